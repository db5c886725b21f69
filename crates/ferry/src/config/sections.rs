//! `[postgres]`, `[http]`, `[log]` and `[shutdown]`. (`[kafka]` is in `kafka.rs`; `[outbox]` and
//! `[route]` are `ferry_router`'s.)

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::defaults;
use super::duration::ConfigDuration;
use super::secret::PostgresUrl;
use crate::telemetry::LogFormat;

/// `[postgres]`: where the WAL comes from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresConfig {
    /// libpq connection URL (`postgres://ferry:pw@db:5432/app?sslmode=verify-full&sslrootcert=/ca.pem`)
    /// or keyword/value string. Required. Prints with the password hidden.
    pub url: PostgresUrl,
    /// Logical replication slot to read (and create, with `create_slot`).
    pub slot: String,
    /// Publication to read the outbox table through (and create, with `create_publication`).
    pub publication: String,
    /// A file holding the password (a mounted Kubernetes Secret), checked at start-up and read
    /// at every connection attempt (a rotated Secret is used from the next reconnect); its
    /// trailing newline is dropped. Not together with a password in `url`.
    pub password_file: Option<PathBuf>,
    /// Create the slot at startup if it does not exist.
    pub create_slot: bool,
    /// Create the publication for the outbox table if it does not exist.
    pub create_publication: bool,
    /// Use a failover slot (PostgreSQL 17+): created with `failover = true`, or made one, so
    /// standbys with `sync_replication_slots = on` keep it and Ferry continues after a promotion.
    pub failover_slot: bool,
    /// How often a standby status update (the confirmed LSN) is sent, also when idle.
    pub status_interval: ConfigDuration,
    /// How long the server may send nothing on the replication connection (a reply is asked
    /// for from a quarter of it on) before the connection is taken for lost; `0s`: never.
    pub receive_timeout: ConfigDuration,
    /// Time allowed to establish a connection.
    pub connect_timeout: ConfigDuration,
    /// First delay before reconnecting after a transient failure; it doubles up to
    /// `reconnect_backoff_max`.
    pub reconnect_backoff_min: ConfigDuration,
    /// Longest delay between reconnect attempts.
    pub reconnect_backoff_max: ConfigDuration,
    /// How often a server in recovery (a standby) is checked again for promotion.
    pub standby_poll_interval: ConfigDuration,
    /// Let pgoutput send values in binary where that helps: a bytea column the router reads
    /// arrives raw instead of as hex text. Used only when every column the router reads has a
    /// type it renders from binary, on PostgreSQL 14 or later; `false` always streams text.
    pub binary: bool,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: PostgresUrl::default(),
            slot: defaults::SLOT.to_owned(),
            publication: defaults::PUBLICATION.to_owned(),
            password_file: None,
            create_slot: defaults::CREATE_SLOT,
            create_publication: defaults::CREATE_PUBLICATION,
            failover_slot: defaults::FAILOVER_SLOT,
            status_interval: defaults::STATUS_INTERVAL.into(),
            receive_timeout: defaults::RECEIVE_TIMEOUT.into(),
            connect_timeout: defaults::CONNECT_TIMEOUT.into(),
            reconnect_backoff_min: defaults::RECONNECT_BACKOFF_MIN.into(),
            reconnect_backoff_max: defaults::RECONNECT_BACKOFF_MAX.into(),
            standby_poll_interval: defaults::STANDBY_POLL_INTERVAL.into(),
            binary: defaults::BINARY,
        }
    }
}

/// `[http]`: the `/metrics`, `/healthz`, `/readyz` endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// `ip:port` to listen on, or `"off"` for no endpoint.
    pub listen: HttpListen,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: HttpListen::Addr(defaults::HTTP_LISTEN),
        }
    }
}

/// `http.listen`: an address, or off. An empty string is an error rather than "off": an empty
/// environment variable is more often a templating accident than a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpListen {
    /// No HTTP endpoint.
    Off,
    /// Listen on this address.
    Addr(SocketAddr),
}

impl HttpListen {
    /// The address, unless off.
    pub fn addr(self) -> Option<SocketAddr> {
        match self {
            HttpListen::Off => None,
            HttpListen::Addr(a) => Some(a),
        }
    }
}

impl FromStr for HttpListen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "off" {
            return Ok(HttpListen::Off);
        }
        s.parse().map(HttpListen::Addr).map_err(|_| {
            format!("invalid listen address {s:?}: expected ip:port like \"127.0.0.1:9187\" or \"[::]:9187\", or \"off\"")
        })
    }
}

impl fmt::Display for HttpListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpListen::Off => f.write_str("off"),
            HttpListen::Addr(a) => write!(f, "{a}"),
        }
    }
}

impl Serialize for HttpListen {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Serializes a value by its `Display` (the spelling the configuration reads).
fn display<T: fmt::Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

impl<'de> Deserialize<'de> for HttpListen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `"text"` or `"json"` (one object per line).
    #[serde(serialize_with = "display")]
    pub format: LogFormat,
    /// A level (`info`) or directives (`info,ferry=debug,rdkafka=warn`); `RUST_LOG` replaces it.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: defaults::LOG_FORMAT,
            level: defaults::LOG_LEVEL.to_owned(),
        }
    }
}

/// `[shutdown]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// How long shutdown waits for in-flight records to be acknowledged before exiting; what is
    /// not acknowledged by then is not checkpointed and is sent again on the next start.
    pub drain_timeout: ConfigDuration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            drain_timeout: defaults::DRAIN_TIMEOUT.into(),
        }
    }
}
