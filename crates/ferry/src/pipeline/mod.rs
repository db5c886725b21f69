//! The pipeline: slot → router → Kafka → confirmed LSN, supervised.
//!
//! [`run`] is what `ferry run` calls and what tests call with their own shutdown future. It runs
//! streaming *sessions* ([`session`]) one after another:
//!
//! - before the first session, and before the next one after a session ended with a Kafka
//!   error, the brokers are **probed** (`kafka_access::probe`) until one answers: no client
//!   exists meanwhile (a librdkafka client with a request waiting reconnects every ~11 ms), the
//!   cause and its fix are logged at WARN after every probe, and the probes back off like the
//!   sessions; a refused password or an untrusted CA, three probes in a row, is permanent;
//! - a session that ends with a **transient** error (Postgres restarted, network dropped, the
//!   brokers unreachable past the delivery timeout) is followed by a new one after a backoff;
//!   the new session resumes from the slot's `confirmed_flush_lsn`, so what was in flight is
//!   produced again (duplicates, never loss); the backoff doubles from one failed session to
//!   the next, and a session that worked starts it over ([`backoff`]);
//! - a slot streamed by another process makes this instance a **hot standby**: it waits for
//!   the streaming session's hand-over lock (`ferry_wal::slot::handover`), and polls every
//!   `postgres.standby_poll_interval` when no Ferry session holds one, then takes over;
//! - a **permanent** error (privileges, an invalidated slot, a record Kafka refuses, a routing
//!   error under `on_error = "fail"`, a row without a column the route reads under any
//!   `on_error`, a gap the start-time verdict found: a slot lost, moved or on another server,
//!   see `ferry_core::verdict`) ends `run` with that error: `ferry` exits non-zero and nothing
//!   past the failed record was confirmed. An `--accept-gap` holds until the progress record
//!   written after the accepted gap is acknowledged, across reconnects; then it is used up;
//! - the outbox table leaving the publication while a session streams (dropped and recreated,
//!   `ALTER PUBLICATION ... DROP TABLE`, even if added back since) means rows the stream never
//!   carried: the session drains and confirms what it streamed, then ends with a permanent
//!   error saying so (watched every lag sample; see `watch::watch_server`);
//! - the shutdown future ends the current session gracefully: stop reading, wait for in-flight
//!   deliveries (up to the drain timeout), confirm, send a final status update.
//!
//! Every session drains its in-flight records before it ends, whatever the reason: a record of
//! an earlier session can therefore never be appended after a replayed copy, which keeps
//! per-key order across reconnects.

mod ahead;
mod backoff;
pub mod binary;
mod driver;
mod error;
pub mod settings;
mod sink;
pub mod start;
pub mod transactional;
mod watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use error::PipelineError;
pub use settings::PipelineSettings;

use crate::producer::Producer;
use crate::progress_topic::Sighting;
use crate::telemetry::{Component, Metrics};
use driver::{Carry, Driver, Link, Producing};
use ferry_wal::slot::handover::Waited;

