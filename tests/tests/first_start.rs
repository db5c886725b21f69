//! A first `ferry run` that fails validation creates nothing: the configuration and the table
//! are checked before the slot is created, so a failed start leaves no slot retaining WAL. A
//! slot from an earlier good run is never dropped by a failed start.

mod common;

use std::time::Duration;

use common::*;

/// Runs `ferry run`, which must stop (exit 1) at set-up; its output.
async fn run_refuses(w: &World) -> String {
    let mut ferry = w.start_ferry();
    let status = ferry.wait_exit(Duration::from_secs(90)).await;
    let log = ferry.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    log
}

async fn a_first_run_stops_and_leaves_no_slot(w: &World, error: &str) {
    let log = run_refuses(w).await;
    assert!(
        log.contains(error),
        "run should stop with {error:?}:\n{log}"
    );
    assert!(
        !w.slot_exists().await,
        "the failed first start left slot {:?} behind:\n{log}",
        w.slot
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_run_with_a_missing_table_leaves_no_slot() {
    let mut w = World::new().await;
    w.env
        .push(("FERRY_OUTBOX_TABLE".into(), "public.no_such_outbox".into()));
    a_first_run_stops_and_leaves_no_slot(&w, "table \"public\".\"no_such_outbox\" does not exist")
        .await;
    // The fatal error is printed once: one ERROR event (text or JSON as log.format says), not
    // that and a plain copy.
    let log = run_refuses(&w).await;
    assert_eq!(
        log.matches("table \"public\".\"no_such_outbox\" does not exist")
            .count(),
        1,
        "{log}"
    );
    let mut w = w;
    w.env.push(("FERRY_LOG_FORMAT".into(), "json".into()));
    let log = run_refuses(&w).await;
    for line in log.lines() {
        let event: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a line that is not JSON ({e}): {line:?} in\n{log}"));
        assert!(event.is_object(), "{line}");
    }
    assert_eq!(log.matches("does not exist").count(), 1, "{log}");
    // With logging off, the reason still comes with the exit code, once, as plain text.
    w.env.push(("FERRY_LOG_LEVEL".into(), "off".into()));
    let log = run_refuses(&w).await;
    assert_eq!(log.matches("does not exist").count(), 1, "{log}");
    assert!(log.starts_with("ferry: PostgreSQL set-up:"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_run_with_a_wrong_column_leaves_no_slot() {
    let mut w = World::new().await;
    w.env.push((
        "FERRY_OUTBOX_PAYLOAD_COLUMN".into(),
        "no_such_column".into(),
    ));
    a_first_run_stops_and_leaves_no_slot(
        &w,
        "has no column \"no_such_column\" (named by outbox.payload_column)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_run_with_a_payload_of_an_unsupported_type_leaves_no_slot() {
    let mut w = World::new().await;
    w.sql
        .batch_execute("ALTER TABLE outbox ADD COLUMN span int4range")
        .await
        .unwrap();
    w.env
        .push(("FERRY_OUTBOX_PAYLOAD_COLUMN".into(), "span".into()));
    a_first_run_stops_and_leaves_no_slot(&w, "(outbox.payload_column) is of type int4range").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_keeps_the_slot_of_an_earlier_good_run() {
    let mut w = World::new().await;
    let topic = w.create_topic("order", 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.insert("order", "o-1", "OrderCreated", "{}").await;
    w.consume(&topic, 1).await;
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
    let confirmed = w.confirmed_lsn().await.expect("the good run's slot");

    // The next start is misconfigured: it stops, and the slot (with the WAL since) stays.
    w.insert("order", "o-2", "OrderPaid", "{}").await;
    w.env.push((
        "FERRY_OUTBOX_PAYLOAD_COLUMN".into(),
        "no_such_column".into(),
    ));
    let log = run_refuses(&w).await;
    assert!(log.contains("has no column \"no_such_column\""), "{log}");
    assert_eq!(w.confirmed_lsn().await, Some(confirmed), "{log}");

    // Fixed, Ferry resumes from it: the row committed in between is delivered.
    w.env.pop();
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let got = w.consume(&topic, 2).await;
    assert!(
        got.iter().any(|r| r.key.as_deref() == Some(&b"o-2"[..])),
        "{got:?}"
    );
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}
