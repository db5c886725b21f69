//! The one-shot pass (`ferry run --skip-event` / `--dead-letter-event`) in the relay core: it
//! passes exactly the poison event it names, once, in both delivery modes, and says so when the
//! event it names is never met or does not stop Ferry.

mod common;

use std::time::Instant;

use common::*;
use ferry_core::pass::{EventPosition, Pass, PassAction};
use ferry_core::progress_record::{Mode, Partial, ProgressRecord, FORMAT};
use ferry_core::{Action, CoreError, Count, DeliveryKey, Relay};
use ferry_router::{oid, OnError, OutboxConfig, RouteConfig, Router, Routers};
use ferry_wal::Lsn;

type R = Relay<String>;

fn at(commit_lsn: u64, event: u64) -> EventPosition {
    EventPosition {
        commit_lsn: Lsn(commit_lsn),
        event,
    }
}

fn relay(config: ferry_core::RelayConfig, pass: Option<Pass>, resume: u64) -> R {
    let mut r = Relay::new(config);
    r.set_pass(pass);
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

fn counts(actions: &[Action<String>]) -> Vec<Count> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Count(c) => Some(*c),
            _ => None,
        })
        .collect()
}

fn route_stop(actions: Vec<Action<String>>) -> Option<(Lsn, u64, Option<Pass>)> {
    actions.into_iter().find_map(|a| match a {
        Action::Stop(result) => match *result {
            Err(CoreError::Route {
                commit_lsn,
                event,
                pass,
                ..
            }) => Some((commit_lsn, event, pass)),
            _ => None,
        },
        _ => None,
    })
}

/// Transaction 1 (commit 110): a good row, the poison row (event 2), a good row. Transaction 2
/// (commit 210): another poison row (event 1).
fn feed_two_poison_transactions(r: &mut R, now: Instant) -> Vec<Action<String>> {
    let rel = relation(oid::JSONB);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 101, 1, "k", Some("{}")), now);
    r.handle_outbox(row(&rel, 1, 102, 2, "k", None), now);
    r.handle_outbox(row(&rel, 1, 103, 3, "k", Some("{}")), now);
    r.handle_outbox(commit(1, 110, 120), now);
    r.handle_outbox(begin(2, 210), now);
    r.handle_outbox(row(&rel, 2, 201, 4, "k", None), now);
    actions(r)
}

#[test]
fn without_a_pass_the_poison_event_stops_with_its_position() {
    let now = Instant::now();
    let mut r = relay(config(OnError::Fail, 100, 1 << 20), None, 100);
    let a = feed_two_poison_transactions(&mut r, now);
    // The first good row was handed over before the stop: the drain waits for its report.
    let p = produced(&a);
    assert_eq!(p.len(), 1);
    r.handle_report(p[0].0, Ok(()), now);
    assert_eq!(route_stop(actions(&mut r)), Some((Lsn(110), 2, None)));
}

#[test]
fn skip_event_passes_the_named_event_once_and_the_next_poison_row_still_stops() {
    let now = Instant::now();
    let pass = Pass::new(at(110, 2), PassAction::Skip);
    let mut r = relay(config(OnError::Fail, 100, 1 << 20), Some(pass), 100);
    let a = feed_two_poison_transactions(&mut r, now);
    let p = produced(&a);
    assert_eq!(p.len(), 2, "the rows around the skipped one: {p:?}");
    assert_eq!(
        counts(&a)
            .iter()
            .filter(|c| **c == Count::RowSkipped)
            .count(),
        1
    );
    assert!(r.pass().is_some_and(|p| p.met), "held until confirmed");
    for (token, _) in p {
        r.handle_report(token, Ok(()), now);
    }
    let a = actions(&mut r);
    assert!(a
        .iter()
        .any(|a| matches!(a, Action::Confirm(l) if *l == Lsn(120))));
    assert_eq!(r.pass(), None, "used up once its transaction is confirmed");
    assert_eq!(
        route_stop(a),
        Some((Lsn(210), 1, Some(Pass { met: true, ..pass }))),
        "the second poison row stops Ferry"
    );
    assert_eq!(r.table_rows()[0], [2, 0, 1, 1]);
}

#[test]
fn a_replay_before_the_confirm_meets_the_same_decision() {
    let now = Instant::now();
    let pass = Pass::new(at(110, 2), PassAction::Skip);
    let mut r = relay(config(OnError::Fail, 100, 1 << 20), Some(pass), 100);
    let rel = relation(oid::JSONB);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 101, 1, "k", Some("{}")), now);
    r.handle_outbox(row(&rel, 1, 102, 2, "k", None), now);
    let first = produced(&actions(&mut r));
    // The session ends (a reconnect) before anything is confirmed; the next one replays.
    r.reader_ended(now);
    r.handle_report(first[0].0, Ok(()), now);
    actions(&mut r);
    r.start(Lsn(100), false);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 101, 1, "k", Some("{}")), now);
    r.handle_outbox(row(&rel, 1, 102, 2, "k", None), now);
    r.handle_outbox(commit(1, 110, 120), now);
    let a = actions(&mut r);
    assert!(route_stop_any(&a).is_none(), "{a:?}");
    assert!(counts(&a).contains(&Count::RowSkipped));
}

fn route_stop_any(a: &[Action<String>]) -> Option<()> {
    a.iter()
        .any(|a| matches!(a, Action::Stop(r) if r.is_err()))
        .then_some(())
}

