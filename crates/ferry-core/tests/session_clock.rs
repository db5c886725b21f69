//! The session machine against a driver's clock, exactly-once:
//!
//! - a driver reads the time once per burst of events, and carries out a commit inside the
//!   burst; the commit's slowness must not make the next transaction start late (a commit after
//!   every event: ~9 rows/s while a transaction coordinator moved, in the three-broker test);
//! - the end of a burst commits once its reports are in and [`QUIET`] passed, not an interval
//!   after it began; yet never three commits in an interval.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ferry_core::progress_record::{Mode, ProgressRecord};
use ferry_core::session::transaction::QUIET;
use ferry_core::testing::Rng;
use ferry_core::{
    CommitOutcome, DeliveryKey, Session, SessionAction, SessionConfig, TransactionLimits,
};
use ferry_router::{oid, OnError};
use ferry_wal::Lsn;

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

/// Starts `m` as a restart does (a committed progress record at 100); nothing to carry out.
fn restarted(m: &mut Session<TestError>, t0: Instant) {
    let remembered = ProgressRecord::whole(Mode::ExactlyOnce, 1, Lsn(100), 0);
    m.start_exactly_once(Lsn(100), false, Some(remembered), t0);
    assert!(m.poll_action().is_none());
}

/// What a driver saw: records handed over and not reported, the commits.
#[derive(Default)]
struct Seen {
    unreported: Vec<DeliveryKey>,
    /// When the first record not committed yet was handed over.
    first_uncommitted: Option<Instant>,
    /// When the newest report left none in flight.
    settled_at: Option<Instant>,
    commits: Vec<Commit>,
    /// How long a commit takes: its outcome comes this much after it was asked for.
    slow: Duration,
}

/// A commit the machine asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Commit {
    at: Instant,
    /// Records handed over without their report yet.
    in_flight: usize,
    /// When the first record it commits was handed over.
    first: Option<Instant>,
}

/// Carries out what is queued at `now`, as the driver does; a commit succeeds at once.
fn carry(m: &mut Session<TestError>, seen: &mut Seen, now: Instant) {
    while let Some(a) = m.poll_action() {
        match a {
            SessionAction::BeginTransaction => m.handle_begun(Ok(()), now),
            SessionAction::Produce { token, .. } => {
                seen.unreported.push(token);
                seen.first_uncommitted.get_or_insert(now);
            }
            SessionAction::CommitTransaction { .. } => {
                seen.commits.push(Commit {
                    at: now,
                    in_flight: seen.unreported.len(),
                    first: seen.first_uncommitted.take(),
                });
                m.handle_commit(CommitOutcome::Committed, now + seen.slow);
            }
            SessionAction::Stop(r) => panic!("stopped: {r:?}"),
            _ => {}
        }
    }
}

/// Feeds a one-row transaction `n` event by event, as the driver does.
fn one_row(m: &mut Session<TestError>, seen: &mut Seen, n: u64, now: Instant) {
    let rel = relation(oid::JSONB);
    let lsn = 1_000 + n * 100;
    for ev in [
        begin(n as u32, lsn),
        row(&rel, n as u32, lsn - 1, n + 1, "k", Some("{}")),
        commit(n as u32, lsn, lsn + 8),
    ] {
        assert!(m.wants_events());
        m.handle_outbox(ev, now);
        carry(m, seen, now);
    }
}

/// Reports the record handed over `i`-th among those in flight.
fn report(m: &mut Session<TestError>, seen: &mut Seen, i: usize, now: Instant) {
    let token = seen.unreported.swap_remove(i);
    if seen.unreported.is_empty() {
        seen.settled_at = Some(now);
    }
    m.handle_report(token, Ok(()), now);
    carry(m, seen, now);
}

/// A one-row transaction `n` at `at`, its record reported 2 ms later; returns that moment.
fn lone_event(m: &mut Session<TestError>, seen: &mut Seen, n: u64, at: Instant) -> Instant {
    one_row(m, seen, n, at);
    report(m, seen, 0, at + ms(2));
    at + ms(2)
}

/// Lets time pass to `to`, waking the machine at each deadline on the way, as the driver does.
fn wait(m: &mut Session<TestError>, seen: &mut Seen, to: Instant) {
    while let Some(due) = m.poll_timeout().filter(|d| *d <= to) {
        m.handle_timeout(due);
        carry(m, seen, due);
    }
}

