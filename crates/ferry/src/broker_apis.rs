//! Whether the brokers can run Ferry's Kafka transactions, judged from their ApiVersions answer
//! (issue 30). Pure: log lines in, a verdict out; the client that produces the lines is
//! [`crate::txn_probe`].
//!
//! Some Kafka-protocol brokers (Kafka-compatible services, tiers without transactions) answer
//! InitProducerId, so a transactional producer initialises, but lack EndTxn: the first commit
//! then fails. Every broker lists the APIs it serves, with a version range, in its answer to
//! ApiVersions, the first request of every connection. librdkafka reads that answer and, with
//! `debug=feature`, logs it line by line (`rdkafka_request.c`, `rd_kafka_handle_ApiVersion`):
//!
//! ```text
//! [thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/bootstrap: Broker API support:
//! [thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/bootstrap:   ApiKey EndTxn (26) Versions 0..5
//! ```
//!
//! so Ferry sees exactly the versions its client will choose from, over every
//! `security.protocol` and SASL mechanism the client speaks, without a second TLS or SASL stack.
//! The format is librdkafka's (2.12.1, pinned by Cargo.lock), not a documented interface: the
//! fixtures below are copied from it, and a format that stops matching yields
//! [`Support::Unknown`], never a false "unsupported"; the end-to-end test
//! `tests/tests/transactions_unsupported.rs` fails if that happens.
//!
//! # What Ferry's transactions need
//!
//! Ferry commits no consumer offsets in its transactions (no `send_offsets_to_transaction`), so
//! AddOffsetsToTxn and TxnOffsetCommit are not needed. It needs the four APIs in [`NEEDED`], in
//! a version librdkafka 2.12.1 speaks (the ranges it passes to
//! `rd_kafka_broker_ApiVersion_supported` in `rdkafka_request.c`): a broker whose range does not
//! overlap the client's makes librdkafka fail the call locally with "... not supported by
//! broker", which [`is_unsupported_text`] recognises.

use std::collections::BTreeMap;
use std::fmt;

/// An API a broker serves: its key and the versions it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiVersion {
    pub key: i16,
    pub min: i16,
    pub max: i16,
}

/// An API Ferry's transactions need, and the versions its Kafka client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needed {
    pub key: i16,
    pub name: &'static str,
    pub min: i16,
    pub max: i16,
    /// What Ferry uses it for.
    pub why: &'static str,
}

/// The APIs exactly-once mode needs (librdkafka 2.12.1's ranges; see the module docs).
pub const NEEDED: [Needed; 4] = [
    Needed {
        key: 10,
        name: "FindCoordinator",
        // Version 0 cannot ask for a transaction coordinator (no key type).
        min: 1,
        max: 2,
        why: "finds the transaction coordinator",
    },
    Needed {
        key: 22,
        name: "InitProducerId",
        min: 0,
        max: 4,
        why: "init_transactions: fences older producers with Ferry's transactional.id",
    },
    Needed {
        key: 24,
        name: "AddPartitionsToTxn",
        min: 0,
        max: 0,
        why: "adds each partition written to the open transaction",
    },
    Needed {
        key: 26,
        name: "EndTxn",
        min: 0,
        max: 1,
        why: "commits or aborts a transaction",
    },
];

/// The ApiVersions answers seen, per broker (librdkafka's name for the connection).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Seen {
    brokers: BTreeMap<String, Vec<ApiVersion>>,
}

impl Seen {
    /// Takes one librdkafka log line (facility and message); lines that are not part of an
    /// ApiVersions answer are ignored.
    pub fn feed(&mut self, facility: &str, message: &str) {
        if facility != "APIVERSION" {
            return;
        }
        match parse_line(message) {
            Some(Line::Start { broker }) => {
                // A new answer from this broker (a reconnect): it replaces the one before.
                self.brokers.insert(broker.to_string(), Vec::new());
            }
            Some(Line::Api { broker, api }) => {
                self.brokers
                    .entry(broker.to_string())
                    .or_default()
                    .push(api);
            }
            None => {}
        }
    }

