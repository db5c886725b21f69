//! The transactional sink: exactly-once delivery into Kafka (issue 11; `kafka.exactly_once`).
//!
//! The position travels inside the Kafka transaction. A session in exactly-once mode:
//!
//! 1. starts replication (the slot is free: a standby never gets here, so it never fences the
//!    instance streaming), then creates a producer whose `transactional.id` is derived from the
//!    server's system identifier and the slot, and calls `init_transactions`: every older
//!    producer with that id is fenced (a zombie Ferry can never commit again) and whatever it
//!    left open is aborted;
//! 2. reads the progress topic to its end (`crate::progress::read`: high watermark first, then
//!    read_committed up to it) for the newest committed record of this slot and server;
//! 3. starts the relay core from it: every event it covers is skipped (`ferry_core::relay`);
//! 4. produces into a Kafka transaction; after each event the core gives the exact position
//!    reached. When the interval passed, or the transaction holds its cap of records or bytes,
//!    or the session drains, the position is written as a progress record **inside the same
//!    transaction**, after the records it covers, and the transaction commits;
//! 5. only then are the records' reports released to the core as durable, and the core may
//!    confirm the slot, never past the end LSN the committed progress record holds.
//!
//! # Errors
//!
//! - A record that fails (its report), or any failure the core saw, poisons the transaction:
//!   it is aborted, never committed, and its records' reports are released failed.
//! - An abortable commit error aborts, a commit whose outcome is unknown (it timed out) is not
//!   trusted either way (librdkafka lacks KIP-890): both end the session with a transient
//!   error; the next session creates a new producer, fences this one, and re-reads progress.
//! - A fenced or fatal error stops Ferry: another instance with the same `transactional.id`
//!   took over ([`PipelineError::Fenced`] names it).
//! - A call the brokers cannot serve ("EndTxnRequest (KIP-98) not supported by broker":
//!   librdkafka refuses to send it) stops Ferry with [`PipelineError::TransactionsUnsupported`]:
//!   retrying cannot change the brokers, and nothing was committed (issue 30). Sessions ask the
//!   brokers first ([`crate::txn_probe`]), so this is the backstop.
//!
//! Records that can never be produced (a payload over `route.max_payload_bytes`, a routing
//! error) are decided by `route.on_error` in the core before they reach a transaction; their
//! dead letters travel in the same transaction as everything else.
//!
//! # Failpoints
//!
//! `FERRY_TEST_FAILPOINT=<point>[:<n>]` kills the process (SIGKILL, no clean-up) the `n`th time
//! (default 1st) it reaches `<point>` in a Kafka transaction that carries records: `records_sent` (records produced, no progress record yet),
//! `progress_sent` (progress record produced, commit not asked), `commit_sent` (killed while the
//! commit is in flight), `committed` (commit acknowledged, reports not released, slot not
//! confirmed), `confirmed` (after the slot confirm was handed to the reader). The end-to-end tests
//! use them; nothing else reads the variable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_core::progress::{Mode, ProgressKey, ProgressRecord};
use ferry_core::{Position, Relay, Token};
use ferry_router::Record;
use ferry_wal::conn::SystemIdentity;
use rdkafka::error::KafkaError;

use super::settings::ExactlyOnce;
use super::PipelineError;
use crate::producer::{
    transaction_error, Delivery, Producer, Reports, SendError, TransactionFailure,
};
use crate::telemetry::Metrics;
use crate::topics::Topics;

/// The delivery-report key of the progress record (no core token is ever this large).
pub const PROGRESS_TOKEN: usize = usize::MAX;

/// The environment variable naming a failpoint (tests only).
pub const FAILPOINT_ENV: &str = "FERRY_TEST_FAILPOINT";

