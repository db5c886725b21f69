//! The metrics registry of one Ferry pipeline, rendered in the Prometheus text format.
//!
//! Every metric is a field of [`Metrics`], updated with plain atomics on the hot path (no locks, no
//! allocation, no map lookups) and rendered by [`Metrics::render`] in the Prometheus text exposition
//! format 0.0.4. There is one pipeline per process, so no metric carries a pipeline or slot label;
//! the only labels are closed enums ([`Component`], [`RoutingErrorReason`]) and the build version.
//! Every labelled series is rendered from the start, at zero, so rates work from the first scrape.
//!
//! # The metrics (this table is the telemetry spec)
//!
//! | Name | Type | Labels | Meaning |
//! |------|------|--------|---------|
//! | `ferry_build_info` | gauge | `version` | Always 1; the label carries the crate version. |
//! | `ferry_streaming` | gauge | | 1 while streaming from the replication slot, else 0. |
//! | `ferry_standby` | gauge | | 1 while standing by because another instance holds the slot. |
//! | `ferry_records_produced_total` | counter | | Records Kafka acknowledged (successful delivery reports). |
//! | `ferry_bytes_produced_total` | counter | | Key + value + header bytes of the records Kafka acknowledged. |
//! | `ferry_delivery_errors_total` | counter | | Failed delivery reports (each freezes the checkpoint). |
//! | `ferry_in_flight_records` | gauge | | Records handed to the producer and not yet acknowledged. |
//! | `ferry_in_flight_bytes` | gauge | | Bytes of those records. |
//! | `ferry_in_flight_oldest_age_seconds` | gauge | | Seconds since the oldest record in flight was handed to the producer (0 when none is): how long records have waited for Kafka. |
//! | `ferry_transactions_received_total` | counter | | Outbox transactions assembled from the slot (commit messages). |
//! | `ferry_transactions_confirmed_total` | counter | | Transactions whose `end_lsn` was confirmed to the server. |
//! | `ferry_received_lsn` | gauge | | Highest WAL position received from the server, as a number. |
//! | `ferry_confirmed_lsn` | gauge | | Last `flush_lsn` reported to the server, as a number. |
//! | `ferry_server_wal_lsn` | gauge | | The server's `pg_current_wal_lsn()` at the last poll, as a number. |
//! | `ferry_wal_lag_bytes` | gauge | | `pg_current_wal_lsn()` minus the confirmed LSN, at the last poll. |
//! | `ferry_replication_lag_seconds` | histogram | | Commit time in Postgres to Kafka acknowledgement, per record (each acknowledged record is one observation). |
//! | `ferry_replication_lag_latest_seconds` | gauge | | The lag now: the latest observation of that histogram, or, when it is larger, the time since the commit of the oldest record still in flight, so it grows while Kafka acknowledges nothing. |
//! | `ferry_source_delay_seconds` | histogram | | Per transaction the server sends: from its commit time to the moment the walsender sent it (the XLogData's `server_time`), both from the server's clock (unless decoding runs on a standby, whose clock sends). It holds the commit's WAL flush, logical decoding and the walsender's wake-up and scheduling, but also every wait for Ferry: a transaction committed while no session streamed (a restart, a takeover) counts that time, and while Ferry holds back (its in-flight window full because Kafka is slow) the walsender waits on its socket and what it sends next counts the wait. So it is PostgreSQL's share of the lag only while Ferry keeps up: with the lag high, this high and `ferry_in_flight_oldest_age_seconds` low, look at the database server. |
//! | `ferry_rows_skipped_total` | counter | | Outbox rows skipped by policy (not produced). |
//! | `ferry_rows_dead_lettered_total` | counter | | Outbox rows sent to the dead-letter topic. |
//! | `ferry_routing_errors_total` | counter | `reason` | Rows the router rejected; `reason` is one of [`RoutingErrorReason`]. |
//! | `ferry_outbox_rows_total` | counter | `table`, `outcome` | Outbox rows read from each table (`schema.table`), by what came of them: `routed`, `dead_lettered`, `skipped`, `failed` (the session stopped at it). Every configured table has its series from the start, so a table that stays at 0 is visible. |
//! | `ferry_trace_context_malformed_total` | counter | `problem` | Records sent without their malformed trace context (`outbox.tracing_column`); `problem` is one of [`TraceProblem`]. |
//! | `ferry_status_updates_sent_total` | counter | | Standby status updates sent to the server. |
//! | `ferry_reconnects_total` | counter | `component` | `postgres`: sessions restarted after a transient error. `kafka`: sessions restarted after a transient Kafka error, plus broker connections librdkafka re-established after losing them (one for each time a broker is seen up again after it lost its connection; see [`super::brokers`]). |
//! | `ferry_kafka_brokers` | gauge | | Brokers librdkafka knows (learned from metadata; the configured bootstrap ones until then), from its latest statistics (every `statistics.interval.ms`, 1 s). |
//! | `ferry_kafka_brokers_up` | gauge | | Of those, the ones connected and answering (state `UP`, no request unanswered for 5 s). librdkafka connects only to the brokers it needs (the leaders Ferry writes to, one for metadata), so fewer than known is normal; 0 for 5 s makes `/readyz` answer 503. In exactly-once mode both are 0 between sessions (the producer ends with its session). |
//! | `ferry_topics_missing` | gauge | | Topics records were routed to that the brokers do not have (records wait for them). |
//! | `ferry_partitions_refusing` | gauge | | Partitions records wait for that refuse writes: fewer in-sync replicas than `min.insync.replicas` (`NOT_ENOUGH_REPLICAS`), or no leader. |
//! | `ferry_log_write_errors_total` | counter | | Log events dropped because stderr failed (closed pipe, full disk); process-wide. |
//! | `ferry_progress_lsn` | gauge | | LSN of the newest progress record Kafka acknowledged (the slot is never confirmed past it), as a number. |
//! | `ferry_progress_write_errors_total` | counter | | Progress records Kafka failed (confirming waits until one succeeds). |
//! | `ferry_progress_failing` | gauge | | 1 while the newest progress record failed and none succeeded since (the slot is not confirmed; WAL is retained). |
//! | `ferry_progress_topic_flawed` | gauge | | 1 when the progress topic's configuration, as the topic watch last read it (DescribeConfigs, every 10 minutes), deletes progress records (a slot dropped while its record is gone goes unnoticed) or lets them pile up (every restart reads them); 0 when it keeps each slot's newest record and little else. A read that fails leaves the last value; one never made (no DescribeConfigs on the topic: `ferry check` says so) leaves 0. The WARN says which flaw, with the command that mends it. |
//! | `ferry_kafka_transactions_committed_total` | counter | | Exactly-once mode: Kafka transactions committed (each carries a progress record). |
//! | `ferry_kafka_transactions_aborted_total` | counter | | Exactly-once mode: Kafka transactions aborted (a record failed; the session starts over from what Kafka holds). |
//! | `ferry_kafka_transaction_commit_seconds` | histogram | | Exactly-once mode: time from asking the commit to its acknowledgement, per committed transaction. |
//!
//! [`Metrics::render`] adds the standard `process_*` families (resident and virtual memory, CPU
//! seconds, open and maximum file descriptors, start time), read from `/proc` at scrape time; their
//! table is in [`super::process`].
//!
//! LSNs are exported as plain numbers (Prometheus samples are float64, exact up to 2^53 bytes =
//! 8 PiB of WAL); `X/X` belongs in logs. The replication lag histogram has buckets from 1 ms to 60 s
//! ([`REPLICATION_LAG_BUCKETS`]); observations that are NaN or infinite are dropped and negative
//! ones (clock skew between Postgres and Ferry) count as zero.
//!
//! Readiness (see the `http` module) reads [`Metrics::streaming`], [`Metrics::standby`],
//! [`Metrics::in_flight_records`], [`Metrics::in_flight_oldest`], [`Metrics::kafka_brokers`] and
//! [`Metrics::confirmed_lsn`]; the two [`StampedGauge`]s
//! remember when their value last rose, which is how "the confirmed LSN advanced recently" is known
//! without a second source of truth.

