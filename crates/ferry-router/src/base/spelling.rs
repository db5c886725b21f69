//! The configuration spelling of a plain enum, written once, and the nearest spelling of a
//! misspelt name ([`nearest`]), for the "did you mean" of every configuration error.

/// `spelling!(Type { Variant => "spelling", ... })` gives `Type` its configuration spelling:
/// `as_str`, `Display`, and a `FromStr` whose error names every accepted value
/// (`unknown value "x"; expected "a", "b" or "c"`).
macro_rules! spelling {
    ($ty:ident { $($variant:ident => $spelling:literal),+ $(,)? }) => {
        impl $ty {
            /// The configuration spelling.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $spelling,)+
                }
            }
        }

        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($spelling => Ok($ty::$variant),)+
                    other => Err(format!(
                        "unknown value {other:?}; expected {}",
                        $crate::base::spelling::one_of(&[$($spelling),+])
                    )),
                }
            }
        }
    };
}

/// `"a", "b" or "c"`.
pub fn one_of(values: &[&str]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}

/// The candidate nearest to `word` by edit distance (ASCII case ignored), when it is near enough
/// to be a likely typo: a change of case alone, or up to a third of the candidate's length (at
/// most 4 edits) away. `None` when nothing is that near.
pub fn nearest<'a, I>(word: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    let word = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (edit_distance(&word, &c.to_ascii_lowercase()), c))
        .min_by_key(|(d, _)| *d)
        .filter(|(d, c)| *d <= (c.len() / 3).clamp(1, 4))
        .map(|(_, c)| c)
}

/// Edit distance in bytes (configuration names are ASCII), counting a swap of two neighbours
/// (`kafak`) as one edit, like an insertion, a deletion or a substitution (optimal string
/// alignment).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    // d[i][j]: distance between a[..i] and b[..j].
    let mut d = vec![vec![0; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    #[test]
    fn nearest_finds_a_typo_and_nothing_for_a_stranger() {
        let keys = ["slot", "publication", "standby_poll_interval", "url"];
        assert_eq!(super::nearest("slott", keys), Some("slot"));
        assert_eq!(super::nearest("SLOT", keys), Some("slot"));
        assert_eq!(super::nearest("publicaton", keys), Some("publication"));
        assert_eq!(super::nearest("zzz_unknown", keys), None);
        assert_eq!(super::nearest("kafak", ["kafka", "http"]), Some("kafka"));
    }

    #[test]
    fn one_of_lists_the_values_as_the_errors_always_did() {
        assert_eq!(super::one_of(&["a"]), "\"a\"");
        assert_eq!(super::one_of(&["a", "b"]), "\"a\" or \"b\"");
        assert_eq!(super::one_of(&["a", "b", "c"]), "\"a\", \"b\" or \"c\"");
    }
}
