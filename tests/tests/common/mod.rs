#![allow(dead_code)]
//! End-to-end test helpers: one outbox database, slot and set of topics per test, and the real
//! `ferry` binary started as a child process (so tests can `kill -9` it), configured through
//! environment variables only, as in a container.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub mod debezium;

use ferry_testkit::kafka::{self, Consumed};
use ferry_testkit::pg::{self, TestDb};
use ferry_testkit::process::{free_port, signal, spawn_owned};

#[allow(unused_imports)] // not every test file waits on a condition
pub use ferry_testkit::wait_until;

/// The Debezium-compatible outbox every test uses (plus a free-form `note` column).
pub const OUTBOX_DDL: &str = "CREATE TABLE outbox (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregatetype text NOT NULL,
    aggregateid text NOT NULL,
    type text NOT NULL,
    payload jsonb,
    note text
)";

/// One test's world: its database (with the outbox), slot, publication, and topic prefix.
pub struct World {
    pub db: TestDb,
    pub sql: tokio_postgres::Client,
    pub brokers: String,
    pub slot: String,
    pub publication: String,
    /// Topic names start with this; the route template is `<prefix>.{aggregatetype}`.
    pub topic_prefix: String,
    /// Extra environment for the ferry process.
    pub env: Vec<(String, String)>,
}

impl World {
    /// A fresh database with the outbox table, on the shared PostgreSQL and broker.
    pub async fn new() -> World {
        Self::on(pg::shared().create_db().await, kafka::shared().brokers()).await
    }

    /// A fresh world on a given database and broker.
    pub async fn on(db: TestDb, brokers: String) -> World {
        let w = Self::bare(db, brokers).await;
        w.sql
            .batch_execute(OUTBOX_DDL)
            .await
            .expect("create outbox");
        w
    }

    /// A fresh world whose database has no outbox table yet.
    pub async fn bare(db: TestDb, brokers: String) -> World {
        let sql = db.client().await;
        World {
            sql,
            brokers,
            slot: pg::unique_name("ferry_slot"),
            publication: pg::unique_name("ferry_pub"),
            topic_prefix: pg::unique_name("t"),
            env: Vec::new(),
            db,
        }
    }

    /// The topic for an aggregate type.
    pub fn topic(&self, aggregate_type: &str) -> String {
        format!("{}.{aggregate_type}", self.topic_prefix)
    }

    /// Creates the topic for `aggregate_type` with `partitions` partitions.
    pub async fn create_topic(&self, aggregate_type: &str, partitions: i32) -> String {
        let t = self.topic(aggregate_type);
        kafka::create_topic(&self.brokers, &t, partitions).await;
        t
    }

