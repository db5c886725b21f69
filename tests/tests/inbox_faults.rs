//! `ferry inbox` under faults, end to end: real Kafka, real PostgreSQL, the real binary killed,
//! paused, stopped and started again while a producer writes. Every scenario ends with the same
//! check ([`assert_exactly_once`]): every produced record is in the inbox exactly once (by its
//! event id and by its topic, partition and offset), nothing went to the dead-letter table, per
//! key the rows in (partition, offset) order carry the key's produced sequence 0, 1, 2, …, and
//! each partition's stored next offset is the end of what it holds.
//!
//! Deduplication by event id is off in the fault scenarios (`inbox.event_id_header = ""`): it
//! would hide a record the offsets let through twice (the repeat would be dropped as a known id).
//! Without it, a record written twice is refused by the inbox's primary key and ends up in the
//! dead-letter table, which the check requires empty. The application-side scenario runs with the
//! defaults.
//!
//! Waits are conditions with deadlines. Where a scenario has a duration (the producer's pace,
//! the moment of a kill), it only decides when things happen, never what is asserted.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{through_proxy, wait_until, Ferry, World};
use ferry_core::testing::Rng;
use ferry_testkit::kafka::{self, LocalBroker};
use ferry_testkit::pg::{self, ClusterOptions, PgCluster, Postgres};
use ferry_testkit::proxy::Fault;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio_postgres::{AsyncMessage, Client, NoTls};

// ---------------------------------------------------------------------------------------------
// 1. kill -9 in a loop

/// `ferry inbox` killed (SIGKILL) 6 to 10 times at seeded random moments while a producer writes
/// 20 000 records to three partitions, and started again each time: every record lands once.
/// Kafka's committed offsets (advice, written after each database commit) are never ahead of the
/// database's, checked at every kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_loop_under_a_producer_stores_every_record_exactly_once() {
    const TOTAL: usize = 20_000;
    const SEED: u64 = 0x1b0c_4411;
    let started = Instant::now();
    let mut w = World::new().await;
    let topic = w.create_topic("inbox_kill", 3).await;
    let group = format!("{topic}.group");
    inbox_env(
        &mut w,
        &topic,
        &group,
        &[("FERRY_INBOX_MAX_BATCH_RECORDS", "50")],
    );
    let recs = records(TOTAL, 200, SEED);
    let producing = produce_in_background(&w.brokers, &topic, recs.clone(), 200, ms(450));

    let mut rng = Rng::new(SEED);
    let kills = rng.range(6, 10);
    let mut ferry = Ferry::spawn(&w, &["inbox"]);
    let mut mid_stream = 0;
    for round in 0..kills {
        // Once this copy has its partitions (after the killed one's session expired), let it
        // write for a random while and kill it.
        wait_until(
            &format!("round {round}: the inbox has its 3 partitions"),
            secs(60),
            || async { metric(&ferry, "ferry_inbox_partitions").await == 3.0 },
        )
        .await;
        tokio::time::sleep(ms(rng.range(0, 2_000))).await;
        let before = metric(&ferry, "ferry_inbox_rows_inserted_total").await;
        let gathered = metric(&ferry, "ferry_inbox_buffered_bytes").await;
        ferry.kill9();
        if before > 0.0 || gathered > 0.0 {
            mid_stream += 1;
        }
        assert_advice_not_ahead(&w, &topic, &group, 3).await;
        eprintln!(
            "kill {}/{kills} at {:?}: that copy had inserted {before} rows, {} of {TOTAL} produced",
            round + 1,
            started.elapsed(),
            producing.acked.load(Ordering::Relaxed)
        );
        ferry = Ferry::spawn(&w, &["inbox"]);
    }
    producing.finish().await;
    wait_consumed(&w.sql, &topic, &group, TOTAL).await;
    assert_advice_not_ahead(&w, &topic, &group, 3).await;
    let status = ferry.terminate().await;
    assert!(status.success(), "{}", ferry.log_text());
    assert_exactly_once(&w.sql, &topic, &group, &recs).await;
    assert!(
        mid_stream >= kills / 2,
        "only {mid_stream} of {kills} kills hit a copy that had written or gathered records"
    );
    eprintln!("took {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// 2. two copies in one group, with rebalances

/// Two `ferry inbox` processes share a group on six partitions under a producer; one is stopped
/// (SIGTERM) and another started, one killed (SIGKILL) and another started, one more stopped:
/// every record lands once, and every copy wrote rows while it had partitions.
///
/// The producer writes a burst before each change of members, so that each rebalance comes
/// while the copies are behind: records fetched before a revocation are still queued when the
/// same copy gets the partition back (the eager protocol revokes everything at each rebalance).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_copies_in_one_group_through_rebalances_store_every_record_exactly_once() {
    const BURST: usize = 2_000;
    const BURSTS: usize = 7;
    let started = Instant::now();
    let mut w = World::new().await;
    let topic = w.create_topic("inbox_group", 6).await;
    let group = format!("{topic}.group");
    inbox_env(
        &mut w,
        &topic,
        &group,
        &[("FERRY_INBOX_MAX_BATCH_RECORDS", "20")],
    );
    let recs = records(BURSTS * BURST, 300, 0x2c0de);
    let mut bursts = recs.chunks(BURST);
    let p = producer(&w.brokers);
    let mut behind = 0;
    let mut burst = async |w: &World| {
        let before = rows(&w.sql, &topic).await;
        produce(&p, &topic, bursts.next().expect("a burst left")).await;
        // Behind when the change comes, as a rule (counted, not required).
        if rows(&w.sql, &topic).await < before + BURST as i64 {
            behind += 1;
        }
    };

    // Both start at once (they create the tables concurrently).
    let mut a = Ferry::spawn(&w, &["inbox"]);
    let mut b = Ferry::spawn(&w, &["inbox"]);
    wait_shared(&[&a, &b], 6, "A and B share the partitions").await;
    burst(&w).await;
    let b_rows = wait_wrote(&b, "B").await;
    burst(&w).await;
    let b_status = b.terminate().await;
    assert!(b_status.success(), "B: {}", b.log_text());

    let mut c = Ferry::spawn(&w, &["inbox"]);
    wait_shared(&[&a, &c], 6, "A and C share the partitions").await;
    burst(&w).await;
    let c_rows_early = wait_wrote(&c, "C").await;
    let a_rows = wait_wrote(&a, "A").await;
    burst(&w).await;
    a.kill9();

    let mut d = Ferry::spawn(&w, &["inbox"]);
    wait_shared(&[&c, &d], 6, "C and D share the partitions").await;
    burst(&w).await;
    let d_rows_early = wait_wrote(&d, "D").await;
    burst(&w).await;
    let c_rows = metric(&c, "ferry_inbox_rows_inserted_total").await;
    let c_status = c.terminate().await;
    assert!(c_status.success(), "C: {}", c.log_text());

    wait_shared(&[&d], 6, "D has every partition").await;
    burst(&w).await;
    wait_consumed(&w.sql, &topic, &group, recs.len()).await;
    let d_rows = metric(&d, "ferry_inbox_rows_inserted_total").await;
    let d_status = d.terminate().await;
    assert!(d_status.success(), "D: {}", d.log_text());
    eprintln!(
        "rows inserted: A {a_rows} (before its kill), B {b_rows}, C {c_rows} (first seen {c_rows_early}), \
         D {d_rows} (first seen {d_rows_early}); {behind} of {BURSTS} bursts still being written at the change; took {:?}",
        started.elapsed()
    );
    assert_exactly_once(&w.sql, &topic, &group, &recs).await;
}

