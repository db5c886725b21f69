//! The cleanup under load: the deduplication table holds `--cleanup-rows` expired event ids
//! (UUID-shaped text, `received_at` 30 days old and spread over time as they would have come;
//! inserted without indexes, then indexed and vacuumed, as a table that autovacuum keeps), and
//! `ferry inbox` takes `--cleanup-load` records/s from a steady producer while its first
//! cleanup (`inbox.cleanup_interval` = `--cleanup-after` after the start) deletes them.
//!
//! Measured:
//! - the cleanup's duration and rows (ferry's log: `took_ms`, `dedup_rows`) and its longest
//!   single DELETE (`ferry_inbox_cleanup_longest_delete_seconds`);
//! - the inbox's writes before the cleanup (its last 10 s), during it and after it (10 s):
//!   every batch's commit time exactly (its rows' `pg_xact_commit_timestamp`), so the longest
//!   gap between two consecutive commits (the longest stall of the writes), rows/s, and each
//!   record's Kafka timestamp (the producer's clock, same machine) → its commit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use ferry::config::inbox::InboxConfig;
use ferry::inbox::store::{describe, Tables};
use ferry_testkit::pg;

use super::produce::Steady;
use super::{log_dir, micros, quantile, rate, wait_rows, Ctx, InboxProc};
use crate::workload::thousands;
use crate::Res;

/// Rows per INSERT while filling the table.
const FILL_CHUNK: u64 = 1_000_000;
/// How long the load goes on after the cleanup ended.
const TAIL: Duration = Duration::from_secs(10);

