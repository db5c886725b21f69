//! Typed durations for the configuration: `"500ms"`, `"5s"`, `"2m"`, `"1h"`.
//!
//! A whole number and one unit (`ms`, `s`, `m`, `h`), nothing else: no bare numbers (is `5`
//! seconds or milliseconds?), no fractions (`1.5s` is `1500ms`), no spaces. Printed back in the
//! largest unit that is exact.
//!
//! Every duration key of the configuration is a [`ConfigDuration`]: it reads ([`parse`]) and
//! writes ([`format()`]) this spelling itself, in the file (serde) and in `FERRY_*` variables
//! ([`FromStr`]). What the configuration hands on (`PipelineSettings`, the connection
//! settings) is a plain [`Duration`] ([`ConfigDuration::get`]).

use std::fmt;
use std::ops::Deref;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration key of the configuration: a [`Duration`] that is read from and written as a
/// duration string (`"5s"`, see the [module documentation](self)). `Debug` is the
/// [`Duration`]'s (`5s`, `250ms`), `Display` the configuration's spelling ([`format()`]).
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConfigDuration(Duration);

impl ConfigDuration {
    /// `d` as a configuration duration.
    pub const fn new(d: Duration) -> ConfigDuration {
        ConfigDuration(d)
    }

    /// The duration.
    pub const fn get(self) -> Duration {
        self.0
    }
}

impl From<Duration> for ConfigDuration {
    fn from(d: Duration) -> ConfigDuration {
        ConfigDuration(d)
    }
}

impl From<ConfigDuration> for Duration {
    fn from(d: ConfigDuration) -> Duration {
        d.0
    }
}

impl Deref for ConfigDuration {
    type Target = Duration;
    fn deref(&self) -> &Duration {
        &self.0
    }
}

impl PartialEq<Duration> for ConfigDuration {
    fn eq(&self, other: &Duration) -> bool {
        self.0 == *other
    }
}

impl PartialEq<ConfigDuration> for Duration {
    fn eq(&self, other: &ConfigDuration) -> bool {
        *self == other.0
    }
}

impl fmt::Debug for ConfigDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// As [`format()`] writes it.
impl fmt::Display for ConfigDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format(self.0))
    }
}

/// As [`parse`] reads it (a `FERRY_*` variable's value).
impl FromStr for ConfigDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<ConfigDuration, String> {
        parse(s).map(ConfigDuration)
    }
}

/// As [`format()`] writes it (`ferry config show`).
impl Serialize for ConfigDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(self.0))
    }
}

/// A duration string, as [`parse`] reads it; anything else is refused as not "a duration
/// string like ...".
impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ConfigDuration, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = ConfigDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string like \"500ms\", \"5s\", \"2m\" or \"1h\"")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<ConfigDuration, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(Text)
    }
}

/// Parses a configuration duration.
pub fn parse(s: &str) -> Result<Duration, String> {
    let expected = || {
        format!("invalid duration {s:?}: expected a whole number and a unit (ms, s, m, h, d), like \"500ms\", \"5s\", \"2m\" or \"1h\"")
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
        "d" => 86_400_000,
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
        _ if ms % 86_400_000 == 0 => format!("{}d", ms / 86_400_000),
        _ if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        _ if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        _ if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        _ => format!("{ms}ms"),
    }
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
            "1w",
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

    #[derive(Debug, PartialEq, serde::Deserialize, serde::Serialize)]
    struct Keys {
        wait: ConfigDuration,
    }

    fn read(text: &str) -> Result<Keys, String> {
        toml::from_str(text).map_err(|e| e.message().to_owned())
    }

    #[test]
    fn a_config_duration_reads_and_writes_the_duration_string() {
        let keys = read("wait = \"90s\"").unwrap();
        assert_eq!(keys.wait, Duration::from_secs(90));
        assert_eq!(keys.wait.get(), Duration::from_secs(90));
        assert_eq!(
            toml::to_string(&keys).unwrap().trim(),
            "wait = \"90s\"",
            "written in the largest exact unit"
        );
        let keys = Keys {
            wait: Duration::from_millis(1500).into(),
        };
        assert_eq!(read(&toml::to_string(&keys).unwrap()), Ok(keys));
    }

    /// The file's reader (`config::file`) puts these in plain words; they must stay as they
    /// were when the fields were `Duration`s with `deserialize_with`.
    #[test]
    fn a_config_duration_refuses_what_parse_refuses_with_its_words() {
        assert_eq!(read("wait = \"5 s\""), Err(parse("5 s").unwrap_err()),);
        assert_eq!(
            read("wait = \"18446744073709551615h\"").unwrap_err(),
            "duration \"18446744073709551615h\" is too long"
        );
        assert_eq!(
            read("wait = 5").unwrap_err(),
            "invalid type: integer `5`, expected a duration string like \"500ms\", \"5s\", \"2m\" or \"1h\""
        );
        assert_eq!(
            "5".parse::<ConfigDuration>(),
            Err(parse("5").unwrap_err()),
            "FERRY_* variables"
        );
        assert_eq!(
            "2m".parse::<ConfigDuration>(),
            Ok(Duration::from_secs(120).into())
        );
    }

    #[test]
    fn a_config_duration_debugs_as_a_duration_and_displays_as_the_configuration_writes_it() {
        let d = ConfigDuration::new(Duration::from_secs(3600));
        assert_eq!(format!("{d:?}"), "3600s");
        assert_eq!(d.to_string(), "1h");
        assert_eq!(format!("{:?}", ConfigDuration::default()), "0ns");
        assert_eq!(Duration::from(d), Duration::from_secs(3600));
        assert!(
            d.as_millis() == 3_600_000 && !d.is_zero(),
            "derefs to the Duration"
        );
        assert!(ConfigDuration::from(Duration::from_millis(1)) < d);
    }
}
