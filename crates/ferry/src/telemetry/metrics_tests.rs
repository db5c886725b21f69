//! Tests of the metrics registry: the exact exposition text, histogram bucket math, the spec table.

use super::*;
use std::time::Duration;

/// The exact rendering of a registry with a few values set. The version label is substituted.
const GOLDEN: &str = r#"# HELP ferry_build_info Build information; always 1.
# TYPE ferry_build_info gauge
ferry_build_info{version="VERSION"} 1
# HELP ferry_streaming 1 while streaming from the replication slot.
# TYPE ferry_streaming gauge
ferry_streaming 1
# HELP ferry_standby 1 while standing by because another instance holds the slot.
# TYPE ferry_standby gauge
ferry_standby 0
# HELP ferry_records_produced_total Records Kafka acknowledged.
# TYPE ferry_records_produced_total counter
ferry_records_produced_total 3
# HELP ferry_bytes_produced_total Key, value and header bytes of the records Kafka acknowledged.
# TYPE ferry_bytes_produced_total counter
ferry_bytes_produced_total 300
# HELP ferry_delivery_errors_total Failed delivery reports.
# TYPE ferry_delivery_errors_total counter
ferry_delivery_errors_total 0
# HELP ferry_in_flight_records Records handed to the producer and not yet acknowledged.
# TYPE ferry_in_flight_records gauge
ferry_in_flight_records 2
# HELP ferry_in_flight_bytes Bytes of the records in flight.
# TYPE ferry_in_flight_bytes gauge
ferry_in_flight_bytes 200
# HELP ferry_in_flight_oldest_age_seconds Seconds since the oldest record in flight was handed to the producer (0 when none is).
# TYPE ferry_in_flight_oldest_age_seconds gauge
ferry_in_flight_oldest_age_seconds 2.5
# HELP ferry_transactions_received_total Outbox transactions assembled from the replication slot.
# TYPE ferry_transactions_received_total counter
ferry_transactions_received_total 2
# HELP ferry_transactions_confirmed_total Transactions whose end LSN was confirmed to the server.
# TYPE ferry_transactions_confirmed_total counter
ferry_transactions_confirmed_total 1
# HELP ferry_received_lsn Highest WAL position received from the server.
# TYPE ferry_received_lsn gauge
ferry_received_lsn 4294967396
# HELP ferry_confirmed_lsn Last flush LSN reported to the server.
# TYPE ferry_confirmed_lsn gauge
ferry_confirmed_lsn 4294967336
# HELP ferry_server_wal_lsn The server's current WAL position at the last poll.
# TYPE ferry_server_wal_lsn gauge
ferry_server_wal_lsn 4294968336
# HELP ferry_wal_lag_bytes Server WAL position minus the confirmed LSN.
# TYPE ferry_wal_lag_bytes gauge
ferry_wal_lag_bytes 1000
# HELP ferry_replication_lag_seconds Seconds from commit in Postgres to acknowledgement by Kafka, per record.
# TYPE ferry_replication_lag_seconds histogram
ferry_replication_lag_seconds_bucket{le="0.001"} 0
ferry_replication_lag_seconds_bucket{le="0.0025"} 0
ferry_replication_lag_seconds_bucket{le="0.005"} 1
ferry_replication_lag_seconds_bucket{le="0.0075"} 1
ferry_replication_lag_seconds_bucket{le="0.01"} 1
ferry_replication_lag_seconds_bucket{le="0.015"} 1
ferry_replication_lag_seconds_bucket{le="0.025"} 1
ferry_replication_lag_seconds_bucket{le="0.05"} 1
ferry_replication_lag_seconds_bucket{le="0.1"} 1
ferry_replication_lag_seconds_bucket{le="0.25"} 1
ferry_replication_lag_seconds_bucket{le="0.5"} 2
ferry_replication_lag_seconds_bucket{le="1"} 2
ferry_replication_lag_seconds_bucket{le="2.5"} 2
ferry_replication_lag_seconds_bucket{le="5"} 2
ferry_replication_lag_seconds_bucket{le="10"} 2
ferry_replication_lag_seconds_bucket{le="30"} 2
ferry_replication_lag_seconds_bucket{le="60"} 2
ferry_replication_lag_seconds_bucket{le="+Inf"} 3
ferry_replication_lag_seconds_sum 120.50390625
ferry_replication_lag_seconds_count 3
# HELP ferry_replication_lag_latest_seconds The replication lag now: the latest observation, or the age since commit of the oldest record in flight when larger.
# TYPE ferry_replication_lag_latest_seconds gauge
ferry_replication_lag_latest_seconds 200
# HELP ferry_source_delay_seconds Seconds from commit in Postgres to the server sending the transaction, per transaction (the server's clock; includes any wait for Ferry to read).
# TYPE ferry_source_delay_seconds histogram
ferry_source_delay_seconds_bucket{le="0.001"} 0
ferry_source_delay_seconds_bucket{le="0.0025"} 0
ferry_source_delay_seconds_bucket{le="0.005"} 0
ferry_source_delay_seconds_bucket{le="0.0075"} 0
ferry_source_delay_seconds_bucket{le="0.01"} 0
ferry_source_delay_seconds_bucket{le="0.015"} 0
ferry_source_delay_seconds_bucket{le="0.025"} 0
ferry_source_delay_seconds_bucket{le="0.05"} 0
ferry_source_delay_seconds_bucket{le="0.1"} 0
ferry_source_delay_seconds_bucket{le="0.25"} 0
ferry_source_delay_seconds_bucket{le="0.5"} 0
ferry_source_delay_seconds_bucket{le="1"} 0
ferry_source_delay_seconds_bucket{le="2.5"} 0
ferry_source_delay_seconds_bucket{le="5"} 0
ferry_source_delay_seconds_bucket{le="10"} 0
ferry_source_delay_seconds_bucket{le="30"} 0
ferry_source_delay_seconds_bucket{le="60"} 0
ferry_source_delay_seconds_bucket{le="+Inf"} 0
ferry_source_delay_seconds_sum 0
ferry_source_delay_seconds_count 0
# HELP ferry_rows_skipped_total Outbox rows skipped by policy.
# TYPE ferry_rows_skipped_total counter
ferry_rows_skipped_total 0
# HELP ferry_rows_dead_lettered_total Outbox rows sent to the dead-letter topic.
# TYPE ferry_rows_dead_lettered_total counter
ferry_rows_dead_lettered_total 1
# HELP ferry_routing_errors_total Rows the router rejected, by reason.
# TYPE ferry_routing_errors_total counter
ferry_routing_errors_total{reason="missing_column"} 0
ferry_routing_errors_total{reason="null_value"} 0
ferry_routing_errors_total{reason="null_payload"} 0
ferry_routing_errors_total{reason="invalid_value"} 0
ferry_routing_errors_total{reason="invalid_topic"} 0
ferry_routing_errors_total{reason="payload_too_large"} 1
ferry_routing_errors_total{reason="invalid_message"} 0
# HELP ferry_outbox_rows_total Outbox rows read, by table and what came of them.
# TYPE ferry_outbox_rows_total counter
ferry_outbox_rows_total{table="public.outbox",outcome="routed"} 2
ferry_outbox_rows_total{table="public.outbox",outcome="dead_lettered"} 1
ferry_outbox_rows_total{table="public.outbox",outcome="skipped"} 0
ferry_outbox_rows_total{table="public.outbox",outcome="failed"} 0
ferry_outbox_rows_total{table="\"Billing\".events",outcome="routed"} 0
ferry_outbox_rows_total{table="\"Billing\".events",outcome="dead_lettered"} 0
ferry_outbox_rows_total{table="\"Billing\".events",outcome="skipped"} 1
ferry_outbox_rows_total{table="\"Billing\".events",outcome="failed"} 0
# HELP ferry_trace_context_malformed_total Records sent without their malformed trace context, by problem.
# TYPE ferry_trace_context_malformed_total counter
ferry_trace_context_malformed_total{problem="not_text"} 0
ferry_trace_context_malformed_total{problem="no_traceparent"} 0
ferry_trace_context_malformed_total{problem="length"} 0
ferry_trace_context_malformed_total{problem="layout"} 0
ferry_trace_context_malformed_total{problem="not_lowercase_hex"} 0
ferry_trace_context_malformed_total{problem="version_ff"} 1
ferry_trace_context_malformed_total{problem="zero_trace_id"} 0
ferry_trace_context_malformed_total{problem="zero_parent_id"} 0
ferry_trace_context_malformed_total{problem="invalid_tracestate"} 0
# HELP ferry_status_updates_sent_total Standby status updates sent to the server.
# TYPE ferry_status_updates_sent_total counter
ferry_status_updates_sent_total 7
# HELP ferry_reconnects_total Sessions restarted after transient errors, and Kafka broker connections re-established, by component.
# TYPE ferry_reconnects_total counter
ferry_reconnects_total{component="postgres"} 0
ferry_reconnects_total{component="kafka"} 2
# HELP ferry_kafka_brokers Kafka brokers librdkafka knows, from its latest statistics.
# TYPE ferry_kafka_brokers gauge
ferry_kafka_brokers 2
# HELP ferry_kafka_brokers_up Kafka brokers connected and answering, from librdkafka's latest statistics.
# TYPE ferry_kafka_brokers_up gauge
ferry_kafka_brokers_up 1
# HELP ferry_topics_missing Topics records were routed to that the brokers do not have.
# TYPE ferry_topics_missing gauge
ferry_topics_missing 1
# HELP ferry_partitions_refusing Partitions records wait for that refuse writes (too few in-sync replicas, no leader).
# TYPE ferry_partitions_refusing gauge
ferry_partitions_refusing 0
# HELP ferry_log_write_errors_total Log events dropped because the log sink (stderr) failed.
# TYPE ferry_log_write_errors_total counter
ferry_log_write_errors_total 0
# HELP ferry_progress_lsn LSN of the newest progress record Kafka acknowledged.
# TYPE ferry_progress_lsn gauge
ferry_progress_lsn 0
# HELP ferry_progress_write_errors_total Progress records Kafka failed.
# TYPE ferry_progress_write_errors_total counter
ferry_progress_write_errors_total 0
# HELP ferry_progress_failing 1 while progress records fail (the slot is not confirmed).
# TYPE ferry_progress_failing gauge
ferry_progress_failing 0
# HELP ferry_progress_topic_flawed 1 when the progress topic's configuration deletes progress records or lets them pile up.
# TYPE ferry_progress_topic_flawed gauge
ferry_progress_topic_flawed 1
# HELP ferry_kafka_transactions_committed_total Exactly-once mode: Kafka transactions committed.
# TYPE ferry_kafka_transactions_committed_total counter
ferry_kafka_transactions_committed_total 2
# HELP ferry_kafka_transactions_aborted_total Exactly-once mode: Kafka transactions aborted.
# TYPE ferry_kafka_transactions_aborted_total counter
ferry_kafka_transactions_aborted_total 1
# HELP ferry_kafka_transaction_commit_seconds Exactly-once mode: seconds from asking a Kafka transaction's commit to its acknowledgement.
# TYPE ferry_kafka_transaction_commit_seconds histogram
ferry_kafka_transaction_commit_seconds_bucket{le="0.001"} 0
ferry_kafka_transaction_commit_seconds_bucket{le="0.0025"} 0
ferry_kafka_transaction_commit_seconds_bucket{le="0.005"} 0
ferry_kafka_transaction_commit_seconds_bucket{le="0.0075"} 0
ferry_kafka_transaction_commit_seconds_bucket{le="0.01"} 0
ferry_kafka_transaction_commit_seconds_bucket{le="0.015"} 0
ferry_kafka_transaction_commit_seconds_bucket{le="0.025"} 0
ferry_kafka_transaction_commit_seconds_bucket{le="0.05"} 0
ferry_kafka_transaction_commit_seconds_bucket{le="0.1"} 1
ferry_kafka_transaction_commit_seconds_bucket{le="0.25"} 1
ferry_kafka_transaction_commit_seconds_bucket{le="0.5"} 1
ferry_kafka_transaction_commit_seconds_bucket{le="1"} 1
ferry_kafka_transaction_commit_seconds_bucket{le="2.5"} 2
ferry_kafka_transaction_commit_seconds_bucket{le="5"} 2
ferry_kafka_transaction_commit_seconds_bucket{le="10"} 2
ferry_kafka_transaction_commit_seconds_bucket{le="30"} 2
ferry_kafka_transaction_commit_seconds_bucket{le="60"} 2
ferry_kafka_transaction_commit_seconds_bucket{le="+Inf"} 2
ferry_kafka_transaction_commit_seconds_sum 2.0625
ferry_kafka_transaction_commit_seconds_count 2
"#;

