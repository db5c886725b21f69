//! Byte sizes in the configuration: a whole number of bytes (`983040`) or a whole number with a
//! unit (`"32MiB"`, `"64 KiB"`, `"1GB"`).
//!
//! Binary units `KiB`, `MiB`, `GiB` (powers of 1024) and decimal units `kB`/`KB`, `MB`, `GB`
//! (powers of 1000, as the SI and Kafka's documentation use them), and `B`. One optional space
//! between the number and the unit (the README writes `32 MiB`). No fractions, no signs. Printed
//! back in the largest binary unit that is exact, or as bytes.

use serde::Deserializer;

/// Units and their sizes, longest spelling first.
const UNITS: &[(&str, u64)] = &[
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("kB", 1_000),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("B", 1),
];

/// Parses a size: digits, then optionally one space and a unit.
pub fn parse(s: &str) -> Result<u64, String> {
    let expected = || {
        format!(
            "invalid size {s:?}: expected a whole number of bytes, or one with a unit \
             (B, KiB, MiB, GiB, kB, MB, GB), like \"983040\", \"64KiB\" or \"32MiB\""
        )
    };
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    if number.is_empty() {
        return Err(expected());
    }
    let n: u64 = number
        .parse()
        .map_err(|_| format!("size {s:?} is too large"))?;
    if unit.is_empty() {
        return Ok(n);
    }
    let unit = unit.strip_prefix(' ').unwrap_or(unit);
    let (_, per) = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .ok_or_else(expected)?;
    n.checked_mul(*per)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// Formats a size as [`parse`] reads it: `"32MiB"`, or the bare number when no binary unit is
/// exact.
pub fn format(n: u64) -> String {
    for (name, per) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n != 0 && n % per == 0 {
            return format!("{}{name}", n / per);
        }
    }
    n.to_string()
}

/// `#[serde(deserialize_with = "size::deserialize")]`: an integer or a size string.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct Size;
    impl serde::de::Visitor<'_> for Size {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a number of bytes, or a size string like \"32MiB\"")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v)
                .map_err(|_| E::custom(format!("invalid value {v}: a size must not be negative")))
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<u64, E> {
            parse(s).map_err(E::custom)
        }
    }
    d.deserialize_any(Size)
}

/// `#[serde(serialize_with = "size::serialize")]`: as [`format`] writes it (`"32MiB"`), or a
/// bare integer when no unit is exact.
pub fn serialize<S: serde::Serializer>(n: &u64, s: S) -> Result<S::Ok, S::Error> {
    let text = format(*n);
    if text.bytes().all(|b| b.is_ascii_digit()) {
        s.serialize_u64(*n)
    } else {
        s.serialize_str(&text)
    }
}

/// [`deserialize`] into a `usize`.
pub fn deserialize_usize<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = deserialize(d)?;
    usize::try_from(n).map_err(|_| serde::de::Error::custom(format!("size {n} is too large")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_numbers_and_units() {
        let cases = [
            ("983040", 983_040),
            ("0", 0),
            ("32MiB", 32 << 20),
            ("32 MiB", 32 << 20),
            ("64KiB", 64 << 10),
            ("1GiB", 1 << 30),
            ("1GB", 1_000_000_000),
            ("5MB", 5_000_000),
            ("500kB", 500_000),
            ("500KB", 500_000),
            ("7B", 7),
        ];
        for (text, n) in cases {
            assert_eq!(parse(text), Ok(n), "{text}");
        }
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            "MiB",
            "1.5MiB",
            "-1",
            "+1",
            "32mib",
            "32 mib",
            "32  MiB",
            " 32",
            "32 ",
            "32M",
            "32Mi",
            "1TB",
            "1e6",
            "32MiBs",
            "99999999999999999999",
            "17179869184GiB",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad:?}: {err}");
        }
    }

    #[test]
    fn a_negative_number_in_the_file_is_refused() {
        #[derive(serde::Deserialize, Debug)]
        struct S {
            #[serde(deserialize_with = "deserialize")]
            #[allow(dead_code)]
            n: u64,
        }
        let err = toml::from_str::<S>("n = -1").unwrap_err().to_string();
        assert!(
            err.contains("invalid value -1: a size must not be negative"),
            "{err}"
        );
        assert_eq!(toml::from_str::<S>("n = \"1KiB\"").unwrap().n, 1024);
    }

    #[test]
    fn formats_in_the_largest_exact_binary_unit_and_round_trips() {
        for (n, text) in [
            (0, "0"),
            (983_040, "960KiB"),
            (32 << 20, "32MiB"),
            (3 << 30, "3GiB"),
            (1_000_000, "1000000"),
            (1025, "1025"),
        ] {
            assert_eq!(format(n), text);
            assert_eq!(parse(text), Ok(n));
        }
    }
}
