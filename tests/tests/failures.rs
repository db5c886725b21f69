//! Failures end to end: the broker away (briefly or for long), `kill -9` of Ferry at several
//! points, PostgreSQL restarted or crashed under Ferry. In every scenario nothing committed is
//! lost, Ferry does not exit by itself, and the slot is never confirmed past a record Kafka has
//! not acknowledged.
//!
//! The events and the two rules asserted (no loss; per-key order of first occurrences) are
//! described in [`sequenced`]. With a finite `kafka.delivery_timeout` only the first holds (see
//! that scenario).
//!
//! Waits are conditions with deadlines. Where a scenario has a duration (an outage, moments to
//! kill at), it only decides when things happen, never what is asserted.

mod common;
mod sequenced;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ferry_core::testing::Rng;
use ferry_testkit::kafka::{self, LocalBroker};
use ferry_testkit::pg::{self, ClusterOptions, PgCluster, Postgres};
use ferry_testkit::proxy::Fault;
use ferry_wal::Lsn;
use sequenced::*;

const PARTITIONS: i32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_lsn_never_passes_an_unacknowledged_record_while_the_broker_is_down() {
    let broker = LocalBroker::start().await;
    let mut w = World::on(pg::shared().create_db().await, broker.brokers()).await;
    quick_reconnects(&mut w);
    w.env
        .push(("FERRY_POSTGRES_STATUS_INTERVAL".into(), "200ms".into()));
    let (topic, mut ferry) = relaying(&w).await;

    // The exact commit LSN of the first transaction written while the broker is down.
    let probe = CommitProbe::create(&w).await;
    tokio::task::block_in_place(|| broker.stop());
    insert_events(&w.sql, 10..110, 0).await;
    insert_events(&w.sql, 110..210, 0).await;
    let end = w.current_wal_lsn().await;
    let first_unacked = probe.first_commit_lsn(&w).await;
    probe.drop_slot(&w).await;
    wait_until(
        "Ferry received the transactions and handed them to the producer",
        Duration::from_secs(30),
        || async {
            metric(&ferry, "ferry_received_lsn").await >= first_unacked.0 as f64
                && metric(&ferry, "ferry_in_flight_records").await > 0.0
        },
    )
    .await;

    // Several standby status updates (the server's reply_time moves) while nothing is acked:
    // none of them moves the slot past the first unacknowledged commit. "Past" is `>`: decoding
    // skips a transaction only if its commit record starts *before* confirmed_flush_lsn
    // (`SnapBuildXactNeedsSkip`), and an idle keepalive may legitimately confirm exactly up to
    // the commit record when the rows before it were flushed first.
    let mut replies = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while replies.len() < 6 {
        let confirmed = w.confirmed_lsn().await.expect("slot exists");
        assert!(
            confirmed <= first_unacked,
            "slot confirmed at {confirmed}, past the unacknowledged commit {first_unacked}"
        );
        let reported = metric(&ferry, "ferry_confirmed_lsn").await;
        assert!(
            reported <= first_unacked.0 as f64,
            "Ferry reported {reported}, past the unacknowledged commit {first_unacked}"
        );
        if let Some((_, Some(reply))) = walsender(&w).await {
            replies.insert(reply);
        }
        assert!(
            Instant::now() < deadline,
            "only {} status updates reached the server in 30s",
            replies.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ferry.is_running(), "Ferry exited while the broker was down");

    tokio::task::block_in_place(|| broker.start_again());
    let events = consume_events(&w.brokers, &topic, 0..210).await;
    assert_key_order(&events, 0..210);
    wait_confirmed(&w, end).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_outage_loses_nothing_keeps_memory_bounded_and_ferry_keeps_running() {
    const WINDOW: f64 = 500.0;
    const OUTAGE: Duration = Duration::from_secs(15);
    // 30 000 rows of ~2 KiB (60 MiB) are written during the outage: buffering them would
    // raise the RSS far past the bound (measured: +78 MiB with a 100 000-record window), while
    // the window (500 records) and the reader's channel (at most ~2 MiB) stay well under it
    // (measured: +12 MiB).
    const ROWS: u64 = 30_000;
    const PAD: i32 = 2048;
    const RSS_GROWTH_BOUND: u64 = 40 << 20;
    let broker = LocalBroker::start().await;
    let mut w = World::on(pg::shared().create_db().await, broker.brokers()).await;
    // The server ends a walsender silent this long: the outage outlasts it several times, so
    // only Ferry's status updates keep the replication connection alive.
    wal_sender_timeout(&w, "3s").await;
    quick_reconnects(&mut w);
    w.env.push((
        "FERRY_KAFKA_MAX_IN_FLIGHT_RECORDS".into(),
        (WINDOW as u64).to_string(),
    ));
    let topic = w.create_topic(AGGREGATE, PARTITIONS).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    insert_events(&w.sql, 0..1000, PAD).await;
    consume_events(&w.brokers, &topic, 0..1000).await;
    let baseline_rss = ferry.rss_bytes().expect("ferry runs");
    let (walsender_pid, _) = walsender(&w).await.expect("Ferry streams");

    tokio::task::block_in_place(|| broker.stop());
    let outage = Instant::now();
    for from in (1000..1000 + ROWS).step_by(1000) {
        insert_events(&w.sql, from..from + 1000, PAD).await;
    }
    let end = w.current_wal_lsn().await;
    wait_until(
        "the in-flight window fills",
        Duration::from_secs(30),
        || async { metric(&ferry, "ferry_in_flight_records").await == WINDOW },
    )
    .await;
    let status_updates = metric(&ferry, "ferry_status_updates_sent_total").await;
    let mut peak_rss = 0;
    while outage.elapsed() < OUTAGE {
        assert!(ferry.is_running(), "Ferry exited during the outage");
        let in_flight = metric(&ferry, "ferry_in_flight_records").await;
        assert!(in_flight <= WINDOW, "{in_flight} records in flight");
        peak_rss = peak_rss.max(ferry.rss_bytes().expect("ferry runs"));
        tokio::time::sleep(Duration::from_millis(200)).await; // sampling period
    }
    assert_eq!(
        walsender(&w).await.map(|(pid, _)| pid),
        Some(walsender_pid),
        "the replication connection survived the outage"
    );
    assert_eq!(reconnects(&ferry, "postgres").await, 0.0);
    assert!(
        metric(&ferry, "ferry_status_updates_sent_total").await > status_updates,
        "Ferry's metrics show no status update during the outage"
    );
    assert!(
        peak_rss <= baseline_rss + RSS_GROWTH_BOUND,
        "RSS grew from {} MiB to {} MiB during the outage (bound: +{} MiB)",
        baseline_rss >> 20,
        peak_rss >> 20,
        RSS_GROWTH_BOUND >> 20
    );

    tokio::task::block_in_place(|| broker.start_again());
    let events = consume_events(&w.brokers, &topic, 0..1000 + ROWS).await;
    assert_key_order(&events, 0..1000 + ROWS);
    wait_confirmed(&w, end).await;
    assert!(ferry.is_running());
    eprintln!(
        "RSS: {} MiB before the outage, peak {} MiB during it",
        baseline_rss >> 20,
        peak_rss >> 20
    );
}

/// With a finite timeout, records fail while the broker is away and the session restarts from
/// the checkpoint. Only "no loss" is asserted: librdkafka may drop timed-out records of a
/// partition and deliver later ones of the same partition, so a key's first occurrences can
/// be out of commit order (which is why the default timeout is 0, never).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finite_delivery_timeout_restarts_from_the_checkpoint_and_loses_nothing() {
    let broker = LocalBroker::start().await;
    let mut w = World::on(pg::shared().create_db().await, broker.brokers()).await;
    quick_reconnects(&mut w);
    w.env
        .push(("FERRY_KAFKA_DELIVERY_TIMEOUT".into(), "3s".into()));
    let topic = w.create_topic(AGGREGATE, PARTITIONS).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    insert_events(&w.sql, 0..50, 0).await;
    consume_events(&w.brokers, &topic, 0..50).await;

    tokio::task::block_in_place(|| broker.stop());
    for from in (50..550).step_by(100) {
        insert_events(&w.sql, from..from + 100, 0).await;
    }
    let end = w.current_wal_lsn().await;
    wait_until(
        "a delivery failure restarts the session (kafka reconnect)",
        Duration::from_secs(40),
        || async { reconnects(&ferry, "kafka").await >= 1.0 },
    )
    .await;
    assert!(metric(&ferry, "ferry_delivery_errors_total").await >= 1.0);
    assert!(ferry.is_running(), "Ferry exited after delivery failures");
    assert!(
        w.confirmed_lsn().await.expect("slot") < end,
        "failed records were confirmed"
    );

    tokio::task::block_in_place(|| broker.start_again());
    let events = consume_events(&w.brokers, &topic, 0..550).await;
    assert_no_loss(&events, 0..550);
    wait_confirmed(&w, end).await;
    assert!(ferry.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_transaction_then_restart_loses_nothing() {
    const ROWS: u64 = 50_000;
    let mut w = World::new().await;
    quick_reconnects(&mut w);
    let topic = w.create_topic(AGGREGATE, PARTITIONS).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;

    insert_events(&w.sql, 0..ROWS, 0).await;
    let end = w.current_wal_lsn().await;
    // Kill as soon as Kafka acknowledged part of the transaction (polled tightly: no backoff).
    let deadline = Instant::now() + Duration::from_secs(60);
    let produced = loop {
        let n = metric(&ferry, "ferry_records_produced_total").await;
        if n >= 1.0 {
            break n;
        }
        assert!(Instant::now() < deadline, "nothing was produced in 60s");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    ferry.kill9();
    assert!(
        produced < ROWS as f64,
        "the whole transaction was acknowledged before the kill ({produced}): not mid-transaction"
    );
    assert!(
        w.confirmed_lsn().await.expect("slot") < end,
        "a partly acknowledged transaction was confirmed"
    );

    eprintln!("killed after {produced} of {ROWS} records were acknowledged");
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let events = consume_events(&w.brokers, &topic, 0..ROWS).await;
    assert_key_order(&events, 0..ROWS);
    wait_confirmed(&w, end).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_after_produce_before_ack_then_restart_loses_nothing() {
    let broker = LocalBroker::start().await;
    let mut w = World::on(pg::shared().create_db().await, broker.brokers()).await;
    quick_reconnects(&mut w);
    let topic = w.create_topic(AGGREGATE, PARTITIONS).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    insert_events(&w.sql, 0..20, 0).await;
    consume_events(&w.brokers, &topic, 0..20).await;

    tokio::task::block_in_place(|| broker.stop());
    insert_events(&w.sql, 20..120, 0).await;
    insert_events(&w.sql, 120..220, 0).await;
    let end = w.current_wal_lsn().await;
    wait_until(
        "every record was handed to the producer",
        Duration::from_secs(30),
        || async { metric(&ferry, "ferry_in_flight_records").await == 200.0 },
    )
    .await;
    ferry.kill9();
    assert!(
        w.confirmed_lsn().await.expect("slot") < end,
        "unacknowledged records were confirmed"
    );

    tokio::task::block_in_place(|| broker.start_again());
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let events = consume_events(&w.brokers, &topic, 0..220).await;
    assert_key_order(&events, 0..220);
    wait_confirmed(&w, end).await;
}

/// Covers "after ack, before confirm" among others: under a steady write load there is almost
/// always a transaction whose records are acknowledged and not yet confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_points_under_load_loses_nothing_and_keeps_key_order() {
    const KILLS: usize = 5;
    let mut rng = Rng::new(0x5eed_f00d);
    let mut w = World::new().await;
    quick_reconnects(&mut w);
    let topic = w.create_topic(AGGREGATE, PARTITIONS).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let sql = w.db.client().await;
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut next = 0;
            while !stop.load(Ordering::Relaxed) {
                insert_events(&sql, next..next + 10, 0).await;
                next += 10;
                tokio::time::sleep(Duration::from_millis(5)).await; // pacing: ~1500 rows/s
            }
            next
        })
    };
    for _ in 0..KILLS {
        // The moment to kill at: pseudo-random, reproducible; nothing waits on it.
        tokio::time::sleep(Duration::from_millis(200 + rng.next_u64() % 1300)).await;
        ferry.kill9();
        ferry = w.start_ferry();
        ferry.wait_ready().await;
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.expect("writer");
    let end = w.current_wal_lsn().await;

    let events = consume_events(&w.brokers, &topic, 0..written).await;
    assert_key_order(&events, 0..written);
    wait_confirmed(&w, end).await;
    eprintln!(
        "{written} events, {} records read ({} duplicates)",
        events.len(),
        events.len() as u64 - written
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_under_ferry_reconnects_and_resumes() {
    let pg = Postgres::Local(PgCluster::start(ClusterOptions::default()).await);
    let Postgres::Local(cluster) = &pg else {
        unreachable!()
    };
    let mut w = World::on(pg.create_db().await, kafka::shared().brokers()).await;
    quick_reconnects(&mut w);
    let topic = w.create_topic(AGGREGATE, PARTITIONS).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    insert_events(&w.sql, 0..100, 0).await;
    consume_events(&w.brokers, &topic, 0..100).await;

    // A clean (fast) shutdown and a start.
    tokio::task::block_in_place(|| cluster.stop(false));
    wait_until(
        "Ferry notices the server went away",
        Duration::from_secs(30),
        || async { reconnects(&ferry, "postgres").await >= 1.0 },
    )
    .await;
    tokio::task::block_in_place(|| cluster.start_again());
    w.sql = w.db.client().await;
    insert_events(&w.sql, 100..200, 0).await;
    consume_events(&w.brokers, &topic, 0..200).await;

    // A crash (immediate stop: recovery on start) right after a commit.
    insert_events(&w.sql, 200..300, 0).await;
    let before = reconnects(&ferry, "postgres").await;
    tokio::task::block_in_place(|| cluster.stop(true));
    wait_until(
        "Ferry notices the crash",
        Duration::from_secs(30),
        || async { reconnects(&ferry, "postgres").await > before },
    )
    .await;
    tokio::task::block_in_place(|| cluster.start_again());
    w.sql = w.db.client().await;
    insert_events(&w.sql, 300..400, 0).await;
    let end = w.current_wal_lsn().await;

    let events = consume_events(&w.brokers, &topic, 0..400).await;
    assert_key_order(&events, 0..400);
    wait_confirmed(&w, end).await;
    assert!(ferry.is_running(), "Ferry exited across the restarts");
}

/// PostgreSQL gone silent under a streaming Ferry, the connection left open (a dropped route,
/// a vanished host behind a proxy): the session ends once the receive timeout passed (the
/// configured one, or the server's `wal_sender_timeout` where longer; the server does not
/// answer the replies asked for), Ferry reconnects once the
/// route is back, and nothing is lost. Without the timeout the session waited as long as the
/// connection stayed open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_gone_silent_ends_the_session_after_the_receive_timeout() {
    let mut w = World::new().await;
    // Longer than the receive timeout below: the session waits the server's own.
    wal_sender_timeout(&w, "3s").await;
    quick_reconnects(&mut w);
    let (url, proxy) = through_proxy(&w.db.url).await;
    w.set_env(&[
        ("FERRY_POSTGRES_URL", url.as_str()),
        ("FERRY_POSTGRES_RECEIVE_TIMEOUT", "2s"),
        ("FERRY_POSTGRES_CONNECT_TIMEOUT", "1s"),
    ]);
    let (topic, mut ferry) = relaying(&w).await;

    let before = reconnects(&ferry, "postgres").await;
    proxy.inject(Fault::Blackhole);
    // Written meanwhile (on the test's own connection, not through the proxy).
    insert_events(&w.sql, 10..20, 0).await;
    let ended = ferry_testkit::wait_for(Duration::from_secs(30), || async {
        reconnects(&ferry, "postgres").await > before
    })
    .await;
    assert!(
        ended,
        "the session still waits on the silent server 30 s in:\n{}",
        ferry.log_text()
    );
    assert!(
        ferry
            .log_text()
            .contains("sent nothing on the replication connection for 3s"),
        "{}",
        ferry.log_text()
    );
    proxy.heal();
    let end = w.current_wal_lsn().await;
    let events = consume_events(&w.brokers, &topic, 0..20).await;
    assert_key_order(&events, 0..20);
    wait_confirmed(&w, end).await;
    assert!(ferry.is_running(), "{}", ferry.log_text());
}

/// PostgreSQL goes silent while Ferry waits for Kafka at its start: the SQL connection Ferry
/// opened meanwhile is the first session's, and its first query goes unanswered. The session
/// ends after the receive timeout (the old build waited for as long as the connection stayed
/// open: forever through a proxy), and Ferry streams soon after the route is back: the
/// connection was kept from before, so Ferry tries to connect every second, as after a failed
/// connect, not once the minute's backoff has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_gone_silent_before_the_session_streams_ends_it_after_the_receive_timeout() {
    let (mut w, broker) = world_behind_a_kafka_proxy().await;
    let (url, postgres) = through_proxy(&w.db.url).await;
    w.set_env(&[
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MIN", "1m"),
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MAX", "1m"),
        ("FERRY_POSTGRES_URL", url.as_str()),
        ("FERRY_POSTGRES_RECEIVE_TIMEOUT", "2s"),
        ("FERRY_POSTGRES_CONNECT_TIMEOUT", "1s"),
    ]);
    let topic = w.create_topic(AGGREGATE, PARTITIONS).await;
    broker.inject(Fault::Blackhole);
    let mut ferry = w.start_ferry();
    ferry
        .wait_log("the Kafka brokers cannot be used", Duration::from_secs(60))
        .await;
    // Ferry's SQL connection is open (through the proxy): the one its first session takes.
    let opened = ferry_testkit::wait_for(Duration::from_secs(30), || async {
        let row = w
            .sql
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                &[],
            )
            .await
            .expect("pg_stat_activity");
        row.get::<_, i64>(0) > 0
    })
    .await;
    assert!(
        opened,
        "Ferry opened no SQL connection:\n{}",
        ferry.log_text()
    );
    postgres.inject(Fault::Blackhole);
    broker.heal();
    ferry
        .wait_log(
            "the server did not answer the reads of the slot and the server within 2s",
            Duration::from_secs(60),
        )
        .await;
    // A first start: the slot is created once the route is back, and relays what follows.
    let healed = Instant::now();
    postgres.heal();
    ferry.wait_ready().await;
    assert!(
        healed.elapsed() < Duration::from_secs(30),
        "Ferry waited out its backoff after a kept connection failed:\n{}",
        ferry.log_text()
    );
    insert_events(&w.sql, 0..10, 0).await;
    let end = w.current_wal_lsn().await;
    let events = consume_events(&w.brokers, &topic, 0..10).await;
    assert_key_order(&events, 0..10);
    wait_confirmed(&w, end).await;
    assert!(ferry.is_running(), "{}", ferry.log_text());
}

/// The session's SQL connection ended by the server while the replication connection streams
/// on (a DBA's `pg_terminate_backend` of a connection that looks idle, the server's
/// `idle_session_timeout`). It holds the hand-over lock and samples the server's WAL position
/// for the lag metric, so the session ends after the records in flight and the next one
/// connects again, and the metric follows the server's WAL again. Before, the session streamed
/// on with the metric frozen at its last sample, and nothing said so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_sql_connection_was_ended_ends_and_the_next_connects_again() {
    let w = World::new().await;
    let (topic, mut ferry) = relaying(&w).await;
    let before = reconnects(&ferry, "postgres").await;
    end_sql_backends(&w).await;
    let reconnected = ferry_testkit::wait_for(Duration::from_secs(30), || async {
        reconnects(&ferry, "postgres").await > before
    })
    .await;
    assert!(
        reconnected,
        "the session streamed on without its SQL connection:\n{}",
        ferry.log_text()
    );
    assert!(
        ferry
            .log_text()
            .contains("the session's SQL connection closed while it streamed"),
        "{}",
        ferry.log_text()
    );
    relays_and_samples_on(&w, &mut ferry, &topic).await;
}