    /// What the answers seen say about transactions.
    pub fn support(&self) -> Support {
        let answered: Vec<_> = self
            .brokers
            .iter()
            .filter(|(_, apis)| !apis.is_empty())
            .collect();
        if answered.is_empty() {
            return Support::Unknown;
        }
        let mut missing = Vec::new();
        for (broker, apis) in answered {
            for needed in &NEEDED {
                let offered = apis.iter().find(|a| a.key == needed.key).copied();
                let usable = offered.is_some_and(|a| a.min <= needed.max && a.max >= needed.min);
                let broker = display_broker(broker);
                // One broker is reached through several connections (bootstrap, then its node
                // id): named once.
                let named = missing
                    .iter()
                    .any(|m: &Missing| m.broker == broker && m.needed.key == needed.key);
                if !usable && !named {
                    missing.push(Missing {
                        broker,
                        needed: *needed,
                        offered,
                    });
                }
            }
        }
        if missing.is_empty() {
            Support::Supported
        } else {
            Support::Missing(missing)
        }
    }
}

/// The verdict on the brokers' transactions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// Every broker that answered serves every API in [`NEEDED`] in a usable version.
    Supported,
    /// At least one lacks one (each entry names the broker and the API).
    Missing(Vec<Missing>),
    /// No ApiVersions answer was seen (no broker reached, or librdkafka's log format changed).
    Unknown,
}

/// An API a broker lacks, or serves only in versions Ferry's client does not speak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    pub broker: String,
    pub needed: Needed,
    /// What the broker offers for it, if anything.
    pub offered: Option<ApiVersion>,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = &self.needed;
        match self.offered {
            None => write!(
                f,
                "broker {} does not offer {} (API key {}, which {})",
                self.broker, n.name, n.key, n.why
            ),
            Some(a) => write!(
                f,
                "broker {} offers {} (API key {}, which {}) only in versions {}..{}, and Ferry's Kafka \
                 client speaks {}..{}",
                self.broker, n.name, n.key, n.why, a.min, a.max, n.min, n.max
            ),
        }
    }
}

/// The problem and the fix, for `ferry check` and the permanent error of `ferry run`.
pub const FIX: &str =
    "exactly-once (kafka.exactly_once = true) needs Kafka transactions: use brokers \
     that support them (Apache Kafka 0.11 or later, or a Kafka-compatible service or tier with \
     transactions), or set kafka.exactly_once = false (FERRY_KAFKA_EXACTLY_ONCE=false) to relay \
     at least once (consumers deduplicate on the id header)";

/// The one-line statement of what is missing (every entry, `; `-separated).
pub fn describe(missing: &[Missing]) -> String {
    let all: Vec<String> = missing.iter().map(Missing::to_string).collect();
    format!(
        "the Kafka brokers do not support transactions: {}",
        all.join("; ")
    )
}

/// Whether librdkafka's text for a failed call says the broker lacks the API or its version
/// (`EndTxnRequest (KIP-98) not supported by broker, requires broker version >= 0.11.0`), or
/// the broker answered UNSUPPORTED_VERSION. Retrying cannot help: the broker stays what it is.
pub fn is_unsupported_text(text: &str) -> bool {
    text.contains("not supported by broker") || text.contains("Unsupported version")
}

/// A parsed `APIVERSION` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line<'a> {
    Start { broker: &'a str },
    Api { broker: &'a str, api: ApiVersion },
}

/// `[thrd:<thread>]: <broker>: Broker API support:` or
/// `[thrd:<thread>]: <broker>:   ApiKey <Name> (<key>) Versions <min>..<max>`.
fn parse_line(message: &str) -> Option<Line<'_>> {
    // The thread prefix (librdkafka's `rd_kafka_log0`), when present.
    let rest = match message.strip_prefix("[thrd:") {
        Some(r) => r.split_once("]: ")?.1,
        None => message,
    };
    let (broker, text) = rest.split_once(": ")?;
    let text = text.trim();
    if text == "Broker API support:" {
        return Some(Line::Start { broker });
    }
    let api = text.strip_prefix("ApiKey ")?;
    let (name, versions) = api.rsplit_once(" Versions ")?;
    let key = name.rsplit_once('(')?.1.strip_suffix(')')?.parse().ok()?;
    let (min, max) = versions.split_once("..")?;
    Some(Line::Api {
        broker,
        api: ApiVersion {
            key,
            min: min.parse().ok()?,
            max: max.parse().ok()?,
        },
    })
}

