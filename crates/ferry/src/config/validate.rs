//! [`Config::validate`](super::Config::validate)'s rules: every problem, with its key path.

use std::time::Duration;

use ferry_router::ConfigProblem;
use ferry_wal::conn::ConnectConfig;

use super::duration::{self, ConfigDuration};
use super::secret::REDACTED;
use super::{defaults, property_rule, Compression, Config};

/// Every problem, in file order: `[postgres]`, `[outbox]`/`[route]`/`[[tables]]` (the router's
/// own rules),
/// `[kafka]`, `[log]`, `[shutdown]`. (`[http]` is checked while parsing.)
pub(super) fn problems(c: &Config) -> Vec<ConfigProblem> {
    let mut p = Problems(Vec::new());
    postgres(c, &mut p);
    if let Err(e) = ferry_router::validate_tables(&c.outbox, &c.route, &c.tables) {
        p.0.extend(e.problems);
    }
    kafka(c, &mut p);
    if let Err(e) = crate::telemetry::logging::filter(&c.log.level, None) {
        p.add("log.level", e.to_string());
    }
    p.positive("shutdown.drain_timeout", c.shutdown.drain_timeout);
    super::inbox::problems(&c.inbox, &mut p);
    p.0
}

pub(super) struct Problems(Vec<ConfigProblem>);

impl Problems {
    pub(super) fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigProblem {
            path: path.into(),
            message: message.into(),
        });
    }

    pub(super) fn positive(&mut self, path: &str, d: ConfigDuration) {
        if d.is_zero() {
            self.add(path, "must be greater than 0s");
        }
    }

    fn at_most(&mut self, path: &str, d: ConfigDuration, max: Duration, why: &str) {
        if d.get() > max {
            let max = duration::format(max);
            self.add(path, format!("must be at most {max}: {why}"));
        }
    }
}

/// The shortest `postgres.receive_timeout` other than 0s.
const MIN_RECEIVE_TIMEOUT: Duration = Duration::from_secs(1);

fn postgres(c: &Config, p: &mut Problems) {
    let pg = &c.postgres;
    if pg.url.is_empty() {
        p.add(
            "postgres.url",
            "required: a libpq URL like postgres://ferry@db.example.com:5432/app?sslmode=verify-full (or FERRY_POSTGRES_URL)",
        );
    } else if pg.url.expose().contains(REDACTED) {
        p.add(
            "postgres.url",
            format!("holds the placeholder {REDACTED} that `ferry config show` prints for the password: put the password back, or set postgres.password_file"),
        );
    } else if let Err(e) = ConnectConfig::parse(pg.url.expose()) {
        p.add(
            "postgres.url",
            without_secrets(&e.to_string(), pg.url.expose(), &pg.url.redacted()),
        );
    }
    if let Some(path) = &pg.password_file {
        if let Err(e) = super::secret::read_secret_file(path) {
            p.add("postgres.password_file", e);
        } else if ConnectConfig::parse(pg.url.expose()).is_ok_and(|c| c.password.is_some()) {
            p.add(
                "postgres.password_file",
                "postgres.url holds a password too: keep one of them",
            );
        }
    }
    if pg.slot.is_empty()
        || pg.slot.len() > defaults::MAX_NAME_BYTES
        || !pg
            .slot
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        p.add(
            "postgres.slot",
            format!(
                "invalid slot name {:?}: 1 to {} lower-case letters, digits and underscores",
                pg.slot,
                defaults::MAX_NAME_BYTES
            ),
        );
    }
    if pg.publication.is_empty()
        || pg.publication.len() > defaults::MAX_NAME_BYTES
        || pg.publication.contains('\0')
    {
        p.add(
            "postgres.publication",
            format!(
                "must be 1 to {} bytes without NUL",
                defaults::MAX_NAME_BYTES
            ),
        );
    }
    p.positive("postgres.status_interval", pg.status_interval);
    p.at_most(
        "postgres.status_interval",
        pg.status_interval,
        defaults::MAX_STATUS_INTERVAL,
        "the server drops a client that sends no status update within wal_sender_timeout (60s by default)",
    );
    if !pg.receive_timeout.is_zero() && pg.receive_timeout.get() < MIN_RECEIVE_TIMEOUT {
        p.add(
            "postgres.receive_timeout",
            format!(
                "must be 0s (never) or at least {}: shorter, the ordinary gaps between the \
                 server's messages would end sessions",
                duration::format(MIN_RECEIVE_TIMEOUT)
            ),
        );
    }
    p.positive("postgres.connect_timeout", pg.connect_timeout);
    p.positive("postgres.reconnect_backoff_min", pg.reconnect_backoff_min);
    if pg.reconnect_backoff_max < pg.reconnect_backoff_min {
        p.add(
            "postgres.reconnect_backoff_max",
            format!(
                "must be at least postgres.reconnect_backoff_min ({})",
                pg.reconnect_backoff_min
            ),
        );
    }
    p.positive("postgres.standby_poll_interval", pg.standby_poll_interval);
}

