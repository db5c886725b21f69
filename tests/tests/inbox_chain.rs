//! The whole outbox pattern end to end, under kill -9: an outbox database → `ferry run`
//! (at-least-once) → Kafka → `ferry inbox` → an inbox database. Both Ferrys are killed with
//! SIGKILL and started again while a writer commits rows with per-key sequence numbers; at the
//! end every committed row is in the inbox exactly once and in per-key order, and no rolled-back
//! row is: `ferry run`'s replays after a kill (it sets the `id` header to the row's id) are
//! dropped by the inbox's deduplication. `ferry-bench chaos --chain` is the longer form.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{wait_until, Ferry, World};
use ferry_testkit::pg;

const PARTITIONS: i32 = 3;
const KEYS: u64 = 8;

/// What the writer committed and rolled back: id → (key, seq).
#[derive(Default)]
struct Truth {
    committed: HashMap<String, (String, i64)>,
    rolled_back: Vec<String>,
}

/// Commits transactions of 1-4 rows over `KEYS` keys (one in seven rolled back) until `stop`.
async fn write(sql: tokio_postgres::Client, truth: Arc<Mutex<Truth>>, stop: Arc<AtomicBool>) {
    let mut seqs: BTreeMap<String, i64> = BTreeMap::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let rollback = n % 7 == 0;
        let mut rows = Vec::new();
        for i in 0..(n % 4 + 1) {
            let key = format!("k{}", (n * 3 + i) % KEYS);
            let seq = seqs.entry(key.clone()).or_default();
            if !rollback {
                *seq += 1;
            }
            rows.push((key, *seq));
        }
        let values: Vec<String> = rows
            .iter()
            .map(|(k, s)| format!("('chain', '{k}', 'Changed', '{{\"key\":\"{k}\",\"seq\":{s}}}')"))
            .collect();
        let insert = format!(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES {} \
             RETURNING id::text",
            values.join(", ")
        );
        if rollback {
            sql.batch_execute("BEGIN").await.unwrap();
        }
        let ids: Vec<String> = sql
            .query(&insert, &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        if rollback {
            sql.batch_execute("ROLLBACK").await.unwrap();
            truth.lock().unwrap().rolled_back.extend(ids);
        } else {
            let mut t = truth.lock().unwrap();
            for (id, row) in ids.into_iter().zip(rows) {
                t.committed.insert(id, row);
            }
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outbox_row_reaches_the_inbox_once_in_key_order_through_kill_9_of_both() {
    let world = World::new().await;
    let topic = world.create_topic("chain", PARTITIONS).await;
    let inbox_db = pg::shared().create_db().await;
    let inbox_sql = inbox_db.client().await;
    let inbox_env = |cmd: &mut std::process::Command| {
        cmd.env("FERRY_POSTGRES_URL", &inbox_db.url)
            .env("FERRY_INBOX_TOPICS", &topic)
            .env("FERRY_INBOX_GROUP_ID", "chain")
            // A consumer killed with SIGKILL stays in its group until its session expires.
            .env("FERRY_KAFKA_PROPERTIES_SESSION_TIMEOUT_MS", "6000")
            .env("FERRY_KAFKA_PROPERTIES_HEARTBEAT_INTERVAL_MS", "1000");
    };
    let mut relay = world.start_ferry();
    relay.wait_ready().await;
    let mut inbox = Ferry::spawn_with(&world, &["inbox"], inbox_env);

    let truth = Arc::new(Mutex::new(Truth::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(write(world.db.client().await, truth.clone(), stop.clone()));
    // Kills: the relay, the inbox, both at once, the relay, the inbox; 4 s apart.
    for (i, (relay_too, inbox_too)) in [
        (true, false),
        (false, true),
        (true, true),
        (true, false),
        (false, true),
    ]
    .into_iter()
    .enumerate()
    {
        tokio::time::sleep(Duration::from_millis(3_000 + 700 * i as u64)).await;
        if relay_too {
            relay.kill9();
            relay = world.start_ferry();
        }
        if inbox_too {
            inbox.kill9();
            inbox = Ferry::spawn_with(&world, &["inbox"], inbox_env);
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    let truth = std::mem::take(&mut *truth.lock().unwrap());
    let want = truth.committed.len();
    assert!(want > 500, "the writer committed only {want} rows");

    // Everything committed reaches the inbox (and the inbox reaches the topic's end).
    wait_until(
        "every committed row in the inbox",
        Duration::from_secs(90),
        || async {
            inbox_sql
                .query_one("SELECT count(DISTINCT event_id) FROM ferry_inbox", &[])
                .await
                .map(|r| r.get::<_, i64>(0) as usize >= want)
                .unwrap_or(false)
        },
    )
    .await;
    let end: i64 = tokio::task::block_in_place(|| {
        let c: rdkafka::consumer::BaseConsumer = rdkafka::config::ClientConfig::new()
            .set("bootstrap.servers", &world.brokers)
            .create()
            .unwrap();
        (0..PARTITIONS)
            .map(|p| {
                rdkafka::consumer::Consumer::fetch_watermarks(
                    &c,
                    &topic,
                    p,
                    Duration::from_secs(10),
                )
                .unwrap()
                .1
            })
            .sum()
    });
    wait_until(
        "the inbox's offsets at the topic's end",
        Duration::from_secs(60),
        || async {
            inbox_sql
                .query_one(
                    "SELECT coalesce(sum(next_offset), 0)::int8 FROM ferry_inbox_offsets",
                    &[],
                )
                .await
                .map(|r| r.get::<_, i64>(0) >= end)
                .unwrap_or(false)
        },
    )
    .await;

    let rows = inbox_sql
        .query(
            "SELECT event_id, payload->>'key', (payload->>'seq')::int8 FROM ferry_inbox \
             ORDER BY \"partition\", \"offset\"",
            &[],
        )
        .await
        .unwrap();
    let mut seen: HashMap<String, ()> = HashMap::new();
    let mut last: HashMap<String, i64> = HashMap::new();
    let mut problems = Vec::new();
    for r in &rows {
        let (id, key, seq): (String, String, i64) = (r.get(0), r.get(1), r.get(2));
        if seen.insert(id.clone(), ()).is_some() {
            problems.push(format!("duplicate: {id}"));
        }
        match truth.committed.get(&id) {
            Some((k, s)) if *k == key && *s == seq => {}
            Some(other) => problems.push(format!(
                "{id} stored as {key}#{seq}, committed as {other:?}"
            )),
            None => problems.push(format!("phantom: {id} ({key}#{seq})")),
        }
        let prev = last.insert(key.clone(), seq).unwrap_or(0);
        if seq != prev + 1 {
            problems.push(format!("order: {key}#{seq} after #{prev}"));
        }
    }
    let lost = truth
        .committed
        .keys()
        .filter(|id| !seen.contains_key(*id))
        .count();
    let dead: i64 = inbox_sql
        .query_one("SELECT count(*) FROM ferry_inbox_dead_letters", &[])
        .await
        .unwrap()
        .get(0);
    problems.truncate(20);
    assert!(
        problems.is_empty() && lost == 0 && dead == 0,
        "{lost} lost, {dead} dead letters, {} rows stored of {want} committed ({} rolled back), \
         {end} records in Kafka; first problems: {problems:#?}\n--- ferry inbox log ---\n{}",
        rows.len(),
        truth.rolled_back.len(),
        inbox.log_text()
    );
    assert_eq!(rows.len(), want);
    eprintln!(
        "{want} rows committed, {} rolled back, {end} records in Kafka: {} replays dropped by the inbox",
        truth.rolled_back.len(),
        end - want as i64
    );
    assert!(inbox.is_running() && relay.is_running());
    assert!(inbox.terminate().await.success(), "{}", inbox.log_text());
    relay.terminate().await;
}

/// A batch made only of records whose ids the inbox stored before (a relay's replay after a
/// restart) stores nothing: its rows were copied in whole when none of its ids was new (found by
/// the chain above: 5 duplicates in the inbox in 60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_nothing_but_known_ids_stores_nothing() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};

    let world = World::new().await;
    let topic = world.create_topic("replayed", 1).await;
    let inbox_db = pg::shared().create_db().await;
    let inbox_sql = inbox_db.client().await;
    let p: FutureProducer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", &world.brokers)
        .create()
        .unwrap();
    let produce = |ids: std::ops::Range<u32>| {
        let (p, topic) = (&p, &topic);
        async move {
            for i in ids {
                let id = format!("e{i}");
                p.send(
                    FutureRecord::to(topic)
                        .key("k")
                        .payload(&format!("{{\"n\":{i}}}"))
                        .headers(OwnedHeaders::new().insert(Header {
                            key: "id",
                            value: Some(&id),
                        })),
                    Duration::from_secs(30),
                )
                .await
                .expect("delivered");
            }
        }
    };
    let stored = |n: i64| {
        let sql = &inbox_sql;
        async move {
            sql.query_one(
                "SELECT coalesce(sum(next_offset), 0)::int8 FROM ferry_inbox_offsets",
                &[],
            )
            .await
            .map(|r| r.get::<_, i64>(0) >= n)
            .unwrap_or(false)
        }
    };
    produce(0..20).await;
    let mut inbox = Ferry::spawn_with(&world, &["inbox"], |cmd| {
        cmd.env("FERRY_POSTGRES_URL", &inbox_db.url)
            .env("FERRY_INBOX_TOPICS", &topic)
            .env("FERRY_INBOX_GROUP_ID", "replayed");
    });
    wait_until("20 records stored", Duration::from_secs(60), || stored(20)).await;
    // The same ids again, after the first ones were committed: batches of known ids only.
    produce(5..15).await;
    wait_until("30 records consumed", Duration::from_secs(60), || {
        stored(30)
    })
    .await;
    let rows: i64 = inbox_sql
        .query_one("SELECT count(*) FROM ferry_inbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 20, "{}", inbox.log_text());
    assert_eq!(
        inbox
            .metric_labeled("ferry_inbox_duplicates_total", "by", "event_id")
            .await,
        Some(10.0)
    );
    assert!(inbox.terminate().await.success());
}
