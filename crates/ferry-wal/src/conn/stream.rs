//! The reader task: streams a logical slot and hands outbox events to the pipeline.
//!
//! [`start`] connects, checks the resume point (see [`crate::feedback`] rule 6) and spawns a task
//! that owns the replication connection. The task:
//!
//! - decodes each XLogData into pgoutput messages and assembles them into [`OutboxEvent`]s, sent
//!   in WAL order over a channel **bounded in events and in bytes** ([`CHANNEL_BYTES`]: rows
//!   are zero-copy slices of what the server sent, so a few thousand 1 MB payloads must not
//!   queue up): when the pipeline stops taking events (its in-flight window is full because
//!   Kafka is slow or down), the task stops reading the socket, and the server stops sending.
//!   Memory does not grow;
//! - hands the events over in batches: what one wake-up read (at most [`BATCH_EVENTS`]
//!   events, flushed early past [`BATCH_BYTES`]) travels as one message with one share of the
//!   byte budget, released once the pipeline has taken the batch's last event. Per event, the
//!   channel's and the budget's semaphores cost ~450 instructions (a lock each to release a
//!   permit); per batch, that is nothing. Nothing waits for company: a batch is sent before the
//!   task waits on the socket or a timer again;
//! - forwards keepalives' `wal_end` in WAL order with the events (a batch of keepalives alone is
//!   dropped when the channel is full: they only matter when the pipeline is idle);
//! - reports the LSN the pipeline confirms (through [`ReaderHandle::confirm`]) in standby status
//!   updates, promptly and regularly, *also while blocked on a full channel*, so that the server
//!   does not time the connection out during a long Kafka outage;
//! - on [`ReaderHandle::shutdown`] sends a final status update and closes the session.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use super::config::ConnectConfig;
use super::error::{answered, timed, ReaderError};
use super::pause::{Bound, Pace, Pause, PauseUntil};
use super::replication::ReplicationConnection;
use crate::assembly::{Assembler, AssemblyStats, OutboxEvent, OutboxSource};
use crate::feedback::{Progress, Silence, Silent};
use crate::pgoutput::Decoder;
use crate::slot::{quote_ident, quote_literal, slot_state};
use crate::wire::{PgTimestamp, ReplicationMessage};
use crate::Lsn;

/// Default cadence of standby status updates when nothing changes.
pub const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// How long a new confirmation may wait before it is reported (coalesces bursts of acks).
pub const CONFIRM_MIN_GAP: Duration = Duration::from_millis(10);
/// Events buffered between the reader task and the pipeline.
pub const DEFAULT_CHANNEL_CAPACITY: usize = 4096;
/// Most events in one batch handed to the pipeline: one wake-up's burst of messages
/// ([`BUFFERED_BURST`] buffered after the first). The channel holds
/// `channel_capacity / BATCH_EVENTS` batches, and at least [`MIN_BATCHES`]: at most
/// `max(channel_capacity, MIN_BATCHES * BATCH_EVENTS)` events (~16,000 by default, each a few
/// dozen bytes beside the WAL bytes it holds, which the byte budget bounds).
pub const BATCH_EVENTS: usize = BUFFERED_BURST + 1;
/// Batches the channel holds at least. On a live stream a wake-up often brings one message, a
/// batch of one: this many of them are the read-ahead while the pipeline pauses (an
/// exactly-once commit), and a keepalive arriving alone is a batch too, so a few of those must
/// not fill a small channel before the rows behind them.
const MIN_BATCHES: usize = 64;
/// A batch is sent once its events hold this many WAL bytes, before the burst ends: the byte
/// budget is taken and released per batch, and at a quarter of it the reader can go on reading
/// while the pipeline takes earlier batches of large rows.
pub const BATCH_BYTES: usize = CHANNEL_BYTES / 4;
/// Bytes of WAL data (pgoutput messages) buffered between the reader task and the pipeline; an
/// event larger than this travels alone. It is read-ahead on top of the pipeline's in-flight
/// window, and while Kafka is slower than the slot it is full: 8 MiB put Ferry's peak RSS at
/// 66–67 MiB on the 16 KB-row backlog with the broker stalled, 2 MiB at 57–60 MiB
/// (bench/README.md, "Memory"). 2 MiB is still more than a hundred 16 KB rows.
pub const CHANNEL_BYTES: usize = 2 * 1024 * 1024;

/// What to stream.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    pub slot: String,
    pub publication: String,
    pub source: OutboxSource,
    pub status_interval: Duration,
    pub channel_capacity: usize,
    /// pgoutput's `binary 'true'` (PostgreSQL 14+): each column in its type's binary send
    /// format where the type has one, text otherwise (the tuple data says which, per value).
    pub binary: bool,
    /// Make the slot a failover slot (PostgreSQL 17+) before streaming, if it is not one.
    pub failover: bool,
    /// The longest the reader leaves the socket alone after a read that ended inside a
    /// transaction, so that the rest of it is read at once ([`pause_for_linger`]; while the
    /// stream is idle the pause ends sooner, when the rest has come); zero: never.
    pub pause_inside_transaction: Duration,
    /// How long the server may send nothing before the connection is taken for lost (a reply
    /// asked for from a quarter of it on; see [`crate::feedback::Silence`]); `None`: never.
    pub receive_timeout: Option<Duration>,
}

/// [`StreamOptions::receive_timeout`] by default: PostgreSQL's own `wal_receiver_timeout`.
pub const DEFAULT_RECEIVE_TIMEOUT: Duration = Duration::from_secs(60);

