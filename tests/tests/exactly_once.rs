//! Exactly-once mode (`kafka.exactly_once`) end to end: the real binary, real PostgreSQL, Apache
//! Kafka with its transaction coordinator. Ferry is killed (`kill -9`, by its own failpoint) at every
//! boundary of the commit protocol, then started again: a read_committed consumer sees every
//! row exactly once and in order per key, while a read_uncommitted one sees what the killed
//! transactions left behind (so the mode is really transactional).

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

const PARTITIONS: i32 = 3;
const KEYS: usize = 5;

/// A world in exactly-once mode with its own progress topic, and its outbox topic created.
async fn world(interval: &str) -> (World, String) {
    world_on(World::new().await, interval).await
}

/// [`world`] on a given world (another broker).
async fn world_on(mut w: World, interval: &str) -> (World, String) {
    let progress = format!("{}.progress", w.topic_prefix);
    w.env.extend([
        ("FERRY_KAFKA_EXACTLY_ONCE".to_string(), "true".to_string()),
        ("FERRY_KAFKA_PROGRESS_TOPIC".into(), progress),
        ("FERRY_KAFKA_TRANSACTION_INTERVAL".into(), interval.into()),
        ("FERRY_KAFKA_TRANSACTION_MAX_RECORDS".into(), "40".into()),
    ]);
    let topic = w.create_topic("order", PARTITIONS).await;
    (w, topic)
}

/// Inserts `txns` transactions of `rows` rows each; row `i` has key `k{i % KEYS}` and payload
/// `{"n": i}`, so per key the `n`s must arrive ascending.
async fn insert(w: &World, from: usize, txns: usize, rows: usize) -> usize {
    let mut n = from;
    for _ in 0..txns {
        let mut sql = String::from("BEGIN;");
        for _ in 0..rows {
            sql.push_str(&format!(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'k{}', 'Created', '{{\"n\": {n}}}');",
                n % KEYS
            ));
            n += 1;
        }
        sql.push_str("COMMIT;");
        w.sql.batch_execute(&sql).await.expect("insert");
    }
    n
}

/// Every record of `topic` up to its current end, with `isolation.level`: (key, n) in
/// partition order.
fn read_all(brokers: &str, topic: &str, isolation: &str) -> Vec<(String, u64)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("eos-check-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("isolation.level", isolation)
        .create()
        .expect("consumer");
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .expect("watermarks");
        if high <= low {
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, Offset::Offset(low))
            .unwrap();
        consumer.assign(&tpl).expect("assign");
        let mut last_message = Instant::now();
        loop {
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                last_message = Instant::now();
                let m = m.expect("consume");
                let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                let v: serde_json::Value =
                    serde_json::from_slice(m.payload().unwrap_or_default()).expect("json");
                let n = v
                    .get("n")
                    .or_else(|| v.get("payload").and_then(|p| p.get("n")))
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or_else(|| panic!("no n in {v}"));
                out.push((key, n));
            }
            let pos = consumer
                .position()
                .ok()
                .and_then(|t| t.find_partition(topic, p).map(|e| e.offset()));
            if matches!(pos, Some(Offset::Offset(o)) if o >= high) {
                break;
            }
            // read_committed stops at the last stable offset: an open transaction of a killed
            // producer holds it until the next Ferry's init_transactions aborts it. (Measured
            // from the last message, so a long partition is read to its end.)
            if last_message.elapsed() > Duration::from_secs(5) {
                break;
            }
        }
    }
    out
}

async fn read(brokers: &str, topic: &str, isolation: &'static str) -> Vec<(String, u64)> {
    let (b, t) = (brokers.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || read_all(&b, &t, isolation))
        .await
        .unwrap()
}

