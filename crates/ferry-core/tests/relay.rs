//! The relay core's decisions, one scenario per test, driven with the real router and the events
//! the reader would produce (no I/O, no clock: the time is a value passed in).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ferry_core::{Action, CoreError, Count, DeliveryKey, End, Relay, RouteErrorKind};
use ferry_router::{oid, OnError, OutboxConfig, RouteConfig, Router, Routers, TraceProblem};
use ferry_wal::Lsn;

type R = Relay<String>;

fn started(on_error: OnError, records: u64, bytes: u64, resume: u64) -> R {
    let mut r = Relay::new(config(on_error, records, bytes));
    r.start(Lsn(resume), false);
    r
}

fn produced(actions: &[Action<String>]) -> Vec<(DeliveryKey, String)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Produce { token, record } => Some((*token, record.topic.to_string())),
            _ => None,
        })
        .collect()
}

fn confirms(actions: &[Action<String>]) -> Vec<Lsn> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Confirm(l) => Some(*l),
            _ => None,
        })
        .collect()
}

fn stop(actions: Vec<Action<String>>) -> Option<Result<End, CoreError<String>>> {
    actions.into_iter().find_map(|a| match a {
        Action::Stop(r) => Some(*r),
        _ => None,
    })
}

/// The session stopped because the `table`-th outbox table's `payload` became an enum (type OID
/// 16400), which binary mode cannot read.
fn assert_text_needed(actions: Vec<Action<String>>, table: usize) {
    match stop(actions) {
        Some(Err(CoreError::TextNeeded {
            column,
            type_oid,
            table: t,
        })) => assert_eq!((column.as_str(), type_oid, t), ("payload", 16_400, table)),
        other => panic!("expected TextNeeded, got {other:?}"),
    }
}

fn counts(actions: &[Action<String>]) -> Vec<Count> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Count(c) => Some(*c),
            _ => None,
        })
        .collect()
}

#[test]
fn a_transaction_is_confirmed_only_once_every_record_is_acknowledged() {
    let now = Instant::now();
    let mut r = started(OnError::Fail, 100, 1 << 20, 100);
    let rel = relation(oid::JSONB);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 105, 1, "a", Some("{}")), now);
    r.handle_outbox(row(&rel, 1, 106, 2, "b", Some("{}")), now);
    r.handle_outbox(commit(1, 110, 120), now);
    let a = actions(&mut r);
    let p = produced(&a);
    assert_eq!(p.len(), 2);
    assert!(p.iter().all(|(_, t)| t == "outbox.event.order"));
    assert!(a
        .iter()
        .any(|x| matches!(x, Action::CommitPoint { end_lsn } if *end_lsn == Lsn(120))));
    assert!(confirms(&a).is_empty(), "nothing acknowledged yet");
    assert_eq!(r.in_flight().0, 2);
    r.handle_report(p[1].0, Ok(()), now);
    assert!(
        confirms(&actions(&mut r)).is_empty(),
        "one record still in flight"
    );
    r.handle_report(p[0].0, Ok(()), now);
    let a = actions(&mut r);
    assert_eq!(confirms(&a), vec![Lsn(120)]);
    assert!(counts(&a).contains(&Count::TransactionsConfirmed(1)));
    assert_eq!(r.confirmed(), Lsn(120));
    assert_eq!(r.in_flight(), (0, 0));
}

#[test]
fn a_failed_record_is_never_stepped_over_and_the_session_drains_and_stops() {
    let now = Instant::now();
    let mut r = started(OnError::Fail, 100, 1 << 20, 100);
    let rel = relation(oid::JSONB);
    for (i, (c, e)) in [(110, 120), (130, 140)].into_iter().enumerate() {
        r.handle_outbox(begin(i as u32, c), now);
        r.handle_outbox(row(&rel, i as u32, c - 5, i as u64, "k", Some("{}")), now);
        r.handle_outbox(commit(i as u32, c, e), now);
    }
    let p = produced(&actions(&mut r));
    r.handle_report(p[0].0, Err("broker down".into()), now);
    let a = actions(&mut r);
    assert!(a.iter().any(|x| matches!(x, Action::Abandon)));
    assert!(stop(a).is_none(), "the second record is still in flight");
    assert!(!r.wants_events(), "no WAL after a failure");
    r.handle_report(p[1].0, Ok(()), now);
    let a = actions(&mut r);
    assert!(confirms(&a).is_empty(), "140 is behind the failed record");
    match stop(a) {
        Some(Err(CoreError::Delivery { topic, error })) => {
            assert_eq!(&*topic, "outbox.event.order");
            assert_eq!(error, "broker down");
        }
        other => panic!("expected the delivery failure, got {other:?}"),
    }
    assert_eq!(r.confirmed(), Lsn(100));
}