use std::fmt::{self, Write as _};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

pub const BUILD_INFO: &str = "ferry_build_info";
pub const STREAMING: &str = "ferry_streaming";
pub const STANDBY: &str = "ferry_standby";
pub const RECORDS_PRODUCED_TOTAL: &str = "ferry_records_produced_total";
pub const BYTES_PRODUCED_TOTAL: &str = "ferry_bytes_produced_total";
pub const DELIVERY_ERRORS_TOTAL: &str = "ferry_delivery_errors_total";
pub const IN_FLIGHT_RECORDS: &str = "ferry_in_flight_records";
pub const IN_FLIGHT_BYTES: &str = "ferry_in_flight_bytes";
pub const IN_FLIGHT_OLDEST_AGE_SECONDS: &str = "ferry_in_flight_oldest_age_seconds";
pub const TRANSACTIONS_RECEIVED_TOTAL: &str = "ferry_transactions_received_total";
pub const TRANSACTIONS_CONFIRMED_TOTAL: &str = "ferry_transactions_confirmed_total";
pub const RECEIVED_LSN: &str = "ferry_received_lsn";
pub const CONFIRMED_LSN: &str = "ferry_confirmed_lsn";
pub const SERVER_WAL_LSN: &str = "ferry_server_wal_lsn";
pub const WAL_LAG_BYTES: &str = "ferry_wal_lag_bytes";
pub const REPLICATION_LAG_SECONDS: &str = "ferry_replication_lag_seconds";
pub const REPLICATION_LAG_LATEST_SECONDS: &str = "ferry_replication_lag_latest_seconds";
pub const SOURCE_DELAY_SECONDS: &str = "ferry_source_delay_seconds";
pub const ROWS_SKIPPED_TOTAL: &str = "ferry_rows_skipped_total";
pub const ROWS_DEAD_LETTERED_TOTAL: &str = "ferry_rows_dead_lettered_total";
pub const ROUTING_ERRORS_TOTAL: &str = "ferry_routing_errors_total";
pub const OUTBOX_ROWS_TOTAL: &str = "ferry_outbox_rows_total";
pub const TRACE_CONTEXT_MALFORMED_TOTAL: &str = "ferry_trace_context_malformed_total";
pub const STATUS_UPDATES_SENT_TOTAL: &str = "ferry_status_updates_sent_total";
pub const RECONNECTS_TOTAL: &str = "ferry_reconnects_total";
pub const KAFKA_BROKERS: &str = "ferry_kafka_brokers";
pub const KAFKA_BROKERS_UP: &str = "ferry_kafka_brokers_up";
pub const TOPICS_MISSING: &str = "ferry_topics_missing";
pub const PARTITIONS_REFUSING: &str = "ferry_partitions_refusing";
pub const LOG_WRITE_ERRORS_TOTAL: &str = "ferry_log_write_errors_total";
pub const PROGRESS_LSN: &str = "ferry_progress_lsn";
pub const PROGRESS_WRITE_ERRORS_TOTAL: &str = "ferry_progress_write_errors_total";
pub const PROGRESS_FAILING: &str = "ferry_progress_failing";
pub const PROGRESS_TOPIC_FLAWED: &str = "ferry_progress_topic_flawed";
pub const KAFKA_TRANSACTIONS_COMMITTED_TOTAL: &str = "ferry_kafka_transactions_committed_total";
pub const KAFKA_TRANSACTIONS_ABORTED_TOTAL: &str = "ferry_kafka_transactions_aborted_total";
pub const KAFKA_TRANSACTION_COMMIT_SECONDS: &str = "ferry_kafka_transaction_commit_seconds";

