//! What librdkafka says of the brokers: how many it knows, how many answer, since when none
//! does, and how many lost connections it re-established. Pure: statistics JSON and the time
//! in, a [`BrokerView`] out; the producer's context feeds it and puts the view in the registry.
//!
//! librdkafka emits its statistics every `statistics.interval.ms` (Ferry's default 1 s, see
//! [`crate::config::defaults::STATISTICS_INTERVAL_MS`]); each broker has a `state` (in
//! librdkafka 2.12's order: `INIT`, `DOWN`, `TRY_CONNECT`, `CONNECT`, `SSL_HANDSHAKE`,
//! `AUTH_LEGACY`, `UP`, `APIVERSION_QUERY`, `AUTH_HANDSHAKE`, `AUTH_REQ`, `REAUTH`), `waitresp_cnt`
//! (requests sent and not answered) and `rxidle` (µs since it last received a byte on the
//! current connection). Ferry counts a broker as **up** when its state is `UP` and it is not
//! silent: a broker with requests outstanding that has received nothing for [`SILENT_AFTER`]
//! (a network that drops packets without closing the connection) does not answer either.
//!
//! Which brokers count: the ones librdkafka learned from metadata (`source` `learned`); until
//! it learned any, the configured bootstrap ones. Its internal broker and the logical ones (the
//! transaction coordinator's handle) are not brokers of the cluster.
//!
//! **No broker up** is meaningful even for an idle relay: with sparse connections (librdkafka's
//! default) a client keeps at least one broker connection, trying one every second while none
//! is up (`rd_kafka_1s_tmr_cb`, "no cluster connection"). So none up for seconds means the
//! cluster cannot be reached, not that the client is idle. The view remembers since when none
//! has been up; readiness ([`super::readiness`]) decides from that.
//!
//! **Reconnects.** A broker seen up again after it lost its connection counts one re-established
//! connection, whatever the cause (the broker stopped, the network, the broker's
//! `connections.max.idle.ms`). Two signs of a loss: its `disconnects` rose (`rd_kafka_broker_fail`
//! counts a transport failed in state `UP` or later, which includes the handshake states after
//! it: a connection whose handshake failed counts too, so a rise counts once however large), or
//! it was seen in a state of no connection, or not listed at all. The second is needed because
//! the count belongs to librdkafka's object for the broker: librdkafka 2.10 and later drop a
//! learned broker that a metadata answer leaves out and make a new one, counting from 0, when it
//! is listed again. A count that went back marks such a new object. A loss and a return both
//! between two statistics count only through `disconnects`; two of them count as one.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::Deserialize;

/// A broker with requests outstanding that received nothing for this long does not answer.
pub const SILENT_AFTER: Duration = Duration::from_secs(5);

/// One broker as the latest statistics show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    /// librdkafka's name for it: `host:port/id` (`host:port/bootstrap` before it is learned).
    pub name: String,
    /// librdkafka's state, as it spells it (`UP`, `TRY_CONNECT`, ...), or `SILENT` for an up
    /// connection that stopped answering.
    pub state: String,
}

impl Broker {
    pub fn is_up(&self) -> bool {
        self.state == "UP"
    }
}

/// What the registry holds of the brokers (`ferry_kafka_brokers`, `ferry_kafka_brokers_up`,
/// and for `/readyz` since when none is up and each one's state).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokerView {
    pub brokers: Vec<Broker>,
    /// Since the first statistics that showed no broker up (none while one is up, or before
    /// any statistics came).
    pub none_up_since: Option<Instant>,
}

impl BrokerView {
    pub fn known(&self) -> usize {
        self.brokers.len()
    }
    pub fn up(&self) -> usize {
        self.brokers.iter().filter(|b| b.is_up()).count()
    }
}

/// The statistics' fields Ferry reads (serde skips the rest).
#[derive(Debug, Deserialize)]
struct Stats {
    #[serde(default)]
    brokers: HashMap<String, BrokerStats>,
}

#[derive(Debug, Deserialize)]
struct BrokerStats {
    #[serde(default)]
    source: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    waitresp_cnt: i64,
    /// -1 before the current connection received anything.
    #[serde(default)]
    rxidle: i64,
    #[serde(default)]
    disconnects: u64,
}

/// Turns statistics into views, remembering what it needs across them.
#[derive(Debug, Default)]
pub struct BrokerWatch {
    none_up_since: Option<Instant>,
    /// Per broker name, what earlier statistics showed of its connection.
    seen: HashMap<String, Seen>,
}

/// One broker's connection across statistics, for counting its re-established connections.
#[derive(Debug, Default)]
struct Seen {
    /// librdkafka's `disconnects` for it at the last statistics that listed it.
    disconnects: u64,
    /// Seen up, and since then not seen without a connection.
    up: bool,
    /// Lost since it was last seen up: its `disconnects` rose, or it was seen without a
    /// connection or not listed.
    lost: bool,
}

