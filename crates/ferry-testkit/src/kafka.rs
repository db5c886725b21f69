//! A Kafka-protocol broker for tests: the one named by `FERRY_TEST_KAFKA_BROKERS` (for example
//! the docker-compose Kafka), or a local broker this process starts (noida-db by default, tansu
//! when `FERRY_TEST_TANSU_BIN` is set), plus helpers to create topics and read them back.
//!
//! Verify by consuming records back, never by reading watermarks (tansu's are wrong), and use
//! one consumer per group: a group shared by consumers of different tests rebalances under them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::TopicPartitionList;

use crate::pg::unique_name;
use crate::process::{self, spawn_owned};

/// Environment variable naming an existing broker list to use instead of a local broker.
pub const BROKERS_ENV: &str = "FERRY_TEST_KAFKA_BROKERS";
/// Environment variable naming the noida-db binary.
pub const NOIDA_BIN_ENV: &str = "FERRY_TEST_NOIDA_BIN";
/// Environment variable naming a tansu binary (used instead of noida when set).
pub const TANSU_BIN_ENV: &str = "FERRY_TEST_TANSU_BIN";

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
            Broker::Local(LocalBroker::start_blocking())
        }
    })
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

/// A local broker process (noida-db or tansu) with its own port and data.
#[derive(Debug)]
pub struct LocalBroker {
    port: u16,
    data: PathBuf,
    child: Mutex<Option<Child>>,
}

impl LocalBroker {
    /// Starts a broker and waits until it answers metadata requests. Blocking.
    pub fn start_blocking() -> LocalBroker {
        let data = std::env::temp_dir().join(unique_name("ferry-broker"));
        std::fs::create_dir_all(&data).expect("create broker dir");
        let b = LocalBroker {
            port: process::free_port(),
            data,
            child: Mutex::new(None),
        };
        b.spawn();
        b
    }

    /// Starts a broker off the runtime's threads.
    pub async fn start() -> LocalBroker {
        tokio::task::spawn_blocking(LocalBroker::start_blocking)
            .await
            .expect("start broker")
    }

