//! `ferry config from-debezium`: translates the configuration of a Debezium PostgreSQL connector
//! that uses the Outbox Event Router SMT (the JSON that users POST to Kafka Connect) into the
//! equivalent `ferry.toml`, and lists every option it could not translate.
//!
//! # Contract
//!
//! [`translate`] is pure: connector JSON in, TOML text and [`Note`]s out, no I/O. The CLI reads
//! the file, prints the TOML, and prints each note to standard error as
//! `not translated: <option> = <value>: <why, and what to do>`. Nothing is silently dropped:
//! every option of the connector is either translated, consumed because Ferry already behaves
//! that way (`tasks.max`, `plugin.name = pgoutput`, `slot.drop.on.stop = false`, ...), or
//! listed. The output always parses as a `ferry.toml`; it validates too, except where a note says
//! that something must be completed by hand.
//!
//! # What maps to what
//!
//! - **Connection** (`database.*`): a libpq URL in `postgres.url`, without the password: a TOML
//!   file cannot read the environment, and Ferry does not write secrets into files, so the note on
//!   `database.password` says to set the whole URL in `FERRY_POSTGRES_URL`, which overrides it.
//!   Debezium's `database.sslmode` defaults to `disable`; Ferry's (libpq's) to `prefer`.
//! - **Slot and publication**: kept, so that Ferry continues from the connector's last confirmed
//!   position in the same slot (duplicates possible, no gap). Debezium's defaults (`debezium`,
//!   `dbz_publication`) are written out because Ferry's differ. A slot keeps the output plugin it
//!   was created with; Ferry decodes only pgoutput, so with any other `plugin.name` (including
//!   the unset default, decoderbufs) the output names a new slot and the note explains the switch.
//! - **The outbox table** from `table.include.list` (a list of regexes: `public.outbox` and
//!   `public\.outbox` both mean the table): the first outbox in it becomes `[outbox]`, every
//!   other table named in it a `[[tables]]` entry with the same mapping (the SMT applied to all);
//!   patterns are noted.
//! - **The SMT** (`transforms.<name>.*`, found through `transforms` and the EventRouter class):
//!   columns to `[outbox]`, routing to `[route]` (see the `outbox` module). Kafka Connect's RegexRouter
//!   leaves a value its regex does not match as the topic itself; a custom regex therefore becomes
//!   a `[[route.rules]]` entry with `route.topic = "{<route.by.field>}"` as the fallback.
//!   Debezium sends the event type only where `table.fields.additional.placement` puts it, so
//!   `route.type_header` is `""`.
//! - **Producer**: `producer.override.*` Java client properties to `[kafka]` keys or librdkafka
//!   names in `[kafka.properties]`, SASL JAAS configs to `sasl.username` (the password, like
//!   every secret, goes to an environment variable), properties Ferry controls dropped with a
//!   note. Brokers are never in a connector config: `--brokers`, or a placeholder with a note.
//! - **Converters** (the connector's, else the worker's from [`Options::worker`]):
//!   `route.key_format` / `route.value_format` that write the converter's bytes
//!   (`StringConverter`, `ByteArrayConverter`, `JsonConverter` with and without schemas); where
//!   none does (Avro and other registry formats, envelope fields under a JsonConverter schema) the
//!   notes say what a consumer will see differently.
//!
//! # The seam with the binary
//!
//! This crate knows Debezium; what the output may say is Ferry's, and the binary answers for it
//! through [`Target`]: which properties are secret or reserved, which compression codecs its
//! librdkafka has, how a duration is written, the configuration's limits, and what it would
//! refuse in the finished TOML (listed as notes, a safety net for values that translate into
//! something Ferry rejects). So this crate depends on `ferry-router` for the outbox vocabulary and
//! never on the binary; `ferry::debezium::FerryConfig` is the binary's [`Target`].
//!
//! Facts are from Debezium's `EventRouterConfigDefinition`/`EventRouterDelegate` and
//! `PostgresConnectorConfig`, and Kafka's `RegexRouter` and `SinkConnectorConfig` (a dead letter
//! queue serves sink connectors only).