/// The longest pause inside a transaction. At 1,000 ten-row transactions a second (pinned,
/// bench/README.md) a pause of 500 µs cut the pipeline thread's CPU by ~18% and Ferry's by
/// ~12%, and moved commit → in Kafka by ~0.2 ms at the median and not at p99; 300 µs saved less
/// (the rest of a transaction had often not arrived yet) for the same cost. At 200 transactions
/// a second a pause of its whole length moved the median by ~0.5 ms (the walsender, idle
/// between transactions, sends each at once), so there the pause ends when the rest of the
/// transaction has come (`pause::Pace`): the median is back within ~0.1 ms of no pause at all,
/// the CPU saved the same.
pub const MAX_PAUSE_INSIDE_TRANSACTION: Duration = Duration::from_micros(500);

/// The pause inside a transaction for a producer that lingers `linger` before it sends a
/// batch: half of it, so that rows read after the pause still join the batches the
/// transaction's first rows opened, and at most [`MAX_PAUSE_INSIDE_TRANSACTION`]. No linger, no
/// pause.
pub fn pause_for_linger(linger: Duration) -> Duration {
    (linger / 2).min(MAX_PAUSE_INSIDE_TRANSACTION)
}

/// What the reader hands the pipeline, in WAL order.
#[derive(Debug)]
pub enum ReaderEvent {
    /// A transaction boundary, an outbox row or an outbox message.
    Outbox(OutboxEvent),
    /// The server's WAL end; confirmable when nothing is in flight.
    Keepalive { wal_end: Lsn },
}

/// Counters the reader keeps for metrics (read with `Ordering::Relaxed`).
#[derive(Debug, Default)]
pub struct ReaderStats {
    /// Highest WAL position received.
    pub received_lsn: AtomicU64,
    /// The server's WAL end as last reported.
    pub server_wal_end: AtomicU64,
    /// The flush LSN last reported to the server.
    pub reported_flush_lsn: AtomicU64,
    pub xlog_messages: AtomicU64,
    pub xlog_bytes: AtomicU64,
    pub keepalives: AtomicU64,
    pub status_updates: AtomicU64,
    /// Pauses after a read that ended inside a transaction ([`pause_for_linger`]).
    pub pauses: AtomicU64,
    /// Skipped UPDATE/DELETE/TRUNCATE statements on the outbox table.
    pub outbox_updates_skipped: AtomicU64,
    pub outbox_deletes_skipped: AtomicU64,
    pub outbox_truncates_skipped: AtomicU64,
    /// INSERTs into published tables that no configured outbox table is (skipped).
    pub other_inserts_skipped: AtomicU64,
    /// Per transaction, its commit time to the moment the server sent its first message.
    pub source_delay: SourceDelay,
}

/// Upper bounds (inclusive, microseconds) of [`SourceDelay`]'s buckets: 1 ms to 60 s, as the
/// pipeline's replication lag histogram.
pub const SOURCE_DELAY_BOUNDS_MICROS: [i64; 17] = [
    1_000, 2_500, 5_000, 7_500, 10_000, 15_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000, 60_000_000,
];

/// Per transaction: from its commit time to the server's clock when it sent the transaction's
/// Begin (the XLogData's `server_time`). Both times are the server's, so no clock between hosts
/// enters it. What it holds: the WAL flush of the commit, logical decoding, the walsender
/// waiting to be woken or scheduled, and every wait for this client: a transaction committed
/// while no session streamed counts that time, and while the reader stops reading (the
/// pipeline's window is full) the walsender waits on its socket. While the client keeps up it
/// is PostgreSQL's share of the replication lag, which no client shortens by reading faster.
#[derive(Debug, Default)]
pub struct SourceDelay {
    /// Per bucket (not cumulative), one past the last bound for anything larger.
    pub buckets: [AtomicU64; SOURCE_DELAY_BOUNDS_MICROS.len() + 1],
    pub sum_micros: AtomicU64,
}

impl SourceDelay {
    /// Records one transaction's delay; a negative one (a clock stepped back) counts as zero.
    pub fn observe(&self, commit: PgTimestamp, sent: PgTimestamp) {
        let micros = sent.0.saturating_sub(commit.0).max(0);
        let slot = SOURCE_DELAY_BOUNDS_MICROS.partition_point(|&b| b < micros);
        self.buckets[slot].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(u64::try_from(micros).unwrap_or(0), Ordering::Relaxed);
    }
}

/// The server's identity as `IDENTIFY_SYSTEM` reports it: another system identifier is another
/// cluster (a slot of the same name there is not the slot Ferry used), another timeline follows
/// a promotion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SystemIdentity {
    pub system_id: u64,
    pub timeline: u32,
}

/// Events in WAL order, with their share of the byte budget (none for keepalives alone).
#[derive(Debug)]
struct Batch {
    events: Vec<ReaderEvent>,
    permit: Option<OwnedSemaphorePermit>,
}

/// The pipeline's side of a running reader.
#[derive(Debug)]
pub struct ReaderHandle {
    events: mpsc::Receiver<Batch>,
    /// The batch being taken, and its share of the budget: returned when its last event is.
    current: std::vec::IntoIter<ReaderEvent>,
    current_permit: Option<OwnedSemaphorePermit>,
    budget: Arc<Semaphore>,
    /// Where streaming resumed (the slot's `confirmed_flush_lsn`).
    pub resume_lsn: Lsn,
    /// The walsender's pid (`active_pid` of the slot).
    pub backend_pid: i32,
    /// Which server and timeline is streaming (`IDENTIFY_SYSTEM`).
    pub system: SystemIdentity,
    pub stats: Arc<ReaderStats>,
    /// The receive timeout the stream runs with: the configured one, never below the server's
    /// `wal_sender_timeout` ([`crate::feedback::receive_timeout`]).
    pub receive_timeout: Option<std::time::Duration>,
    confirm: watch::Sender<Lsn>,
    task: JoinHandle<Result<(), ReaderError>>,
}

