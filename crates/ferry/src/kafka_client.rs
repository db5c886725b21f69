//! Every Kafka client Ferry creates gets its librdkafka configuration from [`config`], here.
//!
//! # Two layers
//!
//! 1. [`KafkaConfig::producer_properties`](crate::config::KafkaConfig::producer_properties)
//!    turns `[kafka]` into one list of properties: Ferry's defaults (`client.id`,
//!    `reconnect.backoff.ms`, `reconnect.backoff.max.ms`), the user's passthrough (`kafka.properties`,
//!    `kafka.property_files`), then every property Ferry controls, last so that it wins:
//!    `bootstrap.servers`, `enable.idempotence=true`, `acks=all`, the `murmur2_random`
//!    partitioner, compression, linger, timeouts and queue limits (and in exactly-once mode
//!    `transaction.timeout.ms`). That list is the relay producer's configuration, and the
//!    connection settings (brokers, TLS, SASL) every other client shares. It is what every
//!    caller here passes as `properties` (in exactly-once mode with the `transactional.id`
//!    added by the transactional sink, and `ferry check` adds a throwaway one).
//! 2. [`config`] builds a client of one [`Role`] from that list: it copies the list and applies
//!    the role's fixed settings. No other code calls `ClientConfig::new()`.
//!
//! # Roles
//!
//! | role | client, where | what it sets, and why |
//! |---|---|---|
//! | [`Role::Producer`] | the relay's producer, idempotent or transactional ([`crate::producer::Producer::new`]) | `statistics.interval.ms` = [`STATISTICS_INTERVAL_MS`] unless the properties set it: the brokers' view (`ferry_kafka_brokers_up`, `/readyz`) comes from the statistics; `message.copy.max.bytes` = [`MESSAGE_COPY_MAX_BYTES`] unless they set it: a value above it goes into the produce request by reference to librdkafka's copy, not copied again |
//! | [`Role::BrokerProbe`] | the bootstrap probe ([`crate::kafka_access::probe`]) | drops `transactional.id`; `enable.idempotence=false` (an idempotent client adds connection requests of its own); `reconnect.backoff.ms=500`, `reconnect.backoff.max.ms=10000` (attempts 250 ms apart); `enable.sparse.connections=false` (the first metadata response retires the bootstrap broker and fails the request it carried: the retry needs a learned broker, which a sparse client would connect to only after 250 ms); `allow.auto.create.topics=false` (it asks for the progress topic's metadata, which must not create it); adds `broker` to the user's `debug` contexts (the state changes tell an accepted connection from a refused one); log level Debug (so the debug lines reach the client's context) |
//! | [`Role::ApiVersionsProbe`] | the transactions API probe ([`crate::txn_probe::probe`]) | drops `transactional.id` (it initialises nothing) and the user's `debug`; `debug=feature` (the ApiVersions lines it judges); `allow.auto.create.topics=false` (its metadata request names the progress topic); log level Debug |
//! | [`Role::TopicWatchAdmin`] | the topic watch's admin client (made by the watch's thread when it first asks, [`crate::topics`]) | drops `enable.idempotence` (an admin client is a producer inside librdkafka and would ask for a producer id) and `transactional.id` |
//! | [`Role::TopicWatchMetadata`] | the topic watch's metadata consumer (same) | drops [`PRODUCER_ONLY`] (each would log a warning on a consumer); `allow.auto.create.topics=false` (asking for a topic's metadata must not create it) |
//! | [`Role::ProgressTopic`] | the progress topic's admin client and metadata consumer ([`crate::progress_topic::ensure_topic`]; a first start's admin client is made when the broker probe answers, [`crate::progress_topic::Admin::ahead`]) | drops [`PRODUCER_ONLY`], `transactional.id`, `transaction.timeout.ms`; `enable.sparse.connections=false` (a client that lives for one request connects to the brokers at once: 55 -> 5 ms; one made ahead has usually connected to the broker CreateTopics goes to by the time it is sent) |
//! | [`Role::ProgressReader`] | the progress topic's reader, which also asks the partition's leader for the log's start and end with ListOffsets through the Admin API on its own handle ([`crate::progress_topic::read`], [`crate::progress_topic::read_slot`], [`crate::progress_topic::read_slot_open`], whose read [`crate::progress_topic::Cursor::read`] takes up later on the same client) | [`Role::ProgressTopic`]'s settings, and `allow.auto.create.topics=false`, `enable.auto.commit=false`, `enable.auto.offset.store=false`, `enable.partition.eof=false`, `auto.offset.reset=earliest` (it assigns the partition and reads it from its start, or a read taken up from where it ended, committing nothing), `fetch.wait.max.ms=10` (a read taken up asks ListOffsets on the connection a waiting fetch holds), `isolation.level=read_committed` (never an aborted record; its ListOffsets requests carry their own isolation level); `group.id=ferry-progress-reader` unless the properties set one (assign() needs no group, librdkafka wants one anyway) |
//! | [`Role::InboxConsumer`] | `ferry inbox`'s group consumer ([`crate::inbox`]) | drops what [`Role::ProgressTopic`] drops; `allow.auto.create.topics=false`, `enable.auto.commit=false`, `enable.auto.offset.store=false` (the database holds the offsets; Kafka's are advice written after each commit), `enable.partition.eof=false`, `isolation.level=read_committed` (never an aborted record), `auto.offset.reset=earliest` (an offset lost to retention resumes at the oldest record left) |
//! | [`Role::Verbatim`] | `ferry check`'s metadata producer, broker admin client and throwaway transactional producer ([`crate::check`]); [`crate::config::builtin_features`] (no properties: librdkafka's defaults) | nothing: the properties as given |
//!
//! # Precedence
//!
//! [`config`] applies, in this order: the role's defaults, the `properties` in their order (a
//! property given twice: the later wins), the role's dropped properties, the role's fixed
//! settings, then the `debug` contexts the role adds to whatever `debug` is by then. So a
//! default yields to the properties (`statistics.interval.ms` and `message.copy.max.bytes` for
//! [`Role::Producer`], `group.id` for [`Role::ProgressReader`]), and a fixed setting wins over
//! them (everything else in the table). Each role keeps the precedence its site had before the
//! builder existed.
//!
//! The guarantee's settings (`enable.idempotence=true`, `acks=all`) come with the properties
//! from `producer_properties`, where they are set last; the producer roles ([`Role::Producer`],
//! and [`Role::Verbatim`] for `ferry check`'s transactional producer) keep them, and only
//! clients that produce nothing drop or change them.

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};

