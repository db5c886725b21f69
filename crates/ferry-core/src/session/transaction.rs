//! Exactly-once: when a Kafka transaction begins, commits or aborts, and which delivery reports
//! are held until then. A part of the [session machine](super); it decides, the session turns its
//! decisions into actions.
//!
//! - **Begin** before the first record after a commit (or an abort), never earlier: an idle
//!   session holds no transaction open.
//! - **Hold every report.** A record's report means nothing until its transaction commits: an
//!   `Ok` is kept back, and all the transaction's records are released `Ok` to the relay core
//!   when the commit succeeds (librdkafka flushes them before it commits), or failed when it
//!   aborts. A failed report, a refused record or an abandon *poisons* the transaction: it will
//!   be aborted, never committed.
//! - **Commit at a position**, the newest the core gave ([`crate::Position`]): when the
//!   transaction is older than the interval, when it holds its cap of records or bytes (no WAL is
//!   taken meanwhile), or when the session drains with records held. The progress record holding
//!   the position goes into the transaction last, after the records it covers.
//! - **Commit the end of a burst without waiting for the interval**: once every record handed
//!   over has had its delivery report and no new one came for [`QUIET`] (a lone event, the end of
//!   a backlog, a burst after an idle stretch), waiting longer would only hold back what is
//!   already written. A position alone, with no record held, waits: nobody waits for it.
//! - **Pace the early commits** so that commits come no more often than one an interval on
//!   average, as in a busy stream: an early commit waits until the commit before the last one
//!   was decided an interval ago, so no three of them fall within one interval. A rule of "an
//!   interval since the last commit" would have events arriving about an interval apart each
//!   wait a little longer than the one before, up to the whole interval. Commits at a cap or a
//!   drain do not wait for the pace, and push it at most an interval ahead; the commit of a fresh
//!   slot's position at the session's start does not count.
//! - **One call at a time.** From the progress record to the commit's outcome nothing else
//!   happens to the transaction.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::inflight::DeliveryKey;
use crate::relay::{CoreError, End, Position};

/// How long every record handed over must have had its report, with no new one, before an
/// early commit ([module documentation](self)): a burst of transactions an application writes a
/// few milliseconds apart stays in one Kafka transaction, and a lone event waits this much
/// rather than an interval.
pub const QUIET: Duration = Duration::from_millis(5);

/// What bounds a Kafka transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionLimits {
    /// `kafka.transaction_interval`: the oldest uncommitted position commits after this long.
    pub interval: Duration,
    /// Records a transaction holds at most (half the in-flight window at most).
    pub max_records: u64,
    /// Their bytes.
    pub max_bytes: u64,
}

/// Why an open transaction may never commit: the error its records fail with, and the topic
/// of the record that failed, when known.
#[derive(Debug, Clone)]
pub(crate) struct Poison<E> {
    pub error: E,
    pub topic: Option<Arc<str>>,
}

/// Where the transaction is in its commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Nothing asked of the producer.
    Idle,
    /// The progress record at this position was handed over; the commit comes next.
    ProgressHanded(Position),
    /// The commit was asked for; its outcome comes next.
    Committing(Position),
    /// The abort was asked for; its outcome comes next.
    Aborting,
}

/// See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct Transaction<E> {
    pub limits: TransactionLimits,
    /// A transaction is begun.
    pub open: bool,
    /// Records in the open transaction: their reports are held until it ends.
    pub held: Vec<DeliveryKey>,
    pub held_bytes: u64,
    /// The newest position the core gave, and when the first uncommitted one came.
    pub position: Option<Position>,
    pub since: Option<Instant>,
    /// The newest committed position, and when its commit's outcome came.
    pub committed: Option<Position>,
    pub committed_at: Option<Instant>,
    pub poisoned: Option<Poison<E>>,
    pub stage: Stage,
    /// Records handed over this session whose reports have not come (a report of a committed
    /// transaction may come after its commit's outcome: the count is the session's, not the
    /// transaction's). It only decides when to commit, never what.
    pub unreported: usize,
    /// Since when `unreported` has been 0, as last told ([`Transaction::settled`]).
    pub settled_since: Option<Instant>,
    /// Earliest time of an early commit ([`Transaction::paced`]; `None`: no commit paces it
    /// yet).
    pub early_from: Option<Instant>,
    /// The session is over once its last position is committed; it ends with this.
    pub finishing: Option<Result<End, CoreError<E>>>,
}

impl<E> Transaction<E> {
    pub fn new(limits: TransactionLimits) -> Self {
        Transaction {
            limits,
            open: false,
            held: Vec::new(),
            held_bytes: 0,
            position: None,
            since: None,
            committed: None,
            committed_at: None,
            poisoned: None,
            stage: Stage::Idle,
            finishing: None,
            unreported: 0,
            settled_since: None,
            early_from: None,
        }
    }

