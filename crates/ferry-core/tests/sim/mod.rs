//! The simulation harness: the real session machine ([`ferry_core::Session`]) with the real
//! router, in either delivery mode, driven as the binary drives it (every action carried out in
//! order, the outcome of each call fed back before the next action is polled) through one
//! simulated PostgreSQL ([`wal`]) and one simulated Kafka ([`kafka`]), with faults drawn from
//! the seed, and checked at every step against the reference model ([`model`]).
//!
//! Restarts: a session that ends starts again from the slot's confirmed position. At-least-once,
//! a session in the same process reuses the machine (late reports of the old session still
//! arrive; its progress record in flight keeps its place); a new process (after a crash) makes a
//! new machine, told the newest progress record in the topic as the start-time verdict does.
//! Exactly-once, every restart makes a new machine (a new transactional producer fences the old
//! one and aborts what it left open), started from the newest committed progress record.

pub mod kafka;
pub mod model;
pub mod wal;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::pass::{EventPosition, Pass, PassAction};
use ferry_core::testing::Rng;
use ferry_core::{
    CommitOutcome, CoreError, End, RelayConfig, Session, SessionAction as Action, SessionConfig,
    TransactionLimits, PROGRESS_DELIVERY_KEY,
};
use ferry_router::{OnError, Record};
use ferry_wal::Lsn;

use crate::common::TestError;
use crate::common::{router, DEAD_LETTER_TOPIC};
use kafka::{Flying, Kafka, Written, PARTITIONS, PROGRESS};
use model::Model;
use wal::{Next, Pg};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    AtLeastOnce,
    ExactlyOnce,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::AtLeastOnce => "at-least-once",
            Mode::ExactlyOnce => "exactly-once",
        })
    }
}

macro_rules! seen {
    ($($field:ident),* $(,)?) => {
        /// What happened across seeds: proof that the faults are exercised.
        #[derive(Debug, Default, Clone, Copy)]
        pub struct Seen {
            $(pub $field: u64,)*
        }

        impl Seen {
            pub fn add(&mut self, o: &Seen) {
                $(self.$field += o.$field;)*
            }

            pub fn counts(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($field), self.$field),)*]
            }
        }
    };
}

seen!(
    fed,
    sessions,
    processes,
    confirms,
    keepalives,
    window_full,
    duplicates,
    dead_letters,
    route_passes,
    policy_changes,
    policy_changes_across,
    failures,
    failed_landed,
    refusals,
    reader_ends,
    drain_timeouts,
    crashes,
    crashes_in_actions,
    crash_landed,
    late_reports,
    progress_acked,
    progress_failed,
    progress_failed_landed,
    progress_permanent,
    progress_refused,
    commits,
    abortable_commits,
    unseen_commits,
    failed_commits,
    crashes_in_commit,
    begin_failures,
    aborts,
    abort_failures,
    skipped_on_restart,
    partial_restarts,
    outside_transaction,
);

impl Seen {
    /// The kinds every run of many seeds must have exercised.
    pub fn required(mode: Mode) -> Vec<&'static str> {
        const BOTH: [&str; 11] = [
            "sessions",
            "processes",
            "confirms",
            "keepalives",
            "dead_letters",
            "route_passes",
            "failures",
            "refusals",
            "reader_ends",
            "crashes",
            "crashes_in_actions",
        ];
        let own: &[&str] = match mode {
            // Exactly-once: a transaction holds half the window at most, a drain commits what
            // it holds at once, and every restart is a new machine.
            Mode::AtLeastOnce => &[
                "window_full",
                "drain_timeouts",
                "late_reports",
                "duplicates",
                "failed_landed",
                "crash_landed",
                "progress_acked",
                "progress_failed",
                "progress_failed_landed",
                "progress_permanent",
                "progress_refused",
            ],
            Mode::ExactlyOnce => &[
                "commits",
                "abortable_commits",
                "unseen_commits",
                "failed_commits",
                "crashes_in_commit",
                "begin_failures",
                "aborts",
                "abort_failures",
                "skipped_on_restart",
                "partial_restarts",
            ],
        };
        own.iter().chain(BOTH.iter()).copied().collect()
    }
}

const MAX_STEPS: u64 = 400_000;

