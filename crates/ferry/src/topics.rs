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
//!   about again every [`RECHECK_INTERVAL`]. At start the thread waits [`FIRST_LOOK`] after the
//!   first topic is sent to (a standby, which sends nothing, [`RECHECK_INTERVAL`] and then
//!   that), and makes its clients when it first asks, so that none of it competes with a
//!   restart's first records for the broker. A client it cannot make is said once at WARN, and
//!   the watch sees nothing until it can (properties librdkafka refuses fail the start, as
//!   before);
//! - a missing topic is logged at WARN with the records waiting for it (again every
//!   [`WARN_INTERVAL`] while it lasts), counted in `ferry_topics_missing`, and named by `/readyz`,
//!   which answers 503 until it exists; when it appears, an INFO line says so and the records
//!   flow (librdkafka delivers what it held);
//! - with `route.create_topics.enabled`, a missing topic is created instead (admin CreateTopics
//!   with the configured partitions, replication factor and topic configs). Another Ferry creating
//!   it at the same moment ("topic already exists") is success.
//!
//! It also says why records of an existing topic stopped being acknowledged. A partition whose
//! in-sync replicas fell below the topic's `min.insync.replicas` answers every `acks=all` write
//! with `NOT_ENOUGH_REPLICAS`; librdkafka retries that error (it is retriable) until the
//! delivery timeout, which is never by default, and logs it only at debug level: the records
//! wait, nothing past them is confirmed, and without the watch nothing would say why. So when a
//! topic has records waiting and no report came for it since the watch last looked (one
//! [`RECHECK_INTERVAL`]: a stalled topic; a flowing one costs nothing), the watch asks for the
//! topic's metadata, and for the topic's `min.insync.replicas` (DescribeConfigs, remembered for
//! [`MIN_INSYNC_TTL`]) when a partition lacks in-sync replicas. Each partition with fewer in-sync
//! replicas than that, or with no leader, is logged at WARN with the reason (again every
//! [`WARN_INTERVAL`] while it lasts, and an INFO line when it takes writes again), counted in
//! `ferry_partitions_refusing`, and named with its reason by `/readyz`. A topic whose other
//! partitions still deliver is not stalled at first; its records for the refusing partition
//! then fill the in-flight window, the topic stalls, and the watch finds the partition.
//!
//! Ferry also writes where the topic counts do not see: the progress topic's partition 0, and in
//! exactly-once mode the transaction coordinator's log (the partition of `__transaction_state`
//! that holds Ferry's `transactional.id`, `abs(hashCode) % partitions` as Kafka computes it).
//! When such a write is refused, the data records may all be acknowledged and the commit or
//! the progress record waits instead. So when Ferry has records in flight and the confirmed
//! LSN has not risen for a [`RECHECK_INTERVAL`], the watch looks at those partitions the same
//! way.
//!
//! The progress topic's configuration is read (DescribeConfigs) at the watch's first look and
//! every [`JUDGE_INTERVAL`] after: a topic that deletes progress records or lets them pile up
//! is said at WARN with the command that mends it, and `ferry_progress_topic_flawed` is 1 until
//! it is mended ([`crate::progress_topic::keeping`]).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferry_router::CreateTopicsConfig;
use rdkafka::admin::{
    AdminClient, AdminOptions, ConfigResource, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::kafka_client::{self, Role};
use crate::telemetry::metrics::{MissingTopic, Refusal, RefusingPartition};
use crate::telemetry::Metrics;

/// How often a missing topic is asked about again.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(2);
/// How often the WARN about a missing topic is repeated while it lasts.
pub const WARN_INTERVAL: Duration = Duration::from_secs(30);
/// How long a topic's `min.insync.replicas` is remembered.
pub const MIN_INSYNC_TTL: Duration = Duration::from_secs(60);
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
    /// Exactly-once mode: the producer's `transactional.id` (known once the session knows the
    /// server's system identifier).
    transactional_id: Option<String>,
    stop: bool,
}