impl ReaderHandle {
    /// Hands over the LSN the relay core confirmed, to be reported as `flush_lsn`. The rule that
    /// it never moves backwards is kept once, by [`crate::feedback::Progress::confirm`].
    pub fn confirm(&self, lsn: Lsn) {
        self.confirm.send_replace(lsn);
    }

    /// The next event in WAL order; `None` once the reader task has ended (its outcome then
    /// comes from [`ReaderHandle::shutdown`]). Cancel-safe.
    pub async fn recv(&mut self) -> Option<ReaderEvent> {
        if let Some(event) = self.take() {
            return Some(event);
        }
        // Cancel-safe: a batch is stored only once received, and nothing is taken before.
        let batch = self.events.recv().await?;
        self.begin(batch);
        self.take()
    }

    /// The next event if one is already waiting, without waiting.
    pub fn try_recv(&mut self) -> Option<ReaderEvent> {
        if let Some(event) = self.take() {
            return Some(event);
        }
        let batch = self.events.try_recv().ok()?;
        self.begin(batch);
        self.take()
    }

    /// The current batch's next event; its last returns the batch's bytes to the budget.
    fn take(&mut self) -> Option<ReaderEvent> {
        let event = self.current.next();
        if self.current.len() == 0 {
            self.current_permit = None;
        }
        event
    }

    fn begin(&mut self, batch: Batch) {
        self.current = batch.events.into_iter();
        self.current_permit = batch.permit;
    }

    /// WAL bytes decoded and waiting in the channel for [`ReaderHandle::recv`] (at most
    /// [`CHANNEL_BYTES`]).
    pub fn buffered_bytes(&self) -> usize {
        CHANNEL_BYTES - self.budget.available_permits()
    }

    /// Whether the channel holds as many batches as it can: the reader task waits for room
    /// before it hands over more rows.
    pub fn channel_full(&self) -> bool {
        self.events.capacity() == 0
    }

    /// Stops streaming after a final status update; returns the task's outcome.
    pub async fn shutdown(self) -> Result<(), ReaderError> {
        let ReaderHandle {
            events,
            current,
            current_permit,
            confirm,
            task,
            ..
        } = self;
        drop(confirm);
        drop((events, current, current_permit));
        match task.await {
            Ok(r) => r,
            Err(e) => Err(ReaderError::TaskFailed {
                reason: e.to_string(),
            }),
        }
    }

    /// Whether the task has ended (it then returns its error from [`ReaderHandle::shutdown`]).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

/// A replication connection, open and identified (`IDENTIFY_SYSTEM`), that has not started
/// streaming: [`start_on`] starts it. Opening one decides nothing and holds no slot, but it
/// takes one of the server's WAL senders (`max_wal_senders`), and the server may close it
/// while it waits (`idle_session_timeout`): open it just before it is needed.
pub struct Replication {
    conn: ReplicationConnection,
    system: SystemIdentity,
}

impl std::fmt::Debug for Replication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replication")
            .field("backend_pid", &self.conn.backend_pid)
            .field("system", &self.system)
            .finish_non_exhaustive()
    }
}

impl Replication {
    /// Connects for logical replication (`replication=database`) and identifies the server.
    pub async fn connect(cfg: &ConnectConfig) -> Result<Replication, ReaderError> {
        let mut conn = ReplicationConnection::connect(cfg).await?;
        // Part of connecting: within the connect timeout too.
        let timeout = cfg.connect_timeout.unwrap_or(Duration::from_secs(3600));
        let what = "identifying the server (IDENTIFY_SYSTEM) on a new replication connection";
        let ident = timed(timeout, what, conn.simple_query("IDENTIFY_SYSTEM")).await?;
        let column = |i: usize| ident.first().and_then(|r| r.get(i)).cloned().flatten();
        if column(3).is_none() {
            return Err(ReaderError::NotLogicalReplication);
        }
        // systemid and timeline: always present and numeric on a real server.
        let system = SystemIdentity {
            system_id: column(0).and_then(|s| s.parse().ok()).unwrap_or(0),
            timeline: column(1).and_then(|s| s.parse().ok()).unwrap_or(0),
        };
        Ok(Replication { conn, system })
    }
}

/// Where [`start_with`] gets its replication connection.
enum Connection<'c> {
    /// Connects after the slot is read (what [`start`] does).
    Later(&'c ConnectConfig),
    Open(Replication),
}

/// Connects and starts streaming `opts.slot` from its `confirmed_flush_lsn`.
///
/// `sql` is an ordinary connection to the same database, used to read the slot before and
/// after `START_REPLICATION`.
pub async fn start(
    cfg: &ConnectConfig,
    sql: &tokio_postgres::Client,
    opts: StreamOptions,
) -> Result<ReaderHandle, ReaderError> {
    start_with(Connection::Later(cfg), sql, opts).await
}

/// [`start`] on a connection opened before ([`Replication::connect`]).
pub async fn start_on(
    replication: Replication,
    sql: &tokio_postgres::Client,
    opts: StreamOptions,
) -> Result<ReaderHandle, ReaderError> {
    start_with(Connection::Open(replication), sql, opts).await
}

