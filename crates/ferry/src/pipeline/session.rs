//! One streaming session: connect, stream, route, produce, confirm, drain.
//!
//! The loop prefers delivery reports over new WAL (`biased` select): acknowledgements free room
//! in the in-flight window and advance the confirmed LSN, so they are never starved by a fast
//! WAL stream. New events are taken only while the window has room; when it is full the reader
//! task's bounded channel fills, it stops reading the socket, and the server stops sending.
//! Memory therefore stays bounded by the window however long Kafka is away and however large a
//! transaction is.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ferry_router::{ColumnRef, OnError, Record, RouteError};
use ferry_wal::assembly::{OutboxEvent, OutboxRow, RelationInfo};
use ferry_wal::conn::{ReaderEvent, ReaderHandle};
use ferry_wal::pgoutput::TupleValue;
use ferry_wal::{slot, Lsn};
use tokio::sync::mpsc;

use super::binary::{self, Mode};
use super::{PipelineError, PipelineSettings};
use crate::producer::{Delivery, Pending, Producer, SendError};
use crate::telemetry::{Metrics, RoutingErrorReason};
use ferry_core::watermark::{Token, Watermark};

/// Most delivery reports or WAL events handled in one wake-up of the session loop.
const BURST: usize = 512;
/// After the in-flight window filled up, reading resumes once it has drained to this fraction:
/// without the hysteresis, every acknowledgement would let exactly one record in, and the loop
/// would ping-pong with the producer one record at a time.
const WINDOW_RESUME_FRACTION: u64 = 2; // resume at half

/// Longest interval between two metric publications of a session.
const PUBLISH_INTERVAL: Duration = Duration::from_secs(1);

/// How a session ended without error.
#[derive(Debug)]
pub(super) enum End {
    /// The shutdown future resolved; everything was drained and confirmed.
    Shutdown,
    /// Streaming stopped without an error (the server ended the stream cleanly).
    Streamed,
}

/// A session's result, and the reports handed back for the next session.
pub(super) struct Outcome {
    pub result: Result<End, PipelineError>,
    pub reports: Reports,
}

/// The producer's delivery reports and what is kept per record until its report arrives. They
/// live as long as the producer, across sessions, so a report always finds its own record.
pub(super) struct Reports {
    rx: mpsc::Receiver<Delivery>,
    pending: Pending<InFlight>,
}

impl Reports {
    pub fn new(rx: mpsc::Receiver<Delivery>) -> Self {
        Reports {
            rx,
            pending: Pending::default(),
        }
    }
}

/// A record handed to the producer and not yet reported.
struct InFlight {
    token: Token,
    /// Commit time of the record's transaction, µs since the Unix epoch (for the lag metric).
    commit_unix_micros: i64,
    /// The record's topic (shared, not copied), for errors.
    topic: Arc<str>,
}

pub(super) struct Session<'a> {
    settings: &'a PipelineSettings,
    metrics: &'a Arc<Metrics>,
    producer: &'a Producer,
    reports: Reports,
}

/// The state of the current transaction while its rows stream through.
struct Current {
    commit_lsn: Lsn,
    commit_unix_micros: i64,
}

impl<'a> Session<'a> {
    pub fn new(
        settings: &'a PipelineSettings,
        metrics: &'a Arc<Metrics>,
        producer: &'a Producer,
        reports: Reports,
    ) -> Self {
        Session {
            settings,
            metrics,
            producer,
            reports,
        }
    }

    pub async fn run(mut self, shutdown: Pin<&mut impl Future<Output = ()>>) -> Outcome {
        let result = self.stream(shutdown).await;
        self.metrics.streaming.set_flag(false);
        Outcome {
            result,
            reports: self.reports,
        }
    }

