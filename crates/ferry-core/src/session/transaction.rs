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
//! - **One call at a time.** From the progress record to the commit's outcome nothing else
//!   happens to the transaction.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::inflight::DeliveryKey;
use crate::relay::{CoreError, End, Position};

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

    /// When the open transaction must commit at the latest; `None` while everything the core
    /// gave is committed (a position it repeats starts no clock).
    pub fn deadline(&self) -> Option<Instant> {
        if self.position == self.committed {
            return None;
        }
        self.since.map(|s| s + self.limits.interval)
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
        let draining = draining && !self.held.is_empty();
        let full = self.full();
        if full || late || draining {
            tracing::debug!(
                full,
                late,
                draining,
                records = self.held.len(),
                end_lsn = %position.end_lsn,
                "committing the Kafka transaction"
            );
        }
        (full || late || draining).then_some(position)
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
