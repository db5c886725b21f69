//! The session machine: every decision of a streaming session, in both delivery modes, as one
//! state machine with no I/O and no clock.
//!
//! It composes three parts and relays between them itself, so the driver never does:
//!
//! - the relay core ([`crate::relay`]): what to produce, what Kafka holds (the watermark), when
//!   to read, when to stop;
//! - at-least-once, [`remember`]: when a progress record is written, and how far the slot may
//!   move once Kafka acknowledged it;
//! - exactly-once, [`transaction`]: when a Kafka transaction begins, commits or aborts, and which
//!   delivery reports are held until then.
//!
//! Inputs: the session's start ([`Session::start_at_least_once`], [`Session::start_exactly_once`]),
//! reader events ([`Session::handle_outbox`], [`Session::handle_keepalive_at`],
//! [`Session::reader_ended`]), delivery reports of outbox records *and of its own progress
//! records* ([`Session::handle_report`], [`Session::handle_refused`]), the outcome of each
//! transaction call it asked for ([`Session::handle_begun`], [`Session::handle_commit`],
//! [`Session::handle_aborted`]), the time ([`Session::handle_timeout`]) and a shutdown request.
//! Outputs: [`Action`]s, which the driver carries out in order without deciding anything, the
//! deadline to wake up at ([`Session::poll_timeout`]) and whether to read WAL
//! ([`Session::wants_events`]).
//!
//! Progress records travel under [`PROGRESS_DELIVERY_KEY`], a token the in-flight table never hands
//! out; the machine tells their reports from its records' by it. The driver passes every report
//! on unchanged.
//!
//! What is confirmed when, in both modes, is the crate's essay ([`crate`]).

pub mod remember;
pub mod transaction;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_pgtypes::Lsn;
use ferry_router::Record;
use ferry_wal::assembly::OutboxEvent;

use crate::inflight::DeliveryKey;
use crate::pass::Pass;
use crate::progress_record::ProgressRecord;
use crate::relay::{self, CoreError, Count, End, Position, Relay, RelayConfig};
use remember::Remember;
pub use transaction::TransactionLimits;
use transaction::{Poison, Stage, Transaction};

/// The token progress records travel under: the in-flight table's tokens are slab indices from
/// 0 up to the window, so this one is never one of them.
pub const PROGRESS_DELIVERY_KEY: DeliveryKey = DeliveryKey(usize::MAX);

/// Longest an at-least-once session that ended with an error waits for its last progress record
/// (a shutdown waits up to its drain timeout).
pub const LAST_RECORD_AFTER_ERROR: Duration = Duration::from_secs(5);

/// Least time between two WARN lines about failing progress records.
pub const PROGRESS_WARN_INTERVAL: Duration = Duration::from_secs(30);

/// What the machine needs to know of the sink's errors. A driver whose error type is foreign to
/// it (the orphan rule) gives the same two answers to [`Session::with_errors`] instead.
pub trait SinkError: Clone + std::fmt::Display {
    /// Whether writing again may succeed (a broker away), rather than never (not authorized,
    /// an invalid topic).
    fn is_transient(&self) -> bool;
    /// The error the records of a transaction abandoned by the core fail with.
    fn abandoned() -> Self;
}

/// What the machine needs to know, fixed for its life.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// The relay core's (its `exactly_once` says which mode).
    pub relay: RelayConfig,
    /// Exactly-once: what bounds a Kafka transaction (`None` in at-least-once mode).
    pub transactions: Option<TransactionLimits>,
    /// The progress topic, named when one of its records fails.
    pub progress_topic: Arc<str>,
}