/// Ferry's connections stranded (a NAT or conntrack entry lost: their packets go nowhere,
/// new connections work) under `wal_sender_timeout = 0`: the server keeps the walsender, and
/// with it the slot, until its TCP gives up on the connection, hours later; and the session's
/// SQL backend, with the slot's hand-over lock. Ferry's next session finds the slot held by its
/// own earlier walsender, ends it, and streams on; it finds the lock held by its own earlier
/// SQL backend, ends it, and holds the lock, so that a standby takes over the moment this
/// instance ends. Before, it stood by behind itself for as long as the walsender lived; and
/// then (once that was fixed) the stale backend held the lock for good through a proxy, and a
/// standby could only take over at its next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn its_own_backends_left_holding_the_slot_and_its_lock_are_ended() {
    let mut w = World::new().await;
    wal_sender_timeout(&w, "0").await;
    let (url, proxy) = through_proxy(&w.db.url).await;
    w.set_env(&[
        ("FERRY_POSTGRES_URL", url.as_str()),
        ("FERRY_POSTGRES_RECEIVE_TIMEOUT", "2s"),
    ]);
    quick_reconnects(&mut w);
    let (topic, mut ferry) = relaying(&w).await;
    // The watch read which backend the walsender is before its first sample.
    let sampled = ferry_testkit::wait_for(Duration::from_secs(30), || async {
        ferry
            .metric("ferry_server_wal_lsn")
            .await
            .is_some_and(|lsn| lsn > 0.0)
    })
    .await;
    assert!(sampled, "{}", ferry.log_text());
    let old = walsender(&w).await.expect("a walsender streams the slot").0;
    let locked = ferry_testkit::wait_for(Duration::from_secs(30), || async {
        lock_holder(&w).await.is_some()
    })
    .await;
    assert!(
        locked,
        "the session holds no hand-over lock:\n{}",
        ferry.log_text()
    );
    let old_sql = lock_holder(&w).await.expect("held");
    proxy.inject(Fault::Strand);
    insert_events(&w.sql, 10..20, 0).await;
    let end = w.current_wal_lsn().await;
    let events = consume_events(&w.brokers, &topic, 0..20).await;
    assert_key_order(&events, 0..20);
    wait_confirmed(&w, end).await;
    assert!(
        ferry
            .log_text()
            .contains("ended this instance's walsender of an earlier session"),
        "{}",
        ferry.log_text()
    );
    let now = walsender(&w).await.expect("a walsender streams the slot").0;
    assert_ne!(now, old, "{}", ferry.log_text());
    // The lock is this session's, and the stale backend gone.
    let handed = ferry_testkit::wait_for(Duration::from_secs(30), || async {
        lock_holder(&w).await.is_some_and(|pid| pid != old_sql)
            && !sql_backends(&w).await.contains(&old_sql)
    })
    .await;
    assert!(
        handed,
        "the hand-over lock is held by {:?} (the stranded backend: {old_sql}):\n{}",
        lock_holder(&w).await,
        ferry.log_text()
    );
    assert!(
        ferry
            .log_text()
            .contains("ended this instance's SQL connection of an earlier session"),
        "{}",
        ferry.log_text()
    );
    // Ended and gone before the next session read the slot: it never stood by behind itself.
    assert!(
        !ferry.log_text().contains("standing by"),
        "{}",
        ferry.log_text()
    );
    assert!(ferry.is_running(), "{}", ferry.log_text());
}

