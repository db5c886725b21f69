//! The Kafka side of `ferry inbox`: a consumer on its own thread. It hands records, assignments
//! and revocations to the async side in order, and carries out the seeks and advisory commits
//! the machine asks for. A revocation blocks the rebalance until the machine says the partitions
//! are no longer written (eager protocol), so the next owner starts after the last write.

use std::collections::HashMap;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_core::inbox::{InboxRecord, Partition, SeekTo};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;

/// What the consumer thread tells the async side, in the order it happened.
#[derive(Debug)]
pub enum Event {
    Records(Vec<InboxRecord>),
    Assigned(Vec<Partition>),
    /// The rebalance waits until `done` is answered.
    Revoked {
        partitions: Vec<Partition>,
        done: std_mpsc::Sender<()>,
    },
    /// The consumer cannot go on (a fatal client error).
    Failed(String),
}

/// What the async side asks of the consumer thread.
#[derive(Debug)]
pub enum Command {
    Seek {
        partition: Partition,
        to: SeekTo,
        epoch: u64,
    },
    Commit(Vec<(Partition, i64)>),
    Stop,
}

struct Context {
    events: mpsc::Sender<Event>,
    /// How long a revocation may wait for the machine.
    revoke_wait: Duration,
}

impl ClientContext for Context {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        crate::kafka_access::observe(None, message);
        let message = crate::kafka_access::relayed(None, message);
        match level {
            // An advisory commit that failed (the member lost its partitions, the coordinator
            // moved) changes nothing: the database holds the offsets, and the next commit
            // after a write goes again.
            _ if fac == "COMMITFAIL" => {
                tracing::debug!(facility = fac, "librdkafka (inbox consumer): {message}")
            }
            // Said by `error` below at WARN: the same text comes as an error event.
            _ if crate::kafka_client::also_an_error_event(level, fac) => {
                tracing::debug!(facility = fac, "librdkafka (inbox consumer): {message}")
            }
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(facility = fac, "librdkafka (inbox consumer): {message}")
            }
            L::Warning => tracing::warn!(facility = fac, "librdkafka (inbox consumer): {message}"),
            _ => tracing::debug!(facility = fac, "librdkafka (inbox consumer): {message}"),
        }
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        crate::kafka_access::observe(error.rdkafka_error_code(), reason);
        let reason = crate::kafka_access::relayed(error.rdkafka_error_code(), reason);
        tracing::warn!(%error, "Kafka (inbox consumer): {reason}");
    }
}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, _c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let partitions = partitions_of(tpl);
            if partitions.is_empty() {
                return;
            }
            let (done, wait) = std_mpsc::channel();
            if self
                .events
                .blocking_send(Event::Revoked {
                    partitions: partitions.clone(),
                    done,
                })
                .is_ok()
                && wait.recv_timeout(self.revoke_wait).is_err()
            {
                tracing::warn!(
                    partitions = %list(&partitions),
                    "a revocation did not wait for the write in flight ({:?}): the next owner may be fenced by it, or fence it",
                    self.revoke_wait
                );
            }
        }
    }

    fn post_rebalance(&self, c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            // Nothing is fetched until the machine seeks each partition to its stored offset.
            if let Err(e) = c.pause(tpl) {
                tracing::warn!(error = %e, "cannot pause newly assigned partitions");
            }
            let _ = self
                .events
                .blocking_send(Event::Assigned(partitions_of(tpl)));
        }
    }
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<Partition> {
    tpl.elements()
        .iter()
        .map(|e| Partition::new(e.topic(), e.partition()))
        .collect()
}

fn list(p: &[Partition]) -> String {
    p.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Holds secrets (the properties): never printed.
pub struct Settings {
    pub properties: Vec<(String, String)>,
    pub group: String,
    pub topics: Vec<String>,
    pub start: Offset,
    pub revoke_wait: Duration,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("group", &self.group)
            .field("topics", &self.topics)
            .finish_non_exhaustive()
    }
}

