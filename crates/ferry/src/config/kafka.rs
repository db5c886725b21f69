//! `[kafka]`: brokers, the producer settings Ferry exposes, the librdkafka passthrough, and
//! [`KafkaConfig::producer_properties`], the one place that builds the producer's properties
//! (from which [`crate::kafka_client`] builds every Kafka client's config).
//!
//! Ferry's guarantee rests on a few producer settings, so they are not left to the passthrough:
//! `enable.idempotence=true` (retries neither duplicate nor reorder within a partition),
//! `acks=all` (a delivery report means every in-sync replica has the record), the Java-compatible
//! `murmur2_random` partitioner, and timeouts and queue limits derived from the `[kafka]` keys.
//! [`property_rule`] says, for each property Ferry controls, why it cannot be set and what to set
//! instead.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::defaults;
use super::duration::ConfigDuration;

/// `[kafka]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port`: a comma-separated string or an array. Required.
    pub brokers: Brokers,
    /// librdkafka properties passed through to the producer (string, integer or boolean values),
    /// except those Ferry controls (see [`property_rule`]). Secret ones never print.
    pub properties: KafkaProperties,
    /// librdkafka properties read from files at start-up (`"sasl.password" =
    /// "/var/run/secrets/kafka/password"`), for secrets mounted as files; the trailing newline is
    /// dropped. A property is set here or in `properties`, not both.
    pub property_files: BTreeMap<String, PathBuf>,
    /// Compression of record batches.
    pub compression: Compression,
    /// Most records handed to the producer and not yet acknowledged; the pipeline stops reading
    /// WAL at this bound until deliveries catch up.
    pub max_in_flight_records: u64,
    /// Most bytes of such records: the memory bound. At least `route.max_payload_bytes`. A
    /// number or a size with a unit (`"32MiB"`, see [`ferry_router::size`]).
    #[serde(
        deserialize_with = "ferry_router::size::deserialize",
        serialize_with = "ferry_router::size::serialize"
    )]
    pub max_in_flight_bytes: u64,
    /// How long librdkafka keeps trying to deliver a record (`message.timeout.ms`). After it the
    /// record fails, nothing past it is checkpointed, and the pipeline restarts from the checkpoint.
    pub delivery_timeout: ConfigDuration,
    /// How long librdkafka waits to fill a batch (`linger.ms`).
    pub linger: ConfigDuration,
    /// Ferry's own topic where it remembers its position per slot and server, outside the slot
    /// (see `ferry_core::progress_record`): one partition, compacted.
    pub progress_topic: String,
    /// Exactly-once delivery (issue 11): records go out in Kafka transactions, each carrying a
    /// progress record with the exact position, and a restart skips what a committed one covers.
    /// Needs brokers with transactions; consumers must read with `isolation.level=read_committed`.
    pub exactly_once: bool,
    /// Exactly-once: how long a Kafka transaction collects records at most before it commits,
    /// and the pace of commits (no more than one an interval on average). A transaction whose
    /// records are all acknowledged, with nothing new for 5 ms, commits without waiting for it,
    /// within that pace (see `ferry_core::session::transaction`).
    pub transaction_interval: ConfigDuration,
    /// Exactly-once: a Kafka transaction commits at this many records even before the interval
    /// (at most half the in-flight window: see [`KafkaConfig::transaction_caps`]).
    pub transaction_max_records: u64,
    /// Exactly-once: likewise in record bytes.
    #[serde(
        deserialize_with = "ferry_router::size::deserialize",
        serialize_with = "ferry_router::size::serialize"
    )]
    pub transaction_max_bytes: u64,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: Brokers::default(),
            properties: KafkaProperties::default(),
            property_files: BTreeMap::new(),
            compression: defaults::COMPRESSION,
            max_in_flight_records: defaults::MAX_IN_FLIGHT_RECORDS,
            max_in_flight_bytes: defaults::MAX_IN_FLIGHT_BYTES,
            delivery_timeout: defaults::DELIVERY_TIMEOUT.into(),
            linger: defaults::LINGER.into(),
            progress_topic: defaults::PROGRESS_TOPIC.to_string(),
            exactly_once: defaults::EXACTLY_ONCE,
            transaction_interval: defaults::TRANSACTION_INTERVAL.into(),
            transaction_max_records: defaults::TRANSACTION_MAX_RECORDS,
            transaction_max_bytes: defaults::TRANSACTION_MAX_BYTES,
        }
    }
}