pub struct Sim {
    mode: Mode,
    rng: Rng,
    pg: Pg,
    kafka: Kafka,
    model: Model,
    config: SessionConfig,
    session: Session<TestError>,
    t0: Instant,
    /// Milliseconds since `t0`.
    tick: u64,
    /// Sessions started by this process (records carry the one they were produced in).
    session_no: u64,
    /// Restarts so far: a carried-out action that restarted stops the loop that carried it.
    epoch: u64,
    shutting_down: bool,
    done: bool,
    /// Under `on_error = "fail"`: the operator's `--skip-event` for the event that stopped the
    /// last session.
    pass: Option<Pass>,
    /// Every event the operator passed so far.
    passed: Vec<EventPosition>,
    /// At-least-once: the newest progress record this process knows to be in Kafka (read at a
    /// session's start, or acknowledged since).
    acked_progress: Option<u64>,
    max_records: u64,
    max_bytes: u64,
    /// Exactly-once: a Kafka transaction's bounds.
    cap: u64,
    cap_bytes: u64,
    largest: u64,
    faults_left: u32,
    crashes_left: u32,
    /// The session began with no fault left to inject.
    clean_session: bool,
    pub seen: Seen,
    /// `FERRY_SIM_TRACE=1`: every input and action on stderr (for replaying one seed).
    trace: bool,
}

macro_rules! trace {
    ($sim:expr, $($arg:tt)*) => {
        if $sim.trace {
            eprintln!("{:>6} {}", $sim.tick, format_args!($($arg)*));
        }
    };
}

/// One seed in one mode; panics on a broken guarantee.
pub fn run_seed(seed: u64, mode: Mode) -> Seen {
    let mut sim = Sim::new(seed, mode);
    sim.run();
    sim.seen
}

impl Sim {
    fn new(seed: u64, mode: Mode) -> Sim {
        let mut rng = Rng::new(seed);
        let policy = match rng.below(3) {
            0 => OnError::Skip,
            1 => OnError::DeadLetter,
            _ => OnError::Fail,
        };
        let pg = Pg::new(&mut rng);
        let exactly_once = mode == Mode::ExactlyOnce;
        let (max_records, max_bytes, cap, cap_bytes, transactions) = if exactly_once {
            let window = 2 + rng.below(30);
            let cap = 1 + rng.below(window / 2);
            let cap_bytes = 300 + rng.below(4_000);
            let limits = TransactionLimits {
                interval: Duration::from_millis(5 + rng.below(100)),
                max_records: cap,
                max_bytes: cap_bytes,
            };
            (window, 2 * cap_bytes, cap, cap_bytes, Some(limits))
        } else {
            let (records, bytes) = (1 + rng.below(16), 200 + rng.below(3_000));
            (records, bytes, records, bytes, None)
        };
        // Mostly as configured; sometimes short, so that sessions end with records in flight
        // (their reports reach the next session of the process).
        let session_drain_timeout = match rng.percent(20) {
            true => Duration::from_millis(10 + rng.below(100)),
            false => Duration::from_secs(60),
        };
        let config = SessionConfig {
            relay: RelayConfig {
                routers: router(policy),
                max_in_flight_records: max_records,
                max_in_flight_bytes: max_bytes,
                drain_timeout: Duration::from_secs(5),
                session_drain_timeout: Some(session_drain_timeout),
                exactly_once,
            },
            transactions,
            progress_topic: Arc::from("ferry.progress"),
        };
        let model = Model::new(&pg.txns, policy, exactly_once);
        let mut sim = Sim {
            mode,
            rng,
            pg,
            kafka: Kafka::default(),
            model,
            session: Session::new(config.clone()),
            config,
            t0: Instant::now(),
            tick: 0,
            session_no: 0,
            epoch: 0,
            shutting_down: false,
            done: false,
            pass: None,
            passed: Vec::new(),
            acked_progress: None,
            max_records,
            max_bytes,
            cap,
            cap_bytes,
            largest: 0,
            faults_left: 8,
            clean_session: false,
            crashes_left: 4,
            seen: Seen::default(),
            trace: std::env::var_os("FERRY_SIM_TRACE").is_some(),
        };
        trace!(sim, "{mode}: {policy:?}, window {max_records} records {max_bytes} bytes, cap {cap} {cap_bytes}, {session_drain_timeout:?}");
        for t in sim.pg.txns.iter().filter(|_| sim.trace) {
            let events: Vec<String> = t
                .events
                .iter()
                .map(|e| format!("{}{:?}/k{}", e.id, e.kind, e.key))
                .collect();
            trace!(
                sim,
                "txn {} commit {} end {} keepalive {:?}: {}",
                t.xid,
                t.commit_lsn,
                t.end_lsn,
                t.keepalive,
                events.join(" ")
            );
        }
        sim.start_process();
        sim
    }

