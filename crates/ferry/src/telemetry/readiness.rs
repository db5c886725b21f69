//! The readiness rule behind `/readyz`: is this instance doing its job right now?
//!
//! Ready means all of:
//!
//! 1. not standing by (another instance holds the replication slot: this one is healthy but idle,
//!    and a load balancer or rollout should not count it as serving);
//! 2. some Kafka broker answers: librdkafka's statistics (every second) have shown no broker up
//!    for less than [`BROKERS_DOWN_AFTER`] (see [`super::brokers`]: a broker is up when
//!    connected and answering). This holds for an idle outbox too: librdkafka keeps at least one
//!    broker connection, trying one every second while none is up, so no broker up for 5 s
//!    means the cluster cannot be reached, and the next record would wait. With statistics every
//!    second, `/readyz` answers 503 within about 6 s of librdkafka seeing the brokers refuse or
//!    close connections (the README states 10 s); the reason names the brokers, their state, and
//!    the records waiting and for how long. Before librdkafka's first statistics (or with
//!    `statistics.interval.ms = 0`) this says nothing;
//! 3. streaming from the replication slot (`ferry_streaming` is 1: connected, `START_REPLICATION`
//!    accepted);
//! 4. confirming: either nothing is in flight, or the confirmed LSN rose within the last
//!    `stall_after`. Streaming start counts as a rise, so a fresh stream gets a full window before its
//!    first confirmation is due. An idle outbox (nothing in flight, no new WAL) is ready: the keepalive
//!    rules confirm the server's `wal_end` on their own schedule and there is nothing to be late for;
//! 5. no topic records were routed to is missing on the brokers (the topic watch keeps that list
//!    in the registry): such records wait, however recently something else was confirmed;
//! 6. no partition records wait for refuses writes (the topic watch finds, for topics whose
//!    records stopped being acknowledged, partitions with fewer in-sync replicas than
//!    `min.insync.replicas`, or no leader): librdkafka retries such writes without end and
//!    without a word, so this is what says why nothing is confirmed;
//! 7. the progress topic takes its records (`ferry_progress_failing` is 0): the slot is confirmed
//!    only up to an acknowledged progress record, so while they fail nothing is confirmed and the
//!    server keeps the WAL, however idle the outbox.
//!
//! The rule reads only the registry, so the pipeline has one thing to update (the metrics) and
//! `/readyz` can never disagree with `/metrics`. It takes `now` as an argument so tests need no
//! clock.

use std::fmt;
use std::time::{Duration, Instant};

use super::metrics::Metrics;

/// Default for how long records may be in flight without the confirmed LSN rising.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(60);

/// How long librdkafka may show no broker up before the instance is not ready.
pub const BROKERS_DOWN_AFTER: Duration = Duration::from_secs(5);