/// What the driver carries out, in order.
#[derive(Debug)]
pub enum Action<E> {
    /// Hand `record` to the sink (in exactly-once mode, into the open transaction); its report
    /// carries `token`. A refusal goes to [`Session::handle_refused`].
    Produce {
        token: DeliveryKey,
        record: Box<Record>,
    },
    /// Write the progress record holding `position` (at-least-once: on its own; exactly-once:
    /// into the open transaction, after its records); its report carries `token`. A refusal
    /// goes to [`Session::handle_refused`].
    ProduceProgress {
        token: DeliveryKey,
        position: Position,
    },
    /// Begin a Kafka transaction; the outcome goes to [`Session::handle_begun`].
    BeginTransaction,
    /// Commit the open Kafka transaction (its progress record holds `position`; it carries
    /// `records` outbox records); the outcome goes to [`Session::handle_commit`].
    CommitTransaction { position: Position, records: usize },
    /// Abort the open Kafka transaction (`records` outbox records in it). `at_end`: the session
    /// is over and only a fenced producer matters (the next session's `init_transactions`
    /// aborts what this one could not); otherwise the outcome goes to
    /// [`Session::handle_aborted`].
    AbortTransaction { records: usize, at_end: bool },
    /// At-least-once: a record failed; nothing accepted after it may land before its replay.
    Abandon,
    /// Report `lsn` as flushed to the server: the slot may move there.
    Confirm(Lsn),
    /// Apply a counter change.
    Count(Count),
    /// The session is over. Boxed, once a session, so that the other actions (one or more a
    /// record) stay small to move.
    Stop(Box<Result<End, CoreError<E>>>),
}

/// How a commit the machine asked for ended.
#[derive(Debug)]
pub enum CommitOutcome<E> {
    Committed,
    /// It failed, and the transaction can be aborted (the session then ends).
    Abortable(E),
    /// It failed otherwise (fenced, fatal, or an outcome not known): the session ends at once.
    Failed(E),
}

/// At-least-once: a session that stopped, waiting for its last progress record.
#[derive(Debug)]
struct Finishing<E> {
    result: Result<End, CoreError<E>>,
    deadline: Instant,
    graceful: bool,
}

/// The mode's own part.
#[derive(Debug)]
enum Mode<E> {
    AtLeastOnce {
        remember: Remember,
        /// The last LSN the core confirmed, with its bound on when later transactions committed
        /// ([`Relay::confirmed_since_micros`]).
        confirmed_since: (Lsn, Option<i64>),
        finishing: Option<Finishing<E>>,
        /// When failing progress records were last logged.
        warned: Option<Instant>,
    },
    ExactlyOnce(Transaction<E>),
}

/// See the [module documentation](self).
#[derive(Debug)]
pub struct Session<E> {
    relay: Relay<E>,
    mode: Mode<E>,
    progress_topic: Arc<str>,
    actions: VecDeque<Action<E>>,
    stopped: bool,
    errors: SinkErrors<E>,
}

/// [`SinkError`]'s two answers, for an error type that cannot implement it.
#[derive(Debug, Clone, Copy)]
pub struct SinkErrors<E> {
    pub is_transient: fn(&E) -> bool,
    pub abandoned: fn() -> E,
}

impl<E: SinkError> Session<E> {
    pub fn new(config: SessionConfig) -> Self {
        Session::with_errors(
            config,
            SinkErrors {
                is_transient: E::is_transient,
                abandoned: E::abandoned,
            },
        )
    }
}

impl<E: Clone + std::fmt::Display> Session<E> {
    /// [`Session::new`], with what the machine needs to know of the sink's errors.
    pub fn with_errors(config: SessionConfig, errors: SinkErrors<E>) -> Self {
        let mode = match config.transactions {
            Some(limits) => Mode::ExactlyOnce(Transaction::new(limits)),
            None => Mode::AtLeastOnce {
                remember: Remember::default(),
                confirmed_since: (Lsn(0), None),
                finishing: None,
                warned: None,
            },
        };
        Session {
            relay: Relay::new(config.relay),
            mode,
            progress_topic: config.progress_topic,
            actions: VecDeque::new(),
            stopped: true,
            errors,
        }
    }

    /// Arms a one-shot pass for a poison event ([`crate::pass`]).
    pub fn set_pass(&mut self, pass: Option<Pass>) {
        self.relay.set_pass(pass);
    }

    /// The one-shot pass while it is armed (a machine made for the next session takes it over).
    pub fn pass(&self) -> Option<Pass> {
        self.relay.pass()
    }

    /// The relay core, for what it counts (in flight, rows per table, the confirmed LSN).
    pub fn relay(&self) -> &Relay<E> {
        &self.relay
    }

