//! The Outbox Event Router SMT (`transforms.<name>.*`) to `[outbox]` and `[route]`.
//!
//! Defaults are Debezium's (`EventRouterConfigDefinition`): `table.field.event.id` = `id`,
//! `.key` = `aggregateid`, `.type` = `type`, `.payload` = `payload`, `route.by.field` =
//! `aggregatetype`, `route.topic.regex` = `(?<routedByValue>.*)`, `route.topic.replacement` =
//! `outbox.event.${routedByValue}`. Debezium 1.x spelt the payload column `table.field.payload`
//! and the schema version `table.field.schema.version`; both spellings are read.
//!
//! Routing: Debezium sets the record's topic to the `route.by.field` value and hands it to Kafka
//! Connect's `RegexRouter`, which replaces the topic when the regex matches the whole value
//! (`Matcher.matches()`, then `replaceFirst`) and leaves it unchanged otherwise. A regex that
//! captures the whole value in one group (the default) becomes a plain topic template; any other
//! becomes a regex rule, whose topic uses the same `$1` / `${name}` references (Java and Ferry
//! agree on both, and on the `(?<name>...)` group syntax), with `route.topic = "{<field>}"` as
//! the unchanged-value fallback.

use ferry_router::config::parse_additional_placement;
use ferry_router::PlacementLocation;

use super::render::{Doc, Value, OUTBOX, ROUTE};
use super::{DebeziumError, Source, EVENT_ROUTER_CLASS};

/// Debezium's tracing SMT, whose `tracing.span.context.field` Ferry translates too.
pub(super) const TRACING_SMT_CLASS: &str = "io.debezium.transforms.tracing.ActivateTracingSpan";
/// Debezium's SMT that turns a logical decoding message's JSON content into a row for the router.
pub(super) const DECODE_MESSAGE_CLASS: &str =
    "io.debezium.connector.postgresql.transforms.DecodeLogicalDecodingMessageContent";
/// The option naming the trace-context column (the SMT's, or the connector's).
const TRACING_FIELD: &str = "tracing.span.context.field";

/// `route.topic.regex`'s default.
pub(super) const DEFAULT_TOPIC_REGEX: &str = "(?<routedByValue>.*)";
/// `route.topic.replacement`'s default.
pub(super) const DEFAULT_TOPIC_REPLACEMENT: &str = "outbox.event.${routedByValue}";

/// What the Kafka part of the translation needs to know about the SMT.
#[derive(Debug, Clone, Default)]
pub(super) struct Facts {
    /// `table.expand.json.payload`.
    pub(super) expand_json: bool,
    /// The SMT's option names for it and `table.json.payload.null.behavior`: the value
    /// converter's translation settles them (`connect`), as only it knows the bytes.
    pub(super) expand_keys: (String, String),
    /// Some placement puts a column into an envelope (the value is a struct, not the payload).
    pub(super) envelope: bool,
}

/// Finds the Outbox Event Router among `transforms` and notes every other transform's options;
/// also returns the name of a `DecodeLogicalDecodingMessageContent` transform, which
/// [`messages`] translates.
pub(super) fn find(src: &mut Source<'_>) -> Result<(String, Option<String>), DebeziumError> {
    let names: Vec<String> = src
        .take("transforms")
        .unwrap_or_default()
        .split(',')
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect();
    let is_router = |src: &Source<'_>, n: &str| {
        src.peek(&format!("transforms.{n}.type")) == Some(EVENT_ROUTER_CLASS)
    };
    let smt = names
        .iter()
        .find(|n| is_router(src, n))
        .cloned()
        .ok_or(DebeziumError::NoOutboxRouter)?;
    let mut decode = None;
    for other in names.iter().filter(|n| **n != smt) {
        let prefix = format!("transforms.{other}.");
        let type_key = format!("{prefix}type");
        if src.peek(&type_key) == Some(DECODE_MESSAGE_CLASS) && decode.is_none() {
            decode = Some(other.clone());
            continue;
        }
        if src.peek(&type_key) == Some(TRACING_SMT_CLASS) {
            // Its options are read by `tracing`.
            src.note(
                &type_key,
                "Ferry creates no spans; the trace context a row carries is sent on as headers \
                 (outbox.tracing_column, from this transform's tracing.span.context.field)",
            );
            continue;
        }
        let reason = if is_router(src, other) {
            "a second Outbox Event Router (its predicate chose other tables): translate a \
             connector with only this SMT, and copy its [outbox] and [route] into a [[tables]] \
             entry of this file, so one Ferry relays both"
                .to_owned()
        } else {
            format!(
                "Ferry applies no SMT besides the outbox router; the record it sends is described \
                 by [route] (transforms = {:?})",
                names.join(",")
            )
        };
        src.note(&type_key, reason);
        for key in src.keys_with_prefix(&prefix) {
            src.note(
                &key,
                format!("an option of the transform {other:?} (see {type_key})"),
            );
        }
    }
    Ok((smt, decode))
}

