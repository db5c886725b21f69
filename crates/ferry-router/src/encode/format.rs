//! `route.key_format` and `route.value_format`: the bytes Kafka Connect's converters put on the
//! wire, so that a consumer does not notice Debezium was replaced.
//!
//! What Debezium's Outbox Event Router hands the converter is the column's value with the
//! column's Connect schema (`EventRouterDelegate`: without envelope fields the record value *is*
//! the payload field, with the payload column's schema; the key is the
//! `table.field.event.key` column with its schema). The PostgreSQL connector's schemas, with its
//! default settings (`binary.handling.mode = bytes`):
//!
//! | column type | Connect schema |
//! |---|---|
//! | text, varchar, char, name | `string` |
//! | json, jsonb | `string` named `io.debezium.data.Json`, version 1 |
//! | uuid | `string` named `io.debezium.data.Uuid`, version 1 |
//! | bytea | `bytes` |
//! | int2, int4, int8 | `int16`, `int32`, `int64` |
//! | bool | `boolean` |
//!
//! The converters (Apache Kafka, `connect/json/.../JsonConverter.java`, `JsonSchema.java`):
//! - `StringConverter` writes the string's UTF-8 text; `ByteArrayConverter` passes `bytes`
//!   through: [`RecordFormat::AsStored`], Ferry's default.
//! - `JsonConverter` with `schemas.enable = false` writes the value as JSON
//!   ([`RecordFormat::Json`]): a string (a jsonb payload included, unless
//!   `table.expand.json.payload`) as a quoted JSON string, `bytes` as a base64 string
//!   (Jackson's default variant: standard alphabet, padded, no line feeds), integers as
//!   numbers. A NULL is `null`, not a tombstone.
//! - `JsonConverter` with `schemas.enable = true` (its default) wraps that in
//!   `{"schema":<schema>,"payload":<value>}` ([`RecordFormat::JsonWithSchema`]), the schema
//!   written by `asJsonSchema` with its members in the order `type`, `optional`, `name`,
//!   `version`.
//!
//! Strings are escaped as Jackson escapes them (`jackson.rs`), not as serde_json does.
//!
//! `optional` is the column's nullability (Debezium reads it from the table), which pgoutput
//! does not carry: `route.key_schema_optional` and `route.value_schema_optional` say it, with
//! the defaults of the reference outbox DDL (`aggregateid ... NOT NULL`, `payload jsonb`).

use serde::{Deserialize, Serialize};

use crate::base::row::oid;
use crate::encode::expand::ExpandNullBehavior;
use crate::encode::jackson::jackson_string;
use crate::encode::json::base64;

/// How a record's key or value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RecordFormat {
    /// The column's bytes as stored (text as text, json as its text, bytea decoded): Kafka
    /// Connect's `StringConverter` / `ByteArrayConverter`.
    #[default]
    AsStored,
    /// JSON without a schema: `JsonConverter` with `schemas.enable = false`.
    Json,
    /// `{"schema":...,"payload":...}`: `JsonConverter` with `schemas.enable = true`.
    JsonWithSchema,
    /// The value only: Debezium's `table.expand.json.payload = true` written by `JsonConverter`
    /// with `schemas.enable = false` (see `encode/expand.rs`).
    JsonExpanded,
    /// The value only: `table.expand.json.payload = true` written by `JsonConverter` with
    /// `schemas.enable = true`, the schema inferred from each payload (see `encode/expand.rs`).
    JsonExpandedWithSchema,
}

impl RecordFormat {
    /// Whether this is one of the two formats of Debezium's `table.expand.json.payload`.
    pub fn expands(self) -> bool {
        matches!(
            self,
            RecordFormat::JsonExpanded | RecordFormat::JsonExpandedWithSchema
        )
    }

    /// Whether this format writes a `{"schema":...,"payload":...}` envelope.
    pub fn has_schema(self) -> bool {
        matches!(
            self,
            RecordFormat::JsonWithSchema | RecordFormat::JsonExpandedWithSchema
        )
    }
}

spelling!(RecordFormat {
    AsStored => "as_stored",
    Json => "json",
    JsonWithSchema => "json_with_schema",
    JsonExpanded => "json_expanded",
    JsonExpandedWithSchema => "json_expanded_with_schema",
});