/// Why the instance is not ready; the `Display` text is the one-line `/readyz` 503 body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    Standby,
    /// No broker could be used at the last probe, and why.
    BrokersUnusable(String),
    BrokersDown {
        /// How long no broker has been up.
        since: Duration,
        brokers: Vec<super::brokers::Broker>,
        in_flight_records: u64,
        /// How long the oldest record in flight has waited.
        oldest: Option<Duration>,
    },
    NotStreaming,
    Stalled {
        in_flight_records: u64,
        since: Duration,
    },
    TopicsMissing(Vec<super::metrics::MissingTopic>),
    PartitionsRefusing(Vec<super::metrics::RefusingPartition>),
    ProgressFailing,
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::Standby => {
                f.write_str("standing by: another instance holds the replication slot")
            }
            NotReady::BrokersUnusable(why) => write!(f, "the Kafka brokers cannot be used: {why}"),
            NotReady::BrokersDown {
                since,
                brokers,
                in_flight_records,
                oldest,
            } => {
                write!(f, "no Kafka broker has answered for {}s (", since.as_secs())?;
                for (i, b) in brokers.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}{} {}", b.name, b.state)?;
                }
                match (in_flight_records, oldest) {
                    (0, _) | (_, None) => f.write_str("); no records wait")?,
                    (n, Some(age)) => write!(
                        f,
                        "); {n} records wait for acknowledgement, the oldest for {}s",
                        age.as_secs()
                    )?,
                }
                f.write_str(
                    "; nothing is confirmed until one answers: check that the brokers run and \
                     that kafka.brokers reaches them from here",
                )
            }
            NotReady::NotStreaming => f.write_str("not streaming from the replication slot"),
            NotReady::Stalled {
                in_flight_records,
                since,
            } => write!(
                f,
                "confirmed LSN has not advanced for {}s with {in_flight_records} records in flight",
                since.as_secs()
            ),
            NotReady::TopicsMissing(topics) => {
                f.write_str("records wait for topics the brokers do not have:")?;
                for t in topics {
                    write!(f, " {:?} ({} records waiting)", t.topic, t.records_waiting)?;
                }
                f.write_str("; create them, or set route.create_topics.enabled = true")
            }
            NotReady::PartitionsRefusing(partitions) => {
                f.write_str("records wait for partitions that refuse writes:")?;
                for (i, p) in partitions.iter().enumerate() {
                    write!(f, "{} {p}", if i == 0 { "" } else { ";" })?;
                }
                f.write_str(
                    "; nothing past them is confirmed until they take writes again (bring their \
                     replicas' brokers back)",
                )
            }
            NotReady::ProgressFailing => f.write_str(
                "progress records cannot be written to the progress topic (kafka.progress_topic): \
                 nothing is confirmed to PostgreSQL until one is; see the log",
            ),
        }
    }
}