/// Ferry stopping (SIGTERM) while records wait for Kafka, and its SQL connection ended during
/// the drain (a database sidecar stopped with the pod): it drains and exits as a stop does,
/// rather than starting another session, and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_connection_lost_while_stopping_still_stops() {
    let (mut w, broker) = world_behind_a_kafka_proxy().await;
    // Room for the steps below on a loaded machine before the drain would give up.
    w.set_env(&[("FERRY_SHUTDOWN_DRAIN_TIMEOUT", "120s")]);
    let (topic, mut ferry) = relaying(&w).await;
    // Records in flight that Kafka does not acknowledge: the drain waits on them.
    broker.inject(Fault::Blackhole);
    insert_events(&w.sql, 10..20, 0).await;
    let in_flight = ferry_testkit::wait_for(Duration::from_secs(30), || async {
        ferry
            .metric("ferry_in_flight_records")
            .await
            .is_some_and(|n| n >= 10.0)
    })
    .await;
    assert!(
        in_flight,
        "the records were not sent:\n{}",
        ferry.log_text()
    );
    ferry.send_signal(libc::SIGTERM);
    ferry
        .wait_log("SIGTERM received", Duration::from_secs(30))
        .await;
    end_sql_backends(&w).await;
    // The watch samples every 5 s.
    ferry
        .wait_log(
            "the session's SQL connection closed or does not answer",
            Duration::from_secs(30),
        )
        .await;
    broker.heal();
    let status = ferry.wait_exit(Duration::from_secs(60)).await;
    assert!(status.success(), "{status:?}:\n{}", ferry.log_text());
    assert!(
        !ferry.log_text().contains("session ended"),
        "{}",
        ferry.log_text()
    );
    let events = consume_events(&w.brokers, &topic, 0..20).await;
    assert_key_order(&events, 0..20);
}

