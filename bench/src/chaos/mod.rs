//! `ferry-bench chaos`: the real `ferry` binary under a mixed load and a seeded schedule of
//! faults, then every record read back and held against what the application committed.
//!
//! The run starts its own PostgreSQL cluster and broker, puts a fault proxy
//! ([`ferry_testkit::proxy`]) on each of Ferry's links (the application writes to PostgreSQL
//! directly), starts Ferry through them, the load ([`load`]) and the faults
//! ([`ferry_testkit::faults`]: proxy faults on both links, kill -9 and SIGSTOP/SIGCONT of
//! Ferry, PostgreSQL stopped fast or immediately, the broker killed), one after another, each
//! healed before the next. With `--cluster` the broker is three KRaft nodes that Ferry reaches
//! directly (replication factor 3, `min.insync.replicas` 2), and the broker faults hit one node
//! at a time: kill -9 (of a node the seed picks, or of the leader of a partition Ferry writes),
//! a clean restart, a pause; each node is back, answering and in every ISR again before the next
//! fault. A monitor polls Ferry's metrics every 100 ms: `ferry_confirmed_lsn`
//! gives the recovery time of each fault (healed → the confirmed LSN moving again), and peak
//! in-flight records; `/proc` gives peak RSS. A Ferry that exits on its own is counted and
//! started again (as a supervisor would) — a permanent error under these faults is a finding.
//! At the end everything is healed, the load stops, the run waits (with a deadline) until the
//! slot's confirmed LSN passes the last commit, reads the topic back ([`check`]) and prints the
//! table. Exit code 1 when anything is lost, phantom or out of order (or, with
//! `--exactly-once`, duplicated), or the confirmed LSN never got there.

mod chain;
mod check;
mod load;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_testkit::faults::{self, FaultKind, Mix, Planned};
use ferry_testkit::kafka::{self as testkafka, ClusterOptions, LocalBroker};
use ferry_testkit::pg::{self, PgCluster, SUPERUSER_PASSWORD};
use ferry_testkit::process::{free_port, signal, spawn_owned};
use ferry_testkit::proxy::{Fault, Proxy};
use ferry_wal::Lsn;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::{procfs, Res, PUBLICATION};

pub const USAGE: &str = "\
ferry-bench chaos: Ferry under faults; counts lost, phantom, reordered and duplicated records

usage: ferry-bench chaos [flags]

  --duration D      how long faults are injected, e.g. 60s, 30m (default 120s)
  --seed N          the fault schedule's seed (default 1); the same seed, the same schedule
  --writers N       concurrent writers (default 4)
  --big-txn         also commit one 1,000,000-row transaction a third of the way in
  --kill-every S    weigh kill -9 so that one comes about every S seconds (default: the
                    standard mix, about one fault in three a kill)
  --cluster         three brokers instead of one: Apache Kafka, 3 KRaft nodes (each broker and
                    controller), the topic with replication factor 3, min.insync.replicas 2,
                    unclean leader election off. Ferry's bootstrap list names all three
                    directly: no fault proxy on its broker link (a proxy fronts one broker), so
                    no broker link faults; the PostgreSQL link faults, Ferry's kill -9 and
                    pause and PostgreSQL's stops stay. The broker faults hit one node at a
                    time: kill -9 of the node the seed picks, kill -9 of the leader of a
                    partition Ferry writes (the seed picks the partition, the progress topic's
                    among them), SIGTERM and start again, SIGSTOP for 1-15 s then SIGCONT. At
                    most one node is down or paused, and it is back (listed by the cluster,
                    answering, in every partition's ISR again) before the next fault: two
                    in-sync replicas always remain, so min.insync.replicas holds and Ferry
                    should keep making progress through every broker fault, once the
                    partitions a killed or paused node led have moved (up to the
                    controller's 9 s broker session); the \"longest stall\" column says how
                    long it made none
  --broker-sigkill  the broker fault kills the broker with SIGKILL (default: a clean stop,
                    SIGTERM: Kafka's controlled shutdown); not with --cluster, which has both
  --exactly-once    run Ferry with FERRY_KAFKA_EXACTLY_ONCE=true, read with
                    isolation.level=read_committed, and require 0 duplicates
  --no-broker-restart  leave the broker faults out of the mix
  --only-broker-restart  the broker faults alone
  --log-level L     Ferry's log level (default warn), in <logs>/ferry.log
  --chain           the whole outbox pattern instead: an outbox database -> ferry run
                    (at-least-once; --exactly-once makes it exactly once) -> one broker ->
                    ferry inbox -> an inbox database; both Ferrys killed with kill -9 at
                    seeded moments (one every ~6 s, or --kill-every S) and started again;
                    fails unless every committed outbox row is in the inbox exactly once, in
                    per-key order, with nothing rolled back and nothing dead-lettered
  --keep-logs       keep <logs> (Ferry's log, a copy of each broker node's, faults.log: each
                    fault as injected and healed) when the run passes too (a failed run
                    always keeps them)
  -h, --help        this text

The ferry binary is FERRY_BIN, else the one beside this executable. The brokers run with the
tests' JVM options (FERRY_TEST_KAFKA_JVM_OPTS replaces them). Exit code 1 when a record is
lost, phantom or out of order.";

#[derive(Debug, Clone)]
struct ChaosArgs {
    duration: Duration,
    seed: u64,
    writers: u64,
    big_txn: bool,
    kill_every: Option<f64>,
    exactly_once: bool,
    cluster: bool,
    broker_sigkill: bool,
    no_broker_restart: bool,
    only_broker_restart: bool,
    log_level: String,
    keep_logs: bool,
    chain: bool,
    command: String,
}

pub(crate) fn parse_duration(s: &str) -> Res<Duration> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("--duration {s:?}: expected a number and s, m or h (e.g. 120s)"))?;
    Ok(Duration::from_secs(match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("--duration {s:?}: unit must be s, m or h").into()),
    }))
}

