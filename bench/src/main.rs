//! Ferry's end-to-end benchmark: the `ferry` binary against `pg_recvlogical` on the same WAL.
//!
//! ```text
//! cargo build --release -p ferry -p ferry-bench && target/release/ferry-bench [--rows 200000] [--txn-rows 100] [--payload 300] [--runs 3] [--rate 2000] [--latency-secs 20]
//! ```
//!
//! Starts a private PostgreSQL cluster and a local broker (or uses `FERRY_TEST_PG_URL` /
//! `FERRY_TEST_KAFKA_BROKERS`). For each run it creates two identical slots, then a backlog of
//! `--rows` outbox rows (jsonb payloads of about `--payload` bytes) in transactions of
//! `--txn-rows`, so both slots see the same WAL, and drains one with `pg_recvlogical -P
//! pgoutput` (the physical read limit) and the other with `ferry run` until the slot's
//! `confirmed_flush_lsn` reaches the backlog's end (read → route → produce with acks=all →
//! confirm). The contenders alternate order between runs; figures are medians. Ferry's CPU
//! seconds and peak RSS come from `/proc/<pid>`.
//!
//! Then a latency run: a writer commits `--rate` rows/s (10-row transactions) for
//! `--latency-secs` seconds while Ferry relays them; commit → Kafka acknowledgement latency
//! is read from Ferry's own `ferry_replication_lag_seconds` histogram (quantiles interpolated
//! within buckets, as Prometheus does).

mod procfs;

use std::error::Error;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferry_testkit::kafka;
use ferry_testkit::pg::{self, PgCluster};
use ferry_testkit::process::{free_port, signal, spawn_owned};
use ferry_wal::Lsn;

type Res<T> = Result<T, Box<dyn Error>>;

const OUTBOX_DDL: &str = "CREATE TABLE outbox (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregatetype text NOT NULL,
    aggregateid text NOT NULL,
    type text NOT NULL,
    payload jsonb
)";
const PUBLICATION: &str = "ferry_outbox";

struct Args {
    rows: u64,
    txn_rows: u64,
    payload: usize,
    runs: u32,
    rate: u64,
    latency_secs: u64,
}

impl Args {
    fn parse() -> Res<Args> {
        let mut a = Args {
            rows: 200_000,
            txn_rows: 100,
            payload: 300,
            runs: 3,
            rate: 2000,
            latency_secs: 20,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let v = it.next().ok_or(format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--rows" => a.rows = v.parse()?,
                "--txn-rows" => a.txn_rows = v.parse()?,
                "--payload" => a.payload = v.parse()?,
                "--runs" => a.runs = v.parse()?,
                "--rate" => a.rate = v.parse()?,
                "--latency-secs" => a.latency_secs = v.parse()?,
                other => return Err(format!("unknown flag {other} (see the module docs)").into()),
            }
        }
        Ok(a)
    }
}

/// The `ferry` binary: `FERRY_BIN`, else beside this executable.
fn ferry_bin() -> Res<PathBuf> {
    if let Ok(p) = std::env::var("FERRY_BIN") {
        return Ok(p.into());
    }
    let p = std::env::current_exe()?.with_file_name("ferry");
    if !p.exists() {
        return Err(format!(
            "{} not found: build it with `cargo build --release -p ferry -p ferry-bench`, or set FERRY_BIN",
            p.display()
        )
        .into());
    }
    Ok(p)
}

struct World {
    _cluster: Option<PgCluster>,
    _broker: Option<kafka::LocalBroker>,
    admin_url: String,
    brokers: String,
}

async fn world() -> Res<World> {
    let (cluster, admin_url) = match std::env::var(pg::PG_URL_ENV) {
        Ok(u) if !u.is_empty() => (None, u),
        _ => {
            let c = PgCluster::start(pg::ClusterOptions {
                tls: false,
                extra_conf: vec![
                    "shared_buffers = '256MB'".into(),
                    "max_wal_size = '4GB'".into(),
                ],
            })
            .await;
            let u = c.url("postgres");
            (Some(c), u)
        }
    };
    let (broker, brokers) = match std::env::var(kafka::BROKERS_ENV) {
        Ok(b) if !b.is_empty() => (None, b),
        _ => {
            let b = kafka::LocalBroker::start().await;
            let s = b.brokers();
            (Some(b), s)
        }
    };
    Ok(World {
        _cluster: cluster,
        _broker: broker,
        admin_url,
        brokers,
    })
}

async fn current_lsn(sql: &tokio_postgres::Client) -> Res<Lsn> {
    let s: String = sql
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    Ok(s.parse()?)
}

