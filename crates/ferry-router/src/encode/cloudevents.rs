//! CloudEvents 1.0 output (`route.cloudevents`), per the Kafka protocol binding.
//!
//! # The attributes (CloudEvents 1.0 core, §3.1 and §3.2)
//! | attribute | from |
//! |---|---|
//! | `specversion` | `"1.0"` |
//! | `id` | the event id (`outbox.id_column`); must be non-empty UTF-8 |
//! | `source` | `route.cloudevents_source`, a template over columns, whose result must be made of URI characters (RFC 3986; a routing error otherwise); unset: `/ferry/<schema>/<table>` of `outbox.table` (each part percent-encoded). The pure router does not know the database's name: put it in the template (`"/ferry/shop/outbox"`) or use a URI naming the service (`"https://orders.example.com/outbox"`). `id` is unique per `source` only if event ids are, which the outbox pattern already needs for deduplication |
//! | `type` | the event type (`outbox.type_column`); must be non-empty |
//! | `time` | the record timestamp (`outbox.timestamp_column`, else the commit time), RFC 3339 in UTC with milliseconds; left out for a year outside 0000-9999 |
//! | `subject` | `route.cloudevents_subject`; unset: the aggregate id (`{<outbox.aggregate_id_column>}`); `""`, a NULL column, an empty result or bytes that are not UTF-8: none |
//! | `datacontenttype` | `route.cloudevents_data_content_type`; unset: from the payload's type (`application/json` for json, jsonb and envelopes, `text/plain; charset=utf-8` for text, `application/octet-stream` for bytea) |
//!
//! A NULL column in the source, a NULL or empty type or id, or text that is not UTF-8 is a
//! routing error (`route.on_error` applies): a record without them is not a CloudEvent.
//!
//! # Binary content mode (Kafka binding §3.2)
//! The value is untouched; each attribute is a `ce_<name>` header (§3.2.3.1), the
//! `datacontenttype` is the `content-type` header (§3.2.1), all UTF-8 (§3.2.3). A tombstone (NULL
//! payload with `route.tombstone_on_null_payload`) is an event without data: null value, no
//! `content-type` (§3.2.2).
//!
//! # Structured content mode (Kafka binding §3.3, JSON event format 1.0)
//! The value is one JSON object with the attributes and the payload, as the JSON format's §3.1.1
//! says: bytea (binary data) goes base64 in `data_base64`; json/jsonb (and an envelope) go inline
//! in `data` when the `datacontenttype` declares JSON (`*/json` or `*/*+json`, the default for
//! them), else as a JSON string of their text; text is always a JSON string (its runtime value is
//! a string, which is also a JSON value). The `content-type` header is `application/cloudevents+json; charset=UTF-8`
//! (§3.3.1). A tombstone stays a tombstone (a structured event is never one, §3.3.2), so it is
//! sent in binary mode's representation: `ce_*` headers, null value.
//!
//! In both modes the configured `id` and `type` headers (`route.id_header`, `route.type_header`)
//! and every other header are still sent: consumers that read them keep working. Dead-letter
//! records (`route.on_error = "dead_letter"`) are not CloudEvents: they carry the row as far as it
//! could be read and the reason.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::base::error::{FieldRole, RouteErrorReason};
use crate::base::read::{column, value};
use crate::base::record::Header;
use crate::base::row::{oid, OutboxRow};
use crate::base::table_name::TableName;
use crate::base::template::{Segment, Template};
use crate::base::timestamp::civil_from_days;
use crate::encode::json::write_json;

/// `route.cloudevents`: whether and how records are CloudEvents (Kafka protocol binding 1.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CloudEventsMode {
    /// Plain records (the default).
    #[default]
    None,
    /// Binary content mode: `ce_*` headers and `content-type`, the value untouched.
    Binary,
    /// Structured content mode: the value is one JSON event (`application/cloudevents+json`).
    Structured,
}

spelling!(CloudEventsMode {
    None => "none",
    Binary => "binary",
    Structured => "structured",
});