#[test]
fn renders_the_exposition_format_exactly() {
    let m = Metrics::new();
    m.streaming.set_flag(true);
    m.records_produced.add(3);
    m.bytes_produced.add(300);
    m.in_flight_records.set(2);
    m.in_flight_bytes.add(250);
    m.in_flight_bytes.sub(50);
    m.transactions_received.add(2);
    m.transactions_confirmed.inc();
    m.received_lsn.set(0x1_0000_0064);
    m.confirmed_lsn.set(0x1_0000_0028);
    m.set_server_wal_lsn(0x1_0000_0028 + 1000);
    // Binary-exact values, so the sum prints exactly.
    m.observe_replication_lag(0.003_906_25);
    m.observe_replication_lag(0.5);
    m.observe_replication_lag(120.0);
    m.rows_dead_lettered.inc();
    m.routing_errors.inc(RoutingErrorReason::PayloadTooLarge);
    m.outbox_rows.set_tables([
        "public.outbox".to_string(),
        "\"Billing\".events".to_string(),
    ]);
    m.outbox_rows.add(0, RowOutcome::Routed, 2);
    m.outbox_rows.add(0, RowOutcome::DeadLettered, 1);
    m.outbox_rows.add(1, RowOutcome::Skipped, 1);
    // A table never named is not counted (and does not panic).
    m.outbox_rows.add(2, RowOutcome::Failed, 1);
    assert_eq!(m.outbox_rows.get(0, RowOutcome::Routed), 2);
    m.trace_context_malformed.inc(TraceProblem::VersionFf);
    m.status_updates_sent.add(7);
    m.reconnects.inc(Component::Kafka);
    m.reconnects.inc(Component::Kafka);
    m.topics_missing
        .set(vec![crate::telemetry::metrics::MissingTopic {
            topic: "orders".into(),
            records_waiting: 4,
        }]);

    m.progress_topic_flawed.set(1);
    m.kafka_transactions_committed.add(2);
    m.kafka_transactions_aborted.inc();
    // Binary-exact values, so the sum prints exactly.
    m.kafka_transaction_commit.observe(0.0625);
    m.kafka_transaction_commit.observe(2.0);
    use crate::telemetry::brokers::{Broker, BrokerView};
    m.kafka_brokers.set(BrokerView {
        brokers: vec![
            Broker {
                name: "a:9092/1".into(),
                state: "UP".into(),
            },
            Broker {
                name: "b:9092/2".into(),
                state: "TRY_CONNECT".into(),
            },
        ],
        none_up_since: None,
    });
    // The oldest record in flight was handed over 2.5 s ago and committed 200 s ago: the lag
    // now is 200 s, more than the latest observation (120 s).
    let now = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let commit = 1_700_000_000_000_000;
    m.in_flight_oldest
        .set(Some((now - std::time::Duration::from_millis(2500), commit)));

    let mut out = String::new();
    m.render_registry_at(&mut out, now, commit + 200_000_000);
    let expected = GOLDEN.replace("VERSION", env!("CARGO_PKG_VERSION"));
    assert_eq!(out, expected, "rendered:\n{out}");
}