/// Whether a metric is a counter, gauge or histogram (its `# TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric family: name, type and `# HELP` text.
#[derive(Debug, Clone, Copy)]
pub struct MetricSpec {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

const fn spec(name: &'static str, kind: Kind, help: &'static str) -> MetricSpec {
    MetricSpec { name, kind, help }
}

/// Every metric, in render order (the order of the table in the module docs).
#[rustfmt::skip]
pub const SPEC: [MetricSpec; 37] = {
    use Kind::{Counter as C, Gauge as G, Histogram as H};
    [
        spec(BUILD_INFO, G, "Build information; always 1."),
        spec(STREAMING, G, "1 while streaming from the replication slot."),
        spec(STANDBY, G, "1 while standing by because another instance holds the slot."),
        spec(RECORDS_PRODUCED_TOTAL, C, "Records Kafka acknowledged."),
        spec(BYTES_PRODUCED_TOTAL, C, "Key, value and header bytes of the records Kafka acknowledged."),
        spec(DELIVERY_ERRORS_TOTAL, C, "Failed delivery reports."),
        spec(IN_FLIGHT_RECORDS, G, "Records handed to the producer and not yet acknowledged."),
        spec(IN_FLIGHT_BYTES, G, "Bytes of the records in flight."),
        spec(IN_FLIGHT_OLDEST_AGE_SECONDS, G, "Seconds since the oldest record in flight was handed to the producer (0 when none is)."),
        spec(TRANSACTIONS_RECEIVED_TOTAL, C, "Outbox transactions assembled from the replication slot."),
        spec(TRANSACTIONS_CONFIRMED_TOTAL, C, "Transactions whose end LSN was confirmed to the server."),
        spec(RECEIVED_LSN, G, "Highest WAL position received from the server."),
        spec(CONFIRMED_LSN, G, "Last flush LSN reported to the server."),
        spec(SERVER_WAL_LSN, G, "The server's current WAL position at the last poll."),
        spec(WAL_LAG_BYTES, G, "Server WAL position minus the confirmed LSN."),
        spec(REPLICATION_LAG_SECONDS, H, "Seconds from commit in Postgres to acknowledgement by Kafka, per record."),
        spec(REPLICATION_LAG_LATEST_SECONDS, G, "The replication lag now: the latest observation, or the age since commit of the oldest record in flight when larger."),
        spec(SOURCE_DELAY_SECONDS, H, "Seconds from commit in Postgres to the server sending the transaction, per transaction (the server's clock; includes any wait for Ferry to read)."),
        spec(ROWS_SKIPPED_TOTAL, C, "Outbox rows skipped by policy."),
        spec(ROWS_DEAD_LETTERED_TOTAL, C, "Outbox rows sent to the dead-letter topic."),
        spec(ROUTING_ERRORS_TOTAL, C, "Rows the router rejected, by reason."),
        spec(OUTBOX_ROWS_TOTAL, C, "Outbox rows read, by table and what came of them."),
        spec(TRACE_CONTEXT_MALFORMED_TOTAL, C, "Records sent without their malformed trace context, by problem."),
        spec(STATUS_UPDATES_SENT_TOTAL, C, "Standby status updates sent to the server."),
        spec(RECONNECTS_TOTAL, C, "Sessions restarted after transient errors, and Kafka broker connections re-established, by component."),
        spec(KAFKA_BROKERS, G, "Kafka brokers librdkafka knows, from its latest statistics."),
        spec(KAFKA_BROKERS_UP, G, "Kafka brokers connected and answering, from librdkafka's latest statistics."),
        spec(TOPICS_MISSING, G, "Topics records were routed to that the brokers do not have."),
        spec(PARTITIONS_REFUSING, G, "Partitions records wait for that refuse writes (too few in-sync replicas, no leader)."),
        spec(LOG_WRITE_ERRORS_TOTAL, C, "Log events dropped because the log sink (stderr) failed."),
        spec(PROGRESS_LSN, G, "LSN of the newest progress record Kafka acknowledged."),
        spec(PROGRESS_WRITE_ERRORS_TOTAL, C, "Progress records Kafka failed."),
        spec(PROGRESS_FAILING, G, "1 while progress records fail (the slot is not confirmed)."),
        spec(PROGRESS_TOPIC_FLAWED, G, "1 when the progress topic's configuration deletes progress records or lets them pile up."),
        spec(KAFKA_TRANSACTIONS_COMMITTED_TOTAL, C, "Exactly-once mode: Kafka transactions committed."),
        spec(KAFKA_TRANSACTIONS_ABORTED_TOTAL, C, "Exactly-once mode: Kafka transactions aborted."),
        spec(KAFKA_TRANSACTION_COMMIT_SECONDS, H, "Exactly-once mode: seconds from asking a Kafka transaction's commit to its acknowledgement."),
    ]
};

/// Upper bounds (inclusive, seconds) of the replication lag histogram (and of the transaction
/// commit histogram); `+Inf` is implicit.
pub const REPLICATION_LAG_BUCKETS: [f64; 17] = [
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
];

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// A counter at zero, usable in a `static`.
    pub const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A non-negative integer that goes up and down; subtraction saturates at zero.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    pub fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }
    /// Sets 1 for `true`, 0 for `false`.
    pub fn set_flag(&self, on: bool) {
        self.set(u64::from(on));
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    pub fn sub(&self, n: u64) {
        // Never fails: the closure always returns Some.
        let _ = self
            .0
            .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(n)));
    }
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A gauge holding a float (seconds).
#[derive(Debug, Default)]
pub struct FloatGauge(AtomicU64);