pub async fn run(ctx: &Ctx) -> Res<()> {
    let n = ctx.args.cleanup_rows;
    let load = ctx.args.cleanup_load;
    println!(
        "\n[cleanup] {} expired event ids in the deduplication table; {} records/s of load; the cleanup starts {:?} after ferry inbox",
        thousands(n),
        thousands(load),
        ctx.args.cleanup_after
    );
    let (db, url) = ctx.inbox_db("bench_inbox_cleanup").await?;
    let mut sql = pg::connect(&url).await;
    let defaults = InboxConfig::default();
    let tables = Tables::new(&defaults.table_name()?, defaults.payload());
    tables.create(&mut sql).await.map_err(|e| describe(&e))?;
    let filled = Instant::now();
    fill(&sql, n)
        .await
        .map_err(|e| format!("filling the deduplication table: {}", describe(&e)))?;
    let size: String = sql
        .query_one(
            "SELECT pg_size_pretty(pg_total_relation_size('ferry_inbox_dedup'))",
            &[],
        )
        .await?
        .get(0);
    println!(
        "[cleanup] filled, indexed and vacuumed in {:.0} s: ferry_inbox_dedup is {size} with its indexes",
        filled.elapsed().as_secs_f64()
    );

    let topic = ctx.topic("inbox-cleanup").await;
    let stop = Arc::new(AtomicBool::new(false));
    let producer = Steady::start(
        &ctx.world.brokers(),
        &topic,
        ctx.args.seed,
        load,
        stop.clone(),
    )?;
    let dir = log_dir()?;
    let log = dir.join("ferry-inbox.log");
    let interval = format!("{}ms", ctx.args.cleanup_after.as_millis());
    let mut inbox = InboxProc::spawn(
        ctx,
        &url,
        &topic,
        "bench-cleanup",
        &[
            ("FERRY_INBOX_CLEANUP_INTERVAL", interval),
            ("FERRY_LOG_LEVEL", "info,ferry::inbox::store=debug".into()),
            ("FERRY_LOG_FORMAT", "json".into()),
        ],
        Some(&log),
    )?;
    // The end of the first cleanup: when its count shows in /metrics (polled every 50 ms).
    let metric = "ferry_inbox_cleanup_deleted_total{what=\"dedup\"}";
    let deadline = Instant::now() + ctx.args.cleanup_after + Duration::from_secs(3600);
    let ended = loop {
        inbox.check_alive()?;
        if inbox.metric(metric).await.unwrap_or(0.0) > 0.0 {
            break SystemTime::now();
        }
        if Instant::now() > deadline {
            return Err("the cleanup did not end within an hour".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let deleted = inbox.metric(metric).await.unwrap_or(0.0);
    let longest = inbox
        .metric("ferry_inbox_cleanup_longest_delete_seconds")
        .await
        .unwrap_or(f64::NAN);
    tokio::time::sleep(TAIL).await;
    stop.store(true, Ordering::Relaxed);
    let sent = producer.join().await?;
    wait_rows(&sql, sent as i64, Duration::from_secs(600), &mut inbox).await?;
    inbox.stop().await;
    let took = took_ms(&log).ok_or_else(|| {
        format!(
            "no \"cleanup deleted expired rows\" line in {}",
            log.display()
        )
    })?;
    let (end_us, start_us) = (micros(ended), micros(ended) - (took * 1e3) as i64);
    let deletes = delete_ms(&log);

    let rows = sql
        .query(
            "SELECT (extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1e6)::bigint, \
             (extract(epoch FROM kafka_timestamp) * 1e6)::bigint FROM ferry_inbox",
            &[],
        )
        .await
        .map_err(|e| describe(&e))?;
    let rows: Vec<(i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let first = rows.iter().map(|r| r.0).min().ok_or("no rows")?;
    // Before: the last 10 s before the cleanup (the inbox has caught up with what the producer
    // wrote while it started), at most from 5 s after the first commit.
    let before = Window::of(
        &rows,
        (start_us - 10_000_000).max(first + 5_000_000).min(start_us),
        start_us,
    );
    let during = Window::of(&rows, start_us, end_us);
    let after = Window::of(&rows, end_us, end_us + TAIL.as_micros() as i64);
    drop(sql);
    ctx.drop_db(&db).await?;
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "[cleanup] deleted {} rows in {:.1} s ({} rows/s), longest DELETE {:.1} ms (batches of inbox.cleanup_batch)",
        thousands(deleted as u64),
        took / 1e3,
        rate(deleted / (took / 1e3)),
        longest * 1e3
    );
    if !deletes.is_empty() {
        let mut sorted = deletes.clone();
        sorted.sort_by(f64::total_cmp);
        let worst = deletes
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i + 1);
        println!(
            "[cleanup] {} DELETEs: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (the {worst}th); first {:.1} ms, last {:.1} ms",
            deletes.len(),
            quantile(&sorted, 0.5),
            quantile(&sorted, 0.99),
            quantile(&sorted, 1.0),
            deletes[0],
            deletes[deletes.len() - 1],
        );
    }
    println!(
        "\n| the inbox's writes at {} records/s | before the cleanup | during it | after it |\n| --- | ---: | ---: | ---: |\n{}",
        thousands(load),
        Window::rows(&[&before, &during, &after])
    );
    Ok(())
}

/// Fills the deduplication table with `n` expired ids, fast: without its indexes, then built.
async fn fill(sql: &tokio_postgres::Client, n: u64) -> Result<(), tokio_postgres::Error> {
    sql.batch_execute(
        "ALTER TABLE ferry_inbox_dedup DROP CONSTRAINT ferry_inbox_dedup_pkey; \
         DROP INDEX ferry_inbox_dedup_received",
    )
    .await?;
    let insert = sql
        .prepare(
            "INSERT INTO ferry_inbox_dedup (event_id, received_at) \
             SELECT md5('expired-' || g)::uuid::text, \
                    now() - interval '30 days' + g * interval '100 microseconds' \
             FROM generate_series($1::bigint, $2::bigint) g",
        )
        .await?;
    let mut first = 1u64;
    while first <= n {
        let last = (first + FILL_CHUNK - 1).min(n);
        sql.execute(&insert, &[&(first as i64), &(last as i64)])
            .await?;
        first = last + 1;
    }
    sql.batch_execute(
        "ALTER TABLE ferry_inbox_dedup ADD PRIMARY KEY (event_id); \
         CREATE INDEX ferry_inbox_dedup_received ON ferry_inbox_dedup (received_at)",
    )
    .await?;
    sql.batch_execute("VACUUM ANALYZE ferry_inbox_dedup")
        .await?;
    sql.batch_execute("CHECKPOINT").await?;
    Ok(())
}

/// The `took_ms` of ferry's first "cleanup deleted expired rows" line (JSON log).
fn took_ms(log: &std::path::Path) -> Option<f64> {
    std::fs::read_to_string(log).ok()?.lines().find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(l).ok()?;
        (v["message"] == "cleanup deleted expired rows")
            .then(|| v["took_ms"].as_f64())
            .flatten()
    })
}

