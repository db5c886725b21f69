//! Ferry's promises under load, idleness, failover, bad rows and shutdown, end to end with the
//! real binary: per-aggregate order across concurrent writers, a slot that advances while the
//! outbox is idle, a hot standby that takes over, the three poison-row policies, and a SIGTERM
//! that drains before exiting 0.
//!
//! **The ordering rule under at-least-once delivery.** A crash or a reconnect may replay records
//! already in Kafka, so a key's records can read `1 2 3 2 3 4`. What Ferry promises, and what
//! [`assert_per_key_order`] checks, is: per key, in partition offset order, the *first*
//! occurrence of each event forms exactly the commit order `1, 2, ..., n` (every event is there,
//! and no event's first copy overtakes an earlier one's).

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use ferry_testkit::kafka::{Consumed, LocalBroker};
use ferry_testkit::pg;

const PARTITIONS: i32 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_aggregate_order_holds_across_concurrent_writers() {
    const WRITERS: usize = 4;
    const AGGREGATES: usize = 20;
    const EVENTS_PER_WRITER: usize = 500;
    let w = World::new().await;
    let topic = w.create_topic("order", PARTITIONS).await;
    // One counter per aggregate, bumped in the transaction that inserts its event: the row lock
    // makes a second writer of the same aggregate wait for the first one's commit, so per
    // aggregate the sequence number is the commit order.
    w.sql
        .batch_execute(&format!(
            "CREATE TABLE counters (aggregateid text PRIMARY KEY, seq bigint NOT NULL);
             INSERT INTO counters SELECT 'agg-' || i, 0 FROM generate_series(0, {}) i;",
            AGGREGATES - 1
        ))
        .await
        .unwrap();
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;

    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let mut client = w.db.client().await;
        writers.push(tokio::spawn(async move {
            let mut rng = Lcg(writer as u64 + 1);
            let mut written = Vec::new();
            while written.len() < EVENTS_PER_WRITER {
                // 1 to 3 distinct aggregates per transaction, locked in a fixed order (no deadlocks).
                let want = (1 + rng.next() % 3).min((EVENTS_PER_WRITER - written.len()) as u64);
                let mut aggs: Vec<usize> = (0..want)
                    .map(|_| (rng.next() % AGGREGATES as u64) as usize)
                    .collect();
                aggs.sort_unstable();
                aggs.dedup();
                let tx = client.transaction().await.unwrap();
                for a in aggs {
                    let key = format!("agg-{a}");
                    let seq: i64 = tx
                        .query_one(
                            "UPDATE counters SET seq = seq + 1 WHERE aggregateid = $1 RETURNING seq",
                            &[&key],
                        )
                        .await
                        .unwrap()
                        .get(0);
                    let id: String = tx
                        .query_one(
                            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
                             VALUES ('order', $1, 'Step', jsonb_build_object('seq', $2::bigint, 'writer', $3::int)) \
                             RETURNING id::text",
                            &[&key, &seq, &(writer as i32)],
                        )
                        .await
                        .unwrap()
                        .get(0);
                    written.push((key, seq, id));
                }
                tx.commit().await.unwrap();
            }
            written
        }));
    }
    let mut events: Vec<(String, i64, String)> = Vec::new();
    for wr in writers {
        events.extend(wr.await.unwrap());
    }
    assert_eq!(events.len(), WRITERS * EVENTS_PER_WRITER);

    let ids: Vec<String> = events.iter().map(|e| e.2.clone()).collect();
    let got = consume_ids(&w, &topic, &ids).await;
    let mut expected: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    for (key, seq, id) in events {
        expected.entry(key).or_default().push((seq, id));
    }
    assert_eq!(expected.len(), AGGREGATES, "every aggregate got events");
    for (key, mut evs) in expected {
        evs.sort();
        let seqs: Vec<i64> = evs.iter().map(|e| e.0).collect();
        assert_eq!(seqs, (1..=evs.len() as i64).collect::<Vec<_>>(), "{key}");
        assert_per_key_order(&got, &key, &evs);
        let partitions: HashSet<i32> = got
            .iter()
            .filter(|r| r.key.as_deref() == Some(key.as_bytes()))
            .map(|r| r.partition)
            .collect();
        assert_eq!(
            partitions,
            HashSet::from([ferry_router::java_partition(key.as_bytes(), PARTITIONS)]),
            "key {key} lives on exactly one partition, the Java client's murmur2 choice"
        );
    }
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

