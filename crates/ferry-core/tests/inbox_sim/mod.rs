//! The inbox simulation harness: real [`Inbox`] machines, one per instance of a consumer group
//! of one or two, driven as `ferry inbox` drives them (every action carried out in order, each
//! outcome fed back as it comes) through a simulated Kafka ([`kafka`]) and a simulated
//! PostgreSQL ([`db`]), with faults drawn from the seed, and checked at every step.
//!
//! - **Consumers.** Each instance's consumer has a fetch position and a seek epoch per
//!   partition it holds, and a queue of fetched records not yet handed over (the driver's
//!   channel): records fetched after a seek carry its epoch, those already queued keep theirs. A
//!   fresh assignment fetches from Kafka's committed offset with epoch 0 until the machine
//!   seeks. Records are handed over only while the machine `wants_records()`.
//! - **The group** (eager protocol). A rebalance revokes every member's partitions and assigns
//!   them anew only once every member answered `Revoked` for all of them, or was dropped: a
//!   member silent for the session timeout (paused, crashed) is out of the group. A paused
//!   member that was dropped is a zombie: when it resumes it goes on (it writes what it holds,
//!   and must be fenced) until it learns it lost its partitions; it then rejoins once its
//!   machine answered `Revoked`.
//! - **Faults** (until the seed's fault phase ends): writes that fail before COMMIT, writes that
//!   commit and answer `Failed` (the COMMIT outcome unknown), database restarts (every call in
//!   flight fails; a write may have committed), loads and cleanups that fail, crashes (the
//!   machine is dropped; its write in flight may still commit; a new machine starts later and
//!   rejoins), pauses (past the session timeout: zombies), graceful restarts (a shutdown that
//!   flushes), and extra rebalances. The producer appends while the run goes.
//! - **Time** is a tick, one millisecond after an `Instant`; `poll_timeout` is honoured to the
//!   tick. Once everything is stored, time jumps from deadline to deadline until the cleanups
//!   have emptied the deduplication table; then every machine is shut down.
//! - **The deduplication window** ([`WINDOW`]) is longer than the worst delay the faults cause
//!   between two copies of an event id reaching the database (the run prints it): upstream
//!   duplicates come within [`kafka::DUP_WITHIN`] of their original, so exactly once by id is
//!   owed, and checked.

pub mod db;
pub mod kafka;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use ferry_core::inbox::{
    Inbox, InboxAction, InboxConfig, InboxError, InboxRecord, InboxStats, Loaded, Partition,
    PayloadType, SeekTo, Write, WriteOutcome,
};
use ferry_core::testing::Rng;

use db::Db;
use kafka::{Kafka, LOGS};

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
    records,
    gaps,
    upstream_duplicates,
    replays,
    non_json,
    bad_ids,
    refusing,
    no_ids,
    handed,
    stale,
    backpressure,
    writes,
    careful_writes,
    inserted,
    duplicates_by_id,
    duplicates_by_position,
    dead_letters,
    deferred_id_drops,
    cleanups,
    dedup_deleted,
    rebalances,
    revoke_waits,
    kicks,
    zombie_writes,
    fenced,
    crashes,
    orphan_commits,
    restarts,
    graceful_restarts,
    shutdown_flushes,
    pauses,
    db_restarts,
    failed_writes,
    unknown_commits,
    load_failures,
    cleanup_failures,
    reloads,
    two_instances,
    positions,
);

impl Seen {
    /// The kinds every run of many seeds must have exercised.
    pub fn required() -> Vec<&'static str> {
        let all = Seen::default().counts();
        all.into_iter().map(|(k, _)| k).collect()
    }
}

/// The deduplication window, in ticks: past the worst delay between two copies of an id
/// reaching the database under the fault schedule (a few hundred ticks: pauses past the session
/// timeout, restarts, backoffs in a row).
pub const WINDOW: u64 = 600;
/// A member silent this long is out of the group (it is also how long a rebalance waits).
const SESSION_TIMEOUT: u64 = 25;
/// The longest a cleanup takes.
const CLEANUP_TIME: u64 = 3;
/// Ticks allowed from the end of faults and production until everything is stored.
const LIVENESS: u64 = 3_000;
/// Records an instance's consumer holds fetched and not yet handed over, at most.
const QUEUE: usize = 16;
/// Rounding: a deadline is honoured at the tick it falls on, or the next.
const SLACK: u64 = 2;

macro_rules! trace {
    ($sim:expr, $($arg:tt)*) => {
        if $sim.trace {
            eprintln!("{:>5} {}", $sim.tick, format_args!($($arg)*));
        }
    };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Paused { until: u64 },
    Gone,
}

/// What an instance is told: the database's answers, and the group's decisions.
#[derive(Debug)]
enum Input {
    Loaded {
        load: u64,
        result: Result<Vec<Loaded>, String>,
        seq: u64,
    },
    Written {
        write: Write,
        outcome: WriteOutcome,
    },
    Cleaned(Result<(), String>),
    Revoke(Vec<usize>),
    Assign(Vec<usize>),
}

