//! PostgreSQL facts that Ferry's pure layers share, kept in one place: the reader
//! (`ferry-wal`, which decodes commit times and status-update times off the replication stream)
//! and the router (`ferry-router`, which reads binary `timestamp`/`timestamptz` columns) may not
//! import each other, so what they share lives here.
//!
//! [`Value`] is a column value as both see it: a range of the buffer it arrived in.
//!
//! [`Lsn`] is the one log sequence number type: the reader reads it off the stream, the core
//! (`ferry-core`) confirms it, and neither should need the other's crate for it.
//!
//! [`PgTimestamp`] is PostgreSQL's `TimestampTz` as sent on the wire: an Int64 of microseconds
//! since 2000-01-01 00:00:00 UTC ([`PgTimestamp::POSTGRES_EPOCH_UNIX_MICROS`] after the Unix
//! epoch; PostgreSQL's `POSTGRES_EPOCH_JDATE`). `infinity` and `-infinity` are `i64::MAX` and
//! `i64::MIN`.

pub mod lsn;
pub mod value;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use lsn::Lsn;
pub use value::Value;

/// A PostgreSQL `TimestampTz` as sent on the wire: microseconds since 2000-01-01 00:00:00 UTC.
///
/// Kept raw so that decoding is lossless; convert with [`PgTimestamp::to_unix_micros`] or
/// [`PgTimestamp::to_system_time`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Debug)]
pub struct PgTimestamp(pub i64);

impl PgTimestamp {
    /// Microseconds from the Unix epoch (1970-01-01) to the PostgreSQL epoch (2000-01-01).
    pub const POSTGRES_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

    /// The raw microseconds since 2000-01-01.
    pub const fn as_micros(self) -> i64 {
        self.0
    }

    /// Microseconds since the Unix epoch, `None` on overflow (only the `infinity` sentinels).
    pub const fn to_unix_micros(self) -> Option<i64> {
        self.0.checked_add(Self::POSTGRES_EPOCH_UNIX_MICROS)
    }

    /// From microseconds since the Unix epoch, `None` on overflow.
    pub const fn from_unix_micros(unix_micros: i64) -> Option<Self> {
        match unix_micros.checked_sub(Self::POSTGRES_EPOCH_UNIX_MICROS) {
            Some(v) => Some(PgTimestamp(v)),
            None => None,
        }
    }

    /// As a [`SystemTime`], `None` if the platform cannot represent it.
    pub fn to_system_time(self) -> Option<SystemTime> {
        let unix = self.to_unix_micros()?;
        let magnitude = Duration::from_micros(unix.unsigned_abs());
        if unix >= 0 {
            UNIX_EPOCH.checked_add(magnitude)
        } else {
            UNIX_EPOCH.checked_sub(magnitude)
        }
    }

    /// From a [`SystemTime`], truncated to microseconds and saturating at the i64 range.
    pub fn from_system_time(time: SystemTime) -> Self {
        let unix = match time.duration_since(UNIX_EPOCH) {
            Ok(after) => i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
            Err(before) => i64::try_from(before.duration().as_micros())
                .map(|m| -m)
                .unwrap_or(i64::MIN),
        };
        PgTimestamp(unix.saturating_sub(Self::POSTGRES_EPOCH_UNIX_MICROS))
    }

    /// The current time, for the `client_time` of a standby status update
    /// (`ferry_wal::wire::StandbyStatusUpdate`).
    pub fn now() -> Self {
        Self::from_system_time(SystemTime::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 2024-01-01T00:00:00Z in microseconds since 2000-01-01.
    const TS_VALUE: PgTimestamp = PgTimestamp(757_382_400_000_000);

    #[test]
    fn the_epoch_is_2000_01_01_utc() {
        // 30 years of 365 days plus the 7 leap days of 1972..=1996.
        let days = 30 * 365 + 7;
        assert_eq!(
            PgTimestamp::POSTGRES_EPOCH_UNIX_MICROS,
            days * 86_400 * 1_000_000
        );
        assert_eq!(
            PgTimestamp(0).to_unix_micros(),
            Some(PgTimestamp::POSTGRES_EPOCH_UNIX_MICROS)
        );
        assert_eq!(PgTimestamp(i64::MAX).to_unix_micros(), None);
    }

    #[test]
    fn now_is_a_postgres_timestamp() {
        let before = SystemTime::now();
        let now = PgTimestamp::now();
        let after = SystemTime::now();
        let t = now.to_system_time().unwrap();
        assert!(before - Duration::from_micros(1) <= t && t <= after);
        assert!(now > TS_VALUE);
    }

    proptest! {
        #[test]
        fn system_time_round_trips_at_microsecond_precision(micros in -10_000_000_000_000_000i64..10_000_000_000_000_000) {
            let ts = PgTimestamp(micros);
            prop_assert_eq!(PgTimestamp::from_system_time(ts.to_system_time().unwrap()), ts);
        }
    }
}
