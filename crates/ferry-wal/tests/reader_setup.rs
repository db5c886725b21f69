//! Misconfigurations against a real PostgreSQL 15: each is found by `slot::check` (or
//! `slot::ensure`, or `conn::start`), reported in the right error family, and says how to fix it.
//!
//! Most tests take a database of the shared cluster; those that need server settings of their
//! own (`wal_level`, `max_slot_wal_keep_size`) start a private cluster.

mod common;

use std::time::Duration;

use common::*;
use ferry_testkit::pg::{self, ClusterOptions, PgCluster, TestDb};
use ferry_wal::conn::{ConnectConfig, ReaderError};
use ferry_wal::slot::{
    self, AcceptedTypes, Problem, RequiredColumn, SetupError, Severity, SlotSpec, TableSpec,
};

/// Type oids a payload column may have in these tests (jsonb, json, text, varchar, bytea); which
/// types are accepted is the caller's policy, passed in with its fix.
const PAYLOAD_TYPES: [u32; 5] = [3802, 114, 25, 1043, 17];

/// A database with the outbox table only (no publication, no slot).
async fn bare() -> (TestDb, tokio_postgres::Client) {
    let db = pg::shared().create_db().await;
    let sql = db.client().await;
    sql.batch_execute(OUTBOX_DDL).await.unwrap();
    (db, sql)
}

fn errors(problems: &[Problem]) -> Vec<&Problem> {
    problems
        .iter()
        .filter(|p| p.severity == Severity::Error)
        .collect()
}

/// The one error-level problem, which must mention `what`; its fix must mention every `fix`.
fn the_error<'a>(problems: &'a [Problem], what: &str, fix: &[&str]) -> &'a Problem {
    let errs = errors(problems);
    assert_eq!(
        errs.len(),
        1,
        "expected exactly one error, got {problems:#?}"
    );
    let p = errs[0];
    assert!(
        p.what.contains(what),
        "{:?} should mention {what:?}",
        p.what
    );
    for f in fix {
        assert!(p.fix.contains(f), "fix {:?} should mention {f:?}", p.fix);
    }
    p
}

fn problems_of(e: SetupError) -> Vec<Problem> {
    match e {
        SetupError::Problems(p) => p,
        SetupError::Connection(e) => panic!("expected problems, got a connection error: {e}"),
    }
}

async fn start_err(
    cfg: &ConnectConfig,
    sql: &tokio_postgres::Client,
    spec: &SlotSpec,
) -> ReaderError {
    match ferry_wal::conn::start(cfg, sql, options(spec, None)).await {
        Ok(r) => {
            let _ = r.shutdown().await;
            panic!("conn::start succeeded; expected an error")
        }
        Err(e) => e,
    }
}

#[tokio::test]
async fn wal_level_replica_is_reported_with_the_alter_system_fix() {
    let cluster = PgCluster::start(ClusterOptions {
        tls: false,
        extra_conf: vec!["wal_level = replica".into()],
    })
    .await;
    let sql = pg::connect(&cluster.url("postgres")).await;
    sql.batch_execute(OUTBOX_DDL).await.unwrap();
    let spec = spec();
    sql.batch_execute(
        "CREATE PUBLICATION ferry_outbox FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = true)",
    )
    .await
    .unwrap();
    let problems = slot::check(&sql, &spec).await.unwrap();
    let errs = errors(&problems);
    // The missing slot is only a note (create_slot = true); the wal_level error is what stops Ferry.
    assert_eq!(errs.len(), 1, "{problems:#?}");
    assert!(problems
        .iter()
        .any(|p| p.severity == slot::Severity::Note && p.what.contains("does not exist")));
    assert!(
        errs[0].what.contains("wal_level is \"replica\""),
        "{:?}",
        errs[0]
    );
    assert!(errs[0].fix.contains("ALTER SYSTEM SET wal_level = logical"));
    assert!(errs[0].fix.contains("restart"));

    // ensure() checks before it creates: the same error, and no slot.
    let err = slot::ensure(&sql, &spec).await.unwrap_err();
    assert!(!err.is_transient());
    let problems = problems_of(err);
    assert!(
        problems[0].what.contains("wal_level is \"replica\""),
        "{problems:#?}"
    );
    assert!(
        problems[0]
            .fix
            .contains("ALTER SYSTEM SET wal_level = logical"),
        "{problems:#?}"
    );
    assert!(slot::slot_state(&sql, &spec.slot).await.unwrap().is_none());
}

