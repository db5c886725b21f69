//! The `[outbox]` and `[route]` sections of Ferry's configuration: serde types and their defaults as
//! named constants. The parsed outbox table name ([`TableName`]) and the options that select an
//! encoding ([`RecordFormat`], [`ExpandNullBehavior`], [`CloudEventsMode`]) are defined beside the
//! code that uses them and re-exported here.
//!
//! Both sections are closed (`deny_unknown_fields`): a misspelt key is an error, not a silently ignored
//! line. Every scalar key is flat and snake_case so that the binary can also set it from the environment
//! as `FERRY_<SECTION>_<KEY>` (e.g. `FERRY_OUTBOX_ID_COLUMN`, `FERRY_ROUTE_MAX_PAYLOAD_BYTES`). Validation
//! lives in [`crate::validate`]; the full reference with an example is `config.md` in this crate.

use serde::{Deserialize, Serialize};

pub use crate::base::table_name::{TableName, DEFAULT_SCHEMA};
pub use crate::encode::cloudevents::CloudEventsMode;
pub use crate::encode::expand::ExpandNullBehavior;
pub use crate::encode::format::RecordFormat;

/// Default outbox table: `public.outbox`, Debezium's conventional name.
pub const DEFAULT_TABLE: &str = "public.outbox";
/// Default event id column (Debezium `table.field.event.id`).
pub const DEFAULT_ID_COLUMN: &str = "id";
/// Default aggregate type column (Debezium `route.by.field`).
pub const DEFAULT_AGGREGATE_TYPE_COLUMN: &str = "aggregatetype";
/// Default aggregate id column, the record key (Debezium `table.field.event.key`).
pub const DEFAULT_AGGREGATE_ID_COLUMN: &str = "aggregateid";
/// Default event type column.
pub const DEFAULT_TYPE_COLUMN: &str = "type";
/// Default payload column (Debezium `table.field.event.payload`).
pub const DEFAULT_PAYLOAD_COLUMN: &str = "payload";

/// Topic template used when `route.topic` is unset, with the default column mapping. When unset, the
/// effective template is `outbox.event.{<outbox.aggregate_type_column>}` (Debezium's
/// `route.topic.replacement` default `outbox.event.${routedByValue}` with `route.by.field` the
/// aggregate type column), so renaming the aggregate type column does not break the default topic.
pub const DEFAULT_TOPIC_TEMPLATE: &str = "outbox.event.{aggregatetype}";
/// Prefix of the default topic template.
pub const DEFAULT_TOPIC_PREFIX: &str = "outbox.event.";
/// Default header carrying the event id (consumer-side deduplication: the inbox pattern). Debezium
/// sends the same header.
pub const DEFAULT_ID_HEADER: &str = "id";
/// Default header carrying the event type.
pub const DEFAULT_TYPE_HEADER: &str = "type";
/// With `route.position_headers`: the header naming the record's source,
/// `<system identifier>/<timeline>/<slot>` (written by the relay core, `ferry_core::source_position`).
pub const SOURCE_HEADER: &str = "ferry-source";
/// With `route.position_headers`: the header with the record's place in its source's WAL,
/// `<commit LSN>:<index>` (`ferry_core::source_position::SourcePosition`).
pub const POSITION_HEADER: &str = "ferry-position";
/// Key of the payload inside the JSON object produced in envelope mode (Debezium's envelope field).
pub const ENVELOPE_PAYLOAD_KEY: &str = "payload";

/// librdkafka's default `message.max.bytes` (1,000,000): the producer refuses larger messages.
pub const LIBRDKAFKA_MESSAGE_MAX_BYTES: usize = 1_000_000;
/// The Kafka broker's default `message.max.bytes` (1,048,588 = 1 MiB + 12): the largest record batch
/// a broker accepts unless the topic's `max.message.bytes` says otherwise.
pub const KAFKA_BROKER_MESSAGE_MAX_BYTES: usize = 1_048_588;
/// Default `route.max_payload_bytes`: 960 KiB (983,040 bytes). Below both limits above, leaving
/// 16,960 bytes under librdkafka's for the key, headers and record-batch overhead. Raise it only
/// together with librdkafka's `message.max.bytes` and the topic's `max.message.bytes`.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 960 * 1024;
/// Upper bound for `route.max_payload_bytes`: librdkafka's maximum `message.max.bytes`.
pub const MAX_MAX_PAYLOAD_BYTES: usize = 1_000_000_000;
/// Default `route.key_schema_optional`: the aggregate id column is `NOT NULL` in Debezium's and
/// Ferry's reference DDL.
pub const DEFAULT_KEY_SCHEMA_OPTIONAL: bool = false;
/// Default `route.value_schema_optional`: the payload column is nullable in Debezium's and
/// Ferry's reference DDL (`payload jsonb`).
pub const DEFAULT_VALUE_SCHEMA_OPTIONAL: bool = true;
/// Default `route.position_headers`: off, so records stay byte-identical to Debezium's.
pub const DEFAULT_POSITION_HEADERS: bool = false;
/// Default `route.on_error`.
pub const DEFAULT_ON_ERROR: OnError = OnError::Fail;

