//! Asks the brokers which APIs they serve (issue 30): a throwaway client with librdkafka's
//! `debug=feature` fetches metadata, and its ApiVersions log lines go to
//! [`crate::broker_apis`], which judges them. Used by `ferry check` and, in exactly-once mode,
//! by every `ferry run` session before it creates the slot or initialises transactions.

use std::sync::Mutex;
use std::time::Duration;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, Producer as _};

use crate::broker_apis::{Seen, Support};

/// Most queued log events handled after the metadata answer (one per poll; an answer is
/// about 90 lines per broker).
const MAX_EVENTS: usize = 5_000;

/// The probe client's context: keeps the ApiVersions lines, passes errors to
/// [`crate::kafka_access`].
#[derive(Debug, Default)]
struct Probe {
    seen: Mutex<Seen>,
}

impl rdkafka::ClientContext for Probe {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        if fac == "APIVERSION" {
            self.seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .feed(fac, message);
        } else if !matches!(level, RDKafkaLogLevel::Debug | RDKafkaLogLevel::Info) {
            crate::kafka_access::observe(None, message);
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        crate::kafka_access::observe(error.rdkafka_error_code(), reason);
        tracing::debug!(%error, "librdkafka: {reason}");
    }
}

impl rdkafka::producer::ProducerContext for Probe {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::producer::DeliveryResult<'_>, _: ()) {}
}

/// What the brokers Ferry reaches with `properties` say about transactions (blocking: run it
/// off the runtime). `Err`: no broker answered the metadata request within `timeout`. The
/// request names `topic` alone (the role keeps it from creating it): any answer will do, and
/// one for every topic grows with the cluster.
pub fn probe(
    properties: &[(String, String)],
    topic: &str,
    timeout: Duration,
) -> Result<Support, KafkaError> {
    // Without the transactional.id (it initialises nothing) and the operator's debug
    // contexts; `debug=feature`, logged at Debug.
    let cc = crate::kafka_client::config(properties, crate::kafka_client::Role::ApiVersionsProbe);
    let producer: BaseProducer<Probe> = cc.create_with_context(Probe::default())?;
    // A broker's error for the topic (unknown, not authorized) comes inside the answer.
    let metadata = producer.client().fetch_metadata(Some(topic), timeout);
    // The log lines reach the context only when polled; the connection that answered logged
    // its ApiVersions answer before it sent the metadata request, so it is queued by now.
    for _ in 0..MAX_EVENTS {
        producer.poll(Duration::ZERO);
    }
    metadata?;
    let support = producer
        .context()
        .seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .support();
    Ok(support)
}
