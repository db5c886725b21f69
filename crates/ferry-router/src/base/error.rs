//! Routing errors: a row that cannot be routed yields a [`RouteError`] naming the row's event id (when
//! it is known) and a typed [`RouteErrorReason`] whose `Display` says what is wrong, why, and how to
//! fix it. The router only reports; the binary applies `route.on_error`.

use std::fmt;

use crate::base::topic::TopicProblem;

/// The role a column plays, for error messages and the config key that maps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldRole {
    /// `outbox.id_column`
    EventId,
    /// `outbox.aggregate_id_column` (the key)
    AggregateId,
    /// `outbox.type_column` (the type header)
    EventType,
    /// `outbox.payload_column`
    Payload,
    /// `outbox.timestamp_column`
    Timestamp,
    /// `outbox.partition_column` or a `partition` placement
    Partition,
    /// A column used by `route.topic` or `route.rules`
    Topic,
    /// A column placed as a header (`route.headers`, `route.additional_placement`)
    Header,
    /// A column placed in the envelope (`route.envelope_fields`, `route.additional_placement`)
    Envelope,
    /// The trace-context column (`outbox.tracing_column`)
    TraceContext,
    /// A column of a CloudEvents attribute template (`route.cloudevents_source`, `_subject`)
    CloudEvents,
}

impl FieldRole {
    /// What the column is, in words.
    pub fn describe(self) -> &'static str {
        match self {
            FieldRole::EventId => "event id",
            FieldRole::AggregateId => "aggregate id (record key)",
            FieldRole::EventType => "event type",
            FieldRole::Payload => "payload",
            FieldRole::Timestamp => "timestamp",
            FieldRole::Partition => "partition",
            FieldRole::Topic => "topic routing input",
            FieldRole::Header => "extra header",
            FieldRole::Envelope => "envelope field",
            FieldRole::TraceContext => "trace context",
            FieldRole::CloudEvents => "CloudEvents attribute",
        }
    }

    /// The configuration key(s) that name the column.
    pub fn config_key(self) -> &'static str {
        match self {
            FieldRole::EventId => "outbox.id_column",
            FieldRole::AggregateId => "outbox.aggregate_id_column",
            FieldRole::EventType => {
                "outbox.type_column (or route.type_header = \"\" to send no type header)"
            }
            FieldRole::Payload => "outbox.payload_column",
            FieldRole::Timestamp => "outbox.timestamp_column",
            FieldRole::Partition => "outbox.partition_column / route.additional_placement",
            FieldRole::Topic => "route.topic / route.rules",
            FieldRole::Header => "route.headers / route.additional_placement",
            FieldRole::Envelope => "route.envelope_fields / route.additional_placement",
            FieldRole::TraceContext => "outbox.tracing_column",
            FieldRole::CloudEvents => {
                "route.cloudevents_source / route.cloudevents_subject (or route.cloudevents = \"none\")"
            }
        }
    }
}

/// Why a row could not be routed. (`Display` is written by hand below: each message says what,
/// why and how to fix it.)
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteErrorReason {
    /// The relation has no column of that name.
    MissingColumn {
        /// What the column is for.
        role: FieldRole,
        /// The configured column name.
        column: String,
    },
    /// A column that must have a value is NULL (the event id, or a column the topic needs).
    NullValue {
        /// What the column is for.
        role: FieldRole,
        /// The column.
        column: String,
    },
    /// The payload is NULL and `route.tombstone_on_null_payload` is off.
    NullPayload {
        /// The payload column.
        column: String,
    },
    /// A value cannot be used (bad bytea text, unparsable timestamp, partition out of range,
    /// unsupported binary type, text that is not UTF-8 in an envelope, ...).
    InvalidValue {
        /// What the column is for.
        role: FieldRole,
        /// The column.
        column: String,
        /// What is wrong with the value.
        problem: String,
    },
    /// The routed topic is not a legal Kafka topic name.
    InvalidTopic {
        /// The topic as rendered (lossy UTF-8, cut to 300 characters).
        topic: String,
        /// Which rule it breaks.
        problem: TopicProblem,
    },
    /// The record value is larger than `route.max_payload_bytes`.
    PayloadTooLarge {
        /// Its size in bytes.
        size: usize,
        /// The configured maximum.
        max: usize,
    },
    /// A table-less outbox message is not a valid document.
    InvalidMessage {
        /// What is wrong with it.
        problem: String,
    },
}