/// Column types a key or value can be written from in a JSON format (those with a Connect
/// schema above).
pub const JSON_FORMAT_TYPES: &[u32] = &[
    oid::TEXT,
    oid::VARCHAR,
    oid::BPCHAR,
    oid::NAME,
    oid::JSON,
    oid::JSONB,
    oid::UUID,
    oid::BYTEA,
    oid::INT2,
    oid::INT4,
    oid::INT8,
    oid::BOOL,
];

/// A Connect schema type, as far as the column types above need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnectType {
    String,
    Bytes,
    Int16,
    Int32,
    Int64,
    Boolean,
}

impl ConnectType {
    /// The `type` member `JsonConverter.asJsonSchema` writes.
    fn name(self) -> &'static str {
        match self {
            ConnectType::String => "string",
            ConnectType::Bytes => "bytes",
            ConnectType::Int16 => "int16",
            ConnectType::Int32 => "int32",
            ConnectType::Int64 => "int64",
            ConnectType::Boolean => "boolean",
        }
    }
}

/// The Connect schema Debezium gives a column type: its type and, for a logical type, its
/// name (version 1).
fn connect_type(type_oid: u32) -> Option<(ConnectType, Option<&'static str>)> {
    Some(match type_oid {
        oid::TEXT | oid::VARCHAR | oid::BPCHAR | oid::NAME => (ConnectType::String, None),
        oid::JSON | oid::JSONB => (ConnectType::String, Some("io.debezium.data.Json")),
        oid::UUID => (ConnectType::String, Some("io.debezium.data.Uuid")),
        oid::BYTEA => (ConnectType::Bytes, None),
        oid::INT2 => (ConnectType::Int16, None),
        oid::INT4 => (ConnectType::Int32, None),
        oid::INT8 => (ConnectType::Int64, None),
        oid::BOOL => (ConnectType::Boolean, None),
        _ => return None,
    })
}

fn unsupported(type_oid: u32) -> String {
    format!(
        "a column of type OID {type_oid} cannot be written as JSON the way Kafka Connect's \
         JsonConverter would (Ferry writes text, varchar, char, json, jsonb, uuid, bytea, int2, \
         int4, int8 and bool); use format \"as_stored\" or another column"
    )
}

/// Writes `v` (the column's natural bytes: text, or bytea decoded; `None` for NULL) in `format`.
/// `AsStored` is the caller's (it needs no copy); this handles the JSON formats.
/// The expansion formats write here what Debezium did not expand (a NULL); [`write_payload`]
/// writes a payload in any format.
pub(crate) fn write_formatted(
    buf: &mut Vec<u8>,
    format: RecordFormat,
    type_oid: u32,
    optional: bool,
    v: Option<&[u8]>,
) -> Result<(), String> {
    match format {
        RecordFormat::AsStored => {
            buf.extend_from_slice(v.unwrap_or_default());
            Ok(())
        }
        RecordFormat::Json | RecordFormat::JsonExpanded => write_connect_json(buf, type_oid, v),
        RecordFormat::JsonWithSchema | RecordFormat::JsonExpandedWithSchema => {
            let (ty, name) = connect_type(type_oid).ok_or_else(|| unsupported(type_oid))?;
            buf.extend_from_slice(b"{\"schema\":{\"type\":\"");
            buf.extend_from_slice(ty.name().as_bytes());
            buf.extend_from_slice(b"\",\"optional\":");
            buf.extend_from_slice(if optional { b"true" } else { b"false" });
            if let Some(name) = name {
                buf.extend_from_slice(b",\"name\":\"");
                buf.extend_from_slice(name.as_bytes());
                buf.extend_from_slice(b"\",\"version\":1");
            }
            buf.extend_from_slice(b"},\"payload\":");
            write_connect_json(buf, type_oid, v)?;
            buf.push(b'}');
            Ok(())
        }
    }
}

/// The payload as a Java String, where Debezium expanded it: a text or json column's value
/// (uuid text never starts with `{` or `[`).
fn expandable(type_oid: u32, v: &[u8]) -> Result<Option<&str>, String> {
    match connect_type(type_oid) {
        Some((ConnectType::String, _)) if type_oid != oid::UUID => std::str::from_utf8(v)
            .map(Some)
            .map_err(|_| "text is not valid UTF-8".to_owned()),
        _ => Ok(None),
    }
}