/// The broker's address from librdkafka's connection name, without the `/bootstrap` or
/// `/<node id>` suffix (`sasl_ssl://k:9093/2` → `sasl_ssl://k:9093`).
fn display_broker(name: &str) -> String {
    match name.rsplit_once('/') {
        Some((address, _)) if !address.is_empty() && !address.ends_with('/') => address.to_string(),
        _ => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "[thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/bootstrap: ";

    /// An answer as librdkafka 2.12.1 logs it, with the given (key, min, max) entries.
    fn answer(seen: &mut Seen, apis: &[(i16, &str, i16, i16)]) {
        seen.feed("APIVERSION", &format!("{T}Broker API support:"));
        for (key, name, min, max) in apis {
            seen.feed(
                "APIVERSION",
                &format!("{T}  ApiKey {name} ({key}) Versions {min}..{max}"),
            );
        }
    }

    /// Apache Kafka 4.4.0's answer as librdkafka 2.12.1 logs it (excerpt, copied from the
    /// end-to-end test's broker), with one of the feature lines that share the facility.
    const KAFKA_4_4_LOG: &str = "\
[thrd:127.0.0.1:34643/bootstrap]: 127.0.0.1:34643/bootstrap: Broker API support:
[thrd:127.0.0.1:34643/bootstrap]: 127.0.0.1:34643/bootstrap:   ApiKey Produce (0) Versions 0..13
[thrd:127.0.0.1:34643/bootstrap]: 127.0.0.1:34643/bootstrap:   ApiKey FindCoordinator (10) Versions 0..6
[thrd:127.0.0.1:34643/bootstrap]: 127.0.0.1:34643/bootstrap:   ApiKey ApiVersion (18) Versions 0..5
[thrd:127.0.0.1:34643/bootstrap]: 127.0.0.1:34643/bootstrap:   ApiKey InitProducerId (22) Versions 0..5
[thrd:127.0.0.1:34643/bootstrap]: 127.0.0.1:34643/bootstrap:   ApiKey AddPartitionsToTxn (24) Versions 0..5
[thrd:127.0.0.1:34643/bootstrap]: 127.0.0.1:34643/bootstrap:   ApiKey AddOffsetsToTxn (25) Versions 0..4
[thrd:127.0.0.1:34643/bootstrap]: 127.0.0.1:34643/bootstrap:   ApiKey EndTxn (26) Versions 0..5
[thrd:127.0.0.1:34643/bootstrap]: 127.0.0.1:34643/bootstrap:   ApiKey Unknown-94? (94) Versions 0..0
[thrd:127.0.0.1:34643/bootstrap]: 127.0.0.1:34643/bootstrap:  Feature MsgVer2: Produce (3..32767) supported by broker";

    #[test]
    fn apache_kafkas_answer_as_librdkafka_logs_it_is_supported() {
        let mut seen = Seen::default();
        for line in KAFKA_4_4_LOG.lines() {
            seen.feed("APIVERSION", line);
        }
        assert_eq!(seen.support(), Support::Supported);
        // Without its EndTxn line, EndTxn is missing.
        let mut seen = Seen::default();
        for line in KAFKA_4_4_LOG.lines().filter(|l| !l.contains("EndTxn")) {
            seen.feed("APIVERSION", line);
        }
        let Support::Missing(missing) = seen.support() else {
            panic!("{:?}", seen.support());
        };
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].broker, "127.0.0.1:34643");
    }

    const KAFKA_4: [(i16, &str, i16, i16); 6] = [
        (0, "Produce", 0, 13),
        (10, "FindCoordinator", 0, 6),
        (18, "ApiVersion", 0, 5),
        (22, "InitProducerId", 0, 5),
        (24, "AddPartitionsToTxn", 0, 5),
        (26, "EndTxn", 0, 5),
    ];

    #[test]
    fn a_broker_with_transactions_is_supported() {
        let mut seen = Seen::default();
        answer(&mut seen, &KAFKA_4);
        assert_eq!(seen.support(), Support::Supported);
    }

    #[test]
    fn a_broker_without_end_txn_is_named_with_the_api() {
        let mut seen = Seen::default();
        let without: Vec<_> = KAFKA_4.iter().copied().filter(|a| a.0 != 26).collect();
        answer(&mut seen, &without);
        let Support::Missing(missing) = seen.support() else {
            panic!("{:?}", seen.support());
        };
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].needed.name, "EndTxn");
        let text = describe(&missing);
        assert!(
            text.contains("broker 127.0.0.1:9092 does not offer EndTxn (API key 26"),
            "{text}"
        );
    }

    #[test]
    fn a_version_range_the_client_does_not_speak_is_missing_too() {
        let mut seen = Seen::default();
        // A broker that dropped AddPartitionsToTxn v0 (librdkafka speaks only v0).
        let apis: Vec<_> = KAFKA_4
            .iter()
            .map(|&(k, n, min, max)| {
                if k == 24 {
                    (k, n, 1, 5)
                } else {
                    (k, n, min, max)
                }
            })
            .collect();
        answer(&mut seen, &apis);
        let Support::Missing(missing) = seen.support() else {
            panic!("{:?}", seen.support());
        };
        assert_eq!(
            missing[0].to_string(),
            "broker 127.0.0.1:9092 offers AddPartitionsToTxn (API key 24, which adds each partition \
             written to the open transaction) only in versions 1..5, and Ferry's Kafka client speaks 0..0"
        );
    }

    #[test]
    fn a_broker_reached_through_two_connections_is_named_once() {
        let mut seen = Seen::default();
        let node = "[thrd:127.0.0.1:9092/1]: 127.0.0.1:9092/1: ";
        for prefix in [T, node] {
            seen.feed("APIVERSION", &format!("{prefix}Broker API support:"));
            seen.feed(
                "APIVERSION",
                &format!("{prefix}  ApiKey Produce (0) Versions 3..13"),
            );
        }
        let Support::Missing(missing) = seen.support() else {
            panic!("{:?}", seen.support());
        };
        assert_eq!(missing.len(), NEEDED.len(), "{missing:?}");
        assert!(missing.iter().all(|m| m.broker == "127.0.0.1:9092"));
        assert_eq!(display_broker("sasl_ssl://k:9093/2"), "sasl_ssl://k:9093");
    }

    #[test]
    fn a_new_answer_from_the_same_broker_replaces_the_old_one() {
        let mut seen = Seen::default();
        answer(&mut seen, &KAFKA_4[..2]);
        answer(&mut seen, &KAFKA_4);
        assert_eq!(seen.support(), Support::Supported);
    }

    #[test]
    fn no_answer_or_lines_of_another_shape_say_nothing() {
        let mut seen = Seen::default();
        assert_eq!(seen.support(), Support::Unknown);
        seen.feed(
            "FEATURE",
            &format!("{T}Updated enabled protocol features to MsgVer2"),
        );
        seen.feed("APIVERSION", &format!("{T}Broker API support:"));
        seen.feed(
            "APIVERSION",
            &format!("{T}  ApiKey EndTxn (x) Versions 0..5"),
        );
        seen.feed(
            "APIVERSION",
            &format!("{T}  ApiKey EndTxn (26) Versions 0-5"),
        );
        seen.feed("APIVERSION", "garbage");
        seen.feed("APIVERSION", "");
        assert_eq!(seen.support(), Support::Unknown);
    }

    /// Every line of the fixture cut at every byte: parsed or ignored, never a panic, and
    /// never an API entry with another key than the whole line's.
    #[test]
    fn cut_lines_never_panic() {
        for line in KAFKA_4_4_LOG.lines() {
            let whole = parse_line(line);
            for end in (0..line.len()).filter(|&e| line.is_char_boundary(e)) {
                if let Some(Line::Api { api, .. }) = parse_line(&line[..end]) {
                    let Some(Line::Api { api: full, .. }) = whole else {
                        panic!("{line:?} cut at {end}");
                    };
                    assert_eq!(api.key, full.key, "{line:?} cut at {end}");
                }
            }
        }
    }

    #[test]
    fn lines_parse_with_and_without_the_thread_prefix() {
        assert_eq!(
            parse_line("sasl_ssl://k:9093/2:   ApiKey EndTxn (26) Versions 0..5"),
            Some(Line::Api {
                broker: "sasl_ssl://k:9093/2",
                api: ApiVersion {
                    key: 26,
                    min: 0,
                    max: 5
                }
            })
        );
        assert_eq!(
            parse_line(&format!("{T}  ApiKey Unknown-99? (99) Versions 0..0")),
            Some(Line::Api {
                broker: "127.0.0.1:9092/bootstrap",
                api: ApiVersion {
                    key: 99,
                    min: 0,
                    max: 0
                }
            })
        );
    }

    #[test]
    fn librdkafkas_unsupported_errors_are_recognised() {
        assert!(is_unsupported_text(
            "Transaction error: EndTxnRequest (KIP-98) not supported by broker, requires broker \
             version >= 0.11.0"
        ));
        assert!(is_unsupported_text(
            "InitProducerId (KIP-98) not supported by broker, requires broker version >= 0.11.0"
        ));
        assert!(!is_unsupported_text("Broker: Not coordinator"));
    }
}