#[test]
fn reading_stops_at_the_window_and_resumes_at_half() {
    let now = Instant::now();
    let mut r = started(OnError::Fail, 4, 1 << 20, 100);
    let rel = relation(oid::JSONB);
    r.handle_outbox(begin(1, 1000), now);
    let mut n = 0;
    while r.wants_events() {
        n += 1;
        r.handle_outbox(row(&rel, 1, 100 + n, n, "k", Some("{}")), now);
    }
    assert_eq!(n, 4, "the record bound");
    let p = produced(&actions(&mut r));
    r.handle_report(p[0].0, Ok(()), now);
    assert!(!r.wants_events(), "3 in flight: above half");
    r.handle_report(p[1].0, Ok(()), now);
    assert!(r.wants_events(), "2 in flight: half");

    // The byte bound, the same way.
    let mut r = started(OnError::Fail, 1000, 300, 100);
    r.handle_outbox(begin(1, 1000), now);
    let mut n = 0;
    while r.wants_events() {
        n += 1;
        r.handle_outbox(
            row(&rel, 1, 100 + n, n, "k", Some(r#"{"pad": "0123456789"}"#)),
            now,
        );
    }
    let (records, bytes) = r.in_flight();
    assert!(
        bytes >= 300 && records == n,
        "{records} records, {bytes} bytes"
    );
}

#[test]
fn on_error_fail_stops_with_the_route_error_and_confirms_nothing_past_it() {
    let now = Instant::now();
    let mut r = started(OnError::Fail, 100, 1 << 20, 100);
    let rel = relation(oid::JSONB);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 105, 1, "k", None), now);
    let a = actions(&mut r);
    assert!(counts(&a).contains(&Count::RoutingError(RouteErrorKind::NullPayload)));
    match stop(a) {
        Some(Err(CoreError::Route { commit_lsn, .. })) => assert_eq!(commit_lsn, Lsn(110)),
        other => panic!("expected a route error, got {other:?}"),
    }
    assert_eq!(r.confirmed(), Lsn(100));
}

#[test]
fn on_error_skip_leaves_the_row_out_and_its_transaction_confirms() {
    let now = Instant::now();
    let mut r = started(OnError::Skip, 100, 1 << 20, 100);
    let rel = relation(oid::JSONB);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 105, 1, "k", None), now);
    r.handle_outbox(commit(1, 110, 120), now);
    let a = actions(&mut r);
    assert!(produced(&a).is_empty());
    assert!(counts(&a).contains(&Count::RowSkipped));
    assert_eq!(confirms(&a), vec![Lsn(120)]);
}

/// A column renamed or dropped under Ferry is not a poison row: skipping or dead-lettering would
/// treat every later event so. Whatever `on_error` says, the session stops at the first such row.
#[test]
fn a_row_without_a_column_the_route_reads_stops_whatever_on_error_says() {
    for on_error in [OnError::Skip, OnError::DeadLetter, OnError::Fail] {
        let now = Instant::now();
        let mut r = started(on_error, 100, 1 << 20, 100);
        let mut renamed = (*relation(oid::JSONB)).clone();
        renamed.columns[3].name = "event_type".into();
        let renamed = std::sync::Arc::new(renamed);
        r.handle_outbox(begin(1, 110), now);
        r.handle_outbox(row(&renamed, 1, 105, 1, "k", Some("{}")), now);
        r.handle_outbox(commit(1, 110, 120), now);
        let a = actions(&mut r);
        assert!(
            produced(&a).is_empty(),
            "{on_error}: produced {:?}",
            produced(&a)
        );
        assert!(counts(&a).contains(&Count::RoutingError(RouteErrorKind::MissingColumn)));
        match stop(a) {
            Some(Err(CoreError::Route {
                commit_lsn,
                error,
                table,
                ..
            })) => {
                assert_eq!((commit_lsn, table), (Lsn(110), Some(0)));
                assert_eq!(error.code(), "missing_column");
            }
            other => panic!("{on_error}: expected a route error, got {other:?}"),
        }
        assert_eq!(r.confirmed(), Lsn(100), "{on_error}");
    }
}

