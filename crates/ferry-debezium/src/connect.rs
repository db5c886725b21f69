//! Kafka Connect's own options: the converters and `errors.*`.
//!
//! What a consumer sees: Kafka Connect passed the key and value through its converters, and
//! `route.key_format` / `route.value_format` write the same bytes: `StringConverter` and
//! `ByteArrayConverter` are `as_stored`, `JsonConverter` is `json` (`schemas.enable=false`: a
//! string as a quoted JSON string) or `json_with_schema` (its default: `{"schema": ...,
//! "payload": ...}`). The converters are usually the worker's, not the connector's: the CLI's
//! `--worker` file fills them in ([`crate::Options::worker`]). Where no format reproduces the
//! converter (a schema registry, envelope fields under a schema) a note says what
//! changes for consumers, including the key's partition, which follows the key's bytes.
//!
//! `errors.tolerance = all` becomes `route.on_error = "skip"`; a dead letter queue topic does
//! not become `dead_letter`, because Kafka Connect uses one for sink connectors only (its
//! `SinkConnectorConfig`), so the connector never sent anything there.

use ferry_router::config::{DEFAULT_KEY_SCHEMA_OPTIONAL, DEFAULT_VALUE_SCHEMA_OPTIONAL};
use ferry_router::{ExpandNullBehavior, RecordFormat};

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

