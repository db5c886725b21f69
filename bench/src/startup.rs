//! Start-up: how long until Ferry's first record is acknowledged, three ways.
//!
//! - **cold start**: a 10-row transaction waits in a fresh slot; `ferry run` is spawned; the
//!   clock runs from the spawn until Ferry's `ferry_records_produced_total` (records Kafka
//!   acknowledged) is above zero. Includes process start, configuration, the check queries,
//!   the topic watch, the progress topic created (a first start: none exists yet), the Kafka
//!   producer getting its producer id, the replication connection.
//! - **standby takeover**: Ferry stands by while another connection holds the slot (its producer
//!   warmed up meanwhile); the clock runs from the holder letting go until the first
//!   acknowledgement: noticing the free slot, connecting, streaming. The holder holds the slot's
//!   hand-over lock as a streaming Ferry does, and lets go of both at once, as a dying one
//!   does; the standby polls at Ferry's default interval (`FERRY_BENCH_STANDBY_POLL_MS` sets
//!   another).
//! - **restart after kill -9**: a Ferry that has relayed a transaction is killed with SIGKILL
//!   and a new one spawned at once with the same configuration (the same slot, and the same
//!   progress topic, holding the killed Ferry's progress records, as a restarted pod finds
//!   them), while a new 10-row transaction is written; the clock runs from the kill until the
//!   new process's first acknowledgement (the walsender has to notice the dead connection
//!   first: until then the slot is active and the new Ferry stands by). With `--startup-fill N`
//!   the killed Ferry's progress topic first gets N more records ([`fill_progress`]), as an hour
//!   of streaming leaves them.
//!
//! Beside Ferry's own count, a consumer positioned at the topic's end times the first record of
//! the waiting transaction in Kafka, the figure Debezium is measured by ([`run_debezium`]: cold
//! start and restart after kill -9; a standby takeover has no Debezium counterpart).
//!
//! The first acknowledgement is observed by polling Ferry's `/metrics` every 2 ms, so each
//! figure is late by up to that (and by the HTTP listener's own start for a cold start, which
//! comes before the pipeline). Figures are medians over `--startup N` runs of each kind.

use std::time::{Duration, Instant};

use ferry_testkit::pg;
use ferry_testkit::process::signal;

use crate::ferry::{Holder, Running};
use crate::kafka::{FirstOf, Watch};
use crate::workload::{Kind, Workload};
use crate::{confirmed, current_lsn, procfs, Res};

/// What the start-up runs measured, seconds per run.
#[derive(Debug, Clone, Default)]
pub struct Startup {
    /// Ferry, to its first acknowledgement (its metric).
    pub cold: Vec<f64>,
    pub takeover: Vec<f64>,
    pub restart: Vec<f64>,
    /// Ferry, to the first record of the waiting transaction seen in Kafka (a consumer).
    pub cold_kafka: Vec<f64>,
    pub restart_kafka: Vec<f64>,
    /// Debezium, to the first record of the waiting transaction seen in Kafka.
    pub debezium_cold: Vec<f64>,
    pub debezium_restart: Vec<f64>,
    /// CPU seconds spent while each kind's clock ran (Ferry's, index 0: cold, 1: restart, 2:
    /// takeover).
    pub cpu: [Vec<Cpu>; 3],
    /// `--outage-for`: the broker's outage under a running Ferry, and from the broker back to
    /// every record written meanwhile acknowledged ([`outage`]).
    pub outage_for: Option<Duration>,
    pub outage: Vec<f64>,
    /// `--pg-outage-for`: PostgreSQL's outage under a running Ferry, and from the server back
    /// to a transaction written then acknowledged ([`pg_outage`]).
    pub pg_outage_for: Option<Duration>,
    pub pg_outage: Vec<f64>,
}

