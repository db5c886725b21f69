//! Validation of `[outbox]` and `[route]`: every problem is reported at once, each with its key path
//! (`route.rules[2].topic: ...`), so one edit fixes a config instead of one edit per run.

use std::fmt;

use crate::base::template::{GroupRef, Template};
use crate::base::topic::{validate_topic, MAX_TOPIC_LENGTH};
use crate::compile::config::{
    parse_additional_placement, OutboxConfig, PlacementLocation, RouteConfig, ENVELOPE_PAYLOAD_KEY,
    MAX_MAX_PAYLOAD_BYTES, POSITION_HEADER, SOURCE_HEADER,
};
use crate::compile::config::{
    CloudEventsMode, ExpandNullBehavior, OnError, RecordFormat, DEFAULT_KEY_SCHEMA_OPTIONAL,
    DEFAULT_VALUE_SCHEMA_OPTIONAL,
};
use crate::encode::cloudevents::HEADER_NAMES as CLOUDEVENTS_HEADERS;
use crate::encode::trace::{TRACEPARENT_HEADER, TRACESTATE_HEADER};

/// One configuration problem: the key path and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// Key path, e.g. `route.rules[2].topic`.
    pub path: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl ConfigProblem {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigProblem {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem found in a configuration (never empty when returned as an error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors {
    /// The problems, in key order.
    pub problems: Vec<ConfigProblem>,
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "{n} configuration problem{}:",
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

impl ConfigErrors {
    pub(crate) fn from_problems(problems: Vec<ConfigProblem>) -> Result<(), ConfigErrors> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors { problems })
        }
    }
}

/// A single problem as [`ConfigErrors`].
pub(crate) fn problem(path: &str, message: String) -> ConfigErrors {
    ConfigErrors {
        problems: vec![ConfigProblem::new(path, message)],
    }
}

impl IntoIterator for ConfigErrors {
    type Item = ConfigProblem;
    type IntoIter = std::vec::IntoIter<ConfigProblem>;
    fn into_iter(self) -> Self::IntoIter {
        self.problems.into_iter()
    }
}

/// Validates both sections together, including the checks that span them (`partition` placement vs
/// `outbox.partition_column`). [`crate::Router::new`] runs this.
pub fn validate(outbox: &OutboxConfig, route: &RouteConfig) -> Result<(), ConfigErrors> {
    let mut problems = outbox.problems();
    problems.extend(route.problems());
    if route.topic.is_none() && !outbox.aggregate_type_column.is_empty() {
        let path = "route.topic (default, from outbox.aggregate_type_column)";
        check_template(&mut problems, path, &route.topic_template(outbox), None);
    }
    if let (Some(col), Some(spec)) = (&outbox.partition_column, &route.additional_placement) {
        if let Ok(placements) = parse_additional_placement(spec) {
            if placements
                .iter()
                .any(|p| p.location == PlacementLocation::Partition && &p.column != col)
            {
                problems.push(ConfigProblem::new(
                    "route.additional_placement",
                    format!("a partition placement conflicts with outbox.partition_column = {col:?}; keep one of them"),
                ));
            }
        }
    }
    if outbox.tracing_column.is_some() {
        for (name, path) in route.header_names() {
            if name == TRACEPARENT_HEADER || name == TRACESTATE_HEADER {
                problems.push(ConfigProblem::new(
                    path,
                    format!(
                        "header {name:?} is what outbox.tracing_column sends; remove one of them"
                    ),
                ));
            }
        }
    }
    if route.position_headers {
        problems.extend(position_header_clashes(route, ""));
    }
    ConfigErrors::from_problems(problems)
}

/// With `route.position_headers`: a header configured in `route` (a table's, with its key
/// `prefix`) that takes the name of one the position headers send.
pub(crate) fn position_header_clashes(route: &RouteConfig, prefix: &str) -> Vec<ConfigProblem> {
    route
        .header_names()
        .into_iter()
        .filter(|(name, _)| name == SOURCE_HEADER || name == POSITION_HEADER)
        .map(|(name, path)| {
            ConfigProblem::new(
                format!("{prefix}{path}"),
                format!(
                    "header {name:?} is sent by route.position_headers = true; rename this one"
                ),
            )
        })
        .collect()
}

fn column_name(problems: &mut Vec<ConfigProblem>, path: &str, name: &str) {
    if name.is_empty() {
        problems.push(ConfigProblem::new(path, "must not be empty"));
    } else if name.contains('\0') {
        problems.push(ConfigProblem::new(path, "must not contain a NUL character"));
    }
}

impl OutboxConfig {
    /// Validates this section alone.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        ConfigErrors::from_problems(self.problems())
    }

    /// Every problem in this section, with key paths.
    pub fn problems(&self) -> Vec<ConfigProblem> {
        let mut p = Vec::new();
        if let Err(e) = self.table_name() {
            p.push(ConfigProblem::new("outbox.table", e));
        }
        column_name(&mut p, "outbox.id_column", &self.id_column);
        column_name(
            &mut p,
            "outbox.aggregate_type_column",
            &self.aggregate_type_column,
        );
        column_name(
            &mut p,
            "outbox.aggregate_id_column",
            &self.aggregate_id_column,
        );
        column_name(&mut p, "outbox.type_column", &self.type_column);
        column_name(&mut p, "outbox.payload_column", &self.payload_column);
        if let Some(c) = &self.timestamp_column {
            column_name(&mut p, "outbox.timestamp_column", c);
        }
        if let Some(c) = &self.partition_column {
            column_name(&mut p, "outbox.partition_column", c);
        }
        if let Some(c) = &self.tracing_column {
            column_name(&mut p, "outbox.tracing_column", c);
        }
        if let Some(prefix) = &self.message_prefix {
            if prefix.is_empty() {
                p.push(ConfigProblem::new(
                    "outbox.message_prefix",
                    "must not be empty; leave it unset to ignore logical decoding messages",
                ));
            }
        }
        p
    }
}