fn at(seen: &Seen) -> Vec<Instant> {
    seen.commits.iter().map(|c| c.at).collect()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_lone_event_commits_once_its_report_is_in_and_the_quiet_time_passed() {
    let (mut m, mut seen) = (machine(), Seen::default());
    let t0 = Instant::now();
    restarted(&mut m, t0);
    one_row(&mut m, &mut seen, 1, t0);
    assert_eq!(
        m.poll_timeout(),
        Some(t0 + INTERVAL),
        "in flight: the interval"
    );
    report(&mut m, &mut seen, 0, t0 + ms(2));
    assert_eq!(
        m.poll_timeout(),
        Some(t0 + ms(2) + QUIET),
        "reported: quiet"
    );
    wait(&mut m, &mut seen, t0 + ms(2) + QUIET - ms(1));
    assert!(seen.commits.is_empty(), "not before the quiet time");
    wait(&mut m, &mut seen, t0 + ms(50));
    let early = t0 + ms(2) + QUIET;
    assert_eq!(at(&seen), [early], "the end of the burst commits early");
    // A second lone event goes early too; a third waits until the first is an interval old
    // (never three commits in an interval), not for an interval of its own.
    let second = lone_event(&mut m, &mut seen, 2, early + ms(30));
    wait(&mut m, &mut seen, second + ms(50));
    let third = lone_event(&mut m, &mut seen, 3, early + ms(60));
    assert_eq!(m.poll_timeout(), Some(early + INTERVAL), "paced");
    wait(&mut m, &mut seen, third + INTERVAL);
    assert_eq!(at(&seen), [early, second + QUIET, early + INTERVAL]);
}

#[test]
fn lone_events_an_interval_apart_each_commit_early_however_long_a_commit_takes() {
    let (mut m, mut seen) = (machine(), Seen::default());
    seen.slow = ms(10);
    // Reports come 2 or 5 ms after their events, in turns.
    let t0 = Instant::now();
    restarted(&mut m, t0);
    for k in 0..20 {
        let t = t0 + INTERVAL * k;
        one_row(&mut m, &mut seen, u64::from(k) + 1, t);
        let reported = t + ms(2) + ms(3 * u64::from(k % 2));
        report(&mut m, &mut seen, 0, reported);
        wait(&mut m, &mut seen, t + INTERVAL / 2);
        assert_eq!(
            at(&seen).last().copied(),
            Some(reported + QUIET),
            "event {k} waits for more than its own report and the quiet time"
        );
    }
}

#[test]
fn a_backlog_committed_at_the_cap_does_not_hold_early_commits_back() {
    let (mut m, mut seen) = (machine(), Seen::default());
    let t0 = Instant::now();
    restarted(&mut m, t0);
    // 10,000 rows in 100 ms: twenty commits at the cap of 500 records.
    let mut now = t0;
    for n in 1..=10_000 {
        now = t0 + Duration::from_micros(10 * n);
        one_row(&mut m, &mut seen, n, now);
        report(&mut m, &mut seen, 0, now);
    }
    assert!(seen.commits.len() >= 20, "{} commits", seen.commits.len());
    wait(&mut m, &mut seen, now + INTERVAL);
    let lone = lone_event(&mut m, &mut seen, 10_001, now + INTERVAL * 3);
    assert_eq!(
        m.poll_timeout(),
        Some(lone + QUIET),
        "commits at the cap pushed the pace far ahead"
    );
}

#[test]
fn a_position_alone_waits_for_the_interval_and_goes_with_the_next_record() {
    let (mut m, mut seen) = (machine(), Seen::default());
    let t0 = Instant::now();
    restarted(&mut m, t0);
    let first = lone_event(&mut m, &mut seen, 1, t0);
    wait(&mut m, &mut seen, t0 + ms(20));
    assert_eq!(at(&seen), [first + QUIET]);
    // The server's keepalive after the transaction: WAL past it, no record.
    let keepalive = t0 + ms(30);
    m.handle_keepalive_at(Lsn(5_000), None, keepalive);
    carry(&mut m, &mut seen, keepalive);
    assert_eq!(
        m.poll_timeout(),
        Some(keepalive + INTERVAL),
        "a position alone commits early"
    );
    // The next transaction takes it along, early.
    let next = lone_event(&mut m, &mut seen, 50, t0 + ms(60));
    wait(&mut m, &mut seen, next + INTERVAL * 2);
    assert_eq!(at(&seen), [first + QUIET, next + QUIET]);
}

#[test]
fn a_fresh_slot_s_start_commit_does_not_count_in_the_pace() {
    let (mut m, mut seen) = (machine(), Seen::default());
    let t0 = Instant::now();
    m.start_exactly_once(Lsn(100), false, None, t0);
    carry(&mut m, &mut seen, t0 + ms(5));
    assert_eq!(at(&seen), [t0 + ms(5)], "the slot's position");
    let first = lone_event(&mut m, &mut seen, 1, t0 + ms(20));
    assert_eq!(m.poll_timeout(), Some(first + QUIET));
    wait(&mut m, &mut seen, first + QUIET);
    // The burst of two is the events' own.
    let second = lone_event(&mut m, &mut seen, 2, first + ms(20));
    assert_eq!(
        m.poll_timeout(),
        Some(second + QUIET),
        "the start commit paced it"
    );
}

/// The model of the pace: after commits decided at `d1, d2, ...`, an early commit may go from
/// `f`, where `f1 = d1` and `fk = min(max(f(k-1) + interval, dk), dk + interval)`.
fn pace(commits: &[Commit]) -> Option<Instant> {
    commits.iter().fold(None, |f, c| {
        let next = f.map_or(c.at, |f: Instant| (f + INTERVAL).max(c.at));
        Some(next.min(c.at + INTERVAL))
    })
}

/// Whatever the pattern of events, reports and pauses: commits (none full, none draining) come
/// no more often than one an interval over any stretch, with a burst of two (no three within an
/// interval); one that comes before its transaction's interval ran out has every report in; and
/// nothing waits past the interval, nor, once every report is in, past the quiet time or the
/// pace ([`pace`]), whichever is later.
#[test]
fn early_commits_are_paced_by_the_interval_and_wait_for_every_report() {
    let mut rng = Rng::new(0x5eed_ea51);
    let mut runs = Vec::new();
    for _ in 0..300 {
        let (mut m, mut seen) = (machine(), Seen::default());
        let t0 = Instant::now();
        restarted(&mut m, t0);
        let (mut now, mut n) = (t0, 0u64);
        for _ in 0..400 {
            let to = now + ms(rng.below(30));
            wait(&mut m, &mut seen, to);
            now = to;
            match rng.below(8) {
                0 | 1 => {
                    n += 1;
                    one_row(&mut m, &mut seen, n, now);
                }
                2..=5 if !seen.unreported.is_empty() => {
                    let i = rng.below(seen.unreported.len() as u64) as usize;
                    report(&mut m, &mut seen, i, now);
                }
                _ => {}
            }
            let Some(due) = m.poll_timeout() else {
                assert!(
                    seen.first_uncommitted.is_none(),
                    "a record left uncommitted"
                );
                continue;
            };
            assert!(due >= now, "a deadline in the past");
            let first = seen
                .first_uncommitted
                .expect("a deadline with nothing to commit");
            assert!(due <= first + INTERVAL, "waits past the interval");
            if let (true, Some(settled)) = (seen.unreported.is_empty(), seen.settled_at) {
                let paced = pace(&seen.commits).unwrap_or(settled);
                assert!(
                    due <= paced.max(settled + QUIET),
                    "the end of a burst waits"
                );
            }
        }
        for (i, c) in seen.commits.iter().enumerate() {
            let first = c.first.expect("a commit of nothing");
            if c.at < first + INTERVAL {
                assert_eq!(c.in_flight, 0, "an early commit with records in flight");
            }
            for (k, later) in seen.commits[i + 1..].iter().enumerate() {
                // The (k + 1)-th commit after this one: at least k intervals later.
                let apart = later.at - c.at;
                assert!(
                    apart >= INTERVAL * k as u32,
                    "{} commits in {apart:?}",
                    k + 2
                );
            }
        }
        runs.push(seen.commits);
    }
    let commits = runs.iter().flatten();
    let (early, late): (Vec<&Commit>, Vec<&Commit>) =
        commits.partition(|c| c.first.is_some_and(|f| c.at < f + INTERVAL));
    let (early, late) = (early.len(), late.len());
    eprintln!("{early} early commits, {late} at the interval");
    assert!(
        early > 1_000,
        "only {early} early commits: the pattern never settles"
    );
    assert!(
        late > 1_000,
        "only {late} commits at the interval: the pattern is never busy"
    );
}