/// The only `specversion` (CloudEvents 1.0 §3.1.1).
pub const SPEC_VERSION: &str = "1.0";
/// Prefix of the binary-mode attribute headers (Kafka binding §3.2.3.1).
pub const HEADER_PREFIX: &str = "ce_";
/// `ce_specversion`.
pub const SPECVERSION_HEADER: &str = "ce_specversion";
/// `ce_id`.
pub const ID_HEADER: &str = "ce_id";
/// `ce_source`.
pub const SOURCE_HEADER: &str = "ce_source";
/// `ce_type`.
pub const TYPE_HEADER: &str = "ce_type";
/// `ce_time`.
pub const TIME_HEADER: &str = "ce_time";
/// `ce_subject`.
pub const SUBJECT_HEADER: &str = "ce_subject";
/// The `content-type` header (Kafka binding §3.2.1, §3.3.1).
pub const CONTENT_TYPE_HEADER: &str = "content-type";
/// Structured mode's `content-type` (Kafka binding §3.3.1, its example).
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json; charset=UTF-8";
/// `datacontenttype` of a json/jsonb payload or an envelope.
pub const JSON_CONTENT_TYPE: &str = "application/json";
/// `datacontenttype` of a text payload.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";
/// `datacontenttype` of a bytea payload.
pub const BYTES_CONTENT_TYPE: &str = "application/octet-stream";
/// Prefix of the default `source`.
pub const DEFAULT_SOURCE_PREFIX: &str = "/ferry/";

/// Every header name the CloudEvents output may send (to refuse configured headers that clash).
pub const HEADER_NAMES: &[&str] = &[
    SPECVERSION_HEADER,
    ID_HEADER,
    SOURCE_HEADER,
    TYPE_HEADER,
    TIME_HEADER,
    SUBJECT_HEADER,
    CONTENT_TYPE_HEADER,
];

/// The default `source` for an outbox table: `/ferry/<schema>/<table>`, each part
/// percent-encoded (RFC 3986 unreserved characters kept).
pub fn default_source(table: &TableName) -> String {
    let mut s = DEFAULT_SOURCE_PREFIX.to_owned();
    percent_encode(&mut s, &table.schema);
    s.push('/');
    percent_encode(&mut s, &table.name);
    s
}

fn percent_encode(out: &mut String, part: &str) {
    for b in part.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

/// `time`: RFC 3339 in UTC with milliseconds (`2026-11-22T10:00:00.123Z`); `None` for a year
/// RFC 3339 cannot write (outside 0000-9999).
pub fn rfc3339_millis(unix_ms: i64) -> Option<String> {
    rfc3339_bytes(unix_ms).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// [`rfc3339_millis`] into a fixed buffer: no formatting machinery on the hot path.
fn rfc3339_bytes(unix_ms: i64) -> Option<[u8; 24]> {
    let secs = unix_ms.div_euclid(1000);
    let ms = unix_ms.rem_euclid(1000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    if !(0..=9999).contains(&y) {
        return None;
    }
    let sod = secs.rem_euclid(86_400);
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut v: i64| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, y);
    put(5, 2, m);
    put(8, 2, d);
    put(11, 2, sod / 3600);
    put(14, 2, sod / 60 % 60);
    put(17, 2, sod % 60);
    put(20, 3, ms);
    Some(out)
}

/// A `source` or `subject`: fixed text, or a template over columns.
#[derive(Debug)]
pub(crate) enum Text {
    Fixed(Bytes),
    Template(Template),
}

impl Text {
    /// Parses a free-text template ([`Template::parse_text`]); one without placeholders is fixed.
    pub(crate) fn parse(text: &str) -> Result<Text, String> {
        let t = Template::parse_text(text)?;
        Ok(match t.segments() {
            [] => Text::Fixed(Bytes::new()),
            [Segment::Literal(l)] => Text::Fixed(Bytes::from(l.clone())),
            _ => Text::Template(t),
        })
    }

    /// The rendered text, or `Err(column)` naming a NULL column.
    fn render<'t, R: OutboxRow + ?Sized>(
        &'t self,
        row: &R,
    ) -> Result<Result<Bytes, &'t str>, RouteErrorReason> {
        let t = match self {
            Text::Fixed(b) => return Ok(Ok(b.clone())),
            Text::Template(t) => t,
        };
        let role = FieldRole::CloudEvents;
        // One placeholder alone: the column's bytes, without a copy.
        if let [Segment::Column { name, .. }] = t.segments() {
            let c = column(row, name, role)?;
            return Ok(value(&c, name, role)?.ok_or(name.as_str()));
        }
        let mut out = Vec::new();
        for seg in t.segments() {
            match seg {
                Segment::Literal(l) => out.extend_from_slice(l.as_bytes()),
                Segment::Column { name, .. } => {
                    let c = column(row, name, role)?;
                    match value(&c, name, role)? {
                        Some(v) => out.extend_from_slice(&v),
                        None => return Ok(Err(name.as_str())),
                    }
                }
                Segment::Group(_) => {}
            }
        }
        Ok(Ok(Bytes::from(out)))
    }

    fn columns(&self) -> Vec<&str> {
        match self {
            Text::Fixed(_) => Vec::new(),
            Text::Template(t) => t.columns().collect(),
        }
    }
}

