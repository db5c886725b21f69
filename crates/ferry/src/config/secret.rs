//! Values that must never print: [`Secret`] (always `***`) and [`PostgresUrl`] (the connection
//! string with only its password replaced by `***`); and [`read_secret_file`], for the secrets
//! kept in files (`postgres.password_file`, `kafka.property_files`).
//!
//! Read the value with `expose()`, at the one place that needs it (the connection or the producer
//! configuration), never into a log line. Redaction fails closed: a connection string whose shape
//! is not understood prints as `***` as a whole, and where the password's end is ambiguous more is
//! hidden rather than less.

use std::fmt;

use serde::{Deserialize, Serialize, Serializer};

/// What `ferry config show` prints in place of a secret. Not a plausible password, and
/// validation refuses it (a shown configuration reused as is says what to put back).
pub const REDACTED: &str = "<redacted>";

/// A secret string. `Debug` and `Display` print `***` (or `""` when empty, so "unset" stays
/// visible).
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself. Do not log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it is empty (unset).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// As [`REDACTED`] (or `""` when empty).
impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if self.0.is_empty() { "" } else { REDACTED })
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "***" })
    }
}

/// A libpq connection string (`postgres://user:password@host:port/db?sslmode=verify-full` or
/// `host=... password=...`), kept secret because it usually carries the password. `Debug` and
/// `Display` show it with the password replaced by `***`. `ferry_wal::conn::ConnectConfig::parse`
/// parses it.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct PostgresUrl(Secret);

impl PostgresUrl {
    /// Wraps a connection string.
    pub fn new(value: impl Into<String>) -> Self {
        PostgresUrl(Secret::new(value))
    }

    /// The full connection string, password included. Do not log it.
    pub fn expose(&self) -> &str {
        self.0.expose()
    }

    /// Whether it is empty (unset).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The connection string with its password replaced by `***`.
    pub fn redacted(&self) -> String {
        redact_conninfo(self.0.expose())
    }
}

/// With its password replaced by [`REDACTED`] (the whole string, if its shape is not understood).
impl Serialize for PostgresUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&redact_conninfo_with(self.0.expose(), REDACTED))
    }
}

impl fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl fmt::Display for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

const MASK: &str = "***";

pub use ferry_wal::conn::pgpass::read_secret_file;

/// Replaces the password of a libpq URL or keyword/value string by `***`.
pub fn redact_conninfo(s: &str) -> String {
    redact_conninfo_with(s, MASK)
}

/// Replaces the password of a libpq URL or keyword/value string by `mask`.
pub fn redact_conninfo_with(s: &str, mask: &str) -> String {
    let trimmed = s.trim();
    for scheme in ["postgres://", "postgresql://"] {
        if let Some(rest) = trimmed.strip_prefix(scheme) {
            return format!("{scheme}{}", redact_url_rest(rest, mask));
        }
    }
    if trimmed.contains("://") {
        return mask.to_owned();
    }
    redact_keyword_value(trimmed, mask).unwrap_or_else(|| mask.to_owned())
}

/// After the scheme. The user info ends at the last `@` (as `ferry_wal` parses it); if a password
/// holds an unescaped `/` or `?`, that `@` may lie beyond them, so the last `@` anywhere is used:
/// at worst some host or parameters are hidden too, never a password shown.
fn redact_url_rest(rest: &str, mask: &str) -> String {
    let (userinfo_end, after) = match rest.rfind('@') {
        Some(at) => (Some(at), &rest[at + 1..]),
        None => (None, rest),
    };
    let mut out = String::with_capacity(rest.len());
    if let Some(at) = userinfo_end {
        let userinfo = &rest[..at];
        match userinfo.split_once(':') {
            Some((user, _password)) => {
                out.push_str(user);
                out.push(':');
                out.push_str(mask);
            }
            None => out.push_str(userinfo),
        }
        out.push('@');
    }
    match after.split_once('?') {
        Some((main, query)) => {
            out.push_str(main);
            out.push('?');
            let params: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}={mask}"),
                    _ => pair.to_owned(),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
        None => out.push_str(after),
    }
    out
}