#[test]
fn on_error_dead_letter_produces_to_the_dead_letter_topic_and_waits_for_it() {
    let now = Instant::now();
    let mut r = started(OnError::DeadLetter, 100, 1 << 20, 100);
    let rel = relation(oid::JSONB);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 105, 1, "k", None), now);
    r.handle_outbox(commit(1, 110, 120), now);
    let a = actions(&mut r);
    let p = produced(&a);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].1, DEAD_LETTER_TOPIC);
    assert!(counts(&a).contains(&Count::RowDeadLettered));
    assert!(
        confirms(&a).is_empty(),
        "the dead letter is a record like any other"
    );
    r.handle_report(p[0].0, Ok(()), now);
    assert_eq!(confirms(&actions(&mut r)), vec![Lsn(120)]);
}

#[test]
fn an_idle_keepalive_is_confirmed_only_when_nothing_is_pending() {
    let now = Instant::now();
    let mut r = started(OnError::Fail, 100, 1 << 20, 100);
    let rel = relation(oid::JSONB);
    r.handle_keepalive(Lsn(150));
    assert_eq!(confirms(&actions(&mut r)), vec![Lsn(150)]);
    r.handle_outbox(begin(1, 160), now);
    r.handle_outbox(row(&rel, 1, 155, 1, "k", Some("{}")), now);
    r.handle_outbox(commit(1, 160, 170), now);
    let p = produced(&actions(&mut r));
    r.handle_keepalive(Lsn(200));
    assert!(
        confirms(&actions(&mut r)).is_empty(),
        "a record is in flight"
    );
    r.handle_report(p[0].0, Ok(()), now);
    assert_eq!(
        confirms(&actions(&mut r)),
        vec![Lsn(170), Lsn(200)],
        "the keepalive that came while the record was in flight, once it landed"
    );
    r.handle_keepalive(Lsn(200));
    r.handle_keepalive(Lsn(190));
    assert!(confirms(&actions(&mut r)).is_empty(), "never backwards");
}