    /// The oldest record in flight ([`Relay::oldest_in_flight`]).
    pub fn oldest_in_flight(&mut self) -> Option<crate::inflight::Oldest> {
        self.relay.oldest_in_flight()
    }

    /// With `route.position_headers`: the source the next session's records come from
    /// ([`Relay::set_source`]); set before every start.
    pub fn set_source(&mut self, source: &str) {
        self.relay.set_source(source);
    }

    /// At-least-once: a session streams from `resume` (the slot's position); `remembered` is the
    /// progress record the start-time verdict compared it with, `None` if one must be written
    /// at `resume` first (it is, at once). Records of earlier sessions still in flight, and a
    /// progress record still in flight, keep their places.
    pub fn start_at_least_once(
        &mut self,
        resume: Lsn,
        binary: bool,
        remembered: Option<Lsn>,
        now: Instant,
    ) {
        self.begin_session();
        self.relay.start(resume, binary);
        if let Mode::AtLeastOnce {
            remember,
            finishing,
            ..
        } = &mut self.mode
        {
            remember.start(resume, remembered);
            *finishing = None;
        }
        self.pump(now);
    }

    /// Exactly-once: a session streams from `resume` with a new transactional producer;
    /// `remembered` is the newest committed progress record (`None` on a first start: the
    /// position `resume` is then committed at once, in a transaction of its own, so that a
    /// restart before the first event finds the slot and its record in step).
    pub fn start_exactly_once(
        &mut self,
        resume: Lsn,
        binary: bool,
        remembered: Option<ProgressRecord>,
        now: Instant,
    ) {
        self.begin_session();
        let fresh = remembered.is_none();
        self.relay.start_from(resume, binary, remembered);
        if let Mode::ExactlyOnce(txn) = &mut self.mode {
            *txn = Transaction::new(txn.limits);
            if fresh {
                let position = Position {
                    end_lsn: resume,
                    partial: None,
                    since_unix_micros: None,
                };
                txn.position = Some(position);
                self.commit(position, None);
            }
        }
        self.pump(now);
    }

    fn begin_session(&mut self) {
        self.actions.clear();
        self.stopped = false;
    }

    /// The next action, if any. Drain this after every input.
    pub fn poll_action(&mut self) -> Option<Action<E>> {
        if let Some(a) = self.actions.pop_front() {
            return Some(a);
        }
        // The progress record is handed over: the commit follows (unless its refusal came in).
        if self.stopped {
            return None;
        }
        if let Mode::ExactlyOnce(txn) = &mut self.mode {
            if let Stage::ProgressHanded(position) = txn.stage {
                txn.stage = Stage::Committing(position);
                return Some(Action::CommitTransaction {
                    position,
                    records: txn.held.len(),
                });
            }
        }
        None
    }