impl Seen {
    /// Takes in one statistics' view of the broker (`state`: librdkafka's; `up`: answering);
    /// returns the connections re-established (0 or 1).
    fn observe(&mut self, disconnects: u64, state: &str, up: bool) -> u64 {
        if disconnects < self.disconnects {
            // librdkafka made a new object for this broker: its count starts over.
            self.disconnects = 0;
        }
        self.lost |= disconnects > self.disconnects;
        self.disconnects = disconnects;
        if up {
            let reconnected = u64::from(self.lost);
            (self.lost, self.up) = (false, true);
            reconnected
        } else {
            if NOT_CONNECTED.contains(&state) {
                self.unlisted_or_down();
            }
            0
        }
    }

    fn unlisted_or_down(&mut self) {
        if self.up {
            (self.up, self.lost) = (false, true);
        }
    }
}

/// librdkafka's states of a broker without a connection, or with one still being set up. The
/// authentication states are left out: a SASL re-authentication passes `REAUTH`,
/// `AUTH_HANDSHAKE` and `AUTH_REQ` on the same connection (a new connection passes `CONNECT`
/// and `APIVERSION_QUERY` first).
const NOT_CONNECTED: [&str; 6] = [
    "INIT",
    "DOWN",
    "TRY_CONNECT",
    "CONNECT",
    "SSL_HANDSHAKE",
    "APIVERSION_QUERY",
];

/// What one statistics event changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub view: BrokerView,
    /// Connections re-established since the previous statistics.
    pub reconnects: u64,
    /// A connection that was up has been lost (`disconnects` > 0), whether or not any statistics
    /// saw it up: a broker that goes away within the first interval was up all the same.
    pub was_up: bool,
}