/// `[outbox]`: where the outbox is and which columns play which role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxConfig {
    /// The outbox table, `schema.table` or `table` (schema `public`). Identifiers follow SQL rules:
    /// unquoted ones are folded to lower case, double-quoted ones are taken as written.
    pub table: String,
    /// Column holding the event id; sent as the `id` header.
    pub id_column: String,
    /// Column holding the aggregate type; names the topic by default.
    pub aggregate_type_column: String,
    /// Column holding the aggregate id; its text is the record key.
    pub aggregate_id_column: String,
    /// Column holding the event type; sent as the `type` header.
    pub type_column: String,
    /// Column holding the payload; it becomes the record value as stored.
    pub payload_column: String,
    /// Optional column whose value is the record timestamp (timestamptz, timestamp, or an integer
    /// of epoch milliseconds). Unset: the transaction's commit time.
    pub timestamp_column: Option<String>,
    /// Optional column holding an explicit partition number (an integer >= 0). Unset: the partition
    /// is chosen from the key by the Java-compatible murmur2 partitioner.
    pub partition_column: Option<String>,
    /// Optional prefix of table-less outbox messages (`pg_logical_emit_message(true, prefix, doc)`).
    /// Unset: logical decoding messages are not routed.
    pub message_prefix: Option<String>,
    /// Optional column holding the writer's W3C trace context: a bare `traceparent`, or Debezium's
    /// `tracingspancontext` (a `java.util.Properties` text with `traceparent` and `tracestate`).
    /// Sent as the `traceparent` and `tracestate` headers; a malformed value is left out and
    /// counted, never fatal (see [`crate::trace`]). Unset: no trace headers.
    pub tracing_column: Option<String>,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            table: DEFAULT_TABLE.to_owned(),
            id_column: DEFAULT_ID_COLUMN.to_owned(),
            aggregate_type_column: DEFAULT_AGGREGATE_TYPE_COLUMN.to_owned(),
            aggregate_id_column: DEFAULT_AGGREGATE_ID_COLUMN.to_owned(),
            type_column: DEFAULT_TYPE_COLUMN.to_owned(),
            payload_column: DEFAULT_PAYLOAD_COLUMN.to_owned(),
            timestamp_column: None,
            partition_column: None,
            message_prefix: None,
            tracing_column: None,
        }
    }
}

impl OutboxConfig {
    /// The parsed `table` (schema and relation name as PostgreSQL stores them, i.e. as pgoutput's
    /// Relation message reports them).
    pub fn table_name(&self) -> Result<TableName, String> {
        self.table.parse()
    }
}

/// What the router does about a row it cannot route. The router only reports; the binary applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Stop, checkpoint nothing past the row (the default: nothing is lost silently).
    #[default]
    Fail,
    /// Skip the row with a log line and a metric.
    Skip,
    /// Produce the row to `route.dead_letter_topic` with the reason as a header.
    DeadLetter,
}

spelling!(OnError {
    Fail => "fail",
    Skip => "skip",
    DeadLetter => "dead_letter",
});