    fn now(&self) -> Instant {
        self.t0 + Duration::from_millis(self.tick)
    }

    fn exactly_once(&self) -> bool {
        self.mode == Mode::ExactlyOnce
    }

    /// A fault, `per_mille` times in 1000, while the seed's budget lasts.
    fn fault(&mut self, per_mille: u64) -> bool {
        if self.faults_left == 0 || self.rng.below(1_000) >= per_mille {
            return false;
        }
        self.faults_left -= 1;
        true
    }

    /// A new process: a new machine, told what the start-time verdict found.
    fn start_process(&mut self) {
        self.seen.processes += 1;
        let pass = self.pass.take().or(self.session.pass());
        self.session = Session::new(self.config.clone());
        self.session.set_pass(pass);
        self.session_no = 0;
        // Exactly-once: the new producer's init_transactions aborts what the old one left open.
        self.kafka.abort();
        // The verdict: the slot is never ahead of the newest progress record.
        match self.kafka.progress_lsn() {
            Some(r) => assert!(
                self.pg.slot <= r,
                "a start finds the slot at {} ahead of the newest progress record {r}",
                self.pg.slot
            ),
            None => assert_eq!(
                self.pg.slot, self.pg.created_at,
                "the slot moved without a progress record"
            ),
        }
        self.acked_progress = self.kafka.progress_lsn();
        self.start_session();
    }

    /// A session of the process starts from the slot.
    fn start_session(&mut self) {
        self.epoch += 1;
        self.session_no += 1;
        self.seen.sessions += 1;
        self.shutting_down = false;
        self.clean_session = self.faults_left == 0 && self.crashes_left == 0;
        if let Some(pass) = self.pass.take() {
            self.session.set_pass(Some(pass));
        }
        let resume = self.pg.resume();
        trace!(
            self,
            "session {} of the process from {resume}, progress {:?}, pass {:?}",
            self.session_no,
            self.kafka.progress,
            self.session.pass()
        );
        self.model.session(resume);
        let now = self.now();
        match self.mode {
            Mode::AtLeastOnce => {
                let remembered = self.kafka.progress_lsn();
                self.acked_progress = remembered;
                self.session
                    .start_at_least_once(Lsn(resume), false, remembered.map(Lsn), now);
            }
            Mode::ExactlyOnce => {
                let remembered = self.kafka.progress.clone();
                if let Some(r) = &remembered {
                    self.seen.partial_restarts += u64::from(r.partial.is_some());
                    let first = self.pg.current();
                    let covered = self.pg.txns[first..]
                        .iter()
                        .take_while(|t| t.commit_lsn < r.end_lsn.0)
                        .count();
                    self.seen.skipped_on_restart += covered as u64;
                }
                self.session
                    .start_exactly_once(Lsn(resume), false, remembered, now);
            }
        }
        self.carry_out();
    }

    /// The process dies: at-least-once, a prefix of each partition's records in flight landed
    /// without a report, the rest is lost; exactly-once, the open transaction is never
    /// committed. Confirmations not yet reported to the server are lost.
    fn crash(&mut self) {
        trace!(self, "CRASH");
        self.seen.crashes += 1;
        self.exit_process();
        self.pg.crash();
        self.start_process();
    }

    /// The process ends (dies, or exits): what it had in flight lands or is lost.
    fn exit_process(&mut self) {
        if !self.exactly_once() {
            for p in 0..=PARTITIONS {
                let flying: Vec<Flying> = self.kafka.queues[p].drain(..).collect();
                let landed = self.rng.below(flying.len() as u64 + 1) as usize;
                self.seen.crash_landed += landed as u64;
                for f in &flying[..landed] {
                    self.land(p, f);
                }
            }
        }
    }

    /// Record `f` of partition `p` is in Kafka (at-least-once).
    fn land(&mut self, p: usize, f: &Flying) {
        if p == PROGRESS {
            self.kafka.append_progress(f.lsn);
        } else {
            self.model.landed(f.id, f.key, f.dead_letter);
            self.seen.dead_letters += u64::from(f.dead_letter);
        }
    }

