//! Contender `debezium`: what Ferry replaces. Kafka Connect 4.3.1 standalone with Debezium
//! 3.6.1's PostgreSQL connector and its Outbox Event Router, started by
//! [`ferry_testkit::debezium`] with the JVM options of Kafka's `connect-standalone.sh`, reading
//! its own slot of the same publication (pgoutput, the slot and publication made beforehand,
//! `snapshot.mode=no_data`: it streams from where the slot was created) and routing every row
//! to the same broker, `${routedByValue}.<workload>.debezium` = `order.<workload>.debezium`.
//!
//! The connector is named on the worker's command line, as `connect-standalone.sh
//! worker.properties outbox.properties` does, so a drain is measured *from process start*: JVM
//! start, the worker, the connector's checks and its replication connection are in the figure.
//! Debezium confirms its position in the slot lazily (an offset flush, then the next message),
//! so the end is **Kafka holding all N records**: the topic's high watermarks, summed over its
//! partitions, polled every 5 ms ([`crate::kafka::Watch`]). CPU (user + system of the JVM, all
//! threads) and peak RSS (`VmHWM`) are read from `/proc` at that moment.
//!
//! Settings: Debezium's and Connect's defaults, except the producer settings every contender
//! shares ([`worker_properties`]) and the converters (`StringConverter` for key and value: the
//! payload's jsonb text as the value, as Ferry's `as_stored`). `extended.headers.enabled` stays
//! at its default. The testkit's `offset.flush.interval.ms=1000` (Connect's default is 60 s)
//! only changes how often offsets are written, not what is sent.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferry_testkit::debezium::{
    outbox_connector, Connect, ConnectOptions, CONNECT_JVM_OPTS_ENV, CONNECT_SCRIPT_JVM_OPTS,
    DEBEZIUM_VERSION, TEST_JVM_OPTS,
};

use crate::kafka::{self, Watch};
use crate::workload::Kind;
use crate::{procfs, Res, Sample, PUBLICATION};

/// The connector's name (and its properties file's).
pub const NAME: &str = "outbox";
/// The Kafka Connect version `.ci/install-debezium` installs with Debezium.
pub const CONNECT_VERSION: &str = "4.3.1";
/// How long a drain may take before the benchmark gives up.
const DRAIN_DEADLINE: Duration = Duration::from_secs(1800);

static SMOKE: AtomicBool = AtomicBool::new(false);

/// A smoke run checks the harness, not Debezium's speed: its workers start with the tests'
/// JVM options (the client compiler, a small heap), a few seconds sooner each.
pub fn set_smoke(smoke: bool) {
    SMOKE.store(smoke, Ordering::Relaxed);
}

/// The JVM's options: `FERRY_TEST_CONNECT_JVM_OPTS`, else those of `connect-standalone.sh`
/// (a smoke run: the tests').
pub fn jvm_opts() -> String {
    std::env::var(CONNECT_JVM_OPTS_ENV).unwrap_or_else(|_| {
        match SMOKE.load(Ordering::Relaxed) {
            true => TEST_JVM_OPTS,
            false => CONNECT_SCRIPT_JVM_OPTS,
        }
        .to_string()
    })
}

/// "Debezium 3.6.1.Final on Kafka Connect 4.3.1 standalone, JVM: ..." for the report.
pub fn version() -> String {
    format!(
        "Debezium {DEBEZIUM_VERSION} (PostgreSQL connector, Outbox Event Router) on Kafka Connect \
         {CONNECT_VERSION} standalone, {}, JVM: {}",
        crate::machine::java_version(),
        jvm_opts()
    )
}

/// The worker's producer settings: those every contender produces with (Ferry's: this run's
/// codec, `linger.ms=1`, `acks=all`, idempotence). The rest is Connect's default for a source
/// task's producer (`max.in.flight.requests.per.connection=1`, `batch.size=16384`, ...).
pub fn worker_properties() -> Vec<String> {
    vec![
        format!("producer.compression.type={}", kafka::compression()),
        "producer.linger.ms=1".into(),
        "producer.acks=all".into(),
        "producer.enable.idempotence=true".into(),
    ]
}

/// The outbox connector on `slot` of the database at `db_url`, routing to
/// `order.<suffix>` (the rows' `aggregatetype` is `order`). The value is the payload as stored:
/// a jsonb payload's text (`StringConverter`), a bytea payload's bytes (`ByteArrayConverter`;
/// the `StringConverter` would write Java's `[B@...` for them).
pub fn connector(
    db_url: &str,
    slot: &str,
    suffix: &str,
    kind: Kind,
) -> Res<BTreeMap<String, String>> {
    let cfg: tokio_postgres::Config = db_url.parse()?;
    let host = match cfg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => return Err("Debezium needs a TCP host in the PostgreSQL URL".into()),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let dbname = cfg.get_dbname().ok_or("no database name in the URL")?;
    let user = cfg.get_user().ok_or("no user in the URL")?;
    let mut c = outbox_connector(
        (&host, port, dbname, user),
        slot,
        PUBLICATION,
        "public.outbox",
    );
    if let Some(p) = cfg.get_password() {
        c.insert(
            "database.password".into(),
            String::from_utf8_lossy(p).into_owned(),
        );
    }
    c.insert(
        "transforms.outbox.route.topic.replacement".into(),
        format!("${{routedByValue}}.{suffix}"),
    );
    let string = "org.apache.kafka.connect.storage.StringConverter";
    c.insert("key.converter".into(), string.into());
    let value = match kind {
        Kind::Jsonb => string,
        Kind::Bytea => "org.apache.kafka.connect.converters.ByteArrayConverter",
    };
    c.insert("value.converter".into(), value.into());
    Ok(c)
}