/// Runs sessions until `shutdown` resolves (Ok) or a permanent error (Err).
///
/// One supervision loop serves both delivery modes; only how a session gets its producer
/// differs. At-least-once keeps one producer (and the core's in-flight table) across sessions
/// until it fails fatally; exactly-once makes a transactional producer per session, once the
/// slot is its own (a standby must never fence the instance streaming), and any transaction
/// failure ends the session: the next one fences the old producer and starts over from what
/// Kafka holds (see [`transactional`]).
pub async fn run(
    settings: PipelineSettings,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PipelineError> {
    let settings = Arc::new(settings);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut producer: Option<(Producer, Link)> = None;
    // `--accept-gap`: good until the fresh progress record after the accepted gap is written.
    let mut acceptance = settings.acceptance;
    // What outlives a session: `--skip-event` / `--dead-letter-event` while armed (the machine
    // decides; a machine made for a new session takes it over), the tables taken out of the
    // publication whose rows still in the WAL are skipped, the progress topic's check.
    let mut carry = Carry {
        pass: settings.pass,
        tables_taken_out: Vec::new(),
        progress_topic: Sighting::Unsure,
        progress_topic_admin: None,
        // Opened while the brokers are probed and the producer made: connecting decides
        // nothing, and the SCRAM exchange and the backend's start took 30-180 ms of the cold
        // start when they came after them.
        early_sql: Some(tokio::spawn({
            let postgres = settings.postgres.clone();
            async move { ferry_wal::slot::connect_sql(&postgres).await }
        })),
        standby_sql: None,
        quiet_sql: false,
        transactions_probe: None,
        lived: backoff::Lived::default(),
        walsender: Default::default(),
        lock_holder: Default::default(),
    };
    let mut supervisor = Supervisor::new(&settings, &metrics);
    // No client before a broker answers: a waiting client reconnects every few milliseconds.
    let answered = supervisor.brokers_answer(shutdown.as_mut()).await;
    if !matches!(answered, Ok(true)) {
        if let Some(h) = carry.early_sql.take() {
            h.abort();
        }
    }
    if !answered? {
        tracing::info!("stopped before streaming began: nothing to drain");
        return Ok(());
    }
    tracing::debug!("start-up: a broker answered the probe");
    // A restart: the probe's answer showed the progress topic as it must be (ensure_topic's
    // own request would ask the same question again). A first start: the brokers do not know
    // the topic, and the first session creates it without asking again.
    carry.progress_topic = supervisor.progress_topic;
    carry.progress_topic_admin = supervisor.progress_topic_admin.take();
    // The probe saw the progress topic settled: the producer's warm-up may name it (a first
    // start's producer, made before the topic is created, asks for every topic).
    let topic_known = carry.progress_topic == Sighting::Settled;
    // Lives as long as the pipeline: every producer reports its topics to it.
    let topic_watch = crate::topics::TopicWatch::start(
        &settings.producer_properties,
        &settings.progress_topic,
        settings.create_topics.clone(),
        metrics.clone(),
    )
    .map_err(PipelineError::ProducerConfig)?;
    tracing::debug!("start-up: topic watch started");
    loop {
        // What a client said of the brokers before this session no longer speaks for it.
        crate::kafka_access::reset();
        let result = if settings.exactly_once.is_some() {
            let producing = Producing::Transactional(topic_watch.topics());
            Driver::new(&settings, &metrics, &mut acceptance, &mut carry)
                .run(producing, shutdown.as_mut())
                .await
        } else {
            if producer
                .as_ref()
                .is_some_and(|(p, _)| p.fatal_error().is_some())
            {
                carry.pass = producer.take().and_then(|(_, link)| link.pass());
            }
            let (p, mut link) = match producer.take() {
                Some(p) => p,
                None => Producer::new(
                    &settings.producer_properties,
                    topic_watch.topics(),
                    metrics.clone(),
                    topic_known.then_some(settings.progress_topic.as_str()),
                )
                .map(|(p, rx)| (p, Link::new(rx, &settings, carry.pass)))
                .map_err(PipelineError::ProducerConfig)
                .inspect(|_| tracing::debug!("start-up: producer created"))?,
            };
            let result = Driver::new(&settings, &metrics, &mut acceptance, &mut carry)
                .run(Producing::Idempotent(&p, &mut link), shutdown.as_mut())
                .await;
            carry.pass = link.pass();
            producer = Some((p, link));
            result
        };
        // Made for the first session's verdict only: kept through a backoff (PostgreSQL down
        // at a first start), an idle client would hold its connections, and report their
        // closing, for nothing.
        carry.progress_topic_admin = None;
        if matches!(result, Ok(driver::End::Shutdown)) {
            // Every report is in (the session drained), so this returns at once; it waits for
            // anything librdkafka itself still has to send. Blocking: off the runtime.
            if let Some((p, _)) = producer.take() {
                let _ = tokio::task::spawn_blocking(move || p.flush(Duration::from_secs(5))).await;
            }
            return Ok(());
        }
        if !supervisor
            .after(
                result,
                carry.lived,
                (&mut carry.standby_sql, &mut carry.quiet_sql),
                &carry.walsender,
                shutdown.as_mut(),
            )
            .await?
        {
            return Ok(());
        }
    }
}

/// What happens between sessions: the backoff after a transient error, the polling of a hot
/// standby, and the log lines and metrics that say which.
struct Supervisor<'a> {
    settings: &'a PipelineSettings,
    metrics: &'a Metrics,
    /// The wait after a transient error, and between the attempts that find no Kafka broker.
    backoff: backoff::Backoff,
    standing_by: bool,
    /// What the last answered probe showed of the progress topic; read once, when the first
    /// session starts (later probes, after a Kafka error, set it unread).
    progress_topic: Sighting,
    /// The first answered probe's admin client when it said the brokers do not know the
    /// progress topic ([`crate::progress_topic::Admin::ahead`]); read with `progress_topic`.
    progress_topic_admin: Option<crate::progress_topic::Admin>,
    /// Whether a probe has ended (later ones make no admin client: nothing would take it).
    answered: bool,
    /// How soon a standby tries the slot again while nobody holds its hand-over lock, when it
    /// has just begun to stand by or seen the holder's session end ([`Supervisor::stand_by`]).
    retry_soon: Option<Duration>,
    /// Whether the last wait for the hand-over lock found it held.
    lock_seen_held: bool,
    /// Whether a failed wait for the hand-over lock was said (once while standing by).
    wait_failed_said: bool,
}

