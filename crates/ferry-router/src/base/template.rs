//! Topic templates: literal text with `{column}` placeholders and, in regex rules, `$1` / `${name}`
//! capture-group references.
//!
//! Grammar: `{name}` is the value of column `name`; `$N` (decimal digits) and `${name}` are capture
//! groups of the rule's regex; every other character is literal. Braces and `$` cannot appear in a
//! topic name, so they need no escape: a lone `{`, `}` or `$` is a configuration error. Literal text
//! is checked against Kafka's topic characters when the configuration is validated, so a rendered
//! topic can only be illegal because of a column value, and that is a routing error naming it.
//!
//! The CloudEvents `source` and `subject` are templates too, free text with `{column}`
//! placeholders ([`Template::parse_text`]): the grammar serves the topic plan and the CloudEvents
//! output alike.

use crate::base::topic::is_legal_topic_byte;

/// A capture-group reference inside a regex rule's topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupRef {
    /// `$N`
    Index(usize),
    /// `${name}`
    Name(String),
}

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Literal text.
    Literal(String),
    /// `{column}`: `slot` indexes the router's list of topic input columns (filled by `bind`).
    Column {
        /// Column name.
        name: String,
        /// Index into the router's topic inputs.
        slot: usize,
    },
    /// A capture group of the rule's regex.
    Group(GroupRef),
}

/// A parsed topic template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    segments: Vec<Segment>,
}

impl Template {
    /// Parses `text`; capture-group references are accepted only if `allow_groups`.
    pub fn parse(text: &str, allow_groups: bool) -> Result<Template, String> {
        let mut segments = Vec::new();
        let mut lit = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' => {
                    let name = take_until_close(&mut chars)
                        .ok_or_else(|| format!("unclosed '{{' at byte {at}"))?;
                    if name.is_empty() {
                        return Err(format!("empty placeholder '{{}}' at byte {at}"));
                    }
                    flush(&mut lit, &mut segments);
                    segments.push(Segment::Column { name, slot: 0 });
                }
                '}' => {
                    return Err(format!(
                        "'}}' at byte {at} closes nothing; placeholders are written {{column}}"
                    ))
                }
                '$' => {
                    if !allow_groups {
                        return Err(format!(
                            "'$' at byte {at}: capture groups ($1, ${{name}}) are only available in a rule with a regex"
                        ));
                    }
                    let group =
                        match chars.peek() {
                            Some(&(_, '{')) => {
                                chars.next();
                                let name = take_until_close(&mut chars)
                                    .ok_or_else(|| format!("unclosed '${{' at byte {at}"))?;
                                if name.is_empty() {
                                    return Err(format!("empty group name '${{}}' at byte {at}"));
                                }
                                match name.parse::<usize>() {
                                    Ok(n) => GroupRef::Index(n),
                                    Err(_) => GroupRef::Name(name),
                                }
                            }
                            Some(&(_, d)) if d.is_ascii_digit() => {
                                let mut digits = String::new();
                                while let Some(&(_, d)) = chars.peek() {
                                    if !d.is_ascii_digit() {
                                        break;
                                    }
                                    digits.push(d);
                                    chars.next();
                                }
                                GroupRef::Index(digits.parse().map_err(|_| {
                                    format!("group number at byte {at} is too large")
                                })?)
                            }
                            _ => {
                                return Err(format!(
                                "'$' at byte {at} must be followed by a group number or {{name}}"
                            ))
                            }
                        };
                    flush(&mut lit, &mut segments);
                    segments.push(Segment::Group(group));
                }
                c => {
                    if !(c.is_ascii() && is_legal_topic_byte(c as u8)) {
                        return Err(format!(
                            "{c:?} at byte {at} is not legal in a Kafka topic name (legal: ASCII letters, digits, '.', '_', '-')"
                        ));
                    }
                    lit.push(c);
                }
            }
        }
        flush(&mut lit, &mut segments);
        Ok(Template { segments })
    }

    /// Parses a free-text template (CloudEvents `source` and `subject`): `{column}` placeholders,
    /// and any other character as literal text, `$` included. Braces cannot be escaped: a lone
    /// `{` or `}` is a configuration error.
    pub fn parse_text(text: &str) -> Result<Template, String> {
        let mut segments = Vec::new();
        let mut lit = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' => {
                    let name = take_until_close(&mut chars)
                        .ok_or_else(|| format!("unclosed '{{' at byte {at}"))?;
                    if name.is_empty() {
                        return Err(format!("empty placeholder '{{}}' at byte {at}"));
                    }
                    flush(&mut lit, &mut segments);
                    segments.push(Segment::Column { name, slot: 0 });
                }
                '}' => {
                    return Err(format!(
                        "'}}' at byte {at} closes nothing; placeholders are written {{column}}"
                    ))
                }
                c => lit.push(c),
            }
        }
        flush(&mut lit, &mut segments);
        Ok(Template { segments })
    }

    /// The segments, in order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The template's text if it has no placeholders at all (a fixed topic).
    pub fn as_fixed(&self) -> Option<&str> {
        match self.segments.as_slice() {
            [] => Some(""),
            [Segment::Literal(s)] => Some(s),
            _ => None,
        }
    }

    /// Columns named by `{column}` placeholders, in order (with repeats).
    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Column { name, .. } => Some(name.as_str()),
            _ => None,
        })
    }

    /// Capture-group references, in order.
    pub fn groups(&self) -> impl Iterator<Item = &GroupRef> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Group(g) => Some(g),
            _ => None,
        })
    }

    /// Total length of the literal text.
    pub fn literal_len(&self) -> usize {
        self.segments
            .iter()
            .map(|s| match s {
                Segment::Literal(l) => l.len(),
                _ => 0,
            })
            .sum()
    }

    /// Assigns each `{column}` its slot: the index of the column in `inputs`, appending new ones.
    pub(crate) fn bind(&mut self, inputs: &mut Vec<String>) {
        for seg in &mut self.segments {
            if let Segment::Column { name, slot } = seg {
                *slot = slot_of(inputs, name);
            }
        }
    }
}

