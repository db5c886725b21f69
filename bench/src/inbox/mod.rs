//! `ferry-bench inbox`: `ferry inbox` (the real binary, spawned) measured on the harness's
//! PostgreSQL and broker.
//!
//! - **drain** ([`drain`]): N records of ~1 KB JSON ([`produce`]) wait in a topic of 6
//!   partitions; `ferry inbox` is spawned on a fresh database with a fresh consumer group and
//!   drains them. The clock's end is the commit of the last batch (its rows'
//!   `pg_xact_commit_timestamp`, exact): records/s from process start and after the first
//!   batch's commit, CPU seconds per 100k records (`ferry`'s own, and PostgreSQL's: every
//!   process of the cluster), peak RSS (`VmHWM`).
//! - **latency** ([`latency`]): a writer commits outbox rows at a steady rate, `ferry run`
//!   relays them, `ferry inbox` stores them: outbox commit → inbox commit, from both rows'
//!   commit timestamps (two databases of one cluster: one clock).
//! - **cleanup** ([`cleanup`]): the deduplication table holds N expired event ids; `ferry inbox`
//!   takes a steady load while its cleanup deletes them; how long the cleanup took, its
//!   longest DELETE, and the inbox's writes during it against before it (the longest gap
//!   between commits, rows/s, Kafka timestamp → commit).

mod cleanup;
mod latency;
mod produce;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_testkit::kafka as testkafka;
use ferry_testkit::pg;
use ferry_testkit::process::{free_port, signal, spawn_owned};

use crate::machine::{self, Machine};
use crate::workload::thousands;
use crate::world::World;
use crate::{procfs, Res};

pub const USAGE: &str = "\
ferry-bench inbox: `ferry inbox` draining a backlog, latency through the whole chain, cleanup
under load

usage: ferry-bench inbox [flags]

  --records N           records of ~1 KB JSON in the backlog each drain run takes (default
                        200000; 0 skips the drain)
  --runs N              drain runs; figures are medians, spreads min-max (default 3)
  --rate R              outbox rows/s of the latency run: writer -> ferry run -> Kafka ->
                        ferry inbox (default 2000; 0 skips it)
  --latency-secs S      length of the latency run (default 30)
  --cleanup-rows N      the cleanup run: N expired event ids in the deduplication table,
                        deleted by ferry inbox's cleanup while it takes --cleanup-load
                        records/s (default 0: no cleanup run). Given alone, it is the only run
  --cleanup-load R      records/s produced during the cleanup run (default 10000)
  --cleanup-after D     inbox.cleanup_interval of the cleanup run, e.g. 20s: the first
                        cleanup starts that long after ferry inbox (default 30s)
  --synchronous-commit off   ALTER DATABASE ... SET synchronous_commit = off on the inbox's
                        databases (the user's choice; PostgreSQL's default is on)
  --env K=V             extra environment for every ferry inbox (e.g.
                        FERRY_INBOX_MAX_BATCH_RECORDS=10000); repeatable
  --seed N              the records' seed (default 1)
  --smoke               tiny version of each run (2,000 records, 2 s of latency, 20,000 ids)
  -h, --help            this text

Starts a private PostgreSQL cluster and a local broker, unless FERRY_TEST_PG_URL /
FERRY_TEST_KAFKA_BROKERS name existing ones (the latency run needs track_commit_timestamp =
on). The ferry binary is FERRY_BIN, else the one beside this executable;
FERRY_BENCH_LOG_LEVEL sets its log level (default warn).";

#[derive(Debug, Clone)]
pub struct InboxArgs {
    pub records: u64,
    pub runs: u32,
    pub rate: u64,
    pub latency_secs: f64,
    pub cleanup_rows: u64,
    pub cleanup_load: u64,
    pub cleanup_after: Duration,
    pub synchronous_commit_off: bool,
    pub env: Vec<(String, String)>,
    pub seed: u64,
    pub smoke: bool,
    pub command: String,
}