/// Translates the SMT's options.
pub(super) fn translate(src: &mut Source<'_>, doc: &mut Doc, smt: &str) -> Facts {
    let key = |opt: &str| format!("transforms.{smt}.{opt}");
    src.take(&key("type"));
    // Each column option: its value, or Debezium's default, and the comment naming it.
    let column = |src: &mut Source<'_>, opts: &[&str], default: Option<&str>| {
        for opt in opts {
            let k = key(opt);
            if let Some(v) = src.take(&k) {
                return Some((v, k));
            }
        }
        default.map(|d| {
            (
                d.to_owned(),
                format!("{} (unset: Debezium's default)", key(opts[0])),
            )
        })
    };
    let id = column(src, &["table.field.event.id"], Some("id"));
    let aggregate_id = column(src, &["table.field.event.key"], Some("aggregateid"));
    let by = column(src, &["route.by.field"], Some("aggregatetype"));
    let type_col = column(src, &["table.field.event.type"], Some("type"));
    let payload = column(
        src,
        &["table.field.event.payload", "table.field.payload"],
        Some("payload"),
    );
    let timestamp = column(src, &["table.field.event.timestamp"], None);
    for (ferry_key, c) in [
        ("id_column", &id),
        ("aggregate_type_column", &by),
        ("aggregate_id_column", &aggregate_id),
        ("type_column", &type_col),
        ("payload_column", &payload),
        ("timestamp_column", &timestamp),
    ] {
        if let Some((v, from)) = c {
            doc.set(OUTBOX, ferry_key, Value::str(v), Some(from));
        }
    }
    doc.caveat(
        OUTBOX,
        "payload_column",
        "Ferry sends the payload as stored: json/jsonb as their JSON text, text as UTF-8, bytea as \
         its bytes; the record key is the aggregate id's text.",
    );
    if timestamp.is_none() {
        doc.intro(
            OUTBOX,
            "No table.field.event.timestamp: Debezium stamped records with the time it processed \
             the row; Ferry uses the transaction's commit time.",
        );
    }
    let by_column = by.map(|(v, _)| v).unwrap_or_default();
    route(src, doc, smt, &by_column);

    doc.set(
        ROUTE,
        "id_header",
        Value::str("id"),
        Some("Debezium's event id header"),
    );
    doc.set(
        ROUTE,
        "type_header",
        Value::str(""),
        Some("Debezium sends no type header"),
    );
    doc.caveat(
        ROUTE,
        "type_header",
        "Debezium sends the event type only where table.fields.additional.placement puts it \
         (e.g. type:header:eventType); Ferry would add a \"type\" header by default.",
    );
    let mut facts = Facts::default();
    let placement_key = key("table.fields.additional.placement");
    if let Some(spec) = src.take(&placement_key).filter(|s| !s.is_empty()) {
        let spec = lowercase_locations(&spec);
        if let Ok(placements) = parse_additional_placement(&spec) {
            facts.envelope = placements
                .iter()
                .any(|p| p.location == PlacementLocation::Envelope);
        }
        doc.set(
            ROUTE,
            "additional_placement",
            Value::Str(spec),
            Some(&placement_key),
        );
    }
    doc.set(
        ROUTE,
        "envelope",
        Value::Bool(facts.envelope),
        Some(if facts.envelope {
            "an envelope placement: the value is {\"payload\": ..., <fields>}"
        } else {
            "no envelope placement: the value is the payload"
        }),
    );
    let tombstone_key = key("route.tombstone.on.empty.payload");
    let tombstone = match src.take(&tombstone_key).map(|v| parse_bool(&v)) {
        Some(Some(b)) => {
            doc.set(
                ROUTE,
                "tombstone_on_null_payload",
                Value::Bool(b),
                Some(&tombstone_key),
            );
            b
        }
        Some(None) => {
            src.note(
                &tombstone_key,
                "not true or false; Debezium would refuse it too",
            );
            false
        }
        None => false,
    };
    if !tombstone {
        // Without it, Debezium's router still sends a row whose payload is NULL: a record with
        // a null value and its headers (found by the parity test against Debezium 3.6.1).
        doc.set(
            ROUTE,
            "send_null_payload",
            Value::Bool(true),
            Some("Debezium sends a NULL payload as a null value"),
        );
    }
    tracing(src, doc, smt);
    facts.expand_json = the_rest(src, smt);
    facts.expand_keys = (
        format!("transforms.{smt}.table.expand.json.payload"),
        format!("transforms.{smt}.table.json.payload.null.behavior"),
    );
    facts
}