    /// The broker acknowledges the oldest record of partition `p`.
    fn ack(&mut self, p: usize) {
        if !self.kafka.ready(p, self.tick) {
            return;
        }
        let f = self.kafka.queues[p].pop_front().unwrap();
        trace!(
            self,
            "ack p{p} {:?} id {} lsn {} (session {})",
            f.token,
            f.id,
            f.lsn,
            f.session
        );
        self.seen.late_reports += u64::from(f.session != self.session_no);
        let now = self.now();
        if self.exactly_once() {
            // Written into the open transaction; visible only when it commits.
            return self.session.handle_report(f.token, Ok(()), now);
        }
        self.land(p, &f);
        if p == PROGRESS {
            self.acked_progress = Some(f.lsn);
            self.seen.progress_acked += 1;
        }
        self.session.handle_report(f.token, Ok(()), now);
    }

    /// The records of partition `p` fail from index `from` on (a failed record fails those
    /// queued behind it); the first of them may have landed all the same (a timeout) if none is
    /// ahead of it.
    fn fail(&mut self, p: usize, from: usize, why: TestError) {
        let failed: Vec<Flying> = self.kafka.queues[p].drain(from..).collect();
        // Only with nothing ahead of it in the partition: the idempotent producer never
        // reorders.
        let landed = !self.exactly_once() && from == 0 && self.rng.percent(20);
        for (i, f) in failed.iter().enumerate() {
            let landed = landed && i == 0;
            trace!(
                self,
                "fail p{p} {:?} id {} lsn {} (session {}) {why:?}, landed {landed}",
                f.token,
                f.id,
                f.lsn,
                f.session
            );
            let now = self.now();
            if p == PROGRESS {
                self.seen.progress_failed += 1;
                self.seen.progress_permanent += u64::from(!why.transient);
                if landed {
                    self.seen.progress_failed_landed += 1;
                    self.kafka.append_progress(f.lsn);
                }
            } else {
                self.seen.failures += 1;
                if landed {
                    self.seen.failed_landed += 1;
                    self.land(p, f);
                }
                if !self.exactly_once() && f.session == self.session_no {
                    self.model.failed(f.txn_end);
                }
            }
            self.session.handle_report(f.token, Err(why.clone()), now);
        }
    }

    /// The reader hands over its next message.
    fn feed(&mut self) {
        self.seen.fed += 1;
        let now = self.now();
        match self.pg.next() {
            Next::Outbox(event) => {
                trace!(
                    self,
                    "feed {}",
                    match &event {
                        ferry_wal::assembly::OutboxEvent::Begin(b) =>
                            format!("begin {}", b.commit_lsn),
                        ferry_wal::assembly::OutboxEvent::Commit(c) =>
                            format!("commit {}", c.end_lsn),
                        _ => "event".to_string(),
                    }
                );
                self.session.handle_outbox(event, now)
            }
            Next::Keepalive(lsn) => {
                self.seen.keepalives += 1;
                self.session.handle_keepalive_at(lsn, None, now);
            }
            Next::Nothing => {}
        }
    }

    /// Carries out the machine's actions in order, each call's outcome fed back before the next
    /// action is polled; stops when the session ends (the next one has started by then).
    fn carry_out(&mut self) {
        let epoch = self.epoch;
        while let Some(action) = self.session.poll_action() {
            // The process may die at any point.
            if self.crashes_left > 0 && self.rng.below(1_000) < 2 {
                self.crashes_left -= 1;
                self.seen.crashes_in_actions += 1;
                return self.crash();
            }
            self.carry(action);
            if self.epoch != epoch {
                return;
            }
        }
    }

