//! Sequenced outbox events for the failure scenarios: written in commit order, read back, and
//! checked against the two rules that hold under at-least-once delivery.
//!
//! Events are outbox rows of aggregate type `ev`, aggregate id (the record key) `k-<seq % 8>`
//! and payload `{"seq": <seq>, "pad": "xx…"}`. `seq` is global and increases in commit order
//! (one writer, rows inserted in `seq` order). After a restart Ferry replays from the slot's
//! checkpoint, so a key's partition may read `A, B, A, B`. Hence:
//!
//! - **no loss** ([`assert_no_loss`]): every inserted `seq` is consumed at least once;
//! - **per-key order** ([`assert_key_order`]): for each key, its partition read in offset order
//!   with every `seq` kept at its *first* occurrence is exactly that key's `seq`s in increasing
//!   (commit) order, no more, no fewer. Checking the raw sequence would reject correct
//!   replays; checking only the set would accept a reordering.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::time::{Duration, Instant};

use ferry_testkit::{kafka, pg};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

/// Aggregate type of every event (the topic is `<prefix>.ev`).
pub const AGGREGATE: &str = "ev";
/// Distinct keys (aggregate ids).
pub const KEYS: u64 = 8;
/// How long reading a topic back may take.
const CONSUME_DEADLINE: Duration = Duration::from_secs(90);

/// Inserts the events `seqs` in one transaction, in `seq` order, with `pad` bytes of padding.
pub async fn insert_events(sql: &tokio_postgres::Client, seqs: Range<u64>, pad: i32) {
    if seqs.is_empty() {
        return;
    }
    sql.execute(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
         SELECT 'ev', 'k-' || (g % $3), 'Happened', jsonb_build_object('seq', g, 'pad', repeat('x', $4))
         FROM generate_series($1::bigint, $2::bigint) AS g ORDER BY g",
        &[
            &(seqs.start as i64),
            &(seqs.end as i64 - 1),
            &(KEYS as i64),
            &pad,
        ],
    )
    .await
    .expect("insert events");
}

/// One consumed event.
#[derive(Debug)]
pub struct Event {
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    pub seq: u64,
}

/// Reads `topic` from the beginning until every `seq` of `expected` arrived at least once (or
/// panics at the deadline saying what is missing); returns what was read, by partition and
/// offset.
pub async fn consume_events(brokers: &str, topic: &str, expected: Range<u64>) -> Vec<Event> {
    let (brokers, topic) = (brokers.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || consume_blocking(&brokers, &topic, expected))
        .await
        .expect("consume task")
}

fn consume_blocking(brokers: &str, topic: &str, expected: Range<u64>) -> Vec<Event> {
    let parts = kafka::partition_count(brokers, topic)
        .unwrap_or_else(|| panic!("topic {topic} does not exist"));
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", pg::unique_name("ferry-failures"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..parts {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("partition offset");
    }
    consumer.assign(&tpl).expect("assign");
    let mut missing: HashSet<u64> = expected.clone().collect();
    let mut out = Vec::new();
    let start = Instant::now();
    while !missing.is_empty() {
        assert!(
            start.elapsed() < CONSUME_DEADLINE,
            "after {CONSUME_DEADLINE:?}, {} of {} events never arrived in {topic} \
             (lowest missing seq {:?}; {} records read)",
            missing.len(),
            expected.end - expected.start,
            missing.iter().min(),
            out.len()
        );
        let m = match consumer.poll(Duration::from_millis(100)) {
            None => continue,
            Some(m) => m.unwrap_or_else(|e| panic!("consume {topic}: {e}")),
        };
        let value: serde_json::Value =
            serde_json::from_slice(m.payload().expect("a payload")).expect("JSON payload");
        let seq = value["seq"].as_u64().expect("seq in the payload");
        missing.remove(&seq);
        out.push(Event {
            partition: m.partition(),
            offset: m.offset(),
            key: String::from_utf8(m.key().expect("a key").to_vec()).expect("UTF-8 key"),
            seq,
        });
    }
    out.sort_by_key(|e| (e.partition, e.offset));
    out
}

/// Every `seq` of `expected` arrived at least once, and nothing else did.
pub fn assert_no_loss(events: &[Event], expected: Range<u64>) {
    let got: HashSet<u64> = events.iter().map(|e| e.seq).collect();
    let want: HashSet<u64> = expected.collect();
    let mut missing: Vec<_> = want.difference(&got).collect();
    let mut unexpected: Vec<_> = got.difference(&want).collect();
    missing.sort();
    unexpected.sort();
    assert!(
        missing.is_empty() && unexpected.is_empty(),
        "missing {missing:?}, unexpected {unexpected:?}"
    );
}

/// The per-key order rule of the module docs (which implies no loss): per key, the first
/// occurrences in offset order are exactly that key's `seq`s of `expected`, ascending.
pub fn assert_key_order(events: &[Event], expected: Range<u64>) {
    let mut seen = HashSet::new();
    let mut firsts: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut partition_of: BTreeMap<&str, i32> = BTreeMap::new();
    for e in events {
        assert_eq!(e.key, key_of(e.seq), "key of seq {}", e.seq);
        let p = *partition_of.entry(&e.key).or_insert(e.partition);
        assert_eq!(p, e.partition, "key {} in two partitions", e.key);
        if seen.insert(e.seq) {
            firsts.entry(&e.key).or_default().push(e.seq);
        }
    }
    for k in 0..KEYS {
        let key = format!("k-{k}");
        let want: Vec<u64> = expected.clone().filter(|s| s % KEYS == k).collect();
        let got = firsts.get(key.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        if got != want.as_slice() {
            let at = got
                .iter()
                .zip(&want)
                .position(|(g, w)| g != w)
                .unwrap_or(got.len().min(want.len()));
            let lo = at.saturating_sub(3);
            panic!(
                "key {key}: first occurrences differ from commit order at position {at}: \
                 got {:?}…, want {:?}… ({} vs {} events)",
                &got[lo..(at + 4).min(got.len())],
                &want[lo..(at + 4).min(want.len())],
                got.len(),
                want.len()
            );
        }
    }
}

fn key_of(seq: u64) -> String {
    format!("k-{}", seq % KEYS)
}
