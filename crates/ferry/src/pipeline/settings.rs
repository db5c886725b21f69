//! Everything one pipeline needs, resolved from the configuration once, before anything runs.

use std::sync::Arc;
use std::time::Duration;

use ferry_router::{tables::key_prefix, Router, Routers};
use ferry_wal::conn::{ConnectConfig, StreamOptions};
use ferry_wal::slot::{AcceptedTypes, RequiredColumn, SlotSpec, TableSpec};

/// The resolved pipeline settings.
#[derive(Debug, Clone)]
pub struct PipelineSettings {
    /// Postgres connection (both the SQL and the replication connection).
    pub postgres: ConnectConfig,
    /// What the database must have (created when allowed).
    pub slot: SlotSpec,
    /// What to stream.
    pub stream: StreamOptions,
    /// Row → record, a router per outbox table (in [`SlotSpec::tables`]' order).
    pub routers: Arc<Routers>,
    /// librdkafka properties, built in one place by the configuration.
    pub producer_properties: Vec<(String, String)>,
    /// `route.create_topics`: what the topic watch does about a missing topic.
    pub create_topics: ferry_router::CreateTopicsConfig,
    /// In-flight window: records handed to the producer and not yet reported.
    pub max_in_flight_records: usize,
    /// In-flight window in payload bytes.
    pub max_in_flight_bytes: usize,
    /// Graceful shutdown: how long to wait for in-flight deliveries.
    pub drain_timeout: Duration,
    /// Longest a session waits for in-flight deliveries before reconnecting: librdkafka's
    /// `delivery.timeout.ms` (which guarantees a report for every record) plus a margin; `None`
    /// when records never time out, so the session waits for every report.
    pub session_drain_timeout: Option<Duration>,
    pub reconnect_backoff_min: Duration,
    pub reconnect_backoff_max: Duration,
    pub standby_poll_interval: Duration,
    /// How often the WAL lag (server WAL position − confirmed) is sampled.
    pub lag_sample_interval: Duration,
    /// `postgres.binary`: pgoutput binary mode allowed where it helps (see [`super::binary`]).
    pub binary: bool,
    /// `kafka.progress_topic`: where Ferry remembers its position outside the slot.
    pub progress_topic: String,
    /// What the operator accepted for this start (`ferry run --accept-gap`); set by the command
    /// line, never by the configuration, so that it cannot outlive the start it was meant for.
    pub acceptance: ferry_core::verdict::Acceptance,
    /// The poison event the operator passes once (`ferry run --skip-event` /
    /// `--dead-letter-event`); set by the command line only, like `acceptance`.
    pub pass: Option<ferry_core::pass::Pass>,
    /// `kafka.exactly_once`, with what it needs; `None` in at-least-once mode.
    pub exactly_once: Option<ExactlyOnce>,
}

/// Exactly-once settings (see [`super::transactional`]).
#[derive(Debug, Clone)]
pub struct ExactlyOnce {
    /// `kafka.progress_topic`.
    pub progress_topic: String,
    /// `kafka.transaction_interval`.
    pub interval: Duration,
    /// Records and bytes a Kafka transaction collects at most (half the window at most).
    pub max_records: u64,
    pub max_bytes: u64,
    /// How long a transaction call (init, commit, abort) and the progress read may take.
    pub call_timeout: Duration,
}

/// The slot spec for the routers' tables, with the columns each reads.
pub fn outbox_spec(
    routers: &Routers,
    slot: &str,
    publication: &str,
    create_slot: bool,
    create_publication: bool,
) -> SlotSpec {
    SlotSpec {
        slot: slot.to_string(),
        publication: publication.to_string(),
        tables: routers
            .iter()
            .enumerate()
            .map(|(i, r)| table_spec(r, &key_prefix(i)))
            .collect(),
        create_slot,
        create_publication,
        failover: false,
    }
}

/// A router's table and the columns it reads; `prefix` is its keys' (`tables[0].`).
fn table_spec(router: &Router, prefix: &str) -> TableSpec {
    let table = router.table();
    // The router's own list: a column it reads that the table lacks (or has with a type it
    // cannot read) stops Ferry before streaming, and `ferry check` reports it, instead of the
    // first row failing to route.
    let required: Vec<RequiredColumn> = router
        .required_columns()
        .iter()
        .map(|r| {
            let config_key = format!("{prefix}{}", r.config_key);
            RequiredColumn {
                name: r.column.clone(),
                accepted_types: r.accepted_types.map(|oids| AcceptedTypes {
                    oids: oids.to_vec(),
                    fix: format!(
                        "use a column of a type Ferry reads there ({}), or set {} to another column",
                        oids.iter()
                            .map(|t| ferry_wal::slot::type_name(*t))
                            .collect::<Vec<_>>()
                            .join(", "),
                        config_key.split(' ').next().unwrap_or(&config_key)
                    ),
                }),
                config_key,
            }
        })
        .collect();
    TableSpec {
        schema: table.schema.clone(),
        table: table.name.clone(),
        config_key: format!("{prefix}outbox.table"),
        required_columns: required,
    }
}

