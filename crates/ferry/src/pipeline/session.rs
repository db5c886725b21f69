//! One streaming session: connect, then drive the relay core until it says stop.
//!
//! Every decision (what to produce, what to confirm, when to read, when to stop) is the relay
//! core's ([`ferry_core::relay`]); this loop only carries inputs to it and its actions out:
//! reader events and delivery reports in, records to the producer, confirmed LSNs to the reader
//! (which reports them as `flush_lsn`) and to the metric, counter changes to the metrics.
//!
//! The loop prefers delivery reports over new WAL (`biased` select): acknowledgements free room
//! in the in-flight window and advance the confirmed LSN, so they are never starved by a fast
//! WAL stream. New events are read only while the core wants them; when it does not (the window
//! is full, a drain began) the reader task's bounded channel fills, it stops reading the socket,
//! and the server stops sending. Memory therefore stays bounded by the window however long Kafka
//! is away and however large a transaction is.
//!
//! # Remembering, then confirming
//!
//! Before it touches the slot a session asks the start-time verdict ([`ferry_core::verdict`])
//! whether streaming from it would hide lost events: it reads the slot, then the progress topic
//! (in that order: a Ferry streaming the slot meanwhile writes its record before it confirms,
//! so the record read after the slot is never behind it), and stops with a permanent error that
//! names the gap unless the operator accepted it. While streaming, the core's confirmed LSN goes
//! to [`Remember`] first: a progress record is written (one in flight, one per 200 ms, and the
//! end of a burst 20 ms after its last record was acknowledged) and the reader reports only an
//! LSN whose record Kafka acknowledged. Progress records travel through the same idempotent
//! producer under one delivery-report key, [`PROGRESS_TOKEN`], outside the core's token space;
//! their reports never reach the core. A shutdown writes the last record before the final status
//! update.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_core::pass::Pass;
use ferry_core::progress::{self as record, ProgressKey, ProgressRecord};
use ferry_core::remember::Remember;
use ferry_core::verdict::{self, Acceptance, Notice, Refusal, SlotSeen, StartInput, Verdict};
use ferry_core::{Action, CoreError, Count, Relay, RelayConfig, RowOutcome, Sink, Token};
use ferry_wal::assembly::{AssemblyError, SourceTable};
use ferry_wal::conn::{ReaderError, ReaderEvent, ReaderHandle};
use ferry_wal::slot::SlotSpec;
use ferry_wal::{slot, Lsn};
use rdkafka::error::KafkaError;
use tokio::sync::mpsc;

use super::binary::{self, Mode};
use super::transactional::Txn;
use super::{PipelineError, PipelineSettings};
use crate::producer::{self, Delivered, Delivery, KafkaSink, Producer, Reports};
use crate::progress;
use crate::telemetry::repeats::Repeats;
use crate::telemetry::Metrics;
use crate::topics::Topics;

/// The delivery-report key of progress records: the core's tokens are slab indices from 0 up
/// to the in-flight window, so this one is never one of them.
pub(crate) const PROGRESS_TOKEN: usize = usize::MAX;

/// How long reading the progress topic, or creating it, may take at a session's start.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(30);

/// Set (to anything), sessions skip [`transactions_supported`]: the end-to-end tests use it to
/// reach the transaction calls of a broker without transactions. Nothing else reads it.
pub const SKIP_API_CHECK_ENV: &str = "FERRY_TEST_SKIP_API_CHECK";

/// How long asking the brokers for their API versions may take (exactly-once).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a failed first exactly-once start waits for its walsender to release the slot it
/// created, to drop it.
const SLOT_DROP_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a session that ended with an error waits for its last progress record.
const LAST_RECORD_AFTER_ERROR: Duration = Duration::from_secs(5);

/// How long a session that ends with a Kafka transaction open waits for its abort
/// (`Txn::end_open`).
const END_ABORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Least time between two WARN lines about failing progress records.
const PROGRESS_WARN_INTERVAL: Duration = Duration::from_secs(30);

/// Most delivery reports or WAL events handled in one wake-up of the session loop.
const BURST: usize = 512;

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

/// A session's result, and the core handed back for the next session.
pub(super) struct Outcome {
    pub result: Result<End, PipelineError>,
    pub core: Core,
}

/// The producer's delivery reports and the relay core. They live as long as the producer,
/// across sessions, so a report always finds its own record in the core's in-flight table.
pub(super) struct Core {
    rx: Reports,
    relay: Relay<KafkaError>,
    /// Progress records between the core's confirmations and the reader (see the module docs).
    remember: Remember,
    /// The progress topic was created or found with one partition.
    progress_topic_ready: bool,
    /// When failing progress records were last logged.
    progress_warned: Option<Instant>,
    /// The relay's per-table row counts as last added to the metrics.
    table_rows_seen: Vec<[u64; 4]>,
    /// Tables no entry relays that were taken out of the publication while rows of theirs were
    /// still ahead in the WAL: the next sessions skip those rows ([`ferry_wal::assembly::OtherTables`]).
    tables_taken_out: Vec<SourceTable>,
}

impl Core {
    /// `pass`: the one-shot pass still armed (`--skip-event`), and `tables_taken_out`, carried
    /// from core to core.
    pub fn new(
        rx: Reports,
        s: &PipelineSettings,
        pass: Option<Pass>,
        tables_taken_out: Vec<SourceTable>,
    ) -> Self {
        let mut relay = Relay::new(RelayConfig {
            routers: s.routers.clone(),
            max_in_flight_records: s.max_in_flight_records as u64,
            max_in_flight_bytes: s.max_in_flight_bytes as u64,
            drain_timeout: s.drain_timeout,
            session_drain_timeout: s.session_drain_timeout,
            exactly_once: s.exactly_once.is_some(),
        });
        relay.set_pass(pass);
        Core {
            rx,
            relay,
            remember: Remember::default(),
            progress_topic_ready: false,
            progress_warned: None,
            tables_taken_out,
            table_rows_seen: vec![[0; 4]; s.routers.len()],
        }
    }

    /// The one-shot pass still armed, for the core of the next session.
    pub fn pass(&self) -> Option<Pass> {
        self.relay.pass()
    }

    /// Tables taken out of the publication whose rows the next sessions skip, for the core of
    /// the next session.
    pub fn tables_taken_out(&self) -> Vec<SourceTable> {
        self.tables_taken_out.clone()
    }
}

