//! The reader against a real PostgreSQL 15: what arrives, in what order, and what the slot
//! remembers.

mod common;

use std::time::Duration;

use common::*;
use ferry_testkit::pg;
use ferry_testkit::proxy::{Fault, Proxy};
use ferry_wal::assembly::OutboxEvent;
use ferry_wal::conn::{ReaderError, ReaderEvent, ReaderHandle, StreamOptions};
use ferry_wal::pgoutput::TupleValue;
use ferry_wal::slot;
use ferry_wal::Lsn;

#[tokio::test]
async fn committed_rows_arrive_with_correct_values() {
    let s = setup().await;
    let mut r = start(&s).await;
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(1024 * 1024));
    s.sql
        .batch_execute(&format!(
            "BEGIN;
             INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, blob, note) VALUES
               ('6f1c7c38-54f5-4d6b-9d38-1f3a3c4f1a01', 'order', 'o-1', 'created', '{{\"a\": 1, \"ü\": \"日本\"}}', '\\x00ff10', 'première'),
               ('6f1c7c38-54f5-4d6b-9d38-1f3a3c4f1a02', 'order', 'o-1', 'paid', NULL, NULL, NULL),
               ('6f1c7c38-54f5-4d6b-9d38-1f3a3c4f1a03', 'order', 'o-2', 'big', '{big}', NULL, 'big');
             COMMIT;"
        ))
        .await
        .unwrap();
    let t = next_txn(&mut r).await;
    assert_eq!(t.rows.len(), 3);
    assert!(t.end_lsn > t.commit_lsn);
    let a = &t.rows[0];
    assert_eq!(
        text(a, "id").unwrap(),
        "6f1c7c38-54f5-4d6b-9d38-1f3a3c4f1a01"
    );
    assert_eq!(text(a, "aggregatetype").unwrap(), "order");
    assert_eq!(text(a, "aggregateid").unwrap(), "o-1");
    assert_eq!(text(a, "payload").unwrap(), "{\"a\": 1, \"ü\": \"日本\"}");
    assert_eq!(text(a, "blob").unwrap(), "\\x00ff10");
    assert_eq!(text(a, "note").unwrap(), "première");
    assert_eq!(a.get("payload").unwrap().0, 3802, "jsonb type oid");
    let b = &t.rows[1];
    assert_eq!(text(b, "payload"), None);
    assert_eq!(text(b, "blob"), None);
    let c = &t.rows[2];
    assert_eq!(text(c, "payload").unwrap(), big);
    assert_eq!(t.xid, a.xid);
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn rolled_back_transactions_never_arrive() {
    let s = setup().await;
    let mut r = start(&s).await;
    s.sql
        .batch_execute(
            "BEGIN; INSERT INTO outbox (aggregatetype, aggregateid, type, note) VALUES ('a','1','t','rolled back'); ROLLBACK;
             BEGIN; INSERT INTO outbox (aggregatetype, aggregateid, type, note) VALUES ('a','1','t','savepoint');
               SAVEPOINT s; INSERT INTO outbox (aggregatetype, aggregateid, type, note) VALUES ('a','1','t','undone');
               ROLLBACK TO SAVEPOINT s; COMMIT;
             INSERT INTO outbox (aggregatetype, aggregateid, type, note) VALUES ('a','1','t','marker');",
        )
        .await
        .unwrap();
    let t = next_txn(&mut r).await;
    let notes: Vec<_> = t.rows.iter().map(|r| text(r, "note").unwrap()).collect();
    assert_eq!(notes, ["savepoint"]);
    let t = next_txn(&mut r).await;
    assert_eq!(text(&t.rows[0], "note").unwrap(), "marker");
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn interleaved_transactions_arrive_in_commit_order() {
    let s = setup().await;
    let mut r = start(&s).await;
    let a = s.db.client().await;
    let b = s.db.client().await;
    let ins = |n: &str| {
        format!("INSERT INTO outbox (aggregatetype, aggregateid, type, note) VALUES ('a','1','t','{n}')")
    };
    a.batch_execute("BEGIN").await.unwrap();
    b.batch_execute("BEGIN").await.unwrap();
    a.batch_execute(&ins("a1")).await.unwrap();
    b.batch_execute(&ins("b1")).await.unwrap();
    a.batch_execute(&ins("a2")).await.unwrap();
    b.batch_execute(&ins("b2")).await.unwrap();
    b.batch_execute("COMMIT").await.unwrap();
    a.batch_execute("COMMIT").await.unwrap();
    let first = next_txn(&mut r).await;
    let second = next_txn(&mut r).await;
    let notes = |t: &Txn| {
        t.rows
            .iter()
            .map(|r| text(r, "note").unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(notes(&first), ["b1", "b2"], "b committed first");
    assert_eq!(notes(&second), ["a1", "a2"]);
    assert!(first.end_lsn < second.end_lsn);
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn confirmed_lsn_survives_a_reconnect() {
    let s = setup().await;
    let mut r = start(&s).await;
    let ins = |n: &str| {
        format!("INSERT INTO outbox (aggregatetype, aggregateid, type, note) VALUES ('a','1','t','{n}')")
    };
    s.sql.batch_execute(&ins("one")).await.unwrap();
    let one = next_txn(&mut r).await;
    r.confirm(one.end_lsn);
    r.shutdown().await.unwrap();
    assert_eq!(slot_confirmed(&s.sql, &s.spec.slot).await, one.end_lsn);

    s.sql.batch_execute(&ins("two")).await.unwrap();
    let mut r = start(&s).await;
    assert_eq!(r.resume_lsn, one.end_lsn);
    let two = next_txn(&mut r).await;
    assert_eq!(
        text(&two.rows[0], "note").unwrap(),
        "two",
        "only newer transactions arrive"
    );
    // Not confirmed: a reconnect replays it.
    r.shutdown().await.unwrap();
    let mut r = start(&s).await;
    let again = next_txn(&mut r).await;
    assert_eq!(text(&again.rows[0], "note").unwrap(), "two");
    assert_eq!(again.end_lsn, two.end_lsn);
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn idle_outbox_with_writes_elsewhere_lets_the_slot_advance() {
    let s = setup().await;
    s.sql
        .batch_execute("CREATE TABLE busy (x int)")
        .await
        .unwrap();
    let mut r = start(&s).await;
    let before = slot_confirmed(&s.sql, &s.spec.slot).await;
    s.sql
        .batch_execute("INSERT INTO busy SELECT generate_series(1, 1000)")
        .await
        .unwrap();
    let target = ferry_wal::slot::current_wal_lsn(&s.sql).await.unwrap();
    assert!(target > before);
    // Act as an idle pipeline: confirm every keepalive's wal_end (nothing is in flight).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ev = tokio::time::timeout_at(deadline, r.recv())
            .await
            .expect("a keepalive past the busy writes within 60s")
            .expect("reader alive");
        match ev {
            ReaderEvent::Keepalive { wal_end } => {
                r.confirm(wal_end);
                if wal_end >= target {
                    break;
                }
            }
            // PostgreSQL 14 sends the busy writes' transactions as empty Begin/Commit pairs
            // (15+ skips them): an idle pipeline confirms each one's end_lsn; rows never come.
            ReaderEvent::Outbox(OutboxEvent::Commit(c)) => r.confirm(c.end_lsn),
            ReaderEvent::Outbox(OutboxEvent::Begin(_)) => {}
            ReaderEvent::Outbox(e) => panic!("no outbox row or message expected, got {e:?}"),
        }
    }
    ferry_testkit::wait_until(
        "confirmed_flush_lsn passes the busy writes",
        Duration::from_secs(30),
        || async { slot_confirmed(&s.sql, &s.spec.slot).await >= target },
    )
    .await;
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn logical_messages_with_the_outbox_prefix_arrive() {
    let s = setup().await;
    let mut r = start(&s).await;
    s.sql
        .batch_execute(
            "BEGIN;
             SELECT pg_logical_emit_message(true, 'outbox', '{\"id\": \"m1\"}');
             SELECT pg_logical_emit_message(true, 'other', 'ignored');
             SELECT pg_logical_emit_message(false, 'outbox', 'non-transactional');
             COMMIT;",
        )
        .await
        .unwrap();
    let t = next_txn(&mut r).await;
    assert_eq!(t.messages.len(), 1);
    assert_eq!(&t.messages[0].content[..], b"{\"id\": \"m1\"}");
    assert!(t.rows.is_empty());
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn updates_deletes_and_other_tables_of_a_publication_for_all_tables_are_skipped() {
    let s = setup().await;
    s.sql
        .batch_execute("CREATE TABLE other (x int); DROP PUBLICATION ferry_outbox; CREATE PUBLICATION ferry_outbox FOR ALL TABLES WITH (publish = 'insert, update, delete, truncate')")
        .await
        .unwrap();
    // FOR ALL TABLES carries other tables by design: the reader skips their inserts.
    let mut options = options(&s.spec, Some("outbox"));
    options.source.other_tables = slot::other_tables(&s.sql, &s.spec).await.unwrap();
    assert!(options.source.other_tables.all);
    let mut r = ferry_wal::conn::start(&s.cfg, &s.sql, options)
        .await
        .unwrap();
    s.sql
        .batch_execute(
            "INSERT INTO other VALUES (1);
             INSERT INTO outbox (aggregatetype, aggregateid, type, note) VALUES ('a','1','t','kept');
             UPDATE outbox SET note = 'changed';
             DELETE FROM outbox;
             INSERT INTO outbox (aggregatetype, aggregateid, type, note) VALUES ('a','1','t','marker');",
        )
        .await
        .unwrap();
    let mut notes = vec![];
    while notes.last().map(String::as_str) != Some("marker") {
        let t = next_txn(&mut r).await;
        notes.extend(t.rows.iter().map(|r| text(r, "note").unwrap()));
    }
    assert_eq!(notes, ["kept", "marker"]);
    assert_eq!(
        r.stats
            .outbox_updates_skipped
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(
        r.stats
            .outbox_deletes_skipped
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_relation_changed_mid_stream_is_remapped_by_name() {
    let s = setup().await;
    let mut r = start(&s).await;
    s.sql
        .batch_execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, note) VALUES ('a','1','t','before');
             ALTER TABLE outbox DROP COLUMN blob, ADD COLUMN tenant text;
             INSERT INTO outbox (aggregatetype, aggregateid, type, note, tenant) VALUES ('a','1','t','after','acme');",
        )
        .await
        .unwrap();
    // One simple query is one transaction: the layout changes between its two rows.
    let t = next_txn(&mut r).await;
    let (before, after) = (&t.rows[0], &t.rows[1]);
    assert_eq!(text(before, "note").unwrap(), "before");
    assert!(before.get("tenant").is_none());
    assert_eq!(text(before, "blob"), None);
    assert_eq!(text(after, "note").unwrap(), "after");
    assert_eq!(text(after, "tenant").unwrap(), "acme");
    assert!(after.get("blob").is_none());
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn values_of_every_outbox_type_arrive_as_text() {
    let s = setup().await;
    s.sql
        .batch_execute("ALTER TABLE outbox ADD COLUMN ts timestamptz, ADD COLUMN n bigint")
        .await
        .unwrap();
    let mut r = start(&s).await;
    s.sql
        .batch_execute("INSERT INTO outbox (aggregatetype, aggregateid, type, ts, n) VALUES ('a','1','t','2026-11-22 10:00:00.123+02', 9007199254740993)")
        .await
        .unwrap();
    let t = next_txn(&mut r).await;
    // The session is pinned to UTC and ISO dates, whatever the server's defaults.
    assert_eq!(
        text(&t.rows[0], "ts").unwrap(),
        "2026-11-22 08:00:00.123+00"
    );
    assert_eq!(text(&t.rows[0], "n").unwrap(), "9007199254740993");
    assert!(matches!(
        t.rows[0].get("id").unwrap().1,
        TupleValue::Text(_)
    ));
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_pipeline_that_stops_taking_events_stops_the_reader_within_its_byte_budget() {
    use std::sync::atomic::Ordering;
    let s = setup().await;
    let mut r = start(&s).await;
    // 48 rows of 1 MiB: far more than the channel's byte budget.
    s.sql
        .batch_execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
             SELECT 'a', g::text, 't', jsonb_build_object('pad', repeat('x', 1048576))
             FROM generate_series(1, 48) g",
        )
        .await
        .unwrap();
    let budget = ferry_wal::conn::stream::CHANNEL_BYTES;
    // Take nothing: the reader fills its budget, then stops reading the socket.
    ferry_testkit::wait_until(
        "the reader's byte budget fills up",
        Duration::from_secs(60),
        || async { r.buffered_bytes() + 1024 * 1024 + 64 * 1024 > budget },
    )
    .await;
    let received = r.stats.xlog_bytes.load(Ordering::Relaxed) as usize;
    assert!(
        received <= budget + 2 * 1024 * 1024,
        "the reader went on reading past its budget: {received} bytes received, budget {budget}"
    );
    // Taking events frees the budget and the rest flows.
    let t = next_txn(&mut r).await;
    assert_eq!(t.rows.len(), 48);
    r.shutdown().await.unwrap();
}

/// Through a backlog the reader batches its reads (the socket's low-water mark is raised); when
/// the stream stops, the mark comes down again: a small transaction after a large one arrives
/// at once, both straight behind it and later, not with the next keepalive (30 s away with the
/// default `wal_sender_timeout`).
#[tokio::test]
async fn small_transactions_after_a_fast_stream_arrive_at_once() {
    let s = setup().await;
    let mut r = start(&s).await;
    let bulk = "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, note)
                  SELECT 'order', 'o', 'bulk', jsonb_build_object('x', repeat('y', 8000)), 'bulk'
                  FROM generate_series(1, 500);";
    let small = |note: &str| {
        format!(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, note)
               VALUES ('order', 'o', 'small', '{{}}', '{note}');"
        )
    };
    // ~4 MB in one transaction (wake-ups bring far more than the batching threshold), and a
    // small transaction straight behind it.
    s.sql
        .batch_execute(&format!("BEGIN; {bulk} COMMIT; {}", small("behind")))
        .await
        .unwrap();
    assert_eq!(next_txn(&mut r).await.rows.len(), 500);
    let within = Duration::from_secs(10);
    let t = tokio::time::timeout(within, next_txn(&mut r))
        .await
        .expect("the transaction behind the bulk waited for more data");
    assert_eq!(text(&t.rows[0], "note").unwrap(), "behind");
    // Another bulk, then, once it is read, a small transaction on its own.
    s.sql.batch_execute(bulk).await.unwrap();
    assert_eq!(next_txn(&mut r).await.rows.len(), 500);
    s.sql.batch_execute(&small("later")).await.unwrap();
    let t = tokio::time::timeout(within, next_txn(&mut r))
        .await
        .expect("a later small transaction waited for more data: the low-water mark stayed up");
    assert_eq!(text(&t.rows[0], "note").unwrap(), "later");
    r.shutdown().await.unwrap();
}

/// The reader hands events over in batches (one read's burst). A row it refuses (here: an
/// INSERT into a table the publication lists and no entry relays) ends it with that error, and
/// what it read before, in the same burst, still reaches the pipeline first: a transaction
/// before the refused row is relayed and confirmed, as when each event went over on its own.
#[tokio::test]
async fn what_was_read_before_a_refused_row_reaches_the_pipeline() {
    let s = setup().await;
    let publication = ferry_wal::slot::quote_ident(&s.spec.publication);
    // Everything is in the WAL before streaming starts, so that the walsender sends it back to
    // back, and the transaction before the refused row often comes in the same read as that
    // row (not always: on a build that dropped what a burst had read before an error, this
    // failed in 5 of 11 runs).
    s.sql
        .batch_execute(&format!(
            "CREATE TABLE other (x int);
             ALTER PUBLICATION {publication} ADD TABLE other;
             COMMIT;
             INSERT INTO outbox (aggregatetype, aggregateid, type, payload, note)
               VALUES ('order', 'o', 't', '{{}}', 'before');
             COMMIT;
             INSERT INTO other VALUES (1);
             COMMIT;"
        ))
        .await
        .unwrap();
    let mut r = start(&s).await;
    let t = tokio::time::timeout(Duration::from_secs(30), next_txn(&mut r))
        .await
        .expect("the transaction before the refused row did not arrive");
    assert_eq!(text(&t.rows[0], "note").unwrap(), "before");
    // Then the reader ends by itself, with the refusal (the refused transaction's Begin
    // before it, nothing of its rows).
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(e) = r.recv().await {
            assert!(
                matches!(
                    e,
                    ReaderEvent::Keepalive { .. } | ReaderEvent::Outbox(OutboxEvent::Begin(_))
                ),
                "{e:?}"
            );
        }
    })
    .await
    .expect("the reader did not end at the refused row");
    let err = r.shutdown().await.unwrap_err().to_string();
    assert!(
        err.contains("no [outbox] or [[tables]] entry relays it"),
        "{err}"
    );
}

/// A reader started with `opts` through a TCP fault proxy in front of the test server.
async fn start_through_proxy(s: &Setup, opts: StreamOptions) -> (Proxy, ReaderHandle) {
    let (proxy, cfg) = proxied(s).await;
    let r = ferry_wal::conn::start(&cfg, &s.sql, opts).await.unwrap();
    (proxy, r)
}

/// A proxy to the test server, and the connection settings that go through it.
async fn proxied(s: &Setup) -> (Proxy, ferry_wal::conn::ConnectConfig) {
    let upstream = s.db.url.split_once('@').map(|(_, r)| r).unwrap_or_default();
    let hostport = upstream.split('/').next().unwrap_or_default();
    let addr = tokio::net::lookup_host(hostport)
        .await
        .expect("the test server's address")
        .next()
        .expect("an address");
    let proxy = Proxy::tcp(addr).await.unwrap();
    let url = s.db.url.replace(hostport, &proxy.addr().to_string());
    (proxy, ferry_wal::conn::ConnectConfig::parse(&url).unwrap())
}

/// A server that goes silent between connecting and `START_REPLICATION` (the connection opened
/// ahead, while the session read the progress topic): the start fails with a transient error
/// once `receive_timeout` passed, instead of waiting for as long as the connection stays open.
#[tokio::test]
async fn a_server_silent_before_start_replication_fails_the_start_after_the_receive_timeout() {
    let s = setup().await;
    let opts = StreamOptions {
        receive_timeout: Some(Duration::from_secs(2)),
        ..options(&s.spec, Some("outbox"))
    };
    let (proxy, cfg) = proxied(&s).await;
    let replication = ferry_wal::conn::Replication::connect(&cfg).await.unwrap();
    proxy.inject(Fault::Blackhole);
    let started = tokio::time::timeout(
        Duration::from_secs(30),
        ferry_wal::conn::start_on(replication, &s.sql, opts),
    )
    .await
    .expect("the start still waits 30 s into the silence");
    let err = started.expect_err("a silent server is an error");
    assert!(
        matches!(
            err,
            ReaderError::Unanswered {
                what: "START_REPLICATION",
                ..
            }
        ) && err.is_transient()
            && err.is_server_away(),
        "{err}"
    );
    assert!(
        err.to_string().contains("postgres.receive_timeout"),
        "{err}"
    );
    proxy.heal();
}

/// A server that goes silent without closing the connection (here a proxy that forwards
/// nothing more, as a dropped route or a vanished host does) ends the stream with a transient
/// timeout once `receive_timeout` passed, a reply asked for from a quarter of it on: without
/// one the reader would wait for as long as the connection stays open.
#[tokio::test]
async fn a_server_that_went_silent_ends_the_stream_after_the_receive_timeout() {
    let s = setup().await;
    let opts = StreamOptions {
        receive_timeout: Some(Duration::from_secs(2)),
        ..options(&s.spec, Some("outbox"))
    };
    let (proxy, mut r) = start_through_proxy(&s, opts).await;
    // The stream works, and an idle stream longer than the timeout stays up: the server
    // answers the reply asked for.
    insert_and_expect_note(&s.sql, &mut r, "before the silence").await;
    // A window to stay up through (2.5 timeouts), not a wait for a condition.
    let idle = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < idle {
        assert!(!r.is_finished(), "an idle stream that answers ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.inject(Fault::Blackhole);
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        while r.recv().await.is_some() {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the reader still waits 30 s into the silence"
    );
    let err = r.shutdown().await.expect_err("a silent server is an error");
    assert!(
        matches!(err, ReaderError::Silent { .. }) && err.is_transient() && err.is_server_away(),
        "{err}"
    );
    assert!(
        err.to_string().contains("postgres.receive_timeout"),
        "{err}"
    );
    proxy.heal();
}

/// A query given up on ([`ferry_wal::conn::answered`]) still runs on the server: a backend
/// waiting on a lock would wait on, whoever asked. [`slot::cancel_sql`] ends it.
#[tokio::test]
async fn a_query_given_up_on_is_cancelled_on_the_server() {
    let s = setup().await;
    let cfg = ferry_wal::conn::ConnectConfig::parse(&s.db.url).unwrap();
    let sql = slot::connect_sql(&cfg).await.unwrap();
    let pid: i32 = sql
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let sleep = async {
        sql.simple_query("SELECT pg_sleep(600)")
            .await
            .map_err(slot::sql_error)
    };
    let err = ferry_wal::conn::answered(Some(Duration::from_millis(200)), "a sleep", sleep)
        .await
        .expect_err("given up on");
    assert!(matches!(err, ReaderError::Unanswered { .. }), "{err}");
    assert!(
        active(&s.sql, pid).await,
        "the sleep should still run on the server"
    );
    slot::cancel_sql(&cfg, &sql.cancel_token()).await;
    let ended = ferry_testkit::wait_for(Duration::from_secs(30), || async {
        !active(&s.sql, pid).await
    })
    .await;
    assert!(ended, "the query still runs 30 s after the cancel");
}

/// Whether backend `pid` runs a query.
async fn active(sql: &tokio_postgres::Client, pid: i32) -> bool {
    let row = sql
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active'",
            &[&pid],
        )
        .await
        .unwrap();
    row.get::<_, i64>(0) == 1
}

/// The next transaction, whose five rows' notes are `t/1` to `t/5`.
async fn expect_five_rows(r: &mut ReaderHandle, t: usize) {
    let txn = next_txn(r).await;
    let notes: Vec<_> = txn.rows.iter().map(|r| text(r, "note").unwrap()).collect();
    let expected: Vec<_> = (1..=5).map(|i| format!("{t}/{i}")).collect();
    assert_eq!(notes, expected);
}

/// Checks that the reader paused at least once (else the test did not exercise `what`), then
/// heals the link and stops the reader.
async fn end_having_paused(proxy: Proxy, r: ReaderHandle, what: &str) {
    assert!(
        r.stats.pauses.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no pause: the test did not exercise {what}"
    );
    proxy.heal();
    r.shutdown().await.unwrap();
}

/// Transactions that come one at a time, apart: a pause inside one ends as soon as the rest of
/// a transaction like the last ones has come (the socket's low-water mark set to that rest),
/// not at its length. The pause here lasts an hour, so a pause that ran its length, or a mark
/// that the rest did not reach, would hold the transaction back past the test's deadline. Each
/// transaction is larger than the last by more than a keepalive, so that its rest reaches the
/// mark whether or not the server sent one after the last commit.
#[tokio::test]
async fn a_pause_ends_when_the_rest_of_a_transaction_has_come() {
    let s = setup().await;
    let opts = StreamOptions {
        pause_inside_transaction: Duration::from_secs(3600),
        ..options(&s.spec, Some("outbox"))
    };
    let (proxy, mut r) = start_through_proxy(&s, opts).await;
    // 40 KB a second, in chunks of 4 KB a tenth of a second apart: each transaction of 6 KB
    // or more comes in two reads or more, the first ending inside it.
    proxy.inject(Fault::Throttle(40_000));
    for t in 0..4 {
        // Written once the last has arrived, so that the stream is idle between them.
        s.sql
            .batch_execute(&format!(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, note)
                   SELECT 'order', 'o', 'apart', jsonb_build_object('x', repeat('y', {})), '{t}/' || i
                   FROM generate_series(1, 5) i;",
                1_000 + 100 * t
            ))
            .await
            .unwrap();
        expect_five_rows(&mut r, t).await;
    }
    end_having_paused(proxy, r, "a pause that ends with the rest").await;
}

/// A link slow enough that every transaction comes in many reads, with a wait after each: the
/// reader pauses after each read that ends inside a transaction (its socket's low-water mark
/// raised meanwhile), and every pause ends, the mark comes down, and the rest is read. A pause
/// that never ended, or a mark left up, would hold the rest of a transaction back for good.
#[tokio::test]
async fn transactions_trickling_in_arrive_whole_and_in_order() {
    let s = setup().await;
    let (proxy, mut r) = start_through_proxy(&s, options(&s.spec, Some("outbox"))).await;
    // 40 KB a second, in chunks of 4 KB a tenth of a second apart: each ~6 KB transaction
    // comes in two or three reads, each ending inside it.
    proxy.inject(Fault::Throttle(40_000));
    for t in 0..4 {
        s.sql
            .batch_execute(&format!(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, note)
                   SELECT 'order', 'o', 'slow', jsonb_build_object('x', repeat('y', 1000)), '{t}/' || i
                   FROM generate_series(1, 5) i;"
            ))
            .await
            .unwrap();
    }
    for t in 0..4 {
        expect_five_rows(&mut r, t).await;
    }
    end_having_paused(proxy, r, "the pause").await;
}

/// The server sends a keepalive when its WAL passes what the reader said it received, and then
/// none until its WAL moves again. One that finds the pipeline's channel full is not lost: its
/// WAL end reaches the pipeline once it takes what is queued, or an idle slot would stay
/// behind it until something else writes WAL. Its own cluster: nothing else writes WAL (an
/// attempt in which something did proves nothing and is repeated).
#[tokio::test]
async fn a_keepalive_that_finds_the_channel_full_reaches_the_pipeline_once_it_has_room() {
    let pg = pg::Postgres::Local(pg::PgCluster::start(pg::ClusterOptions::default()).await);
    let pg::Postgres::Local(cluster) = &pg else {
        unreachable!()
    };
    let s = setup_on(pg.create_db().await).await;
    // Another database's transactions: WAL the slot does not decode, so only keepalives come.
    let other = pg::connect(&cluster.url("postgres")).await;
    other
        .batch_execute("CREATE TABLE elsewhere (v int)")
        .await
        .unwrap();
    let mut r = start(&s).await;
    for attempt in 1..=4 {
        // A keepalive a write, each read alone and handed over as a batch, until the channel
        // is full (nothing takes from it).
        let mut writes = 0;
        while !r.channel_full() {
            assert!(writes < 10_000, "the channel never filled up");
            other
                .batch_execute("INSERT INTO elsewhere VALUES (1)")
                .await
                .unwrap();
            writes += 1;
        }
        other
            .batch_execute("INSERT INTO elsewhere VALUES (2)")
            .await
            .unwrap();
        let target = slot::current_wal_lsn(&s.sql).await.unwrap();
        // The reader reports what it received after it handled what it read: past this, the
        // keepalive met the full channel.
        ferry_testkit::wait_until(
            "the reader reports the WAL end past the last write as received",
            Duration::from_secs(30),
            || async {
                let row = s
                    .sql
                    .query_one(
                        "SELECT coalesce(write_lsn::text, '0/0') FROM pg_stat_replication WHERE pid = $1",
                        &[&r.backend_pid],
                    )
                    .await
                    .unwrap();
                row.get::<_, String>(0).parse::<Lsn>().unwrap() >= target
            },
        )
        .await;
        assert!(r.channel_full());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let ev = tokio::time::timeout_at(deadline, r.recv())
                .await
                .expect("a keepalive at the WAL end within 60s")
                .expect("reader alive");
            match ev {
                ReaderEvent::Keepalive { wal_end } if wal_end >= target => break,
                ReaderEvent::Keepalive { .. } => {}
                ReaderEvent::Outbox(e) => panic!("no outbox event expected, got {e:?}"),
            }
        }
        if slot::current_wal_lsn(&s.sql).await.unwrap() == target {
            r.shutdown().await.unwrap();
            return;
        }
        eprintln!("attempt {attempt}: the server wrote WAL past {target}; again");
    }
    panic!("the WAL end never reached the pipeline before the server wrote more WAL");
}

/// A walsender decoding a long transaction of another table's changes sends the client nothing
/// until its commit, and with `wal_sender_timeout = 0` no keepalive of its own either. It
/// still reads its client's messages every 100 changes (PostgreSQL 15+, and 14.4+ from the same
/// fix backpatched), so the reply the reader asks for from a quarter of its receive timeout on
/// keeps the stream up through a decode many timeouts long; the outbox row behind it arrives.
#[tokio::test]
async fn a_long_decode_of_another_tables_changes_keeps_the_stream_up() {
    let s = setup().await;
    // Changes spilled to disk (the smallest work memory) are slower to decode: a decode of
    // several timeouts from a modest transaction.
    s.sql
        .batch_execute(&format!(
            "ALTER ROLE CURRENT_USER IN DATABASE {} SET wal_sender_timeout = 0;
             ALTER ROLE CURRENT_USER IN DATABASE {0} SET logical_decoding_work_mem = '64kB';
             CREATE TABLE other (x int, pad text);",
            s.db.name
        ))
        .await
        .unwrap();
    let timeout = Duration::from_millis(500);
    let opts = StreamOptions {
        receive_timeout: Some(timeout),
        ..options(&s.spec, Some("outbox"))
    };
    // A connection made after the settings, which the reader reads `wal_sender_timeout` on.
    let sql = s.db.client().await;
    let mut r = ferry_wal::conn::start(&s.cfg, &sql, opts).await.unwrap();
    insert_and_expect_note(&s.sql, &mut r, "before").await;
    s.sql
        .batch_execute(
            "INSERT INTO other SELECT g, repeat('p', 100) FROM generate_series(1, 2000000) g;
             INSERT INTO outbox (aggregatetype, aggregateid, type, note)
               VALUES ('a', '1', 't', 'after');",
        )
        .await
        .unwrap();
    let decoding = std::time::Instant::now();
    let row = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            match r.recv().await? {
                ReaderEvent::Outbox(OutboxEvent::Row(row)) => return Some(row),
                _ => continue,
            }
        }
    })
    .await
    .expect("the row behind the long transaction did not arrive within 120 s");
    let Some(row) = row else {
        panic!(
            "the stream ended during the decode: {:?}",
            r.shutdown().await
        )
    };
    assert_eq!(text(&row, "note").unwrap(), "after");
    // The decode outlasted the timeout, or the test showed nothing.
    let took = decoding.elapsed();
    assert!(
        took > 2 * timeout,
        "the decode took {took:?}, too short to show anything: make the transaction larger"
    );
    r.shutdown().await.unwrap();
}
