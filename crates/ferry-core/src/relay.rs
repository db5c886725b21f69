//! The relay core: one session's decisions as a state machine with no I/O and no clock.
//!
//! Inputs: reader events ([`Relay::handle_outbox`], [`Relay::handle_keepalive`], and
//! [`Relay::reader_ended`]), delivery reports ([`Relay::handle_report`]), records the sink would
//! not accept ([`Relay::handle_refused`]), the time ([`Relay::handle_timeout`], and the `now`
//! every input carries, read by the driver), and a shutdown request ([`Relay::shutdown`]).
//! Outputs: [`Action`]s, taken one at a time with [`Relay::poll_action`] from a queue that is
//! reused (no allocation per event), the deadline the driver must wake up at
//! ([`Relay::poll_timeout`]), and whether to read more WAL ([`Relay::wants_events`]).
//!
//! The relay is a part of the session machine ([`crate::session`]), which feeds it and carries its
//! actions into the modes' parts. It lives as long as the sink (across sessions): its in-flight table must find the
//! record of every report, including a late one from a session that already ended. Each session
//! begins with [`Relay::start`] at the position the server resumes from.
//!
//! # The decisions it makes
//!
//! - **What to produce**: every outbox row and message of a transaction, routed by the real
//!   router; an event the router rejects goes by `route.on_error` (see [`crate::route`]).
//! - **What to confirm**: [`Action::Confirm`] with the watermark's confirmed LSN whenever it
//!   advances, the only place that LSN is held. It never moves backwards (the watermark never
//!   lowers it) and never advances past a failed record (a failure freezes the watermark).
//! - **When to read**: only while the in-flight window has room ([`crate::window`]), no failure
//!   happened and no drain began.
//! - **When to stop**: a failure (a route error under `fail`, a failed or refused record, a
//!   layout binary mode cannot read), the reader ending, or a shutdown request start a *drain*:
//!   no more WAL, and the session ends once every record in flight is reported, or at the
//!   drain's deadline. A bookkeeping error (a report no record was produced for, a rewind) ends
//!   the session at once: the state cannot be trusted, and nothing past it is confirmed.
//! - **The first failure wins**: a session that failed ends with that failure whatever else
//!   happens during its drain (a shutdown, the deadline).
//!
//! # Exactly-once (`RelayConfig::exactly_once`)
//!
//! The same rules, and three more (issue 11; the sink's side is in [`crate::sink`]):
//!
//! - **Skip what Kafka holds.** A session starts with the remembered progress record
//!   ([`Relay::start_from`]) and skips every event it [covers](ProgressRecord::covers). Events
//!   are counted per transaction in WAL order, every outbox row and message, whatever
//!   `route.on_error` does with them: a dead-lettered row counts as handled once its dead letter
//!   is committed, and is never dead-lettered twice.
//! - **Say where it is after every event** ([`Action::Position`]): after each row or message
//!   the position is *(commit LSN, events handled)* inside the transaction, after its commit
//!   the transaction's end LSN. The session machine ([`crate::session::transaction`]) may end a Kafka transaction at any of them, so a Kafka
//!   transaction is bounded by time and size, never by the size of a PostgreSQL transaction.
//! - **Confirm only what a committed progress record holds.** The session machine tells the core the end
//!   LSN its last committed progress record holds ([`Relay::progress_committed`]); the core
//!   confirms the lower of that and the watermark. A transaction without records (all skipped,
//!   or all covered) would otherwise be confirmed ahead of any record that says Ferry got there,
//!   and a restart would find the slot ahead of the remembered position.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_pgtypes::Lsn;
use ferry_router::{Record, RouteError, Routers, TraceOutcome, TraceProblem};
use ferry_wal::assembly::OutboxEvent;

use crate::guard::BinaryGuard;
use crate::inflight::{DeliveryKey, Entry, InFlight};
use crate::pass::{EventPosition, Fate, Meeting, Moved, Pass, PassAction};
use crate::progress_record::{Partial, ProgressRecord};
use crate::route::{self, RouteErrorKind, Routed};
use crate::source_position::{SourcePosition, Stamp};
use crate::watermark::{Watermark, WatermarkError};
use crate::window::Window;

/// What the core needs to know, fixed for its life.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// A router per outbox table ([`ferry_wal::assembly::OutboxRow::table`] picks one); the first
    /// also routes table-less messages.
    pub routers: Arc<Routers>,
    /// In-flight window: records handed to the sink and not yet reported.
    pub max_in_flight_records: u64,
    /// In-flight window in record bytes.
    pub max_in_flight_bytes: u64,
    /// Graceful shutdown: how long to wait for in-flight reports.
    pub drain_timeout: Duration,
    /// How long a session that ends for another reason waits for them; `None` = for ever.
    pub session_drain_timeout: Option<Duration>,
    /// Exactly-once mode: positions after every event, covered events skipped, confirms held
    /// to the committed progress (see the [module documentation](self)).
    pub exactly_once: bool,
}