mod connect;
mod connector;
mod known;
mod outbox;
mod producer;
mod render;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use render::Doc;

/// `connector.class` of the Debezium PostgreSQL connector.
pub const POSTGRES_CONNECTOR_CLASS: &str = "io.debezium.connector.postgresql.PostgresConnector";
/// `transforms.<name>.type` of the Outbox Event Router SMT.
pub const EVENT_ROUTER_CLASS: &str = "io.debezium.transforms.outbox.EventRouter";
/// Placeholder written where the connector config cannot supply a value (brokers, a host given
/// through a config provider).
pub const CHANGE_ME: &str = "CHANGE-ME";

/// What the configuration the output is written for accepts: the binary's answers (see the
/// module docs, "The seam with the binary").
pub trait Target {
    /// Whether a librdkafka property (or connector option of the same name) holds a secret: its
    /// value is never written or shown.
    fn is_secret_property(&self, name: &str) -> bool;
    /// Why librdkafka property `name = value` may not be passed through, `None` if it may.
    fn property_rule(&self, name: &str, value: &str) -> Option<String>;
    /// `kafka.compression` for a Java `compression.type` value (lowercased), or why it cannot
    /// be used (unknown, or not built into this librdkafka).
    fn compression(&self, codec: &str) -> Result<&'static str, String>;
    /// A duration as the configuration spells it (`"500ms"`, `"10s"`).
    fn format_duration(&self, d: Duration) -> String;
    /// The largest `postgres.status_interval`.
    fn max_status_interval(&self) -> Duration;
    /// The largest `kafka.max_in_flight_bytes`.
    fn max_in_flight_bytes(&self) -> u64;
    /// Every problem the configuration would report about `toml` (parsing and validation), one
    /// line each; empty if it loads.
    fn refusals(&self, toml: &str) -> Vec<String>;
}

/// What the caller knows beyond the connector JSON.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Kafka bootstrap servers (`host:port,...`): a connector config does not hold them.
    pub brokers: Option<String>,
    /// Where the JSON came from (a file name), for the header comment.
    pub source: Option<String>,
    /// The Kafka Connect worker's properties (`connect-distributed.properties` text): its
    /// `key.converter`, `value.converter` (and their `schemas.enable`) and `header.converter`
    /// apply where the connector config does not set them, and its `bootstrap.servers` are the
    /// brokers unless `brokers` is given. Nothing else in it is read.
    pub worker: Option<String>,
}

/// Worker properties that decide what the connector's records look like.
const WORKER_KEYS: &[&str] = &[
    "key.converter",
    "key.converter.schemas.enable",
    "value.converter",
    "value.converter.schemas.enable",
    "header.converter",
];

/// The result: the `ferry.toml` text and what could not be translated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Translation {
    /// The configuration file.
    pub toml: String,
    /// Options without an equivalent (or needing a hand), in option order.
    pub notes: Vec<Note>,
}

/// One connector option that was not (fully) translated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The connector option, e.g. `snapshot.mode` or `transforms.outbox.table.expand.json.payload`.
    pub option: String,
    /// Its value as shown (`***` for secrets, `(unset)` where the absence matters).
    pub value: String,
    /// Why it has no equivalent and what to do instead.
    pub reason: String,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "not translated: {} = {}: {}",
            self.option, self.value, self.reason
        )
    }
}

