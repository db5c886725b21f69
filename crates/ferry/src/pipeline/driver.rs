//! One streaming session's driver: connect, start the session machine, then carry its actions
//! out until it says stop.
//!
//! Every decision (what to produce, what to confirm, when to write a progress record, when to
//! begin, commit or abort a Kafka transaction, when to read, when to stop) is the session
//! machine's ([`ferry_core::session`]). This loop only carries inputs to it (reader events,
//! delivery reports of records and progress records alike, the outcome of each transaction call,
//! the time, a shutdown) and its actions out, to the [`Sink`], the reader and the metrics.
//!
//! The loop prefers delivery reports over new WAL (`biased` select): acknowledgements free room
//! in the in-flight window and advance the confirmed LSN, so they are never starved by a fast
//! WAL stream. New events are read only while the machine wants them; when it does not (the
//! window is full, a drain began, a Kafka transaction is at its cap) the reader task's bounded
//! channel fills, it stops reading the socket, and the server stops sending. Memory therefore
//! stays bounded by the window however long Kafka is away and however large a transaction is.
//!
//! Before it touches the slot a session asks the start-time verdict ([`super::start`]) whether
//! streaming from it would hide lost events: it reads the slot, then the progress topic (in that
//! order: a Ferry streaming the slot meanwhile writes its record before it confirms, so the
//! record read after the slot is never behind it), and stops with a permanent error that names
//! the gap unless the operator accepted it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_core::pass::Pass;
use ferry_core::progress_record::ProgressKey;
use ferry_core::verdict::Acceptance;
use ferry_core::{
    CoreError, Count, DeliveryKey, RowOutcome, Session, SessionAction as Action, SessionConfig,
    SinkErrors, TransactionLimits,
};
use ferry_wal::assembly::SourceTable;
use ferry_wal::conn::{ReaderError, ReaderEvent, ReaderHandle};
use ferry_wal::slot;
use ferry_wal::slot::SlotSpec;
use rdkafka::error::KafkaError;

use super::ahead::{self, Ahead, Tables};
use super::backoff::Lived;
use super::binary::Mode;
use super::sink::Sink;
use super::start::transactions_probe;
use super::transactional::{self, Txn};
use super::watch::{watch_server, WalClock};
use super::{PipelineError, PipelineSettings};
use crate::producer::{self, Producer, Reports};
use crate::progress_topic::Sighting;
use crate::telemetry::repeats::Repeats;
use crate::telemetry::Metrics;
use crate::topics::Topics;

/// How long a session that ends with a Kafka transaction open waits for its abort.
pub(super) const END_ABORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Most delivery reports or WAL events handled in one wake-up of the session loop.
const BURST: usize = 512;

/// Longest interval between two metric publications of a session.
const PUBLISH_INTERVAL: Duration = Duration::from_secs(1);

/// What the session machine needs to know of Kafka's errors.
const KAFKA_ERRORS: SinkErrors<KafkaError> = SinkErrors {
    is_transient: producer::is_transient,
    abandoned: || KafkaError::Canceled,
};

/// How a session ended without error.
#[derive(Debug)]
pub(super) enum End {
    /// The shutdown future resolved; everything was drained and confirmed.
    Shutdown,
    /// Streaming stopped without an error (the server ended the stream cleanly).
    Streamed,
}

/// The session machine and the delivery reports it takes: they live as long as the producer
/// whose reports they are (at-least-once: across sessions, so that a late report finds its own
/// record in the in-flight table; exactly-once: one session).
pub(super) struct Link {
    rx: Reports,
    machine: Session<KafkaError>,
    /// The relay's per-table row counts as last added to the metrics.
    table_rows_seen: Vec<[u64; 4]>,
}

impl Link {
    /// `pass`: the one-shot pass still armed (`--skip-event`), carried from machine to machine.
    pub fn new(rx: Reports, s: &PipelineSettings, pass: Option<Pass>) -> Self {
        let config = SessionConfig {
            relay: ferry_core::RelayConfig {
                routers: s.routers.clone(),
                max_in_flight_records: s.max_in_flight_records as u64,
                max_in_flight_bytes: s.max_in_flight_bytes as u64,
                drain_timeout: s.drain_timeout,
                session_drain_timeout: s.session_drain_timeout,
                exactly_once: s.exactly_once.is_some(),
            },
            transactions: s.exactly_once.as_ref().map(|eo| TransactionLimits {
                interval: eo.interval,
                max_records: eo.max_records,
                max_bytes: eo.max_bytes,
            }),
            progress_topic: s.progress_topic.as_str().into(),
        };
        let mut machine = Session::with_errors(config, KAFKA_ERRORS);
        machine.set_pass(pass);
        Link {
            rx,
            machine,
            table_rows_seen: vec![[0; 4]; s.routers.len()],
        }
    }

    /// The one-shot pass still armed, for the machine of the next session.
    pub fn pass(&self) -> Option<Pass> {
        self.machine.pass()
    }
}