#[tokio::test]
async fn a_role_without_replication_is_reported_and_cannot_stream() {
    let s = setup().await;
    let role = pg::unique_name("norepl");
    s.sql
        .batch_execute(&format!("CREATE ROLE {role} LOGIN PASSWORD 'pw'"))
        .await
        .unwrap();
    let cfg = ConnectConfig::parse(&s.db.url_as(&role, "pw")).unwrap();
    let sql = slot::connect_sql(&cfg).await.unwrap();

    let problems = slot::check(&sql, &s.spec).await.unwrap();
    the_error(
        &problems,
        &format!("role \"{role}\" lacks the REPLICATION attribute"),
        &[&format!("ALTER ROLE \"{role}\" WITH REPLICATION")],
    );

    let err = start_err(&cfg, &sql, &s.spec).await;
    assert!(!err.is_transient(), "{err}");
    let ReaderError::Server(ref e) = err else {
        panic!("expected a server error, got {err:?}")
    };
    assert_eq!(e.code, "42501", "{err}");
    assert!(err.to_string().contains("WITH REPLICATION"), "{err}");

    // Granting it is the whole fix.
    s.sql
        .batch_execute(&format!("ALTER ROLE {role} WITH REPLICATION"))
        .await
        .unwrap();
    assert!(errors(&slot::check(&sql, &s.spec).await.unwrap()).is_empty());
    let r = ferry_wal::conn::start(&cfg, &sql, options(&s.spec, None))
        .await
        .unwrap();
    r.shutdown().await.unwrap();
    drop(sql);
    drop_role(&s.sql, &role).await;
}

/// Without CONNECT on the database the server refuses both connections, the SQL one and the
/// replication one, with no hint of its own: each error carries the GRANT.
#[tokio::test]
async fn a_role_without_connect_is_refused_with_the_grant() {
    let s = setup().await;
    let role = pg::unique_name("noconnect");
    s.sql
        .batch_execute(&format!(
            "REVOKE CONNECT ON DATABASE {db} FROM PUBLIC; CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'pw'",
            db = s.db.name
        ))
        .await
        .unwrap();
    let cfg = ConnectConfig::parse(&s.db.url_as(&role, "pw")).unwrap();
    let grant = format!(
        "run GRANT CONNECT ON DATABASE \"{}\" TO \"{role}\"",
        s.db.name
    );
    let err = slot::connect_sql(&cfg).await.unwrap_err();
    assert!(!err.is_transient(), "{err}");
    let ReaderError::Server(ref e) = err else {
        panic!("expected the server's refusal, got {err:?}")
    };
    assert_eq!(e.code, "42501", "{err}");
    assert!(e.hint.as_deref().unwrap_or("").starts_with(&grant), "{err}");
    // The replication connection (the slot is looked at over the superuser's SQL connection).
    let err = start_err(&cfg, &s.sql, &s.spec).await;
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains(&grant), "{err}");
    drop_role(&s.sql, &role).await;
}

async fn drop_role(sql: &tokio_postgres::Client, role: &str) {
    // The role's sessions may still be closing.
    ferry_testkit::wait_until(
        &format!("DROP ROLE {role}"),
        Duration::from_secs(30),
        || async {
            sql.batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
                .await
                .is_ok()
        },
    )
    .await;
}

