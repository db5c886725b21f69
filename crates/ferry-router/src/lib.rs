//! Ferry's router: a pure function from an outbox row (or a table-less outbox message) to the Kafka
//! record to produce: topic, key, headers, value, partition and timestamp. No I/O, no rdkafka, no
//! tokio.
//!
//! This is where "point Ferry at the outbox table you already have" is won or lost, so every column
//! is configurable and the defaults are Debezium's Outbox Event Router's: a Debezium user changes a
//! config file, not an application.
//!
//! | Debezium (`transforms.outbox.*`)        | Ferry                                              |
//! |-----------------------------------------|----------------------------------------------------|
//! | `table.field.event.id` = `id`           | `outbox.id_column` = `"id"` (sent as header `id`)  |
//! | `table.field.event.key` = `aggregateid` | `outbox.aggregate_id_column` = `"aggregateid"`     |
//! | `table.field.event.payload` = `payload` | `outbox.payload_column` = `"payload"`              |
//! | `table.field.event.timestamp`           | `outbox.timestamp_column`                          |
//! | `route.by.field` = `aggregatetype`      | `outbox.aggregate_type_column` = `"aggregatetype"` |
//! | `route.topic.replacement` = `outbox.event.${routedByValue}` | `route.topic` = `"outbox.event.{aggregatetype}"` |
//! | `route.topic.regex` + `route.topic.replacement` | a `[[route.rules]]` entry with `regex` and `$1`/`${name}` |
//! | `route.tombstone.on.empty.payload`      | `route.tombstone_on_null_payload`                  |
//! | `table.fields.additional.placement`     | `route.additional_placement` (same syntax)         |
//! | `tracing.span.context.field`            | `outbox.tracing_column`                            |
//!
//! # What a row becomes
//! - **Topic**: the `route.topic` template over columns (`{column}` placeholders; default
//!   `outbox.event.{aggregatetype}`), unless a `[[route.rules]]` entry matches first (exact value or
//!   whole-value regex). A template without placeholders is a fixed topic. The result must be a legal
//!   Kafka topic name (`[a-zA-Z0-9._-]`, 1 to 249 characters, not `.`/`..`); otherwise the row is a
//!   routing error, never a mangled name.
//! - **Key**: the aggregate id's text (bytea decoded), never JSON-quoted, so all events of an
//!   aggregate share a partition and stay in order. The partition is the Java client's
//!   ([`java_partition`]: `toPositive(murmur2(key)) % n`) unless a partition column is mapped.
//!   A NULL aggregate id gives a keyless record.
//! - **Headers**: `id` (event id, for consumer-side deduplication) and `type` by default (names
//!   configurable, `""` to omit), then `[[route.headers]]` and `header` placements. Values are the
//!   column's text bytes (bytea decoded); a NULL column gives a null header value. With
//!   `outbox.tracing_column`, `traceparent` and `tracestate` ([`trace`]); with `route.cloudevents`,
//!   the CloudEvents binding's `ce_*` and `content-type` headers ([`cloudevents`]).
//! - **Value**: the payload as stored: json/jsonb/text as their UTF-8 text, bytea decoded to raw
//!   bytes, zero-copy. With `route.envelope = true` it is `{"payload": <payload>, <fields>...}`
//!   (json/jsonb embedded as JSON, text as a JSON string, bytea as base64, integers as numbers).
//!   A NULL payload is a tombstone when `route.tombstone_on_null_payload`, else a routing error.
//! - **Timestamp**: the commit time, or the mapped timestamp column when it is not NULL.
//!
//! Errors name the event id and the reason ([`RouteError`]); the binary applies `route.on_error`
//! (`fail`, `skip`, `dead_letter`; [`Router::dead_letter`] builds the dead-letter record).
//!
//! # Layers
//! Data flows compile → route → encode: the configuration is compiled once into a [`Router`],
//! which turns each row into a [`Record`] and has the encoders write its bytes. The source is in
//! four layers along that flow, and each imports only the layers below it:
//!
//! ```text
//!  route    row or message -> Record    router, routers (one per table), message
//!    |        uses the compiled plans and the encoders
//!    v
//!  compile  configuration -> plans      config, validate, tables, topic_plan, cloudevents
//!    |        checks the configuration against what the encoders send (formats, headers)
//!    v
//!  encode   values -> bytes             format (Kafka Connect), jackson, expand, json,
//!    |                                  cloudevents, trace, properties
//!    v
//!  base     shared vocabulary           row, value, read, record, error, topic, template,
//!                                       table_name, trace_outcome, size, spelling, murmur2,
//!                                       timestamp
//! ```
//!
//! A layer is a directory of `src/`; its modules keep their public paths
//! (`ferry_router::config`, `ferry_router::cloudevents`, ...) through re-exports here.
//! `tests/layers.rs` fails, naming the file and line, on an import that goes up a layer or
//! around the layers through the crate root, and on an import circle between modules.
//!
//! # Configuration
//! The full reference is `config.md` beside this crate's `Cargo.toml`. An example:
//!
//! ```toml
//! [outbox]
//! table = "public.outbox"              # "schema.table" or "table" (schema public)
//! id_column = "id"
//! aggregate_type_column = "aggregatetype"
//! aggregate_id_column = "aggregateid"
//! type_column = "type"
//! payload_column = "payload"
//! timestamp_column = "created_at"      # optional; default: commit time
//! # partition_column = "partition"     # optional; default: murmur2 of the key
//! message_prefix = "outbox"            # optional; table-less outbox messages
//! tracing_column = "tracingspancontext" # optional; traceparent/tracestate headers
//!
//! [route]
//! topic = "outbox.event.{aggregatetype}"
//! id_header = "id"
//! type_header = "type"
//! envelope = false
//! tombstone_on_null_payload = false
//! max_payload_bytes = 983040
//! on_error = "dead_letter"             # "fail" (default) | "skip" | "dead_letter"
//! dead_letter_topic = "outbox.dead-letter"
//! additional_placement = "tenant:header:tenant-id"
//! cloudevents = "binary"               # "none" (default) | "binary" | "structured"
//! cloudevents_source = "/ferry/shop/outbox"
//!
//! [[route.rules]]
//! column = "aggregatetype"
//! equals = "Order"
//! topic = "orders"
//!
//! [[route.rules]]
//! column = "aggregatetype"
//! regex = "legacy_(?<name>.+)"
//! topic = "legacy.${name}"
//!
//! [[route.headers]]
//! column = "tenant_region"
//! name = "region"
//! ```
//!
//! ```
//! use ferry_router::{OutboxConfig, RouteConfig, Router, SimpleRow, oid};
//! let router = Router::new(&OutboxConfig::default(), &RouteConfig::default()).unwrap();
//! let row = SimpleRow::new()
//!     .with("id", oid::UUID, "4d47e190-0402-4048-bc2c-89dd54343cdc")
//!     .with("aggregatetype", oid::VARCHAR, "order")
//!     .with("aggregateid", oid::VARCHAR, "42")
//!     .with("type", oid::VARCHAR, "OrderCreated")
//!     .with("payload", oid::JSONB, r#"{"total": 39.98}"#);
//! let record = router.route_row(&row, 1_795_341_600_000_000).unwrap();
//! assert_eq!(&*record.topic, "outbox.event.order");
//! assert_eq!(record.key.as_deref(), Some(&b"42"[..]));
//! assert_eq!(record.value.as_deref(), Some(&br#"{"total": 39.98}"#[..]));
//! assert_eq!(record.timestamp_ms, Some(1_795_341_600_000));
//! ```

