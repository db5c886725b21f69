//! Why a pgoutput message could not be decoded: the tag, the byte offset and what was wrong.

use std::fmt;

use super::tag;

/// A pgoutput message that could not be decoded.
///
/// Displays as, for example, "pgoutput Insert ('I') message: unexpected end of data at offset
/// 13: need 4 more bytes".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The message's first byte, `None` when the message was empty.
    pub tag: Option<u8>,
    /// Byte offset into the message (0 is the tag) where the problem was found.
    pub offset: usize,
    /// What was wrong.
    pub kind: DecodeErrorKind,
}

/// What was wrong with a pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The message had no bytes at all.
    Empty,
    /// The tag is not a pgoutput message of protocol version 1 or 2.
    UnknownTag,
    /// The message ended early: `needed` more bytes were required.
    UnexpectedEof { needed: usize },
    /// A signed length or count on the wire was negative.
    NegativeLength { length: i32 },
    /// A count whose items (of at least `min_item_len` bytes each) cannot fit in the bytes left.
    CountTooLarge {
        count: usize,
        min_item_len: usize,
        remaining: usize,
    },
    /// A tuple column kind other than `n`, `u`, `t`, `b`.
    UnknownTupleKind { kind: u8 },
    /// A marker byte other than the ones allowed at this point (e.g. `'N'` before a new tuple).
    UnexpectedMarker { expected: &'static str, found: u8 },
    /// A field with a closed set of values had another one.
    InvalidValue { field: &'static str, value: u8 },
    /// A string field was not valid UTF-8.
    InvalidUtf8 { field: &'static str },
    /// `count` bytes were left after a complete message: a protocol mismatch.
    TrailingBytes { count: usize },
    /// A Stream Start arrived while a stream block was already open ([`super::Decoder`]).
    StreamStartInsideStream { open_xid: u32 },
    /// A Stream Stop arrived outside a stream block ([`super::Decoder`]).
    StreamStopOutsideStream,
    /// A message with a tuple was 4 GiB or larger (PostgreSQL sends at most ~1 GiB a value).
    MessageTooLarge { len: usize },
}

impl std::error::Error for DecodeError {}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tag {
            None => f.write_str("pgoutput message: ")?,
            Some(t) => match tag::name(t) {
                Some(name) => write!(f, "pgoutput {name} ('{}') message: ", t as char)?,
                None => write!(f, "pgoutput message with tag {}: ", ByteDisplay(t))?,
            },
        }
        let at = self.offset;
        match &self.kind {
            DecodeErrorKind::Empty => f.write_str("empty message"),
            DecodeErrorKind::UnknownTag => write!(f, "unknown message tag at offset {at}"),
            DecodeErrorKind::UnexpectedEof { needed } => write!(
                f,
                "unexpected end of data at offset {at}: need {needed} more bytes"
            ),
            DecodeErrorKind::NegativeLength { length } => {
                write!(f, "negative length {length} at offset {at}")
            }
            DecodeErrorKind::CountTooLarge {
                count,
                min_item_len,
                remaining,
            } => write!(
                f,
                "count {count} at offset {at} cannot fit in the {remaining} remaining bytes \
                 (each item takes at least {min_item_len})"
            ),
            DecodeErrorKind::UnknownTupleKind { kind } => write!(
                f,
                "unknown tuple column kind {} at offset {at} (expected 'n', 'u', 't' or 'b')",
                ByteDisplay(*kind)
            ),
            DecodeErrorKind::UnexpectedMarker { expected, found } => write!(
                f,
                "expected {expected} at offset {at}, found {}",
                ByteDisplay(*found)
            ),
            DecodeErrorKind::InvalidValue { field, value } => {
                write!(f, "invalid {field} {} at offset {at}", ByteDisplay(*value))
            }
            DecodeErrorKind::InvalidUtf8 { field } => {
                write!(f, "{field} at offset {at} is not valid UTF-8")
            }
            DecodeErrorKind::TrailingBytes { count } => write!(
                f,
                "{count} trailing bytes at offset {at} after a complete message \
                 (protocol version mismatch?)"
            ),
            DecodeErrorKind::StreamStartInsideStream { open_xid } => write!(
                f,
                "arrived while the stream block of xid {open_xid} was still open"
            ),
            DecodeErrorKind::StreamStopOutsideStream => {
                f.write_str("arrived outside a stream block")
            }
            DecodeErrorKind::MessageTooLarge { len } => write!(
                f,
                "has {len} bytes, 4 GiB or more: a tuple's values are read as ranges within 4 GiB"
            ),
        }
    }
}

/// A byte as `'x'` when printable, else `0x1f`.
struct ByteDisplay(u8);

impl fmt::Display for ByteDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_ascii_graphic() {
            write!(f, "'{}' (0x{:02x})", self.0 as char, self.0)
        } else {
            write!(f, "0x{:02x}", self.0)
        }
    }
}