/// Debezium's tracing options (the outbox SMT's own, an `ActivateTracingSpan` transform's, or the
/// connector's) to `outbox.tracing_column`. Debezium read the column's `java.util.Properties`
/// text, started its own spans (`db-log-write`, then `tracing.operation.name`) as children of the
/// writer's span, and injected the last one as the record's `traceparent`. Ferry sends the
/// writer's context itself: the consumer's span becomes a child of the writer's span.
fn tracing(src: &mut Source<'_>, doc: &mut Doc, smt: &str) {
    let smt_key = format!("transforms.{smt}.{TRACING_FIELD}");
    let mut keys = vec![smt_key.clone()];
    keys.extend(
        src.keys_with_prefix("transforms.")
            .into_iter()
            .filter(|k| k.ends_with(&format!(".{TRACING_FIELD}")) && *k != smt_key),
    );
    keys.push(TRACING_FIELD.to_owned());
    let mut chosen: Option<String> = None;
    for k in keys {
        let Some(v) = src.peek(&k).map(str::to_owned) else {
            continue;
        };
        match &chosen {
            None => {
                src.take(&k);
                doc.set(OUTBOX, "tracing_column", Value::str(&v), Some(&k));
                doc.caveat(
                    OUTBOX,
                    "tracing_column",
                    "Ferry sends the stored trace context on as the traceparent/tracestate headers \
                     (Debezium's Properties text or a bare traceparent) and creates no spans: the \
                     consumer continues the writer's span, not a Debezium span. A malformed value is \
                     left out and counted, never fatal.",
                );
                chosen = Some(v);
            }
            Some(c) if *c == v => {
                src.take(&k);
            }
            Some(c) => src.note(
                &k,
                format!("a second trace-context field; Ferry reads one column (outbox.tracing_column = {c:?})"),
            ),
        }
    }
    let mut prefixes: Vec<String> = std::iter::once(format!("transforms.{smt}."))
        .chain(
            src.keys_with_prefix("transforms.")
                .into_iter()
                .filter(|k| {
                    k.ends_with(".tracing.operation.name")
                        || k.ends_with(".tracing.with.context.field.only")
                })
                .filter_map(|k| {
                    k.strip_suffix("tracing.operation.name")
                        .or_else(|| k.strip_suffix("tracing.with.context.field.only"))
                        .map(str::to_owned)
                }),
        )
        .chain(std::iter::once(String::new()))
        .collect();
    prefixes.sort_unstable();
    prefixes.dedup();
    for prefix in prefixes {
        src.note(
            &format!("{prefix}tracing.operation.name"),
            "names the span Debezium created per record; Ferry creates no spans (the headers carry \
             the writer's own context)",
        );
        src.note(
            &format!("{prefix}tracing.with.context.field.only"),
            "Ferry only ever sends a trace context a row carries (a NULL or blank column: no \
             headers), which is what true did; with false Debezium also started new traces for \
             rows without one, which Ferry does not",
        );
    }
}

/// `route.by.field`, `route.topic.regex` and `route.topic.replacement` to `route.topic` (and a
/// rule when the regex is not a catch-all).
fn route(src: &mut Source<'_>, doc: &mut Doc, smt: &str, by: &str) {
    let regex_key = format!("transforms.{smt}.route.topic.regex");
    let replacement_key = format!("transforms.{smt}.route.topic.replacement");
    let regex = src.take(&regex_key);
    let replacement = src.take(&replacement_key);
    let from = match (&regex, &replacement) {
        (None, None) => format!("{replacement_key} (unset: Debezium's default)"),
        (None, Some(_)) => replacement_key.clone(),
        _ => format!("{regex_key} + {replacement_key}"),
    };
    let regex = regex.unwrap_or_else(|| DEFAULT_TOPIC_REGEX.to_owned());
    let replacement = replacement.unwrap_or_else(|| DEFAULT_TOPIC_REPLACEMENT.to_owned());
    let placeholder = format!("{{{by}}}");
    if let Some(template) =
        catch_all_group(&regex).and_then(|refs| as_template(&replacement, &refs, &placeholder))
    {
        doc.set(ROUTE, "topic", Value::Str(template), Some(&from));
        return;
    }
    let rule = vec![
        ("column", by.to_owned()),
        ("regex", regex),
        ("topic", replacement),
    ];
    doc.set(ROUTE, "rules", Value::Tables(vec![rule]), Some(&from));
    doc.set(
        ROUTE,
        "topic",
        Value::Str(placeholder),
        Some("a value the regex does not match is the topic itself (Kafka Connect's RegexRouter)"),
    );
}

