//! The Kafka producer: librdkafka (idempotent, `acks=all`) behind a narrow interface.
//!
//! A record handed to [`Producer::send`] is *accepted*; its delivery report, which arrives on
//! the channel returned by [`Producer::new`], makes it *durable* (or failed). Every accepted
//! record gets exactly one report within `delivery.timeout.ms`; that is what lets the pipeline
//! drain before it reconnects, so records of one key never overtake each other across sessions.
//!
//! Reports travel over a bounded channel sized above the in-flight window, so the librdkafka
//! thread that delivers them never waits. Errors are classified into the two families: a report
//! that can succeed on a later attempt (the broker was unreachable past the delivery timeout) is
//! transient; one the broker will always refuse (record too large, not authorized, unknown topic)
//! is permanent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_router::Record;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, Producer as _, ProducerContext, PurgeConfig, ThreadedProducer,
};
use rdkafka::{ClientContext, Message};
use tokio::sync::mpsc;

/// What travels with a record through librdkafka and comes back with its report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta<T> {
    /// The watermark's token for the record.
    pub token: T,
    /// Commit time of the record's transaction, µs since the Unix epoch (for the lag metric).
    pub commit_unix_micros: i64,
    /// Payload size accounted in the in-flight window.
    pub bytes: usize,
    /// The record's topic (shared, not copied), for errors.
    pub topic: Arc<str>,
}

/// One delivery report.
#[derive(Debug)]
pub struct Delivery<T> {
    pub meta: Meta<T>,
    pub result: Result<Delivered, KafkaError>,
}

/// Where a durable record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub partition: i32,
    pub offset: i64,
}

struct Context<T> {
    reports: mpsc::Sender<Delivery<T>>,
    fatal: Arc<Mutex<Option<String>>>,
}

impl<T: Send + Sync + 'static> ClientContext for Context<T> {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(facility = fac, "librdkafka: {log_message}")
            }
            RDKafkaLogLevel::Warning => tracing::warn!(facility = fac, "librdkafka: {log_message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(facility = fac, "librdkafka: {log_message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(facility = fac, "librdkafka: {log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let fatal = matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::Fatal));
        if fatal {
            tracing::error!(error = %error, "Kafka producer fatal error: {reason}");
            *self.fatal.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.to_string());
        } else {
            tracing::warn!(error = %error, "Kafka client error: {reason}");
        }
    }
}

impl<T: Send + Sync + 'static> ProducerContext for Context<T> {
    type DeliveryOpaque = Box<Meta<T>>;

    fn delivery(&self, result: &DeliveryResult<'_>, meta: Box<Meta<T>>) {
        let result = match result {
            Ok(m) => Ok(Delivered {
                partition: m.partition(),
                offset: m.offset(),
            }),
            Err((e, _)) => Err(e.clone()),
        };
        // Never full: the channel is larger than the in-flight window (the blocking send is a
        // safety net, not a path). If the pipeline is gone the report has no one to matter to.
        let delivery = Delivery {
            meta: *meta,
            result,
        };
        if let Err(mpsc::error::TrySendError::Full(delivery)) = self.reports.try_send(delivery) {
            let _ = self.reports.blocking_send(delivery);
        }
    }
}

/// An idempotent Kafka producer with delivery reports on a channel.
pub struct Producer<T: Send + Sync + 'static> {
    inner: ThreadedProducer<Context<T>>,
    fatal: Arc<Mutex<Option<String>>>,
}

impl<T: Send + Sync + 'static> std::fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").finish_non_exhaustive()
    }
}

/// Why `send` did not accept a record.
#[derive(Debug)]
pub enum SendError<T> {
    /// librdkafka's queue is full: wait for reports, then retry with the same meta.
    QueueFull(Meta<T>),
    /// Any other refusal (the record is invalid for the client, e.g. too large).
    Refused(KafkaError),
}

