//! Typed durations for the configuration: `"500ms"`, `"5s"`, `"2m"`, `"1h"`.
//!
//! A whole number and one unit (`ms`, `s`, `m`, `h`), nothing else: no bare numbers (is `5`
//! seconds or milliseconds?), no fractions (`1.5s` is `1500ms`), no spaces. Printed back in the
//! largest unit that is exact.

use std::time::Duration;

use serde::Deserializer;

/// Parses a configuration duration.
pub fn parse(s: &str) -> Result<Duration, String> {
    let expected = || {
        format!("invalid duration {s:?}: expected a whole number and a unit (ms, s, m, h), like \"500ms\", \"5s\", \"2m\" or \"1h\"")
    };
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    if number.is_empty() {
        return Err(expected());
    }
    let n: u64 = number.parse().map_err(|_| expected())?;
    let millis_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(expected()),
    };
    n.checked_mul(millis_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("duration {s:?} is too long"))
}

/// Formats a duration as [`parse`] reads it, in the largest exact unit; sub-millisecond parts
/// (which [`parse`] never produces) are truncated.
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0s".to_owned(),
        _ if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        _ if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        _ if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        _ => format!("{ms}ms"),
    }
}

/// `#[serde(serialize_with = "duration::serialize")]`: as [`format`] writes it.
pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format(*d))
}

/// `#[serde(deserialize_with = "duration::deserialize")]`: a duration string.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    struct Text;
    impl serde::de::Visitor<'_> for Text {
        type Value = Duration;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration string like \"500ms\", \"5s\", \"2m\" or \"1h\"")
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Duration, E> {
            parse(s).map_err(E::custom)
        }
    }
    d.deserialize_str(Text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_unit() {
        let cases = [
            ("500ms", Duration::from_millis(500)),
            ("0ms", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("5s", Duration::from_secs(5)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("90s", Duration::from_secs(90)),
            ("007s", Duration::from_secs(7)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            "5",
            "s",
            "ms",
            "1.5s",
            "-1s",
            "+1s",
            "5 s",
            " 5s",
            "5s ",
            "5S",
            "5sec",
            "5us",
            "1d",
            "1m30s",
            "5ss",
            "99999999999999999999s",
            "18446744073709551615h",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad:?}: {err}");
        }
    }

    #[test]
    fn formats_in_the_largest_exact_unit_and_round_trips() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(5), "5ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_secs(7200), "2h"),
        ];
        for (d, text) in cases {
            assert_eq!(format(d), text);
            assert_eq!(parse(text), Ok(d));
        }
    }
}