/// The payload `v` of column `column` (`None` for NULL) in `format`, the expansion formats
/// included (`nulls` is what they do with null members).
pub(crate) fn write_payload(
    buf: &mut Vec<u8>,
    format: RecordFormat,
    type_oid: u32,
    optional: bool,
    v: Option<&[u8]>,
    column: &str,
    nulls: ExpandNullBehavior,
) -> Result<(), String> {
    match (format, v) {
        // Debezium named the inferred struct schema after the payload column.
        (RecordFormat::JsonExpandedWithSchema, Some(v)) => {
            write_expanded_with_schema(buf, type_oid, optional, v, column, nulls)
        }
        (RecordFormat::JsonExpanded, Some(v)) => write_expanded(buf, type_oid, v, nulls),
        (format, v) => write_formatted(buf, format, type_oid, optional, v),
    }
}

/// `json_expanded`: the payload `v` expanded where Debezium expanded it, else as `json`.
fn write_expanded(
    buf: &mut Vec<u8>,
    type_oid: u32,
    v: &[u8],
    nulls: ExpandNullBehavior,
) -> Result<(), String> {
    match expandable(type_oid, v)? {
        Some(s) => crate::encode::expand::write_expanded(buf, s, nulls),
        // Debezium warned "payload is not a string" and JsonConverter wrote the value.
        None => write_connect_json(buf, type_oid, Some(v)),
    }
}

/// `json_expanded_with_schema`: the payload `v` of column `name` expanded with its inferred
/// schema where Debezium expanded it, else as `json_with_schema`.
fn write_expanded_with_schema(
    buf: &mut Vec<u8>,
    type_oid: u32,
    optional: bool,
    v: &[u8],
    name: &str,
    nulls: ExpandNullBehavior,
) -> Result<(), String> {
    let unexpanded = |buf: &mut Vec<u8>| {
        write_formatted(
            buf,
            RecordFormat::JsonWithSchema,
            type_oid,
            optional,
            Some(v),
        )
    };
    match expandable(type_oid, v)? {
        Some(s) => {
            crate::encode::expand::write_expanded_with_schema(buf, s, name, nulls, unexpanded)
        }
        None => unexpanded(buf),
    }
}