impl<T: Send + Sync + Copy + 'static> Producer<T> {
    /// Creates the producer from `properties` (built in one place by the configuration:
    /// idempotence and `acks=all` always on). `report_capacity` must exceed the in-flight window.
    pub fn new(
        properties: &[(String, String)],
        report_capacity: usize,
    ) -> Result<(Producer<T>, mpsc::Receiver<Delivery<T>>), KafkaError> {
        let mut cc = ClientConfig::new();
        for (k, v) in properties {
            cc.set(k, v);
        }
        let (tx, rx) = mpsc::channel(report_capacity.max(1));
        let fatal = Arc::new(Mutex::new(None));
        let inner = cc.create_with_context(Context {
            reports: tx,
            fatal: fatal.clone(),
        })?;
        Ok((Producer { inner, fatal }, rx))
    }

    /// Hands a record to librdkafka (accepted, not yet durable).
    pub fn send(&self, record: &Record, meta: Meta<T>) -> Result<(), SendError<T>> {
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (name, value) in &record.headers {
            headers = headers.insert(Header {
                key: name,
                value: value.as_deref(),
            });
        }
        let mut r: BaseRecord<'_, [u8], [u8], Box<Meta<T>>> =
            BaseRecord::with_opaque_to(&record.topic, Box::new(meta)).headers(headers);
        if let Some(k) = &record.key {
            r = r.key(&k[..]);
        }
        if let Some(v) = &record.value {
            r = r.payload(&v[..]);
        }
        if let Some(p) = record.partition {
            r = r.partition(p);
        }
        if let Some(ts) = record.timestamp_ms {
            r = r.timestamp(ts);
        }
        match self.inner.send(r) {
            Ok(()) => Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                Err(SendError::QueueFull(*r.delivery_opaque))
            }
            Err((e, _)) => Err(SendError::Refused(e)),
        }
    }

    /// A fatal error librdkafka raised (the producer must be replaced), if any.
    pub fn fatal_error(&self) -> Option<String> {
        self.fatal.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Fails every record still queued (not yet sent) with a purge error: after one record
    /// failed, none queued behind it may be delivered ahead of its replay.
    pub fn purge_queued(&self) {
        self.inner.purge(PurgeConfig::default().queue());
    }

    /// Records librdkafka holds (queued or in flight).
    pub fn in_flight(&self) -> i32 {
        self.inner.in_flight_count()
    }

    /// Waits (blocking) up to `timeout` for every accepted record to be reported.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.inner.flush(timeout)
    }

    /// Metadata round trip: whether the brokers answer within `timeout` (blocking).
    pub fn reachable(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.inner
            .client()
            .fetch_metadata(None, timeout)
            .map(|_| ())
    }
}

/// Whether a failed delivery can succeed on a later attempt (after a reconnect).
pub fn is_transient(e: &KafkaError) -> bool {
    use RDKafkaErrorCode::*;
    let Some(code) = e.rdkafka_error_code() else {
        return true;
    };
    !matches!(
        code,
        MessageSizeTooLarge
            | InvalidMessageSize
            | InvalidMessage
            | InvalidRecord
            | InvalidTopic
            | UnknownTopic
            | UnknownTopicOrPartition
            | UnknownPartition
            | TopicAuthorizationFailed
            | ClusterAuthorizationFailed
            | TransactionalIdAuthorizationFailed
            | SaslAuthenticationFailed
            | Authentication
            | UnsupportedForMessageFormat
            | PolicyViolation
            | InvalidRequiredAcks
            | UnsupportedVersion
    )
}

/// How to fix a permanent delivery error, in words.
pub fn fix_for(e: &KafkaError) -> &'static str {
    use RDKafkaErrorCode::*;
    match e.rdkafka_error_code() {
        Some(MessageSizeTooLarge | InvalidMessageSize ) => {
            "the record is larger than the broker or topic accepts: raise the topic's max.message.bytes \
             (and kafka.properties message.max.bytes), or lower route.max_payload_bytes so the row is routed by on_error"
        }
        Some(UnknownTopic | UnknownTopicOrPartition | UnknownPartition | InvalidTopic) => {
            "the topic does not exist: create it (ferry check lists the topics), or enable auto-creation on the brokers"
        }
        Some(TopicAuthorizationFailed | ClusterAuthorizationFailed) => {
            "grant Ferry's Kafka principal WRITE and DESCRIBE on the topic (and IDEMPOTENT_WRITE on the cluster for older brokers)"
        }
        Some(SaslAuthenticationFailed | Authentication) => {
            "check kafka.properties sasl.mechanism, sasl.username and sasl.password"
        }
        _ => "see the broker's logs for why it refuses the record",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Managed Kafka means TLS and SASL (PLAIN, SCRAM): the linked librdkafka must have them.
    #[test]
    fn librdkafka_is_built_with_tls_and_sasl() {
        let features = crate::config::builtin_features();
        for f in ["ssl", "sasl_plain", "sasl_scram"] {
            assert!(
                features.iter().any(|x| x == f),
                "librdkafka lacks {f}: {features:?}"
            );
        }
    }

    /// A SASL_SSL producer configuration (SCRAM and PLAIN) is accepted by the client; this is
    /// what fails at start-up when TLS or SASL support is missing from the build.
    #[test]
    fn sasl_ssl_producers_can_be_created() {
        for mechanism in ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] {
            let props: Vec<(String, String)> = [
                ("bootstrap.servers", "127.0.0.1:1"),
                ("security.protocol", "sasl_ssl"),
                ("sasl.mechanism", mechanism),
                ("sasl.username", "ferry"),
                ("sasl.password", "secret"),
                ("enable.idempotence", "true"),
                ("acks", "all"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            let created = Producer::<u64>::new(&props, 16);
            assert!(created.is_ok(), "{mechanism}: {:?}", created.err());
        }
    }
}
