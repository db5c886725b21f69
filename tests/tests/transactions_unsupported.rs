//! Exactly-once against a Kafka-protocol broker without transactions (issue 30). The broker is
//! the real Apache Kafka behind the testkit's Kafka proxy, which removes EndTxn (API key 26)
//! from every ApiVersions answer: librdkafka then believes the broker lacks it, as it does with
//! tansu 0.6, while everything else (InitProducerId, produce, fetch) stays real.
//!
//! `ferry check` names the missing API and the fix; `ferry run` stops at once with the same
//! permanent error, before it creates the slot; and a later start against brokers with
//! transactions is a plain first start, not "events may be lost".

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use ferry_testkit::kafka;
use ferry_testkit::pg;
use ferry_testkit::proxy::{Fault, Proxy};

/// EndTxn's API key.
const END_TXN: i16 = 26;

/// A world in exactly-once mode whose brokers are the shared broker behind a proxy that hides
/// EndTxn, and the proxy.
async fn world_without_end_txn() -> (World, Proxy) {
    let upstream: SocketAddr = kafka::shared()
        .brokers()
        .parse()
        .expect("the shared broker is one address");
    let proxy = Proxy::kafka_hiding(upstream, &[END_TXN])
        .await
        .expect("proxy");
    let mut w = World::on(pg::shared().create_db().await, proxy.addr().to_string()).await;
    w.env
        .push(("FERRY_KAFKA_EXACTLY_ONCE".into(), "true".into()));
    (w, proxy)
}

