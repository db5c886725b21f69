//! Contender 3, Ferry end to end: the `ferry` binary (read → route → produce with `acks=all` →
//! confirm in the slot) draining a backlog from its slot.
//!
//! Ferry is measured twice. *From process start* (contender `ferry-cold`): spawned on a free
//! slot, as `pg_recvlogical` is, with the clock, the CPU and the first acknowledgement counted
//! from the spawn, so start-up is in the figure. *As a warm standby taking over* (contender
//! `ferry`), so that the figure is throughput rather than process start-up, which
//! [`crate::startup`] measures on its own. A [`Holder`]
//! keeps the slot active (a replication connection that never reads) while the backlog is
//! written; Ferry is started on the slot, finds it in use and stands by with its producer
//! ready; then the holder disconnects and the clock starts. It stops when the slot's
//! `confirmed_flush_lsn` reaches the backlog's end, so it includes Ferry noticing the free slot
//! (it polls every 50 ms), connecting and starting replication, and every record being
//! acknowledged and confirmed. CPU seconds are Ferry's from the release on; peak RSS
//! (`VmHWM`) is its whole life's. Beside the slot's end, the end Debezium is held to is taken
//! too: the topic's high watermarks reaching the backlog ([`crate::kafka::Watch`]).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferry_testkit::kafka as testkafka;
use ferry_testkit::process::{free_port, signal, signal_pid, spawn_owned};
use ferry_wal::conn::replication::ReplicationConnection;
use ferry_wal::conn::ConnectConfig;
use ferry_wal::Lsn;

use crate::kafka::Watch;
use crate::{confirmed, procfs, Res, Sample, PUBLICATION};

