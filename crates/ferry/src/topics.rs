//! The topic watch: a record routed to a topic the brokers do not have must never wait in
//! silence.
//!
//! On a broker that does not auto-create topics (the default on managed Kafka), librdkafka keeps
//! such a record queued while it waits for the topic's metadata; with `delivery_timeout = 0` it
//! waits forever, and so does the confirmed LSN. The watch makes that visible and, when asked,
//! fixes it:
//!
//! - the producer tells it, per record, the topic it was sent to ([`Topics::sent`]) and the topic
//!   of each delivery report ([`Topics::reported`]): a hash lookup under an uncontended lock, so
//!   it knows the set of topics produced to and how many records wait on each;
//! - the first time a topic is seen, a thread of its own (never the session's) asks the brokers
//!   for that topic's metadata through a consumer-type client with
//!   `allow.auto.create.topics=false`, so that asking never creates it; missing topics are asked
//!   about again every [`RECHECK_INTERVAL`];
//! - a missing topic is logged at WARN with the records waiting for it (again every
//!   [`WARN_INTERVAL`] while it lasts), counted in `ferry_topics_missing`, and named by `/readyz`,
//!   which answers 503 until it exists; when it appears, an INFO line says so and the records
//!   flow (librdkafka delivers what it held);
//! - with `route.create_topics.enabled`, a missing topic is created instead (admin CreateTopics
//!   with the configured partitions, replication factor and topic configs). Another Ferry creating
//!   it at the same moment ("topic already exists") is success.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferry_router::CreateTopicsConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::telemetry::metrics::MissingTopic;
use crate::telemetry::Metrics;

/// How often a missing topic is asked about again.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(2);
/// How often the WARN about a missing topic is repeated while it lasts.
pub const WARN_INTERVAL: Duration = Duration::from_secs(30);
/// How long one metadata or CreateTopics request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The producer's side of the watch: cheap to clone, called per record.
#[derive(Debug, Clone, Default)]
pub struct Topics(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Every topic seen, in the order first seen; `index` finds one by name.
    entries: Vec<Entry>,
    index: HashMap<Box<str>, usize>,
    /// The entries of the last record sent and the last report: records of one topic often
    /// come in runs, and comparing the name is cheaper than hashing it.
    last_sent: usize,
    last_reported: usize,
    /// A topic was seen for the first time since the watch last looked.
    fresh: bool,
    stop: bool,
}

#[derive(Debug)]
struct Entry {
    topic: Box<str>,
    /// Records sent to the topic and not yet reported.
    waiting: u64,
    status: Status,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Unchecked,
    Present,
    Missing { since: Instant, warned: Instant },
}

impl Topics {
    /// A record was handed to the producer for `topic`.
    pub fn sent(&self, topic: &str) {
        let mut state = self.0.lock();
        let i = match state.find(state.last_sent, topic) {
            Some(i) => i,
            None => {
                let i = state.entries.len();
                state.entries.push(Entry {
                    topic: topic.into(),
                    waiting: 0,
                    status: Status::Unchecked,
                });
                state.index.insert(topic.into(), i);
                state.fresh = true;
                self.0.wake.notify_one();
                i
            }
        };
        state.entries[i].waiting += 1;
        state.last_sent = i;
    }

    /// Delivery reports (success or failure) arrived for `count` records of `topic`.
    pub fn reported(&self, topic: &str, count: u64) {
        let mut state = self.0.lock();
        if let Some(i) = state.find(state.last_reported, topic) {
            let e = &mut state.entries[i];
            e.waiting = e.waiting.saturating_sub(count);
            state.last_reported = i;
        }
    }
}