/// The server sends a keepalive when its WAL passes what Ferry said it received, and no other
/// until its WAL moves again: one that came while records were in flight is the last word an
/// idle server says. Its WAL end is owed, and confirmed when they land, not at a later keepalive
/// that may never come; the newest of several is; the time it carries comes with it.
#[test]
fn a_keepalive_that_came_while_records_were_in_flight_is_confirmed_when_they_land() {
    let now = Instant::now();
    let mut r = started(OnError::Fail, 100, 1 << 20, 100);
    let rel = relation(oid::JSONB);
    let t = 1_795_000_000_000_000;
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 105, 1, "a", Some("{}")), now);
    r.handle_outbox(commit(1, 110, 120), now);
    r.handle_outbox(begin(2, 130), now);
    r.handle_outbox(row(&rel, 2, 125, 2, "b", Some("{}")), now);
    r.handle_outbox(commit(2, 130, 140), now);
    let p = produced(&actions(&mut r));
    r.handle_keepalive_at(Lsn(150), Some(t));
    r.handle_keepalive_at(Lsn(180), Some(t + 1));
    r.handle_keepalive_at(Lsn(170), Some(t + 2));
    assert!(confirms(&actions(&mut r)).is_empty());
    r.handle_report(p[0].0, Ok(()), now);
    assert_eq!(
        confirms(&actions(&mut r)),
        vec![Lsn(120)],
        "one still in flight"
    );
    r.handle_report(p[1].0, Ok(()), now);
    assert_eq!(confirms(&actions(&mut r)), vec![Lsn(140), Lsn(180)]);
    assert_eq!(r.confirmed_since_micros(), Some(t + 1));

    // A transaction that began after the keepalive ends past its WAL end: the owed end is
    // below what that transaction's confirmation reaches, and nothing goes backwards.
    r.handle_outbox(begin(3, 200), now);
    r.handle_outbox(row(&rel, 3, 195, 3, "c", Some("{}")), now);
    r.handle_outbox(commit(3, 200, 210), now);
    let p = produced(&actions(&mut r));
    r.handle_keepalive(Lsn(218));
    r.handle_outbox(begin(4, 220), now);
    r.handle_outbox(row(&rel, 4, 219, 4, "d", Some("{}")), now);
    // A ping inside a transaction owes nothing of its own.
    r.handle_keepalive(Lsn(219));
    r.handle_outbox(commit(4, 220, 230), now);
    let p4 = produced(&actions(&mut r));
    r.handle_report(p[0].0, Ok(()), now);
    assert_eq!(
        confirms(&actions(&mut r)),
        vec![Lsn(210)],
        "not past the transaction still in flight"
    );
    r.handle_report(p4[0].0, Ok(()), now);
    assert_eq!(confirms(&actions(&mut r)), vec![Lsn(230)]);

    // A failed record: nothing is confirmed past it, the owed end included.
    r.handle_outbox(begin(5, 240), now);
    r.handle_outbox(row(&rel, 5, 235, 5, "e", Some("{}")), now);
    r.handle_outbox(commit(5, 240, 250), now);
    let p = produced(&actions(&mut r));
    r.handle_keepalive(Lsn(260));
    r.handle_report(p[0].0, Err("broker down".into()), now);
    assert!(confirms(&actions(&mut r)).is_empty());
}

#[test]
fn shutdown_drains_then_stops_and_a_drain_past_its_deadline_is_an_error() {
    let now = Instant::now();
    let rel = relation(oid::JSONB);
    let mut r = started(OnError::Fail, 100, 1 << 20, 100);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 105, 1, "k", Some("{}")), now);
    r.handle_outbox(commit(1, 110, 120), now);
    let p = produced(&actions(&mut r));
    r.shutdown(now);
    assert!(!r.wants_events());
    assert_eq!(r.poll_timeout(), Some(now + Duration::from_secs(5)));
    assert!(stop(actions(&mut r)).is_none());
    r.handle_report(p[0].0, Ok(()), now);
    let a = actions(&mut r);
    assert_eq!(confirms(&a), vec![Lsn(120)]);
    assert!(matches!(stop(a), Some(Ok(End::Shutdown))));

    let mut r = started(OnError::Fail, 100, 1 << 20, 100);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 105, 1, "k", Some("{}")), now);
    actions(&mut r);
    r.shutdown(now);
    r.handle_timeout(now + Duration::from_secs(4));
    assert!(stop(actions(&mut r)).is_none(), "before the deadline");
    r.handle_timeout(now + Duration::from_secs(5));
    assert!(matches!(
        stop(actions(&mut r)),
        Some(Err(CoreError::DrainTimeout { records: 1 }))
    ));
    assert_eq!(r.poll_timeout(), None);
}

#[test]
fn the_reader_ending_drains_then_stops() {
    let now = Instant::now();
    let mut r = started(OnError::Fail, 100, 1 << 20, 100);
    r.reader_ended(now);
    assert!(matches!(stop(actions(&mut r)), Some(Ok(End::ReaderEnded))));
}

#[test]
fn a_report_for_a_token_with_no_record_stops_at_once() {
    let now = Instant::now();
    let mut r = started(OnError::Fail, 100, 1 << 20, 100);
    let rel = relation(oid::JSONB);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 105, 1, "k", Some("{}")), now);
    let p = produced(&actions(&mut r));
    r.handle_report(p[0].0, Ok(()), now);
    r.handle_report(p[0].0, Ok(()), now);
    assert!(matches!(
        stop(actions(&mut r)),
        Some(Err(CoreError::UnknownReport { token })) if token == p[0].0
    ));
}