/// The session's SQL connection left unanswered while the replication connection streams on:
/// its backend stopped here (SIGSTOP); a dropped route or a proxy that lost its server looks the
/// same. After `postgres.receive_timeout` the session ends, the query is cancelled, and the next
/// session connects again; the lag metric follows the server's WAL again. Before, the watch
/// waited on the query forever, the metric frozen at its last sample.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_sql_connection_stopped_answering_ends_after_the_receive_timeout() {
    let mut w = World::new().await;
    // The watch waits as long as the stream, never less than the server's wal_sender_timeout.
    wal_sender_timeout(&w, "0").await;
    w.set_env(&[("FERRY_POSTGRES_RECEIVE_TIMEOUT", "2s")]);
    let (topic, mut ferry) = relaying(&w).await;
    let before = reconnects(&ferry, "postgres").await;
    let pids = sql_backends(&w).await;
    // Continued when the test ends, however it ends: a stopped backend would hold up the
    // database's drop.
    let stopped = Stopped(pids);
    stopped.signal(libc::SIGSTOP);
    let gave_up = ferry_testkit::wait_for(Duration::from_secs(30), || async {
        ferry
            .log_text()
            .contains("the server did not answer the session's watch")
    })
    .await;
    assert!(
        gave_up,
        "the session waited on its SQL connection:\n{}",
        ferry.log_text()
    );
    let reconnected = ferry_testkit::wait_for(Duration::from_secs(30), || async {
        reconnects(&ferry, "postgres").await > before
    })
    .await;
    assert!(reconnected, "{}", ferry.log_text());
    // All while the old backend stays stopped.
    relays_and_samples_on(&w, &mut ferry, &topic).await;
    drop(stopped);
}

