//! PostgreSQL failover under Ferry (17+): a failover slot synchronized to a physical standby
//! carries Ferry across a promotion. Ferry is given both hosts with
//! `target_session_attrs=read-write`; the primary crashes, the standby is promoted, and Ferry
//! continues from the standby's synchronized copy of the slot: every committed row arrives, in
//! per-key order (duplicates are allowed: the copy may lag the primary's slot).
//!
//! On servers before 17 there are no failover slots; the test says so and passes without
//! running (CI runs it on 17 and 18 in the version matrix).

mod common;
mod sequenced;

use std::time::Duration;

use common::*;
use ferry_testkit::kafka;
use ferry_testkit::pg::{self, ClusterOptions, PgCluster, Postgres};
use ferry_wal::Lsn;
use sequenced::*;

const STANDBY_SLOT: &str = "ferry_test_standby";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_continues_from_the_synchronized_failover_slot_without_loss() {
    let pg = Postgres::Local(PgCluster::start(ClusterOptions::default()).await);
    let Postgres::Local(primary) = &pg else {
        unreachable!()
    };
    let admin = pg::connect(&primary.url("postgres")).await;
    let version: i32 = admin
        .query_one("SHOW server_version_num", &[])
        .await
        .unwrap()
        .get::<_, String>(0)
        .parse()
        .unwrap();
    if version < 170000 {
        eprintln!("skipped: failover slots need PostgreSQL 17 (this server is {version})");
        return;
    }
    // The standby's physical slot, and the primary holding logical consumers behind it, so
    // Ferry never sees a transaction the standby lacks.
    for statement in [
        format!("SELECT pg_create_physical_replication_slot('{STANDBY_SLOT}', true)"),
        format!("ALTER SYSTEM SET synchronized_standby_slots = '{STANDBY_SLOT}'"),
        "SELECT pg_reload_conf()".into(),
    ] {
        admin.batch_execute(&statement).await.unwrap();
    }
    let mut w = World::on(pg.create_db().await, kafka::shared().brokers()).await;
    let standby = tokio::task::block_in_place(|| {
        primary.standby_blocking(vec![
            format!("primary_slot_name = '{STANDBY_SLOT}'"),
            "hot_standby_feedback = on".into(),
            "sync_replication_slots = on".into(),
        ])
    });
    w.sql = w.db.client().await; // the primary restarted for the copy
    let standby_sql = pg::connect(&standby.url(&w.db.name)).await;

    w.env.extend([
        (
            "FERRY_POSTGRES_URL".into(),
            format!(
                "host=127.0.0.1,127.0.0.1 port={},{} user=postgres password={} dbname={} target_session_attrs=read-write",
                primary.port(),
                standby.port(),
                pg::SUPERUSER_PASSWORD,
                w.db.name
            ),
        ),
        ("FERRY_POSTGRES_FAILOVER_SLOT".into(), "true".into()),
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MIN".into(), "100ms".into()),
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MAX".into(), "1s".into()),
    ]);
    let topic = w.create_topic(AGGREGATE, 3).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let failover: Option<bool> = w
        .sql
        .query_one(
            "SELECT failover FROM pg_replication_slots WHERE slot_name = $1",
            &[&w.slot],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(failover, Some(true), "Ferry created a failover slot");

    insert_events(&w.sql, 0..200, 0).await;
    consume_events(&w.brokers, &topic, 0..200).await;
    let confirmed = wait_confirmed_past(&w, w.current_wal_lsn().await).await;
    // The standby's copy follows the primary's slot.
    wait_until(
        "the standby's synchronized slot reaches what Ferry confirmed",
        Duration::from_secs(90),
        || async { synced_position(&standby_sql, &w.slot).await >= Some(confirmed) },
    )
    .await;

    // Ferry is paused (SIGSTOP) so the next rows reach it only through the standby's copy of
    // the slot: had the slot been lost and created anew at the promoted server's position,
    // they would be missing. They replicate to the standby (so the database itself loses
    // nothing), then the primary crashes, the standby is promoted and Ferry resumes.
    signal(&ferry, "STOP");
    insert_events(&w.sql, 200..400, 0).await;
    let end = w.current_wal_lsn().await;
    wait_until(
        "the standby replays the last rows",
        Duration::from_secs(60),
        || async { replayed(&standby_sql).await >= end },
    )
    .await;
    tokio::task::block_in_place(|| primary.stop(true));
    standby_sql
        .batch_execute("SELECT pg_promote(true, 60)")
        .await
        .unwrap();
    // The promoted server inherited the old primary's synchronized_standby_slots (ALTER SYSTEM
    // wrote it into the copied data directory); it names a standby this server does not have,
    // which would hold Ferry back. An operator points it at the new standbys' slots; here
    // there are none.
    for statement in [
        "ALTER SYSTEM RESET synchronized_standby_slots",
        "SELECT pg_reload_conf()",
    ] {
        standby_sql.batch_execute(statement).await.unwrap();
    }
    let copy = synced_position(&standby_sql, &w.slot).await;
    assert!(
        copy.is_some_and(|c| c < end),
        "the promoted server holds the synchronized slot ({copy:?}), behind the last rows ({end})"
    );
    signal(&ferry, "CONT");
    w.sql = standby_sql;
    insert_events(&w.sql, 400..500, 0).await;

    let events = consume_events(&w.brokers, &topic, 0..500).await;
    assert_no_loss(&events, 0..500);
    assert_key_order(&events, 0..500);
    let after = w.current_wal_lsn().await;
    wait_confirmed_past(&w, after).await;
    assert!(
        ferry.is_running(),
        "Ferry exited across the failover:\n{}",
        ferry.log_text()
    );
    // Same system identifier, a new timeline, the copy behind the progress record: Ferry says
    // so and continues (no gap).
    let log = ferry.log_text();
    assert!(log.contains("the server's timeline changed"), "{log}");
    assert!(!log.contains("events may be lost"), "{log}");
}

/// Waits until the world's slot is confirmed at or past `lsn`; returns the confirmed LSN.
async fn wait_confirmed_past(w: &World, lsn: Lsn) -> Lsn {
    wait_until(
        &format!("the slot is confirmed past {lsn}"),
        Duration::from_secs(60),
        || async { w.confirmed_lsn().await.is_some_and(|c| c >= lsn) },
    )
    .await;
    w.confirmed_lsn().await.expect("slot")
}

/// The standby's synchronized copy of `slot`: its confirmed position.
async fn synced_position(sql: &tokio_postgres::Client, slot: &str) -> Option<Lsn> {
    sql.query_opt(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1 AND synced",
        &[&slot],
    )
    .await
    .ok()
    .flatten()
    .and_then(|r| r.get::<_, Option<String>>(0))
    .and_then(|s| s.parse().ok())
}

/// The standby's replay position.
async fn replayed(sql: &tokio_postgres::Client) -> Lsn {
    sql.query_one("SELECT pg_last_wal_replay_lsn()::text", &[])
        .await
        .ok()
        .and_then(|r| r.get::<_, Option<String>>(0))
        .and_then(|s| s.parse().ok())
        .unwrap_or(Lsn::ZERO)
}

/// Sends `kill -<sig>` to the Ferry process.
fn signal(ferry: &Ferry, sig: &str) {
    let pid = ferry.pid().expect("ferry runs");
    let ok = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{sig} {pid}");
}