/// How a session ended without error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// A shutdown was requested; everything in flight was reported and confirmed.
    Shutdown,
    /// The reader ended (its own outcome says why); everything in flight was reported.
    ReaderEnded,
}

/// Why a session stopped with an error. `E` is the sink's error.
#[derive(Debug)]
pub enum CoreError<E> {
    /// A row the router rejected under `on_error = "fail"`; `table` is the outbox table's
    /// position ([`ferry_wal::assembly::OutboxRow::table`]), `None` for a table-less message.
    Route {
        error: RouteError,
        commit_lsn: Lsn,
        /// The event's place among its transaction's outbox events, from 1: with `commit_lsn`,
        /// the position `--skip-event` / `--dead-letter-event` name ([`crate::pass`]).
        event: u64,
        /// The row's (or message's) own LSN, for the log.
        lsn: Lsn,
        table: Option<usize>,
        /// The one-shot pass given for this run, if any (it names another event, or it names
        /// this one and `route.dead_letter_topic` is unset).
        pass: Option<Pass>,
    },
    /// Kafka failed or refused a record for `topic`.
    Delivery { topic: Arc<str>, error: E },
    /// The sink failed outside a record (e.g. at a commit point).
    Sink(E),
    /// In binary mode the outbox table's layout changed to a type readable only as text.
    TextNeeded {
        column: String,
        type_oid: u32,
        /// The outbox table's position ([`ferry_wal::assembly::OutboxRow::table`]).
        table: usize,
    },
    /// The watermark refused a call: the event stream or the core's bookkeeping is wrong.
    Bookkeeping(WatermarkError),
    /// A report for a token with no record in flight (never handed out, or reported twice).
    UnknownReport { token: DeliveryKey },
    /// Records were still unreported when the drain's deadline passed.
    DrainTimeout { records: u64 },
    /// Exactly-once: a transaction call failed for good (begin, or a commit that cannot be
    /// aborted: fenced, fatal, or its outcome unknown).
    Transaction(E),
    /// Exactly-once: the Kafka transaction was aborted because of `error` (a record's or the
    /// progress record's, with its topic when known, or the commit's); it held `records`
    /// records. `abort_error`: the abort failed too.
    Aborted {
        error: E,
        topic: Option<Arc<str>>,
        records: usize,
        abort_error: Option<E>,
    },
}

/// A counter change for the driver to apply to its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// A transaction began.
    TransactionReceived,
    /// This many transactions were confirmed.
    TransactionsConfirmed(u64),
    /// A record was reported durable.
    RecordDurable { bytes: u32, commit_unix_micros: i64 },
    /// A record was reported failed.
    DeliveryFailed,
    /// The router rejected an event.
    RoutingError(RouteErrorKind),
    /// An event was skipped by `on_error = "skip"`.
    RowSkipped,
    /// An event was sent to the dead-letter topic.
    RowDeadLettered,
    /// A record's trace context (`outbox.tracing_column`) was malformed: it goes without the
    /// bad header ([`ferry_router::TraceOutcome::Malformed`]).
    TraceContextMalformed(TraceProblem),
    /// A progress record holding this LSN is in Kafka, and the slot may follow it
    /// (at-least-once: acknowledged; exactly-once: committed and confirmed).
    ProgressRecorded(Lsn),
    /// A progress record failed (at-least-once; retried).
    ProgressFailed,
}

/// What came of an outbox row ([`Relay::table_rows`] counts them per table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOutcome {
    /// A record was produced for it.
    Routed,
    /// Sent to the dead-letter topic.
    DeadLettered,
    /// Left out by `on_error = "skip"`.
    Skipped,
    /// Rejected under `on_error = "fail"` (or a column is missing): the session stops.
    Failed,
}

impl RowOutcome {
    /// Every outcome, in the order of [`Relay::table_rows`]' counts.
    pub const ALL: [RowOutcome; 4] = [
        RowOutcome::Routed,
        RowOutcome::DeadLettered,
        RowOutcome::Skipped,
        RowOutcome::Failed,
    ];

    fn of(routed: &Routed) -> Self {
        match routed {
            Routed::Produce {
                dead_letter: false, ..
            } => RowOutcome::Routed,
            Routed::Produce {
                dead_letter: true, ..
            } => RowOutcome::DeadLettered,
            Routed::Skip => RowOutcome::Skipped,
            Routed::Fail(_) => RowOutcome::Failed,
        }
    }
}