/// libpq keyword/value syntax: `key = value` pairs separated by spaces; a value is bare (up to
/// whitespace) or single-quoted, with `\` escaping the next character in both. `None` when the
/// string does not follow it.
fn redact_keyword_value(s: &str, mask: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    let skip_ws = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>, out: &mut String| {
        while let Some(c) = chars.next_if(|c| c.is_whitespace()) {
            out.push(c);
        }
    };
    loop {
        skip_ws(&mut chars, &mut out);
        if chars.peek().is_none() {
            return Some(out);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        out.push_str(&key);
        skip_ws(&mut chars, &mut out);
        if chars.next() != Some('=') || key.is_empty() {
            return None;
        }
        out.push('=');
        skip_ws(&mut chars, &mut out);
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            value.push(chars.next()?);
            loop {
                let c = chars.next()?;
                value.push(c);
                match c {
                    '\\' => value.push(chars.next()?),
                    '\'' => break,
                    _ => {}
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                value.push(c);
                if c == '\\' {
                    value.push(chars.next()?);
                }
            }
        }
        out.push_str(if key == "password" { mask } else { &value });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{s:?}"), "***");
        assert_eq!(format!("{:?}", Secret::default()), "\"\"");
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn only_the_password_of_a_connection_string_is_hidden() {
        let cases = [
            (
                "postgres://ferry:hunter2@db:5432/app?sslmode=verify-full&sslrootcert=/ca.pem",
                "postgres://ferry:***@db:5432/app?sslmode=verify-full&sslrootcert=/ca.pem",
            ),
            (
                "postgresql://ferry:hunter2@db/app",
                "postgresql://ferry:***@db/app",
            ),
            ("postgres://ferry@db/app", "postgres://ferry@db/app"),
            ("postgres://db/app", "postgres://db/app"),
            ("postgres://ferry:@db/app", "postgres://ferry:***@db/app"),
            (
                "postgres://ferry:p%40ss@db/app",
                "postgres://ferry:***@db/app",
            ),
            (
                "postgres://ferry:hunter2@[::1]:5432/app",
                "postgres://ferry:***@[::1]:5432/app",
            ),
            // An unescaped '@', '/' or '?' in the password: hidden, with a little more.
            (
                "postgres://ferry:hun@ter2@db/app",
                "postgres://ferry:***@db/app",
            ),
            (
                "postgres://ferry:hun/ter2@db/app",
                "postgres://ferry:***@db/app",
            ),
            (
                "postgres://ferry:hun?ter2@db/app",
                "postgres://ferry:***@db/app",
            ),
            (
                "postgres://ferry@db/app?password=hunter2&sslmode=require",
                "postgres://ferry@db/app?password=***&sslmode=require",
            ),
            (
                "host=db user=ferry password=hunter2 sslmode=require",
                "host=db user=ferry password=*** sslmode=require",
            ),
            (
                "host=db password = 'hunter 2' dbname=app",
                "host=db password = *** dbname=app",
            ),
            ("password='it\\'s secret' host=db", "password=*** host=db"),
            ("password=back\\ slash host=db", "password=*** host=db"),
            ("host=db", "host=db"),
            // Not understood: everything hidden.
            ("mysql://root:hunter2@db/app", "***"),
            ("host=db password='unterminated hunter2", "***"),
            ("hunter2", "***"),
        ];
        for (input, shown) in cases {
            let url = PostgresUrl::new(input);
            assert_eq!(url.to_string(), shown, "{input}");
            assert_eq!(format!("{url:?}"), format!("{shown:?}"), "{input}");
            assert!(!url.to_string().contains("hunter"), "{input}");
            assert_eq!(url.expose(), input);
        }
    }
}
