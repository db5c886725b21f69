//! A reader of `java.util.Properties` text, as `Properties.load(Reader)` reads it: what
//! Debezium's tracing stores in its `tracingspancontext` column (`Properties.store` output) and
//! reads back. Only [`crate::trace`] uses it.
//!
//! The grammar (the `Properties.load` Javadoc): natural lines end with `\n`, `\r\n` or `\r`;
//! leading whitespace (space, tab, form feed) is skipped; a line starting with `#` or `!` is a
//! comment; a line ending in an odd number of backslashes continues on the next one (whose
//! leading whitespace is skipped). The key ends at the first unescaped `=`, `:` or whitespace;
//! whitespace, then one `=` or `:`, then whitespace separate it from the value. Escapes: `\t`,
//! `\n`, `\r`, `\f`, `\uXXXX`, and `\` before any other character stands for that character.

use std::borrow::Cow;

use crate::base::trace_outcome::TraceProblem;

/// Reads a `java.util.Properties` text as `Properties.load(Reader)` does, keeping every
/// `(key, value)` pair in order; a key or value without escapes or continuation lines borrows
/// from `text`. Fails only on a malformed `\uXXXX` escape (Java throws
/// `IllegalArgumentException` there), as [`TraceProblem::NotText`].
pub fn load_properties(text: &str) -> Result<Vec<Pair<'_>>, TraceProblem> {
    let mut out = Vec::new();
    for_each_property(text, |k, v| out.push((k, v)))?;
    Ok(out)
}

/// [`load_properties`] without collecting: `f` sees each pair in order.
pub(crate) fn for_each_property<'t>(
    text: &'t str,
    mut f: impl FnMut(Cow<'t, str>, Cow<'t, str>),
) -> Result<(), TraceProblem> {
    let mut joined: Option<String> = None;
    let mut lines = natural_lines(text).peekable();
    while let Some(line) = lines.next() {
        let line = line.trim_start_matches([' ', '\t', '\x0c']);
        if joined.is_none() && (line.is_empty() || line.starts_with(['#', '!'])) {
            continue;
        }
        let trailing = line.bytes().rev().take_while(|&b| b == b'\\').count();
        if trailing % 2 == 1 {
            joined
                .get_or_insert_with(String::new)
                .push_str(&line[..line.len() - 1]);
            if lines.peek().is_some() {
                continue;
            }
        } else if let Some(j) = joined.as_mut() {
            j.push_str(line);
        } else {
            let (k, v) = split_pair(line)?;
            f(k, v);
            continue;
        }
        let logical = joined.take().unwrap_or_default();
        let (k, v) = split_pair(&logical)?;
        f(Cow::Owned(k.into_owned()), Cow::Owned(v.into_owned()));
    }
    Ok(())
}

/// A Properties key and value.
pub type Pair<'a> = (Cow<'a, str>, Cow<'a, str>);

/// Lines ended by `\n`, `\r\n` or `\r`.
fn natural_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = rest.find(['\n', '\r']).unwrap_or(rest.len());
        let line = &rest[..end];
        let tail = &rest[end..];
        rest = if let Some(after) = tail.strip_prefix("\r\n") {
            after
        } else if tail.is_empty() {
            tail
        } else {
            &tail[1..]
        };
        Some(line)
    })
}

/// Splits a logical line into its unescaped key and value.
fn split_pair(line: &str) -> Result<Pair<'_>, TraceProblem> {
    let bytes = line.as_bytes();
    let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\x0c');
    let mut key_end = bytes.len();
    let mut value_start = bytes.len();
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        if escaped {
            escaped = false;
            continue;
        }
        match b {
            b'\\' => escaped = true,
            b'=' | b':' => {
                key_end = i;
                value_start = i + 1;
                break;
            }
            b if is_space(b) => {
                key_end = i;
                let mut j = i;
                while j < bytes.len() && is_space(bytes[j]) {
                    j += 1;
                }
                if j < bytes.len() && matches!(bytes[j], b'=' | b':') {
                    j += 1;
                }
                value_start = j;
                break;
            }
            _ => {}
        }
    }
    let mut v = value_start;
    while v < bytes.len() && is_space(bytes[v]) {
        v += 1;
    }
    Ok((unescape(&line[..key_end])?, unescape(&line[v..])?))
}

fn unescape(s: &str) -> Result<Cow<'_, str>, TraceProblem> {
    if !s.contains('\\') {
        return Ok(Cow::Borrowed(s));
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\x0c'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let unit = (hex.len() == 4)
                    .then(|| u16::from_str_radix(&hex, 16).ok())
                    .flatten()
                    .ok_or(TraceProblem::NotText)?;
                // A UTF-16 surrogate (half of a pair) becomes U+FFFD: a trace context is ASCII.
                out.push(char::from_u32(u32::from(unit)).unwrap_or('\u{fffd}'));
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    Ok(Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_load_matches_java() {
        let p: Vec<(String, String)> =
            load_properties("a=1\nb : 2\nc 3\nd\ne=\\t\\n\\\\x\nf\\=g=h\n  i=  spaced  \nj=k\\\n")
                .unwrap()
                .into_iter()
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
        let want: Vec<(String, String)> = [
            ("a", "1"),
            ("b", "2"),
            ("c", "3"),
            ("d", ""),
            ("e", "\t\n\\x"),
            ("f=g", "h"),
            ("i", "spaced  "),
            ("j", "k"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(p, want);
        assert!(load_properties("k=\\u12").is_err());
    }
}
