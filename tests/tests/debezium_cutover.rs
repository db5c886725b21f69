//! The cutover users will do: Debezium relays the outbox under a steady writer; Connect is
//! stopped; `ferry config from-debezium` translates the connector JSON and the worker file; Ferry
//! starts on **Debezium's own slot** (the documented adoption step: nothing in at-least-once mode,
//! `--initialize-progress` once in exactly-once mode) while the writer goes on. Then the way
//! back: Ferry stops, Connect starts again with the connector stopped, its offsets are reset
//! (`DELETE /connectors/NAME/offsets`: they point before the slot's position, which Ferry moved
//! on, and Debezium refuses to start there), and it resumes from the slot's position.
//!
//! An independent consumer (`read_committed`) checks:
//! - every row the writer committed is in Kafka at least once: no gap at either switch;
//! - each key's records stay in one partition, and each key's events arrive in commit order
//!   (a replayed range repeats, it never goes back past it);
//! - a row relayed by both (the duplicate window) has the same key, value and headers from each
//!   (Debezium's `__debezium.context.*` headers aside);
//! - the duplicate window is measured and printed: how many rows both relayed.
//!
//! Connect runs with its default `offset.flush.interval.ms` (60 s), as users run it.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::debezium::{connector, translate, without_context_headers, CONTEXT_HEADER_PREFIX};
use common::{wait_until, Ferry, World};
use ferry_testkit::debezium::{self, Connect, ConnectOptions};
use ferry_testkit::kafka::{self, Consumed};
use ferry_testkit::pg;

const PARTITIONS: i32 = 3;
const KEYS: u64 = 17;

/// A writer committing one outbox row per transaction until told to stop; each row's payload
/// carries its sequence number.
struct Writer {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start(world: &World, at: &str) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let (s, w, url, at) = (
            stop.clone(),
            written.clone(),
            world.db.url.clone(),
            at.to_string(),
        );
        let task = tokio::spawn(async move {
            let sql = pg::connect(&url).await;
            let mut seq = 0u64;
            while !s.load(Ordering::Relaxed) {
                seq += 1;
                sql.execute(
                    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
                     VALUES ($1, $2, 'Moved', $3::text::jsonb)",
                    &[
                        &at,
                        &format!("key-{}", seq % KEYS),
                        &format!("{{\"seq\": {seq}, \"note\": \"ü😀\"}}"),
                    ],
                )
                .await
                .expect("writer insert");
                w.store(seq, Ordering::Release);
                // A steady, modest rate (~500 rows/s at most): one commit per row.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        Writer {
            stop,
            written,
            task,
        }
    }

    fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// Waits until `n` more rows than now are committed.
    async fn wait_more(&self, n: u64) {
        let target = self.written() + n;
        let w = self.written.clone();
        wait_until(
            "the writer commits more rows",
            Duration::from_secs(60),
            || {
                let w = w.clone();
                async move { w.load(Ordering::Acquire) >= target }
            },
        )
        .await;
    }

    async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("writer task");
        self.written.load(Ordering::Acquire)
    }
}

/// Reads the topic until every sequence number up to `rows` has arrived, then on to its end
/// (panics at the deadline: a gap).
async fn read_all(brokers: &str, topic: &str, rows: u64) -> Vec<Consumed> {
    kafka::consume_until(
        brokers,
        topic,
        &format!("rows 1..={rows} (a row missing is a gap)"),
        Duration::from_secs(180),
        move |got| {
            let seen: std::collections::HashSet<u64> = got.iter().map(seq_of).collect();
            (1..=rows).all(|s| seen.contains(&s))
        },
    )
    .await
}

fn seq_of(r: &Consumed) -> u64 {
    let v: serde_json::Value =
        serde_json::from_slice(r.value.as_deref().expect("a value")).expect("a JSON payload");
    v["seq"].as_u64().expect("seq")
}

fn from_debezium(r: &Consumed) -> bool {
    r.headers
        .iter()
        .any(|(n, _)| n.starts_with(CONTEXT_HEADER_PREFIX))
}