/// One process of `ferry inbox`: its machine and its consumer.
#[derive(Debug)]
struct Inst {
    slot: usize,
    machine: Inbox,
    state: State,
    member: bool,
    /// Dropped from the group while paused: a zombie once it resumes.
    kicked: bool,
    /// When a running zombie learns it lost its partitions.
    lost_at: Option<u64>,
    /// Partitions revoked whose `Revoked` the machine has not answered yet: the consumer does
    /// not rejoin the group before (the eager protocol's callback waits for it).
    revoking: BTreeSet<usize>,
    /// A zombie that learnt it lost its partitions rejoins once `revoking` is empty.
    rejoin: bool,
    /// Heartbeats stopped (paused, crashed) at.
    silent_since: Option<u64>,
    /// The consumer's partitions (logs), fetch position and epoch of each.
    assigned: BTreeSet<usize>,
    fetch: BTreeMap<usize, (i64, u64)>,
    queue: VecDeque<InboxRecord>,
    /// Inputs that came while paused.
    held: VecDeque<Input>,
    /// Per log, the commit number the load behind its latest seek saw.
    loaded: HashMap<usize, u64>,
    /// While a load's answer is handed over: the commit number it saw.
    load_seq: Option<u64>,
    /// The logs the write in flight touches.
    writing: Option<BTreeSet<usize>>,
    last_epoch: u64,
    /// Running (not paused) since.
    live_since: u64,
    /// When the machine must ask for its next cleanup (`None` while one runs).
    clean_due: Option<u64>,
    stopping: bool,
    stopped: bool,
    /// The last write answer handed over was `Fenced`.
    fenced: bool,
}

#[derive(Debug)]
enum OpKind {
    Load {
        load: u64,
        partitions: Vec<Partition>,
    },
    Write(Write),
    Cleanup,
}

/// A call in flight to the database, answered at `at`.
#[derive(Debug)]
struct Op {
    at: u64,
    inst: usize,
    kind: OpKind,
}

#[derive(Debug, Default)]
struct Group {
    members: BTreeSet<usize>,
    rebalance: Option<Rebalance>,
}

#[derive(Debug)]
struct Rebalance {
    started: u64,
    deadline: u64,
    /// Per member: the partitions whose `Revoked` is awaited, and whether it has joined.
    waiting: BTreeMap<usize, (BTreeSet<usize>, bool)>,
}

/// What one seed did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Report {
    pub seen: Seen,
    /// Ticks from the end of faults and production until everything was stored.
    pub settle: u64,
    pub ticks: u64,
    /// The longest a record waited between its append and its commit.
    pub max_lag: u64,
    /// The longest between an event id's first store and a later copy's commit.
    pub max_dup_gap: u64,
}

pub struct Sim {
    rng: Rng,
    trace: bool,
    t0: Instant,
    tick: u64,
    config: InboxConfig,
    interval: u64,
    kafka: Kafka,
    db: Db,
    insts: Vec<Inst>,
    /// Per slot (a process that restarts): its instance, or when it starts again.
    slots: Vec<(Option<usize>, Option<u64>)>,
    group: Group,
    ops: Vec<Op>,
    produce_until: u64,
    faults_until: u64,
    /// When everything was stored (time then skips to what is due).
    tail_at: Option<u64>,
    final_at: Option<u64>,
    largest: usize,
    cleanup_failures: Vec<u64>,
    seen: Seen,
}

