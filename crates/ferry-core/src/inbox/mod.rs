//! The inbox machine: every decision of `ferry inbox`, with no I/O.
//!
//! `ferry inbox` consumes topics with a consumer group and writes each record into an inbox
//! table in the consuming service's PostgreSQL. The driver (`crates/ferry/src/inbox/`) owns the
//! Kafka consumer and the database connections; it feeds this machine what happened (a
//! partition assigned or revoked, offsets loaded, a record, a write's outcome, the time) and
//! carries out the [`InboxAction`]s it returns, deciding nothing. The simulation
//! (`tests/inbox_simulation.rs`) drives it with a simulated Kafka and a simulated PostgreSQL
//! through crashes, rebalances, duplicate deliveries, two copies and database restarts.
//!
//! # Exactly once into PostgreSQL
//!
//! 1. **The database holds the offsets.** Each partition's next offset lives in
//!    `ferry_inbox_offsets`, in the inbox's database. A [`Write`] carries, for every partition it
//!    touches, the offset the database held when the batch was made (`expected`) and the one
//!    after its last record (`next`); the driver applies it in the same transaction as the rows,
//!    as `UPDATE … SET next_offset = next WHERE next_offset IS NOT DISTINCT FROM expected`, and
//!    rolls back when a partition's update matches nothing ([`WriteOutcome::Fenced`]): someone
//!    else wrote that partition since this copy read it (a zombie after a rebalance, a second
//!    copy). A fenced machine stops: nothing of its batch was written.
//! 2. **The consumer starts where the database says.** A partition is taken in two steps:
//!    assigned ([`InboxAction::Load`] reads its stored offset) and then sought there
//!    ([`InboxAction::Seek`], with a new epoch). Records are accepted only from the epoch of the
//!    partition's latest seek, so nothing fetched before it, or still queued in the driver from
//!    an older position, is ever stored or skipped. Kafka's committed offsets are advisory:
//!    [`InboxAction::CommitOffsets`] comes only after the database committed.
//! 3. **Any doubt reloads.** A write that failed for any reason other than a refused row (the
//!    connection dropped, the server restarted, a deadlock, a COMMIT whose outcome is unknown)
//!    drops everything in memory, reloads every partition's offset from the database, and seeks
//!    there again. The database decides what was written; memory is only a cache of it.
//!
//! # Duplicates
//!
//! - **By event id** (`event_id_header`, default `id`): the driver inserts the batch's ids into
//!   `ferry_inbox_dedup` with `ON CONFLICT DO NOTHING` in the same transaction and stores only
//!   the rows whose id was new. The machine drops repeats inside one batch (the first copy wins)
//!   and sorts nothing; the driver sorts the ids so that two copies never deadlock.
//! - **By source position** (`positions`, off by default): records `ferry run` made with
//!   `route.position_headers` carry `ferry-source` and `ferry-position` (commit LSN, index). Per
//!   partition and source the database keeps the highest position stored (the *mark*, written
//!   in the same transaction); a record at or below it is Ferry's own replay and is dropped. See
//!   the README's inbox section for when that is exact.
//!
//! # Poison records
//!
//! A record whose payload is not the configured type, or whose event id is not text, goes to
//! the dead-letter table in the same transaction and the offset moves on. A row the database
//! refuses (a constraint, a value PostgreSQL rejects) makes the driver roll back and report
//! [`WriteOutcome::Rejected`]; the machine sends the same batch again as `careful`, and the
//! driver writes it row by row under savepoints, dead-lettering each row refused. A partition
//! never freezes on a record.
//!
//! # Bounded deduplication data
//!
//! Every `cleanup_interval` the machine asks for [`InboxAction::Cleanup`]: the driver deletes
//! deduplication rows older than the retention window, and processed inbox rows older than
//! theirs, in batches with a bounded lock time, on its own connection.

mod machine;
mod validate;

#[cfg(test)]
mod tests;

pub use machine::Inbox;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::source_position::SourcePosition;

