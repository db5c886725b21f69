//! Latency at a steady rate: a writer commits `rate` rows/s (10-row transactions, ~1 KB jsonb)
//! for a fixed time while Ferry relays them.
//!
//! - Commit → Kafka acknowledgement comes from Ferry's own `ferry_replication_lag_seconds`
//!   histogram (observed per record when its delivery report arrives), the difference between
//!   snapshots taken after warm-up and after the last row was confirmed; quantiles are
//!   interpolated within buckets as Prometheus' `histogram_quantile` does, so they are only as
//!   fine as the buckets (1, 2.5, 5, 7.5, 10, 15, 25 ms, ...).
//! - Lag growth: `pg_current_wal_lsn() - confirmed_flush_lsn` of Ferry's slot, sampled every
//!   250 ms; the median of the first and of the last quarter of the run, the maximum, and how
//!   long Ferry needs after the writer stops to confirm everything.
//! - Commit → appended in Kafka, for every relay alike: each row's commit timestamp
//!   (`pg_xact_commit_timestamp`, the server has `track_commit_timestamp = on`) against its
//!   record's `LogAppendTime` (the topic's timestamp type: the broker's clock, same machine),
//!   joined on the `id` header; exact quantiles over every record, to the millisecond the broker
//!   stamps. Debezium has no histogram of its own, so this is its only latency figure.
//! - The writer pipelines its transactions over a few connections and reports the rate it
//!   actually achieved, so a writer that cannot keep up is visible rather than hidden.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_testkit::pg;

use crate::ferry::Running;
use crate::kafka::Watch;
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

/// Which relay a steady-rate run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Relay {
    #[default]
    Ferry,
    Debezium,
}

impl Relay {
    pub fn label(self) -> &'static str {
        match self {
            Relay::Ferry => "Ferry",
            Relay::Debezium => "Debezium",
        }
    }

    /// The contender key in the topic name: `order.steady.<key>`.
    pub fn key(self) -> &'static str {
        match self {
            Relay::Ferry => "ferry",
            Relay::Debezium => "debezium",
        }
    }
}

/// What one steady-rate run measured.
#[derive(Debug, Clone, Default)]
pub struct Latency {
    pub relay: Relay,
    pub rate: u64,
    pub achieved: f64,
    pub rows: u64,
    /// Seconds, from Ferry's histogram (NaN for Debezium, which has none).
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub samples: u64,
    /// Seconds from the commit (`pg_xact_commit_timestamp`) to the broker appending the record
    /// (its `LogAppendTime`), over every record of the run: the same measure for every relay.
    /// NaN when the server does not track commit timestamps.
    pub kafka_p50: f64,
    pub kafka_p99: f64,
    pub kafka_p999: f64,
    pub kafka_samples: u64,
    /// Seconds from the commit to the server sending the transaction, from Ferry's
    /// `ferry_source_delay_seconds` (PostgreSQL's share of the latency; NaN for Debezium).
    pub source_p50: f64,
    pub source_p99: f64,
    /// The relay's walsender over the writer's run, as shares of the run's wall time: on a CPU,
    /// and runnable but waiting for one (`/proc/<pid>/schedstat`); NaN when not known.
    pub walsender_cpu: f64,
    pub walsender_waiting: f64,
    /// WAL bytes between the server's position and the slot's confirmed LSN.
    pub lag_first_quarter: u64,
    pub lag_last_quarter: u64,
    pub lag_max: u64,
    /// Seconds from the writer's last commit until Ferry confirmed it (Debezium: until Kafka
    /// held every record; it confirms its slot lazily).
    pub catch_up: f64,
    pub cpu_per_100k: f64,
    pub peak_rss_mib: f64,
    /// Seconds from spawning the relay until its warm-up transaction was relayed (Ferry:
    /// confirmed in the slot; Debezium: in Kafka).
    pub cold_start: f64,
}

impl Latency {
    /// Whether the slot's lag grew over the run: the last quarter's median above twice the
    /// first quarter's plus 1 MiB.
    pub fn lag_grows(&self) -> bool {
        self.lag_last_quarter > self.lag_first_quarter * 2 + (1 << 20)
    }
}

/// The relay process of a steady-rate run.
enum Proc {
    Ferry(Running),
    Debezium(ferry_testkit::debezium::Connect),
}

impl Proc {
    fn pid(&self) -> Res<u32> {
        match self {
            Proc::Ferry(f) => Ok(f.child.id()),
            Proc::Debezium(c) => c.pid().ok_or_else(|| "Debezium's worker is gone".into()),
        }
    }

    fn check_alive(&mut self) -> Res<()> {
        match self {
            Proc::Ferry(f) => f.check_alive(),
            Proc::Debezium(c) => Ok(c.check_alive()?),
        }
    }