/// `ferry_source_delay_seconds` counts a delay for every transaction the server sends, from
/// the server's own clock: an operator reads PostgreSQL's share of the lag from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transaction_sent_is_timed_from_its_commit_to_the_server_sending_it() {
    const TRANSACTIONS: usize = 5;
    let w = World::new().await;
    let topic = w.create_topic("order", PARTITIONS).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    for i in 0..TRANSACTIONS {
        w.insert("order", &format!("o-{i}"), "OrderCreated", "{}")
            .await;
    }
    w.consume(&topic, TRANSACTIONS).await;
    // Published every 100 ms or so by the session loop, after the records' acknowledgements.
    wait_until(
        "ferry_source_delay_seconds counts every transaction sent",
        Duration::from_secs(30),
        || async {
            ferry.metric("ferry_source_delay_seconds_count").await >= Some(TRANSACTIONS as f64)
        },
    )
    .await;
    let count = ferry
        .metric("ferry_source_delay_seconds_count")
        .await
        .unwrap();
    let sum = ferry
        .metric("ferry_source_delay_seconds_sum")
        .await
        .unwrap();
    // A transaction the server sends is timed once; other transactions of the test's database
    // (empty ones too on PostgreSQL 14, where pgoutput sends them) may add a few. Nothing here
    // takes a minute.
    assert!(count < (TRANSACTIONS * 4) as f64, "count {count}");
    assert!(
        (0.0..60.0 * count).contains(&sum),
        "sum {sum} for {count} transactions"
    );
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_outbox_in_a_busy_database_lets_the_slot_advance() {
    let w = World::new().await;
    w.sql
        .batch_execute("CREATE TABLE busy (id bigserial PRIMARY KEY, v text)")
        .await
        .unwrap();
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let start = w.confirmed_lsn().await.expect("ferry created the slot");

    for i in 0..200 {
        w.sql
            .execute("INSERT INTO busy (v) VALUES ($1)", &[&format!("row {i}")])
            .await
            .unwrap();
    }
    let target = w.current_wal_lsn().await;
    assert!(target > start);
    // Without keepalive confirmation the slot would pin all this WAL on the server forever.
    wait_until(
        "confirmed_flush_lsn passes WAL written only to other tables",
        Duration::from_secs(30),
        || async { w.confirmed_lsn().await.unwrap() >= target },
    )
    .await;
    assert_eq!(
        ferry.metric("ferry_records_produced_total").await,
        Some(0.0)
    );
    assert_eq!(ferry.metric("ferry_in_flight_records").await, Some(0.0));
    assert!(ferry.is_running());
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

/// The server sends a keepalive when its WAL passes what Ferry said it received, and then no
/// other until its WAL moves again. One that comes while records are in flight cannot be
/// confirmed then; once they land, its WAL end must be, or an idle server's slot stays behind
/// it until something else writes WAL. Its own cluster and broker: nothing else writes WAL
/// (an attempt in which something did, before the slot moved, proves nothing and is repeated),
/// and the broker can be paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keepalive_that_comes_while_records_are_in_flight_is_confirmed_once_they_land() {
    keepalive_while_records_are_in_flight(false).await;
}

/// The same in exactly-once mode, where the WAL end is committed in a progress record first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_a_keepalive_that_comes_while_records_are_in_flight_is_confirmed_once_they_land(
) {
    keepalive_while_records_are_in_flight(true).await;
}

