//! The router: a pure function from one outbox row (or table-less message) to the Kafka record to
//! produce, compiled once from the configuration.
//!
//! # The hot path
//! With the default mapping a row costs a handful of column look-ups, `Bytes` clones (reference
//! counts, no copies) for key, value and headers, one `Vec` for the headers, one `String` for the
//! event id, and one hash look-up in the topic cache (see [`crate::topic_plan`]): no regex, no
//! topic rendering and no topic allocation for a topic seen before. About 0.3 µs per row on the
//! development machine (`tests/bench.rs`).
//!
//! What the optional outputs add per row (release build, best of five interleaved rounds, two
//! runs agreeing within 5%, on a 2-core machine shared with other builds; the default mapping's
//! best was 216 ns):
//!
//! | option | best ns/row | extra | why |
//! |---|---|---|---|
//! | `outbox.tracing_column`, bare `traceparent` | 311 | +95 | one more column to find, the W3C checks; the header is a slice of the column's bytes |
//! | the same, Debezium's Properties text | 557 | +341 | the `Properties.load` grammar; one copy for an escaped value (`\=` in `tracestate`) |
//! | the same, malformed | 247 | +31 | mostly finding the column; it fails at the first broken rule |
//! | `route.cloudevents = "binary"` | 372 | +156 | seven more headers, `ce_time` written into a fixed buffer and copied once |
//! | `"binary"` with a source template | 431 | +215 | renders the template per row and checks it is URI text |
//! | `"structured"` | 508 | +292 | writes the value again as one JSON event |
//! | `route.key_format` and `value_format = "json"` | 288 (301) | +56 (+60) | key and value copied once each through the Jackson escaper |
//! | `value_format = "json_expanded"` | 481 | +226 (default 254 in that run) | parses the payload into a tree and writes it again: allocations per member; a 16-byte payload here, so it grows with the document |
//! | both `"json_with_schema"` | 336 (349) | +104 (+108) | the same plus the schema text; default mapping 232 (241) in that run (two runs, the second in brackets; measured 2026-11-24 beside a chaos run) |
//! | `value_format = "json_expanded"`, a ~300 B order | 2,062 | +1,816 (default 246 in that run) | the same tree over a nested object, an array of objects and 13 members (2026-11-25, best of 5) |
//! | `value_format = "json_expanded_with_schema"`, 16 B / ~300 B | 569 / 2,518 | +326 / +2,272 | the tree, then the inferred schema written before the struct |

use std::sync::Arc;

use bytes::Bytes;

use crate::base::error::{FieldRole, RouteError, RouteErrorReason};
use crate::base::read::{column, column_for, invalid, value};
use crate::base::record::Record;
use crate::base::row::{oid, OutboxRow, SimpleRow, Slot};
use crate::base::value::{natural_bytes, partition, timestamp_ms};
use crate::compile::cloudevents::compile_cloudevents;
use crate::compile::config::{
    parse_additional_placement, ExpandNullBehavior, OnError, OutboxConfig, PlacementLocation,
    RouteConfig, TableName, ENVELOPE_PAYLOAD_KEY,
};
use crate::compile::topic_plan::TopicPlan;
use crate::compile::validate::{problem, validate, ConfigErrors, ConfigProblem};
use crate::encode::cloudevents::{CloudEvents, Event};
use crate::encode::format::{write_formatted, write_payload, RecordFormat, JSON_FORMAT_TYPES};
use crate::encode::json::write_json;
use crate::encode::trace::{
    read_trace_context, TraceOutcome, TRACEPARENT_HEADER, TRACESTATE_HEADER,
};
use crate::route::message::parse_message;

/// Headers `route.position_headers` adds: [`crate::SOURCE_HEADER`] and [`crate::POSITION_HEADER`].
const POSITION_HEADER_SLOTS: usize = 2;