/// The `ferry` binary: `FERRY_BIN`, else beside this executable.
pub fn bin() -> Res<PathBuf> {
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

/// `FERRY_BENCH_EXACTLY_ONCE=true` runs Ferry in exactly-once mode (`kafka.exactly_once`), so
/// the two modes are compared on the same workloads. Every Ferry has a progress topic of its own
/// already ([`progress_topic_for`]), as exactly-once mode needs.
fn exactly_once() -> Option<(&'static str, &'static str)> {
    exactly_once_on().then_some(("FERRY_KAFKA_EXACTLY_ONCE", "true"))
}

/// Whether `FERRY_BENCH_EXACTLY_ONCE` asks for exactly-once mode.
fn exactly_once_on() -> bool {
    matches!(
        std::env::var("FERRY_BENCH_EXACTLY_ONCE").as_deref(),
        Ok("true" | "1")
    )
}

/// A new progress topic's name for a Ferry on `slot`. Slots of one name are dropped and created
/// again between runs: each Ferry gets a progress topic of its own, or the next run's slot would
/// be a gap to it.
pub fn progress_topic_for(slot: &str) -> String {
    format!(
        "ferry-bench.progress.{}.{}.{}",
        std::process::id(),
        slot,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    )
}

/// A running `ferry run` and its metrics port.
pub struct Running {
    pub child: Child,
    pub port: u16,
    /// Its progress topic: a restart of the same Ferry reads it ([`Running::restart`]).
    progress_topic: String,
    /// What it was started with, for [`Running::restart`].
    args: Args,
}

/// What a [`Running`] was started with.
#[derive(Clone)]
struct Args {
    wrapper: Vec<String>,
    db_url: String,
    brokers: String,
    slot: String,
    topic: String,
    /// The slot is one the harness created (every slot of the harness is) and this Ferry streams
    /// it first: in exactly-once mode it starts with `--initialize-progress`, as a deployment
    /// adopting a slot it did not create does (such a slot has no progress record, and
    /// exactly-once mode refuses it otherwise). A [`Running::restart`] does not.
    adopts_slot: bool,
}

impl Args {
    fn new(wrapper: &[String], db_url: &str, brokers: &str, slot: &str, topic: &str) -> Args {
        Args {
            wrapper: wrapper.to_vec(),
            db_url: db_url.into(),
            brokers: brokers.into(),
            slot: slot.into(),
            topic: topic.into(),
            adopts_slot: true,
        }
    }
}

impl Running {
    /// Starts `ferry run` on `slot`, routing every row to `topic` (a template).
    pub fn spawn(db_url: &str, brokers: &str, slot: &str, topic: &str) -> Res<Running> {
        Running::spawn_under(&[], db_url, brokers, slot, topic)
    }

    /// [`Running::spawn`] under a wrapper: `wrapper[0] wrapper[1..] <ferry> run` (e.g.
    /// valgrind, see [`crate::instructions`]), with the same environment.
    pub fn spawn_under(
        wrapper: &[String],
        db_url: &str,
        brokers: &str,
        slot: &str,
        topic: &str,
    ) -> Res<Running> {
        let args = Args::new(wrapper, db_url, brokers, slot, topic);
        Running::start(args, progress_topic_for(slot))
    }

    /// [`Running::spawn`] with `progress_topic` as its progress topic (one the harness created,
    /// say, as a deployment's first start did).
    pub fn spawn_with_progress(
        db_url: &str,
        brokers: &str,
        slot: &str,
        topic: &str,
        progress_topic: String,
    ) -> Res<Running> {
        Running::start(Args::new(&[], db_url, brokers, slot, topic), progress_topic)
    }

    /// Its progress topic.
    pub fn progress_topic(&self) -> &str {
        &self.progress_topic
    }

    /// The same Ferry started again (after this one was killed, say): same slot, same
    /// configuration, same progress topic, as a restarted pod finds them.
    pub fn restart(&self) -> Res<Running> {
        let args = Args {
            adopts_slot: false,
            ..self.args.clone()
        };
        Running::start(args, self.progress_topic.clone())
    }

    fn start(args: Args, progress_topic: String) -> Res<Running> {
        let Args {
            wrapper,
            db_url,
            brokers,
            slot,
            topic,
            adopts_slot,
        } = &args;
        let (db_url, brokers, slot, topic) = (
            db_url.as_str(),
            brokers.as_str(),
            slot.as_str(),
            topic.as_str(),
        );
        let port = free_port();
        let mut cmd = match wrapper.split_first() {
            None => Command::new(bin()?),
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin()?);
                c
            }
        };
        cmd.arg("run");
        if *adopts_slot && exactly_once_on() {
            cmd.arg("--initialize-progress");
        }
        cmd.env_clear()
            .env("FERRY_POSTGRES_URL", db_url)
            .env("FERRY_POSTGRES_SLOT", slot)
            .env("FERRY_POSTGRES_PUBLICATION", PUBLICATION)
            .env("FERRY_KAFKA_BROKERS", brokers)
            .env("FERRY_KAFKA_COMPRESSION", crate::kafka::compression())
            .env("FERRY_ROUTE_TOPIC", topic)
            .env("FERRY_KAFKA_PROGRESS_TOPIC", &progress_topic)
            .env("FERRY_HTTP_LISTEN", format!("127.0.0.1:{port}"))
            .env(
                "FERRY_POSTGRES_STANDBY_POLL_INTERVAL",
                format!("{}ms", standby_poll().as_millis()),
            )
            .env(
                "FERRY_LOG_LEVEL",
                std::env::var("FERRY_BENCH_LOG_LEVEL").unwrap_or_else(|_| "warn".into()),
            )
            .envs(exactly_once())
            // The allocator's own settings pass through, for experiments: glibc's tunables (e.g.
            // `glibc.malloc.mxfast=0`), another allocator preloaded (`LD_PRELOAD`) and its
            // options (`MALLOC_CONF` for jemalloc, `MIMALLOC_*`); all are read at process start.
            .envs(std::env::vars().filter(|(k, _)| {
                k == "GLIBC_TUNABLES"
                    || k == "LD_PRELOAD"
                    || k == "MALLOC_CONF"
                    || k.starts_with("MIMALLOC_")
                    // and the in-flight window, for memory experiments, librdkafka's own
                    // properties (`message.copy.max.bytes`, `linger.ms`, ...), and the
                    // exactly-once transactions' bounds (`FERRY_KAFKA_TRANSACTION_INTERVAL`)
                    || k.starts_with("FERRY_KAFKA_MAX_IN_FLIGHT_")
                    || k.starts_with("FERRY_KAFKA_PROPERTIES_")
                    || k.starts_with("FERRY_KAFKA_TRANSACTION_")
            }))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        Ok(Running {
            child: spawn_owned(cmd, libc::SIGKILL)?,
            port,
            progress_topic,
            args,
        })
    }

    /// Fails if Ferry has exited.
    pub fn check_alive(&mut self) -> Res<()> {
        match self.child.try_wait()? {
            Some(status) => Err(format!("ferry exited early: {status}").into()),
            None => Ok(()),
        }
    }

    /// An unlabelled metric's value, if Ferry answers.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let body = procfs::fetch_metrics(self.port).await.ok()?;
        procfs::scalar(&body, name)
    }

    /// `ferry_records_produced_total`, if Ferry answers.
    pub async fn produced(&self) -> Option<f64> {
        self.metric("ferry_records_produced_total").await
    }

    /// SIGTERM (Ferry drains and confirms), then waits for the exit.
    pub async fn stop(mut self) {
        signal(&self.child, libc::SIGTERM);
        let _ = tokio::task::spawn_blocking(move || self.child.wait()).await;
    }
}