/// Ferry started on the world's topic and relaying: the first 10 events are in Kafka.
async fn relaying(w: &World) -> (String, Ferry) {
    let topic = w.create_topic(AGGREGATE, PARTITIONS).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    insert_events(&w.sql, 0..10, 0).await;
    consume_events(&w.brokers, &topic, 0..10).await;
    (topic, ferry)
}

/// A world of its own whose Ferry reaches the shared broker through a proxy.
async fn world_behind_a_kafka_proxy() -> (World, ferry_testkit::proxy::Proxy) {
    let upstream: std::net::SocketAddr = kafka::shared().brokers().parse().expect("one address");
    let broker = ferry_testkit::proxy::Proxy::kafka(upstream)
        .await
        .expect("proxy");
    let w = World::on(pg::shared().create_db().await, broker.addr().to_string()).await;
    (w, broker)
}

/// The pids of Ferry's SQL connections to the world's database (its walsender is not a
/// client backend); at least one.
async fn sql_backends(w: &World) -> Vec<i32> {
    let pids: Vec<i32> = w
        .sql
        .query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND backend_type = 'client backend' \
             AND application_name = 'ferry'",
            &[],
        )
        .await
        .expect("pg_stat_activity")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!pids.is_empty(), "Ferry had no SQL connection open");
    pids
}