/// How long a standby waits for the server's answer to one wait for the hand-over lock (a
/// step of at most 500 ms and five round trips) before it takes the connection for lost.
const WAIT_ANSWER: Duration = Duration::from_secs(10);

/// How long the end of this instance's own earlier walsender is waited for: it exits at once
/// unless it is stuck in the kernel.
const OWN_WALSENDER_EXIT: Duration = Duration::from_secs(5);

/// How soon a standby first tries the slot again while nobody holds its hand-over lock, doubling
/// up to the poll interval: the slot of an instance that just ended is held until its walsender
/// has noticed and exited, a few milliseconds (a restart after kill -9 meets it too).
const RETRY_SOON: Duration = Duration::from_millis(5);

impl<'a> Supervisor<'a> {
    fn new(settings: &'a PipelineSettings, metrics: &'a Metrics) -> Self {
        Supervisor {
            settings,
            metrics,
            backoff: backoff::Backoff::new(
                settings.reconnect_backoff_min,
                settings.reconnect_backoff_max,
            ),
            standing_by: false,
            progress_topic: Sighting::Unsure,
            progress_topic_admin: None,
            answered: false,
            retry_soon: None,
            lock_seen_held: false,
            wait_failed_said: false,
        }
    }

    /// Waits as a session's end asks; Ok(true) to start the next session, Ok(false) when
    /// `shutdown` resolved meanwhile, Err for a permanent error.
    ///
    /// `lived`: what the session did (one that worked starts the backoff over, see [`backoff`]).
    /// `kept`: the connection a standby keeps between polls, on which it waits for the
    /// slot's hand-over, or a quiet attempt opened (then flagged: [`Supervisor::retry`]).
    async fn after(
        &mut self,
        result: Result<driver::End, PipelineError>,
        lived: backoff::Lived,
        kept: Kept<'_>,
        own_walsender: &driver::OwnBackend,
        mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<bool, PipelineError> {
        let standby_sql = &mut *kept.0;
        let s = self.settings;
        if !matches!(&result, Err(e) if e.is_standby()) {
            // A standby's state ends with anything but the slot still in use.
            self.retry_soon = None;
            self.lock_seen_held = false;
            self.wait_failed_said = false;
        }
        if self.backoff.session_ended(lived, std::time::Instant::now()) {
            tracing::debug!("the session worked: the backoff starts over");
        }
        if lived.streaming_since.is_some() {
            // A standby that streamed took over (the driver said so, and cleared the gauge).
            self.standing_by = false;
        }
        match result {
            Ok(driver::End::Shutdown) => return Ok(false),
            Ok(driver::End::Streamed) => self.backoff.reset(),
            Err(e) if e.is_standby() => {
                if let (
                    PipelineError::Reader(ferry_wal::conn::ReaderError::SlotInUse { pid, .. }),
                    Some(sql),
                ) = (&e, standby_sql.as_ref())
                {
                    tokio::select! {
                        ended = self.end_own_walsender(*pid, sql, own_walsender) => if ended {
                            return Ok(true);
                        },
                        _ = shutdown.as_mut() => return Ok(false),
                    }
                }
                if !self.standing_by {
                    tracing::info!(slot = %s.stream.slot, "{e}; standing by");
                    self.retry_soon = Some(RETRY_SOON);
                }
                self.standing_by = true;
                self.metrics.standby.set_flag(true);
                return Ok(tokio::select! {
                    () = self.stand_by(standby_sql) => true,
                    _ = shutdown => false,
                });
            }
            Err(e) if e.is_transient() && e.component() == Component::Kafka => {
                // Why the brokers cannot be reached at all, if a client said (a refused
                // password, an untrusted certificate: permanent; see `kafka_access`).
                match crate::kafka_access::take() {
                    Some(d) if d.permanent => {
                        return Err(PipelineError::KafkaAccess(d.message));
                    }
                    Some(d) => {
                        tracing::warn!(error = %e, "Kafka: {}", d.message);
                    }
                    None => {}
                }
                if !self.retry(e, lived, kept, shutdown.as_mut()).await? {
                    return Ok(false);
                }
                return self.brokers_answer(shutdown).await;
            }
            Err(e) if e.is_transient() => {
                return self.retry(e, lived, kept, shutdown).await;
            }
            Err(e) => return Err(e),
        }
        Ok(true)
    }

    /// Whether the slot's holder, backend `pid`, was this instance's own walsender of an earlier
    /// session, and is now ended and gone. That walsender outlives a connection whose close
    /// never reached the server (a flow lost without a reset, a NAT or conntrack entry gone):
    /// until its `wal_sender_timeout` passes, or with none (0), until the server's TCP gives up
    /// on the connection, hours later, while this instance would stand by behind itself.
    async fn end_own_walsender(
        &self,
        pid: i32,
        sql: &tokio_postgres::Client,
        own: &driver::OwnBackend,
    ) -> bool {
        let own_one = || own.lock().unwrap_or_else(|p| p.into_inner());
        let Some(ours) = own_one().filter(|b| b.pid == pid) else {
            return false;
        };
        let slot = &self.settings.stream.slot;
        // Waited for until it exits (and lets the slot go), within the answer's bound.
        let end = ferry_wal::slot::end_backend(sql, &ours, OWN_WALSENDER_EXIT);
        match tokio::time::timeout(WAIT_ANSWER, end).await {
            Ok(Ok(Some(true))) => {
                *own_one() = None;
                tracing::info!(
                    slot = %slot,
                    pid,
                    "ended this instance's walsender of an earlier session, which still held the \
                     slot after its connection was lost"
                );
                true
            }
            // Gone meanwhile: the slot is free, or another process holds it under the same pid.
            Ok(Ok(None)) => {
                *own_one() = None;
                false
            }
            // Signalled, not yet gone: the standby's wait follows it.
            Ok(Ok(Some(false))) => false,
            Ok(Err(e)) => {
                tracing::warn!(
                    slot = %slot,
                    pid,
                    error = %e,
                    "this instance's walsender of an earlier session still holds the slot after its \
                     connection was lost, and could not be ended: standing by until the server \
                     ends it (wal_sender_timeout; with 0, when its TCP gives up); end it \
                     (SELECT pg_terminate_backend({pid}))"
                );
                *own_one() = None;
                false
            }
            Err(_) => false,
        }
    }

    /// The backoff after a transient error; Ok(false) when `shutdown` resolved meanwhile.
    ///
    /// A session that could not connect to PostgreSQL because the server is away
    /// (`lived.connected` false, [`PipelineError::is_server_away`]: restarting, failing over,
    /// in recovery, unreachable) is followed by quiet attempts to connect, every
    /// [`QUIET_PROBE_EVERY`] of the backoff, each cut off where the backoff ends: the first that
    /// connects ends the wait, and the next session starts on its connection (`kept`). So a
    /// server back is used within about a second, not up to `postgres.reconnect_backoff_max`
    /// later (30 s by default), while the log still says why once per backoff step. A server
    /// that refuses (a password, too many connections) is not asked more often than the
    /// backoff says; nor is one after a session that failed once connected: connecting would
    /// tell nothing about what failed.
    async fn retry(
        &mut self,
        e: PipelineError,
        lived: backoff::Lived,
        (kept, quiet): Kept<'_>,
        mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<bool, PipelineError> {
        let s = self.settings;
        self.metrics.reconnects.inc(e.component());
        let next = if s.exactly_once.is_some() {
            "starting over from the progress topic"
        } else {
            "reconnecting"
        };
        let wait = self.backoff.next();
        tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "session ended; {next}");
        self.backoff.took();
        // A standby whose session failed says so again if it finds the slot in use, and tries
        // it soon once the holder lets go, as when it began to stand by; it stays counted as
        // one meanwhile (it took nothing over).
        self.standing_by = false;
        if lived.connected || !e.is_server_away() {
            return Ok(!sleep_or_shutdown(wait, shutdown).await);
        }
        let until = tokio::time::Instant::now() + wait;
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if sleep_or_shutdown(left.min(QUIET_PROBE_EVERY), shutdown.as_mut()).await {
                return Ok(false);
            }
            if tokio::time::Instant::now() >= until {
                break;
            }
            // What a quiet attempt finds is said by the next session, if it lasts. An attempt
            // still waiting on a host that does not answer when the backoff ends is dropped:
            // the session connects on its own then.
            tokio::select! {
                connected = tokio::time::timeout_at(until, ferry_wal::slot::connect_sql(&s.postgres)) => {
                    if let Ok(Ok(client)) = connected {
                        tracing::debug!("PostgreSQL accepts a connection again");
                        *kept = Some(client);
                        *quiet = true;
                        break;
                    }
                }
                _ = shutdown.as_mut() => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Waits until a Kafka broker answers (`kafka_access::probe`), saying why none does at WARN
    /// after every attempt and backing off exponentially between attempts (the session
    /// backoff: `postgres.reconnect_backoff_min` doubling up to `_max`, so at most one line per
    /// attempt). Between two attempts it asks again quietly every [`QUIET_PROBE_EVERY`], so that
    /// a broker back is used within about a second, not up to `_max` later (30 s by default).
    /// Ok(false) when `shutdown` resolved meanwhile; Err when only causes retrying does not fix
    /// were found, [`crate::kafka_access::CONFIRMATIONS`] attempts in a row.
    async fn brokers_answer(
        &mut self,
        mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<bool, PipelineError> {
        let mut failed = false;
        // Attempts in a row that found only causes retrying does not fix (a refused password, an
        // untrusted CA): stop at `CONFIRMATIONS` of them (one broker in the middle of a
        // credential or certificate change may refuse once or twice).
        let mut refusals = 0;
        'attempts: loop {
            let unusable = match self.probe(shutdown.as_mut()).await {
                Probed::Answered => break,
                Probed::Shutdown => return Ok(false),
                Probed::Unusable(unusable) => unusable,
            };
            failed = true;
            if unusable.diagnoses.iter().all(|d| d.permanent) {
                refusals += 1;
                if refusals >= crate::kafka_access::CONFIRMATIONS {
                    return Err(PipelineError::KafkaAccess(unusable.to_string()));
                }
            } else {
                refusals = 0;
            }
            self.metrics.reconnects.inc(Component::Kafka);
            self.metrics.kafka_unusable.set(Some(unusable.to_string()));
            let wait = self.backoff.next();
            tracing::warn!(
                retry_in_ms = wait.as_millis() as u64,
                "the Kafka brokers cannot be used: {unusable}"
            );
            let next = tokio::time::Instant::now() + wait;
            self.backoff.took();
            loop {
                let left = next.saturating_duration_since(tokio::time::Instant::now());
                if sleep_or_shutdown(left.min(QUIET_PROBE_EVERY), shutdown.as_mut()).await {
                    return Ok(false);
                }
                if tokio::time::Instant::now() >= next {
                    continue 'attempts;
                }
                // What a quiet probe finds is said by the next attempt, if it lasts.
                match self.probe(shutdown.as_mut()).await {
                    Probed::Answered => break 'attempts,
                    Probed::Shutdown => return Ok(false),
                    Probed::Unusable(_) => {}
                }
            }
        }
        // Answered, or could not run: either way no later probe makes an admin client.
        self.answered = true;
        if failed {
            self.metrics.kafka_unusable.set(None);
            tracing::info!("a Kafka broker answers");
        }
        Ok(true)
    }

    /// One probe of the brokers, off the runtime. When a broker answers, what it showed of the
    /// progress topic is kept (and, at the first start, the admin client that creates it).
    async fn probe(&mut self, shutdown: std::pin::Pin<&mut impl Future<Output = ()>>) -> Probed {
        let props = self.settings.producer_properties.clone();
        let topic = self.settings.progress_topic.clone();
        let first = !self.answered;
        let probe = tokio::task::spawn_blocking(move || {
            let seen = crate::kafka_access::probe_seeing(
                &props,
                crate::kafka_access::PROBE_DEADLINE,
                Some(&topic),
            );
            // A first start creates the topic: its admin client connects meanwhile.
            let admin = match (&seen, first) {
                (Ok(Sighting::Absent), true) => crate::progress_topic::Admin::ahead(&props),
                _ => None,
            };
            (seen, admin)
        });
        tokio::select! {
            r = probe => match r {
                Ok((Err(unusable), _)) => Probed::Unusable(unusable),
                Ok((Ok(seen), admin)) => {
                    self.progress_topic = seen;
                    self.progress_topic_admin = admin;
                    Probed::Answered
                }
                // A probe that could not run says nothing: the session finds out.
                Err(_) => Probed::Answered,
            },
            _ = shutdown => Probed::Shutdown,
        }
    }

    /// A standby's wait for its next try of the slot: until the session holding the slot's
    /// hand-over lock ends, or the poll interval ran out (see `ferry_wal::slot::handover`).
    /// A lock seen held and then free counts as a release, whether it was let go during a wait
    /// or between two. Nobody holding the lock, the slot is tried again after [`RETRY_SOON`],
    /// doubling up to the poll interval, when this instance has just begun to stand by or the
    /// holder's session just ended (the ended instance's walsender may hold the slot a moment
    /// longer); otherwise at the poll interval.
    async fn stand_by(&mut self, kept: &mut Option<tokio_postgres::Client>) {
        let s = self.settings;
        let poll = s.standby_poll_interval;
        // (No deadline past a year: an interval that long is as good as none.)
        let until = tokio::time::Instant::now() + poll.min(Duration::from_secs(365 * 86_400));
        let waited = match kept.as_mut() {
            // The slot was taken between the verdict and START_REPLICATION: no connection kept.
            None => Ok(Waited::Unheld),
            Some(sql) => loop {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                // A server that vanished mid-wait would leave the wait unanswered until TCP
                // keepalive gave up, hours later: the answer is due within `WAIT_ANSWER`.
                let wait = ferry_wal::slot::handover::wait_for_release(sql, &s.stream.slot, left);
                let waited = match tokio::time::timeout(WAIT_ANSWER, wait).await {
                    Ok(waited) => waited.map_err(|e| (e.to_string(), sql.is_closed())),
                    // Its state unknown (an answer may still come): not used again.
                    Err(_) => Err((
                        format!(
                            "no answer from PostgreSQL within {} s",
                            WAIT_ANSWER.as_secs()
                        ),
                        true,
                    )),
                };
                match waited {
                    Ok(Waited::StillHeld) => {
                        self.lock_seen_held = true;
                        if left > ferry_wal::slot::handover::WAIT_STEP {
                            continue;
                        }
                        break Ok(Waited::StillHeld);
                    }
                    // Held at the last wait, free now: let go between the two.
                    Ok(Waited::Unheld) if self.lock_seen_held => break Ok(Waited::Released),
                    waited => break waited,
                }
            },
        };
        match waited {
            Ok(Waited::Released) => {
                tracing::debug!("the slot's holder ended its session: trying the slot");
                self.lock_seen_held = false;
                self.retry_soon = Some(RETRY_SOON);
            }
            Ok(Waited::StillHeld) => self.retry_soon = None,
            Ok(Waited::Unheld) => match self.retry_soon {
                Some(after) if after < poll => {
                    tokio::time::sleep(after).await;
                    self.retry_soon = Some(after * 2);
                }
                _ => {
                    self.retry_soon = None;
                    tokio::time::sleep(poll).await;
                }
            },
            Err((e, lost)) => {
                self.lock_seen_held = false;
                self.retry_soon = None;
                if lost {
                    // The next session opens a connection of its own, at once.
                    *kept = None;
                    tracing::info!(error = %e, "the standby's connection is lost: reconnecting");
                    return;
                }
                if !self.wait_failed_said {
                    self.wait_failed_said = true;
                    tracing::warn!(
                        error = %e,
                        poll_ms = poll.as_millis() as u64,
                        "waiting for the slot's hand-over lock failed, so a take-over waits for \
                         the next poll (postgres.standby_poll_interval); if the error names the \
                         language plpgsql, GRANT USAGE ON LANGUAGE plpgsql TO Ferry's role"
                    );
                }
                tokio::time::sleep(poll).await;
            }
        }
    }
}

/// The SQL connection carried to the next session, and whether a quiet attempt opened it
/// ([`driver::Carry::quiet_sql`]).
type Kept<'a> = (&'a mut Option<tokio_postgres::Client>, &'a mut bool);

/// Between two attempts of [`Supervisor::brokers_answer`], the brokers are asked again this
/// often, quietly: librdkafka's own reconnections are paced alike (`reconnect.backoff.max.ms`,
/// 1 s by default). PostgreSQL too, after a session that could not connect
/// ([`Supervisor::retry`]).
const QUIET_PROBE_EVERY: Duration = Duration::from_secs(1);

/// What one probe of the brokers found.
enum Probed {
    /// A broker answered (or the probe could not run: the session finds out).
    Answered,
    Unusable(crate::kafka_access::Unusable),
    Shutdown,
}

/// Sleeps for `d`; returns true if `shutdown` resolved first.
async fn sleep_or_shutdown(
    d: Duration,
    shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = shutdown => true,
    }
}

impl PipelineError {
    fn component(&self) -> Component {
        match self {
            PipelineError::Delivery { .. }
            | PipelineError::ProducerFatal(_)
            | PipelineError::NotAuthorized(_)
            | PipelineError::KafkaAccess(_)
            | PipelineError::ProgressTopic(_)
            | PipelineError::Transaction { .. }
            | PipelineError::Fenced { .. }
            | PipelineError::TransactionsUnsupported { .. } => Component::Kafka,
            _ => Component::Postgres,
        }
    }
}
