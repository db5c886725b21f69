//! Kafka's topic-name rules, checked on every routed topic: an illegal name is a routing error, never
//! a silently mangled one.
//!
//! The rules are those of Kafka's `org.apache.kafka.common.internals.Topic.validate`: not empty, not
//! `.` or `..`, at most 249 characters, and only ASCII letters, digits, `.`, `_` and `-`.

use std::fmt;

/// Longest legal topic name (Kafka's `Topic.MAX_NAME_LENGTH`).
pub const MAX_TOPIC_LENGTH: usize = 249;

/// Why a topic name is illegal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicProblem {
    /// The name is empty.
    Empty,
    /// The name is `.` or `..`.
    DotOrDotDot,
    /// The name is longer than [`MAX_TOPIC_LENGTH`].
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The name contains a byte Kafka does not allow.
    IllegalChar {
        /// The offending character (or the Unicode replacement character for a non-UTF-8 byte).
        ch: char,
        /// Byte offset in the name.
        at: usize,
    },
}

impl fmt::Display for TopicProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopicProblem::Empty => f.write_str("the topic name is empty"),
            TopicProblem::DotOrDotDot => f.write_str("\".\" and \"..\" are not legal topic names"),
            TopicProblem::TooLong { len } => write!(
                f,
                "the topic name is {len} characters long; Kafka allows at most {MAX_TOPIC_LENGTH}"
            ),
            TopicProblem::IllegalChar { ch, at } => write!(
                f,
                "{ch:?} at byte {at} is not legal in a topic name (legal: ASCII letters, digits, '.', '_', '-')"
            ),
        }
    }
}

/// Is `b` legal in a Kafka topic name?
#[inline]
pub fn is_legal_topic_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-'
}

/// Checks a topic name against Kafka's rules.
pub fn validate_topic(name: &[u8]) -> Result<(), TopicProblem> {
    if name.is_empty() {
        return Err(TopicProblem::Empty);
    }
    if name == b"." || name == b".." {
        return Err(TopicProblem::DotOrDotDot);
    }
    if name.len() > MAX_TOPIC_LENGTH {
        return Err(TopicProblem::TooLong { len: name.len() });
    }
    if let Some(at) = name.iter().position(|&b| !is_legal_topic_byte(b)) {
        return Err(TopicProblem::IllegalChar {
            ch: first_char_at(name, at),
            at,
        });
    }
    Ok(())
}

fn first_char_at(bytes: &[u8], at: usize) -> char {
    let end = (at + 4).min(bytes.len());
    for e in (at + 1..=end).rev() {
        if let Ok(s) = std::str::from_utf8(&bytes[at..e]) {
            if let Some(c) = s.chars().next() {
                return c;
            }
        }
    }
    char::REPLACEMENT_CHARACTER
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_rules_table() {
        let long = "a".repeat(MAX_TOPIC_LENGTH);
        let too_long = "a".repeat(MAX_TOPIC_LENGTH + 1);
        let cases: &[(&[u8], Result<(), TopicProblem>)] = &[
            (b"outbox.event.order", Ok(())),
            (b"A-Z_a-z.0-9", Ok(())),
            (b"...", Ok(())),
            (long.as_bytes(), Ok(())),
            (b"", Err(TopicProblem::Empty)),
            (b".", Err(TopicProblem::DotOrDotDot)),
            (b"..", Err(TopicProblem::DotOrDotDot)),
            (
                too_long.as_bytes(),
                Err(TopicProblem::TooLong {
                    len: MAX_TOPIC_LENGTH + 1,
                }),
            ),
            (
                b"outbox event",
                Err(TopicProblem::IllegalChar { ch: ' ', at: 6 }),
            ),
            (b"a/b", Err(TopicProblem::IllegalChar { ch: '/', at: 1 })),
            (
                "caf\u{e9}".as_bytes(),
                Err(TopicProblem::IllegalChar {
                    ch: '\u{e9}',
                    at: 3,
                }),
            ),
            (
                b"x\xff",
                Err(TopicProblem::IllegalChar {
                    ch: char::REPLACEMENT_CHARACTER,
                    at: 1,
                }),
            ),
        ];
        for (name, want) in cases {
            assert_eq!(
                &validate_topic(name),
                want,
                "{:?}",
                String::from_utf8_lossy(name)
            );
        }
    }
}