#[derive(Debug)]
struct Entry {
    topic: Box<str>,
    /// Records sent to the topic and not yet reported.
    waiting: u64,
    /// Records reported, ever (wrapping), and that count when the watch last looked: equal
    /// while records wait means the topic is stalled.
    reports: u64,
    reports_seen: u64,
    status: Status,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Unchecked,
    Present,
    Missing { since: Instant, warned: Instant },
}

impl Topics {
    /// Exactly-once mode: the transactional producer's id, whose coordinator's log the watch
    /// looks at when nothing is confirmed (see the module docs).
    pub fn set_transactional_id(&self, id: &str) {
        self.0.lock().transactional_id = Some(id.to_string());
    }

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
                    reports: 0,
                    reports_seen: 0,
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
            e.reports = e.reports.wrapping_add(count);
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

    /// Waits on `wake` for at most `at_most`.
    fn wait<'a>(
        &self,
        state: std::sync::MutexGuard<'a, State>,
        at_most: Duration,
    ) -> std::sync::MutexGuard<'a, State> {
        self.wake
            .wait_timeout(state, at_most)
            .unwrap_or_else(|e| e.into_inner())
            .0
    }

    /// Waits until `done` holds or `at_most` has passed; false when the watch is stopping.
    fn wait_for(&self, at_most: Duration, done: impl Fn(&State) -> bool) -> bool {
        let until = Instant::now() + at_most;
        let mut state = self.lock();
        loop {
            if state.stop {
                return false;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || done(&state) {
                return true;
            }
            state = self.wait(state, left);
        }
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
    /// settings are ignored by the metadata client). Must be called within a Tokio runtime (the
    /// admin requests, CreateTopics and DescribeConfigs, are awaited on it).
    pub fn start(
        properties: &[(String, String)],
        progress_topic: &str,
        create: CreateTopicsConfig,
        metrics: Arc<Metrics>,
    ) -> Result<TopicWatch, KafkaError> {
        let mut internal = Vec::new();
        if !progress_topic.is_empty() {
            internal.push((progress_topic.to_string(), Internal::Partition(0)));
        }
        // Properties librdkafka refuses still fail the start, as when the clients were made here:
        // checking them makes no client (no thread, no connection).
        for role in [Role::TopicWatchMetadata, Role::TopicWatchAdmin] {
            kafka_client::config(properties, role).create_native_config()?;
        }
        let topics = Topics::default();
        let shared = topics.0.clone();
        let worker = Worker {
            shared,
            properties: properties.to_vec(),
            runtime: tokio::runtime::Handle::current(),
            clients: std::cell::OnceCell::new(),
            clients_failed: std::cell::Cell::new(false),
            create,
            metrics,
            min_insync: HashMap::new(),
            refusals: RefusalLog::default(),
            internal,
            progress_topic: progress_topic.to_string(),
            progress_topic_due: Instant::now(),
            progress_topic_flaw: None,
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
        // Joined only when it is already done: in the middle of its lookups (several blocking
        // requests of up to 10 s each while brokers are away) it would hold this thread, a
        // worker of the runtime, through a shutdown's grace period. It sees `stop` after them.
        if let Some(t) = self.thread.take() {
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

struct Worker {
    shared: Arc<Shared>,
    /// The producer's client properties, for [`Clients`].
    properties: Vec<(String, String)>,
    /// Where the admin requests are awaited.
    runtime: tokio::runtime::Handle,
    /// Made when the watch first asks the brokers ([`Worker::clients`]).
    clients: std::cell::OnceCell<Clients>,
    clients_failed: std::cell::Cell<bool>,
    create: CreateTopicsConfig,
    metrics: Arc<Metrics>,
    /// Topics' `min.insync.replicas`, and when they were asked.
    min_insync: HashMap<String, (Option<i32>, Instant)>,
    refusals: RefusalLog,
    /// The partitions Ferry writes besides the routed topics' (see the module docs).
    internal: Vec<(String, Internal)>,
    /// The progress topic, whose configuration is judged every [`JUDGE_INTERVAL`]
    /// ([`Worker::judge_progress_topic`]): when it is due next, and what the last judgement
    /// found wrong (`None`: nothing, or never judged).
    progress_topic: String,
    progress_topic_due: Instant,
    progress_topic_flaw: Option<String>,
}

/// The watch's two clients.
struct Clients {
    /// Metadata: without the producer-only properties (each would log a warning on a
    /// consumer), and creating no topic by asking for its metadata.
    consumer: BaseConsumer,
    /// CreateTopics and DescribeConfigs. An admin client is a producer inside librdkafka:
    /// without idempotence (a producer id it would ask for) and without Ferry's
    /// transactional.id.
    admin: AdminClient<DefaultClientContext>,
}

/// How long the watch waits, after the first topic is sent to, before it asks the brokers
/// anything: its two clients (each with its connections) and its first requests then land after
/// a restart's first acknowledgements, not among them, where on a busy broker they made the
/// restart wait. A missing topic is reported (or created) that much later once, at start.
const FIRST_LOOK: Duration = Duration::from_millis(250);

/// How often the progress topic's configuration is read again, so that its flaw's metric
/// follows an administrator's change without a restart.
const JUDGE_INTERVAL: Duration = Duration::from_secs(10 * 60);
/// The environment variable that sets [`JUDGE_INTERVAL`] in milliseconds (tests only: a test
/// sees a mended topic judged again without waiting ten minutes).
pub const JUDGE_INTERVAL_ENV: &str = "FERRY_TEST_PROGRESS_TOPIC_JUDGE_MS";

/// [`JUDGE_INTERVAL`], or what [`JUDGE_INTERVAL_ENV`] sets.
fn judge_interval() -> Duration {
    std::env::var(JUDGE_INTERVAL_ENV)
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(JUDGE_INTERVAL, Duration::from_millis)
}

/// How soon a read of it that failed, or said nothing, is tried again.
const JUDGE_RETRY: Duration = Duration::from_secs(60);

/// Kafka's transaction log.
const TRANSACTION_STATE_TOPIC: &str = "__transaction_state";

/// Which partition of an internal topic Ferry writes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Internal {
    Partition(i32),
    /// The one holding this `transactional.id`.
    Coordinator(String),
}

/// The partition of the transaction log holding `transactional_id`, out of `partitions`:
/// Kafka's `Utils.abs(transactionalId.hashCode) % partitions`, with Java's `String.hashCode`
/// (over UTF-16 code units) and `Utils.abs` (which maps `Integer.MIN_VALUE` to 0).
fn coordinator_partition(transactional_id: &str, partitions: usize) -> i32 {
    let hash = transactional_id
        .encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    abs % i32::try_from(partitions.max(1)).unwrap_or(i32::MAX)
}

/// What a judgement of the progress topic has to say, given what the last one found wrong
/// (`last`) and what this one does (`now`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum News {
    /// A flaw found for the first time, or another one than before: said at WARN.
    Flawed,
    /// The flaw of before is gone: said at INFO.
    Mended,
    /// As before.
    Nothing,
}

fn news(last: Option<&str>, now: Option<&str>) -> News {
    match (last, now) {
        (_, Some(now)) if last != Some(now) => News::Flawed,
        (Some(_), None) => News::Mended,
        _ => News::Nothing,
    }
}

/// `min.insync.replicas` in a DescribeConfigs answer.
fn min_insync_of(configs: &ConfigResource) -> Option<i32> {
    configs
        .get("min.insync.replicas")
        .and_then(|e| e.value.as_deref())
        .and_then(|v| v.parse().ok())
}

/// What the brokers say about a topic.
enum Found {
    Present,
    Missing,
}

impl Worker {
    fn run(mut self) {
        // Nothing until a topic is sent to (or a recheck interval passed), then `FIRST_LOOK`.
        if !self.shared.wait_for(RECHECK_INTERVAL, |s| s.fresh)
            || !self.shared.wait_for(FIRST_LOOK, |_| false)
        {
            return;
        }
        // Its answer also gives the progress topic's `min.insync.replicas` to the loop below.
        self.judge_progress_topic();
        // Asked now, while the cluster is most likely whole (see `min_insync`).
        for topic in self
            .internal
            .iter()
            .map(|(t, _)| t.clone())
            .collect::<Vec<_>>()
        {
            self.min_insync(&topic, None);
        }
        loop {
            let due: Vec<String> = {
                let mut state = self.shared.lock();
                if !state.fresh && !state.stop {
                    state = self.shared.wait(state, RECHECK_INTERVAL);
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
                    Ok(Found::Missing) if self.create.enabled => self.create_topic(&topic),
                    other => other,
                };
                if matches!(found, Ok(Found::Present)) {
                    // Asked now, while the cluster is most likely whole: during an outage the
                    // request may go to a broker that is down.
                    self.min_insync(&topic, None);
                }
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
            self.look_at_stalled_topics();
            if !self.shared.lock().stop {
                self.judge_progress_topic();
            }
        }
    }

    /// Finds the refusing partitions of the stalled topics (see the module docs), logs what
    /// changed and publishes them.
    fn look_at_stalled_topics(&mut self) {
        let stalled: Vec<String> = {
            let mut state = self.shared.lock();
            let mut stalled = Vec::new();
            for e in &mut state.entries {
                if e.status == Status::Present && e.waiting > 0 && e.reports == e.reports_seen {
                    stalled.push(e.topic.to_string());
                }
                e.reports_seen = e.reports;
            }
            stalled
        };
        let mut refusing = Vec::new();
        for topic in stalled {
            match self.partitions(&topic) {
                Ok(partitions) => {
                    let short = partitions.iter().find(|p| p.in_sync < p.replicas);
                    let min_insync = match short {
                        Some(p) => self.min_insync(&topic, (p.leader >= 0).then_some(p.leader)),
                        None => None,
                    };
                    tracing::debug!(
                        topic = %topic,
                        ?partitions,
                        ?min_insync,
                        "records wait and none was reported since the last look"
                    );
                    refusing.extend(refusals(&topic, &partitions, min_insync));
                }
                Err(err) => {
                    tracing::debug!(topic = %topic, error = %err, "cannot look up topic metadata")
                }
            }
        }
        let progress = self
            .metrics
            .confirmed_lsn
            .last_raised()
            .max(self.metrics.streaming.last_raised());
        let transactional_id = self.shared.lock().transactional_id.clone();
        if let Some(id) = transactional_id {
            let coordinator = (
                TRANSACTION_STATE_TOPIC.to_string(),
                Internal::Coordinator(id),
            );
            if !self.internal.contains(&coordinator) {
                self.internal.retain(|(t, _)| t != TRANSACTION_STATE_TOPIC);
                self.internal.push(coordinator);
                // Asked now, while the cluster is most likely whole (see `min_insync`).
                self.min_insync(TRANSACTION_STATE_TOPIC, None);
            }
        }
        if self.metrics.in_flight_records.get() > 0 && progress.elapsed() >= RECHECK_INTERVAL {
            for (topic, which) in self.internal.clone() {
                match self.partitions(&topic) {
                    Ok(partitions) => {
                        let id = match &which {
                            Internal::Partition(p) => *p,
                            Internal::Coordinator(tid) => {
                                coordinator_partition(tid, partitions.len())
                            }
                        };
                        let mine: Vec<PartitionView> =
                            partitions.into_iter().filter(|p| p.id == id).collect();
                        let leader = mine.first().map(|p| p.leader).filter(|l| *l >= 0);
                        let short = mine.iter().any(|p| p.in_sync < p.replicas);
                        let min_insync = if short {
                            self.min_insync(&topic, leader)
                        } else {
                            None
                        };
                        tracing::debug!(
                            topic = %topic,
                            partitions = ?mine,
                            ?min_insync,
                            "records in flight and nothing confirmed since the last look"
                        );
                        refusing.extend(refusals(&topic, &mine, min_insync));
                    }
                    Err(err) => {
                        tracing::debug!(topic = %topic, error = %err, "cannot look up topic metadata")
                    }
                }
            }
        }
        let now = Instant::now();
        for notice in self.refusals.update(&refusing, now) {
            match notice {
                Notice::Refusing { partition, for_ } => tracing::warn!(
                    topic = %partition.topic,
                    partition = partition.partition,
                    reason = %partition.reason,
                    refusing_for_s = for_.as_secs(),
                    "partition refuses writes ({}): its records wait (the client retries them), and \
                     nothing past them is confirmed; fix: bring the brokers of its replicas back",
                    partition.reason
                ),
                Notice::Writable {
                    topic,
                    partition,
                    after,
                } => tracing::info!(
                    topic = %topic,
                    partition,
                    refused_for_s = after.as_secs(),
                    "partition no longer refuses writes"
                ),
            }
        }
        self.metrics.partitions_refusing.set(refusing);
    }

    /// The watch's clients, made on first use.
    fn clients(&self) -> Result<&Clients, KafkaError> {
        if let Some(c) = self.clients.get() {
            return Ok(c);
        }
        let made = kafka_client::config(&self.properties, Role::TopicWatchMetadata)
            .create()
            .and_then(|consumer| {
                let admin =
                    kafka_client::config(&self.properties, Role::TopicWatchAdmin).create()?;
                Ok(Clients { consumer, admin })
            });
        match made {
            Ok(c) => {
                if self.clients_failed.get() {
                    tracing::info!(
                        "the topic watch made its Kafka clients: it watches the topics again"
                    );
                }
                Ok(self.clients.get_or_init(|| c))
            }
            // The producer was made from the same properties, so this is rare; said once.
            Err(e) => {
                if !self.clients_failed.replace(true) {
                    tracing::warn!(error = %e, "the topic watch cannot make its Kafka clients: missing topics and refusing partitions go unreported until it can; it tries again at every look (every few seconds). Check the kafka properties this error names");
                }
                Err(e)
            }
        }
    }

    /// The partitions of `topic` as its metadata shows them (blocking).
    fn partitions(&self, topic: &str) -> Result<Vec<PartitionView>, KafkaError> {
        let md = self
            .clients()?
            .consumer
            .fetch_metadata(Some(topic), REQUEST_TIMEOUT)?;
        Ok(md
            .topics()
            .iter()
            .filter(|t| t.name() == topic)
            .flat_map(|t| t.partitions())
            .map(|p| PartitionView {
                id: p.id(),
                leader: p.leader(),
                replicas: p.replicas().len(),
                in_sync: p.isr().len(),
            })
            .collect())
    }

    /// The topic's `min.insync.replicas` (DescribeConfigs: the topic's own or the brokers'
    /// default), remembered for [`MIN_INSYNC_TTL`]; `None` if the brokers do not say (no
    /// DESCRIBE_CONFIGS permission, a topic not created yet: asked again next time). The watch
    /// asks when it first finds the topic; when asking again fails (librdkafka sends the request
    /// to the controller the metadata names, which may be down), the value known stays, and
    /// with none the broker `leader`'s own default is asked of it directly.
    fn min_insync(&mut self, topic: &str, leader: Option<i32>) -> Option<i32> {
        let now = Instant::now();
        let known = self.min_insync.get(topic).copied();
        if let Some((v, at)) = known {
            if now.saturating_duration_since(at) < MIN_INSYNC_TTL {
                return v;
            }
        }
        match self
            .describe(ResourceSpecifier::Topic(topic))
            .map(|c| c.as_ref().and_then(min_insync_of))
        {
            Ok(Some(v)) => {
                tracing::debug!(topic = %topic, min_insync = v, "min.insync.replicas");
                self.min_insync.insert(topic.to_string(), (Some(v), now));
                Some(v)
            }
            Ok(None) => {
                tracing::debug!(topic = %topic, "min.insync.replicas not described");
                known.and_then(|(v, _)| v)
            }
            Err(err) => {
                tracing::debug!(topic = %topic, error = %err, "cannot describe the topic's configs");
                match known {
                    Some((v, _)) => v,
                    None => leader.and_then(|id| {
                        self.describe(ResourceSpecifier::Broker(id))
                            .ok()
                            .flatten()
                            .as_ref()
                            .and_then(min_insync_of)
                    }),
                }
            }
        }
    }

    /// Reads the progress topic's configuration when it is due, and judges it
    /// ([`crate::progress_topic::keeping`]): `ferry_progress_topic_flawed` follows the
    /// judgement; a flaw is said at WARN, with the command that mends it, when it is first found
    /// (and again if it changes), and its mending at INFO. Due again after [`JUDGE_INTERVAL`];
    /// after [`JUDGE_RETRY`] when the read failed or its answer said nothing (refused: no
    /// DESCRIBE_CONFIGS on the topic), which changes nothing. The answer's
    /// `min.insync.replicas` is remembered as [`Worker::min_insync`] would.
    fn judge_progress_topic(&mut self) {
        let now = Instant::now();
        if self.progress_topic.is_empty() || now < self.progress_topic_due {
            return;
        }
        self.progress_topic_due = now + JUDGE_RETRY;
        let configs = match self.describe(ResourceSpecifier::Topic(&self.progress_topic)) {
            Ok(Some(configs)) => configs,
            Ok(None) => return,
            Err(err) => {
                tracing::debug!(topic = %self.progress_topic, error = %err, "cannot describe the progress topic's configs");
                return;
            }
        };
        if let Some(v) = min_insync_of(&configs) {
            self.min_insync
                .insert(self.progress_topic.clone(), (Some(v), now));
        }
        let keeping = crate::progress_topic::keeping_of(&configs);
        tracing::debug!(topic = %self.progress_topic, ?keeping, "the progress topic's configuration");
        let Some(keeping) = keeping else {
            return;
        };
        self.progress_topic_due = now + judge_interval();
        let warning = keeping.warning(&self.progress_topic);
        self.metrics
            .progress_topic_flawed
            .set_flag(warning.is_some());
        let last = self.progress_topic_flaw.take();
        match (
            &warning,
            news(last.as_deref(), warning.as_ref().map(|w| w.what.as_str())),
        ) {
            (Some(w), News::Flawed) => {
                let brokers = kafka_client::bootstrap_servers(&self.properties);
                tracing::warn!(
                    topic = %self.progress_topic,
                    "{}. Fix: {}",
                    w.what,
                    w.fix(brokers, &self.progress_topic)
                );
            }
            (_, News::Mended) => tracing::info!(
                topic = %self.progress_topic,
                "the progress topic's configuration keeps each slot's newest record now"
            ),
            _ => {}
        }
        self.progress_topic_flaw = warning.map(|w| w.what);
    }

    /// One resource's configs (blocking); `None` when the answer holds none for it. A resource
    /// the brokers refused (no DESCRIBE_CONFIGS permission) comes back with no entries, its error
    /// dropped by rdkafka 0.39.
    fn describe(
        &self,
        resource: ResourceSpecifier<'_>,
    ) -> Result<Option<ConfigResource>, KafkaError> {
        let (admin, runtime) = (&self.clients()?.admin, &self.runtime);
        let opts = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
        let results = runtime.block_on(admin.describe_configs([&resource], &opts))?;
        Ok(results.into_iter().next().and_then(Result::ok))
    }

    /// One metadata request for `topic` (blocking), through a client that never creates it.
    fn lookup(&self, topic: &str) -> Result<Found, KafkaError> {
        let md = self
            .clients()?
            .consumer
            .fetch_metadata(Some(topic), REQUEST_TIMEOUT)?;
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
        let (admin, runtime) = (&self.clients()?.admin, &self.runtime);
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

/// A partition as the metadata shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PartitionView {
    id: i32,
    /// The leader's broker id, -1 for none.
    leader: i32,
    replicas: usize,
    in_sync: usize,
}

/// The partitions of `topic` that refuse `acks=all` writes: no leader, or fewer in-sync
/// replicas than `min_insync` (when known).
fn refusals(
    topic: &str,
    partitions: &[PartitionView],
    min_insync: Option<i32>,
) -> Vec<RefusingPartition> {
    partitions
        .iter()
        .filter_map(|p| {
            let reason = if p.leader < 0 {
                Refusal::NoLeader
            } else {
                let min = min_insync?;
                if i64::try_from(p.in_sync).unwrap_or(i64::MAX) >= i64::from(min) {
                    return None;
                }
                Refusal::NotEnoughReplicas {
                    in_sync: p.in_sync,
                    replicas: p.replicas,
                    min_insync: min,
                }
            };
            Some(RefusingPartition {
                topic: topic.to_string(),
                partition: p.id,
                reason,
            })
        })
        .collect()
}

/// What changed among the refusing partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Notice {
    /// Newly refusing (`for_` zero), or still refusing [`WARN_INTERVAL`] after the last WARN.
    Refusing {
        partition: RefusingPartition,
        for_: Duration,
    },
    /// Refused writes `after` long, and no longer does (or its topic no longer waits).
    Writable {
        topic: String,
        partition: i32,
        after: Duration,
    },
}

/// The refusing partitions as last logged: when each started, and when it was last warned of.
#[derive(Debug, Default)]
struct RefusalLog(HashMap<(String, i32), (Instant, Instant)>);

impl RefusalLog {
    /// Takes the partitions refusing `now`; returns what to log, in a stable order.
    fn update(&mut self, current: &[RefusingPartition], now: Instant) -> Vec<Notice> {
        let mut notices = Vec::new();
        let mut gone: Vec<(String, i32)> = self
            .0
            .keys()
            .filter(|k| !current.iter().any(|p| p.topic == k.0 && p.partition == k.1))
            .cloned()
            .collect();
        gone.sort();
        for key in gone {
            if let Some((since, _)) = self.0.remove(&key) {
                notices.push(Notice::Writable {
                    topic: key.0,
                    partition: key.1,
                    after: now.saturating_duration_since(since),
                });
            }
        }
        for p in current {
            let key = (p.topic.clone(), p.partition);
            match self.0.get_mut(&key) {
                None => {
                    self.0.insert(key, (now, now));
                    notices.push(Notice::Refusing {
                        partition: p.clone(),
                        for_: Duration::ZERO,
                    });
                }
                Some((since, warned)) => {
                    if now.saturating_duration_since(*warned) >= WARN_INTERVAL {
                        *warned = now;
                        notices.push(Notice::Refusing {
                            partition: p.clone(),
                            for_: now.saturating_duration_since(*since),
                        });
                    }
                }
            }
        }
        notices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Java's `String.hashCode`: "hello" is 99162322, "polygenelubricants" is
    /// `Integer.MIN_VALUE` (0 by `Utils.abs`), "ferry-orders" is -940164360.
    #[test]
    fn the_coordinator_partition_follows_kafkas_formula() {
        assert_eq!(coordinator_partition("hello", 50), 99162322 % 50);
        assert_eq!(coordinator_partition("polygenelubricants", 50), 0);
        assert_eq!(coordinator_partition("ferry-orders", 50), 940164360 % 50);
        assert_eq!(
            coordinator_partition("Aa", 7),
            coordinator_partition("BB", 7)
        );
        assert_eq!(
            coordinator_partition("x", 0),
            0,
            "no partitions known: no panic"
        );
    }

    /// A flaw is said when it is new or changed, its mending once, and nothing is repeated.
    #[test]
    fn a_judgement_says_only_what_changed() {
        assert_eq!(news(None, None), News::Nothing);
        assert_eq!(news(None, Some("deletes")), News::Flawed);
        assert_eq!(news(Some("deletes"), Some("deletes")), News::Nothing);
        assert_eq!(news(Some("deletes"), Some("piles up")), News::Flawed);
        assert_eq!(news(Some("piles up"), None), News::Mended);
    }

    fn view(id: i32, leader: i32, in_sync: usize) -> PartitionView {
        PartitionView {
            id,
            leader,
            replicas: 3,
            in_sync,
        }
    }

    #[test]
    fn partitions_below_min_insync_or_without_a_leader_refuse_writes() {
        let parts = [view(0, 1, 3), view(1, 2, 2), view(2, 3, 1), view(3, -1, 0)];
        let got = refusals("t", &parts, Some(2));
        assert_eq!(
            got,
            [
                RefusingPartition {
                    topic: "t".into(),
                    partition: 2,
                    reason: Refusal::NotEnoughReplicas {
                        in_sync: 1,
                        replicas: 3,
                        min_insync: 2
                    }
                },
                RefusingPartition {
                    topic: "t".into(),
                    partition: 3,
                    reason: Refusal::NoLeader
                }
            ]
        );
        assert_eq!(
            got[0].reason.to_string(),
            "NOT_ENOUGH_REPLICAS: 1 of 3 replicas in sync, below min.insync.replicas = 2"
        );
        // min.insync.replicas = 1 accepts a lone in-sync leader; unknown judges only leaders.
        assert_eq!(refusals("t", &parts, Some(1)).len(), 1);
        assert_eq!(refusals("t", &parts, None).len(), 1);
        assert!(refusals("t", &[view(0, 1, 3)], Some(3)).is_empty());
    }

    #[test]
    fn a_refusing_partition_is_warned_of_once_then_every_interval_and_its_end_is_told() {
        let p = RefusingPartition {
            topic: "t".into(),
            partition: 1,
            reason: Refusal::NoLeader,
        };
        let mut log = RefusalLog::default();
        let t0 = Instant::now();
        assert_eq!(
            log.update(std::slice::from_ref(&p), t0),
            [Notice::Refusing {
                partition: p.clone(),
                for_: Duration::ZERO
            }]
        );
        assert!(log
            .update(std::slice::from_ref(&p), t0 + Duration::from_secs(2))
            .is_empty());
        assert_eq!(
            log.update(std::slice::from_ref(&p), t0 + WARN_INTERVAL),
            [Notice::Refusing {
                partition: p.clone(),
                for_: WARN_INTERVAL
            }]
        );
        assert!(log
            .update(
                std::slice::from_ref(&p),
                t0 + WARN_INTERVAL + Duration::from_secs(1)
            )
            .is_empty());
        assert_eq!(
            log.update(&[], t0 + Duration::from_secs(40)),
            [Notice::Writable {
                topic: "t".into(),
                partition: 1,
                after: Duration::from_secs(40)
            }]
        );
        assert!(log.update(&[], t0 + Duration::from_secs(41)).is_empty());
    }

    #[test]
    fn the_watchs_start_waits_end_on_what_they_wait_for_or_on_stop() {
        let t = Topics::default();
        let shared = &t.0;
        // Nothing sent: the wait ends at its bound, and the watch goes on.
        assert!(shared.wait_for(Duration::from_millis(5), |s| s.fresh));
        // A topic sent (from another thread): the wait ends with it, long before its bound.
        let sender = t.clone();
        std::thread::spawn(move || sender.sent("a"));
        assert!(shared.wait_for(Duration::from_secs(60), |s| s.fresh));
        // Stopping: the watch ends, whatever the bound.
        let stopper = t.clone();
        std::thread::spawn(move || {
            stopper.0.lock().stop = true;
            stopper.0.wake.notify_all();
        });
        assert!(!shared.wait_for(Duration::from_secs(60), |_| false));
    }

    /// A topic is stalled when records wait and no report came since the watch last looked.
    #[test]
    fn reports_mark_a_topic_as_flowing() {
        let t = Topics::default();
        t.sent("x");
        t.sent("x");
        t.reported("x", 1);
        let mut state = t.0.lock();
        let e = &mut state.entries[0];
        assert_eq!((e.waiting, e.reports, e.reports_seen), (1, 1, 0));
        e.reports_seen = e.reports;
        assert_eq!(e.reports, e.reports_seen, "stalled until the next report");
    }

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
