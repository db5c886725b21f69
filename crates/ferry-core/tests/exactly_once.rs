//! Deterministic simulation of exactly-once mode: the real core and the real router, a simulated
//! PostgreSQL (random transactions, some larger than the in-flight window, replayed from the
//! slot's confirmed position after every restart) and a simulated *transactional* Kafka:
//! records go into an open transaction, which commits together with a progress record holding
//! the position the core gave ([`Action::Position`]), or aborts; the process crashes at any
//! point (before a commit, with a commit landed but not yet acknowledged, after it, with the
//! slot's confirm lost), and every restart starts a new core from the newest committed progress
//! record, as the binary does after `init_transactions` and reading the progress topic.
//!
//! Checked at every step, for every seed:
//! - what read-committed consumers see holds every event **at most once** and, per key, in
//!   commit order (a prefix of the key's events);
//! - the confirmed LSN never passes the end LSN the committed progress record holds;
//! - the window never fills with held reports (the run always finishes: the sink commits at
//!   half the window).
//!
//! And at the end, every event (its record, or its dead letter) is there **exactly once**.
//! `FERRY_SIM_SEED=<seed> cargo test -p ferry-core --test exactly_once` replays one seed.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ferry_core::progress_record::{Mode, ProgressRecord};
use ferry_core::{Action, DeliveryKey, End, Position, Relay, RelayConfig};
use ferry_router::{oid, OnError};
use ferry_wal::assembly::RelationInfo;
use ferry_wal::Lsn;

/// splitmix64.
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

#[derive(Debug, Clone)]
struct Event {
    id: u64,
    key: u8,
    poison: bool,
}

#[derive(Debug, Clone)]
struct Txn {
    xid: u32,
    commit_lsn: u64,
    end_lsn: u64,
    events: Vec<Event>,
    keepalive: Option<u64>,
}

fn generate(rng: &mut Rng) -> Vec<Txn> {
    let mut txns = Vec::new();
    let mut lsn = 1_000 + rng.below(1_000);
    let mut id = 0;
    for xid in 0..(10 + rng.below(30)) as u32 {
        let commit_lsn = lsn + rng.below(3) * 8;
        let end_lsn = commit_lsn + 8 + rng.below(16);
        let n = match rng.below(10) {
            0 => 0,
            1 | 2 => 10 + rng.below(60), // many Kafka transactions long, sometimes
            _ => 1 + rng.below(4),
        };
        let events = (0..n)
            .map(|_| {
                id += 1;
                Event {
                    id,
                    key: rng.below(5) as u8,
                    poison: rng.chance(5),
                }
            })
            .collect();
        let keepalive = rng.chance(30).then(|| end_lsn + rng.below(4));
        txns.push(Txn {
            xid,
            commit_lsn,
            end_lsn,
            events,
            keepalive,
        });
        lsn = end_lsn + 4 + rng.below(20);
    }
    txns
}

/// A record in the open Kafka transaction.
#[derive(Debug, Clone)]
struct Open {
    token: DeliveryKey,
    id: u64,
    key: u8,
    dead_letter: bool,
}

struct Sim {
    rng: Rng,
    txns: Vec<Txn>,
    rel: Arc<RelationInfo>,
    policy: OnError,
    window: u64,
    cap: u64,
    relay: Relay<String>,
    /// The slot's `confirmed_flush_lsn`.
    server_confirmed: u64,
    pos: (usize, usize),
    now: Instant,
    // The transactional Kafka.
    open: Vec<Open>,
    /// The newest position the core gave in this process, and whether it is committed.
    position: Option<Position>,
    position_committed: bool,
    /// What read-committed consumers see: (event id, key, dead letter), in log order.
    log: Vec<(u64, u8, bool)>,
    /// The newest committed progress record.
    progress: Option<ProgressRecord>,
    // The reference model.
    key_order: HashMap<u8, Vec<u64>>,
    crashes_left: u32,
    aborts_left: u32,
    seen: Seen,
}

#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    commits: u64,
    aborts: u64,
    crashes: u64,
    landed_unacknowledged: u64,
    skipped_on_restart: u64,
    partial_restarts: u64,
    confirms: u64,
}

impl Seen {
    fn add(&mut self, o: Seen) {
        self.commits += o.commits;
        self.aborts += o.aborts;
        self.crashes += o.crashes;
        self.landed_unacknowledged += o.landed_unacknowledged;
        self.skipped_on_restart += o.skipped_on_restart;
        self.partial_restarts += o.partial_restarts;
        self.confirms += o.confirms;
    }
}