/// If `regex` matches any value whole as one group (`(?<name>.*)`, `(.*)`, `.*`), the references
/// that stand for the value in a replacement.
fn catch_all_group(regex: &str) -> Option<Vec<String>> {
    let re = regex.trim();
    if re == ".*" {
        return Some(vec!["$0".into(), "${0}".into()]);
    }
    let inner = re.strip_prefix('(')?.strip_suffix(".*)")?;
    let mut refs = vec!["$0".into(), "${0}".into(), "$1".into(), "${1}".into()];
    if inner.is_empty() {
        return Some(refs);
    }
    let name = inner.strip_prefix("?<")?.strip_suffix('>')?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    refs.push(format!("${{{name}}}"));
    Some(refs)
}

/// `replacement` with each of `refs` replaced by `placeholder`, if no other `$` reference or
/// Java escape remains and no brace could be read as a placeholder.
fn as_template(replacement: &str, refs: &[String], placeholder: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = replacement;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        // The longest reference that matches and is not followed by a digit ($1 vs $10).
        let hit = refs
            .iter()
            .filter(|r| tail.starts_with(r.as_str()))
            .filter(|r| !tail[r.len()..].starts_with(|c: char| c.is_ascii_digit()))
            .max_by_key(|r| r.len())?;
        out.push_str(placeholder);
        rest = &tail[hit.len()..];
    }
    out.push_str(rest);
    if out.replace(placeholder, "").contains(['{', '}', '\\']) {
        return None;
    }
    Some(out)
}

