//! The producer settings every Kafka contender shares: Ferry's own, taken from
//! [`ferry::config::KafkaConfig::producer_properties`] with its defaults (idempotence,
//! `acks=all`, lz4, `linger.ms=5`, `murmur2_random`, Ferry's queue limits), so the raw producer
//! and the polling relay cannot drift from what Ferry runs with.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ferry::config::{Brokers, KafkaConfig};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, Timestamp, TopicPartitionList};

use crate::Res;

/// Topic the producers warm up on before a clock starts.
pub const WARMUP_TOPIC: &str = "bench-warmup";
/// Partitions of every benchmark topic.
pub const PARTITIONS: i32 = 6;

static COMPRESSION: OnceLock<String> = OnceLock::new();

/// Sets the codec every contender produces with (`--compression`; Ferry's default otherwise).
pub fn set_compression(codec: &str) {
    let _ = COMPRESSION.set(codec.to_owned());
}

/// The codec of this run, as `kafka.compression` spells it.
pub fn compression() -> String {
    COMPRESSION
        .get()
        .cloned()
        .unwrap_or_else(|| KafkaConfig::default().compression.as_str().to_owned())
}

/// Ferry's producer configuration for `brokers`, with `client_id` and this run's codec.
pub fn client_config(brokers: &str, client_id: &str) -> Res<ClientConfig> {
    let kafka = KafkaConfig {
        brokers: brokers.parse::<Brokers>()?,
        compression: compression().parse()?,
        ..KafkaConfig::default()
    };
    let mut cc = ClientConfig::new();
    for (k, v) in kafka.producer_properties()? {
        cc.set(k, v);
    }
    cc.set("client.id", client_id);
    Ok(cc)
}

/// The topic a contender's records go to: `order.<workload>.<contender>`.
pub fn topic(workload: &str, contender: &str) -> String {
    format!("order.{workload}.{contender}")
}

/// Sends one record and waits for its acknowledgement: an idempotent producer's first send
/// waits for its producer id, which is start-up, not throughput.
pub async fn warm_up(p: &FutureProducer) -> Res<()> {
    let r = FutureRecord::<str, str>::to(WARMUP_TOPIC)
        .key("warm-up")
        .payload("{}");
    p.send(r, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| format!("warm-up record: {e}"))?;
    Ok(())
}

/// How often a [`Watch`] asks for the high watermarks.
const WATCH_EVERY: Duration = Duration::from_millis(5);

pub(crate) fn consumer(brokers: &str) -> Res<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", ferry_testkit::pg::unique_name("ferry-bench"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("allow.auto.create.topics", "false")
        .create()?)
}

/// `topic`'s `partition`'s high watermark. A topic created a moment ago may still answer that
/// its partitions have no leader: asked again for up to 30 s.
fn high_watermark(c: &BaseConsumer, topic: &str, partition: i32) -> Res<i64> {
    let start = Instant::now();
    loop {
        match c.fetch_watermarks(topic, partition, Duration::from_secs(5)) {
            Ok((_, high)) => return Ok(high),
            Err(_) if start.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(format!("{topic} [{partition}] high watermark: {e}").into()),
        }
    }
}

/// The sum of `topic`'s partitions' high watermarks: how many records it holds (a fresh topic
/// of a producer that sends no duplicate).
pub(crate) fn high_watermarks(c: &BaseConsumer, topic: &str) -> Res<i64> {
    let mut sum = 0;
    for p in 0..PARTITIONS {
        sum += high_watermark(c, topic, p)?;
    }
    Ok(sum)
}

/// What a [`Watch`] saw: when the topic first held more than it did at the start, and when it
/// first held the target.
#[derive(Debug, Default, Clone, Copy)]
pub struct Seen {
    pub first: Option<Instant>,
    pub all: Option<Instant>,
    pub count: i64,
}

/// Watches a topic's high watermarks (summed over its partitions) from a thread of its own,
/// every 5 ms, until they reach a target: "Kafka holds all N records", the end condition every
/// contender can be held to, whatever it tells its source.
pub struct Watch {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Res<()>>>,
    pub base: i64,
    more: i64,
}

impl Watch {
    /// Starts watching `topic` for `more` records beyond what it holds now.
    pub fn start(brokers: &str, topic: &str, more: i64) -> Res<Watch> {
        Watch::begin(brokers, topic, |_| more)
    }

    /// Starts watching `topic` until it holds `total` records.
    pub fn until(brokers: &str, topic: &str, total: i64) -> Res<Watch> {
        Watch::begin(brokers, topic, |base| total - base)
    }

