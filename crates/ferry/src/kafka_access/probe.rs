//! Whether any bootstrap broker answers, and if none does, why: asked before `ferry check` reads
//! anything from Kafka and before `ferry run` starts a session, so that a wrong address is
//! named within a second or two instead of after a request's timeout.
//!
//! librdkafka tries the bootstrap brokers one at a time, and its per-broker texts say why each
//! failed ([`super::diagnose`]). The probe stops as soon as every bootstrap broker failed for a
//! reason waiting cannot change ([`super::Cause::certain`]: refused, unresolvable, not Kafka,
//! closed at the first request), and otherwise at its deadline (a silent host, a firewall).
//!
//! A client waiting for a broker asks librdkafka to connect again every
//! `max(11, reconnect.backoff.ms / 2)` ms, and that request skips the per-broker exponential
//! backoff (`RD_KAFKA_OP_CONNECT` resets it: "Expedite next reconnect", `rdkafka_broker.c`).
//! The probe's client therefore paces its attempts at 250 ms, is not idempotent (which would
//! add its own connection requests), and lives only as long as the probe. Its blocking: call it
//! off the async runtime.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseProducer, Producer};

use super::{diagnose, diagnosis::connected, silent, Diagnosis};
use crate::progress_topic::{Disposed, Sighting};

/// One metadata request's wait, between looks at what the client said.
const SLICE: Duration = Duration::from_millis(200);

/// No bootstrap broker could be used; one diagnosis per broker (and per cause).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unusable {
    pub diagnoses: Vec<Diagnosis>,
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let messages: Vec<&str> = self.diagnoses.iter().map(|d| d.message.as_str()).collect();
        f.write_str(&messages.join("; "))
    }
}

/// Asks the brokers named in `properties` (`bootstrap.servers`, with Ferry's security settings)
/// for metadata until one answers (Ok), every bootstrap broker failed for a certain reason, or
/// `deadline` passed (Err, with why). Blocking.
pub fn probe(properties: &[(String, String)], deadline: Duration) -> Result<(), Unusable> {
    probe_seeing(properties, deadline, None).map(|_| ())
}

/// [`probe`], and what the answer shows of `topic` ([`crate::progress_topic::sighted_in`]):
/// settled with one partition, `ferry run` needs no request of its own to find its progress
/// topic on a restart; unknown to the brokers, a first start creates it at once.
///
/// With a `topic` the request names it alone: a request for every topic costs the brokers and
/// this client in proportion to the cluster (the probe answered in 28–95 ms instead of 5–11
/// against one local broker holding 5,000 other topics; bench/README.md, "Round 35"). The
/// role turns auto-creation off, so asking never creates the topic on brokers that honour the
/// request's `AllowAutoTopicCreation` (Metadata v4 and later: Apache Kafka 0.11 on). Without
/// a `topic` it asks for every topic.
pub fn probe_seeing(
    properties: &[(String, String)],
    deadline: Duration,
    topic: Option<&str>,
) -> Result<Sighting, Unusable> {
    let start = Instant::now();
    let bootstrap: Vec<String> = properties
        .iter()
        .rev()
        .find(|(k, _)| k == "bootstrap.servers")
        .map(|(_, v)| {
            v.split(',')
                .map(broker_name)
                .filter(|b| !b.is_empty())
                .collect()
        })
        .unwrap_or_default();
    // Not idempotent and without the transactional.id, reconnecting every 250 ms, with
    // librdkafka's `broker` debug lines at Debug: the state changes tell a connection accepted
    // and then left unanswered (a TLS or SASL listener waiting for its handshake) from one
    // never accepted (a firewall).
    let cc = crate::kafka_client::config(properties, crate::kafka_client::Role::BrokerProbe);
    // Destroyed on a thread of its own: `rd_kafka_destroy` of a client that talked to a broker
    // can take ~100 ms, which would otherwise delay the producer's creation.
    let client: Disposed<BaseProducer<Collector>> =
        match cc.create_with_context(Collector::default()) {
            Ok(c) => Disposed::new(c),
            // An invalid configuration is reported by the first real client, with its property.
            Err(_) => return Ok(Sighting::Unsure),
        };
    loop {
        let remaining = deadline.saturating_sub(start.elapsed());
        let answer = client
            .client()
            .fetch_metadata(topic, SLICE.min(remaining).max(Duration::from_millis(1)));
        // A broker's error for the topic (unknown, not authorized) comes inside the answer,
        // never as the call's error (librdkafka 2.12, `rd_kafka_parse_Metadata`).
        let sighting = answer.ok().filter(|md| !md.brokers().is_empty()).map(|md| {
            topic.map_or(Sighting::Unsure, |t| {
                crate::progress_topic::sighted_in(&md, t)
            })
        });
        if let Some(sighting) = sighting {
            tracing::debug!(
                elapsed_ms = start.elapsed().as_secs_f64() * 1e3,
                "a Kafka broker answered the probe"
            );
            return Ok(sighting);
        }
        // Errors and log lines reach the context only when polled (rdkafka 0.39 sets
        // `log.queue` and routes librdkafka's logs to the main queue): a probe answered at once
        // is never polled, and its librdkafka lines are dropped with it.
        for _ in 0..100 {
            client.poll(Duration::ZERO);
        }
        let seen = client
            .context()
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let certain = !bootstrap.is_empty()
            && bootstrap
                .iter()
                .all(|b| seen.get(b).is_some_and(|d| d.cause.certain()));
        if certain || start.elapsed() >= deadline {
            let connected = client
                .context()
                .connected
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            return Err(verdict(&bootstrap, seen, &connected, deadline));
        }
    }
}