#[test]
fn a_fresh_registry_renders_every_metric_at_zero() {
    let mut out = String::new();
    Metrics::new().render_registry(&mut out);
    for spec in SPEC {
        let name = spec.name;
        assert!(
            out.contains(&format!("# TYPE {name} {}\n", spec.kind.as_str())),
            "{name} missing"
        );
    }
    let samples: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    for line in samples {
        let value = line.rsplit(' ').next().unwrap();
        let expected = if line.starts_with(BUILD_INFO) {
            "1"
        } else {
            "0"
        };
        assert_eq!(value, expected, "{line}");
    }
}

#[test]
fn every_metric_is_in_the_spec_table() {
    let doc = include_str!("metrics.rs");
    let table: Vec<&str> = doc.lines().filter(|l| l.starts_with("//! | `")).collect();
    assert_eq!(table.len(), SPEC.len(), "one table row per metric");
    for (row, spec) in table.iter().zip(SPEC) {
        let (name, kind) = (spec.name, spec.kind.as_str());
        let want = format!("//! | `{name}` | {kind} |");
        assert!(row.starts_with(&want), "row {row:?} should document {name}");
    }
}

#[test]
fn names_and_help_follow_the_convention() {
    for spec in SPEC {
        let name = spec.name;
        assert!(name.starts_with("ferry_"), "{name}");
        let charset = name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
        assert!(charset, "{name}");
        let is_counter = spec.kind == Kind::Counter;
        assert_eq!(
            is_counter,
            name.ends_with("_total"),
            "{name}: _total iff counter"
        );
        assert!(
            !spec.help.contains(['\\', '\n']),
            "{name}: HELP needs no escaping"
        );
    }
    let mut sorted: Vec<&str> = SPEC.iter().map(|s| s.name).collect();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), SPEC.len(), "names are unique");
}

