//! Deterministic simulation of the relay core: the real core and the real router, driven by a
//! simulated PostgreSQL (a WAL of random transactions, replayed from the confirmed position after
//! every restart, as a slot does) and a simulated Kafka (partitions acknowledging out of order
//! across partitions, in order within one; failures that fail the rest of their partition;
//! stalls; crashes of the whole process that lose or land what was in flight without a report).
//!
//! Every seed is checked against a reference model, at every step:
//! - the confirmed LSN never passes the end of a transaction with a record Kafka does not hold
//!   (anything at or below it the slot will never send again);
//! - it never moves backwards within a session, nor below where the session resumed;
//! - after a failure in a transaction, nothing at or past its end is confirmed in that session;
//! - per key, first deliveries follow commit order;
//! - records in flight never exceed the window's record bound, and bytes exceed the byte bound
//!   by less than one record (the window is checked before each event, as in the driver);
//!
//! And at the end, every row that was committed is in Kafka at least once.
//!
//! A failing seed prints itself: `FERRY_SIM_SEED=<seed> cargo test -p ferry-core --test
//! simulation` replays it alone; `FERRY_SIM_SEEDS=<n>` runs more seeds.

mod common;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use ferry_core::{Action, DeliveryKey, End, Relay};
use ferry_router::{oid, OnError};
use ferry_wal::assembly::{OutboxEvent, OutboxMessage, RelationInfo};
use ferry_wal::Lsn;

/// splitmix64: small, fast, good enough, and the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Row,
    Message,
    /// A row the router rejects (NULL payload).
    Poison,
}

#[derive(Debug, Clone)]
struct Event {
    id: u64,
    key: u8,
    kind: Kind,
    payload_len: usize,
}

#[derive(Debug, Clone)]
struct Txn {
    xid: u32,
    commit_lsn: u64,
    end_lsn: u64,
    events: Vec<Event>,
    /// The keepalive `wal_end` sent after it (at most the next transaction's `commit_lsn`).
    keepalive: Option<u64>,
}

fn generate(rng: &mut Rng, poison: bool) -> Vec<Txn> {
    let mut txns = Vec::new();
    let mut lsn = 1_000 + rng.below(1_000);
    let mut id = 0;
    for xid in 0..(20 + rng.below(40)) as u32 {
        let commit_lsn = lsn + rng.below(3) * 8; // sometimes exactly the previous end
        let end_lsn = commit_lsn + 8 + rng.below(16);
        let n = match rng.below(10) {
            0 => 0,
            1 => 10 + rng.below(30), // larger than the window, sometimes
            _ => 1 + rng.below(4),
        };
        let events = (0..n)
            .map(|_| {
                id += 1;
                let kind = match rng.below(100) {
                    0..=3 if poison => Kind::Poison,
                    4..=14 => Kind::Message,
                    _ => Kind::Row,
                };
                Event {
                    id,
                    key: rng.below(5) as u8,
                    kind,
                    payload_len: rng.below(200) as usize,
                }
            })
            .collect();
        txns.push(Txn {
            xid,
            commit_lsn,
            end_lsn,
            events,
            keepalive: None,
        });
        lsn = end_lsn + rng.below(2) * (1 + rng.below(20));
    }
    for i in 0..txns.len() {
        let next = txns.get(i + 1).map_or(u64::MAX, |t| t.commit_lsn);
        if rng.chance(30) {
            let end = txns[i].end_lsn;
            txns[i].keepalive = Some(end + rng.below(next.saturating_sub(end).min(50) + 1));
        }
    }
    txns
}

fn event_id(id: u64) -> String {
    format!("00000000-0000-4000-8000-{id:012x}")
}

