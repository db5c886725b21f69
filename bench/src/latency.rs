//! Latency at a steady rate: a writer commits `rate` rows/s (10-row transactions, ~1 KB jsonb)
//! for a fixed time while Ferry relays them.
//!
//! - Commit → Kafka acknowledgement comes from Ferry's own `ferry_replication_lag_seconds`
//!   histogram (observed per record when its delivery report arrives), the difference between
//!   snapshots taken after warm-up and after the last row was confirmed; quantiles are
//!   interpolated within buckets as Prometheus' `histogram_quantile` does, so they are only as
//!   fine as the buckets (1, 2.5, 5, 10, 25 ms, ...).
//! - Lag growth: `pg_current_wal_lsn() - confirmed_flush_lsn` of Ferry's slot, sampled every
//!   250 ms; the median of the first and of the last quarter of the run, the maximum, and how
//!   long Ferry needs after the writer stops to confirm everything.
//! - The writer pipelines its transactions over a few connections and reports the rate it
//!   actually achieved, so a writer that cannot keep up is visible rather than hidden.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_testkit::pg;

use crate::ferry::Running;
use crate::workload::{Kind, Workload};
use crate::{confirmed, current_lsn, procfs, Res};

/// Rows per transaction of the steady writer.
pub const TXN_ROWS: u64 = 10;
/// Connections the writer spreads its transactions over (one backend alone fell short of
/// 10,000 generated rows/s on a busy 2-core machine).
const WRITERS: usize = 4;

/// The payload shape of the latency runs.
pub fn workload() -> Workload {
    Workload {
        name: "steady",
        rows: 0,
        txn_rows: TXN_ROWS,
        payload: 1024,
        kind: Kind::Jsonb,
    }
}

/// What one steady-rate run measured.
#[derive(Debug, Clone, Default)]
pub struct Latency {
    pub rate: u64,
    pub achieved: f64,
    pub rows: u64,
    /// Seconds.
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub samples: u64,
    /// WAL bytes between the server's position and the slot's confirmed LSN.
    pub lag_first_quarter: u64,
    pub lag_last_quarter: u64,
    pub lag_max: u64,
    /// Seconds from the writer's last commit until Ferry confirmed it.
    pub catch_up: f64,
    pub cpu_per_100k: f64,
    pub peak_rss_mib: f64,
    /// Seconds from spawning a cold `ferry run` until its first transaction was confirmed.
    pub cold_start: f64,
}

impl Latency {
    /// Whether the slot's lag grew over the run: the last quarter's median above twice the
    /// first quarter's plus 1 MiB.
    pub fn lag_grows(&self) -> bool {
        self.lag_last_quarter > self.lag_first_quarter * 2 + (1 << 20)
    }
}

/// One steady-rate run at `rate` rows/s for `secs` seconds on a fresh slot.
pub async fn run(
    db_url: &str,
    brokers: &str,
    topic: &str,
    slot: &str,
    rate: u64,
    secs: f64,
    pinned: bool,
) -> Res<Latency> {
    let sql = Arc::new(pg::connect(db_url).await);
    let w = workload();
    sql.execute(
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
        &[&slot],
    )
    .await?;
    let spawned = Instant::now();
    let mut ferry = Running::spawn(db_url, brokers, slot, topic)?;
    // Warm up: the idempotent producer's first send waits for its producer id.
    w.insert_one_txn(&sql, 0, 100).await?;
    let warm = current_lsn(&sql).await?;
    while confirmed(&sql, slot).await? < warm {
        ferry.check_alive()?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cold_start = spawned.elapsed().as_secs_f64();
    let before = procfs::histogram(ferry.port, "ferry_replication_lag_seconds").await?;
    let cpu_before = procfs::cpu_seconds(ferry.child.id())?;

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample_lag(
        db_url.to_string(),
        slot.to_string(),
        stop.clone(),
    ));
    let (rows, elapsed) = write_load(db_url, rate, secs, pinned).await?;
    let last_commit = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let end = current_lsn(&sql).await?;
    while confirmed(&sql, slot).await? < end {
        ferry.check_alive()?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let catch_up = last_commit.elapsed().as_secs_f64();
    let lags = sampler.await??;

    let h = procfs::diff(
        &procfs::histogram(ferry.port, "ferry_replication_lag_seconds").await?,
        &before,
    );
    let cpu = procfs::cpu_seconds(ferry.child.id())? - cpu_before;
    let rss = procfs::peak_rss_kib(ferry.child.id())?;
    ferry.stop().await;
    sql.execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await?;
    sql.batch_execute("TRUNCATE outbox").await?;
    let q = lags.len() / 4;
    Ok(Latency {
        rate,
        achieved: rows as f64 / elapsed,
        rows,
        p50: procfs::quantile(&h, 0.50),
        p99: procfs::quantile(&h, 0.99),
        p999: procfs::quantile(&h, 0.999),
        samples: h.last().map(|b| b.1).unwrap_or(0),
        lag_first_quarter: median_u64(&lags[..q.max(1).min(lags.len())]),
        lag_last_quarter: median_u64(&lags[lags.len().saturating_sub(q.max(1))..]),
        lag_max: lags.iter().copied().max().unwrap_or(0),
        catch_up,
        cpu_per_100k: cpu / rows.max(1) as f64 * 100_000.0,
        peak_rss_mib: rss as f64 / 1024.0,
        cold_start,
    })
}

/// The steady writer's statement: `TXN_ROWS` rows per transaction, the ~1 KB jsonb payload a
/// parameter (parsed once per statement), so the writer costs PostgreSQL little CPU: on two
/// shared cores a writer that generates its payloads in SQL competes with Ferry and shows up
/// in Ferry's tail latency.
const STEADY_INSERT: &str = "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
     SELECT 'order', 'o-' || (g % 1000), 'OrderUpdated', $3::jsonb \
     FROM generate_series($1::bigint, $2::bigint) g";

/// A ~1 KB event shaped like the backlog workloads' (17 items with md5-like hex skus).
pub fn steady_payload() -> serde_json::Value {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let items: Vec<serde_json::Value> = (1..=17)
        .map(|i| {
            let sku: String = (0..32)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    char::from(b"0123456789abcdef"[(x % 16) as usize])
                })
                .collect();
            serde_json::json!({ "sku": sku, "qty": i })
        })
        .collect();
    serde_json::json!({ "seq": 0, "status": "paid", "items": items })
}