impl FloatGauge {
    pub fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Relaxed);
    }
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Relaxed))
    }
}

/// An integer gauge that remembers when its value last rose (or, before that, when it was made).
#[derive(Debug)]
pub struct StampedGauge {
    value: AtomicU64,
    epoch: Instant,
    /// Nanoseconds after `epoch` of the last rise.
    raised_ns: AtomicU64,
}

impl StampedGauge {
    fn new() -> Self {
        StampedGauge {
            value: AtomicU64::new(0),
            epoch: Instant::now(),
            raised_ns: AtomicU64::new(0),
        }
    }
    pub fn set(&self, v: u64) {
        self.set_at(v, Instant::now());
    }
    /// [`StampedGauge::set`] with the clock read by the caller (tests use it to place rises).
    pub(crate) fn set_at(&self, v: u64, now: Instant) {
        let prev = self.value.swap(v, Relaxed);
        if v > prev {
            let ns = now.saturating_duration_since(self.epoch).as_nanos();
            self.raised_ns
                .fetch_max(u64::try_from(ns).unwrap_or(u64::MAX), Relaxed);
        }
    }
    /// Sets 1 for `true`, 0 for `false`; going to 1 counts as a rise.
    pub fn set_flag(&self, on: bool) {
        self.set(u64::from(on));
    }
    pub fn get(&self) -> u64 {
        self.value.load(Relaxed)
    }
    /// When the value last rose; the gauge's creation time if it never did.
    pub fn last_raised(&self) -> Instant {
        self.epoch + std::time::Duration::from_nanos(self.raised_ns.load(Relaxed))
    }
}

/// A histogram over fixed bucket bounds. Bucket counts are stored per bucket (not cumulative) and
/// summed when rendered; `_count` is the sum of the buckets, so it always equals the `+Inf` bucket.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One slot per bound plus the `+Inf` overflow slot.
    buckets: Box<[AtomicU64]>,
    sum_bits: AtomicU64,
}

impl Histogram {
    /// `bounds` must be finite and strictly increasing.
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        let buckets = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Histogram {
            bounds,
            buckets,
            sum_bits: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Records one value. NaN and infinities are dropped; negative values count as zero.
    pub fn observe(&self, v: f64) {
        if !v.is_finite() {
            return;
        }
        let v = v.max(0.0);
        // `le` is inclusive: the first bound >= v; past the last bound is the +Inf slot.
        let slot = self.bounds.partition_point(|&b| b < v);
        self.buckets[slot].fetch_add(1, Relaxed);
        let _ = self.sum_bits.fetch_update(Relaxed, Relaxed, |bits| {
            Some((f64::from_bits(bits) + v).to_bits())
        });
    }

    /// `(upper bound, cumulative count)` per bucket, ending with `(+Inf, total count)`.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0u64;
        let bounds = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY));
        bounds
            .zip(self.buckets.iter())
            .map(|(b, n)| {
                total = total.saturating_add(n.load(Relaxed));
                (b, total)
            })
            .collect()
    }

    pub fn sum(&self) -> f64 {
        f64::from_bits(self.sum_bits.load(Relaxed))
    }

    /// Adds observations counted elsewhere over the same bounds: `counts[i]` more in bucket `i`
    /// (per bucket, not cumulative, the last one past every bound), summing to `sum`.
    pub fn add(&self, counts: &[u64], sum: f64) {
        debug_assert_eq!(counts.len(), self.buckets.len());
        for (b, &n) in self.buckets.iter().zip(counts) {
            if n > 0 {
                b.fetch_add(n, Relaxed);
            }
        }
        let _ = self.sum_bits.fetch_update(Relaxed, Relaxed, |bits| {
            Some((f64::from_bits(bits) + sum).to_bits())
        });
    }

    pub fn count(&self) -> u64 {
        self.buckets
            .iter()
            .map(|n| n.load(Relaxed))
            .fold(0, u64::saturating_add)
    }
}

/// A closed set of label values for one label key.
pub trait LabelSet: Copy + 'static {
    const KEY: &'static str;
    const ALL: &'static [Self];
    /// Position in [`LabelSet::ALL`].
    fn index(self) -> usize;
    fn value(self) -> &'static str;
}

/// One counter per value of a closed label set.
#[derive(Debug)]
pub struct CounterVec<L> {
    counters: Box<[Counter]>,
    _labels: PhantomData<L>,
}

