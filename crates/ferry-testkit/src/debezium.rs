//! Debezium for tests and benchmarks: Kafka Connect standalone with Debezium's PostgreSQL
//! connector and its Outbox Event Router, started from the jars `.ci/install-debezium` resolves
//! from Maven Central. The oracle of the parity tests and the rival of the benchmark; Ferry never
//! needs it.
//!
//! One [`Connect`] is one worker JVM (standalone mode: offsets in a local file, no cluster
//! topics). Connectors are added through its REST API ([`Connect::put_connector`]), so one worker
//! serves several connectors, one per configuration under test, and a test binary pays one JVM
//! start. Readiness is the REST status: [`Connect::wait_running`] returns once the connector
//! and its task say `RUNNING`, and panics with the task's stack trace when it says `FAILED`.
//! A running task has created its replication slot (Debezium creates it before it streams), so a
//! row committed after that is captured; [`wait_slot_active`] waits for the stream itself.
//!
//! A benchmark passes its connector in [`ConnectOptions::connectors`] instead: standalone mode
//! reads it from a file named on the command line, as `connect-standalone.sh worker.properties
//! connector.properties` does, so the connector starts with the worker and nothing waits on the
//! REST API in between.
//!
//! The worker's log is in [`Connect::dir`]`/connect.log`, kept (with the directory) when the
//! worker is dropped while its thread panics. A directory the caller named is the caller's: it
//! stays, so that a second worker can resume from the first one's offsets.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::kafka::tail;
use crate::pg::unique_name;
use crate::process::{self, spawn_owned};

/// The Debezium version `.ci/install-debezium` installs.
pub const DEBEZIUM_VERSION: &str = "3.6.1.Final";
/// Environment variable naming a directory of Kafka Connect's and Debezium's jars (default: the
/// one `.ci/install-debezium` fills, `~/.cache/ferry/debezium-<version>/libs`).
pub const DEBEZIUM_LIBS_ENV: &str = "FERRY_TEST_DEBEZIUM_LIBS";
/// Environment variable replacing the Connect JVM's options.
pub const CONNECT_JVM_OPTS_ENV: &str = "FERRY_TEST_CONNECT_JVM_OPTS";
/// The Connect JVM's options in tests: a small heap, the serial collector, the client compiler.
pub const TEST_JVM_OPTS: &str = "-Xms128m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1";
/// The options Kafka's `connect-standalone.sh` gives a worker (`KAFKA_HEAP_OPTS=-Xms256M
/// -Xmx2G` and `kafka-run-class.sh`'s G1 settings): what a benchmark measures against.
pub const CONNECT_SCRIPT_JVM_OPTS: &str = "-Xms256M -Xmx2G -server -XX:+UseG1GC \
     -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
     -XX:+ExplicitGCInvokesConcurrent";
/// How long [`Connect::stop`] waits for the worker to exit after SIGTERM before SIGKILL: a
/// shutdown that works takes a few seconds (its tasks get `task.shutdown.graceful.timeout.ms`,
/// 5 s).
pub const STOP_DEADLINE: Duration = Duration::from_secs(30);
/// The Outbox Event Router's class.
pub const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";
/// Debezium's PostgreSQL connector's class.
pub const POSTGRES_CONNECTOR: &str = "io.debezium.connector.postgresql.PostgresConnector";

const LOG4J2: &str = "status = warn\n\
appender.file.type = File\n\
appender.file.name = file\n\
appender.file.fileName = ${sys:ferry.connect.log}\n\
appender.file.layout.type = PatternLayout\n\
appender.file.layout.pattern = [%d] %p %m (%c)%n\n\
rootLogger.level = INFO\n\
rootLogger.appenderRef.file.ref = file\n\
logger.reflections.name = org.reflections\n\
logger.reflections.level = ERROR\n";

/// What to do when the tests have no Debezium to start.
pub const DEBEZIUM_SETUP_HINT: &str = "run `bash .ci/install-deps` once (resolves Kafka Connect \
     and Debezium's jars from Maven Central into ~/.cache/ferry) or `bash .ci/install-debezium`, \
     or set FERRY_TEST_DEBEZIUM_LIBS to a directory of those jars";

/// A Kafka Connect worker in standalone mode.
#[derive(Debug)]
pub struct Connect {
    dir: PathBuf,
    rest_port: u16,
    child: Mutex<Option<Child>>,
    started: Instant,
    /// Whether the directory is a temporary one this worker made (and removes).
    owns_dir: bool,
}

