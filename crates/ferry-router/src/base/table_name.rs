//! The name of an outbox table as PostgreSQL stores it, and as pgoutput's Relation message
//! reports it: `outbox.table` parsed once, with SQL's identifier rules.

use std::fmt;
use std::str::FromStr;

/// Schema assumed when `outbox.table` names no schema.
pub const DEFAULT_SCHEMA: &str = "public";

/// A parsed outbox table name, as PostgreSQL stores it (and pgoutput's Relation message reports it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    /// Schema (namespace) name.
    pub schema: String,
    /// Relation name.
    pub name: String,
}

impl FromStr for TableName {
    type Err = String;

    /// Parses `schema.table` or `table`; unquoted identifiers are folded to lower case, `"quoted"`
    /// ones are kept as written (with `""` for a literal quote).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut chars = s.trim().chars().peekable();
        loop {
            let mut ident = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                loop {
                    match chars.next() {
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            ident.push('"');
                        }
                        Some('"') => break,
                        Some(c) => ident.push(c),
                        None => return Err(format!("unterminated quoted identifier in {s:?}")),
                    }
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == '.' {
                        break;
                    }
                    if c == '"' || c.is_whitespace() {
                        return Err(format!(
                            "unexpected {c:?} in {s:?}; quote identifiers that need it: \"My Schema\".\"Outbox\""
                        ));
                    }
                    ident.extend(c.to_lowercase());
                    chars.next();
                }
            }
            if ident.is_empty() {
                return Err(format!(
                    "{s:?} is not a table name; expected \"schema.table\" or \"table\""
                ));
            }
            parts.push(ident);
            match chars.next() {
                None => break,
                Some('.') => continue,
                Some(c) => return Err(format!("unexpected {c:?} after an identifier in {s:?}")),
            }
        }
        match parts.len() {
            1 => Ok(TableName {
                schema: DEFAULT_SCHEMA.to_owned(),
                name: parts.remove(0),
            }),
            2 => {
                let name = parts.remove(1);
                Ok(TableName {
                    schema: parts.remove(0),
                    name,
                })
            }
            _ => Err(format!(
                "{s:?} has too many parts; expected \"schema.table\" or \"table\""
            )),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_ident(f, &self.schema)?;
        f.write_str(".")?;
        write_ident(f, &self.name)
    }
}

fn write_ident(f: &mut fmt::Formatter<'_>, ident: &str) -> fmt::Result {
    let plain = ident
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !ident.starts_with(|c: char| c.is_ascii_digit());
    if plain {
        f.write_str(ident)
    } else {
        write!(f, "\"{}\"", ident.replace('"', "\"\""))
    }
}