    /// Inserts one outbox row in its own transaction.
    pub async fn insert(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        event_type: &str,
        payload: &str,
    ) {
        self.sql
            .execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4::text::jsonb)",
                &[&aggregate_type, &aggregate_id, &event_type, &payload],
            )
            .await
            .expect("insert outbox row");
    }

    /// Reads `n` records of `topic` back (at least; panics at the deadline).
    pub async fn consume(&self, topic: &str, n: usize) -> Vec<Consumed> {
        kafka::consume(&self.brokers, topic, n, Duration::from_secs(90)).await
    }

    /// The slot's `confirmed_flush_lsn`.
    pub async fn confirmed_lsn(&self) -> Option<ferry_wal::Lsn> {
        let row = self
            .sql
            .query_opt(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .expect("query slot");
        row.and_then(|r| r.get::<_, Option<String>>(0))
            .map(|s| s.parse().expect("lsn"))
    }

    /// Whether the world's replication slot exists.
    pub async fn slot_exists(&self) -> bool {
        self.sql
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)",
                &[&self.slot],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// The id of the first transaction the slot would still send, once no walsender holds it
    /// (it must not be streamed: waits until the slot is released).
    pub async fn first_pending_xid(&self) -> Option<String> {
        wait_until("the slot is released", Duration::from_secs(30), || async {
            let active: bool = self
                .sql
                .query_one(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                    &[&self.slot],
                )
                .await
                .unwrap()
                .get(0);
            !active
        })
        .await;
        self.sql
            .query(
                "SELECT xid::text FROM pg_logical_slot_peek_binary_changes($1, NULL, 1, \
                 'proto_version', '1', 'publication_names', $2)",
                &[&self.slot, &self.publication],
            )
            .await
            .unwrap()
            .first()
            .map(|r| r.get(0))
    }

    /// `pg_current_wal_lsn()`.
    pub async fn current_wal_lsn(&self) -> ferry_wal::Lsn {
        let s: String = self
            .sql
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .expect("current lsn")
            .get(0);
        s.parse().expect("lsn")
    }

    /// The environment a ferry process gets for this world.
    pub fn ferry_env(&self, http_port: u16) -> Vec<(String, String)> {
        let mut env = vec![
            ("FERRY_POSTGRES_URL".to_string(), self.db.url.clone()),
            ("FERRY_POSTGRES_SLOT".into(), self.slot.clone()),
            (
                "FERRY_POSTGRES_PUBLICATION".into(),
                self.publication.clone(),
            ),
            ("FERRY_KAFKA_BROKERS".into(), self.brokers.clone()),
            (
                "FERRY_ROUTE_TOPIC".into(),
                format!("{}.{{aggregatetype}}", self.topic_prefix),
            ),
            ("FERRY_HTTP_LISTEN".into(), format!("127.0.0.1:{http_port}")),
            ("FERRY_LOG_LEVEL".into(), "info".into()),
            ("FERRY_KAFKA_LINGER".into(), "1ms".into()),
            // Each test remembers its progress in a topic of its own.
            ("FERRY_KAFKA_PROGRESS_TOPIC".into(), self.progress_topic()),
        ];
        env.extend(self.env.iter().cloned());
        env
    }

    /// Adds `FERRY_*` variables to the environment Ferry starts with (a later one wins).
    pub fn set_env(&mut self, vars: &[(&str, &str)]) {
        self.env
            .extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    }

    /// This world's progress topic (`kafka.progress_topic`).
    pub fn progress_topic(&self) -> String {
        format!("ferry-progress.{}", self.topic_prefix)
    }

    /// Starts `ferry run` for this world.
    pub fn start_ferry(&self) -> Ferry {
        Ferry::spawn(self, &["run"])
    }
}

/// A running `ferry` process.
pub struct Ferry {
    child: Option<Child>,
    pub http_port: u16,
    pub log: PathBuf,
}

static FERRY_N: AtomicU64 = AtomicU64::new(0);

impl Ferry {
    /// Spawns the binary with `args` and the world's environment (nothing else from ours: a
    /// container sees only what it is given).
    pub fn spawn(world: &World, args: &[&str]) -> Ferry {
        Self::spawn_with(world, args, |_| {})
    }