/// How to start a worker.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The Kafka bootstrap list.
    pub brokers: String,
    /// Extra worker properties (`key=value`), after the defaults; a later key wins.
    pub worker: Vec<String>,
    /// The JVM's options (default [`TEST_JVM_OPTS`]; `FERRY_TEST_CONNECT_JVM_OPTS` overrides).
    pub jvm_opts: Option<String>,
    /// Where the worker keeps its files (default: a fresh temporary directory, removed with the
    /// worker). A given directory stays, with the offsets: a worker started again on it resumes
    /// its connectors where they stopped.
    pub dir: Option<PathBuf>,
    /// Connectors to start with the worker: each `(name, config)` is written to
    /// `<name>.properties` and named on the command line.
    pub connectors: Vec<(String, BTreeMap<String, String>)>,
}

impl ConnectOptions {
    pub fn new(brokers: &str) -> ConnectOptions {
        ConnectOptions {
            brokers: brokers.to_string(),
            worker: Vec::new(),
            jvm_opts: None,
            dir: None,
            connectors: Vec::new(),
        }
    }
}

/// A connector's state as its REST status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub connector: String,
    /// Each task's state and, when it failed, its trace.
    pub tasks: Vec<(String, Option<String>)>,
}

impl Status {
    pub fn running(&self) -> bool {
        self.connector == "RUNNING"
            && !self.tasks.is_empty()
            && self.tasks.iter().all(|t| t.0 == "RUNNING")
    }
    /// What failed, when the connector or a task says `FAILED`.
    pub fn failure(&self) -> Option<String> {
        if self.connector == "FAILED" {
            return Some("the connector FAILED".into());
        }
        self.tasks
            .iter()
            .find(|t| t.0 == "FAILED")
            .map(|t| format!("a task FAILED: {}", t.1.as_deref().unwrap_or("(no trace)")))
    }
}

