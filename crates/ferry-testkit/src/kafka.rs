//! Apache Kafka for tests: the brokers named by `FERRY_TEST_KAFKA_BROKERS` (for example the
//! docker-compose Kafka), or Apache Kafka itself started by this process from the jars
//! `.ci/install-broker` resolves from Maven Central, plus helpers to create topics and read them
//! back.
//!
//! A local cluster is one or more KRaft nodes, each one JVM that is both broker and controller,
//! with storage formatted by Kafka's own `StorageTool`, a fresh log directory, and free ports
//! chosen at run time. [`shared`] is one single-node broker per test process, with topics per
//! test; a test that kills, pauses or reconfigures a broker starts its own ([`LocalBroker`]).
//!
//! When a test fails, the broker's log is kept: a private broker keeps its directory when it is
//! dropped while the thread panics, the shared one when any test of the process panicked, and
//! the path is printed. `FERRY_TEST_KEEP_BROKER_DATA` keeps every directory.
//!
//! Verify by consuming records back, and use one consumer per group.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::TopicPartitionList;

use crate::pg::unique_name;
use crate::process::{self, spawn_owned};

/// Environment variable naming an existing broker list to use instead of a local broker.
pub const BROKERS_ENV: &str = "FERRY_TEST_KAFKA_BROKERS";
/// Environment variable naming the directory of Apache Kafka's jars (default: the one
/// `.ci/install-broker` fills, `~/.cache/ferry/kafka-<version>/libs`).
pub const KAFKA_LIBS_ENV: &str = "FERRY_TEST_KAFKA_LIBS";
/// Environment variable naming the `java` to run the broker with (default: `$JAVA_HOME/bin/java`,
/// else `java` on the PATH).
pub const JAVA_ENV: &str = "FERRY_TEST_JAVA";
/// Environment variable replacing the broker JVM's options (heap, collector, JIT; see
/// [`DEFAULT_JVM_OPTS`] and [`ClusterOptions::jvm_opts`]).
pub const JVM_OPTS_ENV: &str = "FERRY_TEST_KAFKA_JVM_OPTS";
/// The Apache Kafka version `.ci/install-broker` installs and the tests start.
pub const KAFKA_VERSION: &str = "4.4.0";
/// The broker JVM's options for tests: a heap that suits a 2-core, 24 GiB machine running
/// several brokers beside PostgreSQL and Ferry, the serial collector (no GC threads competing
/// for the two cores), and the client compiler only (a JVM that starts in ~2 s rather than
/// one tuned for throughput; the benchmarks use [`KAFKA_SERVER_JVM_OPTS`]).
pub const DEFAULT_JVM_OPTS: &str =
    "-Xms128m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss512k";
/// The JVM options Apache Kafka's own `kafka-server-start.sh` gives a broker (heap 1 GiB, G1
/// with its pause target): what a benchmark measures against.
pub const KAFKA_SERVER_JVM_OPTS: &str = "-Xms1G -Xmx1G -server -XX:+UseG1GC \
     -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
     -XX:+ExplicitGCInvokesConcurrent";
/// How long [`LocalBroker::stop_node`] waits for a node after SIGTERM before SIGKILL. A
/// controlled shutdown takes a few seconds (the node hands its leaderships over); one that asks a
/// controller quorum that is gone, or a JVM whose shutdown hook hangs, would wait for good.
pub const NODE_STOP_DEADLINE: Duration = Duration::from_secs(60);
/// How many times [`LocalBroker::start_blocking_with`] starts a cluster whose node found its
/// port taken.
pub const START_ATTEMPTS: u32 = 3;

/// A broker tests can use.
#[derive(Debug)]
pub enum Broker {
    /// The brokers named by `FERRY_TEST_KAFKA_BROKERS`.
    External { brokers: String },
    /// A broker this process started.
    Local(LocalBroker),
}

/// The broker shared by all tests of this process.
pub fn shared() -> &'static Broker {
    static SHARED: OnceLock<Broker> = OnceLock::new();
    SHARED.get_or_init(|| match std::env::var(BROKERS_ENV) {
        Ok(b) if !b.is_empty() => Broker::External { brokers: b },
        _ => {
            process::sweep_stale_dirs("ferry-broker");
            let b = LocalBroker::start_blocking_with(ClusterOptions::default());
            keep_on_panic(b.dir.clone());
            Broker::Local(b)
        }
    })
}

/// The `java` to run Kafka and Kafka Connect with: `FERRY_TEST_JAVA`, else `$JAVA_HOME/bin/java`,
/// else `java` on the PATH.
pub fn java() -> PathBuf {
    std::env::var_os(JAVA_ENV)
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("JAVA_HOME").map(|h| PathBuf::from(h).join("bin/java")))
        .unwrap_or_else(|| PathBuf::from("java"))
}

/// Keeps `dir` (marks it so that [`process::sweep_stale_dirs`] leaves it) and prints where its
/// logs are as soon as any thread of this process panics: a shared broker lives in a static and
/// is never dropped, so its logs would otherwise go with the next sweep.
fn keep_on_panic(dir: PathBuf) {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        if std::fs::write(dir.join(process::KEEP_MARKER), b"a test panicked\n").is_ok() {
            eprintln!(
                "the shared Kafka broker's logs are kept in {}",
                dir.display()
            );
        }
    }));
}

