//! Builders shared by the core's integration tests: a real router, and the outbox events the
//! reader would hand the core (pgoutput text format, the default outbox columns).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_core::{Action, Relay, RelayConfig, SinkError};
use ferry_router::{oid, OnError, OutboxConfig, RouteConfig, Router, Routers};
use ferry_wal::assembly::{OutboxEvent, OutboxRow, RelationInfo, TxnBegin, TxnCommit};
use ferry_wal::pgoutput::{Column, ReplicaIdentity, TupleValue};
use ferry_wal::{Lsn, PgTimestamp};

pub const DEAD_LETTER_TOPIC: &str = "outbox.dead-letter";

pub fn router(on_error: OnError) -> Arc<Routers> {
    let route = RouteConfig {
        on_error,
        dead_letter_topic: (on_error == OnError::DeadLetter).then(|| DEAD_LETTER_TOPIC.to_string()),
        ..RouteConfig::default()
    };
    Arc::new(Routers::single(
        Router::new(&OutboxConfig::default(), &route).unwrap(),
    ))
}

pub fn config(on_error: OnError, records: u64, bytes: u64) -> RelayConfig {
    RelayConfig {
        routers: router(on_error),
        max_in_flight_records: records,
        max_in_flight_bytes: bytes,
        drain_timeout: Duration::from_secs(5),
        session_drain_timeout: Some(Duration::from_secs(60)),
        exactly_once: false,
    }
}

/// The outbox table's layout, with `payload` of type `payload_oid`.
pub fn relation(payload_oid: u32) -> Arc<RelationInfo> {
    let col = |name: &str, type_oid| Column {
        flags: 0,
        name: name.to_string(),
        type_oid,
        type_modifier: -1,
    };
    Arc::new(RelationInfo {
        oid: 16_384,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: ReplicaIdentity::Default,
        columns: vec![
            col("id", oid::UUID),
            col("aggregatetype", oid::TEXT),
            col("aggregateid", oid::TEXT),
            col("type", oid::TEXT),
            col("payload", payload_oid),
        ],
    })
}

pub fn begin(xid: u32, commit_lsn: u64) -> OutboxEvent {
    OutboxEvent::Begin(TxnBegin {
        xid,
        commit_lsn: Lsn(commit_lsn),
        commit_time: PgTimestamp(800_000_000_000_000),
    })
}

pub fn commit(xid: u32, commit_lsn: u64, end_lsn: u64) -> OutboxEvent {
    OutboxEvent::Commit(TxnCommit {
        xid,
        commit_lsn: Lsn(commit_lsn),
        end_lsn: Lsn(end_lsn),
        commit_time: PgTimestamp(800_000_000_000_000),
        rows: 0,
    })
}

/// An outbox row with event id number `id`, aggregate id `key` and `payload` (`None`: NULL,
/// which the router rejects).
pub fn row(
    rel: &Arc<RelationInfo>,
    xid: u32,
    lsn: u64,
    id: u64,
    key: &str,
    payload: Option<&str>,
) -> OutboxEvent {
    let text = |s: String| TupleValue::Text(Bytes::from(s));
    OutboxEvent::Row(OutboxRow {
        xid,
        table: 0,
        lsn: Lsn(lsn),
        relation: rel.clone(),
        values: vec![
            text(format!("00000000-0000-4000-8000-{id:012x}")),
            text("order".into()),
            text(key.to_string()),
            text("OrderCreated".into()),
            payload.map_or(TupleValue::Null, |p| text(p.to_string())),
        ]
        .into(),
    })
}

/// Every action queued now.
pub fn actions<E>(relay: &mut Relay<E>) -> Vec<Action<E>> {
    std::iter::from_fn(|| relay.poll_action()).collect()
}

/// The sink's error in the core's tests: what failed, and whether writing again may succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestError {
    pub what: &'static str,
    pub transient: bool,
}

impl TestError {
    pub const fn transient(what: &'static str) -> TestError {
        TestError {
            what,
            transient: true,
        }
    }

    pub const fn permanent(what: &'static str) -> TestError {
        TestError {
            what,
            transient: false,
        }
    }
}

impl std::fmt::Display for TestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.what)
    }
}

impl SinkError for TestError {
    fn is_transient(&self) -> bool {
        self.transient
    }

    fn abandoned() -> Self {
        TestError::transient("abandoned by the core")
    }
}
