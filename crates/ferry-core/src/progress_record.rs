//! The progress record: where Ferry is, remembered in Kafka, outside the slot.
//!
//! The slot's `confirmed_flush_lsn` says where the server resumes; it cannot say that the slot is
//! the one Ferry used before. A slot dropped and created again, a failover to a server without
//! it, or something else advancing it all leave a slot that looks healthy and a gap in the
//! events. So Ferry also writes where it is into its own Kafka topic (the *progress topic*:
//! single partition, compacted), one record per slot and server, and the slot is confirmed only
//! up to a position a progress record already holds. Then, at every start, the slot can never be
//! ahead of the remembered position unless something other than Ferry moved it.
//!
//! - **At-least-once mode** writes a record with the confirmed LSN before it confirms it to the
//!   server (at most every few hundred milliseconds), so the record is always at or ahead of the
//!   slot.
//! - **Exactly-once mode** writes the record inside every Kafka transaction, after the outbox
//!   records it covers, with the exact position reached: a restart skips every event the record
//!   [covers](ProgressRecord::covers).
//!
//! # The position
//!
//! `end_lsn` is the end LSN of the last whole PostgreSQL transaction all of whose events are
//! handled in Kafka (the LSN the slot may be confirmed to). Because the rows of a committed
//! transaction replay in the same order, the position is exact inside a transaction too:
//! `partial` names a transaction by its commit LSN and how many of its outbox events (rows and
//! messages, in WAL order, whatever `route.on_error` did with them) are handled. A transaction's
//! commit LSN is below its end LSN, and every later transaction's commit LSN is at or above it,
//! so "the transaction is whole in Kafka" is `commit_lsn < end_lsn`.
//!
//! # Format
//!
//! Both key and value are JSON, so an operator reads them with any console consumer. The key
//! names the server (its system identifier) and the slot; compaction keeps the newest value per
//! key. The value carries a `format` number: a record of a newer format is refused with what to
//! do, never guessed at.

use std::fmt;
use std::str::FromStr;

use ferry_pgtypes::Lsn;
use serde::{Deserialize, Serialize};

/// The format written; decoding reads it and every older one, and refuses a newer one.
///
/// Format 2 added `since_unix_millis`; a Ferry that reads only format 1 refuses format 2 records
/// as written by a newer Ferry (a downgrade past it needs the record rewritten: see the
/// CHANGELOG).
pub const FORMAT: u32 = 2;

/// Whose progress a record is: one slot on one server.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgressKey {
    /// The server's system identifier (`IDENTIFY_SYSTEM`), as a decimal string: it exceeds
    /// what JSON numbers hold exactly in many readers.
    #[serde(with = "decimal")]
    pub system_id: u64,
    pub slot: String,
}

/// Which delivery mode wrote a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    AtLeastOnce,
    ExactlyOnce,
}

/// A transaction partly handled in Kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Partial {
    /// The transaction's commit LSN (pgoutput's Begin `final_lsn`).
    #[serde(with = "lsn")]
    pub commit_lsn: Lsn,
    /// How many of its outbox events, from the first, are handled.
    pub events: u64,
}

/// Where Ferry is; see the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgressRecord {
    pub format: u32,
    pub mode: Mode,
    /// The server's timeline when the record was written.
    pub timeline: u32,
    /// End LSN of the last whole transaction handled in Kafka.
    #[serde(with = "lsn")]
    pub end_lsn: Lsn,
    /// A transaction after `end_lsn` partly handled (exactly-once mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<Partial>,
    /// When it was written (Unix milliseconds; for operators).
    pub written_unix_millis: i64,
    /// Every transaction after `end_lsn` (and after `partial`'s events) was committed at or
    /// after about this time (Unix milliseconds): the commit time of the transaction at
    /// `end_lsn`, or when the server reported its WAL end there. Should events after the record
    /// go missing, `ferry replay --since` starts here. Absent in records of older Ferry
    /// versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_unix_millis: Option<i64>,
}

/// Why a key or value could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProgressError {
    #[error("the progress record is not valid JSON of Ferry's progress format: {0}")]
    Malformed(String),
    #[error(
        "the progress record has format {found}, this Ferry reads formats 1 to {FORMAT}: it was written by a newer Ferry; run that version (or newer) against this slot"
    )]
    NewerFormat { found: u32 },
}

