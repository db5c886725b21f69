//! The acknowledgement watermark: the highest LSN that may be checkpointed, given what Kafka has
//! acknowledged so far. A pure state machine (no I/O, no clock, no tokio).
//!
//! # The guarantee
//!
//! Ferry reports an LSN to PostgreSQL as flushed only after Kafka has acknowledged every record of
//! every transaction at or below it. The server then discards that WAL and, after a restart, skips
//! every transaction whose commit record starts before the reported position; anything confirmed too
//! early is lost. [`Watermark::confirmed`] is the only source of that LSN.
//!
//! # How it is driven
//!
//! 1. [`Watermark::begin`] registers a transaction, in commit order, with its `commit_lsn` (pgoutput
//!    Begin's `final_lsn`). Call it when Begin arrives, before anything else of the transaction.
//! 2. [`Watermark::add_record`] is called for each record as it is handed to the producer
//!    (accepted); it returns a [`Mark`], a small `Copy` value that the relay core keeps in its
//!    in-flight table (`crate::inflight`) under the key the record travels with.
//! 3. [`Watermark::commit`] closes the transaction with its `end_lsn` (the end of the commit record).
//! 4. Delivery reports arrive in any order: [`Watermark::delivered`] (durable) or
//!    [`Watermark::failed`].
//!
//! [`Watermark::confirmed`] is the `end_lsn` of the newest closed transaction whose records, and the
//! records of all earlier transactions, are durable. A transaction without records is confirmable as
//! soon as it is closed and everything before it is durable.
//!
//! # Memory
//!
//! Records are numbered by a sequence counter that never restarts; a transaction owns the
//! contiguous range of sequence numbers handed out while it was open, so it is a handful of
//! counters, and memory is O(unconfirmed transactions), never O(records): a 1,000,000-row
//! transaction costs the same as a one-row one. A token is found in its transaction by binary
//! search over the ranges.
//!
//! Which reports are genuine is decided once, by the relay core's in-flight table: a token reaches
//! the watermark only from the table entry it was stored in, and that entry is removed by its
//! first report, so a duplicate or a forged report never gets here. What the watermark still
//! refuses is what its own structure shows for free (a sequence number never handed out, one more
//! report than a transaction has records): a cheap guard against a caller other than the core.
//!
//! # Failure freezes
//!
//! A failed delivery freezes the watermark: `confirmed()` never advances to or past the failed
//! record's transaction. Later successes are still counted (the gauges stay right and the pipeline
//! can drain) but never stepped over; Vector lost data exactly that way (issues #24215, #24543). The
//! failure is exposed by [`Watermark::failure`]. The only way out is a new session: the relay core
//! starts a new watermark at the position the server resumes from, and the server replays the
//! failed transaction.
//!
//! # Rewinds are errors
//!
//! Every call that would move positions backwards or break the protocol is a typed
//! [`WatermarkError`] and leaves the state untouched: a `begin` before the previous transaction's
//! `end_lsn` (or the confirmed position), a `commit` whose `end_lsn` is before its `commit_lsn`, a
//! second `begin` while a transaction is open, `add_record`/`commit` with none open, unknown or
//! duplicate tokens.
//!
//! A `commit_lsn` *equal* to the previous `end_lsn` is accepted: a commit record may start exactly
//! where the previous one ended (xlogreader's `EndRecPtr` is already aligned to the next record), for
//! example when the second transaction's changes were all written before the first one's commit.
//!
//! # Idle advance
//!
//! When nothing is registered or in flight (no open or unconfirmed transaction, no failure), a
//! keepalive's `wal_end` may be confirmed with [`Watermark::idle_advance`], so that an idle outbox
//! does not pin WAL on the server. Otherwise it is a no-op, and it never moves backwards. A
//! transaction's Begin always reaches the pipeline before any keepalive sent after it, so calling
//! [`Watermark::begin`] on Begin is what makes this safe. The relay core ([`crate::relay`]) keeps
//! a WAL end that came between transactions while records were in flight, and advances to it
//! once they are confirmed: the server sends no other keepalive until its WAL moves again.
//!
//! # Reconnect
//!
//! A watermark lives for one streaming session. After a reconnect the server replays every
//! transaction whose commit ends after the position the reader resumes from (the slot's
//! `confirmed_flush_lsn`), so the relay core starts a new watermark there; reports of records from
//! an earlier session are recognised by the in-flight table and never reach the new one.
//!
//! # In exactly-once mode
//!
//! The watermark is the same. The session machine ([`crate::session`]) holds a Kafka
//! transaction's reports until it commits and then releases them all at once: confirmation is
//! derived from per-transaction counters after each report, never pushed per record, so a batch
//! completing as a unit needs nothing of its own here.