    fn carry(&mut self, action: Action<TestError>) {
        let now = self.now();
        if self.trace {
            match &action {
                Action::Produce { token, record } => trace!(
                    self,
                    "-> produce {token:?} {} {}",
                    record.event_id_text(),
                    record.topic
                ),
                Action::Count(_) => {}
                a => trace!(self, "-> {a:?}"),
            }
        }
        match action {
            Action::Produce { token, record } => self.produce(token, &record),
            Action::ProduceProgress { token, position } => {
                assert_eq!(token, PROGRESS_DELIVERY_KEY);
                if self.exactly_once() && !self.kafka.open {
                    // What a transactional producer answers (librdkafka: _STATE).
                    trace!(self, "refused the progress record: no transaction");
                    self.seen.outside_transaction += 1;
                    let e = TestError::permanent("operation not valid in state Ready");
                    return self.session.handle_refused(token, e, now);
                }
                if self.fault(20) {
                    self.seen.progress_refused += 1;
                    let e = match self.rng.percent(70) {
                        true => TestError::transient("progress: queue full"),
                        false => TestError::permanent("progress: not authorized"),
                    };
                    self.seen.progress_permanent += u64::from(!e.transient);
                    trace!(self, "refused the progress record: {e:?}");
                    return self.session.handle_refused(token, e, now);
                }
                if self.exactly_once() {
                    self.kafka.written_progress = Some(position);
                }
                self.kafka.queues[PROGRESS].push_back(Flying {
                    token,
                    id: 0,
                    key: 0,
                    dead_letter: false,
                    bytes: 0,
                    lsn: position.end_lsn.0,
                    txn_end: 0,
                    session: self.session_no,
                });
            }
            Action::BeginTransaction => {
                assert!(self.exactly_once(), "a transaction in at-least-once mode");
                assert!(!self.kafka.open, "BeginTransaction with one open");
                if self.fault(10) {
                    self.seen.begin_failures += 1;
                    let e = TestError::transient("begin: coordinator not available");
                    return self.session.handle_begun(Err(e), now);
                }
                self.kafka.open = true;
                self.session.handle_begun(Ok(()), now);
            }
            Action::CommitTransaction { position, records } => self.commit(position, records),
            Action::AbortTransaction { records, at_end } => {
                assert!(self.kafka.open, "AbortTransaction with none open");
                assert_eq!(
                    records,
                    self.kafka.written.len(),
                    "records in the aborted transaction"
                );
                self.seen.aborts += 1;
                self.kafka.abort();
                if !at_end {
                    let result = match self.fault(100) {
                        true => {
                            self.seen.abort_failures += 1;
                            Err(TestError::transient("abort: timed out"))
                        }
                        false => Ok(()),
                    };
                    self.session.handle_aborted(result, now);
                }
            }
            Action::Abandon => {
                assert!(!self.exactly_once(), "Abandon in exactly-once mode");
                // The producer purges what is queued, in some partitions.
                for p in 0..=PARTITIONS {
                    if self.rng.percent(50) {
                        self.fail(p, 0, TestError::transient("purged"));
                    }
                }
            }
            Action::Confirm(lsn) => {
                let (limit, what) = match self.mode {
                    Mode::AtLeastOnce => (
                        self.acked_progress.min(self.kafka.progress_lsn()),
                        "the newest acknowledged progress record",
                    ),
                    Mode::ExactlyOnce => (
                        self.kafka.progress_lsn(),
                        "the newest committed progress record",
                    ),
                };
                self.model.confirmed(&self.pg.txns, lsn.0, limit, what);
                self.seen.confirms += 1;
                let now = self.rng.percent(80);
                self.pg.confirmed(lsn.0, now);
            }
            Action::Count(_) => {}
            Action::Stop(result) => self.stopped(*result),
        }
    }