impl RouteErrorReason {
    /// A short, stable, low-cardinality name for metrics labels and the dead-letter header.
    pub fn code(&self) -> &'static str {
        match self {
            RouteErrorReason::MissingColumn { .. } => "missing_column",
            RouteErrorReason::NullValue { .. } => "null_value",
            RouteErrorReason::NullPayload { .. } => "null_payload",
            RouteErrorReason::InvalidValue { .. } => "invalid_value",
            RouteErrorReason::InvalidTopic { .. } => "invalid_topic",
            RouteErrorReason::PayloadTooLarge { .. } => "payload_too_large",
            RouteErrorReason::InvalidMessage { .. } => "invalid_message",
        }
    }
}

impl fmt::Display for RouteErrorReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteErrorReason::MissingColumn { role, column } => write!(
                f,
                "the outbox relation has no column {column:?} (used as the {}); set {} to an existing column, or add the column",
                role.describe(),
                role.config_key()
            ),
            RouteErrorReason::NullValue { role: FieldRole::Topic, column } => write!(
                f,
                "column {column:?} is NULL but the topic template needs its value; make the column NOT NULL, or route such rows with a route.rules entry or a fixed route.topic"
            ),
            RouteErrorReason::NullValue { role, column } => write!(
                f,
                "column {column:?} (the {}) is NULL; it must have a value (make it NOT NULL), or map another column with {}",
                role.describe(),
                role.config_key()
            ),
            RouteErrorReason::NullPayload { column } => write!(
                f,
                "the payload column {column:?} is NULL; set route.tombstone_on_null_payload = true to send a tombstone (null value) instead"
            ),
            RouteErrorReason::InvalidValue { role, column, problem } => write!(
                f,
                "column {column:?} (the {}) has a value that cannot be used: {problem}",
                role.describe()
            ),
            RouteErrorReason::InvalidTopic { topic, problem } => write!(
                f,
                "the routed topic {topic:?} is not a legal Kafka topic name: {problem}; the value comes from the row (fix what the writer stores) or from the route.topic / route.rules template"
            ),
            RouteErrorReason::PayloadTooLarge { size, max } => write!(
                f,
                "the record value is {size} bytes, over route.max_payload_bytes = {max}; shrink the payload, or raise the limit together with librdkafka's message.max.bytes and the topic's max.message.bytes"
            ),
            RouteErrorReason::InvalidMessage { problem } => write!(
                f,
                "the table-less outbox message is not a valid outbox document: {problem}; it must be a JSON object with the configured column names as keys"
            ),
        }
    }
}

/// A row that could not be routed: its event id (if it could be read) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot route outbox event {}: {reason}", shown_id(.event_id.as_deref()))]
pub struct RouteError {
    /// The row's event id, if it could be read.
    pub event_id: Option<String>,
    /// Why it could not be routed.
    pub reason: RouteErrorReason,
}

impl RouteError {
    /// Shorthand for [`RouteErrorReason::code`].
    pub fn code(&self) -> &'static str {
        self.reason.code()
    }
}

fn shown_id(id: Option<&str>) -> String {
    match id {
        Some(id) => format!("{id:?}"),
        None => "(event id unknown)".to_owned(),
    }
}

/// The rendered topic, shortened for an error message.
pub(crate) fn shown_topic(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    if s.chars().count() > 300 {
        let mut t: String = s.chars().take(300).collect();
        t.push('…');
        t
    } else {
        s.into_owned()
    }
}