    async fn stream(
        &mut self,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<End, PipelineError> {
        let s = self.settings;
        let sql = slot::connect_sql(&s.postgres).await?;
        let sql = Arc::new(sql);
        slot::ensure(&sql, &s.slot).await?;
        let read: Vec<String> = s.router.columns().into_iter().map(String::from).collect();
        let mode = binary::decide(&sql, s).await?;
        let mut options = s.stream.clone();
        options.binary = mode == Mode::Binary;
        match &mode {
            Mode::Binary => tracing::info!("values stream in pgoutput's binary mode"),
            Mode::Text(why) => tracing::info!("values stream as text: {why}"),
        }
        let mut reader = ferry_wal::conn::start(&s.postgres, &sql, options).await?;
        if self.metrics.standby.get() != 0 {
            tracing::info!(slot = %s.stream.slot, "the slot is free: taking over from standby");
            self.metrics.standby.set_flag(false);
        }
        tracing::info!(slot = %s.stream.slot, lsn = %reader.resume_lsn, pid = reader.backend_pid, "streaming");
        self.metrics.streaming.set_flag(true);
        self.metrics.confirmed_lsn.set(reader.resume_lsn.0);
        let lag = tokio::spawn(sample_lag(
            sql.clone(),
            self.metrics.clone(),
            s.lag_sample_interval,
        ));

        let mut run = Run {
            wm: Watermark::new(reader.resume_lsn),
            paused: false,
            current: None,
            confirmed: reader.resume_lsn,
            failure: None,
            stats_seen: 0,
            status_updates_seen: 0,
            begins: 0,
            binary: (mode == Mode::Binary).then_some(BinaryGuard {
                read,
                checked: None,
            }),
        };
        // Metrics are published after every wake-up; this one guarantees wake-ups while the
        // loop waits on nothing else (window full, Kafka away), so the reader's counters
        // (status updates sent, received LSN) stay current through an outage.
        let mut publish_tick = tokio::time::interval(PUBLISH_INTERVAL);
        publish_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut draining: Option<(Option<Instant>, bool)> = None; // (deadline, shutdown requested)
        let result = loop {
            let window_open = run.window_open(s);
            tokio::select! {
                biased;
                Some(d) = self.reports.rx.recv() => {
                    self.on_delivery(&mut run, d)?;
                    // Every report already queued, in one wake-up.
                    for _ in 0..BURST {
                        match self.reports.rx.try_recv() {
                            Ok(d) => self.on_delivery(&mut run, d)?,
                            Err(_) => break,
                        }
                    }
                }
                _ = shutdown.as_mut(), if !matches!(draining, Some((_, true))) => {
                    tracing::info!(in_flight = run.wm.in_flight_records(), "shutting down: draining in-flight records");
                    draining = Some((Some(Instant::now() + s.drain_timeout), true));
                }
                ev = reader.recv(), if window_open && draining.is_none() && run.failure.is_none() => match ev {
                    Some(ev) => {
                        // This event and those already buffered, while the window has room.
                        let mut next = Some(ev);
                        let mut taken = 0;
                        while let Some(ev) = next.take() {
                            if let Err(e) = self.on_event(&mut run, ev) {
                                run.failure = Some(e);
                                break;
                            }
                            taken += 1;
                            if taken < BURST && run.window_open(s) {
                                next = reader.try_recv();
                            }
                        }
                    }
                    // The reader task ended: its error comes from shutdown() below.
                    None => draining = Some((session_deadline(s), false)),
                },
                _ = tokio::time::sleep(Duration::from_millis(200)), if draining.is_some() => {}
                _ = publish_tick.tick() => {}
            }
            self.publish_progress(&mut run, &reader);
            if run.failure.is_some() && draining.is_none() {
                draining = Some((session_deadline(s), false));
            }
            if let Some((deadline, by_shutdown)) = draining {
                if run.wm.in_flight_records() == 0 {
                    break Ok(by_shutdown);
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break Err(PipelineError::DrainTimeout {
                        records: run.wm.in_flight_records(),
                    });
                }
            }
        };
        lag.abort();
        self.publish_progress(&mut run, &reader);
        let reader_result = finish(reader).await;
        if let Some(e) = run.failure {
            return Err(e);
        }
        let by_shutdown = result?;
        if by_shutdown {
            tracing::info!(confirmed = %run.confirmed, "drained and confirmed");
            return Ok(End::Shutdown);
        }
        reader_result?;
        Ok(End::Streamed)
    }

    fn on_event(&mut self, run: &mut Run, ev: ReaderEvent) -> Result<(), PipelineError> {
        match ev {
            ReaderEvent::Keepalive { wal_end } => {
                run.wm.idle_advance(wal_end);
            }
            ReaderEvent::Outbox(OutboxEvent::Begin(b)) => {
                run.wm.begin(b.commit_lsn)?;
                run.begins += 1;
                run.current = Some(Current {
                    commit_lsn: b.commit_lsn,
                    commit_unix_micros: b.commit_time.to_unix_micros().unwrap_or(0),
                });
                self.metrics.transactions_received.inc();
            }
            ReaderEvent::Outbox(OutboxEvent::Row(row)) => {
                if let Some(guard) = run.binary.as_mut() {
                    guard.check(&row.relation)?;
                }
                let cur = run
                    .current
                    .as_ref()
                    .expect("assembler emits Begin before rows");
                let routed = self
                    .settings
                    .router
                    .route_row(&WalRow(&row), cur.commit_unix_micros);
                let record = match routed {
                    Ok(r) => Some(r),
                    Err(e) => self.on_route_error(cur, e, |err| {
                        self.settings
                            .router
                            .dead_letter(&WalRow(&row), err, cur.commit_unix_micros)
                    })?,
                };
                if let Some(r) = record {
                    self.produce(run, r)?;
                }
            }
            ReaderEvent::Outbox(OutboxEvent::Message(m)) => {
                let cur = run
                    .current
                    .as_ref()
                    .expect("assembler emits Begin before messages");
                let routed = self
                    .settings
                    .router
                    .route_message(&m.content, cur.commit_unix_micros);
                let record = match routed {
                    Ok(r) => Some(r),
                    Err(e) => self.on_route_error(cur, e, |err| {
                        self.settings.router.dead_letter_message(
                            &m.content,
                            err,
                            cur.commit_unix_micros,
                        )
                    })?,
                };
                if let Some(r) = record {
                    self.produce(run, r)?;
                }
            }
            ReaderEvent::Outbox(OutboxEvent::Commit(c)) => {
                run.wm.commit(c.end_lsn)?;
                run.current = None;
            }
        }
        Ok(())
    }

    /// Applies `route.on_error` to a row that cannot be routed.
    fn on_route_error(
        &self,
        cur: &Current,
        error: RouteError,
        dead_letter: impl FnOnce(&RouteError) -> Option<Record>,
    ) -> Result<Option<Record>, PipelineError> {
        self.metrics.routing_errors.inc(reason_label(&error.reason));
        match self.settings.router.on_error() {
            OnError::Fail => Err(PipelineError::Route {
                error,
                commit_lsn: cur.commit_lsn,
            }),
            OnError::Skip => {
                tracing::warn!(lsn = %cur.commit_lsn, error = %error, "skipping an outbox event that cannot be routed (on_error = skip)");
                self.metrics.rows_skipped.inc();
                Ok(None)
            }
            OnError::DeadLetter => {
                let record = dead_letter(&error);
                tracing::warn!(lsn = %cur.commit_lsn, error = %error, topic = ?record.as_ref().map(|r| r.topic.clone()),
                    "sending an outbox event that cannot be routed to the dead-letter topic");
                self.metrics.rows_dead_lettered.inc();
                Ok(record)
            }
        }
    }

    fn produce(&mut self, run: &mut Run, record: Record) -> Result<(), PipelineError> {
        let token = run.wm.add_record(record.size_bytes())?;
        let cur = run
            .current
            .as_ref()
            .expect("records belong to a transaction");
        let key = self.reports.pending.insert(InFlight {
            token,
            commit_unix_micros: cur.commit_unix_micros,
            topic: record.topic.clone(),
        });
        match self.producer.send(&record, key) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.reports.pending.remove(key);
                run.wm.failed(token, "librdkafka refused the record")?;
                Err(match e {
                    // The settings keep librdkafka's queue larger than the in-flight window, so
                    // this means the properties were overridden: not a state to spin in.
                    SendError::QueueFull => PipelineError::delivery(
                        &record.topic,
                        rdkafka::error::KafkaError::MessageProduction(
                            rdkafka::types::RDKafkaErrorCode::QueueFull,
                        ),
                    ),
                    SendError::Refused(e) => PipelineError::delivery(&record.topic, e),
                })
            }
        }
    }

    fn on_delivery(&mut self, run: &mut Run, d: Delivery) -> Result<(), PipelineError> {
        let Some(meta) = self.reports.pending.remove(d.key) else {
            return Err(PipelineError::UnknownReport { key: d.key });
        };
        match d.result {
            Ok(_) => {
                run.wm.delivered(meta.token)?;
                self.metrics.records_produced.inc();
                self.metrics
                    .bytes_produced
                    .add(u64::from(meta.token.bytes()));
                if meta.commit_unix_micros > 0 {
                    let now = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map(|d| d.as_micros() as i64)
                        .unwrap_or(0);
                    let lag = (now - meta.commit_unix_micros).max(0) as f64 / 1e6;
                    self.metrics.observe_replication_lag(lag);
                }
            }
            Err(e) => {
                run.wm.failed(meta.token, e.to_string())?;
                self.metrics.delivery_errors.inc();
                tracing::error!(topic = %meta.topic, error = %e, "delivery failed; the confirmed LSN stops before this record");
                if run.failure.is_none() {
                    // Nothing queued behind the failed record may land before its replay.
                    self.producer.purge_queued();
                    run.failure = Some(PipelineError::delivery(&meta.topic, e));
                }
            }
        }
        Ok(())
    }

    fn publish_progress(&self, run: &mut Run, reader: &ReaderHandle) {
        let c = run.wm.confirmed();
        if c > run.confirmed {
            reader.confirm(c);
            run.confirmed = c;
            self.metrics.confirmed_lsn.set(c.0);
        }
        let closed = run.begins - run.wm.open_transactions() as u64;
        if closed > run.stats_seen {
            self.metrics
                .transactions_confirmed
                .add(closed - run.stats_seen);
            run.stats_seen = closed;
        }
        self.metrics
            .in_flight_records
            .set(run.wm.in_flight_records());
        self.metrics.in_flight_bytes.set(run.wm.in_flight_bytes());
        self.metrics
            .received_lsn
            .set(reader.stats.received_lsn.load(Ordering::Relaxed));
        let sent = reader.stats.status_updates.load(Ordering::Relaxed);
        if sent > run.status_updates_seen {
            self.metrics
                .status_updates_sent
                .add(sent - run.status_updates_seen);
            run.status_updates_seen = sent;
        }
    }
}