    fn produce(&mut self, token: ferry_core::DeliveryKey, record: &Record) {
        let now = self.now();
        let id = std::str::from_utf8(&record.event_id[24..])
            .ok()
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            .unwrap_or_else(|| panic!("event id {:?}", record.event_id_text()));
        let dead_letter = &*record.topic == DEAD_LETTER_TOPIC;
        let key: u8 = record.key.as_deref().expect("keyed")[4] - b'0';
        let bytes = record.size_bytes() as u64;
        self.largest = self.largest.max(bytes);
        let txn_end = self.pg.txns[self.pg.current()].end_lsn;
        if self.exactly_once() && !self.kafka.open {
            trace!(self, "refused {token:?} id {id}: no transaction");
            self.seen.outside_transaction += 1;
            let e = TestError::permanent("operation not valid in state Ready");
            return self.session.handle_refused(token, e, now);
        }
        if self.fault(5) {
            self.seen.refusals += 1;
            let e = match self.rng.percent(50) {
                true => TestError::transient("queue full"),
                false => TestError::permanent("message too large"),
            };
            trace!(self, "refused {token:?} id {id}: {e:?}");
            if !self.exactly_once() {
                self.model.failed(txn_end);
            }
            return self.session.handle_refused(token, e, now);
        }
        let p = Kafka::partition(key, dead_letter);
        self.kafka.queues[p].push_back(Flying {
            token,
            id,
            key,
            dead_letter,
            bytes,
            lsn: 0,
            txn_end,
            session: self.session_no,
        });
        if self.exactly_once() {
            self.kafka.written.push(Written {
                id,
                key,
                dead_letter,
            });
            let n = self.kafka.written.len() as u64;
            assert!(
                n <= self.cap,
                "{n} records in one Kafka transaction, cap {}",
                self.cap
            );
            let held = self.session.relay().in_flight();
            assert!(
                held.0 <= self.max_records,
                "{} records in flight, window {}",
                held.0,
                self.max_records
            );
            assert!(
                held.1 < self.cap_bytes + self.largest,
                "{} bytes in one Kafka transaction, cap {} (largest record {})",
                held.1,
                self.cap_bytes,
                self.largest
            );
        } else {
            let (n, b) = self.kafka.in_flight();
            assert!(
                n <= self.max_records,
                "{n} records in flight, window {}",
                self.max_records
            );
            assert!(
                b < self.max_bytes + self.largest,
                "{b} bytes in flight, window {} (largest record {})",
                self.max_bytes,
                self.largest
            );
        }
    }

    /// Exactly-once: the commit. The producer flushes what is in flight first (a record may fail
    /// there: the commit then fails abortably); then it commits, fails abortably, fails for good
    /// having landed or not (an outcome not known), or the process dies with the commit landed
    /// or not.
    fn commit(&mut self, position: ferry_core::Position, records: usize) {
        assert!(self.kafka.open, "CommitTransaction with none open");
        assert_eq!(
            records,
            self.kafka.written.len(),
            "records in the committed transaction"
        );
        trace!(self, "commit at {position:?}");
        let now = self.now();
        let mut flush_failed = false;
        for p in 0..=PARTITIONS {
            while let Some(f) = self.kafka.queues[p].pop_front() {
                let result = match !flush_failed && self.fault(5) {
                    true => {
                        flush_failed = true;
                        self.seen.failures += 1;
                        Err(TestError::transient("flush: request timed out"))
                    }
                    false => Ok(()),
                };
                self.session.handle_report(f.token, result, now);
            }
        }
        enum Outcome {
            Committed,
            Abortable,
            Failed { landed: bool },
            Crash { landed: bool },
        }
        let outcome = match self.rng.below(100) {
            _ if flush_failed => Outcome::Abortable,
            0..=2 if self.fault(1_000) => Outcome::Abortable,
            3..=4 if self.fault(1_000) => Outcome::Failed { landed: true },
            5 if self.fault(1_000) => Outcome::Failed { landed: false },
            6..=8 if self.crashes_left > 0 => {
                self.crashes_left -= 1;
                Outcome::Crash {
                    landed: self.rng.percent(60),
                }
            }
            _ => Outcome::Committed,
        };
        trace!(
            self,
            "commit outcome: {}",
            match outcome {
                Outcome::Committed => "committed".to_string(),
                Outcome::Abortable => "abortable".to_string(),
                Outcome::Failed { landed } => format!("failed, landed {landed}"),
                Outcome::Crash { landed } => format!("crash, landed {landed}"),
            }
        );
        let landed = match outcome {
            Outcome::Committed => true,
            Outcome::Abortable => false,
            Outcome::Failed { landed } | Outcome::Crash { landed } => landed,
        };
        if landed {
            // What the transaction holds is committed, whatever the machine believes it holds:
            // the guarantees judge the consequences.
            let (written, held) = self.kafka.commit();
            for w in written {
                self.model.landed(w.id, w.key, w.dead_letter);
                self.seen.dead_letters += u64::from(w.dead_letter);
            }
            if let Some(p) = held {
                let partial = p.partial.map(|x| (x.commit_lsn.0, x.events));
                self.model
                    .progress_committed(&self.pg.txns, p.end_lsn.0, partial);
            }
            self.seen.commits += 1;
        }
        match outcome {
            Outcome::Committed => self.session.handle_commit(CommitOutcome::Committed, now),
            Outcome::Abortable => {
                self.seen.abortable_commits += 1;
                let e = TestError::transient("commit: abortable");
                self.session.handle_commit(CommitOutcome::Abortable(e), now);
            }
            Outcome::Failed { landed } => {
                self.seen.failed_commits += 1;
                self.seen.unseen_commits += u64::from(landed);
                let e = TestError::permanent("commit: fenced or outcome unknown");
                self.session.handle_commit(CommitOutcome::Failed(e), now);
            }
            Outcome::Crash { landed } => {
                self.seen.crashes_in_commit += 1;
                self.seen.unseen_commits += u64::from(landed);
                self.crash();
            }
        }
    }