impl<L: LabelSet> CounterVec<L> {
    fn new() -> Self {
        CounterVec {
            counters: L::ALL.iter().map(|_| Counter::default()).collect(),
            _labels: PhantomData,
        }
    }
    pub fn inc(&self, label: L) {
        self.counters[label.index()].inc();
    }
    pub fn add(&self, label: L, n: u64) {
        self.counters[label.index()].add(n);
    }
    pub fn get(&self, label: L) -> u64 {
        self.counters[label.index()].get()
    }
}

/// What reconnected: the `component` label of `ferry_reconnects_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Postgres,
    Kafka,
}

impl LabelSet for Component {
    const KEY: &'static str = "component";
    const ALL: &'static [Self] = &[Component::Postgres, Component::Kafka];
    fn index(self) -> usize {
        self as usize
    }
    fn value(self) -> &'static str {
        match self {
            Component::Postgres => "postgres",
            Component::Kafka => "kafka",
        }
    }
}

/// Why the router rejected a row: the `reason` label of `ferry_routing_errors_total`. The
/// relay core's closed set of reasons, labelled with the router's own error codes
/// (`ferry_router::RouteErrorReason::code`), so a log line, a dead-letter header and this label
/// name a reason the same way.
pub use ferry_core::RouteErrorKind as RoutingErrorReason;

impl LabelSet for RoutingErrorReason {
    const KEY: &'static str = "reason";
    const ALL: &'static [Self] = &[
        RoutingErrorReason::MissingColumn,
        RoutingErrorReason::NullValue,
        RoutingErrorReason::NullPayload,
        RoutingErrorReason::InvalidValue,
        RoutingErrorReason::InvalidTopic,
        RoutingErrorReason::PayloadTooLarge,
        RoutingErrorReason::InvalidMessage,
    ];
    fn index(self) -> usize {
        self as usize
    }
    fn value(self) -> &'static str {
        match self {
            RoutingErrorReason::MissingColumn => "missing_column",
            RoutingErrorReason::NullValue => "null_value",
            RoutingErrorReason::NullPayload => "null_payload",
            RoutingErrorReason::InvalidValue => "invalid_value",
            RoutingErrorReason::InvalidTopic => "invalid_topic",
            RoutingErrorReason::PayloadTooLarge => "payload_too_large",
            RoutingErrorReason::InvalidMessage => "invalid_message",
        }
    }
}

/// What was wrong with a record's trace context: the `problem` label of
/// `ferry_trace_context_malformed_total`, labelled with the router's own codes
/// ([`TraceProblem::code`]).
pub use ferry_router::TraceProblem;

impl LabelSet for TraceProblem {
    const KEY: &'static str = "problem";
    const ALL: &'static [Self] = &[
        TraceProblem::NotText,
        TraceProblem::NoTraceparent,
        TraceProblem::Length,
        TraceProblem::Layout,
        TraceProblem::NotLowercaseHex,
        TraceProblem::VersionFf,
        TraceProblem::ZeroTraceId,
        TraceProblem::ZeroParentId,
        TraceProblem::InvalidTracestate,
    ];
    fn index(self) -> usize {
        Self::ALL.iter().position(|p| *p == self).unwrap_or(0)
    }
    fn value(self) -> &'static str {
        self.code()
    }
}

/// What came of an outbox row: the `outcome` label of `ferry_outbox_rows_total`.
pub use ferry_core::RowOutcome;

/// The `outcome` label of each of [`RowOutcome::ALL`].
const OUTCOMES: [&str; 4] = ["routed", "dead_lettered", "skipped", "failed"];

/// A counter per outbox table and [`RowOutcome`]; the tables are known once the configuration is.
#[derive(Debug, Default)]
pub struct TableRows(std::sync::OnceLock<Vec<(String, [Counter; 4])>>);

impl TableRows {
    /// Names the tables (`schema.table`, in the configuration's order); only the first call counts.
    pub fn set_tables(&self, tables: impl IntoIterator<Item = String>) {
        let _ = self.0.set(
            tables
                .into_iter()
                .map(|t| (t, std::array::from_fn(|_| Counter::default())))
                .collect(),
        );
    }

    /// `n` rows of the `table`-th table; a table never named is not counted.
    pub fn add(&self, table: usize, outcome: RowOutcome, n: u64) {
        if let Some((_, counters)) = self.0.get().and_then(|t| t.get(table)) {
            counters[outcome as usize].add(n);
        }
    }

    /// The `table`-th table's count of `outcome`.
    pub fn get(&self, table: usize, outcome: RowOutcome) -> u64 {
        self.0
            .get()
            .and_then(|t| t.get(table))
            .map_or(0, |(_, c)| c[outcome as usize].get())
    }

    fn series(&self) -> Vec<(&str, &'static str, u64)> {
        let Some(tables) = self.0.get() else {
            return Vec::new();
        };
        tables
            .iter()
            .flat_map(|(t, counters)| {
                OUTCOMES
                    .iter()
                    .zip(counters)
                    .map(move |(label, c)| (t.as_str(), *label, c.get()))
            })
            .collect()
    }
}