/// The checks of the module documentation; returns the rows both relayed, each with whether
/// Debezium's copy came first (the switch to Ferry) or Ferry's (the switch back).
fn check(records: &[Consumed], rows: u64, mode: &str) -> Vec<(u64, bool)> {
    let mut partition_of: HashMap<Vec<u8>, i32> = HashMap::new();
    let mut by_seq: BTreeMap<u64, Vec<&Consumed>> = BTreeMap::new();
    let mut per_partition: BTreeMap<i32, Vec<&Consumed>> = BTreeMap::new();
    for r in records {
        let key = r.key.clone().expect("a key");
        let p = *partition_of.entry(key.clone()).or_insert(r.partition);
        assert_eq!(
            p,
            r.partition,
            "{mode}: key {:?} moved from partition {p} to {} at the switch",
            String::from_utf8_lossy(&key),
            r.partition
        );
        by_seq.entry(seq_of(r)).or_default().push(r);
        per_partition.entry(r.partition).or_default().push(r);
    }
    // Commit order per key: in offset order, a key's sequence numbers only rise, except where
    // a replay starts again at or after the last one confirmed (never before the first).
    for rs in per_partition.values_mut() {
        rs.sort_by_key(|r| r.offset);
        let mut last: HashMap<&[u8], u64> = HashMap::new();
        let mut highest: HashMap<&[u8], u64> = HashMap::new();
        for r in rs.iter() {
            let key = r.key.as_deref().expect("key");
            let s = seq_of(r);
            if let Some(&prev) = last.get(key) {
                if s < prev {
                    // A replay: it must repeat rows already sent, never skip one.
                    assert!(
                        by_seq[&s].len() > 1,
                        "{mode}: key {:?} went back from {prev} to {s}, which was not sent before",
                        String::from_utf8_lossy(key)
                    );
                }
            }
            last.insert(key, s);
            let h = highest.entry(key).or_insert(0);
            *h = (*h).max(s);
        }
    }
    let mut both = Vec::new();
    for (seq, rs) in &by_seq {
        assert!(*seq >= 1 && *seq <= rows, "{mode}: a phantom row {seq}");
        let dbz: Vec<_> = rs.iter().filter(|r| from_debezium(r)).collect();
        let fer: Vec<_> = rs.iter().filter(|r| !from_debezium(r)).collect();
        if let (Some(d), Some(f)) = (dbz.first(), fer.first()) {
            both.push((*seq, d.offset < f.offset));
            let dh = without_context_headers(&d.headers);
            assert_eq!(
                (&d.key, &d.value, &dh, d.partition),
                (&f.key, &f.value, &f.headers, f.partition),
                "{mode}: row {seq} differs between Debezium and Ferry"
            );
        }
    }
    both
}

/// The slot, publication and route come from the translated file alone, as for a user: the
/// test world's environment would override them.
fn from_the_file(c: &mut std::process::Command) {
    for var in [
        "FERRY_ROUTE_TOPIC",
        "FERRY_POSTGRES_SLOT",
        "FERRY_POSTGRES_PUBLICATION",
    ] {
        c.env_remove(var);
    }
}