/// Each query is answered within `opts.receive_timeout` ([`answered`]).
async fn start_with(
    connection: Connection<'_>,
    sql: &tokio_postgres::Client,
    opts: StreamOptions,
) -> Result<ReaderHandle, ReaderError> {
    let within = opts.receive_timeout;
    let slot_read = "the read of the slot around START_REPLICATION";
    let before = answered(within, slot_read, slot_state(sql, &opts.slot))
        .await?
        .ok_or_else(|| {
            ReaderError::Server(super::error::ServerError {
                severity: "ERROR".into(),
                code: "42704".into(),
                message: format!("replication slot {:?} does not exist", opts.slot),
                detail: None,
                hint: Some(
                    "run `ferry check`; Ferry creates it when postgres.create_slot = true".into(),
                ),
            })
        })?;
    if before.wal_status.as_deref() == Some("lost") {
        return Err(invalidated(&opts.slot, None));
    }
    if let Some(pid) = before.active_pid {
        return Err(ReaderError::SlotInUse {
            slot: opts.slot.clone(),
            pid,
        });
    }
    let resume = before.confirmed_flush_lsn;
    let Replication { mut conn, system } = match connection {
        Connection::Later(cfg) => Replication::connect(cfg).await?,
        Connection::Open(replication) => replication,
    };
    if opts.failover && before.failover == Some(false) && before.synced != Some(true) {
        // Replication protocol only: there is no SQL function for it.
        let alter = format!(
            "ALTER_REPLICATION_SLOT {} ( FAILOVER true )",
            quote_ident(&opts.slot)
        );
        answered(within, "ALTER_REPLICATION_SLOT", conn.simple_query(&alter)).await?;
    }
    let command = format!(
        "START_REPLICATION SLOT {} LOGICAL {} (proto_version '1', publication_names {}, messages 'true'{})",
        quote_ident(&opts.slot),
        resume,
        quote_literal(&quote_ident(&opts.publication)),
        if opts.binary { ", binary 'true'" } else { "" },
    );
    answered(within, "START_REPLICATION", conn.start_copy_both(&command))
        .await
        .map_err(|e| match e {
            ReaderError::Server(s) if s.code == "55006" => ReaderError::SlotInUse {
                slot: opts.slot.clone(),
                pid: parse_pid(&s.message).unwrap_or(0),
            },
            // Invalidated after we read the slot.
            ReaderError::Server(s)
                if s.code == "55000"
                    && s.detail
                        .as_deref()
                        .is_some_and(|d| d.contains("invalidated")) =>
            {
                invalidated(&opts.slot, Some(s))
            }
            other => other,
        })?;
    let after = answered(within, slot_read, slot_state(sql, &opts.slot)).await?;
    if let Some(after) = after {
        if after.confirmed_flush_lsn > resume {
            conn.close().await;
            return Err(ReaderError::SlotAdvancedPastResume {
                slot: opts.slot.clone(),
                resume,
                confirmed: after.confirmed_flush_lsn,
            });
        }
    }
    let (tx, rx) = mpsc::channel((opts.channel_capacity / BATCH_EVENTS).max(MIN_BATCHES));
    let budget = Arc::new(Semaphore::new(CHANNEL_BYTES));
    let (confirm_tx, confirm_rx) = watch::channel(resume);
    let stats = Arc::new(ReaderStats::default());
    stats.reported_flush_lsn.store(resume.0, Ordering::Relaxed);
    let backend_pid = conn.backend_pid;
    let receive_timeout = opts.receive_timeout;
    let task = Task {
        conn,
        tx,
        budget: budget.clone(),
        confirm: confirm_rx,
        progress: Progress::new(resume, opts.status_interval, CONFIRM_MIN_GAP),
        silence: Silence::new(opts.receive_timeout, Instant::now()),
        decoder: Decoder::new(),
        assembler: Assembler::new(opts.source),
        stats: stats.clone(),
        batching: None,
        pause: (!opts.pause_inside_transaction.is_zero())
            .then(|| Pause::new(opts.pause_inside_transaction))
            .flatten(),
        paused: None,
        pace: Pace::default(),
        pacing: false,
        woke: Instant::now(),
        pending: Vec::new(),
        pending_bytes: 0,
        pending_rows: 0,
        owed_keepalive: None,
    };
    Ok(ReaderHandle {
        events: rx,
        current: Vec::new().into_iter(),
        current_permit: None,
        budget,
        resume_lsn: resume,
        backend_pid,
        system,
        stats,
        receive_timeout,
        confirm: confirm_tx,
        task: tokio::spawn(task.run()),
    })
}

/// A permanent error for a slot whose WAL is gone (`wal_status = lost`), saying how to recover;
/// `server` is the server's own report when it refused `START_REPLICATION`.
fn invalidated(slot: &str, server: Option<super::error::ServerError>) -> ReaderError {
    let fix = crate::slot::invalidated_slot_fix(slot);
    ReaderError::Server(match server {
        Some(s) => super::error::ServerError {
            hint: Some(s.hint.map_or(fix.clone(), |h| format!("{h}; {fix}"))),
            ..s
        },
        None => super::error::ServerError {
            severity: "ERROR".into(),
            code: "55000".into(),
            message: format!(
                "replication slot {slot:?} was invalidated (wal_status = lost): the WAL it needed was removed"
            ),
            detail: None,
            hint: Some(fix),
        },
    })
}

/// The end of the task's pause; only awaited while one is under way (and so a timer exists).
async fn pause_over(pause: &mut Option<Pause>) {
    if let Some(pause) = pause {
        pause.over().await;
    }
}

fn parse_pid(msg: &str) -> Option<i32> {
    msg.rsplit("PID ").next()?.trim().parse().ok()
}