impl Broker {
    /// The bootstrap list.
    pub fn brokers(&self) -> String {
        match self {
            Broker::External { brokers } => brokers.clone(),
            Broker::Local(b) => b.brokers(),
        }
    }
}

/// How to set up a local Kafka cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// KRaft nodes, each one process that is broker and controller (1 or 3 make sense). With
    /// three, internal topics get replication factor 3 and `min.insync.replicas = 2`.
    pub nodes: usize,
    /// `auto.create.topics.enable` (Kafka's default, `true`; managed Kafka often has `false`).
    pub auto_create_topics: bool,
    /// A `SASL_SSL` listener with users, TLS and ACLs (see [`Security`]).
    pub security: Option<Security>,
    /// More `server.properties` lines, as `key=value`, after the defaults (a later key wins).
    pub properties: Vec<String>,
    /// The JVM's options (default [`DEFAULT_JVM_OPTS`]); `FERRY_TEST_KAFKA_JVM_OPTS` wins.
    pub jvm_opts: Option<String>,
    /// The first node's plaintext port (default: a free one).
    pub port: Option<u16>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            nodes: 1,
            auto_create_topics: true,
            security: None,
            properties: Vec::new(),
            jvm_opts: None,
            port: None,
        }
    }
}

/// A `SASL_SSL` listener beside the plaintext one: SCRAM-SHA-512 and PLAIN over TLS, with
/// Kafka's `StandardAuthorizer`. The plaintext listener (the tests' own clients, the brokers
/// among themselves) authenticates nobody and is a super user (`User:ANONYMOUS`), so the
/// harness needs no credentials; every client on the `SASL_SSL` listener is held to its ACLs.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// Users and passwords, for both SCRAM-SHA-512 and PLAIN.
    pub users: Vec<(String, String)>,
}

/// A local Apache Kafka cluster of one or more KRaft nodes, each with its own ports and data.
#[derive(Debug)]
pub struct LocalBroker {
    dir: PathBuf,
    cluster_id: String,
    opts: ClusterOptions,
    nodes: Vec<Node>,
    /// The CA that signed every node's certificate, with `security`.
    ca: Option<PathBuf>,
}

#[derive(Debug)]
struct Node {
    id: u32,
    port: u16,
    controller_port: u16,
    sasl_port: Option<u16>,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
}

impl LocalBroker {
    /// Starts a single-node broker with the default options and waits until it answers
    /// metadata requests. Blocking.
    pub fn start_blocking() -> LocalBroker {
        LocalBroker::start_blocking_with(ClusterOptions::default())
    }

    /// Starts a single-node broker off the runtime's threads.
    pub async fn start() -> LocalBroker {
        LocalBroker::start_with(ClusterOptions::default()).await
    }

    /// Starts a cluster as `opts` says, off the runtime's threads.
    pub async fn start_with(opts: ClusterOptions) -> LocalBroker {
        tokio::task::spawn_blocking(move || LocalBroker::start_blocking_with(opts))
            .await
            .expect("start broker")
    }

    /// Starts a cluster as `opts` says: formats every node's storage, starts the nodes in
    /// parallel, and waits until the cluster's metadata lists every broker. Blocking.
    ///
    /// Its ports are found free ([`process::free_port`]) and only then bound by the JVM: a port
    /// taken in between (by another test's process, or an outgoing connection's ephemeral
    /// port) stops a node at start ("Address already in use"). The cluster is then started
    /// again, with new ports, up to [`START_ATTEMPTS`] times.
    pub fn start_blocking_with(opts: ClusterOptions) -> LocalBroker {
        let mut attempt = 1;
        loop {
            match LocalBroker::try_start(opts.clone()) {
                Ok(b) => return b,
                Err(conflict) if attempt < START_ATTEMPTS => {
                    eprintln!(
                        "Kafka: {conflict}; starting the cluster again with other ports (attempt {} of {START_ATTEMPTS})",
                        attempt + 1
                    );
                    attempt += 1;
                }
                Err(conflict) => panic!("Kafka: {conflict}, {START_ATTEMPTS} times"),
            }
        }
    }