async fn confirmed(sql: &tokio_postgres::Client, slot: &str) -> Res<Lsn> {
    let s: Option<String> = sql
        .query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?
        .get(0);
    Ok(s.ok_or("slot has no confirmed_flush_lsn")?.parse()?)
}

async fn insert_backlog(
    sql: &tokio_postgres::Client,
    rows: u64,
    txn_rows: u64,
    payload: usize,
) -> Res<()> {
    let pad = "x".repeat(payload.saturating_sub(60));
    let stmt = format!(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
         SELECT 'order', 'o-' || (g % 1000), 'OrderUpdated', \
                jsonb_build_object('seq', g, 'status', 'paid', 'pad', '{pad}') \
         FROM generate_series($1::bigint, $2::bigint) g"
    );
    let mut done = 0;
    while done < rows {
        let n = txn_rows.min(rows - done);
        sql.execute(&stmt, &[&(done as i64), &((done + n - 1) as i64)])
            .await?;
        done += n;
    }
    Ok(())
}

struct Sample {
    secs: f64,
    cpu: f64,
    peak_rss_kib: u64,
}

fn pg_recvlogical(url: &str, slot: &str, end: Lsn) -> Res<Sample> {
    let before = procfs::children_cpu_seconds();
    let start = Instant::now();
    let out = Command::new(pg::pg_bindir().join("pg_recvlogical"))
        .args([
            "-d",
            url,
            "--slot",
            slot,
            "--start",
            "--no-loop",
            "-P",
            "pgoutput",
        ])
        .args([
            "-o",
            "proto_version=1",
            "-o",
            &format!("publication_names={PUBLICATION}"),
        ])
        .args(["-f", "/dev/null", "-F", "0", "-E", &end.to_string()])
        .output()?;
    let secs = start.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(format!("pg_recvlogical: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(Sample {
        secs,
        cpu: procfs::children_cpu_seconds() - before,
        peak_rss_kib: 0,
    })
}

