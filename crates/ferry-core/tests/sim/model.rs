//! The reference model: what Kafka holds, and the guarantees checked against it at every step.
//!
//! - **Confirmed never passes what Kafka holds.** Every record of every transaction ending at or
//!   below a confirmed LSN is in Kafka (at-least-once: landed; exactly-once: committed, visible
//!   to read_committed consumers). At-least-once: it never passes the newest acknowledged
//!   progress record, nor the newest record of the progress topic. Exactly-once: it never passes
//!   the end LSN of the newest committed progress record, and a committed progress record never
//!   covers an event that is not committed.
//! - **The slot is never ahead of the newest progress record** in Kafka (checked by the driver
//!   after every step, and at every start as the start-time verdict does).
//! - **Never backwards**: within a session each confirmed LSN is above the one before and above
//!   where the session resumed. At-least-once: after a failed or refused record, nothing at or
//!   past its transaction's end is confirmed in that session. Exactly-once: each committed
//!   progress record covers at least the events the one before covered.
//! - **Order**: per key, first deliveries follow commit order (exactly-once: what read_committed
//!   consumers see, per key, is a prefix of the key's events in commit order).
//! - **Exactly-once**: what read_committed consumers see holds every event at most once, and at
//!   the end exactly once. **At-least-once**: at the end every committed row is in Kafka.
//! - **The window** (checked by the driver): records in flight never exceed the record bound,
//!   bytes exceed the byte bound by less than one record; a Kafka transaction never holds more
//!   than its cap.

use ferry_router::OnError;

use super::wal::{Kind, Txn, KEYS};

#[derive(Debug)]
pub struct Model {
    exactly_once: bool,
    /// Per event id (from 1): whether Kafka must hold it (a poison row only as a dead letter,
    /// and only under `dead_letter`), its key, and whether it is a poison row.
    required: Vec<bool>,
    poison: Vec<bool>,
    /// Per key, its events (ids) in commit order, and how many have been delivered first.
    key_order: [Vec<u64>; KEYS],
    key_next: [usize; KEYS],
    /// Copies of each event in Kafka (exactly-once: committed ones).
    pub copies: Vec<u32>,
    pub duplicates: u64,
    /// Transactions (in order) verified to be wholly in Kafka.
    verified: usize,
    /// Exactly-once: transactions verified to be wholly committed under a progress record, and
    /// how many events (a prefix of the WAL's) the newest committed record covers.
    covered: usize,
    progress_events: usize,
    /// The session: where it resumed, what it confirmed last, the lowest end of a transaction
    /// with a failed record.
    resumed: u64,
    session_confirmed: u64,
    frozen_below: Option<u64>,
}

impl Model {
    pub fn new(txns: &[Txn], policy: OnError, exactly_once: bool) -> Model {
        let n = txns.iter().map(|t| t.events.len()).sum::<usize>() + 1;
        let mut required = vec![false; n];
        let mut poison = vec![false; n];
        let mut key_order: [Vec<u64>; KEYS] = Default::default();
        for e in txns.iter().flat_map(|t| &t.events) {
            let p = e.kind == Kind::Poison;
            poison[e.id as usize] = p;
            required[e.id as usize] = !p || policy == OnError::DeadLetter;
            if !p {
                key_order[e.key as usize].push(e.id);
            }
        }
        Model {
            exactly_once,
            required,
            poison,
            key_order,
            key_next: [0; KEYS],
            copies: vec![0; n],
            duplicates: 0,
            verified: 0,
            covered: 0,
            progress_events: 0,
            resumed: 0,
            session_confirmed: 0,
            frozen_below: None,
        }
    }

    /// A session starts from `resume`.
    pub fn session(&mut self, resume: u64) {
        self.resumed = resume;
        self.session_confirmed = resume;
        self.frozen_below = None;
    }

    /// A record of the event `id` landed in Kafka (exactly-once: was committed).
    pub fn landed(&mut self, id: u64, key: u8, dead_letter: bool) {
        let i = id as usize;
        assert_eq!(
            self.poison[i], dead_letter,
            "event {id}: a poison row must go (only) to the dead-letter topic"
        );
        self.copies[i] += 1;
        if self.copies[i] > 1 {
            self.duplicates += 1;
            assert!(
                !self.exactly_once,
                "event {id} (dead letter: {dead_letter}) committed twice"
            );
            return;
        }
        if !dead_letter {
            let next = &mut self.key_next[key as usize];
            assert_eq!(
                self.key_order[key as usize].get(*next),
                Some(&id),
                "key {key}: first delivery of event {id} out of commit order"
            );
            *next += 1;
        }
    }