/// CPU spent while one start-up's clock ran, seconds: whether the machine, not Ferry's chain of
/// round trips, set the figure (`--pinned`: Ferry, the broker and this harness share CPU 1).
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    pub wall: f64,
    /// The Ferry process timed (a cold start or restart: all of it; a takeover: since the
    /// slot was freed).
    pub ferry: f64,
    /// The local broker, if the harness started it.
    pub broker: Option<f64>,
    /// This harness (its 2 ms polls of `/metrics`, the consumer watching for the record).
    pub harness: f64,
}

/// The CPU counters a [`Cpu`] is the difference of.
struct CpuMark {
    at: Instant,
    ferry: f64,
    broker: Option<f64>,
    harness: f64,
}

impl CpuMark {
    /// Now; `ferry`: the timed process, if it runs already.
    fn now(ferry: Option<u32>, broker: Option<u32>) -> CpuMark {
        CpuMark {
            at: Instant::now(),
            ferry: ferry
                .and_then(|p| procfs::cpu_seconds(p).ok())
                .unwrap_or(0.0),
            broker: broker.and_then(|p| procfs::cpu_seconds(p).ok()),
            harness: procfs::self_cpu_seconds(),
        }
    }

    /// What was spent since this mark, read at once (right after the first acknowledgement).
    fn since(&self, ferry: u32, broker: Option<u32>) -> Cpu {
        let now = CpuMark::now(Some(ferry), broker);
        Cpu {
            wall: self.at.elapsed().as_secs_f64(),
            ferry: now.ferry - self.ferry,
            broker: now.broker.zip(self.broker).map(|(a, b)| a - b),
            harness: now.harness - self.harness,
        }
    }
}

impl Startup {
    /// The markdown table: median and min–max per kind, milliseconds.
    pub fn table(&self) -> String {
        let mut o = String::from(
            "| relay | from → to | runs | median | min–max |\n|---|---|--:|--:|--:|\n",
        );
        let ack = "first record acknowledged (Ferry's metric)";
        let seen = "first record of the waiting transaction in Kafka (a consumer)";
        for (who, from, to, v) in [
            ("Ferry", "process start (cold)", ack, &self.cold),
            ("Ferry", "process start (cold)", seen, &self.cold_kafka),
            (
                "Debezium",
                "process start (cold)",
                seen,
                &self.debezium_cold,
            ),
            ("Ferry", "kill -9 → restarted process", ack, &self.restart),
            (
                "Ferry",
                "kill -9 → restarted process",
                seen,
                &self.restart_kafka,
            ),
            (
                "Debezium",
                "kill -9 → restarted process",
                seen,
                &self.debezium_restart,
            ),
            ("Ferry", "slot freed → warm standby", ack, &self.takeover),
            (
                "Ferry",
                "the broker listed again after an outage (`--outage-for`)",
                "every record written during it acknowledged (Ferry's metric)",
                &self.outage,
            ),
            (
                "Ferry",
                "PostgreSQL accepting connections after an outage (`--pg-outage-for`)",
                "a transaction written then acknowledged (Ferry's metric)",
                &self.pg_outage,
            ),
        ] {
            if v.is_empty() {
                continue;
            }
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = v.iter().copied().fold(0.0, f64::max);
            o += &format!(
                "| {who} | {from} → {to} | {} | {:.0} ms | {:.0}–{:.0} ms |\n",
                v.len(),
                crate::report::median(v) * 1e3,
                min * 1e3,
                max * 1e3
            );
        }
        o
    }

    /// The CPU table: per kind, means over the runs, milliseconds (the counters tick every
    /// 10 ms, so one run's figure is coarse; the mean of several is not).
    pub fn cpu_table(&self) -> String {
        let mut o = String::from(
            "| Ferry start-up | runs | wall | Ferry CPU | broker CPU | harness CPU | CPU ÷ wall |\n|---|--:|--:|--:|--:|--:|--:|\n",
        );
        for (kind, v) in ["cold start", "restart after kill -9", "standby takeover"]
            .iter()
            .zip(&self.cpu)
        {
            if v.is_empty() {
                continue;
            }
            let mean = |f: &dyn Fn(&Cpu) -> f64| v.iter().map(f).sum::<f64>() / v.len() as f64;
            let broker = v.iter().all(|c| c.broker.is_some());
            let b = mean(&|c| c.broker.unwrap_or(0.0));
            let (wall, ferry, harness) =
                (mean(&|c| c.wall), mean(&|c| c.ferry), mean(&|c| c.harness));
            o += &format!(
                "| {kind} | {} | {:.0} ms | {:.0} ms | {} | {:.0} ms | {:.0}% |\n",
                v.len(),
                wall * 1e3,
                ferry * 1e3,
                if broker {
                    format!("{:.0} ms", b * 1e3)
                } else {
                    "–".into()
                },
                harness * 1e3,
                (ferry + b + harness) / wall * 100.0
            );
        }
        o
    }
}

