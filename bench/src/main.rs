//! Ferry's benchmark harness: four contenders on the same WAL, and latency at a steady rate.
//!
//! ```text
//! cargo build --release -p ferry -p ferry-bench && target/release/ferry-bench [flags]
//! ```
//!
//! (`--help` lists the flags; `bench/README.md` explains the method and how to read the
//! results.) Starts a private PostgreSQL cluster and a local broker, or uses
//! `FERRY_TEST_PG_URL` / `FERRY_TEST_KAFKA_BROKERS`. For each workload (a database of its own)
//! and each run it creates identical slots (one per WAL reader), writes the backlog, then lets the contenders
//! drain it one after the other, taking turns at going first:
//!
//! 1. `pg_recvlogical -P pgoutput` from one slot ([`recv`]), the physical read limit;
//! 2. the same records produced by rdkafka from memory ([`raw`]), the broker/client limit;
//! 3. the `ferry` binary from the other slot until the slot confirms the backlog's end
//!    ([`ferry`]);
//! 4. a polling relay over the same table ([`relay`]);
//! 5. Debezium (Kafka Connect standalone and the Outbox Event Router) from its own slot until
//!    Kafka holds every record ([`debezium`]).
//!
//! Then a steady writer at each `--rates` value while Ferry (and Debezium) relay ([`latency`]). Figures are
//! medians ([`report`]); the table is printed, and a full run writes `bench/results.md` and
//! the plot `bench/results.svg` ([`svg`]). Benchmarks print figures; they assert nothing about
//! speed. `--smoke` runs everything tiny, as CI does, so the harness cannot rot.

mod args;
mod callgrind;
mod chaos;
mod debezium;
mod ferry;
mod inbox;
mod instructions;
mod kafka;
mod latency;
mod machine;
mod pin;
mod procfs;
mod raw;
mod recv;
mod relay;
mod report;
mod startup;
mod svg;
mod workload;
mod world;

use std::error::Error;
use std::time::{Duration, Instant};

use ferry_testkit::kafka as testkafka;
use ferry_testkit::pg;
use ferry_wal::Lsn;

use crate::args::Args;
use crate::machine::Machine;
use crate::report::{Report, WorkloadResult};
use crate::workload::{thousands, Workload};
use crate::world::{create_db, create_topics, World};

pub type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// The publication every contender reads through.
pub const PUBLICATION: &str = "ferry_outbox";

/// The contenders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contender {
    Recv,
    Raw,
    Ferry,
    FerryCold,
    Relay,
    Debezium,
}

impl Contender {
    pub const ALL: [Contender; 6] = [
        Contender::Recv,
        Contender::Raw,
        Contender::Ferry,
        Contender::FerryCold,
        Contender::Relay,
        Contender::Debezium,
    ];

    /// Whether this contender runs the `ferry` binary.
    pub fn is_ferry(self) -> bool {
        matches!(self, Contender::Ferry | Contender::FerryCold)
    }

    /// The name on the command line and in topic names.
    pub fn key(self) -> &'static str {
        match self {
            Contender::Recv => "recv",
            Contender::Raw => "raw",
            Contender::Ferry => "ferry",
            Contender::FerryCold => "ferry-cold",
            Contender::Relay => "relay",
            Contender::Debezium => "debezium",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Contender::Recv => "pg_recvlogical -P pgoutput",
            Contender::Raw => "raw produce (rdkafka, from memory)",
            Contender::Ferry => "Ferry end to end",
            Contender::FerryCold => "Ferry from process start",
            Contender::Relay => "polling relay (SKIP LOCKED)",
            Contender::Debezium => "Debezium from process start",
        }
    }

    /// When this contender's clock stops.
    pub fn ends_when(self) -> &'static str {
        match self {
            Contender::Recv => "it exits at the end LSN",
            Contender::Raw => "last ack",
            Contender::Ferry | Contender::FerryCold => "slot confirmed the end",
            Contender::Relay => "a poll finds nothing",
            Contender::Debezium => "Kafka holds all N",
        }
    }
}

