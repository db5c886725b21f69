//! The binary's side of `ferry config from-debezium`: the translation itself is the pure
//! `ferry-debezium` crate; this module is its [`Target`], the answers only this configuration
//! can give (secret and reserved librdkafka properties, the codecs the linked librdkafka has,
//! duration spelling, limits, and whether the finished TOML loads).

use std::str::FromStr;
use std::time::Duration;

pub use ferry_debezium::{
    DebeziumError, Note, Options, Target, Translation, CHANGE_ME, EVENT_ROUTER_CLASS,
    POSTGRES_CONNECTOR_CLASS,
};

use crate::config::{self, defaults, duration, Compression, Config};

/// Ferry's configuration as the translation's [`Target`].
#[derive(Debug, Clone, Copy, Default)]
pub struct FerryConfig;

impl Target for FerryConfig {
    fn is_secret_property(&self, name: &str) -> bool {
        config::is_secret_property(name)
    }

    fn property_rule(&self, name: &str, value: &str) -> Option<String> {
        config::property_rule(name, value)
    }

    fn compression(&self, codec: &str) -> Result<&'static str, String> {
        match Compression::from_str(codec)? {
            c if c.is_available() => Ok(c.as_str()),
            c => Err(format!(
                "{} is not built into this Ferry's librdkafka; it compresses with {} (its \
                 default), which consumers read as well",
                c.as_str(),
                defaults::COMPRESSION.as_str()
            )),
        }
    }

    fn format_duration(&self, d: Duration) -> String {
        duration::format(d)
    }

    fn max_status_interval(&self) -> Duration {
        defaults::MAX_STATUS_INTERVAL
    }

    fn max_in_flight_bytes(&self) -> u64 {
        defaults::MAX_IN_FLIGHT_BYTES_LIMIT
    }

    fn refusals(&self, toml: &str) -> Vec<String> {
        match Config::from_toml(toml) {
            Err(e) => vec![e.to_string()],
            Ok(c) => match c.validate() {
                Ok(()) => Vec::new(),
                Err(e) => e.problems.iter().map(ToString::to_string).collect(),
            },
        }
    }
}

/// Translates a connector configuration for this Ferry (see [`ferry_debezium::translate`]).
pub fn translate(json: &str, options: &Options) -> Result<Translation, DebeziumError> {
    ferry_debezium::translate(json, options, &FerryConfig)
}