// ---------------------------------------------------------------------------------------------
// 3. a zombie is fenced

/// Copy A has a write in flight (its database connection goes through a proxy that holds every
/// byte) and is paused (SIGSTOP) beyond the group's session timeout; copy B takes the partitions
/// and writes past A's batch. A is resumed (SIGCONT; its consumer revokes the partitions, which
/// waits for the write in flight) and the proxy lets A's write through: the database's offsets
/// are not what A read, so the write is fenced, A writes nothing and exits with 1, and B goes on.
///
/// A batch that is only gathered, not in flight, is no zombie: on SIGCONT librdkafka notices at
/// once that its session timed out and the revocation drops the batch before any write (tried
/// first with a long `inbox.max_batch_delay`: A rejoined the group and shared the partitions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_copy_that_lost_its_partitions_is_fenced_and_writes_nothing() {
    let started = Instant::now();
    let mut w = World::new().await;
    let topic = w.create_topic("inbox_zombie", 3).await;
    let group = format!("{topic}.group");
    inbox_env(&mut w, &topic, &group, &[]);
    let recs = records(1_000, 50, 0x3d0e);
    let p = producer(&w.brokers);
    produce(&p, &topic, &recs[..600]).await;

    let (a_url, proxy) = through_proxy(&w.db.url).await;
    let mut a = spawn_with(&mut w, &[("FERRY_POSTGRES_URL", &a_url)]);
    wait_rows(&w.sql, &topic, 600, secs(60)).await;
    // A's next write goes out and is held; the records behind it wait in A's memory.
    proxy.inject(Fault::Blackhole);
    produce(&p, &topic, &recs[600..900]).await;
    wait_until("A took the next 300 records", secs(30), || async {
        metric(&a, "ferry_inbox_records_total").await >= 900.0
    })
    .await;
    a.send_signal(libc::SIGSTOP);
    assert_eq!(rows(&w.sql, &topic).await, 600);

    let mut b = Ferry::spawn(&w, &["inbox"]);
    wait_rows(&w.sql, &topic, 900, secs(60)).await;
    a.send_signal(libc::SIGCONT);
    a.wait_log("partitions revoked", secs(30)).await;
    proxy.heal();
    let a_status = a.wait_exit(secs(30)).await;
    let a_log = a.log_text();
    assert_eq!(a_status.code(), Some(1), "A was not fenced:\n{a_log}");
    assert!(
        a_log.contains("written by another consumer"),
        "A's log does not say why it stopped:\n{a_log}"
    );
    assert_eq!(
        rows(&w.sql, &topic).await,
        900,
        "A wrote after it was resumed"
    );

    produce(&p, &topic, &recs[900..]).await;
    wait_rows(&w.sql, &topic, 1_000, secs(60)).await;
    assert!(b.is_running(), "B stopped: {}", b.log_text());
    let b_status = b.terminate().await;
    assert!(b_status.success(), "B: {}", b.log_text());
    assert_exactly_once(&w.sql, &topic, &group, &recs).await;
    eprintln!("took {:?}", started.elapsed());
}

/// The database goes silent under `ferry inbox` (a proxy that forwards nothing, as a server
/// gone without closing the connection or a failover behind a load balancer looks): the write
/// in flight is given up on after `postgres.receive_timeout`, `/readyz` says the inbox is not
/// ready, and once the route is back every record lands once. The old build waited on the
/// write for as long as the connection stayed open, ready all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_gone_silent_is_given_up_on_and_every_record_lands_once_it_answers() {
    let Proxied {
        w,
        topic,
        group,
        proxy,
        recs,
        p,
        mut f,
    } = inbox_through_proxy("inbox_silent", "2s", 0x5113, &[]).await;
    proxy.inject(Fault::Blackhole);
    produce(&p, &topic, &recs[300..]).await;
    f.wait_log("the database did not answer the write within 2s", secs(60))
        .await;
    wait_until("the inbox says it is not ready", secs(30), || async {
        matches!(f.http_get("/readyz").await, Some((503, _)))
    })
    .await;
    proxy.heal();
    wait_rows(&w.sql, &topic, 600, secs(60)).await;
    assert!(f.is_running(), "{}", f.log_text());
    let status = f.terminate().await;
    assert!(status.success(), "{}", f.log_text());
    assert_exactly_once(&w.sql, &topic, &group, &recs).await;
}