/// Every commit of a transaction holding records waits `ms` first, and a transaction has no cap
/// of records: one stays open long enough to be seen, paused or killed (an interval does not
/// keep it open: it commits once its records are in and the stream pauses).
fn hold_commits(w: &mut World, ms: u64) {
    w.env.extend([
        (
            "FERRY_KAFKA_TRANSACTION_MAX_RECORDS".into(),
            "100000".into(),
        ),
        ("FERRY_KAFKA_MAX_IN_FLIGHT_RECORDS".into(), "400000".into()),
        ("FERRY_TEST_HOLD_COMMIT_MS".into(), ms.to_string()),
    ]);
}

/// Waits until Ferry created its slot (rows inserted before it would never be streamed).
async fn slot_created(w: &World) {
    wait_until("the slot exists", Duration::from_secs(60), || async {
        w.confirmed_lsn().await.is_some()
    })
    .await;
}

/// Exactly once, and per key ascending.
fn assert_exactly_once(records: &[(String, u64)], total: usize) {
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut last: HashMap<&str, u64> = HashMap::new();
    for (key, n) in records {
        *seen.entry(*n).or_default() += 1;
        if let Some(prev) = last.insert(key, *n) {
            assert!(prev < *n, "key {key}: {n} after {prev}");
        }
    }
    let dups: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).collect();
    assert!(dups.is_empty(), "duplicates (n, times): {dups:?}");
    let missing: Vec<u64> = (0..total as u64)
        .filter(|n| !seen.contains_key(n))
        .collect();
    assert!(missing.is_empty(), "missing: {missing:?}");
    assert_eq!(records.len(), total);
}

/// Kills Ferry at `failpoint` (its `hit`th time), restarts it, and checks the topic.
async fn killed_at(failpoint: &str, hit: u32) {
    let (mut w, topic) = world("20ms").await;
    // A first life creates the slot and stops; the rows wait as a backlog, so the failpoint's
    // transactions carry rows from the first.
    let mut creator = w.start_ferry();
    creator.wait_ready().await;
    let status = creator.terminate().await;
    assert!(status.success(), "{status}:\n{}", creator.log_text());
    let total = insert(&w, 0, 40, 10).await;
    w.env
        .push(("FERRY_TEST_FAILPOINT".into(), format!("{failpoint}:{hit}")));
    let mut first = w.start_ferry();
    let status = first.wait_exit(Duration::from_secs(90)).await;
    assert!(
        first.log_text().contains(&format!("failpoint {failpoint}")),
        "ferry exited ({status}) without reaching {failpoint}:\n{}",
        first.log_text()
    );
    let before = read(&w.brokers, &topic, "read_committed").await.len();
    if failpoint == "committed" {
        assert!(
            before > 0 && before < total,
            "killed after a commit, in the middle: {before} of {total} rows committed"
        );
    }
    if failpoint == "confirmed" {
        assert!(before > 0, "killed after a confirm with nothing committed");
    }
    w.env.retain(|(k, _)| k != "FERRY_TEST_FAILPOINT");
    // More rows while it is down, then the second life.
    let total = insert(&w, total, 10, 10).await;
    let second = w.start_ferry();
    all_in_once_and_confirmed(&w, &topic, total).await;
    drop(second);
}