/// Each DELETE of the first cleanup, ms, in order (ferry's debug lines "cleanup DELETE").
fn delete_ms(log: &std::path::Path) -> Vec<f64> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut out = Vec::new();
    for l in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(l) else {
            continue;
        };
        if v["message"] == "cleanup deleted expired rows" {
            break;
        }
        if v["message"] == "cleanup DELETE" {
            out.extend(v["took_us"].as_f64().map(|us| us / 1e3));
        }
    }
    out
}

/// The inbox's commits within a window.
#[derive(Debug, Default)]
struct Window {
    secs: f64,
    rows: u64,
    commits: u64,
    /// The longest time between two consecutive commits (the window's edges count as one).
    longest_gap_ms: f64,
    /// Kafka timestamp → commit, ms, sorted.
    latency: Vec<f64>,
}

impl Window {
    /// `rows` are (commit µs, Kafka timestamp µs).
    fn of(rows: &[(i64, i64)], from: i64, to: i64) -> Window {
        let inside: Vec<&(i64, i64)> = rows
            .iter()
            .filter(|(c, _)| (from..to).contains(c))
            .collect();
        let mut commits: Vec<i64> = inside.iter().map(|r| r.0).collect();
        commits.sort_unstable();
        commits.dedup();
        let mut edges = vec![from];
        edges.extend(&commits);
        edges.push(to);
        let longest = edges.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        let mut latency: Vec<f64> = inside.iter().map(|(c, k)| (c - k) as f64 / 1e3).collect();
        latency.sort_by(f64::total_cmp);
        Window {
            secs: (to - from).max(0) as f64 / 1e6,
            rows: inside.len() as u64,
            commits: commits.len() as u64,
            longest_gap_ms: longest as f64 / 1e3,
            latency,
        }
    }

    fn rows(ws: &[&Window]) -> String {
        let line = |name: &str, f: &dyn Fn(&Window) -> String| {
            format!(
                "| {name} | {} |\n",
                ws.iter().map(|w| f(w)).collect::<Vec<_>>().join(" | ")
            )
        };
        let mut s = line("window", &|w| format!("{:.1} s", w.secs));
        s += &line("records/s committed", &|w| {
            rate(w.rows as f64 / w.secs.max(1e-9))
        });
        s += &line("transactions", &|w| w.commits.to_string());
        s += &line("**longest gap between commits**", &|w| {
            format!("**{:.0} ms**", w.longest_gap_ms)
        });
        s += &line("Kafka timestamp → commit p50 / p99 / max", &|w| {
            format!(
                "{:.0} / {:.0} / {:.0} ms",
                quantile(&w.latency, 0.5),
                quantile(&w.latency, 0.99),
                quantile(&w.latency, 1.0)
            )
        });
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_counts_its_commits_and_its_longest_gap() {
        // Commits at 10, 20 (two rows), 70; the window is [0, 100).
        let rows = [(10, 5), (20, 15), (20, 18), (70, 60), (150, 140)];
        let w = Window::of(&rows, 0, 100);
        assert_eq!((w.rows, w.commits), (4, 3));
        assert_eq!(w.longest_gap_ms, 0.05); // 20 → 70 µs
        assert_eq!(w.latency, vec![0.002, 0.005, 0.005, 0.01]);
        let empty = Window::of(&rows, 80, 140);
        assert_eq!((empty.rows, empty.longest_gap_ms), (0, 0.06));
    }
}