impl KafkaConfig {
    /// The producer's librdkafka configuration, in the order to apply it: `client.id` (`ferry`)
    /// and `reconnect.backoff.ms` (20) with `reconnect.backoff.max.ms` (1000) unless the
    /// passthrough sets them, the passthrough
    /// (`properties`, then `property_files` read now), then every property Ferry controls, last
    /// so that it wins even over an unvalidated passthrough. Holds secrets: never log it (see [`is_secret_property`]). Fails
    /// when a property file cannot be read, with `kafka.property_files."<name>"` and why.
    pub fn producer_properties(&self) -> Result<Vec<(String, String)>, String> {
        let mut out: Vec<(String, String)> = Vec::new();
        let user_sets = |name: &str| {
            self.properties.0.contains_key(name) || self.property_files.contains_key(name)
        };
        if !user_sets("client.id") {
            out.push(("client.id".into(), defaults::CLIENT_ID.into()));
        }
        // librdkafka paces connections to brokers it learned from metadata by half of this
        // (`sparse_connect_intvl`, 50 ms at its default of 100), and the idempotent producer's
        // id waits for such a connection: at 20 ms a cold start's first acknowledgement comes
        // ~14 ms sooner (bench/README.md, "Start-up"). Reconnects after an outage back off
        // exponentially up to `reconnect.backoff.max.ms`, and the records of the partitions a
        // broker leads wait for its connection: at most a second, not librdkafka's ten.
        // A passthrough of one of the two keeps Ferry's other one where librdkafka allows it
        // (the maximum at least the first): a Java client's `reconnect.backoff.ms = 50` alone
        // would otherwise bring back librdkafka's maximum of 10 s. A value that is not a
        // number is the passthrough's to answer for (librdkafka names it).
        let (first, max) = ("reconnect.backoff.ms", "reconnect.backoff.max.ms");
        let number = |name: &str| -> Option<u64> {
            self.properties
                .0
                .get(name)
                .and_then(|v| v.trim().parse().ok())
        };
        match (user_sets(first), user_sets(max)) {
            (false, false) => {
                out.push((first.into(), defaults::RECONNECT_BACKOFF_MS.to_string()));
                out.push((max.into(), defaults::RECONNECT_BACKOFF_MAX_MS.to_string()));
            }
            (true, false) => {
                if let Some(ms) = number(first) {
                    let ms = ms.max(defaults::RECONNECT_BACKOFF_MAX_MS.into());
                    out.push((max.into(), ms.to_string()));
                }
            }
            (false, true) => {
                if let Some(ms) = number(max) {
                    let ms = ms.min(defaults::RECONNECT_BACKOFF_MS.into());
                    out.push((first.into(), ms.to_string()));
                }
            }
            (true, true) => {}
        }
        out.extend(
            self.properties
                .0
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        for (name, path) in &self.property_files {
            let value = super::secret::read_secret_file(path)
                .map_err(|e| format!("kafka.property_files.{name:?}: {e}"))?;
            out.push((name.clone(), value));
        }
        // librdkafka's own queue limits sit above Ferry's (twice, so that the pipeline's
        // in-flight window is what bites). A QueueFull therefore means kafka.properties overrode
        // them: the record is refused and the session ends (transiently), it is not waited out.
        let queue_messages = self
            .max_in_flight_records
            .saturating_mul(2)
            .min(defaults::LIBRDKAFKA_QUEUE_LIMIT);
        let queue_kbytes = self
            .max_in_flight_bytes
            .div_ceil(1024)
            .saturating_mul(2)
            .clamp(1, defaults::LIBRDKAFKA_QUEUE_LIMIT);
        let controlled: [(&str, String); 10] = [
            ("bootstrap.servers", self.brokers.0.join(",")),
            ("enable.idempotence", "true".into()),
            ("acks", "all".into()),
            ("partitioner", "murmur2_random".into()),
            ("compression.codec", self.compression.as_str().into()),
            // librdkafka takes fractions of a millisecond (`500us` is 0.5), as the reader's
            // pause and the reports' gathering, half of it, do.
            (
                "linger.ms",
                (self.linger.as_nanos() as f64 / 1e6).to_string(),
            ),
            (
                "message.timeout.ms",
                self.delivery_timeout.as_millis().to_string(),
            ),
            ("queue.buffering.max.messages", queue_messages.to_string()),
            ("queue.buffering.max.kbytes", queue_kbytes.to_string()),
            // A record for a topic the brokers lack waits for it (the topic watch says so
            // loudly) instead of failing after librdkafka's default 30 s.
            (
                "topic.metadata.propagation.max.ms",
                defaults::TOPIC_WAIT_MS.to_string(),
            ),
        ];
        out.extend(controlled.into_iter().map(|(k, v)| (k.to_owned(), v)));
        if self.exactly_once {
            // librdkafka refuses a message timeout above the transaction timeout (0, never, is
            // above it); a record cannot outlive its transaction anyway: a timed-out record
            // aborts the transaction, and it is replayed from the last committed position.
            let txn = defaults::TRANSACTION_TIMEOUT;
            let message = if self.delivery_timeout.is_zero() {
                txn
            } else {
                self.delivery_timeout.get().min(txn)
            };
            out.push(("message.timeout.ms".into(), message.as_millis().to_string()));
            out.push(("transaction.timeout.ms".into(), txn.as_millis().to_string()));
        }
        Ok(out)
    }

    /// The records and bytes a Kafka transaction collects at most: the configured caps, clamped
    /// to half the in-flight window. The transactional sink holds every report until its commit,
    /// so a transaction must commit before the window fills with held reports, or reading would
    /// stop for good.
    pub fn transaction_caps(&self) -> (u64, u64) {
        (
            self.transaction_max_records
                .min(self.max_in_flight_records / 2)
                .max(1),
            self.transaction_max_bytes
                .min(self.max_in_flight_bytes / 2)
                .max(1),
        )
    }

    /// The producer's properties for exactly-once mode: [`Self::producer_properties`] plus the
    /// `transactional.id`, derived from what the producer writes for (the server's system
    /// identifier and the slot), so that a second Ferry on the same slot fences the first.
    pub fn transactional_properties(
        &self,
        base: &[(String, String)],
        system_id: u64,
        slot: &str,
    ) -> Vec<(String, String)> {
        let mut out = base.to_vec();
        out.push(("transactional.id".into(), transactional_id(system_id, slot)));
        out
    }
}

/// The `transactional.id` of the Ferry that streams `slot` of the server `system_id`.
pub fn transactional_id(system_id: u64, slot: &str) -> String {
    format!("ferry-{system_id}-{slot}")
}

/// Bootstrap brokers. Deserialized from `"a:9092,b:9092"` or `["a:9092", "b:9092"]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Brokers(pub Vec<String>);

impl FromStr for Brokers {
    type Err = String;
    /// A comma-separated list; blanks around entries are dropped, an all-blank string is empty.
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().is_empty() {
            return Ok(Brokers(Vec::new()));
        }
        Ok(Brokers(s.split(',').map(|b| b.trim().to_owned()).collect()))
    }
}

