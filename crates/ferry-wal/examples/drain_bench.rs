//! How fast the reader drains a backlog, against `pg_recvlogical` on the same WAL.
//!
//! ```text
//! cargo run --release -p ferry-wal --example drain_bench -- [--rows 200000] [--runs 3] [--txn-rows 100]
//! ```
//!
//! Uses a private cluster (or the server named by `FERRY_TEST_PG_URL`). Each run creates two
//! identical pgoutput slots, then the backlog (`--rows` outbox rows with ~300-byte jsonb
//! payloads, in transactions of `--txn-rows`), so both slots see the same WAL; then drains one
//! with `pg_recvlogical -f /dev/null` up to the backlog's end LSN and the other with the
//! reader into a null sink that counts rows and confirms the last commit. The order alternates
//! between runs. Wall time includes connecting; CPU is the client process's user + system time
//! (`/proc/self/stat`: our own for the reader, reaped children's for `pg_recvlogical`).
//! Both clients wait on the same walsender, which decodes the WAL: on a small machine the
//! server's decoding, not the client, usually sets the pace, and the CPU columns show what
//! each client costs.

use std::error::Error;
use std::process::Command;
use std::time::{Duration, Instant};

use ferry_testkit::pg;
use ferry_wal::assembly::{OutboxEvent, OutboxSource};
use ferry_wal::conn::{self, ConnectConfig, ReaderEvent, StreamOptions};
use ferry_wal::slot;
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

#[derive(Debug)]
struct Args {
    rows: u64,
    runs: u32,
    txn_rows: u64,
}

impl Args {
    fn parse() -> Res<Args> {
        let mut a = Args {
            rows: 200_000,
            runs: 3,
            txn_rows: 100,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let value = it.next().ok_or(format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--rows" => a.rows = value.parse()?,
                "--runs" => a.runs = value.parse()?,
                "--txn-rows" => a.txn_rows = value.parse()?,
                other => return Err(format!("unknown flag {other}").into()),
            }
        }
        if a.rows == 0 || a.txn_rows == 0 || a.rows % a.txn_rows != 0 {
            return Err("--rows must be a positive multiple of --txn-rows".into());
        }
        Ok(a)
    }
}

/// CPU seconds from `/proc/self/stat`: (own user+system, reaped children's user+system).
fn cpu_seconds(ticks_per_sec: f64) -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<f64> = after_comm
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // Fields 14-17 of proc(5) (utime, stime, cutime, cstime); `f[0]` is field 3.
    let field = |n: usize| f.get(n - 3).copied().unwrap_or(0.0) / ticks_per_sec;
    (field(14) + field(15), field(16) + field(17))
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn pg_recvlogical() -> std::path::PathBuf {
    let p = pg::pg_bindir().join("pg_recvlogical");
    if p.exists() {
        p
    } else {
        "pg_recvlogical".into()
    }
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    rows: u64,
    wall: Duration,
    cpu: f64,
}

impl Sample {
    fn rate(&self) -> f64 {
        self.rows as f64 / self.wall.as_secs_f64()
    }
    fn cpu_per_100k(&self) -> f64 {
        self.cpu * 100_000.0 / self.rows as f64
    }
}

async fn create_slot(sql: &tokio_postgres::Client, name: &str) -> Res<()> {
    sql.execute(
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
        &[&name],
    )
    .await?;
    Ok(())
}

