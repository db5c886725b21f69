//! The servers a benchmark runs against: a private PostgreSQL cluster and a local broker (or
//! the ones `FERRY_TEST_PG_URL` / `FERRY_TEST_KAFKA_BROKERS` name), and the database and topics
//! of each workload.

use ferry_testkit::kafka as testkafka;
use ferry_testkit::pg::{self, PgCluster};

use crate::workload::Workload;
use crate::{kafka, Contender, Res, PUBLICATION};

/// `postgresql.conf` lines for the benchmark's own cluster, `;`-separated ([`split_lines`]; e.g.
/// `wal_init_zero = on; log_autovacuum_min_duration = 0`), after its defaults.
pub const PG_CONF_ENV: &str = "FERRY_BENCH_PG_CONF";

/// `server.properties` lines for the benchmark's own broker, `;`-separated ([`split_lines`]; e.g.
/// `controller.quorum.append.linger.ms=0`), after its defaults (a later key wins).
pub const KAFKA_CONF_ENV: &str = "FERRY_BENCH_KAFKA_CONF";

/// PostgreSQL and the broker.
pub struct World {
    cluster: Option<PgCluster>,
    broker: Option<testkafka::LocalBroker>,
    external_brokers: Option<String>,
    pub admin_url: String,
}

impl World {
    pub async fn start() -> Res<World> {
        // Directories that killed runs (and tests) left behind.
        ferry_testkit::process::sweep_stale_dirs("ferry-pg");
        ferry_testkit::process::sweep_stale_dirs("ferry-broker");
        let (cluster, admin_url) = match std::env::var(pg::PG_URL_ENV) {
            Ok(u) if !u.is_empty() => (None, u),
            _ => {
                let mut extra_conf: Vec<String> = vec![
                    "shared_buffers = '256MB'".into(),
                    "max_wal_size = '8GB'".into(),
                    "checkpoint_timeout = '30min'".into(),
                    // The slot holder (see `ferry`) never answers keepalives.
                    "wal_sender_timeout = 0".into(),
                    // Commit → in Kafka, for every relay alike (see `latency`).
                    "track_commit_timestamp = on".into(),
                    // A fresh cluster that never checkpoints during a run reuses no WAL
                    // segment: by default it would fill every new 16 MiB one with zeros while
                    // commits wait (~8 ms each here, ~0.9 a second at 10,000 rows/s, and 40-55
                    // ms in some runs, why not proven), where a server in its steady state
                    // recycles them. bench/README.md, "Round 31".
                    "wal_init_zero = off".into(),
                ];
                // Settings of an experiment, after the defaults (the last one set wins).
                extra_conf.extend(extra_lines(PG_CONF_ENV));
                let c = PgCluster::start(pg::ClusterOptions {
                    tls: false,
                    extra_conf,
                })
                .await;
                let u = c.url("postgres");
                (Some(c), u)
            }
        };
        let external_brokers = std::env::var(testkafka::BROKERS_ENV)
            .ok()
            .filter(|b| !b.is_empty());
        let broker = match external_brokers {
            Some(_) => None,
            None => Some(start_broker().await),
        };
        Ok(World {
            cluster,
            broker,
            external_brokers,
            admin_url,
        })
    }

    pub fn brokers(&self) -> String {
        match (&self.external_brokers, &self.broker) {
            (Some(b), _) => b.clone(),
            (None, Some(b)) => b.brokers(),
            (None, None) => unreachable!("a world has a broker"),
        }
    }

    /// A local broker starts afresh for every run (each run's logs, page cache and log
    /// cleaner start from nothing, whatever ran before); an external one is kept.
    pub async fn fresh_broker(&mut self) {
        if let Some(old) = self.broker.take() {
            drop(old);
            self.broker = Some(start_broker().await);
        }
    }

    /// The benchmark's own PostgreSQL cluster (`None` for an external server).
    pub fn local_postgres(&self) -> Option<&PgCluster> {
        self.cluster.as_ref()
    }

    /// The local broker (`None` for an external one).
    pub fn local_broker(&self) -> Option<&testkafka::LocalBroker> {
        self.broker.as_ref()
    }

    /// The local broker's process id (`None` for an external broker).
    pub fn broker_pid(&self) -> Option<u32> {
        self.broker.as_ref().and_then(|b| b.pid(0))
    }