impl State {
    /// The entry of `topic`: `hint` if that is it, else by name.
    fn find(&self, hint: usize, topic: &str) -> Option<usize> {
        match self.entries.get(hint) {
            Some(e) if *e.topic == *topic => Some(hint),
            _ => self.index.get(topic).copied(),
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The watch's thread; stopped and joined when dropped.
pub struct TopicWatch {
    topics: Topics,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TopicWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicWatch").finish_non_exhaustive()
    }
}

impl TopicWatch {
    /// Starts the watch with the producer's client `properties` (brokers and security; producer
    /// settings are ignored by the metadata client). Must be called within a Tokio runtime when
    /// `create.enabled` (CreateTopics requests are awaited on it).
    pub fn start(
        properties: &[(String, String)],
        create: CreateTopicsConfig,
        metrics: Arc<Metrics>,
    ) -> Result<TopicWatch, KafkaError> {
        let mut cc = ClientConfig::new();
        for (k, v) in properties {
            cc.set(k, v);
        }
        let admin = if create.enabled {
            let admin: AdminClient<DefaultClientContext> = cc.create()?;
            Some((admin, tokio::runtime::Handle::current()))
        } else {
            None
        };
        cc.set("allow.auto.create.topics", "false");
        // Producer-only properties would each log a warning on a consumer.
        for key in PRODUCER_ONLY {
            cc.remove(key);
        }
        let consumer: BaseConsumer = cc.create()?;
        let topics = Topics::default();
        let shared = topics.0.clone();
        let worker = Worker {
            shared,
            consumer,
            admin,
            create,
            metrics,
        };
        let thread = std::thread::Builder::new()
            .name("ferry-topics".into())
            .spawn(move || worker.run())
            .map_err(|e| {
                KafkaError::ClientCreation(format!("cannot start the topic watch: {e}"))
            })?;
        Ok(TopicWatch {
            topics,
            thread: Some(thread),
        })
    }

    /// The handle the producer reports to.
    pub fn topics(&self) -> Topics {
        self.topics.clone()
    }
}

impl Drop for TopicWatch {
    fn drop(&mut self) {
        self.topics.0.lock().stop = true;
        self.topics.0.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Properties Ferry sets on the producer that a consumer-type client does not know.
pub(crate) const PRODUCER_ONLY: [&str; 8] = [
    "enable.idempotence",
    "acks",
    "partitioner",
    "compression.codec",
    "linger.ms",
    "message.timeout.ms",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
];

struct Worker {
    shared: Arc<Shared>,
    consumer: BaseConsumer,
    admin: Option<(AdminClient<DefaultClientContext>, tokio::runtime::Handle)>,
    create: CreateTopicsConfig,
    metrics: Arc<Metrics>,
}

/// What the brokers say about a topic.
enum Found {
    Present,
    Missing,
}

impl Worker {
    fn run(self) {
        loop {
            let due: Vec<String> = {
                let mut state = self.shared.lock();
                if !state.fresh && !state.stop {
                    state = self
                        .shared
                        .wake
                        .wait_timeout(state, RECHECK_INTERVAL)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                if state.stop {
                    return;
                }
                state.fresh = false;
                state
                    .entries
                    .iter()
                    .filter(|e| e.status != Status::Present)
                    .map(|e| e.topic.to_string())
                    .collect()
            };
            for topic in due {
                let found = match self.lookup(&topic) {
                    Ok(Found::Missing) if self.admin.is_some() => self.create_topic(&topic),
                    other => other,
                };
                let now = Instant::now();
                let mut state = self.shared.lock();
                let Some(i) = state.index.get(topic.as_str()).copied() else {
                    continue;
                };
                let e = &mut state.entries[i];
                match (found, e.status) {
                    (Ok(Found::Present), Status::Missing { since, .. }) => {
                        tracing::info!(
                            topic = %topic,
                            records_waiting = e.waiting,
                            missing_for_s = now.saturating_duration_since(since).as_secs(),
                            "topic exists now: the records waiting for it flow"
                        );
                        e.status = Status::Present;
                    }
                    (Ok(Found::Present), _) => e.status = Status::Present,
                    (Ok(Found::Missing), Status::Missing { since, warned }) => {
                        if now.saturating_duration_since(warned) >= WARN_INTERVAL {
                            warn_missing(&topic, e.waiting, now.saturating_duration_since(since));
                            e.status = Status::Missing { since, warned: now };
                        }
                    }
                    (Ok(Found::Missing), _) => {
                        warn_missing(&topic, e.waiting, Duration::ZERO);
                        e.status = Status::Missing {
                            since: now,
                            warned: now,
                        };
                    }
                    // The brokers did not answer: what is known stays as it was (an unreachable
                    // cluster has its own symptoms: delivery errors, reconnects, readiness).
                    (Err(err), _) => {
                        tracing::debug!(topic = %topic, error = %err, "cannot look up topic metadata")
                    }
                }
            }
            let missing: Vec<MissingTopic> = {
                let state = self.shared.lock();
                let mut m: Vec<MissingTopic> = state
                    .entries
                    .iter()
                    .filter(|e| matches!(e.status, Status::Missing { .. }))
                    .map(|e| MissingTopic {
                        topic: e.topic.to_string(),
                        records_waiting: e.waiting,
                    })
                    .collect();
                m.sort_by(|a, b| a.topic.cmp(&b.topic));
                m
            };
            self.metrics.topics_missing.set(missing);
        }
    }

    /// One metadata request for `topic` (blocking), through a client that never creates it.
    fn lookup(&self, topic: &str) -> Result<Found, KafkaError> {
        let md = self.consumer.fetch_metadata(Some(topic), REQUEST_TIMEOUT)?;
        let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
            return Ok(Found::Missing);
        };
        match t.error().map(RDKafkaErrorCode::from) {
            None if !t.partitions().is_empty() => Ok(Found::Present),
            None
            | Some(RDKafkaErrorCode::UnknownTopicOrPartition)
            | Some(RDKafkaErrorCode::UnknownTopic) => Ok(Found::Missing),
            // Leader elections, authorization: not a missing topic.
            Some(_) => Ok(Found::Present),
        }
    }

    /// CreateTopics for `topic` with `route.create_topics`; "already exists" is success.
    fn create_topic(&self, topic: &str) -> Result<Found, KafkaError> {
        let Some((admin, runtime)) = &self.admin else {
            return Ok(Found::Missing);
        };
        let replication = TopicReplication::Fixed(self.create.replication_factor);
        let mut new = NewTopic::new(topic, self.create.partitions, replication);
        for (k, v) in &self.create.configs {
            new = new.set(k, v);
        }
        let opts = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        let result = runtime.block_on(admin.create_topics([&new], &opts))?;
        match result.into_iter().next() {
            Some(Ok(_)) => {
                tracing::info!(
                    topic = %topic,
                    partitions = self.create.partitions,
                    replication_factor = self.create.replication_factor,
                    "created topic (route.create_topics)"
                );
                Ok(Found::Present)
            }
            Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => Ok(Found::Present),
            Some(Err((_, code))) => {
                tracing::warn!(
                    topic = %topic,
                    error = %code,
                    "cannot create topic (route.create_topics); fix: grant Ferry's Kafka principal CREATE on the \
                     topic or cluster, or check route.create_topics partitions, replication_factor and configs"
                );
                Ok(Found::Missing)
            }
            None => Ok(Found::Missing),
        }
    }
}

fn warn_missing(topic: &str, records_waiting: u64, missing_for: Duration) {
    tracing::warn!(
        topic = %topic,
        records_waiting,
        missing_for_s = missing_for.as_secs(),
        "topic does not exist on the brokers: records routed to it wait, and nothing past them is \
         confirmed; fix: create the topic, or set route.create_topics.enabled = true"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(t: &Topics) -> Vec<(String, u64)> {
        let state = t.0.lock();
        let mut v: Vec<(String, u64)> = state
            .entries
            .iter()
            .map(|e| (e.topic.to_string(), e.waiting))
            .collect();
        v.sort();
        v
    }

    /// Against a map model: records sent and reported in any interleaving of topics (runs of
    /// one topic and alternations, which exercise the last-entry shortcut and the index).
    #[test]
    fn waiting_counts_match_a_map_model() {
        let t = Topics::default();
        let mut model: std::collections::BTreeMap<String, u64> = Default::default();
        let names = ["a.orders", "a.invoices", "b.orders", "a.order"];
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let name = names[(x % 4) as usize];
            if x % 3 == 0 && model.get(name).copied().unwrap_or(0) > 0 {
                t.reported(name, 1);
                *model.get_mut(name).unwrap() -= 1;
            } else {
                t.sent(name);
                *model.entry(name.to_string()).or_default() += 1;
            }
        }
        let expected: Vec<(String, u64)> = model.into_iter().collect();
        assert_eq!(waiting(&t), expected);
        t.reported("never.sent", 1);
        assert_eq!(
            waiting(&t).len(),
            4,
            "a report for an unknown topic adds nothing"
        );
    }

    #[test]
    fn a_new_topic_wakes_the_watch_and_a_known_one_does_not() {
        let t = Topics::default();
        t.sent("x");
        assert!(std::mem::take(&mut t.0.lock().fresh));
        t.sent("x");
        assert!(!t.0.lock().fresh);
        t.sent("y");
        assert!(t.0.lock().fresh);
    }
}