/// Applies the rule in the module docs to `metrics` at `now`.
pub fn check(metrics: &Metrics, stall_after: Duration, now: Instant) -> Result<(), NotReady> {
    if metrics.standby.get() != 0 {
        return Err(NotReady::Standby);
    }
    if let Some(why) = metrics.kafka_unusable.get() {
        return Err(NotReady::BrokersUnusable(why));
    }
    let brokers = metrics.kafka_brokers.get();
    if let Some(since) = brokers.none_up_since {
        let since = now.saturating_duration_since(since);
        if since >= BROKERS_DOWN_AFTER {
            return Err(NotReady::BrokersDown {
                since,
                brokers: brokers.brokers,
                in_flight_records: metrics.in_flight_records.get(),
                oldest: metrics.in_flight_oldest.age(now),
            });
        }
    }
    if metrics.streaming.get() == 0 {
        return Err(NotReady::NotStreaming);
    }
    if metrics.progress_failing.get() != 0 {
        return Err(NotReady::ProgressFailing);
    }
    let missing = metrics.topics_missing.get();
    if !missing.is_empty() {
        return Err(NotReady::TopicsMissing(missing));
    }
    let refusing = metrics.partitions_refusing.get();
    if !refusing.is_empty() {
        return Err(NotReady::PartitionsRefusing(refusing));
    }
    let in_flight_records = metrics.in_flight_records.get();
    if in_flight_records == 0 {
        return Ok(());
    }
    let progress = metrics
        .confirmed_lsn
        .last_raised()
        .max(metrics.streaming.last_raised());
    let since = now.saturating_duration_since(progress);
    if since >= stall_after {
        return Err(NotReady::Stalled {
            in_flight_records,
            since,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(60);

    fn streaming() -> std::sync::Arc<Metrics> {
        let m = Metrics::new();
        m.streaming.set_flag(true);
        m
    }

    #[test]
    fn a_fresh_registry_is_not_streaming() {
        let m = Metrics::new();
        assert_eq!(
            check(&m, WINDOW, Instant::now()),
            Err(NotReady::NotStreaming)
        );
    }

    #[test]
    fn standby_is_never_ready() {
        let m = streaming();
        m.standby.set_flag(true);
        assert_eq!(check(&m, WINDOW, Instant::now()), Err(NotReady::Standby));
        m.streaming.set_flag(false);
        assert_eq!(check(&m, WINDOW, Instant::now()), Err(NotReady::Standby));
    }

    #[test]
    fn brokers_that_cannot_be_used_are_named_until_cleared() {
        let m = Metrics::new();
        m.kafka_unusable.set(Some(
            "nothing listens at k:9092 ... Fix: start the broker".into(),
        ));
        let why = check(&m, WINDOW, Instant::now()).unwrap_err();
        assert_eq!(
            why.to_string(),
            "the Kafka brokers cannot be used: nothing listens at k:9092 ... Fix: start the broker"
        );
        m.kafka_unusable.set(None);
        assert_eq!(
            check(&m, WINDOW, Instant::now()),
            Err(NotReady::NotStreaming)
        );
    }

    #[test]
    fn idle_streaming_is_ready_however_long_ago_anything_moved() {
        let m = streaming();
        let much_later = m.streaming.last_raised() + Duration::from_secs(86_400);
        assert_eq!(check(&m, WINDOW, much_later), Ok(()));
    }

    #[test]
    fn in_flight_records_need_recent_confirmations() {
        let m = streaming();
        m.in_flight_records.set(5);
        let start = m.streaming.last_raised();
        assert_eq!(
            check(&m, WINDOW, start + Duration::from_secs(59)),
            Ok(()),
            "grace after streaming starts"
        );
        let stalled = check(&m, WINDOW, start + Duration::from_secs(60));
        assert_eq!(
            stalled,
            Err(NotReady::Stalled {
                in_flight_records: 5,
                since: Duration::from_secs(60)
            })
        );
        assert_eq!(
            stalled.unwrap_err().to_string(),
            "confirmed LSN has not advanced for 60s with 5 records in flight"
        );

        m.confirmed_lsn.set(100);
        let confirmed = m.confirmed_lsn.last_raised();
        assert!(confirmed >= start);
        assert_eq!(
            check(&m, WINDOW, confirmed + Duration::from_secs(30)),
            Ok(())
        );
        assert!(check(&m, WINDOW, confirmed + Duration::from_secs(61)).is_err());

        m.in_flight_records.set(0);
        assert_eq!(
            check(&m, WINDOW, confirmed + Duration::from_secs(61)),
            Ok(()),
            "drained is ready"
        );
    }

    #[test]
    fn a_missing_topic_is_not_ready_and_names_the_topic() {
        use crate::telemetry::metrics::MissingTopic;
        let m = streaming();
        m.topics_missing.set(vec![MissingTopic {
            topic: "orders".into(),
            records_waiting: 3,
        }]);
        let e = check(&m, WINDOW, Instant::now()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "records wait for topics the brokers do not have: \"orders\" (3 records waiting); \
             create them, or set route.create_topics.enabled = true"
        );
        m.topics_missing.set(Vec::new());
        assert_eq!(check(&m, WINDOW, Instant::now()), Ok(()));
    }

    #[test]
    fn a_partition_refusing_writes_is_not_ready_and_says_why() {
        use crate::telemetry::metrics::{Refusal, RefusingPartition};
        let m = streaming();
        m.in_flight_records.set(7);
        m.partitions_refusing.set(vec![
            RefusingPartition {
                topic: "orders".into(),
                partition: 2,
                reason: Refusal::NotEnoughReplicas {
                    in_sync: 1,
                    replicas: 3,
                    min_insync: 2,
                },
            },
            RefusingPartition {
                topic: "orders".into(),
                partition: 0,
                reason: Refusal::NoLeader,
            },
        ]);
        let e = check(&m, WINDOW, Instant::now()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "records wait for partitions that refuse writes: \"orders\" [2] (NOT_ENOUGH_REPLICAS: \
             1 of 3 replicas in sync, below min.insync.replicas = 2); \"orders\" [0] \
             (LEADER_NOT_AVAILABLE: no in-sync replica to lead it); nothing past them is \
             confirmed until they take writes again (bring their replicas' brokers back)"
        );
        m.partitions_refusing.set(Vec::new());
        assert_eq!(check(&m, WINDOW, Instant::now()), Ok(()));
    }

    #[test]
    fn failing_progress_records_are_not_ready_even_when_idle() {
        let m = streaming();
        m.progress_failing.set_flag(true);
        let e = check(&m, WINDOW, Instant::now()).unwrap_err();
        assert_eq!(e, NotReady::ProgressFailing);
        assert!(e.to_string().contains("kafka.progress_topic"), "{e}");
        m.progress_failing.set_flag(false);
        assert_eq!(check(&m, WINDOW, Instant::now()), Ok(()));
    }

    #[test]
    fn a_lower_or_equal_confirmed_lsn_is_not_progress() {
        let m = streaming();
        m.confirmed_lsn.set(100);
        let raised = m.confirmed_lsn.last_raised();
        m.in_flight_records.set(1);
        m.confirmed_lsn.set(100);
        m.confirmed_lsn.set(90);
        assert_eq!(m.confirmed_lsn.last_raised(), raised);
        assert!(check(&m, WINDOW, raised + WINDOW).is_err());
    }

    fn brokers(
        states: &[&str],
        none_up_since: Option<Instant>,
    ) -> crate::telemetry::brokers::BrokerView {
        use crate::telemetry::brokers::{Broker, BrokerView};
        BrokerView {
            brokers: states
                .iter()
                .enumerate()
                .map(|(i, s)| Broker {
                    name: format!("kafka-{i}:9092/{i}"),
                    state: s.to_string(),
                })
                .collect(),
            none_up_since,
        }
    }

    #[test]
    fn no_broker_up_for_the_bound_is_not_ready_and_says_what_waits() {
        let m = streaming();
        // Later than the registry's making, as every hand-over is.
        let t0 = Instant::now() + Duration::from_secs(10);
        m.kafka_brokers.set(brokers(&["UP"], None));
        assert_eq!(check(&m, WINDOW, t0), Ok(()));
        // Stopped: the first statistics without a broker up.
        m.kafka_brokers
            .set(brokers(&["TRY_CONNECT", "CONNECT"], Some(t0)));
        m.in_flight_records.set(50);
        m.in_flight_oldest
            .set(Some((t0 - Duration::from_secs(2), 1)));
        assert_eq!(
            check(&m, WINDOW, t0 + Duration::from_millis(4_999)),
            Ok(()),
            "a blip shorter than the bound"
        );
        let e = check(&m, WINDOW, t0 + BROKERS_DOWN_AFTER).unwrap_err();
        assert!(
            matches!(
                e,
                NotReady::BrokersDown {
                    in_flight_records: 50,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "no Kafka broker has answered for 5s (kafka-0:9092/0 TRY_CONNECT, kafka-1:9092/1 \
             CONNECT); 50 records wait for acknowledgement, the oldest for 7s; nothing is \
             confirmed until one answers: check that the brokers run and that kafka.brokers \
             reaches them from here"
        );
        // A broker answers again.
        m.kafka_brokers.set(brokers(&["UP", "CONNECT"], None));
        assert_eq!(check(&m, WINDOW, t0 + Duration::from_secs(30)), Ok(()));
    }

    /// An idle outbox whose brokers are all down is not ready either: librdkafka tries to keep
    /// one connection, so none up is an outage, not idleness (see the module docs).
    #[test]
    fn no_broker_up_is_not_ready_when_idle_too() {
        let m = streaming();
        let t0 = Instant::now();
        m.kafka_brokers.set(brokers(&["DOWN"], Some(t0)));
        let e = check(&m, WINDOW, t0 + Duration::from_secs(6)).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "no Kafka broker has answered for 6s (kafka-0:9092/0 DOWN); no records wait"
            ),
            "{e}"
        );
        // Before any statistics, nothing is known: no verdict from the brokers.
        m.kafka_brokers.set(brokers(&[], None));
        assert_eq!(check(&m, WINDOW, t0 + Duration::from_secs(60)), Ok(()));
    }

    #[test]
    fn restarting_the_stream_restarts_the_window() {
        let m = streaming();
        m.in_flight_records.set(1);
        let first = m.streaming.last_raised();
        assert!(check(&m, WINDOW, first + Duration::from_secs(120)).is_err());
        m.streaming.set_at(0, first + Duration::from_secs(100));
        assert_eq!(
            check(&m, WINDOW, first + Duration::from_secs(100)),
            Err(NotReady::NotStreaming)
        );
        m.streaming.set_at(1, first + Duration::from_secs(100));
        assert_eq!(check(&m, WINDOW, first + Duration::from_secs(120)), Ok(()));
        assert!(check(&m, WINDOW, first + Duration::from_secs(160)).is_err());
    }
}