async fn drop_slot(sql: &tokio_postgres::Client, name: &str) -> Res<()> {
    // The walsender of a finished client may still be exiting.
    for _ in 0..100 {
        match sql
            .execute("SELECT pg_drop_replication_slot($1)", &[&name])
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if e.code().map(|c| c.code()) == Some("55006") => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(format!("slot {name} stayed active").into())
}

/// `pg_recvlogical` from the slot's start to `end`, output discarded.
fn drain_with_pg_recvlogical(url: &str, slot: &str, end: Lsn, rows: u64, tck: f64) -> Res<Sample> {
    let (_, children0) = cpu_seconds(tck);
    let t = Instant::now();
    let out = Command::new(pg_recvlogical())
        .args(["-d", url, "--slot", slot, "--start", "--no-loop"])
        .args(["-P", "pgoutput", "-o", "proto_version=1"])
        .args(["-o", &format!("publication_names={PUBLICATION}")])
        .args(["-f", "/dev/null", "-F", "0"])
        .args(["-E", &end.to_string()])
        .output()?;
    let wall = t.elapsed();
    let (_, children1) = cpu_seconds(tck);
    if !out.status.success() {
        return Err(format!(
            "pg_recvlogical failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(Sample {
        rows,
        wall,
        cpu: children1 - children0,
    })
}

/// The reader from the slot's start until `rows` rows and their commit arrived.
async fn drain_with_reader(
    cfg: &ConnectConfig,
    sql: &tokio_postgres::Client,
    slot_name: &str,
    rows: u64,
    tck: f64,
) -> Res<Sample> {
    let opts = StreamOptions {
        slot: slot_name.into(),
        publication: PUBLICATION.into(),
        source: OutboxSource::table("public", "outbox", None),
        status_interval: conn::stream::DEFAULT_STATUS_INTERVAL,
        channel_capacity: conn::stream::DEFAULT_CHANNEL_CAPACITY,
        binary: false,
        failover: false,
        // What Ferry's default linger (1 ms) gives.
        pause_inside_transaction: conn::stream::MAX_PAUSE_INSIDE_TRANSACTION,
        receive_timeout: Some(conn::stream::DEFAULT_RECEIVE_TIMEOUT),
    };
    let (cpu0, _) = cpu_seconds(tck);
    let t = Instant::now();
    let mut r = conn::start(cfg, sql, opts).await?;
    let mut seen = 0u64;
    while seen < rows {
        match r.recv().await {
            None => return Err(format!("reader ended after {seen} rows").into()),
            Some(ReaderEvent::Outbox(OutboxEvent::Row(_))) => seen += 1,
            Some(_) => {}
        }
    }
    // The last transaction's commit.
    let last = loop {
        match r.recv().await {
            None => return Err("reader ended before the last commit".into()),
            Some(ReaderEvent::Outbox(OutboxEvent::Commit(c))) => break c.end_lsn,
            Some(ReaderEvent::Outbox(OutboxEvent::Row(_))) => {
                return Err(format!("more than {rows} rows").into())
            }
            Some(_) => {}
        }
    };
    let wall = t.elapsed();
    let (cpu1, _) = cpu_seconds(tck);
    r.confirm(last);
    r.shutdown().await?;
    let confirmed = slot::slot_state(sql, slot_name)
        .await?
        .ok_or("slot vanished")?
        .confirmed_flush_lsn;
    if confirmed != last {
        return Err(format!("slot confirmed {confirmed}, expected {last}").into());
    }
    Ok(Sample {
        rows: seen,
        wall,
        cpu: cpu1 - cpu0,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[tokio::main]
async fn main() -> Res<()> {
    let args = Args::parse()?;
    let tck = clock_ticks();
    let db = pg::shared().create_db().await;
    let sql = db.client().await;
    sql.batch_execute(&format!(
        "{OUTBOX_DDL}; CREATE PUBLICATION {PUBLICATION} FOR TABLE outbox WITH (publish = 'insert')"
    ))
    .await?;
    let cfg = ConnectConfig::parse(&db.url)?;
    let txns = args.rows / args.txn_rows;
    let backlog = format!(
        "DO $$ BEGIN FOR t IN 0..{last} LOOP
           INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
           SELECT 'order', 'order-' || g, 'OrderCreated', jsonb_build_object(
               'order_id', g, 'customer_id', 'customer-' || (g % 1000), 'status', 'created',
               'total', (g % 10000) / 100.0, 'currency', 'EUR',
               'items', jsonb_build_array(jsonb_build_object('sku', 'sku-' || (g % 97), 'qty', 1 + g % 5)),
               'note', repeat('x', 150))
           FROM generate_series(t * {n} + 1, t * {n} + {n}) g;
           COMMIT;
         END LOOP; END $$",
        last = txns - 1,
        n = args.txn_rows
    );
    println!(
        "drain_bench: {} rows in {txns} transactions of {}, {} runs, pg_recvlogical = {}",
        args.rows,
        args.txn_rows,
        args.runs,
        pg_recvlogical().display()
    );

    let (mut recv, mut reader) = (Vec::new(), Vec::new());
    for run in 0..args.runs {
        let (a, b) = (pg::unique_name("bench_a"), pg::unique_name("bench_b"));
        create_slot(&sql, &a).await?;
        create_slot(&sql, &b).await?;
        let t = Instant::now();
        sql.batch_execute(&backlog).await?;
        let end = slot::current_wal_lsn(&sql).await?;
        let size: (i64, f64) = {
            let row = sql
                .query_one(
                    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), (SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = $1))::bigint,
                            (SELECT avg(length(payload::text)) FROM outbox)::float8",
                    &[&a],
                )
                .await?;
            (row.get(0), row.get(1))
        };
        println!(
            "run {run}: backlog inserted in {:.1?} ({:.0} MB of WAL, payload {:.0} bytes on average)",
            t.elapsed(),
            size.0 as f64 / 1e6,
            size.1
        );
        let recv_first = run % 2 == 0;
        for step in 0..2 {
            if (step == 0) == recv_first {
                let s = drain_with_pg_recvlogical(&db.url, &a, end, args.rows, tck)?;
                println!(
                    "  pg_recvlogical  {:>9.0} rows/s  wall {:>6.2}s  cpu {:>5.2}s",
                    s.rate(),
                    s.wall.as_secs_f64(),
                    s.cpu
                );
                recv.push(s);
            } else {
                let s = drain_with_reader(&cfg, &sql, &b, args.rows, tck).await?;
                println!(
                    "  ferry reader    {:>9.0} rows/s  wall {:>6.2}s  cpu {:>5.2}s",
                    s.rate(),
                    s.wall.as_secs_f64(),
                    s.cpu
                );
                reader.push(s);
            }
        }
        drop_slot(&sql, &a).await?;
        drop_slot(&sql, &b).await?;
        sql.batch_execute("TRUNCATE outbox; CHECKPOINT").await?;
    }

    println!();
    println!("| run | pg_recvlogical rows/s | reader rows/s | reader/pg_recvlogical | pg_recvlogical CPU s/100k | reader CPU s/100k |");
    println!("|---|---|---|---|---|---|");
    for (i, (p, r)) in recv.iter().zip(&reader).enumerate() {
        println!(
            "| {i} | {:.0} | {:.0} | {:.2} | {:.3} | {:.3} |",
            p.rate(),
            r.rate(),
            r.rate() / p.rate(),
            p.cpu_per_100k(),
            r.cpu_per_100k()
        );
    }
    let (p, r) = (
        median(recv.iter().map(Sample::rate).collect()),
        median(reader.iter().map(Sample::rate).collect()),
    );
    println!(
        "| median | {p:.0} | {r:.0} | {:.2} | {:.3} | {:.3} |",
        r / p,
        median(recv.iter().map(Sample::cpu_per_100k).collect()),
        median(reader.iter().map(Sample::cpu_per_100k).collect()),
    );
    Ok(())
}