use std::collections::VecDeque;

use ferry_pgtypes::Lsn;

/// Identifies one record handed to the producer, within its transaction.
///
/// Small and `Copy` (a sequence number and the record's size); the relay core keeps it in the
/// in-flight table entry of the record.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Mark {
    seq: u64,
    bytes: u32,
}

impl Mark {
    /// The record's sequence number (unique for the life of the [`Watermark`]).
    pub const fn seq(self) -> u64 {
        self.seq
    }

    /// The record's size as given to [`Watermark::add_record`].
    pub const fn bytes(self) -> u32 {
        self.bytes
    }
}

/// Why a call was refused. Every variant leaves the watermark unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatermarkError {
    /// `begin` while another transaction is still open.
    #[error("begin at commit_lsn {commit_lsn}: the transaction begun at {open} is still open")]
    AlreadyOpen { open: Lsn, commit_lsn: Lsn },
    /// `begin` before the previous transaction's `end_lsn` or the confirmed position.
    #[error("rewind: transaction commit_lsn {commit_lsn} is before {floor}, the previous transaction's end_lsn or the confirmed position")]
    Rewind { commit_lsn: Lsn, floor: Lsn },
    /// `add_record` or `commit` with no open transaction.
    #[error("{op} with no open transaction")]
    NoOpenTransaction { op: &'static str },
    /// `commit` with an `end_lsn` before the transaction's `commit_lsn`.
    #[error("commit end_lsn {end_lsn} is before the transaction's commit_lsn {commit_lsn}")]
    EndBeforeCommit { commit_lsn: Lsn, end_lsn: Lsn },
    /// A record larger than 4 GiB (Kafka's limit is about 1 GB).
    #[error("record of {bytes} bytes is too large to track (limit {})", u32::MAX)]
    RecordTooLarge { bytes: usize },
    /// A token this watermark never handed out.
    #[error("unknown token {seq}: never handed out by this watermark")]
    UnknownToken { seq: u64 },
    /// A second report for a record whose transaction is already fully reported or confirmed.
    #[error("duplicate delivery report for token {seq}: its transaction is already complete")]
    DuplicateToken { seq: u64 },
    /// A row of an outbox table the relay has no router for: the reader and the relay were
    /// given different tables.
    #[error("a row of outbox table #{table}, which the relay has no router for")]
    UnknownTable { table: usize },
}

/// The first failure that froze the watermark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryFailure {
    /// `commit_lsn` of the transaction that holds the failed record.
    pub commit_lsn: Lsn,
    /// The failed record's sequence number.
    pub seq: u64,
    /// Why it failed (the producer's error).
    pub reason: String,
}

/// Gauges for backpressure and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Gauges {
    /// Records accepted by the producer and not yet reported.
    pub in_flight_records: u64,
    /// Their total size in bytes (the memory bound).
    pub in_flight_bytes: u64,
    /// Registered transactions not yet confirmed, including the one still open.
    pub open_transactions: usize,
}

/// One registered, unconfirmed transaction: counters only.
#[derive(Debug, Clone)]
struct Txn {
    commit_lsn: Lsn,
    /// `None` while the transaction is open.
    end_lsn: Option<Lsn>,
    /// Its records are the sequence numbers `first_seq..first_seq + records`.
    first_seq: u64,
    records: u64,
    reported: u64,
    failed: bool,
}