/// What the driver must do, in order.
#[derive(Debug)]
pub enum Action<E> {
    /// Hand `record` to the sink with `token`; if it is refused, tell [`Relay::handle_refused`].
    Produce {
        token: DeliveryKey,
        record: Box<Record>,
    },
    /// A WAL transaction ended at `end_lsn` (nothing to do with it today; tests read it).
    CommitPoint { end_lsn: Lsn },
    /// Exactly-once: every event up to here is handed to the sink (or skipped by policy); a
    /// Kafka transaction may end here with this position ([`crate::Sink::position`]).
    Position(Position),
    /// A record failed: [`crate::Sink::abandon`].
    Abandon,
    /// Report `lsn` as flushed to the server (and as the confirmed-LSN metric).
    Confirm(Lsn),
    /// Apply a counter change.
    Count(Count),
    /// The session is over. Boxed, once a session, so that the other actions (one or more a
    /// record) stay small to move.
    Stop(Box<Result<End, CoreError<E>>>),
}

/// Where the relay is in the WAL, exactly: what a progress record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// End LSN of the last whole transaction handled.
    pub end_lsn: Lsn,
    /// A transaction after it partly handled: its commit LSN and how many events of it.
    pub partial: Option<Partial>,
    /// Every event after this position was committed at or after about this time (Unix
    /// microseconds): the commit time of the transaction at the position, or when the server
    /// reported its WAL end there. `ferry replay --since` starts from it when events after the
    /// position may be missing. `None` when unknown.
    pub since_unix_micros: Option<i64>,
}

/// The transaction whose events are streaming through.
#[derive(Debug, Clone, Copy)]
struct Current {
    commit_lsn: Lsn,
    commit_unix_micros: i64,
    /// Outbox events of it seen so far (covered ones included).
    events: u64,
}

/// A drain in progress: no more WAL; the session ends when nothing is in flight.
#[derive(Debug, Clone, Copy)]
struct Drain {
    deadline: Option<Instant>,
    by_shutdown: bool,
}

/// The relay core; see the [module documentation](self).
#[derive(Debug)]
pub struct Relay<E> {
    config: RelayConfig,
    /// Sessions started; entries of the in-flight table remember theirs.
    session: u64,
    wm: Watermark,
    in_flight: InFlight,
    window: Window,
    current: Option<Current>,
    binary: Option<BinaryGuard>,
    failure: Option<CoreError<E>>,
    drain: Option<Drain>,
    stopped: bool,
    actions: VecDeque<Action<E>>,
    /// Exactly-once: what the remembered progress record covers (skipped).
    remembered: Option<ProgressRecord>,
    /// Exactly-once: the end LSN a committed progress record holds; confirms stop there.
    committed_end: Lsn,
    /// The last LSN confirmed ([`Action::Confirm`]) in this session.
    sent_confirm: Lsn,
    /// End LSN of the last whole transaction seen.
    whole_end: Lsn,
    /// Rows routed per outbox table and [`RowOutcome`] (in [`RowOutcome::ALL`]'s order), since
    /// the relay was made: read by the driver ([`Relay::table_rows`]) rather than sent as an
    /// action per row, which cost 5% of the core's time per row.
    table_rows: Vec<[u64; 4]>,
    /// Per outbox table, where its router's slot columns are in the table's relation.
    places: Vec<route::Places>,
    /// The one-shot pass (`--skip-event` / `--dead-letter-event`) while it is armed.
    pass: Option<Pass>,
    /// Transactions seen whole and not yet confirmed: their end LSN and commit time.
    commit_times: VecDeque<(Lsn, i64)>,
    /// `route.position_headers`: adds the source and position headers to every record.
    stamp: Option<Stamp>,
    /// The commit time of the newest transaction seen whole.
    last_commit_micros: Option<i64>,
    /// An idle keepalive moved the watermark to this WAL end, with the time later commits are
    /// at or after.
    idle_at: Option<(Lsn, i64)>,
    /// Every transaction after the confirmed LSN committed at or after about this time.
    confirmed_since_micros: Option<i64>,
    /// The newest keepalive's WAL end (with its time) that came between transactions while
    /// records were in flight: confirmed once they all are. The server sends a keepalive when
    /// its WAL passes what Ferry said it received, and no other until its WAL moves again, so
    /// on an idle server no later one would come to confirm it.
    owed_idle: Option<(Lsn, Option<i64>)>,
}

impl<E> Relay<E> {
    pub fn new(config: RelayConfig) -> Self {
        let window = Window::new(config.max_in_flight_records, config.max_in_flight_bytes);
        let tables = config.routers.len();
        let stamp = config.routers.position_headers().then(Stamp::new);
        Relay {
            config,
            session: 0,
            wm: Watermark::new(Lsn(0)),
            in_flight: InFlight::default(),
            window,
            current: None,
            binary: None,
            failure: None,
            drain: None,
            stopped: true,
            actions: VecDeque::new(),
            remembered: None,
            committed_end: Lsn(0),
            sent_confirm: Lsn(0),
            whole_end: Lsn(0),
            table_rows: vec![[0; 4]; tables],
            places: (0..tables).map(|_| route::Places::default()).collect(),
            pass: None,
            commit_times: VecDeque::new(),
            stamp,
            last_commit_micros: None,
            idle_at: None,
            confirmed_since_micros: None,
            owed_idle: None,
        }
    }