impl Connect {
    /// Starts a worker and waits until its REST API answers. Blocking.
    pub fn start_blocking(opts: ConnectOptions) -> Connect {
        let libs = debezium_libs();
        let owns_dir = opts.dir.is_none();
        let dir = opts.dir.clone().unwrap_or_else(|| {
            process::sweep_stale_dirs("ferry-connect");
            std::env::temp_dir().join(unique_name("ferry-connect"))
        });
        // A directory of our own is new (one that exists belongs to another run); a caller's
        // may hold an earlier run's offsets on purpose.
        let created = if owns_dir {
            std::fs::create_dir(&dir)
        } else {
            std::fs::create_dir_all(&dir)
        };
        created.unwrap_or_else(|e| {
            panic!("create the Kafka Connect directory {}: {e}", dir.display())
        });
        let rest_port = process::free_port();
        let mut props = vec![
            format!("bootstrap.servers={}", opts.brokers),
            // Debezium's router writes the payload as a string unless the converter says more;
            // each connector of a parity test sets its own converters.
            "key.converter=org.apache.kafka.connect.storage.StringConverter".into(),
            "value.converter=org.apache.kafka.connect.storage.StringConverter".into(),
            format!(
                "offset.storage.file.filename={}",
                dir.join("offsets").display()
            ),
            "offset.flush.interval.ms=1000".into(),
            format!("listeners=http://127.0.0.1:{rest_port}"),
            // Connectors are on the classpath: no plugin.path scan.
            "plugin.discovery=only_scan".into(),
        ];
        props.extend(opts.worker.iter().cloned());
        std::fs::write(dir.join("worker.properties"), props.join("\n") + "\n")
            .expect("write worker.properties");
        std::fs::write(dir.join("log4j2.properties"), LOG4J2).expect("write log4j2");
        let mut connector_files = Vec::new();
        for (name, config) in &opts.connectors {
            let path = dir.join(format!("{name}.properties"));
            std::fs::write(&path, connector_properties(name, config))
                .expect("write connector properties");
            connector_files.push(path);
        }
        let jvm = std::env::var(CONNECT_JVM_OPTS_ENV)
            .ok()
            .or(opts.jvm_opts.clone())
            .unwrap_or_else(|| TEST_JVM_OPTS.to_string());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("connect.out"))
            .expect("open connect.out");
        let mut cmd = Command::new(crate::kafka::java());
        cmd.args(jvm.split_whitespace())
            .arg("-Djava.awt.headless=true")
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                dir.join("log4j2.properties").display()
            ))
            .arg(format!(
                "-Dferry.connect.log={}",
                dir.join("connect.log").display()
            ))
            .arg("-cp")
            .arg(format!("{}/*", libs.display()))
            .arg("org.apache.kafka.connect.cli.ConnectStandalone")
            .arg(dir.join("worker.properties"))
            .args(&connector_files)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log);
        let started = Instant::now();
        let child = spawn_owned(cmd, libc::SIGKILL)
            .unwrap_or_else(|e| panic!("start Kafka Connect (java): {e}: {DEBEZIUM_SETUP_HINT}"));
        let c = Connect {
            dir,
            rest_port,
            child: Mutex::new(Some(child)),
            started,
            owns_dir,
        };
        c.wait_rest(Duration::from_secs(120));
        c
    }

    /// [`Connect::start_blocking`] off the runtime's threads.
    pub async fn start(opts: ConnectOptions) -> Connect {
        tokio::task::spawn_blocking(move || Connect::start_blocking(opts))
            .await
            .expect("start connect")
    }

    /// The worker's directory (`worker.properties`, `connect.log`, `offsets`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The REST API's base URL.
    pub fn rest_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.rest_port)
    }

    /// The worker process's id, for CPU and memory figures.
    pub fn pid(&self) -> Option<u32> {
        self.child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(Child::id)
    }

    /// When the JVM was started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// When the worker last wrote its offsets file (every `offset.flush.interval.ms` that has
    /// new offsets), `None` before the first write.
    pub fn offsets_written(&self) -> Option<std::time::SystemTime> {
        std::fs::metadata(self.dir.join("offsets"))
            .and_then(|m| m.modified())
            .ok()
    }

    fn wait_rest(&self, deadline: Duration) {
        let start = Instant::now();
        loop {
            if let Ok((200, _)) = self.http("GET", "/", None) {
                return;
            }
            self.assert_alive("starting");
            assert!(
                start.elapsed() < deadline,
                "Kafka Connect's REST API did not answer within {deadline:?}; its log ({}):\n{}",
                self.dir.display(),
                self.log_tail(60)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn assert_alive(&self, doing: &str) {
        if let Err(e) = self.check_alive() {
            panic!("{e} while {doing}");
        }
    }

    /// An error with the worker's output and log when it has exited on its own.
    pub fn check_alive(&self) -> Result<(), String> {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            *child = None;
            return Err(format!(
                "Kafka Connect exited ({status}); its output:\n{}\nits log:\n{}",
                tail(&self.dir.join("connect.out"), 30),
                self.log_tail(60)
            ));
        }
        Ok(())
    }

    /// Creates or replaces connector `name` with `config` (`name` is added to it).
    pub fn put_connector(&self, name: &str, config: &BTreeMap<String, String>) {
        let body = serde_json::to_string(&named(name, config)).expect("connector json");
        self.call(
            "PUT",
            &format!("/connectors/{name}/config"),
            Some(&body),
            &[200, 201],
            &format!("Kafka Connect refused connector {name} (config: {body})"),
        );
    }

    /// Creates connector `name` in the `STOPPED` state (KIP-875: `POST /connectors` with
    /// `initial_state`), so that its offsets can be changed before it first runs.
    pub fn create_connector_stopped(&self, name: &str, config: &BTreeMap<String, String>) {
        let body = serde_json::json!({
            "name": name,
            "config": named(name, config),
            "initial_state": "STOPPED",
        })
        .to_string();
        self.call(
            "POST",
            "/connectors",
            Some(&body),
            &[200, 201],
            &format!("Kafka Connect refused connector {name}"),
        );
    }

    /// Forgets the offsets of stopped connector `name` (`DELETE /connectors/NAME/offsets`): a
    /// Debezium connector then starts from its slot's confirmed position.
    pub fn reset_offsets(&self, name: &str) {
        self.call(
            "DELETE",
            &format!("/connectors/{name}/offsets"),
            None,
            &[200],
            &format!("Kafka Connect did not reset the offsets of {name}"),
        );
    }

    /// Resumes a stopped or paused connector (`PUT /connectors/NAME/resume`).
    pub fn resume(&self, name: &str) {
        self.call(
            "PUT",
            &format!("/connectors/{name}/resume"),
            None,
            &[200, 202],
            &format!("Kafka Connect did not resume {name}"),
        );
    }

    /// Deletes connector `name` (its task stops; its slot and offsets stay).
    pub fn delete_connector(&self, name: &str) {
        self.call(
            "DELETE",
            &format!("/connectors/{name}"),
            None,
            &[200, 204, 404],
            &format!("Kafka Connect did not delete connector {name}"),
        );
    }

    /// One REST call that must answer with one of `accepted`; panics with `what`, the status
    /// code and Connect's answer otherwise, or with the transport error.
    fn call(&self, method: &str, path: &str, body: Option<&str>, accepted: &[u16], what: &str) {
        let (code, text) = self
            .http(method, path, body)
            .unwrap_or_else(|e| panic!("{what}: {method} {path}: {e}"));
        assert!(accepted.contains(&code), "{what} ({code}): {text}");
    }

    /// Connector `name`'s status, `None` when the worker does not know it (yet).
    pub fn status(&self, name: &str) -> Option<Status> {
        let (code, text) = self
            .http("GET", &format!("/connectors/{name}/status"), None)
            .ok()?;
        if code != 200 {
            return None;
        }
        parse_status(&text)
    }

    /// Waits until connector `name` and all its tasks run; panics with the task's trace when
    /// one fails, or at the deadline with the worker's log.
    pub fn wait_running(&self, name: &str, deadline: Duration) {
        let start = Instant::now();
        loop {
            let status = self.status(name);
            if let Some(s) = &status {
                if s.running() {
                    return;
                }
                if let Some(f) = s.failure() {
                    panic!(
                        "Debezium connector {name}: {f}\nworker log ({}):\n{}",
                        self.dir.display(),
                        self.log_tail(40)
                    );
                }
            }
            self.assert_alive(&format!("starting connector {name}"));
            assert!(
                start.elapsed() < deadline,
                "Debezium connector {name} not running within {deadline:?} (status {status:?}); \
                 worker log ({}):\n{}",
                self.dir.display(),
                self.log_tail(60)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the worker with SIGTERM (Connect commits its offsets and stops its tasks) and waits
    /// for it, at most [`STOP_DEADLINE`]; then kills it with SIGKILL, as a crash would.
    ///
    /// Connect's shutdown can hang for good. Seen once (a local CI run, 2026-11-28: 12 minutes
    /// and counting): its shutdown hook, stopping the REST server first, waited in Jetty 12's
    /// `Server.join` for a thread pool that did not stop; Jetty's own shutdown hook had logged
    /// "Unable to destroy ... IllegalStateException: STARTED"; the task went on streaming. Its
    /// offsets are then those committed last (`offset.flush.interval.ms`), and what it sent past
    /// them comes again: the duplicates a crash may cause.
    pub fn stop(&self) {
        let taken = self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut c) = taken {
            if !process::terminate_within(&mut c, STOP_DEADLINE) {
                eprintln!(
                    "Kafka Connect ({}) did not stop within {STOP_DEADLINE:?} of SIGTERM: killed \
                     with SIGKILL; its log is connect.log there",
                    self.dir.display()
                );
            }
        }
    }

    /// Kills the worker with SIGKILL.
    pub fn kill(&self) {
        let taken = self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut c) = taken {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The last `lines` lines of the worker's log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.dir.join("connect.log"), lines)
    }

    /// One HTTP/1.1 request to the REST API (`Connection: close`): status code and body.
    fn http(&self, method: &str, path: &str, body: Option<&str>) -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.rest_port))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let body = body.unwrap_or("");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        let text = String::from_utf8_lossy(&raw);
        let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {head}")))?;
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(rest)
        } else {
            rest.to_string()
        };
        Ok((code, body))
    }
}