/// A Kafka transaction in the making, and the producer that runs it.
pub(super) struct Txn {
    pub producer: Producer,
    settings: ExactlyOnce,
    key: Vec<u8>,
    transactional_id: String,
    timeline: u32,
    /// A transaction is begun.
    open: bool,
    /// Tokens of the records in the open transaction: their reports are held until it ends.
    held: Vec<Token>,
    held_bytes: u64,
    /// The newest position the core gave, and when the first uncommitted one came.
    position: Option<Position>,
    since: Option<Instant>,
    /// Why the open transaction may never commit.
    poisoned: Option<KafkaError>,
    /// The topic of the record whose report poisoned it, if one did.
    poisoned_topic: Option<Box<str>>,
    /// The producer's client properties (for the grant in an authorization failure's message).
    properties: Vec<(String, String)>,
    /// The newest committed position.
    committed: Option<Position>,
    metrics: std::sync::Arc<Metrics>,
}

impl Txn {
    /// Creates the transactional producer for `slot` on `system` and fences every older one.
    pub async fn start(
        settings: &ExactlyOnce,
        properties: &[(String, String)],
        topics: Topics,
        system: SystemIdentity,
        slot: &str,
        metrics: std::sync::Arc<Metrics>,
    ) -> Result<(Txn, Reports), PipelineError> {
        let transactional_id = crate::config::transactional_id(system.system_id, slot);
        let mut props = properties.to_vec();
        props.push(("transactional.id".into(), transactional_id.clone()));
        topics.set_transactional_id(&transactional_id);
        let (producer, rx) = Producer::new(&props, topics, metrics.clone())
            .map_err(PipelineError::ProducerConfig)?;
        let fail = |error| match denied_txn(&error, &transactional_id, properties) {
            Some(e) => e,
            None => match transaction_error(&error) {
                TransactionFailure::Fenced => PipelineError::Fenced {
                    transactional_id: transactional_id.clone(),
                    error,
                },
                TransactionFailure::Unsupported => unsupported(&error),
                _ => PipelineError::Transaction { error },
            },
        };
        producer
            .init_transactions(settings.call_timeout)
            .await
            .map_err(fail)?;
        tracing::info!(
            transactional_id,
            "exactly-once: transactions initialised (older producers fenced)"
        );
        let key = ProgressKey {
            system_id: system.system_id,
            slot: slot.to_string(),
        };
        Ok((
            Txn {
                producer,
                settings: settings.clone(),
                key: key.encode(),
                transactional_id,
                timeline: system.timeline,
                open: false,
                held: Vec::new(),
                held_bytes: 0,
                position: None,
                since: None,
                poisoned: None,
                poisoned_topic: None,
                committed: None,
                metrics,
                properties: properties.to_vec(),
            },
            rx,
        ))
    }

    /// The newest committed progress record of this slot and server (blocking read, off the
    /// runtime); `None` on a first start.
    pub async fn remembered(
        &self,
        properties: &[(String, String)],
        system: SystemIdentity,
        slot: &str,
    ) -> Result<Option<ProgressRecord>, PipelineError> {
        let props = properties.to_vec();
        let topic = self.settings.progress_topic.clone();
        let timeout = self.settings.call_timeout;
        let key = ProgressKey {
            system_id: system.system_id,
            slot: slot.to_string(),
        };
        let read = tokio::task::spawn_blocking(move || {
            crate::progress::read(&props, &topic, &key, timeout)
        })
        .await
        .map_err(|_| PipelineError::Transaction {
            error: KafkaError::Canceled,
        })??;
        Ok(match read {
            crate::progress::Remembered::Record { record, .. } => Some(record),
            _ => None,
        })
    }

    /// Hands a record to the open transaction (beginning one if needed); its report is held.
    pub fn produce(&mut self, token: Token, record: &Record) -> Result<(), KafkaError> {
        if !self.open {
            self.producer.begin_transaction()?;
            self.open = true;
        }
        self.producer.send(record, token.0).map_err(send_error)?;
        self.held.push(token);
        self.held_bytes += record.size_bytes() as u64;
        Ok(())
    }

    /// The core's position after an event.
    pub fn position(&mut self, p: Position, now: Instant) {
        self.position = Some(p);
        self.since.get_or_insert(now);
    }