/// What [`Task::read`] took in from one CopyData.
enum Read {
    /// An event for the pipeline, and the WAL bytes it came in (at least 1, its budget share).
    Event { event: OutboxEvent, size: usize },
    /// A keepalive: the server's WAL end, and whether it asked for a status update.
    Keepalive { wal_end: Lsn, reply_requested: bool },
    /// A message that is no event (a relation, a row of another table, ...).
    Nothing,
}

struct Task {
    conn: ReplicationConnection,
    tx: mpsc::Sender<Batch>,
    budget: Arc<Semaphore>,
    confirm: watch::Receiver<Lsn>,
    progress: Progress,
    /// How long the server has been silent, and what that calls for.
    silence: Silence,
    decoder: Decoder,
    assembler: Assembler,
    stats: Arc<ReaderStats>,
    /// While reads are batched: when the batch wait ends (see [`Task::batch_reads`]).
    batching: Option<tokio::time::Instant>,
    /// The timer of a pause inside a transaction (see [`Task::pause_inside_transaction`]);
    /// `None` where there is none.
    pause: Option<Pause>,
    /// A pause under way (the socket's low-water mark raised, the timer running), and how it
    /// ends: at its timer, the socket not read until then, or when the rest has come.
    paused: Option<PauseUntil>,
    /// The stream's pace: when a pause may end before its length.
    pace: Pace,
    /// Whether the stream's pace is kept for what the last wake-up read: where the reader
    /// pauses, and not while reads are batched (there is no pause then, and a backlog's rows
    /// need not pay for it).
    pacing: bool,
    /// When the socket was last read (kept only while `pacing`).
    woke: Instant,
    /// Events not yet handed over ([`Task::flush`]), their WAL bytes, and how many are not
    /// keepalives.
    pending: Vec<ReaderEvent>,
    pending_bytes: usize,
    pending_rows: usize,
    /// The newest WAL end of keepalives the busy pipeline had no room for: handed over as soon
    /// as it has (the server sends no other keepalive until its WAL moves again, so an idle
    /// slot would wait behind it for new WAL).
    owed_keepalive: Option<Lsn>,
}

/// Most buffered messages handled in a row before the task looks at its timers again.
const BUFFERED_BURST: usize = 256;

/// A wake-up that brought at least this much means the server is streaming a backlog: the
/// task then reads in batches (see [`Task::batch_reads`]).
const BATCH_ABOVE: usize = 32 * 1024;
/// While batching, the socket reports readable only once this much is queued (`SO_RCVLOWAT`).
const BATCH_LOW_WATERMARK: usize = 64 * 1024;
/// While batching, a wait this long with less than [`BATCH_LOW_WATERMARK`] queued ends the
/// batching, and whatever is queued is read at once: the most a message waits for company.
const BATCH_WAIT: Duration = Duration::from_millis(2);

/// An XLogData's bytes on the wire beyond its pgoutput message: the CopyData's tag and length
/// (5) and the XLogData's header (25).
const XLOG_DATA_OVERHEAD: usize = 30;
/// A keepalive's bytes on the wire: the CopyData's tag and length (5) and the message (18).
const KEEPALIVE_WIRE: usize = 23;

/// How long the reader looks at the socket once more before it takes a silent server's
/// connection for lost ([`Silent::Lost`]): long enough for a runtime starved of CPU to look at
/// the socket again, short beside the timeout.
const LAST_LOOK: Duration = Duration::from_secs(1);

/// What woke the task.
enum Wake {
    Data(Result<bytes::Bytes, ReaderError>),
    Confirmed(bool),
    StatusDue,
    /// The server has been silent long enough to ask for a reply, or to give up (the time).
    Silence(Instant),
    BatchWaitOver,
    PauseOver,
    /// The pipeline has room for an owed keepalive (`false`: it is gone).
    Room(bool),
}

impl Task {
    async fn run(mut self) -> Result<(), ReaderError> {
        let result = self.stream().await;
        if result.is_err() && !matches!(result, Err(ReaderError::Closed)) {
            // What was read before the error reaches the pipeline, as it would had each event
            // been handed over when decoded: rows before a row the reader refuses are relayed
            // and confirmed, not read again by every session that stops at the same place.
            let _ = self.flush().await;
        }
        if matches!(result, Ok(()) | Err(ReaderError::Closed)) {
            // Orderly stop: report the final confirmation, then end the session.
            self.progress.confirm(*self.confirm.borrow())?;
            let _ = self.send_status().await;
            self.conn.close().await;
            return Ok(());
        }
        result
    }