/// A topic partition the inbox consumes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Partition {
    pub topic: Arc<str>,
    pub partition: i32,
}

impl Partition {
    pub fn new(topic: impl Into<Arc<str>>, partition: i32) -> Partition {
        Partition {
            topic: topic.into(),
            partition,
        }
    }
}

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.topic, self.partition)
    }
}

/// One consumed record, as the driver hands it over.
#[derive(Clone, Debug, PartialEq)]
pub struct InboxRecord {
    pub partition: Partition,
    pub offset: i64,
    /// The seek epoch the consumer was at when it fetched this record ([`InboxAction::Seek`]).
    pub epoch: u64,
    pub key: Option<Bytes>,
    pub payload: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
    /// The record's timestamp, milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
}

impl InboxRecord {
    /// What the record holds in memory, roughly: its bytes and a fixed overhead.
    pub fn size(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Bytes::len) + 32)
            .sum();
        self.key.as_ref().map_or(0, Bytes::len)
            + self.payload.as_ref().map_or(0, Bytes::len)
            + headers
            + 96
    }

    /// The value of the first header named `name`.
    pub fn header(&self, name: &str) -> Option<&Bytes> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_ref())
    }
}

/// The type of the inbox table's `payload` column: what a payload must be to be stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadType {
    /// Any bytes.
    Bytea,
    /// UTF-8 text without NUL bytes.
    Text,
    /// A JSON document PostgreSQL's `jsonb` accepts.
    Jsonb,
}

impl PayloadType {
    pub fn sql(self) -> &'static str {
        match self {
            PayloadType::Bytea => "bytea",
            PayloadType::Text => "text",
            PayloadType::Jsonb => "jsonb",
        }
    }
}

#[derive(Clone, Debug)]
pub struct InboxConfig {
    /// Most records in one database transaction.
    pub max_batch_records: usize,
    /// Most record bytes in one database transaction.
    pub max_batch_bytes: usize,
    /// How long the first record of a batch may wait for others while no write is in flight
    /// (0: write at once; batches then grow by themselves while a write is in flight).
    pub max_batch_delay: Duration,
    /// Most record bytes held in memory, in flight and waiting; past it the driver stops taking
    /// records until a write commits.
    pub max_buffered_bytes: usize,
    /// The header holding the event id to deduplicate by (`None`: no deduplication by id).
    pub event_id_header: Option<String>,
    /// Drop Ferry's own replays by their source position.
    pub positions: bool,
    pub payload: PayloadType,
    /// How often to clean deduplication data and processed rows (`None`: never).
    pub cleanup_interval: Option<Duration>,
    /// The first wait after a failure; it doubles up to `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
}

impl Default for InboxConfig {
    fn default() -> Self {
        InboxConfig {
            max_batch_records: 5_000,
            max_batch_bytes: 8 << 20,
            max_batch_delay: Duration::ZERO,
            max_buffered_bytes: 32 << 20,
            event_id_header: Some("id".into()),
            positions: false,
            payload: PayloadType::Jsonb,
            cleanup_interval: Some(Duration::from_secs(60)),
            retry_min: Duration::from_millis(100),
            retry_max: Duration::from_secs(10),
        }
    }
}

/// Where the consumer is to read a partition from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeekTo {
    /// The offset the database holds.
    Offset(i64),
    /// The database holds none yet: where the configuration says a new group starts.
    Start,
}

/// What a partition's stored state was when it was loaded.
#[derive(Clone, Debug, PartialEq)]
pub struct Loaded {
    pub partition: Partition,
    /// The stored next offset (`None`: the row exists but nothing was written yet).
    pub next: Option<i64>,
    /// The stored marks of the partition's sources.
    pub marks: Vec<(Arc<str>, SourcePosition)>,
}

/// A row to insert.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub record: InboxRecord,
    pub event_id: Option<String>,
}

/// A record that cannot be stored, with why.
#[derive(Clone, Debug, PartialEq)]
pub struct DeadLetter {
    pub record: InboxRecord,
    pub reason: String,
}