#[test]
fn a_late_report_from_an_ended_session_confirms_nothing_in_the_next() {
    let now = Instant::now();
    let mut r = started(OnError::Fail, 100, 1 << 20, 100);
    let rel = relation(oid::JSONB);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 105, 1, "k", Some("{}")), now);
    r.handle_outbox(commit(1, 110, 120), now);
    let old = produced(&actions(&mut r));
    // The session ends with the record still in flight; the next resumes from 100 and the
    // server replays the transaction.
    r.start(Lsn(100), false);
    assert_eq!(r.in_flight().0, 1, "still in flight, still in the window");
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 105, 1, "k", Some("{}")), now);
    r.handle_outbox(commit(1, 110, 120), now);
    let new = produced(&actions(&mut r));
    assert_ne!(old[0].0, new[0].0, "the old record keeps its token");
    r.handle_report(old[0].0, Ok(()), now);
    assert!(
        confirms(&actions(&mut r)).is_empty(),
        "the old copy confirms nothing"
    );
    r.handle_report(new[0].0, Ok(()), now);
    assert_eq!(confirms(&actions(&mut r)), vec![Lsn(120)]);
}

#[test]
fn in_binary_mode_a_layout_readable_only_as_text_ends_the_session() {
    let now = Instant::now();
    let mut r: R = Relay::new(config(OnError::Fail, 100, 1 << 20));
    r.start(Lsn(100), true);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&relation(16_400), 1, 105, 1, "k", Some("{}")), now);
    assert_text_needed(actions(&mut r), 0);
}

/// A malformed trace context is counted and the record still goes (without the header); a valid
/// one is not counted.
#[test]
fn a_malformed_trace_context_is_counted_and_the_record_still_goes() {
    let now = Instant::now();
    let outbox = OutboxConfig {
        tracing_column: Some("type".into()),
        ..OutboxConfig::default()
    };
    let mut cfg = config(OnError::Fail, 100, 1 << 20);
    cfg.routers = std::sync::Arc::new(Routers::single(
        Router::new(&outbox, &RouteConfig::default()).unwrap(),
    ));
    let mut r = Relay::new(cfg);
    r.start(Lsn(100), false);
    let rel = relation(oid::JSONB);
    r.handle_outbox(begin(1, 110), now);
    // The row builder's type column holds "OrderCreated": not a traceparent.
    r.handle_outbox(row(&rel, 1, 105, 1, "k", Some("{}")), now);
    r.handle_outbox(commit(1, 110, 120), now);
    let a = actions(&mut r);
    assert_eq!(produced(&a).len(), 1);
    assert!(
        counts(&a).contains(&Count::TraceContextMalformed(TraceProblem::Length)),
        "{:?}",
        counts(&a)
    );
    let record = a
        .iter()
        .find_map(|x| match x {
            Action::Produce { record, .. } => Some(record),
            _ => None,
        })
        .unwrap();
    assert!(record.headers.iter().all(|(n, _)| &**n != "traceparent"));
}

