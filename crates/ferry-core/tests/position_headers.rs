//! `route.position_headers`: every record the relay core produces says where it comes from
//! (`ferry-source`) and where in the WAL (`ferry-position`, commit LSN and index among the
//! transaction's outbox events), the same on every replay; without the setting, no record says
//! anything of the kind.

mod common;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use common::*;
use ferry_core::progress_record::{Mode, Partial, ProgressRecord};
use ferry_core::source_position::{source_id, SourcePosition, POSITION_HEADER, SOURCE_HEADER};
use ferry_core::{Action, Relay};
use ferry_router::{oid, OnError, OutboxConfig, RouteConfig, Routers, TableConfig};
use ferry_wal::assembly::{OutboxEvent, OutboxMessage};
use ferry_wal::Lsn;

type R = Relay<String>;

const SOURCE: &str = "7312345678901234567/1/ferry";

/// The first table dead-letters what it cannot route and routes table-less messages; the
/// second (`billing.outbox`, topic `billing`) skips what it cannot route.
fn routers(position_headers: bool) -> Arc<Routers> {
    let billing = TableConfig {
        outbox: OutboxConfig {
            table: "billing.outbox".into(),
            ..OutboxConfig::default()
        },
        route: RouteConfig {
            topic: Some("billing".into()),
            on_error: OnError::Skip,
            ..RouteConfig::default()
        },
    };
    let outbox = OutboxConfig {
        message_prefix: Some("outbox".into()),
        ..OutboxConfig::default()
    };
    let route = RouteConfig {
        on_error: OnError::DeadLetter,
        dead_letter_topic: Some(DEAD_LETTER_TOPIC.into()),
        position_headers,
        ..RouteConfig::default()
    };
    Arc::new(Routers::new(&outbox, &route, &[billing]).unwrap())
}

fn relay(position_headers: bool) -> R {
    let mut cfg = config(OnError::Fail, 1_000, 1 << 30);
    cfg.routers = routers(position_headers);
    Relay::new(cfg)
}

fn of_table(table: usize, ev: OutboxEvent) -> OutboxEvent {
    match ev {
        OutboxEvent::Row(mut row) => {
            row.table = table;
            OutboxEvent::Row(row)
        }
        other => other,
    }
}

fn message(xid: u32, lsn: u64, id: u64) -> OutboxEvent {
    let doc = format!(
        r#"{{"id": "m-{id}", "aggregatetype": "order", "aggregateid": "k", "type": "T", "payload": {{}}}}"#
    );
    OutboxEvent::Message(OutboxMessage {
        xid,
        lsn: Lsn(lsn),
        message_lsn: Lsn(lsn),
        content: Bytes::from(doc),
    })
}

/// A transaction with commit LSN `0/16B3748` across both tables, with a message, a row the
/// second table skips and a row the first dead-letters; then a second transaction.
fn two_transactions() -> Vec<OutboxEvent> {
    let rel = relation(oid::JSONB);
    vec![
        begin(1, 0x16B_3748),
        row(&rel, 1, 0x16B_3700, 1, "k", Some("{}")), // 0: outbox
        of_table(1, row(&rel, 1, 0x16B_3710, 2, "k", Some("{}"))), // 1: billing
        of_table(1, row(&rel, 1, 0x16B_3718, 3, "k", None)), // 2: billing skips it
        message(1, 0x16B_3720, 4),                    // 3: a table-less message
        row(&rel, 1, 0x16B_3728, 5, "k", None),       // 4: dead-lettered
        of_table(1, row(&rel, 1, 0x16B_3730, 6, "k", Some("{}"))), // 5: billing
        commit(1, 0x16B_3748, 0x16B_3780),
        begin(2, 0x1_0000_0010),
        of_table(1, row(&rel, 2, 0x1_0000_0000, 7, "k", Some("{}"))), // 0: billing
        row(&rel, 2, 0x1_0000_0008, 8, "k", Some("{}")),              // 1: outbox
        commit(2, 0x1_0000_0010, 0x1_0000_0040),
    ]
}

/// Each produced record: its topic, and its position headers' values as text.
fn stamped(r: &mut R, events: Vec<OutboxEvent>) -> Vec<(String, Option<String>, Option<String>)> {
    let now = Instant::now();
    let mut out = Vec::new();
    for ev in events {
        r.handle_outbox(ev, now);
        while let Some(a) = r.poll_action() {
            if let Action::Produce { token, record } = a {
                let header = |name: &str| {
                    let mut values = record.headers.iter().filter(|(n, _)| &**n == name);
                    let v = values
                        .next()
                        .map(|(_, v)| String::from_utf8(v.as_deref().unwrap().to_vec()).unwrap());
                    assert!(values.next().is_none(), "one {name} header: {record:?}");
                    v
                };
                out.push((
                    record.topic.to_string(),
                    header(SOURCE_HEADER),
                    header(POSITION_HEADER),
                ));
                r.handle_report(token, Ok(()), now);
            }
        }
    }
    out
}

