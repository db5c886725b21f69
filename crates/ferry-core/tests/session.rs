//! The session machine's exactly-once corner cases, one scenario each (the simulation,
//! `tests/simulation.rs`, covers the rest with random faults).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ferry_core::progress_record::{Mode, ProgressRecord};
use ferry_core::{RelayConfig, Session, SessionAction as Action, SessionConfig, TransactionLimits};
use ferry_router::{oid, OnError};
use ferry_wal::Lsn;

/// The next action that is not a counter change.
fn poll(s: &mut Session<TestError>) -> Option<Action<TestError>> {
    std::iter::from_fn(|| s.poll_action()).find(|a| !matches!(a, Action::Count(_)))
}

/// Simulation seed 235208710 (exactly-once): a record whose event's position fills the
/// transaction is refused by the producer after the machine queued the progress record behind
/// it. The commit must not follow: its progress record would cover the refused event, which
/// the next session would then skip.
#[test]
fn a_record_refused_after_the_commit_was_decided_aborts_the_transaction() {
    let config = SessionConfig {
        relay: RelayConfig {
            exactly_once: true,
            ..config(OnError::Skip, 10, 1 << 20)
        },
        transactions: Some(TransactionLimits {
            interval: Duration::from_secs(10),
            max_records: 1,
            max_bytes: 1 << 20,
        }),
        progress_topic: Arc::from("ferry.progress"),
    };
    let now = Instant::now();
    let mut s: Session<TestError> = Session::new(config);
    let remembered = ProgressRecord::whole(Mode::ExactlyOnce, 1, Lsn(100), 0);
    s.start_exactly_once(Lsn(100), false, Some(remembered), now);
    assert!(poll(&mut s).is_none());
    let rel = relation(oid::JSONB);
    s.handle_outbox(begin(1, 110), now);
    s.handle_outbox(row(&rel, 1, 109, 1, "key-1", Some("{}")), now);
    assert!(matches!(poll(&mut s), Some(Action::BeginTransaction)));
    s.handle_begun(Ok(()), now);
    let Some(Action::Produce { token, .. }) = poll(&mut s) else {
        panic!("the record first");
    };
    // The producer refuses it; the progress record is already queued behind it.
    s.handle_refused(token, TestError::transient("queue full"), now);
    let mut rest = Vec::new();
    while let Some(a) = poll(&mut s) {
        let abort = matches!(a, Action::AbortTransaction { at_end: false, .. });
        rest.push(format!("{a:?}"));
        if abort {
            s.handle_aborted(Ok(()), now);
        }
    }
    assert!(
        !rest
            .iter()
            .any(|a| a.starts_with("ProduceProgress") || a.starts_with("CommitTransaction")),
        "committed past a refused record: {rest:?}"
    );
    assert!(
        rest.iter().any(|a| a.starts_with("AbortTransaction")),
        "{rest:?}"
    );
    assert!(
        rest.last().is_some_and(|a| a.starts_with("Stop(Err")),
        "{rest:?}"
    );
}
