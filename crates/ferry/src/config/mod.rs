//! Ferry's configuration: `ferry.toml`, overridden by `FERRY_*` environment variables.
//!
//! # Shape
//!
//! Eight sections (and optional `[[tables]]`), each closed (`deny_unknown_fields`: a misspelt key is an error naming the key,
//! its line and the nearest valid key), each key with a default, except the
//! two without which nothing can run: `postgres.url` and `kafka.brokers`.
//!
//! | section | type | what |
//! |---|---|---|
//! | `[postgres]` | [`PostgresConfig`] | the server, slot, publication, and connection timings |
//! | `[outbox]` | [`ferry_router::OutboxConfig`] | the outbox table and its columns |
//! | `[route]` | [`ferry_router::RouteConfig`] | how a row becomes a Kafka record |
//! | `[[tables]]` | [`ferry_router::TableConfig`] | more outbox tables, each with its `outbox` and `route` (optional) |
//! | `[kafka]` | [`KafkaConfig`] | brokers, producer settings, librdkafka passthrough |
//! | `[http]` | [`HttpConfig`] | the metrics and health endpoint |
//! | `[log]` | [`LogConfig`] | log format and level |
//! | `[shutdown]` | [`ShutdownConfig`] | the drain deadline |
//! | `[inbox]` | [`inbox::InboxConfig`] | `ferry inbox`: the topics, the group, the inbox tables |
//!
//! `ferry.example.toml` beside this crate's `Cargo.toml` documents every key; a test loads it, so
//! it cannot rot. Defaults are named constants in [`defaults`]; `[outbox]` and `[route]` keep
//! theirs in `ferry_router::config`.
//!
//! # Loading
//!
//! [`load`] takes the file's text (or none: a container can be configured by environment alone)
//! and the environment as a map, so tests never touch the process environment. It reads the file
//! against the schema ([`file`]: every unknown key and every value of the wrong type, not just
//! the first), applies the overrides ([`env`]), and runs [`Config::validate`]; all their
//! problems are reported together, each with its key path and line, or its variable
//! (``kafka.lingr (line 7): unknown key `lingr`; did you mean `linger`?``,
//! `FERRY_KAFKA_BROKER: unknown variable`, `FERRY_KAFKA_BROKERS: kafka.brokers: must not be
//! empty`, `route.rules[2].topic: ...`), so one run lists everything to fix. Only a file that
//! is not TOML at all stops before the rest is looked at.
//!
//! # Values
//!
//! Durations are strings with a unit (`"500ms"`, `"5s"`, `"2m"`, `"1h"`; see [`duration`]);
//! byte sizes are numbers or strings with a unit (`"32MiB"`; see [`ferry_router::size`]).
//! Secrets never print: `postgres.url` shows with its password replaced by `***`, and secret
//! librdkafka properties (`sasl.password`, `ssl.key.password`, ...) as `***` ([`secret`],
//! [`is_secret_property`]).

mod connect;
pub mod defaults;
pub mod duration;
pub mod env;
mod file;
pub mod inbox;
mod kafka;
pub mod secret;
mod sections;
mod validate;

#[cfg(test)]
mod tests;

use std::fmt;

use ferry_router::{ConfigErrors, ConfigProblem, OutboxConfig, RouteConfig, TableConfig};
use serde::{Deserialize, Serialize};

pub use duration::ConfigDuration;
pub use kafka::{
    builtin_features, is_secret_property, property_rule, transactional_id, Brokers, Compression,
    KafkaConfig, KafkaProperties,
};
pub use secret::{PostgresUrl, Secret};
pub use sections::{HttpConfig, HttpListen, LogConfig, PostgresConfig, ShutdownConfig};

/// The whole configuration. `Debug` hides secrets; `Serialize` (what [`Config::to_toml`] and
/// `ferry config show` print) writes them as [`secret::REDACTED`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[postgres]`.
    pub postgres: PostgresConfig,
    /// `[outbox]`.
    pub outbox: OutboxConfig,
    /// `[route]`.
    pub route: RouteConfig,
    /// `[[tables]]`: more outbox tables, each with its own `outbox` and `route` (see
    /// [`ferry_router::tables`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<TableConfig>,
    /// `[kafka]`.
    pub kafka: KafkaConfig,
    /// `[http]`.
    pub http: HttpConfig,
    /// `[log]`.
    pub log: LogConfig,
    /// `[shutdown]`.
    pub shutdown: ShutdownConfig,
    /// `[inbox]`: `ferry inbox` only.
    pub inbox: inbox::InboxConfig,
}

/// Why a configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file is not TOML at all (a missing bracket or quote, a key given twice): its
    /// position, and nothing else is looked at.
    #[error("{0}")]
    Toml(TomlError),
    /// Every problem of the file, the environment and the values, at once: first the file's
    /// keys that are unknown or whose values do not fit their type (path = the key and its line,
    /// `kafka.linger (line 7)`), then the `FERRY_*` variables that are unknown or have bad
    /// values (path = the variable), then the values that do not work (path = the key, after
    /// the variable that set it, if one did).
    #[error("{0}")]
    Invalid(ConfigErrors),
}

