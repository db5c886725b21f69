//! `route.key_format` / `route.value_format`: the records Debezium's Outbox Event Router puts on
//! the wire through Kafka Connect's converters, byte for byte.
//!
//! Sources for the expected bytes:
//! - Debezium's outbox documentation (`transformations/outbox-event-router`, "Using JSON"):
//!   with `table.expand.json.payload = false` (the default) a jsonb payload "is a String"; the
//!   PostgreSQL connector's data types page maps json/jsonb to `STRING` named
//!   `io.debezium.data.Json`, uuid to `io.debezium.data.Uuid`, bytea to `BYTES`.
//! - Debezium `EventRouterDelegate`: without envelope fields the value is the payload field with
//!   the column's schema; the key is the `table.field.event.key` column with its schema; with
//!   envelope fields a struct `{payload, <aliases>}`.
//! - Apache Kafka `JsonConverter.asJsonSchema` (members `type`, `optional`, `name`, `version`),
//!   `JsonSchema.Envelope` (`schema` then `payload`), `convertToJson` (`BYTES` as a Jackson binary
//!   node: base64), and Jackson's compact writer and `CharTypes` escapes.

mod common;

use common::{assert_problem, base_row, router, COMMIT_MICROS};
use ferry_router::{oid, Record, SimpleRow};

fn route(config: &str, row: &SimpleRow) -> Record {
    router(config).route_row(row, COMMIT_MICROS).unwrap()
}

fn text(b: &Option<bytes::Bytes>) -> &str {
    std::str::from_utf8(b.as_deref().expect("not null")).unwrap()
}

