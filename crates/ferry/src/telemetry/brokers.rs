//! What librdkafka says of the brokers: how many it knows, how many answer, since when none
//! does, and how many lost connections it re-established. Pure: statistics JSON and the time
//! in, a [`BrokerView`] out; the producer's context feeds it and puts the view in the registry.
//!
//! librdkafka emits its statistics every `statistics.interval.ms` (Ferry's default 1 s, see
//! [`crate::config::defaults::STATISTICS_INTERVAL_MS`]); each broker has a `state` (`INIT`,
//! `TRY_CONNECT`, `CONNECT`, `DOWN`, the handshake states, `UP`, `UPDATE`), `waitresp_cnt`
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
//! **Reconnects.** A broker's `disconnects` counts connections that were up and were lost
//! (`rd_kafka_broker_fail` counts only a transport in state `UP` or later). Each such loss is
//! counted once the broker is seen up again: that is a re-established connection, whatever its
//! cause (the broker stopped, the network, the broker's `connections.max.idle.ms`).

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
    /// Per broker, the disconnects already counted as reconnects.
    disconnects_counted: HashMap<String, u64>,
}

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
                let state = match b.state.as_str() {
                    "UP" if silent => "SILENT".to_string(),
                    _ => b.state,
                };
                was_up |= b.disconnects > 0;
                if state == "UP" {
                    let counted = self.disconnects_counted.entry(name.clone()).or_insert(0);
                    reconnects += b.disconnects.saturating_sub(*counted);
                    *counted = (*counted).max(b.disconnects);
                }
                Broker { name, state }
            })
            .collect();
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
        // Two losses between two statistics, up again at the second.
        assert_eq!(w.update(&at("UP", 3), now).unwrap().reconnects, 2);
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