/// What outlives a session whatever the mode.
pub(super) struct Carry {
    /// `--skip-event` / `--dead-letter-event`, while armed (the machine decides).
    pub pass: Option<Pass>,
    /// Tables taken out of the publication while rows of theirs were still ahead in the WAL:
    /// the next sessions skip those rows ([`ferry_wal::assembly::OtherTables`]).
    pub tables_taken_out: Vec<SourceTable>,
    /// What is known of the progress topic: [`Sighting::Settled`] once found with one partition
    /// (by the broker probe, a session's verdict, or a standby's check); [`Sighting::Unsure`]
    /// after a verdict that created it (it may still be settling: the next session looks
    /// first); the probe's answer before the first session.
    pub progress_topic: Sighting,
    /// A first start's admin client for the progress topic's CreateTopics, made when the
    /// broker probe's answer said the brokers do not know the topic, so that it begins
    /// connecting while the first session reads the slot; taken by that session's verdict.
    pub progress_topic_admin: Option<crate::progress_topic::Admin>,
    /// The first session's SQL connection, opened while the brokers were probed and the
    /// producer made (it decides nothing); taken by that session.
    pub early_sql: Option<tokio::task::JoinHandle<Result<tokio_postgres::Client, ReaderError>>>,
    /// A standby's SQL connection, kept from one poll of the slot to the next: a poll is one
    /// query, not a new backend and an authentication, and a takeover starts on a connection
    /// already open. Also the connection a quiet attempt opened after a session could not
    /// connect (`Supervisor::retry`): the next session starts on it.
    pub standby_sql: Option<tokio_postgres::Client>,
    /// `standby_sql` was opened by a quiet attempt just now, not kept from before: the next
    /// session counts as connected at once ([`super::backoff::Lived::connected`]).
    pub quiet_sql: bool,
    /// Exactly-once: a standby's question whether the brokers serve transactions, kept from
    /// the poll that asked it, so that a take-over judges its answer rather than asking on its
    /// path. Asked again once older than [`PROBE_KEPT`].
    pub transactions_probe: Option<super::start::TransactionsProbe>,
    /// What the last session did that bears on the wait after it (set by each session).
    pub lived: Lived,
    /// The walsender of the last session that streamed (recorded by its server watch): a
    /// later session that finds the slot held by it ends it (`Supervisor::after`).
    pub walsender: OwnBackend,
    /// The SQL connection's backend of the last session that held the slot's hand-over lock:
    /// a later session that finds the lock held by it ends it ([`hold_handover_lock`]).
    pub lock_holder: OwnBackend,
}

/// A backend of this instance's last streaming session: its walsender, as the server watch
/// found it, or its SQL connection's, as it took the hand-over lock.
pub(super) type OwnBackend = Arc<std::sync::Mutex<Option<slot::Backend>>>;

/// How long a standby's answer on transactions is judged instead of asking again: brokers
/// do not lose the transaction APIs, and if they did, the transaction calls would fail
/// permanently anyway (the probe only says so first, and clearly).
pub(super) const PROBE_KEPT: Duration = Duration::from_secs(300);

/// What the session machine stopped with.
type Stopped = Result<ferry_core::End, CoreError<KafkaError>>;

pub(super) struct Driver<'a> {
    pub(super) settings: &'a PipelineSettings,
    pub(super) metrics: &'a Arc<Metrics>,
    pub(super) acceptance: &'a mut Acceptance,
    pub(super) carry: &'a mut Carry,
    status_updates_seen: u64,
    /// The reader's source delay counts (per bucket, then the sum in µs) already added to
    /// `ferry_source_delay_seconds`.
    source_delay_seen: [u64; ferry_wal::conn::SOURCE_DELAY_BOUNDS_MICROS.len() + 2],
    /// INSERTs into published tables Ferry does not relay: how many the last warning covered,
    /// and the warning's repeats.
    other_inserts_seen: u64,
    other_inserts_log: Repeats,
    /// The server's clock at sampled WAL positions, for the bound of an idle WAL end.
    wal_clock: WalClock,
    /// The session accepted a gap; the acceptance is used up by its first written record.
    accepting: bool,
    /// A transaction abort at the session's end found the producer fenced.
    fenced: Option<PipelineError>,
    /// A carried-out action waited for Kafka (a commit, an abort): the clock read before it
    /// is stale.
    waited: bool,
}

/// How a session gets its producer.
pub(super) enum Producing<'a, 'l> {
    /// At-least-once: the idempotent producer shared across sessions, and its link.
    Idempotent(&'a Producer, &'l mut Link),
    /// Exactly-once: a transactional producer made for the session, initialised once the slot
    /// is its own.
    Transactional(Topics),
}

/// A session's producer once its verdict is in: exactly-once's is being made
/// ([`Driver::make_transactional`]).
enum Made<'a, 'l> {
    Idempotent(&'a Producer, &'l mut Link),
    Transactional(tokio::task::JoinHandle<Result<transactional::Unready, PipelineError>>),
}

impl<'a> Driver<'a> {
    pub fn new(
        settings: &'a PipelineSettings,
        metrics: &'a Arc<Metrics>,
        acceptance: &'a mut Acceptance,
        carry: &'a mut Carry,
    ) -> Self {
        Driver {
            settings,
            metrics,
            acceptance,
            carry,
            status_updates_seen: 0,
            source_delay_seen: [0; ferry_wal::conn::SOURCE_DELAY_BOUNDS_MICROS.len() + 2],
            other_inserts_seen: 0,
            other_inserts_log: Repeats::default(),
            wal_clock: WalClock::default(),
            accepting: false,
            fenced: None,
            waited: false,
        }
    }

