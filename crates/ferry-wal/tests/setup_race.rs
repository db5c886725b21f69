//! Two Ferry instances starting at the same moment both create the publication and the slot;
//! whichever loses the race must carry on with the winner's objects, never stop with an error.
//!
//! The races are made deterministic with the server's own locks as the barrier: the "winner" is
//! held inside its creation (an open transaction for the publication, a transaction the slot's
//! snapshot must wait for), the "loser" is started and observed in `pg_stat_activity` waiting
//! on a lock (or finding the half-made object), and only then is the winner let go.

mod common;

use std::time::Duration;

use common::*;
use ferry_testkit::pg;
use ferry_testkit::wait_until;
use ferry_wal::slot::{self, Severity};

/// The backend pid of a connection.
async fn backend_pid(c: &tokio_postgres::Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// Waits until backend `pid` is blocked on a heavyweight lock.
async fn wait_blocked(observer: &tokio_postgres::Client, pid: i32, what: &str) {
    wait_until(what, Duration::from_secs(30), || async {
        observer
            .query_one(
                "SELECT coalesce((SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1), false)",
                &[&pid],
            )
            .await
            .unwrap()
            .get::<_, bool>(0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_created_concurrently_by_another_instance_is_not_an_error() {
    let db = pg::shared().create_db().await;
    let observer = db.client().await;
    observer.batch_execute(OUTBOX_DDL).await.unwrap();
    let winner = db.client().await;
    let loser = db.client().await;
    let spec = spec();

    // The winner has created the publication but not committed yet.
    winner
        .batch_execute(&format!(
            "BEGIN; CREATE PUBLICATION {} FOR TABLE public.outbox WITH (publish = 'insert', publish_via_partition_root = true)",
            slot::quote_ident(&spec.publication)
        ))
        .await
        .unwrap();
    // The loser finds no publication, creates it too and waits on the catalog's unique index.
    let loser_pid = backend_pid(&loser).await;
    let loser_spec = spec.clone();
    let lost = tokio::spawn(async move { slot::ensure(&loser, &loser_spec).await });
    wait_blocked(
        &observer,
        loser_pid,
        "the loser waits on the winner's publication",
    )
    .await;
    winner.batch_execute("COMMIT").await.unwrap();

    // The loser's CREATE fails with 23505; ensure carries on with the winner's publication.
    let state = lost
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("losing the publication race must not be an error: {e}"));
    assert_eq!(state.plugin.as_deref(), Some("pgoutput"));
    let problems = slot::check(&observer, &spec).await.unwrap();
    assert!(
        problems.iter().all(|p| p.severity != Severity::Error),
        "{problems:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_being_created_by_another_instance_is_not_an_error() {
    let db = pg::shared().create_db().await;
    let observer = db.client().await;
    observer.batch_execute(OUTBOX_DDL).await.unwrap();
    let spec = spec();
    // The publication exists; the race is about the slot.
    slot::ensure(
        &observer,
        &slot::SlotSpec {
            create_slot: false,
            ..spec.clone()
        },
    )
    .await
    .expect_err("no slot yet");

    // A transaction with an xid: a new logical slot waits for it before it has a start point.
    let holder = db.client().await;
    holder
        .batch_execute("BEGIN; SELECT txid_current()")
        .await
        .unwrap();
    let winner = db.client().await;
    let winner_pid = backend_pid(&winner).await;
    let winner_spec = spec.clone();
    let won = tokio::spawn(async move { slot::ensure(&winner, &winner_spec).await });
    wait_blocked(
        &observer,
        winner_pid,
        "the winner's slot waits for the open transaction",
    )
    .await;

    // The loser finds the half-made slot: a warning naming the process, not an error.
    let loser = db.client().await;
    slot::ensure(&loser, &spec).await.unwrap_or_else(|e| {
        panic!("a slot being created by another Ferry must not be an error: {e}")
    });
    let problems = slot::check(&observer, &spec).await.unwrap();
    let creating: Vec<_> = problems
        .iter()
        .filter(|p| p.what.contains("is being created by process"))
        .collect();
    assert_eq!(creating.len(), 1, "{problems:#?}");
    assert_eq!(creating[0].severity, Severity::Warning);
    assert!(creating[0].what.contains(&winner_pid.to_string()));

    // A second creation attempt while the first is under way: 42710, also not an error.
    let err = observer
        .query_one(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&spec.slot],
        )
        .await
        .expect_err("the name is taken");
    assert_eq!(err.code().map(|c| c.code()), Some("42710"));

    holder.batch_execute("COMMIT").await.unwrap();
    let state = won.await.unwrap().expect("the winner creates the slot");
    assert_ne!(state.confirmed_flush_lsn, ferry_wal::Lsn::ZERO);
    let problems = slot::check(&observer, &spec).await.unwrap();
    assert!(
        problems.iter().all(|p| p.severity != Severity::Error),
        "{problems:#?}"
    );
}