/// `[route]`: how a row becomes a Kafka record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouteConfig {
    /// Topic template: literal text with `{column}` placeholders. A template without placeholders
    /// is a fixed topic. Unset: `outbox.event.{<outbox.aggregate_type_column>}`.
    pub topic: Option<String>,
    /// Ordered override rules; the first that matches picks the topic.
    pub rules: Vec<RuleConfig>,
    /// Extra columns placed as headers.
    pub headers: Vec<HeaderConfig>,
    /// Name of the event id header; `""` sends none.
    pub id_header: String,
    /// Name of the event type header; `""` sends none.
    pub type_header: String,
    /// Wrap the payload in a JSON object `{"payload": ..., <envelope fields>}`.
    pub envelope: bool,
    /// Columns added to the envelope, under their own names (needs `envelope = true`).
    pub envelope_fields: Vec<String>,
    /// Debezium's `table.fields.additional.placement`, verbatim: comma-separated
    /// `column:header[:alias]`, `column:envelope[:alias]` or `column:partition`.
    pub additional_placement: Option<String>,
    /// A NULL payload becomes a tombstone (null value) instead of a routing error.
    pub tombstone_on_null_payload: bool,
    /// A NULL payload is sent as a record with a null value and its headers, as Debezium's
    /// router sends it without `route.tombstone.on.empty.payload` (unlike a tombstone, blank
    /// text stays a payload); off, a NULL payload is a routing error unless
    /// `tombstone_on_null_payload`. Only the `as_stored` format refuses NULL: the JSON formats
    /// write it as `JsonConverter` does.
    pub send_null_payload: bool,
    /// Largest record value accepted, in bytes (a number or a size like `"960KiB"`, see
    /// [`crate::size`]); a larger one is a routing error.
    #[serde(deserialize_with = "crate::base::size::deserialize_usize")]
    pub max_payload_bytes: usize,
    /// What the binary does about a row that cannot be routed.
    pub on_error: OnError,
    /// Topic for rows that cannot be routed; required iff `on_error = "dead_letter"`.
    pub dead_letter_topic: Option<String>,
    /// `[route.create_topics]`: have the binary create the topics it routes to (file only).
    pub create_topics: CreateTopicsConfig,
    /// CloudEvents 1.0 output (Kafka protocol binding): `none` (default), `binary` or
    /// `structured`. See [`crate::cloudevents`].
    pub cloudevents: CloudEventsMode,
    /// The CloudEvents `source`: literal text with `{column}` placeholders. Unset:
    /// `/ferry/<schema>/<table>` of `outbox.table` ([`crate::cloudevents`]).
    pub cloudevents_source: Option<String>,
    /// The CloudEvents `subject`: literal text with `{column}` placeholders; `""` sends none.
    /// Unset: `{<outbox.aggregate_id_column>}`. A NULL column leaves the subject out.
    pub cloudevents_subject: Option<String>,
    /// The CloudEvents `datacontenttype` (the `content-type` header in binary mode). Unset: from
    /// the payload's type (json/jsonb and envelopes `application/json`, text
    /// `text/plain; charset=utf-8`, bytea `application/octet-stream`).
    pub cloudevents_data_content_type: Option<String>,
    /// How the key is written: `as_stored` (the column's text, the default), `json` or
    /// `json_with_schema` (Kafka Connect's `JsonConverter` without / with schemas). See
    /// [`crate::format`].
    pub key_format: RecordFormat,
    /// How the value is written, as `key_format`, or `json_expanded` /
    /// `json_expanded_with_schema` (Debezium's `table.expand.json.payload`; see
    /// `encode/expand.rs`).
    pub value_format: RecordFormat,
    /// The key schema's `optional` in `json_with_schema` (the key column's nullability).
    pub key_schema_optional: bool,
    /// The value schema's `optional` in `json_with_schema`, and in `json_expanded_with_schema`
    /// for a payload Debezium did not expand (the payload column's nullability).
    pub value_schema_optional: bool,
    /// What the expansion formats do with a member whose value is `null`: Debezium's
    /// `table.json.payload.null.behavior`.
    pub expand_null_behavior: ExpandNullBehavior,
    /// Every record `ferry run` produces carries [`SOURCE_HEADER`] and [`POSITION_HEADER`]: where
    /// in which server's WAL it comes from, for a consumer that drops replayed duplicates by a
    /// high-water mark. A property of the source, so `[route]` only: it applies to every
    /// `[[tables]]` entry. Off by default (Debezium's records have no such headers).
    pub position_headers: bool,
}

/// Default partition count of a topic Ferry creates.
pub const DEFAULT_CREATE_TOPICS_PARTITIONS: i32 = 1;
/// Default replication factor of a topic Ferry creates: -1 takes the brokers'
/// `default.replication.factor`.
pub const DEFAULT_CREATE_TOPICS_REPLICATION_FACTOR: i32 = -1;

/// `[route.create_topics]`: a topic a record routes to that does not exist on the brokers is
/// created (an admin CreateTopics request) with these settings, instead of waiting for someone
/// to create it. Off by default: most clusters manage their topics elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CreateTopicsConfig {
    /// Create missing topics.
    pub enabled: bool,
    /// Partitions of a created topic (at least 1).
    pub partitions: i32,
    /// Replication factor of a created topic (at least 1), or -1 for the brokers' default.
    pub replication_factor: i32,
    /// Topic configs of a created topic (`retention.ms`, `cleanup.policy`, ...), verbatim.
    pub configs: std::collections::BTreeMap<String, String>,
}