impl ChaosArgs {
    fn parse(args: &[String]) -> Res<Option<ChaosArgs>> {
        let mut a = ChaosArgs {
            duration: Duration::from_secs(120),
            seed: 1,
            writers: 4,
            big_txn: false,
            kill_every: None,
            exactly_once: false,
            cluster: false,
            broker_sigkill: false,
            no_broker_restart: false,
            only_broker_restart: false,
            log_level: "warn".into(),
            keep_logs: false,
            chain: false,
            command: format!("ferry-bench chaos {}", args.join(" ")),
        };
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "-h" | "--help" => return Ok(None),
                "--duration" => a.duration = parse_duration(value()?)?,
                "--seed" => a.seed = value()?.parse()?,
                "--writers" => a.writers = value()?.parse()?,
                "--big-txn" => a.big_txn = true,
                "--kill-every" => a.kill_every = Some(value()?.parse()?),
                "--exactly-once" => a.exactly_once = true,
                "--cluster" => a.cluster = true,
                "--broker-sigkill" => a.broker_sigkill = true,
                "--no-broker-restart" => a.no_broker_restart = true,
                "--only-broker-restart" => a.only_broker_restart = true,
                "--log-level" => a.log_level = value()?.to_string(),
                "--keep-logs" => a.keep_logs = true,
                "--chain" => a.chain = true,
                other => return Err(format!("unknown flag {other:?} (see --help)").into()),
            }
        }
        if a.chain
            && (a.cluster || a.broker_sigkill || a.no_broker_restart || a.only_broker_restart)
        {
            return Err(
                "--chain injects kill -9 of both Ferrys only, on one broker: no broker flags"
                    .into(),
            );
        }
        if a.cluster && a.broker_sigkill {
            return Err(
                "--broker-sigkill is for one broker; --cluster kills nodes with \
                        SIGKILL and restarts them with SIGTERM as part of its mix"
                    .into(),
            );
        }
        Ok(Some(a))
    }

    fn mix(&self) -> Mix {
        let mut mix = if self.cluster {
            Mix::cluster()
        } else {
            Mix::standard()
        };
        let broker_fault = |k: FaultKind| k == FaultKind::BrokerKill || k.is_node_fault();
        if self.no_broker_restart {
            mix.weights.retain(|(k, _)| !broker_fault(*k));
        }
        if self.only_broker_restart {
            mix.weights.retain(|(k, _)| broker_fault(*k));
        }
        if let Some(every) = self.kill_every {
            // The mean gap plus the mean hold of the other kinds is ~4 s; weigh kills so that
            // about one fault in (every / 4) is a kill.
            let others: u32 = mix
                .weights
                .iter()
                .filter(|(k, _)| *k != FaultKind::FerryKill)
                .map(|(_, w)| *w)
                .sum();
            let per_kill = (every / 4.0).max(1.0);
            let w = (f64::from(others) / (per_kill - 1.0).max(0.1)).round() as u32;
            for (k, weight) in &mut mix.weights {
                if *k == FaultKind::FerryKill {
                    *weight = w.max(1);
                }
            }
        }
        mix
    }
}

/// Whether a run passes: the confirmed LSN got past the last commit, nothing was lost, phantom
/// or out of order, Ferry never stopped on its own (a permanent error under these faults is a
/// finding), and in exactly-once mode nothing was duplicated.
fn passes(caught_up: bool, v: &check::Verdict, exits: usize, exactly_once: bool) -> bool {
    caught_up
        && v.lost == 0
        && v.phantom == 0
        && v.order_violations == 0
        && exits == 0
        && !(exactly_once && v.duplicates > 0)
}

/// Entry point of `ferry-bench chaos`; returns the exit code.
pub async fn main(argv: &[String]) -> i32 {
    let args = match ChaosArgs::parse(argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("ferry-bench chaos: {e}");
            return 2;
        }
    };
    let result = if args.chain {
        chain::run(args).await
    } else {
        run(args).await
    };
    match result {
        Ok(ok) => i32::from(!ok),
        Err(e) => {
            eprintln!("ferry-bench chaos: {e}");
            2
        }
    }
}

const SLOT: &str = "ferry_chaos";
const TOPIC: &str = "chaos";
const PARTITIONS: i32 = 4;
/// Ferry's progress topic (its default name): a leader kill may pick its one partition.
const PROGRESS_TOPIC: &str = "ferry.progress";
/// How long, after everything is healed, the confirmed LSN may take to pass the last commit.
const CATCH_UP: Duration = Duration::from_secs(300);