/// Starts the consumer thread. Records come in `Event::Records` of up to `burst` records.
pub fn spawn(
    settings: Settings,
    events: mpsc::Sender<Event>,
    commands: std_mpsc::Receiver<Command>,
) -> Result<std::thread::JoinHandle<()>, String> {
    let mut cc = crate::kafka_client::config(
        &settings.properties,
        crate::kafka_client::Role::InboxConsumer,
    );
    cc.set("group.id", &settings.group);
    // librdkafka prefetches up to 64 MiB by default (queued.max.messages.kbytes) in fetch
    // responses of up to 50 MiB (fetch.max.bytes), each kept whole while a record of it is
    // queued: on top of what the machine buffers (inbox.max_buffered_bytes) and the write in
    // flight, that took the peak RSS draining a backlog of 1 KB records to 470 MiB. Smaller
    // prefetch, smaller responses; a value in kafka.properties wins.
    for (property, value) in PREFETCH {
        if !settings.properties.iter().any(|(k, _)| k == property) {
            cc.set(property, value);
        }
    }
    let consumer: BaseConsumer<Context> = cc
        .create_with_context(Context {
            events: events.clone(),
            revoke_wait: settings.revoke_wait,
        })
        .map_err(|e| {
            format!(
                "cannot create the Kafka consumer: {e}; check the [kafka] properties \
                 (FERRY_KAFKA_PROPERTIES_*): `ferry inbox check` names the one at fault"
            )
        })?;
    let topics: Vec<&str> = settings.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics).map_err(|e| {
        format!(
            "cannot subscribe to {}: {e}; check inbox.topics (a topic name or a ^regex)",
            settings.topics.join(", ")
        )
    })?;
    let start = settings.start;
    std::thread::Builder::new()
        .name("ferry-inbox-consumer".into())
        .spawn(move || run(consumer, events, commands, start))
        .map_err(|e| format!("cannot start the consumer thread: {e}"))
}

/// How often the offsets the database committed are committed to Kafka (advice for lag
/// monitors; Ferry starts from the database's). One OffsetCommit per transaction was up to
/// hundreds a second at low rates, each work for the group coordinator.
const ADVISE_EVERY: Duration = Duration::from_millis(200);

/// Records handed to the async side at a time.
pub const BURST: usize = 1_000;

/// The consumer's prefetch: its queue (KiB) and the most a fetch response holds (bytes; Kafka
/// still returns a record batch larger than that whole). One fetch is in flight per broker, so
/// the response size bounds the rate: draining 1 KB records into a bytea inbox, 1 MiB responses
/// gave 34,000 records/s with the writer idle a third of the time, 4 MiB 41,000-44,000 (peak
/// RSS 131 -> 172-175 MiB; jsonb, writer-bound either way: 139 -> 185 MiB).
const PREFETCH: [(&str, &str); 2] = [
    ("queued.max.messages.kbytes", "16384"),
    ("fetch.max.bytes", "4194304"),
];