/// What the verdict let a session do.
struct Start {
    /// The slot may be created (first start, or a lost slot the operator accepted).
    create_slot: bool,
    /// The progress record the slot was compared with; `None`: write a fresh one first.
    remembered: Option<Lsn>,
    identity: ferry_wal::conn::SystemIdentity,
    /// An accepted gap: the acceptance is used up once the fresh record is written.
    accepted: bool,
}

pub(super) struct Session<'a> {
    settings: &'a PipelineSettings,
    metrics: &'a Arc<Metrics>,
    /// The idempotent producer (at-least-once), shared across sessions.
    producer: Option<&'a Producer>,
    /// Exactly-once: this session's transactional producer, created once the slot is ours.
    txn: Option<Txn>,
    topics: Option<Topics>,
    core: Core,
    status_updates_seen: u64,
    /// INSERTs into published tables Ferry does not relay: how many the last warning covered,
    /// and the warning's repeats.
    other_inserts_seen: u64,
    /// The last LSN confirmed to the progress record's writer, with the core's bound on when
    /// later transactions committed ([`Relay::confirmed_since_micros`]).
    confirmed_since: (Lsn, Option<i64>),
    /// The server's clock at sampled WAL positions, for the bound of an idle WAL end.
    wal_clock: WalClock,
    other_inserts_log: Repeats,
    acceptance: &'a mut Acceptance,
    /// This session's progress key and timeline (from the streaming server's IDENTIFY_SYSTEM).
    progress_key: Vec<u8>,
    timeline: u32,
    /// The session accepted a gap; the acceptance is used up by its first written record.
    accepting: bool,
}

impl<'a> Session<'a> {
    pub fn new(
        settings: &'a PipelineSettings,
        metrics: &'a Arc<Metrics>,
        producer: &'a Producer,
        core: Core,
        acceptance: &'a mut Acceptance,
    ) -> Self {
        Session {
            settings,
            metrics,
            producer: Some(producer),
            txn: None,
            topics: None,
            core,
            status_updates_seen: 0,
            other_inserts_seen: 0,
            confirmed_since: (Lsn(0), None),
            wal_clock: WalClock::default(),
            other_inserts_log: Repeats::default(),
            acceptance,
            progress_key: Vec::new(),
            timeline: 0,
            accepting: false,
        }
    }

    /// An exactly-once session: its transactional producer (and core) are made once the slot
    /// is ours (see [`super::transactional`]).
    pub fn exactly_once(
        settings: &'a PipelineSettings,
        metrics: &'a Arc<Metrics>,
        topics: Topics,
        acceptance: &'a mut Acceptance,
        pass: Option<Pass>,
        tables_taken_out: Vec<SourceTable>,
    ) -> Self {
        let (_, rx) = mpsc::unbounded_channel();
        Session {
            settings,
            metrics,
            producer: None,
            txn: None,
            topics: Some(topics),
            core: Core::new(rx, settings, pass, tables_taken_out),
            status_updates_seen: 0,
            other_inserts_seen: 0,
            confirmed_since: (Lsn(0), None),
            wal_clock: WalClock::default(),
            other_inserts_log: Repeats::default(),
            acceptance,
            progress_key: Vec::new(),
            timeline: 0,
            accepting: false,
        }
    }

    pub async fn run(mut self, shutdown: Pin<&mut impl Future<Output = ()>>) -> Outcome {
        let result = self.stream(shutdown).await;
        self.metrics.streaming.set_flag(false);
        Outcome {
            result,
            core: self.core,
        }
    }

