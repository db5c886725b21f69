//! The transactional sink: exactly-once delivery into Kafka (issue 11; `kafka.exactly_once`).
//!
//! The position travels inside the Kafka transaction. A session in exactly-once mode:
//!
//! 1. makes a producer whose `transactional.id` is derived from the server's system identifier
//!    and the slot while it starts replication (the producer connects meanwhile); once the slot
//!    is its own (a standby never gets here, so it never fences the instance streaming), it
//!    calls `init_transactions`: every older producer with that id is fenced (a zombie Ferry can
//!    never commit again) and whatever it left open is aborted;
//! 2. reads the progress topic to its end (`crate::progress_topic::read`: high watermark first, then
//!    read_committed up to it) for the newest committed record of this slot and server, taking
//!    up the verdict's read (to the stable end, before fencing) where it ended
//!    (`crate::progress_topic::Cursor`);
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
use std::time::{Duration, Instant};

use ferry_core::progress_record::{Mode, ProgressKey, ProgressRecord};
use ferry_core::{CommitOutcome, DeliveryKey, Position};
use ferry_router::Record;
use ferry_wal::conn::SystemIdentity;
use rdkafka::error::KafkaError;

use super::settings::ExactlyOnce;
use super::sink::{send_error, unix_millis};
use super::PipelineError;
use crate::producer::{transaction_error, Producer, Reports, TransactionFailure};
use crate::telemetry::Metrics;
use crate::topics::Topics;

/// The environment variable naming a failpoint (tests only).
pub const FAILPOINT_ENV: &str = "FERRY_TEST_FAILPOINT";

/// The environment variable holding every commit of a transaction that carries records for
/// this many milliseconds before it is asked for (tests only): a transaction kept open to be
/// seen, paused or killed. Without it, a transaction commits as soon as its records are in
/// and the stream pauses, however long `kafka.transaction_interval` is.
pub const HOLD_COMMIT_ENV: &str = "FERRY_TEST_HOLD_COMMIT_MS";

/// The transactional producer of one session, and what its calls need to say why they failed.
/// It carries out the session machine's transaction actions ([`ferry_core::session`] decides
/// when to begin, commit or abort); it decides nothing.
pub(super) struct Txn {
    pub producer: Producer,
    settings: ExactlyOnce,
    key: Vec<u8>,
    transactional_id: String,
    timeline: u32,
    /// Records produced since the last commit or abort (for the failpoints).
    sent: usize,
    /// The producer's client properties (for the grant in an authorization failure's message).
    properties: Vec<(String, String)>,
    metrics: std::sync::Arc<Metrics>,
}

/// A session's transactional producer, made and connecting to the brokers, not yet
/// initialised: it has fenced nothing ([`Unready::init`] does).
pub(super) struct Unready {
    producer: Producer,
    reports: Reports,
    transactional_id: String,
}

impl Txn {
    /// Makes the transactional producer for `slot` on the server `system_id` (blocking:
    /// librdkafka's client and its threads). Its warm-up connects to the brokers at once, so a
    /// session makes it while replication starts; `init_transactions`, which fences, waits for
    /// the slot ([`Unready::init`]).
    pub fn make(
        settings: &ExactlyOnce,
        properties: &[(String, String)],
        topics: Topics,
        system_id: u64,
        slot: &str,
        metrics: std::sync::Arc<Metrics>,
    ) -> Result<Unready, KafkaError> {
        let transactional_id = crate::config::transactional_id(system_id, slot);
        let mut props = properties.to_vec();
        props.push(("transactional.id".into(), transactional_id.clone()));
        topics.set_transactional_id(&transactional_id);
        // Made after the verdict ensured the progress topic: its warm-up asks for it alone.
        let (producer, reports) = Producer::new(
            &props,
            topics,
            metrics,
            Some(settings.progress_topic.as_str()),
        )?;
        Ok(Unready {
            producer,
            reports,
            transactional_id,
        })
    }
}

impl Unready {
    /// `init_transactions`: every older producer of this slot and server is fenced. Only the
    /// session holding the slot may call it (a standby never gets here).
    pub async fn init(
        self,
        settings: &ExactlyOnce,
        properties: &[(String, String)],
        system: SystemIdentity,
        slot: &str,
        metrics: std::sync::Arc<Metrics>,
    ) -> Result<(Txn, Reports), PipelineError> {
        let Unready {
            producer,
            reports,
            transactional_id,
        } = self;
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
                sent: 0,
                metrics,
                properties: properties.to_vec(),
            },
            reports,
        ))
    }
}

impl Txn {
    /// The newest committed progress record of this slot and server (blocking read, off the
    /// runtime); `None` on a first start. `cursor`: the verdict's read, taken up where it ended
    /// (what came since is read; without one, the topic is read whole).
    pub async fn remembered(
        &self,
        properties: &[(String, String)],
        system: SystemIdentity,
        slot: &str,
        cursor: Option<crate::progress_topic::Cursor>,
    ) -> Result<Option<ProgressRecord>, PipelineError> {
        let props = properties.to_vec();
        let topic = self.settings.progress_topic.clone();
        let timeout = self.settings.call_timeout;
        let key = ProgressKey {
            system_id: system.system_id,
            slot: slot.to_string(),
        };
        let read = tokio::task::spawn_blocking(move || match cursor {
            Some(cursor) => cursor.read(&props, &topic, &key, timeout),
            None => crate::progress_topic::read(&props, &topic, &key, timeout),
        })
        .await
        .map_err(|_| PipelineError::Transaction {
            error: KafkaError::Canceled,
        })??;
        Ok(match read {
            crate::progress_topic::Remembered::Record { record, .. } => Some(record),
            _ => None,
        })
    }