/// Dead-letter header with the routing error, in words.
pub const DEAD_LETTER_REASON_HEADER: &str = "ferry.error";
/// Dead-letter header with the routing error's code ([`RouteErrorReason::code`]).
pub const DEAD_LETTER_CODE_HEADER: &str = "ferry.error.code";

/// Routes outbox rows to Kafka records. Cheap to share between threads (`Send + Sync`).
#[derive(Debug)]
pub struct Router {
    table: TableName,
    message_prefix: Option<String>,
    id_col: String,
    aggregate_id_col: String,
    type_col: String,
    payload_col: String,
    timestamp_col: Option<String>,
    partition_col: Option<String>,
    /// `outbox.tracing_column` and the interned `traceparent` / `tracestate` header names.
    tracing: Option<(String, Arc<str>, Arc<str>)>,
    /// `route.cloudevents` other than `none`.
    cloudevents: Option<CloudEvents>,
    /// Most headers a record can have (one allocation per record), the two of
    /// `route.position_headers` included: the relay core adds them after routing.
    header_capacity: usize,
    /// `route.position_headers` (the first table's, for every table: see [`crate::Routers`]).
    position_headers: bool,
    id_header: Option<Arc<str>>,
    type_header: Option<Arc<str>>,
    extra_headers: Vec<(String, Arc<str>)>,
    /// `(column, key)` pairs when envelope mode is on.
    envelope: Option<Vec<(String, String)>>,
    topic: TopicPlan,
    tombstone_on_null_payload: bool,
    send_null_payload: bool,
    max_payload_bytes: usize,
    on_error: OnError,
    dead_letter_topic: Option<Arc<str>>,
    /// `route.key_format` and the key schema's `optional`.
    key_format: (RecordFormat, bool),
    /// `route.value_format` and the value schema's `optional`.
    value_format: (RecordFormat, bool),
    /// `route.expand_null_behavior`.
    expand_null_behavior: ExpandNullBehavior,
    /// Every column read, with the key that names it and the types it can be read from.
    requirements: Vec<ColumnRequirement>,
}

/// A column the router reads from every row: its name, the configuration key that names it (for
/// messages: `outbox.type_column`, `route.rules[2].column`), and the column types it can read it
/// from (`None`: any type, read as its text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnRequirement {
    pub column: String,
    pub config_key: String,
    pub accepted_types: Option<&'static [u32]>,
}

/// Types a payload is read from (the value as stored).
pub const PAYLOAD_TYPES: &[u32] = &[oid::JSONB, oid::JSON, oid::TEXT, oid::VARCHAR, oid::BYTEA];
/// Types a record timestamp is read from (a timestamp, epoch milliseconds, or timestamp text).
pub const TIMESTAMP_TYPES: &[u32] = &[
    oid::TIMESTAMPTZ,
    oid::TIMESTAMP,
    oid::INT2,
    oid::INT4,
    oid::INT8,
    oid::TEXT,
    oid::VARCHAR,
];
/// Types an explicit partition is read from (an integer, or integer text).
pub const PARTITION_TYPES: &[u32] = &[
    oid::INT2,
    oid::INT4,
    oid::INT8,
    oid::OID,
    oid::TEXT,
    oid::VARCHAR,
];