/// `key.converter` / `value.converter` and their settings: the `route.key_format` /
/// `route.value_format` that writes the bytes the converter wrote (see `ferry_router::format`).
fn converter(src: &mut Source<'_>, doc: &mut Doc, side: &str, facts: &Facts) {
    let key = format!("{side}.converter");
    let schemas_key = format!("{key}.schemas.enable");
    let format_key = format!("{side}_format");
    let Some(class) = src.peek(&key).map(str::to_owned) else {
        if side == "value" {
            expansion(src, doc, None, facts);
        }
        src.note_value(
            &key,
            "(unset)",
            format!(
                "the Kafka Connect worker's converter decided the {side}'s bytes, and it is not in \
                 this connector config: rerun with --worker <connect-distributed.properties>, or \
                 set route.{format_key} by hand (\"json_with_schema\" for JsonConverter with its \
                 default schemas.enable=true, \"json\" with schemas.enable=false, \"as_stored\" \
                 for StringConverter or ByteArrayConverter)"
            ),
        );
        return;
    };
    let schemas = src.peek(&schemas_key).and_then(parse_bool).unwrap_or(true);
    let short = class.rsplit('.').next().unwrap_or(&class).to_owned();
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
    let is_json = class.ends_with("JsonConverter") && !class.contains("Schema");
    let expand = side == "value" && facts.expand_json;
    // The format that reproduces the converter's bytes, or why none does.
    let outcome: Result<(RecordFormat, Option<String>), String> = if class
        .ends_with("StringConverter")
        || class.ends_with("ByteArrayConverter")
    {
        Ok((RecordFormat::AsStored, None))
    } else if is_json && !schemas && expand {
        Ok((RecordFormat::JsonExpanded, None))
    } else if is_json && !schemas {
        Ok((RecordFormat::Json, None))
    } else if is_json && expand && !facts.envelope {
        Ok((
                RecordFormat::JsonExpandedWithSchema,
                Some(format!(
                    "A payload the connector did not expand (not an object, or an array of mixed \
                     kinds) went out as a string with the column's schema, whose \"optional\" is \
                     the column's nullability: route.value_schema_optional = {DEFAULT_VALUE_SCHEMA_OPTIONAL} \
                     assumes a nullable payload column (payload jsonb); set it to match your table."
                )),
            ))
    } else if is_json && side == "value" && facts.envelope {
        Err(
            "with envelope fields and schemas.enable=true the connector named the struct \
                 schema after its topic.prefix and each aggregate type, which Ferry does not \
                 write; route.value_format = \"json\" gives the same object without the schema \
                 envelope"
                .to_owned(),
        )
    } else if is_json {
        Ok((
            RecordFormat::JsonWithSchema,
            Some(format!(
                "The schema's \"optional\" is the column's nullability: \
                     route.{side}_schema_optional = {} assumes {}; set it to match your table.",
                if side == "key" {
                    DEFAULT_KEY_SCHEMA_OPTIONAL
                } else {
                    DEFAULT_VALUE_SCHEMA_OPTIONAL
                },
                if side == "key" {
                    "an aggregate id column that is NOT NULL"
                } else {
                    "a nullable payload column (payload jsonb)"
                }
            )),
        ))
    } else if class.contains("CloudEvents") {
        Err(format!(
            "Ferry's CloudEvents output is route.cloudevents (binary or structured mode, per \
                 the CloudEvents Kafka binding); it sends {what} unless you set it.{partition}"
        ))
    } else if ["Avro", "Protobuf", "JsonSchema", "confluent", "apicurio"]
        .iter()
        .any(|s| class.contains(s))
    {
        Err(format!(
            "Ferry uses no schema registry: it sends {what} without registry framing, so \
                 consumers must switch to plain deserializers.{partition}"
        ))
    } else {
        Err(format!("Ferry sends {what}.{partition}"))
    };
    if side == "value" {
        expansion(src, doc, outcome.as_ref().ok().map(|(f, _)| *f), facts);
    }
    match outcome {
        Ok((format, caveat)) => {
            src.take(&key);
            let mut from = match src.take(&schemas_key) {
                Some(v) => format!("{key} = {short}, {schemas_key} = {v}"),
                None => format!("{key} = {short}"),
            };
            if format.expands() {
                from.push_str(&format!(", {} = true", facts.expand_keys.0));
            }
            doc.set(ROUTE, &format_key, Value::str(format.as_str()), Some(&from));
            if let Some(c) = caveat {
                doc.caveat(ROUTE, &format_key, c);
            }
        }
        Err(r) => {
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

/// `table.expand.json.payload` and `table.json.payload.null.behavior`, once the value format is
/// known: translated where `json_expanded` / `json_expanded_with_schema` reproduce them (or
/// expansion is off), else noted.
fn expansion(src: &mut Source<'_>, doc: &mut Doc, format: Option<RecordFormat>, facts: &Facts) {
    let (expand_key, null_key) = &facts.expand_keys;
    let nulls = src.peek(null_key).map(str::to_ascii_lowercase);
    match format {
        Some(f) if f.expands() => {
            src.take(expand_key);
            match nulls.as_deref().map(str::parse::<ExpandNullBehavior>) {
                None | Some(Ok(ExpandNullBehavior::Ignore)) => {
                    src.take(null_key);
                }
                Some(Ok(b)) => {
                    let from = format!("{null_key} = {}", src.take(null_key).unwrap_or_default());
                    doc.set(
                        ROUTE,
                        "expand_null_behavior",
                        Value::str(b.as_str()),
                        Some(&from),
                    );
                }
                Some(Err(_)) => src.note(
                    null_key,
                    "not a value Debezium knows (ignore or optional_bytes): Ferry leaves null \
                     members out, as \"ignore\" (the default) does",
                ),
            }
        }
        _ if !facts.expand_json => {
            src.take(expand_key);
            if src.peek(null_key).is_some() {
                src.note(null_key, "has no effect without table.expand.json.payload");
            }
        }
        _ => {
            src.note(
                expand_key,
                "with this value converter (or an unknown one) no Ferry format writes the \
                 expanded payload's bytes: \
                 Ferry sends it as its JSON text (PostgreSQL's spacing, null members kept); with \
                 JsonConverter route.value_format = \"json_expanded\" (schemas.enable=false) or \
                 \"json_expanded_with_schema\" (schemas.enable=true, without envelope fields) \
                 reproduces it",
            );
            src.note(null_key, "belongs to table.expand.json.payload (see there)");
        }
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
