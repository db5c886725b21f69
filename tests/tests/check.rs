//! `ferry check` and `ferry status` end to end: the check passes on a good setup, names every
//! misconfiguration with its fix (exit 1), refuses an unusable configuration (exit 2), and
//! status shows where the slot stands after a run.

mod common;

use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_on_a_good_setup() {
    let w = World::new().await;
    w.create_topic("order", 1).await;
    w.insert("order", "o-1", "OrderCreated", "{}").await;
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(0), "{out}");
    // Neither exists yet, and `ferry run` may create both: notes, not problems.
    assert!(
        out.contains(&format!(
            "note: publication {:?} does not exist\n    fix: none needed: Ferry creates it",
            w.publication
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "note: replication slot {:?} does not exist\n    fix: none needed: Ferry creates it",
            w.slot
        )),
        "{out}"
    );
    assert!(
        out.contains("note: values will stream as text: no column Ferry reads is bytea"),
        "{out}"
    );
    assert!(out.contains("OK: Ferry can run (0 warning(s))"), "{out}");
    assert!(!out.contains("error:"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_missing_outbox_table_with_its_fix() {
    let w = World::new().await;
    w.sql.batch_execute("DROP TABLE outbox").await.unwrap();
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(
        &out,
        "table \"public\".\"outbox\" does not exist",
        "sql/outbox.sql",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_missing_mapped_column_with_its_fix() {
    let mut w = World::new().await;
    w.env
        .push(("FERRY_OUTBOX_PAYLOAD_COLUMN".into(), "nope".into()));
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(
        &out,
        "has no column \"nope\" (named by outbox.payload_column)",
        "set outbox.payload_column to one of its columns",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_missing_publication_it_may_not_create() {
    let mut w = World::new().await;
    w.env
        .push(("FERRY_POSTGRES_CREATE_PUBLICATION".into(), "false".into()));
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(
        &out,
        &format!("publication {:?} does not exist", w.publication),
        &format!(
            "CREATE PUBLICATION {:?} FOR TABLE \"public\".\"outbox\"",
            w.publication
        ),
    );
}

/// A table the publication lists by name that no entry relays: `run` would skip its rows, so
/// `check` fails naming it, with both fixes. A publication FOR ALL TABLES carries every table by
/// design: a note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_fails_on_a_published_table_no_entry_relays_and_notes_a_publication_for_all_tables() {
    let w = World::new().await;
    w.create_topic("order", 1).await;
    let publication = &w.publication;
    w.sql
        .batch_execute(&format!(
            "CREATE SCHEMA shop; CREATE TABLE shop.events_json (id int PRIMARY KEY, body jsonb); \
             CREATE PUBLICATION {publication} FOR TABLE outbox, shop.events_json WITH (publish = 'insert')"
        ))
        .await
        .unwrap();
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(
        &out,
        &format!(
            "publication {publication:?} includes table \"shop\".\"events_json\", which no [outbox] or \
             [[tables]] entry relays"
        ),
        "add a [[tables]] entry with outbox.table = \"shop.events_json\"",
    );
    assert!(
        out.contains(&format!(
            "ALTER PUBLICATION \"{publication}\" DROP TABLE \"shop\".\"events_json\""
        )),
        "{out}"
    );

    w.sql
        .batch_execute(&format!(
            "DROP PUBLICATION {publication}; CREATE PUBLICATION {publication} FOR ALL TABLES WITH (publish = 'insert')"
        ))
        .await
        .unwrap();
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!(
            "note: publication {publication:?} is FOR ALL TABLES"
        )),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_role_without_replication() {
    let mut w = World::new().await;
    let role = ferry_testkit::pg::unique_name("ferry_norepl");
    w.sql
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD 'role-secret'; GRANT SELECT ON outbox TO {role}"
        ))
        .await
        .unwrap();
    w.env.push((
        "FERRY_POSTGRES_URL".into(),
        w.db.url_as(&role, "role-secret"),
    ));
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(
        &out,
        &format!("role {role:?} lacks the REPLICATION attribute"),
        &format!("ALTER ROLE {role:?} WITH REPLICATION"),
    );
    assert!(
        !out.contains("role-secret"),
        "the password never prints: {out}"
    );
    w.sql
        .batch_execute(&format!(
            "REVOKE ALL ON outbox FROM {role}; DROP ROLE {role}"
        ))
        .await
        .unwrap();
}

/// A server that stops answering (here a query waiting on a lock another transaction holds on
/// the outbox table) is reported within `postgres.receive_timeout`, not waited for. (The query
/// is cancelled too, but the sample's own statement timeout would end this one anyway: the
/// cancel is shown where nothing else would, in `reader_stream` and `schema`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_server_that_does_not_answer() {
    let mut w = World::new().await;
    w.set_env(&[("FERRY_POSTGRES_RECEIVE_TIMEOUT", "2s")]);
    let mut locker = ferry_testkit::pg::connect(&w.db.url).await;
    let held = locker.transaction().await.unwrap();
    held.batch_execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(
        &out,
        "the server did not answer within 2s (postgres.receive_timeout)",
        "a query waiting on a lock",
    );
    held.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_wrong_password_without_printing_it() {
    let mut w = World::new().await;
    w.env.push((
        "FERRY_POSTGRES_URL".into(),
        w.db.url_as("postgres", "not-the-password-42"),
    ));
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(
        &out,
        "cannot connect to PostgreSQL: authentication as \"postgres\" failed: FATAL: password authentication failed for user \"postgres\" (SQLSTATE 28P01)",
        "check postgres.url",
    );
    assert!(!out.contains("not-the-password-42"), "{out}");
}

/// The shared test broker has `auto.create.topics.enable = true` (Kafka's default), so a topic that current outbox rows route to but that does not exist yet is no
/// problem: `check` passes without flagging it (with `false` it would be an error, with the
/// setting unknown a warning; see `crates/ferry/src/check.rs`), and `run` proves it right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_accepts_a_missing_topic_that_the_brokers_create_on_first_use() {
    let w = World::new().await;
    w.insert("invoice", "i-1", "InvoiceIssued", "{}").await;
    let topic = w.topic("invoice");
    assert_eq!(partition_count(&w, &topic).await, None, "no such topic yet");

    let (code, out) = check(&w).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("OK: Ferry can run (0 warning(s))"), "{out}");
    assert!(
        out.contains(&format!(
            "note: topic {topic:?} (where current outbox rows route) does not exist"
        )) && out.contains("the brokers create it on first use"),
        "a missing topic on an auto-creating broker is a note: {out}"
    );

    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    // The slot starts after the first row: the next one is relayed.
    w.insert("invoice", "i-2", "InvoicePaid", "{}").await;
    wait_until(
        "the broker created the topic",
        Duration::from_secs(30),
        || async { partition_count(&w, &topic).await.is_some() },
    )
    .await;
    let got = w.consume(&topic, 1).await;
    assert_eq!(got[0].key.as_deref(), Some(&b"i-2"[..]));
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_refuses_an_unknown_configuration_variable() {
    let mut w = World::new().await;
    w.env.push(("FERRY_KAFKA_BROKER".into(), "x".into()));
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("FERRY_KAFKA_BROKER"), "{out}");
    assert!(
        !out.contains("PostgreSQL"),
        "nothing is checked with an unusable configuration: {out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_slot_and_its_lag_after_a_run() {
    let w = World::new().await;
    w.create_topic("order", 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.insert("order", "o-1", "OrderCreated", "{}").await;
    let target = w.current_wal_lsn().await;
    wait_until("the row is confirmed", Duration::from_secs(30), || async {
        w.confirmed_lsn().await.unwrap() >= target
    })
    .await;
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
    // WAL written while Ferry is stopped is lag.
    w.insert("order", "o-2", "OrderPaid", "{}").await;

    let mut status = Ferry::spawn(&w, &["status"]);
    let code = status.wait_exit(Duration::from_secs(60)).await.code();
    let out = status.log_text();
    assert_eq!(code, Some(0), "{out}");
    let confirmed = w.confirmed_lsn().await.unwrap();
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {name:?} line: {out}"))
            .to_string()
    };
    assert_eq!(field("slot "), w.slot);
    assert_eq!(field("streaming "), "no");
    assert_eq!(field("confirmed_flush_lsn "), confirmed.to_string());
    let server: ferry_wal::Lsn = field("server WAL position ").parse().unwrap();
    let lag: u64 = field("lag ")
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("lag in bytes: {out}"));
    assert!(lag > 0, "the second row is not confirmed: {out}");
    assert_eq!(lag, server.saturating_sub(confirmed), "{out}");
}

/// [`common::assert_problem`], and `check`'s summary says that problems must be fixed.
fn assert_problem(out: &str, what: &str, fix: &str) {
    common::assert_problem(out, what, fix);
    assert!(
        out.contains("problem(s) must be fixed before Ferry can run"),
        "{out}"
    );
}

/// The partition count the broker reports for `topic`, if it knows it.
async fn partition_count(w: &World, topic: &str) -> Option<i32> {
    let (b, t) = (w.brokers.clone(), topic.to_string());
    tokio::task::spawn_blocking(move || ferry_testkit::kafka::partition_count(&b, &t))
        .await
        .unwrap()
}

/// Runs `ferry check` for `w` and returns its exit code and everything it printed.
async fn check(w: &World) -> (Option<i32>, String) {
    let mut ferry = Ferry::spawn(w, &["check"]);
    let status = ferry.wait_exit(Duration::from_secs(60)).await;
    (status.code(), ferry.log_text())
}

// What `run` would stop at, `check` reports first: every column the router reads (with its
// type), and every sampled row that cannot be routed, by its id.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_missing_type_column_the_router_reads() {
    let w = World::new().await;
    w.sql
        .batch_execute("ALTER TABLE outbox DROP COLUMN type")
        .await
        .unwrap();
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(
        &out,
        "has no column \"type\" (named by outbox.type_column (route.type_header))",
        "set outbox.type_column",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_topic_placeholder_column_the_table_lacks() {
    let mut w = World::new().await;
    w.env.push((
        "FERRY_ROUTE_TOPIC".into(),
        format!("{}.{{tenant}}.{{aggregatetype}}", w.topic_prefix),
    ));
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(
        &out,
        "has no column \"tenant\" (named by route.topic",
        "or add the column",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_timestamp_column_of_a_type_it_cannot_read() {
    let mut w = World::new().await;
    w.sql
        .batch_execute("ALTER TABLE outbox ADD COLUMN happened boolean")
        .await
        .unwrap();
    w.env
        .push(("FERRY_OUTBOX_TIMESTAMP_COLUMN".into(), "happened".into()));
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(
        &out,
        "(outbox.timestamp_column) is of type boolean",
        "timestamptz, timestamp, smallint, integer, bigint, text, varchar",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_every_sampled_row_that_cannot_be_routed_with_its_id() {
    let w = World::new().await;
    w.create_topic("order", 1).await;
    w.insert("order", "o-1", "OrderCreated", "{}").await;
    let null_payload: String = w
        .sql
        .query_one(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
             VALUES ('invoice', 'i-1', 'InvoiceIssued', NULL) RETURNING id::text",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let bad_topic: String = w
        .sql
        .query_one(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
             VALUES ('no spaces allowed', 'x-1', 'Thing', '{}') RETURNING id::text",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(
        &out,
        &format!("outbox row {null_payload} (aggregate type \"invoice\") cannot be routed"),
        "`ferry run` stops at this row",
    );
    assert_problem(
        &out,
        &format!("outbox row {bad_topic} (aggregate type \"no spaces allowed\") cannot be routed"),
        "`ferry run` stops at this row",
    );
    assert!(out.contains("2 problem(s) must be fixed"), "{out}");
}

/// One row per aggregate type, however many rows come before it; a topic missing on a broker
/// that does not auto-create topics is an error whose fix names route.create_topics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_samples_every_aggregate_type_and_reports_its_missing_topic() {
    let broker =
        ferry_testkit::kafka::LocalBroker::start_with(ferry_testkit::kafka::ClusterOptions {
            auto_create_topics: false,
            ..Default::default()
        })
        .await;
    let w = World::on(
        ferry_testkit::pg::shared().create_db().await,
        broker.brokers(),
    )
    .await;
    w.create_topic("order", 1).await;
    w.sql
        .batch_execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
             SELECT 'order', 'o-' || i, 'OrderCreated', '{}' FROM generate_series(1, 120) i",
        )
        .await
        .unwrap();
    w.insert("zebra", "z-1", "ZebraSeen", "{}").await;
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(
        &out,
        &format!(
            "topic {:?} (where current outbox rows route) does not exist",
            w.topic("zebra")
        ),
        "set route.create_topics.enabled = true",
    );
    assert!(
        !out.contains(&format!("topic {:?}", w.topic("order"))),
        "{out}"
    );
}