#[test]
fn dead_letter_event_sends_the_named_event_to_the_dead_letter_topic_under_fail() {
    let now = Instant::now();
    let route = RouteConfig {
        on_error: OnError::Fail,
        dead_letter_topic: Some(DEAD_LETTER_TOPIC.into()),
        ..RouteConfig::default()
    };
    let mut c = config(OnError::Fail, 100, 1 << 20);
    c.routers = std::sync::Arc::new(Routers::single(
        Router::new(&OutboxConfig::default(), &route).unwrap(),
    ));
    let pass = Pass::new(at(110, 2), PassAction::DeadLetter);
    let mut r = relay(c, Some(pass), 100);
    let a = feed_two_poison_transactions(&mut r, now);
    let topics: Vec<String> = produced(&a).into_iter().map(|p| p.1).collect();
    assert_eq!(topics[1], DEAD_LETTER_TOPIC, "{topics:?}");
    assert_eq!(topics.len(), 3);
    assert!(counts(&a).contains(&Count::RowDeadLettered));
}

#[test]
fn dead_letter_event_without_a_dead_letter_topic_still_stops_and_says_so() {
    let now = Instant::now();
    let pass = Pass::new(at(110, 2), PassAction::DeadLetter);
    let mut r = relay(config(OnError::Fail, 100, 1 << 20), Some(pass), 100);
    let a = feed_two_poison_transactions(&mut r, now);
    let p = produced(&a);
    assert_eq!(p.len(), 1);
    r.handle_report(p[0].0, Ok(()), now);
    let (commit, event, given) = route_stop(actions(&mut r)).unwrap();
    assert_eq!((commit, event), (Lsn(110), 2));
    assert!(given.is_some_and(|g| g.met && g.action == PassAction::DeadLetter));
}

#[test]
fn a_pass_naming_an_event_that_routes_drops_it_and_delivers_the_event() {
    let now = Instant::now();
    let pass = Pass::new(at(110, 1), PassAction::Skip);
    let mut r = relay(config(OnError::Fail, 100, 1 << 20), Some(pass), 100);
    let a = feed_two_poison_transactions(&mut r, now);
    assert_eq!(r.pass(), None);
    assert!(!counts(&a).contains(&Count::RowSkipped));
    let p = produced(&a);
    assert_eq!(
        p.len(),
        1,
        "the good row is delivered, the poison one stops Ferry"
    );
    r.handle_report(p[0].0, Ok(()), now);
    assert_eq!(route_stop(actions(&mut r)).map(|s| s.1), Some(2));
}

#[test]
fn a_pass_the_stream_passes_without_meeting_is_dropped() {
    let now = Instant::now();
    // Transaction 110 has two events, not five.
    let mut r = relay(
        config(OnError::Fail, 100, 1 << 20),
        Some(Pass::new(at(110, 5), PassAction::Skip)),
        100,
    );
    let rel = relation(oid::JSONB);
    r.handle_outbox(begin(1, 110), now);
    r.handle_outbox(row(&rel, 1, 101, 1, "k", Some("{}")), now);
    r.handle_outbox(row(&rel, 1, 102, 2, "k", Some("{}")), now);
    assert!(r.pass().is_some());
    r.handle_outbox(commit(1, 110, 120), now);
    assert_eq!(r.pass(), None);
    // No transaction commits at 150.
    let mut r = relay(
        config(OnError::Fail, 100, 1 << 20),
        Some(Pass::new(at(150, 1), PassAction::Skip)),
        100,
    );
    r.handle_keepalive(Lsn(140));
    assert!(r.pass().is_some());
    r.handle_keepalive(Lsn(160));
    assert_eq!(r.pass(), None);
}

#[test]
fn a_pass_behind_the_slot_at_start_is_dropped() {
    let r = relay(
        config(OnError::Fail, 100, 1 << 20),
        Some(Pass::new(at(110, 1), PassAction::Skip)),
        120,
    );
    assert_eq!(r.pass(), None);
}

/// Exactly-once: the remembered progress record covers events the slot still replays; a pass
/// for a covered event is behind, one for the event after the covered ones applies.
#[test]
fn exactly_once_counts_the_same_positions() {
    let now = Instant::now();
    let mut c = config(OnError::Fail, 100, 1 << 20);
    c.exactly_once = true;
    let remembered = ProgressRecord {
        format: FORMAT,
        mode: Mode::ExactlyOnce,
        timeline: 1,
        end_lsn: Lsn(100),
        partial: Some(Partial {
            commit_lsn: Lsn(110),
            events: 1,
        }),
        written_unix_millis: 0,
        since_unix_millis: None,
    };
    let mut r: R = Relay::new(c.clone());
    r.set_pass(Some(Pass::new(at(110, 1), PassAction::Skip)));
    r.start_from(Lsn(100), false, Some(remembered.clone()));
    assert_eq!(r.pass(), None, "event 1 is covered: behind");

    let mut r: R = Relay::new(c);
    r.set_pass(Some(Pass::new(at(110, 2), PassAction::Skip)));
    r.start_from(Lsn(100), false, Some(remembered));
    let a = feed_two_poison_transactions(&mut r, now);
    let p = produced(&a);
    assert_eq!(
        p.len(),
        1,
        "event 1 covered, event 2 skipped, event 3 produced"
    );
    assert!(counts(&a).contains(&Count::RowSkipped));
    assert!(a.iter().any(|a| matches!(
        a,
        Action::Position(ferry_core::Position {
            partial: Some(Partial {
                commit_lsn: Lsn(110),
                events: 2
            }),
            ..
        })
    )));
}