/// What both `check` and `run` must say: the broker, the missing API, and the two fixes.
fn assert_names_the_missing_api(out: &str) {
    for want in [
        "the Kafka brokers do not support transactions",
        "does not offer EndTxn (API key 26",
        "needs Kafka transactions",
        "kafka.exactly_once = false",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_fails_naming_the_missing_transaction_api() {
    let (w, _proxy) = world_without_end_txn().await;
    let mut check = Ferry::spawn(&w, &["check"]);
    let status = check.wait_exit(Duration::from_secs(90)).await;
    let out = check.log_text();
    assert_eq!(status.code(), Some(1), "{out}");
    assert_names_the_missing_api(&out);
    assert!(!out.contains("OK: Ferry can run"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_stops_before_creating_the_slot_and_a_later_start_with_transactions_is_a_first_start() {
    let (mut w, proxy) = world_without_end_txn().await;
    let topic = w.create_topic("order", 1).await;
    w.insert("order", "o-1", "OrderCreated", "{}").await;

    let mut ferry = w.start_ferry();
    let status = ferry.wait_exit(Duration::from_secs(90)).await;
    let log = ferry.log_text();
    // A permanent error, at once: no commit was tried, nothing retried.
    assert_eq!(status.code(), Some(1), "{log}");
    assert_names_the_missing_api(&log);
    assert!(!log.contains("Kafka transaction commit failed"), "{log}");
    assert!(!log.contains("events may be lost"), "{log}");
    assert!(
        !w.slot_exists().await,
        "the failed start left slot {:?} behind:\n{log}",
        w.slot
    );

    // The same world on brokers with transactions: a first start, which relays what is
    // committed from then on.
    drop(proxy);
    w.brokers = kafka::shared().brokers();
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.insert("order", "o-2", "OrderPaid", "{}").await;
    let got = w.consume(&topic, 1).await;
    assert!(
        got.iter().any(|r| r.key.as_deref() == Some(&b"o-2"[..])),
        "{got:?}"
    );
    let log = ferry.log_text();
    assert!(!log.contains("events may be lost"), "{log}");
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

/// The backstop, for brokers the check cannot see through (an answer it cannot read, a
/// coordinator it did not reach): with the check skipped, Ferry creates the slot, and its first
/// commit is refused by librdkafka ("EndTxnRequest (KIP-98) not supported by broker"). That is a
/// permanent error, tried once and never retried as an uncertain outcome; the slot no record
/// remembers is dropped; and the next start on brokers with transactions is a first start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_first_commit_is_permanent_and_drops_the_slot_it_created() {
    let (mut w, proxy) = world_without_end_txn().await;
    let topic = w.create_topic("order", 1).await;
    w.env.push(("FERRY_TEST_SKIP_API_CHECK".into(), "1".into()));

    let mut ferry = w.start_ferry();
    let status = ferry.wait_exit(Duration::from_secs(90)).await;
    let log = ferry.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("exactly-once: resuming from the progress topic"),
        "the slot was created and streamed from: {log}"
    );
    assert!(
        log.contains("EndTxnRequest (KIP-98) not supported by broker"),
        "{log}"
    );
    assert!(log.contains("kafka.exactly_once = false"), "{log}");
    assert_eq!(
        log.matches("Kafka transaction commit failed").count(),
        1,
        "the commit is tried once, not retried:\n{log}"
    );
    assert!(log.contains("dropped the slot it created"), "{log}");
    assert!(!log.contains("events may be lost"), "{log}");
    assert!(!w.slot_exists().await, "{log}");

    drop(proxy);
    w.env.pop();
    w.brokers = kafka::shared().brokers();
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.insert("order", "o-1", "OrderCreated", "{}").await;
    let got = w.consume(&topic, 1).await;
    assert!(
        got.iter().any(|r| r.key.as_deref() == Some(&b"o-1"[..])),
        "{got:?}"
    );
    assert!(!ferry.log_text().contains("events may be lost"));
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

/// Kafka goes away (a blackhole) just after a first exactly-once start created the slot, before
/// its first progress record: the session fails with a transient error, and the next one, once
/// Kafka is back, starts from the slot this process created (nothing was produced from it)
/// instead of refusing it as a used slot without a record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_away_during_a_first_start_leaves_a_slot_the_retry_starts_from() {
    let upstream: SocketAddr = kafka::shared().brokers().parse().expect("one address");
    let proxy = Proxy::kafka(upstream).await.expect("proxy");
    let mut w = World::on(pg::shared().create_db().await, proxy.addr().to_string()).await;
    w.env
        .push(("FERRY_KAFKA_EXACTLY_ONCE".into(), "true".into()));
    let topic = w.create_topic("order", 1).await;

    let mut ferry = w.start_ferry();
    // The check passed: the slot is created next, and the first record needs Kafka.
    ferry
        .wait_log(
            "exactly-once: the Kafka brokers serve the transaction APIs",
            Duration::from_secs(60),
        )
        .await;
    proxy.inject(Fault::Blackhole);
    ferry
        .wait_log(
            "session ended; starting over from the progress topic",
            Duration::from_secs(150),
        )
        .await;
    let log = ferry.log_text();
    assert!(
        !log.contains("session: streaming slot="),
        "Kafka went away too late, after the first record: {log}"
    );
    assert!(w.slot_exists().await, "{log}");
    proxy.heal();

    ferry.wait_ready().await;
    w.insert("order", "o-1", "OrderCreated", "{}").await;
    let got = w.consume(&topic, 1).await;
    assert!(
        got.iter().any(|r| r.key.as_deref() == Some(&b"o-1"[..])),
        "{got:?}"
    );
    assert!(!ferry.log_text().contains("events may be lost"));
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

/// The probe `check` and `run` use reads real Apache Kafka's answer (librdkafka's log lines
/// parse: a format change would make it see nothing) and the proxy's answer without EndTxn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_reads_the_brokers_api_versions() {
    use ferry::broker_apis::Support;
    // A topic the brokers do not know: their answer for it counts all the same, and asking
    // does not create it (the shared broker auto-creates topics).
    let topic = format!("ferry-test.txn-probe.{}", std::process::id());
    let probe = |brokers: String| {
        let topic = topic.clone();
        tokio::task::spawn_blocking(move || {
            ferry::txn_probe::probe(
                &[("bootstrap.servers".to_string(), brokers)],
                &topic,
                Duration::from_secs(30),
            )
            .expect("the broker answers")
        })
    };
    let real = probe(kafka::shared().brokers()).await.unwrap();
    assert_eq!(real, Support::Supported);
    assert!(
        !kafka::topic_known(&kafka::shared().brokers(), &topic),
        "the probe created {topic}"
    );
    let (w, _proxy) = world_without_end_txn().await;
    let Support::Missing(missing) = probe(w.brokers.clone()).await.unwrap() else {
        panic!("the proxy hides EndTxn");
    };
    assert_eq!(
        missing.iter().map(|m| m.needed.name).collect::<Vec<_>>(),
        ["EndTxn"],
        "{missing:?}"
    );
}