/// Debezium reads a placement's location case-insensitively; Ferry wants it in lower case.
fn lowercase_locations(spec: &str) -> String {
    spec.split(',')
        .map(|entry| {
            let mut parts: Vec<String> = entry.split(':').map(str::to_owned).collect();
            if let Some(loc) = parts.get_mut(1) {
                let lower = loc.trim().to_ascii_lowercase();
                if ["header", "envelope", "partition"].contains(&lower.as_str()) {
                    *loc = lower;
                }
            }
            parts.join(":")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Kafka's boolean parsing: `true`/`false`, any case.
pub(super) fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// Notes the SMT's options without an equivalent; returns `table.expand.json.payload` (which,
/// with `table.json.payload.null.behavior`, the value converter's translation settles).
fn the_rest(src: &mut Source<'_>, smt: &str) -> bool {
    let key = |opt: &str| format!("transforms.{smt}.{opt}");
    let expand = src
        .peek(&key("table.expand.json.payload"))
        .and_then(parse_bool)
        .unwrap_or(false);
    let missing = key("table.fields.additional.error.on.missing");
    match src.peek(&missing).and_then(parse_bool) {
        Some(true) => {
            src.take(&missing);
        }
        _ => src.note(
            &missing,
            "Ferry always treats a placed column missing from the row as a routing error, which \
             route.on_error handles (fail, skip or dead_letter); leave columns that may be absent \
             out of route.additional_placement",
        ),
    }
    for opt in [
        "table.field.event.schema.version",
        "table.field.schema.version",
    ] {
        src.note(
            &key(opt),
            "sets the Kafka Connect schema version of the value, which only a schema-aware \
             converter writes; Ferry sends no schema",
        );
    }
    for opt in ["table.op.invalid.behavior", "debezium.op.invalid.behavior"] {
        let k = key(opt);
        match src.peek(&k).map(str::to_ascii_lowercase).as_deref() {
            Some("warn") => {
                src.take(&k);
            }
            _ => src.note(
                &k,
                "Ferry skips (and counts) UPDATEs and DELETEs of the outbox table, as Debezium's \
                 default warn did; it has no mode that fails on them",
            ),
        }
    }
    for opt in ["table.field.event.payload.id", "table.field.payload.id"] {
        src.note(
            &key(opt),
            "a Debezium 1.x envelope field; to send that column, add it to route.additional_placement",
        );
    }
    for opt in ["predicate", "negate"] {
        src.note(
            &key(opt),
            "Ferry routes only the outbox table's INSERTs, which is what a predicate selecting the \
             outbox topic achieves; check that it did nothing else",
        );
    }
    let settled_later = [
        key("table.expand.json.payload"),
        key("table.json.payload.null.behavior"),
    ];
    for k in src.keys_with_prefix(&format!("transforms.{smt}.")) {
        if settled_later.contains(&k) {
            continue;
        }
        src.note(
            &k,
            "not an Outbox Event Router option Ferry has an equivalent for",
        );
    }
    expand
}

/// Logical decoding messages: Debezium routes them when `DecodeLogicalDecodingMessageContent`
/// (transform `decode`) turns their JSON content into a row before the router; Ferry relays the
/// messages of one prefix (`outbox.message_prefix`) with the same content format.
pub(super) fn messages(src: &mut Source<'_>, doc: &mut Doc, decode: &str) {
    let type_key = format!("transforms.{decode}.type");
    src.take(&type_key);
    let nulls = format!("transforms.{decode}.fields.null.include");
    // Null members dropped or kept as null fields: the router reads a missing field and a null
    // one alike, and so does Ferry.
    src.take(&nulls);
    const LIST: &str = "message.prefix.include.list";
    let why_one = "Ferry relays the messages of one prefix (outbox.message_prefix): set it to the \
                   prefix your application passes to pg_logical_emit_message";
    match src.peek(LIST).map(str::to_owned) {
        None => src.note_value(LIST, "(unset: Debezium took every prefix)", why_one),
        Some(list) => {
            let entries: Vec<&str> = list
                .split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .collect();
            // A prefix that is a plain name (a regex matching only itself, `\.` for a dot).
            let literal = |e: &str| {
                let plain = e.replace("\\.", "");
                !plain.is_empty()
                    && plain
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            };
            match entries.as_slice() {
                [one] if literal(one) => {
                    let prefix = one.replace("\\.", ".");
                    src.take(LIST);
                    doc.set(OUTBOX, "message_prefix", Value::str(&prefix), Some(LIST));
                    doc.caveat(
                        OUTBOX,
                        "message_prefix",
                        "Messages emitted with pg_logical_emit_message(true, prefix, content) are \
                         routed like rows, the content one JSON object keyed by the column names (as \
                         Debezium's DecodeLogicalDecodingMessageContent read it). A payload given as \
                         a JSON string is sent as that string's contents, as Debezium sent it; a \
                         payload given as an object is sent as its JSON text, where Debezium sent \
                         the struct it decoded (StringConverter wrote Struct{...}).",
                    );
                }
                _ => src.note(LIST, why_one),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catch_all_regexes_become_templates() {
        let t = |re: &str, rep: &str| {
            catch_all_group(re).and_then(|refs| as_template(rep, &refs, "{aggregatetype}"))
        };
        assert_eq!(
            t(DEFAULT_TOPIC_REGEX, DEFAULT_TOPIC_REPLACEMENT).as_deref(),
            Some("outbox.event.{aggregatetype}")
        );
        assert_eq!(
            t("(.*)", "events.$1.v1").as_deref(),
            Some("events.{aggregatetype}.v1")
        );
        assert_eq!(t(".*", "x.$0").as_deref(), Some("x.{aggregatetype}"));
        assert_eq!(t("(?<v>.*)", "fixed").as_deref(), Some("fixed"));
        // A reference the catch-all regex does not define, a group number that is not 1, a
        // Java escape, a regex that selects: rules.
        assert_eq!(t("(?<v>.*)", "x.${other}"), None);
        assert_eq!(t("(.*)", "x.$12"), None);
        assert_eq!(t("(.*)", "x\\$"), None);
        assert_eq!(t("(?<v>.*)Aggregate", "x.${v}"), None);
        assert_eq!(t("(?<v>[a-z]+)", "x.${v}"), None);
    }

    #[test]
    fn placement_locations_are_lowercased_and_the_rest_kept() {
        assert_eq!(
            lowercase_locations("type:HEADER:eventType,tenant:Envelope,p:partition"),
            "type:header:eventType,tenant:envelope,p:partition"
        );
        assert_eq!(lowercase_locations("odd:nowhere"), "odd:nowhere");
    }
}
