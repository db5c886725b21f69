//! Deterministic simulation of the inbox machine ([`ferry_core::inbox::Inbox`]): one or two
//! instances of a consumer group, each a real machine with its consumer, driven through a
//! simulated Kafka (topics whose logs grow while the run goes, with offset gaps, upstream
//! duplicates, poison payloads and Ferry's replays) and a simulated PostgreSQL (conditional
//! offset advances, deduplication by id, dead letters, marks, cleanup), with rebalances,
//! zombies, crashes, database restarts and lost COMMIT answers drawn from a seed. The harness is
//! `tests/inbox_sim/`: what it models is in its modules' documentation.
//!
//! Checked at every step, for every seed:
//!
//! 1. every Kafka record gets at most one fate (a row in the inbox, a dead letter, dropped as a
//!    duplicate by id or by position), each for a reason; at the end, exactly one;
//! 2. at the end every event id of a record that is not meant for the dead letters is in the
//!    inbox exactly once (duplicates come within the deduplication window), and never twice on
//!    the way;
//! 3. a partition's stored next offset never goes backwards; an instance never commits a
//!    partition another instance committed after its load, and is fenced only then; a fenced
//!    machine stops with `Stop(Err(Fenced))`;
//! 4. the rows of a partition are stored in offset order;
//! 5. `CommitOffsets` reports only offsets the database committed;
//! 6. every machine asks for a cleanup every interval (after the last one ended), and no dedup
//!    row outlives the window by more than one interval and a cleanup while a machine runs;
//! 7. a machine buffers at most `max_buffered_bytes` and one record, when handed records only
//!    while it wants them;
//! 8. once faults and production end, everything is stored within a bounded time, and every
//!    machine shuts down with `Stop(Ok)`;
//!
//! and the driver's contract: a machine loads, seeks and writes only partitions its consumer
//! holds, one write at a time, batches within bounds, epochs increasing, `Revoked` only for
//! revoked partitions with no write to them in flight, nothing after `Stop`, and a due
//! `poll_timeout` is no longer due after `handle_timeout` (a driver would spin).
//!
//! A failing seed prints itself: `FERRY_SIM_SEED=<seed> cargo test -p ferry-core --test
//! inbox_simulation` replays it alone (`FERRY_SIM_TRACE=1` prints every input and action);
//! `FERRY_SIM_SEEDS=<n>` runs more seeds.

mod inbox_sim;

use std::time::Instant;

use inbox_sim::Seen;

#[test]
fn the_inbox_keeps_its_promises_under_random_faults() {
    let seeds: Vec<u64> = match std::env::var("FERRY_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("FERRY_SIM_SEED is a number")],
        Err(_) => {
            let n: u64 = std::env::var("FERRY_SIM_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(2_000);
            (0..n).map(|i| 0x1b0c_0000 + i).collect()
        }
    };
    // `FERRY_SIM_KEEP_GOING=1`: every seed runs; the failures are summed up at the end (to see
    // what a change to the machine breaks, and where first).
    let keep_going = std::env::var_os("FERRY_SIM_KEEP_GOING").is_some();
    let mut failures: Vec<(u64, String)> = Vec::new();
    let started = Instant::now();
    let mut seen = Seen::default();
    let (mut settle, mut ticks, mut lag) = (0, 0, 0);
    let mut gaps = Vec::new();
    for &seed in &seeds {
        match std::panic::catch_unwind(|| inbox_sim::run_seed(seed)) {
            Ok(r) => {
                seen.add(&r.seen);
                settle = settle.max(r.settle);
                ticks += r.ticks;
                lag = lag.max(r.max_lag);
                gaps.push((r.max_dup_gap, seed));
            }
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                if keep_going {
                    failures.push((seed, msg));
                    continue;
                }
                panic!(
                    "seed {seed} failed: {msg}\nreplay: FERRY_SIM_SEED={seed} cargo test -p ferry-core --test inbox_simulation"
                );
            }
        }
    }
    let elapsed = started.elapsed();
    eprintln!(
        "inbox: {} seeds in {elapsed:?} ({:.0} seeds/s), {ticks} ticks, longest settling {settle} ticks",
        seeds.len(),
        seeds.len() as f64 / elapsed.as_secs_f64()
    );
    // How far apart the copies of an event id were committed: the deduplication window must
    // exceed it for exactly once to hold.
    gaps.sort_unstable();
    if let Some(&(max, seed)) = gaps.last() {
        eprintln!(
            "inbox: a record waited up to {lag} ticks; an id's copies were committed up to {max} \
             ticks apart (seed {seed}; p99 {}, window {})",
            gaps[gaps.len() * 99 / 100].0,
            inbox_sim::WINDOW
        );
    }
    if !failures.is_empty() {
        // The first seed of each kind of failure (its message up to the first digit).
        let mut kinds: Vec<(String, u64, usize)> = Vec::new();
        for (seed, msg) in &failures {
            let kind: String = msg.chars().take_while(|c| !c.is_ascii_digit()).collect();
            match kinds.iter_mut().find(|k| k.0 == kind) {
                Some(k) => k.2 += 1,
                None => kinds.push((kind, *seed, 1)),
            }
        }
        for (_, seed, n) in &kinds {
            let msg = &failures.iter().find(|f| f.0 == *seed).unwrap().1;
            eprintln!("{n} seeds, first {seed}: {msg}");
        }
        panic!("{} of {} seeds failed", failures.len(), seeds.len());
    }
    let counts = seen.counts();
    let line: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    eprintln!("inbox: exercised: {}", line.join(", "));
    if seeds.len() >= 1_000 {
        // The faults the simulation is about did happen.
        for kind in Seen::required() {
            let n = counts.iter().find(|(k, _)| *k == kind).map_or(0, |c| c.1);
            assert!(n > 0, "no seed exercised {kind}: {seen:?}");
        }
    }
}