/// Why a JSON document cannot be translated at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DebeziumError {
    /// Not JSON.
    #[error("not valid JSON: {0}")]
    Json(String),
    /// JSON, but not a connector configuration.
    #[error(
        "expected a JSON object: {{\"name\": ..., \"config\": {{...}}}} or the bare config map"
    )]
    NotAnObject,
    /// An option whose value is an object, array or null.
    #[error("option {key:?} is {kind}; connector options are strings (or numbers and booleans)")]
    BadValue {
        /// The option.
        key: String,
        /// What it is instead.
        kind: &'static str,
    },
    /// The worker properties cannot be read.
    #[error("the worker properties: {0}")]
    Worker(String),
    /// Another connector.
    #[error("connector.class is {0:?}: only the Debezium PostgreSQL connector ({POSTGRES_CONNECTOR_CLASS}) can be translated")]
    NotPostgres(String),
    /// No Outbox Event Router among the transforms.
    #[error("no Outbox Event Router SMT: expected transforms = \"<name>,...\" and transforms.<name>.type = {EVENT_ROUTER_CLASS}")]
    NoOutboxRouter,
}

/// Translates a connector configuration (`{"name": ..., "config": {...}}` or the bare map).
pub fn translate(
    json: &str,
    options: &Options,
    target: &dyn Target,
) -> Result<Translation, DebeziumError> {
    let (name, mut src) = Source::parse(json, target)?;
    let mut options = options.clone();
    let mut worker_brokers = None;
    if let Some(text) = &options.worker {
        let pairs = ferry_router::properties::load_properties(text).map_err(|_| {
            DebeziumError::Worker("a malformed \\uXXXX escape (java.util.Properties syntax)".into())
        })?;
        for (k, v) in pairs {
            if WORKER_KEYS.contains(&k.as_ref()) && !src.values.contains_key(k.as_ref()) {
                src.values.insert(k.into_owned(), v.into_owned());
            } else if k == "bootstrap.servers" && options.brokers.is_none() {
                worker_brokers = Some(v.trim().to_owned());
            }
        }
    }
    options.brokers = options.brokers.or(worker_brokers.clone());
    let options = &options;
    if let Some(class) = src.take("connector.class") {
        if class.trim() != POSTGRES_CONNECTOR_CLASS {
            return Err(DebeziumError::NotPostgres(class));
        }
    }
    let (smt, decode_messages) = outbox::find(&mut src)?;
    let mut doc = Doc::new();
    let what = match &name {
        Some(n) => format!("the Debezium connector {}", render::quote(n)),
        None => "a Debezium connector".to_owned(),
    };
    let from = options
        .source
        .as_deref()
        .map(|s| format!(" ({s})"))
        .unwrap_or_default();
    doc.header(format!(
        "ferry.toml translated by `ferry config from-debezium` from {what}{from}: PostgreSQL \
         connector with the Outbox Event Router SMT {}.",
        render::quote(&smt)
    ));
    doc.header(
        "The comment after each line names the connector option it comes from. Options with no \
         equivalent were printed as \"not translated: ...\" lines; act on them before the first run, \
         then check with `ferry check --config <this file>`.",
    );
    connector::translate(&mut src, &mut doc);
    let facts = outbox::translate(&mut src, &mut doc, &smt);
    if let Some(decode) = &decode_messages {
        outbox::messages(&mut src, &mut doc, decode);
    }
    producer::translate(&mut src, &mut doc, options);
    if let Some(b) = worker_brokers.filter(|b| !b.is_empty()) {
        doc.set(
            render::KAFKA,
            "brokers",
            render::Value::Str(b),
            Some("the worker's bootstrap.servers"),
        );
    }
    connect::translate(&mut src, &mut doc, &facts);
    src.note_the_rest();
    let toml = doc.render();
    let mut notes = src.notes;
    notes.extend(self_check(&toml, target));
    Ok(Translation { toml, notes })
}

/// The problems `ferry` itself would report about the output, as notes: a safety net for
/// connector values that translate into something Ferry refuses (a Java-only regex construct,
/// a duplicate header name).
fn self_check(toml: &str, target: &dyn Target) -> Vec<Note> {
    target
        .refusals(toml)
        .into_iter()
        .map(|p| Note {
            option: "(translated configuration)".to_owned(),
            value: "(see the output)".to_owned(),
            reason: format!("Ferry refuses it as written: {p}; edit that key by hand"),
        })
        .collect()
}