impl Drop for Connect {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let _ = std::fs::write(self.dir.join(process::KEEP_MARKER), b"a test panicked\n");
            eprintln!("Kafka Connect's logs are kept in {}", self.dir.display());
        } else if self.owns_dir && std::env::var_os("FERRY_TEST_KEEP_BROKER_DATA").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A connector's configuration as a standalone worker reads it from a file: `name` first, then
/// the keys in order (`\`, `=`, `:` and line breaks escaped as `java.util.Properties` wants).
fn connector_properties(name: &str, config: &BTreeMap<String, String>) -> String {
    let esc = |s: &str| {
        s.replace('\\', "\\\\")
            .replace('\n', "\\n")
            .replace('=', "\\=")
            .replace(':', "\\:")
    };
    let mut out = format!("name={}\n", esc(name));
    for (k, v) in config.iter().filter(|(k, _)| *k != "name") {
        out += &format!("{}={}\n", esc(k), esc(v));
    }
    out
}

/// `config` with its `name` key, as Connect's REST API takes a connector's configuration.
fn named(name: &str, config: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut config = config.clone();
    config.insert("name".into(), name.into());
    config
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn parse_status(text: &str) -> Option<Status> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let connector = v["connector"]["state"].as_str()?.to_string();
    let tasks = v["tasks"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| {
                    (
                        t["state"].as_str().unwrap_or("?").to_string(),
                        t["trace"].as_str().map(str::to_string),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Status { connector, tasks })
}

/// A Debezium outbox connector's configuration for the PostgreSQL database at `host:port/dbname`:
/// pgoutput, an existing publication (never created by Debezium), no snapshot, no tombstones,
/// the Outbox Event Router as transform `outbox`. Callers add or replace keys: the router's
/// (`transforms.outbox.*`), the converters, `extended.headers.enabled`.
pub fn outbox_connector(
    pg: (&str, u16, &str, &str),
    slot: &str,
    publication: &str,
    tables: &str,
) -> BTreeMap<String, String> {
    let (host, port, dbname, user) = pg;
    [
        ("connector.class", POSTGRES_CONNECTOR),
        ("plugin.name", "pgoutput"),
        ("database.hostname", host),
        ("database.port", &port.to_string()),
        ("database.user", user),
        ("database.password", "unused"),
        ("database.dbname", dbname),
        ("topic.prefix", slot),
        ("slot.name", slot),
        ("publication.name", publication),
        ("publication.autocreate.mode", "disabled"),
        ("table.include.list", tables),
        ("snapshot.mode", "no_data"),
        ("tombstones.on.delete", "false"),
        ("tasks.max", "1"),
        ("transforms", "outbox"),
        ("transforms.outbox.type", EVENT_ROUTER),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Waits until replication slot `slot` exists and a walsender streams from it.
pub async fn wait_slot_active(client: &tokio_postgres::Client, slot: &str, deadline: Duration) {
    let start = Instant::now();
    loop {
        let row = client
            .query_opt(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .expect("query pg_replication_slots");
        if row.is_some_and(|r| r.get::<_, bool>(0)) {
            return;
        }
        assert!(
            start.elapsed() < deadline,
            "replication slot {slot} not active within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The directory of Kafka Connect's and Debezium's jars: `FERRY_TEST_DEBEZIUM_LIBS`, else the one
/// `.ci/install-debezium` fills; when neither has them, runs `.ci/install-deps` once first.
/// Panics with what to do when there are none.
pub fn debezium_libs() -> PathBuf {
    static LIBS: OnceLock<PathBuf> = OnceLock::new();
    LIBS.get_or_init(|| process::jars(DEBEZIUM_LIBS_ENV, find_debezium_libs))
        .clone()
}

fn find_debezium_libs(env_dir: Option<PathBuf>, cache: &Path) -> Result<PathBuf, String> {
    let jar = format!("debezium-connector-postgres-{DEBEZIUM_VERSION}.jar");
    if let Some(dir) = env_dir {
        if dir.join(&jar).is_file() {
            return Ok(dir);
        }
        return Err(format!(
            "{DEBEZIUM_LIBS_ENV}={} holds no {jar}: {DEBEZIUM_SETUP_HINT}",
            dir.display()
        ));
    }
    let dir = cache.join(format!("debezium-{DEBEZIUM_VERSION}/libs"));
    if dir.join(&jar).is_file() && dir.join(".complete").is_file() {
        return Ok(dir);
    }
    Err(format!(
        "no Debezium for the tests (nothing under {}): {DEBEZIUM_SETUP_HINT}",
        dir.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_read_from_connects_answer() {
        let s = parse_status(
            r#"{"name":"o","connector":{"state":"RUNNING","worker_id":"w"},
               "tasks":[{"id":0,"state":"FAILED","worker_id":"w","trace":"boom"}],"type":"source"}"#,
        )
        .unwrap();
        assert!(!s.running());
        assert_eq!(s.failure().unwrap(), "a task FAILED: boom");
        let s = parse_status(
            r#"{"connector":{"state":"RUNNING"},"tasks":[{"id":0,"state":"RUNNING"}]}"#,
        )
        .unwrap();
        assert!(s.running());
        // A connector without tasks yet is not running.
        let s = parse_status(r#"{"connector":{"state":"RUNNING"},"tasks":[]}"#).unwrap();
        assert!(!s.running());
    }

    #[test]
    fn a_connector_file_escapes_what_properties_would_read_otherwise() {
        let mut c = BTreeMap::new();
        c.insert("a.b".to_string(), "${routedByValue}.x".to_string());
        c.insert("url".to_string(), "host:5432=y\\z".to_string());
        assert_eq!(
            connector_properties("o", &c),
            "name=o\na.b=${routedByValue}.x\nurl=host\\:5432\\=y\\\\z\n"
        );
    }

    #[test]
    fn a_chunked_body_is_joined() {
        assert_eq!(dechunk("4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n"), "Wikipedia");
    }
}