/// `3 event(s) of the transaction committed at 0/16B374D9`, for logs.
impl fmt::Display for Partial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} event(s) of the transaction committed at {}",
            self.events, self.commit_lsn
        )
    }
}

impl ProgressRecord {
    /// The position in words, for logs: `0/16B374D8`, or `0/16B374D8, then 3 event(s) of the
    /// transaction committed at 0/16B374D9`.
    pub fn position(&self) -> String {
        match &self.partial {
            None => self.end_lsn.to_string(),
            Some(p) => format!("{}, then {p}", self.end_lsn),
        }
    }
}

impl ProgressKey {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a progress key always serializes")
    }

    pub fn decode(bytes: &[u8]) -> Result<ProgressKey, ProgressError> {
        serde_json::from_slice(bytes).map_err(|e| ProgressError::Malformed(e.to_string()))
    }
}

impl fmt::Display for ProgressKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slot {} on system {}", self.slot, self.system_id)
    }
}

impl ProgressRecord {
    /// A record of whole transactions up to `end_lsn`.
    pub fn whole(mode: Mode, timeline: u32, end_lsn: Lsn, written_unix_millis: i64) -> Self {
        ProgressRecord {
            format: FORMAT,
            mode,
            timeline,
            end_lsn,
            partial: None,
            written_unix_millis,
            since_unix_millis: None,
        }
    }

    /// The record of `position` (whole transactions and, inside the next, the events handled;
    /// its replay bound kept to the millisecond).
    pub fn at(
        mode: Mode,
        timeline: u32,
        position: &crate::relay::Position,
        written_unix_millis: i64,
    ) -> Self {
        ProgressRecord {
            partial: position.partial,
            since_unix_millis: position.since_unix_micros.map(|t| t.div_euclid(1000)),
            ..ProgressRecord::whole(mode, timeline, position.end_lsn, written_unix_millis)
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a progress record always serializes")
    }

    pub fn decode(bytes: &[u8]) -> Result<ProgressRecord, ProgressError> {
        // The format first, so that a newer record is refused as such and not as malformed.
        #[derive(Deserialize)]
        struct Format {
            format: u32,
        }
        let f: Format =
            serde_json::from_slice(bytes).map_err(|e| ProgressError::Malformed(e.to_string()))?;
        if f.format > FORMAT || f.format == 0 {
            return Err(ProgressError::NewerFormat { found: f.format });
        }
        serde_json::from_slice(bytes).map_err(|e| ProgressError::Malformed(e.to_string()))
    }

    #[cfg(test)]
    fn with_format(self, format: u32) -> Self {
        ProgressRecord { format, ..self }
    }

    /// Whether the event at `index` (0-based, in WAL order) of the transaction committed at
    /// `commit_lsn` is already handled in Kafka: a restart skips it.
    pub fn covers(&self, commit_lsn: Lsn, index: u64) -> bool {
        commit_lsn < self.end_lsn
            || self
                .partial
                .is_some_and(|p| p.commit_lsn == commit_lsn && index < p.events)
    }

    /// The LSN the slot may be confirmed to under this record.
    pub fn confirmable(&self) -> Lsn {
        self.end_lsn
    }
}

/// An LSN as PostgreSQL writes it (`16/B374D848`).
mod lsn {
    use super::*;

    pub fn serialize<S: serde::Serializer>(lsn: &Lsn, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(lsn)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Lsn, D::Error> {
        let s = String::deserialize(d)?;
        Lsn::from_str(&s).map_err(serde::de::Error::custom)
    }
}

/// A `u64` as a decimal string.
mod decimal {
    use super::*;

    pub fn serialize<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(end: u64, partial: Option<(u64, u64)>) -> ProgressRecord {
        ProgressRecord {
            partial: partial.map(|(c, events)| Partial {
                commit_lsn: Lsn(c),
                events,
            }),
            ..ProgressRecord::whole(Mode::ExactlyOnce, 1, Lsn(end), 1_700_000_000_000)
        }
    }