    async fn stop(self) {
        match self {
            Proc::Ferry(f) => f.stop().await,
            Proc::Debezium(c) => c.kill(),
        }
    }
}

/// Rows of the warm-up transaction.
const WARM_UP_ROWS: u64 = 100;

/// One steady-rate run at `rate` rows/s for `secs` seconds on a fresh slot, relayed by `relay`
/// to `order.steady.<relay>` (a topic with `message.timestamp.type=LogAppendTime`).
pub async fn run(
    db_url: &str,
    brokers: &str,
    relay: Relay,
    slot: &str,
    rate: u64,
    secs: f64,
    pinned: bool,
) -> Res<Latency> {
    let sql = Arc::new(pg::connect(db_url).await);
    let w = workload();
    let topic = crate::kafka::topic("steady", relay.key());
    sql.execute(
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
        &[&slot],
    )
    .await?;
    let spawned = Instant::now();
    let mut proc = match relay {
        Relay::Ferry => Proc::Ferry(Running::spawn(
            db_url,
            brokers,
            slot,
            "{aggregatetype}.steady.ferry",
        )?),
        Relay::Debezium => {
            let config = crate::debezium::connector(db_url, slot, "steady.debezium", w.kind)?;
            Proc::Debezium(crate::debezium::start(brokers, None, config).await)
        }
    };
    // Warm up: the idempotent producer's first send waits for its producer id.
    let mut watch = Watch::start(brokers, &topic, WARM_UP_ROWS as i64)?;
    let base = watch.base;
    w.insert_one_txn(&sql, 0, WARM_UP_ROWS).await?;
    let warm = current_lsn(&sql).await?;
    watch
        .wait_all(Duration::from_secs(120), || proc.check_alive())
        .await?;
    drop(watch);
    if matches!(proc, Proc::Ferry(_)) {
        while confirmed(&sql, slot).await? < warm {
            proc.check_alive()?;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let cold_start = spawned.elapsed().as_secs_f64();
    let before = match &proc {
        Proc::Ferry(f) => Some((
            procfs::histogram(f.port, "ferry_replication_lag_seconds").await?,
            procfs::histogram(f.port, "ferry_source_delay_seconds").await?,
        )),
        Proc::Debezium(_) => None,
    };
    let cpu_before = procfs::cpu_seconds(proc.pid()?)?;

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample_lag(
        db_url.to_string(),
        slot.to_string(),
        stop.clone(),
    ));
    let walsender = walsender_pid(&sql, slot).await;
    let sched_before = walsender.and_then(procfs::sched_seconds);
    let writer_start = std::time::SystemTime::now();
    let Written {
        rows,
        elapsed,
        commits,
    } = write_load(db_url, rate, secs, pinned).await?;
    let last_commit = Instant::now();
    let sched = match (sched_before, walsender.and_then(procfs::sched_seconds)) {
        (Some(a), Some(b)) => ((b.0 - a.0) / elapsed, (b.1 - a.1) / elapsed),
        _ => (f64::NAN, f64::NAN),
    };
    stop.store(true, Ordering::Relaxed);
    let end = current_lsn(&sql).await?;
    if matches!(proc, Proc::Ferry(_)) {
        while confirmed(&sql, slot).await? < end {
            proc.check_alive()?;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    } else {
        let total = base + (WARM_UP_ROWS + rows) as i64;
        let mut watch = Watch::until(brokers, &topic, total)?;
        watch
            .wait_all(Duration::from_secs(300), || proc.check_alive())
            .await?;
    }
    let catch_up = last_commit.elapsed().as_secs_f64();
    let lags = sampler.await??;

    let (h, source) = match (&proc, before) {
        (Proc::Ferry(f), Some((lag, source))) => (
            procfs::diff(
                &procfs::histogram(f.port, "ferry_replication_lag_seconds").await?,
                &lag,
            ),
            procfs::diff(
                &procfs::histogram(f.port, "ferry_source_delay_seconds").await?,
                &source,
            ),
        ),
        _ => (Vec::new(), Vec::new()),
    };
    let source_q = |q: f64| {
        if source.is_empty() {
            f64::NAN
        } else {
            procfs::quantile(&source, q)
        }
    };
    let cpu = procfs::cpu_seconds(proc.pid()?)? - cpu_before;
    let rss = procfs::peak_rss_kib(proc.pid()?)?;
    proc.stop().await;
    let kafka = commit_to_kafka(&sql, brokers, &topic, writer_start, rows).await?;
    if !kafka.is_empty() {
        print_commit_returned(&commit_returned(&sql, writer_start, &commits).await?);
    }
    crate::drop_slot(&sql, slot).await?;
    sql.batch_execute("TRUNCATE outbox").await?;
    let q = lags.len() / 4;
    let exact = |q: f64| exact_quantile(&kafka, q);
    Ok(Latency {
        relay,
        rate,
        achieved: rows as f64 / elapsed,
        rows,
        p50: procfs::quantile(&h, 0.50),
        p99: procfs::quantile(&h, 0.99),
        p999: procfs::quantile(&h, 0.999),
        samples: h.last().map(|b| b.1).unwrap_or(0),
        kafka_p50: exact(0.50),
        kafka_p99: exact(0.99),
        kafka_p999: exact(0.999),
        kafka_samples: kafka.len() as u64,
        source_p50: source_q(0.50),
        source_p99: source_q(0.99),
        walsender_cpu: sched.0,
        walsender_waiting: sched.1,
        lag_first_quarter: median_u64(&lags[..q.max(1).min(lags.len())]),
        lag_last_quarter: median_u64(&lags[lags.len().saturating_sub(q.max(1))..]),
        lag_max: lags.iter().copied().max().unwrap_or(0),
        catch_up,
        cpu_per_100k: cpu / rows.max(1) as f64 * 100_000.0,
        peak_rss_mib: rss as f64 / 1024.0,
        cold_start,
    })
}

/// Commit → appended in Kafka, seconds, sorted, for every row committed after `since`: the
/// row's commit timestamp (`pg_xact_commit_timestamp`, microseconds) against its record's
/// `LogAppendTime` (milliseconds, so half a millisecond is added: the expected truncation).
/// Empty when the server does not track commit timestamps.
async fn commit_to_kafka(
    sql: &tokio_postgres::Client,
    brokers: &str,
    topic: &str,
    since: std::time::SystemTime,
    rows: u64,
) -> Res<Vec<f64>> {
    let on: String = sql
        .query_one("SHOW track_commit_timestamp", &[])
        .await?
        .get(0);
    if on != "on" {
        eprintln!("  (track_commit_timestamp is off: no commit → Kafka latency)");
        return Ok(Vec::new());
    }
    let since_us = since.duration_since(std::time::UNIX_EPOCH)?.as_micros() as i64;
    let commits: std::collections::HashMap<String, i64> = sql
        .query(
            "SELECT id::text, (extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1e6)::bigint \
             FROM outbox",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .filter(|(_, t): &(String, i64)| *t >= since_us)
        .collect();
    if commits.len() as u64 != rows {
        return Err(format!(
            "{} rows committed during the run, the writer counted {rows}",
            commits.len()
        )
        .into());
    }
    let appended = crate::kafka::append_times(brokers, topic, Duration::from_secs(300)).await?;
    // (second of the run the row was committed in, seconds to the broker)
    let timed: Vec<(usize, f64)> = appended
        .iter()
        .filter_map(|(id, ms)| {
            let c = commits.get(id)?;
            let second = usize::try_from((c - since_us) / 1_000_000).unwrap_or(0);
            Some((second, ((*ms as f64 + 0.5) * 1e3 - *c as f64) / 1e6))
        })
        .collect();
    if timed.len() as u64 != rows {
        return Err(format!("{topic}: {} of the run's {rows} rows found", timed.len()).into());
    }
    println!("  commit → in Kafka: {}", by_second(&timed));
    let mut out: Vec<f64> = timed.into_iter().map(|(_, l)| l).collect();
    out.sort_by(f64::total_cmp);
    Ok(out)
}

/// The pid of the walsender streaming `slot`, if one does.
async fn walsender_pid(sql: &tokio_postgres::Client, slot: &str) -> Option<u32> {
    let row = sql
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .ok()??;
    row.get::<_, Option<i32>>(0)
        .and_then(|p| u32::try_from(p).ok())
}

/// The `q` quantile of `sorted` (the smallest value with at least `q` of them at or below it);
/// NaN when empty.
fn exact_quantile(sorted: &[f64], q: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(f64::NAN)
}

/// Prints commit → returned to the writer: by second of the run, then its quantiles.
fn print_commit_returned(returned: &[(usize, f64)]) {
    println!(
        "  commit → returned to the writer (PostgreSQL's flush): {}",
        by_second(returned)
    );
    let mut all: Vec<f64> = returned.iter().map(|r| r.1).collect();
    all.sort_by(f64::total_cmp);
    let ms = |q: f64| exact_quantile(&all, q) * 1e3;
    println!(
        "  commit → returned to the writer: p50 {:.1} ms, p99 {:.1} ms, p999 {:.1} ms over {} \
         transactions",
        ms(0.5),
        ms(0.99),
        ms(0.999),
        all.len()
    );
}

/// Where in the run the tail is: the p99 of the rows committed in each second of
/// the run, in milliseconds (a tail spread over the run is not one that a pause at its start
/// makes).
fn by_second(timed: &[(usize, f64)]) -> String {
    let seconds = timed.iter().map(|(s, _)| s + 1).max().unwrap_or(0);
    let mut each: Vec<Vec<f64>> = vec![Vec::new(); seconds];
    for &(s, l) in timed {
        each[s].push(l);
    }
    let p99s: Vec<String> = each
        .iter_mut()
        .map(|v| {
            v.sort_by(f64::total_cmp);
            match v.len() {
                0 => "-".to_string(),
                _ => format!("{:.0}", exact_quantile(v, 0.99) * 1e3),
            }
        })
        .collect();
    format!("p99 by second of the run (ms): {}", p99s.join(" "))
}

/// The steady writer's statement: `TXN_ROWS` rows per transaction, the ~1 KB jsonb payload a
/// parameter (parsed once per statement), so the writer costs PostgreSQL little CPU: on two
/// shared cores a writer that generates its payloads in SQL competes with Ferry and shows up
/// in Ferry's tail latency.
const STEADY_INSERT: &str = "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
     SELECT 'order', 'o-' || (g % 1000), 'OrderUpdated', $3::jsonb \
     FROM generate_series($1::bigint, $2::bigint) g RETURNING xmin::text::bigint";

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
pub(crate) async fn write_load(db_url: &str, rate: u64, secs: f64, pinned: bool) -> Res<Written> {
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
            let run = || -> Res<Written> {
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

/// What the steady writer did.
pub(crate) struct Written {
    pub rows: u64,
    /// Seconds from the first transaction to the last commit.
    pub elapsed: f64,
    /// Per transaction: its id and when its commit returned to the writer (µs since the epoch).
    pub commits: Vec<(i64, i64)>,
}

/// Commits `rate` rows/s in `TXN_ROWS`-row transactions for `secs`, round-robin over
/// `sqls`; returns rows written, the time it took and when each commit returned.
async fn write_steadily(
    sqls: &[Arc<tokio_postgres::Client>],
    rate: u64,
    secs: f64,
) -> Res<Written> {
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
    let mut commits = Vec::new();
    let mut next = 1_000i64;
    while Instant::now() < until {
        tick.tick().await;
        while pending.len() >= MAX_PENDING {
            commits.push(pending.join_next().await.ok_or("writer")???);
        }
        let i = (next as u64 / TXN_ROWS) as usize % sqls.len();
        let (sql, stmt, payload) = (sqls[i].clone(), stmts[i].clone(), payload.clone());
        let (first, last) = (next, next + TXN_ROWS as i64 - 1);
        pending.spawn(async move {
            let rows = sql.query(&stmt, &[&first, &last, &*payload]).await?;
            let returned = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as i64);
            Ok::<_, tokio_postgres::Error>((rows.first().map_or(0, |r| r.get(0)), returned))
        });
        next += TXN_ROWS as i64;
        while let Some(done) = pending.try_join_next() {
            commits.push(done??);
        }
    }
    while let Some(done) = pending.join_next().await {
        commits.push(done??);
    }
    Ok(Written {
        rows: (next - 1_000) as u64,
        elapsed: start.elapsed().as_secs_f64(),
        commits,
    })
}

/// Commit → the commit returned to the writer, seconds, sorted, with the second of the run each
/// transaction committed in: its commit timestamp against the moment its `INSERT` (an implicit
/// transaction) returned. A logical slot sends a transaction only once its commit is flushed, as
/// the writer's commit returns only then: this is PostgreSQL's own share of every relay's
/// latency (WAL write and flush, the wake-ups), before any relay could see the rows.
async fn commit_returned(
    sql: &tokio_postgres::Client,
    since: std::time::SystemTime,
    commits: &[(i64, i64)],
) -> Res<Vec<(usize, f64)>> {
    let since_us = since.duration_since(std::time::UNIX_EPOCH)?.as_micros() as i64;
    let xids: Vec<i64> = commits.iter().map(|c| c.0).collect();
    let at: std::collections::HashMap<i64, i64> = sql
        .query(
            "SELECT x, (extract(epoch FROM pg_xact_commit_timestamp(x::text::xid)) * 1e6)::bigint \
             FROM unnest($1::bigint[]) x",
            &[&xids],
        )
        .await?
        .iter()
        .filter_map(|r| Some((r.get::<_, i64>(0), r.get::<_, Option<i64>>(1)?)))
        .collect();
    Ok(commits
        .iter()
        .filter_map(|(x, returned)| {
            let c = at.get(x)?;
            let second = usize::try_from((c - since_us) / 1_000_000).unwrap_or(0);
            Some((second, (returned - c) as f64 / 1e6))
        })
        .collect())
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