    /// When [`Session::handle_timeout`] must be called next, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.stopped {
            return None;
        }
        let relay = self.relay.poll_timeout();
        let own = match &self.mode {
            Mode::AtLeastOnce {
                remember,
                finishing,
                ..
            } => earliest(
                remember.poll_timeout(),
                finishing.as_ref().map(|f| f.deadline),
            ),
            Mode::ExactlyOnce(txn) if txn.stage == Stage::Idle => txn.wake_at(),
            Mode::ExactlyOnce(_) => None,
        };
        earliest(relay, own)
    }

    /// Whether the driver may feed more WAL: the relay core wants it, and in exactly-once mode
    /// no transaction is at its cap or in a commit.
    pub fn wants_events(&mut self) -> bool {
        if self.stopped {
            return false;
        }
        match &self.mode {
            Mode::AtLeastOnce { finishing, .. } if finishing.is_some() => return false,
            Mode::ExactlyOnce(txn) if txn.full() || txn.stage != Stage::Idle => return false,
            _ => {}
        }
        self.relay.wants_events()
    }

    /// Whether the session has stopped ([`Action::Stop`] was queued).
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// A transaction boundary, an outbox row or an outbox message, in WAL order.
    pub fn handle_outbox(&mut self, event: OutboxEvent, now: Instant) {
        self.relay.handle_outbox(event, now);
        self.pump(now);
    }

    /// An idle keepalive ([`Relay::handle_keepalive_at`]).
    pub fn handle_keepalive_at(&mut self, wal_end: Lsn, unix_micros: Option<i64>, now: Instant) {
        self.relay.handle_keepalive_at(wal_end, unix_micros);
        self.pump(now);
    }

    /// A delivery report: of an outbox record, or of a progress record ([`PROGRESS_DELIVERY_KEY`]).
    pub fn handle_report(&mut self, token: DeliveryKey, result: Result<(), E>, now: Instant) {
        match &mut self.mode {
            Mode::AtLeastOnce { .. } if token == PROGRESS_DELIVERY_KEY => match result {
                Ok(()) => self.progress_written(now),
                Err(e) => self.progress_failed(e, now),
            },
            Mode::AtLeastOnce { .. } => self.relay.handle_report(token, result, now),
            // Held until the transaction ends; a failure poisons it.
            Mode::ExactlyOnce(txn) => {
                if token != PROGRESS_DELIVERY_KEY {
                    txn.handed(false);
                }
                if let Err(error) = result {
                    tracing::warn!(error = %error, "a record of the open Kafka transaction failed; it will be aborted");
                    let topic = match token {
                        PROGRESS_DELIVERY_KEY => Some(self.progress_topic.clone()),
                        _ => self.relay.topic_of(token),
                    };
                    txn.poison(Poison { error, topic });
                }
            }
        }
        self.pump(now);
    }

    /// The sink refused the record of `token` (it was never accepted; no report will come).
    pub fn handle_refused(&mut self, token: DeliveryKey, error: E, now: Instant) {
        match &mut self.mode {
            Mode::AtLeastOnce { .. } if token == PROGRESS_DELIVERY_KEY => {
                self.progress_failed(error, now)
            }
            Mode::AtLeastOnce { .. } => self.relay.handle_refused(token, error, now),
            Mode::ExactlyOnce(txn) => {
                if token == PROGRESS_DELIVERY_KEY {
                    // The commit that was to follow is not asked for: the transaction aborts.
                    txn.stage = Stage::Idle;
                    let topic = Some(self.progress_topic.clone());
                    txn.poison(Poison { error, topic });
                } else {
                    // Never in the transaction: its report will not come, and nothing after
                    // its event may be committed.
                    txn.handed(false);
                    if let Some(i) = txn.held.iter().rposition(|t| *t == token) {
                        txn.held.remove(i);
                    }
                    if let Stage::ProgressHanded(_) = txn.stage {
                        // The commit was decided with this record in it (its event's position
                        // filled the transaction): the progress record queued behind it is not
                        // produced and the commit is not asked for, or the position would be
                        // committed without the record. The transaction aborts.
                        txn.stage = Stage::Idle;
                        self.actions
                            .retain(|a| !matches!(a, Action::ProduceProgress { .. }));
                    }
                    let topic = self.relay.topic_of(token);
                    txn.poison(Poison {
                        error: error.clone(),
                        topic,
                    });
                    self.relay.handle_refused(token, error, now);
                }
            }
        }
        self.pump(now);
    }

    /// The outcome of [`Action::BeginTransaction`].
    pub fn handle_begun(&mut self, result: Result<(), E>, now: Instant) {
        if let Err(e) = result {
            let mut result = Err(CoreError::Transaction(e));
            if let Mode::ExactlyOnce(txn) = &mut self.mode {
                txn.open = false;
                txn.stage = Stage::Idle;
                result = txn.finishing.take().unwrap_or(result);
            }
            self.actions.clear();
            return self.stop(result);
        }
        self.pump(now);
    }

    /// The outcome of [`Action::CommitTransaction`].
    pub fn handle_commit(&mut self, outcome: CommitOutcome<E>, now: Instant) {
        let Mode::ExactlyOnce(txn) = &mut self.mode else {
            return;
        };
        let Stage::Committing(position) = txn.stage else {
            return;
        };
        match outcome {
            CommitOutcome::Committed => {
                // The position first: the reports may end the relay core's drain, and it
                // confirms what they release only up to a committed position.
                self.relay.progress_committed(position.end_lsn);
                for token in txn.committed(position, now) {
                    self.relay.handle_report(token, Ok(()), now);
                }
                if let Some(result) = txn.finishing.take() {
                    // The session's last commit, after the relay core stopped: what it confirmed
                    // goes out before the end.
                    while let Some(action) = self.relay.poll_action() {
                        if let relay::Action::Confirm(lsn) = action {
                            self.confirm_committed(lsn);
                        }
                    }
                    return self.stop(result);
                }
            }
            CommitOutcome::Abortable(error) => {
                txn.stage = Stage::Idle;
                txn.poison(Poison { error, topic: None });
            }
            CommitOutcome::Failed(e) => {
                for token in txn.failed() {
                    self.relay.handle_report(token, Err(e.clone()), now);
                }
                self.actions.clear();
                // A session's last commit failing does not hide why it ended.
                let result = txn
                    .finishing
                    .take()
                    .unwrap_or(Err(CoreError::Transaction(e)));
                return self.stop(result);
            }
        }
        self.pump(now);
    }

    /// The outcome of [`Action::AbortTransaction`] (not at the end): the session ends with the
    /// failure that caused it.
    pub fn handle_aborted(&mut self, result: Result<(), E>, now: Instant) {
        let Mode::ExactlyOnce(txn) = &mut self.mode else {
            return;
        };
        if txn.stage != Stage::Aborting {
            return;
        }
        let why = txn.poisoned.take();
        self.aborted(why, result.err(), now);
    }

    /// The reader ended (cleanly or not; the driver has its outcome): drain, then stop.
    pub fn reader_ended(&mut self, now: Instant) {
        self.relay.reader_ended(now);
        self.pump(now);
    }

    /// Shutdown was requested: stop reading, drain within the drain timeout, then stop.
    pub fn shutdown(&mut self, now: Instant) {
        self.relay.shutdown(now);
        self.pump(now);
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.relay.handle_timeout(now);
        self.pump(now);
    }

    /// After every input: the relay core's actions, carried into the modes' parts, then what
    /// those parts decide now.
    fn pump(&mut self, now: Instant) {
        while let Some(action) = self.relay.poll_action() {
            if self.stopped {
                // Late inputs of an ended session (reports freeing the window) decide nothing.
                continue;
            }
            match action {
                relay::Action::Produce { token, record } => {
                    if let Mode::ExactlyOnce(txn) = &mut self.mode {
                        if !txn.open {
                            txn.open = true;
                            self.actions.push_back(Action::BeginTransaction);
                        }
                        txn.held.push(token);
                        txn.held_bytes += record.size_bytes() as u64;
                        txn.handed(true);
                    }
                    self.actions.push_back(Action::Produce { token, record });
                }
                relay::Action::CommitPoint { .. } => {}
                relay::Action::Position(p) => {
                    if let Mode::ExactlyOnce(txn) = &mut self.mode {
                        txn.position(p, now);
                    }
                }
                relay::Action::Abandon => match &mut self.mode {
                    Mode::AtLeastOnce { .. } => self.actions.push_back(Action::Abandon),
                    Mode::ExactlyOnce(txn) => txn.poison(Poison {
                        error: (self.errors.abandoned)(),
                        topic: None,
                    }),
                },
                relay::Action::Confirm(lsn) => match &mut self.mode {
                    Mode::AtLeastOnce {
                        remember,
                        confirmed_since,
                        ..
                    } => {
                        // Remembered first; the slot follows the acknowledged record.
                        remember.confirmed(lsn);
                        *confirmed_since = (lsn, self.relay.confirmed_since_micros());
                    }
                    Mode::ExactlyOnce(_) => self.confirm_committed(lsn),
                },
                relay::Action::Count(c) => self.actions.push_back(Action::Count(c)),
                relay::Action::Stop(result) => self.relay_stopped(*result, now),
            }
        }
        if self.stopped {
            return;
        }
        match &self.mode {
            Mode::AtLeastOnce { .. } => self.remember(now),
            Mode::ExactlyOnce(_) => self.settle(now),
        }
    }

    /// Exactly-once: the relay core confirmed `lsn`; the committed Kafka transaction held the
    /// progress record.
    fn confirm_committed(&mut self, lsn: Lsn) {
        self.actions.push_back(Action::Confirm(lsn));
        self.actions
            .push_back(Action::Count(Count::ProgressRecorded(lsn)));
    }

    /// The relay core stopped. At-least-once: the last progress record is written before the
    /// session ends (a shutdown waits up to its drain timeout for it, a session that ends for
    /// another reason briefly: its records are in Kafka, and without the record they are
    /// produced again on the next start, never lost). Exactly-once: a transaction still open is
    /// aborted (read_committed consumers need not wait for the next session's fencing).
    fn relay_stopped(&mut self, result: Result<End, CoreError<E>>, now: Instant) {
        let drain_timeout = self.relay.drain_timeout();
        match &mut self.mode {
            Mode::AtLeastOnce {
                remember,
                finishing,
                ..
            } => {
                let graceful = matches!(result, Ok(End::Shutdown));
                let wait = match graceful {
                    true => drain_timeout,
                    false => drain_timeout.min(LAST_RECORD_AFTER_ERROR),
                };
                remember.hurry();
                *finishing = Some(Finishing {
                    result,
                    deadline: now + wait,
                    graceful,
                });
            }
            Mode::ExactlyOnce(txn) => {
                // Events handled since the last commit without a record held (skipped, covered,
                // passed with `--skip-event`): their position is committed before the session
                // ends, or the next one meets them again (a pass used up, it would stop at the
                // same poison row for ever). Only where the position is exact: the session
                // ended cleanly or at an event the core refused.
                let at_event = matches!(
                    result,
                    Ok(_) | Err(CoreError::Route { .. }) | Err(CoreError::TextNeeded { .. })
                );
                if at_event
                    && txn.poisoned.is_none()
                    && txn.stage == Stage::Idle
                    && txn.held.is_empty()
                    && txn.position.is_some()
                    && txn.position != txn.committed
                {
                    if let Some(position) = txn.position {
                        txn.finishing = Some(result);
                        return self.commit(position, Some(now));
                    }
                }
                if txn.open {
                    txn.open = false;
                    tracing::warn!(
                        records = txn.held.len(),
                        "the session ends with a Kafka transaction open; aborting it"
                    );
                    self.actions.push_back(Action::AbortTransaction {
                        records: txn.held.len(),
                        at_end: true,
                    });
                }
                self.stop(result);
            }
        }
    }

    /// At-least-once: writes the next progress record if one is due, and confirms what an
    /// acknowledged record holds; ends a finishing session once its last record is in.
    fn remember(&mut self, now: Instant) {
        let settled = self.relay.in_flight().0 == 0;
        let Mode::AtLeastOnce {
            remember,
            confirmed_since,
            finishing,
            ..
        } = &mut self.mode
        else {
            return;
        };
        remember.settled(settled, now);
        if finishing.is_some() {
            remember.hurry();
        }
        if let Some(lsn) = remember.poll_write(now) {
            let since = match *confirmed_since {
                (at, since) if at == lsn => since,
                _ => None,
            };
            self.actions.push_back(Action::ProduceProgress {
                token: PROGRESS_DELIVERY_KEY,
                position: Position {
                    end_lsn: lsn,
                    partial: None,
                    since_unix_micros: since,
                },
            });
        }
        if let Some(lsn) = remember.poll_confirm() {
            self.actions.push_back(Action::Confirm(lsn));
        }
        let Some(f) = finishing.as_ref() else { return };
        let done = !remember.is_behind() || (!f.graceful && remember.is_failing());
        if !done && now < f.deadline {
            return;
        }
        if !done && f.graceful {
            tracing::warn!(
                topic = %self.progress_topic,
                confirmed = %self.relay.confirmed(),
                "the last progress record was not acknowledged within the drain timeout; \
                 the slot stays at the last remembered position (what follows is produced again on the next start)"
            );
        }
        if let Some(f) = finishing.take() {
            self.stop(f.result);
        }
    }

    /// At-least-once: the progress record in flight was acknowledged.
    fn progress_written(&mut self, now: Instant) {
        let Mode::AtLeastOnce {
            remember, warned, ..
        } = &mut self.mode
        else {
            return;
        };
        let lsn = remember.in_flight();
        let was_failing = remember.is_failing();
        remember.acked(true, now);
        if was_failing {
            tracing::info!(topic = %self.progress_topic, "progress records are written again; confirming resumes");
            *warned = None;
        }
        if let Some(lsn) = lsn {
            self.actions
                .push_back(Action::Count(Count::ProgressRecorded(lsn)));
        }
    }

    /// At-least-once: a progress record failed or was refused. Confirming waits, visibly; a
    /// record Kafka will never take (not authorized, an invalid topic) ends the session like a
    /// failed outbox record.
    fn progress_failed(&mut self, e: E, now: Instant) {
        let Mode::AtLeastOnce {
            remember, warned, ..
        } = &mut self.mode
        else {
            return;
        };
        remember.acked(false, now);
        self.actions.push_back(Action::Count(Count::ProgressFailed));
        let topic = &self.progress_topic;
        if !(self.errors.is_transient)(&e) {
            tracing::error!(%topic, error = %e, "Kafka refuses progress records");
            self.relay.handle_sink_error(e, now);
            return;
        }
        if warned.is_none_or(|t| now.duration_since(t) >= PROGRESS_WARN_INTERVAL) {
            *warned = Some(now);
            tracing::warn!(
                %topic,
                error = %e,
                confirmed = %self.relay.confirmed(),
                remembered = remember.remembered().map(tracing::field::display),
                "cannot write the progress record: nothing is confirmed to PostgreSQL until one is written \
                 (the server keeps the WAL); retrying"
            );
        }
    }

    /// Exactly-once: commits or aborts when it is time to.
    fn settle(&mut self, now: Instant) {
        let draining = self.relay.is_draining();
        let Mode::ExactlyOnce(txn) = &mut self.mode else {
            return;
        };
        txn.settled(now);
        if txn.stage != Stage::Idle {
            return;
        }
        if let Some(why) = txn.poisoned.take() {
            if !txn.open && txn.held.is_empty() {
                return;
            }
            tracing::warn!(error = %why.error, records = txn.held.len(), "aborting the Kafka transaction");
            if txn.open {
                txn.stage = Stage::Aborting;
                txn.poisoned = Some(why);
                self.actions.push_back(Action::AbortTransaction {
                    records: txn.held.len(),
                    at_end: false,
                });
            } else {
                self.aborted(Some(why), None, now);
            }
            return;
        }
        if let Some(position) = txn.due(draining, now) {
            self.commit(position, Some(now));
        }
    }

    /// Exactly-once: the progress record at `position` into the transaction (begun if it is
    /// not), then the commit ([`Session::poll_action`] asks for it once the record is handed
    /// over). `decided`: when, to pace early commits by (`None`: the commit of a fresh slot's
    /// position at the session's start, which paces nothing).
    fn commit(&mut self, position: Position, decided: Option<Instant>) {
        let Mode::ExactlyOnce(txn) = &mut self.mode else {
            return;
        };
        if let Some(now) = decided {
            txn.paced(now);
        }
        if !txn.open {
            txn.open = true;
            self.actions.push_back(Action::BeginTransaction);
        }
        txn.stage = Stage::ProgressHanded(position);
        self.actions.push_back(Action::ProduceProgress {
            token: PROGRESS_DELIVERY_KEY,
            position,
        });
    }

    /// Exactly-once: the transaction is aborted (or was never begun); its records' reports are
    /// released failed, and the session ends (the next one starts over from what Kafka holds).
    fn aborted(&mut self, why: Option<Poison<E>>, abort_error: Option<E>, now: Instant) {
        let Mode::ExactlyOnce(txn) = &mut self.mode else {
            return;
        };
        let why = why.unwrap_or(Poison {
            error: (self.errors.abandoned)(),
            topic: None,
        });
        let held = txn.failed();
        let records = held.len();
        for token in held {
            self.relay.handle_report(token, Err(why.error.clone()), now);
        }
        self.actions.clear();
        let result = txn.finishing.take().unwrap_or(Err(CoreError::Aborted {
            error: why.error,
            topic: why.topic,
            records,
            abort_error,
        }));
        self.stop(result);
    }

    fn stop(&mut self, result: Result<End, CoreError<E>>) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        self.actions.push_back(Action::Stop(Box::new(result)));
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