/// Keeps a slot active without consuming it: a replication connection that started streaming
/// and never reads. Dropping it frees the slot.
/// Holds a slot as a streaming Ferry does: a replication connection streaming from it, and the
/// slot's hand-over lock on an SQL connection (`ferry_wal::slot::handover`), which a standby
/// Ferry waits for. Dropped, both connections close, as when a Ferry process dies.
pub struct Holder {
    _replication: ReplicationConnection,
    _sql: tokio_postgres::Client,
}

impl Holder {
    pub async fn hold(db_url: &str, slot: &str) -> Res<Holder> {
        let mut conn = ReplicationConnection::connect(&ConnectConfig::parse(db_url)?).await?;
        conn.start_copy_both(&format!(
            "START_REPLICATION SLOT \"{slot}\" LOGICAL 0/0 \
             (proto_version '1', publication_names '\"{PUBLICATION}\"', messages 'true')"
        ))
        .await?;
        let sql = ferry_testkit::pg::connect(db_url).await;
        if !ferry_wal::slot::handover::hold(&sql, slot).await? {
            return Err(format!("the hand-over lock of slot {slot} is held elsewhere").into());
        }
        Ok(Holder {
            _replication: conn,
            _sql: sql,
        })
    }
}

/// How often a standby Ferry polls its slot here (`postgres.standby_poll_interval`): Ferry's
/// default, or `FERRY_BENCH_STANDBY_POLL_MS` milliseconds (to time a build that has no
/// hand-over lock as the harness did before, at 50 ms).
pub fn standby_poll() -> Duration {
    match std::env::var("FERRY_BENCH_STANDBY_POLL_MS") {
        Ok(ms) if !ms.is_empty() => match ms.parse() {
            Ok(ms) => Duration::from_millis(ms),
            Err(_) => panic!("FERRY_BENCH_STANDBY_POLL_MS={ms:?}: not a number of milliseconds"),
        },
        _ => ferry::config::defaults::STANDBY_POLL_INTERVAL,
    }
}

/// How long Ferry stands by before the slot is freed: long enough for the producer id (~60 ms
/// from start against a local broker, up to ~1 s when the brokers answer slowly).
const WARM_UP: Duration = Duration::from_millis(1500);
/// With every record acknowledged, how long the confirmed LSN may stay short of the measured
/// end (WAL written after the last commit that no keepalive has reported yet) before the last
/// confirmation counts as the end.
const SETTLE: Duration = Duration::from_secs(3);

/// `--stall-broker`: how far into a drain the broker stops.
pub const STALL_AFTER: Duration = Duration::from_millis(700);
/// `--stall-broker`: how long it stays stopped.
pub const STALL_FOR: Duration = Duration::from_secs(4);

/// The local broker (process `pid`) stopped with SIGSTOP [`STALL_AFTER`] after `from`, for
/// [`STALL_FOR`], then continued; continued on drop too, whatever happened meanwhile. Its
/// connections stay open and nothing answers: the in-flight window fills and stays full.
pub struct Stall {
    pid: u32,
    task: tokio::task::JoinHandle<()>,
}

impl Stall {
    pub fn start(pid: u32, from: Instant) -> Stall {
        let task = tokio::spawn(async move {
            tokio::time::sleep_until((from + STALL_AFTER).into()).await;
            signal_pid(pid, libc::SIGSTOP);
            tokio::time::sleep(STALL_FOR).await;
            signal_pid(pid, libc::SIGCONT);
        });
        Stall { pid, task }
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        self.task.abort();
        // SIGCONT to a running process does nothing.
        signal_pid(self.pid, libc::SIGCONT);
    }
}