impl InboxArgs {
    pub fn parse(args: &[String]) -> Res<Option<InboxArgs>> {
        let mut a = InboxArgs {
            records: 200_000,
            runs: 3,
            rate: 2000,
            latency_secs: 30.0,
            cleanup_rows: 0,
            cleanup_load: 10_000,
            cleanup_after: Duration::from_secs(30),
            synchronous_commit_off: false,
            env: Vec::new(),
            seed: 1,
            smoke: false,
            command: format!("ferry-bench inbox {}", args.join(" ")),
        };
        let (mut records, mut rate) = (None, None);
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "-h" | "--help" => return Ok(None),
                "--records" => records = Some(value()?.parse()?),
                "--runs" => a.runs = value()?.parse()?,
                "--rate" => rate = Some(value()?.parse()?),
                "--latency-secs" => a.latency_secs = value()?.parse()?,
                "--cleanup-rows" => a.cleanup_rows = value()?.parse()?,
                "--cleanup-load" => a.cleanup_load = value()?.parse()?,
                "--cleanup-after" => {
                    a.cleanup_after = crate::chaos::parse_duration(value()?)?;
                }
                "--synchronous-commit" => match value()?.as_str() {
                    "off" => a.synchronous_commit_off = true,
                    "on" => a.synchronous_commit_off = false,
                    v => return Err(format!("--synchronous-commit {v:?}: on or off").into()),
                },
                "--env" => {
                    let v = value()?;
                    let (k, v) = v
                        .split_once('=')
                        .ok_or_else(|| format!("--env {v:?}: expected K=V"))?;
                    a.env.push((k.to_string(), v.to_string()));
                }
                "--seed" => a.seed = value()?.parse()?,
                "--smoke" => {
                    a.smoke = true;
                    a.runs = 1;
                    a.latency_secs = 2.0;
                    a.cleanup_after = Duration::from_secs(3);
                    a.cleanup_load = 1000;
                }
                other => return Err(format!("unknown flag {other:?} (see --help)").into()),
            }
        }
        if a.runs == 0 {
            return Err("--runs must be at least 1".into());
        }
        // --cleanup-rows alone is the cleanup run alone.
        let alone = a.cleanup_rows > 0;
        a.records = records.unwrap_or(match (a.smoke, alone) {
            (true, _) => 2_000,
            (false, true) => 0,
            (false, false) => 200_000,
        });
        a.rate = rate.unwrap_or(if alone && !a.smoke { 0 } else { 2000 });
        if a.smoke {
            a.rate = a.rate.min(500);
            if a.cleanup_rows == 0 {
                a.cleanup_rows = 20_000;
            }
        }
        Ok(Some(a))
    }
}

/// Entry point of `ferry-bench inbox`; returns the exit code.
pub async fn main(argv: &[String]) -> i32 {
    let args = match InboxArgs::parse(argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("ferry-bench inbox: {e}");
            return 2;
        }
    };
    match run(args).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ferry-bench inbox: {e}");
            1
        }
    }
}

/// The topic partitions of every inbox run.
const PARTITIONS: i32 = crate::kafka::PARTITIONS;

async fn run(args: InboxArgs) -> Res<()> {
    let started = Instant::now();
    let mut m = Machine::probe();
    m.ferry = machine::output(&crate::ferry::bin()?.to_string_lossy(), &["--version"]);
    let world = World::start().await?;
    let admin = pg::connect(&world.admin_url).await;
    m.postgres = admin.query_one("SHOW server_version", &[]).await?.get(0);
    println!(
        "{}\n  {}\n  PostgreSQL {}, broker {}, librdkafka {}, {} (commit {}); load average {:.1}",
        args.command.trim(),
        m.summary(),
        m.postgres,
        world.broker_version(),
        m.librdkafka,
        m.ferry,
        m.commit,
        machine::load_average()
    );
    let ctx = Ctx {
        admin,
        world,
        args: args.clone(),
    };
    if args.records > 0 {
        drain::all(&ctx).await?;
    }
    if args.rate > 0 {
        latency::run(&ctx).await?;
    }
    if args.cleanup_rows > 0 {
        cleanup::run(&ctx).await?;
    }
    println!(
        "\ndone in {:.0} s; load average {:.1}",
        started.elapsed().as_secs_f64(),
        machine::load_average()
    );
    Ok(())
}

/// What every run of the family shares.
pub struct Ctx {
    pub admin: tokio_postgres::Client,
    pub world: World,
    pub args: InboxArgs,
}

impl Ctx {
    /// A fresh, empty database for an inbox; its name and URL.
    pub async fn inbox_db(&self, prefix: &str) -> Res<(String, String)> {
        let db = pg::unique_name(prefix);
        self.admin
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await?;
        if self.args.synchronous_commit_off {
            self.admin
                .batch_execute(&format!("ALTER DATABASE {db} SET synchronous_commit = off"))
                .await?;
        }
        Ok((db.clone(), pg::with_dbname(&self.world.admin_url, &db)))
    }