/// The compiled CloudEvents output.
#[derive(Debug)]
pub(crate) struct CloudEvents {
    mode: CloudEventsMode,
    source: Text,
    subject: Option<Text>,
    content_type: Option<Bytes>,
    names: Names,
}

/// Interned header names (an `Arc` clone per record, no allocation).
#[derive(Debug)]
struct Names {
    specversion: Arc<str>,
    id: Arc<str>,
    source: Arc<str>,
    ty: Arc<str>,
    time: Arc<str>,
    subject: Arc<str>,
    content_type: Arc<str>,
}

/// What the router hands over for one record.
pub(crate) struct Event<'a> {
    pub id: &'a Bytes,
    pub ty: Option<Bytes>,
    pub type_column: &'a str,
    pub id_column: &'a str,
    pub payload_column: &'a str,
    /// The PostgreSQL type of the record value (json for an envelope).
    pub data_type: u32,
    pub timestamp_ms: i64,
}

impl CloudEvents {
    /// The output in `mode` (not `none`) with these `source` and `subject` attributes and
    /// `datacontenttype` (`None`: from the payload's type). Compiled from the configuration by
    /// the compile layer (`compile/cloudevents.rs`).
    pub(crate) fn new(
        mode: CloudEventsMode,
        source: Text,
        subject: Option<Text>,
        content_type: Option<Bytes>,
    ) -> CloudEvents {
        CloudEvents {
            mode,
            source,
            subject,
            content_type,
            names: Names {
                specversion: Arc::from(SPECVERSION_HEADER),
                id: Arc::from(ID_HEADER),
                source: Arc::from(SOURCE_HEADER),
                ty: Arc::from(TYPE_HEADER),
                time: Arc::from(TIME_HEADER),
                subject: Arc::from(SUBJECT_HEADER),
                content_type: Arc::from(CONTENT_TYPE_HEADER),
            },
        }
    }

