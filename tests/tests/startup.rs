//! Start-up. Instances started at the same moment (a Deployment with two replicas, a rolling
//! restart) on a database where nothing exists yet: they all race to create the publication and
//! the slot. Exactly one streams, the others stand by, none stops with an error. A standby on a
//! first deployment creates the progress topic while it waits. A restart asks the brokers for
//! the topics it uses, never for every topic.

mod common;

use std::time::Duration;

use common::*;

/// How many fresh databases the race is run on, and how many instances start on each.
const ROUNDS: usize = 4;
const INSTANCES: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_started_together_on_a_fresh_database_never_stop_with_an_error() {
    for round in 0..ROUNDS {
        let mut w = World::new().await;
        let topic = w.create_topic("order", 1).await;
        w.env.push((
            "FERRY_POSTGRES_STANDBY_POLL_INTERVAL".into(),
            "200ms".into(),
        ));
        let mut all: Vec<Ferry> = (0..INSTANCES).map(|_| w.start_ferry()).collect();

        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            for f in all.iter_mut() {
                assert!(
                    f.is_running(),
                    "round {round}: an instance exited during the start-up race; log:\n{}",
                    f.log_text()
                );
            }
            let (mut streaming, mut standby) = (0, 0);
            for f in &all {
                streaming += usize::from(f.metric("ferry_streaming").await == Some(1.0));
                standby += usize::from(f.metric("ferry_standby").await == Some(1.0));
            }
            if streaming == 1 && standby == INSTANCES - 1 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: {streaming} streaming and {standby} standing by after 60s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for f in &all {
            let log = f.log_text();
            assert!(!log.contains("ERROR"), "round {round}: {log}");
        }

        w.insert("order", "o-1", "Created", r#"{"round": 1}"#).await;
        let written = w.current_wal_lsn().await;
        let got = w.consume(&topic, 1).await;
        assert_eq!(got.len(), 1, "round {round}");
        wait_until("the row is confirmed", Duration::from_secs(30), || async {
            w.confirmed_lsn().await.is_some_and(|l| l >= written)
        })
        .await;
        for f in all.iter_mut() {
            assert!(
                f.terminate().await.success(),
                "round {round}: {}",
                f.log_text()
            );
        }
    }
}

/// A standby on a first deployment (its slot held by another connection, no progress topic yet)
/// creates the progress topic while it waits, as it did before the verdict read the slot first:
/// a takeover then reads the topic instead of waiting for its CreateTopics. It still relays once
/// the slot is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_creates_the_progress_topic_while_it_waits() {
    use ferry_wal::conn::replication::ReplicationConnection;
    use ferry_wal::conn::ConnectConfig;

    let w = World::new().await;
    let topic = w.create_topic("order", 1).await;
    w.sql
        .batch_execute(&format!(
            "CREATE PUBLICATION \"{}\" FOR TABLE outbox",
            w.publication
        ))
        .await
        .unwrap();
    w.sql
        .batch_execute(&format!(
            "SELECT pg_create_logical_replication_slot('{}', 'pgoutput')",
            w.slot
        ))
        .await
        .unwrap();
    let mut holder = ReplicationConnection::connect(&ConnectConfig::parse(&w.db.url).unwrap())
        .await
        .unwrap();
    holder
        .start_copy_both(&format!(
            "START_REPLICATION SLOT \"{}\" LOGICAL 0/0 (proto_version '1', publication_names '\"{}\"')",
            w.slot, w.publication
        ))
        .await
        .unwrap();

    let mut f = w.start_ferry();
    wait_until("Ferry stands by", Duration::from_secs(60), || async {
        f.metric("ferry_standby").await == Some(1.0)
    })
    .await;
    // Read as Ferry reads it: a topic that is still settling is asked again.
    let properties = vec![("bootstrap.servers".to_string(), w.brokers.clone())];
    let progress_topic = w.progress_topic();
    let slot = w.slot.clone();
    let history = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match ferry::progress_topic::read_slot(
                &properties,
                &progress_topic,
                &slot,
                Duration::from_secs(10),
                ferry::progress_topic::Until::End,
            ) {
                Err(e) if e.is_transient() && std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                other => return other,
            }
        }
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        history.topic_exists,
        "no progress topic while standing by; log:\n{}",
        f.log_text()
    );

    drop(holder);
    w.insert("order", "o-1", "Created", r#"{"n": 1}"#).await;
    let got = w.consume(&topic, 1).await;
    assert_eq!(got.len(), 1, "log:\n{}", f.log_text());
    assert!(f.terminate().await.success(), "{}", f.log_text());
}

/// A restart's producer and the clients whose librdkafka lines reach the log ask the brokers for
/// the topics they use, never for every topic: an answer for every topic grows with the cluster
/// (against one local broker holding 5,000 other topics a restart took 137 ms with such
/// requests, 41.5 ms without; bench/README.md, "Round 35"). A first start's producer, made before
/// its progress topic exists, still asks for every topic; the broker probe's client logs only
/// what it is polled for, so its request is not seen here. And the probe, which names the
/// progress topic, must not create it by asking: the topic a first start leaves is Ferry's
/// compacted one, not one the brokers made with their defaults (auto-creation is on here, as it
/// is by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_asks_the_brokers_for_no_topic_but_its_own() {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::ClientConfig;

    let mut w = World::new().await;
    let topic = w.create_topic("order", 1).await;
    // librdkafka's metadata lines ("Request metadata for all topics: ...") from every client.
    w.env.push(("FERRY_LOG_LEVEL".into(), "debug".into()));
    w.env
        .push(("FERRY_KAFKA_PROPERTIES_DEBUG".into(), "metadata".into()));

    let mut first = w.start_ferry();
    first.wait_ready().await;
    w.insert("order", "o-1", "Created", "{}").await;
    assert_eq!(w.consume(&topic, 1).await.len(), 1, "{}", first.log_text());
    assert!(first.terminate().await.success(), "{}", first.log_text());
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &w.brokers)
        .create()
        .unwrap();
    let progress_topic = w.progress_topic();
    let described = admin
        .describe_configs(
            [&ResourceSpecifier::Topic(&progress_topic)],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    let config = described[0].as_ref().expect("the progress topic's config");
    assert_eq!(
        config
            .get("cleanup.policy")
            .and_then(|e| e.value.as_deref()),
        Some("compact"),
        "the progress topic was not the one Ferry creates; first start's log:\n{}",
        first.log_text()
    );

    let mut second = w.start_ferry();
    second.wait_ready().await;
    w.insert("order", "o-2", "Created", "{}").await;
    assert_eq!(w.consume(&topic, 2).await.len(), 2, "{}", second.log_text());
    assert!(second.terminate().await.success(), "{}", second.log_text());
    let log = second.log_text();
    // The lines this test reads are there at all.
    assert!(
        log.contains("Request metadata for"),
        "no librdkafka metadata lines in the log:\n{log}"
    );
    let every: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Request metadata for all topics"))
        .collect();
    assert!(
        every.is_empty(),
        "the restart asked for every topic:\n{}\n\nlog:\n{log}",
        every.join("\n")
    );
}
