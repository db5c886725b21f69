//! A topic that does not exist on a broker that does not auto-create topics (managed Kafka's
//! default): the records routed to it wait, and Ferry says so loudly (a WARN naming the topic,
//! `ferry_topics_missing`, `/readyz` 503 with the reason) until the topic appears, then they
//! flow; or, with `route.create_topics`, Ferry creates it.
//!
//! Each test starts its own broker with `auto.create.topics.enable = false` (a static broker
//! setting), so the shared broker keeps auto-creating for the other tests.

mod common;

use std::time::Duration;

use common::*;
use ferry_testkit::kafka::{self, LocalBroker};
use ferry_testkit::pg;

async fn world_without_auto_create() -> (LocalBroker, World) {
    let broker = LocalBroker::start_with(kafka::ClusterOptions {
        auto_create_topics: false,
        ..Default::default()
    })
    .await;
    let w = World::on(pg::shared().create_db().await, broker.brokers()).await;
    (broker, w)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_is_reported_loudly_and_its_records_flow_once_it_exists() {
    let (_broker, w) = world_without_auto_create().await;
    let orders = w.create_topic("order", 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.insert("order", "o-1", "Created", "{}").await;
    w.consume(&orders, 1).await;

    let invoices = w.topic("invoice");
    w.insert("invoice", "i-1", "Issued", "{}").await;
    let written = w.current_wal_lsn().await;
    wait_until(
        "the WARN naming the missing topic",
        Duration::from_secs(30),
        || async {
            ferry.log_text().lines().any(|l| {
                l.contains("WARN")
                    && l.contains("topic does not exist on the brokers")
                    && l.contains(&invoices)
                    && l.contains("records_waiting=1")
            })
        },
    )
    .await;
    wait_until(
        "ferry_topics_missing = 1",
        Duration::from_secs(30),
        || async { ferry.metric("ferry_topics_missing").await == Some(1.0) },
    )
    .await;
    let (status, body) = ferry.http_get("/readyz").await.expect("readyz");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains(&format!("{invoices:?} (1 records waiting)")),
        "{body}"
    );
    assert!(body.contains("route.create_topics.enabled"), "{body}");
    assert!(
        w.confirmed_lsn().await.is_some_and(|l| l < written),
        "nothing past the waiting record is confirmed"
    );
    assert!(
        ferry.is_running(),
        "a missing topic is waited for, not fatal"
    );
    // Past librdkafka's default topic.metadata.propagation.max.ms (30 s), after which it would
    // fail the record: the WARN is repeated while the topic stays missing, and the record waits.
    wait_until("the repeated WARN", Duration::from_secs(60), || async {
        ferry
            .log_text()
            .lines()
            .filter(|l| l.contains("topic does not exist on the brokers") && l.contains(&invoices))
            .count()
            >= 2
    })
    .await;
    assert_eq!(ferry.metric("ferry_topics_missing").await, Some(1.0));

    w.create_topic("invoice", 1).await;
    let got = w.consume(&invoices, 1).await;
    assert_eq!(got[0].key.as_deref(), Some(&b"i-1"[..]));
    wait_until("ready again", Duration::from_secs(60), || async {
        matches!(ferry.http_get("/readyz").await, Some((200, _)))
    })
    .await;
    assert_eq!(ferry.metric("ferry_topics_missing").await, Some(0.0));
    wait_until("the row is confirmed", Duration::from_secs(30), || async {
        w.confirmed_lsn().await.is_some_and(|l| l >= written)
    })
    .await;
    let log = ferry.log_text();
    assert!(log.contains("topic exists now"), "{log}");
    assert!(
        !log.contains("delivery failed"),
        "the record waited, it did not fail: {log}"
    );
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_create_topics_creates_a_missing_topic_with_its_partitions() {
    let (_broker, mut w) = world_without_auto_create().await;
    let config =
        std::env::temp_dir().join(format!("{}.toml", pg::unique_name("ferry-create-topics")));
    std::fs::write(
        &config,
        "[route.create_topics]\nenabled = true\npartitions = 3\nreplication_factor = 1\n\
         configs = { \"retention.ms\" = \"86400000\" }\n",
    )
    .unwrap();
    w.env
        .push(("FERRY_CONFIG".into(), config.display().to_string()));
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;

    let topic = w.topic("shipment");
    w.insert("shipment", "s-1", "Shipped", "{}").await;
    wait_until(
        "Ferry creates the topic with 3 partitions",
        Duration::from_secs(30),
        || {
            let (b, t) = (w.brokers.clone(), topic.clone());
            async move {
                tokio::task::spawn_blocking(move || kafka::partition_count(&b, &t))
                    .await
                    .unwrap()
                    == Some(3)
            }
        },
    )
    .await;
    let got = w.consume(&topic, 1).await;
    assert_eq!(got[0].key.as_deref(), Some(&b"s-1"[..]));
    assert!(
        ferry
            .log_text()
            .contains("created topic (route.create_topics)"),
        "{}",
        ferry.log_text()
    );
    assert_eq!(ferry.metric("ferry_topics_missing").await, Some(0.0));
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
    let _ = std::fs::remove_file(config);
}