/// One diagnosis per bootstrap broker (a broker without one did not answer in time), then any
/// other the client gave; duplicates (the same text for two brokers) once.
fn verdict(
    bootstrap: &[String],
    mut seen: BTreeMap<String, Diagnosis>,
    connected: &BTreeSet<String>,
    deadline: Duration,
) -> Unusable {
    let mut diagnoses: Vec<Diagnosis> = Vec::new();
    for b in bootstrap {
        diagnoses.push(
            seen.remove(b)
                .unwrap_or_else(|| silent(b, deadline, connected.contains(b))),
        );
    }
    diagnoses.extend(seen.into_values());
    let mut unique: Vec<Diagnosis> = Vec::new();
    for d in diagnoses {
        if !unique.iter().any(|u| u.message == d.message) {
            unique.push(d);
        }
    }
    Unusable { diagnoses: unique }
}

/// librdkafka's name of a bootstrap broker: `host:port` as written, port 9092 when omitted, the
/// protocol prefix (`SSL://`) dropped.
fn broker_name(s: &str) -> String {
    let s = s.trim();
    let s = s.split_once("://").map_or(s, |(_, rest)| rest);
    if s.is_empty()
        || s.rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        s.to_owned()
    } else {
        format!("{s}:9092")
    }
}

/// The probe client's context: the newest diagnosis per broker (and the shared one, see
/// [`super::observe`]).
#[derive(Default)]
struct Collector {
    seen: Mutex<BTreeMap<String, Diagnosis>>,
    /// Brokers whose TCP connection was accepted.
    connected: Mutex<BTreeSet<String>>,
}

impl Collector {
    fn keep(&self, code: Option<rdkafka::error::RDKafkaErrorCode>, text: &str) {
        super::observe(code, text);
        if let Some(b) = connected(text) {
            self.connected
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(broker_name(b));
        }
        if let Some(d) = diagnose(code, text) {
            let key = d.broker.as_deref().map(broker_name).unwrap_or_default();
            self.seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, d);
        }
    }
}

impl rdkafka::ClientContext for Collector {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        self.keep(None, message);
        tracing::debug!(?level, facility = fac, "librdkafka (probe): {message}");
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.keep(error.rdkafka_error_code(), reason);
        tracing::debug!(%error, "librdkafka (probe): {reason}");
    }
}

impl rdkafka::producer::ProducerContext for Collector {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::producer::DeliveryResult<'_>, _: ()) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_names_are_librdkafkas() {
        assert_eq!(broker_name(" 127.0.0.1:1"), "127.0.0.1:1");
        assert_eq!(broker_name("SSL://k:9093"), "k:9093");
        assert_eq!(broker_name("kafka"), "kafka:9092");
    }

    #[test]
    fn a_broker_that_said_nothing_did_not_answer_in_time() {
        let refused = diagnose(
            None,
            "a:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused",
        )
        .unwrap();
        let seen = BTreeMap::from([("a:1".to_owned(), refused.clone())]);
        let u = verdict(
            &["a:1".into(), "b:2".into()],
            seen,
            &BTreeSet::new(),
            Duration::from_secs(10),
        );
        assert_eq!(u.diagnoses.len(), 2);
        assert_eq!(u.diagnoses[0], refused);
        assert!(u.diagnoses[1]
            .message
            .starts_with("no answer from b:2 within 10s"));
    }
}
