//! A poison row already committed, end to end (issue 28): under `route.on_error = "fail"` it stops
//! Ferry with its position and the commands that pass it; `ferry run --dead-letter-event` or
//! `--skip-event` with the printed position passes exactly that one event, once, and the rows
//! after it flow; a later poison row still stops Ferry; a flag whose position the slot has passed
//! does nothing and says so. In at-least-once and exactly-once mode.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;

const GOOD_1: &str = "00000000-0000-0000-0000-000000000001";
const GOOD_2: &str = "00000000-0000-0000-0000-000000000002";
const GOOD_3: &str = "00000000-0000-0000-0000-000000000003";
const POISON_1: &str = "00000000-0000-0000-0000-0000000000b1";
const POISON_2: &str = "00000000-0000-0000-0000-0000000000b2";

/// Inserts an outbox row with a fixed id (`payload` `None`: NULL, which the router rejects
/// without `route.tombstone_on_null_payload`); returns the inserting transaction's id.
async fn insert(w: &World, id: &str, payload: Option<&str>) -> String {
    w.sql
        .query_one(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1::text::uuid, 'order', 'agg-1', 'Happened', $2::text::jsonb) \
             RETURNING pg_current_xact_id()::text",
            &[&id, &payload],
        )
        .await
        .expect("insert outbox row")
        .get(0)
}

/// The position the stop error prints in "`ferry run <flag> <POSITION>`".
fn printed_position(log: &str, flag: &str) -> String {
    let needle = format!("`ferry run {flag} ");
    let at = log
        .find(&needle)
        .unwrap_or_else(|| panic!("no {needle} in the log:\n{log}"));
    let rest = &log[at + needle.len()..];
    rest[..rest.find('`').expect("closing backquote")].to_string()
}

/// The ids in `topic` until every one of `want` arrived (duplicates dropped, first copy kept).
async fn ids_in(w: &World, topic: &str, want: &[&str]) -> Vec<String> {
    let mut n = want.len();
    loop {
        let got = w.consume(topic, n).await;
        let mut seen = Vec::new();
        for id in got.iter().filter_map(|r| r.header("id")) {
            if !seen.contains(&id) {
                seen.push(id);
            }
        }
        if want.iter().all(|id| seen.iter().any(|s| s == id)) || got.len() < n {
            return seen;
        }
        n = got.len() + 1;
    }
}

