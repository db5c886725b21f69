//! Deterministic simulation of the session machine ([`ferry_core::Session`]) in both delivery
//! modes: the real machine and the real router, driven as the binary drives them through one
//! simulated PostgreSQL and one simulated Kafka, with crashes, aborts, unseen commits, refusals,
//! failures, stalls and out-of-order acknowledgements drawn from a seed, and checked at every
//! step against a reference model. The harness is `tests/sim/`: what it models is in its
//! modules' documentation, the guarantees it checks in `sim/model.rs`.
//!
//! A failing seed prints itself with its mode:
//! `FERRY_SIM_SEED=<seed> FERRY_SIM_MODE=<mode> cargo test -p ferry-core --test simulation`
//! replays it alone; `FERRY_SIM_SEEDS=<n>` runs more seeds per mode.

mod common;
mod sim;

use std::time::Instant;

use sim::{Mode, Seen};

fn run(mode: Mode, default_seeds: u64, first_seed: u64) {
    if let Ok(only) = std::env::var("FERRY_SIM_MODE") {
        if only != mode.to_string() {
            eprintln!("{mode}: skipped (FERRY_SIM_MODE={only})");
            return;
        }
    }
    let seeds: Vec<u64> = match std::env::var("FERRY_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("FERRY_SIM_SEED is a number")],
        Err(_) => {
            let n: u64 = std::env::var("FERRY_SIM_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(default_seeds);
            (0..n).map(|i| first_seed + i).collect()
        }
    };
    let started = Instant::now();
    let mut seen = Seen::default();
    for &seed in &seeds {
        match std::panic::catch_unwind(|| sim::run_seed(seed, mode)) {
            Ok(s) => seen.add(&s),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                    "seed {seed} failed in {mode} mode: {msg}\nreplay: FERRY_SIM_SEED={seed} FERRY_SIM_MODE={mode} cargo test -p ferry-core --test simulation"
                );
            }
        }
    }
    let elapsed = started.elapsed();
    eprintln!(
        "{mode}: {} seeds in {elapsed:?} ({:.0} seeds/s)",
        seeds.len(),
        seeds.len() as f64 / elapsed.as_secs_f64()
    );
    let counts = seen.counts();
    let required = Seen::required(mode);
    let line: Vec<String> = counts
        .iter()
        .filter(|(k, n)| *n > 0 || required.contains(k))
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    eprintln!("{mode}: exercised: {}", line.join(", "));
    if seeds.len() > 100 {
        // The faults the simulation is about did happen.
        for kind in required {
            let n = counts.iter().find(|(k, _)| *k == kind).map_or(0, |c| c.1);
            assert!(n > 0, "{mode}: no seed exercised {kind}: {seen:?}");
        }
    }
}

#[test]
fn at_least_once_keeps_its_promises_under_random_faults() {
    run(Mode::AtLeastOnce, 2_000, 0x5eed_0000);
}

#[test]
fn exactly_once_keeps_its_promises_under_random_faults() {
    run(Mode::ExactlyOnce, 1_000, 0xe05_0000);
}