impl Default for CreateTopicsConfig {
    fn default() -> Self {
        CreateTopicsConfig {
            enabled: false,
            partitions: DEFAULT_CREATE_TOPICS_PARTITIONS,
            replication_factor: DEFAULT_CREATE_TOPICS_REPLICATION_FACTOR,
            configs: std::collections::BTreeMap::new(),
        }
    }
}

impl Default for RouteConfig {
    fn default() -> Self {
        RouteConfig {
            topic: None,
            rules: Vec::new(),
            headers: Vec::new(),
            id_header: DEFAULT_ID_HEADER.to_owned(),
            type_header: DEFAULT_TYPE_HEADER.to_owned(),
            envelope: false,
            envelope_fields: Vec::new(),
            additional_placement: None,
            tombstone_on_null_payload: false,
            send_null_payload: false,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            on_error: DEFAULT_ON_ERROR,
            dead_letter_topic: None,
            create_topics: CreateTopicsConfig::default(),
            cloudevents: CloudEventsMode::None,
            cloudevents_source: None,
            cloudevents_subject: None,
            cloudevents_data_content_type: None,
            key_format: RecordFormat::AsStored,
            value_format: RecordFormat::AsStored,
            key_schema_optional: DEFAULT_KEY_SCHEMA_OPTIONAL,
            value_schema_optional: DEFAULT_VALUE_SCHEMA_OPTIONAL,
            expand_null_behavior: ExpandNullBehavior::Ignore,
            position_headers: DEFAULT_POSITION_HEADERS,
        }
    }
}

impl RouteConfig {
    /// The topic template in effect: `topic`, or the default built from the aggregate type column.
    pub fn topic_template(&self, outbox: &OutboxConfig) -> String {
        match &self.topic {
            Some(t) => t.clone(),
            None => format!("{DEFAULT_TOPIC_PREFIX}{{{}}}", outbox.aggregate_type_column),
        }
    }
}

/// One `[[route.rules]]` entry: when `column` equals `equals` (or fully matches `regex`), the
/// record goes to `topic`. In a regex rule the topic may use the regex's capture groups as `$1` or
/// `${name}` (Debezium's `route.topic.regex` / `route.topic.replacement`); any rule's topic may use
/// `{column}` placeholders.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Column whose value is matched.
    pub column: String,
    /// Exact value to match (bytes of the column's text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<String>,
    /// Regular expression (Rust `regex` syntax) that must match the whole value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// Topic template for matching rows.
    pub topic: String,
}

/// One `[[route.headers]]` entry: the column's value as a header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderConfig {
    /// Column whose value becomes the header value.
    pub column: String,
    /// Header name; defaults to the column name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl HeaderConfig {
    /// The header name in effect.
    pub fn header_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.column)
    }
}

/// Where a Debezium `table.fields.additional.placement` entry puts its column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementLocation {
    /// As a header named by the alias (or the column).
    Header,
    /// As a field of the envelope named by the alias (or the column).
    Envelope,
    /// As the explicit partition number.
    Partition,
}

/// One parsed entry of `route.additional_placement`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Source column.
    pub column: String,
    /// Where it goes.
    pub location: PlacementLocation,
    /// Header or envelope field name (the column's name when no alias was given).
    pub alias: String,
}

/// Parses Debezium's `table.fields.additional.placement` syntax: comma-separated
/// `column:location[:alias]` with location `header`, `envelope` or `partition`. Returns each entry
/// or, for each bad entry, its index and the problem.
pub fn parse_additional_placement(spec: &str) -> Result<Vec<Placement>, Vec<(usize, String)>> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (i, entry) in spec.split(',').enumerate() {
        let entry = entry.trim();
        let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
        if parts.len() < 2 || parts.len() > 3 || parts.iter().any(|p| p.is_empty()) {
            errors.push((
                i,
                format!("{entry:?} is not column:location or column:location:alias"),
            ));
            continue;
        }
        let location = match parts[1] {
            "header" => PlacementLocation::Header,
            "envelope" => PlacementLocation::Envelope,
            "partition" => PlacementLocation::Partition,
            other => {
                errors.push((
                    i,
                    format!("unknown location {other:?} in {entry:?}; expected header, envelope or partition"),
                ));
                continue;
            }
        };
        let alias = parts.get(2).unwrap_or(&parts[0]).to_string();
        out.push(Placement {
            column: parts[0].to_owned(),
            location,
            alias,
        });
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}
