//! The relay end to end: rows committed in PostgreSQL arrive in Kafka as the router says, and
//! the slot is confirmed only past what Kafka acknowledged.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_row_arrives_with_topic_key_partition_headers_and_value() {
    let w = World::new().await;
    let topic = w.create_topic("order", 3).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;

    w.sql
        .batch_execute(
            "BEGIN;
             INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
               ('00000000-0000-0000-0000-000000000001', 'order', 'o-1', 'OrderCreated', '{\"n\": 1, \"name\": \"Zoë\"}'),
               ('00000000-0000-0000-0000-000000000002', 'order', 'o-2', 'OrderCreated', '{\"n\": 2}');
             COMMIT;
             BEGIN;
             INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
               ('00000000-0000-0000-0000-00000000dead', 'order', 'o-1', 'Never', '{}');
             ROLLBACK;
             INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
               ('00000000-0000-0000-0000-000000000003', 'order', 'o-1', 'OrderPaid', '{\"n\": 3}');",
        )
        .await
        .unwrap();
    let got = w.consume(&topic, 3).await;
    let by_id: HashMap<String, _> = got.iter().map(|r| (r.header("id").unwrap(), r)).collect();
    assert_eq!(by_id.len(), 3, "{got:#?}");
    assert!(!by_id.contains_key("00000000-0000-0000-0000-00000000dead"));
    let first = by_id["00000000-0000-0000-0000-000000000001"];
    assert_eq!(
        first.key.as_deref(),
        Some(&b"o-1"[..]),
        "key is the plain aggregate id"
    );
    assert_eq!(first.header("type").as_deref(), Some("OrderCreated"));
    assert_eq!(
        String::from_utf8(first.value.clone().unwrap()).unwrap(),
        "{\"n\": 1, \"name\": \"Zoë\"}",
        "the payload as stored (jsonb text form)"
    );
    for r in &got {
        let expected = ferry_router::java_partition(r.key.as_deref().unwrap(), 3);
        assert_eq!(
            r.partition, expected,
            "Java-compatible murmur2 partition for {:?}",
            r.key
        );
    }
    // Per-aggregate order: o-1's events in commit order.
    let o1: Vec<_> = got
        .iter()
        .filter(|r| r.key.as_deref() == Some(&b"o-1"[..]))
        .map(|r| r.header("type").unwrap())
        .collect();
    assert_eq!(o1, ["OrderCreated", "OrderPaid"]);

    // The slot is confirmed past the last transaction once Kafka acknowledged it.
    let target = w.current_wal_lsn().await;
    wait_until(
        "confirmed_flush_lsn reaches the last commit",
        Duration::from_secs(30),
        || async { w.confirmed_lsn().await.unwrap() >= target },
    )
    .await;
    assert_eq!(
        ferry.metric("ferry_records_produced_total").await,
        Some(3.0)
    );
    let status = ferry.terminate().await;
    assert!(
        status.success(),
        "graceful shutdown exits 0: {status:?}\n{}",
        ferry.log_text()
    );
}