    pub async fn drop_db(&self, db: &str) -> Res<()> {
        self.admin
            .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
            .await?;
        Ok(())
    }

    /// A topic of [`PARTITIONS`] partitions with a name of its own.
    pub async fn topic(&self, prefix: &str) -> String {
        self.topic_with(prefix, &[]).await
    }

    /// [`Ctx::topic`] with topic configuration.
    pub async fn topic_with(&self, prefix: &str, config: &[(&str, &str)]) -> String {
        let t = pg::unique_name(prefix);
        testkafka::create_topic_with(&self.world.brokers(), &t, PARTITIONS, config).await;
        t
    }

    /// The pid of the postmaster (this machine's cluster), for PostgreSQL's CPU.
    pub async fn postmaster(&self) -> Option<i32> {
        let backend: i32 = self
            .admin
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .ok()?
            .get(0);
        crate::pin::parent_of(backend)
    }
}

/// A running `ferry inbox`.
pub struct InboxProc {
    pub child: Option<Child>,
    pub port: u16,
    pub spawned: SystemTime,
}

impl InboxProc {
    /// Spawns `ferry inbox` on `db_url`, consuming `topic` with `group`; its log goes to `log`
    /// (else to this process's stderr).
    pub fn spawn(
        ctx: &Ctx,
        db_url: &str,
        topic: &str,
        group: &str,
        extra: &[(&str, String)],
        log: Option<&Path>,
    ) -> Res<InboxProc> {
        let port = free_port();
        let mut cmd = Command::new(crate::ferry::bin()?);
        cmd.arg("inbox")
            .env_clear()
            .env("FERRY_POSTGRES_URL", db_url)
            .env("FERRY_KAFKA_BROKERS", ctx.world.brokers())
            .env("FERRY_INBOX_TOPICS", topic)
            .env("FERRY_INBOX_GROUP_ID", group)
            .env("FERRY_HTTP_LISTEN", format!("127.0.0.1:{port}"))
            .env(
                "FERRY_LOG_LEVEL",
                std::env::var("FERRY_BENCH_LOG_LEVEL").unwrap_or_else(|_| "warn".into()),
            )
            .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
            .envs(ctx.args.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        match log {
            Some(path) => {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                cmd.stdout(f.try_clone()?).stderr(f);
            }
            None => {
                cmd.stderr(Stdio::inherit());
            }
        }
        let spawned = SystemTime::now();
        Ok(InboxProc {
            child: Some(spawn_owned(cmd, libc::SIGKILL)?),
            port,
            spawned,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn check_alive(&mut self) -> Res<()> {
        match self.child.as_mut().map(Child::try_wait).transpose()? {
            Some(Some(status)) => Err(format!("ferry inbox exited early: {status}").into()),
            _ => Ok(()),
        }
    }

    pub async fn metric(&self, name: &str) -> Option<f64> {
        procfs::scalar(&procfs::fetch_metrics(self.port).await.ok()?, name)
    }

    /// SIGTERM, then waits for the exit.
    pub async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(&c, libc::SIGTERM);
            let _ = tokio::task::spawn_blocking(move || c.wait()).await;
        }
    }
}

/// Microseconds since the epoch.
pub fn micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Waits until `db_url`'s inbox holds `n` rows (polling every 100 ms), `alive` failing meanwhile.
pub async fn wait_rows(
    sql: &tokio_postgres::Client,
    n: i64,
    deadline: Duration,
    inbox: &mut InboxProc,
) -> Res<()> {
    let start = Instant::now();
    loop {
        let have: i64 = sql
            .query_one("SELECT count(*) FROM ferry_inbox", &[])
            .await
            .map(|r| r.get(0))
            .unwrap_or(0);
        if have >= n {
            return Ok(());
        }
        inbox.check_alive()?;
        if start.elapsed() > deadline {
            return Err(format!("the inbox holds {have} of {n} rows after {deadline:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// User + system CPU seconds of every process of the PostgreSQL cluster (the postmaster and its
/// children), or `None` off this machine.
pub fn pg_cpu(postmaster: Option<i32>) -> Option<f64> {
    let root = postmaster?;
    let ticks = 100.0;
    let mut total = 0u64;
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        // f[1] is the ppid (field 4); utime, stime are fields 14, 15.
        if pid == root || f.get(1).copied() == Some(root as u64) {
            total += f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
        }
    }
    Some(total as f64 / ticks)
}

/// The `q` quantile of sorted `v` (nearest rank).
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
}

/// "median (min–max)" of `v`, each formatted by `f`.
pub fn spread(v: &[f64], f: impl Fn(f64) -> String) -> String {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => "-".into(),
        1 => f(s[0]),
        n => format!("{} ({}–{})", f(s[n / 2]), f(s[0]), f(s[n - 1])),
    }
}

pub fn rate(x: f64) -> String {
    thousands(x.round() as u64)
}

/// A directory for logs of this run.
pub fn log_dir() -> Res<PathBuf> {
    let d = std::env::temp_dir().join(pg::unique_name("ferry-bench-inbox"));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

mod drain {
    //! The drain runs.

    use super::*;

    /// One drain.
    #[derive(Debug, Clone, Default)]
    pub struct Drain {
        /// Records/s from the spawn to the last batch's commit.
        pub from_start: f64,
        /// Records/s from the first batch's commit to the last's (the first batch's rows left
        /// out).
        pub from_first: f64,
        /// Seconds from the spawn to the first commit.
        pub first: f64,
        pub secs: f64,
        pub cpu_per_100k: f64,
        pub pg_cpu_per_100k: Option<f64>,
        pub peak_rss_mib: f64,
        pub batches: u64,
        /// The time transactions took (BEGIN to COMMIT's answer, `ferry_inbox_write_seconds`)
        /// over the time from the first commit to the last: how busy the one writer was.
        pub busy: f64,
    }

    pub async fn all(ctx: &Ctx) -> Res<()> {
        let n = ctx.args.records;
        let brokers = ctx.world.brokers();
        let topic = ctx.topic("inbox-drain").await;
        let took = produce::backlog(&brokers, &topic, ctx.args.seed, 0, n).await?;
        println!(
            "\n[drain] {} records of ~1 KB JSON in {topic} ({PARTITIONS} partitions), produced in {:.1} s; {} run(s)",
            thousands(n),
            took.as_secs_f64(),
            ctx.args.runs
        );
        let mut runs = Vec::new();
        for run in 0..ctx.args.runs {
            let d = one(ctx, &topic, n, run).await?;
            println!(
                "[drain] run {}/{}: {} records/s from process start ({:.2} s, first commit at {:.2} s), {} records/s after the first commit; {:.2} CPU s / 100k records (PostgreSQL {}), peak RSS {:.1} MiB, {} transactions, writing {:.0}% of the time; load average {:.1}",
                run + 1,
                ctx.args.runs,
                rate(d.from_start),
                d.secs,
                d.first,
                rate(d.from_first),
                d.cpu_per_100k,
                d.pg_cpu_per_100k.map_or("?".into(), |c| format!("{c:.2}")),
                d.peak_rss_mib,
                d.batches,
                d.busy * 100.0,
                machine::load_average()
            );
            runs.push(d);
        }
        let col = |f: fn(&Drain) -> f64| runs.iter().map(f).collect::<Vec<_>>();
        println!(
            "\n| `ferry inbox`, {} records of ~1 KB | median (min–max) over {} runs |\n| --- | ---: |\n\
             | records/s from process start | {} |\n\
             | records/s after the first commit | {} |\n\
             | CPU s / 100k records, ferry | {} |\n\
             | CPU s / 100k records, PostgreSQL (every process) | {} |\n\
             | peak RSS | {} |\n\
             | transactions | {} |\n\
             | time writing (sum of transactions / first to last commit) | {} |",
            thousands(n),
            runs.len(),
            spread(&col(|d| d.from_start), rate),
            spread(&col(|d| d.from_first), rate),
            spread(&col(|d| d.cpu_per_100k), |x| format!("{x:.2}")),
            spread(&col(|d| d.pg_cpu_per_100k.unwrap_or(f64::NAN)), |x| format!("{x:.2}")),
            spread(&col(|d| d.peak_rss_mib), |x| format!("{x:.1} MiB")),
            spread(&col(|d| d.batches as f64), |x| format!("{x:.0}")),
            spread(&col(|d| d.busy * 100.0), |x| format!("{x:.0}%")),
        );
        Ok(())
    }

    async fn one(ctx: &Ctx, topic: &str, n: u64, run: u32) -> Res<Drain> {
        let (db, url) = ctx.inbox_db("bench_inbox").await?;
        let sql = pg::connect(&url).await;
        let postmaster = ctx.postmaster().await;
        let pg_before = pg_cpu(postmaster);
        let group = format!("bench-drain-{run}-{}", pg::unique_name("g"));
        let mut inbox = InboxProc::spawn(ctx, &url, topic, &group, &[], None)?;
        let pid = inbox.pid();
        // Done when every record is committed.
        let start = Instant::now();
        let mut rss = 0;
        loop {
            inbox.check_alive()?;
            rss = rss.max(procfs::peak_rss_kib(pid).unwrap_or(0));
            if inbox.metric("ferry_inbox_rows_inserted_total").await == Some(n as f64) {
                break;
            }
            if start.elapsed() > Duration::from_secs(600) {
                return Err(format!("{n} records not drained in 600 s").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let cpu = procfs::cpu_seconds(pid)?;
        let pg_after = pg_cpu(postmaster);
        let written = inbox
            .metric("ferry_inbox_write_seconds_sum")
            .await
            .unwrap_or(f64::NAN);
        rss = rss.max(procfs::peak_rss_kib(pid)?);
        inbox.stop().await;
        // Every batch's commit, exactly, from its rows.
        let commits = sql
            .query(
                "SELECT (extract(epoch FROM c) * 1e6)::bigint, count(*) FROM \
                 (SELECT pg_xact_commit_timestamp(xmin) c FROM ferry_inbox) s GROUP BY c ORDER BY c",
                &[],
            )
            .await?;
        let distinct: i64 = sql
            .query_one("SELECT count(DISTINCT event_id) FROM ferry_inbox", &[])
            .await?
            .get(0);
        if distinct != n as i64 {
            return Err(
                format!("the inbox holds {distinct} distinct event ids, expected {n}").into(),
            );
        }
        let first = commits.first().ok_or("no commit")?;
        let last = commits.last().ok_or("no commit")?;
        let (t0, t1, tn) = (
            micros(inbox.spawned),
            first.get::<_, i64>(0),
            last.get::<_, i64>(0),
        );
        let first_rows: i64 = first.get(1);
        drop(sql);
        ctx.drop_db(&db).await?;
        let secs = (tn - t0) as f64 / 1e6;
        Ok(Drain {
            from_start: n as f64 / secs,
            from_first: (n as f64 - first_rows as f64) / ((tn - t1) as f64 / 1e6),
            first: (t1 - t0) as f64 / 1e6,
            secs,
            cpu_per_100k: cpu / n as f64 * 1e5,
            pg_cpu_per_100k: pg_before
                .zip(pg_after)
                .map(|(a, b)| (b - a) / n as f64 * 1e5),
            peak_rss_mib: rss as f64 / 1024.0,
            batches: commits.len() as u64,
            busy: written / ((tn - t0) as f64 / 1e6 - (t1 - t0) as f64 / 1e6),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> InboxArgs {
        let v: Vec<String> = s.split_whitespace().map(String::from).collect();
        InboxArgs::parse(&v).unwrap().unwrap()
    }

    #[test]
    fn the_cleanup_alone_runs_alone() {
        let a = parse("");
        assert_eq!((a.records, a.rate, a.cleanup_rows), (200_000, 2000, 0));
        let a = parse("--cleanup-rows 10000000");
        assert_eq!((a.records, a.rate, a.cleanup_rows), (0, 0, 10_000_000));
        let a = parse("--cleanup-rows 100 --rate 50");
        assert_eq!((a.records, a.rate), (0, 50));
        let a = parse("--smoke");
        assert_eq!((a.records, a.rate, a.cleanup_rows), (2000, 500, 20_000));
        let a = parse("--env A=b --env C=d=e --synchronous-commit off");
        assert_eq!(a.env[1], ("C".to_string(), "d=e".to_string()));
        assert!(a.synchronous_commit_off);
        assert!(InboxArgs::parse(&["--env".into(), "x".into()]).is_err());
    }

    #[test]
    fn quantiles_and_spreads() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 2.0);
        assert_eq!(quantile(&v, 0.99), 4.0);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(spread(&[3.0, 1.0, 2.0], |x| format!("{x}")), "2 (1–3)");
        assert_eq!(spread(&[3.0], |x| format!("{x}")), "3");
    }
}