#[tokio::test]
async fn a_slot_streamed_by_another_reader_is_in_use_until_it_stops() {
    let s = setup().await;
    let first = start(&s).await;
    let err = start_err(&s.cfg, &s.sql, &s.spec).await;
    assert!(err.is_transient(), "{err}");
    match &err {
        ReaderError::SlotInUse { slot, pid } => {
            assert_eq!(slot, &s.spec.slot);
            assert_eq!(*pid, first.backend_pid);
        }
        other => panic!("expected SlotInUse, got {other:?}"),
    }
    assert!(err.to_string().contains("pg_terminate_backend"), "{err}");
    let problems = slot::check(&s.sql, &s.spec).await.unwrap();
    assert!(errors(&problems).is_empty(), "{problems:#?}");
    assert!(problems
        .iter()
        .any(|p| p.severity == Severity::Warning && p.what.contains("being streamed")));

    first.shutdown().await.unwrap();
    wait_released(&s.sql, &s.spec.slot).await;
    let mut second = start(&s).await;
    insert_and_expect_note(&s.sql, &mut second, "second").await;
    second.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_invalidated_slot_is_reported_and_never_streamed() {
    let cluster = PgCluster::start(ClusterOptions {
        tls: false,
        // Later lines win over the harness's `max_slot_wal_keep_size = -1`.
        extra_conf: vec!["max_slot_wal_keep_size = '1MB'".into()],
    })
    .await;
    let url = cluster.url("postgres");
    let sql = pg::connect(&url).await;
    sql.batch_execute(OUTBOX_DDL).await.unwrap();
    let spec = spec();
    slot::ensure(&sql, &spec).await.unwrap();
    invalidate(&sql, &spec.slot).await;

    let problems = slot::check(&sql, &spec).await.unwrap();
    the_error(
        &problems,
        "was invalidated (wal_status = lost)",
        &["pg_drop_replication_slot", "max_slot_wal_keep_size"],
    );
    let err = slot::ensure(&sql, &spec).await.unwrap_err();
    assert!(!err.is_transient());
    the_error(
        &problems_of(err),
        "was invalidated",
        &["pg_drop_replication_slot"],
    );

    let cfg = ConnectConfig::parse(&url).unwrap();
    let err = start_err(&cfg, &sql, &spec).await;
    assert!(!err.is_transient(), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("was invalidated"), "{msg}");
    assert!(msg.contains("pg_drop_replication_slot"), "{msg}");

    // Invalidated between the reader's look at the slot and START_REPLICATION: the server
    // refuses, and the error still says how to recover.
    let spec = SlotSpec {
        slot: pg::unique_name("slot"),
        ..spec
    };
    slot::ensure(&sql, &spec).await.unwrap();
    let other = pg::connect(&url).await;
    let slot_name = spec.slot.clone();
    let (cfg, proxy) = proxy_once(&cfg, async move {
        invalidate(&other, &slot_name).await;
    })
    .await;
    let err = start_err(&cfg, &sql, &spec).await;
    proxy.await.unwrap();
    assert!(!err.is_transient(), "{err}");
    let ReaderError::Server(ref e) = err else {
        panic!("expected the server's refusal, got {err:?}")
    };
    assert_eq!(e.code, "55000");
    assert!(
        e.detail.as_deref().unwrap_or("").contains("invalidated"),
        "{err}"
    );
    assert!(
        e.hint
            .as_deref()
            .unwrap_or("")
            .contains("pg_drop_replication_slot"),
        "{err}"
    );
}

/// Writes WAL until `slot` is invalidated. Each round fills and leaves a 16 MB segment; the
/// checkpoint removes WAL past the 1 MB the slot may keep (`max_slot_wal_keep_size`).
async fn invalidate(sql: &tokio_postgres::Client, slot: &str) {
    ferry_testkit::wait_until("wal_status = 'lost'", Duration::from_secs(120), || async {
        sql.batch_execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
               SELECT 'a', g::text, 't', jsonb_build_object('n', g, 'pad', repeat('x', 200))
               FROM generate_series(1, 5000) g;
             SELECT pg_switch_wal();
             CHECKPOINT;",
        )
        .await
        .unwrap();
        let state = slot::slot_state(sql, slot).await.unwrap().unwrap();
        state.wal_status.as_deref() == Some("lost")
    })
    .await;
}