fn buckets(h: &Histogram) -> Vec<u64> {
    h.cumulative().into_iter().map(|(_, n)| n).collect()
}

#[test]
fn histogram_bounds_are_inclusive() {
    static BOUNDS: [f64; 3] = [1.0, 2.0, 4.0];
    let h = Histogram::new(&BOUNDS);
    h.observe(1.0); // le="1"
    h.observe(1.000_001); // le="2"
    h.observe(2.0); // le="2"
    h.observe(4.0); // le="4"
    h.observe(4.5); // +Inf only
    assert_eq!(buckets(&h), [1, 3, 4, 5]);
    assert_eq!(h.count(), 5);
    assert_eq!(h.cumulative().last().unwrap().0, f64::INFINITY);
}

#[test]
fn histogram_drops_non_finite_and_clamps_negative_values() {
    static BOUNDS: [f64; 2] = [0.5, 1.0];
    let h = Histogram::new(&BOUNDS);
    h.observe(f64::NAN);
    h.observe(f64::INFINITY);
    h.observe(f64::NEG_INFINITY);
    assert_eq!(h.count(), 0);
    h.observe(-3.0);
    assert_eq!(buckets(&h), [1, 1, 1]);
    assert_eq!(h.sum(), 0.0);
    h.observe(0.75);
    h.observe(0.25);
    assert_eq!(buckets(&h), [2, 3, 3]);
    assert_eq!(h.sum(), 1.0);
}