/// Several outbox tables: a row is routed by its table's router (here a second table that sends
/// its rows elsewhere and skips the ones it cannot route), counted per table, and in binary mode
/// each table's layout is checked against the columns its own router reads.
#[test]
fn each_row_is_routed_by_its_tables_router_and_counted_per_table() {
    use ferry_core::RowOutcome;
    use ferry_router::TableConfig;
    use ferry_wal::assembly::OutboxEvent;
    let now = Instant::now();
    let second = TableConfig {
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
    let routers =
        Routers::new(&OutboxConfig::default(), &RouteConfig::default(), &[second]).unwrap();
    let mut cfg = config(OnError::Fail, 100, 1 << 20);
    cfg.routers = std::sync::Arc::new(routers);
    let mut r: R = Relay::new(cfg.clone());
    r.start(Lsn(100), false);
    let rel = relation(oid::JSONB);
    let of_table = |table: usize, ev: OutboxEvent| match ev {
        OutboxEvent::Row(mut row) => {
            row.table = table;
            OutboxEvent::Row(row)
        }
        other => other,
    };
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 101, 1, "k", Some("{}")), now);
    r.handle_outbox(of_table(1, row(&rel, 1, 102, 2, "k", Some("{}"))), now);
    // A NULL payload: the first table fails on it, the second skips it.
    r.handle_outbox(of_table(1, row(&rel, 1, 103, 3, "k", None)), now);
    r.handle_outbox(commit(1, 110, 120), now);
    let a = actions(&mut r);
    let topics: Vec<String> = produced(&a).into_iter().map(|(_, t)| t).collect();
    assert_eq!(topics, ["outbox.event.order", "billing"]);
    // Routed, dead-lettered, skipped, failed, per table.
    assert_eq!(r.table_rows(), [[1, 0, 0, 0], [1, 0, 1, 0]]);
    assert_eq!(RowOutcome::ALL[2], RowOutcome::Skipped);
    assert!(stop(a).is_none());

    // A row of a table the relay has no router for: the stream and the configuration disagree.
    r.handle_outbox(begin(2, 210), now);
    r.handle_outbox(of_table(2, row(&rel, 2, 201, 4, "k", Some("{}"))), now);
    match stop(actions(&mut r)) {
        Some(Err(CoreError::Bookkeeping(e))) => {
            assert!(e.to_string().contains("outbox table #2"), "{e}");
        }
        other => panic!("expected a bookkeeping stop, got {other:?}"),
    }

    // Binary mode: the second table's layout is checked with its own router's columns.
    let mut r: R = Relay::new(cfg);
    r.start(Lsn(100), true);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 101, 1, "k", Some("{}")), now);
    for (token, _) in produced(&actions(&mut r)) {
        r.handle_report(token, Ok(()), now);
    }
    r.handle_outbox(
        of_table(1, row(&relation(16_400), 1, 102, 2, "k", Some("{}"))),
        now,
    );
    assert_text_needed(actions(&mut r), 1);

    // ... and only with them: a second table whose router reads "type" as its payload does not
    // read the "payload" column, so an enum there is nothing to it, while the first table,
    // which reads it, needs text for the same layout.
    let third = TableConfig {
        outbox: OutboxConfig {
            table: "billing.outbox".into(),
            payload_column: "type".into(),
            ..OutboxConfig::default()
        },
        route: RouteConfig {
            topic: Some("billing".into()),
            ..RouteConfig::default()
        },
    };
    let mut cfg = config(OnError::Fail, 100, 1 << 20);
    cfg.routers = Arc::new(
        Routers::new(&OutboxConfig::default(), &RouteConfig::default(), &[third]).unwrap(),
    );
    let mut r: R = Relay::new(cfg);
    r.start(Lsn(100), true);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(
        of_table(1, row(&relation(16_400), 1, 101, 1, "k", Some("{}"))),
        now,
    );
    let a = actions(&mut r);
    let sent = produced(&a);
    assert_eq!(sent.len(), 1, "the second table's row is produced");
    for (token, _) in sent {
        r.handle_report(token, Ok(()), now);
    }
    assert!(stop(a).is_none());
    r.handle_outbox(row(&relation(16_400), 1, 102, 2, "k", Some("{}")), now);
    assert_text_needed(actions(&mut r), 0);
}