/// Waits until `total` rows are committed in `topic` and the slot is confirmed past the WAL
/// written so far, then checks that each row is there exactly once, in order per key.
async fn all_in_once_and_confirmed(w: &World, topic: &str, total: usize) {
    let brokers = w.brokers.clone();
    wait_until("every row committed", Duration::from_secs(120), || {
        let (b, t) = (brokers.clone(), topic.to_string());
        async move { read(&b, &t, "read_committed").await.len() >= total }
    })
    .await;
    let end = w.current_wal_lsn().await;
    wait_until("the slot confirmed", Duration::from_secs(60), || async {
        w.confirmed_lsn().await.is_some_and(|l| l >= end)
    })
    .await;
    assert_exactly_once(&read(&w.brokers, topic, "read_committed").await, total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_records_sent_every_row_arrives_exactly_once() {
    killed_at("records_sent", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_progress_sent_every_row_arrives_exactly_once() {
    killed_at("progress_sent", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_while_the_commit_is_in_flight_every_row_arrives_exactly_once() {
    killed_at("commit_sent", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_commit_before_the_slot_confirm_every_row_arrives_exactly_once() {
    killed_at("committed", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_slot_confirm_every_row_arrives_exactly_once() {
    killed_at("confirmed", 2).await;
}

/// A transaction killed before its commit is visible to read_uncommitted and never to
/// read_committed; after the restart read_committed holds every row once, read_uncommitted
/// holds more (the aborted copies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_transactions_are_invisible_to_read_committed_only() {
    // A transaction that stays open long enough to be seen and killed.
    let (mut w, topic) = world("100ms").await;
    hold_commits(&mut w, 600_000);
    let mut first = w.start_ferry();
    slot_created(&w).await;
    let total = insert(&w, 0, 20, 10).await;
    let brokers = w.brokers.clone();
    // Its first transaction's records (it may have committed before the rest were read: the
    // commit is held, and nothing more is produced meanwhile).
    wait_until(
        "the open transaction's records on the broker",
        Duration::from_secs(60),
        || {
            let (b, t) = (brokers.clone(), topic.clone());
            async move { !read(&b, &t, "read_uncommitted").await.is_empty() }
        },
    )
    .await;
    first.kill9();
    let aborted = read(&w.brokers, &topic, "read_uncommitted").await.len();
    let committed = read(&w.brokers, &topic, "read_committed").await;
    assert!(
        committed.is_empty(),
        "read_committed saw {} records of a transaction never committed",
        committed.len()
    );
    w.env.retain(|(k, _)| k != "FERRY_TEST_HOLD_COMMIT_MS");
    let second = w.start_ferry();
    wait_until("every row committed", Duration::from_secs(120), || {
        let (b, t) = (brokers.clone(), topic.clone());
        async move { read(&b, &t, "read_committed").await.len() >= total }
    })
    .await;
    assert_exactly_once(&read(&w.brokers, &topic, "read_committed").await, total);
    // The transaction metrics: the commit that carried the rows is counted and timed; nothing
    // of this instance was aborted (the killed one's transaction was aborted by the fencing).
    // One scrape, so the two samples are of one moment (up to the one commit in between the
    // counter and the histogram).
    let (_, body) = second.http_get("/metrics").await.expect("/metrics");
    let sample = |name: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{body}"))
    };
    let committed = sample("ferry_kafka_transactions_committed_total");
    let timed = sample("ferry_kafka_transaction_commit_seconds_count");
    assert!(committed >= 1.0, "no commit counted: {committed}");
    assert!(
        (timed - committed).abs() <= 1.0,
        "every commit is timed: {committed} committed, {timed} timed"
    );
    assert_eq!(
        second
            .metric("ferry_kafka_transactions_aborted_total")
            .await,
        Some(0.0)
    );
    let all = read(&w.brokers, &topic, "read_uncommitted").await;
    assert!(
        all.len() >= total + aborted,
        "read_uncommitted should also see the {aborted} aborted copies: {} records for {total} rows",
        all.len()
    );
}

/// `ferry check` says what exactly-once needs: transactions, the brokers' transaction timeout
/// against Ferry's, the progress topic, read_committed consumers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_what_exactly_once_needs() {
    let (w, _topic) = world("100ms").await;
    let mut ferry = Ferry::spawn(&w, &["check"]);
    let status = ferry.wait_exit(Duration::from_secs(60)).await;
    let out = ferry.log_text();
    assert_eq!(status.code(), Some(0), "{out}");
    for want in [
        "note: exactly-once: the brokers serve the transaction APIs Ferry uses (FindCoordinator, InitProducerId, AddPartitionsToTxn, EndTxn)",
        "note: exactly-once: a transactional producer initialises",
        "exactly-once: the progress topic",
        "isolation.level=read_committed",
        "transaction.max.timeout.ms",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
}

/// Zombie: the first Ferry is paused (SIGSTOP) with the slot taken from it; a second one takes
/// over and fences it. Resumed, the first can never commit again: it exits, naming the
/// transactional.id, and nothing appears twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_instance_is_fenced_by_its_successor_and_exits() {
    // The paused instance must hold an open transaction (a producer with nothing open learns
    // of its fencing only when it next writes): its commit is held 15 s, past the pause, and
    // checked below.
    let (mut w, topic) = world("100ms").await;
    hold_commits(&mut w, 15_000);
    let mut first = w.start_ferry();
    slot_created(&w).await;
    let total = insert(&w, 0, 10, 10).await;
    // Its records are produced (read_uncommitted sees them), its transaction still open.
    let brokers = w.brokers.clone();
    wait_until(
        "the first instance produced",
        Duration::from_secs(60),
        || {
            let (b, t) = (brokers.clone(), topic.clone());
            async move { !read(&b, &t, "read_uncommitted").await.is_empty() }
        },
    )
    .await;
    let pid = first.pid().expect("running");
    let stop = |sig: &str| {
        std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill")
    };
    stop("-STOP");
    assert!(
        read(&w.brokers, &topic, "read_committed").await.is_empty(),
        "the first instance committed before it was paused: the test needs its transaction open"
    );
    // Its walsender goes (as after a network partition), so the second can take the slot.
    w.sql
        .execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL",
            &[&w.slot],
        )
        .await
        .unwrap();
    // The successor commits at once.
    w.env.retain(|(k, _)| k != "FERRY_TEST_HOLD_COMMIT_MS");
    let _second = w.start_ferry();
    wait_until(
        "the second instance committed",
        Duration::from_secs(120),
        || {
            let (b, t) = (brokers.clone(), topic.clone());
            async move { read(&b, &t, "read_committed").await.len() >= total }
        },
    )
    .await;
    stop("-CONT");
    let status = first.wait_exit(Duration::from_secs(90)).await;
    let log = first.log_text();
    assert!(!status.success(), "the fenced instance exited 0:\n{log}");
    assert!(
        log.contains("another Ferry instance fenced this one"),
        "no fencing error in:\n{log}"
    );
    let total = insert(&w, total, 2, 10).await;
    wait_until("the later rows committed", Duration::from_secs(120), || {
        let (b, t) = (brokers.clone(), topic.clone());
        async move { read(&b, &t, "read_committed").await.len() >= total }
    })
    .await;
    assert_exactly_once(&read(&w.brokers, &topic, "read_committed").await, total);
}

/// One PostgreSQL transaction of 100,000 rows spans many Kafka transactions (the position is
/// exact inside it); Ferry is killed after the 10th commit, in its middle, and the restart
/// skips exactly the rows already committed. (1,000,000 rows by hand: see the report.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_transaction_killed_in_the_middle_arrives_exactly_once() {
    // FERRY_TEST_EOS_ROWS=1000000 for the by-hand run.
    let rows: usize = std::env::var("FERRY_TEST_EOS_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let (mut w, topic) = world("100ms").await;
    w.env
        .push(("FERRY_KAFKA_TRANSACTION_MAX_RECORDS".into(), "4000".into()));
    w.env
        .push(("FERRY_TEST_FAILPOINT".into(), "committed:10".into()));
    let mut first = w.start_ferry();
    slot_created(&w).await;
    w.sql
        .batch_execute(&format!(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
             SELECT 'order', 'k' || (g % {KEYS}), 'Created', jsonb_build_object('n', g) \
             FROM generate_series(0, {}) g",
            rows - 1
        ))
        .await
        .unwrap();
    first.wait_exit(Duration::from_secs(120)).await;
    assert!(
        first.log_text().contains("failpoint committed"),
        "{}",
        first.log_text()
    );
    let partial = read(&w.brokers, &topic, "read_committed").await.len();
    assert!(
        partial > 0 && partial < rows,
        "killed in the middle: {partial} of {rows} committed"
    );
    w.env.retain(|(k, _)| k != "FERRY_TEST_FAILPOINT");
    let end = w.current_wal_lsn().await;
    let second = w.start_ferry();
    // The slot is confirmed only up to what a committed Kafka transaction holds: once it passes
    // the insert, every row is committed. (Cheap to poll; the topic is read once, after.)
    wait_until(
        "the slot confirmed past the insert",
        Duration::from_secs(900),
        || async { w.confirmed_lsn().await.is_some_and(|l| l >= end) },
    )
    .await;
    let started = Instant::now();
    let committed = read(&w.brokers, &topic, "read_committed").await;
    eprintln!(
        "read back {} records in {:.1} s",
        committed.len(),
        started.elapsed().as_secs_f64()
    );
    assert_exactly_once(&committed, rows);
    let hwm = std::fs::read_to_string(format!("/proc/{}/status", second.pid().unwrap()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(str::to_string)
        });
    eprintln!("{rows} rows in one transaction: second instance peak {hwm:?}");
}

/// At-least-once → exactly-once on one slot: the exactly-once start resumes from the progress
/// record the at-least-once Ferry wrote (before each confirmation) and skips what it covers;
/// after a graceful stop nothing is produced twice. Then back to at-least-once: nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_from_at_least_once_to_exactly_once_and_back_loses_nothing() {
    let (mut w, topic) = world("20ms").await;
    let eos: Vec<(String, String)> = w
        .env
        .iter()
        .filter(|(k, _)| k.starts_with("FERRY_KAFKA_EXACTLY_ONCE"))
        .cloned()
        .collect();
    w.env
        .retain(|(k, _)| !k.starts_with("FERRY_KAFKA_EXACTLY_ONCE"));
    // At-least-once: creates the slot, relays the first rows, stops gracefully.
    let mut alo = w.start_ferry();
    alo.wait_ready().await;
    slot_created(&w).await;
    let total = insert(&w, 0, 10, 10).await;
    let brokers = w.brokers.clone();
    wait_until("the at-least-once rows", Duration::from_secs(60), || {
        let (b, t) = (brokers.clone(), topic.clone());
        async move { read(&b, &t, "read_committed").await.len() >= total }
    })
    .await;
    let status = alo.terminate().await;
    assert!(status.success(), "{status}:\n{}", alo.log_text());
    // Exactly-once on the same slot: no --initialize-progress needed, nothing repeated.
    w.env.extend(eos.iter().cloned());
    let total = insert(&w, total, 10, 10).await;
    let mut exactly = w.start_ferry();
    wait_until("the exactly-once rows", Duration::from_secs(60), || {
        let (b, t) = (brokers.clone(), topic.clone());
        async move { read(&b, &t, "read_committed").await.len() >= total }
    })
    .await;
    let status = exactly.terminate().await;
    assert!(status.success(), "{status}:\n{}", exactly.log_text());
    assert_exactly_once(&read(&w.brokers, &topic, "read_committed").await, total);
    // Its start-up log says where it resumes in words, not in Rust's Debug form
    // (`Some((Lsn(0/…), None))`).
    let log = exactly.log_text();
    let resuming = log
        .lines()
        .find(|l| l.contains("exactly-once: resuming from the progress topic"))
        .unwrap_or_else(|| panic!("no resume line in\n{log}"));
    assert!(
        resuming.contains("remembered=0/") || resuming.contains("remembered=\"0/"),
        "{resuming}"
    );
    for debug in ["Some(", "None", "Lsn(", "Partial {"] {
        assert!(!log.contains(debug), "{debug:?} in\n{log}");
    }
    // Back to at-least-once: it resumes from the slot, which exactly-once confirmed only up to
    // what Kafka committed; after a graceful stop, again nothing twice.
    w.env
        .retain(|(k, _)| !k.starts_with("FERRY_KAFKA_EXACTLY_ONCE"));
    let total = insert(&w, total, 5, 10).await;
    let mut back = w.start_ferry();
    wait_until(
        "the rows after switching back",
        Duration::from_secs(60),
        || {
            let (b, t) = (brokers.clone(), topic.clone());
            async move { read(&b, &t, "read_committed").await.len() >= total }
        },
    )
    .await;
    let status = back.terminate().await;
    assert!(status.success(), "{status}:\n{}", back.log_text());
    assert_exactly_once(&read(&w.brokers, &topic, "read_committed").await, total);
}

/// The broker goes down and comes back while Ferry streams in exactly-once mode, with a
/// transaction open (100 ms transactions under a steady writer: one is always open): Kafka's
/// transaction coordinator aborts it or keeps it across the restart, never loses it, and
/// Ferry, which stays up, aborts and starts over from what Kafka holds. Every row arrives
/// exactly once, in order per key.
async fn broker_restart_mid_transaction(sigkill: bool) {
    let broker = ferry_testkit::kafka::LocalBroker::start().await;
    let db = ferry_testkit::pg::shared().create_db().await;
    let (w, topic) = world_on(World::on(db, broker.brokers()).await, "100ms").await;
    let ferry = w.start_ferry();
    slot_created(&w).await;
    let writer = Writer::start(&w).await;
    // Rows committed in Kafka before the fault, and transactions open at it.
    let brokers = w.brokers.clone();
    wait_until(
        "rows committed before the fault",
        Duration::from_secs(60),
        || {
            let (b, t) = (brokers.clone(), topic.clone());
            async move { read(&b, &t, "read_committed").await.len() >= 50 }
        },
    )
    .await;
    tokio::task::block_in_place(|| {
        if sigkill {
            broker.kill()
        } else {
            broker.stop()
        }
    });
    // The writer goes on while the broker is away; Ferry holds what it cannot commit.
    writer.wait_rows(writer.rows() + 100).await;
    tokio::task::block_in_place(|| broker.start_again());
    writer.wait_rows(writer.rows() + 100).await;
    let total = writer.stop().await;
    all_in_once_and_confirmed(&w, &topic, total).await;
    let log = ferry.log_text();
    assert!(
        !log.contains("permanent error"),
        "Ferry stopped over a broker restart:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_broker_restart_with_a_transaction_open_loses_and_repeats_nothing() {
    broker_restart_mid_transaction(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_with_a_transaction_open_loses_and_repeats_nothing() {
    broker_restart_mid_transaction(true).await;
}

/// A steady writer: single-row transactions, row `n` with key `k{n % KEYS}`, on its own
/// connection, until stopped.
struct Writer {
    rows: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<usize>,
}

impl Writer {
    async fn start(w: &World) -> Writer {
        let sql = w.db.client().await;
        let rows = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let count = rows.clone();
        let task = tokio::spawn(async move {
            let mut n = 0usize;
            while !*stopped.borrow_and_update() {
                sql.batch_execute(&format!(
                    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
                     VALUES ('order', 'k{}', 'Created', '{{\"n\": {n}}}')",
                    n % KEYS
                ))
                .await
                .expect("insert");
                n += 1;
                count.store(n, std::sync::atomic::Ordering::Release);
                // Paced, not synchronizing: about 500 rows/s, so a fault meets a steady stream.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            n
        });
        Writer { rows, stop, task }
    }

    fn rows(&self) -> usize {
        self.rows.load(std::sync::atomic::Ordering::Acquire)
    }

    async fn wait_rows(&self, n: usize) {
        wait_until("the writer's rows", Duration::from_secs(60), || async {
            self.rows() >= n
        })
        .await;
    }

    async fn stop(self) -> usize {
        let _ = self.stop.send(true);
        self.task.await.expect("writer")
    }
}

/// A standby in exactly-once mode takes over from a Ferry killed with kill -9: every row once,
/// in order per key. It judges the answer on transactions it asked while it stood by, rather
/// than asking on the take-over's path (16–23 ms of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_judging_the_answer_it_asked_while_it_waited() {
    let (mut w, topic) = world("100ms").await;
    w.env.extend([
        (
            "FERRY_POSTGRES_STANDBY_POLL_INTERVAL".into(),
            "200ms".into(),
        ),
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MAX".into(), "1s".into()),
    ]);
    let mut first = w.start_ferry();
    first.wait_ready().await;
    let total = insert(&w, 0, 5, 4).await;
    let mut standby = w.start_ferry();
    wait_until("the second stands by", Duration::from_secs(30), || async {
        standby.metric("ferry_standby").await == Some(1.0)
    })
    .await;
    let stood_by = Instant::now();
    // Polls go by (every 200 ms) before the take-over.
    wait_until("two seconds of polls", Duration::from_secs(30), || async {
        stood_by.elapsed() >= Duration::from_secs(2)
    })
    .await;
    first.kill9();
    let total = insert(&w, total, 5, 4).await;
    wait_until(
        "the standby takes over",
        Duration::from_secs(60),
        || async { standby.metric("ferry_streaming").await == Some(1.0) },
    )
    .await;
    all_in_once_and_confirmed(&w, &topic, total).await;
    let log = standby.log_text();
    let judged: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("serve the transaction APIs Ferry uses"))
        .filter_map(|l| l.split("asked_ms_ago=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(judged.len(), 1, "one session, one judgement:\n{log}");
    assert!(
        judged[0] >= 1_000,
        "the take-over asked on its path ({} ms before judging):\n{log}",
        judged[0]
    );
    assert!(
        standby.terminate().await.success(),
        "{}",
        standby.log_text()
    );
}

/// A shutdown whose drain ends with the session's last commit confirms what that commit holds
/// before Ferry exits: the slot is at the last transaction's end, not at the commit before it
/// (the commit's reports ended the relay core's drain, and the commit came after).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_confirms_what_its_last_commit_holds() {
    use ferry_testkit::pg;
    let pg = pg::Postgres::Local(pg::PgCluster::start(pg::ClusterOptions::default()).await);
    let broker = ferry_testkit::kafka::LocalBroker::start().await;
    // No commit at the interval while the broker is paused: once the records are in.
    let (w, topic) = world_on(
        World::on(pg.create_db().await, broker.brokers()).await,
        "6s",
    )
    .await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let first = insert(&w, 0, 1, 5).await;
    let end = w.current_wal_lsn().await;
    wait_until(
        "the first transaction confirmed",
        Duration::from_secs(60),
        || async { w.confirmed_lsn().await.is_some_and(|c| c >= end) },
    )
    .await;

    // The second transaction's records wait for the paused broker when the shutdown begins.
    broker.pause_node(0);
    let total = insert(&w, first, 1, 5).await;
    let end = w.current_wal_lsn().await;
    wait_until("the records in flight", Duration::from_secs(30), || async {
        ferry.metric("ferry_in_flight_records").await == Some(5.0)
    })
    .await;
    ferry.send_signal(libc::SIGTERM);
    ferry
        .wait_log("shutting down: draining", Duration::from_secs(30))
        .await;
    broker.resume_node(0);
    let status = ferry.wait_exit(Duration::from_secs(60)).await;
    assert!(status.success(), "{}", ferry.log_text());
    assert_exactly_once(&read(&w.brokers, &topic, "read_committed").await, total);
    let slot = w.confirmed_lsn().await.expect("slot");
    assert!(
        slot >= end,
        "the slot ({slot}) is behind the last transaction ({end}) its last commit held; log:\n{}",
        ferry.log_text()
    );
}