/// The connector's options, with a record of which ones were handled, and the notes.
pub(crate) struct Source<'t> {
    values: BTreeMap<String, String>,
    handled: BTreeSet<String>,
    notes: Vec<Note>,
    /// The configuration the output is for.
    pub(crate) target: &'t dyn Target,
}

impl fmt::Debug for Source<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("options", &self.values.len())
            .field("handled", &self.handled.len())
            .field("notes", &self.notes.len())
            .finish_non_exhaustive()
    }
}

impl<'t> Source<'t> {
    /// The connector name (if any) and its options.
    fn parse(
        json: &str,
        target: &'t dyn Target,
    ) -> Result<(Option<String>, Source<'t>), DebeziumError> {
        let doc: serde_json::Value =
            serde_json::from_str(json).map_err(|e| DebeziumError::Json(e.to_string()))?;
        let top = doc.as_object().ok_or(DebeziumError::NotAnObject)?;
        let (name, map) = match top.get("config").and_then(|c| c.as_object()) {
            Some(config) => (top.get("name").and_then(|n| n.as_str()), config),
            None => (None, top),
        };
        let mut values = BTreeMap::new();
        for (k, v) in map {
            let text = match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                other => {
                    return Err(DebeziumError::BadValue {
                        key: k.clone(),
                        kind: match other {
                            serde_json::Value::Null => "null",
                            serde_json::Value::Array(_) => "an array",
                            _ => "an object",
                        },
                    })
                }
            };
            values.insert(k.clone(), text);
        }
        let name = name
            .map(str::to_owned)
            .or_else(|| values.get("name").cloned());
        let mut src = Source {
            values,
            handled: BTreeSet::new(),
            notes: Vec::new(),
            target,
        };
        src.take("name");
        Ok((name, src))
    }

    /// The option's value (trimmed), marking it handled.
    pub(crate) fn take(&mut self, key: &str) -> Option<String> {
        let v = self.values.get(key)?.trim().to_owned();
        self.handled.insert(key.to_owned());
        Some(v)
    }

    /// The option's value without marking it handled.
    pub(crate) fn peek(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(|v| v.trim())
    }

    /// Keys starting with `prefix` that are not handled yet, in order.
    pub(crate) fn keys_with_prefix(&self, prefix: &str) -> Vec<String> {
        self.values
            .keys()
            .filter(|k| k.starts_with(prefix) && !self.handled.contains(*k))
            .cloned()
            .collect()
    }

    /// Records a note for a present option (marking it handled); a no-op if it is absent.
    pub(crate) fn note(&mut self, key: &str, reason: impl Into<String>) {
        if let Some(v) = self.values.get(key) {
            let value = shown(self.target, key, v);
            self.handled.insert(key.to_owned());
            self.notes.push(Note {
                option: key.to_owned(),
                value,
                reason: reason.into(),
            });
        }
    }

    /// Records a note about an option whose value is given (an absent option whose default
    /// matters, or a value already taken).
    pub(crate) fn note_value(&mut self, key: &str, value: &str, reason: impl Into<String>) {
        self.handled.insert(key.to_owned());
        self.notes.push(Note {
            option: key.to_owned(),
            value: shown(self.target, key, value),
            reason: reason.into(),
        });
    }

    /// Notes every option nobody handled, with the reason [`known::reason`] knows or
    /// a generic one.
    fn note_the_rest(&mut self) {
        let rest: Vec<String> = self
            .values
            .keys()
            .filter(|k| !self.handled.contains(*k))
            .cloned()
            .collect();
        for key in rest {
            let reason = known::reason(&key).unwrap_or_else(|| {
                "not an option Ferry has an equivalent for; check that Ferry's defaults suit"
                    .to_owned()
            });
            self.note(&key, reason);
        }
        self.notes.sort_by(|a, b| a.option.cmp(&b.option));
    }
}