    /// A failure elsewhere (the core's `Abandon`): the open transaction may never commit.
    pub fn poison(&mut self, why: KafkaError) {
        self.poisoned.get_or_insert(why);
    }

    /// A delivery report: held (an `Ok` means nothing until the commit); a failure poisons.
    pub fn report(&mut self, d: Delivery) {
        if let Err(e) = d.result {
            tracing::warn!(error = %e, "a record of the open Kafka transaction failed; it will be aborted");
            if self.poisoned.is_none() {
                self.poisoned_topic = d.topic;
            }
            self.poison(e);
        }
    }

    /// When the open transaction must commit at the latest.
    pub fn deadline(&self) -> Option<Instant> {
        self.since.map(|s| s + self.settings.interval)
    }

    /// Whether the open transaction holds its cap of records or bytes: no more WAL until it
    /// commits.
    pub fn full(&self) -> bool {
        self.held.len() as u64 >= self.settings.max_records
            || self.held_bytes >= self.settings.max_bytes
    }

    fn uncommitted(&self) -> bool {
        self.position.is_some() && self.position != self.committed
    }

    /// Commits or aborts when it is time to; see the [module documentation](self).
    pub async fn settle(
        &mut self,
        relay: &mut Relay<KafkaError>,
        now: Instant,
    ) -> Result<(), PipelineError> {
        if let Some(why) = self.poisoned.take() {
            if self.open || !self.held.is_empty() {
                return self.abort(relay, why, now).await;
            }
            return Ok(());
        }
        let full = self.full();
        let late = self.deadline().is_some_and(|d| now >= d);
        let draining = relay.is_draining() && !self.held.is_empty();
        if !self.uncommitted() || !(full || late || draining) {
            return Ok(());
        }
        let Some(position) = self.position else {
            return Ok(());
        };
        self.commit(relay, position).await
    }

    /// Commits a transaction holding only a progress record at `position` (a fresh slot's).
    pub async fn commit_position(
        &mut self,
        relay: &mut Relay<KafkaError>,
        position: Position,
    ) -> Result<(), PipelineError> {
        self.position = Some(position);
        self.commit(relay, position).await
    }