/// Ends Ferry's SQL connections to the world's database (`pg_terminate_backend`).
async fn end_sql_backends(w: &World) {
    let pids = sql_backends(w).await;
    w.sql
        .execute(
            "SELECT pg_terminate_backend(pid) FROM unnest($1::int4[]) AS pid",
            &[&pids],
        )
        .await
        .expect("pg_terminate_backend");
}

/// After a session's SQL connection was lost: what follows is relayed and confirmed, and the
/// lag metric follows the server's WAL past it.
async fn relays_and_samples_on(w: &World, ferry: &mut Ferry, topic: &str) {
    insert_events(&w.sql, 10..20, 0).await;
    let end = w.current_wal_lsn().await;
    let events = consume_events(&w.brokers, topic, 0..20).await;
    assert_key_order(&events, 0..20);
    wait_confirmed(w, end).await;
    let sampled = ferry_testkit::wait_for(Duration::from_secs(30), || async {
        ferry
            .metric("ferry_server_wal_lsn")
            .await
            .is_some_and(|lsn| lsn >= end.0 as f64)
    })
    .await;
    assert!(
        sampled,
        "the lag metric's WAL position stayed behind {end}:\n{}",
        ferry.log_text()
    );
    assert!(ferry.is_running(), "{}", ferry.log_text());
}