impl Txn {
    fn is_durable(&self) -> bool {
        self.end_lsn.is_some() && !self.failed && self.reported == self.records
    }
}

/// The acknowledgement watermark; see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Watermark {
    confirmed: Lsn,
    /// The lowest `commit_lsn` the next `begin` may have: the last registered `end_lsn`, or
    /// `confirmed` if higher.
    floor: Lsn,
    /// Unconfirmed transactions, oldest first; only the last one may be open.
    txns: VecDeque<Txn>,
    next_seq: u64,
    in_flight_records: u64,
    in_flight_bytes: u64,
    failure: Option<DeliveryFailure>,
}

impl Watermark {
    /// A watermark starting at `confirmed`, normally the slot's `confirmed_flush_lsn`.
    pub fn new(confirmed: Lsn) -> Self {
        Watermark {
            confirmed,
            floor: confirmed,
            txns: VecDeque::new(),
            next_seq: 0,
            in_flight_records: 0,
            in_flight_bytes: 0,
            failure: None,
        }
    }

    /// The LSN that may be checkpointed (reported as flushed).
    pub fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    /// The failure that froze the watermark, if any.
    pub fn failure(&self) -> Option<&DeliveryFailure> {
        self.failure.as_ref()
    }

    /// Whether a failure froze the watermark ([`Watermark::failure`] says which).
    pub fn is_frozen(&self) -> bool {
        self.failure.is_some()
    }

    /// Records in flight (accepted, not yet reported).
    pub fn in_flight_records(&self) -> u64 {
        self.in_flight_records
    }

    /// Bytes in flight.
    pub fn in_flight_bytes(&self) -> u64 {
        self.in_flight_bytes
    }

    /// Registered transactions not yet confirmed, including the open one.
    pub fn open_transactions(&self) -> usize {
        self.txns.len()
    }

    /// All gauges at once.
    pub fn gauges(&self) -> Gauges {
        Gauges {
            in_flight_records: self.in_flight_records,
            in_flight_bytes: self.in_flight_bytes,
            open_transactions: self.txns.len(),
        }
    }

    /// The open transaction, if any.
    fn open(&self) -> Option<&Txn> {
        self.txns.back().filter(|t| t.end_lsn.is_none())
    }

    /// Registers the next transaction in commit order; it is open until [`Watermark::commit`].
    pub fn begin(&mut self, commit_lsn: Lsn) -> Result<(), WatermarkError> {
        if let Some(open) = self.open() {
            return Err(WatermarkError::AlreadyOpen {
                open: open.commit_lsn,
                commit_lsn,
            });
        }
        if commit_lsn < self.floor {
            return Err(WatermarkError::Rewind {
                commit_lsn,
                floor: self.floor,
            });
        }
        self.txns.push_back(Txn {
            commit_lsn,
            end_lsn: None,
            first_seq: self.next_seq,
            records: 0,
            reported: 0,
            failed: false,
        });
        Ok(())
    }

    /// Adds a record of `bytes` bytes to the open transaction as it is handed to the producer.
    pub fn add_record(&mut self, bytes: usize) -> Result<Mark, WatermarkError> {
        let bytes32 = u32::try_from(bytes).map_err(|_| WatermarkError::RecordTooLarge { bytes })?;
        let seq = self.next_seq;
        let txn = match self.txns.back_mut() {
            Some(t) if t.end_lsn.is_none() => t,
            _ => return Err(WatermarkError::NoOpenTransaction { op: "add_record" }),
        };
        let token = Mark {
            seq,
            bytes: bytes32,
        };
        txn.records += 1;
        self.next_seq += 1;
        self.in_flight_records += 1;
        self.in_flight_bytes += u64::from(bytes32);
        Ok(token)
    }

