//! Model test of the acknowledgement watermark: random interleavings of begin / add / commit /
//! deliver / fail / duplicate report / idle advance, checked after every step against a
//! reference model that keeps every record's state and recomputes `confirmed` by scanning from the
//! start (the obviously-correct, O(records) way).

use ferry_core::watermark::{Gauges, Mark, Watermark, WatermarkError};
use ferry_wal::Lsn;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// `begin(floor + delta)`; negative deltas are rewinds.
    Begin(i64),
    Add(usize),
    /// `commit(open commit_lsn + delta)`; negative deltas end before the commit.
    Commit(i64),
    /// Deliver / fail the n-th in-flight record (modulo their number).
    Deliver(usize),
    Fail(usize),
    /// Report again the n-th record whose transaction is complete, confirmed or discarded.
    Duplicate(usize),
    /// `idle_advance(confirmed + delta)`.
    Idle(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (-3i64..20).prop_map(Op::Begin),
        6 => (0usize..1000).prop_map(Op::Add),
        3 => (-3i64..20).prop_map(Op::Commit),
        8 => any::<usize>().prop_map(Op::Deliver),
        1 => any::<usize>().prop_map(Op::Fail),
        1 => any::<usize>().prop_map(Op::Duplicate),
        2 => (-5i64..30).prop_map(Op::Idle),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    InFlight,
    Delivered,
    Failed,
}

#[derive(Debug)]
struct MTxn {
    commit: u64,
    end: Option<u64>,
    /// Indices into `Model::records`.
    records: Vec<usize>,
}

#[derive(Debug)]
struct MRecord {
    token: Mark,
    state: State,
    /// Whether its transaction was discarded by a reset.
    discarded: bool,
    txn: usize,
}

/// Every record and every transaction since the last reset, never forgotten.
#[derive(Debug, Default)]
struct Model {
    base: u64,
    txns: Vec<MTxn>,
    /// Index of the first transaction since the last reset.
    since_reset: usize,
    records: Vec<MRecord>,
}

impl Model {
    fn current(&self) -> &[MTxn] {
        &self.txns[self.since_reset..]
    }
    fn durable(&self, t: &MTxn) -> bool {
        t.end.is_some()
            && t.records
                .iter()
                .all(|&r| self.records[r].state == State::Delivered)
    }
    /// Number of leading durable transactions since the reset, and the confirmed LSN.
    fn scan(&self) -> (usize, u64) {
        let mut confirmed = self.base;
        let mut n = 0;
        for t in self.current() {
            if !self.durable(t) {
                break;
            }
            confirmed = confirmed.max(t.end.unwrap());
            n += 1;
        }
        (n, confirmed)
    }
    fn confirmed(&self) -> u64 {
        self.scan().1
    }
    fn floor(&self) -> u64 {
        self.current()
            .iter()
            .filter_map(|t| t.end)
            .fold(self.confirmed(), u64::max)
    }
    fn open(&self) -> Option<&MTxn> {
        self.current().last().filter(|t| t.end.is_none())
    }
    fn in_flight(&self) -> Vec<usize> {
        (0..self.records.len())
            .filter(|&i| self.records[i].state == State::InFlight)
            .collect()
    }
    fn txn_complete(&self, t: usize) -> bool {
        self.txns[t]
            .records
            .iter()
            .all(|&r| self.records[r].state != State::InFlight)
    }
    fn frozen(&self) -> bool {
        self.current()
            .iter()
            .flat_map(|t| &t.records)
            .any(|&r| self.records[r].state == State::Failed)
    }
    fn gauges(&self) -> Gauges {
        let flying = self.in_flight();
        Gauges {
            in_flight_records: flying.len() as u64,
            in_flight_bytes: flying
                .iter()
                .map(|&r| u64::from(self.records[r].token.bytes()))
                .sum(),
            open_transactions: self.current().len() - self.scan().0,
        }
    }
}