    /// Every transaction after the confirmed LSN ([`Action::Confirm`]) was committed at or after
    /// about this time (Unix microseconds): the commit time of the confirmed transaction, or when
    /// an idle keepalive reported the WAL end it confirmed. A progress record keeps it, so that
    /// the refusal of a gap can say from when to replay. `None` until known.
    pub fn confirmed_since_micros(&self) -> Option<i64> {
        self.confirmed_since_micros
    }

    /// Arms a one-shot pass for a poison event ([`crate::pass`]); checked against the resume
    /// position at the next [`Relay::start`].
    pub fn set_pass(&mut self, pass: Option<Pass>) {
        self.pass = pass;
    }

    /// The one-shot pass while it is armed (a relay made for the next session takes it over).
    pub fn pass(&self) -> Option<Pass> {
        self.pass
    }

    /// Rows routed per outbox table, by [`RowOutcome`] (in [`RowOutcome::ALL`]'s order), since
    /// the relay was made.
    pub fn table_rows(&self) -> &[[u64; 4]] {
        &self.table_rows
    }

    /// With `route.position_headers`: the source the next session's records come from
    /// ([`crate::source_position::source_id`] of the replication connection's
    /// `IDENTIFY_SYSTEM` and the slot), the value of their `ferry-source` header. Set before
    /// every [`Relay::start`]: a reconnect to a promoted standby changes the timeline. Without
    /// the setting it does nothing.
    pub fn set_source(&mut self, source: &str) {
        if let Some(stamp) = self.stamp.as_mut() {
            stamp.set_source(source);
        }
    }

    /// Starts a session streaming from `resume` (the slot's `confirmed_flush_lsn`, from which
    /// the server replays). `binary`: the session streams pgoutput's binary mode, so every new
    /// layout of an outbox table is checked for columns its router reads only as text. Records
    /// of earlier sessions still in flight stay in the table (and the window) until their
    /// reports arrive; they confirm nothing any more.
    pub fn start(&mut self, resume: Lsn, binary: bool) {
        self.start_from(resume, binary, None);
    }

    /// [`Relay::start`] for exactly-once mode: `remembered` is the newest committed progress
    /// record (`None` on a first start); every event it covers is skipped, and nothing is
    /// confirmed past its end LSN until the sink says a newer one committed.
    pub fn start_from(&mut self, resume: Lsn, binary: bool, remembered: Option<ProgressRecord>) {
        self.committed_end = remembered
            .as_ref()
            .map_or(resume, |r| r.end_lsn.max(resume));
        if let Some(pass) = self.pass {
            if pass.behind(resume, remembered.as_ref()) {
                self.pass = None;
                if !pass.met {
                    tracing::warn!(position = %pass.at, slot_lsn = %resume,
                        "{pass} names an event the slot has already passed: it does nothing (remove the flag)");
                }
            }
        }
        debug_assert!(
            self.stamp.as_ref().is_none_or(Stamp::has_source),
            "route.position_headers: Relay::set_source must be called before a session starts"
        );
        self.remembered = remembered;
        self.sent_confirm = resume;
        self.whole_end = self.committed_end;
        self.session += 1;
        self.wm = Watermark::new(resume);
        self.window.unpause();
        self.current = None;
        // The server replays from `resume`: what the last session saw whole is seen again.
        self.commit_times.clear();
        self.idle_at = None;
        self.owed_idle = None;
        self.binary = binary.then(|| BinaryGuard::new(&self.config.routers));
        self.failure = None;
        self.drain = None;
        self.stopped = false;
        self.actions.clear();
    }

    /// The next action, if any. Drain this after every input.
    pub fn poll_action(&mut self) -> Option<Action<E>> {
        self.actions.pop_front()
    }