    /// Closes the open transaction at `end_lsn`; it becomes confirmable once all its records (and
    /// all earlier transactions') are durable.
    pub fn commit(&mut self, end_lsn: Lsn) -> Result<(), WatermarkError> {
        let txn = match self.txns.back_mut() {
            Some(t) if t.end_lsn.is_none() => t,
            _ => return Err(WatermarkError::NoOpenTransaction { op: "commit" }),
        };
        if end_lsn < txn.commit_lsn {
            return Err(WatermarkError::EndBeforeCommit {
                commit_lsn: txn.commit_lsn,
                end_lsn,
            });
        }
        txn.end_lsn = Some(end_lsn);
        self.floor = self.floor.max(end_lsn);
        self.advance();
        Ok(())
    }

    /// Kafka acknowledged the record: it is durable.
    pub fn delivered(&mut self, token: Mark) -> Result<(), WatermarkError> {
        self.report(token, None)
    }

    /// Kafka gave up on the record: the watermark freezes before its transaction.
    pub fn failed(&mut self, token: Mark, reason: impl Into<String>) -> Result<(), WatermarkError> {
        self.report(token, Some(reason.into()))
    }

    /// Confirms a keepalive's `wal_end` when nothing is registered or in flight. Returns whether
    /// `confirmed()` moved; it never moves backwards.
    pub fn idle_advance(&mut self, wal_end: Lsn) -> bool {
        if !self.txns.is_empty() || self.failure.is_some() || wal_end <= self.confirmed {
            return false;
        }
        self.confirmed = wal_end;
        self.floor = self.floor.max(wal_end);
        true
    }

    fn report(&mut self, token: Mark, failure: Option<String>) -> Result<(), WatermarkError> {
        let seq = token.seq;
        if seq >= self.next_seq {
            return Err(WatermarkError::UnknownToken { seq });
        }
        // Ranges are contiguous and ascending: the owner is the last transaction starting at or
        // before `seq`. Before the first one, the owner was confirmed or discarded.
        let idx = self.txns.partition_point(|t| t.first_seq <= seq);
        let Some(idx) = idx.checked_sub(1) else {
            return Err(WatermarkError::DuplicateToken { seq });
        };
        let txn = &mut self.txns[idx];
        if seq - txn.first_seq >= txn.records {
            // Unreachable while ranges are contiguous; refuse rather than miscount.
            return Err(WatermarkError::UnknownToken { seq });
        }
        if txn.reported >= txn.records {
            return Err(WatermarkError::DuplicateToken { seq });
        }
        txn.reported += 1;
        self.in_flight_records -= 1;
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(u64::from(token.bytes));
        if let Some(reason) = failure {
            txn.failed = true;
            let commit_lsn = txn.commit_lsn;
            self.failure.get_or_insert(DeliveryFailure {
                commit_lsn,
                seq,
                reason,
            });
        }
        self.advance();
        Ok(())
    }

