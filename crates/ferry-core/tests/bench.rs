//! Rough cost of the relay core per row, for the next engineer to measure (no timing is asserted):
//!
//! ```sh
//! cargo test --release -p ferry-core --test bench -- --ignored --nocapture
//! ```
//!
//! Each round feeds transactions of 100 rows through the real core and the real router (default
//! mapping), drains every action and acknowledges every record, as the driver does; the best of
//! several rounds is printed (the figure least disturbed by other work on the machine). With
//! `tables = 2` every other row belongs to a second outbox table with its own router. The same
//! rows through the session machine (at-least-once, progress records acknowledged at once) say
//! what the machine adds to the relay core, with 100 rows and with 1 row per transaction. The
//! relay core with `route.position_headers` and without, interleaved, says what the two headers
//! cost a row.

mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use common::*;
use ferry_core::{Action, Relay, Session, SessionAction, SessionConfig};
use ferry_router::{oid, OnError, OutboxConfig, RouteConfig, Routers, TableConfig};
use ferry_wal::assembly::OutboxEvent;
use ferry_wal::Lsn;

const ROUNDS: usize = 5;
const TXNS: u64 = 2_000;
const ROWS_PER_TXN: u64 = 100;

fn routers(tables: usize, position_headers: bool) -> Arc<Routers> {
    let extra: Vec<TableConfig> = (1..tables)
        .map(|i| TableConfig {
            outbox: OutboxConfig {
                table: format!("s{i}.outbox"),
                ..OutboxConfig::default()
            },
            route: RouteConfig::default(),
        })
        .collect();
    let route = RouteConfig {
        position_headers,
        ..RouteConfig::default()
    };
    Arc::new(Routers::new(&OutboxConfig::default(), &route, &extra).unwrap())
}

/// Nanoseconds per row of the best round.
fn run(tables: usize, position_headers: bool) -> f64 {
    let rel = relation(oid::JSONB);
    let payload = r#"{"orderId": 42, "total": 39.98, "items": [{"sku": "A-1", "qty": 2}]}"#;
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        let mut cfg = config(OnError::Fail, 10_000, 1 << 30);
        cfg.routers = routers(tables, position_headers);
        let mut r: Relay<String> = Relay::new(cfg);
        r.set_source("7312345678901234567/1/ferry");
        r.start(Lsn(1), false);
        let mut lsn = 100u64;
        let mut tokens = Vec::with_capacity(ROWS_PER_TXN as usize);
        let now = Instant::now();
        let start = Instant::now();
        for txn in 0..TXNS {
            let commit_lsn = lsn + ROWS_PER_TXN * 10 + 5;
            r.handle_outbox(begin(txn as u32 + 1, commit_lsn), now);
            for i in 0..ROWS_PER_TXN {
                let ev = row(&rel, txn as u32 + 1, lsn, i, "order-42", Some(payload));
                let ev = match ev {
                    OutboxEvent::Row(mut row) => {
                        row.table = (i as usize) % tables;
                        OutboxEvent::Row(row)
                    }
                    other => other,
                };
                r.handle_outbox(ev, now);
                lsn += 10;
            }
            r.handle_outbox(commit(txn as u32 + 1, commit_lsn, commit_lsn + 8), now);
            lsn = commit_lsn + 16;
            while let Some(a) = r.poll_action() {
                if let Action::Produce { token, record } = a {
                    black_box(&record);
                    tokens.push(token);
                }
            }
            for t in tokens.drain(..) {
                r.handle_report(t, Ok(()), now);
            }
            while let Some(a) = r.poll_action() {
                black_box(&a);
            }
        }
        let ns = start.elapsed().as_nanos() as f64 / (TXNS * ROWS_PER_TXN) as f64;
        best = best.min(ns);
    }
    best
}

/// Nanoseconds per row of the best round, through the session machine.
fn run_session(rows_per_txn: u64) -> f64 {
    let rel = relation(oid::JSONB);
    let payload = r#"{"orderId": 42, "total": 39.98, "items": [{"sku": "A-1", "qty": 2}]}"#;
    let txns = TXNS * ROWS_PER_TXN / rows_per_txn;
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        let mut m: Session<TestError> = Session::new(SessionConfig {
            relay: config(OnError::Fail, 10_000, 1 << 30),
            transactions: None,
            progress_topic: "progress".into(),
        });
        let now = Instant::now();
        m.start_at_least_once(Lsn(1), false, Some(Lsn(1)), now);
        let mut lsn = 100u64;
        let mut tokens = Vec::with_capacity(rows_per_txn as usize + 1);
        let start = Instant::now();
        for txn in 0..txns {
            let commit_lsn = lsn + rows_per_txn * 10 + 5;
            m.handle_outbox(begin(txn as u32 + 1, commit_lsn), now);
            for i in 0..rows_per_txn {
                let ev = row(&rel, txn as u32 + 1, lsn, i, "order-42", Some(payload));
                m.handle_outbox(ev, now);
                lsn += 10;
            }
            m.handle_outbox(commit(txn as u32 + 1, commit_lsn, commit_lsn + 8), now);
            lsn = commit_lsn + 16;
            while let Some(a) = m.poll_action() {
                match a {
                    SessionAction::Produce { token, record } => {
                        black_box(&record);
                        tokens.push(token);
                    }
                    SessionAction::ProduceProgress { token, .. } => tokens.push(token),
                    a => _ = black_box(a),
                }
            }
            for t in tokens.drain(..) {
                m.handle_report(t, Ok(()), now);
            }
            while let Some(a) = m.poll_action() {
                if let SessionAction::ProduceProgress { token, .. } = a {
                    m.handle_report(token, Ok(()), now);
                }
            }
        }
        let ns = start.elapsed().as_nanos() as f64 / (txns * rows_per_txn) as f64;
        best = best.min(ns);
    }
    best
}

#[test]
#[ignore = "measurement, run by hand with --release --ignored --nocapture"]
fn relay_core_cost_per_row() {
    for rows in [ROWS_PER_TXN, 1] {
        println!(
            "session machine, at-least-once, {rows} row(s) per transaction: {:.0} ns/row (best of {ROUNDS} rounds)",
            run_session(rows)
        );
    }
    for tables in [1, 2] {
        println!(
            "relay core, {tables} table(s): {:.0} ns/row (route, track, acknowledge, confirm; best of {ROUNDS} rounds of {} rows)",
            run(tables, false),
            TXNS * ROWS_PER_TXN
        );
    }
    // Interleaved, so that both see the same machine load.
    for _ in 0..2 {
        println!(
            "relay core, 1 table, route.position_headers off / on: {:.0} / {:.0} ns/row",
            run(1, false),
            run(1, true)
        );
    }
}