    async fn stream(&mut self) -> Result<(), ReaderError> {
        loop {
            let due = tokio::time::Instant::from_std(self.progress.next_due(Instant::now()));
            let batch_until = self.batching;
            let paused = self.paused;
            let read = paused != Some(PauseUntil::ItsEnd);
            // One timer for the status update and the silence's next check (only while the
            // socket is read: a pause is the reader's own), whichever is first.
            let silence = self
                .silence
                .next_check()
                .filter(|_| read)
                .map(tokio::time::Instant::from_std);
            let timer = silence.map_or(due, |s| s.min(due));
            let wake = tokio::select! {
                biased;
                changed = self.confirm.changed() => Wake::Confirmed(changed.is_ok()),
                _ = tokio::time::sleep_until(timer) => {
                    let now = tokio::time::Instant::now();
                    match silence {
                        Some(s) if s <= now => Wake::Silence(now.into_std()),
                        _ => Wake::StatusDue,
                    }
                }
                _ = tokio::time::sleep_until(batch_until.unwrap_or(due)), if batch_until.is_some() => Wake::BatchWaitOver,
                () = pause_over(&mut self.pause), if paused.is_some() => Wake::PauseOver,
                room = self.tx.reserve(), if self.owed_keepalive.is_some() => Wake::Room(room.is_ok()),
                // While paused until the rest comes, readable only once the mark's bytes are.
                data = self.conn.recv_copy_data(), if read => Wake::Data(data),
            };
            match wake {
                Wake::Confirmed(false) => return Err(ReaderError::Closed),
                Wake::Confirmed(true) => self.take_confirmation()?,
                Wake::StatusDue => self.send_status_bounded().await?,
                Wake::Silence(now) => match self.silence.check(now) {
                    Silent::Fine => {}
                    Silent::Ask => self.send_status_bounded().await?,
                    Silent::Lost => self.last_look().await?,
                },
                Wake::Room(false) => return Err(ReaderError::Closed),
                Wake::Room(true) => {
                    self.flush().await?;
                    // What the pipeline made the reader wait was not the server's silence.
                    self.silence.heard(Instant::now());
                }
                Wake::BatchWaitOver => self.batch_reads(0),
                Wake::PauseOver => {
                    // Lowering the mark reports readable at once if anything is queued.
                    self.conn.set_read_low_watermark(1);
                    self.paused = None;
                }
                Wake::Data(data) => self.take_data(data?).await?,
            }
        }
    }

    /// Before a silent server's connection is given up, one last look at the socket: a timer
    /// due while this process was stopped or starved of CPU fires before the runtime has looked
    /// at the socket again. Whatever is queued counts, below a raised low-water mark too.
    async fn last_look(&mut self) -> Result<(), ReaderError> {
        let was_paused = self.paused.take().is_some();
        if was_paused {
            if let Some(pause) = &mut self.pause {
                pause.stop();
            }
        }
        if self.batching.take().is_some() || was_paused {
            self.conn.set_read_low_watermark(1);
        }
        match tokio::time::timeout(LAST_LOOK, self.conn.recv_copy_data()).await {
            Ok(data) => self.take_data(data?).await,
            Err(_) => Err(self.silent()),
        }
    }

    /// The error of a connection the server's silence ended.
    fn silent(&self) -> ReaderError {
        ReaderError::Silent {
            after: self.silence.timeout().unwrap_or_default(),
        }
    }

    /// What a read of the socket brought, and whatever else is buffered behind it.
    async fn take_data(&mut self, data: bytes::Bytes) -> Result<(), ReaderError> {
        self.pacing = self.pause.is_some() && self.batching.is_none();
        if self.pacing {
            self.woke = Instant::now();
        }
        let mut bytes = data.len();
        self.handle(data).await?;
        // Everything that read brought, before waiting on the socket and the
        // timers again (bounded, so confirmations and status updates stay prompt).
        for _ in 0..BUFFERED_BURST {
            match self.conn.buffered_copy_data()? {
                Some(data) => {
                    bytes += data.len();
                    self.handle(data).await?;
                }
                None => break,
            }
        }
        // Before any wait: nothing read waits for company.
        self.flush().await?;
        // Heard, and what the pipeline made the reader wait meanwhile was not the server's
        // silence.
        self.silence.heard(Instant::now());
        self.batch_reads(bytes);
        self.pause_inside_transaction();
        Ok(())
    }

    /// Switches batched reading on and off after a wake-up that brought `bytes` (0: the batch
    /// wait passed with nothing). The walsender sends every message on its own, so a reader that
    /// keeps up with it wakes once per message; through a backlog that is tens of thousands of
    /// wake-ups a second, most of the reader's CPU. Once a wake-up brings [`BATCH_ABOVE`], the
    /// socket's low-water mark is raised so that wake-ups come per [`BATCH_LOW_WATERMARK`];
    /// when [`BATCH_WAIT`] passes without one (the stream slowed or ended), the mark drops
    /// back and what is queued is read at once.
    fn batch_reads(&mut self, bytes: usize) {
        match self.batching {
            Some(_) if bytes == 0 => {
                self.conn.set_read_low_watermark(1);
                self.batching = None;
            }
            Some(_) => self.batching = Some(tokio::time::Instant::now() + BATCH_WAIT),
            None if bytes >= BATCH_ABOVE
                && self.conn.set_read_low_watermark(BATCH_LOW_WATERMARK) =>
            {
                self.batching = Some(tokio::time::Instant::now() + BATCH_WAIT);
            }
            None => {}
        }
    }