    /// One attempt of [`LocalBroker::start_blocking_with`]: `Err` when a node could not bind
    /// its port (the cluster is stopped and its directory removed as it drops).
    fn try_start(opts: ClusterOptions) -> Result<LocalBroker, String> {
        assert!(opts.nodes >= 1, "a Kafka cluster needs at least one node");
        let dir = std::env::temp_dir().join(unique_name("ferry-broker"));
        // `create_dir`, not `create_dir_all`: a directory that exists belongs to another run.
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("create the broker directory {}: {e}", dir.display()));
        let ca = opts.security.as_ref().map(|_| {
            crate::pg::make_certs(&dir, None);
            dir.join("ca.crt")
        });
        // Every port of the cluster at once, so that no two are the same.
        let mut ports = process::free_ports(3 * opts.nodes).into_iter();
        let nodes = (1..=opts.nodes as u32)
            .map(|id| {
                let node_dir = dir.join(format!("node-{id}"));
                std::fs::create_dir_all(&node_dir).expect("create node dir");
                let (port, controller_port, sasl_port) = (
                    ports.next().expect("a port"),
                    ports.next().expect("a port"),
                    ports.next().expect("a port"),
                );
                Node {
                    id,
                    port: opts.port.filter(|_| id == 1).unwrap_or(port),
                    controller_port,
                    sasl_port: opts.security.as_ref().map(|_| sasl_port),
                    dir: node_dir,
                    child: Mutex::new(None),
                }
            })
            .collect();
        let mut b = LocalBroker {
            cluster_id: String::new(),
            dir,
            opts,
            nodes,
            ca,
        };
        std::fs::write(b.dir.join("log4j2.properties"), LOG4J2).expect("write log4j2");
        b.cluster_id = cluster_id();
        for n in &b.nodes {
            b.write_config(n);
        }
        std::thread::scope(|s| {
            for n in &b.nodes {
                let b = &b;
                s.spawn(move || b.format(n));
            }
        });
        for i in 0..b.nodes.len() {
            b.spawn_node(i);
        }
        b.wait_started(b.nodes.len())?;
        Ok(b)
    }

    fn java_command(&self) -> Command {
        let mut c = Command::new(java());
        let opts = std::env::var(JVM_OPTS_ENV)
            .ok()
            .or_else(|| self.opts.jvm_opts.clone())
            .unwrap_or_else(|| DEFAULT_JVM_OPTS.to_string());
        c.args(opts.split_whitespace())
            .arg("-Djava.awt.headless=true")
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                self.dir.join("log4j2.properties").display()
            ))
            .arg("-cp")
            .arg(format!("{}/*", kafka_libs().display()))
            .stdin(Stdio::null());
        c
    }

    fn voters(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn write_config(&self, n: &Node) {
        let replicas = self.nodes.len().min(3);
        let min_isr = if replicas >= 3 { 2 } else { 1 };
        let mut listeners = format!(
            "PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
            n.port, n.controller_port
        );
        let mut advertised = format!("PLAINTEXT://127.0.0.1:{}", n.port);
        let mut protocols = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT".to_string();
        if let Some(sp) = n.sasl_port {
            listeners.push_str(&format!(",SASL_SSL://127.0.0.1:{sp}"));
            advertised.push_str(&format!(",SASL_SSL://127.0.0.1:{sp}"));
            protocols.push_str(",SASL_SSL:SASL_SSL");
        }
        let mut p = vec![
            "process.roles=broker,controller".to_string(),
            format!("node.id={}", n.id),
            format!("controller.quorum.voters={}", self.voters()),
            format!("listeners={listeners}"),
            format!("advertised.listeners={advertised}"),
            format!("listener.security.protocol.map={protocols}"),
            "controller.listener.names=CONTROLLER".into(),
            "inter.broker.listener.name=PLAINTEXT".into(),
            format!("log.dirs={}", n.dir.join("data").display()),
            format!("auto.create.topics.enable={}", self.opts.auto_create_topics),
            "num.partitions=1".into(),
            format!("default.replication.factor={replicas}"),
            format!("min.insync.replicas={min_isr}"),
            "unclean.leader.election.enable=false".into(),
            format!("offsets.topic.replication.factor={replicas}"),
            "offsets.topic.num.partitions=5".into(),
            format!("transaction.state.log.replication.factor={replicas}"),
            format!("transaction.state.log.min.isr={min_isr}"),
            format!("transaction.state.log.num.partitions={TRANSACTION_STATE_PARTITIONS}"),
            "group.initial.rebalance.delay.ms=0".into(),
            // A test's broker holds little: small segments and indexes keep its disk small.
            "log.segment.bytes=67108864".into(),
            "log.index.size.max.bytes=1048576".into(),
            "num.network.threads=2".into(),
            "num.io.threads=4".into(),
            "background.threads=2".into(),
            "log.cleaner.threads=1".into(),
            "log.cleaner.dedupe.buffer.size=8388608".into(),
            format!("share.coordinator.state.topic.replication.factor={replicas}"),
            format!("share.coordinator.state.topic.min.isr={min_isr}"),
        ];
        if let Some(sec) = &self.opts.security {
            let jaas_plain: String = sec
                .users
                .iter()
                .map(|(u, pw)| format!(" user_{u}=\"{pw}\""))
                .collect();
            p.extend([
                "sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN".to_string(),
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=\
                 org.apache.kafka.common.security.scram.ScramLoginModule required;"
                    .into(),
                format!(
                    "listener.name.sasl_ssl.plain.sasl.jaas.config=\
                     org.apache.kafka.common.security.plain.PlainLoginModule required{jaas_plain};"
                ),
                "ssl.keystore.type=PEM".into(),
                format!(
                    "ssl.keystore.location={}",
                    self.dir.join("server-keystore.pem").display()
                ),
                "ssl.truststore.type=PEM".into(),
                format!(
                    "ssl.truststore.location={}",
                    self.dir.join("ca.crt").display()
                ),
                "ssl.client.auth=none".into(),
                "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer"
                    .into(),
                "super.users=User:ANONYMOUS".into(),
                "allow.everyone.if.no.acl.found=false".into(),
            ]);
            let pem = format!(
                "{}{}",
                std::fs::read_to_string(self.dir.join("server.key")).expect("server.key"),
                std::fs::read_to_string(self.dir.join("server.crt")).expect("server.crt")
            );
            std::fs::write(self.dir.join("server-keystore.pem"), pem).expect("write keystore");
        }
        p.extend(self.opts.properties.iter().cloned());
        let mut f = std::fs::File::create(n.dir.join("server.properties"))
            .expect("write server.properties");
        for l in p {
            writeln!(f, "{l}").expect("write server.properties");
        }
    }

    fn format(&self, n: &Node) {
        let mut c = self.java_command();
        c.args([
            "kafka.tools.StorageTool",
            "format",
            "--ignore-formatted",
            "-t",
        ])
        .arg(&self.cluster_id)
        .arg("-c")
        .arg(n.dir.join("server.properties"));
        if let Some(sec) = &self.opts.security {
            for (u, pw) in &sec.users {
                c.arg("--add-scram")
                    .arg(format!("SCRAM-SHA-512=[name={u},password={pw}]"));
            }
        }
        let out = c.output().unwrap_or_else(|e| {
            panic!("run java for Kafka's StorageTool: {e}: {BROKER_SETUP_HINT}")
        });
        if !out.status.success() {
            // The reason is in stderr and at the end of stdout, after a page of configuration.
            let stdout = String::from_utf8_lossy(&out.stdout);
            let lines: Vec<&str> = stdout.lines().collect();
            panic!(
                "Kafka's StorageTool format failed for node {} in {}: {}\n(the last lines of its \
                 output:)\n{}",
                n.id,
                n.dir.display(),
                String::from_utf8_lossy(&out.stderr),
                lines[lines.len().saturating_sub(20)..].join("\n")
            );
        }
    }

    fn spawn_node(&self, i: usize) {
        let n = &self.nodes[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(n.dir.join("server.log"))
            .expect("open server.log");
        let mut cmd = self.java_command();
        cmd.arg("kafka.Kafka")
            .arg(n.dir.join("server.properties"))
            .stdout(log.try_clone().expect("dup"))
            .stderr(log);
        let child = spawn_owned(cmd, libc::SIGKILL)
            .unwrap_or_else(|e| panic!("start Apache Kafka (java): {e}: {BROKER_SETUP_HINT}"));
        *n.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
    }

    /// Waits until the cluster's metadata lists `brokers` brokers, through any live node.
    fn wait_ready(&self, brokers: usize) {
        if let Err(conflict) = self.wait_started(brokers) {
            panic!("Kafka: {conflict}");
        }
    }

    /// [`LocalBroker::wait_ready`], or `Err` when a node stopped because its port was taken.
    fn wait_started(&self, brokers: usize) -> Result<(), String> {
        let start = Instant::now();
        let deadline = Duration::from_secs(90);
        loop {
            if let Some(n) = metadata_brokers(&self.brokers()) {
                if n >= brokers {
                    return Ok(());
                }
            }
            for node in &self.nodes {
                let mut child = node.child.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                    *child = None;
                    let log =
                        std::fs::read_to_string(node.dir.join("server.log")).unwrap_or_default();
                    if log.contains("java.net.BindException: Address already in use") {
                        return Err(format!(
                            "node {} could not bind its port (Address already in use)",
                            node.id
                        ));
                    }
                    panic!(
                        "Kafka node {} exited ({status}) while starting; its log ({}):\n{}",
                        node.id,
                        node.dir.join("server.log").display(),
                        tail(&node.dir.join("server.log"), 60)
                    );
                }
            }
            assert!(
                start.elapsed() < deadline,
                "Kafka did not list {brokers} broker(s) within {deadline:?}; logs in {}:\n{}",
                self.dir.display(),
                tail(&self.nodes[0].dir.join("server.log"), 60)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops every node (SIGTERM: a controlled shutdown, then waits). The data stays for
    /// [`LocalBroker::start_again`].
    pub fn stop(&self) {
        std::thread::scope(|s| {
            for i in 0..self.nodes.len() {
                s.spawn(move || self.stop_node(i));
            }
        });
    }

    /// Kills every node (SIGKILL: no shutdown work), keeping the data for
    /// [`LocalBroker::start_again`].
    pub fn kill(&self) {
        for i in 0..self.nodes.len() {
            self.kill_node(i);
        }
    }

    /// Starts every stopped node again on the same ports with the same data, and waits until
    /// all of them are listed.
    pub fn start_again(&self) {
        for (i, n) in self.nodes.iter().enumerate() {
            if n.child.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
                self.spawn_node(i);
            }
        }
        self.wait_ready(self.nodes.len());
    }

    /// Stops node `i` (0-based) with SIGTERM and waits for it to exit, at most
    /// [`NODE_STOP_DEADLINE`]; then kills it with SIGKILL, as a crash would, and says so.
    pub fn stop_node(&self, i: usize) {
        let taken = self.child(i).take();
        if let Some(mut c) = taken {
            process::signal(&c, libc::SIGCONT);
            if !process::terminate_within(&mut c, NODE_STOP_DEADLINE) {
                eprintln!(
                    "Kafka node {i} did not stop within {NODE_STOP_DEADLINE:?} of SIGTERM: killed \
                     with SIGKILL; its log is {}",
                    self.nodes[i].dir.join("server.log").display()
                );
            }
        }
    }

    /// Node `i`'s process id (0-based), while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.child(i).as_ref().map(Child::id)
    }

    /// Kills node `i` (0-based) with SIGKILL.
    pub fn kill_node(&self, i: usize) {
        let taken = self.child(i).take();
        if let Some(mut c) = taken {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts node `i` (0-based) again with its data. Does not wait: see
    /// [`LocalBroker::wait_brokers`].
    pub fn start_node(&self, i: usize) {
        let running = self.child(i).is_some();
        if !running {
            self.spawn_node(i);
        }
    }

    /// Node `i`'s process, if it runs (a poisoned lock is still a valid slot).
    fn child(&self, i: usize) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.nodes[i]
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Pauses node `i` (SIGSTOP): its connections stay open and nothing answers.
    pub fn pause_node(&self, i: usize) {
        if let Some(c) = &*self.child(i) {
            process::signal(c, libc::SIGSTOP);
        }
    }

    /// Resumes node `i` after [`LocalBroker::pause_node`].
    pub fn resume_node(&self, i: usize) {
        if let Some(c) = &*self.child(i) {
            process::signal(c, libc::SIGCONT);
        }
    }

    /// Waits (blocking) until the cluster's metadata lists `n` brokers.
    pub fn wait_brokers(&self, n: usize) {
        self.wait_ready(n);
    }

    /// The number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// The index of the node whose broker id is `id`.
    pub fn node_of(&self, id: i32) -> Option<usize> {
        self.nodes.iter().position(|n| n.id as i32 == id)
    }

    /// The bootstrap list of the plaintext listeners (every node).
    pub fn brokers(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The bootstrap list of the `SASL_SSL` listeners, with [`ClusterOptions::security`].
    pub fn sasl_brokers(&self) -> Option<String> {
        let ports: Option<Vec<u16>> = self.nodes.iter().map(|n| n.sasl_port).collect();
        ports.map(|p| {
            p.iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect::<Vec<_>>()
                .join(",")
        })
    }

    /// The CA certificate (PEM) that signed the brokers' TLS certificates, with security.
    pub fn ca_cert(&self) -> Option<&Path> {
        self.ca.as_deref()
    }

    /// The directory holding every node's configuration, data and `server.log`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The authorizations every node's authorizer denied so far (the `kafka.authorizer.logger`
    /// lines, which name the principal, the operation and the resource).
    pub fn denials(&self) -> Vec<String> {
        self.nodes
            .iter()
            .flat_map(|n| {
                std::fs::read_to_string(n.dir.join("server.log"))
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains("kafka.authorizer.logger") && l.contains("Denied"))
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The last `lines` lines of node `i`'s log.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        tail(&self.nodes[i].dir.join("server.log"), lines)
    }

    /// Whether node `i`'s process is running (not killed or stopped by the harness).
    pub fn is_running(&self, i: usize) -> bool {
        self.child(i).is_some()
    }

    /// The node id of the active controller (the KRaft quorum's leader), asked of a running
    /// node's controller listener by Kafka's own `MetadataQuorumCommand` (`describe --status`;
    /// the Admin call behind it, DescribeMetadataQuorum, is not in librdkafka). `None` when no
    /// node answers or the quorum has no leader. Blocking; starts a JVM (~1 s).
    pub fn active_controller(&self) -> Option<i32> {
        let bootstrap = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| self.is_running(*i))
            .map(|(_, n)| format!("127.0.0.1:{}", n.controller_port))
            .collect::<Vec<_>>()
            .join(",");
        if bootstrap.is_empty() {
            return None;
        }
        let out = self
            .java_command()
            .args([
                "org.apache.kafka.tools.MetadataQuorumCommand",
                "--bootstrap-controller",
                &bootstrap,
                "describe",
                "--status",
            ])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        quorum_leader(&String::from_utf8_lossy(&out.stdout))
    }
}

/// The `LeaderId` of `MetadataQuorumCommand describe --status` output.
pub fn quorum_leader(status: &str) -> Option<i32> {
    status
        .lines()
        .find_map(|l| l.trim().strip_prefix("LeaderId:"))
        .and_then(|v| v.trim().parse().ok())
        .filter(|id: &i32| *id >= 0)
}

/// The partition of `__transaction_state` that holds `transactional_id` (its leader is the
/// transaction coordinator): Kafka's `Utils.abs(transactionalId.hashCode) % partitions`, with
/// Java's `String.hashCode` (UTF-16 code units) and `Utils.abs` (`Integer.MIN_VALUE` is 0).
pub fn transaction_state_partition(transactional_id: &str, partitions: i32) -> i32 {
    let hash = transactional_id
        .encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    abs % partitions
}

/// The broker id coordinating `transactional_id`'s transactions (the leader of its
/// `__transaction_state` partition; the local clusters have 5 of them), if the metadata names
/// one.
pub fn transaction_coordinator(brokers: &str, transactional_id: &str) -> Option<i32> {
    leader_of(
        brokers,
        "__transaction_state",
        transaction_state_partition(transactional_id, TRANSACTION_STATE_PARTITIONS),
    )
}

/// `transaction.state.log.num.partitions` of the local clusters.
pub const TRANSACTION_STATE_PARTITIONS: i32 = 5;

/// The partitions (topic, partition, replicas, in-sync replicas) of every topic whose in-sync
/// replicas are fewer than its replicas, or that have no leader; `None` when no broker answers.
/// An empty list means the cluster is fully replicated (what a rolling restart waits for
/// before it stops the next broker).
pub fn under_replicated(brokers: &str) -> Option<Vec<(String, i32, usize, usize)>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("log_level", "0")
        .create()
        .ok()?;
    let md = consumer.fetch_metadata(None, Duration::from_secs(5)).ok()?;
    let mut out = Vec::new();
    for t in md.topics() {
        for p in t.partitions() {
            if p.leader() < 0 || p.isr().len() < p.replicas().len() {
                out.push((
                    t.name().to_string(),
                    p.id(),
                    p.replicas().len(),
                    p.isr().len(),
                ));
            }
        }
    }
    Some(out)
}

impl Drop for LocalBroker {
    fn drop(&mut self) {
        let keep = std::env::var_os("FERRY_TEST_KEEP_BROKER_DATA").is_some();
        if keep {
            self.stop();
        } else {
            self.kill();
        }
        if keep || std::thread::panicking() {
            let _ = std::fs::write(self.dir.join(process::KEEP_MARKER), b"kept\n");
            eprintln!("Kafka's logs and data kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

const LOG4J2: &str = "\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
# Every authorization the StandardAuthorizer denies (INFO; DEBUG would add every one allowed),
# so that a test of least privilege can read what was refused: see LocalBroker::denials.
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = INFO
";

/// A new cluster id, as Kafka's `StorageTool random-uuid` makes it (16 random bytes in
/// URL-safe base64 without padding, never starting with `-`), without a JVM start for it.
fn cluster_id() -> String {
    use std::io::Read;
    let mut urandom = std::fs::File::open("/dev/urandom").expect("open /dev/urandom");
    loop {
        let mut bytes = [0u8; 16];
        urandom.read_exact(&mut bytes).expect("read /dev/urandom");
        let bits = u128::from_be_bytes(bytes);
        let id = uuid_string(bits);
        // Kafka reserves the all-zero and the one-bit ids.
        if !id.starts_with('-') && bits > 1 {
            return id;
        }
    }
}

/// A 128-bit id in URL-safe base64 without padding (Kafka's `Uuid.toString`): 22 characters of
/// 6 bits, the last 4 bits padding zeros.
fn uuid_string(bits: u128) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    (0..22)
        .map(|i| {
            let shift = 128i32 - 6 * (i + 1);
            let v = if shift >= 0 {
                (bits >> shift) & 63
            } else {
                (bits << -shift) & 63
            };
            ALPHABET[v as usize] as char
        })
        .collect()
}

/// The last `lines` lines of a file, or a note that it cannot be read.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(s) => {
            let all: Vec<&str> = s.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// What to do when the tests have no broker to start or use.
pub const BROKER_SETUP_HINT: &str = "run `bash .ci/install-deps` once (resolves Apache Kafka's \
     jars from Maven Central into ~/.cache/ferry, and installs PostgreSQL 15 and a JDK; needs \
     root or sudo for the packages) or `bash .ci/install-broker` (Kafka only), or set \
     FERRY_TEST_KAFKA_BROKERS to the bootstrap servers of a Kafka cluster (README, \"Run the \
     tests\")";

/// The directory of Apache Kafka's jars: `FERRY_TEST_KAFKA_LIBS`, else the one
/// `.ci/install-broker` fills under `~/.cache/ferry/kafka-<version>/libs`. Panics with what to
/// do when there is none. When there is none and `FERRY_TEST_KAFKA_LIBS` is unset, it first
/// runs `.ci/install-deps` ([`process::install_deps_once`]): a fresh machine needs no set-up
/// step before the tests.
pub fn kafka_libs() -> PathBuf {
    static LIBS: OnceLock<PathBuf> = OnceLock::new();
    LIBS.get_or_init(|| process::jars(KAFKA_LIBS_ENV, find_kafka_libs))
        .clone()
}

/// [`kafka_libs`] with its inputs as arguments: the `FERRY_TEST_KAFKA_LIBS` value and the cache
/// directory `.ci/install-broker` fills.
pub fn find_kafka_libs(env_dir: Option<PathBuf>, cache: &Path) -> Result<PathBuf, String> {
    let broker_jar = format!("kafka_2.13-{KAFKA_VERSION}.jar");
    let complete = |d: &Path| d.join(&broker_jar).is_file() && d.join(".complete").is_file();
    if let Some(dir) = env_dir {
        if dir.join(&broker_jar).is_file() {
            return Ok(dir);
        }
        return Err(format!(
            "{KAFKA_LIBS_ENV}={} holds no {broker_jar}: point it at a directory of Apache \
             Kafka {KAFKA_VERSION}'s jars, or unset it to use the ones .ci/install-broker \
             installs",
            dir.display()
        ));
    }
    let dir = cache.join(format!("kafka-{KAFKA_VERSION}/libs"));
    if complete(&dir) {
        return Ok(dir);
    }
    Err(format!(
        "no Kafka broker for the tests (no Apache Kafka {KAFKA_VERSION} under {}, \
         {BROKERS_ENV} and {KAFKA_LIBS_ENV} unset): {BROKER_SETUP_HINT}",
        dir.display()
    ))
}

/// How many brokers the cluster's metadata lists, asked through `brokers`; `None` when no
/// broker answers.
fn metadata_brokers(brokers: &str) -> Option<usize> {
    let consumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("log_level", "0")
        .create::<BaseConsumer>()
        .ok()?;
    consumer
        .fetch_metadata(None, Duration::from_millis(1000))
        .ok()
        .map(|md| md.brokers().len())
}

/// An admin client of `brokers` (no security settings: the testkit's own brokers).
pub fn admin(brokers: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client")
}

/// Creates `topic` with `partitions` partitions (the cluster's default replication factor:
/// 1 on one node, 3 on three) and waits until its metadata shows every partition.
pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    create_topic_with(brokers, topic, partitions, &[]).await
}

/// [`create_topic`] with topic configurations (`("message.timestamp.type", "LogAppendTime")`).
pub async fn create_topic_with(
    brokers: &str,
    topic: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) {
    let admin = admin(brokers);
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
    for (k, v) in configs {
        new = new.set(k, v);
    }
    let res = admin
        .create_topics([&new], &AdminOptions::new())
        .await
        .expect("create_topics");
    for r in res {
        if let Err((t, code)) = r {
            if code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
                panic!("create topic {t}: {code:?}");
            }
        }
    }
    let brokers = brokers.to_string();
    let topic = topic.to_string();
    process::wait_until("topic metadata", Duration::from_secs(30), || {
        let (b, t) = (brokers.clone(), topic.clone());
        async move {
            tokio::task::spawn_blocking(move || partition_count(&b, &t) == Some(partitions))
                .await
                .unwrap_or(false)
        }
    })
    .await;
}

/// Sets `topic`'s configs to `configs` (AlterConfigs: every topic config not named goes back to
/// the brokers' default). The brokers apply it a moment after they acknowledge it.
pub async fn alter_topic_configs(brokers: &str, topic: &str, configs: &[(&str, &str)]) {
    let admin = admin(brokers);
    let mut alter = AlterConfig::new(ResourceSpecifier::Topic(topic));
    for (k, v) in configs {
        alter = alter.set(k, v);
    }
    let altered = admin
        .alter_configs([&alter], &AdminOptions::new())
        .await
        .expect("alter_configs");
    assert!(altered.iter().all(|r| r.is_ok()), "{altered:?}");
}

/// The number of partitions the broker reports for `topic`, if it knows the topic.
pub fn partition_count(brokers: &str, topic: &str) -> Option<i32> {
    with_topic_metadata(brokers, topic, |t| {
        (t.error().is_none() && !t.partitions().is_empty()).then_some(t.partitions().len() as i32)
    })
}

/// Whether the brokers know `topic` (settled or still being created), asked without creating it.
pub fn topic_known(brokers: &str, topic: &str) -> bool {
    with_topic_metadata(brokers, topic, |t| {
        let unknown = rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
        (t.error() != Some(unknown)).then_some(())
    })
    .is_some()
}

/// The broker id leading `topic`'s `partition`, if the metadata names one.
pub fn leader_of(brokers: &str, topic: &str, partition: i32) -> Option<i32> {
    with_topic_metadata(brokers, topic, |t| {
        let p = t.partitions().iter().find(|p| p.id() == partition)?;
        (p.leader() >= 0).then_some(p.leader())
    })
}

/// `read` of `topic`'s metadata, asked of `brokers` without creating the topic; `None` when no
/// broker answers or the answer does not name the topic.
fn with_topic_metadata<T>(
    brokers: &str,
    topic: &str,
    read: impl FnOnce(&rdkafka::metadata::MetadataTopic) -> Option<T>,
) -> Option<T> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("allow.auto.create.topics", "false")
        .create()
        .ok()?;
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .ok()?;
    md.topics()
        .iter()
        .find(|t| t.name() == topic)
        .and_then(read)
}

/// One record read back from a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumed {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp_ms: Option<i64>,
}

impl Consumed {
    /// The first header named `name`, as UTF-8.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_ref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

/// Reads every partition of `topic` from the beginning (`read_committed`: records of aborted
/// or open transactions never show) until at least `expected` records have arrived, or panics
/// at the deadline saying how many came. Returns them in per-partition offset order
/// (partitions interleaved as fetched).
pub async fn consume(
    brokers: &str,
    topic: &str,
    expected: usize,
    deadline: Duration,
) -> Vec<Consumed> {
    let (brokers, topic) = (brokers.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || consume_blocking(&brokers, &topic, expected, deadline))
        .await
        .expect("consume task")
}

/// Reads every partition of `topic` from the beginning (`read_committed`) until `done` holds for
/// what has arrived, then on to the end of every partition (its high watermark when `done` first
/// held), or panics at the deadline with `what` and how many came. For tests whose expectation is
/// not a count: every row of a writer at least once, duplicates included.
pub async fn consume_until(
    brokers: &str,
    topic: &str,
    what: &str,
    deadline: Duration,
    done: impl FnMut(&[Consumed]) -> bool + Send + 'static,
) -> Vec<Consumed> {
    let (brokers, topic, what) = (brokers.to_string(), topic.to_string(), what.to_string());
    tokio::task::spawn_blocking(move || {
        read_blocking(&brokers, &topic, deadline, &what, done, true)
    })
    .await
    .expect("consume task")
}

fn consume_blocking(
    brokers: &str,
    topic: &str,
    expected: usize,
    deadline: Duration,
) -> Vec<Consumed> {
    read_blocking(
        brokers,
        topic,
        deadline,
        &format!("{expected} records"),
        |got| got.len() >= expected,
        false,
    )
}

fn read_blocking(
    brokers: &str,
    topic: &str,
    deadline: Duration,
    what: &str,
    mut done: impl FnMut(&[Consumed]) -> bool,
    to_end: bool,
) -> Vec<Consumed> {
    let parts = partition_count(brokers, topic)
        .unwrap_or_else(|| panic!("topic {topic} does not exist on {brokers}"));
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique_name("ferry-test-group"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..parts {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)
            .expect("partition offset");
    }
    consumer.assign(&tpl).expect("assign");
    let start = Instant::now();
    let mut out = Vec::new();
    // The high watermarks to read up to, once `done` held (with `to_end`).
    let mut ends: Option<Vec<i64>> = None;
    loop {
        if ends.is_none() && done(&out) {
            if !to_end {
                break;
            }
            ends = Some(
                (0..parts)
                    .map(|p| {
                        consumer
                            .fetch_watermarks(topic, p, Duration::from_secs(10))
                            .expect("fetch watermarks")
                            .1
                    })
                    .collect(),
            );
        }
        if let Some(ends) = &ends {
            let positions = consumer.position().expect("position");
            let at_end = (0..parts).all(|p| {
                let pos = positions
                    .find_partition(topic, p)
                    .and_then(|e| e.offset().to_raw())
                    .unwrap_or(0);
                pos >= ends[p as usize]
            });
            if at_end {
                break;
            }
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} reading {topic}: waiting for {what}, {} records arrived{}",
            out.len(),
            if ends.is_some() { " (reading on to the end)" } else { "" }
        );
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => panic!("consume {topic}: {e}"),
            Some(Ok(m)) => out.push(Consumed {
                topic: m.topic().to_string(),
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                headers: m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                            .collect()
                    })
                    .unwrap_or_default(),
                timestamp_ms: m.timestamp().to_millis(),
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's `Uuid.toString` (URL-safe base64, no padding) of known ids: all ones, and
    /// `new Uuid(1, 2)` ("AAAAAAAAAAEAAAAAAAAAAg").
    #[test]
    fn a_cluster_id_is_spelled_as_kafka_spells_it() {
        assert_eq!(uuid_string(u128::MAX), "_____________________w");
        assert_eq!(uuid_string((1u128 << 64) | 2), "AAAAAAAAAAEAAAAAAAAAAg");
        let id = cluster_id();
        assert_eq!(id.len(), 22);
        assert!(!id.starts_with('-'));
    }

    /// Java's `String.hashCode`: "hello" is 99162322; "polygenelubricants" is
    /// `Integer.MIN_VALUE`, which Kafka's `Utils.abs` maps to 0; a negative hash is made
    /// positive before the modulo.
    #[test]
    fn transaction_state_partition_follows_kafkas_formula() {
        assert_eq!(transaction_state_partition("hello", 5), 99162322 % 5);
        assert_eq!(transaction_state_partition("hello", 50), 99162322 % 50);
        assert_eq!(transaction_state_partition("polygenelubricants", 5), 0);
        // "Aa" and "BB" collide in Java (both 2112).
        assert_eq!(transaction_state_partition("Aa", 7), 2112 % 7);
        assert_eq!(transaction_state_partition("BB", 7), 2112 % 7);
        // A negative hash: "ferry-orders".hashCode() is -940164360 in Java.
        assert_eq!(
            transaction_state_partition("ferry-orders", 5),
            940164360 % 5
        );
    }

    #[test]
    fn the_quorum_leader_is_read_from_describe_status() {
        let out =
            "ClusterId:              abc\nLeaderId:               2\nLeaderEpoch:            7\n";
        assert_eq!(quorum_leader(out), Some(2));
        assert_eq!(quorum_leader("LeaderId: -1\n"), None);
        assert_eq!(quorum_leader("nothing"), None);
    }
}