/// PostgreSQL backends stopped (SIGSTOP) until this is dropped.
struct Stopped(Vec<i32>);

impl Stopped {
    fn signal(&self, signal: libc::c_int) {
        for &pid in &self.0 {
            ferry_testkit::process::signal_pid(pid as u32, signal);
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
    }
}

/// Ferry stopped (SIGSTOP) for longer than `postgres.receive_timeout` while the server sends:
/// once it runs again, what waits in the socket is read, not taken for the server's silence,
/// and the session goes on (no reconnection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ferry_stopped_for_a_while_takes_no_silence_for_the_servers() {
    let mut w = World::new().await;
    wal_sender_timeout(&w, "0").await;
    w.set_env(&[("FERRY_POSTGRES_RECEIVE_TIMEOUT", "2s")]);
    let (topic, mut ferry) = relaying(&w).await;
    let before = reconnects(&ferry, "postgres").await;

    ferry.send_signal(libc::SIGSTOP);
    let stopped = Instant::now();
    insert_events(&w.sql, 10..20, 0).await;
    // The fault's length: two and a half receive timeouts.
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(stopped.elapsed())).await;
    ferry.send_signal(libc::SIGCONT);

    consume_events(&w.brokers, &topic, 0..20).await;
    assert_eq!(
        reconnects(&ferry, "postgres").await,
        before,
        "the session ended:\n{}",
        ferry.log_text()
    );
    assert!(ferry.is_running(), "{}", ferry.log_text());
}

/// A session that could not connect is followed by quiet attempts during its backoff: Ferry
/// streams again soon after PostgreSQL is back, not when a long backoff ends. Ferry starts
/// while the server is down, with a backoff of a minute; the server comes back once Ferry has
/// said it waits, and Ferry must stream within 30 s (the old build waited the minute out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_back_is_used_without_waiting_out_the_backoff() {
    let pg = Postgres::Local(PgCluster::start(ClusterOptions::default()).await);
    let Postgres::Local(cluster) = &pg else {
        unreachable!()
    };
    let mut w = World::on(pg.create_db().await, kafka::shared().brokers()).await;
    w.set_env(&[
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MIN", "1m"),
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MAX", "1m"),
    ]);
    let topic = w.create_topic(AGGREGATE, PARTITIONS).await;
    tokio::task::block_in_place(|| cluster.stop(false));
    let mut ferry = w.start_ferry();
    ferry
        .wait_log("retry_in_ms=60000", Duration::from_secs(60))
        .await;
    tokio::task::block_in_place(|| cluster.start_again());
    w.sql = w.db.client().await;
    let streams = ferry_testkit::wait_for(Duration::from_secs(30), || async {
        walsender(&w).await.is_some()
    })
    .await;
    assert!(
        streams,
        "Ferry did not stream within 30 s of the server's return:\n{}",
        ferry.log_text()
    );
    insert_events(&w.sql, 0..10, 0).await;
    consume_events(&w.brokers, &topic, 0..10).await;
    assert!(ferry.is_running(), "{}", ferry.log_text());
}