/// A write's connection stranded in the middle of its transaction (a NAT or conntrack entry
/// lost: the flow's packets go nowhere, while the database lives on and new connections work).
/// The backend stays in its transaction, holding the offsets' rows, until the server's TCP
/// keepalive gives up (over two hours by default; through a proxy, never), and every load and
/// write after it waits on those rows. The inbox ends that backend once the database answers
/// on a new connection, and every record lands once. The old build retried behind it for as
/// long as the backend lived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_stranded_in_its_transaction_is_ended_and_every_record_lands_once() {
    let Proxied {
        w,
        topic,
        group,
        proxy,
        recs,
        p,
        mut f,
    } = inbox_through_proxy("inbox_stranded", "10s", 0x57a4, &[]).await;
    // The next write takes the offsets' rows first, then waits behind this lock to insert.
    let locker = w.db.client().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE ferry_inbox IN SHARE MODE")
        .await
        .expect("lock");
    produce(&p, &topic, &recs[300..]).await;
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                   AND application_name = 'ferry' AND wait_event_type = 'Lock'";
    wait_until("the write waits on the lock", secs(60), || async {
        count(&w.sql, waiting).await >= 1
    })
    .await;
    // Well within the receive timeout (10 s, long enough for a loaded machine to get here):
    // the write is not given up on yet.
    proxy.inject(Fault::Strand);
    locker.batch_execute("COMMIT").await.expect("unlock");
    // The backend inserts, and its answer and the client's next statement go nowhere.
    // Idle in its transaction, or in its COPY waiting for the data (the COPY's go-ahead is what
    // went nowhere): either way waiting on the client, a transaction id held.
    let stranded = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                    AND application_name = 'ferry' AND wait_event = 'ClientRead' \
                    AND backend_xid IS NOT NULL";
    wait_until(
        "the stranded backend sits in its transaction",
        secs(30),
        || async { count(&w.sql, stranded).await >= 1 },
    )
    .await;
    let landed =
        ferry_testkit::wait_for(secs(60), || async { rows(&w.sql, &topic).await >= 600 }).await;
    assert!(
        landed,
        "{} of 600 rows after 60 s, {} backend(s) still in a transaction:\n{}",
        rows(&w.sql, &topic).await,
        count(&w.sql, stranded).await,
        f.log_text()
    );
    let ended =
        ferry_testkit::wait_for(secs(30), || async { count(&w.sql, stranded).await == 0 }).await;
    assert!(ended, "the stranded backend lives on:\n{}", f.log_text());
    said_and_stops_cleanly(
        &mut f,
        "ended the database backend of the write given up on",
    )
    .await;
    assert_exactly_once(&w.sql, &topic, &group, &recs).await;
}

/// The cleanup's connection stranded between two cleanups (a NAT or conntrack entry lost
/// while it sat idle): the next cleanup's DELETE goes nowhere. It is given up on after
/// `postgres.receive_timeout` and the next cleanup runs on a new connection. The old build
/// waited on it for as long as the connection lived (through a proxy, for good), and no
/// cleanup ran again: the deduplication and processed rows grew without bound, and nothing said
/// so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_stranded_on_its_connection_is_given_up_on_and_the_next_one_cleans() {
    let Proxied {
        w,
        topic,
        mut f,
        proxy,
        ..
    } = inbox_through_proxy(
        "inbox_cleanup_stranded",
        "2s",
        0xc1ea,
        &[
            ("FERRY_INBOX_PROCESSED_RETENTION", "1s"),
            ("FERRY_INBOX_CLEANUP_INTERVAL", "1s"),
        ],
    )
    .await;
    let process = |n: i64| {
        let (sql, topic) = (&w.sql, &topic);
        async move {
            sql.execute(
                "UPDATE ferry_inbox SET processed_at = now() - interval '1 hour' \
                 WHERE ctid = ANY(ARRAY(SELECT ctid FROM ferry_inbox \
                   WHERE topic = $1 AND processed_at IS NULL LIMIT $2))",
                &[topic, &n],
            )
            .await
            .expect("mark rows processed");
        }
    };
    // A first cleanup deletes 100 rows: the cleaner holds its connection from then on.
    process(100).await;
    wait_until("the first cleanup deletes 100 rows", secs(60), || async {
        rows(&w.sql, &topic).await == 200
    })
    .await;
    proxy.inject(Fault::Strand);
    process(200).await;
    let cleaned =
        ferry_testkit::wait_for(secs(30), || async { rows(&w.sql, &topic).await == 0 }).await;
    assert!(
        cleaned,
        "{} processed rows left after 30 s:\n{}",
        rows(&w.sql, &topic).await,
        f.log_text()
    );
    said_and_stops_cleanly(&mut f, "the database did not answer the cleanup within 2s").await;
}

/// The start waits on a lock (a migration's `ACCESS EXCLUSIVE` lock on the inbox's tables,
/// another copy creating them; a server gone behind a proxy looks the same): `ferry inbox`
/// stops after `postgres.receive_timeout`, says why, and leaves nothing waiting behind the lock
/// (a restart after each would queue one more backend), instead of waiting without a word, not
/// ready, for as long as the lock is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_the_database_does_not_answer_stops_after_the_receive_timeout_and_says_why() {
    let mut w = World::new().await;
    let topic = w.create_topic("inbox_start_locked", 1).await;
    let group = format!("{topic}.group");
    inbox_env(
        &mut w,
        &topic,
        &group,
        &[("FERRY_POSTGRES_RECEIVE_TIMEOUT", "2s")],
    );
    // The tables first, so that the lock has something to hold.
    let mut first = Ferry::spawn(&w, &["inbox"]);
    first.wait_log("consuming into the inbox", secs(60)).await;
    assert!(first.terminate().await.success(), "{}", first.log_text());
    // Each step of the start behind its lock: the tables' creation takes turns under an
    // advisory lock (copies starting together), the statements' preparation reads the tables.
    for (lock, step) in [
        (
            "SELECT pg_advisory_xact_lock(hashtext('ferry inbox tables \"public\".\"ferry_inbox\"'))",
            "the look-up or creation of its tables",
        ),
        (
            "LOCK TABLE ferry_inbox IN ACCESS EXCLUSIVE MODE",
            "the preparation of its statements",
        ),
    ] {
        let locker = w.db.client().await;
        locker
            .batch_execute(&format!("BEGIN; {lock}"))
            .await
            .expect("lock");
        let mut f = Ferry::spawn(&w, &["inbox"]);
        let status = f.wait_exit(secs(30)).await;
        assert!(!status.success(), "{}", f.log_text());
        assert!(
            f.log_text().contains(&format!(
                "the database did not answer {step} within 2s"
            )),
            "{}",
            f.log_text()
        );
        // Cancelled before it stopped: nothing of it is left waiting behind the lock.
        let waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                       AND application_name = 'ferry' AND wait_event_type = 'Lock'";
        wait_until("nothing of it waits behind the lock", secs(30), || async {
            count(&w.sql, waiting).await == 0
        })
        .await;
        locker.batch_execute("ROLLBACK").await.expect("unlock");
    }
}

// ---------------------------------------------------------------------------------------------
// 4. the broker restarted