    /// The session stopped: the last status update goes out, and the next session starts, or
    /// the run is over.
    fn stopped(&mut self, result: Result<End, CoreError<TestError>>) {
        self.pg.status_update();
        match &result {
            Err(CoreError::Route {
                commit_lsn, event, ..
            }) => {
                let at = EventPosition {
                    commit_lsn: *commit_lsn,
                    event: *event,
                };
                let passes = self.passed.iter().filter(|p| **p == at).count();
                // Exactly-once commits the position after a passed event before the session
                // ends, so a restart meets that event again only when that last commit failed
                // (a fault): the operator passes it again. Five times in a row is a machine
                // that does not commit it.
                assert!(
                    self.mode != Mode::ExactlyOnce || passes < 5,
                    "{at} stopped Ferry again after {passes} passes: the position after the passed \
                     event is not committed before the session ends"
                );
                if passes > 0 && self.mode != Mode::ExactlyOnce {
                    // One pass at a time cannot get past this (two poison rows the restarts
                    // meet in turn): the operator sets `route.on_error = "skip"` and restarts
                    // Ferry. For the model it is the same: a poison row is never required.
                    trace!(self, "the operator sets on_error = skip");
                    self.seen.policy_changes += 1;
                    let last = self.passed.last().map(|p| p.commit_lsn);
                    self.seen.policy_changes_across += u64::from(last != Some(at.commit_lsn));
                    self.config.relay.routers = router(OnError::Skip);
                    self.pass = None;
                    self.session.set_pass(None);
                    self.exit_process();
                    return self.start_process();
                }
                // The operator runs `ferry run --skip-event <position>`.
                self.seen.route_passes += 1;
                self.passed.push(at);
                self.pass = Some(Pass::new(at, PassAction::Skip));
            }
            Err(CoreError::DrainTimeout { .. }) => self.seen.drain_timeouts += 1,
            _ => {}
        }
        if matches!(result, Ok(End::Shutdown)) && self.finished() {
            self.epoch += 1;
            self.done = true;
            return;
        }
        // A session that was sent everything and met no fault has confirmed the idle WAL end
        // when it shuts down: the server sends no other keepalive until its WAL moves.
        // Exactly-once: the slot itself (what the last commit held is confirmed before the
        // session ends).
        if matches!(result, Ok(End::Shutdown)) && self.clean_session && self.pg.done() {
            if self.exactly_once() {
                assert!(
                    self.pg.slot >= self.pg.idle_end(),
                    "an exactly-once session without faults shut down with the slot at {}, before the idle WAL end {} (committed {:?})",
                    self.pg.slot,
                    self.pg.idle_end(),
                    self.kafka.progress_lsn()
                );
            } else {
                // At-least-once: the core's confirmation (the slot follows once the progress
                // record's report is in, which a shutdown may end before).
                let confirmed = self.session.relay().confirmed();
                assert!(
                    confirmed.0 >= self.pg.idle_end(),
                    "a session without faults shut down having confirmed {confirmed}, before the idle WAL end {}",
                    Lsn(self.pg.idle_end())
                );
            }
        }
        match self.mode {
            Mode::AtLeastOnce => self.start_session(),
            Mode::ExactlyOnce => self.start_process(),
        }
    }

    /// Everything is in Kafka and the slot is at the server's idle WAL end.
    fn finished(&self) -> bool {
        let last = self.pg.idle_end();
        self.pg.slot >= last && self.kafka.progress_lsn().is_some_and(|p| p >= last)
    }

