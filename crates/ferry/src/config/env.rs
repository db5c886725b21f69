//! Environment overrides: every scalar key is `FERRY_<SECTION>_<KEY>` in upper case
//! (`FERRY_POSTGRES_URL`, `FERRY_KAFKA_MAX_IN_FLIGHT_RECORDS`, `FERRY_OUTBOX_ID_COLUMN`), and
//! `FERRY_KAFKA_PROPERTIES_<NAME>` sets the librdkafka property `<name>` with `_` read as `.`
//! (`FERRY_KAFKA_PROPERTIES_SASL_MECHANISM` sets `sasl.mechanism`; the few properties whose names
//! contain `_` can only be set in the file), and `FERRY_KAFKA_PROPERTY_FILES_<NAME>` the file
//! that property is read from (`FERRY_KAFKA_PROPERTY_FILES_SASL_PASSWORD=/secrets/kafka`).
//!
//! Values are text and are parsed as the key's type: numbers, `true`/`false`, durations (`"5s"`),
//! sizes (`32MiB`, as in the file), `kafka.brokers` comma-separated. An empty value unsets an optional key (`outbox.timestamp_column`).
//! Arrays of tables (`route.rules`, `route.headers`) and `route.envelope_fields` come only from
//! the file.
//!
//! Any other `FERRY_*` variable is an error naming it and the nearest valid variable (by edit
//! distance), so a typo is never silently ignored. Three kinds of `FERRY_*` variables are not
//! Ferry's to refuse, and are skipped:
//!
//! - Ferry's own tools' ([`RESERVED`], [`RESERVED_PREFIXES`]): `FERRY_CONFIG` (read by `main`),
//!   `FERRY_BIN` (ferry-bench), `FERRY_TEST_*` (the test harness), `FERRY_BENCH_*`, `FERRY_DEMO_*`.
//! - Kubernetes service links ([`is_kubernetes_service_link`]): a pod gets, for every Service
//!   of its namespace, `<SVC>_SERVICE_HOST`, `<SVC>_SERVICE_PORT`, `<SVC>_SERVICE_PORT_<PORT NAME>`,
//!   `<SVC>_PORT`, `<SVC>_PORT_<N>_<PROTO>` and its `_PROTO`, `_PORT`, `_ADDR` (kubelet
//!   `pkg/kubelet/envvars/envvars.go`; `<SVC>` is the Service name upper-cased with `-` as `_`),
//!   so a Service named `ferry` or `ferry-*` yields `FERRY_*` variables. They are recognised by
//!   name *and* value (a cluster IP, a port number, `tcp://10.0.0.1:9187`), so a mistake that
//!   merely looks like one (`FERRY_HTTP_PORT=9187`) is still refused.

use std::fmt::Display;
use std::str::FromStr;

use ferry_router::ConfigProblem;

use super::duration::ConfigDuration;
use super::secret::PostgresUrl;
use super::Config;

/// `FERRY_*` variables that are not configuration keys: the config file path (read by `main`)
/// and the `ferry` binary ferry-bench runs (`bench/README.md`).
pub const RESERVED: &[&str] = &["FERRY_CONFIG", "FERRY_BIN"];
/// Prefixes of `FERRY_*` variables that are not configuration keys: the test harness's
/// (`FERRY_TEST_PG_URL`, ...), and room for the benchmark's and the demo's.
pub const RESERVED_PREFIXES: &[&str] = &["FERRY_TEST_", "FERRY_BENCH_", "FERRY_DEMO_"];