    pub fn broker_version(&self) -> String {
        match &self.external_brokers {
            Some(b) => format!("external ({b})"),
            None => {
                let props = extra_lines(KAFKA_CONF_ENV);
                format!(
                    "Apache Kafka {} (local, one KRaft node as broker and controller, JVM: {}{})",
                    testkafka::KAFKA_VERSION,
                    jvm_opts(),
                    if props.is_empty() {
                        String::new()
                    } else {
                        let shown: Vec<String> = props.iter().map(|l| hide_secret(l)).collect();
                        format!("; {KAFKA_CONF_ENV}: {}", shown.join("; "))
                    }
                )
            }
        }
    }
}

/// The broker JVM's options: `FERRY_TEST_KAFKA_JVM_OPTS`, else those of Kafka's own start script.
fn jvm_opts() -> String {
    std::env::var(testkafka::JVM_OPTS_ENV)
        .unwrap_or_else(|_| testkafka::KAFKA_SERVER_JVM_OPTS.to_string())
}

/// The lines of an experiment's settings in the environment variable `var` ([`split_lines`]).
fn extra_lines(var: &str) -> Vec<String> {
    std::env::var(var)
        .map(|more| split_lines(&more))
        .unwrap_or_default()
}

/// Lines separated by `;` or a newline, each trimmed, the empty ones left out. `\;` is a `;`
/// within a line (a JAAS setting ends with one), and `\\` a backslash.
fn split_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(next @ (';' | '\\')) => line.push(next),
                Some(other) => {
                    line.push('\\');
                    line.push(other);
                }
                None => line.push('\\'),
            },
            ';' | '\n' => lines.push(std::mem::take(&mut line)),
            c => line.push(c),
        }
    }
    lines.push(line);
    lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// A setting as the report shows it: the value of a JAAS or password setting hidden.
fn hide_secret(line: &str) -> String {
    match line.split_once('=') {
        Some((key, _))
            if ["jaas", "password"]
                .iter()
                .any(|secret| key.to_ascii_lowercase().contains(secret)) =>
        {
            format!("{}=<hidden>", key.trim_end())
        }
        _ => line.to_string(),
    }
}

/// A single-node Apache Kafka, run as Kafka's start script runs it, with an experiment's
/// `server.properties` lines ([`KAFKA_CONF_ENV`]).
async fn start_broker() -> testkafka::LocalBroker {
    testkafka::LocalBroker::start_with(testkafka::ClusterOptions {
        jvm_opts: Some(jvm_opts()),
        properties: extra_lines(KAFKA_CONF_ENV),
        ..Default::default()
    })
    .await
}

/// A fresh database with the workload's outbox table and the publication.
pub async fn create_db(
    admin: &tokio_postgres::Client,
    world: &World,
    w: &Workload,
) -> Res<(String, String)> {
    let db = pg::unique_name(&format!("bench_{}", w.name.replace('-', "_")));
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await?;
    let url = pg::with_dbname(&world.admin_url, &db);
    let sql = pg::connect(&url).await;
    sql.batch_execute(&w.ddl()).await?;
    sql.batch_execute(&format!(
        "CREATE PUBLICATION {PUBLICATION} FOR TABLE outbox WITH (publish = 'insert')"
    ))
    .await?;
    Ok((db, url))
}

pub async fn create_topics(brokers: &str, workload: &str, contenders: &[Contender]) {
    testkafka::create_topic(brokers, kafka::WARMUP_TOPIC, 1).await;
    for c in contenders.iter().filter(|c| **c != Contender::Recv) {
        testkafka::create_topic(brokers, &kafka::topic(workload, c.key()), kafka::PARTITIONS).await;
    }
}

#[cfg(test)]
mod tests {
    use super::split_lines;

    #[test]
    fn settings_split_on_semicolons_and_newlines_and_keep_escaped_ones() {
        assert_eq!(
            split_lines(" a = 1 ;b=2\nc=3;; \n"),
            ["a = 1", "b=2", "c=3"]
        );
        assert_eq!(
            split_lines(r#"sasl.jaas.config=M required user="u" password="p"\;;x=1"#),
            [
                r#"sasl.jaas.config=M required user="u" password="p";"#,
                "x=1"
            ]
        );
        assert_eq!(
            split_lines(r"dir=C:\\tmp;re=\d+\"),
            [r"dir=C:\tmp", r"re=\d+\"]
        );
        assert!(split_lines("").is_empty());
    }

    #[test]
    fn the_report_hides_jaas_and_password_values() {
        use super::hide_secret;
        assert_eq!(
            hide_secret(
                r#"listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=M required password="p";"#
            ),
            "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=<hidden>"
        );
        assert_eq!(
            hide_secret("ssl.key.password = s"),
            "ssl.key.password=<hidden>"
        );
        assert_eq!(hide_secret("log.retention.ms=1"), "log.retention.ms=1");
    }
}