async fn cutover(exactly_once: bool) {
    let mode = if exactly_once {
        "exactly-once"
    } else {
        "at-least-once"
    };
    let mut world = World::new().await;
    let at = world.topic_prefix.replace('_', "-");
    let topic = format!("outbox.event.{at}");
    kafka::create_topic(&world.brokers, &topic, PARTITIONS).await;
    // Debezium's slot and publication: the ones Ferry adopts.
    world.slot = format!("{}_dbz", world.topic_prefix);
    world
        .sql
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE outbox",
            world.publication
        ))
        .await
        .expect("create publication");
    let config = connector(&world.db, &world.slot, &world.publication);
    let worker = [
        (
            "key.converter",
            "org.apache.kafka.connect.storage.StringConverter",
        ),
        (
            "value.converter",
            "org.apache.kafka.connect.storage.StringConverter",
        ),
    ];
    let connect_dir = std::env::temp_dir().join(pg::unique_name("ferry-cutover-connect"));
    let connect_opts = ConnectOptions {
        // Connect's default offset flush interval, as users run it.
        worker: vec!["offset.flush.interval.ms=60000".into()],
        dir: Some(connect_dir.clone()),
        ..ConnectOptions::new(&world.brokers)
    };
    let connect = Connect::start(connect_opts.clone()).await;
    connect.put_connector("outbox", &config);
    connect.wait_running("outbox", Duration::from_secs(120));
    debezium::wait_slot_active(&world.sql, &world.slot, Duration::from_secs(60)).await;

    // Debezium relays under the writer.
    let writer = Writer::start(&world, &at);
    writer.wait_more(400).await;
    let debezium_saw = writer.written();
    kafka::consume(
        &world.brokers,
        &topic,
        debezium_saw as usize,
        Duration::from_secs(120),
    )
    .await;

    // Stop Connect (SIGTERM: it commits its offsets); the writer goes on.
    let stopped_at = writer.written();
    connect.stop();
    drop(connect);
    let confirmed = world.confirmed_lsn().await.expect("Debezium's slot");

    // Translate and adopt the slot.
    let dir = std::env::temp_dir().join(pg::unique_name("ferry-cutover"));
    let (toml, notes) = translate(&dir, "outbox", &config, &worker, &world.brokers);
    world.env.extend([
        ("FERRY_CONFIG".to_string(), toml.display().to_string()),
        ("FERRY_KAFKA_EXACTLY_ONCE".into(), exactly_once.to_string()),
    ]);
    if exactly_once {
        // Without the adoption step, exactly-once mode refuses a slot it has no progress record
        // for, and names the step.
        let mut refused = Ferry::spawn_with(&world, &["run"], from_the_file);
        let status = refused.wait_exit(Duration::from_secs(60)).await;
        let log = refused.log_text();
        assert!(
            !status.success() && log.contains("ferry run --initialize-progress"),
            "{mode}: a first start on Debezium's slot should name --initialize-progress ({status}):\n{log}"
        );
    }
    let args: &[&str] = if exactly_once {
        &["run", "--initialize-progress"]
    } else {
        &["run"]
    };
    let mut ferry = Ferry::spawn_with(&world, args, from_the_file);
    ferry.wait_ready().await;
    writer.wait_more(400).await;

    // The way back: stop Ferry; start Connect again with the connector stopped, forget its
    // offsets (they point before the slot's position, which Ferry moved on, and Debezium
    // refuses to start there), and resume it: it continues from the slot's position.
    // No gap at the switch to Ferry: every row committed so far reaches Kafka while Ferry runs,
    // checked before Debezium comes back, whose replay from its own position could fill one.
    let ferry_upto = writer.written();
    read_all(&world.brokers, &topic, ferry_upto).await;
    let _ = ferry.terminate().await;
    let ferry_log = ferry.log_text();
    let back_at = writer.written();
    let connect = Connect::start(connect_opts).await;
    connect.create_connector_stopped("outbox", &config);
    connect.reset_offsets("outbox");
    connect.resume("outbox");
    connect.wait_running("outbox", Duration::from_secs(120));
    writer.wait_more(300).await;
    let rows = writer.finish().await;

    let records = read_all(&world.brokers, &topic, rows).await;
    let dup_rows = records.len() - rows as usize;
    let both = check(&records, rows, mode);
    let (to_ferry, back): (Vec<_>, Vec<_>) = both.iter().partition(|(_, dbz_first)| *dbz_first);
    let to_ferry: Vec<u64> = to_ferry.iter().map(|(s, _)| *s).collect();
    let back: Vec<u64> = back.iter().map(|(s, _)| *s).collect();
    eprintln!(
        "{mode} cutover: {rows} rows; Debezium stopped after row {stopped_at} (slot confirmed at \
         {confirmed}), Ferry ran until row {back_at}, Debezium again to the end; {dup_rows} \
         records were duplicates: {} rows relayed by both at the switch to Ferry {to_ferry:?}, \
         {} at the switch back {back:?}",
        to_ferry.len(),
        back.len()
    );
    assert!(
        ferry_log.contains("no progress record remembers it"),
        "{mode}: Ferry's log does not say it adopted the slot:\n{ferry_log}"
    );
    drop(connect);
    let _ = std::fs::remove_dir_all(&dir);
    // The translation told the user what Ferry does not send.
    assert!(
        notes.contains("extended.headers.enabled"),
        "{mode}: from-debezium did not name Debezium's context headers:\n{notes}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cutover_from_debezium_at_least_once_and_back() {
    cutover(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cutover_from_debezium_exactly_once_and_back() {
    cutover(true).await;
}
