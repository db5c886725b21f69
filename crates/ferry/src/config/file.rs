//! Reading `ferry.toml` against the schema, every problem in one round.
//!
//! serde's derive stays the one schema (`deny_unknown_fields`, the field types, the custom
//! deserializers of durations, sizes and brokers), but serde stops at the first problem. So the
//! file is parsed once into a tree that keeps every key's and value's position
//! ([`toml::de::DeTable`]) and deserialized from it; when that fails, the error's position names
//! the key it is about, the problem is recorded with that key's path and line, the key is taken
//! out of the tree, and the rest is deserialized again, until it fits. What was taken out keeps
//! its default, so validation and the environment still look at everything else.
//!
//! serde's wording (`expected u64`, ``unknown field `x`, expected one of ...``) is put in plain
//! words here ([`plain`]): a number's bounds, the nearest known key
//! ([`ferry_router::spelling::nearest`]) rather than all of them.

use std::ops::Range;

use ferry_router::ConfigProblem;
use serde::Deserialize;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::Config;

/// More problems than this in one file are not worth the rounds: stop and report what was found.
const MAX_PROBLEMS: usize = 100;

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

/// What [`read`] makes of a file.
pub(super) struct FileRead {
    /// The configuration the file gives once every key with a problem is taken out.
    pub(super) config: Config,
    /// The problems, in line order, each with its key path and line (`kafka.linger (line 7)`).
    pub(super) problems: Vec<ConfigProblem>,
    /// Key paths whose validation would mislead: the keys taken out (they have their defaults
    /// now), and the arrays an entry was taken out of (the later entries moved up).
    pub(super) taken_out: Vec<String>,
}

/// Reads the file's tree against the schema; see the [module documentation](self).
pub(super) fn read(text: &str, mut root: Spanned<DeTable<'_>>) -> FileRead {
    // (line, problem), sorted by line at the end: serde meets keys in name order.
    let mut problems: Vec<(usize, ConfigProblem)> = Vec::new();
    // Paths as the file has them: an array entry taken out shifts the later ones in the tree,
    // not in the file (`removed`, the entries taken out, by their arrays' paths).
    let mut reported: Vec<Vec<Step>> = Vec::new();
    let mut removed: Vec<(Vec<Step>, usize)> = Vec::new();
    loop {
        let e = match Config::deserialize(toml::de::Deserializer::from(root.clone())) {
            Ok(config) => return done(config, problems, &reported, &removed),
            Err(e) => e,
        };
        let located = e
            .span()
            .and_then(|span| locate(root.get_ref(), &span).map(|path| (span, path)));
        let Some((span, path)) = located.filter(|(_, path)| !path.is_empty()) else {
            // Not a key's problem (or nowhere to be found): report it and stop with the defaults.
            let line = e.span().map_or(0, |span| line_of(text, span.start));
            problems.push((
                line,
                ConfigProblem {
                    path: "(file)".to_owned(),
                    message: plain(e.message().trim_end(), None),
                },
            ));
            return done(Config::default(), problems, &reported, &removed);
        };
        // A key inside one already reported (an entry of `[[route.rules]]` missing the `topic`
        // that was just taken out for a bad value) is a consequence, not a second problem.
        let in_file = in_file(&path, &removed);
        let consequence = reported
            .iter()
            .any(|r| r.len() > in_file.len() && r.starts_with(&in_file));
        if !consequence {
            let value = get(root.get_ref(), &path);
            let line = line_of(text, span.start);
            problems.push((
                line,
                ConfigProblem {
                    path: format!("{} (line {line})", path_string(&in_file)),
                    message: plain(e.message().trim_end(), value),
                },
            ));
            reported.push(in_file.clone());
        }
        if let Some((Step::Index(i), array)) = in_file.split_last() {
            removed.push((array.to_vec(), *i));
        }
        // Each round takes a key out, so the rounds end; one that cannot be taken out ends
        // them too, with what was found.
        if !remove(root.get_mut(), &path) || problems.len() >= MAX_PROBLEMS {
            return done(Config::default(), problems, &reported, &removed);
        }
    }
}

/// `path` (in the tree) as the file has it: each array index counts the entries taken out before
/// it.
fn in_file(path: &[Step], removed: &[(Vec<Step>, usize)]) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::with_capacity(path.len());
    for step in path {
        let step = match step {
            Step::Key(k) => Step::Key(k.clone()),
            Step::Index(i) => {
                let gone = |o: usize| removed.iter().any(|(a, r)| *a == out && *r == o);
                // The i-th entry still there, counting from the file's first.
                let original = (0..).filter(|o| !gone(*o)).nth(*i).unwrap_or(*i);
                Step::Index(original)
            }
        };
        out.push(step);
    }
    out
}

fn done(
    config: Config,
    mut problems: Vec<(usize, ConfigProblem)>,
    reported: &[Vec<Step>],
    removed: &[(Vec<Step>, usize)],
) -> FileRead {
    problems.sort_by_key(|(line, _)| *line);
    let taken_out = reported
        .iter()
        .chain(removed.iter().map(|(array, _)| array))
        .map(|p| path_string(p))
        .collect();
    FileRead {
        config,
        problems: problems.into_iter().map(|(_, p)| p).collect(),
        taken_out,
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset).unwrap_or(text).matches('\n').count() + 1
}

fn contains(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end
}

/// The deepest key or array entry whose key or value holds `span`. A table's own span is its
/// header alone (`[kafka]`), not its keys, so every table is searched.
fn locate(table: &DeTable<'_>, span: &Range<usize>) -> Option<Vec<Step>> {
    for (key, value) in table.iter() {
        let here = Step::Key(key.get_ref().to_string());
        if contains(&key.span(), span) || key.span().contains(&span.start) {
            return Some(vec![here]);
        }
        if let Some(inner) = locate_in(value.get_ref(), span) {
            let mut path = vec![here];
            path.extend(inner);
            return Some(path);
        }
        if contains(&value.span(), span) {
            return Some(vec![here]);
        }
    }
    None
}