/// A TOML syntax error in the file, with its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TomlError {
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column (in characters), when known.
    pub column: Option<usize>,
    /// The nearest `[section]` header above the error, when there is one.
    pub section: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for TomlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid configuration file")?;
        if let (Some(line), Some(column)) = (self.line, self.column) {
            write!(f, " at line {line}, column {column}")?;
        }
        if let Some(section) = &self.section {
            write!(f, " (in {section})")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Loads the configuration from the file's text (if any) and the environment, and validates it.
pub fn load(
    file: Option<&str>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, ConfigError> {
    // The file's problems do not stop loading either: a key with a problem keeps its default,
    // and the environment and validation look at everything else, so one run lists
    // everything to fix.
    let (mut config, mut problems, taken_out) = match file {
        Some(text) => {
            let read = read_file(text)?;
            (read.config, read.problems, read.taken_out)
        }
        None => (Config::default(), Vec::new(), Vec::new()),
    };
    let env: Vec<(String, String)> = env.into_iter().collect();
    problems.extend(
        env::apply(&mut config, env.iter().cloned())
            .err()
            .unwrap_or_default(),
    );
    if let Some(text) = file {
        problems.extend(unnamed_tables(text));
    }
    if let Err(e) = config.validate() {
        let set_by = env::set_keys(&env);
        problems.extend(
            e.problems
                .into_iter()
                // A key whose file value was refused above has its default now (and an array
                // an entry was taken out of has its later entries moved up): a rule about what
                // is left there would only confuse.
                .filter(|p| !taken_out.iter().any(|k| under(&p.path, k)))
                // A value that came from the environment is named by its variable too.
                .map(|mut p| {
                    if let Some((_, var)) = set_by.iter().find(|(key, _)| under(&p.path, key)) {
                        p.path = format!("{var}: {}", p.path);
                    }
                    p
                }),
        );
    }
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::Invalid(ConfigErrors { problems }))
    }
}

/// Whether `path` is `key` or a key inside it (`route.rules[2].topic` is under `route.rules`).
fn under(path: &str, key: &str) -> bool {
    path.strip_prefix(key)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
}

/// The file as a configuration, and every problem of its keys and values ([`file`]). Only text
/// that is not TOML at all stops here, with its position.
fn read_file(text: &str) -> Result<file::FileRead, ConfigError> {
    let root =
        toml::de::DeTable::parse(text).map_err(|e| ConfigError::Toml(toml_error(text, &e)))?;
    Ok(file::read(text, root))
}

/// Every `[[tables]]` entry names its table: without `outbox.table` an entry would take the
/// default, `public.outbox`, and relay that table with the entry's mapping (or collide with
/// `[outbox]` when that is the default too).
fn unnamed_tables(text: &str) -> Vec<ConfigProblem> {
    let Ok(doc) = toml::from_str::<toml::Table>(text) else {
        return Vec::new();
    };
    let Some(tables) = doc.get("tables").and_then(toml::Value::as_array) else {
        return Vec::new();
    };
    let names_table = |t: &toml::Value| t.get("outbox").and_then(|o| o.get("table")).is_some();
    let mut problems = Vec::new();
    for (i, t) in tables.iter().enumerate() {
        if !names_table(t) {
            problems.push(ConfigProblem {
                path: format!("tables[{i}].outbox.table"),
                message: format!(
                    "required: each [[tables]] entry names its outbox table (without it the entry \
                     would relay the default, public.outbox); set tables[{i}].outbox.table = \
                     \"<schema>.<table>\""
                ),
            });
        }
    }
    problems
}

impl Config {
    /// Parses the file's text alone: no environment, no validation.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let read = read_file(text)?;
        if read.problems.is_empty() {
            Ok(read.config)
        } else {
            Err(ConfigError::Invalid(ConfigErrors {
                problems: read.problems,
            }))
        }
    }

    /// The configuration as TOML that [`load`] reads back: every key, defaults included, with
    /// secrets as [`secret::REDACTED`] (what `ferry config show` prints).
    pub fn to_toml(&self) -> Result<String, String> {
        let body = toml::to_string(self).map_err(|e| e.to_string())?;
        Ok(format!(
            "# The effective configuration (file, environment and defaults), as `ferry config show` printed it.\n\
             # Secrets are shown as \"{}\": put them back (or use postgres.password_file,\n\
             # kafka.property_files) before loading this again.\n\n{body}",
            secret::REDACTED
        ))
    }

    /// Every problem of the configuration, with key paths, or `Ok`.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let problems: Vec<ConfigProblem> = validate::problems(self);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors { problems })
        }
    }
}

fn toml_error(text: &str, e: &toml::de::Error) -> TomlError {
    let message = e.message().trim_end().to_owned();
    let Some(span) = e.span() else {
        return TomlError {
            line: None,
            column: None,
            section: None,
            message,
        };
    };
    let before = text.get(..span.start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    let line_end = text[line_start..]
        .find('\n')
        .map_or(text.len(), |i| line_start + i);
    let section = text[..line_end]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|l| l.split('#').next().unwrap_or(l).trim().to_owned());
    TomlError {
        line: Some(line),
        column: Some(column),
        section,
        message,
    }
}