use crate::config::defaults::{MESSAGE_COPY_MAX_BYTES, STATISTICS_INTERVAL_MS};

/// Properties Ferry sets on the producer that a consumer-type client does not know (each would
/// log a warning there).
pub const PRODUCER_ONLY: [&str; 9] = [
    "enable.idempotence",
    "enable.gapless.guarantee",
    "acks",
    "partitioner",
    "compression.codec",
    "linger.ms",
    "message.timeout.ms",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
];

/// The bootstrap probe's `reconnect.backoff.ms`: librdkafka asks to connect again every half of
/// it, so attempts come 250 ms apart (see [`crate::kafka_access::probe`]).
const PROBE_RECONNECT_BACKOFF_MS: &str = "500";

/// The bootstrap probe's `reconnect.backoff.max.ms`.
const PROBE_RECONNECT_BACKOFF_MAX_MS: &str = "10000";

/// The progress reader's `group.id` unless the properties set one.
pub const PROGRESS_READER_GROUP: &str = "ferry-progress-reader";

/// What a client is for; see the [module documentation](self) for what each sets and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The relay's producer, idempotent, or transactional when the properties carry a
    /// `transactional.id`.
    Producer,
    /// The probe asking whether any bootstrap broker answers.
    BrokerProbe,
    /// The probe asking which APIs the brokers serve (transactions).
    ApiVersionsProbe,
    /// The topic watch's admin client (CreateTopics, DescribeConfigs).
    TopicWatchAdmin,
    /// The topic watch's metadata consumer.
    TopicWatchMetadata,
    /// The progress topic's admin client and metadata consumer.
    ProgressTopic,
    /// A consumer reading the progress topic from its beginning, committed records only.
    ProgressReader,
    /// `ferry inbox`'s group consumer: it seeks to the offsets the database holds and commits
    /// to Kafka only as advice.
    InboxConsumer,
    /// The properties as given, nothing added or dropped.
    Verbatim,
}

