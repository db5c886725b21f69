//! The router's output: the Kafka record to produce for one outbox row.

use std::sync::Arc;

use bytes::Bytes;

use crate::base::murmur2::java_partition;
use crate::base::trace_outcome::TraceOutcome;

/// A header: name and value (`None` = null value, from a NULL column).
pub type Header = (Arc<str>, Option<Bytes>);

/// The Kafka record to produce for one outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Destination topic (interned: repeated topics share one allocation).
    pub topic: Arc<str>,
    /// The aggregate id as plain bytes (its text; bytea decoded); `None` if it is NULL.
    pub key: Option<Bytes>,
    /// The payload as stored (or the envelope); `None` is a tombstone.
    pub value: Option<Bytes>,
    /// Headers, in order: id, type, configured extra headers, `traceparent` and `tracestate`,
    /// then the CloudEvents headers; with `route.position_headers`, the relay core adds
    /// `ferry-source` and `ferry-position` last.
    pub headers: Vec<Header>,
    /// An explicit partition from the partition column; `None` = choose by key.
    pub partition: Option<i32>,
    /// Record timestamp, ms since the Unix epoch.
    pub timestamp_ms: Option<i64>,
    /// The event id as read from its column (its text), for logs and errors; see
    /// [`Record::event_id_text`]. Bytes, not a `String`: a slice of the row, so that routing a
    /// row allocates nothing for an id that only an error would show.
    pub event_id: Bytes,
    /// What became of the row's trace context (`outbox.tracing_column`): the relay counts
    /// [`TraceOutcome::Malformed`] records; they are sent without the bad header.
    pub trace_context: TraceOutcome,
}

impl Record {
    /// The event id as text (invalid UTF-8 replaced), for logs and errors.
    pub fn event_id_text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.event_id)
    }

    /// The partition the Java producer would pick: the explicit one if set, else murmur2 of the
    /// key; `None` for a keyless record without an explicit partition (any partition will do).
    pub fn java_partition(&self, num_partitions: i32) -> Option<i32> {
        match (self.partition, &self.key) {
            (Some(p), _) => Some(p),
            (None, Some(k)) => Some(java_partition(k, num_partitions)),
            (None, None) => None,
        }
    }

    /// Bytes of key, value and headers (names and values): the record's payload size for
    /// in-flight accounting.
    pub fn size_bytes(&self) -> usize {
        let h: usize = self
            .headers
            .iter()
            .map(|(n, v)| n.len() + v.as_ref().map_or(0, Bytes::len))
            .sum();
        self.key.as_ref().map_or(0, Bytes::len) + self.value.as_ref().map_or(0, Bytes::len) + h
    }
}