/// One contender's run.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Wall-clock seconds to drain the backlog.
    pub secs: f64,
    /// CPU seconds of the contender's process (see each contender for which process).
    pub cpu: Option<f64>,
    /// Peak resident set (Ferry only).
    pub peak_rss_kib: Option<u64>,
    /// Seconds from spawn to the first acknowledged record (Ferry only).
    pub first_ack: Option<f64>,
    /// Seconds from the start to the last record's acknowledgement, as polled (Ferry only):
    /// the rest of `secs` is the slot's confirmation catching up.
    pub last_ack: Option<f64>,
    /// Bytes Ferry's sockets to the broker sent, as TCP acknowledged them (Ferry only).
    pub wire_bytes: Option<u64>,
    /// Seconds from the start until the topic first held a record (Ferry and Debezium).
    pub kafka_first: Option<f64>,
    /// Seconds from the start until the topic held every record (Ferry and Debezium): the end
    /// condition all relays can be held to.
    pub kafka_all: Option<f64>,
}

pub async fn current_lsn(sql: &tokio_postgres::Client) -> Res<Lsn> {
    let s: String = sql
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    Ok(s.parse()?)
}

/// Drops `slot`, waiting (up to 30 s) for the walsender of a killed or stopped relay to go.
pub async fn drop_slot(sql: &tokio_postgres::Client, slot: &str) -> Res<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match sql
            .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
            .await
        {
            Ok(_) => return Ok(()),
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => return Err(e.into()),
        }
    }
}

pub async fn confirmed(sql: &tokio_postgres::Client, slot: &str) -> Res<Lsn> {
    let s: Option<String> = sql
        .query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?
        .get(0);
    Ok(s.ok_or("slot has no confirmed_flush_lsn")?.parse()?)
}