fn outbox_event(rel: &Arc<RelationInfo>, t: &Txn, e: &Event) -> OutboxEvent {
    let payload = format!(r#"{{"pad": "{}"}}"#, "x".repeat(e.payload_len));
    let key = format!("key-{}", e.key);
    match e.kind {
        Kind::Row => row(rel, t.xid, t.commit_lsn - 1, e.id, &key, Some(&payload)),
        Kind::Poison => row(rel, t.xid, t.commit_lsn - 1, e.id, &key, None),
        Kind::Message => {
            let doc = format!(
                r#"{{"id": "{}", "aggregatetype": "order", "aggregateid": "{key}", "type": "OrderCreated", "payload": {payload}}}"#,
                event_id(e.id)
            );
            OutboxEvent::Message(OutboxMessage {
                xid: t.xid,
                lsn: Lsn(t.commit_lsn - 1),
                message_lsn: Lsn(t.commit_lsn - 1),
                content: Bytes::from(doc),
            })
        }
    }
}

/// A record in flight in the simulated Kafka.
#[derive(Debug, Clone)]
struct Flying {
    token: DeliveryKey,
    session: u64,
    id: u64,
    key: u8,
    dead_letter: bool,
    bytes: u64,
    txn: usize,
}

const PARTITIONS: usize = 3;

struct Sim {
    rng: Rng,
    txns: Vec<Txn>,
    rel: Arc<RelationInfo>,
    policy: OnError,
    max_records: u64,
    max_bytes: u64,
    relay: Relay<String>,
    /// Sessions of the current process; a crash starts a new process (a new relay).
    session: u64,
    /// The slot's `confirmed_flush_lsn` (what the last status update reported).
    server_confirmed: u64,
    /// Reader position: transaction index, and the next event (0 = Begin, 1.. = events,
    /// len + 1 = Commit, len + 2 = keepalive).
    pos: (usize, usize),
    partitions: Vec<VecDeque<Flying>>,
    stalled: [u64; PARTITIONS],
    now: Instant,
    tick: u64,
    // The reference model.
    landed: HashSet<u64>,
    key_order: HashMap<u8, Vec<u64>>,
    key_next: HashMap<u8, usize>,
    /// Transactions (in order) verified to be entirely in Kafka.
    verified: usize,
    session_confirmed: u64,
    frozen_below: Option<u64>,
    largest_record: u64,
    faults_left: u32,
    crashes_left: u32,
    seen: Seen,
}

/// What happened across seeds: proof that the faults are exercised.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    confirms: u64,
    failures: u64,
    crashes: u64,
    sessions: u64,
    duplicates: u64,
    dead_letters: u64,
    window_full: u64,
}

