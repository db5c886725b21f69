//! The router: a pure function from one outbox row (or table-less message) to the Kafka record to
//! produce, compiled once from the configuration.
//!
//! # The hot path
//! With the default mapping a row costs a handful of column look-ups, `Bytes` clones (reference
//! counts, no copies) for key, value and headers, one `Vec` for the headers, one `String` for the
//! event id, and one hash look-up in the topic cache: the topic is a pure function of the values of
//! its *input columns* (those named by the template and the rules), so it is rendered, checked
//! against Kafka's rules and interned as an `Arc<str>` the first time a combination is seen and then
//! reused. No regex runs unless a rule has one, and then only on a cache miss. The cache is bounded
//! ([`TOPIC_CACHE_CAPACITY`]) and cleared when full, so a template over a high-cardinality column
//! costs a render per row but never unbounded memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

use crate::config::{
    parse_additional_placement, OnError, OutboxConfig, PlacementLocation, RouteConfig, TableName,
    ENVELOPE_PAYLOAD_KEY,
};
use crate::error::{shown_topic, FieldRole, RouteError, RouteErrorReason};
use crate::message::parse_message;
use crate::murmur2::java_partition;
use crate::row::{oid, ColumnRef, OutboxRow, SimpleRow};
use crate::template::{slot_of, GroupRef, Segment, Template};
use crate::topic::validate_topic;
use crate::validate::{compile_rule_regex, validate, ConfigErrors, ConfigProblem};
use crate::value::{natural_bytes, partition, timestamp_ms, write_json};

/// Most distinct topic-input combinations kept in the topic cache before it is cleared.
pub const TOPIC_CACHE_CAPACITY: usize = 4096;
/// Dead-letter header with the routing error, in words.
pub const DEAD_LETTER_REASON_HEADER: &str = "ferry.error";
/// Dead-letter header with the routing error's code ([`RouteErrorReason::code`]).
pub const DEAD_LETTER_CODE_HEADER: &str = "ferry.error.code";

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
    /// Headers, in order: id, type, then configured extra headers.
    pub headers: Vec<Header>,
    /// An explicit partition from the partition column; `None` = choose by key.
    pub partition: Option<i32>,
    /// Record timestamp, ms since the Unix epoch.
    pub timestamp_ms: Option<i64>,
    /// The event id, for logs and errors.
    pub event_id: String,
}

impl Record {
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

#[derive(Debug)]
enum Matcher {
    Equals(Box<[u8]>),
    Regex(regex::bytes::Regex),
}

#[derive(Debug)]
enum Target {
    Fixed(Arc<str>),
    Template(Template),
}

#[derive(Debug)]
struct Rule {
    slot: usize,
    matcher: Matcher,
    target: Target,
}

#[derive(Debug)]
struct TopicPlan {
    /// Columns the topic depends on; template slots index this list.
    inputs: Vec<String>,
    rules: Vec<Rule>,
    default: Target,
    cache: Mutex<HashMap<Box<[u8]>, Arc<str>>>,
}

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
    id_header: Option<Arc<str>>,
    type_header: Option<Arc<str>>,
    extra_headers: Vec<(String, Arc<str>)>,
    /// `(column, key)` pairs when envelope mode is on.
    envelope: Option<Vec<(String, String)>>,
    topic: TopicPlan,
    tombstone_on_null_payload: bool,
    max_payload_bytes: usize,
    on_error: OnError,
    dead_letter_topic: Option<Arc<str>>,
}

fn problem(path: &str, message: String) -> ConfigErrors {
    ConfigErrors {
        problems: vec![ConfigProblem::new(path, message)],
    }
}