async fn keepalive_while_records_are_in_flight(exactly_once: bool) {
    let pg = pg::Postgres::Local(pg::PgCluster::start(pg::ClusterOptions::default()).await);
    let pg::Postgres::Local(cluster) = &pg else {
        unreachable!()
    };
    let broker = LocalBroker::start().await;
    let mut w = World::on(pg.create_db().await, broker.brokers()).await;
    if exactly_once {
        // No commit while the broker is paused (one that waits for it holds the driver, and
        // the metrics this test reads): the row's transaction commits once its report is in.
        w.env.extend([
            ("FERRY_KAFKA_EXACTLY_ONCE".into(), "true".into()),
            ("FERRY_KAFKA_TRANSACTION_INTERVAL".into(), "6s".into()),
        ]);
    }
    let topic = w.create_topic("order", 1).await;
    // WAL that the slot's database does not decode: another database's transactions.
    let other = pg::connect(&cluster.url("postgres")).await;
    other
        .batch_execute("CREATE TABLE elsewhere (v int)")
        .await
        .unwrap();
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let mut sent = 0;
    for attempt in 1..=4 {
        broker.pause_node(0);
        w.insert("order", "o1", "Placed", "{}").await;
        sent += 1;
        wait_until("the row is in flight", Duration::from_secs(30), || async {
            ferry.metric("ferry_in_flight_records").await == Some(1.0)
        })
        .await;
        other
            .batch_execute("INSERT INTO elsewhere VALUES (1)")
            .await
            .unwrap();
        let target = w.current_wal_lsn().await;
        // Ferry reports what it received after it handled what it read: past this, the
        // keepalive met the record in flight (and the server sends no other for this WAL end).
        wait_until(
            "Ferry reports the WAL end as received",
            Duration::from_secs(30),
            || async {
                let row = w
                    .sql
                    .query_one(
                        "SELECT coalesce(r.write_lsn::text, '0/0') FROM pg_stat_replication r \
                         JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1",
                        &[&w.slot],
                    )
                    .await
                    .unwrap();
                row.get::<_, String>(0).parse::<ferry_wal::Lsn>().unwrap() >= target
            },
        )
        .await;
        assert_eq!(ferry.metric("ferry_in_flight_records").await, Some(1.0));
        broker.resume_node(0);
        w.consume(&topic, sent).await;
        wait_until(
            "the slot reaches the WAL end (or the server writes more WAL)",
            Duration::from_secs(60),
            || async {
                w.confirmed_lsn().await.is_some_and(|c| c >= target)
                    || w.current_wal_lsn().await > target
            },
        )
        .await;
        let confirmed = w.confirmed_lsn().await.expect("slot");
        let moved = w.current_wal_lsn().await > target;
        if confirmed >= target && !moved {
            assert!(ferry.is_running());
            return;
        }
        eprintln!("attempt {attempt}: the server wrote WAL past {target} before the slot reached it (confirmed {confirmed}); again");
    }
    panic!(
        "the slot never reached an idle WAL end before the server wrote more WAL; log:\n{}",
        ferry.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_ferry_stands_by_and_takes_over_when_the_first_dies() {
    let mut w = World::new().await;
    let topic = w.create_topic("order", 3).await;
    w.env.push((
        "FERRY_POSTGRES_STANDBY_POLL_INTERVAL".into(),
        "200ms".into(),
    ));
    w.env
        .push(("FERRY_POSTGRES_RECONNECT_BACKOFF_MAX".into(), "1s".into()));
    let mut a = w.start_ferry();
    a.wait_ready().await;

    // One key, one writer: commit order is the order of the writer's inserts.
    let writer = Writer::start(w.db.client().await, "k");
    writer.wait_for(20).await;

    // A's SQL connection(s), to tell B's apart.
    let ferry_backends = "SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity \
                          WHERE datname = current_database() AND application_name = 'ferry' \
                          AND backend_type = 'client backend'";
    let a_backends: Vec<i32> = w.sql.query_one(ferry_backends, &[]).await.unwrap().get(0);
    let mut b = w.start_ferry();
    wait_until("B reports standby", Duration::from_secs(30), || async {
        b.metric("ferry_standby").await == Some(1.0)
    })
    .await;
    // B polls the slot on one connection it keeps: a backend of B's has served a poll a second
    // (five polls) after it started, where a connection per poll would fork a backend and
    // authenticate every time.
    wait_until(
        "one of B's backends serves poll after poll",
        Duration::from_secs(30),
        || async {
            w.sql
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND application_name = 'ferry' \
                     AND backend_type = 'client backend' AND NOT (pid = ANY($1)) \
                     AND query_start - backend_start > interval '1 second'",
                    &[&a_backends],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                > 0
        },
    )
    .await;
    let (status, body) = b.http_get("/readyz").await.expect("B serves HTTP");
    assert_eq!(status, 503, "a standby is not ready: {body}");
    assert!(body.contains("standing by"), "{body}");
    assert_eq!(b.metric("ferry_streaming").await, Some(0.0));
    assert!(b.is_running(), "a standby waits, it does not exit");
    assert_eq!(a.metric("ferry_streaming").await, Some(1.0));

    a.kill9();
    // Committed right after A died, most likely before B notices the slot is free.
    let mut orphans = Vec::new();
    for seq in 1..=5i64 {
        let id: String = w
            .sql
            .query_one(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
                 VALUES ('order', 'h', 'Orphan', jsonb_build_object('seq', $1::bigint)) RETURNING id::text",
                &[&seq],
            )
            .await
            .unwrap()
            .get(0);
        orphans.push((seq, id));
    }
    wait_until("B takes over the slot", Duration::from_secs(30), || async {
        b.metric("ferry_streaming").await == Some(1.0)
            && b.metric("ferry_standby").await == Some(0.0)
    })
    .await;
    b.wait_ready().await;
    // And rows committed after the takeover.
    writer.wait_for(writer.count() + 20).await;
    let ids = writer.stop().await;

    let mut all = ids.clone();
    all.extend(orphans.iter().map(|o| o.1.clone()));
    let got = consume_ids(&w, &topic, &all).await;
    let expected: Vec<(i64, String)> = (1..).zip(ids).collect();
    assert_per_key_order(&got, "k", &expected);
    assert_per_key_order(&got, "h", &orphans);
    assert!(b.log_text().contains("taking over"), "{}", b.log_text());

    // A standby stops cleanly on SIGTERM too.
    let mut c = w.start_ferry();
    wait_until("C reports standby", Duration::from_secs(30), || async {
        c.metric("ferry_standby").await == Some(1.0)
    })
    .await;
    assert!(c.terminate().await.success(), "{}", c.log_text());
    assert!(b.terminate().await.success(), "{}", b.log_text());
}

/// How many of the test database's slot hand-over locks (`ferry_wal::slot::handover`) are in
/// `mode`, granted or waiting.
async fn handover_locks(w: &World, mode: &str, granted: bool) -> i64 {
    w.sql
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 \
             AND classid::bigint = $1 AND mode = $2 AND granted = $3 \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[
                &i64::from(ferry_wal::slot::handover::CLASS),
                &mode,
                &granted,
            ],
        )
        .await
        .unwrap()
        .get(0)
}

async fn insert_event(w: &World, key: &str) -> String {
    w.sql
        .query_one(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
             VALUES ('order', $1, 'HandedOver', '{}') RETURNING id::text",
            &[&key],
        )
        .await
        .unwrap()
        .get(0)
}

/// Waits until `ferry` is a standby waiting for the slot's hand-over lock, held by another.
async fn waits_for_the_handover(w: &World, ferry: &mut Ferry, who: &str) {
    wait_until(
        &format!("{who} stands by, waiting for the hand-over lock"),
        Duration::from_secs(60),
        || async {
            handover_locks(w, "ExclusiveLock", true).await == 1
                && handover_locks(w, "ShareLock", false).await == 1
        },
    )
    .await;
    assert_eq!(ferry.metric("ferry_standby").await, Some(1.0), "{who}");
}

/// Waits until `ferry` streams, then for a row committed after `what` to reach Kafka.
async fn takes_over(w: &World, ferry: &mut Ferry, topic: &str, who: &str, what: &str) {
    let id = insert_event(w, what).await;
    wait_until(
        &format!("{who} takes over"),
        Duration::from_secs(30),
        || async {
            ferry.metric("ferry_streaming").await == Some(1.0)
                && ferry.metric("ferry_standby").await == Some(0.0)
        },
    )
    .await;
    consume_ids(w, topic, std::slice::from_ref(&id)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_when_the_active_session_ends_not_at_its_next_poll() {
    let mut w = World::new().await;
    let topic = w.create_topic("order", 3).await;
    // Polls an hour apart: within this test only the hand-over can wake a standby. A session
    // that ends begins the next one 10 s later, so the standby, not the instance whose session
    // ended, takes the slot.
    w.env
        .push(("FERRY_POSTGRES_STANDBY_POLL_INTERVAL".into(), "1h".into()));
    w.env
        .push(("FERRY_POSTGRES_RECONNECT_BACKOFF_MIN".into(), "10s".into()));
    let mut a = w.start_ferry();
    a.wait_ready().await;
    let mut b = w.start_ferry();
    waits_for_the_handover(&w, &mut b, "B").await;

    // A's session ends, A lives on: its walsender is terminated, the session ends with it and
    // closes its SQL connection.
    w.sql
        .execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = $1",
            &[&w.slot],
        )
        .await
        .unwrap();
    takes_over(&w, &mut b, &topic, "B", "a session's end").await;
    assert!(a.is_running(), "A's session ended, not A");
    waits_for_the_handover(&w, &mut a, "A").await;

    // B dies with SIGKILL: its backends end, and with them the lock.
    b.kill9();
    takes_over(&w, &mut a, &topic, "A", "a kill -9").await;

    // A stops cleanly: the last session's end closes its connection.
    let mut c = w.start_ferry();
    waits_for_the_handover(&w, &mut c, "C").await;
    assert!(a.terminate().await.success(), "{}", a.log_text());
    takes_over(&w, &mut c, &topic, "C", "a clean stop").await;
    assert!(c.terminate().await.success(), "{}", c.log_text());
    for (who, ferry) in [("A", &a), ("B", &b), ("C", &c)] {
        let log = ferry.log_text();
        assert!(!log.contains("hand-over lock failed"), "{who}: {log}");
    }
}

const GOOD_1: &str = "00000000-0000-0000-0000-000000000001";
const GOOD_2: &str = "00000000-0000-0000-0000-000000000002";
const GOOD_3: &str = "00000000-0000-0000-0000-000000000003";
const POISON: &str = "00000000-0000-0000-0000-0000000000bd";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_row_under_fail_stops_ferry_and_confirms_nothing_past_it() {
    let w = World::new().await;
    let topic = w.create_topic("order", 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;

    insert(&w, GOOD_1, "order", Some("{\"n\": 1}")).await;
    insert(&w, GOOD_2, "order", Some("{\"n\": 2}")).await;
    // The topic would be "<prefix>.bad topic!": not a legal Kafka topic name.
    let poison_xid = insert(&w, POISON, "bad topic!", Some("{\"n\": 9}")).await;
    let after_poison = w.current_wal_lsn().await;
    insert(&w, GOOD_3, "order", Some("{\"n\": 3}")).await;

    let status = ferry.wait_exit(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(1), "{}", ferry.log_text());
    let log = ferry.log_text();
    assert!(log.contains(POISON), "names the event: {log}");
    assert!(
        log.contains("not a legal Kafka topic name"),
        "says why: {log}"
    );
    assert!(log.contains("route.on_error"), "says how to fix it: {log}");

    let got = w.consume(&topic, 2).await;
    let ids: Vec<_> = got.iter().map(|r| r.header("id").unwrap()).collect();
    assert_eq!(ids, [GOOD_1, GOOD_2], "the rows before it arrived");
    assert!(w.confirmed_lsn().await.unwrap() < after_poison);
    assert_eq!(
        w.first_pending_xid().await.as_deref(),
        Some(poison_xid.as_str()),
        "the slot's next transaction is the poison one: nothing past it was confirmed"
    );

    // A restart meets the same row and stops the same way.
    let mut again = w.start_ferry();
    let status = again.wait_exit(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(1), "{}", again.log_text());
    assert!(again.log_text().contains(POISON), "{}", again.log_text());
    assert_eq!(
        w.first_pending_xid().await.as_deref(),
        Some(poison_xid.as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_row_under_skip_is_counted_and_the_rest_flows() {
    let mut w = World::new().await;
    let topic = w.create_topic("order", 1).await;
    w.env.push(("FERRY_ROUTE_ON_ERROR".into(), "skip".into()));
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;

    insert(&w, GOOD_1, "order", Some("{\"n\": 1}")).await;
    // A NULL payload without route.tombstone_on_null_payload cannot be routed.
    insert(&w, POISON, "order", None).await;
    insert(&w, GOOD_2, "order", Some("{\"n\": 2}")).await;
    let target = w.current_wal_lsn().await;

    wait_until("the skip is counted", Duration::from_secs(30), || async {
        ferry.metric("ferry_rows_skipped_total").await == Some(1.0)
    })
    .await;
    wait_until(
        "the slot is confirmed past the last row",
        Duration::from_secs(30),
        || async { w.confirmed_lsn().await.unwrap() >= target },
    )
    .await;
    // One partition: had the poison row been produced, it would sit between the two.
    let got = w.consume(&topic, 2).await;
    let ids: Vec<_> = got.iter().map(|r| r.header("id").unwrap()).collect();
    assert_eq!(ids, [GOOD_1, GOOD_2]);
    assert!(ferry.log_text().contains(POISON), "{}", ferry.log_text());
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_row_under_dead_letter_goes_to_the_dead_letter_topic_with_its_reason() {
    let mut w = World::new().await;
    let topic = w.create_topic("order", 1).await;
    let dlq = w.create_topic("dead-letter", 1).await;
    w.env
        .push(("FERRY_ROUTE_ON_ERROR".into(), "dead_letter".into()));
    w.env
        .push(("FERRY_ROUTE_DEAD_LETTER_TOPIC".into(), dlq.clone()));
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;

    insert(&w, GOOD_1, "order", Some("{\"n\": 1}")).await;
    insert(&w, POISON, "bad topic!", Some("{\"n\": 9}")).await;
    insert(&w, GOOD_2, "order", Some("{\"n\": 2}")).await;

    let dead = w.consume(&dlq, 1).await;
    assert_eq!(dead.len(), 1, "{dead:#?}");
    let d = &dead[0];
    assert_eq!(d.header("id").as_deref(), Some(POISON));
    assert_eq!(
        d.header("ferry.error.code").as_deref(),
        Some("invalid_topic")
    );
    let reason = d.header("ferry.error").unwrap();
    assert!(
        reason.contains(POISON) && reason.contains("not a legal Kafka topic name"),
        "{reason}"
    );
    assert_eq!(d.key.as_deref(), Some(&b"agg-bad topic!"[..]));
    assert_eq!(d.value.as_deref(), Some(&b"{\"n\": 9}"[..]));

    let got = w.consume(&topic, 2).await;
    let ids: Vec<_> = got.iter().map(|r| r.header("id").unwrap()).collect();
    assert_eq!(ids, [GOOD_1, GOOD_2], "the rows around it flow");
    wait_until(
        "the dead letter is counted",
        Duration::from_secs(30),
        || async { ferry.metric("ferry_rows_dead_lettered_total").await == Some(1.0) },
    )
    .await;
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_records_confirms_and_exits_zero() {
    const ROWS: usize = 40;
    let broker = LocalBroker::start().await;
    let mut w = World::on(pg::shared().create_db().await, broker.brokers()).await;
    let topic = w.create_topic("order", 2).await;
    w.env
        .push(("FERRY_SHUTDOWN_DRAIN_TIMEOUT".into(), "50s".into()));
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;

    // With the broker away, every row is read and produced but none is acknowledged.
    let broker = Arc::new(broker);
    let b = broker.clone();
    tokio::task::spawn_blocking(move || b.stop()).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..ROWS {
        let id = format!("00000000-0000-0000-0000-{i:012}");
        insert(&w, &id, "order", Some(&format!("{{\"seq\": {}}}", i + 1))).await;
        ids.push(id);
    }
    let target = w.current_wal_lsn().await;
    wait_until(
        "every row is in flight",
        Duration::from_secs(30),
        || async { ferry.metric("ferry_in_flight_records").await == Some(ROWS as f64) },
    )
    .await;
    assert!(w.confirmed_lsn().await.unwrap() < target);

    // SIGTERM now; once Ferry says it is draining, bring the broker back.
    let draining = ferry.wait_log("draining in-flight records", Duration::from_secs(30));
    let b = broker.clone();
    let restore = async move {
        draining.await;
        tokio::task::spawn_blocking(move || b.start_again())
            .await
            .unwrap();
    };
    let (status, ()) = tokio::join!(ferry.terminate(), restore);
    assert_eq!(status.code(), Some(0), "{}", ferry.log_text());
    assert!(
        ferry.log_text().contains("drained and confirmed"),
        "{}",
        ferry.log_text()
    );
    // Not `confirmed >= target`: other tests' WAL on the shared server may lie past the last
    // commit, and only a keepalive (none after shutdown) would confirm that.
    assert_eq!(
        w.first_pending_xid().await,
        None,
        "the final status update confirmed every drained transaction: nothing is left to replay"
    );
    let got = consume_ids(&w, &topic, &ids).await;
    let expected: Vec<(i64, String)> = (1..).zip(ids).collect();
    assert_per_key_order(&got, "agg-order", &expected);
}

/// Inserts an outbox row with a fixed id and aggregate id `agg-<aggregate type>`; returns the
/// inserting transaction's id.
async fn insert(w: &World, id: &str, aggregate_type: &str, payload: Option<&str>) -> String {
    w.sql
        .query_one(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1::text::uuid, $2, 'agg-' || $2, 'Happened', $3::text::jsonb) \
             RETURNING pg_current_xact_id()::text",
            &[&id, &aggregate_type, &payload],
        )
        .await
        .expect("insert outbox row")
        .get(0)
}

/// Reads `topic` from the beginning until every id in `ids` has arrived (duplicates allowed).
async fn consume_ids(w: &World, topic: &str, ids: &[String]) -> Vec<Consumed> {
    let mut n = ids.len();
    loop {
        let got = w.consume(topic, n).await;
        let seen: HashSet<String> = got.iter().filter_map(|r| r.header("id")).collect();
        let missing = ids.iter().filter(|id| !seen.contains(*id)).count();
        if missing == 0 {
            return got;
        }
        n = got.len() + missing;
    }
}

/// The ordering rule of the module docs: `expected` is `key`'s events in commit order as
/// `(seq, id)`, and each record's payload carries its `seq`.
fn assert_per_key_order(got: &[Consumed], key: &str, expected: &[(i64, String)]) {
    let mut seen = HashSet::new();
    let mut first: Vec<(i64, String)> = Vec::new();
    for r in got
        .iter()
        .filter(|r| r.key.as_deref() == Some(key.as_bytes()))
    {
        let id = r.header("id").expect("id header");
        let payload: serde_json::Value =
            serde_json::from_slice(r.value.as_deref().expect("payload")).expect("json payload");
        let seq = payload["seq"].as_i64().expect("payload seq");
        if seen.insert(id.clone()) {
            first.push((seq, id));
        }
    }
    assert_eq!(
        first, expected,
        "key {key}: first occurrences must be every event, in commit order"
    );
}

/// A background writer inserting one row at a time for one key, with `seq` 1, 2, ... in the
/// payload, until stopped.
struct Writer {
    count: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Writer {
    fn start(client: tokio_postgres::Client, key: &'static str) -> Writer {
        let count = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (count.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut ids = Vec::new();
            // Paces the writer (a steady trickle rather than a flood); not a synchronization.
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            while !s.load(Ordering::SeqCst) {
                tick.tick().await;
                let seq = ids.len() as i64 + 1;
                let id: String = client
                    .query_one(
                        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
                         VALUES ('order', $1, 'Tick', jsonb_build_object('seq', $2::bigint)) RETURNING id::text",
                        &[&key, &seq],
                    )
                    .await
                    .expect("writer insert")
                    .get(0);
                ids.push(id);
                c.store(ids.len(), Ordering::SeqCst);
            }
            ids
        });
        Writer { count, stop, task }
    }

    fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    async fn wait_for(&self, n: usize) {
        wait_until(
            &format!("{n} rows written"),
            Duration::from_secs(30),
            || async { self.count() >= n },
        )
        .await;
    }

    async fn stop(self) -> Vec<String> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("writer task")
    }
}

/// A small deterministic generator (no `rand` needed for picking aggregates).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}
