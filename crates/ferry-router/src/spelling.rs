//! The configuration spelling of a plain enum, written once.

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
                        $crate::spelling::one_of(&[$($spelling),+])
                    )),
                }
            }
        }
    };
}

/// `"a", "b" or "c"`.
pub(crate) fn one_of(values: &[&str]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_of_lists_the_values_as_the_errors_always_did() {
        assert_eq!(super::one_of(&["a"]), "\"a\"");
        assert_eq!(super::one_of(&["a", "b"]), "\"a\" or \"b\"");
        assert_eq!(super::one_of(&["a", "b", "c"]), "\"a\", \"b\" or \"c\"");
    }
}
