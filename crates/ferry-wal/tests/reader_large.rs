//! One transaction of a million outbox rows streams through the reader in bounded memory.
//!
//! With pgoutput protocol version 1 the server sends a transaction only once it committed, and
//! then all of it at once; the reader must hand rows on as they arrive (the bounded channel
//! holds it back when the consumer is slower) rather than gather the transaction. This test is
//! alone in its binary so that the process's memory is the reader's.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ferry_wal::assembly::OutboxEvent;
use ferry_wal::conn::ReaderEvent;

const ROWS: u64 = 1_000_000;
/// How much the process may grow while the transaction streams through it.
const MAX_GROWTH: u64 = 64 << 20;

/// A `kB` field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("cannot parse {line:?}"));
    kb * 1024
}

#[tokio::test]
async fn a_million_row_transaction_streams_in_bounded_memory() {
    let s = setup().await;
    let mut r = start(&s).await;

    let t0 = Instant::now();
    // ~100 bytes of jsonb payload per row.
    s.sql
        .batch_execute(&format!(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
             SELECT 'order', g::text, 'created',
                    jsonb_build_object('n', g, 'pad', repeat('x', 80))
             FROM generate_series(1, {ROWS}) g"
        ))
        .await
        .unwrap();
    let inserted = t0.elapsed();
    let table_bytes: i64 = s
        .sql
        .query_one("SELECT pg_table_size('outbox')", &[])
        .await
        .unwrap()
        .get(0);

    let rss_before = status_bytes("VmRSS:");
    let t1 = Instant::now();
    let (mut rows, mut first_row_at) = (0u64, None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    let commit = loop {
        let ev = tokio::time::timeout_at(deadline, r.recv())
            .await
            .expect("the transaction streams within 10 minutes")
            .expect("the reader is alive");
        match ev {
            ReaderEvent::Outbox(OutboxEvent::Row(row)) => {
                rows += 1;
                first_row_at.get_or_insert_with(|| t1.elapsed());
                assert_eq!(row.relation.name, "outbox");
                // Dropped here: the consumer keeps nothing.
            }
            ReaderEvent::Outbox(OutboxEvent::Commit(c)) => break c,
            ReaderEvent::Outbox(OutboxEvent::Begin(b)) => assert_eq!(rows, 0, "{b:?}"),
            ReaderEvent::Outbox(other) => panic!("unexpected {other:?}"),
            ReaderEvent::Keepalive { .. } => {}
        }
    };
    let streamed = t1.elapsed();
    let hwm = status_bytes("VmHWM:");
    let xlog_bytes = r
        .stats
        .xlog_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    r.confirm(commit.end_lsn);
    r.shutdown().await.unwrap();

    let growth = hwm.saturating_sub(rss_before);
    println!(
        "insert {ROWS} rows: {inserted:?}; first row after {:?}; streamed in {streamed:?} \
         ({:.0} rows/s); {:.1} MB of pgoutput data, table {:.1} MB; RSS before {:.1} MB, \
         peak {:.1} MB, growth {:.1} MB",
        first_row_at.unwrap_or_default(),
        ROWS as f64 / streamed.as_secs_f64(),
        xlog_bytes as f64 / 1e6,
        table_bytes as f64 / 1e6,
        rss_before as f64 / 1e6,
        hwm as f64 / 1e6,
        growth as f64 / 1e6,
    );
    assert_eq!(rows, ROWS);
    assert_eq!(commit.rows, ROWS);
    assert!(
        xlog_bytes > 2 * MAX_GROWTH,
        "the transaction ({xlog_bytes} bytes) dwarfs the allowed growth"
    );
    assert!(
        growth < MAX_GROWTH,
        "the reader grew by {growth} bytes streaming {xlog_bytes} bytes"
    );
    assert_eq!(
        slot_confirmed(&s.sql, &s.spec.slot).await,
        commit.end_lsn,
        "the commit is confirmed"
    );
}