/// The registry: one field per metric of the table in the module docs.
#[derive(Debug)]
pub struct Metrics {
    pub streaming: StampedGauge,
    pub standby: Gauge,
    pub records_produced: Counter,
    pub bytes_produced: Counter,
    pub delivery_errors: Counter,
    pub in_flight_records: Gauge,
    pub in_flight_bytes: Gauge,
    /// The oldest record in flight (`ferry_in_flight_oldest_age_seconds`, and the pending part
    /// of `ferry_replication_lag_latest_seconds`).
    pub in_flight_oldest: OldestInFlight,
    pub transactions_received: Counter,
    pub transactions_confirmed: Counter,
    pub received_lsn: Gauge,
    pub confirmed_lsn: StampedGauge,
    pub server_wal_lsn: Gauge,
    pub wal_lag_bytes: Gauge,
    pub replication_lag: Histogram,
    pub replication_lag_latest: FloatGauge,
    /// Filled from the reader's [`ferry_wal::conn::SourceDelay`] ([`Histogram::add`]).
    pub source_delay: Histogram,
    pub rows_skipped: Counter,
    pub rows_dead_lettered: Counter,
    pub routing_errors: CounterVec<RoutingErrorReason>,
    /// `ferry_outbox_rows_total{table, outcome}`: its tables are set once, before the pipeline
    /// starts ([`TableRows::set_tables`]).
    pub outbox_rows: TableRows,
    pub trace_context_malformed: CounterVec<TraceProblem>,
    pub status_updates_sent: Counter,
    pub reconnects: CounterVec<Component>,
    /// The brokers as librdkafka's latest statistics show them (`ferry_kafka_brokers`,
    /// `ferry_kafka_brokers_up`; `/readyz` names them when none is up).
    pub kafka_brokers: KafkaBrokers,
    /// Why no Kafka broker can be used, while `run` probes them before a session
    /// (`kafka_access::probe`); `/readyz` says it.
    pub kafka_unusable: Reason,
    /// The topics records wait for, as the topic watch last found them (`ferry_topics_missing`
    /// is their number; `/readyz` names them).
    pub topics_missing: MissingTopics,
    /// The partitions records wait for that refuse writes, as the topic watch last found them
    /// (`ferry_partitions_refusing` is their number; `/readyz` names them and why).
    pub partitions_refusing: RefusingPartitions,
    /// When it last rose is when a progress record was last acknowledged.
    pub progress_lsn: StampedGauge,
    pub progress_write_errors: Counter,
    pub progress_failing: Gauge,
    /// Set by the topic watch when it judges the progress topic's configuration.
    pub progress_topic_flawed: Gauge,
    pub kafka_transactions_committed: Counter,
    pub kafka_transactions_aborted: Counter,
    pub kafka_transaction_commit: Histogram,
}

/// A topic the brokers do not have, and how many records wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingTopic {
    pub topic: String,
    pub records_waiting: u64,
}

/// A partition that refuses writes (records routed to it wait), and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusingPartition {
    pub topic: String,
    pub partition: i32,
    pub reason: Refusal,
}

/// Why a partition refuses Ferry's writes (`acks=all`), as its metadata shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No leader: none of its replicas is in sync and alive (unclean election is off).
    NoLeader,
    /// Fewer replicas in sync than the topic's `min.insync.replicas`: the leader answers every
    /// `acks=all` write with `NOT_ENOUGH_REPLICAS`, which the client retries (it never fails the
    /// record), so the records wait, unconfirmed, until a replica catches up.
    NotEnoughReplicas {
        in_sync: usize,
        replicas: usize,
        min_insync: i32,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NoLeader => f.write_str("LEADER_NOT_AVAILABLE: no in-sync replica to lead it"),
            Refusal::NotEnoughReplicas {
                in_sync,
                replicas,
                min_insync,
            } => write!(
                f,
                "NOT_ENOUGH_REPLICAS: {in_sync} of {replicas} replicas in sync, below \
                 min.insync.replicas = {min_insync}"
            ),
        }
    }
}

impl std::fmt::Display for RefusingPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} [{}] ({})", self.topic, self.partition, self.reason)
    }
}

/// A reason that holds until cleared (written once per attempt at most).
#[derive(Debug, Default)]
pub struct Reason(std::sync::Mutex<Option<String>>);

impl Reason {
    pub fn set(&self, reason: Option<String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = reason;
    }
    pub fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The refusing partitions (written by the topic watch every few seconds at most).
#[derive(Debug, Default)]
pub struct RefusingPartitions(std::sync::Mutex<Vec<RefusingPartition>>);

impl RefusingPartitions {
    pub fn set(&self, partitions: Vec<RefusingPartition>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = partitions;
    }
    pub fn get(&self) -> Vec<RefusingPartition> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The oldest record in flight, as the session last published it: when it was handed to the
/// producer and its transaction's commit time. Atomics: published after every wake-up of the
/// session loop.
#[derive(Debug)]
pub struct OldestInFlight {
    epoch: Instant,
    /// Nanoseconds after `epoch` it was handed over; `u64::MAX`: nothing in flight.
    handed_ns: AtomicU64,
    commit_unix_micros: std::sync::atomic::AtomicI64,
}

impl OldestInFlight {
    fn new() -> Self {
        OldestInFlight {
            epoch: Instant::now(),
            handed_ns: AtomicU64::new(u64::MAX),
            commit_unix_micros: std::sync::atomic::AtomicI64::new(0),
        }
    }

    /// The oldest record in flight was handed over at `handed_at` and committed at
    /// `commit_unix_micros` (0 if unknown); `None`: nothing is in flight.
    pub fn set(&self, oldest: Option<(Instant, i64)>) {
        match oldest {
            Some((handed_at, commit)) => {
                let ns = handed_at.saturating_duration_since(self.epoch).as_nanos();
                self.commit_unix_micros.store(commit, Relaxed);
                self.handed_ns
                    .store(u64::try_from(ns).unwrap_or(u64::MAX - 1), Relaxed);
            }
            None => self.handed_ns.store(u64::MAX, Relaxed),
        }
    }