impl Seen {
    fn add(&mut self, o: Seen) {
        self.confirms += o.confirms;
        self.failures += o.failures;
        self.crashes += o.crashes;
        self.sessions += o.sessions;
        self.duplicates += o.duplicates;
        self.dead_letters += o.dead_letters;
        self.window_full += o.window_full;
    }
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng(seed);
        let policy = if rng.chance(50) {
            OnError::Skip
        } else {
            OnError::DeadLetter
        };
        let txns = generate(&mut rng, true);
        let max_records = 1 + rng.below(16);
        let max_bytes = 200 + rng.below(3_000);
        let mut key_order: HashMap<u8, Vec<u64>> = HashMap::new();
        for t in &txns {
            for e in &t.events {
                if e.kind != Kind::Poison {
                    key_order.entry(e.key).or_default().push(e.id);
                }
            }
        }
        let server_confirmed = txns[0].commit_lsn - 1;
        let mut sim = Sim {
            relay: Relay::new(config(policy, max_records, max_bytes)),
            rng,
            txns,
            rel: relation(oid::JSONB),
            policy,
            max_records,
            max_bytes,
            session: 0,
            server_confirmed,
            pos: (0, 0),
            partitions: vec![VecDeque::new(); PARTITIONS],
            stalled: [0; PARTITIONS],
            now: Instant::now(),
            tick: 0,
            landed: HashSet::new(),
            key_order,
            key_next: HashMap::new(),
            verified: 0,
            session_confirmed: server_confirmed,
            frozen_below: None,
            largest_record: 0,
            faults_left: 6,
            crashes_left: 3,
            seen: Seen::default(),
        };
        sim.start_session();
        sim
    }

    /// A new session resumes where the slot is: transactions ending at or before the slot's
    /// confirmed position are not sent again.
    fn start_session(&mut self) {
        self.session += 1;
        self.seen.sessions += 1;
        self.relay.start(Lsn(self.server_confirmed), false);
        let first = self
            .txns
            .iter()
            .position(|t| t.end_lsn > self.server_confirmed)
            .unwrap_or(self.txns.len());
        self.pos = (first, 0);
        self.session_confirmed = self.server_confirmed;
        self.frozen_below = None;
    }

    fn crash(&mut self) {
        // What was in flight: a prefix of each partition landed without a report, the rest is
        // lost. The process restarts with a new relay.
        for p in 0..PARTITIONS {
            let flying: Vec<Flying> = self.partitions[p].drain(..).collect();
            let landed = self.rng.below(flying.len() as u64 + 1) as usize;
            for f in &flying[..landed] {
                self.land(f);
            }
        }
        self.seen.crashes += 1;
        self.relay = Relay::new(config(self.policy, self.max_records, self.max_bytes));
        self.session = 0;
        self.start_session();
    }

    fn land(&mut self, f: &Flying) {
        let first = self.landed.insert(f.id);
        self.seen.duplicates += u64::from(!first);
        self.seen.dead_letters += u64::from(f.dead_letter);
        if first && !f.dead_letter {
            let order = &self.key_order[&f.key];
            let next = self.key_next.entry(f.key).or_default();
            assert_eq!(
                order.get(*next),
                Some(&f.id),
                "key {}: first delivery of event {} out of commit order",
                f.key,
                f.id
            );
            *next += 1;
        }
    }

    /// Carries out the core's actions; returns the stop verdict, if any.
    fn carry_out(&mut self) -> Option<Result<End, String>> {
        let mut stop = None;
        while let Some(action) = self.relay.poll_action() {
            match action {
                Action::Produce { token, record } => {
                    let id = u64::from_str_radix(&record.event_id_text()[24..], 16)
                        .unwrap_or_else(|_| panic!("event id {:?}", record.event_id_text()));
                    let dead_letter = &*record.topic == DEAD_LETTER_TOPIC;
                    let key: u8 = record.key.as_deref().expect("keyed")[4] - b'0';
                    let bytes = record.size_bytes() as u64;
                    self.largest_record = self.largest_record.max(bytes);
                    let txn = self.pos.0;
                    let p = (key as usize + usize::from(dead_letter)) % PARTITIONS;
                    self.partitions[p].push_back(Flying {
                        token,
                        session: self.session,
                        id,
                        key,
                        dead_letter,
                        bytes,
                        txn,
                    });
                    let records: u64 = self.partitions.iter().map(|q| q.len() as u64).sum();
                    let bytes: u64 = self.partitions.iter().flatten().map(|f| f.bytes).sum();
                    assert!(
                        records <= self.max_records,
                        "{records} records in flight, window {}",
                        self.max_records
                    );
                    assert!(
                        bytes < self.max_bytes + self.largest_record,
                        "{bytes} bytes in flight, window {} (largest record {})",
                        self.max_bytes,
                        self.largest_record
                    );
                }
                Action::CommitPoint { .. } | Action::Position(_) => {}
                Action::Abandon => {
                    // Purge: what is still queued fails (reported), in every partition.
                    for p in 0..PARTITIONS {
                        if self.rng.chance(50) {
                            self.fail_partition(p, 0);
                        }
                    }
                }
                Action::Confirm(lsn) => self.confirmed(lsn.0),
                Action::Count(_) => {}
                Action::Stop(r) => stop = Some(r.map_err(|e| format!("{e:?}"))),
            }
        }
        stop
    }

    fn confirmed(&mut self, lsn: u64) {
        assert!(
            lsn > self.session_confirmed,
            "confirmed {lsn} after {} in the same session",
            self.session_confirmed
        );
        self.session_confirmed = lsn;
        self.seen.confirms += 1;
        if let Some(end) = self.frozen_below {
            assert!(
                lsn < end,
                "confirmed {lsn} past a failed transaction ending at {end}"
            );
        }
        // Everything at or below it will never be sent again: it must all be in Kafka.
        while let Some(t) = self.txns.get(self.verified) {
            if t.end_lsn > lsn {
                break;
            }
            for e in &t.events {
                if e.kind == Kind::Poison && self.policy == OnError::Skip {
                    continue;
                }
                assert!(
                    self.landed.contains(&e.id),
                    "confirmed {lsn} passes event {} of the transaction ending at {}, which Kafka does not hold",
                    e.id,
                    t.end_lsn
                );
            }
            self.verified += 1;
        }
        // The status update carrying it reaches the server, most of the time before a crash.
        if self.rng.chance(80) {
            self.server_confirmed = self.server_confirmed.max(lsn);
        }
    }

    /// Fails the records of partition `p` from index `from` on (a failed record fails those
    /// queued behind it on its partition).
    fn fail_partition(&mut self, p: usize, from: usize) {
        let failed: Vec<Flying> = self.partitions[p].drain(from..).collect();
        for f in failed {
            self.seen.failures += 1;
            if f.session == self.session {
                let end = self.txns[f.txn].end_lsn;
                self.frozen_below = Some(self.frozen_below.map_or(end, |b| b.min(end)));
            }
            self.relay
                .handle_report(f.token, Err("broker down".into()), self.now);
        }
    }

    fn feed_one(&mut self) {
        let (ti, ei) = self.pos;
        let t = &self.txns[ti];
        let ev = if ei == 0 {
            Some(begin(t.xid, t.commit_lsn))
        } else if ei <= t.events.len() {
            Some(outbox_event(&self.rel, t, &t.events[ei - 1]))
        } else if ei == t.events.len() + 1 {
            Some(commit(t.xid, t.commit_lsn, t.end_lsn))
        } else {
            None
        };
        let keepalive = t.keepalive;
        match ev {
            Some(ev) => {
                self.relay.handle_outbox(ev, self.now);
                self.pos.1 += 1;
            }
            None => {
                if let Some(k) = keepalive {
                    self.relay.handle_keepalive(Lsn(k));
                }
                self.pos = (ti + 1, 0);
            }
        }
    }

    fn step(&mut self) -> Option<Result<End, String>> {
        self.tick += 1;
        self.now += Duration::from_millis(1);
        let faults = self.faults_left > 0;
        match self.rng.below(100) {
            // Kafka acknowledges the head of a partition.
            0..=39 => {
                let p = self.rng.below(PARTITIONS as u64) as usize;
                if self.stalled[p] > self.tick {
                    return self.carry_out();
                }
                if let Some(f) = self.partitions[p].pop_front() {
                    self.land(&f);
                    if f.session != self.session {
                        // Never happens: sessions drain. Kept as a check of the model.
                        panic!("a record of an ended session in flight");
                    }
                    self.relay.handle_report(f.token, Ok(()), self.now);
                }
            }
            // The reader hands over an event, if the core wants one.
            40..=84 if self.pos.0 < self.txns.len() => {
                if self.relay.wants_events() {
                    self.feed_one();
                } else {
                    self.seen.window_full += 1;
                }
            }
            85..=89 => {
                let p = self.rng.below(PARTITIONS as u64) as usize;
                self.stalled[p] = self.tick + self.rng.below(50);
            }
            90..=91 if faults => {
                let p = self.rng.below(PARTITIONS as u64) as usize;
                if !self.partitions[p].is_empty() {
                    self.faults_left -= 1;
                    let from = self.rng.below(self.partitions[p].len() as u64) as usize;
                    self.fail_partition(p, from);
                }
            }
            92 if faults => {
                self.faults_left -= 1;
                self.relay.reader_ended(self.now);
            }
            93 if self.crashes_left > 0 => {
                self.crashes_left -= 1;
                self.crash();
            }
            _ => {}
        }
        self.carry_out()
    }

    fn run(&mut self) {
        let mut shutting_down = false;
        for _ in 0..200_000 {
            let done = self.pos.0 >= self.txns.len() && self.relay.in_flight().0 == 0;
            if done && !shutting_down {
                shutting_down = true;
                self.relay.shutdown(self.now);
            }
            match self.step() {
                None => {}
                Some(Ok(End::Shutdown)) => return self.finish(),
                Some(Ok(End::ReaderEnded)) | Some(Err(_)) => {
                    // Drained: a transient end; the final status update reports the
                    // confirmed LSN, and the next session resumes from it.
                    assert_eq!(self.relay.in_flight().0, 0, "a session ended undrained");
                    self.server_confirmed = self.server_confirmed.max(self.session_confirmed);
                    shutting_down = false;
                    self.start_session();
                }
            }
        }
        panic!("no progress after 200000 steps");
    }

    fn finish(&mut self) {
        for t in &self.txns {
            for e in &t.events {
                if e.kind == Kind::Poison && self.policy == OnError::Skip {
                    continue;
                }
                assert!(
                    self.landed.contains(&e.id),
                    "event {} never reached Kafka",
                    e.id
                );
            }
        }
        let last = self.txns.last().unwrap().end_lsn;
        assert!(
            self.session_confirmed >= last,
            "ended at {} before the last end {last}",
            self.session_confirmed
        );
    }
}

