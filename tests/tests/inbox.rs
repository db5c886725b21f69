//! `ferry inbox` end to end: real Kafka into real PostgreSQL, exactly once.

mod common;

use std::time::Duration;

use common::{wait_until, Ferry, World};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

/// What one test record is.
struct Rec {
    key: String,
    id: Option<String>,
    payload: Vec<u8>,
}

fn producer(brokers: &str) -> FutureProducer {
    rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .expect("producer")
}

async fn produce(p: &FutureProducer, topic: &str, recs: &[Rec]) {
    let sends: Vec<_> = recs
        .iter()
        .map(|r| {
            let mut headers = OwnedHeaders::new();
            if let Some(id) = &r.id {
                headers = headers.insert(Header {
                    key: "id",
                    value: Some(id.as_bytes()),
                });
            }
            p.send(
                FutureRecord::to(topic)
                    .key(&r.key)
                    .payload(&r.payload)
                    .headers(headers),
                Duration::from_secs(30),
            )
        })
        .collect();
    for s in sends {
        s.await.expect("delivered");
    }
}

fn inbox_env(world: &mut World, topic: &str, group: &str) {
    world.env.extend([
        ("FERRY_INBOX_TOPICS".to_string(), topic.to_string()),
        ("FERRY_INBOX_GROUP_ID".into(), group.to_string()),
        ("FERRY_INBOX_NOTIFY_CHANNEL".into(), "".into()),
    ]);
}