fn kafka(c: &Config, p: &mut Problems) {
    let k = &c.kafka;
    if c.route.position_headers && !k.exactly_once && !k.delivery_timeout.is_zero() {
        p.add(
            "kafka.delivery_timeout",
            "must be 0s (records never time out) with route.position_headers in at-least-once mode: \
             the inbox drops a record at or below its source's highest position, which is exact only \
             if no record lands after a later one, and a timed-out record could (README, \"The inbox\"); \
             set kafka.delivery_timeout = \"0s\", or kafka.exactly_once = true",
        );
    }
    if k.brokers.0.is_empty() {
        p.add(
            "kafka.brokers",
            "must not be empty: give host:port of one or more brokers (or FERRY_KAFKA_BROKERS)",
        );
    }
    for (i, b) in k.brokers.0.iter().enumerate() {
        if b.is_empty() || b.contains(char::is_whitespace) || b.contains(',') {
            p.add(
                format!("kafka.brokers[{i}]"),
                format!("invalid broker {b:?}: expected host:port"),
            );
        }
    }
    if let Err(problem) = ferry_router::topic::validate_topic(k.progress_topic.as_bytes()) {
        p.add(
            "kafka.progress_topic",
            format!(
                "{:?} is not a valid topic name: {problem}",
                k.progress_topic
            ),
        );
    }
    if !k.compression.is_available() {
        let available: Vec<&str> = [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ]
        .into_iter()
        .filter(|c| c.is_available())
        .map(Compression::as_str)
        .collect();
        p.add(
            "kafka.compression",
            format!(
                "{} is not built into this librdkafka; use one of: {}",
                k.compression.as_str(),
                available.join(", ")
            ),
        );
    }
    for (name, value) in &k.properties.0 {
        if let Some(why) = property_rule(name, value) {
            p.add(format!("kafka.properties.{name:?}"), why);
        } else if value == REDACTED {
            p.add(
                format!("kafka.properties.{name:?}"),
                format!("holds the placeholder {REDACTED} that `ferry config show` prints for a secret: put the value back, or read it from a file with kafka.property_files"),
            );
        }
    }
    for (name, path) in &k.property_files {
        let at = format!("kafka.property_files.{name:?}");
        if let Some(why) = property_rule(name, "") {
            p.add(at, why);
        } else if k.properties.0.contains_key(name) {
            p.add(
                at,
                format!("kafka.properties sets {name:?} too: keep one of them"),
            );
        } else if let Err(e) = super::secret::read_secret_file(path) {
            p.add(at, e);
        }
    }
    if k.max_in_flight_records == 0
        || k.max_in_flight_records > defaults::LIBRDKAFKA_QUEUE_LIMIT / 2
    {
        p.add(
            "kafka.max_in_flight_records",
            format!("must be 1 to {}", defaults::LIBRDKAFKA_QUEUE_LIMIT / 2),
        );
    }
    let routes = std::iter::once(&c.route).chain(c.tables.iter().map(|t| &t.route));
    for (i, route) in routes.enumerate() {
        let max_payload = u64::try_from(route.max_payload_bytes).unwrap_or(u64::MAX);
        if k.max_in_flight_bytes < max_payload {
            let key = format!(
                "{}route.max_payload_bytes",
                ferry_router::tables::key_prefix(i)
            );
            p.add(
                "kafka.max_in_flight_bytes",
                format!(
                    "must be at least {key} ({max_payload}), or the largest record could never be sent"
                ),
            );
        }
    }
    let max_bytes = defaults::MAX_IN_FLIGHT_BYTES_LIMIT;
    if k.max_in_flight_bytes > max_bytes {
        p.add(
            "kafka.max_in_flight_bytes",
            format!("must be at most {max_bytes}"),
        );
    }
    p.at_most(
        "kafka.linger",
        k.linger,
        defaults::MAX_LINGER,
        "librdkafka's limit for linger.ms",
    );
    if !k.delivery_timeout.is_zero() && k.delivery_timeout <= k.linger {
        p.add(
            "kafka.delivery_timeout",
            format!(
                "must be 0 (never time out, the default) or longer than kafka.linger ({}): librdkafka refuses a message timeout that does not exceed linger.ms",
                k.linger
            ),
        );
    }
    p.at_most(
        "kafka.delivery_timeout",
        k.delivery_timeout,
        defaults::MAX_DELIVERY_TIMEOUT,
        "librdkafka's limit for message.timeout.ms",
    );
    exactly_once(k, p);
}