    async fn stream(
        &mut self,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<End, PipelineError> {
        let s = self.settings;
        // Nothing is produced before the stream starts, so a shutdown during the set-up (a
        // server slow to answer, a progress topic read waiting on a transaction) ends it at
        // once: there is nothing to drain or confirm.
        let prepared = async {
            let sql = slot::connect_sql(&s.postgres).await?;
            let sql = Arc::new(sql);
            let start = self.verdict(&sql).await?;
            if s.exactly_once.is_some() {
                // Before the slot is created or transactions initialised (issue 30).
                transactions_supported(s).await?;
            }
            let spec = SlotSpec {
                create_slot: s.slot.create_slot && start.create_slot,
                ..s.slot.clone()
            };
            slot::ensure(&sql, &spec).await?;
            Ok::<_, PipelineError>((sql, start))
        };
        let (sql, start) = tokio::select! {
            r = prepared => r?,
            _ = shutdown.as_mut() => {
                tracing::info!("stopped before streaming began: nothing to drain");
                return Ok(End::Shutdown);
            }
        };
        // An exactly-once session that created the slot: until its first record commits,
        // nothing remembers it (see `first_start_failed`).
        let created = s.exactly_once.is_some() && s.slot.create_slot && start.create_slot;
        let opened = async {
            // ensure() checked the publication covers the table; how it does is watched below.
            let membership = slot::publication_membership(&sql, &s.slot).await?;
            let mode = binary::decide(&sql, s).await?;
            let mut options = s.stream.clone();
            options.binary = mode == Mode::Binary;
            // ensure() refused tables the publication lists and no entry relays; one listed
            // later stops the stream at its first row (or the watch below, whichever is first).
            options.source.other_tables = slot::other_tables(&sql, &s.slot).await?;
            options.source.other_tables.tables = self.core.tables_taken_out.clone();
            options.source.oids = slot::outbox_oids(&sql, &s.slot).await?;
            match &mode {
                Mode::Binary => tracing::info!("values stream in pgoutput's binary mode"),
                Mode::Text(why) => tracing::info!("values stream as text: {why}"),
            }
            let reader = ferry_wal::conn::start(&s.postgres, &sql, options).await?;
            Ok::<_, PipelineError>((membership, mode, reader))
        };
        let opened = tokio::select! {
            r = opened => r,
            _ = shutdown.as_mut() => {
                tracing::info!("stopped before streaming began: nothing to drain");
                self.drop_created_slot(&sql, created).await;
                return Ok(End::Shutdown);
            }
        };
        let (membership, mode, reader) = match opened {
            Ok(x) => x,
            Err(e) => return Err(self.first_start_failed(&sql, created, e).await),
        };
        if reader.system.system_id != start.identity.system_id {
            let replication = reader.system.system_id;
            let _ = reader.shutdown().await;
            let e = PipelineError::TwoServers {
                sql: start.identity.system_id,
                replication,
            };
            return Err(self.first_start_failed(&sql, created, e).await);
        }
        let mut reader = reader;
        self.progress_key = ProgressKey {
            system_id: reader.system.system_id,
            slot: s.slot.slot.clone(),
        }
        .encode();
        self.timeline = reader.system.timeline;
        self.accepting = start.accepted;
        let binary_read = mode == Mode::Binary;
        match (&s.exactly_once, self.topics.clone()) {
            (Some(eo), Some(topics)) => {
                // The slot is ours: fence older producers, then read what Kafka holds.
                let started = async {
                    crate::progress::ensure_topic(
                        &s.producer_properties,
                        &eo.progress_topic,
                        s.create_topics.replication_factor,
                        eo.call_timeout,
                    )
                    .await?;
                    let (txn, rx) = Txn::start(
                        eo,
                        &s.producer_properties,
                        topics,
                        reader.system,
                        &s.stream.slot,
                        self.metrics.clone(),
                    )
                    .await?;
                    let remembered = txn
                        .remembered(&s.producer_properties, reader.system, &s.stream.slot)
                        .await?;
                    Ok::<_, PipelineError>((txn, rx, remembered))
                };
                // Shutdown is honoured during the set-up too (init_transactions can take a while).
                let started = tokio::select! {
                    r = started => r,
                    _ = shutdown.as_mut() => {
                        let _ = finish(reader).await;
                        self.drop_created_slot(&sql, created).await;
                        return Ok(End::Shutdown);
                    }
                };
                let (txn, rx, remembered) = match started {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = finish(reader).await;
                        return Err(self.first_start_failed(&sql, created, e).await);
                    }
                };
                // The start-time verdict (above, before the slot was taken) compared the slot
                // with what the progress topic held; this read follows the fencing, so a
                // transaction a fenced producer left open is decided.
                tracing::info!(
                    remembered = remembered.as_ref().map(|r| r.position()),
                    slot_lsn = %reader.resume_lsn,
                    "exactly-once: resuming from the progress topic"
                );
                let fresh = remembered.is_none();
                self.txn = Some(txn);
                self.core = Core::new(rx, s, self.core.pass(), self.core.tables_taken_out());
                self.core
                    .relay
                    .start_from(reader.resume_lsn, binary_read, remembered);
                if fresh {
                    // A slot just created (or a gap the operator accepted): its position is
                    // remembered at once, in a transaction of its own, so that a restart before
                    // the first event finds the slot and its record in step.
                    if let Some(txn) = self.txn.as_mut() {
                        let initial = txn.commit_position(
                            &mut self.core.relay,
                            ferry_core::Position {
                                end_lsn: reader.resume_lsn,
                                partial: None,
                                since_unix_micros: None,
                            },
                        );
                        if let Err(e) = initial.await {
                            let _ = finish(reader).await;
                            return Err(self.first_start_failed(&sql, created, e).await);
                        }
                    }
                    if self.accepting {
                        *self.acceptance = Acceptance::default();
                        self.accepting = false;
                    }
                }
                // A committed record remembers the slot now: `--initialize-progress` (or the
                // acceptance `first_start_failed` gave) is used up.
                self.acceptance.initialize_progress = false;
            }
            _ => {
                self.core
                    .remember
                    .start(reader.resume_lsn, start.remembered);
                self.core.relay.start(reader.resume_lsn, binary_read);
            }
        }
        if self.metrics.standby.get() != 0 {
            tracing::info!(slot = %s.stream.slot, "the slot is free: taking over from standby");
            self.metrics.standby.set_flag(false);
        }
        tracing::info!(slot = %s.stream.slot, lsn = %reader.resume_lsn, pid = reader.backend_pid, "streaming");
        self.metrics.streaming.set_flag(true);
        self.metrics.confirmed_lsn.set(reader.resume_lsn.0);
        let (left_tx, mut left_rx) = tokio::sync::oneshot::channel();
        let lag = tokio::spawn(watch_server(
            sql.clone(),
            self.metrics.clone(),
            s.lag_sample_interval,
            (s.slot.clone(), membership, left_tx),
            self.wal_clock.clone(),
        ));
        // Set once the outbox table left the publication: the session drains, then ends with it.
        let mut left_publication: Option<PipelineError> = None;
        let mut watching = true;

        // Metrics are published after every wake-up; this one guarantees wake-ups while the
        // loop waits on nothing else (window full, Kafka away), so the reader's counters
        // (status updates sent, received LSN) stay current through an outage.
        let mut publish_tick = tokio::time::interval(PUBLISH_INTERVAL);
        publish_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Only so that the shutdown future is not polled again once it resolved.
        let mut shutdown_seen = false;
        let stopped = loop {
            let mut stop = None;
            let wants_events = self.wants_events();
            let deadline = self.core.relay.poll_timeout();
            let next_record = self.core.remember.poll_timeout();
            let txn_deadline = self.txn.as_ref().and_then(Txn::deadline);
            tokio::select! {
                biased;
                Some(d) = self.core.rx.recv() => {
                    let now = Instant::now();
                    self.report(d, now);
                    // Every report already queued, in one wake-up.
                    for _ in 0..BURST {
                        match self.core.rx.try_recv() {
                            Ok(d) => self.report(d, now),
                            Err(_) => break,
                        }
                    }
                }
                _ = shutdown.as_mut(), if !shutdown_seen => {
                    shutdown_seen = true;
                    self.core.relay.shutdown(Instant::now());
                }
                ev = reader.recv(), if wants_events => match ev {
                    Some(ev) => {
                        // This event and those already buffered, while the core wants them.
                        let now = Instant::now();
                        let mut next = Some(ev);
                        let mut taken = 0;
                        while let Some(ev) = next.take() {
                            self.feed(ev, now);
                            stop = self.carry_out(&reader);
                            if stop.is_some() {
                                break;
                            }
                            taken += 1;
                            if taken < BURST && self.wants_events() {
                                next = reader.try_recv();
                            }
                        }
                    }
                    // The reader task ended: its outcome comes from finish() below.
                    None => self.core.relay.reader_ended(Instant::now()),
                },
                _ = sleep_until(deadline), if deadline.is_some() => {
                    self.core.relay.handle_timeout(Instant::now());
                }
                // The next progress record is due (its interval passed).
                _ = sleep_until(next_record), if next_record.is_some() => {}
                _ = sleep_until(txn_deadline), if txn_deadline.is_some() => {}
                _ = publish_tick.tick() => {}
                r = &mut left_rx, if watching => {
                    watching = false;
                    if let Ok(e) = r {
                        tracing::error!(publication = %s.slot.publication, "{e}: stopping after the records in flight");
                        left_publication = Some(e);
                        self.core.relay.shutdown(Instant::now());
                    }
                }
            }
            if stop.is_none() {
                stop = self.carry_out(&reader);
            }
            if self.txn.is_none() {
                self.remember(&reader, Instant::now());
            }
            if stop.is_none() {
                if let Some(txn) = self.txn.as_mut() {
                    if let Err(e) = txn.settle(&mut self.core.relay, Instant::now()).await {
                        lag.abort();
                        let _ = finish(reader).await;
                        return Err(e);
                    }
                    stop = self.carry_out(&reader);
                }
            }
            self.publish_gauges(&reader);
            if let Some(stop) = stop {
                break stop;
            }
        };
        lag.abort();
        if let Some(txn) = self.txn.as_mut() {
            if let Err(fenced) = txn.end_open(END_ABORT_TIMEOUT).await {
                let _ = finish(reader).await;
                return Err(fenced);
            }
        }
        // What the drain confirmed is remembered, then reported in the final status update: a
        // shutdown waits up to its drain timeout for that, a session that ends for another
        // reason briefly (its records are in Kafka; without the record they are produced
        // again on the next start, never lost).
        let graceful = matches!(stopped, Ok(ferry_core::End::Shutdown));
        let wait = match graceful {
            true => s.drain_timeout,
            false => s.drain_timeout.min(LAST_RECORD_AFTER_ERROR),
        };
        if self.txn.is_none() {
            self.remember_last(&reader, wait, graceful).await;
        }
        self.publish_gauges(&reader);
        let reader_result = finish(reader).await;
        if let Some(e) = left_publication {
            // Drained and confirmed what was streamed; a drain failure is reported first.
            stopped.map_err(|e| pipeline_error(e, s))?;
            return Err(e);
        }
        match stopped {
            Ok(ferry_core::End::Shutdown) => {
                tracing::info!(confirmed = %self.core.relay.confirmed(), "drained and confirmed");
                Ok(End::Shutdown)
            }
            Ok(ferry_core::End::ReaderEnded) => match reader_result {
                Ok(()) => Ok(End::Streamed),
                Err(e) => Err(self.unrelayed(e, &sql).await),
            },
            Err(e) => {
                let mut e = pipeline_error(e, s);
                if let PipelineError::TextNeeded {
                    type_oid,
                    type_name,
                    ..
                } = &mut e
                {
                    // pgoutput's Relation names types by OID only: ask for the name.
                    if let Ok(name) = slot::format_type(&sql, *type_oid).await {
                        *type_name = name;
                    }
                }
                Err(e)
            }
        }
    }