    #[test]
    fn the_wire_form_is_stable() {
        let key = ProgressKey {
            system_id: 7_312_345_678_901_234_567,
            slot: "ferry".into(),
        };
        assert_eq!(
            String::from_utf8(key.encode()).unwrap(),
            r#"{"system_id":"7312345678901234567","slot":"ferry"}"#
        );
        let r = record(0x16_B374_D848, Some((0x16_B374_D900, 3)));
        assert_eq!(
            String::from_utf8(r.encode()).unwrap(),
            r#"{"format":2,"mode":"exactly_once","timeline":1,"end_lsn":"16/B374D848","partial":{"commit_lsn":"16/B374D900","events":3},"written_unix_millis":1700000000000}"#
        );
        let bounded = ProgressRecord {
            since_unix_millis: Some(1_699_999_999_000),
            ..ProgressRecord::whole(Mode::AtLeastOnce, 2, Lsn(0x10), 5)
        };
        assert_eq!(
            String::from_utf8(bounded.encode()).unwrap(),
            r#"{"format":2,"mode":"at_least_once","timeline":2,"end_lsn":"0/10","written_unix_millis":5,"since_unix_millis":1699999999000}"#
        );
        // Format 1 (before since_unix_millis) still reads.
        let old = br#"{"format":1,"mode":"at_least_once","timeline":2,"end_lsn":"0/10","written_unix_millis":5}"#;
        assert_eq!(
            ProgressRecord::decode(old).unwrap(),
            ProgressRecord::whole(Mode::AtLeastOnce, 2, Lsn(0x10), 5).with_format(1)
        );
        let whole = ProgressRecord::whole(Mode::AtLeastOnce, 2, Lsn(0x10), 5);
        assert_eq!(
            String::from_utf8(whole.encode()).unwrap(),
            r#"{"format":2,"mode":"at_least_once","timeline":2,"end_lsn":"0/10","written_unix_millis":5}"#
        );
    }

    #[test]
    fn bad_and_newer_records_are_refused_with_what_to_do() {
        assert!(matches!(
            ProgressRecord::decode(b"{\"format\":1}"),
            Err(ProgressError::Malformed(_))
        ));
        assert!(matches!(
            ProgressRecord::decode(b"not json"),
            Err(ProgressError::Malformed(_))
        ));
        let newer = br#"{"format":3,"something":"else"}"#;
        let e = ProgressRecord::decode(newer).unwrap_err();
        assert_eq!(e, ProgressError::NewerFormat { found: 3 });
        assert!(e.to_string().contains("newer Ferry"), "{e}");
        let bad_lsn = br#"{"format":1,"mode":"at_least_once","timeline":1,"end_lsn":"16-0","written_unix_millis":0}"#;
        assert!(matches!(
            ProgressRecord::decode(bad_lsn),
            Err(ProgressError::Malformed(_))
        ));
        assert!(ProgressKey::decode(br#"{"system_id":7,"slot":"s"}"#).is_err());
    }

    #[test]
    fn covers_whole_transactions_and_the_handled_prefix_of_a_partial_one() {
        // Transactions: A commits at 100 and ends at 110; B commits at 120.
        let after_a = record(110, None);
        assert!(after_a.covers(Lsn(100), 0));
        assert!(after_a.covers(Lsn(100), u64::MAX));
        assert!(!after_a.covers(Lsn(120), 0));
        assert!(
            !after_a.covers(Lsn(110), 0),
            "a commit at the end LSN is the next transaction"
        );
        let into_b = record(110, Some((120, 2)));
        assert!(into_b.covers(Lsn(120), 0));
        assert!(into_b.covers(Lsn(120), 1));
        assert!(!into_b.covers(Lsn(120), 2));
        assert!(!into_b.covers(Lsn(130), 0));
        assert_eq!(into_b.confirmable(), Lsn(110));
    }

    proptest! {
        #[test]
        fn round_trips(
            system_id in any::<u64>(),
            slot in "[a-z0-9_]{1,63}",
            end in any::<u64>(),
            partial in proptest::option::of((any::<u64>(), any::<u64>())),
            timeline in any::<u32>(),
            millis in any::<i64>(),
            exactly in any::<bool>(),
        ) {
            let key = ProgressKey { system_id, slot };
            prop_assert_eq!(ProgressKey::decode(&key.encode()).unwrap(), key);
            let mut r = record(end, partial);
            r.timeline = timeline;
            r.written_unix_millis = millis;
            r.mode = if exactly { Mode::ExactlyOnce } else { Mode::AtLeastOnce };
            prop_assert_eq!(ProgressRecord::decode(&r.encode()).unwrap(), r);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = ProgressRecord::decode(&bytes);
            let _ = ProgressKey::decode(&bytes);
        }
    }
}