    fn begin(brokers: &str, topic: &str, more: impl FnOnce(i64) -> i64) -> Res<Watch> {
        let c = consumer(brokers)?;
        let base = high_watermarks(&c, topic)?;
        let more = more(base);
        let seen = Arc::new(Mutex::new(Seen {
            count: base,
            ..Seen::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st, topic) = (seen.clone(), stop.clone(), topic.to_string());
        let thread = std::thread::Builder::new()
            .name("bench-watch".into())
            .spawn(move || -> Res<()> {
                while !st.load(Ordering::Relaxed) {
                    let n = high_watermarks(&c, &topic)?;
                    let now = Instant::now();
                    let mut seen = s.lock().unwrap_or_else(|e| e.into_inner());
                    seen.count = n;
                    if n > base {
                        seen.first.get_or_insert(now);
                    }
                    if n >= base + more {
                        seen.all.get_or_insert(now);
                        return Ok(());
                    }
                    drop(seen);
                    std::thread::sleep(WATCH_EVERY);
                }
                Ok(())
            })?;
        Ok(Watch {
            seen,
            stop,
            thread: Some(thread),
            base,
            more,
        })
    }

    pub fn seen(&self) -> Seen {
        *self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until the target is reached, `alive` failing meanwhile, or `deadline` passes.
    pub async fn wait_all(
        &mut self,
        deadline: Duration,
        mut alive: impl FnMut() -> Res<()>,
    ) -> Res<Seen> {
        let start = Instant::now();
        loop {
            let seen = self.seen();
            if seen.all.is_some() {
                return Ok(seen);
            }
            if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
                let t = self.thread.take().ok_or("watch")?;
                t.join().map_err(|_| "the watch thread panicked")??;
                return Err("the watch stopped before the target".into());
            }
            alive()?;
            if start.elapsed() > deadline {
                return Err(format!(
                    "Kafka held {} of {} records after {deadline:?}",
                    seen.count - self.base,
                    self.more
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A consumer positioned at `topic`'s current end, waiting for the first record of a given
/// transaction (its payload's `seq` in `seqs`): "the first *new* record in Kafka" even when a
/// restarted relay replays what it had sent before. Assigned at the end offsets before it is
/// handed back, so that nothing sent after this returns is missed.
pub struct FirstOf {
    thread: std::thread::JoinHandle<Res<Instant>>,
}

impl FirstOf {
    pub fn start(
        brokers: &str,
        topic: &str,
        seqs: std::ops::Range<u64>,
        deadline: Duration,
    ) -> Res<FirstOf> {
        let c = consumer(brokers)?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            let end = high_watermark(&c, topic, p)?;
            tpl.add_partition_offset(topic, p, Offset::Offset(end))?;
        }
        c.assign(&tpl)?;
        let topic = topic.to_string();
        let thread = std::thread::Builder::new()
            .name("bench-first-of".into())
            .spawn(move || -> Res<Instant> {
                let start = Instant::now();
                while start.elapsed() < deadline {
                    let Some(m) = c.poll(Duration::from_millis(1)) else {
                        continue;
                    };
                    let m = m?;
                    let now = Instant::now();
                    let seq = m
                        .payload()
                        .and_then(|v| serde_json::from_slice::<serde_json::Value>(v).ok())
                        .and_then(|v| v["seq"].as_u64());
                    if seq.is_some_and(|s| seqs.contains(&s)) {
                        return Ok(now);
                    }
                }
                Err(format!("no new record in {topic} within {deadline:?}").into())
            })?;
        Ok(FirstOf { thread })
    }

    pub async fn wait(self) -> Res<Instant> {
        tokio::task::spawn_blocking(move || self.thread.join())
            .await?
            .map_err(|_| "the consumer thread panicked")?
    }
}

fn header<M: Message>(m: &M, name: &str) -> Option<String> {
    m.headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Every record `topic` holds now: its `id` header and the time the broker appended it (the
/// topic must have `message.timestamp.type=LogAppendTime`), milliseconds.
pub async fn append_times(
    brokers: &str,
    topic: &str,
    deadline: Duration,
) -> Res<Vec<(String, i64)>> {
    let c = consumer(brokers)?;
    let mut tpl = TopicPartitionList::new();
    let mut ends = Vec::new();
    for p in 0..PARTITIONS {
        ends.push(high_watermark(&c, topic, p)?);
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || -> Res<Vec<(String, i64)>> {
        let start = Instant::now();
        let mut out = Vec::new();
        let mut next = vec![0i64; ends.len()];
        while next.iter().zip(&ends).any(|(n, e)| n < e) {
            if start.elapsed() > deadline {
                return Err(format!("{topic}: {} records read in {deadline:?}", out.len()).into());
            }
            let Some(m) = c.poll(Duration::from_millis(100)) else {
                // An exactly-once Ferry's partitions end with a transaction's marker, which no
                // poll returns: the consumer's position moves past it.
                for e in c.position()?.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        let n = &mut next[e.partition() as usize];
                        *n = (*n).max(o);
                    }
                }
                continue;
            };
            let m = m?;
            next[m.partition() as usize] = m.offset() + 1;
            let Timestamp::LogAppendTime(t) = m.timestamp() else {
                return Err(format!("{topic}: a record without its log append time").into());
            };
            let id = header(&m, "id")
                .ok_or_else(|| format!("{topic}: a record without an id header"))?;
            out.push((id, t));
        }
        Ok(out)
    })
    .await?
}

/// How long `--keep-broker` loads its broker before the first run.
pub const BROKER_WARM_UP: Duration = Duration::from_secs(15);

/// Loads a new broker as the runs will, for `how_long`: produce requests of compressed batches
/// from an idempotent producer with Ferry's settings (1 KB records with an `id` header, keyed),
/// and the watermark requests a [`Watch`] sends; then deletes the topic it wrote. A broker's JIT
/// compiles its request paths in its first seconds under load, which without this fall on the
/// first workload's runs (measured: `backlog-100b` first in a `--pinned --keep-broker` matrix,
/// 65% of `pg_recvlogical` against 109% when another workload had gone first). Returns the
/// records it sent.
pub async fn warm_broker(brokers: &str, how_long: Duration) -> Res<u64> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let topic = format!("ferry-bench.broker-warm-up.{}", std::process::id());
    ferry_testkit::kafka::create_topic(brokers, &topic, PARTITIONS).await;
    let producer: BaseProducer = client_config(brokers, "ferry-bench-broker-warm-up")?.create()?;
    let watermarks = consumer(brokers)?;
    let t = topic.clone();
    let sent = tokio::task::spawn_blocking(move || -> Res<u64> {
        // Hex of a counter's hash: about as compressible as the workloads' md5 payloads.
        let payload = |n: u64| -> String {
            let mut s = String::with_capacity(1024);
            let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            while s.len() < 1000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                s.push_str(&format!("{x:016x}"));
            }
            s
        };
        let started = Instant::now();
        let mut last_watch = started;
        let mut n = 0u64;
        while started.elapsed() < how_long {
            let (key, value, id) = (format!("k{}", n % 1000), payload(n), n.to_string());
            let headers = OwnedHeaders::new().insert(Header {
                key: "id",
                value: Some(&id),
            });
            let record = BaseRecord::to(&t)
                .key(&key)
                .payload(&value)
                .headers(headers);
            match producer.send(record) {
                Ok(()) => n += 1,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    producer.poll(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(format!("broker warm-up: {e}").into()),
            }
            producer.poll(Duration::ZERO);
            if last_watch.elapsed() >= WATCH_EVERY {
                last_watch = Instant::now();
                let _ = watermarks.fetch_watermarks(&t, 0, Duration::from_secs(5));
            }
        }
        producer
            .flush(Duration::from_secs(30))
            .map_err(|e| format!("broker warm-up: flush: {e}"))?;
        Ok(n)
    })
    .await??;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    admin
        .delete_topics(&[&topic], &AdminOptions::new())
        .await
        .map_err(|e| format!("broker warm-up: deleting {topic}: {e}"))?;
    Ok(sent)
}

/// Gives the broker `n` topics of one partition (`ferry-bench.other.00000`, ...), as a cluster
/// in use holds topics Ferry never touches: every metadata request for all topics answers for
/// them. Topics that exist already are kept; returns once the broker lists all of them.
pub async fn other_topics(brokers: &str, n: u32) -> Res<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::types::RDKafkaErrorCode;

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let names: Vec<String> = (0..n)
        .map(|i| format!("ferry-bench.other.{i:05}"))
        .collect();
    for chunk in names.chunks(500) {
        let topics: Vec<NewTopic<'_>> = chunk
            .iter()
            .map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1)))
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(60)));
        for result in admin.create_topics(&topics, &options).await? {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((t, e)) => return Err(format!("creating {t}: {e}").into()),
            }
        }
    }
    // Created is not yet listed: wait until a metadata answer holds them all.
    let consumer = consumer(brokers)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let listed =
            tokio::task::block_in_place(|| consumer.fetch_metadata(None, Duration::from_secs(30)))?
                .topics()
                .iter()
                .filter(|t| t.name().starts_with("ferry-bench.other."))
                .count();
        if listed >= names.len() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{listed} of {} other topics listed after 120 s",
                names.len()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_produce_with_ferrys_settings() {
        let cc = client_config("127.0.0.1:1,127.0.0.1:2", "x").unwrap();
        assert_eq!(cc.get("bootstrap.servers"), Some("127.0.0.1:1,127.0.0.1:2"));
        assert_eq!(cc.get("enable.idempotence"), Some("true"));
        assert_eq!(cc.get("acks"), Some("all"));
        assert_eq!(cc.get("compression.codec"), Some("lz4"));
        assert_eq!(cc.get("linger.ms"), Some("1"));
        assert_eq!(cc.get("partitioner"), Some("murmur2_random"));
        assert_eq!(topic("backlog-1k", "raw"), "order.backlog-1k.raw");
    }
}