    /// When [`Relay::handle_timeout`] must be called next (a drain's deadline), if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.stopped {
            return None;
        }
        self.drain.and_then(|d| d.deadline)
    }

    /// Whether the driver may feed more WAL: the session runs, nothing failed, no drain began,
    /// and the in-flight window has room (with its hysteresis).
    pub fn wants_events(&mut self) -> bool {
        !self.stopped
            && self.failure.is_none()
            && self.drain.is_none()
            && self
                .window
                .open(self.in_flight.records(), self.in_flight.bytes())
    }

    /// Whether the session has stopped ([`Action::Stop`] was queued).
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// The LSN confirmed so far in this session (the watermark's; for logs and tests).
    pub fn confirmed(&self) -> Lsn {
        self.wm.confirmed()
    }

    /// Records and bytes in flight (all sessions).
    pub fn in_flight(&self) -> (u64, u64) {
        (self.in_flight.records(), self.in_flight.bytes())
    }

    /// The oldest record in flight (all sessions): when it was handed to the sink, and its
    /// transaction's commit time; `None` when nothing is in flight.
    pub fn oldest_in_flight(&mut self) -> Option<crate::inflight::Oldest> {
        self.in_flight.oldest()
    }

    /// The topic of the record in flight under `token`, if any (for errors).
    pub fn topic_of(&self, token: DeliveryKey) -> Option<Arc<str>> {
        self.in_flight.get(token).map(|e| e.topic.clone())
    }

    /// How long a graceful shutdown waits for in-flight reports.
    pub fn drain_timeout(&self) -> Duration {
        self.config.drain_timeout
    }

    /// Whether a drain is under way.
    pub fn is_draining(&self) -> bool {
        self.drain.is_some()
    }

    /// A transaction boundary, an outbox row or an outbox message, in WAL order.
    pub fn handle_outbox(&mut self, event: OutboxEvent, now: Instant) {
        if self.stopped || self.failure.is_some() {
            return;
        }
        let open = self.wm.open_transactions();
        match event {
            OutboxEvent::Begin(b) => {
                if let Err(e) = self.wm.begin(b.commit_lsn) {
                    return self.bookkeeping(e);
                }
                self.current = Some(Current {
                    commit_lsn: b.commit_lsn,
                    commit_unix_micros: b.commit_time.to_unix_micros().unwrap_or(0),
                    events: 0,
                });
                self.count(Count::TransactionReceived);
                self.pass_moved(Moved::Begin(b.commit_lsn));
            }
            OutboxEvent::Row(row) => {
                let Some(cur) = self.next_event() else {
                    return self.bookkeeping(WatermarkError::NoOpenTransaction { op: "row" });
                };
                if self.covered(cur) {
                    return;
                }
                if let Some(guard) = self.binary.as_mut() {
                    if let Some((column, type_oid)) = guard.check(row.table, &row.relation) {
                        let table = row.table;
                        let e = CoreError::TextNeeded {
                            column,
                            type_oid,
                            table,
                        };
                        return self.fail(e, now);
                    }
                }
                let Some(router) = self.config.routers.get(row.table) else {
                    return self.bookkeeping(WatermarkError::UnknownTable { table: row.table });
                };
                let wal = match self.places.get_mut(row.table) {
                    Some(places) => route::WalRow::placed(&row, places.of(&row.relation, router)),
                    None => route::WalRow::by_name(&row),
                };
                let mut routed = route::row(router, &wal, cur.commit_unix_micros);
                if let Some(action) = pass_meets(&mut self.pass, cur, row.lsn, &routed.0) {
                    routed.0 = route::pass(routed.0, action, |e| {
                        router.dead_letter(&wal, e, cur.commit_unix_micros)
                    });
                }
                self.table_rows[row.table][RowOutcome::of(&routed.0) as usize] += 1;
                self.routed(cur, routed, row.lsn, Some(row.table), now);
                self.position_inside(cur);
            }
            OutboxEvent::Message(m) => {
                let Some(cur) = self.next_event() else {
                    return self.bookkeeping(WatermarkError::NoOpenTransaction { op: "message" });
                };
                if self.covered(cur) {
                    return;
                }
                let router = self.config.routers.primary();
                let mut routed = route::message(router, &m.content, cur.commit_unix_micros);
                if let Some(action) = pass_meets(&mut self.pass, cur, m.lsn, &routed.0) {
                    routed.0 = route::pass(routed.0, action, |e| {
                        router.dead_letter_message(&m.content, e, cur.commit_unix_micros)
                    });
                }
                self.routed(cur, routed, m.lsn, None, now);
                self.position_inside(cur);
            }
            OutboxEvent::Commit(c) => {
                if let Err(e) = self.wm.commit(c.end_lsn) {
                    return self.bookkeeping(e);
                }
                let committed = self.current.take().map(|cur| cur.commit_unix_micros);
                if let Some(t) = committed.filter(|t| *t > 0) {
                    self.commit_times.push_back((c.end_lsn, t));
                    self.last_commit_micros = Some(t);
                }
                self.pass_moved(Moved::Commit(c.commit_lsn));
                self.whole_end = self.whole_end.max(c.end_lsn);
                self.actions
                    .push_back(Action::CommitPoint { end_lsn: c.end_lsn });
                self.position(Position {
                    end_lsn: c.end_lsn,
                    partial: None,
                    since_unix_micros: self.last_commit_micros,
                });
            }
        }
        self.confirm_advanced(open);
    }

    /// The server's WAL end from an idle keepalive: confirmed if nothing is pending.
    pub fn handle_keepalive(&mut self, wal_end: Lsn) {
        self.handle_keepalive_at(wal_end, None);
    }

    /// [`Relay::handle_keepalive`], with a time every transaction committed past `wal_end` is at
    /// or after (Unix microseconds; the server's clock read at a WAL position at or before
    /// `wal_end`): the bound an idle confirmation carries ([`Relay::confirmed_since_micros`]).
    /// Without one, the last confirmed transaction's commit time stays the bound.
    ///
    /// Between transactions with records still in flight, the WAL end is owed: it is confirmed
    /// once they all are (every transaction that committed before it had been sent).
    pub fn handle_keepalive_at(&mut self, wal_end: Lsn, unix_micros: Option<i64>) {
        // After a failure, events are ignored (the session drains and stops): so is a WAL end
        // past them.
        if self.stopped || self.failure.is_some() {
            return;
        }
        if self.current.is_none() {
            self.pass_moved(Moved::Idle(wal_end));
            if self.wm.open_transactions() > 0
                && self.owed_idle.is_none_or(|(owed, _)| wal_end > owed)
            {
                self.owed_idle = Some((wal_end, unix_micros));
            }
        }
        self.idle_end(wal_end, unix_micros);
    }

    /// Confirms an idle WAL end if nothing is pending ([`Relay::handle_keepalive_at`]).
    fn idle_end(&mut self, wal_end: Lsn, unix_micros: Option<i64>) {
        let (before, open) = (self.wm.confirmed(), self.wm.open_transactions());
        self.wm.idle_advance(wal_end);
        if self.wm.confirmed() > before {
            if let Some(t) = unix_micros {
                self.idle_at = Some((self.wm.confirmed(), t));
            }
        }
        if self.config.exactly_once && self.current.is_none() && self.wm.confirmed() > before {
            // Idle: the session machine may commit a progress record at the WAL end, so that an idle
            // outbox does not pin WAL in exactly-once mode either.
            self.whole_end = self.whole_end.max(self.wm.confirmed());
            let since = self
                .idle_at
                .filter(|(at, _)| *at == self.whole_end)
                .map(|(_, t)| t)
                .or(self.last_commit_micros);
            self.position(Position {
                end_lsn: self.whole_end,
                partial: None,
                since_unix_micros: since,
            });
        }
        self.confirm_advanced(open);
    }

    /// Exactly-once: a progress record holding `end_lsn` is committed in Kafka; the slot may be
    /// confirmed up to it (and no further than the watermark). Also after the relay stopped: a
    /// session's last commit comes after its drain (what it holds is in Kafka either way).
    pub fn progress_committed(&mut self, end_lsn: Lsn) {
        if end_lsn > self.committed_end {
            self.committed_end = end_lsn;
            let open = self.wm.open_transactions();
            self.confirm_advanced(open);
        }
    }

    /// A delivery report for `token`.
    pub fn handle_report(&mut self, token: DeliveryKey, result: Result<(), E>, now: Instant) {
        let Some(entry) = self.in_flight.remove(token) else {
            if !self.stopped {
                self.stop(Err(CoreError::UnknownReport { token }));
            }
            return;
        };
        if entry.session != self.session || self.stopped {
            // A record of an ended session: it confirms nothing now, and its transaction is
            // replayed by a later session. Its report only frees its place in the window.
            return self.check_drained(now);
        }
        let open = self.wm.open_transactions();
        match result {
            Ok(()) => {
                if let Err(e) = self.wm.delivered(entry.mark) {
                    return self.bookkeeping(e);
                }
                self.count(Count::RecordDurable {
                    bytes: entry.mark.bytes(),
                    commit_unix_micros: entry.commit_unix_micros,
                });
                self.confirm_advanced(open);
                self.check_drained(now);
            }
            Err(error) => {
                if let Err(e) = self.wm.failed(entry.mark, "delivery failed") {
                    return self.bookkeeping(e);
                }
                self.count(Count::DeliveryFailed);
                if self.failure.is_none() {
                    tracing::error!(topic = %entry.topic, "delivery failed; the confirmed LSN stops before this record");
                    // Nothing accepted behind the failed record may land before its replay.
                    self.actions.push_back(Action::Abandon);
                }
                self.confirm_advanced(open);
                self.fail(
                    CoreError::Delivery {
                        topic: entry.topic,
                        error,
                    },
                    now,
                );
            }
        }
    }

    /// The sink refused the record of `token` (it was never accepted; no report will come).
    pub fn handle_refused(&mut self, token: DeliveryKey, error: E, now: Instant) {
        let Some(entry) = self.in_flight.remove(token) else {
            return self.stop(Err(CoreError::UnknownReport { token }));
        };
        if let Err(e) = self.wm.failed(entry.mark, "the sink refused the record") {
            return self.bookkeeping(e);
        }
        self.fail(
            CoreError::Delivery {
                topic: entry.topic,
                error,
            },
            now,
        );
    }

    /// The sink failed outside a record (e.g. at a commit point).
    pub fn handle_sink_error(&mut self, error: E, now: Instant) {
        self.actions.push_back(Action::Abandon);
        self.fail(CoreError::Sink(error), now);
    }

    /// The reader ended (cleanly or not; the driver has its outcome): drain, then stop.
    pub fn reader_ended(&mut self, now: Instant) {
        if self.drain.is_none() {
            self.drain = Some(Drain {
                deadline: self.session_deadline(now),
                by_shutdown: false,
            });
        }
        self.check_drained(now);
    }

    /// Shutdown was requested: stop reading, drain within the drain timeout, then stop.
    pub fn shutdown(&mut self, now: Instant) {
        if self.stopped || self.drain.is_some_and(|d| d.by_shutdown) {
            return;
        }
        tracing::info!(
            in_flight = self.in_flight.records(),
            "shutting down: draining in-flight records"
        );
        self.drain = Some(Drain {
            deadline: now.checked_add(self.config.drain_timeout),
            by_shutdown: true,
        });
        self.check_drained(now);
    }

    /// Time passed: a drain whose deadline is reached stops the session.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.check_drained(now);
    }

    fn routed(
        &mut self,
        cur: Current,
        (routed, kind): (Routed, Option<RouteErrorKind>),
        lsn: Lsn,
        table: Option<usize>,
        now: Instant,
    ) {
        if let Some(kind) = kind {
            self.count(Count::RoutingError(kind));
        }
        match routed {
            Routed::Produce {
                mut record,
                dead_letter,
            } => {
                if let Some(stamp) = self.stamp.as_mut() {
                    stamp.stamp(&mut record.headers, source_position(cur));
                }
                if dead_letter {
                    self.count(Count::RowDeadLettered);
                }
                if let TraceOutcome::Malformed(problem) = record.trace_context {
                    self.count(Count::TraceContextMalformed(problem));
                }
                self.produce(cur, record, now);
            }
            Routed::Skip => self.count(Count::RowSkipped),
            Routed::Fail(error) => self.fail(
                CoreError::Route {
                    error,
                    commit_lsn: cur.commit_lsn,
                    event: cur.events,
                    lsn,
                    table,
                    pass: self.pass,
                },
                now,
            ),
        }
    }

    fn produce(&mut self, cur: Current, record: Box<Record>, now: Instant) {
        let mark = match self.wm.add_record(record.size_bytes()) {
            Ok(mark) => mark,
            Err(e) => return self.bookkeeping(e),
        };
        let token = self.in_flight.insert(Entry {
            mark,
            session: self.session,
            commit_unix_micros: cur.commit_unix_micros,
            topic: record.topic.clone(),
            handed_at: now,
        });
        self.actions.push_back(Action::Produce { token, record });
    }

    fn count(&mut self, c: Count) {
        self.actions.push_back(Action::Count(c));
    }

    /// After the watermark may have moved: confirm what advanced, count what was confirmed.
    fn confirm_advanced(&mut self, open_before: usize) {
        let open = self.wm.open_transactions();
        // Begin adds one; only confirming removes any.
        if open < open_before {
            self.count(Count::TransactionsConfirmed((open_before - open) as u64));
        }
        let mut confirmed = self.wm.confirmed();
        if self.config.exactly_once {
            confirmed = confirmed.min(self.committed_end);
        }
        if confirmed > self.sent_confirm {
            self.sent_confirm = confirmed;
            // Later transactions committed after the newest one confirmed (less the skew of
            // concurrent commits, which the reader of the bound allows for), or after the
            // keepalive that reported the WAL end confirmed.
            while let Some(&(end, t)) = self.commit_times.front() {
                if end > confirmed {
                    break;
                }
                self.commit_times.pop_front();
                self.confirmed_since_micros = Some(t);
            }
            if let Some((at, t)) = self.idle_at {
                if at <= confirmed {
                    self.confirmed_since_micros =
                        Some(self.confirmed_since_micros.map_or(t, |s| s.max(t)));
                    self.idle_at = None;
                }
            }
            self.actions.push_back(Action::Confirm(confirmed));
            self.pass_moved(Moved::Confirmed(confirmed));
        }
        if open == 0 && self.current.is_none() && self.failure.is_none() {
            if let Some((wal_end, t)) = self.owed_idle.take() {
                self.idle_end(wal_end, t);
            }
        }
    }

    /// The stream moved: the one-shot pass may be used up, or passed without meeting its event.
    fn pass_moved(&mut self, moved: Moved) {
        let Some(pass) = self.pass else { return };
        match pass.after(moved) {
            Fate::Armed => {}
            Fate::Used => {
                self.pass = None;
                tracing::info!(position = %pass.at, "{pass}: its transaction is confirmed; the flag is used up");
            }
            Fate::Unmet => {
                self.pass = None;
                tracing::warn!(position = %pass.at,
                    "{pass}: the stream passed this position without meeting an event there that stops \
                     Ferry: nothing was skipped or dead-lettered (check the position the error printed)");
            }
        }
    }

    /// The current transaction, with the event about to be handled counted.
    fn next_event(&mut self) -> Option<Current> {
        let cur = self.current.as_mut()?;
        cur.events += 1;
        Some(*cur)
    }

    /// Whether the event just counted in `cur` is covered by the remembered progress record.
    fn covered(&self, cur: Current) -> bool {
        self.remembered
            .as_ref()
            .is_some_and(|r| r.covers(cur.commit_lsn, cur.events - 1))
    }

    /// Exactly-once: the position after an event of `cur` was handled.
    fn position_inside(&mut self, cur: Current) {
        self.position(Position {
            end_lsn: self.whole_end,
            partial: Some(Partial {
                commit_lsn: cur.commit_lsn,
                events: cur.events,
            }),
            since_unix_micros: (cur.commit_unix_micros > 0).then_some(cur.commit_unix_micros),
        });
    }

    /// Exactly-once: hands `p` to the sink, unless the session failed or the remembered
    /// record is already at or past it (a replayed, covered transaction's end must never be
    /// committed as progress: it would move the remembered position back).
    fn position(&mut self, p: Position) {
        if !self.config.exactly_once || self.failure.is_some() || self.stopped {
            return;
        }
        let beyond = match (&self.remembered, p.partial) {
            (None, _) => true,
            // Past the remembered end, and past the transaction it is inside of, if any.
            (Some(r), None) => {
                p.end_lsn > r.end_lsn && r.partial.is_none_or(|x| x.commit_lsn < p.end_lsn)
            }
            (Some(r), Some(x)) => !r.covers(x.commit_lsn, x.events.saturating_sub(1)),
        };
        if beyond {
            self.actions.push_back(Action::Position(p));
        }
    }

    /// A failure: remembered (the first one wins), and the session drains.
    fn fail(&mut self, error: CoreError<E>, now: Instant) {
        if self.failure.is_none() {
            self.failure = Some(error);
        }
        if self.drain.is_none() {
            self.drain = Some(Drain {
                deadline: self.session_deadline(now),
                by_shutdown: false,
            });
        }
        self.check_drained(now);
    }

    fn bookkeeping(&mut self, e: WatermarkError) {
        self.stop(Err(CoreError::Bookkeeping(e)));
    }

    fn check_drained(&mut self, now: Instant) {
        let Some(drain) = self.drain else { return };
        if self.stopped {
            return;
        }
        let records = self.in_flight.records();
        let end = if records == 0 {
            if drain.by_shutdown {
                End::Shutdown
            } else {
                End::ReaderEnded
            }
        } else if drain.deadline.is_some_and(|d| now >= d) {
            let e = self
                .failure
                .take()
                .unwrap_or(CoreError::DrainTimeout { records });
            return self.stop(Err(e));
        } else {
            return;
        };
        match self.failure.take() {
            Some(e) => self.stop(Err(e)),
            None => self.stop(Ok(end)),
        }
    }

    fn stop(&mut self, result: Result<End, CoreError<E>>) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        self.actions.push_back(Action::Stop(Box::new(result)));
    }

    fn session_deadline(&self, now: Instant) -> Option<Instant> {
        self.config
            .session_drain_timeout
            .and_then(|t| now.checked_add(t))
    }
}