/// The application's writes, from `WRITERS` connections. With `--pinned` they run on a thread
/// of their own on PostgreSQL's CPU: the deployment the pinned mode models has the application
/// elsewhere, not on the relay's core (on 2 cores, that leaves the relay's core to Ferry and the
/// broker).
async fn write_load(db_url: &str, rate: u64, secs: f64, pinned: bool) -> Res<(u64, f64)> {
    let writes = move |url: String| async move {
        let mut writers = Vec::new();
        for _ in 0..WRITERS {
            writers.push(Arc::new(pg::connect(&url).await));
        }
        write_steadily(&writers, rate, secs).await
    };
    if !pinned {
        return writes(db_url.to_string()).await;
    }
    let (done, result) = tokio::sync::oneshot::channel();
    let url = db_url.to_string();
    std::thread::Builder::new()
        .name("bench-writer".into())
        .spawn(move || {
            let run = || -> Res<(u64, f64)> {
                crate::pin::pin_current_thread(crate::pin::PG_CPU)?;
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(writes(url))
            };
            let _ = done.send(run());
        })?;
    result.await?
}

/// Commits `rate` rows/s in `TXN_ROWS`-row transactions for `secs`, round-robin over
/// `sqls`; returns rows written and the time it took.
async fn write_steadily(
    sqls: &[Arc<tokio_postgres::Client>],
    rate: u64,
    secs: f64,
) -> Res<(u64, f64)> {
    /// Transactions allowed in flight before the writer waits (it has fallen behind).
    const MAX_PENDING: usize = 256;
    let payload = Arc::new(steady_payload());
    let mut stmts = Vec::new();
    for sql in sqls {
        stmts.push(sql.prepare(STEADY_INSERT).await?);
    }
    let period = Duration::from_secs_f64(TXN_ROWS as f64 / rate as f64);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let mut pending = tokio::task::JoinSet::new();
    let mut next = 1_000i64;
    while Instant::now() < until {
        tick.tick().await;
        while pending.len() >= MAX_PENDING {
            pending.join_next().await.ok_or("writer")???;
        }
        let i = (next as u64 / TXN_ROWS) as usize % sqls.len();
        let (sql, stmt, payload) = (sqls[i].clone(), stmts[i].clone(), payload.clone());
        let (first, last) = (next, next + TXN_ROWS as i64 - 1);
        pending.spawn(async move {
            sql.execute(&stmt, &[&first, &last, &*payload])
                .await
                .map(|_| ())
        });
        next += TXN_ROWS as i64;
        while let Some(done) = pending.try_join_next() {
            done??;
        }
    }
    while let Some(done) = pending.join_next().await {
        done??;
    }
    Ok(((next - 1_000) as u64, start.elapsed().as_secs_f64()))
}

/// Samples the slot's lag in bytes every 250 ms until `stop`.
async fn sample_lag(db_url: String, slot: String, stop: Arc<AtomicBool>) -> Res<Vec<u64>> {
    let sql = pg::connect(&db_url).await;
    let stmt = sql
        .prepare(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint \
             FROM pg_replication_slots WHERE slot_name = $1",
        )
        .await?;
    let mut out = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let lag: i64 = sql.query_one(&stmt, &[&slot]).await?.get(0);
        out.push(lag.max(0) as u64);
    }
    Ok(out)
}

fn median_u64(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steady_payload_is_about_a_kilobyte() {
        let text = steady_payload().to_string();
        assert!((900..1100).contains(&text.len()), "{} bytes", text.len());
        assert_eq!(steady_payload(), steady_payload());
    }

    #[test]
    fn lag_quarters_take_medians() {
        assert_eq!(median_u64(&[5, 1, 3]), 3);
        assert_eq!(median_u64(&[]), 0);
    }
}
