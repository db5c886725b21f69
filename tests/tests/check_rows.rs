//! What `ferry check` says of the outbox's current rows (issue 28): a wrong column is one
//! configuration problem, not one data problem per aggregate type; a row that cannot be routed
//! but that the slot has already passed is not one `run` stops at.

mod common;

use std::time::Duration;

use common::*;

/// Runs `ferry check` for `w` and returns its exit code and everything it printed.
async fn check(w: &World) -> (Option<i32>, String) {
    let mut ferry = Ferry::spawn(w, &["check"]);
    let status = ferry.wait_exit(Duration::from_secs(60)).await;
    (status.code(), ferry.log_text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_aggregate_id_column_is_one_configuration_problem_naming_the_nearest_column() {
    let mut w = World::new().await;
    for t in ["order", "invoice", "shipment"] {
        w.create_topic(t, 1).await;
        w.insert(t, &format!("{t}-1"), "Happened", "{}").await;
    }
    w.env.push((
        "FERRY_OUTBOX_AGGREGATE_ID_COLUMN".into(),
        "aggregate_id".into(),
    ));
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    let errors: Vec<&str> = out
        .lines()
        .filter(|l| l.trim_start().starts_with("error:"))
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "one problem, not one per aggregate type:\n{out}"
    );
    assert!(
        errors[0].contains("has no column \"aggregate_id\" (named by outbox.aggregate_id_column)"),
        "{out}"
    );
    assert!(
        out.contains(
            "set outbox.aggregate_id_column = \"aggregateid\" (the nearest of its columns"
        ),
        "{out}"
    );
    assert!(!out.contains("fix the row"), "{out}");
    assert!(!out.contains("cannot be routed"), "{out}");
    assert!(out.contains("1 problem(s) must be fixed"), "{out}");
}

/// Whether the slot's `catalog_xmin` is past the transaction `xid` (it committed before the
/// slot's position). A checkpoint logs the running transactions, which the streaming Ferry
/// decodes and confirms, which moves `catalog_xmin`.
async fn slot_passed(w: &World, xid: &str) -> bool {
    w.sql.batch_execute("CHECKPOINT").await.unwrap();
    w.sql
        .query_one(
            "SELECT coalesce(age(catalog_xmin) < age($2::text::xid), false) \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&w.slot, &xid],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_the_slot_has_passed_is_not_one_run_stops_at() {
    let mut w = World::new().await;
    let topic = w.create_topic("order", 1).await;
    w.env.push(("FERRY_ROUTE_ON_ERROR".into(), "skip".into()));
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let poison: (String, String) = {
        let r = w
            .sql
            .query_one(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
                 VALUES ('order', 'o-1', 'Happened', NULL) \
                 RETURNING id::text, pg_current_xact_id()::text",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    w.insert("order", "o-2", "Happened", "{}").await;
    w.consume(&topic, 1).await;
    wait_until(
        "the poison row is skipped",
        Duration::from_secs(30),
        || async { ferry.metric("ferry_rows_skipped_total").await == Some(1.0) },
    )
    .await;
    wait_until(
        "the slot's catalog_xmin passes the poison row's transaction",
        Duration::from_secs(60),
        || slot_passed(&w, &poison.1),
    )
    .await;
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());

    // Under on_error = "fail" now: the row is in the table, but `run` never reads it again.
    w.env.retain(|(k, _)| k != "FERRY_ROUTE_ON_ERROR");
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("stops at this row"), "{out}");
    assert!(
        out.contains(&format!("note: outbox row {} ", poison.0))
            && out.contains("the slot has already passed it"),
        "at most a note: {out}"
    );

    // A row the slot has not passed yet is still an error.
    let pending: String = w
        .sql
        .query_one(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
             VALUES ('order', 'o-3', 'Happened', NULL) RETURNING id::text",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!("error: outbox row {pending} ")),
        "{out}"
    );
}