async fn count(world: &World, sql: &str) -> i64 {
    world
        .sql
        .query_one(sql, &[])
        .await
        .map(|r| r.get::<_, i64>(0))
        .unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_land_once_duplicates_by_id_are_dropped_and_poison_goes_to_dead_letters() {
    let mut world = World::new().await;
    let topic = world.create_topic("inbox", 3).await;
    inbox_env(&mut world, &topic, "g1");
    let p = producer(&world.brokers);
    let mut recs: Vec<Rec> = (0..300)
        .map(|i| Rec {
            key: format!("k{}", i % 17),
            id: Some(format!("e{i}")),
            payload: format!("{{\"n\":{i}}}").into_bytes(),
        })
        .collect();
    // Upstream duplicates (another producer's retries): same ids again.
    recs.extend((0..50).map(|i| Rec {
        key: format!("k{}", i % 17),
        id: Some(format!("e{i}")),
        payload: format!("{{\"n\":{i}}}").into_bytes(),
    }));
    // A poison record: not JSON, for a jsonb inbox.
    recs.push(Rec {
        key: "k0".into(),
        id: Some("poison".into()),
        payload: b"not json".to_vec(),
    });
    // A record PostgreSQL refuses although it is JSON (jsonb has no \u0000).
    recs.push(Rec {
        key: "k1".into(),
        id: Some("nul".into()),
        payload: br#"{"s":"a\u0000b"}"#.to_vec(),
    });
    produce(&p, &topic, &recs).await;

    let mut ferry = Ferry::spawn(&world, &["inbox"]);
    wait_until("300 rows in the inbox", Duration::from_secs(60), || async {
        count(&world, "SELECT count(*) FROM ferry_inbox").await >= 300
    })
    .await;
    wait_until("2 dead letters", Duration::from_secs(30), || async {
        count(&world, "SELECT count(*) FROM ferry_inbox_dead_letters").await >= 2
    })
    .await;
    ferry.wait_ready().await;
    assert_eq!(
        count(&world, "SELECT count(*) FROM ferry_inbox").await,
        300,
        "{}",
        ferry.log_text()
    );
    assert_eq!(
        count(&world, "SELECT count(DISTINCT event_id) FROM ferry_inbox").await,
        300
    );
    let offsets = count(
        &world,
        "SELECT coalesce(sum(next_offset), 0)::int8 FROM ferry_inbox_offsets WHERE consumer_group = 'g1'",
    )
    .await;
    assert_eq!(
        offsets,
        recs.len() as i64,
        "stored offsets cover every record"
    );
    let dups = ferry
        .metric_labeled("ferry_inbox_duplicates_total", "by", "event_id")
        .await;
    assert_eq!(dups, Some(50.0));
    let reasons: Vec<String> = world
        .sql
        .query(
            "SELECT reason FROM ferry_inbox_dead_letters ORDER BY event_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        reasons[0].contains("the database refused it"),
        "{reasons:?}"
    );
    assert!(reasons[1].contains("is not JSON"), "{reasons:?}");
    let status = ferry.terminate().await;
    assert!(status.success(), "{}", ferry.log_text());
}

async fn run_to_exit(world: &World, args: &[&str]) -> (Option<i32>, String) {
    let mut ferry = Ferry::spawn(world, args);
    let status = ferry.wait_exit(Duration::from_secs(60)).await;
    (status.code(), ferry.log_text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_what_is_missing_and_status_says_where_each_partition_is() {
    let mut world = World::new().await;
    let topic = world.create_topic("inbox", 2).await;
    let absent = world.topic("absent");
    inbox_env(&mut world, &format!("{topic},{absent}"), "g-check");
    world
        .env
        .push(("FERRY_INBOX_CREATE_TABLES".into(), "false".into()));
    let (code, out) = run_to_exit(&world, &["inbox", "check"]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("do not exist"), "{out}");
    assert!(out.contains("psql -f sql/inbox.sql"), "{out}");
    assert!(
        out.contains(&format!("topic {absent:?} does not exist")),
        "{out}"
    );
    // The same refusal from `ferry inbox` itself, before it consumes anything.
    let (code, out) = run_to_exit(&world, &["inbox"]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("do not exist; create them from sql/inbox.sql"),
        "{out}"
    );

    // The tables from the file, and only the existing topic: check passes.
    let ddl =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../sql/inbox.sql")).unwrap();
    world.sql.batch_execute(&ddl).await.unwrap();
    world.env.retain(|(k, _)| k != "FERRY_INBOX_TOPICS");
    world.env.push(("FERRY_INBOX_TOPICS".into(), topic.clone()));
    let (code, out) = run_to_exit(&world, &["inbox", "check"]).await;
    assert_eq!(code, Some(0), "{out}");

    let p = producer(&world.brokers);
    let recs: Vec<Rec> = (0..40)
        .map(|i| Rec {
            key: format!("k{i}"),
            id: Some(format!("s{i}")),
            payload: b"{}".to_vec(),
        })
        .collect();
    produce(&p, &topic, &recs).await;
    let mut ferry = Ferry::spawn(&world, &["inbox"]);
    wait_until("40 rows", Duration::from_secs(60), || async {
        count(&world, "SELECT count(*) FROM ferry_inbox").await == 40
    })
    .await;
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
    let (code, out) = run_to_exit(&world, &["inbox", "status", "--json"]).await;
    assert_eq!(code, Some(0), "{out}");
    let json: serde_json::Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(json["unprocessed_rows"], 40, "{out}");
    let parts = json["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 2, "{out}");
    for p in parts {
        assert_eq!(p["lag"], 0, "{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_or_a_closed_port_stops_the_inbox_with_what_to_fix() {
    let mut world = World::new().await;
    let topic = world.create_topic("inbox", 1).await;
    inbox_env(&mut world, &topic, "g-auth");
    let url = world.db.url.clone();
    let wrong = url.replacen("://", "://nobody:wrong@", 1);
    let wrong = if url.contains('@') {
        // The URL already names a user: replace user and password.
        let (scheme, rest) = url.split_once("://").unwrap();
        let (_, host) = rest.split_once('@').unwrap();
        format!("{scheme}://nobody:wrong@{host}")
    } else {
        wrong
    };
    world.env.push(("FERRY_POSTGRES_URL".into(), wrong));
    let (code, out) = run_to_exit(&world, &["inbox"]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("cannot connect to the inbox's PostgreSQL"),
        "{out}"
    );
    world.env.retain(|(k, _)| k != "FERRY_POSTGRES_URL");
    let port = ferry_testkit::process::free_port();
    world.env.push((
        "FERRY_POSTGRES_URL".into(),
        format!("postgres://postgres@127.0.0.1:{port}/postgres?connect_timeout=2"),
    ));
    let (code, out) = run_to_exit(&world, &["inbox"]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("cannot connect to the inbox's PostgreSQL"),
        "{out}"
    );
}

/// Ferry's own at-least-once replay, dropped by position alone (no event ids stored): the slot
/// is put back before the rows after a kill -9 (the state a kill between Kafka's acknowledgement
/// and the slot's confirmation leaves), so every row reaches Kafka twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferrys_own_replay_is_dropped_by_position_without_storing_ids() {
    let mut world = World::new().await;
    world
        .env
        .push(("FERRY_ROUTE_POSITION_HEADERS".into(), "true".into()));
    let topic = world.create_topic("order", 3).await;
    let before = format!("{}_before", world.slot);
    let mut ferry = world.start_ferry();
    ferry.wait_ready().await;
    world
        .sql
        .execute(
            "SELECT pg_copy_logical_replication_slot($1, $2)",
            &[&world.slot, &before],
        )
        .await
        .unwrap();
    for t in 0..20 {
        world.sql.batch_execute("BEGIN").await.unwrap();
        for r in 0..3 {
            world
                .insert("order", &format!("o-{}", (t + r) % 5), "Created", "{}")
                .await;
        }
        world.sql.batch_execute("COMMIT").await.unwrap();
    }
    world.consume(&topic, 60).await;
    ferry.kill9();
    world.first_pending_xid().await;
    let drop = "SELECT pg_drop_replication_slot($1)";
    world.sql.execute(drop, &[&world.slot]).await.unwrap();
    world
        .sql
        .execute(
            "SELECT pg_copy_logical_replication_slot($1, $2)",
            &[&before, &world.slot],
        )
        .await
        .unwrap();
    world.sql.execute(drop, &[&before]).await.unwrap();
    let mut ferry = world.start_ferry();
    world.consume(&topic, 120).await;
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());

    let stored =
        |table: &str| format!("SELECT count(*), count(DISTINCT headers->>'id') FROM {table}");
    // By position: each row once, no event id kept.
    inbox_env(&mut world, &topic, "by-position");
    world.env.extend([
        ("FERRY_INBOX_EVENT_ID_HEADER".to_string(), String::new()),
        ("FERRY_INBOX_POSITIONS".into(), "true".into()),
    ]);
    let mut inbox = Ferry::spawn(&world, &["inbox"]);
    let offsets = "SELECT coalesce(sum(next_offset), 0)::int8 FROM ferry_inbox_offsets WHERE consumer_group = $1";
    let covered = |group: &'static str| {
        let sql = &world.sql;
        async move {
            sql.query_one(offsets, &[&group])
                .await
                .map(|r| r.get::<_, i64>(0))
                .unwrap_or(0)
                >= 120
        }
    };
    wait_until(
        "the inbox read all 120 records",
        Duration::from_secs(60),
        || covered("by-position"),
    )
    .await;
    let r = world
        .sql
        .query_one(&stored("ferry_inbox"), &[])
        .await
        .unwrap();
    assert_eq!(
        (r.get::<_, i64>(0), r.get::<_, i64>(1)),
        (60, 60),
        "{}",
        inbox.log_text()
    );
    assert_eq!(
        inbox
            .metric_labeled("ferry_inbox_duplicates_total", "by", "position")
            .await,
        Some(60.0)
    );
    let dedup = count(&world, "SELECT count(*) FROM ferry_inbox_dedup").await;
    assert_eq!(dedup, 0, "no event id stored");
    assert!(inbox.terminate().await.success(), "{}", inbox.log_text());

    // The control: without positions (and without ids) every copy is stored.
    world.env.retain(|(k, _)| !k.starts_with("FERRY_INBOX_"));
    inbox_env(&mut world, &topic, "control");
    world.env.extend([
        ("FERRY_INBOX_EVENT_ID_HEADER".to_string(), String::new()),
        ("FERRY_INBOX_TABLE".into(), "control_inbox".into()),
    ]);
    let mut inbox = Ferry::spawn(&world, &["inbox"]);
    wait_until("the control read all 120 records", Duration::from_secs(60), || async {
        world
            .sql
            .query_one(
                "SELECT coalesce(sum(next_offset), 0)::int8 FROM control_inbox_offsets WHERE consumer_group = 'control'",
                &[],
            )
            .await
            .map(|r| r.get::<_, i64>(0))
            .unwrap_or(0)
            >= 120
    })
    .await;
    let r = world
        .sql
        .query_one(&stored("control_inbox"), &[])
        .await
        .unwrap();
    assert_eq!((r.get::<_, i64>(0), r.get::<_, i64>(1)), (120, 60));
    assert!(inbox.terminate().await.success(), "{}", inbox.log_text());
}
