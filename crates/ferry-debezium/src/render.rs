//! The generated `ferry.toml` as a small document: sections of `key = value` lines, each with the
//! Debezium option it came from as an inline comment and any caveats as full-line comments above
//! it. Rendering quotes every string as a TOML basic string, so no connector value can break the
//! file's syntax (the tests parse every fixture's output with `ferry::config::load`).

use std::fmt::Write as _;

/// Width that full-line comments wrap at.
const WRAP: usize = 98;

/// A TOML value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Value {
    Str(String),
    Bool(bool),
    Int(u64),
    /// An array of inline tables of strings (`rules = [{ column = "c", topic = "t" }]`).
    Tables(Vec<Vec<(&'static str, String)>>),
}

impl Value {
    pub(super) fn str(s: impl Into<String>) -> Value {
        Value::Str(s.into())
    }

    fn render(&self) -> String {
        match self {
            Value::Str(s) => quote(s),
            Value::Bool(b) => b.to_string(),
            Value::Int(n) => n.to_string(),
            Value::Tables(rows) => {
                let rows: Vec<String> = rows
                    .iter()
                    .map(|row| {
                        let fields: Vec<String> = row
                            .iter()
                            .map(|(k, v)| format!("{k} = {}", quote(v)))
                            .collect();
                        format!("{{ {} }}", fields.join(", "))
                    })
                    .collect();
                format!("[{}]", rows.join(", "))
            }
        }
    }
}

#[derive(Debug)]
struct Line {
    key: String,
    value: Value,
    /// Written as a comment: a setting the user must complete (a secret, an unavailable codec).
    commented_out: bool,
    /// The Debezium option(s) it came from.
    from: Option<String>,
    /// Caveats, as full-line comments above the line.
    above: Vec<String>,
}

#[derive(Debug)]
struct Section {
    name: &'static str,
    intro: Vec<String>,
    lines: Vec<Line>,
}

/// The document: a header comment and the sections in file order.
#[derive(Debug)]
pub(super) struct Doc {
    header: Vec<String>,
    sections: Vec<Section>,
    /// More outbox tables with the `[outbox]` and `[route]` mapping: `[[tables]]` entries.
    tables: Vec<(String, String)>,
    tables_intro: Vec<String>,
}

/// Sections in the order Ferry's example file has them.
pub(super) const POSTGRES: &str = "postgres";
pub(super) const OUTBOX: &str = "outbox";
pub(super) const ROUTE: &str = "route";
pub(super) const KAFKA: &str = "kafka";
pub(super) const KAFKA_PROPERTIES: &str = "kafka.properties";

impl Doc {
    pub(super) fn new() -> Doc {
        Doc {
            header: Vec::new(),
            sections: [POSTGRES, OUTBOX, ROUTE, KAFKA, KAFKA_PROPERTIES]
                .into_iter()
                .map(|name| Section {
                    name,
                    intro: Vec::new(),
                    lines: Vec::new(),
                })
                .collect(),
            tables: Vec::new(),
            tables_intro: Vec::new(),
        }
    }

    /// Adds a `[[tables]]` entry for `table` (from option `from`) with the mapping of `[outbox]`
    /// (but its table) and `[route]`, as they are when the document is rendered.
    pub(super) fn same_mapping_table(&mut self, table: &str, from: &str) {
        self.tables.push((table.to_owned(), from.to_owned()));
    }

    /// Adds a paragraph of comment above the first `[[tables]]` entry.
    pub(super) fn tables_intro(&mut self, text: impl Into<String>) {
        self.tables_intro.push(text.into());
    }

    /// Adds a paragraph to the header comment.
    pub(super) fn header(&mut self, text: impl Into<String>) {
        self.header.push(text.into());
    }

    fn section(&mut self, name: &str) -> &mut Section {
        self.sections
            .iter_mut()
            .find(|s| s.name == name)
            .expect("sections are fixed at Doc::new")
    }

    /// Adds a paragraph of comment under the section's header.
    pub(super) fn intro(&mut self, section: &str, text: impl Into<String>) {
        self.section(section).intro.push(text.into());
    }

    /// Sets `key = value` in `section`, replacing an earlier line for the same key.
    pub(super) fn set(&mut self, section: &str, key: &str, value: Value, from: Option<&str>) {
        let s = self.section(section);
        s.lines.retain(|l| l.key != key);
        s.lines.push(Line {
            key: key.to_owned(),
            value,
            commented_out: false,
            from: from.map(str::to_owned),
            above: Vec::new(),
        });
    }

    /// Writes `# key = value` in `section`: a line the user completes or enables.
    pub(super) fn commented(&mut self, section: &str, key: &str, value: Value, from: Option<&str>) {
        self.set(section, key, value, from);
        if let Some(l) = self.section(section).lines.last_mut() {
            l.commented_out = true;
        }
    }

    /// Adds a caveat above the line for `key` (which must have been set).
    pub(super) fn caveat(&mut self, section: &str, key: &str, text: impl Into<String>) {
        if let Some(l) = self
            .section(section)
            .lines
            .iter_mut()
            .find(|l| l.key == key)
        {
            l.above.push(text.into());
        }
    }

    /// The TOML text.
    pub(super) fn render(&self) -> String {
        let mut out = String::new();
        for p in &self.header {
            comment(&mut out, p);
        }
        for s in &self.sections {
            if s.lines.is_empty() && s.intro.is_empty() {
                continue;
            }
            let _ = writeln!(out, "\n[{}]", s.name);
            for p in &s.intro {
                comment(&mut out, p);
            }
            let width = s
                .lines
                .iter()
                .map(|l| assignment(l).chars().count())
                .filter(|&n| n <= 48)
                .max()
                .unwrap_or(0);
            for l in &s.lines {
                for p in &l.above {
                    comment(&mut out, p);
                }
                let text = assignment(l);
                match &l.from {
                    Some(from) => {
                        let pad = width.saturating_sub(text.chars().count());
                        let _ = writeln!(out, "{text}{:pad$}  # {}", "", one_line(from));
                    }
                    None => {
                        let _ = writeln!(out, "{text}");
                    }
                }
            }
        }
        for (i, (table, from)) in self.tables.iter().enumerate() {
            let _ = writeln!(out, "\n[[tables]]");
            if i == 0 {
                for p in &self.tables_intro {
                    comment(&mut out, p);
                }
            }
            let table = Value::str(table).render();
            let _ = writeln!(out, "outbox.table = {table}  # {}", one_line(from));
            for s in self
                .sections
                .iter()
                .filter(|s| s.name == OUTBOX || s.name == ROUTE)
            {
                for l in s.lines.iter().filter(|l| !l.commented_out) {
                    if s.name == OUTBOX && (l.key == "table" || l.key == "message_prefix") {
                        continue;
                    }
                    let _ = writeln!(out, "{}.{}", s.name, assignment(l));
                }
            }
        }
        out
    }
}

fn assignment(l: &Line) -> String {
    let key = if is_bare_key(&l.key) {
        l.key.clone()
    } else {
        quote(&l.key)
    };
    let prefix = if l.commented_out { "# " } else { "" };
    format!("{prefix}{key} = {}", l.value.render())
}

fn is_bare_key(k: &str) -> bool {
    !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Writes `text` as `# ` comment lines wrapped at [`WRAP`] columns.
fn comment(out: &mut String, text: &str) {
    let mut line = String::from("#");
    for word in one_line(text).split(' ').filter(|w| !w.is_empty()) {
        if line.len() > 1 && line.len() + 1 + word.len() > WRAP {
            let _ = writeln!(out, "{line}");
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    let _ = writeln!(out, "{line}");
}

/// `text` with every control character (newlines included) replaced by a space, so that a
/// connector value quoted in a comment cannot end the comment.
pub(super) fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// A TOML basic string.
pub(super) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_any_text() {
        for s in [
            "plain",
            "a\"b",
            "back\\slash",
            "new\nline",
            "nul\u{0}",
            "é ü",
        ] {
            let text = format!("k = {}", quote(s));
            let parsed: toml::Table = toml::from_str(&text).unwrap();
            assert_eq!(parsed["k"].as_str(), Some(s), "{text}");
        }
    }

    #[test]
    fn renders_sections_comments_and_commented_lines() {
        let mut d = Doc::new();
        d.header("made by a test");
        d.set(POSTGRES, "slot", Value::str("debezium"), Some("slot.name"));
        d.caveat(POSTGRES, "slot", "a caveat\nthat cannot break out");
        d.commented(KAFKA_PROPERTIES, "sasl.password", Value::str(""), None);
        d.set(
            KAFKA_PROPERTIES,
            "sasl.username",
            Value::str("u"),
            Some("jaas"),
        );
        let text = d.render();
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(parsed["postgres"]["slot"].as_str(), Some("debezium"));
        let props = parsed["kafka"]["properties"].as_table().unwrap();
        assert_eq!(props.len(), 1, "{text}");
        assert!(text.contains("# \"sasl.password\" = \"\""), "{text}");
        assert!(text.contains("# a caveat that cannot break out"), "{text}");
        assert!(
            !text.contains("[outbox]"),
            "empty sections are left out: {text}"
        );
    }
}