    /// The core's position after an event.
    pub fn position(&mut self, p: Position, now: Instant) {
        self.position = Some(p);
        // Never before the last commit: a driver that read the clock before a burst of events
        // and carried out a slow commit inside it would otherwise start the next transaction
        // already late, and commit after every event.
        let since = self.committed_at.map_or(now, |c| c.max(now));
        self.since.get_or_insert(since);
    }

    /// The first poison wins (its error is what the session ends with).
    pub fn poison(&mut self, why: Poison<E>) {
        if self.poisoned.is_none() {
            self.poisoned = Some(why);
        }
    }

    /// A record was handed over (`true`), or its report came or it was refused (`false`).
    pub fn handed(&mut self, handed: bool) {
        match handed {
            true => self.unreported += 1,
            // A late report of an earlier session's record counts for nothing.
            false => self.unreported = self.unreported.saturating_sub(1),
        }
    }

    /// Notes whether every record handed over has had its report, as of `now`: before each
    /// [`Transaction::due`] and [`Transaction::wake_at`].
    pub fn settled(&mut self, now: Instant) {
        match self.unreported {
            0 => _ = self.settled_since.get_or_insert(now),
            _ => self.settled_since = None,
        }
    }

    /// When the open transaction must commit at the latest; `None` while everything the core
    /// gave is committed (a position it repeats starts no clock).
    pub fn deadline(&self) -> Option<Instant> {
        if self.position == self.committed {
            return None;
        }
        self.since.map(|s| s + self.limits.interval)
    }

    /// When it may commit early: it holds records, none is in flight, no record came for
    /// [`QUIET`], and the pace allows it ([`Transaction::paced`]). A position alone (an idle
    /// stretch of WAL, rows skipped) waits for the interval: no consumer waits for it, and the
    /// server's keepalive after every transaction would otherwise commit a second time each.
    pub fn early_at(&self) -> Option<Instant> {
        if self.position == self.committed || self.held.is_empty() {
            return None;
        }
        let quiet = self.settled_since? + QUIET;
        Some(self.early_from.map_or(quiet, |t| t.max(quiet)))
    }

    /// A commit was decided at `now`: the next early one goes an interval after the pace of
    /// this one at the soonest, and never before `now`, nor more than an interval after it
    /// (a commit at a cap, which does not wait for the pace, does not hold early ones back
    /// further). From the decision, not the outcome: commits take time, and paced from their
    /// outcomes, events about an interval apart would again each wait a little longer.
    pub fn paced(&mut self, now: Instant) {
        let interval = self.limits.interval;
        let next = self.early_from.map_or(now, |f| (f + interval).max(now));
        self.early_from = Some(next.min(now + interval));
    }

    /// When the machine must look again: the deadline, or an early commit's time if sooner.
    pub fn wake_at(&self) -> Option<Instant> {
        super::earliest(self.deadline(), self.early_at())
    }

    /// Whether it holds its cap of records or bytes: no more WAL until it commits.
    pub fn full(&self) -> bool {
        self.held.len() as u64 >= self.limits.max_records
            || self.held_bytes >= self.limits.max_bytes
    }

    /// The position to commit now, if it is time to: the newest one is not committed yet, and
    /// the transaction is full, late, or the session drains with records held.
    pub fn due(&self, draining: bool, now: Instant) -> Option<Position> {
        let position = self.position?;
        if self.committed == Some(position) {
            return None;
        }
        let late = self.deadline().is_some_and(|d| now >= d);
        let early = self.early_at().is_some_and(|e| now >= e);
        let draining = draining && !self.held.is_empty();
        let full = self.full();
        if full || late || early || draining {
            tracing::debug!(
                full,
                late,
                early,
                draining,
                records = self.held.len(),
                end_lsn = %position.end_lsn,
                "committing the Kafka transaction"
            );
        }
        (full || late || early || draining).then_some(position)
    }

    /// The commit succeeded: the held records are durable.
    pub fn committed(&mut self, position: Position, now: Instant) -> Vec<DeliveryKey> {
        self.open = false;
        self.committed = Some(position);
        self.committed_at = Some(now);
        self.since = None;
        self.held_bytes = 0;
        self.stage = Stage::Idle;
        std::mem::take(&mut self.held)
    }

    /// The transaction ended without committing: the held records failed, and the position
    /// falls back to the newest committed one.
    pub fn failed(&mut self) -> Vec<DeliveryKey> {
        self.open = false;
        self.held_bytes = 0;
        self.position = self.committed;
        self.since = None;
        self.stage = Stage::Idle;
        std::mem::take(&mut self.held)
    }
}