#[macro_use]
mod base;
mod compile;
mod encode;
mod route;

// Each module under the path it had before the layers, for other crates.
pub use base::{error, murmur2, row, size, spelling, template, timestamp, topic, value};
pub use compile::{config, topic_plan};
pub use encode::{cloudevents, format, properties, trace};
pub use route::message;
pub mod tables;

pub use base::error::{FieldRole, RouteError, RouteErrorReason};
pub use base::murmur2::{java_partition, murmur2, to_positive};
pub use base::record::{Header, Record};
pub use base::row::{oid, ColumnRef, OutboxRow, SimpleColumn, SimpleRow, Slot, Value};
pub use base::topic::{validate_topic, TopicProblem, MAX_TOPIC_LENGTH};
pub use base::trace_outcome::{TraceOutcome, TraceProblem};
pub use base::value::renders_binary;
pub use compile::config::{
    CloudEventsMode, CreateTopicsConfig, ExpandNullBehavior, HeaderConfig, OnError, OutboxConfig,
    Placement, PlacementLocation, RecordFormat, RouteConfig, RuleConfig, TableName,
    POSITION_HEADER, SOURCE_HEADER,
};
pub use compile::tables::{validate_tables, TableConfig};
pub use compile::topic_plan::TOPIC_CACHE_CAPACITY;
pub use compile::validate::{validate, ConfigErrors, ConfigProblem};
pub use ferry_pgtypes::PgTimestamp;
pub use route::router::{
    ColumnRequirement, Router, DEAD_LETTER_CODE_HEADER, DEAD_LETTER_REASON_HEADER, PARTITION_TYPES,
    PAYLOAD_TYPES, TIMESTAMP_TYPES,
};
pub use route::routers::Routers;