fn relay_config(policy: OnError, window: u64) -> RelayConfig {
    RelayConfig {
        exactly_once: true,
        ..config(policy, window, 1 << 30)
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
        let txns = generate(&mut rng);
        let window = 2 + rng.below(30);
        let cap = 1 + rng.below(window / 2);
        let mut key_order: HashMap<u8, Vec<u64>> = HashMap::new();
        for t in &txns {
            for e in &t.events {
                if !e.poison {
                    key_order.entry(e.key).or_default().push(e.id);
                }
            }
        }
        let server_confirmed = txns[0].commit_lsn - 1;
        let mut sim = Sim {
            relay: Relay::new(relay_config(policy, window)),
            rng,
            txns,
            rel: relation(oid::JSONB),
            policy,
            window,
            cap,
            server_confirmed,
            pos: (0, 0),
            now: Instant::now(),
            open: Vec::new(),
            position: None,
            position_committed: true,
            log: Vec::new(),
            progress: None,
            key_order,
            crashes_left: 4,
            aborts_left: 3,
            seen: Seen::default(),
        };
        sim.restart();
        sim
    }

    /// A new process: a new core, started from the newest committed progress record, and the
    /// reader from the slot.
    fn restart(&mut self) {
        self.relay = Relay::new(relay_config(self.policy, self.window));
        self.open.clear();
        self.position = None;
        self.position_committed = true;
        if self.progress.as_ref().is_some_and(|p| p.partial.is_some()) {
            self.seen.partial_restarts += 1;
        }
        if let Some(p) = &self.progress {
            assert!(
                self.server_confirmed <= p.end_lsn.0,
                "the slot ({}) is ahead of the committed progress ({})",
                self.server_confirmed,
                p.end_lsn
            );
        }
        self.relay
            .start_from(Lsn(self.server_confirmed), false, self.progress.clone());
        let first = self
            .txns
            .iter()
            .position(|t| t.end_lsn > self.server_confirmed)
            .unwrap_or(self.txns.len());
        if let Some(p) = &self.progress {
            let covered = self.txns[first..]
                .iter()
                .take_while(|t| t.commit_lsn < p.end_lsn.0)
                .count();
            self.seen.skipped_on_restart += covered as u64;
        }
        self.pos = (first, 0);
    }

    /// Kafka commits the open transaction with the progress record of the newest position.
    fn commit(&mut self) {
        let Some(position) = self.position else {
            return;
        };
        let mut progress = ProgressRecord::whole(Mode::ExactlyOnce, 1, position.end_lsn, 0);
        progress.partial = position.partial;
        for o in &self.open {
            self.log.push((o.id, o.key, o.dead_letter));
        }
        self.progress = Some(progress);
        self.position_committed = true;
        self.seen.commits += 1;
        self.check_log();
        // A crash after the commit landed and before the sink heard of it.
        if self.crashes_left > 0 && self.rng.chance(3) {
            self.crashes_left -= 1;
            self.seen.landed_unacknowledged += 1;
            return self.crash();
        }
        for o in std::mem::take(&mut self.open) {
            self.relay.handle_report(o.token, Ok(()), self.now);
        }
        self.relay.progress_committed(position.end_lsn);
    }

    /// An abortable error: the open transaction is invisible; its reports fail.
    fn abort(&mut self) {
        self.seen.aborts += 1;
        // Nothing of the aborted transaction may be committed later.
        self.position = None;
        self.position_committed = true;
        self.relay.handle_sink_error("abortable".into(), self.now);
        for o in std::mem::take(&mut self.open) {
            self.relay
                .handle_report(o.token, Err("aborted".into()), self.now);
        }
    }

    fn crash(&mut self) {
        self.seen.crashes += 1;
        self.restart();
    }

    fn check_log(&self) {
        let mut seen = HashMap::new();
        let mut per_key: HashMap<u8, Vec<u64>> = HashMap::new();
        for &(id, key, dl) in &self.log {
            assert!(
                seen.insert((id, dl), ()).is_none(),
                "event {id} (dead letter: {dl}) committed twice"
            );
            if !dl {
                per_key.entry(key).or_default().push(id);
            }
        }
        for (key, ids) in per_key {
            let order = &self.key_order[&key];
            assert_eq!(
                &order[..ids.len()],
                &ids[..],
                "key {key}: committed out of order"
            );
        }
    }

    fn carry_out(&mut self) -> Option<Result<End, String>> {
        let mut stop = None;
        while let Some(action) = self.relay.poll_action() {
            match action {
                Action::Produce { token, record } => {
                    let id = u64::from_str_radix(&record.event_id_text()[24..], 16).unwrap();
                    let key: u8 = record.key.as_deref().expect("keyed")[4] - b'0';
                    self.open.push(Open {
                        token,
                        id,
                        key,
                        dead_letter: &*record.topic == DEAD_LETTER_TOPIC,
                    });
                    assert!(
                        self.open.len() as u64 <= self.cap,
                        "{} records in one Kafka transaction, cap {}",
                        self.open.len(),
                        self.cap
                    );
                }
                Action::Position(p) => {
                    if let Some(old) = self.position {
                        assert!(
                            (p.end_lsn, p.partial.map(|x| (x.commit_lsn, x.events)))
                                >= (old.end_lsn, old.partial.map(|x| (x.commit_lsn, x.events)))
                                || p.partial.is_none(),
                            "position moved back: {old:?} -> {p:?}"
                        );
                    }
                    self.position = Some(p);
                    self.position_committed = false;
                    if self.open.len() as u64 >= self.cap {
                        self.commit();
                    }
                }
                Action::Confirm(lsn) => {
                    let held = self.progress.as_ref().map_or(0, |p| p.end_lsn.0);
                    assert!(
                        lsn.0 <= held,
                        "confirmed {lsn} past the committed progress {held}"
                    );
                    self.seen.confirms += 1;
                    if self.rng.chance(80) {
                        self.server_confirmed = self.server_confirmed.max(lsn.0);
                    }
                }
                Action::Abandon => {}
                Action::CommitPoint { .. } | Action::Count(_) => {}
                Action::Stop(r) => stop = Some(r.map_err(|e| format!("{e:?}"))),
            }
        }
        stop
    }

    fn feed_one(&mut self) {
        let (ti, ei) = self.pos;
        let t = &self.txns[ti];
        let ev = if ei == 0 {
            Some(begin(t.xid, t.commit_lsn))
        } else if ei <= t.events.len() {
            let e = &t.events[ei - 1];
            let key = format!("key-{}", e.key);
            let payload = e
                .poison
                .then_some(())
                .map_or(Some(r#"{"a": 1}"#), |()| None);
            Some(row(&self.rel, t.xid, t.commit_lsn - 1, e.id, &key, payload))
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
        self.now += Duration::from_millis(1);
        match self.rng.below(100) {
            0..=59 if self.pos.0 < self.txns.len() && self.relay.wants_events() => {
                self.feed_one();
            }
            // The interval passed: commit what is open (or a newer position alone).
            60..=79 if !self.position_committed => self.commit(),
            80..=81 if self.aborts_left > 0 && !self.open.is_empty() => {
                self.aborts_left -= 1;
                self.abort();
            }
            82 if self.crashes_left > 0 => {
                self.crashes_left -= 1;
                // Records sent, progress sent, commit sent: none of it is visible.
                self.crash();
            }
            _ => {}
        }
        self.carry_out()
    }

    fn run(&mut self) {
        for _ in 0..200_000 {
            let done = self.pos.0 >= self.txns.len() && self.position_committed;
            if done {
                return self.finish();
            }
            match self.step() {
                None => {}
                Some(Ok(_)) => panic!("the session ended without a shutdown"),
                Some(Err(_)) => {
                    // The binary throws the producer away and starts again from Kafka.
                    assert_eq!(self.relay.in_flight().0, 0, "ended undrained");
                    self.restart();
                }
            }
        }
        panic!(
            "no progress after 200000 steps (window {}, cap {}, open {}, in flight {:?})",
            self.window,
            self.cap,
            self.open.len(),
            self.relay.in_flight()
        );
    }

    fn finish(&mut self) {
        self.check_log();
        for t in &self.txns {
            for e in &t.events {
                if e.poison && self.policy == OnError::Skip {
                    continue;
                }
                let n = self.log.iter().filter(|(id, _, _)| *id == e.id).count();
                assert_eq!(n, 1, "event {} committed {n} times", e.id);
            }
        }
        let last = self.txns.last().unwrap().end_lsn;
        let held = self.progress.as_ref().map_or(0, |p| p.end_lsn.0);
        assert!(
            held >= last,
            "progress {held} ends before the last end {last}"
        );
    }
}

#[test]
fn every_event_is_committed_exactly_once_through_aborts_and_crashes() {
    let seeds: Vec<u64> = match std::env::var("FERRY_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("FERRY_SIM_SEED is a number")],
        Err(_) => {
            let n: u64 = std::env::var("FERRY_SIM_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(500);
            (0..n).map(|i| 0xe05_0000 + i).collect()
        }
    };
    let started = Instant::now();
    let mut seen = Seen::default();
    for seed in &seeds {
        let seed = *seed;
        let outcome = std::panic::catch_unwind(|| {
            let mut sim = Sim::new(seed);
            sim.run();
            sim.seen
        });
        match outcome {
            Ok(s) => seen.add(s),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                    "seed {seed} failed: {msg}\nreplay: FERRY_SIM_SEED={seed} cargo test -p ferry-core --test exactly_once"
                );
            }
        }
    }
    eprintln!("{} seeds in {:?}: {seen:?}", seeds.len(), started.elapsed());
    if seeds.len() > 100 {
        assert!(
            seen.aborts > 0
                && seen.crashes > 0
                && seen.landed_unacknowledged > 0
                && seen.skipped_on_restart > 0
                && seen.partial_restarts > 0
                && seen.confirms > 0,
            "{seen:?}"
        );
    }
}