const PREFIX: &str = "FERRY_";
/// Sections in file order.
pub(super) const SECTIONS: &[&str] = &[
    "postgres", "outbox", "route", "kafka", "http", "log", "shutdown", "inbox",
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
    postgres.password_file = |v: &str| optional(v).map(|p| p.map(std::path::PathBuf::from));
    postgres.create_slot = boolean;
    postgres.create_publication = boolean;
    postgres.failover_slot = boolean;
    postgres.status_interval = ConfigDuration::from_str;
    postgres.receive_timeout = ConfigDuration::from_str;
    postgres.connect_timeout = ConfigDuration::from_str;
    postgres.reconnect_backoff_min = ConfigDuration::from_str;
    postgres.reconnect_backoff_max = ConfigDuration::from_str;
    postgres.standby_poll_interval = ConfigDuration::from_str;
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
    outbox.tracing_column = optional;
    route.topic = optional;
    route.id_header = text;
    route.type_header = text;
    route.envelope = boolean;
    route.additional_placement = optional;
    route.tombstone_on_null_payload = boolean;
    route.send_null_payload = boolean;
    route.max_payload_bytes = size_usize;
    route.on_error = parsed;
    route.dead_letter_topic = optional;
    route.cloudevents = parsed;
    route.cloudevents_source = optional;
    // `""` is a value here (no subject), not "unset": leave the variable out for the default.
    route.cloudevents_subject = |v: &str| Ok::<_, String>(Some(v.to_owned()));
    route.cloudevents_data_content_type = optional;
    route.key_format = parsed;
    route.value_format = parsed;
    route.key_schema_optional = boolean;
    route.value_schema_optional = boolean;
    route.expand_null_behavior = parsed;
    route.position_headers = boolean;
    kafka.brokers = parsed;
    kafka.compression = parsed;
    kafka.max_in_flight_records = whole;
    kafka.max_in_flight_bytes = ferry_router::size::parse;
    kafka.delivery_timeout = ConfigDuration::from_str;
    kafka.linger = ConfigDuration::from_str;
    kafka.progress_topic = text;
    kafka.exactly_once = boolean;
    kafka.transaction_interval = ConfigDuration::from_str;
    kafka.transaction_max_records = whole;
    kafka.transaction_max_bytes = ferry_router::size::parse;
    http.listen = parsed;
    log.format = parsed;
    log.level = text;
    shutdown.drain_timeout = ConfigDuration::from_str;
    inbox.topics = parsed;
    inbox.group_id = text;
    inbox.table = text;
    inbox.create_tables = boolean;
    inbox.payload_type = text;
    inbox.event_id_header = text;
    inbox.positions = boolean;
    inbox.start = text;
    inbox.dedup_retention = ConfigDuration::from_str;
    inbox.processed_retention = ConfigDuration::from_str;
    inbox.cleanup_interval = ConfigDuration::from_str;
    inbox.cleanup_batch = whole;
    inbox.max_batch_records = whole;
    inbox.max_batch_delay = ConfigDuration::from_str;
    inbox.max_buffered_bytes = ferry_router::size::parse;
    inbox.notify_channel = text;
};

fn text(v: &str) -> Result<String, String> {
    Ok(v.to_owned())
}

fn optional(v: &str) -> Result<Option<String>, String> {
    Ok((!v.is_empty()).then(|| v.to_owned()))
}

fn size_usize(v: &str) -> Result<usize, String> {
    let n = ferry_router::size::parse(v)?;
    usize::try_from(n).map_err(|_| format!("size {v:?} is too large"))
}

fn whole(v: &str) -> Result<u64, String> {
    v.parse()
        .map_err(|_| format!("must be a whole number ≥ 0, got {v:?}"))
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

/// The key path each `FERRY_*` variable of `env` sets, with the variable
/// (`("kafka.brokers", "FERRY_KAFKA_BROKERS")`, `("kafka.properties.\"sasl.mechanism\"",
/// "FERRY_KAFKA_PROPERTIES_SASL_MECHANISM")`), so a problem with that value can name where it
/// came from.
pub(super) fn set_keys(env: &[(String, String)]) -> Vec<(String, String)> {
    let mut set = Vec::new();
    for (name, _) in env {
        if let Some(k) = KEYS.iter().find(|k| var_name(k.section, k.key) == *name) {
            set.push((format!("{}.{}", k.section, k.key), name.clone()));
        }
        for (prefix, key) in [
            ("FERRY_KAFKA_PROPERTIES_", "properties"),
            ("FERRY_KAFKA_PROPERTY_FILES_", "property_files"),
        ] {
            if let Some(property) = name.strip_prefix(prefix) {
                let property = property.to_ascii_lowercase().replace('_', ".");
                set.push((format!("kafka.{key}.{property:?}"), name.clone()));
            }
        }
    }
    set
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
        names.push("FERRY_KAFKA_PROPERTY_FILES_<NAME>".to_owned());
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
        .filter(|(name, value)| !is_kubernetes_service_link(name, value))
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
            "unknown variable{}: configuration variables are FERRY_<SECTION>_<KEY> with SECTION one of {}",
            did_you_mean(name),
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
        if let Some(property) = key.strip_prefix("PROPERTY_FILES_") {
            if property.is_empty() || property.bytes().any(|b| b.is_ascii_lowercase()) {
                return Err("expected FERRY_KAFKA_PROPERTY_FILES_<NAME> in upper case, like FERRY_KAFKA_PROPERTY_FILES_SASL_PASSWORD".to_owned());
            }
            let property = property.to_ascii_lowercase().replace('_', ".");
            config.kafka.property_files.insert(property, value.into());
            return Ok(());
        }
    }
    let found = KEYS
        .iter()
        .find(|k| k.section == section && var_name(k.section, k.key) == name);
    match found {
        Some(k) => (k.set)(config, value).map_err(|e| format!("{section}.{}: {e}", k.key)),
        None => Err(format!(
            "unknown variable{}; the [{section}] variables are {}",
            did_you_mean(name),
            valid_vars(section)
        )),
    }
}