/// Where the event just counted in `cur` sits ([`crate::source_position`]): its transaction's
/// commit LSN and its index among the transaction's outbox events, from 0, every event counted
/// whatever became of it (the count exactly-once positions keep). An index past `u32::MAX`
/// (four billion outbox events in one transaction) stays there.
fn source_position(cur: Current) -> SourcePosition {
    SourcePosition {
        commit_lsn: cur.commit_lsn,
        index: u32::try_from(cur.events - 1).unwrap_or(u32::MAX),
    }
}

/// The one-shot pass's decision for the event just routed (`routed`), counted in `cur`;
/// `lsn` is the event's own LSN, for the log.
fn pass_meets(
    slot: &mut Option<Pass>,
    cur: Current,
    lsn: Lsn,
    routed: &Routed,
) -> Option<PassAction> {
    let pass = slot.as_mut()?;
    let at = EventPosition {
        commit_lsn: cur.commit_lsn,
        event: cur.events,
    };
    match pass.meet(at, matches!(routed, Routed::Fail(_))) {
        Meeting::Other => None,
        Meeting::Apply(action) => {
            let Routed::Fail(e) = routed else { return None };
            tracing::warn!(position = %at, lsn = %lsn, error = %e,
            "{}: passing this one event that cannot be routed, as the flag asks ({})",
            action.flag(),
            match action {
                PassAction::Skip => "skipped, counted in ferry_rows_skipped_total",
                PassAction::DeadLetter => "sent to the dead-letter topic, counted in ferry_rows_dead_lettered_total",
            });
            Some(action)
        }
        Meeting::NotStopping => {
            let flag = *pass;
            *slot = None;
            tracing::warn!(position = %at, lsn = %lsn,
                "{flag} names an event that does not stop Ferry (it routes, or route.on_error handles it): \
                 it is handled as usual, and the flag does nothing");
            None
        }
    }
}