/// Index of `name` in `inputs`, appending it if absent.
pub(crate) fn slot_of(inputs: &mut Vec<String>, name: &str) -> usize {
    match inputs.iter().position(|i| i == name) {
        Some(i) => i,
        None => {
            inputs.push(name.to_owned());
            inputs.len() - 1
        }
    }
}

fn flush(lit: &mut String, segments: &mut Vec<Segment>) {
    if !lit.is_empty() {
        segments.push(Segment::Literal(std::mem::take(lit)));
    }
}

fn take_until_close(chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>) -> Option<String> {
    let mut name = String::new();
    for (_, c) in chars.by_ref() {
        match c {
            '}' => return Some(name),
            '{' => return None,
            c => name.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str) -> Segment {
        Segment::Column {
            name: name.into(),
            slot: 0,
        }
    }
    fn lit(s: &str) -> Segment {
        Segment::Literal(s.into())
    }

    #[test]
    fn parses_valid_templates() {
        let cases: &[(&str, bool, Vec<Segment>)] = &[
            ("orders", false, vec![lit("orders")]),
            (
                "outbox.event.{aggregatetype}",
                false,
                vec![lit("outbox.event."), col("aggregatetype")],
            ),
            ("{a}{b}-x", false, vec![col("a"), col("b"), lit("-x")]),
            ("{tenant id}", false, vec![col("tenant id")]),
            (
                "outbox.event.${routedByValue}",
                true,
                vec![
                    lit("outbox.event."),
                    Segment::Group(GroupRef::Name("routedByValue".into())),
                ],
            ),
            (
                "t.$12.${3}.{c}",
                true,
                vec![
                    lit("t."),
                    Segment::Group(GroupRef::Index(12)),
                    lit("."),
                    Segment::Group(GroupRef::Index(3)),
                    lit("."),
                    col("c"),
                ],
            ),
            ("", false, vec![]),
        ];
        for (text, groups, want) in cases {
            let t = Template::parse(text, *groups).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(t.segments(), want.as_slice(), "{text}");
        }
    }

    #[test]
    fn rejects_invalid_templates() {
        let cases: &[(&str, bool, &str)] = &[
            ("outbox.{aggregatetype", false, "unclosed '{'"),
            ("outbox.aggregatetype}", false, "closes nothing"),
            ("outbox.{}", false, "empty placeholder"),
            ("outbox.{a{b}}", false, "unclosed '{'"),
            ("outbox.$1", false, "only available in a rule with a regex"),
            ("outbox.$x", true, "must be followed by a group number"),
            ("outbox.$", true, "must be followed by a group number"),
            ("outbox.${}", true, "empty group name"),
            ("outbox.${a", true, "unclosed '${'"),
            ("outbox events", false, "' ' at byte 6 is not legal"),
            ("outbox/events", false, "'/' at byte 6 is not legal"),
            ("caf\u{e9}", false, "'é' at byte 3 is not legal"),
            ("t.$99999999999999999999999", true, "too large"),
        ];
        for (text, groups, want) in cases {
            let err = Template::parse(text, *groups).expect_err(text);
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn text_templates_take_any_literal() {
        let t = Template::parse_text("https://x.example/$/{tenant}/orders?{id}").unwrap();
        assert_eq!(
            t.segments(),
            &[
                lit("https://x.example/$/"),
                col("tenant"),
                lit("/orders?"),
                col("id"),
            ]
        );
        for (bad, want) in [
            ("/a/{b", "unclosed '{'"),
            ("/a}", "closes nothing"),
            ("{}", "empty placeholder"),
        ] {
            let err = Template::parse_text(bad).expect_err(bad);
            assert!(err.contains(want), "{bad}: {err}");
        }
    }

    #[test]
    fn fixed_and_binding() {
        assert_eq!(
            Template::parse("x.y", false).unwrap().as_fixed(),
            Some("x.y")
        );
        assert_eq!(Template::parse("x.{y}", false).unwrap().as_fixed(), None);
        let mut inputs = vec!["b".to_string()];
        let mut t = Template::parse("{a}.{b}.{a}", false).unwrap();
        t.bind(&mut inputs);
        assert_eq!(inputs, vec!["b", "a"]);
        let slots: Vec<usize> = t
            .segments()
            .iter()
            .filter_map(|s| match s {
                Segment::Column { slot, .. } => Some(*slot),
                _ => None,
            })
            .collect();
        assert_eq!(slots, vec![1, 0, 1]);
        assert_eq!(t.literal_len(), 2);
    }
}