/// A long-lived instance is not punished for its past: a session that worked (it confirmed
/// something) starts the backoff over, so every one of several walsender terminations, each
/// after a working session, is retried after the minimum wait, not after a doubling one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_session_that_worked_starts_the_backoff_over() {
    const ENDS: usize = 5;
    let mut w = World::new().await;
    // A maximum no session here lasts: only a confirmation can start the backoff over.
    w.set_env(&[
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MIN", "50ms"),
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MAX", "1h"),
    ]);
    let topic = w.create_topic(AGGREGATE, PARTITIONS).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let mut pid = None;
    for i in 0..=ENDS as u64 {
        // A new session streams...
        let old = pid;
        let seen = ferry_testkit::wait_for(Duration::from_secs(60), || async {
            walsender(&w).await.is_some_and(|(p, _)| Some(p) != old)
        })
        .await;
        assert!(seen, "session {i} did not start:\n{}", ferry.log_text());
        pid = walsender(&w).await.map(|(p, _)| p);
        // ...and works: a row is produced and its position confirmed.
        let before = metric(&ferry, "ferry_confirmed_lsn").await;
        insert_events(&w.sql, i * 10..(i + 1) * 10, 0).await;
        consume_events(&w.brokers, &topic, 0..(i + 1) * 10).await;
        wait_until(
            "the session confirmed the row's position",
            Duration::from_secs(30),
            || async { metric(&ferry, "ferry_confirmed_lsn").await > before },
        )
        .await;
        if i == ENDS as u64 {
            break;
        }
        // Its walsender ends; Ferry lives on.
        w.sql
            .execute("SELECT pg_terminate_backend($1)", &[&pid.unwrap()])
            .await
            .expect("pg_terminate_backend");
    }
    assert!(ferry.is_running(), "{}", ferry.log_text());
    let log = ferry.log_text();
    let waits: Vec<&str> = log
        .lines()
        // The field ends the log record, whatever lines its error message takes.
        .filter_map(|l| l.split("retry_in_ms=").nth(1))
        .map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap_or("")
        })
        .collect();
    assert_eq!(waits, vec!["50"; ENDS], "the waits after each end:\n{log}");
}

// ---------------------------------------------------------------------------------------------

/// The server's `wal_sender_timeout` for the world's database (`"0"`: off). Ferry's receive
/// timeout is never shorter than it (60 s by default); off, the walsender does not end the
/// connection of a Ferry a test stops.
async fn wal_sender_timeout(w: &World, value: &str) {
    w.sql
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET wal_sender_timeout = '{value}'",
            w.db.name
        ))
        .await
        .expect("ALTER DATABASE ... SET wal_sender_timeout");
}

/// Small backoffs so that reconnects happen within the test's time.
fn quick_reconnects(w: &mut World) {
    w.set_env(&[
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MIN", "100ms"),
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MAX", "1s"),
    ]);
}

/// A metric's value, 0 when absent (or Ferry not answering).
async fn metric(ferry: &Ferry, name: &str) -> f64 {
    ferry.metric(name).await.unwrap_or(0.0)
}

/// `ferry_reconnects_total{component}`.
async fn reconnects(ferry: &Ferry, component: &str) -> f64 {
    ferry
        .metric_labeled("ferry_reconnects_total", "component", component)
        .await
        .unwrap_or(0.0)
}

/// The backend holding the slot's hand-over lock, if one does.
async fn lock_holder(w: &World) -> Option<i32> {
    ferry_wal::slot::handover::holder(&w.sql, &w.slot)
        .await
        .expect("pg_locks")
}

/// The walsender streaming the world's slot: its pid and the time of the last status update it
/// received (`reply_time`, as text).
async fn walsender(w: &World) -> Option<(i32, Option<String>)> {
    w.sql
        .query_opt(
            "SELECT r.pid, r.reply_time::text FROM pg_stat_replication r
             JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1",
            &[&w.slot],
        )
        .await
        .expect("pg_stat_replication")
        .map(|r| (r.get(0), r.get(1)))
}

/// Waits until the slot is confirmed at or past `lsn`.
async fn wait_confirmed(w: &World, lsn: Lsn) {
    wait_until(
        &format!("the slot is confirmed past {lsn}"),
        Duration::from_secs(30),
        || async { w.confirmed_lsn().await.is_some_and(|c| c >= lsn) },
    )
    .await;
}

/// A second pgoutput slot on the world's publication, to learn a transaction's exact commit
/// LSN: the `final_lsn` of its Begin message (`B`, then the LSN as Int64).
struct CommitProbe(String);

impl CommitProbe {
    async fn create(w: &World) -> CommitProbe {
        let name = format!("{}_probe", w.slot);
        w.sql
            .execute(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&name],
            )
            .await
            .expect("create probe slot");
        CommitProbe(name)
    }

    /// The commit LSN of the first outbox transaction after the probe was created.
    async fn first_commit_lsn(&self, w: &World) -> Lsn {
        let rows = w
            .sql
            .query(
                "SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
                   'proto_version', '1', 'publication_names', $2)",
                &[&self.0, &w.publication],
            )
            .await
            .expect("peek probe slot");
        rows.iter()
            .map(|r| r.get::<_, Vec<u8>>(0))
            .find(|d| d.first() == Some(&b'B') && d.len() >= 9)
            .map(|d| Lsn(u64::from_be_bytes(d[1..9].try_into().expect("8 bytes"))))
            .expect("a Begin message on the probe slot")
    }

    async fn drop_slot(self, w: &World) {
        w.sql
            .execute("SELECT pg_drop_replication_slot($1)", &[&self.0])
            .await
            .expect("drop probe slot");
    }
}