/// A TCP proxy to `cfg`'s server for one connection, which runs `before` when the connection
/// arrives and only then lets it through: a way to change the server's state inside the
/// reader's start-up, between its look at the slot and `START_REPLICATION`. Returns the
/// configuration that goes through the proxy and the proxy's task, which ends with `before`'s
/// output when the connection closes.
async fn proxy_once<F>(
    cfg: &ConnectConfig,
    before: F,
) -> (ConnectConfig, tokio::task::JoinHandle<F::Output>)
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    use ferry_wal::conn::config::Host;
    let Host::Tcp(host) = cfg.host.clone() else {
        panic!("the test server must be reachable over TCP")
    };
    let port = cfg.port;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut proxied = cfg.clone();
    proxied.host = Host::Tcp("127.0.0.1".into());
    proxied.port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (mut client, _) = listener.accept().await.unwrap();
        let out = before.await;
        let mut server = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .unwrap();
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        out
    });
    (proxied, task)
}

#[tokio::test]
async fn a_publication_without_the_outbox_table_is_reported() {
    let (_db, sql) = bare().await;
    sql.batch_execute(
        "CREATE TABLE other (x int); CREATE PUBLICATION ferry_outbox FOR TABLE other",
    )
    .await
    .unwrap();
    let spec = spec();
    // An existing publication is never altered by ensure(): the operator owns it.
    let err = slot::ensure(&sql, &spec).await.unwrap_err();
    let problems = problems_of(err);
    let whats: Vec<&str> = errors(&problems).iter().map(|p| p.what.as_str()).collect();
    assert_eq!(whats.len(), 2, "{problems:#?}");
    assert!(
        whats[0].starts_with(
            "publication \"ferry_outbox\" does not include table \"public\".\"outbox\""
        ) && whats[1]
            .starts_with("publication \"ferry_outbox\" includes table \"public\".\"other\""),
        "{problems:#?}"
    );
    sql.batch_execute("ALTER PUBLICATION ferry_outbox ADD TABLE outbox")
        .await
        .unwrap();
    // `other` is still listed, and no entry relays it: its rows would be skipped.
    the_error(
        &slot::check(&sql, &spec).await.unwrap(),
        "publication \"ferry_outbox\" includes table \"public\".\"other\", which no [outbox] or [[tables]] entry relays",
        &["ALTER PUBLICATION \"ferry_outbox\" DROP TABLE \"public\".\"other\""],
    );
    sql.batch_execute("ALTER PUBLICATION ferry_outbox DROP TABLE other")
        .await
        .unwrap();
    assert!(errors(&slot::check(&sql, &spec).await.unwrap()).is_empty());
}

