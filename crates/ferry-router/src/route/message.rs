//! Table-less outbox: the content of a logical decoding message (`pg_logical_emit_message(true,
//! '<outbox.message_prefix>', doc)`) read as a row.
//!
//! # Format
//! The content is one JSON object whose keys are the configured column names (defaults shown):
//!
//! ```json
//! {"id": "4d47e190-0402-4048-bc2c-89dd54343cdc", "aggregatetype": "order",
//!  "aggregateid": "42", "type": "OrderCreated", "payload": {"total": 39.98}}
//! ```
//!
//! Each member becomes a column, typed by its JSON kind:
//! - a **string** is `text`: its unescaped contents (so a payload given as a string is sent as that
//!   string's text, e.g. a pre-serialized document or a non-JSON body);
//! - an **object or array** is `json`: its exact source text, without re-encoding (the usual payload);
//! - a **number** is `int8` if it is an integer, `numeric` otherwise, with its source text (so
//!   `"aggregateid": 42` keys the record with `42`, and a timestamp may be integer epoch milliseconds);
//! - `true`/`false` is `bool`; `null` is SQL NULL.
//!
//! An absent member for the timestamp, the partition, an extra header or an envelope field is NULL
//! (those are optional in a document); an absent id, aggregate type (when the topic needs it),
//! aggregate id, type (when the type header is on) or payload is a missing column, as for a table.
//! Duplicate keys are an error.
//! Strings without escapes and object/array payloads are zero-copy slices of the message content.

use std::fmt;

use bytes::Bytes;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::base::row::{oid, SimpleRow};

/// Parses a table-less outbox message into a row.
pub fn parse_message(content: &Bytes) -> Result<SimpleRow, String> {
    let fields: Fields<'_> = serde_json::from_slice(content).map_err(|e| e.to_string())?;
    let mut row = SimpleRow::new();
    for (name, raw) in fields.0 {
        if row.columns.iter().any(|c| c.name == name) {
            return Err(format!("duplicate key {name:?}"));
        }
        let text = raw.get();
        let (type_oid, value) = match text.as_bytes().first() {
            Some(b'"') => {
                let value = match serde_json::from_str::<&str>(text) {
                    Ok(s) => sub_bytes(content, s.as_bytes()),
                    Err(_) => Bytes::from(
                        serde_json::from_str::<String>(text).map_err(|e| e.to_string())?,
                    ),
                };
                (oid::TEXT, Some(value))
            }
            Some(b'{' | b'[') => (oid::JSON, Some(sub_bytes(content, text.as_bytes()))),
            Some(b't') => (oid::BOOL, Some(Bytes::from_static(b"true"))),
            Some(b'f') => (oid::BOOL, Some(Bytes::from_static(b"false"))),
            Some(b'n') => (oid::TEXT, None),
            _ => {
                let ty = if text.contains(['.', 'e', 'E']) {
                    oid::NUMERIC
                } else {
                    oid::INT8
                };
                (ty, Some(sub_bytes(content, text.as_bytes())))
            }
        };
        row.push(&name, type_oid, value);
    }
    Ok(row)
}

/// `part` as a zero-copy slice of `whole` when it lies inside it, else a copy.
fn sub_bytes(whole: &Bytes, part: &[u8]) -> Bytes {
    let start = (part.as_ptr() as usize).wrapping_sub(whole.as_ptr() as usize);
    if start <= whole.len() && part.len() <= whole.len() - start {
        whole.slice(start..start + part.len())
    } else {
        Bytes::copy_from_slice(part)
    }
}

/// The top-level object's members in order, values unparsed.
struct Fields<'a>(Vec<(String, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                    out.push((k, v));
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::row::OutboxRow;

    fn val(row: &SimpleRow, name: &str) -> (u32, Option<Vec<u8>>) {
        let c = row.column(name).unwrap();
        (c.type_oid, c.value.map(|b| b.to_vec()))
    }

    #[test]
    fn kinds_map_to_types() {
        let content = Bytes::from_static(
            br#" {"s": "plain", "e": "a\"b\u00e9", "o": {"a": [1, 2]}, "a": [true],
                 "i": -42, "f": 1.5e3, "t": true, "F": false, "n": null} "#,
        );
        let row = parse_message(&content).unwrap();
        assert_eq!(val(&row, "s"), (oid::TEXT, Some(b"plain".to_vec())));
        assert_eq!(
            val(&row, "e"),
            (oid::TEXT, Some("a\"b\u{e9}".as_bytes().to_vec()))
        );
        assert_eq!(
            val(&row, "o"),
            (oid::JSON, Some(br#"{"a": [1, 2]}"#.to_vec()))
        );
        assert_eq!(val(&row, "a"), (oid::JSON, Some(b"[true]".to_vec())));
        assert_eq!(val(&row, "i"), (oid::INT8, Some(b"-42".to_vec())));
        assert_eq!(val(&row, "f"), (oid::NUMERIC, Some(b"1.5e3".to_vec())));
        assert_eq!(val(&row, "t"), (oid::BOOL, Some(b"true".to_vec())));
        assert_eq!(val(&row, "F"), (oid::BOOL, Some(b"false".to_vec())));
        assert_eq!(val(&row, "n"), (oid::TEXT, None));
        assert!(row.column("missing").is_none());
    }

    #[test]
    fn payload_object_is_a_zero_copy_slice() {
        let content = Bytes::from_static(br#"{"payload": {"x": 1}, "id": "abc"}"#);
        let row = parse_message(&content).unwrap();
        let p = row.column("payload").unwrap().value.unwrap().to_bytes();
        let range = content.as_ptr() as usize..content.as_ptr() as usize + content.len();
        assert!(range.contains(&(p.as_ptr() as usize)));
        let id = row.column("id").unwrap().value.unwrap().to_bytes();
        assert!(range.contains(&(id.as_ptr() as usize)));
    }

    #[test]
    fn rejects_bad_documents() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "EOF"),
            (b"[1, 2]", "a JSON object"),
            (b"\"x\"", "a JSON object"),
            (b"{\"a\": 1,}", "trailing comma"),
            (b"{\"a\": 1} x", "trailing characters"),
            (b"{\"a\": 1, \"a\": 2}", "duplicate key"),
            (b"{\"a\": \"\xff\"}", "invalid unicode"),
        ];
        for (doc, want) in cases {
            let err = parse_message(&Bytes::copy_from_slice(doc)).expect_err(want);
            assert!(err.contains(want), "{doc:?}: {err}");
        }
    }
}