/// `value` as a note shows it: `***` for secrets, quoted when it has spaces or is empty (but
/// not a `(marker)` like `(unset)`).
fn shown(target: &dyn Target, key: &str, value: &str) -> String {
    if target.is_secret_property(key) {
        return "***".to_owned();
    }
    let v = render::one_line(value.trim());
    let marker = v.starts_with('(') && v.ends_with(')');
    if v.is_empty() || (v.contains(' ') && !marker) {
        format!("{v:?}")
    } else {
        v
    }
}

/// Whether a value is a Kafka Connect config provider reference (`${file:/path:key}`,
/// `${env:NAME}`, `${vault:...}`), resolved by the worker and unknown here.
pub(crate) fn is_provider_ref(value: &str) -> bool {
    let v = value.trim();
    v.starts_with("${") && v.ends_with('}') && v.contains(':')
}

/// A [`Target`] for unit tests: the translation's own logic against a few fixed answers (the
/// golden tests in `tests/` use the binary's real one).
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct TestTarget;

#[cfg(test)]
impl Target for TestTarget {
    fn is_secret_property(&self, name: &str) -> bool {
        name.contains("password") || name.contains("jaas")
    }
    fn property_rule(&self, name: &str, _value: &str) -> Option<String> {
        (name == "acks").then(|| "Ferry always sets acks=all".to_owned())
    }
    fn compression(&self, codec: &str) -> Result<&'static str, String> {
        ["none", "gzip", "lz4"]
            .into_iter()
            .find(|c| *c == codec)
            .ok_or_else(|| format!("unknown compression {codec:?}"))
    }
    fn format_duration(&self, d: Duration) -> String {
        format!("{}ms", d.as_millis())
    }
    fn max_status_interval(&self) -> Duration {
        Duration::from_secs(30)
    }
    fn max_in_flight_bytes(&self) -> u64 {
        1 << 40
    }
    fn refusals(&self, _toml: &str) -> Vec<String> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_print_as_the_cli_shows_them_and_hide_secrets() {
        let (_, mut src) = Source::parse(
            r#"{"name": "x", "config": {"database.password": "hunter2", "snapshot.mode": "initial"}}"#,
            &TestTarget,
        )
        .unwrap();
        src.note("database.password", "set it elsewhere");
        src.note("snapshot.mode", "never snapshots");
        assert_eq!(
            src.notes[0].to_string(),
            "not translated: database.password = ***: set it elsewhere"
        );
        assert_eq!(
            src.notes[1].to_string(),
            "not translated: snapshot.mode = initial: never snapshots"
        );
    }

    #[test]
    fn rejects_what_is_not_a_postgres_outbox_connector() {
        let o = Options::default();
        assert!(matches!(
            translate("nope", &o, &TestTarget),
            Err(DebeziumError::Json(_))
        ));
        assert_eq!(
            translate("[1]", &o, &TestTarget),
            Err(DebeziumError::NotAnObject)
        );
        assert!(matches!(
            translate(r#"{"tasks.max": [1]}"#, &o, &TestTarget),
            Err(DebeziumError::BadValue { .. })
        ));
        assert!(matches!(
            translate(
                r#"{"connector.class": "io.debezium.connector.mysql.MySqlConnector"}"#,
                &o,
                &TestTarget
            ),
            Err(DebeziumError::NotPostgres(_))
        ));
        assert_eq!(
            translate(
                r#"{"transforms": "unwrap", "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState"}"#,
                &o,
                &TestTarget
            ),
            Err(DebeziumError::NoOutboxRouter)
        );
    }

    #[test]
    fn config_provider_references_are_recognised() {
        assert!(is_provider_ref(
            "${file:/opt/secrets.properties:pg_password}"
        ));
        assert!(is_provider_ref(" ${env:PGPASSWORD} "));
        assert!(!is_provider_ref("plain${x}"));
        assert!(!is_provider_ref("${notaprovider}"));
    }
}