    /// Hands a record to the open transaction; its report comes to the session machine.
    pub fn produce(&mut self, token: DeliveryKey, record: &Record) -> Result<(), KafkaError> {
        self.producer.send(record, token.0).map_err(send_error)?;
        self.sent += 1;
        Ok(())
    }

    /// `begin_transaction`.
    pub fn begin(&mut self) -> Result<(), KafkaError> {
        self.producer.begin_transaction()
    }

    /// The progress record holding `position`, into the open transaction after its records.
    pub fn produce_progress(
        &mut self,
        token: DeliveryKey,
        position: Position,
    ) -> Result<(), KafkaError> {
        // Failpoints count transactions that carry records (not progress-only ones).
        let carrying = self.sent > 0;
        if carrying {
            failpoint("records_sent");
        }
        let record = ProgressRecord::at(Mode::ExactlyOnce, self.timeline, &position, unix_millis());
        self.producer
            .send_progress(
                &self.settings.progress_topic,
                &self.key,
                &record.encode(),
                token.0,
            )
            .map_err(send_error)?;
        if carrying {
            failpoint("progress_sent");
        }
        Ok(())
    }

    /// `commit_transaction`, and what its outcome means to the session machine.
    pub async fn commit(
        &mut self,
        position: Position,
        records: usize,
    ) -> CommitOutcome<KafkaError> {
        let carrying = self.sent > 0;
        if let Some(ms) = std::env::var(HOLD_COMMIT_ENV).ok().filter(|_| carrying) {
            let ms = ms.parse().expect("FERRY_TEST_HOLD_COMMIT_MS: milliseconds");
            tracing::warn!(ms, "{HOLD_COMMIT_ENV}: holding the commit (tests only)");
            tokio::time::sleep(Duration::from_millis(ms)).await;
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
                    records,
                    end_lsn = %position.end_lsn,
                    commit_ms = started.elapsed().as_millis() as u64,
                    "Kafka transaction committed"
                );
                self.sent = 0;
                CommitOutcome::Committed
            }
            Err(e) => {
                let failure = transaction_error(&e);
                tracing::warn!(error = %e, failure = failure.as_str(), "Kafka transaction commit failed");
                match failure {
                    TransactionFailure::Abortable => CommitOutcome::Abortable(e),
                    _ => CommitOutcome::Failed(e),
                }
            }
        }
    }

    /// `abort_transaction` (the session machine asked for it; it ends the session).
    pub async fn abort(&mut self) -> Result<(), KafkaError> {
        self.sent = 0;
        self.metrics.kafka_transactions_aborted.inc();
        self.producer
            .abort_transaction(self.settings.call_timeout)
            .await
    }

    /// A session that ends with its transaction open (the reader failed, PostgreSQL went
    /// away) aborts it before the producer goes: read_committed consumers need not wait for the
    /// next session's fencing or the transaction timeout, and a producer that another instance
    /// fenced meanwhile learns it here, and stops, instead of standing by as if nothing
    /// happened. The abort waits at most `timeout` (a broker that does not answer must not
    /// hold the restart); any other failure is left to the next session, whose
    /// `init_transactions` aborts what is still open.
    pub async fn end_open(&mut self, timeout: Duration) -> Result<(), PipelineError> {
        self.sent = 0;
        self.metrics.kafka_transactions_aborted.inc();
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

    /// The pipeline's error for an aborted transaction ([`ferry_core::CoreError::Aborted`]): `error` caused
    /// it (its record's `topic`, when known; the transaction held `records` outbox records),
    /// `abort_error` is the abort's own failure.
    pub fn aborted(
        &self,
        error: KafkaError,
        topic: Option<&str>,
        records: usize,
        abort_error: Option<KafkaError>,
    ) -> PipelineError {
        if let Some(code) = crate::authz::authorization_code(&error) {
            // The broker refuses the records (or the progress record) for good: stop. The
            // refused record's report may not have come in yet (the commit failed first): then
            // the topic is the one librdkafka's error quotes, if it does; the progress topic if
            // the transaction held nothing else; never a guess among several.
            let quoted = quoted_topic(&error.to_string());
            let topic = topic
                .or(quoted.as_deref())
                .or((records == 0).then_some(self.settings.progress_topic.as_str()))
                .unwrap_or("<the outbox topic or progress topic named in the error>");
            let progress = topic == self.settings.progress_topic;
            return PipelineError::not_authorized(code, topic, progress, &self.properties);
        }
        match abort_error {
            Some(e) => self.failure(e),
            None => PipelineError::Transaction { error },
        }
    }

    /// The pipeline's error for a transaction call that failed for good.
    pub fn failure(&self, error: KafkaError) -> PipelineError {
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