/// What a progress record keeps for `ferry replay --since`: every transaction after the
/// confirmed LSN committed at or after the confirmed transaction's commit time, or after the
/// idle keepalive that confirmed a WAL end.
#[test]
fn the_confirmed_position_carries_when_later_transactions_committed() {
    let now = Instant::now();
    let mut r = started(OnError::Fail, 100, 1 << 20, 100);
    let rel = relation(oid::JSONB);
    let at = |xid: u32, commit_lsn: u64, micros: i64| {
        ferry_wal::assembly::OutboxEvent::Begin(ferry_wal::assembly::TxnBegin {
            xid,
            commit_lsn: Lsn(commit_lsn),
            commit_time: ferry_wal::PgTimestamp::from_unix_micros(micros).unwrap(),
        })
    };
    assert_eq!(r.confirmed_since_micros(), None);
    let (t1, t2) = (1_795_000_000_000_000, 1_795_000_001_000_000);
    r.handle_outbox(at(1, 110, t1), now);
    r.handle_outbox(row(&rel, 1, 105, 1, "a", Some("{}")), now);
    r.handle_outbox(commit(1, 110, 120), now);
    r.handle_outbox(at(2, 130, t2), now);
    r.handle_outbox(row(&rel, 2, 125, 2, "b", Some("{}")), now);
    r.handle_outbox(commit(2, 130, 140), now);
    let p = produced(&actions(&mut r));
    r.handle_report(p[0].0, Ok(()), now);
    assert_eq!(confirms(&actions(&mut r)), vec![Lsn(120)]);
    assert_eq!(r.confirmed_since_micros(), Some(t1));
    r.handle_report(p[1].0, Ok(()), now);
    assert_eq!(confirms(&actions(&mut r)), vec![Lsn(140)]);
    assert_eq!(r.confirmed_since_micros(), Some(t2));
    // Idle: the keepalive's WAL end is confirmed, and what commits later commits after it came.
    let t3 = t2 + 5_000_000;
    r.handle_keepalive_at(Lsn(200), Some(t3));
    assert_eq!(confirms(&actions(&mut r)), vec![Lsn(200)]);
    assert_eq!(r.confirmed_since_micros(), Some(t3));
}

/// The columns a router reads on every row are found by name once per relation, then by place
/// (`ferry_core::route::Places`); a Relation message after `ALTER TABLE` describes the table
/// anew, and the next rows must be read by the new layout, not the places of the old one.
#[test]
fn a_row_after_its_table_changed_is_read_by_the_new_layout() {
    use bytes::Bytes;
    use ferry_wal::assembly::{OutboxEvent, OutboxRow, RelationInfo};
    use ferry_wal::pgoutput::TupleValue;

    let now = Instant::now();
    let mut r = started(OnError::Fail, 100, 1 << 20, 100);
    let before = relation(oid::JSONB);
    // The same table, its columns in another order (a column dropped and added back).
    let mut after = (*before).clone();
    after.columns.rotate_left(2);
    let after = Arc::new(after);
    let text = |s: &str| TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()));
    let row = |rel: &Arc<RelationInfo>, lsn: u64, id: &str, key: &str, payload: &str| {
        let values: Vec<TupleValue> = rel
            .columns
            .iter()
            .map(|c| match c.name.as_str() {
                "id" => text(id),
                "aggregatetype" => text("order"),
                "aggregateid" => text(key),
                "type" => text("OrderCreated"),
                _ => text(payload),
            })
            .collect();
        OutboxEvent::Row(OutboxRow {
            xid: 1,
            table: 0,
            lsn: Lsn(lsn),
            relation: rel.clone(),
            values: values.into(),
        })
    };
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(
        row(
            &before,
            101,
            "00000000-0000-4000-8000-000000000001",
            "a",
            r#"{"n":1}"#,
        ),
        now,
    );
    r.handle_outbox(
        row(
            &after,
            102,
            "00000000-0000-4000-8000-000000000002",
            "b",
            r#"{"n":2}"#,
        ),
        now,
    );
    r.handle_outbox(
        row(
            &before,
            103,
            "00000000-0000-4000-8000-000000000003",
            "c",
            r#"{"n":3}"#,
        ),
        now,
    );
    let records: Vec<(String, String, String, String)> = actions(&mut r)
        .into_iter()
        .filter_map(|a| match a {
            Action::Produce { record, .. } => Some((
                record.topic.to_string(),
                String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned(),
                String::from_utf8_lossy(record.value.as_deref().unwrap_or_default()).into_owned(),
                record.event_id_text().into_owned(),
            )),
            _ => None,
        })
        .collect();
    let want = |n: u64, key: &str| {
        (
            "outbox.event.order".to_string(),
            key.to_string(),
            format!(r#"{{"n":{n}}}"#),
            format!("00000000-0000-4000-8000-{n:012}"),
        )
    };
    assert_eq!(records, vec![want(1, "a"), want(2, "b"), want(3, "c")]);
}