/// The small transaction each run relays.
fn workload() -> Workload {
    Workload {
        name: "startup",
        rows: 10,
        txn_rows: 10,
        payload: 1024,
        kind: Kind::Jsonb,
    }
}

/// Polls until Ferry reports an acknowledged record; seconds since `since`.
async fn first_ack(ferry: &mut Running, since: Instant) -> Res<f64> {
    wait_produced(ferry, 1, since, Duration::from_secs(60)).await?;
    Ok(since.elapsed().as_secs_f64())
}

/// One run of each kind on fresh slots of the database at `url` (which has the outbox table).
///
/// `broker`: the local broker's process, whose CPU is counted beside Ferry's.
pub async fn run(
    url: &str,
    brokers: &str,
    topic: &str,
    run: u32,
    broker: Option<u32>,
    fill: u32,
    out: &mut Startup,
) -> Res<()> {
    let sql = pg::connect(url).await;
    let w = workload();
    let slot = |kind: &str| format!("bench_start_{kind}_{run}");
    for s in ["cold", "takeover"] {
        sql.execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot(s)],
        )
        .await?;
    }

    // Cold start (its Ferry is then killed for the restart).
    let kafka_topic = topic.replace("{aggregatetype}", "order");
    let before = current_lsn(&sql).await?;
    w.insert_one_txn(&sql, 0, w.rows).await?;
    let end = current_lsn(&sql).await?;
    let seen = FirstOf::start(brokers, &kafka_topic, 0..w.rows, DEADLINE)?;
    let mark = CpuMark::now(None, broker);
    let spawned = Instant::now();
    let mut ferry = Running::spawn(url, brokers, &slot("cold"), topic)?;
    out.cold.push(first_ack(&mut ferry, spawned).await?);
    out.cpu[0].push(mark.since(ferry.child.id(), broker));
    out.cold_kafka
        .push((seen.wait().await? - spawned).as_secs_f64());
    // The transaction confirmed before the kill. `end` may lie past its commit (a standby
    // snapshot record the server logged meanwhile), and with `wal_sender_timeout = 0` no
    // keepalive need report that WAL: a confirmed LSN past `before` that stays put for 2 s
    // with every row acknowledged is the transaction's end.
    let (mut last, mut since) = (before, Instant::now());
    loop {
        let c = confirmed(&sql, &slot("cold")).await?;
        if c >= end {
            break;
        }
        if c != last {
            (last, since) = (c, Instant::now());
        }
        if c > before
            && since.elapsed() > Duration::from_secs(2)
            && ferry.produced().await == Some(w.rows as f64)
        {
            break;
        }
        ferry.check_alive()?;
        if spawned.elapsed() > DEADLINE {
            return Err(format!("ferry did not confirm {end} within {DEADLINE:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    if fill > 0 {
        fill_progress(brokers, ferry.progress_topic(), fill).await?;
    }

    // Restart after kill -9: a new transaction is written as the replacement starts, so that
    // what it acknowledges first is new work, not only a replay (and not, as when it was
    // written before the kill, work the killed Ferry may have relayed already).
    let seen = FirstOf::start(brokers, &kafka_topic, 100..100 + w.rows, DEADLINE)?;
    let mark = CpuMark::now(None, broker);
    signal(&ferry.child, libc::SIGKILL);
    let killed = Instant::now();
    let _ = ferry.child.wait();
    // The same configuration, progress topic included: it holds the killed Ferry's records.
    let mut again = ferry.restart()?;
    w.insert_one_txn(&sql, 100, w.rows).await?;
    out.restart.push(first_ack(&mut again, killed).await?);
    out.cpu[1].push(mark.since(again.child.id(), broker));
    out.restart_kafka
        .push((seen.wait().await? - killed).as_secs_f64());
    again.stop().await;

    // Standby takeover: the holder has the slot while Ferry starts and warms up.
    let holder = Holder::hold(url, &slot("takeover")).await?;
    w.insert_one_txn(&sql, 200, w.rows).await?;
    let mut standby = Running::spawn(url, brokers, &slot("takeover"), topic)?;
    let spawned = Instant::now();
    while spawned.elapsed() < Duration::from_millis(1500)
        || standby.metric("ferry_standby").await != Some(1.0)
    {
        standby.check_alive()?;
        if spawned.elapsed() > Duration::from_secs(60) {
            return Err("ferry did not stand by within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Freed at a point of the standby's poll cycle that moves run by run. The wait above ends
    // on the harness's 20 ms grid a fixed time after the spawn, and the standby polls on a cycle
    // fixed by its own start-up: freed at the same point of that cycle in every run, a build
    // whose start-up took a few ms longer or shorter waited a different share of the cycle in
    // every run (round 32: 10 ms between two builds' medians whose take-over chains differed
    // the other way). Spread by the golden ratio, any seven runs cover the cycle evenly.
    let offset = (f64::from(run) * 0.618_033_988_75).fract();
    tokio::time::sleep(crate::ferry::standby_poll().mul_f64(offset)).await;
    let mark = CpuMark::now(Some(standby.child.id()), broker);
    let released = Instant::now();
    drop(holder);
    out.takeover.push(first_ack(&mut standby, released).await?);
    out.cpu[2].push(mark.since(standby.child.id(), broker));
    standby.stop().await;

    for s in ["cold", "takeover"] {
        crate::drop_slot(&sql, &slot(s)).await?;
    }
    sql.batch_execute("TRUNCATE outbox").await?;
    Ok(())
}

/// How long a first record may take.
const DEADLINE: Duration = Duration::from_secs(120);

/// A broker outage under a running Ferry: Ferry streams on a fresh slot and has relayed a
/// transaction; the local broker is stopped (SIGTERM, waited for), a 10-row transaction is
/// written, and `outage_for` after the stop ended the broker is started again on the same port
/// (returning once the harness's own client sees the cluster list it, which is after it accepts
/// connections). The clock runs from then until Ferry reports those 10 records
/// acknowledged: how soon the producer is connected and producing again (librdkafka's
/// `reconnect.backoff.*` pace its attempts while the broker is away). It starts a little late,
/// by the same for any build.
pub async fn outage(
    url: &str,
    broker: &ferry_testkit::kafka::LocalBroker,
    topic: &str,
    run: u32,
    outage_for: Duration,
    out: &mut Startup,
) -> Res<()> {
    let slot = format!("bench_outage_{run}");
    let Relaying {
        sql, w, mut ferry, ..
    } = relaying(url, &broker.brokers(), &slot, topic).await?;
    tokio::task::block_in_place(|| broker.stop());
    let stopped = Instant::now();
    w.insert_one_txn(&sql, 100, w.rows).await?;
    // The fault's length, not a wait for a condition.
    tokio::time::sleep(outage_for.saturating_sub(stopped.elapsed())).await;
    tokio::task::block_in_place(|| broker.start_again());
    let back = Instant::now();
    wait_produced(&mut ferry, 2 * w.rows, back, DEADLINE).await?;
    out.outage.push(back.elapsed().as_secs_f64());
    ferry.stop().await;
    crate::drop_slot(&sql, &slot).await?;
    sql.batch_execute("TRUNCATE outbox").await?;
    Ok(())
}

/// A PostgreSQL outage under a running Ferry: Ferry streams on a fresh slot and has relayed a
/// transaction; the benchmark's cluster is stopped (fast shutdown, waited for), and
/// `outage_for` after the stop ended it is started again (returning once `pg_isready` says it
/// accepts connections). The stop waits until the slot is confirmed past the first transaction,
/// so that the stream does not replay it. The clock runs from then until Ferry reports a 10-row
/// transaction, written at once on a new connection, acknowledged: how soon Ferry streams again (its
/// sessions back off from `postgres.reconnect_backoff_min` while the server is away). It
/// starts a little late, by the same for any build.
pub async fn pg_outage(
    url: &str,
    brokers: &str,
    cluster: &ferry_testkit::pg::PgCluster,
    topic: &str,
    run: u32,
    outage_for: Duration,
    out: &mut Startup,
) -> Res<()> {
    let slot = format!("bench_pg_outage_{run}");
    let Relaying {
        sql,
        w,
        mut ferry,
        written,
        spawned,
    } = relaying(url, brokers, &slot, topic).await?;
    // Confirmed in the slot: after the restart the stream starts past it, and Ferry's count
    // grows only by the transaction written then (not by this one, replayed).
    while confirmed(&sql, &slot).await? < written {
        ferry.check_alive()?;
        if spawned.elapsed() > DEADLINE {
            return Err(
                format!("the slot was not confirmed past {written} within {DEADLINE:?}").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(sql);
    tokio::task::block_in_place(|| cluster.stop(false));
    let stopped = Instant::now();
    // The fault's length, not a wait for a condition.
    tokio::time::sleep(outage_for.saturating_sub(stopped.elapsed())).await;
    tokio::task::block_in_place(|| cluster.start_again());
    let back = Instant::now();
    let sql = pg::connect(url).await;
    w.insert_one_txn(&sql, 100, w.rows).await?;
    wait_produced(&mut ferry, 2 * w.rows, back, DEADLINE).await?;
    out.pg_outage.push(back.elapsed().as_secs_f64());
    ferry.stop().await;
    crate::drop_slot(&sql, &slot).await?;
    sql.batch_execute("TRUNCATE outbox").await?;
    Ok(())
}

/// A Ferry relaying on a fresh slot `slot`, which has relayed the one transaction written
/// before it started ([`relaying`]).
struct Relaying {
    sql: tokio_postgres::Client,
    w: Workload,
    ferry: Running,
    /// The WAL's end once that transaction was written.
    written: ferry_wal::Lsn,
    spawned: Instant,
}

/// Creates `slot`, writes a transaction, starts Ferry on the slot and waits until it reports
/// the transaction's records acknowledged.
async fn relaying(url: &str, brokers: &str, slot: &str, topic: &str) -> Res<Relaying> {
    let sql = pg::connect(url).await;
    let w = workload();
    sql.execute(
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
        &[&slot],
    )
    .await?;
    w.insert_one_txn(&sql, 0, w.rows).await?;
    let written = current_lsn(&sql).await?;
    let spawned = Instant::now();
    let mut ferry = Running::spawn(url, brokers, slot, topic)?;
    wait_produced(&mut ferry, w.rows, spawned, DEADLINE).await?;
    Ok(Relaying {
        sql,
        w,
        ferry,
        written,
        spawned,
    })
}

/// Polls every 2 ms until Ferry reports `n` records acknowledged, at most `deadline` after
/// `since`.
async fn wait_produced(ferry: &mut Running, n: u64, since: Instant, deadline: Duration) -> Res<()> {
    while ferry.produced().await.is_none_or(|p| p < n as f64) {
        ferry.check_alive()?;
        if since.elapsed() > deadline {
            return Err(format!(
                "ferry did not report {n} record(s) acknowledged within {deadline:?}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// Writes `n` records of another key (~90 bytes each, as progress records are) to
/// `progress_topic` and waits for their acknowledgements: what a restart finds after an hour of
/// streaming (about five progress records a second while busy), all in the active segment,
/// which compaction does not touch until it rolls. Each record is a batch of its own, as a
/// progress record written every 200 ms is (an exactly-once Ferry's also has a commit marker
/// after it, which this leaves out). The restart reads them all, and keeps none.
async fn fill_progress(brokers: &str, progress_topic: &str, n: u32) -> Res<()> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let p: FutureProducer = crate::kafka::client_config(brokers, "ferry-bench-fill")?
        .set("batch.num.messages", "1")
        .create()?;
    let value = vec![b'x'; 90];
    // In chunks: the producer's queue holds 20,000 messages.
    for start in (0..n).step_by(5_000) {
        let mut pending = Vec::with_capacity(5_000);
        for i in start..n.min(start + 5_000) {
            let key = format!("ferry-bench-fill-{}", i % 16);
            pending.push(
                p.send_result(
                    FutureRecord::to(progress_topic)
                        .key(key.as_bytes())
                        .payload(&value),
                )
                .map_err(|(e, _)| e)?,
            );
        }
        for d in pending {
            d.await?.map_err(|(e, _)| e)?;
        }
    }
    Ok(())
}

/// Debezium's cold start and restart after kill -9, into `order.startup.debezium` (which
/// exists): a 10-row transaction waits in a fresh slot; the clock runs from spawning the worker
/// (the connector named on its command line) until a consumer sees the transaction's first
/// record in Kafka. Then, once Kafka holds the whole transaction and the worker has written its
/// offsets after that (as Ferry's slot confirmed its transaction before the kill), the worker
/// is killed with SIGKILL, a new one spawned at once on the same offsets, a new transaction
/// written meanwhile; the clock runs from the kill until the new transaction's first record is
/// in Kafka (records replayed before it do not stop it).
pub async fn run_debezium(url: &str, brokers: &str, run: u32, out: &mut Startup) -> Res<()> {
    let sql = pg::connect(url).await;
    let w = workload();
    let slot = format!("bench_start_debezium_{run}");
    let topic = crate::kafka::topic("startup", "debezium");
    sql.execute(
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
        &[&slot],
    )
    .await?;
    let config = crate::debezium::connector(url, &slot, "startup.debezium", w.kind)?;
    let dir = std::env::temp_dir().join(pg::unique_name("ferry-bench-connect"));

    w.insert_one_txn(&sql, 0, w.rows).await?;
    let mut whole = Watch::start(brokers, &topic, w.rows as i64)?;
    let seen = FirstOf::start(brokers, &topic, 0..w.rows, DEADLINE)?;
    let connect = crate::debezium::start(brokers, Some(dir.clone()), config.clone()).await;
    let mut health = crate::debezium::Health::new(&connect);
    let first = seen
        .wait()
        .await
        .map_err(|e| format!("{e}; {:?}", health.check()))?;
    out.debezium_cold
        .push((first - connect.started()).as_secs_f64());
    whole.wait_all(DEADLINE, || health.check()).await?;
    let relayed = std::time::SystemTime::now();
    let start = Instant::now();
    while connect.offsets_written().is_none_or(|t| t <= relayed) {
        health.check()?;
        if start.elapsed() > DEADLINE {
            return Err("Debezium wrote no offsets after relaying the transaction".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let seen = FirstOf::start(brokers, &topic, 100..100 + w.rows, DEADLINE)?;
    let killed = Instant::now();
    connect.kill();
    let again = tokio::spawn(crate::debezium::start(
        brokers.to_string(),
        Some(dir.clone()),
        config,
    ));
    w.insert_one_txn(&sql, 100, w.rows).await?;
    let again = again.await?;
    let first = seen.wait().await.map_err(|e| {
        format!(
            "{e}; worker log ({}):\n{}",
            again.dir().display(),
            again.log_tail(40)
        )
    })?;
    out.debezium_restart.push((first - killed).as_secs_f64());
    again.kill();
    drop((connect, again));
    let _ = std::fs::remove_dir_all(&dir);
    crate::drop_slot(&sql, &slot).await?;
    sql.batch_execute("TRUNCATE outbox").await?;
    Ok(())
}