/// Stream options for the spec's tables and the routers' message prefix.
pub fn stream_options(
    spec: &SlotSpec,
    routers: &Routers,
    status_interval: Duration,
    receive_timeout: Duration,
    capacity: usize,
    linger: Duration,
) -> StreamOptions {
    StreamOptions {
        slot: spec.slot.clone(),
        publication: spec.publication.clone(),
        source: spec.outbox_source(routers.message_prefix().map(str::to_string)),
        status_interval,
        channel_capacity: capacity,
        // Chosen per session (see super::binary).
        binary: false,
        failover: spec.failover,
        pause_inside_transaction: ferry_wal::conn::stream::pause_for_linger(linger),
        receive_timeout: (!receive_timeout.is_zero()).then_some(receive_timeout),
    }
}

/// Why the configuration cannot make a pipeline (beyond what `Config::validate` checks).
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{0}")]
    Router(ferry_router::ConfigErrors),
    /// The connection settings cannot be resolved (`postgres.url`, `postgres.password_file`,
    /// `kafka.property_files`), with the key at fault.
    #[error("{0}")]
    Secret(String),
}

/// Derived timings.
/// How often the WAL lag is sampled.
pub const LAG_SAMPLE_INTERVAL: Duration = Duration::from_secs(5);
/// Extra time a session waits past librdkafka's delivery timeout for the last reports.
pub const SESSION_DRAIN_MARGIN: Duration = Duration::from_secs(30);

impl PipelineSettings {
    /// Resolves a validated configuration.
    pub fn from_config(config: &crate::config::Config) -> Result<PipelineSettings, SettingsError> {
        let postgres = config
            .postgres
            .connect_config()
            .map_err(SettingsError::Secret)?;
        let routers = Routers::new(&config.outbox, &config.route, &config.tables)
            .map_err(SettingsError::Router)?;
        let mut slot = outbox_spec(
            &routers,
            &config.postgres.slot,
            &config.postgres.publication,
            config.postgres.create_slot,
            config.postgres.create_publication,
        );
        slot.failover = config.postgres.failover_slot;
        let stream = stream_options(
            &slot,
            &routers,
            config.postgres.status_interval.get(),
            config.postgres.receive_timeout.get(),
            ferry_wal::conn::stream::DEFAULT_CHANNEL_CAPACITY,
            config.kafka.linger.get(),
        );
        Ok(PipelineSettings {
            postgres,
            slot,
            stream,
            routers: Arc::new(routers),
            producer_properties: {
                let mut props = config
                    .kafka
                    .producer_properties()
                    .map_err(SettingsError::Secret)?;
                if config.route.position_headers && !config.kafka.exactly_once {
                    // The inbox's high-water mark is exact only if no record lands in a partition
                    // after a later one did: a broker refusing a record (too large, not
                    // authorized) while later ones land would break it. Gapless makes such a
                    // refusal a fatal error before anything after it lands; the session starts
                    // over with a new producer from the slot (README, "The inbox").
                    props.push(("enable.gapless.guarantee".into(), "true".into()));
                }
                props
            },
            create_topics: config.route.create_topics.clone(),
            max_in_flight_records: config.kafka.max_in_flight_records as usize,
            max_in_flight_bytes: config.kafka.max_in_flight_bytes as usize,
            drain_timeout: config.shutdown.drain_timeout.get(),
            session_drain_timeout: (!config.kafka.delivery_timeout.is_zero())
                .then(|| config.kafka.delivery_timeout.get() + SESSION_DRAIN_MARGIN),
            reconnect_backoff_min: config.postgres.reconnect_backoff_min.get(),
            reconnect_backoff_max: config.postgres.reconnect_backoff_max.get(),
            standby_poll_interval: config.postgres.standby_poll_interval.get(),
            lag_sample_interval: LAG_SAMPLE_INTERVAL,
            binary: config.postgres.binary,
            progress_topic: config.kafka.progress_topic.clone(),
            acceptance: ferry_core::verdict::Acceptance::default(),
            pass: None,
            exactly_once: config.kafka.exactly_once.then(|| {
                let (max_records, max_bytes) = config.kafka.transaction_caps();
                ExactlyOnce {
                    progress_topic: config.kafka.progress_topic.clone(),
                    interval: config.kafka.transaction_interval.get(),
                    max_records,
                    max_bytes,
                    call_timeout: crate::config::defaults::TRANSACTION_TIMEOUT,
                }
            }),
        })
    }
}