impl Serialize for Brokers {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Brokers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(String),
            Many(Vec<String>),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("expected a comma-separated string or an array of strings")
        })? {
            Raw::One(s) => Ok(s.parse().unwrap_or_default()),
            Raw::Many(v) => Ok(Brokers(
                v.into_iter().map(|b| b.trim().to_owned()).collect(),
            )),
        }
    }
}

/// `kafka.compression`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// No compression.
    None,
    /// gzip: small, slow.
    Gzip,
    /// snappy: fast, larger.
    Snappy,
    /// lz4: fast and small (the default).
    Lz4,
    /// zstd: smallest; needs brokers 2.1 or later and a librdkafka built with it (rdkafka's
    /// `zstd` feature), which [`Compression::is_available`] checks.
    Zstd,
}

impl Compression {
    /// The librdkafka (and configuration) spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

impl Compression {
    /// Whether the linked librdkafka can use this codec (its `builtin.features`; zstd, for one,
    /// needs rdkafka's `zstd` feature at build time).
    pub fn is_available(self) -> bool {
        self == Compression::None || builtin_features().iter().any(|f| f == self.as_str())
    }
}

/// The linked librdkafka's `builtin.features` (`gzip`, `snappy`, `lz4`, `ssl`, ...).
pub fn builtin_features() -> Vec<String> {
    crate::kafka_client::config(&[], crate::kafka_client::Role::Verbatim)
        .create_native_config()
        .and_then(|native| native.get("builtin.features"))
        .map(|list| list.split(',').map(|f| f.trim().to_owned()).collect())
        .unwrap_or_default()
}

impl FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Compression::None),
            "gzip" => Ok(Compression::Gzip),
            "snappy" => Ok(Compression::Snappy),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            other => Err(format!(
                "unknown compression {other:?}; expected none, gzip, snappy, lz4 or zstd"
            )),
        }
    }
}

/// `kafka.properties`: librdkafka property name to value. `Debug` hides secret values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaProperties(pub BTreeMap<String, String>);

impl fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| {
                let shown = if is_secret_property(k) { "***" } else { v };
                (k, shown)
            }))
            .finish()
    }
}

/// Secret values serialize as [`super::secret::REDACTED`], so `ferry config show` never prints
/// them.
impl Serialize for KafkaProperties {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| {
            let shown = if is_secret_property(k) {
                super::secret::REDACTED
            } else {
                v
            };
            (k, shown)
        }))
    }
}

