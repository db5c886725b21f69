//! Kafka Connect's own options: the converters and `errors.*`.
//!
//! What a consumer sees: Ferry sends the payload column as stored and the key as the aggregate
//! id's text, with no schema envelope and no schema registry framing. Kafka Connect passed the
//! same data through its converters: `JsonConverter` with `schemas.enable=true` (its default)
//! wrapped each key and value in `{"schema": ..., "payload": ...}`; with `false` it still wrote a
//! string as a quoted JSON string. The notes say what changes for consumers, including the key's
//! partition, which follows the key's bytes.
//!
//! `errors.tolerance = all` becomes `route.on_error = "skip"`; a dead letter queue topic does
//! not become `dead_letter`, because Kafka Connect uses one for sink connectors only (its
//! `SinkConnectorConfig`), so the connector never sent anything there.

use super::outbox::{parse_bool, Facts};
use super::render::{Doc, Value, ROUTE};
use super::Source;

/// Translates the converters and the error handling.
pub(super) fn translate(src: &mut Source<'_>, doc: &mut Doc, facts: &Facts) {
    converter(src, doc, "key", facts);
    converter(src, doc, "value", facts);
    match src.peek("header.converter") {
        Some(c) if c.ends_with("SimpleHeaderConverter") => {
            src.take("header.converter");
        }
        _ => src.note(
            "header.converter",
            "Ferry sends header values as the column's text (bytea decoded)",
        ),
    }
    errors(src, doc);
}

/// `key.converter` / `value.converter` and their settings.
fn converter(src: &mut Source<'_>, doc: &mut Doc, side: &str, facts: &Facts) {
    let key = format!("{side}.converter");
    let schemas_key = format!("{key}.schemas.enable");
    let Some(class) = src.peek(&key).map(str::to_owned) else {
        if side == "value" {
            doc.intro(
                ROUTE,
                "The converters are the Kafka Connect worker's (not in this connector config). \
                 Ferry sends the key as the aggregate id's text and the value as the payload as \
                 stored, with no schema envelope: the worker default, JsonConverter with \
                 schemas.enable=true, wrapped both in {\"schema\": ..., \"payload\": ...}.",
            );
        }
        return;
    };
    let schemas = src.peek(&schemas_key).and_then(parse_bool).unwrap_or(true);
    let what = if side == "key" {
        "the aggregate id's text"
    } else if facts.envelope {
        "the object {\"payload\": <payload>, <envelope fields>}"
    } else {
        "the payload as stored"
    };
    let partition = if side == "key" {
        " The key's bytes differ, so a key's partition changes at the switch: per-key order holds \
         within the connector's records and within Ferry's, not across them."
    } else {
        ""
    };
    let reason = if class.ends_with("StringConverter")
        || (class.ends_with("ByteArrayConverter") && side == "value")
        || (class.ends_with("JsonConverter") && !schemas && side == "value" && facts.expand_json)
    {
        None
    } else if class.ends_with("JsonConverter") && schemas {
        Some(format!(
            "Debezium wrote {{\"schema\": ..., \"payload\": ...}}; Ferry sends {what} with no schema \
             envelope, so consumers that read the payload field must read the {side} itself.{partition}"
        ))
    } else if class.ends_with("JsonConverter") {
        Some(format!(
            "with schemas.enable=false Debezium still wrote a string as a quoted JSON string \
             (\"\\\"42\\\"\"); Ferry sends {what} unquoted, so consumers that JSON-decode the {side} \
             must read it as is.{partition}"
        ))
    } else if class.contains("CloudEvents") {
        Some(format!(
            "Ferry does not produce CloudEvents: it sends {what}.{partition}"
        ))
    } else if ["Avro", "Protobuf", "JsonSchema", "confluent", "apicurio"]
        .iter()
        .any(|s| class.contains(s))
    {
        Some(format!(
            "Ferry uses no schema registry: it sends {what} without registry framing, so \
             consumers must switch to plain deserializers.{partition}"
        ))
    } else {
        Some(format!("Ferry sends {what}.{partition}"))
    };
    match reason {
        None => {
            src.take(&key);
            let schemas_note = match src.take(&schemas_key) {
                Some(v) => format!(" with {schemas_key} = {v}"),
                None => String::new(),
            };
            let class = class.rsplit('.').next().unwrap_or(&class);
            doc.intro(
                ROUTE,
                format!("{key} = {class}{schemas_note}: Ferry sends the same {side}, {what}."),
            );
        }
        Some(r) => {
            src.note(&key, r.trim_end_matches('.').to_owned());
            src.note(&schemas_key, format!("belongs to {key} (see there)"));
        }
    }
    for sub in src.keys_with_prefix(&format!("{key}.")) {
        src.note(
            &sub,
            format!("a setting of {key}, which Ferry does not use"),
        );
    }
}

/// `errors.*` to `route.on_error`.
fn errors(src: &mut Source<'_>, doc: &mut Doc) {
    match src
        .peek("errors.tolerance")
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("all") => {
            src.take("errors.tolerance");
            doc.set(
                ROUTE,
                "on_error",
                Value::str("skip"),
                Some("errors.tolerance = all"),
            );
            doc.caveat(
                ROUTE,
                "on_error",
                "Kafka Connect skipped records its transforms or converters failed on (and, since \
                 Kafka 3.2, records the producer could not send); Ferry skips only rows it cannot \
                 route, with a log line and a metric each, and never a record Kafka refused.",
            );
        }
        Some("none") | None => {
            let from = if src.take("errors.tolerance").is_some() {
                "errors.tolerance = none"
            } else {
                "errors.tolerance (unset: none)"
            };
            doc.set(ROUTE, "on_error", Value::str("fail"), Some(from));
        }
        Some(_) => src.note(
            "errors.tolerance",
            "not none or all; Ferry's route.on_error is fail, skip or dead_letter",
        ),
    }
    if let Some(topic) = src
        .peek("errors.deadletterqueue.topic.name")
        .map(str::to_owned)
    {
        src.note(
            "errors.deadletterqueue.topic.name",
            format!(
                "Kafka Connect uses a dead letter queue for sink connectors only, so this source \
                 connector sent nothing there; to dead-letter the rows Ferry cannot route, set \
                 route.on_error = \"dead_letter\" and route.dead_letter_topic = {topic:?}"
            ),
        );
    }
    for key in src.keys_with_prefix("errors.deadletterqueue.") {
        src.note(
            &key,
            "belongs to errors.deadletterqueue.topic.name (see there)",
        );
    }
    for key in ["errors.log.enable", "errors.log.include.messages"] {
        src.note(
            key,
            "Ferry logs every row it skips or dead-letters (event id and reason, never the payload)",
        );
    }
    for key in ["errors.retry.timeout", "errors.retry.delay.max.ms"] {
        src.note(
            key,
            "Ferry's routing is deterministic, so it does not retry it; librdkafka retries \
             deliveries until kafka.delivery_timeout (never, by default)",
        );
    }
}