fn run_seed(seed: u64) -> Seen {
    let mut sim = Sim::new(seed);
    sim.run();
    sim.seen
}

#[test]
fn the_core_keeps_its_promises_under_random_faults() {
    let seeds: Vec<u64> = match std::env::var("FERRY_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("FERRY_SIM_SEED is a number")],
        Err(_) => {
            let n: u64 = std::env::var("FERRY_SIM_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(2_000);
            (0..n).map(|i| 0x5eed_0000 + i).collect()
        }
    };
    let started = Instant::now();
    let mut seen = Seen::default();
    for seed in &seeds {
        let seed = *seed;
        let outcome = std::panic::catch_unwind(|| run_seed(seed));
        if let Ok(s) = &outcome {
            seen.add(*s);
        }
        if let Err(panic) = outcome {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!(
                "seed {seed} failed: {msg}\nreplay: FERRY_SIM_SEED={seed} cargo test -p ferry-core --test simulation"
            );
        }
    }
    eprintln!("{} seeds in {:?}: {seen:?}", seeds.len(), started.elapsed());
    if seeds.len() > 100 {
        // The faults the test is about did happen.
        assert!(
            seen.failures > 0 && seen.crashes > 0 && seen.duplicates > 0,
            "{seen:?}"
        );
        assert!(
            seen.dead_letters > 0 && seen.window_full > 0 && seen.sessions > seeds.len() as u64,
            "{seen:?}"
        );
    }
}