/// In binary mode: the columns the router reads, and the last relation layout found readable.
struct BinaryGuard {
    read: Vec<String>,
    checked: Option<Arc<RelationInfo>>,
}

impl BinaryGuard {
    /// Fails (transiently: the next session streams text) when a new layout of the outbox table
    /// gives a column the router reads a type it cannot render from binary. Each layout is
    /// checked once: rows share their relation's `Arc`.
    fn check(&mut self, relation: &Arc<RelationInfo>) -> Result<(), PipelineError> {
        if self
            .checked
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, relation))
        {
            return Ok(());
        }
        let read: Vec<&str> = self.read.iter().map(String::as_str).collect();
        let layout = relation.columns.iter().map(|c| (&c.name, c.type_oid));
        if let Some((column, type_oid)) = binary::unreadable(&read, layout) {
            return Err(PipelineError::TextNeeded { column, type_oid });
        }
        self.checked = Some(relation.clone());
        Ok(())
    }
}

struct Run {
    wm: Watermark,
    /// The in-flight window filled up and has not yet drained enough to read again.
    paused: bool,
    current: Option<Current>,
    confirmed: Lsn,
    failure: Option<PipelineError>,
    stats_seen: u64,
    status_updates_seen: u64,
    begins: u64,
    /// Set when the session streams binary values.
    binary: Option<BinaryGuard>,
}