    /// [`Ferry::spawn`], with `adjust` applied to the command last (tests that need other
    /// stdio than the log file: pipes, closed readers).
    pub fn spawn_with(world: &World, args: &[&str], adjust: impl FnOnce(&mut Command)) -> Ferry {
        let http_port = free_port();
        let log = std::env::temp_dir().join(format!(
            "ferry-e2e-{}-{}.log",
            std::process::id(),
            FERRY_N.fetch_add(1, Ordering::Relaxed)
        ));
        let out = std::fs::File::create(&log).expect("create ferry log");
        let mut cmd = Command::new(binary());
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(world.ferry_env(http_port))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out);
        adjust(&mut cmd);
        let child = spawn_owned(cmd, libc::SIGKILL).expect("spawn ferry");
        Ferry {
            child: Some(child),
            http_port,
            log,
        }
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(&c, libc::SIGKILL);
            let _ = c.wait();
        }
    }

    /// Sends `sig` (the process keeps running as it decides; see [`Ferry::wait_exit`]).
    pub fn send_signal(&self, sig: libc::c_int) {
        if let Some(c) = self.child.as_ref() {
            signal(c, sig);
        }
    }

    /// SIGTERM, then waits for the exit status.
    pub async fn terminate(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("ferry is running");
        signal(&c, libc::SIGTERM);
        tokio::task::spawn_blocking(move || c.wait().expect("wait ferry"))
            .await
            .expect("join")
    }

    /// Waits for the process to exit by itself (for permanent errors), with a deadline.
    pub async fn wait_exit(&mut self, deadline: Duration) -> ExitStatus {
        let start = std::time::Instant::now();
        loop {
            let c = self.child.as_mut().expect("ferry is running");
            if let Some(status) = c.try_wait().expect("try_wait") {
                self.child = None;
                return status;
            }
            assert!(
                start.elapsed() < deadline,
                "ferry did not exit within {deadline:?}; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The child process (to take its piped stdout or stderr), while it runs.
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }

    /// Waits (up to `deadline`) until the log holds `text`. An owned copy of the log's path is
    /// waited on, so the process stays free for a concurrent `terminate`.
    pub fn wait_log(
        &self,
        text: &'static str,
        deadline: Duration,
    ) -> impl std::future::Future<Output = ()> + use<> {
        let log = self.log.clone();
        async move {
            wait_until(&format!("ferry logs {text:?}"), deadline, || {
                let log = log.clone();
                async move {
                    std::fs::read_to_string(&log)
                        .unwrap_or_default()
                        .contains(text)
                }
            })
            .await
        }
    }

    /// What the process logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET `path` from the HTTP endpoint: (status, body), or None if not listening.
    pub async fn http_get(&self, path: &str) -> Option<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.http_port))
            .await
            .ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Some((status, body))
    }

    /// Waits until `/readyz` answers 200 (streaming and confirming).
    pub async fn wait_ready(&mut self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some((200, _)) = self.http_get("/readyz").await {
                return;
            }
            assert!(
                self.is_running(),
                "ferry exited before it was ready; log:\n{}",
                self.log_text()
            );
            assert!(
                std::time::Instant::now() < deadline,
                "ferry not ready within 60s; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A metric's value from `/metrics` (the first sample of that name).
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.http_get("/metrics").await?;
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| l.split(['{', ' ']).next() == Some(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }
}

impl Drop for Ferry {
    fn drop(&mut self) {
        self.kill9();
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        } else {
            eprintln!(
                "--- ferry log ({}) ---\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// The `ferry` binary under test (built by cargo for this test crate).
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ferry-under-test"))
}

// Helpers for the failure scenarios (`failures.rs`).

impl Ferry {
    /// The process id, while the process runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The resident set size (`VmRSS` of `/proc/<pid>/status`) in bytes, while the process runs.
    pub fn rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()?;
        Some(kb * 1024)
    }

    /// A labelled metric's value: the sample of `name` whose labels include `label="value"`.
    pub async fn metric_labeled(&self, name: &str, label: &str, value: &str) -> Option<f64> {
        let (_, body) = self.http_get("/metrics").await?;
        let wanted = format!("{label}=\"{value}\"");
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| {
                let Some((metric, rest)) = l.split_once('{') else {
                    return false;
                };
                let labels = rest.split('}').next().unwrap_or("");
                metric == name && labels.split(',').any(|kv| kv == wanted)
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }
}

/// `ferry check`'s output `out` lists an error containing `what`, and the next line is a fix
/// containing `fix`.
pub fn assert_problem(out: &str, what: &str, fix: &str) {
    let lines: Vec<&str> = out.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with("error:") && l.contains(what))
        .unwrap_or_else(|| panic!("no error line containing {what:?}:\n{out}"));
    let next = lines.get(at + 1).copied().unwrap_or_default();
    assert!(
        next.trim_start().starts_with("fix:") && next.contains(fix),
        "the fix for {what:?} should contain {fix:?}:\n{out}"
    );
}

/// `url` through a new TCP proxy to its host and port: the URL and the proxy.
pub async fn through_proxy(url: &str) -> (String, ferry_testkit::proxy::Proxy) {
    let (head, rest) = url.rsplit_once('@').expect("user@host in the URL");
    let (hostport, db) = rest.split_once('/').expect("a database in the URL");
    let upstream: std::net::SocketAddr = hostport.parse().expect("host:port");
    let proxy = ferry_testkit::proxy::Proxy::tcp(upstream)
        .await
        .expect("start the proxy");
    (format!("{head}@{}/{db}", proxy.addr()), proxy)
}