    /// After a wake-up that ended inside a transaction, leaves the socket alone for a while
    /// (what was read is already handed over). The server sends a committed transaction as
    /// fast as it decodes it, one message at a time, and a reader that keeps up with a steady
    /// rate woke for nearly every one: at 1,000 ten-row transactions a second, 6.6 socket reads
    /// a transaction, most after a sleep of the pipeline's thread.
    ///
    /// How long depends on the stream's pace ([`Pace`]): while transactions come close behind
    /// each other, for the stream's pause ([`pause_for_linger`]); otherwise until the rest of a
    /// transaction like the last ones has come, to its commit, or the pause's end if that is
    /// sooner. The socket's low-water mark is raised meanwhile: to the rest, or so high that
    /// only the timer ends the pause. Between transactions, and while reads are batched, there
    /// is no pause; a wake-up that ends a pause before its end stops the timer and lowers the
    /// mark again, unless the next pause follows at once.
    fn pause_inside_transaction(&mut self) {
        let Some(pause) = &mut self.pause else {
            return;
        };
        let until = if self.batching.is_none() && self.assembler.open_xid().is_some() {
            self.pace.pause(self.conn.buffered_bytes())
        } else {
            None
        };
        // Data arriving wakes the runtime's poller whether or not the task reads it: the mark
        // keeps what arrives meanwhile from waking the thread.
        let pausing = until.and_then(|until| {
            let (mark, until) = match until {
                PauseUntil::Rest(rest) if rest < BATCH_LOW_WATERMARK => (rest, until),
                _ => (BATCH_LOW_WATERMARK, PauseUntil::ItsEnd),
            };
            self.conn.set_read_low_watermark(mark).then_some(until)
        });
        match pausing {
            Some(paused) if pause.start() => {
                self.paused = Some(paused);
                self.stats.pauses.fetch_add(1, Ordering::Relaxed);
            }
            // A mark just raised, or one a pause ended early by data left raised, goes back
            // down (unless reads are batched, which keep their own).
            Some(_) => {
                self.paused = None;
                self.conn.set_read_low_watermark(1);
            }
            None => {
                if self.paused.take().is_some() {
                    pause.stop();
                    if self.batching.is_none() {
                        self.conn.set_read_low_watermark(1);
                    }
                }
            }
        }
    }

    fn take_confirmation(&mut self) -> Result<(), ReaderError> {
        let lsn = *self.confirm.borrow_and_update();
        Ok(self.progress.confirm(lsn)?)
    }

    /// A status update, given up with the connection if it cannot be written within the
    /// receive timeout (a server gone: the kernel's send buffer full).
    async fn send_status_bounded(&mut self) -> Result<(), ReaderError> {
        match self.silence.timeout() {
            Some(t) => tokio::time::timeout(t, self.send_status())
                .await
                .map_err(|_| self.silent())?,
            None => self.send_status().await,
        }
    }

    /// A status update; while the server is silent, it asks for a reply ([`Silence`]).
    async fn send_status(&mut self) -> Result<(), ReaderError> {
        let mut update = self
            .progress
            .take_update(Instant::now(), PgTimestamp::now());
        update.reply_requested = self.silence.asking();
        let mut buf = bytes::BytesMut::with_capacity(64);
        update.encode_into(&mut buf);
        self.conn.send_copy_data(&buf).await?;
        self.stats.status_updates.fetch_add(1, Ordering::Relaxed);
        self.stats
            .reported_flush_lsn
            .store(update.flush_lsn.0, Ordering::Relaxed);
        Ok(())
    }

    async fn handle(&mut self, data: bytes::Bytes) -> Result<(), ReaderError> {
        match self.read(data)? {
            Read::Nothing => {}
            Read::Event { event, size } => {
                // A batch stays within BATCH_BYTES unless one event alone is larger (it then
                // travels alone, its share of the budget clamped to the whole).
                if self.pending_bytes > 0 && self.pending_bytes + size > BATCH_BYTES {
                    self.flush().await?;
                }
                self.pending.push(ReaderEvent::Outbox(event));
                self.pending_bytes += size;
                self.pending_rows += 1;
                if self.pending.len() >= BATCH_EVENTS || self.pending_bytes >= BATCH_BYTES {
                    self.flush().await?;
                }
            }
            Read::Keepalive {
                wal_end,
                reply_requested,
            } => {
                if reply_requested {
                    self.send_status().await?;
                }
                // Only useful to an idle pipeline: a batch of keepalives alone never waits.
                self.pending.push(ReaderEvent::Keepalive { wal_end });
                if self.pending.len() >= BATCH_EVENTS {
                    self.flush().await?;
                }
            }
        }
        Ok(())
    }

    /// What one CopyData brought, taken in without waiting: decoded, assembled and counted.
    /// Apart from [`Task::handle`]'s waits, so that its future (moved on every message) holds
    /// only what lives across them.
    fn read(&mut self, data: bytes::Bytes) -> Result<Read, ReaderError> {
        match ReplicationMessage::decode(data)? {
            ReplicationMessage::XLogData(x) => {
                self.stats.xlog_messages.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .xlog_bytes
                    .fetch_add(x.data.len() as u64, Ordering::Relaxed);
                self.progress.on_received(x.wal_start);
                self.stats
                    .received_lsn
                    .store(self.progress.received().0, Ordering::Relaxed);
                self.stats
                    .server_wal_end
                    .store(x.wal_end.0, Ordering::Relaxed);
                let size = x.data.len();
                let msg = self.decoder.decode(x.data)?;
                if let crate::pgoutput::PgOutputMessage::Begin(b) = &msg {
                    self.stats
                        .source_delay
                        .observe(b.commit_time, x.server_time);
                }
                let event = self.assembler.push(x.wal_start, msg)?;
                if self.pacing {
                    // Every transaction's begin and commit come out as events.
                    let bound = match &event {
                        Some(OutboxEvent::Begin(_)) => Bound::Begin,
                        Some(OutboxEvent::Commit(_)) => Bound::Commit,
                        _ => Bound::Other,
                    };
                    self.pace
                        .message(self.woke, size + XLOG_DATA_OVERHEAD, bound);
                }
                self.sync_stats();
                Ok(match event {
                    Some(event) => Read::Event {
                        event,
                        size: size.max(1),
                    },
                    None => Read::Nothing,
                })
            }
            ReplicationMessage::PrimaryKeepalive(k) => {
                self.stats.keepalives.fetch_add(1, Ordering::Relaxed);
                self.pace.keepalive(KEEPALIVE_WIRE);
                self.stats
                    .server_wal_end
                    .store(k.wal_end.0, Ordering::Relaxed);
                self.progress.on_keepalive(k.wal_end, k.reply_requested);
                self.stats
                    .received_lsn
                    .store(self.progress.received().0, Ordering::Relaxed);
                Ok(Read::Keepalive {
                    wal_end: k.wal_end,
                    reply_requested: k.reply_requested,
                })
            }
        }
    }