/// A partition's offset advance, applied conditionally in the write's transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetAdvance {
    pub partition: Partition,
    pub expected: Option<i64>,
    pub next: i64,
}

/// A source's new mark on a partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkAdvance {
    pub partition: Partition,
    pub source: Arc<str>,
    pub position: SourcePosition,
}

/// One database transaction: rows, dead letters, offsets and marks, all or nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    pub id: u64,
    /// Row by row under savepoints, dead-lettering each row the database refuses.
    pub careful: bool,
    pub rows: Vec<Row>,
    pub dead_letters: Vec<DeadLetter>,
    pub offsets: Vec<OffsetAdvance>,
    pub marks: Vec<MarkAdvance>,
    /// Records of the batch dropped before the database as repeats of an event id earlier in it.
    pub dropped_by_id: u64,
    /// Records of the batch dropped at or below their source's mark.
    pub dropped_by_position: u64,
}

/// What became of a [`Write`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Committed. `duplicates`: rows not stored because their event id was known.
    Committed {
        inserted: u64,
        duplicates: u64,
        dead_lettered: u64,
    },
    /// A partition's offset was not what the batch expected: rolled back.
    Fenced {
        partition: Partition,
        expected: Option<i64>,
        found: Option<i64>,
    },
    /// The database refused a row: rolled back; the batch can go again, carefully.
    Rejected { error: String },
    /// Anything else: not written, or not known to be.
    Failed { error: String },
}

/// What the driver is to do.
#[derive(Clone, Debug, PartialEq)]
pub enum InboxAction {
    /// Read these partitions' stored offsets and marks (creating their offset rows), and answer
    /// with [`Inbox::handle_loaded`] and this `load`.
    Load {
        load: u64,
        partitions: Vec<Partition>,
    },
    /// Read the partition from here on, tagging what is fetched from now on with `epoch`.
    Seek {
        partition: Partition,
        to: SeekTo,
        epoch: u64,
    },
    /// Carry out the transaction and answer with [`Inbox::handle_written`].
    Write(Write),
    /// The database committed these next offsets: commit them to Kafka (advisory only).
    CommitOffsets(Vec<(Partition, i64)>),
    /// Partitions revoked by the group are no longer written: the rebalance may go on.
    Revoked(Vec<Partition>),
    /// Delete expired deduplication data and processed rows; answer with
    /// [`Inbox::handle_cleaned`].
    Cleanup,
    /// The session is over: `Ok` after a shutdown, an error when this copy must not go on.
    Stop(Result<(), InboxError>),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InboxError {
    #[error(
        "partition {partition} was written by another consumer since this one read its offset \
         (the database holds next offset {found}, this copy expected {expected}): a copy that \
         lost the partition in a rebalance, or a second copy with the same consumer group and \
         inbox; nothing of this batch was written, and this copy stops so that one writer \
         remains (a restart rejoins the group and reads the offsets again)",
        found = show(*found),
        expected = show(*expected),
    )]
    Fenced {
        partition: Partition,
        expected: Option<i64>,
        found: Option<i64>,
    },
}

fn show(o: Option<i64>) -> String {
    o.map_or_else(|| "none".into(), |n| n.to_string())
}

/// What the machine counted, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboxStats {
    /// Records accepted from the consumer.
    pub records: u64,
    /// Rows committed into the inbox table.
    pub inserted: u64,
    /// Dropped because their event id was stored before (by the database) or earlier in the same
    /// batch.
    pub duplicates_by_id: u64,
    /// Dropped at or below their source's mark.
    pub duplicates_by_position: u64,
    /// Committed into the dead-letter table.
    pub dead_lettered: u64,
    /// Records dropped because they came from before their partition's latest seek.
    pub stale: u64,
    /// Transactions committed.
    pub writes: u64,
    /// Failed writes or loads (each reloads every partition).
    pub failures: u64,
    /// Batches sent again row by row after a refusal.
    pub careful_writes: u64,
    /// Cleanups finished.
    pub cleanups: u64,
}