fn target(
    text: &str,
    path: &str,
    groups: bool,
    inputs: &mut Vec<String>,
) -> Result<Target, ConfigErrors> {
    let mut t = Template::parse(text, groups).map_err(|e| problem(path, e))?;
    if let Some(fixed) = t.as_fixed() {
        return Ok(Target::Fixed(Arc::from(fixed)));
    }
    t.bind(inputs);
    Ok(Target::Template(t))
}

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

        let mut inputs = Vec::new();
        let mut rules = Vec::new();
        for (i, r) in route.rules.iter().enumerate() {
            let slot = slot_of(&mut inputs, &r.column);
            let matcher = match (&r.equals, &r.regex) {
                (Some(e), _) => Matcher::Equals(e.as_bytes().into()),
                (None, Some(re)) => Matcher::Regex(
                    compile_rule_regex(re)
                        .map_err(|e| problem(&format!("route.rules[{i}].regex"), e))?,
                ),
                (None, None) => {
                    return Err(problem(&format!("route.rules[{i}]"), "no matcher".into()))
                }
            };
            let path = format!("route.rules[{i}].topic");
            let target = target(&r.topic, &path, r.regex.is_some(), &mut inputs)?;
            rules.push(Rule {
                slot,
                matcher,
                target,
            });
        }
        let default = target(
            &route.topic_template(outbox),
            "route.topic",
            false,
            &mut inputs,
        )?;

        let header = |name: &str| (!name.is_empty()).then(|| Arc::from(name));
        Ok(Router {
            table,
            message_prefix: outbox.message_prefix.clone(),
            id_col: outbox.id_column.clone(),
            aggregate_id_col: outbox.aggregate_id_column.clone(),
            type_col: outbox.type_column.clone(),
            payload_col: outbox.payload_column.clone(),
            timestamp_col: outbox.timestamp_column.clone(),
            partition_col,
            id_header: header(&route.id_header),
            type_header: header(&route.type_header),
            extra_headers,
            envelope: route.envelope.then_some(envelope),
            topic: TopicPlan {
                inputs,
                rules,
                default,
                cache: Mutex::new(HashMap::new()),
            },
            tombstone_on_null_payload: route.tombstone_on_null_payload,
            max_payload_bytes: route.max_payload_bytes,
            on_error: route.on_error,
            dead_letter_topic: route.dead_letter_topic.as_deref().map(Arc::from),
        })
    }

    /// The outbox table (schema and name as PostgreSQL stores them).
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The prefix of table-less outbox messages, if configured.
    pub fn message_prefix(&self) -> Option<&str> {
        self.message_prefix.as_deref()
    }

    /// The configured error policy (applied by the caller).
    pub fn on_error(&self) -> OnError {
        self.on_error
    }

    /// The dead-letter topic, when `on_error = "dead_letter"`.
    pub fn dead_letter_topic(&self) -> Option<&str> {
        self.dead_letter_topic.as_deref()
    }

    /// Routes one outbox row. `commit_time_micros` is the transaction's commit time in
    /// microseconds since the **Unix** epoch (convert PostgreSQL's 2000-01-01 epoch first; see
    /// [`crate::PG_EPOCH_OFFSET_MICROS`]); it is the record timestamp unless a timestamp column is
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
        let event_id = String::from_utf8_lossy(&id).into_owned();
        match self.route_inner(row, id, commit_time_micros) {
            Ok(mut record) => {
                record.event_id = event_id;
                Ok(record)
            }
            Err(reason) => Err(RouteError {
                event_id: Some(event_id),
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

    /// In a message, an absent timestamp, partition, extra-header or envelope-field member is NULL
    /// (a document has no fixed set of columns); the other mapped members stay required.
    fn absent_optional_members_are_null(&self, row: &mut SimpleRow) {
        let optional = self
            .timestamp_col
            .iter()
            .chain(self.partition_col.iter())
            .chain(self.extra_headers.iter().map(|(c, _)| c))
            .chain(self.envelope.iter().flatten().map(|(c, _)| c));
        for col in optional {
            if row.column(col).is_none() {
                row.push(col, oid::TEXT, None);
            }
        }
    }

    /// The dead-letter record for a row that failed with `error`, when `on_error = "dead_letter"`
    /// (else `None`). Best effort, never failing: key and value are the row's aggregate id and
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
        let topic = match (self.on_error, &self.dead_letter_topic) {
            (OnError::DeadLetter, Some(t)) => t.clone(),
            _ => return None,
        };
        let mut headers = Vec::with_capacity(3);
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
            event_id: error.event_id.clone().unwrap_or_default(),
        })
    }

    fn event_id<R: OutboxRow + ?Sized>(&self, row: &R) -> Result<Bytes, RouteErrorReason> {
        let c = column(row, &self.id_col, FieldRole::EventId)?;
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
        id: Bytes,
        commit_time_micros: i64,
    ) -> Result<Record, RouteErrorReason> {
        let topic = self.topic(row)?;
        let c = column(row, &self.aggregate_id_col, FieldRole::AggregateId)?;
        let key = value(&c, &self.aggregate_id_col, FieldRole::AggregateId)?;
        let value = self.value(row)?;

        let mut headers = Vec::with_capacity(2 + self.extra_headers.len());
        if let Some(name) = &self.id_header {
            headers.push((name.clone(), Some(id)));
        }
        if let Some(name) = &self.type_header {
            let c = column(row, &self.type_col, FieldRole::EventType)?;
            headers.push((
                name.clone(),
                self::value(&c, &self.type_col, FieldRole::EventType)?,
            ));
        }
        for (col, name) in &self.extra_headers {
            let c = column(row, col, FieldRole::Header)?;
            headers.push((name.clone(), self::value(&c, col, FieldRole::Header)?));
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
        Ok(Record {
            topic,
            key,
            value,
            headers,
            partition,
            timestamp_ms: Some(timestamp_ms),
            event_id: String::new(),
        })
    }

    fn value<R: OutboxRow + ?Sized>(&self, row: &R) -> Result<Option<Bytes>, RouteErrorReason> {
        let col = &self.payload_col;
        let c = column(row, col, FieldRole::Payload)?;
        let payload = match value(&c, col, FieldRole::Payload)? {
            None if self.tombstone_on_null_payload => return Ok(None),
            None => {
                return Err(RouteErrorReason::NullPayload {
                    column: col.clone(),
                })
            }
            Some(p) => p,
        };
        // Debezium's route.tombstone.on.empty.payload also treats a blank payload as empty.
        if self.tombstone_on_null_payload
            && c.type_oid != oid::BYTEA
            && payload.iter().all(u8::is_ascii_whitespace)
        {
            return Ok(None);
        }
        self.check_size(payload.len())?;
        let Some(fields) = &self.envelope else {
            return Ok(Some(payload));
        };
        let mut buf = Vec::with_capacity(payload.len() + 16 + 32 * fields.len());
        buf.extend_from_slice(b"{\"");
        buf.extend_from_slice(ENVELOPE_PAYLOAD_KEY.as_bytes());
        buf.extend_from_slice(b"\":");
        write_json(&mut buf, c.type_oid, &payload)
            .map_err(|problem| invalid(FieldRole::Payload, col, problem))?;
        for (fcol, key) in fields {
            buf.push(b',');
            let _ = serde_json::to_writer(&mut buf, key);
            buf.push(b':');
            let fc = column(row, fcol, FieldRole::Envelope)?;
            match value(&fc, fcol, FieldRole::Envelope)? {
                None => buf.extend_from_slice(b"null"),
                Some(v) => write_json(&mut buf, fc.type_oid, &v)
                    .map_err(|problem| invalid(FieldRole::Envelope, fcol, problem))?,
            }
        }
        buf.push(b'}');
        self.check_size(buf.len())?;
        Ok(Some(Bytes::from(buf)))
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

    fn input<R: OutboxRow + ?Sized>(
        &self,
        row: &R,
        slot: usize,
    ) -> Result<Option<Bytes>, RouteErrorReason> {
        let name = &self.topic.inputs[slot];
        let c = column(row, name, FieldRole::Topic)?;
        value(&c, name, FieldRole::Topic)
    }

    fn topic<R: OutboxRow + ?Sized>(&self, row: &R) -> Result<Arc<str>, RouteErrorReason> {
        let plan = &self.topic;
        match plan.inputs.len() {
            0 => plan.resolve(&[]),
            1 => {
                let v = self.input(row, 0)?;
                let Some(k) = &v else {
                    return plan.resolve(std::slice::from_ref(&v));
                };
                if let Some(t) = plan.cached(k) {
                    return Ok(t);
                }
                let t = plan.resolve(std::slice::from_ref(&v))?;
                plan.remember(k, &t);
                Ok(t)
            }
            n => {
                let mut values = Vec::with_capacity(n);
                let mut key = Vec::new();
                for slot in 0..n {
                    let v = self.input(row, slot)?;
                    match &v {
                        None => key.push(0),
                        Some(b) => {
                            key.push(1);
                            key.extend_from_slice(&(b.len() as u64).to_le_bytes());
                            key.extend_from_slice(b);
                        }
                    }
                    values.push(v);
                }
                if let Some(t) = plan.cached(&key) {
                    return Ok(t);
                }
                let t = plan.resolve(&values)?;
                plan.remember(&key, &t);
                Ok(t)
            }
        }
    }
}

impl TopicPlan {
    fn cached(&self, key: &[u8]) -> Option<Arc<str>> {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.get(key).cloned()
    }

    fn remember(&self, key: &[u8], topic: &Arc<str>) {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= TOPIC_CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(key.into(), topic.clone());
    }

    /// The topic for these input values (aligned with `inputs`): first matching rule, else default.
    fn resolve(&self, values: &[Option<Bytes>]) -> Result<Arc<str>, RouteErrorReason> {
        for rule in &self.rules {
            let Some(v) = &values[rule.slot] else {
                continue;
            };
            match &rule.matcher {
                Matcher::Equals(e) if v[..] == e[..] => {
                    return self.render(&rule.target, values, None)
                }
                Matcher::Equals(_) => {}
                Matcher::Regex(re) => {
                    if let Some(caps) = re.captures(v) {
                        return self.render(&rule.target, values, Some(&caps));
                    }
                }
            }
        }
        self.render(&self.default, values, None)
    }

    fn render(
        &self,
        target: &Target,
        values: &[Option<Bytes>],
        caps: Option<&regex::bytes::Captures<'_>>,
    ) -> Result<Arc<str>, RouteErrorReason> {
        let t = match target {
            Target::Fixed(t) => return Ok(t.clone()),
            Target::Template(t) => t,
        };
        let mut buf = Vec::with_capacity(64);
        for seg in t.segments() {
            match seg {
                Segment::Literal(l) => buf.extend_from_slice(l.as_bytes()),
                Segment::Column { name, slot } => match &values[*slot] {
                    Some(v) => buf.extend_from_slice(v),
                    None => {
                        return Err(RouteErrorReason::NullValue {
                            role: FieldRole::Topic,
                            column: name.clone(),
                        })
                    }
                },
                Segment::Group(g) => {
                    let m = caps.and_then(|c| match g {
                        GroupRef::Index(i) => c.get(*i),
                        GroupRef::Name(n) => c.name(n),
                    });
                    if let Some(m) = m {
                        buf.extend_from_slice(m.as_bytes());
                    }
                }
            }
        }
        validate_topic(&buf).map_err(|problem| RouteErrorReason::InvalidTopic {
            topic: shown_topic(&buf),
            problem,
        })?;
        // validate_topic admits only ASCII, so this cannot fail.
        let s = String::from_utf8(buf).map_err(|e| RouteErrorReason::InvalidTopic {
            topic: shown_topic(e.as_bytes()),
            problem: crate::topic::TopicProblem::Empty,
        })?;
        Ok(Arc::from(s))
    }
}

fn column<'r, R: OutboxRow + ?Sized>(
    row: &'r R,
    name: &str,
    role: FieldRole,
) -> Result<ColumnRef<'r>, RouteErrorReason> {
    row.column(name)
        .ok_or_else(|| RouteErrorReason::MissingColumn {
            role,
            column: name.to_owned(),
        })
}

fn value(
    c: &ColumnRef<'_>,
    name: &str,
    role: FieldRole,
) -> Result<Option<Bytes>, RouteErrorReason> {
    match c.value {
        None => Ok(None),
        Some(v) => natural_bytes(c.type_oid, c.binary, v)
            .map(Some)
            .map_err(|problem| invalid(role, name, problem)),
    }
}

fn invalid(role: FieldRole, column: &str, problem: String) -> RouteErrorReason {
    RouteErrorReason::InvalidValue {
        role,
        column: column.to_owned(),
        problem,
    }
}