    /// How long the oldest record in flight has waited at `now`; `None` when none is in flight.
    pub fn age(&self, now: Instant) -> Option<std::time::Duration> {
        match self.handed_ns.load(Relaxed) {
            u64::MAX => None,
            ns => Some(
                now.saturating_duration_since(self.epoch + std::time::Duration::from_nanos(ns)),
            ),
        }
    }

    /// Its transaction's commit time, µs since the Unix epoch; `None` when none is in flight.
    pub fn commit_unix_micros(&self) -> Option<i64> {
        match self.handed_ns.load(Relaxed) {
            u64::MAX => None,
            _ => Some(self.commit_unix_micros.load(Relaxed)),
        }
    }
}

/// The brokers as librdkafka's latest statistics show them (written once per statistics
/// interval, read per `/readyz` and scrape).
#[derive(Debug, Default)]
pub struct KafkaBrokers(std::sync::Mutex<super::brokers::BrokerView>);

impl KafkaBrokers {
    pub fn set(&self, view: super::brokers::BrokerView) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = view;
    }
    pub fn get(&self) -> super::brokers::BrokerView {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The wall clock, µs since the Unix epoch (0 before it).
pub fn unix_micros_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The missing topics (a lock, not an atomic: written by the topic watch every few seconds at
/// most, read per `/readyz` and scrape).
#[derive(Debug, Default)]
pub struct MissingTopics(std::sync::Mutex<Vec<MissingTopic>>);

impl MissingTopics {
    pub fn set(&self, topics: Vec<MissingTopic>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = topics;
    }
    pub fn get(&self) -> Vec<MissingTopic> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Metrics {
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> Arc<Metrics> {
        Arc::new(Metrics {
            streaming: StampedGauge::new(),
            standby: Gauge::default(),
            records_produced: Counter::default(),
            bytes_produced: Counter::default(),
            delivery_errors: Counter::default(),
            in_flight_records: Gauge::default(),
            in_flight_bytes: Gauge::default(),
            in_flight_oldest: OldestInFlight::new(),
            transactions_received: Counter::default(),
            transactions_confirmed: Counter::default(),
            received_lsn: Gauge::default(),
            confirmed_lsn: StampedGauge::new(),
            server_wal_lsn: Gauge::default(),
            wal_lag_bytes: Gauge::default(),
            replication_lag: Histogram::new(&REPLICATION_LAG_BUCKETS),
            replication_lag_latest: FloatGauge::default(),
            source_delay: Histogram::new(&REPLICATION_LAG_BUCKETS),
            rows_skipped: Counter::default(),
            rows_dead_lettered: Counter::default(),
            routing_errors: CounterVec::new(),
            outbox_rows: TableRows::default(),
            trace_context_malformed: CounterVec::new(),
            status_updates_sent: Counter::default(),
            reconnects: CounterVec::new(),
            kafka_brokers: KafkaBrokers::default(),
            kafka_unusable: Reason::default(),
            topics_missing: MissingTopics::default(),
            partitions_refusing: RefusingPartitions::default(),
            progress_lsn: StampedGauge::new(),
            progress_write_errors: Counter::default(),
            progress_failing: Gauge::default(),
            progress_topic_flawed: Gauge::default(),
            kafka_transactions_committed: Counter::default(),
            kafka_transactions_aborted: Counter::default(),
            kafka_transaction_commit: Histogram::new(&REPLICATION_LAG_BUCKETS),
        })
    }

    /// Records one transaction's commit-to-acknowledgement lag in the histogram and the latest gauge.
    pub fn observe_replication_lag(&self, secs: f64) {
        self.replication_lag.observe(secs);
        if secs.is_finite() {
            self.replication_lag_latest.set(secs.max(0.0));
        }
    }

    /// Sets `ferry_server_wal_lsn`, and `ferry_wal_lag_bytes` from it and the confirmed LSN.
    pub fn set_server_wal_lsn(&self, server_wal_lsn: u64) {
        self.server_wal_lsn.set(server_wal_lsn);
        self.wal_lag_bytes
            .set(server_wal_lsn.saturating_sub(self.confirmed_lsn.get()));
    }

    /// Appends the registry, then the `process_*` families read now (see [`super::process`]), to
    /// `out` in the Prometheus text format 0.0.4: what `/metrics` serves.
    pub fn render(&self, out: &mut String) {
        self.render_registry(out);
        super::process::ProcessStats::read().render(out);
    }

    /// Appends the registry alone (the `ferry_*` families) in the Prometheus text format 0.0.4.
    pub fn render_registry(&self, out: &mut String) {
        self.render_registry_at(out, Instant::now(), unix_micros_now());
    }

    /// [`Metrics::render_registry`] with the clocks read by the caller (the ages are computed
    /// at these times).
    pub fn render_registry_at(&self, out: &mut String, now: Instant, now_unix_micros: i64) {
        for (spec, sample) in SPEC.iter().zip(self.samples(now, now_unix_micros)) {
            // Writing to a String cannot fail.
            let _ = render_family(out, spec, sample);
        }
    }

    /// The replication lag at `now_unix_micros`: the latest observation, or the time since the
    /// commit of the oldest record in flight if that is larger.
    pub fn replication_lag_now(&self, now_unix_micros: i64) -> f64 {
        let latest = self.replication_lag_latest.get();
        match self.in_flight_oldest.commit_unix_micros() {
            Some(commit) if commit > 0 => {
                latest.max((now_unix_micros - commit).max(0) as f64 / 1e6)
            }
            _ => latest,
        }
    }

    /// The current values, in [`SPEC`] order.
    fn samples(&self, now: Instant, now_unix_micros: i64) -> [Sample<'_>; 37] {
        let brokers = self.kafka_brokers.get();
        [
            Sample::Info,
            Sample::Int(self.streaming.get()),
            Sample::Int(self.standby.get()),
            Sample::Int(self.records_produced.get()),
            Sample::Int(self.bytes_produced.get()),
            Sample::Int(self.delivery_errors.get()),
            Sample::Int(self.in_flight_records.get()),
            Sample::Int(self.in_flight_bytes.get()),
            Sample::Float(
                self.in_flight_oldest
                    .age(now)
                    .map_or(0.0, |d| d.as_secs_f64()),
            ),
            Sample::Int(self.transactions_received.get()),
            Sample::Int(self.transactions_confirmed.get()),
            Sample::Int(self.received_lsn.get()),
            Sample::Int(self.confirmed_lsn.get()),
            Sample::Int(self.server_wal_lsn.get()),
            Sample::Int(self.wal_lag_bytes.get()),
            Sample::Histogram(&self.replication_lag),
            Sample::Float(self.replication_lag_now(now_unix_micros)),
            Sample::Histogram(&self.source_delay),
            Sample::Int(self.rows_skipped.get()),
            Sample::Int(self.rows_dead_lettered.get()),
            Sample::Labelled(labelled(&self.routing_errors)),
            Sample::Tables(self.outbox_rows.series()),
            Sample::Labelled(labelled(&self.trace_context_malformed)),
            Sample::Int(self.status_updates_sent.get()),
            Sample::Labelled(labelled(&self.reconnects)),
            Sample::Int(brokers.known() as u64),
            Sample::Int(brokers.up() as u64),
            Sample::Int(self.topics_missing.len() as u64),
            Sample::Int(self.partitions_refusing.len() as u64),
            Sample::Int(super::logging::write_errors()),
            Sample::Int(self.progress_lsn.get()),
            Sample::Int(self.progress_write_errors.get()),
            Sample::Int(self.progress_failing.get()),
            Sample::Int(self.progress_topic_flawed.get()),
            Sample::Int(self.kafka_transactions_committed.get()),
            Sample::Int(self.kafka_transactions_aborted.get()),
            Sample::Histogram(&self.kafka_transaction_commit),
        ]
    }
}

/// One family's value(s) at render time.
enum Sample<'a> {
    /// `ferry_build_info`: the version label, value 1.
    Info,
    Int(u64),
    Float(f64),
    Histogram(&'a Histogram),
    /// `(label key, label value, count)` per series.
    Labelled(Vec<(&'static str, &'static str, u64)>),
    /// `(table, outcome, count)` per series.
    Tables(Vec<(&'a str, &'static str, u64)>),
}

fn labelled<L: LabelSet>(v: &CounterVec<L>) -> Vec<(&'static str, &'static str, u64)> {
    L::ALL
        .iter()
        .map(|&l| (L::KEY, l.value(), v.get(l)))
        .collect()
}

fn render_family(out: &mut String, spec: &MetricSpec, sample: Sample<'_>) -> fmt::Result {
    let name = spec.name;
    writeln!(out, "# HELP {name} {}", spec.help)?;
    writeln!(out, "# TYPE {name} {}", spec.kind.as_str())?;
    match sample {
        Sample::Info => writeln!(
            out,
            "{name}{{version=\"{}\"}} 1",
            Escaped(env!("CARGO_PKG_VERSION"))
        ),
        Sample::Int(v) => writeln!(out, "{name} {v}"),
        Sample::Float(v) => writeln!(out, "{name} {}", Float(v)),
        Sample::Histogram(h) => {
            for (bound, n) in h.cumulative() {
                writeln!(out, "{name}_bucket{{le=\"{}\"}} {n}", Float(bound))?;
            }
            writeln!(out, "{name}_sum {}", Float(h.sum()))?;
            writeln!(out, "{name}_count {}", h.count())
        }
        Sample::Labelled(series) => {
            for (key, value, n) in series {
                writeln!(out, "{name}{{{key}=\"{}\"}} {n}", Escaped(value))?;
            }
            Ok(())
        }
        Sample::Tables(series) => {
            for (table, outcome, n) in series {
                writeln!(
                    out,
                    "{name}{{table=\"{}\",outcome=\"{outcome}\"}} {n}",
                    Escaped(table)
                )?;
            }
            Ok(())
        }
    }
}

/// A float as the exposition format spells it: `+Inf`, `-Inf`, `NaN`, else Rust's shortest
/// round-tripping decimal (never an exponent).
struct Float(f64);

impl fmt::Display for Float {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            v if v.is_nan() => f.write_str("NaN"),
            v if v == f64::INFINITY => f.write_str("+Inf"),
            v if v == f64::NEG_INFINITY => f.write_str("-Inf"),
            v => write!(f, "{v}"),
        }
    }
}

/// A label value with `\`, `"` and newline escaped.
struct Escaped<'a>(&'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '"' => f.write_str("\\\"")?,
                '\n' => f.write_str("\\n")?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