#[tokio::main]
async fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some("chaos") {
        std::process::exit(chaos::main(&argv[1..]).await);
    }
    if argv.first().map(String::as_str) == Some("inbox") {
        std::process::exit(inbox::main(&argv[1..]).await);
    }
    let args = match Args::parse(&argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{}", args::USAGE);
            return;
        }
        Err(e) => {
            eprintln!("ferry-bench: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(args).await {
        eprintln!("ferry-bench: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Res<()> {
    if let Some(w) = &args.instructions {
        return instructions::run(&args, w).await;
    }
    kafka::set_compression(&args.compression);
    debezium::set_smoke(args.smoke);
    let started = std::time::Instant::now();
    let mut report = Report {
        machine: Machine::probe(),
        command: args.command.clone(),
        runs: args.runs,
        ..Report::default()
    };
    let needs_ferry =
        args.contenders.iter().any(|c| c.is_ferry()) || !args.rates.is_empty() || args.startup > 0;
    if needs_ferry {
        report.machine.ferry = machine::output(&ferry::bin()?.to_string_lossy(), &["--version"]);
    }
    if args.contenders.contains(&Contender::Debezium) {
        report.machine.debezium = debezium::version();
    }
    if args.pinned {
        if pin::cpus_available() < 2 {
            return Err("--pinned needs 2 CPUs".into());
        }
        // First, so that the broker started next inherits it; PostgreSQL is moved after.
        pin::pin_self(pin::CLIENT_CPU)?;
        report.machine.pinned = true;
    }
    let mut world = World::start().await?;
    let admin = pg::connect(&world.admin_url).await;
    if args.pinned {
        let backend: i32 = admin
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let postmaster = pin::parent_of(backend)
            .ok_or("--pinned: cannot find the postmaster (is PostgreSQL on this machine?)")?;
        let n = pin::pin_tree(postmaster, pin::PG_CPU)?;
        println!(
            "ferry-bench: pinned {n} PostgreSQL processes to CPU {}, this harness (and what it starts) to CPU {}",
            pin::PG_CPU,
            pin::CLIENT_CPU
        );
    }
    report.machine.postgres = admin.query_one("SHOW server_version", &[]).await?.get(0);
    report.machine.broker = world.broker_version();
    if args.keep_broker {
        report.machine.broker += "; one broker for every run (--keep-broker)";
    }
    if !args.outage_for.is_zero() && world.local_broker().is_none() {
        return Err(
            "--outage-for stops the local broker, and FERRY_TEST_KAFKA_BROKERS names an external \
             one: unset it"
                .into(),
        );
    }
    if !args.pg_outage_for.is_zero() && world.local_postgres().is_none() {
        return Err(format!(
            "--pg-outage-for stops the benchmark's own PostgreSQL cluster, and {} names an \
             external server: unset it",
            pg::PG_URL_ENV
        )
        .into());
    }
    if args.stall_broker {
        if world.broker_pid().is_none() {
            return Err(
                "--stall-broker stops the local broker, and FERRY_TEST_KAFKA_BROKERS names \
                        an external one: unset it"
                    .into(),
            );
        }
        report.machine.broker += &format!(
            "; stopped (SIGSTOP) {:.1} s into every Ferry drain for {} s (--stall-broker: Ferry's \
             rates in this report compare with nothing, its peak RSS is the figure)",
            ferry::STALL_AFTER.as_secs_f64(),
            ferry::STALL_FOR.as_secs()
        );
    }
    println!(
        "ferry-bench: {}\n  PostgreSQL {}, broker {}, librdkafka {}, {}\n  {} workload(s) × {} run(s), contenders: {}; latency at {:?} rows/s",
        report.machine.summary(),
        report.machine.postgres,
        report.machine.broker,
        report.machine.librdkafka,
        report.machine.ferry,
        args.workloads.len(),
        args.runs,
        args.contenders.iter().map(|c| c.key()).collect::<Vec<_>>().join(","),
        args.rates
    );
    if args.keep_broker {
        let sent = kafka::warm_broker(&world.brokers(), kafka::BROKER_WARM_UP).await?;
        println!(
            "ferry-bench: the broker warmed up for {} s ({} records of 1 KB), before the first run",
            kafka::BROKER_WARM_UP.as_secs(),
            thousands(sent)
        );
        report.machine.broker += &format!(
            ", loaded for {} s before the first run",
            kafka::BROKER_WARM_UP.as_secs()
        );
    }
    for (i, w) in args.workloads.iter().enumerate() {
        let r = run_workload(&args, &mut world, &admin, w, i == 0).await?;
        report.workloads.push(r);
        report.machine.loads.push(machine::load_average());
    }
    if !args.rates.is_empty() {
        report.latency = run_latency(&args, &mut world, &admin).await?;
    }
    if args.startup > 0 {
        report.startup = Some(run_startup(&args, &mut world, &admin).await?);
    }
    report.machine.loads.push(machine::load_average());
    println!("\n{}", report.markdown());
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        std::fs::write(dir.join("results.md"), report.markdown())?;
        std::fs::write(dir.join("results.svg"), svg::chart(&report))?;
        println!("wrote {0}/results.md and {0}/results.svg", dir.display());
    }
    println!("done in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

async fn run_workload(
    args: &Args,
    world: &mut World,
    admin: &tokio_postgres::Client,
    w: &Workload,
    first: bool,
) -> Res<WorkloadResult> {
    println!("\n[{}] {}", w.name, w.describe());
    // A smoke run starts Debezium's JVM (~7 s) on the first workload only.
    let contenders: Vec<Contender> = args
        .contenders
        .iter()
        .copied()
        .filter(|c| !(args.smoke && *c == Contender::Debezium && !first))
        .collect();
    let (db, url) = create_db(admin, world, w).await?;
    let sql = pg::connect(&url).await;
    let mut result = WorkloadResult {
        workload: w.clone(),
        rows: w.rows,
        payload_bytes: 0,
        insert_secs: vec![],
        samples: vec![],
    };
    for run in 0..args.runs {
        let tag = format!("[{}] run {}/{}", w.name, run + 1, args.runs);
        // The smoke run keeps one broker per run and reads every topic back at the end; a
        // measured run gives each contender that produces a fresh broker (below).
        let mut brokers = world.brokers();
        if args.smoke {
            create_topics(&brokers, w.name, &contenders).await;
        }
        let slots = [
            format!("bench_recv_{run}"),
            format!("bench_ferry_{run}"),
            format!("bench_ferrycold_{run}"),
            format!("bench_debezium_{run}"),
        ];
        for s in &slots {
            sql.execute(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[s],
            )
            .await?;
        }
        let mut holder = match contenders.contains(&Contender::Ferry) {
            true => Some(ferry::Holder::hold(&url, &slots[1]).await?),
            false => None,
        };
        let took = w.insert(&sql).await?;
        let end = current_lsn(&sql).await?;
        sql.batch_execute("CHECKPOINT").await?;
        let (rows, bytes) = workload::measure(&sql, w.kind).await?;
        if rows != w.rows {
            return Err(format!("{tag}: the table holds {rows} rows, expected {}", w.rows).into());
        }
        result.payload_bytes = bytes;
        result.insert_secs.push(took.as_secs_f64());
        println!(
            "{tag}: wrote {} rows ({:.0} MB of payload) in {:.1} s; load average {:.1}",
            thousands(rows),
            bytes as f64 / 1e6,
            took.as_secs_f64(),
            machine::load_average()
        );
        // Take turns at going first.
        let n = contenders.len();
        for i in 0..n {
            let c = contenders[(i + run as usize) % n];
            let topic = kafka::topic(w.name, c.key());
            if !args.smoke && c != Contender::Recv {
                // The local broker keeps every record in memory and slows as it fills: a
                // contender after another one that produced 200,000 records was measured
                // 20-30% slower, whichever it was. Each gets a fresh broker, unless
                // `--keep-broker` asks for one warm broker throughout (its JIT then compiles
                // before the runs rather than during each).
                if !args.keep_broker {
                    world.fresh_broker().await;
                }
                brokers = world.brokers();
                create_topics(&brokers, w.name, &[c]).await;
            }
            // The local broker's CPU over the turn: in pinned mode it shares CPU 1 with the
            // contender, and its share is what the contender's cannot be.
            let broker_before = world
                .broker_pid()
                .and_then(|pid| procfs::cpu_seconds(pid).ok().map(|cpu| (pid, cpu)));
            let turn = Instant::now();
            let stall = broker_before
                .filter(|_| args.stall_broker)
                .map(|(pid, _)| pid);
            let s = match c {
                Contender::Recv => {
                    // Ferry streams binary values when the payload is bytea (postgres.binary).
                    let binary = w.kind == workload::Kind::Bytea;
                    recv::drain(&url, &slots[0], end, binary).await?
                }
                Contender::Raw => raw::produce(&sql, &brokers, w.kind, &topic).await?,
                Contender::Ferry => {
                    let template = format!("{{aggregatetype}}.{}.ferry", w.name);
                    let holder = holder.take().ok_or("one ferry turn per run")?;
                    ferry::drain(
                        &url,
                        &brokers,
                        &sql,
                        &slots[1],
                        &template,
                        rows,
                        end,
                        Some(holder),
                        stall,
                    )
                    .await?
                }
                Contender::FerryCold => {
                    let template = format!("{{aggregatetype}}.{}.ferry-cold", w.name);
                    ferry::drain(
                        &url, &brokers, &sql, &slots[2], &template, rows, end, None, stall,
                    )
                    .await?
                }
                Contender::Relay => {
                    let suffix = format!("{}.relay", w.name);
                    relay::publish_all(&url, &brokers, w.kind, &suffix, rows).await?
                }
                Contender::Debezium => {
                    debezium::drain(&url, &brokers, &slots[3], w.name, w.kind, rows).await?
                }
            };
            if s.secs.is_nan() || s.secs <= 0.0 {
                return Err(format!("{tag}: {} took no time: a measurement bug", c.label()).into());
            }
            print_sample(&tag, c, &s, rows, bytes);
            if let Some((pid, before)) = broker_before.filter(|_| c != Contender::Recv) {
                if let Ok(after) = procfs::cpu_seconds(pid) {
                    println!(
                        "{tag}: the broker used {:.2} CPU s in this turn's {:.2} s",
                        after - before,
                        turn.elapsed().as_secs_f64()
                    );
                }
            }
            result.samples.push((c, s));
        }
        for s in &slots {
            drop_slot(&sql, s).await?;
        }
        sql.batch_execute("TRUNCATE outbox").await?;
        if args.smoke {
            verify_topics(&brokers, w.name, &contenders, rows).await;
        }
    }
    drop(sql);
    admin.batch_execute(&format!("DROP DATABASE {db}")).await?;
    Ok(result)
}

fn print_sample(tag: &str, c: Contender, s: &Sample, rows: u64, bytes: u64) {
    let mut line = format!(
        "{tag}: {:<36} {:>10} rows/s {:>7.1} MB/s ({:.2} s",
        c.label(),
        thousands((rows as f64 / s.secs).round() as u64),
        bytes as f64 / s.secs / 1e6,
        s.secs
    );
    if let Some(cpu) = s.cpu {
        line += &format!(", {cpu:.2} CPU s");
    }
    if let Some(rss) = s.peak_rss_kib {
        line += &format!(", peak RSS {} MiB", rss / 1024);
    }
    if let Some(f) = s.first_ack.filter(|_| c != Contender::Debezium) {
        line += &format!(", first ack at {f:.2} s");
    }
    if let (Some(f), Some(a)) = (s.kafka_first, s.kafka_all) {
        line += &format!(
            ", Kafka: first record at {f:.2} s, all at {a:.2} s ({} rows/s from the first)",
            thousands((rows as f64 / (a - f)).round() as u64)
        );
    }
    if let Some(l) = s.last_ack {
        line += &format!(
            ", confirmed {:.0} ms after the last ack",
            (s.secs - l).max(0.0) * 1e3
        );
    }
    if let Some(w) = s.wire_bytes {
        line += &format!(
            ", {:.1} MB to the broker ({:.0}% of the payload)",
            w as f64 / 1e6,
            w as f64 / bytes.max(1) as f64 * 100.0
        );
    }
    println!("{line})");
}

/// Smoke runs read every contender's topic back: each must hold exactly the backlog.
async fn verify_topics(brokers: &str, workload: &str, contenders: &[Contender], rows: u64) {
    for c in contenders.iter().filter(|c| **c != Contender::Recv) {
        let topic = kafka::topic(workload, c.key());
        let got = testkafka::consume(brokers, &topic, rows as usize, Duration::from_secs(60)).await;
        assert_eq!(got.len() as u64, rows, "{topic}: records read back");
        println!("  {topic}: {} records read back", got.len());
    }
}

async fn run_latency(
    args: &Args,
    world: &mut World,
    admin: &tokio_postgres::Client,
) -> Res<Vec<latency::Latency>> {
    let w = latency::workload();
    println!(
        "\n[latency] steady writer, {}-row transactions of ~1 KB jsonb, {} s per rate",
        latency::TXN_ROWS,
        args.latency_secs
    );
    let (db, url) = create_db(admin, world, &w).await?;
    let mut out = Vec::new();
    for (i, &rate) in args.rates.iter().enumerate() {
        let mut relays = vec![latency::Relay::Ferry];
        // A smoke run starts Debezium's JVM at the first rate only.
        if args.contenders.contains(&Contender::Debezium) && !(args.smoke && i > 0) {
            relays.push(latency::Relay::Debezium);
        }
        for relay in relays {
            if !args.smoke && !args.keep_broker {
                world.fresh_broker().await;
            }
            let (kib, took) = machine::write_back();
            println!(
                "[latency] wrote back {} KiB of dirty pages first ({:.1} s)",
                thousands(kib),
                took.as_secs_f64()
            );
            let brokers = world.brokers();
            testkafka::create_topic_with(
                &brokers,
                &kafka::topic("steady", relay.key()),
                kafka::PARTITIONS,
                &[("message.timestamp.type", "LogAppendTime")],
            )
            .await;
            let l = latency::run(
                &url,
                &brokers,
                relay,
                &format!("bench_latency_{}_{rate}", relay.key()),
                rate,
                args.latency_secs,
                args.pinned,
            )
            .await?;
            println!(
                "[latency] {} {} rows/s (achieved {}): commit → ack p50 {:.1} ms, p99 {:.1} ms, p999 {:.1} ms over {} records; commit → in Kafka p50 {:.1} ms, p99 {:.1} ms, p999 {:.1} ms over {}, of which PostgreSQL (commit → sent) p50 {:.1} ms, p99 {:.1} ms; its walsender on a CPU {:.0}% of the run, waiting for one {:.0}%; slot lag {} → {} (max {}), caught up {:.2} s after the last commit; {:.2} CPU s / 100k rows, peak RSS {:.0} MiB",
                relay.label(),
                thousands(rate),
                thousands(l.achieved.round() as u64),
                l.p50 * 1e3,
                l.p99 * 1e3,
                l.p999 * 1e3,
                thousands(l.samples),
                l.kafka_p50 * 1e3,
                l.kafka_p99 * 1e3,
                l.kafka_p999 * 1e3,
                thousands(l.kafka_samples),
                l.source_p50 * 1e3,
                l.source_p99 * 1e3,
                l.walsender_cpu * 100.0,
                l.walsender_waiting * 100.0,
                report::kib(l.lag_first_quarter),
                report::kib(l.lag_last_quarter),
                report::kib(l.lag_max),
                l.catch_up,
                l.cpu_per_100k,
                l.peak_rss_mib,
            );
            out.push(l);
        }
    }
    admin.batch_execute(&format!("DROP DATABASE {db}")).await?;
    Ok(out)
}

async fn run_startup(
    args: &Args,
    world: &mut World,
    admin: &tokio_postgres::Client,
) -> Res<startup::Startup> {
    println!(
        "\n[startup] cold start, restart after kill -9, standby takeover; {} run(s) each{}",
        args.startup,
        match args.startup_fill {
            0 => String::new(),
            n => format!("; {n} records written to the progress topic before each kill -9"),
        }
    );
    let (db, url) = create_db(admin, world, &latency::workload()).await?;
    let brokers = world.brokers();
    if args.startup_topics > 0 {
        let started = std::time::Instant::now();
        kafka::other_topics(&brokers, args.startup_topics).await?;
        println!(
            "[startup] the broker holds {} other topics (one partition each; made in {:.1} s)",
            args.startup_topics,
            started.elapsed().as_secs_f64()
        );
    }
    create_topics(&brokers, "steady", &[Contender::Ferry]).await;
    let debezium = args.contenders.contains(&Contender::Debezium);
    if debezium {
        create_topics(&brokers, "startup", &[Contender::Debezium]).await;
    }
    let last = |v: &Vec<f64>| v.last().copied().unwrap_or(f64::NAN) * 1e3;
    let mut out = startup::Startup::default();
    if !args.outage_for.is_zero() {
        out.outage_for = Some(args.outage_for);
    }
    if !args.pg_outage_for.is_zero() {
        out.pg_outage_for = Some(args.pg_outage_for);
    }
    for run in 0..args.startup {
        startup::run(
            &url,
            &brokers,
            "{aggregatetype}.steady.ferry",
            run,
            world.broker_pid(),
            args.startup_fill,
            &mut out,
        )
        .await?;
        println!(
            "[startup] run {}/{}: Ferry cold {:.0} ms (in Kafka {:.0} ms), restart after kill -9 {:.0} ms (in Kafka {:.0} ms), takeover {:.0} ms",
            run + 1,
            args.startup,
            last(&out.cold),
            last(&out.cold_kafka),
            last(&out.restart),
            last(&out.restart_kafka),
            last(&out.takeover),
        );
        if debezium {
            startup::run_debezium(&url, &brokers, run, &mut out).await?;
            println!(
                "[startup] run {}/{}: Debezium cold {:.0} ms, restart after kill -9 {:.0} ms (first record in Kafka)",
                run + 1,
                args.startup,
                last(&out.debezium_cold),
                last(&out.debezium_restart),
            );
        }
    }
    // Once the other start-up runs are done: a broker just started again slows the next cold
    // start (its coordinators load their partitions, ~0.6 s in exactly-once mode).
    for run in 0..args.startup {
        if let (Some(outage_for), Some(broker)) = (out.outage_for, world.local_broker()) {
            startup::outage(
                &url,
                broker,
                "{aggregatetype}.steady.ferry",
                run,
                outage_for,
                &mut out,
            )
            .await?;
            println!(
                "[startup] outage {}/{}: the broker stopped, {:.1} s later started again; from it listed to every record written meanwhile acknowledged {:.0} ms",
                run + 1,
                args.startup,
                outage_for.as_secs_f64(),
                last(&out.outage),
            );
        }
    }
    for run in 0..args.startup {
        if let (Some(outage_for), Some(cluster)) = (out.pg_outage_for, world.local_postgres()) {
            startup::pg_outage(
                &url,
                &brokers,
                cluster,
                "{aggregatetype}.steady.ferry",
                run,
                outage_for,
                &mut out,
            )
            .await?;
            println!(
                "[startup] PostgreSQL outage {}/{}: the server stopped, {:.1} s later started again; from it accepting connections to a transaction written then acknowledged {:.0} ms",
                run + 1,
                args.startup,
                outage_for.as_secs_f64(),
                last(&out.pg_outage),
            );
        }
    }
    // A server restarted by the PostgreSQL outages ended `admin`'s connection.
    let reconnected;
    let admin = match out.pg_outage_for {
        Some(_) => {
            reconnected = pg::connect(&world.admin_url).await;
            &reconnected
        }
        None => admin,
    };
    admin.batch_execute(&format!("DROP DATABASE {db}")).await?;
    Ok(out)
}
