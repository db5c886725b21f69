//! Several outbox tables in one Ferry, one slot and one publication (`[[tables]]`): tables of
//! different structures, each routed by its own mapping, in commit order across tables; a table
//! added to the configuration later must be added to the publication (check says how); `ferry
//! check` checks each table.

mod common;

use std::time::Duration;

use common::{wait_until, Ferry, World};
use ferry_testkit::pg;

/// A billing service's outbox: another schema, other column names and types.
const BILLING_DDL: &str = "CREATE SCHEMA billing;
    CREATE TABLE billing.events (
        event_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        account text NOT NULL,
        kind text NOT NULL,
        body text NOT NULL
    )";

/// Writes a configuration file with a `[[tables]]` entry for `billing.events` (plus `extra`
/// keys of that entry), routed to `topic`; returns its path.
fn billing_config(topic: &str, extra: &str) -> String {
    let path = std::env::temp_dir().join(format!("{}.toml", pg::unique_name("ferry-tables")));
    std::fs::write(
        &path,
        format!(
            "[[tables]]\n\
             outbox.table = \"billing.events\"\n\
             outbox.id_column = \"event_id\"\n\
             outbox.aggregate_type_column = \"kind\"\n\
             outbox.aggregate_id_column = \"account\"\n\
             outbox.type_column = \"kind\"\n\
             outbox.payload_column = \"body\"\n\
             route.topic = \"{topic}\"\n\
             route.id_header = \"event-id\"\n\
             {extra}\n"
        ),
    )
    .unwrap();
    path.display().to_string()
}

async fn rows_metric(ferry: &Ferry, table: &str, outcome: &str) -> Option<f64> {
    let (_, body) = ferry.http_get("/metrics").await?;
    let prefix = format!("ferry_outbox_rows_total{{table=\"{table}\",outcome=\"{outcome}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tables_of_different_structures_share_a_slot_and_keep_commit_order() {
    let mut w = World::new().await;
    w.sql.batch_execute(BILLING_DDL).await.unwrap();
    // Both tables' events for an account go to one topic, so their order can be compared.
    let topic = w.create_topic("account", 1).await;

    // First, only the public outbox: the publication is created for it alone.
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.insert("account", "acct-1", "Opened", r#"{"seq": 1}"#)
        .await;
    let got = w.consume(&topic, 1).await;
    assert_eq!(got[0].value.as_deref(), Some(&br#"{"seq": 1}"#[..]));
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
    let published: i64 = w
        .sql
        .query_one(
            "SELECT count(*) FROM pg_publication_tables WHERE pubname = $1",
            &[&w.publication],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(published, 1, "the first run published the one table");

    // Then billing.events is added to the configuration: `check` says the publication lacks it
    // (Ferry never alters an existing publication) and how to add it; with that done, both relay.
    w.env
        .push(("FERRY_CONFIG".into(), billing_config(&topic, "")));
    let mut check = Ferry::spawn(&w, &["check"]);
    let status = check.wait_exit(Duration::from_secs(60)).await;
    let out = check.log_text();
    assert_eq!(status.code(), Some(1), "{out}");
    let fix = format!(
        "ALTER PUBLICATION \"{}\" ADD TABLE \"billing\".\"events\"",
        w.publication
    );
    assert!(
        out.contains("does not include table \"billing\".\"events\"") && out.contains(&fix),
        "{out}"
    );
    w.sql.batch_execute(&fix).await.unwrap();
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    // One transaction writes both outboxes, another writes them in the other order.
    w.sql
        .batch_execute(
            "BEGIN;
             INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
               VALUES ('account', 'acct-1', 'Credited', '{\"seq\": 2}');
             INSERT INTO billing.events (account, kind, body) VALUES ('acct-1', 'Invoiced', '{\"seq\": 3}');
             COMMIT;
             BEGIN;
             INSERT INTO billing.events (account, kind, body) VALUES ('acct-1', 'Paid', '{\"seq\": 4}');
             INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
               VALUES ('account', 'acct-1', 'Closed', '{\"seq\": 5}');
             COMMIT;",
        )
        .await
        .unwrap();
    let got = w.consume(&topic, 5).await;
    let values: Vec<&str> = got
        .iter()
        .map(|r| std::str::from_utf8(r.value.as_deref().unwrap()).unwrap())
        .collect();
    assert_eq!(
        values,
        [
            r#"{"seq": 1}"#,
            r#"{"seq": 2}"#,
            r#"{"seq": 3}"#,
            r#"{"seq": 4}"#,
            r#"{"seq": 5}"#
        ],
        "one key's events in commit order across the two tables"
    );
    // Each table's rows carry its own mapping: billing's id in `event-id`, its kind as `type`.
    let billing: Vec<_> = got
        .iter()
        .filter(|r| r.header("event-id").is_some())
        .collect();
    assert_eq!(billing.len(), 2, "{got:?}");
    assert_eq!(billing[0].header("type").as_deref(), Some("Invoiced"));
    assert_eq!(billing[0].key.as_deref(), Some(&b"acct-1"[..]));
    assert!(billing[0].header("id").is_none());
    let public = got.iter().filter(|r| r.header("id").is_some()).count();
    assert_eq!(public, 3);
    wait_until("per-table row counts", Duration::from_secs(30), || async {
        rows_metric(&ferry, "billing.events", "routed").await == Some(2.0)
            && rows_metric(&ferry, "public.outbox", "routed").await == Some(2.0)
    })
    .await;
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_run_name_the_table_entry_whose_column_is_missing() {
    let mut w = World::new().await;
    w.sql.batch_execute(BILLING_DDL).await.unwrap();
    let topic = w.topic("billing");
    w.env.push((
        "FERRY_CONFIG".into(),
        billing_config(&topic, "outbox.timestamp_column = \"created_at\""),
    ));
    let mut check = Ferry::spawn(&w, &["check"]);
    let status = check.wait_exit(Duration::from_secs(60)).await;
    let out = check.log_text();
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        out.contains(
            "table \"billing\".\"events\" has no column \"created_at\" (named by tables[0].outbox.timestamp_column)"
        ),
        "{out}"
    );
    assert!(
        out.contains("set tables[0].outbox.timestamp_column to one of its columns (event_id, account, kind, body)"),
        "{out}"
    );
    // `run` refuses to start on it, with the same words.
    let mut ferry = w.start_ferry();
    let status = ferry.wait_exit(Duration::from_secs(60)).await;
    assert!(!status.success());
    assert!(
        ferry
            .log_text()
            .contains("(named by tables[0].outbox.timestamp_column)"),
        "{}",
        ferry.log_text()
    );
}