    fn spawn(&self) {
        let addr = format!("127.0.0.1:{}", self.port);
        let mut cmd = if let Ok(tansu) = std::env::var(TANSU_BIN_ENV) {
            let mut c = Command::new(tansu);
            c.args(["broker", "--listener-url"])
                .arg(format!("tcp://{addr}"))
                .arg("--advertised-listener-url")
                .arg(format!("tcp://{addr}"))
                .args(["--storage-engine", "memory://tansu/"]);
            c
        } else {
            let mut c = Command::new(noida_bin());
            c.args(["start", "--only", "kafka", "--kafka-port"])
                .arg(self.port.to_string())
                .arg("--data-dir")
                .arg(&self.data);
            c
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data.join("broker.log"))
            .expect("open broker.log");
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log);
        let program = cmd.get_program().to_owned();
        let child = spawn_owned(cmd, libc::SIGKILL).unwrap_or_else(|e| {
            panic!(
                "start the test broker {}: {e}: {BROKER_SETUP_HINT}",
                Path::new(&program).display()
            )
        });
        *self.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
        let start = Instant::now();
        while !metadata_ok(&self.brokers()) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "broker did not answer within 60s; log:\n{}",
                std::fs::read_to_string(self.data.join("broker.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the broker (SIGTERM, then waits). Its data stays for [`LocalBroker::start_again`].
    pub fn stop(&self) {
        if let Some(mut c) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            process::signal(&c, libc::SIGTERM);
            let _ = c.wait();
        }
    }

    /// Kills the broker (SIGKILL: no shutdown work), keeping its data for
    /// [`LocalBroker::start_again`].
    pub fn kill(&self) {
        if let Some(mut c) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the broker again on the same port with the same data.
    pub fn start_again(&self) {
        self.spawn();
    }

    /// The bootstrap address.
    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for LocalBroker {
    fn drop(&mut self) {
        // FERRY_TEST_KEEP_BROKER_DATA: stop it cleanly (noida-db saves its data file then) and
        // keep the directory, to look into what the broker held.
        let keep = std::env::var_os("FERRY_TEST_KEEP_BROKER_DATA").is_some();
        if let Some(mut c) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if keep {
                process::signal(&c, libc::SIGTERM);
            } else {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        if keep {
            eprintln!("broker data kept in {}", self.data.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.data);
        }
    }
}

/// What to do when the tests have no broker to start or use.
pub const BROKER_SETUP_HINT: &str = "run `bash .ci/install-deps` once (installs the test broker \
     noida-db under ~/.cache/ferry, and PostgreSQL 15; needs root or sudo for the packages) or \
     `bash .ci/install-broker` (the broker only), or set FERRY_TEST_KAFKA_BROKERS to the bootstrap \
     servers of a Kafka cluster (README, \"Run the tests\")";

/// The noida-db binary: `FERRY_TEST_NOIDA_BIN`, else the one `.ci/install-broker` installs under
/// `~/.cache/ferry/noida-<version>/`. Panics with what to do when there is none.
pub fn noida_bin() -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    find_noida_bin(
        std::env::var_os(NOIDA_BIN_ENV).map(PathBuf::from),
        &home
            .unwrap_or_else(|| PathBuf::from("/root"))
            .join(".cache/ferry"),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// [`noida_bin`] with its inputs as arguments: the `FERRY_TEST_NOIDA_BIN` value and the cache
/// directory holding the venvs `.ci/install-broker` makes.
pub fn find_noida_bin(env_bin: Option<PathBuf>, cache: &Path) -> Result<PathBuf, String> {
    if let Some(bin) = env_bin {
        if bin.is_file() {
            return Ok(bin);
        }
        return Err(format!(
            "{NOIDA_BIN_ENV}={} is not a file: point it at the noida-db binary, or unset it \
             to use the one .ci/install-broker installs",
            bin.display()
        ));
    }
    let found = std::fs::read_dir(cache)
        .into_iter()
        .flatten()
        .flatten()
        .find_map(|e| {
            let lib = e.path().join("lib");
            std::fs::read_dir(lib)
                .into_iter()
                .flatten()
                .flatten()
                .find_map(|py| {
                    let bin = py.path().join("site-packages/noida_db/noida-db");
                    bin.is_file().then_some(bin)
                })
        });
    found.ok_or_else(|| {
        format!(
            "no Kafka broker for the tests (no noida-db under {}, {BROKERS_ENV} and \
             {NOIDA_BIN_ENV} unset): {BROKER_SETUP_HINT}",
            cache.display()
        )
    })
}

fn metadata_ok(brokers: &str) -> bool {
    let Ok(consumer) = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("log_level", "0")
        .create::<BaseConsumer>()
    else {
        return false;
    };
    consumer
        .fetch_metadata(None, Duration::from_millis(500))
        .is_ok()
}

/// Creates `topic` with `partitions` partitions (replication factor 1) and waits until its
/// metadata shows every partition.
pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
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

/// Turns the broker's `auto.create.topics.enable` on or off (AlterConfigs on the broker
/// resource), as managed Kafka has it off. Use it on a broker of the test's own
/// ([`LocalBroker`]): the shared one serves tests that rely on auto-creation.
pub async fn set_auto_create_topics(brokers: &str, enabled: bool) {
    use rdkafka::admin::AlterConfig;
    let b = brokers.to_string();
    let id = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &b)
            .create()
            .expect("consumer");
        consumer
            .fetch_metadata(None, Duration::from_secs(10))
            .expect("broker metadata")
            .brokers()[0]
            .id()
    })
    .await
    .expect("metadata task");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let value = if enabled { "true" } else { "false" };
    let alter =
        AlterConfig::new(ResourceSpecifier::Broker(id)).set("auto.create.topics.enable", value);
    let res = admin
        .alter_configs([&alter], &opts)
        .await
        .expect("alter_configs");
    for r in res {
        r.unwrap_or_else(|e| panic!("set auto.create.topics.enable = {value}: {e:?}"));
    }
    let described = admin
        .describe_configs([&ResourceSpecifier::Broker(id)], &opts)
        .await
        .expect("describe_configs");
    let now = described
        .into_iter()
        .flatten()
        .flat_map(|r| r.entries)
        .find(|e| e.name == "auto.create.topics.enable")
        .and_then(|e| e.value);
    assert_eq!(
        now.as_deref(),
        Some(value),
        "the broker did not take auto.create.topics.enable"
    );
}

/// The number of partitions the broker reports for `topic`, if it knows the topic.
pub fn partition_count(brokers: &str, topic: &str) -> Option<i32> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .ok()?;
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .ok()?;
    let t = md.topics().iter().find(|t| t.name() == topic)?;
    if t.error().is_some() || t.partitions().is_empty() {
        return None;
    }
    Some(t.partitions().len() as i32)
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

/// Reads every partition of `topic` from the beginning until at least `expected` records have
/// arrived, or panics at the deadline saying how many came. Returns them in per-partition
/// offset order (partitions interleaved as fetched).
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

fn consume_blocking(
    brokers: &str,
    topic: &str,
    expected: usize,
    deadline: Duration,
) -> Vec<Consumed> {
    let parts = partition_count(brokers, topic)
        .unwrap_or_else(|| panic!("topic {topic} does not exist on {brokers}"));
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique_name("ferry-test-group"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
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
    while out.len() < expected {
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} reading {topic}: {} of {expected} records arrived",
            out.len()
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