    /// A record of the session failed (or was refused) in the transaction ending at `end`.
    pub fn failed(&mut self, end: u64) {
        self.frozen_below = Some(self.frozen_below.map_or(end, |b| b.min(end)));
    }

    /// The session confirmed `lsn`; `limit` is the progress record it may not pass (at-least-once:
    /// the newest acknowledged one; exactly-once: the newest committed one).
    pub fn confirmed(&mut self, txns: &[Txn], lsn: u64, limit: Option<u64>, what: &str) {
        assert!(
            lsn > self.session_confirmed,
            "confirmed {lsn} after {} in the same session (resumed at {})",
            self.session_confirmed,
            self.resumed
        );
        self.session_confirmed = lsn;
        if let Some(end) = self.frozen_below {
            assert!(
                lsn < end,
                "confirmed {lsn} past a failed transaction ending at {end}"
            );
        }
        assert!(
            limit.is_some_and(|l| lsn <= l),
            "confirmed {lsn} past {what} ({limit:?})"
        );
        // Everything at or below it will never be sent again: it must all be in Kafka.
        self.verified = self.check_held(txns, self.verified, lsn, "confirmed");
    }

    /// The transactions from `from` on that end at or below `lsn` are wholly in Kafka; returns
    /// the index of the first one past `lsn`.
    fn check_held(&self, txns: &[Txn], from: usize, lsn: u64, what: &str) -> usize {
        let mut i = from;
        while let Some(t) = txns.get(i) {
            if t.end_lsn > lsn {
                break;
            }
            for e in &t.events {
                assert!(
                    !self.required[e.id as usize] || self.copies[e.id as usize] > 0,
                    "{what} {lsn} passes event {} of the transaction ending at {}, which Kafka does not hold",
                    e.id,
                    t.end_lsn
                );
            }
            i += 1;
        }
        i
    }

    /// Exactly-once: a progress record at `end_lsn` (and `partial`: the first `events` events of
    /// the transaction committed at `commit_lsn`) was committed with what is now visible.
    pub fn progress_committed(&mut self, txns: &[Txn], end_lsn: u64, partial: Option<(u64, u64)>) {
        self.covered = self.check_held(txns, self.covered, end_lsn, "the progress record at");
        // Never backwards: the events a record covers are a prefix of the WAL's, and each
        // committed record's is at least as long as the one before.
        let whole: usize = txns
            .iter()
            .take_while(|t| t.commit_lsn < end_lsn)
            .map(|t| t.events.len())
            .sum();
        let events_covered = whole + partial.map_or(0, |p| p.1 as usize);
        assert!(
            events_covered >= self.progress_events,
            "the progress record committed at {end_lsn} {partial:?} covers {events_covered} events, the one before {}",
            self.progress_events
        );
        self.progress_events = events_covered;
        let Some((commit_lsn, events)) = partial else {
            return;
        };
        let t = txns
            .iter()
            .find(|t| t.commit_lsn == commit_lsn)
            .unwrap_or_else(|| panic!("a progress record inside no transaction: {commit_lsn}"));
        assert!(
            events as usize <= t.events.len(),
            "a progress record past its transaction's last event"
        );
        for e in &t.events[..events as usize] {
            assert!(
                !self.required[e.id as usize] || self.copies[e.id as usize] > 0,
                "the progress record at {commit_lsn}:{events} covers event {}, which is not committed",
                e.id
            );
        }
    }

    /// At the end: every event Kafka must hold is there (exactly-once: exactly once), and none
    /// it must not hold.
    pub fn finish(&self, txns: &[Txn]) {
        for e in txns.iter().flat_map(|t| &t.events) {
            let n = self.copies[e.id as usize];
            if !self.required[e.id as usize] {
                assert_eq!(n, 0, "event {} is in Kafka against the policy", e.id);
            } else if self.exactly_once {
                assert_eq!(n, 1, "event {} committed {n} times", e.id);
            } else {
                assert!(n > 0, "event {} never reached Kafka", e.id);
            }
        }
    }
}