    /// Hands the pending events to the pipeline as one batch, keeping the session alive while
    /// the pipeline applies backpressure (a full channel or an exhausted byte budget). A batch of
    /// keepalives alone is not waited for if the channel is full: its newest WAL end is owed, and
    /// goes first in the next batch, or alone once there is room ([`Task::stream`]).
    async fn flush(&mut self) -> Result<(), ReaderError> {
        if let Some(wal_end) = self.owed_keepalive.take() {
            self.pending.insert(0, ReaderEvent::Keepalive { wal_end });
        }
        if self.pending.is_empty() {
            return Ok(());
        }
        // The next batch starts with room for as many events as this one: a burst's batches
        // are each one allocation, not the eight of a vector grown by doubling to
        // `BATCH_EVENTS`; a live stream's are small.
        let room = self.pending.len();
        let events = std::mem::replace(&mut self.pending, Vec::with_capacity(room));
        let size = std::mem::take(&mut self.pending_bytes);
        if std::mem::take(&mut self.pending_rows) == 0 {
            return match self.tx.try_send(Batch {
                events,
                permit: None,
            }) {
                Err(mpsc::error::TrySendError::Closed(_)) => Err(ReaderError::Closed),
                Ok(()) => Ok(()),
                Err(mpsc::error::TrySendError::Full(batch)) => {
                    self.owed_keepalive = batch
                        .events
                        .iter()
                        .filter_map(|e| match e {
                            ReaderEvent::Keepalive { wal_end } => Some(*wal_end),
                            ReaderEvent::Outbox(_) => None,
                        })
                        .max();
                    Ok(())
                }
            };
        }
        let want = size.clamp(1, CHANNEL_BYTES) as u32;
        let permit = match self.budget.clone().try_acquire_many_owned(want) {
            Ok(p) => p,
            Err(_) => {
                let budget = self.budget.clone();
                let acquire = budget.acquire_many_owned(want);
                tokio::pin!(acquire);
                loop {
                    let due =
                        tokio::time::Instant::from_std(self.progress.next_due(Instant::now()));
                    tokio::select! {
                        biased;
                        p = &mut acquire => break p.map_err(|_| ReaderError::Closed)?,
                        changed = self.confirm.changed() => {
                            if changed.is_err() {
                                return Err(ReaderError::Closed);
                            }
                            self.take_confirmation()?;
                        }
                        _ = tokio::time::sleep_until(due) => self.send_status().await?,
                    }
                }
            }
        };
        let batch = Batch {
            events,
            permit: Some(permit),
        };
        let item = match self.tx.try_send(batch) {
            Ok(()) => return Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(ReaderError::Closed),
            Err(mpsc::error::TrySendError::Full(item)) => item,
        };
        // Backpressure: wait for room, answering the server meanwhile.
        let tx = self.tx.clone();
        loop {
            let due = tokio::time::Instant::from_std(self.progress.next_due(Instant::now()));
            tokio::select! {
                biased;
                slot = tx.reserve() => {
                    slot.map_err(|_| ReaderError::Closed)?.send(item);
                    return Ok(());
                }
                changed = self.confirm.changed() => {
                    if changed.is_err() {
                        return Err(ReaderError::Closed);
                    }
                    self.take_confirmation()?;
                }
                _ = tokio::time::sleep_until(due) => self.send_status().await?,
            }
        }
    }

    fn sync_stats(&self) {
        let s: &AssemblyStats = self.assembler.stats();
        self.stats
            .outbox_updates_skipped
            .store(s.outbox_updates, Ordering::Relaxed);
        self.stats
            .outbox_deletes_skipped
            .store(s.outbox_deletes, Ordering::Relaxed);
        self.stats
            .outbox_truncates_skipped
            .store(s.outbox_truncates, Ordering::Relaxed);
        self.stats
            .other_inserts_skipped
            .store(s.other_inserts, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(d: &SourceDelay) -> Vec<u64> {
        d.buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }

    #[test]
    fn a_source_delay_lands_in_the_first_bucket_whose_bound_it_does_not_exceed() {
        let d = SourceDelay::default();
        let commit = PgTimestamp(1_000_000_000);
        // Exactly on a bound: that bucket (bounds are inclusive, as Prometheus' `le`).
        d.observe(commit, PgTimestamp(commit.0 + 1_000));
        d.observe(commit, PgTimestamp(commit.0 + 1_001));
        d.observe(commit, PgTimestamp(commit.0 + 42_000));
        // Past the last bound: the overflow bucket.
        d.observe(commit, PgTimestamp(commit.0 + 61_000_000));
        // Sent "before" its commit (a clock stepped back): zero, not a huge unsigned value.
        d.observe(commit, PgTimestamp(commit.0 - 5));
        let mut want = vec![0u64; SOURCE_DELAY_BOUNDS_MICROS.len() + 1];
        want[0] = 2; // 1 ms and 0
        want[1] = 1; // 1.001 ms <= 2.5 ms
        want[7] = 1; // 42 ms <= 50 ms
        want[SOURCE_DELAY_BOUNDS_MICROS.len()] = 1;
        assert_eq!(counts(&d), want);
        assert_eq!(
            d.sum_micros.load(Ordering::Relaxed),
            1_000 + 1_001 + 42_000 + 61_000_000
        );
    }
}