impl Role {
    /// Set before the properties: they win.
    fn defaults(self) -> Vec<(&'static str, String)> {
        match self {
            Role::Producer => vec![
                ("statistics.interval.ms", STATISTICS_INTERVAL_MS.to_string()),
                ("message.copy.max.bytes", MESSAGE_COPY_MAX_BYTES.to_string()),
            ],
            // assign() needs no group; librdkafka wants the property for some code paths anyway.
            Role::ProgressReader => vec![("group.id", PROGRESS_READER_GROUP.to_owned())],
            _ => Vec::new(),
        }
    }

    /// Taken out of the properties.
    fn dropped(self) -> Vec<&'static str> {
        match self {
            Role::Producer | Role::Verbatim => Vec::new(),
            // Gapless needs idempotence, which these clients do not have.
            Role::BrokerProbe => vec!["transactional.id", "enable.gapless.guarantee"],
            Role::ApiVersionsProbe => vec!["transactional.id", "debug", "enable.gapless.guarantee"],
            Role::TopicWatchAdmin => vec![
                "enable.idempotence",
                "enable.gapless.guarantee",
                "transactional.id",
            ],
            Role::TopicWatchMetadata => PRODUCER_ONLY.to_vec(),
            Role::ProgressTopic | Role::ProgressReader | Role::InboxConsumer => {
                let mut dropped = PRODUCER_ONLY.to_vec();
                dropped.extend(["transactional.id", "transaction.timeout.ms"]);
                dropped
            }
        }
    }

    /// Set after the properties: they win over them.
    fn fixed(self) -> Vec<(&'static str, &'static str)> {
        match self {
            Role::Producer | Role::TopicWatchAdmin | Role::Verbatim => Vec::new(),
            Role::BrokerProbe => vec![
                ("enable.idempotence", "false"),
                ("reconnect.backoff.ms", PROBE_RECONNECT_BACKOFF_MS),
                ("reconnect.backoff.max.ms", PROBE_RECONNECT_BACKOFF_MAX_MS),
                // The first metadata response retires the bootstrap broker, failing the
                // request it carried; the retry waits for a learned broker, which a sparse
                // client connects to only 250 ms later at this backoff.
                ("enable.sparse.connections", "false"),
                // It asks for the progress topic's metadata alone (a request for every topic
                // grows with the cluster): asking must not create it with the brokers'
                // defaults.
                ("allow.auto.create.topics", "false"),
            ],
            // Its metadata request names the progress topic, which it must not create.
            Role::ApiVersionsProbe => {
                vec![("debug", "feature"), ("allow.auto.create.topics", "false")]
            }
            Role::TopicWatchMetadata => vec![("allow.auto.create.topics", "false")],
            // These clients live for one read: connecting to the brokers as soon as metadata
            // names them (rather than when a request needs one, paced by
            // reconnect.backoff.ms / 2) took the metadata check after creating the progress
            // topic from 55 to 5 ms.
            Role::ProgressTopic => vec![("enable.sparse.connections", "false")],
            // A position out of range (deleted by retention) resumes at the oldest record
            // left, never past records still there.
            Role::InboxConsumer => vec![
                ("allow.auto.create.topics", "false"),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("enable.partition.eof", "false"),
                ("isolation.level", "read_committed"),
                ("auto.offset.reset", "earliest"),
            ],
            Role::ProgressReader => vec![
                ("enable.sparse.connections", "false"),
                // A fetch at the end of the log waits this long for records at the broker, and
                // the connection's other requests wait behind it (see `progress_topic::Scan`):
                // a read taken up asks ListOffsets on it.
                ("fetch.wait.max.ms", "10"),
                ("allow.auto.create.topics", "false"),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("enable.partition.eof", "false"),
                ("isolation.level", "read_committed"),
                ("auto.offset.reset", "earliest"),
            ],
        }
    }

    /// A `debug` context added to the properties' own, if it is not among them (nor `all`).
    fn debug_context(self) -> Option<&'static str> {
        match self {
            Role::BrokerProbe => Some("broker"),
            _ => None,
        }
    }

    /// Whether the client logs at Debug: its context reads librdkafka's debug lines, and
    /// rust-rdkafka would otherwise take the level from the `log` facade's (Error when nothing
    /// logs, as in `ferry check`) and drop them before they reach the context.
    fn logs_debug(self) -> bool {
        matches!(self, Role::BrokerProbe | Role::ApiVersionsProbe)
    }
}