/// What a session watches while streaming: the identity changes whenever the table was out of
/// the publication, however briefly, and whichever way the publication covers it.
#[tokio::test]
async fn the_publication_membership_changes_whenever_the_table_was_out_of_it() {
    let (_db, sql) = bare().await;
    let spec = spec();
    async fn membership(sql: &tokio_postgres::Client, spec: &SlotSpec) -> Option<String> {
        let mut tables = slot::publication_membership(sql, spec).await.unwrap();
        assert_eq!(tables.len(), 1);
        tables.remove(0)
    }
    let recreate = format!("DROP TABLE outbox; {OUTBOX_DDL}");
    assert_eq!(membership(&sql, &spec).await, None, "no publication yet");

    sql.batch_execute("CREATE PUBLICATION ferry_outbox FOR TABLE outbox")
        .await
        .unwrap();
    let listed = membership(&sql, &spec).await.expect("listed by name");
    assert_eq!(membership(&sql, &spec).await.as_ref(), Some(&listed));
    sql.batch_execute("ALTER PUBLICATION ferry_outbox DROP TABLE outbox")
        .await
        .unwrap();
    assert_eq!(membership(&sql, &spec).await, None, "taken out");
    sql.batch_execute("ALTER PUBLICATION ferry_outbox ADD TABLE outbox")
        .await
        .unwrap();
    let back = membership(&sql, &spec).await.expect("added back");
    assert_ne!(back, listed, "added back is another membership");
    sql.batch_execute(&recreate).await.unwrap();
    assert_eq!(membership(&sql, &spec).await, None, "recreated: not listed");

    sql.batch_execute(
        "DROP PUBLICATION ferry_outbox; CREATE PUBLICATION ferry_outbox FOR ALL TABLES",
    )
    .await
    .unwrap();
    let all = membership(&sql, &spec).await.expect("all tables");
    sql.batch_execute(&recreate).await.unwrap();
    assert_eq!(
        membership(&sql, &spec).await,
        Some(all),
        "FOR ALL TABLES covers a recreated table from its creation: no gap"
    );

    if slot::server_version_num(&sql).await.unwrap() >= 150000 {
        sql.batch_execute(
            "DROP PUBLICATION ferry_outbox; CREATE PUBLICATION ferry_outbox FOR TABLES IN SCHEMA public",
        )
        .await
        .unwrap();
        let schema = membership(&sql, &spec).await.expect("by schema");
        sql.batch_execute(&recreate).await.unwrap();
        assert_eq!(
            membership(&sql, &spec).await.as_ref(),
            Some(&schema),
            "a schema covers a recreated table from its creation"
        );
        sql.batch_execute(
            "ALTER PUBLICATION ferry_outbox DROP TABLES IN SCHEMA public;
             ALTER PUBLICATION ferry_outbox ADD TABLES IN SCHEMA public",
        )
        .await
        .unwrap();
        let schema_again = membership(&sql, &spec).await.expect("by schema");
        assert_ne!(
            schema, schema_again,
            "the schema was out of the publication"
        );
    }
}

#[tokio::test]
async fn a_missing_publication_is_reported_when_ferry_may_not_create_it() {
    let (_db, sql) = bare().await;
    let spec = SlotSpec {
        create_publication: false,
        ..spec()
    };
    let err = slot::ensure(&sql, &spec).await.unwrap_err();
    assert!(!err.is_transient());
    the_error(
        &problems_of(err),
        "publication \"ferry_outbox\" does not exist",
        &[
            "CREATE PUBLICATION \"ferry_outbox\" FOR TABLE \"public\".\"outbox\"",
            "postgres.create_publication = true",
        ],
    );
    let exists: bool = sql
        .query_one("SELECT EXISTS (SELECT 1 FROM pg_publication)", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!exists, "create_publication = false must not create it");
}