    /// Columns read by the source and subject templates, with the key that names them.
    pub(crate) fn columns(&self) -> Vec<(&str, &'static str)> {
        let mut out: Vec<(&str, &'static str)> = self
            .source
            .columns()
            .into_iter()
            .map(|c| (c, "route.cloudevents_source"))
            .collect();
        if let Some(s) = &self.subject {
            out.extend(
                s.columns()
                    .into_iter()
                    .map(|c| (c, "route.cloudevents_subject")),
            );
        }
        out
    }

    /// Turns the routed record's parts into a CloudEvent: appends the headers and, in structured
    /// mode, replaces the value with the JSON event.
    pub(crate) fn apply<R: OutboxRow + ?Sized>(
        &self,
        row: &R,
        event: Event<'_>,
        headers: &mut Vec<Header>,
        value: &mut Option<Bytes>,
    ) -> Result<(), RouteErrorReason> {
        let id = required_text(event.id.clone(), FieldRole::EventId, event.id_column)?;
        let ty = match event.ty {
            None => {
                return Err(RouteErrorReason::NullValue {
                    role: FieldRole::EventType,
                    column: event.type_column.to_owned(),
                })
            }
            Some(t) => required_text(t, FieldRole::EventType, event.type_column)?,
        };
        let source = match self.source.render(row)? {
            // A fixed source was checked with the configuration.
            Ok(s) if matches!(self.source, Text::Template(_)) && !is_uri_reference_text(&s) => {
                return Err(RouteErrorReason::InvalidValue {
                    role: FieldRole::CloudEvents,
                    column: "route.cloudevents_source".to_owned(),
                    problem: format!(
                        "the rendered source {:?} is not a URI reference (CloudEvents 1.0 §3.1.1, RFC 3986): the columns it uses must hold URI characters (percent-encode the rest)",
                        String::from_utf8_lossy(&s)
                    ),
                })
            }
            Ok(s) => required_text(s, FieldRole::CloudEvents, "route.cloudevents_source")?,
            Err(col) => {
                return Err(RouteErrorReason::NullValue {
                    role: FieldRole::CloudEvents,
                    column: col.to_owned(),
                })
            }
        };
        let subject = match &self.subject {
            None => None,
            // OPTIONAL (§3.1.2): a NULL, empty or non-UTF-8 subject (a bytea aggregate id) is
            // left out rather than failing the row.
            Some(s) => match s.render(row)? {
                Ok(b) if !b.is_empty() => utf8(b, FieldRole::CloudEvents, "").ok(),
                _ => None,
            },
        };
        let time = rfc3339_bytes(event.timestamp_ms);
        let content_type = self.content_type.clone().unwrap_or_else(|| {
            Bytes::from_static(
                match event.data_type {
                    oid::JSON | oid::JSONB => JSON_CONTENT_TYPE,
                    oid::BYTEA => BYTES_CONTENT_TYPE,
                    _ => TEXT_CONTENT_TYPE,
                }
                .as_bytes(),
            )
        });
        let n = &self.names;
        if self.mode == CloudEventsMode::Binary || value.is_none() {
            headers.push((
                n.specversion.clone(),
                Some(Bytes::from_static(SPEC_VERSION.as_bytes())),
            ));
            headers.push((n.id.clone(), Some(id.0)));
            headers.push((n.source.clone(), Some(source.0)));
            headers.push((n.ty.clone(), Some(ty.0)));
            if let Some(t) = time {
                headers.push((n.time.clone(), Some(Bytes::copy_from_slice(&t))));
            }
            if let Some(s) = subject {
                headers.push((n.subject.clone(), Some(s.0)));
            }
            if value.is_some() {
                headers.push((n.content_type.clone(), Some(content_type)));
            }
            return Ok(());
        }
        let data = value.as_ref().expect("checked above");
        let content_type = utf8(
            content_type,
            FieldRole::CloudEvents,
            "route.cloudevents_data_content_type",
        )?;
        let mut buf = Vec::with_capacity(data.len() + 256);
        buf.extend_from_slice(b"{\"specversion\":\"1.0\",\"id\":");
        json_str(&mut buf, &id);
        buf.extend_from_slice(b",\"source\":");
        json_str(&mut buf, &source);
        buf.extend_from_slice(b",\"type\":");
        json_str(&mut buf, &ty);
        if let Some(s) = &subject {
            buf.extend_from_slice(b",\"subject\":");
            json_str(&mut buf, s);
        }
        if let Some(t) = &time {
            buf.extend_from_slice(b",\"time\":\"");
            buf.extend_from_slice(t);
            buf.push(b'"');
        }
        buf.extend_from_slice(b",\"datacontenttype\":");
        json_str(&mut buf, &content_type);
        buf.extend_from_slice(if event.data_type == oid::BYTEA {
            b",\"data_base64\":"
        } else {
            b",\"data\":"
        });
        // JSON format §3.1.1: JSON inline only when the datacontenttype declares JSON.
        let data_type = match event.data_type {
            oid::JSON | oid::JSONB if !declares_json(&content_type) => oid::TEXT,
            t => t,
        };
        write_json(&mut buf, data_type, data).map_err(|problem| {
            RouteErrorReason::InvalidValue {
                role: FieldRole::Payload,
                column: event.payload_column.to_owned(),
                problem,
            }
        })?;
        buf.push(b'}');
        *value = Some(Bytes::from(buf));
        headers.push((
            n.content_type.clone(),
            Some(Bytes::from_static(STRUCTURED_CONTENT_TYPE.as_bytes())),
        ));
        Ok(())
    }
}

/// Whether every byte may appear in a URI reference (RFC 3986 §2: unreserved, reserved and `%`).
/// A character-level check, not the full grammar: it keeps spaces, quotes, control and
/// non-ASCII characters out of `source`, which CloudEvents SDKs parse as a URI.
pub fn is_uri_reference_text(s: &[u8]) -> bool {
    s.iter().all(|&b| {
        b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b':'
                    | b'/'
                    | b'?'
                    | b'#'
                    | b'['
                    | b']'
                    | b'@'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b'%'
            )
    })
}