impl RouteConfig {
    /// Every header name this section configures (id, type, `[[route.headers]]`, `header`
    /// placements), with the key that sets it.
    pub(crate) fn header_names(&self) -> Vec<(String, String)> {
        let mut names = Vec::new();
        for (what, name) in [
            ("route.id_header", &self.id_header),
            ("route.type_header", &self.type_header),
        ] {
            if !name.is_empty() {
                names.push((name.clone(), what.to_owned()));
            }
        }
        for (i, h) in self.headers.iter().enumerate() {
            names.push((h.header_name().to_owned(), format!("route.headers[{i}]")));
        }
        if let Some(Ok(placements)) = self
            .additional_placement
            .as_deref()
            .map(parse_additional_placement)
        {
            for (i, pl) in placements.iter().enumerate() {
                if pl.location == PlacementLocation::Header {
                    names.push((pl.alias.clone(), format!("route.additional_placement[{i}]")));
                }
            }
        }
        names
    }

    fn cloudevents_problems(&self, p: &mut Vec<ConfigProblem>) {
        let keys = [
            ("route.cloudevents_source", &self.cloudevents_source),
            ("route.cloudevents_subject", &self.cloudevents_subject),
            (
                "route.cloudevents_data_content_type",
                &self.cloudevents_data_content_type,
            ),
        ];
        if self.cloudevents == CloudEventsMode::None {
            for (key, v) in keys {
                if v.is_some() {
                    p.push(ConfigProblem::new(
                        key,
                        "has no effect unless route.cloudevents = \"binary\" or \"structured\"",
                    ));
                }
            }
            return;
        }
        for (key, v) in &keys[..2] {
            if let Some(t) = v {
                if let Err(e) = Template::parse_text(t) {
                    p.push(ConfigProblem::new(*key, e));
                }
            }
        }
        if let Some(Ok(t)) = self.cloudevents_source.as_deref().map(Template::parse_text) {
            for seg in t.segments() {
                if let crate::base::template::Segment::Literal(l) = seg {
                    if !crate::encode::cloudevents::is_uri_reference_text(l.as_bytes()) {
                        p.push(ConfigProblem::new(
                            "route.cloudevents_source",
                            format!("{l:?} is not URI text (CloudEvents 1.0 §3.1.1 wants a URI reference, RFC 3986): percent-encode spaces, quotes and non-ASCII characters"),
                        ));
                    }
                }
            }
        }
        if self.cloudevents_source.as_deref() == Some("") {
            p.push(ConfigProblem::new(
                "route.cloudevents_source",
                "must not be empty: a CloudEvent needs a source (CloudEvents 1.0 §3.1.1); leave it unset for /ferry/<schema>/<table>",
            ));
        }
        if let Some(ct) = &self.cloudevents_data_content_type {
            if ct.trim().is_empty() || !ct.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                p.push(ConfigProblem::new(
                    "route.cloudevents_data_content_type",
                    format!("{ct:?} is not a media type (RFC 2046, e.g. \"application/avro\"); leave it unset to derive it from the payload's type"),
                ));
            }
        }
        for (name, path) in self.header_names() {
            if CLOUDEVENTS_HEADERS.contains(&name.as_str()) {
                p.push(ConfigProblem::new(
                    path,
                    format!(
                        "header {name:?} is sent by route.cloudevents = \"{}\"; rename this one",
                        self.cloudevents
                    ),
                ));
            }
        }
    }

    fn format_problems(&self, p: &mut Vec<ConfigProblem>) {
        if self.value_format != RecordFormat::AsStored && self.cloudevents != CloudEventsMode::None
        {
            p.push(ConfigProblem::new(
                "route.value_format",
                format!(
                    "\"{}\" cannot be combined with route.cloudevents = \"{}\" (a CloudEvent has its own \
                     format); set one of them back to its default",
                    self.value_format, self.cloudevents
                ),
            ));
        }
        if self.value_format.has_schema() && self.envelope {
            p.push(ConfigProblem::new(
                "route.value_format",
                format!(
                    "\"{}\" with route.envelope = true is not supported: Debezium names that \
                     struct schema after the connector's topic.prefix and each aggregate type, which \
                     Ferry does not know; use \"{}\" (the envelope as JsonConverter writes it with \
                     schemas.enable = false) or envelope = false",
                    self.value_format,
                    if self.value_format.expands() {
                        "json_expanded"
                    } else {
                        "json"
                    }
                ),
            ));
        }
        if self.key_format.expands() {
            p.push(ConfigProblem::new(
                "route.key_format",
                format!(
                    "\"{}\" is for the value (Debezium's table.expand.json.payload expands the \
                     payload only); the key's JsonConverter format is \"json\" or \
                     \"json_with_schema\"",
                    self.key_format
                ),
            ));
        }
        if self.expand_null_behavior != ExpandNullBehavior::Ignore && !self.value_format.expands() {
            p.push(ConfigProblem::new(
                "route.expand_null_behavior",
                "has no effect unless route.value_format = \"json_expanded\" or \
                 \"json_expanded_with_schema\" (Debezium's table.json.payload.null.behavior \
                 belongs to table.expand.json.payload)",
            ));
        }
        for (key, format, set) in [
            (
                "route.key_schema_optional",
                self.key_format,
                self.key_schema_optional != DEFAULT_KEY_SCHEMA_OPTIONAL,
            ),
            (
                "route.value_schema_optional",
                self.value_format,
                self.value_schema_optional != DEFAULT_VALUE_SCHEMA_OPTIONAL,
            ),
        ] {
            if set && !format.has_schema() {
                p.push(ConfigProblem::new(
                    key,
                    format!(
                        "has no effect unless route.{}_format writes a schema \
                         (\"json_with_schema\", or \"json_expanded_with_schema\" for the value)",
                        if key.contains("key") { "key" } else { "value" }
                    ),
                ));
            }
        }
    }

    /// Validates this section alone (see [`validate`] for the cross-section checks).
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        ConfigErrors::from_problems(self.problems())
    }

    /// Every problem in this section, with key paths.
    pub fn problems(&self) -> Vec<ConfigProblem> {
        let mut p = Vec::new();
        if let Some(topic) = &self.topic {
            check_template(&mut p, "route.topic", topic, None);
        }
        for (i, rule) in self.rules.iter().enumerate() {
            let path = format!("route.rules[{i}]");
            column_name(&mut p, &format!("{path}.column"), &rule.column);
            let regex = match (&rule.equals, &rule.regex) {
                (Some(_), Some(_)) => {
                    p.push(ConfigProblem::new(
                        &path,
                        "set either `equals` or `regex`, not both",
                    ));
                    None
                }
                (None, None) => {
                    p.push(ConfigProblem::new(
                        &path,
                        "set `equals = \"value\"` or `regex = \"pattern\"`",
                    ));
                    None
                }
                (Some(_), None) => None,
                (None, Some(re)) => match compile_rule_regex(re) {
                    Ok(re) => Some(re),
                    Err(e) => {
                        p.push(ConfigProblem::new(format!("{path}.regex"), e));
                        None
                    }
                },
            };
            check_template(
                &mut p,
                &format!("{path}.topic"),
                &rule.topic,
                rule.regex.as_ref().map(|_| regex.as_ref()),
            );
        }
        let mut header_names: Vec<(String, String)> = Vec::new();
        for (what, name) in [
            ("route.id_header", &self.id_header),
            ("route.type_header", &self.type_header),
        ] {
            if !name.is_empty() {
                header_names.push((name.clone(), what.to_owned()));
            }
        }
        for (i, h) in self.headers.iter().enumerate() {
            column_name(&mut p, &format!("route.headers[{i}].column"), &h.column);
            if h.name.as_deref() == Some("") {
                p.push(ConfigProblem::new(
                    format!("route.headers[{i}].name"),
                    "must not be empty; omit it to use the column name",
                ));
            }
            header_names.push((h.header_name().to_owned(), format!("route.headers[{i}]")));
        }
        if !self.envelope && !self.envelope_fields.is_empty() {
            p.push(ConfigProblem::new(
                "route.envelope_fields",
                "has no effect unless route.envelope = true",
            ));
        }
        let mut envelope_keys: Vec<(String, String)> = Vec::new();
        for (i, f) in self.envelope_fields.iter().enumerate() {
            let path = format!("route.envelope_fields[{i}]");
            column_name(&mut p, &path, f);
            envelope_keys.push((f.clone(), path));
        }
        if let Some(spec) = &self.additional_placement {
            match parse_additional_placement(spec) {
                Err(errors) => {
                    for (i, e) in errors {
                        p.push(ConfigProblem::new(
                            format!("route.additional_placement[{i}]"),
                            e,
                        ));
                    }
                }
                Ok(placements) => {
                    let mut partitions = 0;
                    for (i, pl) in placements.iter().enumerate() {
                        let path = format!("route.additional_placement[{i}]");
                        match pl.location {
                            PlacementLocation::Header => {
                                header_names.push((pl.alias.clone(), path))
                            }
                            PlacementLocation::Envelope => {
                                if !self.envelope {
                                    p.push(ConfigProblem::new(
                                        &path,
                                        format!(
                                            "{}:envelope needs route.envelope = true",
                                            pl.column
                                        ),
                                    ));
                                }
                                envelope_keys.push((pl.alias.clone(), path));
                            }
                            PlacementLocation::Partition => partitions += 1,
                        }
                    }
                    if partitions > 1 {
                        p.push(ConfigProblem::new(
                            "route.additional_placement",
                            "at most one column can be placed as the partition",
                        ));
                    }
                }
            }
        }
        duplicates(&mut p, &header_names, "header name");
        self.cloudevents_problems(&mut p);
        self.format_problems(&mut p);
        for (key, path) in &envelope_keys {
            if key == ENVELOPE_PAYLOAD_KEY {
                p.push(ConfigProblem::new(
                    path,
                    "\"payload\" is the envelope's payload key; use an alias (column:envelope:alias)",
                ));
            }
        }
        duplicates(&mut p, &envelope_keys, "envelope field");
        if self.max_payload_bytes == 0 || self.max_payload_bytes > MAX_MAX_PAYLOAD_BYTES {
            p.push(ConfigProblem::new(
                "route.max_payload_bytes",
                format!(
                    "must be between 1 and {MAX_MAX_PAYLOAD_BYTES} (librdkafka's largest message.max.bytes), got {}",
                    self.max_payload_bytes
                ),
            ));
        }
        match (self.on_error, &self.dead_letter_topic) {
            (OnError::DeadLetter, None) => p.push(ConfigProblem::new(
                "route.dead_letter_topic",
                "is required when route.on_error = \"dead_letter\"",
            )),
            // Under `fail`, where `ferry run --dead-letter-event` sends the one event it names.
            (OnError::DeadLetter | OnError::Fail, Some(t)) => {
                if let Err(e) = validate_topic(t.as_bytes()) {
                    p.push(ConfigProblem::new("route.dead_letter_topic", e.to_string()));
                }
            }
            (other, Some(_)) => p.push(ConfigProblem::new(
                "route.dead_letter_topic",
                format!("is only used when route.on_error = \"dead_letter\" (or \"fail\", by `ferry run --dead-letter-event`; it is {other:?}); remove it or change on_error", other = other.as_str()),
            )),
            (_, None) => {}
        }
        let create = &self.create_topics;
        if create.partitions < 1 {
            p.push(ConfigProblem::new(
                "route.create_topics.partitions",
                format!("must be at least 1, got {}", create.partitions),
            ));
        }
        if create.replication_factor < 1 && create.replication_factor != -1 {
            p.push(ConfigProblem::new(
                "route.create_topics.replication_factor",
                format!(
                    "must be at least 1, or -1 for the brokers' default.replication.factor, got {}",
                    create.replication_factor
                ),
            ));
        }
        for name in create.configs.keys() {
            if name.trim().is_empty() {
                p.push(ConfigProblem::new(
                    "route.create_topics.configs",
                    "a topic config name must not be empty",
                ));
            }
        }
        p
    }
}

