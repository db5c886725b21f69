//! Shared set-up for the reader's tests against a real PostgreSQL.
#![allow(dead_code)]

use std::time::Duration;

use ferry_testkit::pg::{self, TestDb};
use ferry_wal::assembly::OutboxEvent;
use ferry_wal::conn::{ConnectConfig, ReaderEvent, ReaderHandle, StreamOptions};
use ferry_wal::pgoutput::TupleValue;
use ferry_wal::slot::{self, RequiredColumn, SlotSpec, TableSpec};
use ferry_wal::Lsn;

pub const OUTBOX_DDL: &str = "CREATE TABLE outbox (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregatetype text NOT NULL,
    aggregateid text NOT NULL,
    type text NOT NULL,
    payload jsonb,
    blob bytea,
    note text
)";

pub struct Setup {
    pub db: TestDb,
    pub sql: tokio_postgres::Client,
    pub cfg: ConnectConfig,
    pub spec: SlotSpec,
}

pub fn spec() -> SlotSpec {
    SlotSpec {
        slot: pg::unique_name("slot"),
        publication: "ferry_outbox".into(),
        tables: vec![TableSpec {
            required_columns: ["id", "aggregatetype", "aggregateid", "type", "payload"]
                .iter()
                .map(|c| RequiredColumn {
                    name: c.to_string(),
                    config_key: format!("outbox.{c}"),
                    accepted_types: None,
                })
                .collect(),
            ..TableSpec::new("public", "outbox")
        }],
        create_slot: true,
        failover: false,
        create_publication: true,
    }
}

/// A database with the outbox table, its publication and a slot.
pub async fn setup() -> Setup {
    setup_on(pg::shared().create_db().await).await
}

/// [`setup`] on a given database.
pub async fn setup_on(db: TestDb) -> Setup {
    let sql = db.client().await;
    sql.batch_execute(OUTBOX_DDL).await.unwrap();
    let spec = spec();
    slot::ensure(&sql, &spec).await.unwrap();
    let cfg = ConnectConfig::parse(&db.url).unwrap();
    Setup { db, sql, cfg, spec }
}

pub fn options(spec: &SlotSpec, prefix: Option<&str>) -> StreamOptions {
    StreamOptions {
        slot: spec.slot.clone(),
        publication: spec.publication.clone(),
        source: spec.outbox_source(prefix.map(Into::into)),
        status_interval: ferry_wal::conn::stream::DEFAULT_STATUS_INTERVAL,
        channel_capacity: 1024,
        binary: false,
        failover: spec.failover,
        // The longest pause, so that the tests read through it wherever a read ends inside
        // a transaction.
        pause_inside_transaction: ferry_wal::conn::stream::MAX_PAUSE_INSIDE_TRANSACTION,
        receive_timeout: Some(ferry_wal::conn::stream::DEFAULT_RECEIVE_TIMEOUT),
    }
}

pub async fn start(s: &Setup) -> ReaderHandle {
    ferry_wal::conn::start(&s.cfg, &s.sql, options(&s.spec, Some("outbox")))
        .await
        .unwrap()
}

/// The next outbox event (keepalives skipped), or a panic at the deadline.
pub async fn next_event(r: &mut ReaderHandle) -> OutboxEvent {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match tokio::time::timeout_at(deadline, r.recv()).await {
            Err(_) => panic!("no outbox event within 60s"),
            Ok(None) => panic!("reader ended: {:?}", "channel closed"),
            Ok(Some(ReaderEvent::Keepalive { .. })) => {}
            Ok(Some(ReaderEvent::Outbox(e))) => return e,
        }
    }
}

/// A whole transaction: its rows' `note` column values and its commit.
pub struct Txn {
    pub xid: u32,
    pub rows: Vec<ferry_wal::assembly::OutboxRow>,
    pub messages: Vec<ferry_wal::assembly::OutboxMessage>,
    pub end_lsn: Lsn,
    pub commit_lsn: Lsn,
}

/// The next transaction that carries outbox rows or messages. PostgreSQL 14 sends every
/// transaction, even one with no published change (DDL, writes to other tables), as an empty
/// Begin/Commit; 15 and later skip those. Either way the reader passes what the server sends.
pub async fn next_txn(r: &mut ReaderHandle) -> Txn {
    loop {
        let t = next_txn_or_empty(r).await;
        if !t.rows.is_empty() || !t.messages.is_empty() {
            return t;
        }
    }
}

/// The next transaction, empty or not.
pub async fn next_txn_or_empty(r: &mut ReaderHandle) -> Txn {
    let OutboxEvent::Begin(b) = next_event(r).await else {
        panic!("expected Begin")
    };
    let mut t = Txn {
        xid: b.xid,
        rows: vec![],
        messages: vec![],
        end_lsn: Lsn::ZERO,
        commit_lsn: b.commit_lsn,
    };
    loop {
        match next_event(r).await {
            OutboxEvent::Row(row) => t.rows.push(row),
            OutboxEvent::Message(m) => t.messages.push(m),
            OutboxEvent::Commit(c) => {
                assert_eq!(c.xid, b.xid);
                assert_eq!(c.commit_lsn, b.commit_lsn);
                t.end_lsn = c.end_lsn;
                return t;
            }
            OutboxEvent::Begin(_) => panic!("Begin inside a transaction"),
        }
    }
}

pub fn text(row: &ferry_wal::assembly::OutboxRow, col: &str) -> Option<String> {
    match row.get(col).unwrap_or_else(|| panic!("no column {col}")).1 {
        TupleValue::Null => None,
        TupleValue::Text(b) => Some(String::from_utf8(b.to_vec()).unwrap()),
        other => panic!("unexpected {other:?}"),
    }
}

pub async fn slot_confirmed(sql: &tokio_postgres::Client, slot: &str) -> Lsn {
    slot::slot_state(sql, slot)
        .await
        .unwrap()
        .unwrap()
        .confirmed_flush_lsn
}

/// Inserts one outbox row with `note` in its own transaction and asserts that the reader's next
/// transaction starts with that row.
pub async fn insert_and_expect_note(
    sql: &tokio_postgres::Client,
    r: &mut ReaderHandle,
    note: &str,
) {
    sql.execute(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, note) VALUES ('a', '1', 't', $1)",
        &[&note],
    )
    .await
    .unwrap();
    let t = next_txn(r).await;
    assert_eq!(text(&t.rows[0], "note").as_deref(), Some(note));
}

/// Waits until no walsender streams `slot_name` (a reader's walsender exits shortly after it).
#[allow(dead_code)] // not every test binary waits for a release
pub async fn wait_released(sql: &tokio_postgres::Client, slot_name: &str) {
    ferry_testkit::wait_until("the slot is released", Duration::from_secs(30), || async {
        slot::slot_state(sql, slot_name)
            .await
            .unwrap()
            .unwrap()
            .active_pid
            .is_none()
    })
    .await;
}