/// The exactly-once keys (checked whether or not the mode is on, so a later switch does not
/// meet a surprise).
fn exactly_once(k: &super::kafka::KafkaConfig, p: &mut Problems) {
    if k.transaction_interval.get() < defaults::MIN_TRANSACTION_INTERVAL
        || k.transaction_interval.get() > defaults::MAX_TRANSACTION_INTERVAL
    {
        p.add(
            "kafka.transaction_interval",
            format!(
                "must be {} to {}: a tenth of the transaction timeout Ferry asks for ({}) at most, so a commit never nears it",
                duration::format(defaults::MIN_TRANSACTION_INTERVAL),
                duration::format(defaults::MAX_TRANSACTION_INTERVAL),
                duration::format(defaults::TRANSACTION_TIMEOUT),
            ),
        );
    }
    if k.transaction_max_records == 0 {
        p.add("kafka.transaction_max_records", "must be at least 1");
    }
    if k.transaction_max_bytes == 0 {
        p.add("kafka.transaction_max_bytes", "must be at least 1");
    }
    if k.exactly_once
        && !k.delivery_timeout.is_zero()
        && k.delivery_timeout.get() > defaults::TRANSACTION_TIMEOUT
    {
        p.add(
            "kafka.delivery_timeout",
            format!(
                "must be 0 or at most the transaction timeout ({}) with kafka.exactly_once: a record cannot outlive its transaction",
                duration::format(defaults::TRANSACTION_TIMEOUT)
            ),
        );
    }
}

/// `message` with every quoted fragment that shows part of the password masked: a fragment may
/// be shown only if the redacted connection string shows it too.
fn without_secrets(message: &str, raw: &str, redacted: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(open) = rest.find('"') {
        let Some(len) = rest[open + 1..].find('"') else {
            break;
        };
        let fragment = &rest[open + 1..open + 1 + len];
        out.push_str(&rest[..=open]);
        if !fragment.is_empty() && raw.contains(fragment) && !redacted.contains(fragment) {
            out.push_str("***");
        } else {
            out.push_str(fragment);
        }
        out.push('"');
        rest = &rest[open + len + 2..];
    }
    out.push_str(rest);
    out
}