/// Starts a worker with the connector; returns once its REST API answers (the connector starts
/// meanwhile: [`Connect::started`] is the spawn). `dir`: where it keeps its offsets (a
/// restart names the same one).
pub async fn start(
    brokers: impl AsRef<str>,
    dir: Option<PathBuf>,
    connector: BTreeMap<String, String>,
) -> Connect {
    let mut o = ConnectOptions::new(brokers.as_ref());
    o.worker = worker_properties();
    o.jvm_opts = Some(jvm_opts());
    o.dir = dir;
    o.connectors = vec![(NAME.into(), connector)];
    Connect::start(o).await
}

/// Fails when the worker exited, or (asked at most once a second) the connector failed.
pub struct Health<'a> {
    connect: &'a Connect,
    asked: Instant,
}

impl<'a> Health<'a> {
    pub fn new(connect: &'a Connect) -> Health<'a> {
        Health {
            connect,
            asked: Instant::now(),
        }
    }

    pub fn check(&mut self) -> Res<()> {
        self.connect.check_alive()?;
        if self.asked.elapsed() > Duration::from_secs(1) {
            self.asked = Instant::now();
            if let Some(f) = self.connect.status(NAME).and_then(|s| s.failure()) {
                return Err(format!(
                    "Debezium: {f}\nworker log ({}):\n{}",
                    self.connect.dir().display(),
                    self.connect.log_tail(40)
                )
                .into());
            }
        }
        Ok(())
    }
}

/// Drains the backlog (`rows` rows) on `slot` into `order.<workload>.debezium`: from the JVM's
/// spawn until Kafka holds all `rows` records.
pub async fn drain(
    db_url: &str,
    brokers: &str,
    slot: &str,
    workload: &str,
    kind: Kind,
    rows: u64,
) -> Res<Sample> {
    let topic = kafka::topic(workload, "debezium");
    let config = connector(db_url, slot, &format!("{workload}.debezium"), kind)?;
    let mut watch = Watch::start(brokers, &topic, rows as i64)?;
    if watch.base != 0 {
        return Err(format!("{topic} already holds {} records", watch.base).into());
    }
    let connect = start(brokers, None, config).await;
    let t0 = connect.started();
    let mut health = Health::new(&connect);
    let seen = watch
        .wait_all(DRAIN_DEADLINE, || health.check())
        .await
        .map_err(|e| format!("Debezium draining {topic}: {e}"))?;
    let pid = connect.pid().ok_or("Debezium's worker is gone")?;
    let cpu = procfs::cpu_seconds(pid)?;
    let peak_rss_kib = procfs::peak_rss_kib(pid)?;
    let wire_bytes = procfs::tcp_bytes_acked(pid, brokers);
    connect.kill();
    let all = (seen.all.ok_or("no end")? - t0).as_secs_f64();
    let first = seen.first.map(|f| (f - t0).as_secs_f64());
    Ok(Sample {
        secs: all,
        cpu: Some(cpu),
        peak_rss_kib: Some(peak_rss_kib),
        first_ack: first,
        last_ack: None,
        wire_bytes,
        kafka_first: first,
        kafka_all: Some(all),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connector_reads_the_same_slot_publication_and_topic_as_ferry() {
        let c = connector(
            "postgres://postgres:secret@127.0.0.1:5433/bench_x",
            "bench_debezium_0",
            "backlog-1k.debezium",
            Kind::Jsonb,
        )
        .unwrap();
        let get = |k: &str| c.get(k).map(String::as_str);
        assert_eq!(get("database.hostname"), Some("127.0.0.1"));
        assert_eq!(get("database.port"), Some("5433"));
        assert_eq!(get("database.dbname"), Some("bench_x"));
        assert_eq!(get("database.user"), Some("postgres"));
        assert_eq!(get("database.password"), Some("secret"));
        assert_eq!(get("slot.name"), Some("bench_debezium_0"));
        assert_eq!(get("publication.name"), Some(PUBLICATION));
        assert_eq!(get("plugin.name"), Some("pgoutput"));
        assert_eq!(
            get("transforms.outbox.route.topic.replacement"),
            Some("${routedByValue}.backlog-1k.debezium")
        );
        assert_eq!(
            get("value.converter"),
            Some("org.apache.kafka.connect.storage.StringConverter")
        );
        // Debezium's default, not set.
        assert_eq!(get("extended.headers.enabled"), None);
        assert!(connector("postgres://u@%2Ftmp/db", "s", "x", Kind::Jsonb).is_err());
        let b = connector("postgres://u@h/db", "s", "x", Kind::Bytea).unwrap();
        assert_eq!(
            b.get("value.converter").map(String::as_str),
            Some("org.apache.kafka.connect.converters.ByteArrayConverter")
        );
    }

    #[test]
    fn the_worker_produces_with_the_shared_settings() {
        let w = worker_properties();
        for p in [
            "producer.linger.ms=1",
            "producer.acks=all",
            "producer.enable.idempotence=true",
        ] {
            assert!(w.iter().any(|x| x == p), "{p}");
        }
        assert!(w
            .iter()
            .any(|x| x.starts_with("producer.compression.type=")));
    }
}