    /// Confirms durable transactions from the front; stops at the first one that is not (a failed
    /// one is never durable, so it stops here for good).
    fn advance(&mut self) {
        while let Some(front) = self.txns.front() {
            if !front.is_durable() {
                break;
            }
            if let Some(end_lsn) = front.end_lsn {
                self.confirmed = self.confirmed.max(end_lsn);
            }
            self.txns.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a scenario script from `Watermark::new(Lsn(start))`: space-separated steps `b<lsn>`
    /// begin, `a<bytes>` add a record, `c<lsn>` commit, `d<i>`/`f<i>` deliver/fail the i-th token
    /// handed out, `i<lsn>` idle advance. Returns the watermark and each step's error.
    fn run(start: u64, script: &str) -> (Watermark, Vec<Option<WatermarkError>>) {
        let mut w = Watermark::new(Lsn(start));
        let mut tokens = Vec::new();
        let mut errors = Vec::new();
        for step in script.split_whitespace() {
            let (op, arg) = step.split_at(1);
            let n = || arg.parse::<u64>().unwrap();
            let r = match op {
                "b" => w.begin(Lsn(n())),
                "a" => w.add_record(arg.parse().unwrap()).map(|t| tokens.push(t)),
                "c" => w.commit(Lsn(n())),
                "d" => w.delivered(tokens[arg.parse::<usize>().unwrap()]),
                "f" => w.failed(tokens[arg.parse::<usize>().unwrap()], "broker down"),
                "i" => {
                    w.idle_advance(Lsn(n()));
                    Ok(())
                }
                _ => panic!("bad step {step:?}"),
            };
            errors.push(r.err());
        }
        (w, errors)
    }

    #[test]
    fn confirms_only_what_is_durable_in_order() {
        // (name, ops, expected confirmed, expected open transactions)
        let cases: &[(&str, &str, u64, usize)] = &[
            ("nothing registered", "", 100, 0),
            ("empty transaction confirms at commit", "b110 c120", 120, 0),
            ("open transaction pins", "b110 a5 d0", 100, 1),
            ("undelivered record pins", "b110 a5 c120", 100, 1),
            ("delivered then committed", "b110 a5 d0 c120", 120, 0),
            ("committed then delivered", "b110 a5 c120 d0", 120, 0),
            (
                "later transaction durable first waits for earlier",
                "b110 a1 c120 b130 a1 c140 d1",
                100,
                2,
            ),
            (
                "out of order reports confirm both once the gap closes",
                "b110 a1 c120 b130 a1 c140 d1 d0",
                140,
                0,
            ),
            (
                "partial: first durable, second not",
                "b110 a1 a1 c120 b130 a1 c140 d0 d1",
                120,
                1,
            ),
            (
                "records within a transaction complete in any order",
                "b110 a1 a2 a3 c120 d2 d0 d1",
                120,
                0,
            ),
            (
                "commit_lsn equal to previous end_lsn",
                "b110 c120 b120 c120",
                120,
                0,
            ),
            ("commit_lsn equal to start", "b100 c105", 105, 0),
        ];
        for (name, ops, confirmed, open) in cases {
            let (w, errors) = run(100, ops);
            assert!(errors.iter().all(Option::is_none), "{name}: {errors:?}");
            assert_eq!(w.confirmed(), Lsn(*confirmed), "{name}");
            assert_eq!(w.open_transactions(), *open, "{name}");
        }
    }

    #[test]
    fn a_failure_freezes_and_is_never_stepped_over() {
        // (name, ops, expected confirmed)
        let cases: &[(&str, &str, u64)] = &[
            ("failed record", "b110 a1 c120 f0", 100),
            (
                "later successes are counted but not stepped over",
                "b110 a1 c120 b130 a1 c140 d1 f0",
                100,
            ),
            (
                "failure after the later success",
                "b110 a1 c120 b130 a1 c140 f0 d1",
                100,
            ),
            (
                "earlier transactions still confirm",
                "b110 a1 c120 b130 a1 c140 f1 d0",
                120,
            ),
            (
                "one failed record among delivered ones",
                "b110 a1 a1 a1 c120 d0 f1 d2",
                100,
            ),
            (
                "failure in the open transaction",
                "b110 a1 f0 c120 b130 c140",
                100,
            ),
            (
                "idle advance is refused while frozen",
                "b110 a1 c120 f0 i500",
                100,
            ),
        ];
        for (name, ops, confirmed) in cases {
            let (w, errors) = run(100, ops);
            assert!(errors.iter().all(Option::is_none), "{name}: {errors:?}");
            assert_eq!(w.confirmed(), Lsn(*confirmed), "{name}");
            let failure = w
                .failure()
                .unwrap_or_else(|| panic!("{name}: no failure exposed"));
            assert_eq!(failure.reason, "broker down", "{name}");
            assert!(w.is_frozen(), "{name}");
            assert_eq!(
                w.in_flight_records(),
                0,
                "{name}: later reports still counted"
            );
        }
    }

    #[test]
    fn the_failure_names_its_transaction_and_record_and_the_first_one_wins() {
        let (w, _) = run(100, "b110 a1 a1 c120 f1 f0");
        let f = w.failure().unwrap();
        assert_eq!((f.commit_lsn, f.seq), (Lsn(110), 1));
    }

    #[test]
    fn protocol_violations_are_typed_errors_that_change_nothing() {
        type E = WatermarkError;
        // (name, ops; the last op must fail with the error)
        let cases: &[(&str, &str, E)] = &[
            (
                "begin before start",
                "b99",
                E::Rewind {
                    commit_lsn: Lsn(99),
                    floor: Lsn(100),
                },
            ),
            (
                "begin before previous end",
                "b110 a1 c120 b119",
                E::Rewind {
                    commit_lsn: Lsn(119),
                    floor: Lsn(120),
                },
            ),
            (
                "begin before previous end of a confirmed transaction",
                "b110 c120 b115",
                E::Rewind {
                    commit_lsn: Lsn(115),
                    floor: Lsn(120),
                },
            ),
            (
                "begin before an idle-advanced position",
                "i300 b299",
                E::Rewind {
                    commit_lsn: Lsn(299),
                    floor: Lsn(300),
                },
            ),
            (
                "begin while open",
                "b110 b120",
                E::AlreadyOpen {
                    open: Lsn(110),
                    commit_lsn: Lsn(120),
                },
            ),
            (
                "add with nothing begun",
                "a1",
                E::NoOpenTransaction { op: "add_record" },
            ),
            (
                "add after commit",
                "b110 c120 a1",
                E::NoOpenTransaction { op: "add_record" },
            ),
            (
                "commit with nothing begun",
                "c120",
                E::NoOpenTransaction { op: "commit" },
            ),
            (
                "commit twice",
                "b110 a1 c120 c130",
                E::NoOpenTransaction { op: "commit" },
            ),
            (
                "end before commit",
                "b110 c109",
                E::EndBeforeCommit {
                    commit_lsn: Lsn(110),
                    end_lsn: Lsn(109),
                },
            ),
            (
                "duplicate report, transaction still pending",
                "b110 a1 d0 d0",
                E::DuplicateToken { seq: 0 },
            ),
            (
                "duplicate report, transaction confirmed",
                "b110 a1 c120 d0 d0",
                E::DuplicateToken { seq: 0 },
            ),
            (
                "failure reported after delivery",
                "b110 a1 c120 d0 f0",
                E::DuplicateToken { seq: 0 },
            ),
        ];
        for (name, ops, expected) in cases {
            let setup = ops.rsplit_once(' ').map_or("", |(setup, _)| setup);
            let (before, errors) = run(100, setup);
            assert!(
                errors.iter().all(Option::is_none),
                "{name}: setup failed: {errors:?}"
            );
            let (after, errors) = run(100, ops);
            assert_eq!(errors.last().unwrap().as_ref(), Some(expected), "{name}");
            assert!(!expected.to_string().is_empty());
            // Nothing changed: same observable state as before the refused call.
            assert_eq!(after.confirmed(), before.confirmed(), "{name}");
            assert_eq!(after.gauges(), before.gauges(), "{name}");
            assert_eq!(after.failure(), before.failure(), "{name}");
            assert_eq!(after.floor, before.floor, "{name}");
        }
    }

    #[test]
    fn tokens_not_handed_out_are_refused() {
        let mut w = Watermark::new(Lsn(100));
        w.begin(Lsn(110)).unwrap();
        let t = w.add_record(10).unwrap();
        let never = Mark { seq: 5, bytes: 1 };
        assert_eq!(
            w.delivered(never),
            Err(WatermarkError::UnknownToken { seq: 5 })
        );
        assert_eq!(
            w.add_record(usize::MAX),
            Err(WatermarkError::RecordTooLarge { bytes: usize::MAX })
        );
        assert_eq!(w.in_flight_records(), 1);
        w.delivered(t).unwrap();
    }

    #[test]
    fn gauges_track_records_bytes_and_transactions() {
        let mut w = Watermark::new(Lsn(0));
        assert_eq!(w.gauges(), Gauges::default());
        w.begin(Lsn(10)).unwrap();
        let a = w.add_record(100).unwrap();
        let b = w.add_record(20).unwrap();
        w.commit(Lsn(20)).unwrap();
        w.begin(Lsn(30)).unwrap();
        let c = w.add_record(3).unwrap();
        let g = |r, b, t| Gauges {
            in_flight_records: r,
            in_flight_bytes: b,
            open_transactions: t,
        };
        assert_eq!(w.gauges(), g(3, 123, 2));
        w.delivered(b).unwrap();
        assert_eq!(w.gauges(), g(2, 103, 2));
        w.failed(c, "x").unwrap();
        assert_eq!(w.gauges(), g(1, 100, 2));
        w.delivered(a).unwrap();
        assert_eq!(w.gauges(), g(0, 0, 1));
        assert_eq!(w.confirmed(), Lsn(20));
    }

    #[test]
    fn idle_advance_only_when_nothing_is_pending_and_never_backwards() {
        // (name, ops, expected confirmed)
        let cases: &[(&str, &str, u64)] = &[
            ("idle", "i150", 150),
            ("never backwards", "i150 i120", 150),
            ("no-op while a transaction is open", "b110 i150", 100),
            ("no-op while an empty transaction is open", "b110 i105", 100),
            (
                "no-op while records are in flight",
                "b110 a1 c120 i150",
                100,
            ),
            (
                "applies after everything is confirmed",
                "b110 a1 c120 d0 i150",
                150,
            ),
            ("does not lower a confirmed end_lsn", "b110 c120 i115", 120),
            ("begin at the idle position is fine", "i150 b150 c160", 160),
        ];
        for (name, ops, confirmed) in cases {
            let (w, errors) = run(100, ops);
            assert!(errors.iter().all(Option::is_none), "{name}: {errors:?}");
            assert_eq!(w.confirmed(), Lsn(*confirmed), "{name}");
        }
        let mut w = Watermark::new(Lsn(100));
        assert!(w.idle_advance(Lsn(101)));
        assert!(!w.idle_advance(Lsn(101)));
    }

    #[test]
    fn a_large_transaction_is_a_counter() {
        let mut w = Watermark::new(Lsn(0));
        w.begin(Lsn(1)).unwrap();
        let tokens: Vec<Mark> = (0..1_000_000).map(|_| w.add_record(100).unwrap()).collect();
        w.commit(Lsn(2)).unwrap();
        assert_eq!(w.open_transactions(), 1);
        assert_eq!(w.in_flight_bytes(), 100_000_000);
        for t in tokens.iter().rev() {
            w.delivered(*t).unwrap();
        }
        assert_eq!(w.confirmed(), Lsn(2));
        assert_eq!(std::mem::size_of::<Mark>(), 16);
    }

    /// Rough cost of one add + deliver; prints, asserts nothing about time.
    #[test]
    #[ignore = "bench-ish: cargo test -p ferry-core --lib --release -- --ignored --nocapture watermark"]
    fn bench_add_and_deliver() {
        let mut w = Watermark::new(Lsn(0));
        let n: u64 = 5_000_000;
        let started = std::time::Instant::now();
        for i in 0..n / 1000 {
            w.begin(Lsn(i * 10 + 1)).unwrap();
            let mut window = Vec::with_capacity(1000);
            for _ in 0..1000 {
                window.push(w.add_record(200).unwrap());
            }
            w.commit(Lsn(i * 10 + 2)).unwrap();
            for t in window {
                w.delivered(t).unwrap();
            }
        }
        let ns = started.elapsed().as_nanos() / u128::from(n);
        println!("watermark: {ns} ns per add_record + delivered");
        assert_eq!(w.confirmed(), Lsn((n / 1000 - 1) * 10 + 2));
    }
}