/// The value as `JsonConverter.convertToJson` with Jackson's serializer writes it.
fn write_connect_json(buf: &mut Vec<u8>, type_oid: u32, v: Option<&[u8]>) -> Result<(), String> {
    let (ty, _) = connect_type(type_oid).ok_or_else(|| unsupported(type_oid))?;
    let Some(v) = v else {
        buf.extend_from_slice(b"null");
        return Ok(());
    };
    match ty {
        ConnectType::Bytes => {
            buf.push(b'"');
            base64(buf, v);
            buf.push(b'"');
        }
        ConnectType::Boolean => buf.extend_from_slice(match v {
            b"t" | b"true" => b"true",
            b"f" | b"false" => b"false",
            _ => return Err("a bool column's text is neither t nor f".to_owned()),
        }),
        ConnectType::Int16 | ConnectType::Int32 | ConnectType::Int64 => {
            // PostgreSQL prints integers as Java does (no `+`, no leading zeros, `-0` never),
            // so the checked text is written as it is.
            std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| "an integer column's text is not an integer".to_owned())?;
            buf.extend_from_slice(v);
        }
        ConnectType::String => {
            let s = std::str::from_utf8(v).map_err(|_| "text is not valid UTF-8".to_owned())?;
            jackson_string(buf, s);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(format: RecordFormat, ty: u32, optional: bool, v: Option<&[u8]>) -> String {
        let mut buf = Vec::new();
        write_formatted(&mut buf, format, ty, optional, v).unwrap();
        String::from_utf8(buf).unwrap()
    }

    /// A jsonb payload with `JsonConverter`, `schemas.enable=false` (Debezium's outbox
    /// documentation, "Using JSON" with expand.json.payload off: "the payload is a JSON string").
    #[test]
    fn jsonb_payload_as_a_json_string() {
        let payload = br#"{"id": 1, "note": "a\tb", "path": "/x"}"#;
        assert_eq!(
            render(RecordFormat::Json, oid::JSONB, true, Some(payload)),
            r#""{\"id\": 1, \"note\": \"a\\tb\", \"path\": \"/x\"}""#
        );
    }

    /// `schemas.enable=true`: the Connect schema of a nullable jsonb column (Debezium's
    /// `io.debezium.data.Json`, version 1) and the payload as a string.
    #[test]
    fn jsonb_payload_with_schema() {
        assert_eq!(
            render(
                RecordFormat::JsonWithSchema,
                oid::JSONB,
                true,
                Some(br#"{"a": 1}"#)
            ),
            r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"{\"a\": 1}"}"#
        );
        assert_eq!(
            render(RecordFormat::JsonWithSchema, oid::JSON, false, None),
            r#"{"schema":{"type":"string","optional":false,"name":"io.debezium.data.Json","version":1},"payload":null}"#
        );
    }

    #[test]
    fn text_bytea_uuid_int_bool_per_format() {
        type Case<'a> = (u32, &'a [u8], &'a str, &'a str);
        let cases: &[Case<'_>] = &[
            (
                oid::TEXT,
                b"order-1",
                r#""order-1""#,
                r#"{"schema":{"type":"string","optional":false},"payload":"order-1"}"#,
            ),
            (
                oid::VARCHAR,
                b"a\"b",
                r#""a\"b""#,
                r#"{"schema":{"type":"string","optional":false},"payload":"a\"b"}"#,
            ),
            (
                oid::BYTEA,
                b"\x00\x01\xfe\xff",
                r#""AAH+/w==""#,
                r#"{"schema":{"type":"bytes","optional":false},"payload":"AAH+/w=="}"#,
            ),
            (
                oid::UUID,
                b"4d47e190-0402-4048-bc2c-89dd54343cdc",
                r#""4d47e190-0402-4048-bc2c-89dd54343cdc""#,
                r#"{"schema":{"type":"string","optional":false,"name":"io.debezium.data.Uuid","version":1},"payload":"4d47e190-0402-4048-bc2c-89dd54343cdc"}"#,
            ),
            (
                oid::INT8,
                b"-42",
                "-42",
                r#"{"schema":{"type":"int64","optional":false},"payload":-42}"#,
            ),
            (
                oid::INT4,
                b"7",
                "7",
                r#"{"schema":{"type":"int32","optional":false},"payload":7}"#,
            ),
            (
                oid::INT2,
                b"3",
                "3",
                r#"{"schema":{"type":"int16","optional":false},"payload":3}"#,
            ),
            (
                oid::BOOL,
                b"t",
                "true",
                r#"{"schema":{"type":"boolean","optional":false},"payload":true}"#,
            ),
        ];
        for (ty, v, json, with_schema) in cases {
            let mut stored = Vec::new();
            write_formatted(&mut stored, RecordFormat::AsStored, *ty, false, Some(v)).unwrap();
            assert_eq!(stored, *v);
            assert_eq!(render(RecordFormat::Json, *ty, false, Some(v)), *json);
            assert_eq!(
                render(RecordFormat::JsonWithSchema, *ty, false, Some(v)),
                *with_schema
            );
        }
        assert_eq!(render(RecordFormat::Json, oid::TEXT, true, None), "null");
    }

    #[test]
    fn unsupported_types_and_bad_text_are_errors() {
        let mut buf = Vec::new();
        let e = write_formatted(
            &mut buf,
            RecordFormat::Json,
            oid::NUMERIC,
            false,
            Some(b"1.5"),
        )
        .unwrap_err();
        assert!(e.contains("as_stored"), "{e}");
        assert!(write_formatted(
            &mut buf,
            RecordFormat::Json,
            oid::TEXT,
            false,
            Some(b"\xff")
        )
        .is_err());
        assert!(
            write_formatted(&mut buf, RecordFormat::Json, oid::INT4, false, Some(b"x")).is_err()
        );
    }

    #[test]
    fn spellings_round_trip() {
        for f in [
            RecordFormat::AsStored,
            RecordFormat::Json,
            RecordFormat::JsonWithSchema,
            RecordFormat::JsonExpanded,
            RecordFormat::JsonExpandedWithSchema,
        ] {
            assert_eq!(f.as_str().parse::<RecordFormat>(), Ok(f));
        }
        assert!("avro"
            .parse::<RecordFormat>()
            .unwrap_err()
            .contains("as_stored"));
    }
}