impl Run {
    /// Whether the pipeline may take more WAL: the in-flight window (records and bytes) has
    /// room, with hysteresis (see [`WINDOW_RESUME_FRACTION`]).
    fn window_open(&mut self, s: &PipelineSettings) -> bool {
        let (records, bytes) = (self.wm.in_flight_records(), self.wm.in_flight_bytes());
        let (max_records, max_bytes) =
            (s.max_in_flight_records as u64, s.max_in_flight_bytes as u64);
        if self.paused {
            self.paused = records > max_records / WINDOW_RESUME_FRACTION
                || bytes > max_bytes / WINDOW_RESUME_FRACTION;
        } else {
            self.paused = records >= max_records || bytes >= max_bytes;
        }
        !self.paused
    }
}

fn reason_label(reason: &ferry_router::RouteErrorReason) -> RoutingErrorReason {
    use ferry_router::RouteErrorReason as R;
    match reason {
        R::MissingColumn { .. } => RoutingErrorReason::MissingColumn,
        R::NullValue { .. } => RoutingErrorReason::NullValue,
        R::NullPayload { .. } => RoutingErrorReason::NullPayload,
        R::InvalidValue { .. } => RoutingErrorReason::InvalidValue,
        R::InvalidTopic { .. } => RoutingErrorReason::InvalidTopic,
        R::PayloadTooLarge { .. } => RoutingErrorReason::PayloadTooLarge,
        R::InvalidMessage { .. } => RoutingErrorReason::InvalidMessage,
    }
}

/// When a session that is ending (not by shutdown) stops waiting for in-flight reports.
fn session_deadline(s: &PipelineSettings) -> Option<Instant> {
    s.session_drain_timeout
        .and_then(|t| Instant::now().checked_add(t))
}

/// Ends the reader: a final status update with the confirmed LSN, then its outcome.
async fn finish(reader: ReaderHandle) -> Result<(), PipelineError> {
    match reader.shutdown().await {
        Ok(()) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Samples `pg_current_wal_lsn()` for the WAL lag metric.
async fn sample_lag(sql: Arc<tokio_postgres::Client>, metrics: Arc<Metrics>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        if let Ok(lsn) = slot::current_wal_lsn(&sql).await {
            metrics.set_server_wal_lsn(lsn.0);
        }
    }
}

/// A decoded row, as the router reads it.
struct WalRow<'a>(&'a OutboxRow);

impl ferry_router::OutboxRow for WalRow<'_> {
    fn column(&self, name: &str) -> Option<ColumnRef<'_>> {
        let (type_oid, value) = self.0.get(name)?;
        let (value, binary): (Option<&Bytes>, bool) = match value {
            TupleValue::Null | TupleValue::UnchangedToast => (None, false),
            TupleValue::Text(b) => (Some(b), false),
            TupleValue::Binary(b) => (Some(b), true),
        };
        Some(ColumnRef {
            type_oid,
            value,
            binary,
        })
    }
}