    /// The reader stopped at a row of a table the publication carries and no entry relays
    /// ([`AssemblyError::UnrelayedInsert`]). Still listed: the operator decides (relay it or take
    /// it out), a permanent error. Taken out since: the rows committed while it was in are
    /// skipped from now on, and the next session resumes. Any other error is returned as it is.
    async fn unrelayed(&mut self, e: PipelineError, sql: &tokio_postgres::Client) -> PipelineError {
        let PipelineError::Reader(ReaderError::Assembly(AssemblyError::UnrelayedInsert {
            xid,
            lsn,
            oid,
            namespace,
            name,
        })) = &e
        else {
            return e;
        };
        let s = self.settings;
        let table = format!(
            "{}.{}",
            slot::quote_ident(namespace),
            slot::quote_ident(name)
        );
        let at = format!("an INSERT of transaction {xid} at {lsn}");
        let standing = match slot::standing(sql, &s.slot, *oid).await {
            Ok(standing) => standing,
            // Asked again by the next session.
            Err(e) => return e.into(),
        };
        match standing {
            // Relayed, by oid, once the next session maps it (never skipped).
            slot::Standing::Outbox { now } => PipelineError::Remap {
                why: format!(
                    "rows of outbox table {now} arrive as {table}, the name or partition they were committed \
                     under ({at})"
                ),
            },
            slot::Standing::WholeSchema => PipelineError::Remap {
                why: format!(
                    "publication {:?} now covers the schema of table {table} wholesale ({at})",
                    s.slot.publication
                ),
            },
            slot::Standing::Listed { .. } => PipelineError::UnrelayedTable {
                publication: s.slot.publication.clone(),
                table,
                at: Some(at),
            },
            slot::Standing::Out => {
                tracing::warn!(
                    table = %table,
                    publication = %s.slot.publication,
                    "table {table}, which no entry relays, is no longer in publication {:?}, but rows committed \
                     while it was (the first at {at}) are still in the WAL: they are skipped, as taking it out asked",
                    s.slot.publication
                );
                self.core.tables_taken_out.push(SourceTable {
                    schema: namespace.clone(),
                    table: name.clone(),
                });
                PipelineError::Remap {
                    why: format!("skipping the rows of table {table}, which left the publication"),
                }
            }
        }
    }

    /// An exactly-once session failed between creating the slot (`created`) and committing its
    /// first progress record, before anything was produced: nothing remembers the slot, and the
    /// next start would refuse it as a used slot without a record (issue 30). So that it does
    /// not:
    /// - a transient failure leaves the slot to the next session of this process, which may
    ///   start from it (the acceptance `--initialize-progress` gives, used up by the first
    ///   record): this process made it and produced nothing from it;
    /// - a permanent one (brokers without transactions, a missing ACL) drops it, as does a
    ///   shutdown in that window: Ferry exits, and the next start, once the cause is fixed, is a
    ///   first start again. A fenced session keeps it (another Ferry took over);
    /// - a commit whose outcome is unknown is transient: kept, and the next session reads what
    ///   Kafka holds (a `kill -9` in that moment still needs `--initialize-progress`: README).
    async fn first_start_failed(
        &mut self,
        sql: &tokio_postgres::Client,
        created: bool,
        e: PipelineError,
    ) -> PipelineError {
        if !created || matches!(e, PipelineError::Fenced { .. }) {
            return e;
        }
        if e.is_transient() {
            self.acceptance.initialize_progress = true;
            return e;
        }
        self.drop_created_slot(sql, true).await;
        e
    }