fn positions(records: &[(String, Option<String>, Option<String>)]) -> Vec<(&str, &str)> {
    records
        .iter()
        .map(|(t, _, p)| (t.as_str(), p.as_deref().unwrap()))
        .collect()
}

#[test]
fn every_record_carries_its_source_and_its_place_among_its_transactions_events() {
    let mut r = relay(true);
    r.set_source(&source_id("7312345678901234567", 1, "ferry"));
    r.start(Lsn(100), false);
    let got = stamped(&mut r, two_transactions());
    assert!(got.iter().all(|(_, s, _)| s.as_deref() == Some(SOURCE)));
    // Every outbox event counts, across tables, whatever became of it: index 2 (skipped by the
    // billing table) is missing, index 4 went to the dead-letter topic with its position.
    assert_eq!(
        positions(&got),
        [
            ("outbox.event.order", "0/16B3748:0"),
            ("billing", "0/16B3748:1"),
            ("outbox.event.order", "0/16B3748:3"),
            (DEAD_LETTER_TOPIC, "0/16B3748:4"),
            ("billing", "0/16B3748:5"),
            ("billing", "1/10:0"),
            ("outbox.event.order", "1/10:1"),
        ]
    );
    // In the order produced, positions strictly increase, and parse back.
    let parsed: Vec<SourcePosition> = got
        .iter()
        .map(|(_, _, p)| SourcePosition::parse(p.as_deref().unwrap().as_bytes()).unwrap())
        .collect();
    assert!(parsed.windows(2).all(|w| w[0] < w[1]), "{parsed:?}");
}

#[test]
fn a_replayed_transaction_carries_the_positions_of_its_first_copy_and_the_new_timeline() {
    let mut r = relay(true);
    r.set_source(SOURCE);
    r.start(Lsn(100), false);
    let first = stamped(&mut r, two_transactions());
    // The next session (the same relay: a reconnect) starts before the slot moved, so the
    // server replays everything; it is on the promoted standby's timeline.
    r.set_source(&source_id("7312345678901234567", 2, "ferry"));
    r.start(Lsn(100), false);
    let again = stamped(&mut r, two_transactions());
    assert_eq!(positions(&again), positions(&first));
    assert!(again
        .iter()
        .all(|(_, s, _)| s.as_deref() == Some("7312345678901234567/2/ferry")));
    // Ferry restarted (a new relay): the same again.
    let mut r = relay(true);
    r.set_source(SOURCE);
    r.start(Lsn(100), false);
    assert_eq!(
        positions(&stamped(&mut r, two_transactions())),
        positions(&first)
    );
}

#[test]
fn exactly_once_skips_what_kafka_holds_and_the_rest_keep_their_indices() {
    let mut cfg = config(OnError::Fail, 1_000, 1 << 30);
    cfg.routers = routers(true);
    cfg.exactly_once = true;
    let mut r: R = Relay::new(cfg);
    r.set_source(SOURCE);
    // Kafka holds the first transaction's first three events.
    let remembered = ProgressRecord {
        partial: Some(Partial {
            commit_lsn: Lsn(0x16B_3748),
            events: 3,
        }),
        ..ProgressRecord::whole(Mode::ExactlyOnce, 1, Lsn(100), 0)
    };
    r.start_from(Lsn(100), false, Some(remembered));
    let got = stamped(&mut r, two_transactions());
    assert_eq!(
        positions(&got),
        [
            ("outbox.event.order", "0/16B3748:3"),
            (DEAD_LETTER_TOPIC, "0/16B3748:4"),
            ("billing", "0/16B3748:5"),
            ("billing", "1/10:0"),
            ("outbox.event.order", "1/10:1"),
        ]
    );
}

#[test]
fn off_by_default_no_record_carries_them() {
    let mut r = relay(false);
    r.set_source(SOURCE); // does nothing without the setting
    r.start(Lsn(100), false);
    let got = stamped(&mut r, two_transactions());
    assert_eq!(got.len(), 7);
    assert!(
        got.iter().all(|(_, s, p)| s.is_none() && p.is_none()),
        "{got:?}"
    );
    assert!(!RouteConfig::default().position_headers);
}
