//! The one log sequence number type.
//!
//! A PostgreSQL LSN is a 64-bit byte position in the write-ahead log, written `X/X` (high and low
//! 32 bits in upper-case hex, no padding), as `pg_lsn` prints it. Fixed names for its meanings run
//! through the whole code base:
//!
//! - `commit_lsn`: where a transaction's commit record starts (pgoutput Begin's `final_lsn`).
//! - `end_lsn`: the end of the commit record; what is checkpointed once a transaction is durable.
//! - `wal_end`: the server's WAL end reported in a keepalive or XLogData header.
//! - `flush_lsn`: what Ferry reports to the server as flushed (the slot's `confirmed_flush_lsn`).

use std::fmt;
use std::str::FromStr;

/// A PostgreSQL log sequence number. Ordered, `Copy`, printed and parsed as `X/X`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    /// `0/0`, the invalid LSN: "no position".
    pub const ZERO: Lsn = Lsn(0);

    /// The raw 64-bit position.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// Whether this is the invalid LSN `0/0`.
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Bytes from `earlier` to `self`, zero when `earlier` is ahead.
    pub const fn saturating_sub(self, earlier: Lsn) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl From<u64> for Lsn {
    fn from(v: u64) -> Self {
        Lsn(v)
    }
}

impl From<Lsn> for u64 {
    fn from(v: Lsn) -> Self {
        v.0
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl fmt::Debug for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Lsn({self})")
    }
}

/// Why a string is not an LSN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid LSN {input:?}: expected two hexadecimal numbers of at most 8 digits separated by '/', like 16/B374D848")]
pub struct ParseLsnError {
    input: String,
}

impl FromStr for Lsn {
    type Err = ParseLsnError;

    /// Strict: exactly one `/`, each half 1 to 8 hex digits (either case), nothing else.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseLsnError {
            input: s.to_owned(),
        };
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        let half = |h: &str| -> Result<u64, ParseLsnError> {
            if h.is_empty() || h.len() > 8 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            u64::from_str_radix(h, 16).map_err(|_| err())
        };
        Ok(Lsn((half(hi)? << 32) | half(lo)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn displays_like_pg_lsn() {
        assert_eq!(Lsn(0).to_string(), "0/0");
        assert_eq!(Lsn(0x16_B374_D848).to_string(), "16/B374D848");
        assert_eq!(Lsn(u64::MAX).to_string(), "FFFFFFFF/FFFFFFFF");
        assert_eq!(Lsn(0x1_0000_0000).to_string(), "1/0");
    }

    #[test]
    fn parses_strictly() {
        assert_eq!("16/B374D848".parse::<Lsn>().unwrap(), Lsn(0x16_B374_D848));
        assert_eq!("0/0".parse::<Lsn>().unwrap(), Lsn::ZERO);
        assert_eq!("a/b".parse::<Lsn>().unwrap(), Lsn(0xA_0000_000B));
        for bad in [
            "",
            "/",
            "0/",
            "/0",
            "0/0/0",
            "0x1/0",
            " 0/0",
            "0/0 ",
            "+1/0",
            "-1/0",
            "123456789/0",
            "0/123456789",
            "g/0",
            "16B374D848",
            "1/-0",
        ] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn orders_by_position() {
        assert!(Lsn(1) < Lsn(2));
        assert!("1/0".parse::<Lsn>().unwrap() > "0/FFFFFFFF".parse::<Lsn>().unwrap());
        assert_eq!(Lsn(10).saturating_sub(Lsn(3)), 7);
        assert_eq!(Lsn(3).saturating_sub(Lsn(10)), 0);
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(v in any::<u64>()) {
            let lsn = Lsn(v);
            prop_assert_eq!(lsn.to_string().parse::<Lsn>().unwrap(), lsn);
        }
    }
}