    /// Drops the slot this session created (`created`) before any record remembered it; see
    /// [`Session::first_start_failed`].
    async fn drop_created_slot(&self, sql: &tokio_postgres::Client, created: bool) {
        if !created {
            return;
        }
        let name = &self.settings.slot.slot;
        match slot::drop_inactive(sql, name, SLOT_DROP_TIMEOUT).await {
            Ok(()) => tracing::warn!(
                slot = %name,
                "the first exactly-once start ended before its first progress record; dropped the slot it \
                 created, so that the next start is a first start again"
            ),
            Err(drop) => tracing::warn!(
                slot = %name,
                error = %drop,
                "the first exactly-once start ended before its first progress record, and the slot it created \
                 could not be dropped: drop it (SELECT pg_drop_replication_slot('{name}')) before the next start, \
                 or start once with `ferry run --initialize-progress`"
            ),
        }
    }

    /// The start-time verdict (see the module docs): may this session stream from the slot?
    async fn verdict(&mut self, sql: &tokio_postgres::Client) -> Result<Start, PipelineError> {
        let s = self.settings;
        let name = &s.slot.slot;
        // The slot first, then the progress topic (see the module docs for why this order).
        let state = slot::slot_state(sql, name).await?;
        if let Some(pid) = state.as_ref().and_then(|st| st.active_pid) {
            // Another process streams it (another Ferry, which keeps it and its record in step).
            return Err(ReaderError::SlotInUse {
                slot: name.clone(),
                pid,
            }
            .into());
        }
        let identity = slot::system_identity(sql).await?;
        let current_wal_lsn = match slot::in_recovery(sql).await? {
            true => None,
            false => Some(slot::current_wal_lsn(sql).await?),
        };
        if !self.core.progress_topic_ready {
            progress::ensure_topic(
                &s.producer_properties,
                &s.progress_topic,
                s.create_topics.replication_factor,
                PROGRESS_TIMEOUT,
            )
            .await?;
            self.core.progress_topic_ready = true;
        }
        let (properties, topic, slot_name) = (
            s.producer_properties.clone(),
            s.progress_topic.clone(),
            name.clone(),
        );
        let until = match s.exactly_once {
            Some(_) => progress::Until::Stable,
            None => progress::Until::End,
        };
        let history = tokio::task::spawn_blocking(move || {
            progress::read_slot(&properties, &topic, &slot_name, PROGRESS_TIMEOUT, until)
        })
        .await
        .map_err(|e| PipelineError::ProducerFatal(format!("reading the progress topic: {e}")))??;
        // The slot again: another Ferry starting at the same moment may have created it (and
        // written its first record) between the two reads, which would look like a lost slot.
        // A slot that changed while Ferry looked is judged on the next attempt.
        let again = slot::slot_state(sql, name).await?;
        if let Some(pid) = again.as_ref().and_then(|st| st.active_pid) {
            return Err(ReaderError::SlotInUse {
                slot: name.clone(),
                pid,
            }
            .into());
        }
        let position = |st: &Option<slot::SlotState>| {
            st.as_ref()
                .map(|st| (st.confirmed_flush_lsn, st.wal_status.clone()))
        };
        if position(&state) != position(&again) {
            return Err(PipelineError::SlotChanged { slot: name.clone() });
        }
        let remembered = history.remembered(identity.system_id);
        let seen = match &state {
            None => SlotSeen::Missing,
            Some(st) if st.wal_status.as_deref() == Some("lost") => SlotSeen::Invalidated {
                confirmed_flush_lsn: st.confirmed_flush_lsn,
            },
            Some(st) => SlotSeen::Present {
                confirmed_flush_lsn: st.confirmed_flush_lsn,
            },
        };
        let verdict = verdict::decide(&StartInput {
            slot_name: name,
            slot: seen,
            server: verdict::Server {
                system_id: identity.system_id,
                timeline: identity.timeline,
                current_wal_lsn,
            },
            remembered: &remembered,
            mode: match s.exactly_once {
                Some(_) => record::Mode::ExactlyOnce,
                None => record::Mode::AtLeastOnce,
            },
            acceptance: *self.acceptance,
        });
        let record_lsn = remembered.this_system.as_ref().map(|r| r.end_lsn);
        if let Some(r) = record_lsn {
            self.metrics.progress_lsn.set(r.0);
        }
        let start = |create_slot, remembered, accepted| Start {
            create_slot,
            remembered,
            identity,
            accepted,
        };
        match verdict {
            Verdict::CreateSlot => {
                tracing::info!(slot = %name, "first start: no progress record and no slot; the slot is created once the set-up checks pass");
                Ok(start(true, None, false))
            }
            Verdict::Stream {
                notice,
                fresh_record,
            } => {
                match notice {
                    Some(Notice::TimelineChanged { from, to }) => tracing::info!(
                        slot = %name,
                        from_timeline = from,
                        to_timeline = to,
                        "the server's timeline changed since the progress record (a promoted standby); the slot is not ahead of the record, continuing"
                    ),
                    Some(Notice::NoRecord { confirmed }) => tracing::warn!(
                        slot = %name,
                        lsn = %confirmed,
                        topic = %s.progress_topic,
                        "the slot exists but no progress record remembers it (created by hand, or used by a Ferry without progress records): \
                         continuing from the slot's position and writing progress records from now on"
                    ),
                    None => {}
                }
                Ok(start(
                    false,
                    (!fresh_record).then_some(record_lsn).flatten(),
                    false,
                ))
            }
            Verdict::Accepted { gap, create_slot } => {
                tracing::warn!(
                    slot = %name,
                    gap = gap.kind(),
                    remembered = gap.accept_with().map(tracing::field::display),
                    bytes = gap.bytes(),
                    "accepting a gap (--accept-gap): {gap}; continuing from {}",
                    if create_slot { "a new slot" } else { "the slot's position" }
                );
                Ok(start(create_slot, None, true))
            }
            Verdict::Refuse { gap, offered } => Err(PipelineError::Gap(Refusal {
                slot: name.clone(),
                gap,
                offered,
                replay_since: remembered.replay_since(),
            })),
        }
    }

    fn progress_report(&mut self, result: Result<Delivered, KafkaError>, now: Instant) {
        let lsn = self.core.remember.in_flight();
        match result {
            Ok(_) => {
                self.core.remember.acked(true, now);
                if let Some(lsn) = lsn {
                    self.metrics.progress_lsn.set(lsn.0);
                }
                if self.metrics.progress_failing.get() != 0 {
                    tracing::info!(topic = %self.settings.progress_topic, "progress records are written again; confirming resumes");
                    self.metrics.progress_failing.set_flag(false);
                    self.core.progress_warned = None;
                }
                if self.accepting {
                    // The gap is accepted for good: the new record is the position from now on.
                    *self.acceptance = Acceptance::default();
                    self.accepting = false;
                }
            }
            Err(e) => self.progress_failed(e, now),
        }
    }