    fn step(&mut self) {
        self.tick += 1;
        self.skip_idle_time();
        let now = self.now();
        if self.session.poll_timeout().is_some_and(|t| t <= now) {
            self.session.handle_timeout(now);
            self.carry_out();
        }
        let faults = self.faults_left > 0;
        match self.rng.below(100) {
            // Kafka acknowledges the oldest record of a partition.
            0..=39 => {
                let p = self.rng.below(PARTITIONS as u64 + 1) as usize;
                self.ack(p);
            }
            // The reader hands over a message, if the machine wants one.
            40..=84 if !self.pg.done() => {
                if self.session.wants_events() {
                    self.feed();
                } else {
                    self.seen.window_full += 1;
                }
            }
            85..=89 => {
                let p = self.rng.below(PARTITIONS as u64 + 1) as usize;
                let long = p == PROGRESS && self.rng.percent(10);
                self.kafka.stalled[p] = self.tick
                    + match long {
                        // Longer than a shutdown waits for the last progress record.
                        true => 1_000 + self.rng.below(6_000),
                        false => self.rng.below(50),
                    };
            }
            90..=91 if faults => {
                let p = self.rng.below(PARTITIONS as u64 + 1) as usize;
                let n = self.kafka.queues[p].len() as u64;
                if n > 0 {
                    self.faults_left -= 1;
                    let from = self.rng.below(n) as usize;
                    let why = match self.rng.percent(70) {
                        true => TestError::transient("broker down"),
                        false => TestError::permanent("not authorized"),
                    };
                    self.fail(p, from, why);
                }
            }
            92 if faults => {
                self.faults_left -= 1;
                self.seen.reader_ends += 1;
                trace!(self, "reader ended");
                self.session.reader_ended(now);
            }
            93 if self.crashes_left > 0 => {
                self.crashes_left -= 1;
                return self.crash();
            }
            94..=96 => self.pg.status_update(),
            _ => {}
        }
        self.carry_out();
    }

    /// When nothing can happen before a deadline or a stalled partition resumes, time jumps
    /// there (a long stall costs no steps).
    fn skip_idle_time(&mut self) {
        let tick = self.tick;
        if (0..=PARTITIONS).any(|p| self.kafka.ready(p, tick))
            || (!self.pg.done() && self.session.wants_events())
        {
            return;
        }
        let deadline = self.session.poll_timeout().map(|t| {
            let ms = t
                .saturating_duration_since(self.t0)
                .as_nanos()
                .div_ceil(1_000_000);
            ms as u64
        });
        let wake = match (deadline, self.kafka.next_resume(tick)) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(w) => w,
                None => return,
            },
        };
        self.tick = self.tick.max(wake);
    }

    /// The slot is never ahead of the newest progress record in Kafka.
    fn check_slot(&self) {
        match self.kafka.progress_lsn() {
            Some(r) => assert!(
                self.pg.slot <= r,
                "the slot at {} is ahead of the newest progress record {r}",
                self.pg.slot
            ),
            None => assert_eq!(
                self.pg.slot, self.pg.created_at,
                "the slot moved without a progress record"
            ),
        }
    }

    fn run(&mut self) {
        for _ in 0..MAX_STEPS {
            if self.done {
                return self.finish();
            }
            let drained = self.pg.done() && self.session.relay().in_flight().0 == 0;
            let committed = !self.exactly_once()
                || self
                    .kafka
                    .progress_lsn()
                    .is_some_and(|p| p >= self.pg.last_end());
            if drained && committed && !self.shutting_down {
                self.shutting_down = true;
                let now = self.now();
                self.session.shutdown(now);
                self.carry_out();
                continue;
            }
            self.step();
            self.check_slot();
        }
        panic!(
            "no progress after {MAX_STEPS} steps (slot {}, last end {}, progress {:?}, in flight {:?}, {} sessions)",
            self.pg.slot,
            self.pg.last_end(),
            self.kafka.progress_lsn(),
            self.session.relay().in_flight(),
            self.seen.sessions
        );
    }

    fn finish(&mut self) {
        assert_eq!(
            self.seen.outside_transaction, 0,
            "records produced outside a Kafka transaction"
        );
        self.model.finish(&self.pg.txns);
        self.seen.duplicates = self.model.duplicates;
        let last = self.pg.idle_end();
        assert!(
            self.pg.slot >= last,
            "ended with the slot at {} before the last end {last}",
            self.pg.slot
        );
    }
}
