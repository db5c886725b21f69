//! Timestamp text: PostgreSQL's ISO output (`2026-11-22 10:00:00.123+00`) and RFC 3339, parsed to
//! microseconds since the Unix epoch with proleptic Gregorian arithmetic (no time-zone database:
//! PostgreSQL prints an explicit offset for timestamptz, and timestamp without time zone is UTC).

/// Parses PostgreSQL's ISO timestamp text (`2026-11-22 10:00:00.123+00`, `... +05:30`, no zone =
/// UTC) and RFC 3339 (`2026-11-22T10:00:00Z`) to microseconds since the Unix epoch.
pub fn parse_timestamp_micros(s: &str) -> Result<i64, String> {
    let bad = || {
        format!("{s:?} is not an ISO timestamp like 2026-11-22 10:00:00.123+00 (is DateStyle ISO?)")
    };
    let b = s.trim().as_bytes();
    if b.ends_with(b" BC") || b.ends_with(b"infinity") {
        return Err(format!(
            "{s:?} cannot be a record timestamp (infinite or BC)"
        ));
    }
    let mut p = Cursor { b, i: 0 };
    let year = p.digits(4, 9).ok_or_else(bad)?;
    p.expect(b'-').ok_or_else(bad)?;
    let month = p.digits(2, 2).ok_or_else(bad)?;
    p.expect(b'-').ok_or_else(bad)?;
    let day = p.digits(2, 2).ok_or_else(bad)?;
    if !(p.eat(b' ') || p.eat(b'T') || p.eat(b't')) {
        return Err(bad());
    }
    let hour = p.digits(2, 2).ok_or_else(bad)?;
    p.expect(b':').ok_or_else(bad)?;
    let minute = p.digits(2, 2).ok_or_else(bad)?;
    p.expect(b':').ok_or_else(bad)?;
    let second = p.digits(2, 2).ok_or_else(bad)?;
    let mut micros = 0i64;
    if p.eat(b'.') {
        let start = p.i;
        let frac = p.digits(1, 9).ok_or_else(bad)?;
        let n = p.i - start;
        micros = if n <= 6 {
            frac * 10i64.pow((6 - n) as u32)
        } else {
            frac / 10i64.pow((n - 6) as u32)
        };
    }
    let mut offset_secs = 0i64;
    if p.eat(b'Z') || p.eat(b'z') {
    } else if let Some(sign) = p.peek().filter(|c| *c == b'+' || *c == b'-') {
        p.i += 1;
        let oh = p.digits(2, 2).ok_or_else(bad)?;
        let mut om = 0;
        let mut os = 0;
        if p.eat(b':') {
            om = p.digits(2, 2).ok_or_else(bad)?;
            if p.eat(b':') {
                os = p.digits(2, 2).ok_or_else(bad)?;
            }
        }
        offset_secs = (oh * 3600 + om * 60 + os) * if sign == b'-' { -1 } else { 1 };
    }
    if p.i != b.len() {
        return Err(bad());
    }
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&month)
        || day < 1
        || day > month_days[(month - 1) as usize]
        || hour > 24
        || minute > 59
        || second > 60
    {
        return Err(format!("{s:?} is not a valid date and time"));
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_secs;
    secs.checked_mul(1_000_000)
        .and_then(|x| x.checked_add(micros))
        .ok_or_else(|| format!("{s:?} is out of range"))
}

struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }
    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: u8) -> Option<()> {
        self.eat(c).then_some(())
    }
    /// Between `min` and `max` ASCII digits.
    fn digits(&mut self, min: usize, max: usize) -> Option<i64> {
        let start = self.i;
        let mut n = 0i64;
        while self.i - start < max {
            match self.peek() {
                Some(d @ b'0'..=b'9') => {
                    n = n * 10 + i64::from(d - b'0');
                    self.i += 1;
                }
                _ => break,
            }
        }
        (self.i - start >= min).then_some(n)
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian `(year, month, day)` of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`, the inverse of `days_from_civil`).
pub(crate) fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `YYYY-MM-DD HH:MM:SS.ffffff` (UTC) for microseconds since the Unix epoch.
pub(crate) fn format_timestamp(unix_micros: i64) -> String {
    let secs = unix_micros.div_euclid(1_000_000);
    let micros = unix_micros.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{micros:06}",
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_pgtypes::PgTimestamp;

    #[test]
    fn timestamp_text_table() {
        let base = 1_795_341_600_000_000i64; // 2026-11-22 10:00:00 UTC
        let ok: &[(&str, i64)] = &[
            ("2026-11-22 10:00:00+00", base),
            ("2026-11-22 10:00:00.123+00", base + 123_000),
            ("2026-11-22 10:00:00.123456+00", base + 123_456),
            ("2026-11-22 10:00:00.1234567+00", base + 123_456),
            ("2026-11-22 10:00:00", base),
            ("2026-11-22T10:00:00Z", base),
            ("2026-11-22 12:30:00+02:30", base),
            ("2026-11-22 05:00:00-05", base),
            ("2026-11-22 10:00:10+00:00:10", base),
            ("1970-01-01 00:00:00+00", 0),
            ("1969-12-31 23:59:59.5+00", -500_000),
            (
                "2000-01-01 00:00:00+00",
                PgTimestamp::POSTGRES_EPOCH_UNIX_MICROS,
            ),
            ("2024-02-29 00:00:00+00", 1_709_164_800_000_000),
            ("10000-01-01 00:00:00+00", 253_402_300_800_000_000),
        ];
        for (s, want) in ok {
            assert_eq!(parse_timestamp_micros(s), Ok(*want), "{s}");
        }
        let bad = [
            "",
            "infinity",
            "-infinity",
            "2026-11-22",
            "2026-11-22 10:00",
            "2026-13-01 00:00:00",
            "2025-02-29 00:00:00",
            "2026-11-22 10:00:00+",
            "2026-11-22 10:00:00 junk",
            "0044-03-15 12:00:00+00 BC",
            "Sun Nov 22 10:00:00 2026 UTC",
            "22.11.2026 10:00:00",
        ];
        for s in bad {
            assert!(parse_timestamp_micros(s).is_err(), "{s}");
        }
    }

    #[test]
    fn timestamp_formatting_round_trips() {
        for micros in [
            0,
            -1,
            1_795_341_600_123_456,
            -62_135_596_800_000_000,
            253_402_300_799_999_999,
        ] {
            let s = format_timestamp(micros);
            assert_eq!(parse_timestamp_micros(&s), Ok(micros), "{s}");
        }
    }
}