fn offset(base: u64, delta: i64) -> u64 {
    base.saturating_add_signed(delta)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn watermark_matches_the_reference_model(start in 0u64..50, ops in prop::collection::vec(op(), 1..200)) {
        let mut w = Watermark::new(Lsn(start));
        let mut m = Model { base: start, ..Model::default() };
        let mut last_confirmed = w.confirmed();
        for op in ops {
            match op {
                Op::Begin(delta) => {
                    let commit = offset(m.floor(), delta);
                    let expected = if let Some(open) = m.open() {
                        Err(WatermarkError::AlreadyOpen { open: Lsn(open.commit), commit_lsn: Lsn(commit) })
                    } else if commit < m.floor() {
                        Err(WatermarkError::Rewind { commit_lsn: Lsn(commit), floor: Lsn(m.floor()) })
                    } else {
                        m.txns.push(MTxn { commit, end: None, records: vec![] });
                        Ok(())
                    };
                    prop_assert_eq!(w.begin(Lsn(commit)), expected);
                }
                Op::Add(bytes) => match m.open().is_some() {
                    true => {
                        let token = w.add_record(bytes).unwrap();
                        prop_assert_eq!(usize::try_from(token.bytes()).unwrap(), bytes);
                        let txn = m.txns.len() - 1;
                        m.txns[txn].records.push(m.records.len());
                        m.records.push(MRecord { token, state: State::InFlight, discarded: false, txn });
                    }
                    false => prop_assert_eq!(
                        w.add_record(bytes),
                        Err(WatermarkError::NoOpenTransaction { op: "add_record" })
                    ),
                },
                Op::Commit(delta) => {
                    let Some(open) = m.open() else {
                        prop_assert_eq!(
                            w.commit(Lsn(offset(m.floor(), delta))),
                            Err(WatermarkError::NoOpenTransaction { op: "commit" })
                        );
                        continue;
                    };
                    let (commit, end) = (open.commit, offset(open.commit, delta));
                    if end < commit {
                        prop_assert_eq!(
                            w.commit(Lsn(end)),
                            Err(WatermarkError::EndBeforeCommit { commit_lsn: Lsn(commit), end_lsn: Lsn(end) })
                        );
                    } else {
                        prop_assert_eq!(w.commit(Lsn(end)), Ok(()));
                        m.txns.last_mut().unwrap().end = Some(end);
                    }
                }
                Op::Deliver(n) | Op::Fail(n) => {
                    let flying = m.in_flight();
                    if flying.is_empty() {
                        continue;
                    }
                    let r = flying[n % flying.len()];
                    let token = m.records[r].token;
                    if matches!(op, Op::Deliver(_)) {
                        prop_assert_eq!(w.delivered(token), Ok(()));
                        m.records[r].state = State::Delivered;
                    } else {
                        prop_assert_eq!(w.failed(token, "boom"), Ok(()));
                        m.records[r].state = State::Failed;
                    }
                }
                Op::Duplicate(n) => {
                    let stale: Vec<usize> = (0..m.records.len())
                        .filter(|&r| {
                            let rec = &m.records[r];
                            rec.state != State::InFlight && (rec.discarded || m.txn_complete(rec.txn))
                        })
                        .collect();
                    if stale.is_empty() {
                        continue;
                    }
                    let token = m.records[stale[n % stale.len()]].token;
                    let expected = Err(WatermarkError::DuplicateToken { seq: token.seq() });
                    prop_assert_eq!(w.delivered(token), expected.clone());
                    prop_assert_eq!(w.failed(token, "again"), expected);
                }
                Op::Idle(delta) => {
                    let wal_end = offset(m.confirmed(), delta);
                    let idle = m.open().is_none() && m.scan().0 == m.current().len();
                    let moves = idle && wal_end > m.confirmed();
                    prop_assert_eq!(w.idle_advance(Lsn(wal_end)), moves);
                    if moves {
                        m.base = wal_end;
                    }
                }
            }

            // The watermark agrees with the model, never moves back, never passes a record that is
            // not durable (a transaction holding one starts at or after `confirmed`), and its
            // gauges and freeze agree.
            prop_assert_eq!(w.confirmed(), Lsn(m.confirmed()));
            prop_assert!(w.confirmed() >= last_confirmed);
            last_confirmed = w.confirmed();
            for t in m.current() {
                if !m.durable(t) {
                    prop_assert!(Lsn(t.commit) >= w.confirmed(), "confirmed {} passes {:?}", w.confirmed(), t);
                }
            }
            prop_assert_eq!(w.gauges(), m.gauges());
            prop_assert_eq!(w.is_frozen(), m.frozen());
        }
    }
}