/// `" (did you mean FERRY_X?)"` for the valid variable nearest to `name`, when one is near
/// enough to be a likely typo ([`ferry_router::spelling::nearest`]); `""` otherwise.
fn did_you_mean(name: &str) -> String {
    let vars: Vec<String> = KEYS.iter().map(|k| var_name(k.section, k.key)).collect();
    match ferry_router::spelling::nearest(name, vars.iter().map(String::as_str)) {
        Some(v) => format!(" (did you mean {v}?)"),
        None => String::new(),
    }
}

/// Whether `name=value` is a variable that Kubernetes injects for a Service (service links,
/// on unless the pod sets `enableServiceLinks: false`), by its exact shape:
///
/// | name | value |
/// |---|---|
/// | `<SVC>_SERVICE_HOST` | the cluster IP |
/// | `<SVC>_SERVICE_PORT`, `<SVC>_SERVICE_PORT_<PORT NAME>` | a port number |
/// | `<SVC>_PORT` | `<proto>://<cluster IP>:<port>` of the first port |
/// | `<SVC>_PORT_<N>_<PROTO>` | `<proto>://<cluster IP>:<N>` |
/// | `<SVC>_PORT_<N>_<PROTO>_PROTO` | `<proto>` (`tcp`, `udp`, `sctp`) |
/// | `<SVC>_PORT_<N>_<PROTO>_PORT` | `<N>` |
/// | `<SVC>_PORT_<N>_<PROTO>_ADDR` | the cluster IP |
pub fn is_kubernetes_service_link(name: &str, value: &str) -> bool {
    // `<SVC>`: a Service name upper-cased with `-` as `_`.
    let service = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    };
    let port = |s: &str| s.parse::<u16>().is_ok_and(|p| p > 0) && !s.starts_with('0');
    let ip = |s: &str| s.parse::<std::net::IpAddr>().is_ok();
    let proto = |s: &str| matches!(s, "TCP" | "UDP" | "SCTP");
    // `tcp://10.0.0.1:9187` (or `tcp://[fd00::1]:9187`), with the protocol and port if given.
    let url = |v: &str, want_proto: Option<&str>, want_port: Option<&str>| {
        let Some((p, addr)) = v.split_once("://") else {
            return false;
        };
        let Ok(addr) = addr.parse::<std::net::SocketAddr>() else {
            return false;
        };
        proto(&p.to_ascii_uppercase())
            && p == p.to_ascii_lowercase()
            && want_proto.is_none_or(|w| w.eq_ignore_ascii_case(p))
            && want_port.is_none_or(|w| w == addr.port().to_string())
    };
    if let Some(svc) = name.strip_suffix("_SERVICE_HOST") {
        return service(svc) && ip(value);
    }
    for (at, _) in name.match_indices("_SERVICE_PORT") {
        let (svc, rest) = (&name[..at], &name[at + "_SERVICE_PORT".len()..]);
        let named = rest.is_empty() || rest.strip_prefix('_').is_some_and(service);
        if service(svc) && named && port(value) {
            return true;
        }
    }
    for (at, _) in name.match_indices("_PORT") {
        let (svc, rest) = (&name[..at], &name[at + "_PORT".len()..]);
        if !service(svc) {
            continue;
        }
        if rest.is_empty() {
            if url(value, None, None) {
                return true;
            }
            continue;
        }
        let mut parts = rest.strip_prefix('_').unwrap_or("").splitn(3, '_');
        let (Some(n), Some(p)) = (parts.next(), parts.next()) else {
            continue;
        };
        if !port(n) || !proto(p) {
            continue;
        }
        let matches = match parts.next() {
            None => url(value, Some(p), Some(n)),
            Some("PROTO") => value == p.to_ascii_lowercase(),
            Some("PORT") => value == n,
            Some("ADDR") => ip(value),
            Some(_) => false,
        };
        if matches {
            return true;
        }
    }
    false
}