    async fn commit(
        &mut self,
        relay: &mut Relay<KafkaError>,
        position: Position,
    ) -> Result<(), PipelineError> {
        if !self.open {
            self.producer
                .begin_transaction()
                .map_err(|e| self.failure(e))?;
            self.open = true;
        }
        // Failpoints count transactions that carry records (not progress-only ones).
        let carrying = !self.held.is_empty();
        if carrying {
            failpoint("records_sent");
        }
        let written_unix_millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let record = ProgressRecord {
            partial: position.partial,
            since_unix_millis: position.since_unix_micros.map(|t| t.div_euclid(1000)),
            ..ProgressRecord::whole(
                Mode::ExactlyOnce,
                self.timeline,
                position.end_lsn,
                written_unix_millis,
            )
        };
        if let Err(e) = self.producer.send_progress(
            &self.settings.progress_topic,
            &self.key,
            &record.encode(),
            PROGRESS_TOKEN,
        ) {
            return self.abort(relay, send_error(e), Instant::now()).await;
        }
        if carrying {
            failpoint("progress_sent");
        }
        if carrying && failpoint_armed("commit_sent") {
            // Killed while the commit is in flight: whether it lands is the broker's business.
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(2));
                failpoint("commit_sent");
            });
        }
        let started = Instant::now();
        match self
            .producer
            .commit_transaction(self.settings.call_timeout)
            .await
        {
            Ok(()) => {
                self.metrics.kafka_transactions_committed.inc();
                self.metrics
                    .kafka_transaction_commit
                    .observe(started.elapsed().as_secs_f64());
                if carrying {
                    failpoint("committed");
                }
                tracing::debug!(
                    records = self.held.len(),
                    end_lsn = %position.end_lsn,
                    commit_ms = started.elapsed().as_millis() as u64,
                    "Kafka transaction committed"
                );
                self.open = false;
                self.committed = Some(position);
                self.since = None;
                self.held_bytes = 0;
                let now = Instant::now();
                for token in self.held.drain(..) {
                    relay.handle_report(token, Ok(()), now);
                }
                relay.progress_committed(position.end_lsn);
                Ok(())
            }
            Err(e) => {
                let failure = transaction_error(&e);
                tracing::warn!(error = %e, failure = failure.as_str(), "Kafka transaction commit failed");
                if failure == TransactionFailure::Abortable {
                    return self.abort(relay, e, Instant::now()).await;
                }
                self.release_failed(relay, &e, Instant::now());
                Err(self.failure(e))
            }
        }
    }

    /// Aborts the open transaction; its records' reports are released failed, and the session
    /// ends (the next one starts over from what Kafka holds).
    async fn abort(
        &mut self,
        relay: &mut Relay<KafkaError>,
        why: KafkaError,
        now: Instant,
    ) -> Result<(), PipelineError> {
        let held = self.held.len();
        tracing::warn!(error = %why, records = held, "aborting the Kafka transaction");
        let aborted = if self.open {
            self.metrics.kafka_transactions_aborted.inc();
            self.producer
                .abort_transaction(self.settings.call_timeout)
                .await
        } else {
            Ok(())
        };
        self.open = false;
        self.release_failed(relay, &why, now);
        let topic = self.poisoned_topic.take();
        if let Some(code) = crate::authz::authorization_code(&why) {
            // The broker refuses the records (or the progress record) for good: stop. The
            // refused record's report may not have come in yet (the commit failed first): then
            // the topic is the one librdkafka's error quotes, if it does; the progress topic if
            // the transaction held nothing else; never a guess among several.
            let quoted = quoted_topic(&why.to_string());
            let topic = topic
                .as_deref()
                .or(quoted.as_deref())
                .or((held == 0).then_some(self.settings.progress_topic.as_str()))
                .unwrap_or("<the outbox topic or progress topic named in the error>");
            let progress = topic == self.settings.progress_topic;
            return Err(PipelineError::not_authorized(
                code,
                topic,
                progress,
                &self.properties,
            ));
        }
        if let Err(e) = aborted {
            return Err(self.failure(e));
        }
        Err(PipelineError::Transaction { error: why })
    }

    /// A session that ends with its transaction open (the reader failed, PostgreSQL went
    /// away) aborts it before the producer goes: read_committed consumers need not wait for the
    /// next session's fencing or the transaction timeout, and a producer that another instance
    /// fenced meanwhile learns it here, and stops, instead of standing by as if nothing
    /// happened. The abort waits at most `timeout` (a broker that does not answer must not
    /// hold the restart); any other failure is left to the next session, whose
    /// `init_transactions` aborts what is still open.
    pub async fn end_open(&mut self, timeout: Duration) -> Result<(), PipelineError> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        self.metrics.kafka_transactions_aborted.inc();
        tracing::warn!(
            records = self.held.len(),
            "the session ends with a Kafka transaction open; aborting it"
        );
        match self.producer.abort_transaction(timeout).await {
            Ok(()) => Ok(()),
            Err(e) => match self.failure(e) {
                fenced @ PipelineError::Fenced { .. } => Err(fenced),
                other => {
                    tracing::warn!(error = %other, "could not abort the open Kafka transaction; the next session's init_transactions aborts it");
                    Ok(())
                }
            },
        }
    }

    fn release_failed(&mut self, relay: &mut Relay<KafkaError>, why: &KafkaError, now: Instant) {
        self.held_bytes = 0;
        self.position = self.committed;
        self.since = None;
        for token in self.held.drain(..) {
            relay.handle_report(token, Err(why.clone()), now);
        }
    }

    fn failure(&self, error: KafkaError) -> PipelineError {
        if let Some(e) = denied_txn(&error, &self.transactional_id, &self.properties) {
            return e;
        }
        match transaction_error(&error) {
            TransactionFailure::Fenced => PipelineError::Fenced {
                transactional_id: self.transactional_id.clone(),
                error,
            },
            TransactionFailure::Unsupported => unsupported(&error),
            _ => PipelineError::Transaction { error },
        }
    }
}