impl<'de> Deserialize<'de> for KafkaProperties {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// One value: a string, or an integer or boolean taken as its text.
        struct Value(String);
        impl<'de> Deserialize<'de> for Value {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(ValueVisitor)
            }
        }
        struct ValueVisitor;
        impl serde::de::Visitor<'_> for ValueVisitor {
            type Value = Value;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a librdkafka property value: a string, integer or boolean")
            }
            fn visit_str<E>(self, v: &str) -> Result<Value, E> {
                Ok(Value(v.to_owned()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
                Ok(Value(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
                Ok(Value(v.to_string()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
                Ok(Value(v.to_string()))
            }
        }
        let raw = BTreeMap::<String, Value>::deserialize(d)?;
        Ok(KafkaProperties(
            raw.into_iter().map(|(k, v)| (k, v.0)).collect(),
        ))
    }
}

/// Whether a librdkafka property holds a secret (passwords, client secrets, private keys, the
/// OAUTHBEARER config): its value is never printed.
pub fn is_secret_property(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "password",
        "secret",
        "passphrase",
        "key.pem",
        "sasl.oauthbearer.config",
        "sasl.jaas.config",
    ]
    .iter()
    .any(|s| name.contains(s))
}

/// Properties settable only through librdkafka's C API (callbacks, opaques, in-memory keys).
const API_ONLY: &[&str] = &[
    "background_event_cb",
    "closesocket_cb",
    "connect_cb",
    "consume_cb",
    "default_topic_conf",
    "dr_cb",
    "dr_msg_cb",
    "error_cb",
    "interceptors",
    "log_cb",
    "msg_order_cmp",
    "oauthbearer_token_refresh_cb",
    "offset_commit_cb",
    "opaque",
    "open_cb",
    "partitioner_cb",
    "rebalance_cb",
    "resolve_cb",
    "socket_cb",
    "ssl.certificate.verify_cb",
    "ssl_ca",
    "ssl_certificate",
    "ssl_engine_callback_data",
    "ssl_key",
    "stats_cb",
    "throttle_cb",
];

/// Why `name = value` may not be passed through, or `None` if it may. Names compare
/// case-insensitively.
pub fn property_rule(name: &str, value: &str) -> Option<String> {
    let lower = name.trim().to_ascii_lowercase();
    let fixed = |what: &str, why: &str| Some(format!("Ferry always sets {what}: {why}"));
    let use_key = |key: &str| Some(format!("set by Ferry from kafka.{key}; set that instead"));
    match lower.as_str() {
        "" => Some("an empty property name".to_owned()),
        "enable.idempotence" => fixed(
            "enable.idempotence=true",
            "without it a retried batch can be duplicated or reordered within a partition",
        ),
        "acks" | "request.required.acks" => fixed(
            "acks=all",
            "a delivery report must mean every in-sync replica has the record before its LSN is checkpointed",
        ),
        "partitioner" => fixed(
            "partitioner=murmur2_random",
            "the Java client's partitioner, so a key lands on the same partition as with Java producers and Debezium",
        ),
        "max.in.flight.requests.per.connection" | "max.in.flight" => match value.trim().parse::<u32>() {
            Ok(1..=5) => None,
            _ => Some(format!(
                "must be 1 to 5 (got {value:?}): the idempotent producer keeps order only with at most 5 requests in flight per connection"
            )),
        },
        "queuing.strategy" => fixed("FIFO queuing", "any other order reorders records within a partition"),
        "enable.gapless.guarantee" => Some(
            "not supported: experimental in librdkafka, and it makes a failed batch a fatal producer error; \
             Ferry already never checkpoints past a failed record and replays it after restarting"
                .to_owned(),
        ),
        "transactional.id" => Some(
            "Ferry derives it from the server's system identifier and the slot in exactly-once mode (so that \
             a second Ferry on the slot fences the first); set kafka.exactly_once = true instead"
                .to_owned(),
        ),
        "transaction.timeout.ms" => Some(format!(
            "Ferry sets it to {}s in exactly-once mode, far above kafka.transaction_interval; set that instead",
            super::defaults::TRANSACTION_TIMEOUT.as_secs()
        )),
        "bootstrap.servers" | "metadata.broker.list" => use_key("brokers"),
        "delivery.report.only.error" => Some(
            "Ferry needs the report of every delivered record to advance its checkpoint; with this set it would never advance"
                .to_owned(),
        ),
        "compression.codec" | "compression.type" => use_key("compression"),
        "linger.ms" | "queue.buffering.max.ms" => use_key("linger"),
        "message.timeout.ms" | "delivery.timeout.ms" => use_key("delivery_timeout"),
        "queue.buffering.max.messages" => use_key("max_in_flight_records"),
        "queue.buffering.max.kbytes" => use_key("max_in_flight_bytes"),
        "topic.metadata.propagation.max.ms" => fixed(
            "topic.metadata.propagation.max.ms=1800000",
            "a record for a missing topic waits for it (reported as missing) for 30 minutes rather than failing after 30 s; \
             set route.create_topics to have Ferry create topics",
        ),
        other if API_ONLY.contains(&other) => Some(
            "set through librdkafka's API, not a property; Ferry installs its own".to_owned(),
        ),
        _ => None,
    }
}