#[test]
fn default_is_as_stored_string_converter_bytes() {
    let r = route("", &base_row());
    assert_eq!(text(&r.key), "42");
    assert_eq!(text(&r.value), r#"{"total": 39.98}"#);
}

/// `key.converter = JsonConverter`, `value.converter = JsonConverter`, `schemas.enable = false`.
#[test]
fn json_converter_without_schemas() {
    let r = route(
        "[route]\nkey_format = \"json\"\nvalue_format = \"json\"",
        &base_row(),
    );
    assert_eq!(text(&r.key), r#""42""#);
    assert_eq!(text(&r.value), r#""{\"total\": 39.98}""#);
    // Headers are the SimpleHeaderConverter's and do not change.
    assert_eq!(common::header(&r, "id"), Some(common::EVENT_ID.as_bytes()));
}

/// `schemas.enable = true` (JsonConverter's default) with the reference DDL: `aggregateid`
/// NOT NULL, `payload jsonb` nullable.
#[test]
fn json_converter_with_schemas() {
    let r = route(
        "[route]\nkey_format = \"json_with_schema\"\nvalue_format = \"json_with_schema\"",
        &base_row(),
    );
    assert_eq!(
        text(&r.key),
        r#"{"schema":{"type":"string","optional":false},"payload":"42"}"#
    );
    assert_eq!(
        text(&r.value),
        r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"{\"total\": 39.98}"}"#
    );
    let r = route(
        "[route]\nkey_format = \"json_with_schema\"\nkey_schema_optional = true\nvalue_format = \"json_with_schema\"\nvalue_schema_optional = false",
        &base_row(),
    );
    assert!(text(&r.key).starts_with(r#"{"schema":{"type":"string","optional":true}"#));
    assert!(text(&r.value).contains(r#""optional":false"#));
}

/// Per payload type: json, text, bytea (with `binary.handling.mode = bytes`, base64 in JSON).
#[test]
fn payload_types() {
    type Case<'a> = (u32, &'a str, &'a [u8], &'a str);
    let cases: &[Case<'_>] = &[
        (
            oid::JSON,
            "{\"a\":\"x\\ny\"}",
            br#""{\"a\":\"x\\ny\"}""#,
            r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"{\"a\":\"x\\ny\"}"}"#,
        ),
        (
            oid::TEXT,
            "line\u{1}\t\u{7f}é",
            "\"line\\u0001\\t\u{7f}é\"".as_bytes(),
            "{\"schema\":{\"type\":\"string\",\"optional\":true},\"payload\":\"line\\u0001\\t\u{7f}é\"}",
        ),
        (
            oid::BYTEA,
            "\\x00fffe41",
            br#""AP/+QQ==""#,
            r#"{"schema":{"type":"bytes","optional":true},"payload":"AP/+QQ=="}"#,
        ),
    ];
    for (ty, stored, json, with_schema) in cases {
        let row = base_row().with("payload", *ty, stored);
        let r = route("[route]\nvalue_format = \"json\"", &row);
        assert_eq!(r.value.as_deref(), Some(*json), "oid {ty}");
        let r = route("[route]\nvalue_format = \"json_with_schema\"", &row);
        assert_eq!(text(&r.value), *with_schema, "oid {ty}");
    }
    // bytea as stored is the raw bytes (ByteArrayConverter).
    let row = base_row().with("payload", oid::BYTEA, "\\x00fffe41");
    assert_eq!(
        route("", &row).value.as_deref(),
        Some(&b"\x00\xff\xfeA"[..])
    );
}

/// A NULL payload through JsonConverter is `null` (with its schema), not a tombstone; with
/// `tombstone_on_null_payload` it is a tombstone in every format.
#[test]
fn null_payload() {
    let row = base_row().null("payload", oid::JSONB);
    assert_eq!(
        text(&route("[route]\nvalue_format = \"json\"", &row).value),
        "null"
    );
    assert_eq!(
        text(&route("[route]\nvalue_format = \"json_with_schema\"", &row).value),
        r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":null}"#
    );
    let r = route(
        "[route]\nvalue_format = \"json\"\ntombstone_on_null_payload = true",
        &row,
    );
    assert_eq!(r.value, None);
    // With envelope fields, Debezium put NULL into the optional payload field
    // (`EventRouterDelegate`: `new Struct(structValueSchema).put(ENVELOPE_PAYLOAD, payload)`) and
    // JsonConverter wrote it as `null`.
    for format in ["json", "json_expanded"] {
        let r = route(
            &format!("[route]\nenvelope = true\nvalue_format = \"{format}\"\nadditional_placement = \"type:envelope:eventType\""),
            &row,
        );
        assert_eq!(
            text(&r.value),
            r#"{"payload":null,"eventType":"OrderCreated"}"#,
            "{format}"
        );
    }
}

/// A uuid or integer key (Debezium `io.debezium.data.Uuid`, `int64`).
#[test]
fn key_types() {
    let row = base_row().with("aggregateid", oid::UUID, common::EVENT_ID);
    assert_eq!(
        text(&route("[route]\nkey_format = \"json_with_schema\"", &row).key),
        format!(
            r#"{{"schema":{{"type":"string","optional":false,"name":"io.debezium.data.Uuid","version":1}},"payload":"{}"}}"#,
            common::EVENT_ID
        )
    );
    let row = base_row().with("aggregateid", oid::INT8, "9007199254740993");
    assert_eq!(
        text(&route("[route]\nkey_format = \"json\"", &row).key),
        "9007199254740993"
    );
    // A type JsonConverter output is not defined for here is a routing error naming the column.
    let row = base_row().with("aggregateid", oid::NUMERIC, "1.5");
    let e = router("[route]\nkey_format = \"json\"")
        .route_row(&row, COMMIT_MICROS)
        .unwrap_err();
    assert!(e.to_string().contains("aggregateid"), "{e}");
}

/// Envelope fields with `json`: the struct as JsonConverter writes it without schemas (the
/// jsonb payload a JSON string; `as_stored` embeds it, as expand.json.payload did).
#[test]
fn envelope_with_json() {
    let config = "[route]\nenvelope = true\nvalue_format = \"json\"\nadditional_placement = \"type:envelope:eventType,version:envelope\"";
    let r = route(config, &base_row());
    assert_eq!(
        text(&r.value),
        r#"{"payload":"{\"total\": 39.98}","eventType":"OrderCreated","version":7}"#
    );
    let r = route(
        "[route]\nenvelope = true\nadditional_placement = \"type:envelope:eventType\"",
        &base_row(),
    );
    assert_eq!(
        text(&r.value),
        r#"{"payload":{"total": 39.98},"eventType":"OrderCreated"}"#
    );
}

#[test]
fn what_cannot_be_combined_is_a_config_error() {
    assert_problem(
        "[route]\nvalue_format = \"json_with_schema\"\nenvelope = true",
        "route.value_format",
        "topic.prefix",
    );
    assert_problem(
        "[route]\nvalue_format = \"json\"\ncloudevents = \"structured\"",
        "route.value_format",
        "cloudevents",
    );
    assert_problem(
        "[route]\nvalue_schema_optional = false",
        "route.value_schema_optional",
        "json_with_schema",
    );
}

/// The aggregate id column must be of a type the JSON key formats write: checked against the
/// table before streaming (`required_columns`), not at the first row.
#[test]
fn json_key_narrows_the_accepted_key_types() {
    let r = router("[route]\nkey_format = \"json\"");
    let req = r
        .required_columns()
        .iter()
        .find(|c| c.column == "aggregateid")
        .unwrap();
    let types = req.accepted_types.expect("narrowed");
    assert!(types.contains(&oid::UUID) && !types.contains(&oid::NUMERIC));
    assert!(req.config_key.contains("route.key_format"));
    let r = router("");
    let req = r
        .required_columns()
        .iter()
        .find(|c| c.column == "aggregateid")
        .unwrap();
    assert_eq!(req.accepted_types, None);
}

/// `json_expanded`: Debezium's `table.expand.json.payload` through `JsonConverter` without
/// schemas (`JsonSchemaData` with `table.json.payload.null.behavior = ignore`): the jsonb text
/// parsed and written compactly, null members and empty arrays left out, numbers as Java
/// writes an int, a long and a double.
#[test]
fn json_expanded_value() {
    let row = base_row().with(
        "payload",
        oid::JSONB,
        r#"{"id": 42, "big": 3000000000, "total": 39.98, "rate": 0.0001, "tags": ["a", "b"], "note": null, "none": [], "lines": [{"qty": 1, "sku": "x"}]}"#,
    );
    let r = route("[route]\nvalue_format = \"json_expanded\"", &row);
    assert_eq!(
        text(&r.value),
        r#"{"id":42,"big":3000000000,"total":39.98,"rate":1.0E-4,"tags":["a","b"],"lines":[{"qty":1,"sku":"x"}]}"#
    );
    // A text or json payload is a Java String too, and expanded alike; bytea is not (Debezium
    // warned "payload is not a string" and JsonConverter wrote its base64).
    for ty in [oid::TEXT, oid::JSON] {
        let row = base_row().with("payload", ty, "{ \"a\" : [2.50, 1.25], \"b\": true }");
        assert_eq!(
            text(&route("[route]\nvalue_format = \"json_expanded\"", &row).value),
            r#"{"a":[2.5,1.25],"b":true}"#
        );
    }
    let row = base_row().with("payload", oid::BYTEA, "\\x7b7d");
    assert_eq!(
        text(&route("[route]\nvalue_format = \"json_expanded\"", &row).value),
        r#""e30=""#
    );
    // What Debezium could not expand it sent as a string: the same bytes as "json".
    let row = base_row().with("payload", oid::JSONB, r#"{"mixed": [1, "a"]}"#);
    assert_eq!(
        text(&route("[route]\nvalue_format = \"json_expanded\"", &row).value),
        text(&route("[route]\nvalue_format = \"json\"", &row).value)
    );
    // An envelope: the expanded payload, then the fields as JsonConverter writes them.
    let r = route(
        "[route]\nenvelope = true\nvalue_format = \"json_expanded\"\nadditional_placement = \"type:envelope:eventType\"",
        &base_row(),
    );
    assert_eq!(
        text(&r.value),
        r#"{"payload":{"total":39.98},"eventType":"OrderCreated"}"#
    );
    // A document Kafka Connect failed on is a routing error (the on_error policy applies).
    let row = base_row().with(
        "payload",
        oid::JSONB,
        r#"{"n": 123456789012345678901234567890}"#,
    );
    let e = router("[route]\nvalue_format = \"json_expanded\"")
        .route_row(&row, COMMIT_MICROS)
        .unwrap_err();
    assert!(e.to_string().contains("expand"), "{e}");
    assert_problem(
        "[route]\nkey_format = \"json_expanded\"",
        "route.key_format",
        "value",
    );
}

/// `json_expanded_with_schema`: `table.expand.json.payload` through `JsonConverter` with
/// `schemas.enable = true` (its default). Debezium's `EventRouterDelegate` calls
/// `jsonSchemaData.toConnectSchema(fieldPayload, jsonPayload)`, so the inferred struct is named
/// after the payload column (`table.field.event.payload`), nested structs after their path
/// (`JsonSchemaData`: `key + "." + fieldName`), every schema `optional()`; without envelope
/// fields the record's schema is that struct, with no version. Kafka's `asJsonSchema` writes
/// `type`, `fields` (each with `field` last) or `items`, `optional`, `name`; `FLOAT64` as
/// `double`.
#[test]
fn json_expanded_with_schema_value() {
    let config = "[route]\nvalue_format = \"json_expanded_with_schema\"";
    let row = base_row().with(
        "payload",
        oid::JSONB,
        r#"{"id": 42, "total": 39.98, "note": null, "customer": {"name": "Ada"}, "tags": ["a"]}"#,
    );
    assert_eq!(
        text(&route(config, &row).value),
        concat!(
            r#"{"schema":{"type":"struct","fields":["#,
            r#"{"type":"int32","optional":true,"field":"id"},"#,
            r#"{"type":"double","optional":true,"field":"total"},"#,
            r#"{"type":"struct","fields":[{"type":"string","optional":true,"field":"name"}],"#,
            r#""optional":true,"name":"payload.customer","field":"customer"},"#,
            r#"{"type":"array","items":{"type":"string","optional":true},"optional":true,"field":"tags"}"#,
            r#"],"optional":true,"name":"payload"},"#,
            r#""payload":{"id":42,"total":39.98,"customer":{"name":"Ada"},"tags":["a"]}}"#
        )
    );
    // The payload column names the root struct.
    let row = base_row()
        .without("payload")
        .with("body", oid::JSONB, r#"{"a": true}"#);
    assert_eq!(
        text(&route(
            "[outbox]\npayload_column = \"body\"\n[route]\nvalue_format = \"json_expanded_with_schema\"",
            &row
        )
        .value),
        r#"{"schema":{"type":"struct","fields":[{"type":"boolean","optional":true,"field":"a"}],"optional":true,"name":"body"},"payload":{"a":true}}"#
    );
    // What Debezium did not expand kept the column's schema: the bytes of "json_with_schema",
    // value_schema_optional included; a NULL payload likewise.
    for payload in [Some(r#"{"mixed": [1, "a"]}"#), Some("42"), None] {
        let row = match payload {
            Some(p) => base_row().with("payload", oid::JSONB, p),
            None => base_row().null("payload", oid::JSONB),
        };
        for optional in ["true", "false"] {
            let opt = format!("\nvalue_schema_optional = {optional}");
            assert_eq!(
                text(&route(&format!("{config}{opt}"), &row).value),
                text(
                    &route(
                        &format!("[route]\nvalue_format = \"json_with_schema\"{opt}"),
                        &row
                    )
                    .value
                ),
                "{payload:?}"
            );
        }
    }
    // A text or json payload is a Java String too, and expanded alike; bytea is not (Debezium
    // warned "payload is not a string") and keeps its bytes schema.
    for ty in [oid::TEXT, oid::JSON] {
        let row = base_row().with("payload", ty, "{ \"a\" : [2.50] }");
        assert_eq!(
            text(&route(config, &row).value),
            r#"{"schema":{"type":"struct","fields":[{"type":"array","items":{"type":"double","optional":true},"optional":true,"field":"a"}],"optional":true,"name":"payload"},"payload":{"a":[2.5]}}"#
        );
    }
    let row = base_row().with("payload", oid::BYTEA, "\\x7b7d");
    assert_eq!(
        text(&route(config, &row).value),
        r#"{"schema":{"type":"bytes","optional":true},"payload":"e30="}"#
    );
    // A top-level [] had no schema at all.
    let row = base_row().with("payload", oid::JSONB, "[]");
    assert_eq!(
        text(&route(config, &row).value),
        r#"{"schema":null,"payload":"[]"}"#
    );
    // A non-empty top-level array made the converter fail: a routing error.
    let row = base_row().with("payload", oid::JSONB, "[1, 2]");
    let e = router(config).route_row(&row, COMMIT_MICROS).unwrap_err();
    assert!(e.to_string().contains("JSON array"), "{e}");
    // Refused where Debezium named the schema after things Ferry does not know, and for keys.
    assert_problem(
        "[route]\nvalue_format = \"json_expanded_with_schema\"\nenvelope = true",
        "route.value_format",
        "json_expanded",
    );
    assert_problem(
        "[route]\nkey_format = \"json_expanded_with_schema\"",
        "route.key_format",
        "value",
    );
    assert_problem(
        "[route]\nvalue_format = \"json_expanded_with_schema\"\ncloudevents = \"binary\"",
        "route.value_format",
        "cloudevents",
    );
}