impl Router {
    /// Validates the configuration (every problem, with key paths) and compiles the router.
    pub fn new(outbox: &OutboxConfig, route: &RouteConfig) -> Result<Router, ConfigErrors> {
        validate(outbox, route)?;
        let table = outbox
            .table_name()
            .map_err(|e| problem("outbox.table", e))?;
        let placements = match &route.additional_placement {
            Some(spec) => parse_additional_placement(spec).map_err(|e| ConfigErrors {
                problems: e
                    .into_iter()
                    .map(|(i, m)| ConfigProblem::new(format!("route.additional_placement[{i}]"), m))
                    .collect(),
            })?,
            None => Vec::new(),
        };
        let mut partition_col = outbox.partition_column.clone();
        let mut extra_headers: Vec<(String, Arc<str>)> = route
            .headers
            .iter()
            .map(|h| (h.column.clone(), Arc::from(h.header_name())))
            .collect();
        let mut envelope: Vec<(String, String)> = route
            .envelope_fields
            .iter()
            .map(|f| (f.clone(), f.clone()))
            .collect();
        for p in placements {
            match p.location {
                PlacementLocation::Header => extra_headers.push((p.column, Arc::from(p.alias))),
                PlacementLocation::Envelope => envelope.push((p.column, p.alias)),
                PlacementLocation::Partition => partition_col = Some(p.column),
            }
        }

        let header = |name: &str| (!name.is_empty()).then(|| Arc::from(name));
        let mut requirements: Vec<ColumnRequirement> = Vec::new();
        let mut need = |column: &str, key: String, types: Option<&'static [u32]>| {
            if let Some(r) = requirements.iter_mut().find(|r| r.column == column) {
                // Read in two roles: the narrower list of types holds.
                if let Some(t) = types {
                    if r.accepted_types.is_none_or(|a| t.len() < a.len()) {
                        r.accepted_types = Some(t);
                    }
                }
                return;
            }
            requirements.push(ColumnRequirement {
                column: column.to_owned(),
                config_key: key,
                accepted_types: types,
            });
        };
        need(&outbox.id_column, "outbox.id_column".into(), None);
        let json_key = route.key_format != RecordFormat::AsStored;
        need(
            &outbox.aggregate_id_column,
            if json_key {
                format!(
                    "outbox.aggregate_id_column (route.key_format = \"{}\")",
                    route.key_format
                )
            } else {
                "outbox.aggregate_id_column".into()
            },
            json_key.then_some(JSON_FORMAT_TYPES),
        );
        need(
            &outbox.payload_column,
            "outbox.payload_column".into(),
            Some(PAYLOAD_TYPES),
        );
        if !route.type_header.is_empty() {
            need(
                &outbox.type_column,
                "outbox.type_column (route.type_header)".into(),
                None,
            );
        }
        let cloudevents = compile_cloudevents(outbox, route, &table)?;
        if let Some(ce) = &cloudevents {
            need(
                &outbox.type_column,
                "outbox.type_column (the CloudEvents type)".into(),
                None,
            );
            for (c, key) in ce.columns() {
                need(c, key.into(), None);
            }
        }
        if let Some(c) = &outbox.tracing_column {
            need(c, "outbox.tracing_column".into(), None);
        }
        if let Some(c) = &outbox.timestamp_column {
            need(c, "outbox.timestamp_column".into(), Some(TIMESTAMP_TYPES));
        }
        if let Some(c) = &partition_col {
            let key = if outbox.partition_column.as_deref() == Some(c.as_str()) {
                "outbox.partition_column"
            } else {
                "route.additional_placement"
            };
            need(c, key.into(), Some(PARTITION_TYPES));
        }
        for (c, _) in &extra_headers {
            let key = if route.headers.iter().any(|h| &h.column == c) {
                "route.headers"
            } else {
                "route.additional_placement"
            };
            need(c, key.into(), None);
        }
        if route.envelope {
            let json_value = route.value_format != RecordFormat::AsStored;
            for (c, _) in &envelope {
                let key = if route.envelope_fields.contains(c) {
                    "route.envelope_fields"
                } else {
                    "route.additional_placement"
                };
                need(c, key.into(), json_value.then_some(JSON_FORMAT_TYPES));
            }
        }
        for (i, r) in route.rules.iter().enumerate() {
            need(&r.column, format!("route.rules[{i}].column"), None);
        }
        let template = route.topic_template(outbox);
        let plan = TopicPlan::compile(outbox, route)?;
        for c in plan.inputs() {
            let key = if route.topic.is_none() && *c == outbox.aggregate_type_column {
                "outbox.aggregate_type_column (in the topic template)".to_owned()
            } else {
                format!("route.topic ({template:?})")
            };
            need(c, key, None);
        }
        Ok(Router {
            table,
            message_prefix: outbox.message_prefix.clone(),
            id_col: outbox.id_column.clone(),
            aggregate_id_col: outbox.aggregate_id_column.clone(),
            type_col: outbox.type_column.clone(),
            payload_col: outbox.payload_column.clone(),
            timestamp_col: outbox.timestamp_column.clone(),
            partition_col,
            tracing: outbox.tracing_column.as_ref().map(|c| {
                (
                    c.clone(),
                    Arc::from(TRACEPARENT_HEADER),
                    Arc::from(TRACESTATE_HEADER),
                )
            }),
            header_capacity: 2
                + extra_headers.len()
                + if outbox.tracing_column.is_some() {
                    2
                } else {
                    0
                }
                + if cloudevents.is_some() {
                    crate::encode::cloudevents::HEADER_NAMES.len()
                } else {
                    0
                }
                + POSITION_HEADER_SLOTS * usize::from(route.position_headers),
            position_headers: route.position_headers,
            cloudevents,
            id_header: header(&route.id_header),
            type_header: header(&route.type_header),
            extra_headers,
            envelope: route.envelope.then_some(envelope),
            topic: plan,
            requirements,
            tombstone_on_null_payload: route.tombstone_on_null_payload,
            send_null_payload: route.send_null_payload,
            max_payload_bytes: route.max_payload_bytes,
            on_error: route.on_error,
            dead_letter_topic: route.dead_letter_topic.as_deref().map(Arc::from),
            key_format: (route.key_format, route.key_schema_optional),
            value_format: (route.value_format, route.value_schema_optional),
            expand_null_behavior: route.expand_null_behavior,
        })
    }

    /// The outbox table (schema and name as PostgreSQL stores them).
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// Every column the router reads from a row (deduplicated, in no particular order).
    pub fn columns(&self) -> Vec<&str> {
        let mut cols: Vec<&str> = [&self.id_col, &self.aggregate_id_col, &self.payload_col]
            .into_iter()
            .chain(
                (self.type_header.is_some() || self.cloudevents.is_some())
                    .then_some(&self.type_col),
            )
            .chain(self.timestamp_col.iter())
            .chain(self.partition_col.iter())
            .chain(self.tracing.iter().map(|(c, _, _)| c))
            .chain(self.extra_headers.iter().map(|(c, _)| c))
            .chain(self.envelope.iter().flatten().map(|(c, _)| c))
            .chain(self.topic.inputs().iter())
            .map(String::as_str)
            .chain(
                self.cloudevents
                    .iter()
                    .flat_map(|ce| ce.columns())
                    .map(|(c, _)| c),
            )
            .collect();
        cols.sort_unstable();
        cols.dedup();
        cols
    }

    /// Every column the router reads, with the key that names it and the types it accepts: what
    /// the table must have for rows to be routable (checked before streaming, and by
    /// `ferry check`).
    pub fn required_columns(&self) -> &[ColumnRequirement] {
        &self.requirements
    }

    /// The column each [`Slot`] names for this router (`None`: the slot is not read, as
    /// [`Slot::TopicInput`] when the topic plan reads no column or several). A row that knows
    /// where these columns are in its relation can answer [`OutboxRow::column_for`] by place.
    pub fn slot_columns(&self) -> [Option<&str>; Slot::COUNT] {
        let topic = self.topic.inputs();
        Slot::ALL.map(|slot| match slot {
            Slot::EventId => Some(self.id_col.as_str()),
            Slot::AggregateId => Some(self.aggregate_id_col.as_str()),
            Slot::Payload => Some(self.payload_col.as_str()),
            Slot::EventType => Some(self.type_col.as_str()),
            Slot::TopicInput => match topic {
                [one] => Some(one.as_str()),
                _ => None,
            },
        })
    }

    /// The columns the topic depends on (the topic template's placeholders and the rules'
    /// columns): rows that agree on them go to the same topic.
    pub fn topic_columns(&self) -> &[String] {
        self.topic.inputs()
    }

    /// The prefix of table-less outbox messages, if configured.
    pub fn message_prefix(&self) -> Option<&str> {
        self.message_prefix.as_deref()
    }

    /// The configured error policy (applied by the caller).
    pub fn on_error(&self) -> OnError {
        self.on_error
    }

    /// `outbox.timestamp_column`, if mapped.
    pub fn timestamp_column(&self) -> Option<&str> {
        self.timestamp_col.as_deref()
    }

    /// `route.position_headers`: the relay core adds [`crate::SOURCE_HEADER`] and [`crate::POSITION_HEADER`]
    /// to each record this router makes (room for them is reserved, so adding them does not
    /// grow the headers' allocation).
    pub fn position_headers(&self) -> bool {
        self.position_headers
    }

    /// The dead-letter topic (`on_error = "dead_letter"`, or `"fail"` with a topic for
    /// `ferry run --dead-letter-event`).
    pub fn dead_letter_topic(&self) -> Option<&str> {
        self.dead_letter_topic.as_deref()
    }

    /// Routes one outbox row. `commit_time_micros` is the transaction's commit time in
    /// microseconds since the **Unix** epoch (convert PostgreSQL's 2000-01-01 epoch first; see
    /// [`crate::PgTimestamp::to_unix_micros`]); it is the record timestamp unless a timestamp column is
    /// mapped and non-NULL.
    pub fn route_row<R: OutboxRow + ?Sized>(
        &self,
        row: &R,
        commit_time_micros: i64,
    ) -> Result<Record, RouteError> {
        let id = self.event_id(row).map_err(|reason| RouteError {
            event_id: None,
            reason,
        })?;
        match self.route_inner(row, &id, commit_time_micros) {
            Ok(mut record) => {
                // Moved, not cloned: a clone and a drop of a shared `Bytes` are two atomic
                // operations behind an indirect call.
                record.event_id = id;
                Ok(record)
            }
            Err(reason) => Err(RouteError {
                event_id: Some(String::from_utf8_lossy(&id).into_owned()),
                reason,
            }),
        }
    }

    /// Routes one table-less outbox message (the content of a logical decoding message with the
    /// configured prefix; format in [`crate::message`]).
    pub fn route_message(
        &self,
        content: &Bytes,
        commit_time_micros: i64,
    ) -> Result<Record, RouteError> {
        let mut row = parse_message(content).map_err(|problem| RouteError {
            event_id: None,
            reason: RouteErrorReason::InvalidMessage { problem },
        })?;
        self.absent_optional_members_are_null(&mut row);
        self.route_row(&row, commit_time_micros)
    }

    /// In a message, an absent timestamp, partition, trace-context, extra-header, envelope-field
    /// or CloudEvents source/subject member is NULL (a document has no fixed set of columns); the
    /// other mapped members stay required.
    fn absent_optional_members_are_null(&self, row: &mut SimpleRow) {
        let optional = self
            .timestamp_col
            .iter()
            .chain(self.partition_col.iter())
            .chain(self.tracing.iter().map(|(c, _, _)| c))
            .chain(self.extra_headers.iter().map(|(c, _)| c))
            .chain(self.envelope.iter().flatten().map(|(c, _)| c))
            .map(String::as_str)
            .chain(
                self.cloudevents
                    .iter()
                    .flat_map(|ce| ce.columns())
                    .map(|(c, _)| c),
            )
            .map(str::to_owned)
            .collect::<Vec<_>>();
        for col in optional {
            if row.column(&col).is_none() {
                row.push(&col, oid::TEXT, None);
            }
        }
    }

    /// The dead-letter record for a row that failed with `error`, when `route.dead_letter_topic`
    /// is set (`on_error = "dead_letter"`, or `"fail"` for `ferry run --dead-letter-event`; else
    /// `None`). Best effort, never failing: key and value are the row's aggregate id and
    /// payload as far as they can be read (no value if the payload was too large), headers are the
    /// event id and [`DEAD_LETTER_REASON_HEADER`] / [`DEAD_LETTER_CODE_HEADER`].
    pub fn dead_letter<R: OutboxRow + ?Sized>(
        &self,
        row: &R,
        error: &RouteError,
        commit_time_micros: i64,
    ) -> Option<Record> {
        let read = |name: &str| {
            row.column(name).and_then(|c| {
                c.value
                    .and_then(|v| natural_bytes(c.type_oid, c.binary, v).ok())
            })
        };
        let value = read(&self.payload_col).filter(|v| v.len() <= self.max_payload_bytes);
        self.dead_letter_record(
            read(&self.aggregate_id_col),
            value,
            error,
            commit_time_micros,
        )
    }

    /// The dead-letter record for a table-less message that failed with `error` (see
    /// [`Router::dead_letter`]); the value is the payload if the document parses, else the whole
    /// message content.
    pub fn dead_letter_message(
        &self,
        content: &Bytes,
        error: &RouteError,
        commit_time_micros: i64,
    ) -> Option<Record> {
        match parse_message(content) {
            Ok(mut row) => {
                self.absent_optional_members_are_null(&mut row);
                self.dead_letter(&row, error, commit_time_micros)
            }
            Err(_) => {
                let value = Some(content.clone()).filter(|v| v.len() <= self.max_payload_bytes);
                self.dead_letter_record(None, value, error, commit_time_micros)
            }
        }
    }

    fn dead_letter_record(
        &self,
        key: Option<Bytes>,
        value: Option<Bytes>,
        error: &RouteError,
        commit_time_micros: i64,
    ) -> Option<Record> {
        // Set only under `dead_letter`, or under `fail` for `ferry run --dead-letter-event`.
        let topic = self.dead_letter_topic.clone()?;
        let mut headers =
            Vec::with_capacity(3 + POSITION_HEADER_SLOTS * usize::from(self.position_headers));
        if let (Some(name), Some(id)) = (&self.id_header, &error.event_id) {
            headers.push((name.clone(), Some(Bytes::from(id.clone()))));
        }
        headers.push((
            Arc::from(DEAD_LETTER_REASON_HEADER),
            Some(Bytes::from(error.to_string())),
        ));
        headers.push((
            Arc::from(DEAD_LETTER_CODE_HEADER),
            Some(Bytes::from_static(error.code().as_bytes())),
        ));
        Some(Record {
            topic,
            key,
            value,
            headers,
            partition: None,
            timestamp_ms: Some(commit_time_micros.div_euclid(1000)),
            event_id: error.event_id.clone().map(Bytes::from).unwrap_or_default(),
            trace_context: TraceOutcome::None,
        })
    }

    fn event_id<R: OutboxRow + ?Sized>(&self, row: &R) -> Result<Bytes, RouteErrorReason> {
        let c = column_for(row, Slot::EventId, &self.id_col, FieldRole::EventId)?;
        match value(&c, &self.id_col, FieldRole::EventId)? {
            Some(v) => Ok(v),
            None => Err(RouteErrorReason::NullValue {
                role: FieldRole::EventId,
                column: self.id_col.clone(),
            }),
        }
    }

    fn route_inner<R: OutboxRow + ?Sized>(
        &self,
        row: &R,
        id: &Bytes,
        commit_time_micros: i64,
    ) -> Result<Record, RouteErrorReason> {
        let topic = self.topic.topic(row)?;
        let c = column_for(
            row,
            Slot::AggregateId,
            &self.aggregate_id_col,
            FieldRole::AggregateId,
        )?;
        let key = value(&c, &self.aggregate_id_col, FieldRole::AggregateId)?;
        let key = match self.key_format {
            (RecordFormat::AsStored, _) => key,
            (format, optional) => {
                let mut buf = Vec::with_capacity(key.as_ref().map_or(4, |k| k.len() + 96));
                write_formatted(&mut buf, format, c.type_oid, optional, key.as_deref())
                    .map_err(|p| invalid(FieldRole::AggregateId, &self.aggregate_id_col, p))?;
                Some(Bytes::from(buf))
            }
        };
        let (mut value, data_type) = self.value(row)?;

        let mut headers = Vec::with_capacity(self.header_capacity);
        if let Some(name) = &self.id_header {
            headers.push((name.clone(), Some(id.clone())));
        }
        let mut event_type = if self.type_header.is_some() || self.cloudevents.is_some() {
            let c = column_for(row, Slot::EventType, &self.type_col, FieldRole::EventType)?;
            self::value(&c, &self.type_col, FieldRole::EventType)?
        } else {
            None
        };
        if let Some(name) = &self.type_header {
            let value = match &self.cloudevents {
                Some(_) => event_type.clone(),
                None => event_type.take(),
            };
            headers.push((name.clone(), value));
        }
        for (col, name) in &self.extra_headers {
            let c = column(row, col, FieldRole::Header)?;
            headers.push((name.clone(), self::value(&c, col, FieldRole::Header)?));
        }
        let mut trace_context = TraceOutcome::None;
        if let Some((col, traceparent, tracestate)) = &self.tracing {
            let c = column(row, col, FieldRole::TraceContext)?;
            if let Some(v) = c.value {
                // Telemetry, never fatal: a value that cannot even be read is malformed too.
                let t = match natural_bytes(c.type_oid, c.binary, v) {
                    Ok(text) => read_trace_context(&text),
                    Err(_) => crate::encode::trace::TraceContext {
                        outcome: TraceOutcome::Malformed(
                            crate::encode::trace::TraceProblem::NotText,
                        ),
                        ..Default::default()
                    },
                };
                trace_context = t.outcome;
                if let Some(tp) = t.traceparent {
                    headers.push((traceparent.clone(), Some(tp)));
                }
                if let Some(ts) = t.tracestate {
                    headers.push((tracestate.clone(), Some(ts)));
                }
            }
        }

        let partition = match &self.partition_col {
            None => None,
            Some(col) => {
                let c = column(row, col, FieldRole::Partition)?;
                match c.value {
                    None => None,
                    Some(v) => Some(
                        partition(c.type_oid, c.binary, v)
                            .map_err(|problem| invalid(FieldRole::Partition, col, problem))?,
                    ),
                }
            }
        };
        let commit_ms = commit_time_micros.div_euclid(1000);
        let timestamp_ms = match &self.timestamp_col {
            None => commit_ms,
            Some(col) => {
                let c = column(row, col, FieldRole::Timestamp)?;
                match c.value {
                    None => commit_ms,
                    Some(v) => timestamp_ms(c.type_oid, c.binary, v)
                        .map_err(|problem| invalid(FieldRole::Timestamp, col, problem))?,
                }
            }
        };
        if let Some(ce) = &self.cloudevents {
            let event = Event {
                id,
                ty: event_type,
                type_column: &self.type_col,
                id_column: &self.id_col,
                payload_column: &self.payload_col,
                data_type,
                timestamp_ms,
            };
            ce.apply(row, event, &mut headers, &mut value)?;
            if let Some(v) = &value {
                self.check_size(v.len())?;
            }
        }
        Ok(Record {
            topic,
            key,
            value,
            headers,
            partition,
            timestamp_ms: Some(timestamp_ms),
            // Set by `route_row`, which owns it.
            event_id: Bytes::new(),
            trace_context,
        })
    }

    /// The record value and the type it has (the payload column's, or json for an envelope).
    fn value<R: OutboxRow + ?Sized>(
        &self,
        row: &R,
    ) -> Result<(Option<Bytes>, u32), RouteErrorReason> {
        let col = &self.payload_col;
        let c = column_for(row, Slot::Payload, col, FieldRole::Payload)?;
        let (format, optional) = self.value_format;
        let payload = match value(&c, col, FieldRole::Payload)? {
            None if self.tombstone_on_null_payload => return Ok((None, c.type_oid)),
            None if format == RecordFormat::AsStored && self.send_null_payload => {
                if self.envelope.is_none() {
                    return Ok((None, c.type_oid));
                }
                None
            }
            None if format == RecordFormat::AsStored => {
                return Err(RouteErrorReason::NullPayload {
                    column: col.clone(),
                })
            }
            // Kafka Connect's JsonConverter writes a NULL as `null` (with its schema, or as the
            // envelope's optional payload field), not as a tombstone.
            payload => payload,
        };
        if let Some(payload) = &payload {
            // Debezium's route.tombstone.on.empty.payload also treats a blank payload as empty.
            if self.tombstone_on_null_payload
                && c.type_oid != oid::BYTEA
                && payload.iter().all(u8::is_ascii_whitespace)
            {
                return Ok((None, c.type_oid));
            }
            self.check_size(payload.len())?;
        }
        let nulls = self.expand_null_behavior;
        let Some(fields) = &self.envelope else {
            if format == RecordFormat::AsStored {
                // Not NULL: that was refused above.
                return Ok((payload, c.type_oid));
            }
            let len = payload.as_ref().map_or(0, Bytes::len);
            let mut buf = Vec::with_capacity(len + len / 8 + 96);
            write_payload(
                &mut buf,
                format,
                c.type_oid,
                optional,
                payload.as_deref(),
                col,
                nulls,
            )
            .map_err(|problem| invalid(FieldRole::Payload, col, problem))?;
            self.check_size(buf.len())?;
            return Ok((Some(Bytes::from(buf)), oid::JSON));
        };
        // In an envelope, `json` writes each field as JsonConverter would (a jsonb payload as a
        // JSON string); `as_stored` embeds json as JSON (Debezium's expand.json.payload).
        let write = |buf: &mut Vec<u8>, ty: u32, v: Option<&[u8]>| match (format, v) {
            (RecordFormat::AsStored, None) => {
                buf.extend_from_slice(b"null");
                Ok(())
            }
            (RecordFormat::AsStored, Some(v)) => write_json(buf, ty, v),
            (_, v) => write_formatted(buf, RecordFormat::Json, ty, true, v),
        };
        let mut buf =
            Vec::with_capacity(payload.as_ref().map_or(4, Bytes::len) + 16 + 32 * fields.len());
        buf.extend_from_slice(b"{\"");
        buf.extend_from_slice(ENVELOPE_PAYLOAD_KEY.as_bytes());
        buf.extend_from_slice(b"\":");
        match format {
            RecordFormat::AsStored => write(&mut buf, c.type_oid, payload.as_deref()),
            // `json` or `json_expanded`: the schema formats are refused with an envelope.
            _ => write_payload(
                &mut buf,
                format,
                c.type_oid,
                true,
                payload.as_deref(),
                col,
                nulls,
            ),
        }
        .map_err(|problem| invalid(FieldRole::Payload, col, problem))?;
        for (fcol, key) in fields {
            buf.push(b',');
            let _ = serde_json::to_writer(&mut buf, key);
            buf.push(b':');
            let fc = column(row, fcol, FieldRole::Envelope)?;
            let v = value(&fc, fcol, FieldRole::Envelope)?;
            write(&mut buf, fc.type_oid, v.as_deref())
                .map_err(|problem| invalid(FieldRole::Envelope, fcol, problem))?;
        }
        buf.push(b'}');
        self.check_size(buf.len())?;
        Ok((Some(Bytes::from(buf)), oid::JSON))
    }

    fn check_size(&self, size: usize) -> Result<(), RouteErrorReason> {
        if size > self.max_payload_bytes {
            Err(RouteErrorReason::PayloadTooLarge {
                size,
                max: self.max_payload_bytes,
            })
        } else {
            Ok(())
        }
    }
}