fn run(
    consumer: BaseConsumer<Context>,
    events: mpsc::Sender<Event>,
    commands: std_mpsc::Receiver<Command>,
    start: Offset,
) {
    let mut epochs: HashMap<(Arc<str>, i32), u64> = HashMap::new();
    let mut topics: HashMap<String, Arc<str>> = HashMap::new();
    let mut burst = Vec::with_capacity(BURST);
    // The advisory commits, merged: the latest offset of each partition, sent every ADVISE_EVERY.
    let mut advice: HashMap<(Arc<str>, i32), i64> = HashMap::new();
    let mut advised = Instant::now();
    loop {
        loop {
            match commands.try_recv() {
                Ok(Command::Stop) | Err(std_mpsc::TryRecvError::Disconnected) => {
                    commit(&consumer, &mut advice);
                    consumer.unsubscribe();
                    return;
                }
                Ok(Command::Seek {
                    partition,
                    to,
                    epoch,
                }) => seek(&consumer, &partition, to, start, epoch, &mut epochs),
                Ok(Command::Commit(offsets)) => {
                    for (p, next) in offsets {
                        advice.insert((p.topic, p.partition), next);
                    }
                }
                Err(std_mpsc::TryRecvError::Empty) => break,
            }
        }
        if !advice.is_empty() && advised.elapsed() >= ADVISE_EVERY {
            commit(&consumer, &mut advice);
            advised = Instant::now();
        }
        let timeout = if burst.is_empty() {
            Duration::from_millis(50)
        } else {
            Duration::ZERO
        };
        match consumer.poll(timeout) {
            Some(Ok(m)) => {
                let topic = match topics.get(m.topic()) {
                    Some(t) => t.clone(),
                    None => {
                        let t: Arc<str> = m.topic().into();
                        topics.insert(m.topic().to_owned(), t.clone());
                        t
                    }
                };
                let epoch = epochs
                    .get(&(topic.clone(), m.partition()))
                    .copied()
                    .unwrap_or(0);
                burst.push(record(&m, topic, epoch));
                if burst.len() < BURST {
                    continue;
                }
            }
            Some(Err(e)) => {
                if let rdkafka::error::KafkaError::MessageConsumptionFatal(_) = e {
                    let _ = events.blocking_send(Event::Failed(e.to_string()));
                    return;
                }
                tracing::debug!(error = %e, "Kafka consumer");
            }
            None => {}
        }
        if !burst.is_empty() {
            let records = std::mem::replace(&mut burst, Vec::with_capacity(BURST));
            if events.blocking_send(Event::Records(records)).is_err() {
                return;
            }
        }
    }
}

fn seek(
    consumer: &BaseConsumer<Context>,
    p: &Partition,
    to: SeekTo,
    start: Offset,
    epoch: u64,
    epochs: &mut HashMap<(Arc<str>, i32), u64>,
) {
    let offset = match to {
        SeekTo::Offset(n) => Offset::Offset(n),
        SeekTo::Start => start,
    };
    // Records fetched from here on carry the new epoch; anything older is dropped by the machine.
    epochs.insert((p.topic.clone(), p.partition), epoch);
    let mut tpl = TopicPartitionList::new();
    if let Err(e) = tpl.add_partition_offset(&p.topic, p.partition, offset) {
        tracing::warn!(partition = %p, error = %e, "cannot seek");
        return;
    }
    if let Err(e) = consumer.seek_partitions(tpl.clone(), Duration::from_secs(10)) {
        tracing::warn!(partition = %p, error = %e, "seek failed");
    }
    if let Err(e) = consumer.resume(&tpl) {
        tracing::warn!(partition = %p, error = %e, "cannot resume");
    }
}

/// Commits (and forgets) `advice`, each partition's next offset the database holds.
fn commit(consumer: &BaseConsumer<Context>, advice: &mut HashMap<(Arc<str>, i32), i64>) {
    if advice.is_empty() {
        return;
    }
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), next) in advice.drain() {
        let _ = tpl.add_partition_offset(&topic, partition, Offset::Offset(next));
    }
    // Advisory only: the database holds the offsets Ferry starts from.
    if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
        tracing::debug!(error = %e, "advisory offset commit");
    }
}

fn record(m: &rdkafka::message::BorrowedMessage<'_>, topic: Arc<str>, epoch: u64) -> InboxRecord {
    let headers = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| (h.key.to_owned(), h.value.map(Bytes::copy_from_slice)))
                .collect()
        })
        .unwrap_or_default();
    InboxRecord {
        partition: Partition {
            topic,
            partition: m.partition(),
        },
        offset: m.offset(),
        epoch,
        key: m.key().map(Bytes::copy_from_slice),
        payload: m.payload().map(Bytes::copy_from_slice),
        headers,
        timestamp_ms: m.timestamp().to_millis(),
    }
}