/// The Ferry process of the run, restarted after kills and exits.
struct Ferry {
    /// `run` (or, in the chain, `inbox`).
    command: &'static str,
    child: Option<Child>,
    port: u16,
    env: Vec<(String, String)>,
    log: PathBuf,
    spawns: u64,
}

impl Ferry {
    fn spawn(&mut self) -> Res<()> {
        self.port = free_port();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut cmd = Command::new(crate::ferry::bin()?);
        cmd.arg(self.command)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("FERRY_HTTP_LISTEN", format!("127.0.0.1:{}", self.port))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.child = Some(spawn_owned(cmd, libc::SIGKILL)?);
        self.spawns += 1;
        Ok(())
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// kill -9 and reap; whether there was a process to kill.
    fn kill(&mut self) -> bool {
        match self.child.take() {
            Some(mut c) => {
                let _ = c.kill();
                let _ = c.wait();
                true
            }
            None => false,
        }
    }
}

/// What the monitor saw.
#[derive(Debug, Default)]
struct Seen {
    /// Highest `ferry_confirmed_lsn` seen.
    confirmed: u64,
    /// Each time that highest value grew: when, and to what.
    advances: Vec<(Instant, u64)>,
    peak_in_flight: f64,
    peak_rss_kib: u64,
    /// Ferry exits the run did not cause, with their status.
    exits: Vec<String>,
}

async fn run(args: ChaosArgs) -> Res<bool> {
    let started = Instant::now();
    ferry_testkit::process::sweep_stale_dirs("ferry-pg");
    ferry_testkit::process::sweep_stale_dirs("ferry-broker");
    let cluster = Arc::new(PgCluster::start(pg::ClusterOptions::default()).await);
    let broker = Arc::new(if args.cluster {
        LocalBroker::start_with(ClusterOptions {
            nodes: CLUSTER_NODES,
            ..ClusterOptions::default()
        })
        .await
    } else {
        LocalBroker::start().await
    });
    let admin = pg::connect(&cluster.url("postgres")).await;
    admin.batch_execute("CREATE DATABASE chaos").await?;
    let url = cluster.url("chaos");
    let sql = pg::connect(&url).await;
    sql.batch_execute(load::DDL).await?;
    sql.batch_execute(&format!(
        "CREATE PUBLICATION {PUBLICATION} FOR TABLE outbox WITH (publish = 'insert')"
    ))
    .await?;
    testkafka::create_topic(&broker.brokers(), TOPIC, PARTITIONS).await;
    let pg_proxy = Arc::new(Proxy::tcp(([127, 0, 0, 1], cluster.port()).into()).await?);
    // One broker: Ferry goes through the fault proxy. A cluster: Ferry names every node (the
    // proxy fronts one broker and rewrites the metadata to itself).
    let kafka_proxy = if args.cluster {
        None
    } else {
        Some(Arc::new(Proxy::kafka(broker.brokers().parse()?).await?))
    };
    let ferry_brokers = kafka_proxy
        .as_ref()
        .map_or_else(|| broker.brokers(), |p| p.addr().to_string());
    let broker_desc = describe_broker(&broker.brokers(), broker.nodes()).await?;
    let dir = std::env::temp_dir().join(pg::unique_name("ferry-chaos"));
    std::fs::create_dir_all(&dir)?;
    let mut env: Vec<(String, String)> = [
        (
            "FERRY_POSTGRES_URL",
            format!(
                "postgres://postgres:{SUPERUSER_PASSWORD}@127.0.0.1:{}/chaos",
                pg_proxy.addr().port()
            ),
        ),
        ("FERRY_POSTGRES_SLOT", SLOT.into()),
        ("FERRY_POSTGRES_PUBLICATION", PUBLICATION.into()),
        ("FERRY_KAFKA_BROKERS", ferry_brokers),
        ("FERRY_ROUTE_TOPIC", TOPIC.into()),
        ("FERRY_ROUTE_ID_HEADER", String::new()),
        ("FERRY_LOG_LEVEL", args.log_level.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if args.exactly_once {
        env.push(("FERRY_KAFKA_EXACTLY_ONCE".into(), "true".into()));
    }
    let ferry = Arc::new(Mutex::new(Ferry {
        command: "run",
        child: None,
        port: 0,
        env,
        log: dir.join("ferry.log"),
        spawns: 0,
    }));
    ferry.lock().unwrap_or_else(|e| e.into_inner()).spawn()?;
    // Rows committed before Ferry created its slot are not Ferry's to deliver.
    let slot_at = Instant::now();
    while sql
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
            &[&SLOT],
        )
        .await?
        .is_none()
    {
        if slot_at.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "ferry did not create its slot within 60 s; its log: {}",
                dir.join("ferry.log").display()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let schedule = faults::schedule(args.seed, args.duration, &args.mix());
    println!(
        "ferry-bench chaos: {broker_desc}; seed {}, {} s of faults ({} planned), {} writers{}{}; \
         logs in {}",
        args.seed,
        args.duration.as_secs(),
        schedule.len(),
        args.writers,
        if args.big_txn {
            ", one 1,000,000-row transaction"
        } else {
            ""
        },
        if args.exactly_once {
            ", exactly-once"
        } else {
            ""
        },
        dir.display()
    );

    // The monitor.
    let seen = Arc::new(Mutex::new(Seen::default()));
    let monitoring = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let monitor = tokio::spawn(monitor(ferry.clone(), seen.clone(), monitoring.clone()));

    // The load.
    let load = load::Load::new(url.clone());
    let mut tasks = Vec::new();
    for w in 0..args.writers {
        tasks.push(tokio::spawn(load.clone().writer(w, args.seed)));
    }
    tasks.push(tokio::spawn(load.clone().deleter()));
    tasks.push(tokio::spawn(load.clone().noise()));
    let big = args.big_txn.then(|| {
        let load = load.clone();
        let at = args.duration / 3;
        tokio::spawn(async move {
            tokio::time::sleep(at).await;
            load.big_txn().await;
        })
    });

    // The faults.
    let t0 = Instant::now();
    let world = World {
        cluster: cluster.clone(),
        broker: broker.clone(),
        pg_proxy: pg_proxy.clone(),
        kafka_proxy: kafka_proxy.clone(),
        ferry: ferry.clone(),
        broker_sigkill: args.broker_sigkill,
        nodes: Mutex::default(),
        last_node: Mutex::default(),
    };
    let mut healed: Vec<Healed> = Vec::new();
    for p in &schedule {
        if let Some(wait) = p.at.checked_sub(t0.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let injected = Instant::now();
        let at = match world.apply(p, &seen).await {
            Ok(at) => at,
            Err(e) => {
                keep_broker_logs(&broker, &dir);
                return Err(e);
            }
        };
        timeline(&dir, t0, injected, p, &world, at.0);
        healed.push(Healed {
            kind: p.kind,
            injected,
            at: at.0,
            confirmed: at.1,
        });
    }
    if let Some(wait) = args.duration.checked_sub(t0.elapsed()) {
        tokio::time::sleep(wait).await;
    }
    world.heal_all().await?;
    if let Some(big) = big {
        big.await?;
    }
    load.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }

    // The last commit, then Ferry catching up with it.
    let sql = pg::connect(&url).await;
    let last: Lsn = sql
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get::<_, String>(0)
        .parse()?;
    let catch_up = Instant::now();
    let mut caught_up = false;
    while catch_up.elapsed() < CATCH_UP {
        let c = crate::confirmed(&sql, SLOT).await.ok();
        if c.is_some_and(|c| c >= last) {
            caught_up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    monitoring.store(false, Ordering::Relaxed);
    monitor.await?;
    let truth = std::mem::take(&mut *load.truth.lock().unwrap_or_else(|e| e.into_inner()));
    let want = truth.committed.iter().map(|r| r.id).collect();
    let brokers = broker.brokers();
    let eos = args.exactly_once;
    let delivered = tokio::task::spawn_blocking(move || {
        check::read_back(
            &brokers,
            TOPIC,
            PARTITIONS,
            eos,
            &want,
            Duration::from_secs(30),
        )
    })
    .await??;
    let verdict = check::judge(&truth, &delivered);
    let mut f = ferry.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(mut c) = f.child.take() {
        signal(&c, libc::SIGTERM);
        let _ = c.wait();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    let (recovery, unrecovered, stalls) = recoveries(&healed, &seen.advances);
    let nodes = std::mem::take(&mut *world.nodes.lock().unwrap_or_else(|e| e.into_inner()));

    // The table.
    let mut counts: BTreeMap<FaultKind, u64> = BTreeMap::new();
    for p in &schedule {
        *counts.entry(p.kind).or_default() += 1;
    }
    let ok = passes(caught_up, &verdict, seen.exits.len(), args.exactly_once);
    let report = Report {
        args: &args,
        counts: &counts,
        recovery: &recovery,
        unrecovered: &unrecovered,
        stalls: &stalls,
        nodes: &nodes,
        broker: &broker_desc,
        truth: &truth,
        verdict: &verdict,
        seen: &seen,
        caught_up,
        spawns: f.spawns,
        elapsed: started.elapsed(),
    };
    println!("\n{}", report.table());
    for e in &verdict.examples {
        println!("  {e}");
    }
    for e in &seen.exits {
        println!("  ferry exited on its own: {e}");
    }
    println!("\nverdict: {}", if ok { "PASS" } else { "FAIL" });
    if !ok || args.keep_logs {
        println!("ferry's log: {}", f.log.display());
        keep_broker_logs(&broker, &dir);
        println!(
            "faults, as they were injected and healed: {}",
            dir.join("faults.log").display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(ok)
}

/// Copies every broker node's log into `dir` (the broker's own directory goes with it).
fn keep_broker_logs(broker: &LocalBroker, dir: &std::path::Path) {
    for i in 0..broker.nodes() {
        let from = broker.dir().join(format!("node-{}/server.log", i + 1));
        let to = dir.join(format!("broker-node-{}.log", i + 1));
        if std::fs::copy(&from, &to).is_ok() {
            println!("broker node {}'s log: {}", i + 1, to.display());
        }
    }
}

/// One line of `<logs>/faults.log`: when the fault was injected and healed (seconds from the
/// first fault's start, wall clock too, to match the logs), its kind, hold and node.
fn timeline(
    dir: &std::path::Path,
    t0: Instant,
    injected: Instant,
    p: &Planned,
    world: &World,
    healed: Instant,
) {
    use std::io::Write;
    let wall = chrono_now();
    let node = world
        .last_node
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .map(|i| format!(" node {}", i + 1))
        .unwrap_or_default();
    let line = format!(
        "{wall} +{:.1}s → +{:.1}s {}{node} (hold {} ms, param {})\n",
        (injected - t0).as_secs_f64(),
        (healed - t0).as_secs_f64(),
        p.kind.name(),
        p.hold.as_millis(),
        p.param
    );
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("faults.log"))
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// The wall clock at the heal (UTC, seconds since the epoch with milliseconds), to match the
/// logs' timestamps.
fn chrono_now() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let s = d.as_secs();
    format!(
        "{:02}:{:02}:{:02}.{:03}Z",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60,
        d.subsec_millis()
    )
}

/// One fault of the run as it happened.
#[derive(Debug, Clone, Copy)]
struct Healed {
    kind: FaultKind,
    /// When it was injected.
    injected: Instant,
    /// When it was healed (for a broker node: started or resumed again, listed by the cluster
    /// and answering).
    at: Instant,
    /// The highest confirmed LSN the monitor had seen at `at`.
    confirmed: u64,
}

type PerKind<T> = BTreeMap<FaultKind, T>;

/// Per kind: the recovery times, from each heal to the first time the confirmed LSN passed the
/// value it had at that heal (heals after which it never moved are counted apart); and the
/// longest stalls, each the longest time without an advance of the confirmed LSN from the
/// fault's injection to its recovery.
fn recoveries(
    healed: &[Healed],
    advances: &[(Instant, u64)],
) -> (PerKind<Vec<Duration>>, PerKind<u64>, PerKind<Vec<Duration>>) {
    let (mut rec, mut never, mut stalls) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for h in healed {
        match advances
            .iter()
            .find(|(t, v)| *t >= h.at && *v > h.confirmed)
        {
            Some((t, _)) => {
                rec.entry(h.kind).or_insert_with(Vec::new).push(*t - h.at);
                let mut last = h.injected;
                let mut longest = Duration::ZERO;
                for (a, _) in advances.iter().filter(|(a, _)| *a > h.injected && a <= t) {
                    longest = longest.max(*a - last);
                    last = *a;
                }
                stalls.entry(h.kind).or_insert_with(Vec::new).push(longest);
            }
            None => *never.entry(h.kind).or_insert(0u64) += 1,
        }
    }
    (rec, never, stalls)
}

/// "Apache Kafka 4.4.0, 3 KRaft nodes, RF 3, min.insync.replicas 2", as the cluster says it
/// of the chaos topic (its partitions' replicas and its `min.insync.replicas`).
async fn describe_broker(brokers: &str, nodes: usize) -> Res<String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let res = admin
        .describe_configs(
            [&ResourceSpecifier::Topic(TOPIC)],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(30))),
        )
        .await?;
    let min_isr = res
        .into_iter()
        .flatten()
        .flat_map(|r| r.entries)
        .find(|e| e.name == "min.insync.replicas")
        .and_then(|e| e.value)
        .unwrap_or_else(|| "?".into());
    let (b, t) = (brokers.to_string(), TOPIC.to_string());
    let rf = tokio::task::spawn_blocking(move || -> Res<usize> {
        let c: BaseConsumer = ClientConfig::new().set("bootstrap.servers", &b).create()?;
        let md = c.fetch_metadata(Some(&t), Duration::from_secs(10))?;
        let topic = md
            .topics()
            .iter()
            .find(|x| x.name() == t)
            .ok_or("no chaos topic")?;
        Ok(topic
            .partitions()
            .iter()
            .map(|p| p.replicas().len())
            .min()
            .unwrap_or(0))
    })
    .await??;
    Ok(format!(
        "Apache Kafka {}, {nodes} KRaft node{}, RF {rf}, min.insync.replicas {min_isr}",
        testkafka::KAFKA_VERSION,
        if nodes == 1 { "" } else { "s" }
    ))
}

/// The servers and proxies the faults act on.
struct World {
    cluster: Arc<PgCluster>,
    broker: Arc<LocalBroker>,
    pg_proxy: Arc<Proxy>,
    /// Ferry's link to a single broker; none with a cluster.
    kafka_proxy: Option<Arc<Proxy>>,
    ferry: Arc<Mutex<Ferry>>,
    broker_sigkill: bool,
    /// What the node faults took to heal.
    nodes: Mutex<NodeHeals>,
    /// The node the last node fault hit (for the fault timeline).
    last_node: Mutex<Option<usize>>,
}

/// How the node faults of a cluster run healed.
#[derive(Debug, Default)]
struct NodeHeals {
    /// From starting (or resuming) the node to the cluster listing it and it answering.
    back: Vec<Duration>,
    /// From then until every partition's ISR held every replica again.
    in_sync: Vec<Duration>,
    /// Node faults after which the ISRs were not whole again within [`IN_SYNC_DEADLINE`].
    not_in_sync: u64,
    /// Leader kills that found no leader for their partition and killed the seed's node.
    leaderless: u64,
}

/// Nodes of the `--cluster` broker.
const CLUSTER_NODES: usize = 3;
/// How long a node is given to be listed and answering again after it was started or resumed.
const NODE_BACK_DEADLINE: Duration = Duration::from_secs(300);
/// How long, after a node is back, every ISR is given to be whole again.
const IN_SYNC_DEADLINE: Duration = Duration::from_secs(120);

impl World {
    /// Injects `p`, holds it, heals it; returns when it was healed and the confirmed LSN the
    /// monitor had seen then. A node fault returns once the node is back, and before that only
    /// once every ISR is whole again (the next fault finds two in-sync replicas besides the
    /// node it hits).
    async fn apply(&self, p: &Planned, seen: &Mutex<Seen>) -> Res<(Instant, u64)> {
        let healed = || {
            (
                Instant::now(),
                seen.lock().unwrap_or_else(|e| e.into_inner()).confirmed,
            )
        };
        let link = |k: FaultKind| -> Res<&Arc<Proxy>> {
            match k {
                FaultKind::PgCut
                | FaultKind::PgBlackhole
                | FaultKind::PgDelay
                | FaultKind::PgThrottle => Ok(&self.pg_proxy),
                _ => self.kafka_proxy.as_ref().ok_or_else(|| {
                    format!("{}: no broker link proxy with --cluster", k.name()).into()
                }),
            }
        };
        match p.kind {
            FaultKind::PgCut | FaultKind::KafkaCut => link(p.kind)?.inject(Fault::Cut),
            FaultKind::PgBlackhole | FaultKind::KafkaBlackhole => {
                link(p.kind)?.inject(Fault::Blackhole);
                tokio::time::sleep(p.hold).await;
                link(p.kind)?.heal();
            }
            FaultKind::PgDelay | FaultKind::KafkaDelay => {
                link(p.kind)?.inject(Fault::Delay(Duration::from_millis(p.param)));
                tokio::time::sleep(p.hold).await;
                link(p.kind)?.heal();
            }
            FaultKind::PgThrottle | FaultKind::KafkaThrottle => {
                link(p.kind)?.inject(Fault::Throttle(p.param));
                tokio::time::sleep(p.hold).await;
                link(p.kind)?.heal();
            }
            FaultKind::FerryKill => {
                let mut f = self.ferry.lock().unwrap_or_else(|e| e.into_inner());
                f.kill();
                f.spawn()?;
            }
            FaultKind::FerryPause => {
                let pid = self.ferry.lock().unwrap_or_else(|e| e.into_inner()).pid();
                if let Some(pid) = pid {
                    kill(pid, libc::SIGSTOP);
                    tokio::time::sleep(p.hold).await;
                    kill(pid, libc::SIGCONT);
                }
            }
            FaultKind::PgStopFast | FaultKind::PgStopImmediate => {
                let immediate = p.kind == FaultKind::PgStopImmediate;
                let c = self.cluster.clone();
                tokio::task::spawn_blocking(move || c.stop(immediate)).await?;
                tokio::time::sleep(p.hold).await;
                let c = self.cluster.clone();
                tokio::task::spawn_blocking(move || c.start_again()).await?;
            }
            FaultKind::BrokerKill => {
                // Apache Kafka: SIGTERM is a controlled shutdown, SIGKILL loses nothing that
                // reached the page cache; either way a transaction left open is aborted or kept
                // by the coordinator after the restart, never lost. Ferry stays up through it.
                let b = self.broker.clone();
                let sigkill = self.broker_sigkill;
                tokio::task::spawn_blocking(move || if sigkill { b.kill() } else { b.stop() })
                    .await?;
                tokio::time::sleep(p.hold).await;
                let b = self.broker.clone();
                tokio::task::spawn_blocking(move || b.start_again()).await?;
            }
            FaultKind::NodeKill
            | FaultKind::LeaderKill
            | FaultKind::NodeRestart
            | FaultKind::NodePause => {
                let i = self.node_for(p).await?;
                *self.last_node.lock().unwrap_or_else(|e| e.into_inner()) = Some(i);
                let b = self.broker.clone();
                let kind = p.kind;
                tokio::task::spawn_blocking(move || match kind {
                    FaultKind::NodeRestart => b.stop_node(i),
                    FaultKind::NodePause => b.pause_node(i),
                    _ => b.kill_node(i),
                })
                .await?;
                tokio::time::sleep(p.hold).await;
                let resumed = Instant::now();
                let b = self.broker.clone();
                tokio::task::spawn_blocking(move || {
                    if kind == FaultKind::NodePause {
                        b.resume_node(i);
                    } else {
                        b.start_node(i);
                    }
                    node_back(&b, i)
                })
                .await??;
                let at = healed();
                let b = self.broker.clone();
                let in_sync = tokio::task::spawn_blocking(move || in_sync(&b.brokers())).await?;
                let mut n = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
                n.back.push(at.0 - resumed);
                match in_sync {
                    Some(d) => n.in_sync.push(d),
                    None => n.not_in_sync += 1,
                }
                return Ok(at);
            }
        }
        Ok(healed())
    }

    /// The node a node fault hits: the seed's, or for a leader kill the current leader of the
    /// seed's partition (of the chaos topic's, or the progress topic's one).
    async fn node_for(&self, p: &Planned) -> Res<usize> {
        let n = self.broker.nodes();
        let by_seed = (p.param % n as u64) as usize;
        if p.kind != FaultKind::LeaderKill {
            return Ok(by_seed);
        }
        let pick = p.param % (PARTITIONS as u64 + 1);
        let (topic, partition) = if pick == PARTITIONS as u64 {
            (PROGRESS_TOPIC, 0)
        } else {
            (TOPIC, pick as i32)
        };
        let b = self.broker.clone();
        let leader = tokio::task::spawn_blocking(move || {
            testkafka::leader_of(&b.brokers(), topic, partition).and_then(|id| b.node_of(id))
        })
        .await?;
        Ok(leader.unwrap_or_else(|| {
            self.nodes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .leaderless += 1;
            by_seed
        }))
    }

    /// Heals what a fault may have left: the proxies, Ferry paused, a node down or paused.
    async fn heal_all(&self) -> Res<()> {
        self.pg_proxy.heal();
        if let Some(k) = &self.kafka_proxy {
            k.heal();
        }
        if let Some(pid) = self.ferry.lock().unwrap_or_else(|e| e.into_inner()).pid() {
            kill(pid, libc::SIGCONT);
        }
        if self.broker.nodes() > 1 {
            let b = self.broker.clone();
            tokio::task::spawn_blocking(move || -> Res<()> {
                for i in 0..b.nodes() {
                    b.resume_node(i);
                    b.start_node(i);
                }
                (0..b.nodes()).try_for_each(|i| node_back(&b, i))
            })
            .await??;
        }
        Ok(())
    }
}

/// Waits (blocking) until node `i` itself answers a metadata request that lists every node
/// (a Kafka node serves requests only once it is unfenced; a node just killed may still be
/// listed for the controller's session timeout, so the listing alone says little). Not
/// `LocalBroker::wait_brokers`, which panics after 90 s: on a 2-core machine under a load
/// average of 30-45 the KRaft quorum took longer than that to register a restarted node.
fn node_back(broker: &LocalBroker, i: usize) -> Res<()> {
    let start = Instant::now();
    let own = broker
        .brokers()
        .split(',')
        .nth(i)
        .ok_or("no such node")?
        .to_string();
    loop {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &own)
            .set("log_level", "0")
            .create()?;
        if c.fetch_metadata(None, Duration::from_secs(1))
            .is_ok_and(|md| md.brokers().len() >= broker.nodes())
        {
            return Ok(());
        }
        if start.elapsed() > NODE_BACK_DEADLINE {
            return Err(format!(
                "broker node {} not back within {NODE_BACK_DEADLINE:?}; its log:\n{}",
                i + 1,
                broker.log_tail(i, 40)
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (blocking) until every partition of every topic has its whole replica set in sync,
/// and says how long that took; `None` at [`IN_SYNC_DEADLINE`].
fn in_sync(brokers: &str) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < IN_SYNC_DEADLINE {
        let whole = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("log_level", "0")
            .create::<BaseConsumer>()
            .ok()
            .and_then(|c| c.fetch_metadata(None, Duration::from_secs(2)).ok())
            .is_some_and(|md| {
                md.topics().iter().all(|t| {
                    t.error().is_none()
                        && t.partitions()
                            .iter()
                            .all(|p| p.leader() >= 0 && p.isr().len() >= p.replicas().len())
                })
            });
        if whole {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

fn kill(pid: u32, sig: libc::c_int) {
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on the pid of a child this process holds (not yet reaped).
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Polls Ferry every 100 ms: confirmed LSN, in-flight records, peak RSS; restarts a Ferry that
/// exited on its own.
async fn monitor(
    ferry: Arc<Mutex<Ferry>>,
    seen: Arc<Mutex<Seen>>,
    on: Arc<std::sync::atomic::AtomicBool>,
) {
    while on.load(Ordering::Relaxed) {
        let (port, pid, exited) = {
            let mut f = ferry.lock().unwrap_or_else(|e| e.into_inner());
            let exited = f
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
                .map(|s| s.to_string());
            if let Some(status) = &exited {
                f.child = None;
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .exits
                    .push(status.clone());
                let _ = f.spawn();
            }
            (f.port, f.pid(), exited)
        };
        let _ = exited;
        let body =
            tokio::time::timeout(Duration::from_millis(500), procfs::fetch_metrics(port)).await;
        {
            if let Ok(Ok(body)) = body {
                let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(c) = procfs::scalar(&body, "ferry_confirmed_lsn") {
                    if c as u64 > s.confirmed {
                        s.confirmed = c as u64;
                        s.advances.push((Instant::now(), c as u64));
                    }
                }
                if let Some(n) = procfs::scalar(&body, "ferry_in_flight_records") {
                    s.peak_in_flight = s.peak_in_flight.max(n);
                }
            }
        }
        if let Some(rss) = pid.and_then(|p| procfs::peak_rss_kib(p).ok()) {
            let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
            s.peak_rss_kib = s.peak_rss_kib.max(rss);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The printed result.
struct Report<'a> {
    args: &'a ChaosArgs,
    counts: &'a BTreeMap<FaultKind, u64>,
    recovery: &'a BTreeMap<FaultKind, Vec<Duration>>,
    unrecovered: &'a BTreeMap<FaultKind, u64>,
    stalls: &'a BTreeMap<FaultKind, Vec<Duration>>,
    nodes: &'a NodeHeals,
    /// What the broker is ([`describe_broker`]).
    broker: &'a str,
    truth: &'a load::Truth,
    verdict: &'a check::Verdict,
    seen: &'a Seen,
    caught_up: bool,
    spawns: u64,
    elapsed: Duration,
}

impl Report<'_> {
    fn table(&self) -> String {
        let mut t = format!(
            "`{}` — seed {}, {} s of faults, run {:.0} s\n\
             broker: {}{}\n\n\
             | fault | count | recovery p50 | recovery max | never recovered | longest stall p50 | longest stall max |\n\
             | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
            self.args.command.trim(),
            self.args.seed,
            self.args.duration.as_secs(),
            self.elapsed.as_secs_f64(),
            self.broker,
            if self.args.exactly_once {
                "; exactly-once, read back read_committed"
            } else {
                "; at-least-once"
            },
        );
        for (kind, n) in self.counts {
            let (p50, max) = p50_max(self.recovery.get(kind));
            let (s50, smax) = p50_max(self.stalls.get(kind));
            t += &format!(
                "| {} | {n} | {p50} | {max} | {} | {s50} | {smax} |\n",
                kind.name(),
                self.unrecovered.get(kind).copied().unwrap_or(0)
            );
        }
        let v = self.verdict;
        let tr = self.truth;
        t += &format!(
            "\n| figure | value |\n| --- | ---: |\n\
             | transactions committed / rolled back / in doubt (settled by the status table) | {} / {} / {} |\n\
             | rows committed | {} |\n\
             | rows rolled back | {} |\n\
             | records delivered | {} |\n\
             | **lost** | **{}** |\n\
             | **phantom** (rolled back yet delivered) | **{}** |\n\
             | **per-key order violations** | **{}** |\n\
             | duplicates | {} |\n\
             | confirmed LSN passed the last commit | {} |\n\
             | ferry processes started / exited on their own | {} / {} |\n\
             | peak RSS of ferry | {:.1} MiB |\n\
             | peak in-flight records | {} |\n",
            tr.txns_committed,
            tr.txns_rolled_back,
            tr.txns_in_doubt,
            v.rows_committed,
            v.rows_rolled_back,
            v.delivered,
            v.lost,
            v.phantom,
            v.order_violations,
            v.duplicates,
            if self.caught_up { "yes" } else { "NO (deadline)" },
            self.spawns,
            self.seen.exits.len(),
            self.seen.peak_rss_kib as f64 / 1024.0,
            self.seen.peak_in_flight
        );
        let n = self.nodes;
        if !n.back.is_empty() {
            let (b50, bmax) = p50_max(Some(&n.back));
            let (i50, imax) = p50_max(Some(&n.in_sync));
            t += &format!(
                "| broker node started or resumed → listed and answering (p50 / max) | {b50} / {bmax} |\n\
                 | then → every ISR whole again (p50 / max; not within {} s) | {i50} / {imax}; {} |\n",
                IN_SYNC_DEADLINE.as_secs(),
                n.not_in_sync
            );
            if n.leaderless > 0 {
                t += &format!(
                    "| leader kills that found no leader (killed the seed's node) | {} |\n",
                    n.leaderless
                );
            }
        }
        t
    }
}

/// The median and the maximum, or dashes for none.
fn p50_max(d: Option<&Vec<Duration>>) -> (String, String) {
    let mut r = d.cloned().unwrap_or_default();
    r.sort();
    match r.len() {
        0 => ("-".to_string(), "-".to_string()),
        len => (secs(r[len / 2]), secs(r[len - 1])),
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_fails_on_anything_lost_phantom_reordered_stalled_or_exited() {
        let clean = check::Verdict {
            rows_committed: 10,
            delivered: 12,
            duplicates: 2,
            ..check::Verdict::default()
        };
        assert!(passes(true, &clean, 0, false));
        // Duplicates are allowed at least once, never exactly once.
        assert!(!passes(true, &clean, 0, true));
        assert!(passes(
            true,
            &check::Verdict {
                duplicates: 0,
                ..clean.clone()
            },
            0,
            true
        ));
        assert!(!passes(false, &clean, 0, false), "never caught up");
        assert!(!passes(true, &clean, 1, false), "ferry stopped on its own");
        for bad in [
            check::Verdict {
                lost: 1,
                ..clean.clone()
            },
            check::Verdict {
                phantom: 1,
                ..clean.clone()
            },
            check::Verdict {
                order_violations: 1,
                ..clean.clone()
            },
        ] {
            assert!(!passes(true, &bad, 0, false), "{bad:?}");
        }
    }
}