#[test]
fn replication_lag_buckets_span_a_millisecond_to_a_minute() {
    assert_eq!(REPLICATION_LAG_BUCKETS.first(), Some(&0.001));
    assert_eq!(REPLICATION_LAG_BUCKETS.last(), Some(&60.0));
    assert!(REPLICATION_LAG_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    let m = Metrics::new();
    for ms in [
        0u64, 1, 2, 3, 6, 8, 12, 20, 40, 90, 200, 400, 900, 2000, 4000, 9000, 20_000, 60_000,
        61_000,
    ] {
        m.observe_replication_lag(Duration::from_millis(ms).as_secs_f64());
    }
    // Exactly one observation per bucket, the last past every bound; 0 and 1 ms share le="0.001".
    let got = buckets(&m.replication_lag);
    let want: Vec<u64> = (2..=19).collect();
    assert_eq!(got, want);
}

#[test]
fn gauges_saturate_and_flags_are_zero_or_one() {
    let g = Gauge::default();
    g.add(3);
    g.sub(5);
    assert_eq!(g.get(), 0);
    g.set_flag(true);
    assert_eq!(g.get(), 1);
    g.set_flag(false);
    assert_eq!(g.get(), 0);
    let f = FloatGauge::default();
    f.set(0.25);
    assert_eq!(f.get(), 0.25);
}

#[test]
fn stamped_gauge_moves_its_stamp_only_when_the_value_rises() {
    let g = StampedGauge::new();
    let born = g.last_raised();
    g.set(0);
    assert_eq!(g.last_raised(), born, "no rise, no stamp");
    let before = Instant::now();
    g.set(10);
    let raised = g.last_raised();
    assert!(raised >= before && raised <= Instant::now());
    g.set(10);
    g.set(5);
    assert_eq!(
        g.last_raised(),
        raised,
        "equal or lower values keep the stamp"
    );
    assert_eq!(g.get(), 5);
}

#[test]
fn wal_lag_saturates_when_the_confirmed_lsn_is_ahead() {
    let m = Metrics::new();
    m.confirmed_lsn.set(500);
    m.set_server_wal_lsn(400);
    assert_eq!(m.wal_lag_bytes.get(), 0);
    m.set_server_wal_lsn(1500);
    assert_eq!(m.wal_lag_bytes.get(), 1000);
}

#[test]
fn label_values_are_escaped() {
    assert_eq!(Escaped("a\"b\\c\nd").to_string(), "a\\\"b\\\\c\\nd");
    assert_eq!(Float(f64::INFINITY).to_string(), "+Inf");
    assert_eq!(Float(f64::NEG_INFINITY).to_string(), "-Inf");
    assert_eq!(Float(f64::NAN).to_string(), "NaN");
    assert_eq!(Float(0.0025).to_string(), "0.0025");
    assert_eq!(Float(60.0).to_string(), "60");
}

#[test]
fn label_sets_index_their_own_position() {
    for (i, c) in Component::ALL.iter().enumerate() {
        assert_eq!(c.index(), i);
    }
    for (i, r) in RoutingErrorReason::ALL.iter().enumerate() {
        assert_eq!(r.index(), i);
    }
}

#[test]
fn counts_added_from_elsewhere_render_as_if_observed_here() {
    let observed = Histogram::new(&REPLICATION_LAG_BUCKETS);
    for v in [0.0005, 0.004, 0.004, 0.07, 100.0] {
        observed.observe(v);
    }
    let added = Histogram::new(&REPLICATION_LAG_BUCKETS);
    let mut counts = vec![0u64; REPLICATION_LAG_BUCKETS.len() + 1];
    let bucket = |le: f64| {
        REPLICATION_LAG_BUCKETS
            .iter()
            .position(|&b| b == le)
            .unwrap()
    };
    counts[bucket(0.001)] = 1;
    counts[bucket(0.005)] = 2;
    counts[bucket(0.1)] = 1;
    counts[REPLICATION_LAG_BUCKETS.len()] = 1; // +Inf
    added.add(&counts, 0.0005 + 0.004 + 0.004 + 0.07 + 100.0);
    assert_eq!(added.cumulative(), observed.cumulative());
    assert_eq!(added.count(), 5);
    assert!((added.sum() - observed.sum()).abs() < 1e-9);
}

#[test]
fn the_readers_source_delay_buckets_are_the_histograms() {
    let reader = ferry_wal::conn::SOURCE_DELAY_BOUNDS_MICROS;
    assert_eq!(reader.len(), REPLICATION_LAG_BUCKETS.len());
    for (micros, secs) in reader.iter().zip(REPLICATION_LAG_BUCKETS) {
        assert_eq!(*micros as f64 / 1e6, secs, "{micros} µs");
    }
}