/// Whether librdkafka reports a log line of `level` and facility `fac` again as an error
/// event with the same text: a broker's failure (`FAIL`) at `LOG_ERR` or worse is both logged
/// and sent to the error callback (`rd_kafka_broker_set_error`, librdkafka 2.12). A context
/// that logs its error events says it there; its log line would only say it twice.
pub fn also_an_error_event(level: RDKafkaLogLevel, fac: &str) -> bool {
    fac == "FAIL"
        && matches!(
            level,
            RDKafkaLogLevel::Emerg
                | RDKafkaLogLevel::Alert
                | RDKafkaLogLevel::Critical
                | RDKafkaLogLevel::Error
        )
}

/// The brokers `properties` name (`bootstrap.servers`, the last one set), for messages and
/// commands; `<brokers>` when none.
pub fn bootstrap_servers(properties: &[(String, String)]) -> &str {
    properties
        .iter()
        .rev()
        .find(|(k, _)| k == "bootstrap.servers")
        .map_or("<brokers>", |(_, v)| v.as_str())
}

/// The librdkafka configuration of a client of `role`, from `properties` (Ferry's producer
/// properties, see the [module documentation](self)). Holds secrets: never log it.
pub fn config(properties: &[(String, String)], role: Role) -> ClientConfig {
    let mut cc = ClientConfig::new();
    for (k, v) in role.defaults() {
        cc.set(k, v);
    }
    for (k, v) in properties {
        cc.set(k, v);
    }
    for k in role.dropped() {
        cc.remove(k);
    }
    for (k, v) in role.fixed() {
        cc.set(k, v);
    }
    if let Some(context) = role.debug_context() {
        let debug = match cc.get("debug") {
            Some(d)
                if d.split(',')
                    .any(|c| c.trim() == context || c.trim() == "all") =>
            {
                d.to_owned()
            }
            Some(d) if !d.trim().is_empty() => format!("{d},{context}"),
            _ => context.to_owned(),
        };
        cc.set("debug", debug);
    }
    if role.logs_debug() {
        cc.set_log_level(RDKafkaLogLevel::Debug);
    }
    cc
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn only_a_broker_failure_at_error_or_worse_comes_again_as_an_error_event() {
        use RDKafkaLogLevel as L;
        for level in [L::Emerg, L::Alert, L::Critical, L::Error] {
            assert!(also_an_error_event(level, "FAIL"), "{level:?}");
        }
        // Below LOG_ERR librdkafka logs the failure and sends no event: the line is the report.
        for level in [L::Warning, L::Notice, L::Info, L::Debug] {
            assert!(!also_an_error_event(level, "FAIL"), "{level:?}");
        }
        for fac in ["GETPID", "ERROR", "BROKERFAIL", "fail"] {
            assert!(!also_an_error_event(L::Error, fac), "{fac}");
        }
    }

    fn props(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Every property set, with its value (`config_map` hides secret ones).
    fn map(cc: &ClientConfig) -> BTreeMap<String, String> {
        cc.config_map()
            .into_keys()
            .map(|k| (k.to_owned(), cc.get(k).unwrap_or_default().to_owned()))
            .collect()
    }

    fn expect(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn logs_at_debug(cc: &ClientConfig) -> bool {
        matches!(cc.log_level, RDKafkaLogLevel::Debug)
    }

    /// What Ferry's producer properties look like in exactly-once mode, with the sink's
    /// `transactional.id`, a user's passthrough and a user's `debug`.
    fn producer_like() -> Vec<(String, String)> {
        props(&[
            ("client.id", "ferry"),
            ("reconnect.backoff.ms", "20"),
            ("reconnect.backoff.max.ms", "1000"),
            ("security.protocol", "sasl_ssl"),
            ("sasl.password", "secret"),
            ("debug", "protocol"),
            ("bootstrap.servers", "a:9092,b:9092"),
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("partitioner", "murmur2_random"),
            ("compression.codec", "lz4"),
            ("linger.ms", "1"),
            ("message.timeout.ms", "0"),
            ("queue.buffering.max.messages", "20000"),
            ("queue.buffering.max.kbytes", "65536"),
            ("topic.metadata.propagation.max.ms", "1800000"),
            ("message.timeout.ms", "60000"),
            ("transaction.timeout.ms", "60000"),
            ("transactional.id", "ferry-1-slot"),
        ])
    }

    /// The connection and user settings every role keeps.
    const SHARED: [(&str, &str); 6] = [
        ("client.id", "ferry"),
        ("reconnect.backoff.ms", "20"),
        ("reconnect.backoff.max.ms", "1000"),
        ("security.protocol", "sasl_ssl"),
        ("sasl.password", "secret"),
        ("bootstrap.servers", "a:9092,b:9092"),
    ];

    fn with_shared(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut out = expect(&SHARED);
        out.extend(expect(pairs));
        out
    }

    #[test]
    fn the_producer_keeps_every_property_and_adds_statistics_and_the_copy_limit() {
        let cc = config(&producer_like(), Role::Producer);
        let mut want = BTreeMap::new();
        for (k, v) in producer_like() {
            want.insert(k, v);
        }
        want.insert("statistics.interval.ms".into(), "1000".into());
        want.insert("message.copy.max.bytes".into(), "4096".into());
        assert_eq!(map(&cc), want);
        assert_eq!(
            cc.get("message.timeout.ms"),
            Some("60000"),
            "the later wins"
        );
        assert!(!logs_at_debug(&cc));
    }

    #[test]
    fn the_producers_defaults_yield_to_the_properties() {
        let given = [
            ("statistics.interval.ms", "0"),
            ("message.copy.max.bytes", "65535"),
        ];
        let cc = config(&props(&given), Role::Producer);
        assert_eq!(map(&cc), expect(&given));
    }

    #[test]
    fn producers_keep_the_guarantee() {
        for role in [Role::Producer, Role::Verbatim] {
            let cc = config(&producer_like(), role);
            assert_eq!(cc.get("enable.idempotence"), Some("true"), "{role:?}");
            assert_eq!(cc.get("acks"), Some("all"), "{role:?}");
        }
    }

    #[test]
    fn verbatim_is_the_properties_as_given() {
        let cc = config(&producer_like(), Role::Verbatim);
        let want: BTreeMap<String, String> = producer_like().into_iter().collect();
        assert_eq!(map(&cc), want);
        assert!(!logs_at_debug(&cc));
        assert!(map(&config(&[], Role::Verbatim)).is_empty());
    }

    #[test]
    fn the_broker_probe_is_plain_slow_to_reconnect_and_debugs_brokers() {
        let cc = config(&producer_like(), Role::BrokerProbe);
        let mut want: BTreeMap<String, String> = producer_like().into_iter().collect();
        want.remove("transactional.id");
        want.extend(expect(&[
            ("enable.idempotence", "false"),
            ("reconnect.backoff.ms", "500"),
            ("reconnect.backoff.max.ms", "10000"),
            ("enable.sparse.connections", "false"),
            ("allow.auto.create.topics", "false"),
            ("debug", "protocol,broker"),
        ]));
        assert_eq!(map(&cc), want);
        assert!(logs_at_debug(&cc));
    }

    #[test]
    fn the_broker_probe_adds_broker_to_the_debug_contexts_only_when_missing() {
        for (given, want) in [
            (None, "broker"),
            (Some(""), "broker"),
            (Some("  "), "broker"),
            (Some("protocol"), "protocol,broker"),
            (Some("protocol, broker"), "protocol, broker"),
            (Some("all"), "all"),
            (Some("security,all"), "security,all"),
        ] {
            let mut p = props(&[("bootstrap.servers", "a:9092")]);
            if let Some(d) = given {
                p.push(("debug".into(), d.into()));
            }
            let cc = config(&p, Role::BrokerProbe);
            assert_eq!(cc.get("debug"), Some(want), "{given:?}");
        }
    }

    #[test]
    fn the_broker_probes_settings_win_over_the_properties() {
        let cc = config(
            &props(&[
                ("reconnect.backoff.ms", "1"),
                ("reconnect.backoff.max.ms", "2"),
                ("enable.idempotence", "true"),
            ]),
            Role::BrokerProbe,
        );
        assert_eq!(
            map(&cc),
            expect(&[
                ("reconnect.backoff.ms", "500"),
                ("reconnect.backoff.max.ms", "10000"),
                ("enable.idempotence", "false"),
                ("enable.sparse.connections", "false"),
                ("allow.auto.create.topics", "false"),
                ("debug", "broker"),
            ])
        );
    }

    #[test]
    fn the_api_versions_probe_debugs_features_only_and_creates_no_topic() {
        let cc = config(&producer_like(), Role::ApiVersionsProbe);
        let mut want: BTreeMap<String, String> = producer_like().into_iter().collect();
        want.remove("transactional.id");
        want.insert("debug".into(), "feature".into());
        want.insert("allow.auto.create.topics".into(), "false".into());
        assert_eq!(map(&cc), want);
        assert!(logs_at_debug(&cc));
    }

    #[test]
    fn the_topic_watch_admin_is_neither_idempotent_nor_transactional() {
        let cc = config(&producer_like(), Role::TopicWatchAdmin);
        let mut want: BTreeMap<String, String> = producer_like().into_iter().collect();
        want.remove("enable.idempotence");
        want.remove("transactional.id");
        assert_eq!(map(&cc), want);
        assert!(!logs_at_debug(&cc));
    }

    #[test]
    fn the_topic_watch_metadata_consumer_drops_producer_settings_and_creates_no_topic() {
        let cc = config(&producer_like(), Role::TopicWatchMetadata);
        // The transactional settings stay, as they always did on this client.
        let want = with_shared(&[
            ("debug", "protocol"),
            ("topic.metadata.propagation.max.ms", "1800000"),
            ("transaction.timeout.ms", "60000"),
            ("transactional.id", "ferry-1-slot"),
            ("allow.auto.create.topics", "false"),
        ]);
        assert_eq!(map(&cc), want);
        let cc = config(
            &props(&[("allow.auto.create.topics", "true")]),
            Role::TopicWatchMetadata,
        );
        assert_eq!(cc.get("allow.auto.create.topics"), Some("false"));
    }

    #[test]
    fn the_progress_topic_clients_drop_producer_and_transaction_settings() {
        let cc = config(&producer_like(), Role::ProgressTopic);
        let want = with_shared(&[
            ("debug", "protocol"),
            ("topic.metadata.propagation.max.ms", "1800000"),
            ("enable.sparse.connections", "false"),
        ]);
        assert_eq!(map(&cc), want);
        assert!(!logs_at_debug(&cc));
        let cc = config(
            &props(&[("enable.sparse.connections", "true")]),
            Role::ProgressTopic,
        );
        assert_eq!(cc.get("enable.sparse.connections"), Some("false"));
    }

    #[test]
    fn the_progress_reader_reads_everything_committed_and_commits_nothing() {
        let cc = config(&producer_like(), Role::ProgressReader);
        let want = with_shared(&[
            ("debug", "protocol"),
            ("topic.metadata.propagation.max.ms", "1800000"),
            ("enable.sparse.connections", "false"),
            ("fetch.wait.max.ms", "10"),
            ("allow.auto.create.topics", "false"),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("enable.partition.eof", "false"),
            ("isolation.level", "read_committed"),
            ("auto.offset.reset", "earliest"),
            ("group.id", "ferry-progress-reader"),
        ]);
        assert_eq!(map(&cc), want);
        assert!(!logs_at_debug(&cc));
    }

    #[test]
    fn the_progress_readers_group_yields_and_its_settings_win() {
        let cc = config(
            &props(&[
                ("group.id", "mine"),
                ("isolation.level", "read_uncommitted"),
                ("enable.auto.commit", "true"),
                ("auto.offset.reset", "latest"),
            ]),
            Role::ProgressReader,
        );
        assert_eq!(cc.get("group.id"), Some("mine"));
        assert_eq!(cc.get("isolation.level"), Some("read_committed"));
        assert_eq!(cc.get("enable.auto.commit"), Some("false"));
        assert_eq!(cc.get("auto.offset.reset"), Some("earliest"));
    }

    /// Every role's configuration is one librdkafka accepts, from the producer properties
    /// `[kafka]` gives by default.
    #[test]
    fn every_role_makes_a_valid_native_config() {
        let c = crate::config::load(
            Some("[postgres]\nurl = \"postgres://x@h/db\"\n[kafka]\nbrokers = \"127.0.0.1:1\"\nexactly_once = true\n"),
            Vec::<(String, String)>::new(),
        )
        .expect("config");
        let mut properties = c.kafka.producer_properties().unwrap();
        properties.push(("transactional.id".into(), "ferry-1-slot".into()));
        for role in [
            Role::Producer,
            Role::BrokerProbe,
            Role::ApiVersionsProbe,
            Role::TopicWatchAdmin,
            Role::TopicWatchMetadata,
            Role::ProgressTopic,
            Role::ProgressReader,
            Role::Verbatim,
        ] {
            let cc = config(&properties, role);
            if let Err(e) = cc.create_native_config() {
                panic!("{role:?}: {e}");
            }
        }
    }
}