    /// A progress record failed or was refused: confirming waits, visibly; a record Kafka will
    /// never take (not authorized, an invalid topic) ends the session like a failed outbox
    /// record.
    fn progress_failed(&mut self, e: KafkaError, now: Instant) {
        self.core.remember.acked(false, now);
        self.metrics.progress_write_errors.inc();
        self.metrics.progress_failing.set_flag(true);
        let topic = &self.settings.progress_topic;
        if !producer::is_transient(&e) {
            tracing::error!(%topic, error = %e, "Kafka refuses progress records");
            self.core.relay.handle_sink_error(e, now);
            return;
        }
        if self
            .core
            .progress_warned
            .is_none_or(|t| now.duration_since(t) >= PROGRESS_WARN_INTERVAL)
        {
            self.core.progress_warned = Some(now);
            tracing::warn!(
                %topic,
                error = %e,
                confirmed = %self.core.relay.confirmed(),
                remembered = self.core.remember.remembered().map(tracing::field::display),
                "cannot write the progress record: nothing is confirmed to PostgreSQL until one is written \
                 (the server keeps the WAL); retrying"
            );
        }
    }

    /// Writes the next progress record if one is due, and reports what an acknowledged record
    /// holds to the server.
    fn remember(&mut self, reader: &ReaderHandle, now: Instant) {
        let settled = self.core.relay.in_flight().0 == 0;
        self.core.remember.settled(settled, now);
        if let Some(lsn) = self.core.remember.poll_write(now) {
            let since = match self.confirmed_since {
                (at, since) if at == lsn => since.map(|t| t.div_euclid(1000)),
                _ => None,
            };
            let value = ProgressRecord {
                since_unix_millis: since,
                ..ProgressRecord::whole(
                    record::Mode::AtLeastOnce,
                    self.timeline,
                    lsn,
                    unix_millis(),
                )
            }
            .encode();
            let Some(producer) = self.producer else {
                return;
            };
            if let Err(e) = producer.send_progress(
                &self.settings.progress_topic,
                &self.progress_key,
                &value,
                PROGRESS_TOKEN,
            ) {
                let e = match e {
                    producer::SendError::QueueFull => {
                        KafkaError::MessageProduction(rdkafka::error::RDKafkaErrorCode::QueueFull)
                    }
                    producer::SendError::Refused(e) => e,
                };
                self.progress_failed(e, now);
            }
        }
        if let Some(lsn) = self.core.remember.poll_confirm() {
            reader.confirm(lsn);
            self.metrics.confirmed_lsn.set(lsn.0);
        }
    }

    /// After a graceful drain: the last progress record, then its LSN to the reader (whose
    /// final status update carries it), within the drain timeout.
    async fn remember_last(&mut self, reader: &ReaderHandle, wait: Duration, graceful: bool) {
        let deadline = Instant::now() + wait;
        loop {
            self.core.remember.hurry();
            self.remember(reader, Instant::now());
            if !self.core.remember.is_behind() {
                return;
            }
            if !graceful && self.core.remember.is_failing() {
                return;
            }
            let next = self
                .core
                .remember
                .poll_timeout()
                .unwrap_or(deadline)
                .min(deadline);
            tokio::select! {
                Some(d) = self.core.rx.recv() => self.report(d, Instant::now()),
                _ = sleep_until(Some(next)) => {}
            }
            if Instant::now() >= deadline && graceful {
                tracing::warn!(
                    topic = %self.settings.progress_topic,
                    confirmed = %self.core.relay.confirmed(),
                    "the last progress record was not acknowledged within the drain timeout; \
                     the slot stays at the last remembered position (what follows is produced again on the next start)"
                );
                return;
            }
            if Instant::now() >= deadline {
                return;
            }
        }
    }

    fn feed(&mut self, ev: ReaderEvent, now: Instant) {
        match ev {
            ReaderEvent::Keepalive { wal_end } => {
                // What commits past an idle WAL end committed after the server's clock read at
                // the newest WAL position sampled at or before it ([`slot::wal_clock`]).
                let since = self
                    .wal_clock
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .rev()
                    .find(|(lsn, _)| *lsn <= wal_end)
                    .map(|(_, t)| *t);
                self.core.relay.handle_keepalive_at(wal_end, since)
            }
            ReaderEvent::Outbox(ev) => self.core.relay.handle_outbox(ev, now),
        }
    }

    /// Whether to read more WAL: the core wants it, and no Kafka transaction is at its cap (it
    /// commits first, at the end of this wake-up).
    fn wants_events(&mut self) -> bool {
        self.core.relay.wants_events() && !self.txn.as_ref().is_some_and(Txn::full)
    }

    /// A delivery report: in exactly-once mode held by the transaction; else a progress
    /// record's goes to [`Remember`], every other to the core.
    fn report(&mut self, d: Delivery, now: Instant) {
        match self.txn.as_mut() {
            Some(txn) => txn.report(d),
            None if d.key == PROGRESS_TOKEN => self.progress_report(d.result, now),
            None => self
                .core
                .relay
                .handle_report(Token(d.key), d.result.map(drop), now),
        }
    }

    /// Carries out the core's actions; returns its verdict once it stopped.
    fn carry_out(
        &mut self,
        reader: &ReaderHandle,
    ) -> Option<Result<ferry_core::End, CoreError<KafkaError>>> {
        let mut stop = None;
        // The wall clock for the replication lag of the records made durable here: read once
        // per call, not once per record (the reports of one produce response arrive together).
        let mut now_unix_micros = None;
        while let Some(action) = self.core.relay.poll_action() {
            match action {
                Action::Produce { token, record } => {
                    let produced = match (self.txn.as_mut(), self.producer) {
                        (Some(txn), _) => txn.produce(token, &record),
                        (None, Some(p)) => KafkaSink(p).produce(token, &record),
                        (None, None) => Err(KafkaError::Canceled),
                    };
                    if let Err(e) = produced {
                        self.core.relay.handle_refused(token, e, Instant::now());
                    }
                }
                // Nothing to the idempotent sink; the transactional one ends its
                // transactions at positions.
                Action::CommitPoint { .. } => {}
                Action::Position(p) => {
                    if let Some(txn) = self.txn.as_mut() {
                        txn.position(p, Instant::now());
                    }
                }
                Action::Abandon => match (self.txn.as_mut(), self.producer) {
                    (Some(txn), _) => txn.poison(KafkaError::Canceled),
                    (None, Some(p)) => KafkaSink(p).abandon(),
                    (None, None) => {}
                },
                Action::Confirm(lsn) => {
                    self.confirm(reader, lsn);
                    if self.txn.is_some() {
                        super::transactional::failpoint("confirmed");
                    }
                }
                Action::Count(c) => self.count(c, &mut now_unix_micros),
                Action::Stop(result) => stop = Some(result),
            }
        }
        stop
    }

