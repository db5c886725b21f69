//! The session machine against a driver's clock: a driver reads the time once per burst of
//! events, and carries out a commit inside the burst; the commit's slowness must not make the
//! next transaction start late (a commit after every event: ~9 rows/s while a transaction
//! coordinator moved, in the three-broker test).

mod common;

use std::time::{Duration, Instant};

use common::*;
use ferry_core::{CommitOutcome, Session, SessionAction, SessionConfig, TransactionLimits};
use ferry_router::{oid, OnError};

const INTERVAL: Duration = Duration::from_millis(100);

fn machine() -> Session<TestError> {
    let mut relay = config(OnError::Fail, 1_000, 1 << 20);
    relay.exactly_once = true;
    Session::new(SessionConfig {
        relay,
        transactions: Some(TransactionLimits {
            interval: INTERVAL,
            max_records: 500,
            max_bytes: 1 << 19,
        }),
        progress_topic: "progress".into(),
    })
}

/// Carries the actions out; returns how many commits were asked for. Commits take `slow`.
fn carry_out(m: &mut Session<TestError>, clock: &mut Instant, slow: Duration) -> usize {
    let mut commits = 0;
    while let Some(a) = m.poll_action() {
        match a {
            SessionAction::BeginTransaction => m.handle_begun(Ok(()), *clock),
            SessionAction::CommitTransaction { .. } => {
                commits += 1;
                *clock += slow;
                m.handle_commit(CommitOutcome::Committed, *clock);
            }
            SessionAction::Stop(r) => panic!("stopped: {r:?}"),
            _ => {}
        }
    }
    commits
}

#[test]
fn a_slow_commit_inside_a_burst_does_not_make_every_later_transaction_commit_alone() {
    let rel = relation(oid::JSONB);
    let mut m = machine();
    let t0 = Instant::now();
    let mut clock = t0;
    m.start_exactly_once(ferry_wal::Lsn(100), false, None, t0);
    assert_eq!(
        carry_out(&mut m, &mut clock, Duration::ZERO),
        1,
        "a fresh slot's position"
    );
    // Bursts 10 ms apart, each read with one clock reading at its start, of three one-row
    // transactions; a commit takes 1.5 intervals (Kafka recovering).
    let (mut commits, mut rows) = (0, 0u64);
    for burst in 0..60u64 {
        clock += Duration::from_millis(10);
        let now = clock;
        for i in 0..3 {
            let n = burst * 3 + i;
            let lsn = 1_000 + n * 100;
            for ev in [
                begin(n as u32, lsn),
                row(&rel, n as u32, lsn - 1, n + 1, "k", Some("{}")),
                commit(n as u32, lsn, lsn + 8),
            ] {
                m.handle_outbox(ev, now);
                commits += carry_out(&mut m, &mut clock, INTERVAL * 3 / 2);
            }
            rows += 1;
        }
    }
    // One commit per interval and commit: about 60 * 10 ms / 250 ms plus the slow commits'
    // own time. A transaction started late commits at its first event: one per burst.
    assert!(
        commits <= rows as usize / 6,
        "{commits} commits for {rows} rows: a transaction after a slow commit started already late"
    );
}