impl BrokerWatch {
    /// Reads one statistics JSON document, received at `now`.
    pub fn update(&mut self, json: &[u8], now: Instant) -> Result<Update, serde_json::Error> {
        let stats: Stats = serde_json::from_slice(json)?;
        let learned = stats.brokers.values().any(|b| b.source == "learned");
        let wanted = if learned { "learned" } else { "configured" };
        let mut reconnects = 0;
        let mut was_up = false;
        let mut brokers: Vec<Broker> = stats
            .brokers
            .into_iter()
            .filter(|(_, b)| b.source == wanted)
            .map(|(name, b)| {
                let silent = b.waitresp_cnt > 0
                    && u64::try_from(b.rxidle)
                        .is_ok_and(|us| us >= SILENT_AFTER.as_micros() as u64);
                let up = b.state == "UP" && !silent;
                reconnects +=
                    self.seen
                        .entry(name.clone())
                        .or_default()
                        .observe(b.disconnects, &b.state, up);
                let state = match b.state.as_str() {
                    "UP" if silent => "SILENT".to_string(),
                    _ => b.state,
                };
                was_up |= b.disconnects > 0;
                Broker { name, state }
            })
            .collect();
        for (name, seen) in &mut self.seen {
            if !brokers.iter().any(|b| &b.name == name) {
                seen.unlisted_or_down();
            }
        }
        brokers.sort_by(|a, b| a.name.cmp(&b.name));
        let any_up = brokers.iter().any(Broker::is_up);
        self.none_up_since = match (any_up, self.none_up_since) {
            (true, _) => None,
            (false, since) if !brokers.is_empty() => Some(since.unwrap_or(now)),
            (false, since) => since,
        };
        Ok(Update {
            view: BrokerView {
                brokers,
                none_up_since: self.none_up_since,
            },
            reconnects,
            was_up,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(brokers: &[(&str, &str, &str, i64, i64, u64)]) -> Vec<u8> {
        let brokers: serde_json::Map<String, serde_json::Value> = brokers
            .iter()
            .map(|(name, source, state, waitresp, rxidle, disconnects)| {
                (
                    name.to_string(),
                    serde_json::json!({
                        "name": name, "nodeid": 1, "source": source, "state": state,
                        "waitresp_cnt": waitresp, "rxidle": rxidle, "disconnects": disconnects,
                        "rtt": {"avg": 0}
                    }),
                )
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({
            "name": "rdkafka#producer-1", "type": "producer", "ts": 1, "brokers": brokers,
            "topics": {}
        }))
        .unwrap()
    }

    const INTERNAL: (&str, &str, &str, i64, i64, u64) = (":0/internal", "internal", "UP", 0, -1, 0);

    /// A broker that went away before any statistics saw it up still counts as having been up
    /// (its connection was lost), so the log says the outage; a broker never reached does not.
    #[test]
    fn a_connection_lost_within_the_first_interval_was_up() {
        let now = Instant::now();
        let lost = BrokerWatch::default()
            .update(
                &stats(&[INTERNAL, ("b:9092/1", "learned", "TRY_CONNECT", 0, -1, 1)]),
                now,
            )
            .unwrap();
        assert!(lost.was_up && lost.view.up() == 0);
        let never = BrokerWatch::default()
            .update(
                &stats(&[
                    INTERNAL,
                    ("b:9092/bootstrap", "configured", "CONNECT", 0, -1, 0),
                ]),
                now,
            )
            .unwrap();
        assert!(!never.was_up);
    }

    #[test]
    fn learned_brokers_count_once_learned_and_internal_never() {
        let mut w = BrokerWatch::default();
        let now = Instant::now();
        let u = w
            .update(
                &stats(&[INTERNAL, ("b:9092/bootstrap", "configured", "UP", 0, 10, 0)]),
                now,
            )
            .unwrap();
        assert_eq!((u.view.known(), u.view.up()), (1, 1));
        let u = w
            .update(
                &stats(&[
                    INTERNAL,
                    ("b:9092/bootstrap", "configured", "INIT", 0, -1, 0),
                    ("b:9092/1", "learned", "UP", 1, 100, 0),
                    ("c:9092/2", "learned", "INIT", 0, -1, 0),
                    ("TxnCoordinator", "logical", "UP", 0, 5, 0),
                ]),
                now,
            )
            .unwrap();
        assert_eq!((u.view.known(), u.view.up()), (2, 1));
        assert_eq!(u.view.brokers[0].name, "b:9092/1");
        assert_eq!(u.view.none_up_since, None);
    }

    #[test]
    fn none_up_is_timed_from_the_first_statistics_that_show_it() {
        let mut w = BrokerWatch::default();
        let t0 = Instant::now();
        let up = stats(&[("b:9092/1", "learned", "UP", 0, 10, 0)]);
        let down = stats(&[("b:9092/1", "learned", "TRY_CONNECT", 0, -1, 1)]);
        assert_eq!(w.update(&up, t0).unwrap().view.none_up_since, None);
        let t1 = t0 + Duration::from_secs(1);
        let u = w.update(&down, t1).unwrap();
        assert_eq!(u.view.none_up_since, Some(t1));
        assert_eq!(u.view.up(), 0);
        let u = w.update(&down, t1 + Duration::from_secs(1)).unwrap();
        assert_eq!(u.view.none_up_since, Some(t1), "still since the first");
        assert_eq!(
            w.update(&up, t1 + Duration::from_secs(2))
                .unwrap()
                .view
                .none_up_since,
            None
        );
    }

    #[test]
    fn an_up_connection_with_requests_unanswered_too_long_is_silent() {
        let mut w = BrokerWatch::default();
        let now = Instant::now();
        let busy_but_answering = stats(&[("b:9092/1", "learned", "UP", 3, 4_999_999, 0)]);
        assert_eq!(w.update(&busy_but_answering, now).unwrap().view.up(), 1);
        let idle = stats(&[("b:9092/1", "learned", "UP", 0, 600_000_000, 0)]);
        assert_eq!(
            w.update(&idle, now).unwrap().view.up(),
            1,
            "idle is not silent"
        );
        let silent = stats(&[("b:9092/1", "learned", "UP", 1, 5_000_000, 0)]);
        let u = w.update(&silent, now).unwrap();
        assert_eq!(u.view.up(), 0);
        assert_eq!(u.view.brokers[0].state, "SILENT");
        assert_eq!(u.view.none_up_since, Some(now));
    }

    #[test]
    fn each_lost_connection_counts_once_when_the_broker_is_up_again() {
        let mut w = BrokerWatch::default();
        let now = Instant::now();
        let at = |state: &'static str, disconnects| {
            stats(&[
                ("b:9092/1", "learned", state, 0, 10, disconnects),
                ("c:9092/2", "learned", "UP", 0, 10, 0),
            ])
        };
        assert_eq!(w.update(&at("UP", 0), now).unwrap().reconnects, 0);
        assert_eq!(w.update(&at("TRY_CONNECT", 1), now).unwrap().reconnects, 0);
        assert_eq!(w.update(&at("CONNECT", 1), now).unwrap().reconnects, 0);
        assert_eq!(w.update(&at("UP", 1), now).unwrap().reconnects, 1);
        assert_eq!(w.update(&at("UP", 1), now).unwrap().reconnects, 0);
        // Losses between two statistics, up at both: once (a rise of `disconnects` also counts
        // connections whose handshake failed, which were never re-established).
        assert_eq!(w.update(&at("UP", 3), now).unwrap().reconnects, 1);
        assert_eq!(
            w.update(&at("APIVERSION_QUERY", 5), now)
                .unwrap()
                .reconnects,
            0
        );
        assert_eq!(w.update(&at("UP", 6), now).unwrap().reconnects, 1);
    }

    /// librdkafka (2.10 and later) drops a learned broker that a metadata answer leaves out
    /// (a stopped broker of a cluster, as soon as the others stop listing it), and makes a new
    /// one, counting its disconnects from 0, once it is listed again: the statistics of a
    /// three-broker run showed `b/1` `UP` with 0 disconnects, then no `b/1`, then `b/1` `INIT`
    /// with 0. Its re-established connection counts all the same.
    #[test]
    fn a_broker_librdkafka_made_again_counts_its_reconnection() {
        let mut w = BrokerWatch::default();
        let now = Instant::now();
        let two = |state: &'static str, disconnects| {
            stats(&[
                ("b:9092/1", "learned", state, 0, 10, disconnects),
                ("c:9092/2", "learned", "UP", 0, 10, 0),
            ])
        };
        let without = stats(&[("c:9092/2", "learned", "UP", 0, 10, 0)]);
        assert_eq!(w.update(&two("UP", 0), now).unwrap().reconnects, 0);
        assert_eq!(w.update(&without, now).unwrap().reconnects, 0);
        assert_eq!(w.update(&two("INIT", 0), now).unwrap().reconnects, 0);
        assert_eq!(w.update(&two("UP", 0), now).unwrap().reconnects, 1);
        assert_eq!(w.update(&two("UP", 0), now).unwrap().reconnects, 0);
        // Shown down with its loss, then dropped while none is up: only the bootstrap broker
        // librdkafka added back is listed, and it answers.
        let one = |state: &'static str, disconnects| {
            stats(&[("b:9092/1", "learned", state, 0, 10, disconnects)])
        };
        assert_eq!(w.update(&one("TRY_CONNECT", 1), now).unwrap().reconnects, 0);
        let bootstrap = stats(&[("b:9092/bootstrap", "configured", "UP", 0, 10, 0)]);
        let u = w.update(&bootstrap, now).unwrap();
        assert_eq!((u.view.up(), u.reconnects), (1, 0));
        assert_eq!(w.update(&one("CONNECT", 0), now).unwrap().reconnects, 0);
        assert_eq!(w.update(&one("UP", 0), now).unwrap().reconnects, 1);
        // The new object's own losses count from its own count.
        assert_eq!(w.update(&one("UP", 2), now).unwrap().reconnects, 1);
    }

    /// A broker seen up, then without a connection, then up again was reconnected, whether or
    /// not its `disconnects` show it; one that never was up, a silent connection that answers
    /// again, or a SASL re-authentication on the same connection was not.
    #[test]
    fn a_broker_seen_down_between_two_ups_counts_one_reconnection() {
        let mut w = BrokerWatch::default();
        let now = Instant::now();
        let one = |state: &'static str, waitresp, rxidle, disconnects| {
            stats(&[("b:9092/1", "learned", state, waitresp, rxidle, disconnects)])
        };
        let mut counted = |json: Vec<u8>| w.update(&json, now).unwrap().reconnects;
        assert_eq!(counted(one("TRY_CONNECT", 0, -1, 0)), 0);
        assert_eq!(counted(one("APIVERSION_QUERY", 0, -1, 0)), 0);
        assert_eq!(counted(one("UP", 0, 10, 0)), 0, "the first connection");
        assert_eq!(counted(one("UP", 1, 6_000_000, 0)), 0, "silent");
        assert_eq!(counted(one("UP", 0, 10, 0)), 0, "answering again");
        for reauthenticating in ["REAUTH", "AUTH_HANDSHAKE", "AUTH_REQ"] {
            assert_eq!(counted(one(reauthenticating, 0, 10, 0)), 0);
        }
        assert_eq!(counted(one("UP", 0, 10, 0)), 0, "re-authenticated");
        // Down with no disconnect counted (a new object in between, say): one loss, counted
        // when it is up.
        assert_eq!(counted(one("DOWN", 0, -1, 0)), 0);
        assert_eq!(counted(one("CONNECT", 0, -1, 0)), 0);
        assert_eq!(counted(one("UP", 0, 10, 0)), 1);
        // Down and shown as one disconnect: still one.
        assert_eq!(counted(one("DOWN", 0, -1, 1)), 0);
        assert_eq!(counted(one("UP", 0, 10, 1)), 1);
        assert_eq!(counted(one("UP", 0, 10, 1)), 0);
    }

    #[test]
    fn bad_statistics_are_an_error_not_a_panic() {
        let mut w = BrokerWatch::default();
        assert!(w.update(b"{\"brokers\": 3}", Instant::now()).is_err());
        assert!(w.update(b"", Instant::now()).is_err());
        let u = w.update(b"{}", Instant::now()).unwrap();
        assert_eq!(u.view, BrokerView::default());
    }
}