    /// The core confirmed `lsn`. At-least-once: it is remembered first (a progress record), and
    /// reported to the server once that record is acknowledged ([`Session::remember`]).
    /// Exactly-once: the Kafka transaction that made it durable held its progress record, so it
    /// goes to the server at once.
    fn confirm(&mut self, reader: &ReaderHandle, lsn: Lsn) {
        if self.txn.is_some() {
            reader.confirm(lsn);
            self.metrics.confirmed_lsn.set(lsn.0);
            self.metrics.progress_lsn.set(lsn.0);
        } else {
            self.core.remember.confirmed(lsn);
            self.confirmed_since = (lsn, self.core.relay.confirmed_since_micros());
        }
    }

    /// Counts `c`; `now_unix_micros` is the wall clock, read on first need and then reused.
    fn count(&self, c: Count, now_unix_micros: &mut Option<i64>) {
        let m = self.metrics;
        match c {
            Count::TransactionReceived => m.transactions_received.inc(),
            Count::TransactionsConfirmed(n) => m.transactions_confirmed.add(n),
            Count::RecordDurable {
                bytes,
                commit_unix_micros,
            } => {
                m.records_produced.inc();
                m.bytes_produced.add(u64::from(bytes));
                if commit_unix_micros > 0 {
                    let now = *now_unix_micros.get_or_insert_with(|| {
                        SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map(|d| d.as_micros() as i64)
                            .unwrap_or(0)
                    });
                    let lag = (now - commit_unix_micros).max(0) as f64 / 1e6;
                    m.observe_replication_lag(lag);
                }
            }
            Count::DeliveryFailed => m.delivery_errors.inc(),
            Count::RoutingError(kind) => m.routing_errors.inc(kind),
            Count::RowSkipped => m.rows_skipped.inc(),
            Count::RowDeadLettered => m.rows_dead_lettered.inc(),
            Count::TraceContextMalformed(problem) => m.trace_context_malformed.inc(problem),
        }
    }

    /// Gauges: the core's in-flight window, the reader's counters.
    fn publish_gauges(&mut self, reader: &ReaderHandle) {
        let core = &mut self.core;
        let tables = core
            .relay
            .table_rows()
            .iter()
            .zip(&mut core.table_rows_seen);
        for (table, (now, seen)) in tables.enumerate() {
            for (outcome, (n, s)) in RowOutcome::ALL.into_iter().zip(now.iter().zip(seen)) {
                if n > s {
                    self.metrics.outbox_rows.add(table, outcome, n - *s);
                    *s = *n;
                }
            }
        }
        let (records, bytes) = self.core.relay.in_flight();
        self.metrics.in_flight_records.set(records);
        self.metrics.in_flight_bytes.set(bytes);
        let oldest = self.core.relay.oldest_in_flight();
        self.metrics
            .in_flight_oldest
            .set(oldest.map(|o| (o.handed_at, o.commit_unix_micros)));
        self.metrics
            .received_lsn
            .set(reader.stats.received_lsn.load(Ordering::Relaxed));
        let sent = reader.stats.status_updates.load(Ordering::Relaxed);
        if sent > self.status_updates_seen {
            self.metrics
                .status_updates_sent
                .add(sent - self.status_updates_seen);
            self.status_updates_seen = sent;
        }
        // Rows of tables no entry relays reach here only by design: a publication FOR ALL
        // TABLES or FOR TABLES IN SCHEMA, or a table taken out of it (a table the publication
        // lists stops the reader). Said once, then at most once a repeats window.
        let other = reader.stats.other_inserts_skipped.load(Ordering::Relaxed);
        if other > self.other_inserts_seen
            && self
                .other_inserts_log
                .admit("other inserts", Instant::now())
                .is_some()
        {
            tracing::info!(
                skipped = other - self.other_inserts_seen,
                publication = %self.settings.slot.publication,
                "skipped rows inserted into tables that publication {:?} covers wholesale (FOR ALL TABLES or \
                 FOR TABLES IN SCHEMA) or no longer lists, and that no [outbox] or [[tables]] entry relays",
                self.settings.slot.publication
            );
            self.other_inserts_seen = other;
        }
    }
}

/// The pipeline's error for the core's verdict.
fn pipeline_error(e: CoreError<KafkaError>, s: &PipelineSettings) -> PipelineError {
    let (progress_topic, exactly_once) = (s.progress_topic.as_str(), s.exactly_once.is_some());
    match e {
        CoreError::Route {
            error,
            commit_lsn,
            event,
            lsn,
            table,
            pass,
        } => PipelineError::Route {
            error,
            at: ferry_core::pass::EventPosition { commit_lsn, event },
            lsn,
            // With one table there is nothing to tell apart.
            table: table
                .filter(|_| s.routers.len() > 1)
                .and_then(|i| Some((i, s.routers.get(i)?.table().to_string()))),
            dead_letter_topic: s
                .routers
                .get(table.unwrap_or(0))
                .and_then(|r| r.dead_letter_topic())
                .map(str::to_string),
            pass,
        },
        CoreError::Delivery { topic, error } => PipelineError::delivery(
            &topic,
            error,
            &*topic == progress_topic,
            &s.producer_properties,
        ),
        // At-least-once: a progress record failed outside an outbox record. Exactly-once: a
        // Kafka transaction failed (begin, commit, the progress record in it).
        CoreError::Sink(error) if exactly_once => PipelineError::Transaction { error },
        CoreError::Sink(error) => {
            PipelineError::delivery(progress_topic, error, true, &s.producer_properties)
        }
        CoreError::TextNeeded {
            column,
            type_oid,
            table,
        } => PipelineError::TextNeeded {
            column,
            type_oid,
            type_name: ferry_wal::slot::type_name(type_oid),
            table: s
                .routers
                .get(table)
                .map_or_else(|| format!("#{table}"), |r| r.table().to_string()),
        },
        CoreError::Bookkeeping(e) => PipelineError::Watermark(e),
        CoreError::UnknownReport { token } => PipelineError::UnknownReport { key: token.0 },
        CoreError::DrainTimeout { records } => PipelineError::DrainTimeout { records },
    }
}

fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Exactly-once: the brokers must serve Kafka transactions (issue 30; [`crate::broker_apis`]).
/// A broker that lacks them is a permanent error; brokers that do not answer a transient one
/// (no slot is created until they do); an answer Ferry cannot read is let through with a WARN
/// (the transaction calls themselves then fail permanently).
async fn transactions_supported(s: &PipelineSettings) -> Result<(), PipelineError> {
    use crate::broker_apis::Support;
    if std::env::var_os(SKIP_API_CHECK_ENV).is_some() {
        // Tests only: the backstop behind this check (`first_start_failed`) is tested alone.
        return Ok(());
    }
    let properties = s.producer_properties.clone();
    let started = Instant::now();
    let support =
        tokio::task::spawn_blocking(move || crate::txn_probe::probe(&properties, PROBE_TIMEOUT))
            .await
            .map_err(|e| {
                PipelineError::ProducerFatal(format!("asking the brokers for their APIs: {e}"))
            })?;
    match support {
        Ok(Support::Supported) => {
            tracing::info!(
                probe_ms = started.elapsed().as_millis() as u64,
                "exactly-once: the Kafka brokers serve the transaction APIs Ferry uses"
            );
            Ok(())
        }
        Ok(Support::Missing(missing)) => Err(PipelineError::TransactionsUnsupported {
            what: crate::broker_apis::describe(&missing),
        }),
        Ok(Support::Unknown) => {
            tracing::warn!(
                "exactly-once: could not read which APIs the Kafka brokers serve; assuming they support transactions"
            );
            Ok(())
        }
        Err(e) => Err(PipelineError::ProducerFatal(format!(
            "asking the Kafka brokers which APIs they serve: {e}"
        ))),
    }
}

/// Sleeps until `deadline` (for ever without one; the select arm is disabled then anyway).
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Ends the reader: a final status update with the confirmed LSN, then its outcome.
async fn finish(reader: ReaderHandle) -> Result<(), PipelineError> {
    match reader.shutdown().await {
        Ok(()) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The server's clock sampled with its WAL position ([`slot::wal_clock`]), newest last.
type WalClock = Arc<std::sync::Mutex<std::collections::VecDeque<(Lsn, i64)>>>;

/// Samples kept: a minute's at the default lag sample interval.
const WAL_CLOCK_SAMPLES: usize = 12;

/// What [`watch_server`] watches the publication with: the tables' spec, how the publication
/// covered each when the session started, and where to say which table's coverage changed, and
/// how ([`PipelineError::PublicationChanged`]), or which table it lists that no entry relays
/// ([`PipelineError::UnrelayedTable`]).
type MembershipWatch = (
    slot::SlotSpec,
    Vec<Option<String>>,
    tokio::sync::oneshot::Sender<PipelineError>,
);

/// Samples `pg_current_wal_lsn()` for the WAL lag metric, warns when the role loses the
/// REPLICATION attribute (before the next connection fails on it), and watches that the publication
/// still covers the outbox table as it did when the session started
/// ([`slot::publication_membership`]): a table dropped and recreated, or taken out of the
/// publication (and perhaps added back), means rows the stream never carried, which must stop
/// Ferry rather than pass unnoticed. A failed query is skipped (the replication connection
/// reports a lost server).
async fn watch_server(
    sql: Arc<tokio_postgres::Client>,
    metrics: Arc<Metrics>,
    every: Duration,
    (spec, membership, left): MembershipWatch,
    wal_clock: WalClock,
) {
    let mut left = Some(left);
    let mut could_replicate = true;
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        // On a standby there is no current WAL position (and no clock sample).
        if let Ok((lsn, micros)) = slot::wal_clock(&sql).await {
            metrics.set_server_wal_lsn(lsn.0);
            let mut samples = wal_clock.lock().unwrap_or_else(|p| p.into_inner());
            if samples.len() == WAL_CLOCK_SAMPLES {
                samples.pop_front();
            }
            samples.push_back((lsn, micros));
        }
        // Said once per loss: streaming goes on, but the next connection will be refused.
        if let Ok((role, can)) = slot::replication_privilege(&sql).await {
            if could_replicate && !can {
                tracing::warn!(
                    role = %role,
                    "role {role:?} no longer has the REPLICATION attribute: this session streams on, but the \
                     next connection (a restart, a network cut) will be refused and Ferry will stop; run \
                     ALTER ROLE {} WITH REPLICATION as a superuser (on Amazon RDS: GRANT rds_replication TO {})",
                    slot::quote_ident(&role),
                    slot::quote_ident(&role)
                );
            }
            could_replicate = can;
        }
        if left.is_none() {
            continue;
        }
        let Ok(now) = slot::publication_membership(&sql, &spec).await else {
            continue;
        };
        let changed = spec
            .tables
            .iter()
            .zip(now.iter().zip(&membership))
            .find(|(_, (now, then))| now != then);
        if let Some((table, (now, _))) = changed {
            let what = match now {
                None => "it is no longer in the publication (dropped, or ALTER PUBLICATION ... DROP TABLE)".to_string(),
                Some(_) => "it is in the publication again, but was dropped and recreated or taken out and added back since the session started".to_string(),
            };
            if let Some(tx) = left.take() {
                let _ = tx.send(PipelineError::PublicationChanged {
                    publication: spec.publication.clone(),
                    table: table.qualified(),
                    what,
                });
            }
            continue;
        }
        // A table listed since the start that no entry relays: its first row would stop the
        // reader; this says so as soon as it is listed, rows or not.
        if let Ok(Some(table)) = slot::unrelayed_tables(&sql, &spec)
            .await
            .map(|t| t.into_iter().next())
        {
            if let Some(tx) = left.take() {
                let _ = tx.send(PipelineError::UnrelayedTable {
                    publication: spec.publication.clone(),
                    table,
                    at: None,
                });
            }
        }
    }
}