#[tokio::test]
async fn a_missing_table_is_reported_with_its_key() {
    let db = pg::shared().create_db().await;
    let sql = db.client().await;
    let spec = spec();
    let err = slot::ensure(&sql, &spec).await.unwrap_err();
    let problems = problems_of(err);
    let errs = errors(&problems);
    assert_eq!(errs.len(), 1, "{problems:#?}");
    assert!(errs[0]
        .what
        .contains("table \"public\".\"outbox\" does not exist"));
    assert!(errs[0].fix.contains("outbox.table"));
    // Checked before anything is created: neither the publication nor the slot (which would
    // retain WAL for a Ferry that never started).
    let (slots, publications): (i64, i64) = {
        let r = sql
            .query_one(
                "SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1), \
                        (SELECT count(*) FROM pg_publication)",
                &[&spec.slot],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((slots, publications), (0, 0));
}

#[tokio::test]
async fn a_missing_required_column_is_reported_with_its_key_and_the_columns() {
    let (_db, sql) = bare().await;
    let mut spec = spec();
    spec.tables[0].required_columns.push(RequiredColumn {
        name: "event_key".into(),
        config_key: "outbox.key_column".into(),
        accepted_types: None,
    });
    let err = slot::ensure(&sql, &spec).await.unwrap_err();
    the_error(
        &problems_of(err),
        "has no column \"event_key\" (named by outbox.key_column)",
        &["set outbox.key_column to one of its columns", "aggregateid"],
    );
}

#[tokio::test]
async fn a_required_column_of_an_unsupported_type_is_reported() {
    let db = pg::shared().create_db().await;
    let sql = db.client().await;
    sql.batch_execute(&OUTBOX_DDL.replace("payload jsonb", "payload int"))
        .await
        .unwrap();
    let mut spec = spec();
    for c in &mut spec.tables[0].required_columns {
        if c.name == "payload" {
            c.config_key = "outbox.payload_column".into();
            c.accepted_types = Some(AcceptedTypes {
                oids: PAYLOAD_TYPES.to_vec(),
                fix: "use a column of type jsonb or text".into(),
            });
        }
    }
    let err = slot::ensure(&sql, &spec).await.unwrap_err();
    the_error(
        &problems_of(err),
        "column \"public\".\"outbox\".payload (outbox.payload_column) is of type integer",
        // The fix is the caller's, word for word.
        &["use a column of type jsonb or text"],
    );
    sql.batch_execute("ALTER TABLE outbox ALTER COLUMN payload TYPE jsonb USING to_jsonb(payload)")
        .await
        .unwrap();
    assert!(errors(&slot::check(&sql, &spec).await.unwrap()).is_empty());
}

/// `confirmed_flush_lsn` moves between the reader's read of the slot and its
/// `START_REPLICATION`: the replication connection goes through a proxy that advances the slot
/// before it lets the connection through, which is exactly that window.
#[tokio::test]
async fn a_slot_advanced_behind_the_readers_back_stops_it() {
    let s = setup().await;
    let other = s.db.client().await;
    let slot_name = s.spec.slot.clone();
    let (cfg, proxy) = proxy_once(&s.cfg, async move {
        other
            .batch_execute("INSERT INTO outbox (aggregatetype, aggregateid, type, note) VALUES ('a','1','t','skipped')")
            .await
            .unwrap();
        let row = other
            .query_one(
                "SELECT end_lsn::text FROM pg_replication_slot_advance($1, pg_current_wal_lsn())",
                &[&slot_name],
            )
            .await
            .unwrap();
        row.get::<_, String>(0)
    })
    .await;
    let before = slot_confirmed(&s.sql, &s.spec.slot).await;
    let err = start_err(&cfg, &s.sql, &s.spec).await;
    let advanced: ferry_wal::Lsn = proxy.await.unwrap().parse().unwrap();
    assert!(advanced > before);
    match &err {
        ReaderError::SlotAdvancedPastResume {
            slot,
            resume,
            confirmed,
        } => {
            assert_eq!(slot, &s.spec.slot);
            assert_eq!(*resume, before);
            assert_eq!(*confirmed, advanced);
        }
        other => panic!("expected SlotAdvancedPastResume, got {other:?}"),
    }
    assert!(!err.is_transient());
    assert!(err
        .to_string()
        .contains("restart Ferry to accept the new position"));
    // Restarting accepts the new position: the skipped row is gone, later ones arrive.
    let mut r = start(&s).await;
    assert_eq!(r.resume_lsn, advanced);
    insert_and_expect_note(&s.sql, &mut r, "after").await;
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn rows_inserted_into_partitions_arrive_under_the_partitioned_tables_name() {
    let db = pg::shared().create_db().await;
    let sql = db.client().await;
    sql.batch_execute(
        "CREATE TABLE outbox (
            id uuid NOT NULL DEFAULT gen_random_uuid(),
            aggregatetype text NOT NULL,
            aggregateid text NOT NULL,
            type text NOT NULL,
            payload jsonb,
            note text,
            PRIMARY KEY (aggregatetype, id)
         ) PARTITION BY LIST (aggregatetype);
         CREATE TABLE outbox_order PARTITION OF outbox FOR VALUES IN ('order');
         CREATE TABLE outbox_rest PARTITION OF outbox DEFAULT;",
    )
    .await
    .unwrap();
    let spec = spec();
    slot::ensure(&sql, &spec).await.unwrap();
    let via_root: bool = sql
        .query_one(
            "SELECT pubviaroot FROM pg_publication WHERE pubname = 'ferry_outbox'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(via_root, "ensure() publishes through the partition root");
    let cfg = ConnectConfig::parse(&db.url).unwrap();
    let mut r = ferry_wal::conn::start(&cfg, &sql, options(&spec, None))
        .await
        .unwrap();
    sql.batch_execute(
        "BEGIN;
         INSERT INTO outbox (aggregatetype, aggregateid, type, note) VALUES ('order','1','t','routed');
         INSERT INTO outbox_rest (aggregatetype, aggregateid, type, note) VALUES ('invoice','2','t','direct');
         COMMIT;",
    )
    .await
    .unwrap();
    let t = next_txn(&mut r).await;
    let notes: Vec<_> = t.rows.iter().map(|r| text(r, "note").unwrap()).collect();
    assert_eq!(notes, ["routed", "direct"]);
    for row in &t.rows {
        assert_eq!(
            (row.relation.namespace.as_str(), row.relation.name.as_str()),
            ("public", "outbox")
        );
    }
    r.shutdown().await.unwrap();

    // A publication that publishes per partition would deliver rows under the partitions'
    // names, which the reader would not recognise: check() says so.
    sql.batch_execute("ALTER PUBLICATION ferry_outbox SET (publish_via_partition_root = false)")
        .await
        .unwrap();
    the_error(
        &slot::check(&sql, &spec).await.unwrap(),
        "is partitioned but publication \"ferry_outbox\" publishes per partition",
        &["SET (publish_via_partition_root = true)"],
    );
}

#[tokio::test]
async fn exhausted_slots_and_wal_senders_are_permanent_errors_with_their_fix() {
    let cluster = PgCluster::start(ClusterOptions {
        tls: false,
        extra_conf: vec![
            "max_replication_slots = 2".into(),
            "max_wal_senders = 1".into(),
        ],
    })
    .await;
    let url = cluster.url("postgres");
    let sql = pg::connect(&url).await;
    sql.batch_execute(OUTBOX_DDL).await.unwrap();
    let spec = spec();
    slot::ensure(&sql, &spec).await.unwrap();
    sql.batch_execute("SELECT pg_create_logical_replication_slot('filler', 'pgoutput')")
        .await
        .unwrap();

    // Both slots are taken: a second Ferry's slot cannot be created, and check says so first.
    let second = SlotSpec {
        slot: "second".into(),
        ..spec.clone()
    };
    let problems = slot::check(&sql, &second).await.unwrap();
    the_error(
        &problems,
        "all 2 replication slots are in use",
        &["pg_drop_replication_slot", "max_replication_slots"],
    );
    assert!(
        problems.iter().any(|p| p.severity == Severity::Note
            && p.what == "replication slots: 2 of 2 in use; WAL senders: 0 of 1 in use"),
        "{problems:#?}"
    );
    let err = slot::ensure(&sql, &second).await.unwrap_err();
    assert!(!err.is_transient(), "{err}");
    assert!(
        err.to_string().contains("pg_drop_replication_slot"),
        "{err}"
    );

    // The one WAL sender streams Ferry's slot: another slot cannot be streamed, permanently.
    let cfg = ConnectConfig::parse(&url).unwrap();
    let first = ferry_wal::conn::start(&cfg, &sql, options(&spec, None))
        .await
        .unwrap();
    let filler = SlotSpec {
        slot: "filler".into(),
        ..spec.clone()
    };
    let problems = slot::check(&sql, &filler).await.unwrap();
    the_error(
        &problems,
        "all 1 WAL senders are in use",
        &["pg_stat_replication", "max_wal_senders"],
    );
    let err = start_err(&cfg, &sql, &filler).await;
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("max_wal_senders"), "{err}");
    // The slot being streamed is not reported as lacking a sender: it has one.
    assert!(errors(&slot::check(&sql, &spec).await.unwrap()).is_empty());
    first.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_failover_slot_is_checked_for_what_it_needs_on_every_version() {
    let s = setup().await;
    let version = slot::server_version_num(&s.sql).await.unwrap();
    let spec = SlotSpec {
        failover: true,
        ..s.spec.clone()
    };
    let problems = slot::check(&s.sql, &spec).await.unwrap();
    if version < 170000 {
        the_error(
            &problems,
            "postgres.failover_slot needs PostgreSQL 17 or later",
            &["postgres.failover_slot = false"],
        );
        return;
    }
    // 17+: the existing slot is made a failover slot when streaming starts, and without
    // synchronized_standby_slots a failover could erase what Ferry already published.
    assert!(errors(&problems).is_empty(), "{problems:#?}");
    assert!(
        problems.iter().any(|p| p.severity == Severity::Note
            && p.what.contains("is not a failover slot")
            && p.fix.contains("ALTER_REPLICATION_SLOT")),
        "{problems:#?}"
    );
    assert!(
        problems.iter().any(|p| p.severity == Severity::Warning
            && p.what.contains("synchronized_standby_slots is empty")
            && p.what.contains("phantom")),
        "{problems:#?}"
    );
    let cfg = s.cfg.clone();
    let r = ferry_wal::conn::start(&cfg, &s.sql, options(&spec, None))
        .await
        .unwrap();
    let state = slot::slot_state(&s.sql, &spec.slot).await.unwrap().unwrap();
    assert_eq!(state.failover, Some(true), "made a failover slot");
    r.shutdown().await.unwrap();
}

/// Several outbox tables: one publication for all, each table checked and watched on its own.
#[tokio::test]
async fn several_tables_share_the_publication_and_are_checked_each() {
    let (_db, sql) = bare().await;
    sql.batch_execute(
        "CREATE SCHEMA billing; CREATE TABLE billing.events (event_id bigint, body text)",
    )
    .await
    .unwrap();
    let mut spec = spec();
    spec.tables.push(TableSpec {
        required_columns: vec![RequiredColumn {
            name: "body".into(),
            config_key: "tables[0].outbox.payload_column".into(),
            accepted_types: None,
        }],
        config_key: "tables[0].outbox.table".into(),
        ..TableSpec::new("billing", "events")
    });
    slot::ensure(&sql, &spec).await.unwrap();
    let published: Vec<String> = sql
        .query(
            "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = 'ferry_outbox' ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(published, ["billing.events", "public.outbox"]);
    let membership = slot::publication_membership(&sql, &spec).await.unwrap();
    assert!(membership.iter().all(Option::is_some), "{membership:?}");

    // Taken out: only its own identity changes, and check names it. An existing publication is
    // never altered, even when Ferry may create one: the fix is the operator's.
    sql.batch_execute("ALTER PUBLICATION ferry_outbox DROP TABLE billing.events")
        .await
        .unwrap();
    let now = slot::publication_membership(&sql, &spec).await.unwrap();
    assert_eq!((&now[0], &now[1]), (&membership[0], &None));
    let err = slot::ensure(&sql, &spec).await.unwrap_err();
    the_error(
        &problems_of(err),
        "publication \"ferry_outbox\" does not include table \"billing\".\"events\"",
        &["ALTER PUBLICATION \"ferry_outbox\" ADD TABLE \"billing\".\"events\""],
    );
    sql.batch_execute("ALTER PUBLICATION ferry_outbox ADD TABLE billing.events")
        .await
        .unwrap();
    slot::ensure(&sql, &spec).await.unwrap();
    let back = slot::publication_membership(&sql, &spec).await.unwrap();
    assert!(back[1].is_some() && back[1] != membership[1], "{back:?}");

    // A column the second table's mapping reads is missing: named by that entry's key.
    spec.tables[1].required_columns[0].name = "payload".into();
    the_error(
        &slot::check(&sql, &spec).await.unwrap(),
        "table \"billing\".\"events\" has no column \"payload\" (named by tables[0].outbox.payload_column)",
        &["event_id, body"],
    );
    // A missing second table is named with its key.
    spec.tables[1].table = "nope".into();
    let problems = slot::check(&sql, &spec).await.unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p.what.contains("\"billing\".\"nope\" does not exist")
                && p.fix
                    .contains("point tables[0].outbox.table at your outbox")),
        "{problems:#?}"
    );
}