/// Starts `ferry run` on `slot`; returns it once it streams.
fn spawn_ferry(
    url: &str,
    brokers: &str,
    slot: &str,
    topic: &str,
) -> Res<(std::process::Child, u16)> {
    let port = free_port();
    let mut cmd = Command::new(ferry_bin()?);
    cmd.arg("run")
        .env_clear()
        .env("FERRY_POSTGRES_URL", url)
        .env("FERRY_POSTGRES_SLOT", slot)
        .env("FERRY_POSTGRES_PUBLICATION", PUBLICATION)
        .env("FERRY_KAFKA_BROKERS", brokers)
        .env("FERRY_ROUTE_TOPIC", topic)
        .env("FERRY_HTTP_LISTEN", format!("127.0.0.1:{port}"))
        .env("FERRY_LOG_LEVEL", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    Ok((spawn_owned(cmd, libc::SIGKILL)?, port))
}

async fn ferry_drain(
    w: &World,
    db_url: &str,
    sql: &tokio_postgres::Client,
    slot: &str,
    topic: &str,
    end: Lsn,
) -> Res<Sample> {
    let start = Instant::now();
    let (mut child, _) = spawn_ferry(db_url, &w.brokers, slot, topic)?;
    let pid = child.id();
    loop {
        if confirmed(sql, slot).await? >= end {
            break;
        }
        if let Some(status) = child.try_wait()? {
            return Err(format!("ferry exited early: {status}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = procfs::cpu_seconds(pid)?;
    let peak_rss_kib = procfs::peak_rss_kib(pid)?;
    signal(&child, libc::SIGTERM);
    let _ = child.wait();
    Ok(Sample {
        secs,
        cpu,
        peak_rss_kib,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> Res<()> {
    let args = Args::parse()?;
    let w = world().await?;
    let admin = pg::connect(&w.admin_url).await;
    let db = pg::unique_name("bench");
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await?;
    let db_url = pg::with_dbname(&w.admin_url, &db);
    let sql = pg::connect(&db_url).await;
    sql.batch_execute(OUTBOX_DDL).await?;
    sql.batch_execute(&format!(
        "CREATE PUBLICATION {PUBLICATION} FOR TABLE outbox WITH (publish = 'insert')"
    ))
    .await?;
    let topic = "bench.{aggregatetype}";
    kafka::create_topic(&w.brokers, "bench.order", 6).await;
    let version: String = sql.query_one("SHOW server_version", &[]).await?.get(0);
    println!(
        "ferry-bench: {} rows in {}-row transactions, ~{} B jsonb payloads, {} runs; PostgreSQL {version}; {} cores",
        args.rows,
        args.txn_rows,
        args.payload,
        args.runs,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );

    let (mut pgr, mut fer, mut cpu, mut rss) = (vec![], vec![], vec![], vec![]);
    for run in 0..args.runs {
        let (a, b) = (format!("bench_a_{run}"), format!("bench_b_{run}"));
        for s in [&a, &b] {
            sql.execute(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[s],
            )
            .await?;
        }
        insert_backlog(&sql, args.rows, args.txn_rows, args.payload).await?;
        let end = current_lsn(&sql).await?;
        let order: [bool; 2] = if run % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for recv_first in order {
            if recv_first {
                let s = pg_recvlogical(&db_url, &a, end)?;
                println!(
                    "  run {run}: pg_recvlogical {:>9.0} rows/s ({:.2}s, {:.2} CPU s)",
                    args.rows as f64 / s.secs,
                    s.secs,
                    s.cpu
                );
                pgr.push(args.rows as f64 / s.secs);
            } else {
                let s = ferry_drain(&w, &db_url, &sql, &b, topic, end).await?;
                println!(
                    "  run {run}: ferry         {:>9.0} rows/s ({:.2}s, {:.2} CPU s, peak RSS {} MiB)",
                    args.rows as f64 / s.secs,
                    s.secs,
                    s.cpu,
                    s.peak_rss_kib / 1024
                );
                fer.push(args.rows as f64 / s.secs);
                cpu.push(s.cpu / args.rows as f64 * 100_000.0);
                rss.push(s.peak_rss_kib as f64 / 1024.0);
            }
        }
        for s in [&a, &b] {
            sql.execute("SELECT pg_drop_replication_slot($1)", &[s])
                .await?;
        }
        sql.batch_execute("TRUNCATE outbox").await?;
    }
    let (p, f) = (median(pgr), median(fer));
    println!();
    println!("| contender | rows/s (median) | MB/s | vs pg_recvlogical | CPU s / 100k rows | peak RSS MiB |");
    println!("|---|---|---|---|---|---|");
    let mb = |r: f64| r * args.payload as f64 / 1e6;
    println!(
        "| pg_recvlogical -P pgoutput | {p:.0} | {:.1} | 100% | – | – |",
        mb(p)
    );
    println!(
        "| ferry end to end (acks=all, confirmed) | {f:.0} | {:.1} | {:.0}% | {:.2} | {:.0} |",
        mb(f),
        f / p * 100.0,
        median(cpu),
        median(rss)
    );
    latency(&args, &w, &db_url, &sql, topic).await?;
    Ok(())
}

/// Steady writer at `--rate` rows/s while Ferry relays; commit → ack quantiles from Ferry's histogram.
async fn latency(
    args: &Args,
    w: &World,
    db_url: &str,
    sql: &tokio_postgres::Client,
    topic: &str,
) -> Res<()> {
    let slot = "bench_latency";
    sql.execute(
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
        &[&slot],
    )
    .await?;
    let (mut child, port) = spawn_ferry(db_url, &w.brokers, slot, topic)?;
    // Warm up: the idempotent producer's first send waits for its producer id.
    insert_backlog(sql, 100, 10, args.payload).await?;
    let warm = current_lsn(sql).await?;
    while confirmed(sql, slot).await? < warm {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = procfs::histogram(port, "ferry_replication_lag_seconds").await?;
    let txn_rows = 10u64;
    let period = Duration::from_secs_f64(txn_rows as f64 / args.rate as f64);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let until = Instant::now() + Duration::from_secs(args.latency_secs);
    let mut rows = 0;
    while Instant::now() < until {
        tick.tick().await;
        insert_backlog(sql, txn_rows, txn_rows, args.payload).await?;
        rows += txn_rows;
    }
    let end = current_lsn(sql).await?;
    while confirmed(sql, slot).await? < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = procfs::histogram(port, "ferry_replication_lag_seconds").await?;
    let h = procfs::diff(&after, &before);
    signal(&child, libc::SIGTERM);
    let _ = child.wait();
    println!();
    println!(
        "latency: {rows} rows at {} rows/s over {}s (10-row transactions), commit → Kafka ack:",
        args.rate, args.latency_secs
    );
    println!(
        "| p50 | p99 | p999 | samples |\n|---|---|---|---|\n| {:.1} ms | {:.1} ms | {:.1} ms | {} |",
        procfs::quantile(&h, 0.50) * 1e3,
        procfs::quantile(&h, 0.99) * 1e3,
        procfs::quantile(&h, 0.999) * 1e3,
        h.last().map(|b| b.1).unwrap_or(0)
    );
    Ok(())
}