fn duplicates(p: &mut Vec<ConfigProblem>, names: &[(String, String)], what: &str) {
    for (i, (name, path)) in names.iter().enumerate() {
        if let Some((_, first)) = names[..i].iter().find(|(n, _)| n == name) {
            p.push(ConfigProblem::new(
                path,
                format!("duplicate {what} {name:?} (also set by {first})"),
            ));
        }
    }
}

/// Compiles a rule's regex so that it must match the whole value (like Java's `Matcher.matches()`,
/// which Debezium's `route.topic.regex` uses).
pub(crate) fn compile_rule_regex(re: &str) -> Result<regex::bytes::Regex, String> {
    regex::bytes::RegexBuilder::new(&format!("^(?:{re})$"))
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("invalid regex: {e}"))
}

/// Checks a template's syntax and literal text; `regex` is `Some` for a regex rule (with the
/// compiled regex if it compiled) so capture references can be checked.
fn check_template(
    p: &mut Vec<ConfigProblem>,
    path: &str,
    text: &str,
    regex: Option<Option<&regex::bytes::Regex>>,
) {
    let t = match Template::parse(text, regex.is_some()) {
        Ok(t) => t,
        Err(e) => {
            p.push(ConfigProblem::new(path, e));
            return;
        }
    };
    if let Some(fixed) = t.as_fixed() {
        if let Err(e) = validate_topic(fixed.as_bytes()) {
            p.push(ConfigProblem::new(path, e.to_string()));
        }
    } else if t.literal_len() > MAX_TOPIC_LENGTH {
        p.push(ConfigProblem::new(
            path,
            format!(
                "its literal text alone is longer than Kafka's {MAX_TOPIC_LENGTH}-character limit"
            ),
        ));
    }
    if let Some(Some(re)) = regex {
        for g in t.groups() {
            let ok = match g {
                GroupRef::Index(n) => *n < re.captures_len(),
                GroupRef::Name(name) => re.capture_names().any(|c| c == Some(name.as_str())),
            };
            if !ok {
                let shown = match g {
                    GroupRef::Index(n) => format!("${n}"),
                    GroupRef::Name(name) => format!("${{{name}}}"),
                };
                p.push(ConfigProblem::new(
                    path,
                    format!("{shown} names no capture group of the rule's regex"),
                ));
            }
        }
    }
}