/// A transaction call the brokers cannot serve (issue 30): permanent, never an uncertain
/// outcome to retry. librdkafka refused to send the request, so nothing was committed.
fn unsupported(error: &KafkaError) -> PipelineError {
    PipelineError::TransactionsUnsupported {
        what: format!("the Kafka brokers do not support transactions: {error}"),
    }
}

/// A transaction call the broker refused Ferry's principal: its transactional id
/// (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), or an idempotent producer id for it
/// (CLUSTER_AUTHORIZATION_FAILED). librdkafka raises both as fatal errors, which would otherwise
/// read as fencing.
fn denied_txn(
    error: &KafkaError,
    transactional_id: &str,
    properties: &[(String, String)],
) -> Option<PipelineError> {
    use rdkafka::error::RDKafkaErrorCode as C;
    let code = crate::authz::authorization_code(error)?;
    let resource = match code {
        C::ClusterAuthorizationFailed => crate::authz::Resource::Cluster,
        C::TransactionalIdAuthorizationFailed => {
            crate::authz::Resource::TransactionalId(transactional_id.to_string())
        }
        // A record's topic: its report says which (see `Txn::abort`).
        _ => return None,
    };
    Some(PipelineError::NotAuthorized(crate::authz::denied(
        code,
        "the exactly-once producer's transactions",
        &resource,
        properties,
    )))
}

/// The first double-quoted name in a librdkafka error (`Failed to add partition "orders" [0]
/// to transaction: ...`).
fn quoted_topic(text: &str) -> Option<String> {
    let (_, rest) = text.split_once('"')?;
    let (name, _) = rest.split_once('"')?;
    (!name.is_empty()).then(|| name.to_string())
}

fn send_error(e: SendError) -> KafkaError {
    match e {
        SendError::QueueFull => {
            KafkaError::MessageProduction(rdkafka::error::RDKafkaErrorCode::QueueFull)
        }
        SendError::Refused(e) => e,
    }
}

/// Times each failpoint was reached.
static HITS: AtomicU64 = AtomicU64::new(0);

/// The failpoint asked for, and at which hit: `None` unless the variable names `point`.
fn failpoint_target(point: &str) -> Option<u64> {
    let v = std::env::var(FAILPOINT_ENV).ok()?;
    let (name, n) = v.split_once(':').unwrap_or((&v, "1"));
    (name == point).then(|| n.parse().unwrap_or(1))
}

/// Whether `point` is the failpoint asked for (without counting a hit).
fn failpoint_armed(point: &str) -> bool {
    failpoint_target(point).is_some()
}

/// Kills the process (SIGKILL) the `n`th time `point` is reached, if it is the one asked for.
pub fn failpoint(point: &str) {
    let Some(n) = failpoint_target(point) else {
        return;
    };
    if HITS.fetch_add(1, Ordering::SeqCst) + 1 >= n {
        eprintln!("failpoint {point}: killing the process");
        // kill -9 of ourselves: no destructor, no flush, no goodbye to either server.
        let _ = std::process::Command::new("kill")
            .args(["-9", &std::process::id().to_string()])
            .status();
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::quoted_topic;

    #[test]
    fn the_refused_topic_is_read_from_librdkafkas_error_or_not_at_all() {
        assert_eq!(
            quoted_topic(
                "Transaction error: Failed to add partition \"orders\" [0] to transaction: \
                 Broker: Topic authorization failed"
            )
            .as_deref(),
            Some("orders")
        );
        assert_eq!(quoted_topic("Broker: Topic authorization failed"), None);
        assert_eq!(quoted_topic("an \"\" empty name"), None);
    }
}
