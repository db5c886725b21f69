//! Environment overrides: every scalar key is `FERRY_<SECTION>_<KEY>` in upper case
//! (`FERRY_POSTGRES_URL`, `FERRY_KAFKA_MAX_IN_FLIGHT_RECORDS`, `FERRY_OUTBOX_ID_COLUMN`), and
//! `FERRY_KAFKA_PROPERTIES_<NAME>` sets the librdkafka property `<name>` with `_` read as `.`
//! (`FERRY_KAFKA_PROPERTIES_SASL_MECHANISM` sets `sasl.mechanism`; the few properties whose names
//! contain `_` can only be set in the file).
//!
//! Values are text and are parsed as the key's type: numbers, `true`/`false`, durations (`"5s"`),
//! `kafka.brokers` comma-separated. An empty value unsets an optional key (`outbox.timestamp_column`).
//! Arrays of tables (`route.rules`, `route.headers`) and `route.envelope_fields` come only from
//! the file.
//!
//! Any other `FERRY_*` variable is an error naming it and the valid keys, so a typo is never
//! silently ignored; [`RESERVED`] and [`RESERVED_PREFIXES`] are left to the binary and the test
//! harness.

use std::fmt::Display;
use std::str::FromStr;

use ferry_router::ConfigProblem;

use super::secret::PostgresUrl;
use super::{duration, Config};

/// `FERRY_*` variables that are not configuration keys: the config file path (read by `main`).
pub const RESERVED: &[&str] = &["FERRY_CONFIG"];
/// Prefixes of `FERRY_*` variables that are not configuration keys: the test harness's.
pub const RESERVED_PREFIXES: &[&str] = &["FERRY_TEST_"];

const PREFIX: &str = "FERRY_";
/// Sections in file order.
pub(super) const SECTIONS: &[&str] = &[
    "postgres", "outbox", "route", "kafka", "http", "log", "shutdown",
];

type Setter = fn(&mut Config, &str) -> Result<(), String>;

/// One overridable key.
pub(super) struct EnvKey {
    pub(super) section: &'static str,
    pub(super) key: &'static str,
    set: Setter,
}

macro_rules! env_keys {
    ($($section:ident . $key:ident = $parse:expr;)*) => {
        &[$(EnvKey {
            section: stringify!($section),
            key: stringify!($key),
            set: |c: &mut Config, v: &str| {
                c.$section.$key = $parse(v)?;
                Ok(())
            },
        },)*]
    };
}

/// Every scalar key, in file order.
pub(super) const KEYS: &[EnvKey] = env_keys! {
    postgres.url = |v: &str| Ok::<_, String>(PostgresUrl::new(v));
    postgres.slot = text;
    postgres.publication = text;
    postgres.create_slot = boolean;
    postgres.create_publication = boolean;
    postgres.failover_slot = boolean;
    postgres.status_interval = duration::parse;
    postgres.connect_timeout = duration::parse;
    postgres.reconnect_backoff_min = duration::parse;
    postgres.reconnect_backoff_max = duration::parse;
    postgres.standby_poll_interval = duration::parse;
    postgres.binary = boolean;
    outbox.table = text;
    outbox.id_column = text;
    outbox.aggregate_type_column = text;
    outbox.aggregate_id_column = text;
    outbox.type_column = text;
    outbox.payload_column = text;
    outbox.timestamp_column = optional;
    outbox.partition_column = optional;
    outbox.message_prefix = optional;
    route.topic = optional;
    route.id_header = text;
    route.type_header = text;
    route.envelope = boolean;
    route.additional_placement = optional;
    route.tombstone_on_null_payload = boolean;
    route.max_payload_bytes = parsed;
    route.on_error = parsed;
    route.dead_letter_topic = optional;
    kafka.brokers = parsed;
    kafka.compression = parsed;
    kafka.max_in_flight_records = parsed;
    kafka.max_in_flight_bytes = parsed;
    kafka.delivery_timeout = duration::parse;
    kafka.linger = duration::parse;
    http.listen = parsed;
    log.format = parsed;
    log.level = text;
    shutdown.drain_timeout = duration::parse;
};

fn text(v: &str) -> Result<String, String> {
    Ok(v.to_owned())
}

fn optional(v: &str) -> Result<Option<String>, String> {
    Ok((!v.is_empty()).then(|| v.to_owned()))
}

fn boolean(v: &str) -> Result<bool, String> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("invalid boolean {v:?}: expected true or false")),
    }
}

fn parsed<T: FromStr>(v: &str) -> Result<T, String>
where
    T::Err: Display,
{
    v.parse().map_err(|e: T::Err| {
        let e = e.to_string();
        if e.contains(&format!("{v:?}")) {
            e
        } else {
            format!("invalid value {v:?}: {e}")
        }
    })
}

/// The variable name of a key.
pub(super) fn var_name(section: &str, key: &str) -> String {
    format!(
        "{PREFIX}{}_{}",
        section.to_ascii_uppercase(),
        key.to_ascii_uppercase()
    )
}

fn valid_vars(section: &str) -> String {
    let mut names: Vec<String> = KEYS
        .iter()
        .filter(|k| k.section == section)
        .map(|k| var_name(k.section, k.key))
        .collect();
    if section == "kafka" {
        names.push("FERRY_KAFKA_PROPERTIES_<NAME>".to_owned());
    }
    names.join(", ")
}

/// Applies every `FERRY_*` variable of `env` to `config`; reports every bad one.
pub(super) fn apply(
    config: &mut Config,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(), Vec<ConfigProblem>> {
    let mut vars: Vec<(String, String)> = env
        .into_iter()
        .filter(|(name, _)| name.starts_with(PREFIX))
        .filter(|(name, _)| !RESERVED.contains(&name.as_str()))
        .filter(|(name, _)| !RESERVED_PREFIXES.iter().any(|p| name.starts_with(p)))
        .collect();
    // By name; for a name given twice, the later value wins.
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let mut problems = Vec::new();
    for (name, value) in vars {
        if let Err(message) = apply_one(config, &name, &value) {
            problems.push(ConfigProblem {
                path: name,
                message,
            });
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

fn apply_one(config: &mut Config, name: &str, value: &str) -> Result<(), String> {
    let rest = &name[PREFIX.len()..];
    let Some((section, key)) = SECTIONS.iter().find_map(|s| {
        let key = rest
            .strip_prefix(&s.to_ascii_uppercase())?
            .strip_prefix('_')?;
        Some((*s, key))
    }) else {
        let sections: Vec<String> = SECTIONS.iter().map(|s| s.to_ascii_uppercase()).collect();
        return Err(format!(
            "unknown variable: configuration variables are FERRY_<SECTION>_<KEY> with SECTION one of {}",
            sections.join(", ")
        ));
    };
    if section == "kafka" {
        if let Some(property) = key.strip_prefix("PROPERTIES_") {
            if property.is_empty() || property.bytes().any(|b| b.is_ascii_lowercase()) {
                return Err("expected FERRY_KAFKA_PROPERTIES_<NAME> in upper case, like FERRY_KAFKA_PROPERTIES_SASL_MECHANISM".to_owned());
            }
            let property = property.to_ascii_lowercase().replace('_', ".");
            config.kafka.properties.0.insert(property, value.to_owned());
            return Ok(());
        }
    }
    let found = KEYS
        .iter()
        .find(|k| k.section == section && var_name(k.section, k.key) == name);
    match found {
        Some(k) => (k.set)(config, value).map_err(|e| format!("{section}.{}: {e}", k.key)),
        None => Err(format!(
            "unknown variable; the [{section}] variables are {}",
            valid_vars(section)
        )),
    }
}