/// A private broker stopped (SIGTERM) and started again, then killed (SIGKILL) and started
/// again, while the producer and `ferry inbox` run: `ferry inbox` keeps running, logs the
/// brokers away, says on `/readyz` that it waits for the group once its session timed out, is
/// ready again afterwards, and every record lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_stopped_and_killed_under_the_inbox_loses_and_duplicates_nothing() {
    const TOTAL: usize = 8_000;
    let started = Instant::now();
    let broker = LocalBroker::start().await;
    let mut w = World::on(pg::shared().create_db().await, broker.brokers()).await;
    let topic = w.create_topic("inbox_broker", 3).await;
    let group = format!("{topic}.group");
    inbox_env(
        &mut w,
        &topic,
        &group,
        &[
            ("FERRY_INBOX_MAX_BATCH_RECORDS", "50"),
            ("FERRY_KAFKA_PROPERTIES_RECONNECT_BACKOFF_MAX_MS", "1000"),
        ],
    );
    let recs = records(TOTAL, 100, 0x4b40);
    let producing = produce_in_background(&w.brokers, &topic, recs.clone(), 200, ms(500));
    let mut ferry = Ferry::spawn(&w, &["inbox"]);
    ferry.wait_ready().await;

    for kill in [false, true] {
        let before = rows(&w.sql, &topic).await;
        wait_until("the inbox writes", secs(60), || async {
            rows(&w.sql, &topic).await >= before + 500
        })
        .await;
        let reports = kafka_reports(&ferry);
        tokio::task::block_in_place(|| if kill { broker.kill() } else { broker.stop() });
        let down = rows(&w.sql, &topic).await;
        wait_until(
            "the inbox's consumer reports the broker away",
            secs(30),
            || async { kafka_reports(&ferry) > reports },
        )
        .await;
        // Once the group session times out, the consumer has no partitions: not ready.
        wait_until(
            "/readyz says the inbox waits for the group",
            secs(30),
            || async {
                matches!(ferry.http_get("/readyz").await,
                Some((503, why)) if why.contains("waiting for the consumer group"))
            },
        )
        .await;
        assert!(
            ferry.is_running(),
            "ferry inbox exited with the broker away:\n{}",
            ferry.log_text()
        );
        tokio::task::block_in_place(|| broker.start_again());
        wait_until("the inbox writes again", secs(60), || async {
            rows(&w.sql, &topic).await > down
        })
        .await;
        eprintln!(
            "broker {} at {down} rows, back at {:?}",
            if kill { "killed" } else { "stopped" },
            started.elapsed()
        );
    }
    producing.finish().await;
    wait_consumed(&w.sql, &topic, &group, TOTAL).await;
    assert!(ferry.is_running(), "{}", ferry.log_text());
    wait_until("/readyz is 200", secs(30), || async {
        matches!(ferry.http_get("/readyz").await, Some((200, _)))
    })
    .await;
    let status = ferry.terminate().await;
    assert!(status.success(), "{}", ferry.log_text());
    assert_exactly_once(&w.sql, &topic, &group, &recs).await;
    eprintln!("took {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// 5. the database restarted

/// The inbox's PostgreSQL crashes (immediate stop) twice while `ferry inbox` writes, and starts
/// again: `ferry inbox` does not exit, counts the failed writes, reloads the offsets, and every
/// record lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_crashes_under_the_inbox_lose_and_duplicate_nothing() {
    const TOTAL: usize = 6_000;
    let started = Instant::now();
    let pg = Postgres::Local(PgCluster::start(ClusterOptions::default()).await);
    let Postgres::Local(cluster) = &pg else {
        unreachable!()
    };
    let mut w = World::on(pg.create_db().await, kafka::shared().brokers()).await;
    let topic = w.create_topic("inbox_pg", 3).await;
    let group = format!("{topic}.group");
    inbox_env(
        &mut w,
        &topic,
        &group,
        &[("FERRY_INBOX_MAX_BATCH_RECORDS", "50")],
    );
    let recs = records(TOTAL, 100, 0x5e5);
    let producing = produce_in_background(&w.brokers, &topic, recs.clone(), 200, ms(400));
    let mut ferry = Ferry::spawn(&w, &["inbox"]);
    ferry.wait_ready().await;

    for _ in 0..2 {
        let before = rows(&w.sql, &topic).await;
        wait_until("the inbox writes", secs(60), || async {
            rows(&w.sql, &topic).await >= before + 500
        })
        .await;
        let failures = metric(&ferry, "ferry_inbox_write_failures_total").await;
        tokio::task::block_in_place(|| cluster.stop(true));
        wait_until("the inbox notices the crash", secs(30), || async {
            metric(&ferry, "ferry_inbox_write_failures_total").await > failures
        })
        .await;
        assert!(
            matches!(ferry.http_get("/readyz").await, Some((503, _))),
            "/readyz is not 503 with the database down"
        );
        tokio::task::block_in_place(|| cluster.start_again());
        w.sql = w.db.client().await;
        let back = rows(&w.sql, &topic).await;
        wait_until("the inbox writes again", secs(60), || async {
            rows(&w.sql, &topic).await > back
        })
        .await;
        assert!(
            ferry.is_running(),
            "ferry inbox exited:\n{}",
            ferry.log_text()
        );
    }
    producing.finish().await;
    wait_consumed(&w.sql, &topic, &group, TOTAL).await;
    let failures = metric(&ferry, "ferry_inbox_write_failures_total").await;
    assert!(failures > 0.0, "no write failure counted");
    ferry.wait_ready().await;
    let status = ferry.terminate().await;
    assert!(status.success(), "{}", ferry.log_text());
    assert_exactly_once(&w.sql, &topic, &group, &recs).await;
    eprintln!("{failures} failures counted; took {:?}", started.elapsed());
}