/// Runs `ferry` with `args` until it exits 1 at a poison row; its log.
async fn stops_at_a_poison_row(w: &World, args: &[&str]) -> String {
    let mut ferry = Ferry::spawn(w, args);
    let status = ferry.wait_exit(Duration::from_secs(90)).await;
    let log = ferry.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("cannot route outbox event"), "{log}");
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_flag_passes_just_the_poison_event_and_a_later_one_still_stops_ferry() {
    let mut w = World::new().await;
    let topic = w.create_topic("order", 1).await;
    let dlq = w.create_topic("dead-letter", 1).await;
    // Allowed under on_error = "fail": where --dead-letter-event sends its event.
    w.env
        .push(("FERRY_ROUTE_DEAD_LETTER_TOPIC".into(), dlq.clone()));
    let mut first = w.start_ferry();
    first.wait_ready().await;
    insert(&w, GOOD_1, Some("{\"n\": 1}")).await;
    let poison_1 = insert(&w, POISON_1, None).await;
    insert(&w, GOOD_2, Some("{\"n\": 2}")).await;
    let poison_2 = insert(&w, POISON_2, None).await;
    insert(&w, GOOD_3, Some("{\"n\": 3}")).await;

    // 1. The first poison row stops Ferry, with the commands that pass it.
    let status = first.wait_exit(Duration::from_secs(90)).await;
    let log = first.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains(POISON_1), "{log}");
    assert!(
        !log.contains("fix the row's data"),
        "advice that cannot work: {log}"
    );
    assert!(
        log.contains("Ferry reads it from the WAL, not from the table"),
        "{log}"
    );
    let at_1 = printed_position(&log, "--dead-letter-event");
    assert_eq!(printed_position(&log, "--skip-event"), at_1);
    assert_eq!(w.first_pending_xid().await, Some(poison_1));

    // 2. A position that names another event passes nothing: the same row stops Ferry, and the
    //    error says which position the flag named.
    let (lsn, _) = at_1.rsplit_once(':').unwrap();
    let wrong = format!("{lsn}:2");
    let log = stops_at_a_poison_row(&w, &["run", "--skip-event", &wrong]).await;
    assert!(log.contains(POISON_1), "{log}");
    assert!(
        log.contains(&format!(
            "(--skip-event {wrong} was given, but this event is at {at_1}"
        )),
        "{log}"
    );

    // 3. The printed position dead-letters that one event; the rows after it flow, and the
    //    second poison row stops Ferry: the flag is one-shot.
    let log = stops_at_a_poison_row(&w, &["run", "--dead-letter-event", &at_1]).await;
    assert!(
        log.contains("--dead-letter-event: passing this one event that cannot be routed"),
        "logged with its position: {log}"
    );
    assert!(log.contains(POISON_2), "{log}");
    let at_2 = printed_position(&log, "--skip-event");
    assert_ne!(at_1, at_2);
    let dead = w.consume(&dlq, 1).await;
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert_eq!(dead[0].header("id").as_deref(), Some(POISON_1));
    assert_eq!(
        dead[0].header("ferry.error.code").as_deref(),
        Some("null_payload")
    );
    assert_eq!(w.first_pending_xid().await, Some(poison_2));

    // 4. The second one, skipped; Ferry streams on, counting it.
    let mut skipping = Ferry::spawn(&w, &["run", "--skip-event", &at_2]);
    skipping.wait_ready().await;
    let ids = ids_in(&w, &topic, &[GOOD_1, GOOD_2, GOOD_3]).await;
    assert_eq!(
        ids,
        [GOOD_1, GOOD_2, GOOD_3],
        "no poison row, nothing else missing"
    );
    wait_until("the skip is counted", Duration::from_secs(30), || async {
        skipping.metric("ferry_rows_skipped_total").await == Some(1.0)
    })
    .await;
    assert!(
        skipping.log_text().contains(&format!("position={at_2}")),
        "{}",
        skipping.log_text()
    );
    let end = w.current_wal_lsn().await;
    wait_until(
        "the slot passes the skipped row",
        Duration::from_secs(30),
        || async { w.confirmed_lsn().await.unwrap() >= end },
    )
    .await;
    assert!(
        skipping.terminate().await.success(),
        "{}",
        skipping.log_text()
    );

    // 5. The same flag again (left in a deployment): the slot is past it, so it does nothing
    //    and says so; Ferry runs.
    let mut stale = Ferry::spawn(&w, &["run", "--skip-event", &at_2]);
    stale.wait_ready().await;
    wait_until(
        "the stale flag is reported",
        Duration::from_secs(30),
        || async {
            stale
                .log_text()
                .contains("names an event the slot has already passed")
        },
    )
    .await;
    assert!(stale.terminate().await.success(), "{}", stale.log_text());
    let dead: HashSet<_> = w
        .consume(&dlq, 1)
        .await
        .iter()
        .filter_map(|r| r.header("id"))
        .collect();
    assert_eq!(dead, HashSet::from([POISON_1.to_string()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_passes_the_printed_poison_event_once() {
    let mut w = World::new().await;
    let topic = w.create_topic("order", 1).await;
    let dlq = w.create_topic("dead-letter", 1).await;
    let progress = format!("{}.progress", w.topic_prefix);
    w.env.extend([
        ("FERRY_KAFKA_EXACTLY_ONCE".to_string(), "true".to_string()),
        ("FERRY_KAFKA_PROGRESS_TOPIC".into(), progress),
        ("FERRY_KAFKA_TRANSACTION_INTERVAL".into(), "100ms".into()),
        ("FERRY_ROUTE_DEAD_LETTER_TOPIC".into(), dlq.clone()),
    ]);
    let mut first = w.start_ferry();
    first.wait_ready().await;
    // One transaction: a good row, the poison row, a good row.
    w.sql
        .batch_execute(&format!(
            "BEGIN;
             INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
                 VALUES ('{GOOD_1}', 'order', 'agg-1', 'Happened', '{{\"n\": 1}}');
             INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
                 VALUES ('{POISON_1}', 'order', 'agg-1', 'Happened', NULL);
             INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
                 VALUES ('{GOOD_2}', 'order', 'agg-1', 'Happened', '{{\"n\": 2}}');
             COMMIT;"
        ))
        .await
        .unwrap();
    insert(&w, POISON_2, None).await;

    let status = first.wait_exit(Duration::from_secs(90)).await;
    let log = first.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    let at_1 = printed_position(&log, "--dead-letter-event");
    assert!(
        at_1.ends_with(":2"),
        "the second event of its transaction: {at_1}"
    );

    let log = stops_at_a_poison_row(&w, &["run", "--dead-letter-event", &at_1]).await;
    assert!(log.contains(POISON_2), "the flag is one-shot: {log}");
    let at_2 = printed_position(&log, "--skip-event");

    let mut ferry = Ferry::spawn(&w, &["run", "--skip-event", &at_2]);
    ferry.wait_ready().await;
    insert(&w, GOOD_3, Some("{\"n\": 3}")).await;
    let ids = ids_in(&w, &topic, &[GOOD_1, GOOD_2, GOOD_3]).await;
    assert_eq!(ids, [GOOD_1, GOOD_2, GOOD_3]);
    let dead = w.consume(&dlq, 1).await;
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert_eq!(dead[0].header("id").as_deref(), Some(POISON_1));
    wait_until("the skip is counted", Duration::from_secs(30), || async {
        ferry.metric("ferry_rows_skipped_total").await == Some(1.0)
    })
    .await;
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

/// Exactly-once: a skipped event produces nothing, so no Kafka transaction carries its position;
/// the session that skipped it commits that position before it stops at the next poison row, or
/// the next run, with the second flag, would meet the first row again (the two flags would
/// alternate for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_a_skipped_event_is_not_met_again_when_a_later_poison_row_stops_ferry() {
    let mut w = World::new().await;
    let topic = w.create_topic("order", 1).await;
    let progress = format!("{}.progress", w.topic_prefix);
    w.env.extend([
        ("FERRY_KAFKA_EXACTLY_ONCE".to_string(), "true".to_string()),
        ("FERRY_KAFKA_PROGRESS_TOPIC".into(), progress),
        ("FERRY_KAFKA_TRANSACTION_INTERVAL".into(), "100ms".into()),
    ]);
    let mut first = w.start_ferry();
    first.wait_ready().await;
    // Two poison rows, each alone in its transaction.
    insert(&w, POISON_1, None).await;
    insert(&w, POISON_2, None).await;
    let status = first.wait_exit(Duration::from_secs(90)).await;
    let log = first.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains(POISON_1), "{log}");
    let at_1 = printed_position(&log, "--skip-event");

    let log = stops_at_a_poison_row(&w, &["run", "--skip-event", &at_1]).await;
    assert!(log.contains(POISON_2), "{log}");
    let at_2 = printed_position(&log, "--skip-event");

    let mut ferry = Ferry::spawn(&w, &["run", "--skip-event", &at_2]);
    ferry.wait_ready().await;
    insert(&w, GOOD_1, Some("{\"n\": 1}")).await;
    let ids = ids_in(&w, &topic, &[GOOD_1]).await;
    assert_eq!(ids, [GOOD_1]);
    assert!(
        !ferry.log_text().contains(POISON_1),
        "the first poison row was met again: {}",
        ferry.log_text()
    );
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

/// A position that does not parse, or a dead letter with nowhere to go, is refused at once (exit
/// 2) with what to give instead; nothing is streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flag_that_cannot_work_is_refused_before_streaming() {
    let w = World::new().await;
    let mut bad = Ferry::spawn(&w, &["run", "--skip-event", "0/1D4ABB8"]);
    let status = bad.wait_exit(Duration::from_secs(30)).await;
    let log = bad.log_text();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("expected <commit LSN>:<n>"), "{log}");

    let mut nowhere = Ferry::spawn(&w, &["run", "--dead-letter-event", "0/1D4ABB8:1"]);
    let status = nowhere.wait_exit(Duration::from_secs(30)).await;
    let log = nowhere.log_text();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("no dead-letter topic to send the event to; set route.dead_letter_topic"),
        "{log}"
    );
    assert_eq!(w.confirmed_lsn().await, None, "no slot was created");
}