fn locate_in(value: &DeValue<'_>, span: &Range<usize>) -> Option<Vec<Step>> {
    match value {
        DeValue::Table(t) => locate(t, span),
        DeValue::Array(a) => a.iter().enumerate().find_map(|(i, v)| {
            let mut path = vec![Step::Index(i)];
            if let Some(inner) = locate_in(v.get_ref(), span) {
                path.extend(inner);
                Some(path)
            } else {
                contains(&v.span(), span).then_some(path)
            }
        }),
        _ => None,
    }
}

fn get<'a, 'i>(table: &'a DeTable<'i>, path: &[Step]) -> Option<&'a DeValue<'i>> {
    let (Step::Key(first), rest) = path.split_first()? else {
        return None;
    };
    let mut value = table
        .iter()
        .find(|(k, _)| k.get_ref() == first)
        .map(|(_, v)| v.get_ref())?;
    for step in rest {
        value = match (step, value) {
            (Step::Key(k), DeValue::Table(t)) => {
                t.iter().find(|(key, _)| key.get_ref() == k)?.1.get_ref()
            }
            (Step::Index(i), DeValue::Array(a)) => a.get(*i)?.get_ref(),
            _ => return None,
        };
    }
    Some(value)
}

/// Takes the key or entry at `path` out; whether there was one.
fn remove(table: &mut DeTable<'_>, path: &[Step]) -> bool {
    match path {
        [Step::Key(k)] => table.remove(k.as_str()).is_some(),
        [Step::Key(k), rest @ ..] => table
            .get_mut(k.as_str())
            .is_some_and(|v| remove_in(v.get_mut(), rest)),
        _ => false,
    }
}

fn remove_in(value: &mut DeValue<'_>, path: &[Step]) -> bool {
    match (value, path) {
        (DeValue::Table(t), _) => remove(t, path),
        (DeValue::Array(a), [Step::Index(i)]) if *i < a.len() => {
            let old = std::mem::replace(a, toml::de::DeArray::new());
            for (j, v) in old.into_iter().enumerate() {
                if j != *i {
                    a.push(v);
                }
            }
            true
        }
        (DeValue::Array(a), [Step::Index(i), rest @ ..]) => {
            a.get_mut(*i).is_some_and(|v| remove_in(v.get_mut(), rest))
        }
        _ => false,
    }
}

/// `route.rules[2].topic`, `kafka.properties."sasl.mechanism"`.
fn path_string(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                let bare = !k.is_empty()
                    && k.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if bare {
                    out.push_str(k);
                } else {
                    out.push_str(&format!("{k:?}"));
                }
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// serde's message in plain words. `value` is the value at the key, when there is one.
fn plain(message: &str, value: Option<&DeValue<'_>>) -> String {
    let backticked =
        |s: &str| -> Vec<String> { s.split('`').skip(1).step_by(2).map(str::to_owned).collect() };
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (name, expected) = rest.split_once('`').unwrap_or((rest, ""));
        let known = backticked(expected);
        let what = if matches!(value, Some(DeValue::Table(_))) {
            "section"
        } else {
            "key"
        };
        return match ferry_router::spelling::nearest(name, known.iter().map(String::as_str)) {
            Some(near) => format!("unknown {what} `{name}`; did you mean `{near}`?"),
            None if known.is_empty() => format!("unknown {what} `{name}`: this table has no keys"),
            None => format!(
                "unknown {what} `{name}`; the known keys here are {}",
                list(&known)
            ),
        };
    }
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        let (name, expected) = rest.split_once('`').unwrap_or((rest, ""));
        let known = backticked(expected);
        let near = ferry_router::spelling::nearest(name, known.iter().map(String::as_str))
            .map(|n| format!(" (did you mean {n:?}?)"))
            .unwrap_or_default();
        let quoted: Vec<&str> = known.iter().map(String::as_str).collect();
        return format!(
            "must be {}, got {name:?}{near}",
            ferry_router::spelling::one_of(&quoted)
        );
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let name = rest.split('`').next().unwrap_or(rest);
        return format!("required key `{name}` is missing");
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            if let Some((got, expected)) = rest.rsplit_once(", expected ") {
                return format!(
                    "must be {}, got {}",
                    expected_words(expected),
                    got_words(got)
                );
            }
        }
    }
    message.to_owned()
}

/// `` `a`, `b` or `c` ``.
fn list(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}

/// serde's `Expected` of the primitive types in words; a custom one (`a duration string like
/// "5s"`) is already words.
fn expected_words(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a whole number ≥ 0".to_owned(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "a whole number".to_owned(),
        "f32" | "f64" => "a number".to_owned(),
        "a boolean" => "true or false".to_owned(),
        "a sequence" => "an array".to_owned(),
        "a map" => "a table".to_owned(),
        e if e.starts_with("struct ") => "a table".to_owned(),
        e => e.to_owned(),
    }
}

/// serde's `Unexpected` in words: `` integer `-5` `` is `-5`, `sequence` is `an array`.
fn got_words(got: &str) -> String {
    for prefix in ["integer `", "floating point `", "boolean `"] {
        if let Some(v) = got.strip_prefix(prefix).and_then(|v| v.strip_suffix('`')) {
            return v.to_owned();
        }
    }
    if let Some(s) = got.strip_prefix("string ") {
        return format!("the string {s}");
    }
    match got {
        "sequence" => "an array".to_owned(),
        "map" => "a table".to_owned(),
        other => other.to_owned(),
    }
}