/// Drains the backlog on `slot` (`rows` rows ending at `end`): with a `holder`, which keeps the
/// slot busy until Ferry stands by, from the holder letting go; without, from the spawn. With
/// `stall` (the local broker's pid), the broker is stopped for a while into the drain
/// ([`Stall`]).
#[allow(clippy::too_many_arguments)]
pub async fn drain(
    db_url: &str,
    brokers: &str,
    sql: &tokio_postgres::Client,
    slot: &str,
    topic: &str,
    rows: u64,
    end: Lsn,
    holder: Option<Holder>,
    stall: Option<u32>,
) -> Res<Sample> {
    // The same end as Debezium's, beside the slot's: Kafka holding every record.
    let mut watch = Watch::start(
        brokers,
        &topic.replace("{aggregatetype}", "order"),
        rows as i64,
    )?;
    // From process start, the progress topic exists (as the slot does, for every contender): a
    // deployment's first start created it, and a process start after that, a restart or a
    // rollout, finds it. A standby creates its own while it waits, off the clock.
    let progress_topic = progress_topic_for(slot);
    if holder.is_none() {
        testkafka::create_topic_with(
            brokers,
            &progress_topic,
            1,
            &[("cleanup.policy", "compact")],
        )
        .await;
    }
    let spawned = Instant::now();
    let mut ferry = Running::spawn_with_progress(db_url, brokers, slot, topic, progress_topic)?;
    let pid = ferry.child.id();
    while holder.is_some()
        && (spawned.elapsed() < WARM_UP || ferry.metric("ferry_standby").await != Some(1.0))
    {
        ferry.check_alive()?;
        if ferry.metric("ferry_streaming").await == Some(1.0) {
            return Err(
                "ferry found the slot free before the holder let go of it: the server \
                        ended the holder's session (set wal_sender_timeout = 0 on the server)"
                    .into(),
            );
        }
        if spawned.elapsed() > Duration::from_secs(60) {
            return Err("ferry did not stand by within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (cpu, wire_before, start) = match holder {
        Some(holder) => {
            let cpu = procfs::cpu_seconds(pid)?;
            let wire_before = procfs::tcp_bytes_acked(pid, brokers).unwrap_or(0);
            let start = Instant::now();
            drop(holder);
            (cpu, wire_before, start)
        }
        None => (0.0, 0, spawned),
    };
    let _stall = stall.map(|pid| Stall::start(pid, start));
    let mut first_ack = None;
    let initial = confirmed(sql, slot).await?;
    let (mut last, mut last_at) = (initial, start);
    let mut all_acked: Option<Instant> = None;
    let mut polls = 0u64;
    // Near the end, every poll also reads Ferry's count, so that the last acknowledgement is
    // timed as finely as the confirmation (before that, every 4th: /metrics costs Ferry CPU).
    let mut produced = 0.0;
    let secs = loop {
        let c = confirmed(sql, slot).await?;
        if c >= end {
            break start.elapsed().as_secs_f64();
        }
        if c > last {
            (last, last_at) = (c, Instant::now());
        }
        ferry.check_alive()?;
        polls += 1;
        if polls % 4 == 0 || produced >= rows as f64 * 0.9 {
            produced = ferry.produced().await.unwrap_or(0.0);
            if first_ack.is_none() && produced > 0.0 {
                first_ack = Some(start.elapsed().as_secs_f64());
            }
            if produced >= rows as f64 {
                all_acked.get_or_insert_with(Instant::now);
            }
        }
        // Every record acknowledged long ago, the confirmed LSN moved since and then stood
        // still: the rest of the distance to `end` is WAL no keepalive has reported yet.
        if all_acked.is_some_and(|t| t.elapsed() > SETTLE)
            && last > initial
            && last_at.elapsed() > SETTLE
        {
            eprintln!("  (ferry confirmed {last}, short of {end}, with every record acknowledged: WAL after the last commit)");
            break (last_at - start).as_secs_f64();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let cpu = procfs::cpu_seconds(pid)? - cpu;
    let peak_rss_kib = procfs::peak_rss_kib(pid)?;
    let seen = watch
        .wait_all(Duration::from_secs(60), || ferry.check_alive())
        .await?;
    let since = |t: Option<Instant>| t.map(|t| t.saturating_duration_since(start).as_secs_f64());
    let wire_bytes = procfs::tcp_bytes_acked(pid, brokers).map(|b| b - wire_before);
    let produced = ferry.produced().await.unwrap_or(f64::NAN);
    ferry.stop().await;
    if produced != rows as f64 {
        return Err(format!(
            "ferry confirmed the backlog but reports {produced} records produced, expected {rows}"
        )
        .into());
    }
    Ok(Sample {
        secs,
        cpu: Some(cpu),
        peak_rss_kib: Some(peak_rss_kib),
        first_ack: Some(first_ack.unwrap_or(secs)),
        last_ack: all_acked.map(|t| (t - start).as_secs_f64().min(secs)),
        wire_bytes,
        kafka_first: since(seen.first),
        kafka_all: since(seen.all),
    })
}