/// Whether a media type declares JSON content (JSON format §3.1.1): without its parameters, of
/// the form `*/json` or `*/*+json`.
pub fn declares_json(media_type: &str) -> bool {
    let essence = media_type.split(';').next().unwrap_or_default().trim();
    match essence.split_once('/') {
        Some((_, sub)) => {
            let sub = sub.to_ascii_lowercase();
            sub == "json" || sub.ends_with("+json")
        }
        None => false,
    }
}

/// Text known to be UTF-8 (checked once, kept as `Bytes`).
struct Utf8(Bytes);

impl std::ops::Deref for Utf8 {
    type Target = str;
    fn deref(&self) -> &str {
        // Checked in `utf8`.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

fn utf8(b: Bytes, role: FieldRole, what: &str) -> Result<Utf8, RouteErrorReason> {
    if std::str::from_utf8(&b).is_err() {
        return Err(RouteErrorReason::InvalidValue {
            role,
            column: what.to_owned(),
            problem: "a CloudEvents attribute must be UTF-8 text (Kafka binding §3.2.3)".to_owned(),
        });
    }
    Ok(Utf8(b))
}

fn required_text(b: Bytes, role: FieldRole, what: &str) -> Result<Utf8, RouteErrorReason> {
    if b.is_empty() {
        return Err(RouteErrorReason::InvalidValue {
            role,
            column: what.to_owned(),
            problem: "a CloudEvents id, source and type must be non-empty (CloudEvents 1.0 §3.1.1)"
                .to_owned(),
        });
    }
    utf8(b, role, what)
}

fn json_str(buf: &mut Vec<u8>, s: &str) {
    // Serializing a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *buf, s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times() {
        assert_eq!(
            rfc3339_millis(1_795_341_600_123).as_deref(),
            Some("2026-11-22T10:00:00.123Z")
        );
        assert_eq!(
            rfc3339_millis(0).as_deref(),
            Some("1970-01-01T00:00:00.000Z")
        );
        assert_eq!(
            rfc3339_millis(-1).as_deref(),
            Some("1969-12-31T23:59:59.999Z")
        );
        assert_eq!(rfc3339_millis(253_402_300_800_000), None, "year 10000");
        assert_eq!(rfc3339_millis(-62_167_219_200_001), None, "before year 0");
        assert_eq!(rfc3339_millis(i64::MAX), None);
    }

    #[test]
    fn json_media_types() {
        for yes in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/cloudevents+json",
            "application/vnd.acme.order+json;v=2",
            "text/json",
        ] {
            assert!(declares_json(yes), "{yes}");
        }
        for no in [
            "text/plain",
            "application/avro",
            "application/jsonl",
            "json",
            "",
            "application/json-seq",
        ] {
            assert!(!declares_json(no), "{no}");
        }
    }

    #[test]
    fn default_source_is_a_uri_path() {
        let t: TableName = "public.outbox".parse().unwrap();
        assert_eq!(default_source(&t), "/ferry/public/outbox");
        let t: TableName = "\"My Schema\".\"out/box\"".parse().unwrap();
        assert_eq!(default_source(&t), "/ferry/My%20Schema/out%2Fbox");
    }
}