/// A fresh group (no stored offsets) starts on a 250 000-record backlog, and the inbox's
/// database connections are dropped (`pg_terminate_backend`) three times while `ferry inbox`
/// works through it (`inbox.max_buffered_bytes` at its 1 MiB minimum, so the consumer's queue
/// is full of records fetched ahead). Records fetched before a partition's seek, from a
/// position of librdkafka's own, are still being handed over when its offset is loaded; with
/// no stored offset (or after a reload) nothing but their seek epoch tells them apart, and a
/// copy that took them would skip what lies before. Every record lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_dropped_under_a_deep_backlog_lose_and_duplicate_nothing() {
    const TOTAL: usize = 250_000;
    let started = Instant::now();
    let mut w = World::new().await;
    let topic = w.create_topic("inbox_backlog", 3).await;
    let group = format!("{topic}.group");
    inbox_env(
        &mut w,
        &topic,
        &group,
        &[
            ("FERRY_INBOX_MAX_BATCH_RECORDS", "500"),
            ("FERRY_INBOX_MAX_BUFFERED_BYTES", "1MiB"),
        ],
    );
    let recs = records(TOTAL, 500, 0x7b7);
    let p = producer(&w.brokers);
    for c in recs.chunks(50_000) {
        produce(&p, &topic, c).await;
    }
    eprintln!("produced {TOTAL} at {:?}", started.elapsed());
    let mut ferry = Ferry::spawn(&w, &["inbox"]);
    let mut failed_rounds = 0;
    for round in 1..=3 {
        let target = (TOTAL / 8 * round) as i64;
        wait_until("the inbox works through the backlog", secs(60), || async {
            rows(&w.sql, &topic).await >= target
        })
        .await;
        // A drop between two writes fails nothing (the next write connects again): drop
        // again and again, every 20 ms, until a write in flight fails. One drop every 3 s
        // once missed every write for 30 s (CI, 2026-11-27): the writes are short beside the
        // time the inbox spends taking records from Kafka.
        let failures = metric(&ferry, "ferry_inbox_write_failures_total").await;
        let (mut dropped, deadline) = (0, Instant::now() + secs(60));
        loop {
            dropped += count(
                &w.sql,
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .await;
            tokio::time::sleep(ms(20)).await;
            if metric(&ferry, "ferry_inbox_write_failures_total").await > failures {
                failed_rounds += 1;
                break;
            }
            // The backlog written whole: no write is left for a drop to fail.
            if rows(&w.sql, &topic).await >= TOTAL as i64 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no write failed after {dropped} connections dropped in 60 s"
            );
        }
        eprintln!(
            "round {round}: {dropped} connections dropped at {target} rows, {:?}",
            started.elapsed()
        );
    }
    assert!(failed_rounds > 0, "no round failed a write");
    wait_consumed(&w.sql, &topic, &group, TOTAL).await;
    let taken = metric(&ferry, "ferry_inbox_records_total").await;
    let status = ferry.terminate().await;
    assert!(status.success(), "{}", ferry.log_text());
    assert_exactly_once(&w.sql, &topic, &group, &recs).await;
    eprintln!(
        "{taken} records taken for {TOTAL}; took {:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// 6. the application's side

/// The application's consumer pattern on the inbox: two workers, each on its own connection,
/// take the unprocessed rows whose key has no earlier unprocessed row ([`TAKE`]), apply them
/// into an application table that checks each key's sequence, and mark them processed, all in
/// one transaction; they wake on `LISTEN ferry_inbox` (and poll as a fallback). Every event is
/// applied exactly once and in per-key order. Then, with a 1 s processed retention, the cleanup
/// deletes the processed rows and leaves the unprocessed ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_workers_apply_every_event_once_in_key_order_and_cleanup_keeps_unprocessed() {
    const TOTAL: usize = 3_000;
    const LATER: usize = 200;
    let started = Instant::now();
    let mut w = World::new().await;
    let topic = w.create_topic("inbox_app", 3).await;
    let group = format!("{topic}.group");
    inbox_env(
        &mut w,
        &topic,
        &group,
        &[("FERRY_INBOX_MAX_BATCH_RECORDS", "100")],
    );
    // This scenario runs with the defaults: deduplication by id and NOTIFY ferry_inbox.
    w.env
        .retain(|(k, _)| k != "FERRY_INBOX_EVENT_ID_HEADER" && k != "FERRY_INBOX_NOTIFY_CHANNEL");
    let recs = records(TOTAL + LATER, 40, 0x6a99);
    let mut ferry = Ferry::spawn(&w, &["inbox"]);
    ferry.wait_ready().await;
    w.sql
        .batch_execute(
            "CREATE TABLE app_applied (event_id text PRIMARY KEY, key text NOT NULL, seq bigint NOT NULL, worker int NOT NULL);
             CREATE TABLE app_key_seq (key text PRIMARY KEY, last_seq bigint NOT NULL);",
        )
        .await
        .unwrap();
    let keys: HashSet<&str> = recs.iter().map(|r| r.key.as_str()).collect();
    for k in keys {
        w.sql
            .execute("INSERT INTO app_key_seq VALUES ($1, -1)", &[&k])
            .await
            .unwrap();
    }

    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|id| tokio::spawn(app_worker(w.db.url.clone(), id, stop.clone())))
        .collect();
    let producing = produce_in_background(&w.brokers, &topic, recs[..TOTAL].to_vec(), 150, ms(200));
    producing.finish().await;
    wait_until("the workers applied every event", secs(90), || async {
        // A worker that stopped early stopped on an error: its answer says which.
        if workers.iter().any(|h| h.is_finished()) {
            return true;
        }
        count(&w.sql, "SELECT count(*) FROM app_applied").await == TOTAL as i64
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut notified = 0;
    for (id, h) in workers.into_iter().enumerate() {
        let done = h.await.expect("worker task");
        let done = done.unwrap_or_else(|e| panic!("worker {id} failed: {e}"));
        assert!(
            done.violations.is_empty(),
            "worker {id} applied events out of their key's order: {:?}",
            done.violations
        );
        eprintln!(
            "worker {id}: {} events in {} transactions, {} notifications",
            done.applied, done.transactions, done.notifications
        );
        assert!(done.applied > 0, "worker {id} applied nothing");
        notified += done.notifications;
    }
    assert!(notified > 0, "no NOTIFY ferry_inbox reached the workers");
    // Applied exactly once (the primary key refuses a second time) and every one of them.
    assert_eq!(
        count(&w.sql, "SELECT count(*) FROM app_applied").await,
        TOTAL as i64
    );
    assert_eq!(
        count(
            &w.sql,
            "SELECT count(*) FROM app_key_seq s WHERE s.last_seq + 1 <> (SELECT count(*) FROM app_applied a WHERE a.key = s.key)"
        )
        .await,
        0,
        "a key's last applied sequence is not its count"
    );
    assert_exactly_once(&w.sql, &topic, &group, &recs[..TOTAL]).await;

    // Cleanup: processed rows older than 1 s go; unprocessed ones stay.
    let status = ferry.terminate().await;
    assert!(status.success(), "{}", ferry.log_text());
    let p = producer(&w.brokers);
    produce(&p, &topic, &recs[TOTAL..]).await;
    w.env.extend([
        (
            "FERRY_INBOX_PROCESSED_RETENTION".to_string(),
            "1s".to_string(),
        ),
        ("FERRY_INBOX_CLEANUP_INTERVAL".into(), "1s".into()),
    ]);
    let mut ferry = Ferry::spawn(&w, &["inbox"]);
    wait_until(
        "the processed rows are deleted and the new ones stored",
        secs(60),
        || async {
            count(
                &w.sql,
                "SELECT count(*) FROM ferry_inbox WHERE processed_at IS NOT NULL",
            )
            .await
                == 0
                && count(
                    &w.sql,
                    "SELECT count(*) FROM ferry_inbox WHERE processed_at IS NULL",
                )
                .await
                    == LATER as i64
        },
    )
    .await;
    let deleted = ferry
        .metric_labeled("ferry_inbox_cleanup_deleted_total", "what", "processed")
        .await;
    assert_eq!(deleted, Some(TOTAL as f64));
    // The unprocessed rows are exactly the later records.
    let ids: HashSet<String> = w
        .sql
        .query("SELECT event_id FROM ferry_inbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let later: HashSet<String> = recs[TOTAL..].iter().map(|r| r.id.clone()).collect();
    assert_eq!(ids, later);
    let status = ferry.terminate().await;
    assert!(status.success(), "{}", ferry.log_text());
    eprintln!("took {:?}", started.elapsed());
}

/// What the application's worker runs in each transaction to take rows: unprocessed rows whose
/// key has no earlier unprocessed row (so a key is never applied out of order, nor by two
/// workers at once), oldest first, skipping rows another worker holds.
const TAKE: &str = r#"SELECT topic, "partition", "offset", convert_from(key, 'UTF8'), event_id, (payload->>'seq')::int8
FROM ferry_inbox i
WHERE processed_at IS NULL
  AND NOT EXISTS (
    SELECT 1 FROM ferry_inbox j
    WHERE j.topic = i.topic AND j.key = i.key AND j.processed_at IS NULL
      AND (j."partition", j."offset") < (i."partition", i."offset"))
ORDER BY topic, "partition", "offset"
LIMIT 50
FOR UPDATE SKIP LOCKED"#;

/// Marks the rows taken as processed.
const MARK: &str = r#"UPDATE ferry_inbox SET processed_at = now()
WHERE (topic, "partition", "offset") IN (SELECT * FROM unnest($1::text[], $2::int4[], $3::int8[]))"#;

#[derive(Debug, Default)]
struct WorkerDone {
    applied: u64,
    transactions: u64,
    notifications: u64,
    violations: Vec<String>,
}

/// One application worker: until `stop` and nothing is left, take rows, apply them, mark them.
async fn app_worker(url: String, id: i32, stop: Arc<AtomicBool>) -> Result<WorkerDone, String> {
    let (mut client, mut notes) = connect_listening(&url).await;
    client
        .batch_execute("LISTEN ferry_inbox")
        .await
        .map_err(|e| e.to_string())?;
    let mut done = WorkerDone::default();
    loop {
        while notes.try_recv().is_ok() {
            done.notifications += 1;
        }
        let tx = client.transaction().await.map_err(|e| e.to_string())?;
        let taken = tx
            .query(TAKE, &[])
            .await
            .map_err(|e| format!("taking rows: {e}"))?;
        if taken.is_empty() {
            tx.commit().await.map_err(|e| e.to_string())?;
            if stop.load(Ordering::Relaxed) {
                return Ok(done);
            }
            // Woken by a notification, or a poll every 500 ms as the fallback.
            if let Ok(Some(_)) = tokio::time::timeout(ms(500), notes.recv()).await {
                done.notifications += 1;
            }
            continue;
        }
        let (mut topics, mut parts, mut offsets) = (Vec::new(), Vec::new(), Vec::new());
        for r in &taken {
            let (topic, part, offset): (String, i32, i64) = (r.get(0), r.get(1), r.get(2));
            let (key, event_id, seq): (String, String, i64) = (r.get(3), r.get(4), r.get(5));
            let n = tx
                .execute(
                    "UPDATE app_key_seq SET last_seq = $2::int8 WHERE key = $1::text AND last_seq = $2::int8 - 1",
                    &[&key, &seq],
                )
                .await
                .map_err(|e| format!("sequence check: {e}"))?;
            if n != 1 {
                done.violations
                    .push(format!("{key} seq {seq} at {topic}[{part}]@{offset}"));
            }
            tx.execute(
                "INSERT INTO app_applied VALUES ($1::text, $2::text, $3::int8, $4::int4)",
                &[&event_id, &key, &seq, &id],
            )
            .await
            .map_err(|e| format!("applying {event_id} ({key} seq {seq}): {e}"))?;
            topics.push(topic);
            parts.push(part);
            offsets.push(offset);
        }
        let marked = tx
            .execute(MARK, &[&topics, &parts, &offsets])
            .await
            .map_err(|e| format!("marking processed: {e}"))?;
        if marked != taken.len() as u64 {
            done.violations
                .push(format!("marked {marked} of {} rows", taken.len()));
        }
        tx.commit().await.map_err(|e| e.to_string())?;
        done.applied += taken.len() as u64;
        done.transactions += 1;
    }
}

/// A connection whose notifications come out of the returned channel.
async fn connect_listening(
    url: &str,
) -> (
    Client,
    tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
) {
    let (client, mut conn) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect worker");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(m) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            match m {
                Ok(AsyncMessage::Notification(n)) => {
                    let _ = tx.send(n);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    (client, rx)
}

// ---------------------------------------------------------------------------------------------
// The records, the producer and the check.

/// One produced record: event id `e<n>`, a key, and a payload `{"n", "key", "seq"}` where `seq`
/// counts the key's records in production order.
#[derive(Clone, Debug)]
struct Rec {
    key: String,
    id: String,
    payload: String,
}

/// `total` records over `keys` keys chosen at random (seeded), so keys repeat unevenly.
/// `ferry inbox` reaching its database through a proxy, with 600 records (50 keys) of which
/// the first 300 landed.
struct Proxied {
    w: World,
    topic: String,
    group: String,
    proxy: ferry_testkit::proxy::Proxy,
    recs: Vec<Rec>,
    p: FutureProducer,
    f: Ferry,
}

/// [`Proxied`], with `receive_timeout`, a connect timeout of 1 s, and `extra` environment.
async fn inbox_through_proxy(
    name: &str,
    receive_timeout: &str,
    seed: u64,
    extra: &[(&str, &str)],
) -> Proxied {
    let mut w = World::new().await;
    let topic = w.create_topic(name, 3).await;
    let group = format!("{topic}.group");
    let (url, proxy) = through_proxy(&w.db.url).await;
    inbox_env(
        &mut w,
        &topic,
        &group,
        &[
            ("FERRY_POSTGRES_URL", url.as_str()),
            ("FERRY_POSTGRES_RECEIVE_TIMEOUT", receive_timeout),
            ("FERRY_POSTGRES_CONNECT_TIMEOUT", "1s"),
        ]
        .iter()
        .chain(extra)
        .copied()
        .collect::<Vec<_>>(),
    );
    let recs = records(600, 50, seed);
    let p = producer(&w.brokers);
    produce(&p, &topic, &recs[..300]).await;
    let f = Ferry::spawn(&w, &["inbox"]);
    wait_rows(&w.sql, &topic, 300, secs(60)).await;
    Proxied {
        w,
        topic,
        group,
        proxy,
        recs,
        p,
        f,
    }
}

fn records(total: usize, keys: u64, seed: u64) -> Vec<Rec> {
    let mut rng = Rng::new(seed);
    let mut seqs: HashMap<String, u64> = HashMap::new();
    (0..total)
        .map(|n| {
            let key = format!("k{}", rng.below(keys));
            let seq = seqs.entry(key.clone()).or_insert(0);
            let payload = serde_json::json!({ "n": n, "key": key, "seq": *seq }).to_string();
            *seq += 1;
            Rec {
                key,
                id: format!("e{n}"),
                payload,
            }
        })
        .collect()
}

fn producer(brokers: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "180000")
        .set("reconnect.backoff.max.ms", "1000")
        .create()
        .expect("producer")
}

/// Produces `recs` in order (enqueued one after the other, then every delivery awaited).
async fn produce(p: &FutureProducer, topic: &str, recs: &[Rec]) {
    let mut deliveries = Vec::with_capacity(recs.len());
    for r in recs {
        let headers = OwnedHeaders::new().insert(Header {
            key: "id",
            value: Some(r.id.as_bytes()),
        });
        let record = FutureRecord::to(topic)
            .key(&r.key)
            .payload(&r.payload)
            .headers(headers);
        match p.send_result(record) {
            Ok(d) => deliveries.push(d),
            Err((e, _)) => panic!("enqueue {}: {e}", r.id),
        }
    }
    for (d, r) in deliveries.into_iter().zip(recs) {
        match d.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => panic!("deliver {}: {e}", r.id),
            Err(_) => panic!("deliver {}: cancelled", r.id),
        }
    }
}

/// A producer writing in the background.
struct Producing {
    task: tokio::task::JoinHandle<()>,
    /// Records acknowledged so far.
    acked: Arc<AtomicU64>,
}

impl Producing {
    /// Waits until every record is acknowledged.
    async fn finish(self) {
        tokio::time::timeout(secs(240), self.task)
            .await
            .expect("the producer finished within 240 s")
            .expect("the producer task");
    }
}

/// Produces `recs` in chunks of `chunk`, pausing `pause` after each (the pace spreads the
/// records over the scenario; it decides nothing).
fn produce_in_background(
    brokers: &str,
    topic: &str,
    recs: Vec<Rec>,
    chunk: usize,
    pause: Duration,
) -> Producing {
    let p = producer(brokers);
    let topic = topic.to_owned();
    let acked = Arc::new(AtomicU64::new(0));
    let counter = acked.clone();
    let task = tokio::spawn(async move {
        for c in recs.chunks(chunk) {
            produce(&p, &topic, c).await;
            counter.fetch_add(c.len() as u64, Ordering::Relaxed);
            tokio::time::sleep(pause).await;
        }
    });
    Producing { task, acked }
}

/// Every record of `expected` is in the inbox once, by event id and by position; nothing was
/// dead-lettered; per key the rows in (partition, offset) order carry sequences 0, 1, 2, …; each
/// partition's stored next offset is one past its last row.
async fn assert_exactly_once(sql: &Client, topic: &str, group: &str, expected: &[Rec]) {
    let rows = sql
        .query(
            r#"SELECT "partition", "offset", headers->>'id', payload->>'key', (payload->>'seq')::int8
               FROM ferry_inbox WHERE topic = $1"#,
            &[&topic],
        )
        .await
        .expect("read the inbox");
    let mut ids: HashMap<String, Vec<(i32, i64)>> = HashMap::new();
    let mut positions = HashSet::new();
    let mut per_key: BTreeMap<String, Vec<(i32, i64, i64)>> = BTreeMap::new();
    let mut ends: BTreeMap<i32, (i64, i64)> = BTreeMap::new();
    for r in &rows {
        let (part, offset): (i32, i64) = (r.get(0), r.get(1));
        let id: Option<String> = r.get(2);
        ids.entry(id.unwrap_or_default())
            .or_default()
            .push((part, offset));
        positions.insert((part, offset));
        per_key
            .entry(r.get(3))
            .or_default()
            .push((part, offset, r.get(4)));
        let e = ends.entry(part).or_insert((0, -1));
        e.0 += 1;
        e.1 = e.1.max(offset);
    }
    let lost: Vec<&str> = expected
        .iter()
        .filter(|r| !ids.contains_key(&r.id))
        .map(|r| r.id.as_str())
        .collect();
    let duplicated: Vec<(&String, &Vec<(i32, i64)>)> =
        ids.iter().filter(|(_, at)| at.len() > 1).collect();
    let wanted: HashSet<&str> = expected.iter().map(|r| r.id.as_str()).collect();
    let unknown: Vec<&String> = ids
        .keys()
        .filter(|id| !wanted.contains(id.as_str()))
        .collect();
    let dead: Vec<(i32, i64, String)> = sql
        .query(
            r#"SELECT "partition", "offset", reason FROM ferry_inbox_dead_letters WHERE topic = $1 ORDER BY 1, 2"#,
            &[&topic],
        )
        .await
        .expect("read the dead letters")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let mut disorder = Vec::new();
    for (key, mut at) in per_key {
        at.sort_unstable();
        let seqs: Vec<i64> = at.iter().map(|(_, _, s)| *s).collect();
        if let Some(i) = seqs.iter().enumerate().position(|(i, s)| *s != i as i64) {
            disorder.push(format!(
                "{key}: row {i} at {}@{} has seq {} (around: {:?})",
                at[i].0,
                at[i].1,
                seqs[i],
                &seqs[i.saturating_sub(2)..(i + 3).min(seqs.len())]
            ));
        }
    }
    let stored: BTreeMap<i32, Option<i64>> = sql
        .query(
            r#"SELECT "partition", next_offset FROM ferry_inbox_offsets WHERE consumer_group = $1 AND topic = $2"#,
            &[&group, &topic],
        )
        .await
        .expect("read the offsets")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let offsets_off: Vec<String> = ends
        .iter()
        .filter(|(p, (n, last))| {
            stored.get(p).copied().flatten() != Some(last + 1) || *n != last + 1
        })
        .map(|(p, (n, last))| {
            format!(
                "partition {p}: {n} rows, last offset {last}, stored next offset {:?}",
                stored.get(p)
            )
        })
        .collect();
    let summary = format!(
        "{} rows for {} records: {} lost (first: {:?}), {} duplicated by event id (first: {:?}), \
         {} duplicated by position, {} unknown ids, {} dead letters (first: {:?}), {} keys out of \
         order (first: {:?}), offsets: {:?}",
        rows.len(),
        expected.len(),
        lost.len(),
        lost.iter().take(5).collect::<Vec<_>>(),
        duplicated.len(),
        duplicated.iter().take(3).collect::<Vec<_>>(),
        rows.len() - positions.len(),
        unknown.len(),
        dead.len(),
        dead.first(),
        disorder.len(),
        disorder.first(),
        offsets_off,
    );
    assert!(
        lost.is_empty()
            && duplicated.is_empty()
            && unknown.is_empty()
            && rows.len() == positions.len()
            && dead.is_empty()
            && disorder.is_empty()
            && offsets_off.is_empty()
            && rows.len() == expected.len(),
        "not exactly once: {summary}"
    );
}

/// Kafka's committed offsets of the group (advice) are nowhere ahead of the database's. Kafka is
/// read first: the database's offsets only move forward, so a later read of them can only be
/// further on.
async fn assert_advice_not_ahead(w: &World, topic: &str, group: &str, partitions: i32) {
    let (brokers, t, g) = (w.brokers.clone(), topic.to_owned(), group.to_owned());
    let kafka = tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", &g)
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(&t, p);
        }
        c.committed_offsets(tpl, secs(10))
            .expect("committed offsets")
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(n) => (e.partition(), Some(n)),
                _ => (e.partition(), None),
            })
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    let db: HashMap<i32, Option<i64>> = w
        .sql
        .query(
            r#"SELECT "partition", next_offset FROM ferry_inbox_offsets WHERE consumer_group = $1 AND topic = $2"#,
            &[&group, &topic],
        )
        .await
        .expect("read the offsets")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (p, k) in kafka {
        if let Some(k) = k {
            let d = db.get(&p).copied().flatten();
            assert!(
                d.is_some_and(|d| k <= d),
                "partition {p}: Kafka's committed offset {k} is ahead of the database's {d:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers.

/// `ferry inbox`'s environment for the fault scenarios: the topic and group, short sessions (a
/// killed copy's partitions move after 6 s, the broker's minimum), no deduplication by id (see
/// the module docs), no NOTIFY, and `extra`.
fn inbox_env(w: &mut World, topic: &str, group: &str, extra: &[(&str, &str)]) {
    w.env.extend(
        [
            ("FERRY_INBOX_TOPICS", topic),
            ("FERRY_INBOX_GROUP_ID", group),
            ("FERRY_INBOX_EVENT_ID_HEADER", ""),
            ("FERRY_INBOX_NOTIFY_CHANNEL", ""),
            ("FERRY_KAFKA_PROPERTIES_SESSION_TIMEOUT_MS", "6000"),
            ("FERRY_KAFKA_PROPERTIES_HEARTBEAT_INTERVAL_MS", "1000"),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
}

/// Asserts that `f` logged `text`, runs on, and exits 0 when told to stop.
async fn said_and_stops_cleanly(f: &mut Ferry, text: &str) {
    assert!(f.log_text().contains(text), "{}", f.log_text());
    assert!(f.is_running(), "{}", f.log_text());
    let status = f.terminate().await;
    assert!(status.success(), "{}", f.log_text());
}

/// How many lines the inbox's Kafka consumer logged about the brokers (errors and warnings).
fn kafka_reports(f: &Ferry) -> usize {
    f.log_text()
        .lines()
        .filter(|l| l.contains("(inbox consumer)") && (l.contains("WARN") || l.contains("ERROR")))
        .count()
}

/// `ferry inbox` with `extra` environment on top of the world's.
fn spawn_with(w: &mut World, extra: &[(&str, &str)]) -> Ferry {
    let n = w.env.len();
    w.env
        .extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let f = Ferry::spawn(w, &["inbox"]);
    w.env.truncate(n);
    f
}

/// Waits until the copies hold `total` partitions between them, each at least one.
async fn wait_shared(copies: &[&Ferry], total: u64, what: &str) {
    wait_until(what, secs(60), || async {
        let mut sum = 0.0;
        for c in copies {
            let n = metric(c, "ferry_inbox_partitions").await;
            if n == 0.0 {
                return false;
            }
            sum += n;
        }
        sum == total as f64
    })
    .await;
}

/// Waits until a copy inserted rows; returns how many.
async fn wait_wrote(f: &Ferry, name: &str) -> f64 {
    wait_until(&format!("{name} inserts rows"), secs(60), || async {
        metric(f, "ferry_inbox_rows_inserted_total").await > 0.0
    })
    .await;
    metric(f, "ferry_inbox_rows_inserted_total").await
}

/// Waits until the stored offsets cover `n` records (the producer's offsets have no gaps): the
/// end, whether or not every record made it into the inbox, which the check then tells.
async fn wait_consumed(sql: &Client, topic: &str, group: &str, n: usize) {
    wait_until(
        &format!("stored offsets covering {n} records"),
        secs(90),
        || async {
            sql.query_one(
                "SELECT coalesce(sum(next_offset), 0)::int8 FROM ferry_inbox_offsets \
                 WHERE consumer_group = $1 AND topic = $2",
                &[&group, &topic],
            )
            .await
            .is_ok_and(|r| r.get::<_, i64>(0) >= n as i64)
        },
    )
    .await;
}

async fn wait_rows(sql: &Client, topic: &str, n: usize, deadline: Duration) {
    wait_until(&format!("{n} rows in the inbox"), deadline, || async {
        rows(sql, topic).await >= n as i64
    })
    .await;
}

async fn rows(sql: &Client, topic: &str) -> i64 {
    sql.query_one(
        "SELECT count(*) FROM ferry_inbox WHERE topic = $1",
        &[&topic],
    )
    .await
    .map(|r| r.get(0))
    .unwrap_or(-1)
}

async fn count(sql: &Client, q: &str) -> i64 {
    sql.query_one(q, &[]).await.map(|r| r.get(0)).unwrap_or(-1)
}

/// A metric's value, 0 when absent (or the process not answering).
async fn metric(f: &Ferry, name: &str) -> f64 {
    f.metric(name).await.unwrap_or(0.0)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