/// One seed; panics on a broken guarantee.
pub fn run_seed(seed: u64) -> Report {
    let mut sim = Sim::new(seed);
    sim.run()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng::new(seed);
        let interval = rng.range(20, 60);
        let config = InboxConfig {
            max_batch_records: rng.range(1, 12) as usize,
            max_batch_bytes: rng.range(400, 3_000) as usize,
            max_batch_delay: match rng.percent(50) {
                true => Duration::ZERO,
                false => ms(rng.range(1, 5)),
            },
            max_buffered_bytes: rng.range(300, 3_000) as usize,
            event_id_header: Some("id".into()),
            positions: rng.percent(50),
            payload: PayloadType::Jsonb,
            cleanup_interval: Some(ms(interval)),
            retry_min: ms(rng.range(1, 3)),
            retry_max: ms(rng.range(8, 20)),
        };
        let slots = 1 + rng.below(2) as usize;
        let produce_until = rng.range(80, 400);
        let faults_until = rng.range(40, 450);
        let kafka = Kafka::new(&mut rng);
        let mut sim = Sim {
            rng,
            trace: std::env::var_os("FERRY_SIM_TRACE").is_some(),
            t0: Instant::now(),
            tick: 0,
            interval,
            kafka,
            db: Db::new(WINDOW),
            insts: Vec::new(),
            slots: vec![(None, None); slots],
            group: Group::default(),
            ops: Vec::new(),
            produce_until,
            faults_until,
            tail_at: None,
            final_at: None,
            largest: 0,
            cleanup_failures: Vec::new(),
            seen: Seen::default(),
            config,
        };
        sim.seen.two_instances = u64::from(slots == 2);
        sim.seen.positions = u64::from(sim.config.positions);
        trace!(
            sim,
            "{slots} instance(s), produce until {produce_until}, faults until {faults_until}, {:?}",
            sim.config
        );
        for s in 0..slots {
            sim.start(s);
        }
        sim
    }

    fn now(&self) -> Instant {
        self.t0 + ms(self.tick)
    }

    fn faults(&self) -> bool {
        self.tick < self.faults_until
    }

    fn quiet_at(&self) -> u64 {
        self.faults_until.max(self.produce_until)
    }

    fn partitions(&self, logs: &[usize]) -> Vec<Partition> {
        logs.iter()
            .map(|&l| self.kafka.partitions[l].clone())
            .collect()
    }

    // ---- instances -------------------------------------------------------------------------

    fn start(&mut self, slot: usize) {
        let i = self.insts.len();
        let now = self.now();
        self.insts.push(Inst {
            slot,
            machine: Inbox::new(self.config.clone(), now),
            state: State::Running,
            member: false,
            kicked: false,
            lost_at: None,
            revoking: BTreeSet::new(),
            rejoin: false,
            silent_since: None,
            assigned: BTreeSet::new(),
            fetch: BTreeMap::new(),
            queue: VecDeque::new(),
            held: VecDeque::new(),
            loaded: HashMap::new(),
            load_seq: None,
            writing: None,
            last_epoch: 0,
            live_since: self.tick,
            clean_due: Some(self.tick + self.interval),
            stopping: false,
            stopped: false,
            fenced: false,
        });
        self.slots[slot] = (Some(i), None);
        trace!(self, "instance {i} starts (slot {slot})");
        self.join(i);
    }

    /// The process ends: crashed (the group notices after the session timeout; its write in
    /// flight may still commit) or stopped (it leaves the group).
    fn exit(&mut self, i: usize, crashed: bool) {
        let inst = &mut self.insts[i];
        inst.state = State::Gone;
        inst.queue.clear();
        inst.held.clear();
        inst.lost_at = None;
        let slot = inst.slot;
        if crashed {
            if inst.member {
                inst.silent_since.get_or_insert(self.tick);
            }
        } else if inst.member {
            self.leave(i);
        }
        let restart = match self.final_at {
            Some(_) => None,
            None => Some(self.tick + self.rng.range(1, 40)),
        };
        self.slots[slot] = (None, restart);
        trace!(
            self,
            "instance {i} {}; slot {slot} restarts at {restart:?}",
            if crashed { "CRASHES" } else { "exits" }
        );
    }

    fn pause(&mut self, i: usize) {
        let until = self.tick + self.rng.range(5, 60);
        self.seen.pauses += 1;
        let inst = &mut self.insts[i];
        inst.state = State::Paused { until };
        if inst.member {
            inst.silent_since = Some(self.tick);
        }
        trace!(self, "instance {i} PAUSES until {until}");
    }

    fn resume(&mut self, i: usize) {
        let kicked = self.insts[i].kicked;
        trace!(
            self,
            "instance {i} resumes{}",
            if kicked { " (a zombie)" } else { "" }
        );
        let inst = &mut self.insts[i];
        inst.state = State::Running;
        inst.live_since = self.tick;
        inst.silent_since = None;
        if kicked {
            inst.kicked = false;
            inst.lost_at = Some(self.tick + self.rng.range(0, 8));
        } else if let Some(r) = &mut self.group.rebalance {
            if let Some(w) = r.waiting.get_mut(&i) {
                w.1 = true;
            }
        }
        let held = std::mem::take(&mut self.insts[i].held);
        for input in held {
            if kicked && matches!(input, Input::Revoke(_) | Input::Assign(_)) {
                continue;
            }
            if self.insts[i].state != State::Running {
                break;
            }
            self.input(i, input);
        }
    }

    /// A zombie learns it lost its partitions: revoked, it rejoins once they are answered.
    fn lost(&mut self, i: usize) {
        self.insts[i].lost_at = None;
        let parts: Vec<usize> = self.insts[i].assigned.iter().copied().collect();
        trace!(self, "instance {i} learns it lost {parts:?}");
        self.revoke(i, parts);
        let inst = &mut self.insts[i];
        if inst.state == State::Running && !inst.stopped {
            match inst.revoking.is_empty() {
                true => self.join(i),
                false => inst.rejoin = true,
            }
        }
    }

    fn deliver(&mut self, i: usize, input: Input) {
        match self.insts[i].state {
            State::Running => self.input(i, input),
            State::Paused { .. } => self.insts[i].held.push_back(input),
            State::Gone => {}
        }
    }

    fn input(&mut self, i: usize, input: Input) {
        let now = self.now();
        match input {
            Input::Loaded { load, result, seq } => {
                trace!(self, "{i} <- loaded {load}: {result:?}");
                self.insts[i].load_seq = Some(seq);
                self.insts[i].machine.handle_loaded(load, result, now);
                self.carry_out(i);
                self.insts[i].load_seq = None;
            }
            Input::Written { write, outcome } => {
                trace!(self, "{i} <- written {}: {outcome:?}", write.id);
                let fenced = matches!(outcome, WriteOutcome::Fenced { .. });
                self.insts[i].writing = None;
                self.insts[i].fenced = fenced;
                self.insts[i].machine.handle_written(write, outcome, now);
                self.carry_out(i);
                if fenced {
                    assert!(
                        self.insts[i].stopped,
                        "instance {i}: a fenced machine does not stop"
                    );
                }
            }
            Input::Cleaned(result) => {
                trace!(self, "{i} <- cleaned: {result:?}");
                self.insts[i].clean_due = Some(self.tick + self.interval);
                self.insts[i].machine.handle_cleaned(result, now);
                self.carry_out(i);
            }
            Input::Revoke(parts) => self.revoke(i, parts),
            Input::Assign(parts) => self.assign(i, parts),
        }
    }

    fn revoke(&mut self, i: usize, parts: Vec<usize>) {
        let parts: Vec<usize> = parts
            .into_iter()
            .filter(|l| self.insts[i].assigned.contains(l))
            .collect();
        if parts.is_empty() {
            return;
        }
        for l in &parts {
            self.insts[i].assigned.remove(l);
            self.insts[i].fetch.remove(l);
            self.insts[i].revoking.insert(*l);
        }
        let partitions = self.partitions(&parts);
        trace!(self, "{i} <- revoked {parts:?}");
        let now = self.now();
        self.insts[i].machine.handle_revoked(partitions, now);
        self.carry_out(i);
        let waits = match &self.group.rebalance {
            Some(r) => r.waiting.get(&i).is_some_and(|w| !w.0.is_empty()),
            None => false,
        };
        self.seen.revoke_waits += u64::from(waits);
    }

    fn assign(&mut self, i: usize, parts: Vec<usize>) {
        for &l in &parts {
            self.insts[i].assigned.insert(l);
            let from = self.kafka.logs[l].committed.unwrap_or(0);
            self.insts[i].fetch.insert(l, (from, 0));
        }
        let partitions = self.partitions(&parts);
        trace!(self, "{i} <- assigned {parts:?}");
        let now = self.now();
        self.insts[i].machine.handle_assigned(partitions, now);
        self.carry_out(i);
    }

    // ---- the group ---------------------------------------------------------------------------

    fn join(&mut self, i: usize) {
        self.insts[i].member = true;
        self.group.members.insert(i);
        match &mut self.group.rebalance {
            Some(r) => {
                r.waiting.insert(i, (BTreeSet::new(), true));
            }
            None => self.rebalance(),
        }
    }

    fn leave(&mut self, i: usize) {
        self.insts[i].member = false;
        self.group.members.remove(&i);
        match &mut self.group.rebalance {
            Some(r) => {
                r.waiting.remove(&i);
            }
            None => self.rebalance(),
        }
    }

    /// Out of the group: silent too long, or late in a rebalance.
    fn kick(&mut self, i: usize) {
        trace!(self, "the group drops instance {i}");
        self.seen.kicks += 1;
        let inst = &mut self.insts[i];
        inst.member = false;
        inst.silent_since = None;
        match inst.state {
            State::Paused { .. } => inst.kicked = true,
            State::Running => inst.lost_at = Some(self.tick + self.rng.range(0, 8)),
            State::Gone => {}
        }
        self.group.members.remove(&i);
        match &mut self.group.rebalance {
            Some(r) => {
                r.waiting.remove(&i);
            }
            None => self.rebalance(),
        }
    }

    /// Eager: every member's partitions are revoked; they are assigned again once all answered.
    fn rebalance(&mut self) {
        self.seen.rebalances += 1;
        let members: Vec<usize> = self.group.members.iter().copied().collect();
        let waiting = members
            .iter()
            .map(|&m| {
                let inst = &self.insts[m];
                (m, (inst.assigned.clone(), inst.state == State::Running))
            })
            .collect();
        self.group.rebalance = Some(Rebalance {
            started: self.tick,
            deadline: self.tick + SESSION_TIMEOUT,
            waiting,
        });
        trace!(self, "rebalance of {members:?}");
        for m in members {
            let parts: Vec<usize> = self.insts[m].assigned.iter().copied().collect();
            match self.insts[m].state {
                State::Running => self.revoke(m, parts),
                State::Paused { .. } => self.insts[m].held.push_back(Input::Revoke(parts)),
                State::Gone => {}
            }
        }
    }

    fn progress_group(&mut self) {
        if self.group.rebalance.is_none()
            && !self
                .group
                .members
                .iter()
                .any(|&m| self.insts[m].silent_since.is_some())
        {
            return;
        }
        let silent: Vec<usize> = self
            .group
            .members
            .iter()
            .copied()
            .filter(|&m| {
                self.insts[m]
                    .silent_since
                    .is_some_and(|s| self.tick >= s + SESSION_TIMEOUT)
            })
            .collect();
        for m in silent {
            self.kick(m);
        }
        let Some(r) = &self.group.rebalance else {
            return;
        };
        let late: Vec<usize> = r
            .waiting
            .iter()
            .filter(|(_, (parts, joined))| !*joined || !parts.is_empty())
            .map(|(m, _)| *m)
            .collect();
        if !late.is_empty() {
            if self.tick < r.deadline {
                return;
            }
            for m in late {
                // A member running all along answers within the session timeout: its machine
                // waits at most for the write in flight (and its careful resend).
                let inst = &self.insts[m];
                if let Some(r) = &self.group.rebalance {
                    assert!(
                        inst.state != State::Running || inst.live_since > r.started,
                        "instance {m} has not answered Revoked for {:?} since the rebalance at {}",
                        r.waiting[&m].0,
                        r.started
                    );
                }
                self.kick(m);
            }
        }
        self.group.rebalance = None;
        let members: Vec<usize> = self.group.members.iter().copied().collect();
        if members.is_empty() {
            return;
        }
        let mut owned = vec![Vec::new(); members.len()];
        for l in 0..LOGS {
            owned[self.rng.below(members.len() as u64) as usize].push(l);
        }
        trace!(self, "assignment: {members:?} get {owned:?}");
        for (m, logs) in members.into_iter().zip(owned) {
            if logs.is_empty() {
                continue;
            }
            match self.insts[m].state {
                State::Running => self.assign(m, logs),
                State::Paused { .. } => self.insts[m].held.push_back(Input::Assign(logs)),
                State::Gone => {}
            }
        }
    }

    // ---- the machine's actions ---------------------------------------------------------------

    fn carry_out(&mut self, i: usize) {
        while let Some(action) = self.insts[i].machine.poll_action() {
            assert!(
                !self.insts[i].stopped,
                "instance {i}: {action:?} after Stop"
            );
            self.carry(i, action);
        }
    }

    fn carry(&mut self, i: usize, action: InboxAction) {
        match action {
            InboxAction::Load { load, partitions } => {
                trace!(self, "{i} -> load {load} {}", show(&partitions));
                for p in &partitions {
                    let l = self.kafka.log_of(p);
                    assert!(
                        self.insts[i].assigned.contains(&l),
                        "instance {i} loads {p}, which its consumer does not hold"
                    );
                }
                let at = self.tick + self.rng.range(1, 3);
                self.push_op(i, at, OpKind::Load { load, partitions });
            }
            InboxAction::Seek {
                partition,
                to,
                epoch,
            } => {
                trace!(self, "{i} -> seek {partition} {to:?} epoch {epoch}");
                let l = self.kafka.log_of(&partition);
                let inst = &mut self.insts[i];
                assert!(
                    inst.assigned.contains(&l),
                    "instance {i} seeks {partition}, which its consumer does not hold"
                );
                assert!(
                    epoch > inst.last_epoch,
                    "instance {i}: epoch {epoch} after {}",
                    inst.last_epoch
                );
                inst.last_epoch = epoch;
                let seq = inst.load_seq.expect("a seek outside a load's answer");
                inst.loaded.insert(l, seq);
                let from = match to {
                    SeekTo::Offset(o) => o,
                    SeekTo::Start => 0,
                };
                inst.fetch.insert(l, (from, epoch));
            }
            InboxAction::Write(w) => self.write(i, w),
            InboxAction::CommitOffsets(offsets) => {
                trace!(self, "{i} -> commit offsets {offsets:?}");
                for (p, next) in offsets {
                    let l = self.kafka.log_of(&p);
                    assert!(
                        self.db.committed_ever(l, next),
                        "instance {i} commits offset {next} of {p} to Kafka, which the database \
                         never committed (it holds {:?})",
                        self.db.stored(l)
                    );
                    if self.insts[i].member {
                        self.kafka.logs[l].committed = Some(next);
                    }
                }
            }
            InboxAction::Revoked(partitions) => {
                trace!(self, "{i} -> revoked {}", show(&partitions));
                for p in &partitions {
                    let l = self.kafka.log_of(p);
                    let inst = &mut self.insts[i];
                    assert!(
                        inst.revoking.remove(&l) && !inst.assigned.contains(&l),
                        "instance {i} answers Revoked for {p}, which was not revoked"
                    );
                    assert!(
                        !inst.writing.as_ref().is_some_and(|w| w.contains(&l)),
                        "instance {i} answers Revoked for {p} with a write to it in flight"
                    );
                    if let Some(r) = &mut self.group.rebalance {
                        if let Some(w) = r.waiting.get_mut(&i) {
                            w.0.remove(&l);
                        }
                    }
                }
                let inst = &mut self.insts[i];
                if inst.rejoin && inst.revoking.is_empty() {
                    inst.rejoin = false;
                    self.join(i);
                }
            }
            InboxAction::Cleanup => {
                trace!(self, "{i} -> cleanup");
                assert!(
                    self.insts[i].clean_due.take().is_some(),
                    "instance {i}: a cleanup while one runs"
                );
                let at = self.tick + self.rng.range(1, CLEANUP_TIME);
                self.push_op(i, at, OpKind::Cleanup);
            }
            InboxAction::Stop(result) => {
                trace!(self, "{i} -> stop {result:?}");
                let inst = &mut self.insts[i];
                inst.stopped = true;
                match result {
                    Ok(()) => assert!(inst.stopping, "instance {i} stops without a shutdown"),
                    Err(InboxError::Fenced { .. }) => {
                        assert!(
                            inst.fenced,
                            "instance {i} stops fenced without a fenced write"
                        );
                        self.seen.fenced += 1;
                    }
                }
                self.exit(i, false);
            }
        }
    }

    fn write(&mut self, i: usize, w: Write) {
        if self.trace {
            let rows: Vec<String> = w
                .rows
                .iter()
                .map(|r| format!("{}@{}", r.record.partition, r.record.offset))
                .collect();
            let dead: Vec<String> = w
                .dead_letters
                .iter()
                .map(|d| format!("{}@{}", d.record.partition, d.record.offset))
                .collect();
            let offsets: Vec<String> = w
                .offsets
                .iter()
                .map(|o| format!("{} {:?}→{}", o.partition, o.expected, o.next))
                .collect();
            trace!(
                self,
                "{i} -> write {}{}: rows {rows:?} dead {dead:?} offsets {offsets:?} marks {} dropped {}+{}",
                w.id,
                if w.careful { " (careful)" } else { "" },
                w.marks.len(),
                w.dropped_by_id,
                w.dropped_by_position
            );
        }
        let inst = &self.insts[i];
        assert!(inst.writing.is_none(), "instance {i}: two writes in flight");
        let mut logs = BTreeSet::new();
        for o in &w.offsets {
            let l = self.kafka.log_of(&o.partition);
            assert!(logs.insert(l), "write {}: {} twice", w.id, o.partition);
            assert!(
                inst.assigned.contains(&l) && inst.loaded.contains_key(&l),
                "instance {i} writes {}, which its consumer does not hold",
                o.partition
            );
        }
        let n = w.rows.len() + w.dead_letters.len();
        let n = n as u64 + w.dropped_by_id + w.dropped_by_position;
        assert!(
            w.careful || n <= self.config.max_batch_records as u64,
            "write {} of {n} records, max {}",
            w.id,
            self.config.max_batch_records
        );
        self.seen.writes += 1;
        self.seen.careful_writes += u64::from(w.careful);
        self.seen.zombie_writes += u64::from(!inst.member);
        self.insts[i].writing = Some(logs);
        let at = self.tick + self.rng.range(1, 3);
        self.push_op(i, at, OpKind::Write(w));
    }

    fn push_op(&mut self, inst: usize, at: u64, kind: OpKind) {
        self.ops.push(Op { at, inst, kind });
    }

    // ---- the database ------------------------------------------------------------------------

    fn apply(&mut self, i: usize, w: &Write) -> WriteOutcome {
        self.db.write(
            &mut self.kafka,
            w,
            i,
            &self.insts[i].loaded,
            self.config.positions,
            self.tick,
            &mut self.seen,
        )
    }

    fn complete_ops(&mut self) {
        let tick = self.tick;
        if !self.ops.iter().any(|o| o.at <= tick) {
            return;
        }
        let (mut due, rest): (Vec<Op>, Vec<Op>) = std::mem::take(&mut self.ops)
            .into_iter()
            .partition(|o| o.at <= tick);
        self.ops = rest;
        due.sort_by_key(|o| o.at);
        for op in due {
            self.complete(op);
        }
    }

    fn complete(&mut self, op: Op) {
        let i = op.inst;
        let orphan = self.insts[i].state == State::Gone;
        let faults = self.faults();
        match op.kind {
            OpKind::Load { load, partitions } => {
                if orphan {
                    return;
                }
                let input = match faults && self.rng.percent(5) {
                    true => {
                        self.seen.load_failures += 1;
                        Input::Loaded {
                            load,
                            result: Err("could not connect to server".to_string()),
                            seq: 0,
                        }
                    }
                    false => {
                        let (loaded, seq) = self.db.load(&self.kafka, &partitions);
                        Input::Loaded {
                            load,
                            result: Ok(loaded),
                            seq,
                        }
                    }
                };
                self.deliver(i, input);
            }
            OpKind::Write(w) => {
                if orphan {
                    // The process is gone; its transaction commits or not.
                    if self.rng.percent(50) {
                        let outcome = self.apply(i, &w);
                        trace!(self, "orphan write {} of {i}: {outcome:?}", w.id);
                        self.seen.orphan_commits +=
                            u64::from(matches!(outcome, WriteOutcome::Committed { .. }));
                    }
                    return;
                }
                let outcome = match if faults { self.rng.below(100) } else { 100 } {
                    0..=4 => {
                        self.seen.failed_writes += 1;
                        WriteOutcome::Failed {
                            error: "connection reset by peer".into(),
                        }
                    }
                    5..=8 => {
                        let outcome = self.apply(i, &w);
                        trace!(self, "write {} of {i}: {outcome:?}, answer lost", w.id);
                        self.seen.unknown_commits +=
                            u64::from(matches!(outcome, WriteOutcome::Committed { .. }));
                        WriteOutcome::Failed {
                            error: "connection lost during COMMIT".into(),
                        }
                    }
                    _ => self.apply(i, &w),
                };
                self.deliver(i, Input::Written { write: w, outcome });
            }
            OpKind::Cleanup => {
                if !orphan && faults && self.rng.percent(5) {
                    self.seen.cleanup_failures += 1;
                    self.cleanup_failures.push(self.tick);
                    return self.deliver(i, Input::Cleaned(Err("statement timeout".into())));
                }
                let deleted = self.db.cleanup(self.tick);
                self.seen.dedup_deleted += deleted;
                self.seen.cleanups += 1;
                trace!(self, "cleanup of {i}: {deleted} dedup rows deleted");
                self.deliver(i, Input::Cleaned(Ok(())));
            }
        }
    }

    /// Every call in flight fails; a write whose COMMIT was sent may have committed.
    fn db_restart(&mut self) {
        trace!(self, "DATABASE RESTART");
        self.seen.db_restarts += 1;
        for op in std::mem::take(&mut self.ops) {
            let i = op.inst;
            let error = "terminating connection due to administrator command".to_string();
            match op.kind {
                OpKind::Load { load, .. } => self.deliver(
                    i,
                    Input::Loaded {
                        load,
                        result: Err(error),
                        seq: 0,
                    },
                ),
                OpKind::Write(w) => {
                    if self.rng.percent(30) {
                        let outcome = self.apply(i, &w);
                        trace!(self, "write {} of {i}: {outcome:?}, answer lost", w.id);
                    }
                    self.deliver(
                        i,
                        Input::Written {
                            write: w,
                            outcome: WriteOutcome::Failed { error },
                        },
                    );
                }
                OpKind::Cleanup => {
                    self.cleanup_failures.push(self.tick);
                    self.deliver(i, Input::Cleaned(Err(error)));
                }
            }
        }
    }

    // ---- steps -------------------------------------------------------------------------------

    fn timers(&mut self, i: usize) {
        let now = self.now();
        if self.insts[i].machine.poll_timeout().is_none_or(|t| t > now) {
            return;
        }
        self.insts[i].machine.handle_timeout(now);
        self.carry_out(i);
        if self.insts[i].state == State::Running && !self.insts[i].stopped {
            let next = self.insts[i].machine.poll_timeout();
            assert!(
                next.is_none_or(|t| t > now),
                "instance {i}: poll_timeout is still due after handle_timeout ({} ms ≤ now): a \
                 driver sleeping until it would spin",
                next.map_or(0, |t| t.duration_since(self.t0).as_millis())
            );
        }
    }

    fn consume(&mut self, i: usize) {
        let inst = &self.insts[i];
        if inst.stopping || inst.stopped {
            return;
        }
        if inst.queue.len() < QUEUE && !inst.fetch.is_empty() && self.rng.percent(60) {
            let k = self.rng.below(inst.fetch.len() as u64) as usize;
            let l = *inst.fetch.keys().nth(k).expect("k < len");
            let (from, epoch) = inst.fetch[&l];
            let n = self.rng.range(1, 4) as usize;
            let log = &self.kafka.logs[l];
            let first = log.from(from);
            let mut next = from;
            let fetched: Vec<InboxRecord> = log.records[first..]
                .iter()
                .take(n)
                .map(|r| {
                    next = r.offset + 1;
                    self.kafka.inbox_record(l, r, epoch)
                })
                .collect();
            let inst = &mut self.insts[i];
            inst.queue.extend(fetched);
            inst.fetch.insert(l, (next, epoch));
        }
        if !self.rng.percent(75) {
            return;
        }
        let now = self.now();
        for _ in 0..self.rng.range(1, 4) {
            let inst = &mut self.insts[i];
            if inst.state != State::Running || inst.stopped || inst.queue.is_empty() {
                break;
            }
            if !inst.machine.wants_records() {
                self.seen.backpressure += 1;
                break;
            }
            let r = inst.queue.pop_front().expect("not empty");
            let size = r.size();
            self.largest = self.largest.max(size);
            trace!(
                self,
                "{i} <- record {}@{} epoch {}",
                r.partition,
                r.offset,
                r.epoch
            );
            self.seen.handed += 1;
            self.insts[i].machine.handle_record(r, now);
            let buffered = self.insts[i].machine.buffered_bytes();
            assert!(
                buffered <= self.config.max_buffered_bytes + self.largest,
                "instance {i} buffers {buffered} bytes, max {} + one record ({})",
                self.config.max_buffered_bytes,
                self.largest
            );
            self.carry_out(i);
        }
    }

    fn fault(&mut self) {
        if self.rng.below(1_000) >= 21 {
            return;
        }
        let running: Vec<usize> = (0..self.insts.len())
            .filter(|&i| self.insts[i].state == State::Running && !self.insts[i].stopping)
            .collect();
        let pick = |rng: &mut Rng| {
            running
                .get(rng.below(running.len() as u64) as usize)
                .copied()
        };
        match self.rng.below(21) {
            0..=4 => self.db_restart(),
            5..=7 => {
                let alive: Vec<usize> = (0..self.insts.len())
                    .filter(|&i| self.insts[i].state != State::Gone)
                    .collect();
                if let Some(&i) = alive.get(self.rng.below(alive.len() as u64) as usize) {
                    self.seen.crashes += 1;
                    self.exit(i, true);
                }
            }
            8..=13 => {
                if let Some(i) = pick(&mut self.rng) {
                    self.pause(i);
                }
            }
            14..=15 => {
                if let Some(i) = pick(&mut self.rng) {
                    trace!(self, "instance {i} shuts down (graceful restart)");
                    self.seen.graceful_restarts += 1;
                    self.seen.shutdown_flushes +=
                        u64::from(self.insts[i].machine.buffered_bytes() > 0);
                    self.shutdown(i);
                }
            }
            16..=20 if self.group.rebalance.is_none() && !self.group.members.is_empty() => {
                self.rebalance()
            }
            _ => {}
        }
    }

    fn shutdown(&mut self, i: usize) {
        self.insts[i].stopping = true;
        let now = self.now();
        self.insts[i].machine.shutdown(now);
        self.carry_out(i);
    }

    fn step(&mut self) {
        self.tick += 1;
        let tick = self.tick;
        for s in 0..self.slots.len() {
            if let (None, Some(at)) = self.slots[s] {
                if at <= tick {
                    self.seen.restarts += 1;
                    self.start(s);
                }
            }
        }
        for i in 0..self.insts.len() {
            if matches!(self.insts[i].state, State::Paused { until } if until <= tick) {
                self.resume(i);
            }
            if self.insts[i].state == State::Running
                && self.insts[i].lost_at.is_some_and(|t| t <= tick)
            {
                self.lost(i);
            }
        }
        self.progress_group();
        self.complete_ops();
        for i in 0..self.insts.len() {
            if self.insts[i].state == State::Running {
                self.timers(i);
            }
        }
        if self.faults() {
            self.fault();
        }
        if tick < self.produce_until && self.rng.percent(30) {
            let what = self.kafka.produce(&mut self.rng, tick, &mut self.seen);
            trace!(self, "produce: {what}");
        }
        for i in 0..self.insts.len() {
            if self.insts[i].state == State::Running {
                self.consume(i);
            }
        }
        self.check();
    }

    /// The checks of every step that are not made where things happen: cleanups come on time,
    /// and no dedup row outlives the window by more than a cleanup interval and a cleanup.
    fn check(&mut self) {
        let tick = self.tick;
        let mut live_since = None::<u64>;
        for (i, inst) in self.insts.iter().enumerate() {
            if inst.state != State::Running || inst.stopping || inst.stopped {
                continue;
            }
            if let Some(due) = inst.clean_due {
                assert!(
                    tick <= due + SLACK,
                    "instance {i} has not asked for a cleanup since {} (interval {})",
                    due - self.interval,
                    self.interval
                );
            }
            live_since = Some(live_since.map_or(inst.live_since, |s| s.min(inst.live_since)));
        }
        let Some(since) = live_since else {
            return;
        };
        let Some((received, id)) = self.db.oldest_dedup(tick.saturating_sub(WINDOW)) else {
            return;
        };
        let base = (received + WINDOW).max(since);
        let failures = self.cleanup_failures.iter().filter(|&&f| f >= base).count() as u64;
        let deadline =
            base + (1 + failures) * (self.interval + CLEANUP_TIME + SLACK) + CLEANUP_TIME;
        assert!(
            tick <= deadline,
            "the dedup row of {id}, received at {received}, is still there at {tick}: past the \
             window ({WINDOW}) + one cleanup interval ({}) + a cleanup ({CLEANUP_TIME}), with a \
             machine running since {since} and {failures} failed cleanups",
            self.interval
        );
    }

    /// Once everything is stored: when nothing can happen before the next deadline, time jumps
    /// there.
    fn skip_idle_time(&mut self) {
        let busy = self.insts.iter().any(|i| {
            i.state == State::Running
                && (!i.queue.is_empty()
                    || i.fetch.iter().any(|(&l, &(from, _))| {
                        self.kafka.logs[l].from(from) < self.kafka.logs[l].records.len()
                    }))
        });
        if busy {
            return;
        }
        let t0 = self.t0;
        let machines = self
            .insts
            .iter()
            .filter(|i| i.state == State::Running)
            .flat_map(|i| {
                let due = i.machine.poll_timeout().map(|t| {
                    t.saturating_duration_since(t0)
                        .as_nanos()
                        .div_ceil(1_000_000) as u64
                });
                [due, i.lost_at, i.silent_since.map(|s| s + SESSION_TIMEOUT)]
            });
        let wake = machines
            .chain(self.ops.iter().map(|o| Some(o.at)))
            .chain(self.slots.iter().map(|s| s.1))
            .chain([self.group.rebalance.as_ref().map(|r| r.deadline)])
            .flatten()
            .min();
        if let Some(w) = wake {
            self.tick = self.tick.max(w.saturating_sub(1));
        }
    }

    fn settled(&self) -> bool {
        self.tick >= self.quiet_at()
            && self
                .insts
                .iter()
                .all(|i| !matches!(i.state, State::Paused { .. }))
            && (0..LOGS).all(|l| match self.kafka.logs[l].done_at() {
                None => true,
                Some(d) => self.db.stored(l).is_some_and(|s| s >= d),
            })
    }

    fn run(&mut self) -> Report {
        let mut settle = 0;
        loop {
            if self.tail_at.is_some() {
                self.skip_idle_time();
            }
            self.step();
            if self.tail_at.is_none() && self.settled() {
                // Everything is stored: time goes on without records until every dedup row
                // is cleaned.
                settle = self.tick - self.quiet_at();
                trace!(self, "everything is stored");
                self.tail_at = Some(self.tick);
            }
            if self.tail_at.is_some()
                && self.final_at.is_none()
                && self.db.oldest_dedup(u64::MAX).is_none()
            {
                trace!(self, "every dedup row is cleaned: shutdown");
                self.final_at = Some(self.tick);
                for s in &mut self.slots {
                    s.1 = None;
                }
                for i in 0..self.insts.len() {
                    if self.insts[i].state == State::Running && !self.insts[i].stopped {
                        self.shutdown(i);
                    }
                }
            }
            if self.final_at.is_some() && self.insts.iter().all(|i| i.state == State::Gone) {
                break;
            }
            if self.tail_at.is_none() && self.tick > self.quiet_at() + LIVENESS
                || self.tick > self.quiet_at() + LIVENESS + 2 * WINDOW
            {
                let stored: Vec<String> = (0..LOGS)
                    .map(|l| {
                        format!(
                            "{}: {:?}/{:?}",
                            self.kafka.partitions[l],
                            self.db.stored(l),
                            self.kafka.logs[l].done_at()
                        )
                    })
                    .collect();
                let insts: Vec<String> = self
                    .insts
                    .iter()
                    .enumerate()
                    .filter(|(_, i)| i.state != State::Gone)
                    .map(|(n, i)| {
                        format!(
                            "{n}: {:?} member {} assigned {:?} active {:?}",
                            i.state,
                            i.member,
                            i.assigned,
                            i.machine.active_partitions().collect::<Vec<_>>()
                        )
                    })
                    .collect();
                panic!(
                    "not everything is stored {LIVENESS} ticks after faults and production ended \
                     (stored/end: {stored:?}; instances: {insts:?}; group: {:?})",
                    self.group
                );
            }
        }
        self.finish(settle)
    }

    fn finish(&mut self, settle: u64) -> Report {
        self.db.finish(&self.kafka);
        for (l, log) in self.kafka.logs.iter().enumerate() {
            if let Some(c) = log.committed {
                assert!(
                    self.db.stored(l).is_some_and(|s| c <= s),
                    "Kafka's committed offset {c} of {} passes the database's",
                    self.kafka.partitions[l]
                );
            }
        }
        let mut stats = InboxStats::default();
        for inst in &self.insts {
            let s = inst.machine.stats();
            stats.inserted += s.inserted;
            stats.duplicates_by_id += s.duplicates_by_id;
            stats.duplicates_by_position += s.duplicates_by_position;
            stats.dead_lettered += s.dead_lettered;
            stats.stale += s.stale;
            stats.failures += s.failures;
        }
        let s = &mut self.seen;
        s.records = self.kafka.record_count() as u64;
        s.gaps = self
            .kafka
            .logs
            .iter()
            .map(|l| l.end as u64 - l.records.len() as u64)
            .sum();
        s.inserted = stats.inserted;
        s.duplicates_by_id = stats.duplicates_by_id;
        s.duplicates_by_position = stats.duplicates_by_position;
        s.dead_letters = stats.dead_lettered;
        s.stale = stats.stale;
        s.reloads = stats.failures;
        Report {
            seen: self.seen,
            settle,
            ticks: self.tick,
            max_lag: self.db.max_lag,
            max_dup_gap: self.db.max_dup_gap,
        }
    }
}

fn show(partitions: &[Partition]) -> String {
    let v: Vec<String> = partitions.iter().map(ToString::to_string).collect();
    v.join(",")
}