    pub async fn run(
        mut self,
        producing: Producing<'_, '_>,
        shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<End, PipelineError> {
        self.carry.lived = Lived::default();
        let result = self.stream(producing, shutdown).await;
        self.metrics.streaming.set_flag(false);
        result
    }

    async fn stream(
        &mut self,
        producing: Producing<'_, '_>,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<End, PipelineError> {
        let s = self.settings;
        // Nothing is produced before the stream starts, so a shutdown during the set-up (a
        // server slow to answer, a progress topic read waiting on a transaction) ends it at
        // once: there is nothing to drain or confirm.
        let (sql, mut start, ahead) = tokio::select! {
            r = self.prepare() => r?,
            _ = shutdown.as_mut() => {
                tracing::info!("stopped before streaming began: nothing to drain");
                return Ok(End::Shutdown);
            }
        };
        // An exactly-once session that created the slot: until its first record commits,
        // nothing remembers it (see `first_start_failed`).
        let created = s.exactly_once.is_some() && s.slot.create_slot && start.create_slot;
        // Exactly-once: the transactional producer is made now and connects to the brokers
        // while replication starts (~20 ms of a start); only `init_transactions`, which fences,
        // waits for the slot.
        let producing = match producing {
            Producing::Transactional(topics) => {
                Made::Transactional(self.make_transactional(topics, start.identity.system_id))
            }
            Producing::Idempotent(producer, link) => Made::Idempotent(producer, link),
        };
        let opened = tokio::select! {
            r = self.open(&sql, ahead) => r,
            _ = shutdown.as_mut() => {
                tracing::info!("stopped before streaming began: nothing to drain");
                self.drop_created_slot(&sql, created).await;
                return Ok(End::Shutdown);
            }
        };
        let (membership, binary_read, mut reader) = match opened {
            Ok(x) => x,
            Err(e) => {
                cancel_given_up(&e, &sql, s);
                return Err(self.first_start_failed(&sql, created, e).await);
            }
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
        self.accepting = start.accepted;
        let mut own_link;
        let (link, mut sink) = match producing {
            Made::Idempotent(producer, link) => {
                let sink = self.at_least_once(producer, link, &reader, binary_read, &start);
                (link, sink)
            }
            Made::Transactional(made) => {
                let started = tokio::select! {
                    r = self.exactly_once(made, &reader, binary_read, start.cursor.take()) => r,
                    // Honoured during the set-up too (init_transactions can take a while).
                    _ = shutdown.as_mut() => {
                        let _ = finish(reader).await;
                        self.drop_created_slot(&sql, created).await;
                        return Ok(End::Shutdown);
                    }
                };
                match started {
                    Ok((link, sink)) => {
                        own_link = link;
                        (&mut own_link, sink)
                    }
                    Err(e) => {
                        let _ = finish(reader).await;
                        return Err(self.first_start_failed(&sql, created, e).await);
                    }
                }
            }
        };
        let (left_tx, left_rx) = tokio::sync::oneshot::channel();
        let watch = self.streaming(&reader, &sql, membership, left_tx);
        let (stopped, watch_error) = self
            .stream_loop(link, &mut sink, &mut reader, left_rx, shutdown)
            .await;
        drop(watch);
        self.ended(stopped, watch_error, link, &sink, reader, &sql)
            .await
    }

    /// At-least-once: the machine starts from the slot and the record the verdict trusted;
    /// the shared idempotent producer is the sink.
    fn at_least_once<'p>(
        &self,
        producer: &'p Producer,
        link: &mut Link,
        reader: &ReaderHandle,
        binary_read: bool,
        start: &super::start::Start,
    ) -> Sink<'p>
    where
        'a: 'p,
    {
        let s = self.settings;
        link.machine.set_source(&source_of(reader, &s.stream.slot));
        link.machine.start_at_least_once(
            reader.resume_lsn,
            binary_read,
            start.remembered,
            Instant::now(),
        );
        Sink::Idempotent {
            producer,
            progress_topic: &s.progress_topic,
            key: ProgressKey {
                system_id: reader.system.system_id,
                slot: s.slot.slot.clone(),
            }
            .encode(),
            timeline: reader.system.timeline,
        }
    }

    /// The session streams: said, counted, and the server watched (see [`watch_server`]).
    fn streaming(
        &mut self,
        reader: &ReaderHandle,
        sql: &Arc<tokio_postgres::Client>,
        membership: Vec<Option<String>>,
        left_tx: tokio::sync::oneshot::Sender<PipelineError>,
    ) -> AbortOnDrop {
        let s = self.settings;
        if self.metrics.standby.get() != 0 {
            tracing::info!(slot = %s.stream.slot, "the slot is free: taking over from standby");
            self.metrics.standby.set_flag(false);
        }
        tracing::info!(slot = %s.stream.slot, lsn = %reader.resume_lsn, pid = reader.backend_pid, "streaming");
        self.metrics.streaming.set_flag(true);
        self.metrics.confirmed_lsn.set(reader.resume_lsn.0);
        self.carry.lived.streaming_since = Some(Instant::now());
        let watch = watch_server(
            sql.clone(),
            self.metrics.clone(),
            s.lag_sample_interval,
            super::watch::Asking {
                // The stream's: never below the server's wal_sender_timeout.
                within: reader.receive_timeout,
                postgres: s.postgres.clone(),
            },
            (s.slot.clone(), membership, left_tx),
            self.wal_clock.clone(),
            (reader.backend_pid, self.carry.walsender.clone()),
        );
        // Both end with the session (the task ends when its handle drops): the hand-over lock
        // is held while this session's SQL connection lasts, so that a standby waiting for it
        // takes over as soon as the connection closes (see `ferry_wal::slot::handover`).
        let hold = hold_handover_lock(
            sql.clone(),
            s.stream.slot.clone(),
            self.carry.lock_holder.clone(),
        );
        AbortOnDrop(tokio::spawn(async move {
            tokio::join!(hold, watch);
        }))
    }

    /// After the loop: the reader's outcome, and the session's result (the first failure wins).
    async fn ended(
        &mut self,
        stopped: Stopped,
        watch_error: Option<PipelineError>,
        link: &mut Link,
        sink: &Sink<'_>,
        reader: ReaderHandle,
        sql: &tokio_postgres::Client,
    ) -> Result<End, PipelineError> {
        let s = self.settings;
        self.carry.pass = link.machine.pass();
        self.publish_gauges(link, &reader);
        let reader_result = finish(reader).await;
        if let Some(fenced) = self.fenced.take() {
            return Err(fenced);
        }
        if let Some(e) = watch_error {
            // Drained and confirmed what was streamed; a drain failure is reported first.
            stopped.map_err(|e| pipeline_error(e, s, sink.txn()))?;
            return Err(e);
        }
        match stopped {
            Ok(ferry_core::End::Shutdown) => {
                tracing::info!(confirmed = %link.machine.relay().confirmed(), "drained and confirmed");
                Ok(End::Shutdown)
            }
            Ok(ferry_core::End::ReaderEnded) => match reader_result {
                Ok(()) => Ok(End::Streamed),
                Err(e) => Err(self.unrelayed(e, sql).await),
            },
            Err(e) => Err(self.named(pipeline_error(e, s, sink.txn()), sql).await),
        }
    }

    /// Connects, asks the start-time verdict, checks that the brokers serve transactions
    /// (exactly-once: asked beside the verdict, judged after it), and makes sure of the slot
    /// and publication.
    ///
    /// The verdict reads the slot, then creates or checks the progress topic (until a session
    /// found it; on a restart the broker probe's answer already showed it) and reads it, unless
    /// it created it.
    ///
    /// What the session reads after the verdict is read while the verdict reads the progress
    /// topic ([`super::ahead`]), and handed to [`Driver::open`].
    async fn prepare(
        &mut self,
    ) -> Result<(Arc<tokio_postgres::Client>, super::start::Start, Ahead), PipelineError> {
        let s = self.settings;
        let early = self.carry.early_sql.take();
        let kept = self.carry.standby_sql.take();
        // Exactly-once: whether the brokers serve transactions is asked beside the verdict (a
        // client of its own, 16–23 ms) and judged after it. A standby polling a slot that
        // something else holds keeps the question for its next polls, and asks again only
        // every PROBE_KEPT: its take-over judges an answer already in.
        let (probe, probe_kept) = match self.carry.transactions_probe.take() {
            _ if s.exactly_once.is_none() => (None, false),
            Some(probe) if probe.asked.elapsed() < PROBE_KEPT => (Some(probe), true),
            _ => (Some(transactions_probe(s)), false),
        };
        // The connection a standby kept, or the early one, if it is still good; otherwise a new
        // one (whose error is the one reported, as it always was).
        let reused = match (kept, early) {
            (Some(c), _) => Some(c),
            (None, Some(h)) => h.await.ok().and_then(Result::ok),
            (None, None) => None,
        };
        let (sql, kept) = match reused.filter(|c| !c.is_closed()) {
            Some(c) => (c, true),
            None => (slot::connect_sql(&s.postgres).await?, false),
        };
        // A connection kept from before (the early one, a standby's) counts once the server
        // answered on it: one that died while it waited (the server failed over, a load
        // balancer dropped the idle flow) fails the verdict's first read, and the wait after it
        // tries to connect every second, as after a failed connect, instead of waiting the
        // whole backoff. One a quiet attempt just opened counts at once.
        let quiet = std::mem::take(&mut self.carry.quiet_sql);
        self.carry.lived.connected = !kept || quiet;
        let sql = Arc::new(sql);
        tracing::debug!("start-up: SQL connection open");
        match self.prepare_on(&sql, probe, probe_kept).await {
            Ok((start, ahead)) => Ok((sql, start, ahead)),
            Err(e) => {
                cancel_given_up(&e, &sql, s);
                if e.is_standby() {
                    // Polled again on the same connection (the verdict's reads are all done).
                    self.carry.standby_sql = Arc::try_unwrap(sql).ok();
                }
                Err(e)
            }
        }
    }

    /// [`Driver::prepare`] on its SQL connection: the verdict, the transactions check, the slot
    /// and the publication.
    async fn prepare_on(
        &mut self,
        sql: &Arc<tokio_postgres::Client>,
        probe: Option<super::start::TransactionsProbe>,
        probe_kept: bool,
    ) -> Result<(super::start::Start, Ahead), PipelineError> {
        let s = self.settings;
        let verdict = self.verdict(sql, ahead::read(s, sql)).await;
        self.carry.lived.connected |= verdict.is_ok();
        let (start, mut ahead) = match verdict {
            Ok(started) => started,
            Err(e) => {
                if e.is_standby() {
                    self.carry.transactions_probe = probe;
                }
                return Err(e);
            }
        };
        tracing::debug!("start-up: verdict decided");
        // Before the slot is created or transactions initialised (issue 30).
        if let Some(probe) = probe {
            match probe.judge().await {
                // A kept question that got no answer (the brokers away then): asked again.
                Err(PipelineError::ProducerFatal(_)) if probe_kept => {
                    transactions_probe(s).judge().await?
                }
                judged => judged?,
            }
        }
        let spec = SlotSpec {
            create_slot: s.slot.create_slot && start.create_slot,
            ..s.slot.clone()
        };
        // Read again where it failed ahead: its error is reported as ensure's own.
        let survey = match ahead.survey.take() {
            Some(Ok(survey)) => survey,
            Some(Err(_)) | None => ahead::survey(sql, s)
                .await
                .map_err(slot::SetupError::from)?,
        };
        // Creating the publication or the slot may wait on other transactions: not bounded.
        slot::ensure_surveyed(sql, &spec, survey, s.stream.receive_timeout).await?;
        tracing::debug!("start-up: slot and publication ensured");
        Ok((start, ahead))
    }

    /// Starts replication: how the publication covers each table (watched while streaming),
    /// whether values stream in binary, and the reader.
    async fn open(
        &mut self,
        sql: &tokio_postgres::Client,
        ahead: Ahead,
    ) -> Result<(Vec<Option<String>>, bool, ReaderHandle), PipelineError> {
        let s = self.settings;
        let Tables {
            membership,
            mode,
            other_tables,
            oids,
            wal_sender_timeout,
        } = match ahead.tables {
            Some(Ok(tables)) => tables,
            // Read again: its error is reported as this read's own.
            Some(Err(_)) | None => ahead::tables(sql, s).await?,
        };
        let mut options = s.stream.clone();
        options.binary = mode == Mode::Binary;
        // ensure() refused tables the publication lists and no entry relays; one listed
        // later stops the stream at its first row (or the watch, whichever is first).
        options.source.other_tables = other_tables;
        options.source.other_tables.tables = self.carry.tables_taken_out.clone();
        options.source.oids = oids;
        options.receive_timeout =
            ferry_wal::feedback::receive_timeout(options.receive_timeout, wal_sender_timeout);
        match &mode {
            Mode::Binary => tracing::info!("values stream in pgoutput's binary mode"),
            Mode::Text(why) => tracing::info!("values stream as text: {why}"),
        }
        // A connection that failed ahead is tried again here, after the slot is read: a slot
        // another process took meanwhile is still SlotInUse (a standby), not the connection's
        // error (all WAL senders busy, say).
        let reader = match ahead.replication {
            Some(Ok(replication)) => ferry_wal::conn::start_on(replication, sql, options).await?,
            Some(Err(_)) | None => ferry_wal::conn::start(&s.postgres, sql, options).await?,
        };
        tracing::debug!("start-up: replication started");
        Ok((membership, mode == Mode::Binary, reader))
    }

    /// Exactly-once: makes the session's transactional producer (on the blocking pool: its
    /// client and threads) and sees the progress topic settled (a first start's verdict created
    /// it without waiting), beside each other and beside the replication's start. Nothing is
    /// fenced: a session that ends before its slot is its own drops the producer unused.
    fn make_transactional(
        &self,
        topics: Topics,
        system_id: u64,
    ) -> tokio::task::JoinHandle<Result<transactional::Unready, PipelineError>> {
        let s = self.settings;
        let Some(eo) = s.exactly_once.clone() else {
            unreachable!("an exactly-once session without exactly-once settings");
        };
        let properties = s.producer_properties.clone();
        let (slot, metrics) = (s.stream.slot.clone(), self.metrics.clone());
        let replication_factor = s.create_topics.replication_factor;
        tokio::spawn(async move {
            let made = tokio::task::spawn_blocking({
                let (eo, properties) = (eo.clone(), properties.clone());
                move || Txn::make(&eo, &properties, topics, system_id, &slot, metrics)
            });
            crate::progress_topic::ensure_topic(
                &properties,
                &eo.progress_topic,
                replication_factor,
                eo.call_timeout,
            )
            .await?;
            made.await
                .map_err(|e| {
                    PipelineError::ProducerFatal(format!("making the transactional producer: {e}"))
                })?
                .map_err(PipelineError::ProducerConfig)
        })
    }

    /// Exactly-once: the slot is ours; fence older producers, read what Kafka holds, and start
    /// the machine from it. A fresh slot's position is committed at once, in a transaction of
    /// its own, before anything streams.
    async fn exactly_once(
        &mut self,
        made: tokio::task::JoinHandle<Result<transactional::Unready, PipelineError>>,
        reader: &ReaderHandle,
        binary_read: bool,
        cursor: Option<crate::progress_topic::Cursor>,
    ) -> Result<(Link, Sink<'static>), PipelineError> {
        let s = self.settings;
        let Some(eo) = &s.exactly_once else {
            unreachable!("an exactly-once session without exactly-once settings");
        };
        let slot = &s.stream.slot;
        let unready = made.await.map_err(|e| {
            PipelineError::ProducerFatal(format!("making the transactional producer: {e}"))
        })??;
        let (txn, rx) = unready
            .init(
                eo,
                &s.producer_properties,
                reader.system,
                slot,
                self.metrics.clone(),
            )
            .await?;
        let remembered = txn
            .remembered(&s.producer_properties, reader.system, slot, cursor)
            .await?;
        // The start-time verdict compared the slot with what the progress topic held before
        // the slot was taken; this read follows the fencing, so a transaction a fenced producer
        // left open is decided. It takes up where the verdict's read ended.
        tracing::info!(
            remembered = remembered.as_ref().map(|r| r.position()),
            slot_lsn = %reader.resume_lsn,
            "exactly-once: resuming from the progress topic"
        );
        let fresh = remembered.is_none();
        let mut link = Link::new(rx, s, self.carry.pass);
        let mut sink = Sink::Transactional(txn);
        link.machine.set_source(&source_of(reader, slot));
        link.machine
            .start_exactly_once(reader.resume_lsn, binary_read, remembered, Instant::now());
        if let Some(Err(e)) = self.carry_out(&mut link, &mut sink, reader).await {
            return Err(pipeline_error(e, s, sink.txn()));
        }
        if fresh && self.accepting {
            *self.acceptance = Acceptance::default();
            self.accepting = false;
        }
        // A committed record remembers the slot now: `--initialize-progress` (or the
        // acceptance `first_start_failed` gave) is used up.
        self.acceptance.initialize_progress = false;
        Ok((link, sink))
    }

    /// Feeds the machine until it stops; returns what it stopped with, and the error the
    /// server watch raised, if it did (the publication changed, the SQL connection lost; the
    /// session then drained first).
    async fn stream_loop(
        &mut self,
        link: &mut Link,
        sink: &mut Sink<'_>,
        reader: &mut ReaderHandle,
        mut left_rx: tokio::sync::oneshot::Receiver<PipelineError>,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> (Stopped, Option<PipelineError>) {
        let mut watch_error = None;
        let mut watching = true;
        // Metrics are published after every wake-up; this one guarantees wake-ups while the
        // loop waits on nothing else (window full, Kafka away), so the reader's counters
        // (status updates sent, received LSN) stay current through an outage.
        let mut publish_tick = tokio::time::interval(PUBLISH_INTERVAL);
        publish_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Only so that the shutdown future is not polled again once it resolved.
        let mut shutdown_seen = false;
        let mut first_report = true;
        let mut stop = self.carry_out(link, sink, reader).await;
        while stop.is_none() {
            let wants_events = link.machine.wants_events();
            let deadline = link.machine.poll_timeout();
            tokio::select! {
                biased;
                Some(d) = link.rx.recv() => {
                    if first_report {
                        first_report = false;
                        tracing::debug!("start-up: the session's first delivery report");
                    }
                    let now = Instant::now();
                    link.machine.handle_report(DeliveryKey(d.key), d.result.map(drop), now);
                    // Every report already queued, in one wake-up.
                    for _ in 0..BURST {
                        match link.rx.try_recv() {
                            Some(d) => link.machine.handle_report(DeliveryKey(d.key), d.result.map(drop), now),
                            None => break,
                        }
                    }
                }
                _ = shutdown.as_mut(), if !shutdown_seen => {
                    shutdown_seen = true;
                    link.machine.shutdown(Instant::now());
                }
                ev = reader.recv(), if wants_events => match ev {
                    Some(ev) => {
                        stop = self.feed(link, sink, reader, ev).await;
                        // Reports that came meanwhile, served on this wake-up rather than on
                        // one of their own (see `producer::client`'s `Gather`).
                        sink.serve_waiting();
                    }
                    // The reader task ended: its outcome comes from finish().
                    None => link.machine.reader_ended(Instant::now()),
                },
                _ = sleep_until(deadline), if deadline.is_some() => {
                    link.machine.handle_timeout(Instant::now());
                }
                _ = publish_tick.tick() => {}
                r = &mut left_rx, if watching => {
                    watching = false;
                    if let Ok(e) = r {
                        if e.is_transient() {
                            // Said with the session's end.
                            tracing::info!("the session's SQL connection closed or does not answer: stopping after the records in flight");
                        } else {
                            tracing::error!(publication = %self.settings.slot.publication, "{e}: stopping after the records in flight");
                        }
                        watch_error = Some(e);
                        link.machine.shutdown(Instant::now());
                    }
                }
            }
            if stop.is_none() {
                stop = self.carry_out(link, sink, reader).await;
            }
            self.publish_gauges(link, reader);
        }
        // Stopping anyway: a lost SQL connection found during the drain (a database sidecar
        // stopped with the pod, say) is no reason to start another session.
        if shutdown_seen
            && watch_error
                .as_ref()
                .is_some_and(PipelineError::is_transient)
        {
            if let Some(e) = watch_error.take() {
                tracing::debug!(error = %e, "the SQL connection was lost while stopping");
            }
        }
        (
            stop.expect("the loop ends once the machine stopped"),
            watch_error,
        )
    }

    /// `ev` and the events already buffered, while the machine wants them, each carried out
    /// before the next is read.
    async fn feed(
        &mut self,
        link: &mut Link,
        sink: &mut Sink<'_>,
        reader: &mut ReaderHandle,
        ev: ReaderEvent,
    ) -> Option<Stopped> {
        let mut now = Instant::now();
        let mut next = Some(ev);
        let mut taken = 0;
        while let Some(ev) = next.take() {
            match ev {
                ReaderEvent::Keepalive { wal_end } => {
                    // What commits past an idle WAL end committed after the server's clock read
                    // at the newest WAL position sampled at or before it ([`slot::wal_clock`]).
                    let since = self
                        .wal_clock
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .iter()
                        .rev()
                        .find(|(lsn, _)| *lsn <= wal_end)
                        .map(|(_, t)| *t);
                    link.machine.handle_keepalive_at(wal_end, since, now);
                }
                ReaderEvent::Outbox(ev) => link.machine.handle_outbox(ev, now),
            }
            let stop = self.carry_out(link, sink, reader).await;
            if stop.is_some() {
                return stop;
            }
            if std::mem::take(&mut self.waited) {
                now = Instant::now();
            }
            taken += 1;
            if taken < BURST && link.machine.wants_events() {
                next = reader.try_recv();
            }
        }
        None
    }

    /// Carries out the machine's actions, each call's outcome fed back before the next action;
    /// returns what it stopped with, once it did.
    async fn carry_out(
        &mut self,
        link: &mut Link,
        sink: &mut Sink<'_>,
        reader: &ReaderHandle,
    ) -> Option<Stopped> {
        let machine = &mut link.machine;
        // The wall clock for the replication lag of the records made durable here: read once
        // per call, not once per record (the reports of one produce response arrive together).
        let mut now_unix_micros = None;
        while let Some(action) = machine.poll_action() {
            match action {
                Action::Produce { token, record } => {
                    if let Err(e) = sink.produce(token, &record) {
                        machine.handle_refused(token, e, Instant::now());
                    }
                }
                Action::ProduceProgress { token, position } => {
                    if let Err(e) = sink.produce_progress(token, position) {
                        machine.handle_refused(token, e, Instant::now());
                    }
                }
                Action::BeginTransaction => machine.handle_begun(sink.begin(), Instant::now()),
                Action::CommitTransaction { position, records } => {
                    self.waited = true;
                    let outcome = sink.commit(position, records).await;
                    machine.handle_commit(outcome, Instant::now());
                }
                Action::AbortTransaction { at_end: false, .. } => {
                    self.waited = true;
                    let result = sink.abort().await;
                    machine.handle_aborted(result, Instant::now());
                }
                Action::AbortTransaction { at_end: true, .. } => {
                    if let Err(fenced) = sink.end_open().await {
                        self.fenced = Some(fenced);
                    }
                }
                Action::Abandon => sink.abandon(),
                Action::Confirm(lsn) => {
                    reader.confirm(lsn);
                    self.metrics.confirmed_lsn.set(lsn.0);
                    if lsn > reader.resume_lsn {
                        self.carry.lived.confirmed_past_start = true;
                    }
                    if sink.txn().is_some() {
                        transactional::failpoint("confirmed");
                    }
                }
                Action::Count(c) => self.count(c, &mut now_unix_micros),
                Action::Stop(result) => return Some(*result),
            }
        }
        None
    }

    /// Counts `c`; `now_unix_micros` is the wall clock, read on first need and then reused.
    fn count(&mut self, c: Count, now_unix_micros: &mut Option<i64>) {
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
            Count::ProgressRecorded(lsn) => {
                m.progress_lsn.set(lsn.0);
                m.progress_failing.set_flag(false);
                if self.accepting {
                    // The gap is accepted for good: the new record is the position from now on.
                    *self.acceptance = Acceptance::default();
                    self.accepting = false;
                }
            }
            Count::ProgressFailed => {
                m.progress_write_errors.inc();
                m.progress_failing.set_flag(true);
            }
        }
    }

    /// Adds what the reader observed of the source delay since the last call to
    /// `ferry_source_delay_seconds` (the reader's counts start at zero with each session).
    fn sync_source_delay(&mut self, delay: &ferry_wal::conn::SourceDelay) {
        let mut now = [0u64; ferry_wal::conn::SOURCE_DELAY_BOUNDS_MICROS.len() + 2];
        for (n, b) in now.iter_mut().zip(&delay.buckets) {
            *n = b.load(Ordering::Relaxed);
        }
        now[now.len() - 1] = delay.sum_micros.load(Ordering::Relaxed);
        if now == self.source_delay_seen {
            return;
        }
        let mut delta = now;
        for (d, seen) in delta.iter_mut().zip(&self.source_delay_seen) {
            *d = d.saturating_sub(*seen);
        }
        let (counts, sum) = delta.split_at(delta.len() - 1);
        self.metrics.source_delay.add(counts, sum[0] as f64 / 1e6);
        self.source_delay_seen = now;
    }

    /// Gauges: the core's in-flight window, the reader's counters.
    fn publish_gauges(&mut self, link: &mut Link, reader: &ReaderHandle) {
        let tables = link
            .machine
            .relay()
            .table_rows()
            .iter()
            .zip(&mut link.table_rows_seen);
        for (table, (now, seen)) in tables.enumerate() {
            for (outcome, (n, s)) in RowOutcome::ALL.into_iter().zip(now.iter().zip(seen)) {
                if n > s {
                    self.metrics.outbox_rows.add(table, outcome, n - *s);
                    *s = *n;
                }
            }
        }
        let (records, bytes) = link.machine.relay().in_flight();
        self.metrics.in_flight_records.set(records);
        self.metrics.in_flight_bytes.set(bytes);
        let oldest = link.machine.oldest_in_flight();
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
        self.sync_source_delay(&reader.stats.source_delay);
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

    /// `e`, with what only the server can name: pgoutput's Relation names types by OID only.
    async fn named(&self, mut e: PipelineError, sql: &tokio_postgres::Client) -> PipelineError {
        if let PipelineError::TextNeeded {
            type_oid,
            type_name,
            ..
        } = &mut e
        {
            let name = ferry_wal::conn::answered(
                self.settings.stream.receive_timeout,
                "the read of a type's name",
                slot::format_type(sql, *type_oid),
            );
            if let Ok(name) = name.await {
                *type_name = name;
            }
        }
        e
    }
}

/// A set-up query given up on ([`ReaderError::Unanswered`]) still runs on the server: a
/// backend waiting on a lock waits on, and each session after it would add one. Cancelled,
/// best effort, in the background ([`slot::cancel_sql_soon`]); a query that was not on `sql` (the
/// replication connection's) leaves nothing to cancel there, and the request is ignored.
fn cancel_given_up(e: &PipelineError, sql: &tokio_postgres::Client, s: &PipelineSettings) {
    let unanswered = |e: &ReaderError| matches!(e, ReaderError::Unanswered { .. });
    let given_up = match e {
        PipelineError::Reader(e) => unanswered(e),
        PipelineError::Setup(slot::SetupError::Connection(e)) => unanswered(e),
        _ => false,
    };
    if given_up {
        slot::cancel_sql_soon(&s.postgres, sql.cancel_token());
    }
}

/// The pipeline's error for what the session machine stopped with.
fn pipeline_error(
    e: CoreError<KafkaError>,
    s: &PipelineSettings,
    txn: Option<&Txn>,
) -> PipelineError {
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
        CoreError::Transaction(error) => match txn {
            Some(txn) => txn.failure(error),
            None => PipelineError::Transaction { error },
        },
        CoreError::Aborted {
            error,
            topic,
            records,
            abort_error,
        } => match txn {
            Some(txn) => txn.aborted(error, topic.as_deref(), records, abort_error),
            None => PipelineError::Transaction { error },
        },
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

/// The `ferry-source` header's value for this session's records (`route.position_headers`):
/// the replication connection's `IDENTIFY_SYSTEM` (system identifier and timeline: a promoted
/// standby's new timeline shows in the next session's records) and the slot.
fn source_of(reader: &ReaderHandle, slot: &str) -> String {
    ferry_core::source_id(
        &reader.system.system_id.to_string(),
        reader.system.timeline,
        slot,
    )
}

/// How long the end of this instance's own earlier SQL backend is waited for: it exits at once
/// (it is idle, or waits on its client).
const OWN_LOCK_HOLDER_EXIT: Duration = Duration::from_secs(5);

/// Whether `slot`'s hand-over lock was held by `earlier`, this instance's SQL backend of an
/// earlier session, and it is now ended and gone (or gone by itself): `Some(true)`; `None`
/// when it could not be ended (said). The caller's task ends with the session, which bounds
/// the wait.
async fn end_own_lock_holder(
    sql: &tokio_postgres::Client,
    slot: &str,
    earlier: &slot::Backend,
) -> Option<bool> {
    match ferry_wal::slot::handover::holder(sql, slot).await {
        Ok(Some(pid)) if pid == earlier.pid => {}
        // Another process's, or let go meanwhile.
        Ok(_) => return Some(false),
        Err(e) => {
            tracing::debug!(error = %e, "the slot's hand-over lock's holder not read");
            return Some(false);
        }
    }
    match ferry_wal::slot::end_backend(sql, earlier, OWN_LOCK_HOLDER_EXIT).await {
        Ok(Some(true)) => {
            tracing::info!(
                slot = %slot,
                pid = earlier.pid,
                "ended this instance's SQL connection of an earlier session, which still held the \
                 slot's hand-over lock after its connection was lost"
            );
            Some(true)
        }
        // Gone by itself (the pid and start no longer match).
        Ok(None) => Some(true),
        // Signalled, not gone yet: asked again at the next try.
        Ok(Some(false)) => Some(false),
        Err(e) => {
            tracing::warn!(
                slot = %slot,
                pid = earlier.pid,
                error = %e,
                "this instance's SQL connection of an earlier session still holds the slot's \
                 hand-over lock after its connection was lost, and could not be ended: until the \
                 server notices it is gone, a standby takes over at its next poll; end it \
                 (SELECT pg_terminate_backend({}))",
                earlier.pid
            );
            None
        }
    }
}

/// A task that ends when this is dropped: the session's watch, and the hand-over lock's
/// holder, whose clone of the SQL connection would otherwise keep the lock past the session
/// (and every standby waiting).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Takes the slot's hand-over lock on the session's SQL connection, trying again (10 ms,
/// doubling up to a second) while another backend holds it: a standby's probe for a moment, or
/// an ended instance's backend until the server notices it is gone. Stops at the first error
/// (the connection is gone, and the lock with it).
///
/// A holder that is this instance's own SQL backend of an earlier session (`own`, recorded
/// here as each session takes the lock) is ended: its connection was lost without the server
/// noticing (a flow stranded by a lost NAT or conntrack entry), and it would hold the lock
/// until the server's TCP keepalive gave up on it, hours later (through a proxy, for good),
/// while a standby could only take over at its next poll.
async fn hold_handover_lock(sql: Arc<tokio_postgres::Client>, slot: String, own: OwnBackend) {
    const LONGEST: Duration = Duration::from_secs(1);
    let own_one = || own.lock().unwrap_or_else(|p| p.into_inner());
    let mut pause = Duration::from_millis(10);
    loop {
        match ferry_wal::slot::handover::hold(&sql, &slot).await {
            Ok(true) => {
                tracing::debug!("holding the slot's hand-over lock");
                // Unread (a role that may not see its own backend start): nothing to end later.
                let me = ferry_wal::slot::backend(&sql, None).await.ok().flatten();
                *own_one() = me;
                return;
            }
            Ok(false) => {
                let earlier = *own_one();
                if let Some(earlier) = earlier {
                    match end_own_lock_holder(&sql, &slot, &earlier).await {
                        Some(true) => {
                            *own_one() = None;
                            continue;
                        }
                        // Said once: not tried again.
                        None => *own_one() = None,
                        Some(false) => {}
                    }
                }
                // Said once: when the pauses have grown to their longest.
                let next = (pause * 2).min(LONGEST);
                if next == LONGEST && pause < LONGEST {
                    tracing::info!(
                        slot = %slot,
                        "another backend holds the slot's hand-over lock (an ended instance's, \
                         until the server notices it is gone): until it is free, a standby \
                         takes over at its next poll"
                    );
                }
                tokio::time::sleep(pause).await;
                pause = next;
            }
            Err(e) => {
                tracing::debug!(error = %e, "the slot's hand-over lock not taken");
                return;
            }
        }
    }
}
