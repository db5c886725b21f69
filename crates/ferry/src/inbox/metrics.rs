//! `ferry inbox`'s metrics and readiness, served on the same `/metrics`, `/healthz` and
//! `/readyz` as `ferry run`'s.
//!
//! | Name | Type | Meaning |
//! |------|------|---------|
//! | `ferry_inbox_records_total` | counter | Records taken from Kafka into batches (a record taken again after a failure counts again). |
//! | `ferry_inbox_rows_inserted_total` | counter | Rows committed into the inbox table. |
//! | `ferry_inbox_duplicates_total{by}` | counter | Records dropped as duplicates: `by="event_id"` (the id was stored within `inbox.dedup_retention`, or repeated in one batch), `by="position"` (at or below the source's mark). |
//! | `ferry_inbox_dead_lettered_total` | counter | Records committed into the dead-letter table. |
//! | `ferry_inbox_transactions_total` | counter | Database transactions committed. |
//! | `ferry_inbox_write_failures_total` | counter | Writes or loads that failed (each reloads the offsets and seeks again). |
//! | `ferry_inbox_partitions` | gauge | Partitions assigned and consumed (offsets loaded). |
//! | `ferry_inbox_buffered_bytes` | gauge | Record bytes gathered and not yet in a transaction. |
//! | `ferry_inbox_write_seconds` | histogram | Time of each committed transaction, from BEGIN to COMMIT's answer. |
//! | `ferry_inbox_cleanup_deleted_total{what}` | counter | Rows the cleanup deleted: `dedup` (expired event ids), `processed` (processed rows past `inbox.processed_retention`). |
//! | `ferry_inbox_cleanup_longest_delete_seconds` | gauge | The longest single DELETE of the latest cleanup (each is its own transaction: the longest any row lock was held). |
//!
//! `/readyz` is 200 while the database answers (the last write or load succeeded) and the
//! consumer has its partitions, and 503 with why otherwise.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use ferry_core::inbox::InboxStats;

use crate::telemetry::metrics::Histogram;

/// Buckets of `ferry_inbox_write_seconds`, 1 ms to 30 s.
const WRITE_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
];

#[derive(Debug)]
pub struct InboxMetrics {
    stats: Mutex<InboxStats>,
    pub partitions: AtomicU64,
    pub buffered_bytes: AtomicU64,
    pub write_seconds: Histogram,
    pub cleanup_dedup: AtomicU64,
    pub cleanup_processed: AtomicU64,
    pub cleanup_longest_micros: AtomicU64,
    /// Why the inbox is not ready, if it is not.
    not_ready: Mutex<Option<String>>,
}

impl Default for InboxMetrics {
    fn default() -> Self {
        InboxMetrics {
            stats: Mutex::new(InboxStats::default()),
            partitions: AtomicU64::new(0),
            buffered_bytes: AtomicU64::new(0),
            write_seconds: Histogram::new(WRITE_BUCKETS),
            cleanup_dedup: AtomicU64::new(0),
            cleanup_processed: AtomicU64::new(0),
            cleanup_longest_micros: AtomicU64::new(0),
            not_ready: Mutex::new(Some("starting".into())),
        }
    }
}

impl InboxMetrics {
    pub fn set_stats(&self, s: InboxStats) {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    pub fn stats(&self) -> InboxStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_not_ready(&self, why: Option<String>) {
        *self.not_ready.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    pub fn ready(&self) -> Result<(), String> {
        match &*self.not_ready.lock().unwrap_or_else(|e| e.into_inner()) {
            None => Ok(()),
            Some(why) => Err(why.clone()),
        }
    }

    pub fn render(&self, out: &mut String) {
        let s = self.stats();
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let _ = writeln!(
            out,
            "# HELP ferry_build_info Always 1; the label carries the crate version.\n# TYPE ferry_build_info gauge\nferry_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        counter(
            out,
            "ferry_inbox_records_total",
            "Records taken from Kafka into batches.",
            s.records,
        );
        counter(
            out,
            "ferry_inbox_rows_inserted_total",
            "Rows committed into the inbox table.",
            s.inserted,
        );
        let _ = writeln!(
            out,
            "# HELP ferry_inbox_duplicates_total Records dropped as duplicates, by event id or by source position.\n\
             # TYPE ferry_inbox_duplicates_total counter\n\
             ferry_inbox_duplicates_total{{by=\"event_id\"}} {}\n\
             ferry_inbox_duplicates_total{{by=\"position\"}} {}",
            s.duplicates_by_id, s.duplicates_by_position
        );
        counter(
            out,
            "ferry_inbox_dead_lettered_total",
            "Records committed into the dead-letter table.",
            s.dead_lettered,
        );
        counter(
            out,
            "ferry_inbox_transactions_total",
            "Database transactions committed.",
            s.writes,
        );
        counter(
            out,
            "ferry_inbox_write_failures_total",
            "Writes or loads that failed (each reloads the offsets).",
            s.failures,
        );
        gauge(
            out,
            "ferry_inbox_partitions",
            "Partitions assigned and consumed.",
            self.partitions.load(Relaxed) as f64,
        );
        gauge(
            out,
            "ferry_inbox_buffered_bytes",
            "Record bytes gathered and not yet in a transaction.",
            self.buffered_bytes.load(Relaxed) as f64,
        );
        let _ = writeln!(
            out,
            "# HELP ferry_inbox_write_seconds Time of each committed transaction.\n# TYPE ferry_inbox_write_seconds histogram"
        );
        for (le, n) in self.write_seconds.cumulative() {
            let le = if le.is_infinite() {
                "+Inf".to_owned()
            } else {
                le.to_string()
            };
            let _ = writeln!(out, "ferry_inbox_write_seconds_bucket{{le=\"{le}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "ferry_inbox_write_seconds_sum {}",
            self.write_seconds.sum()
        );
        let _ = writeln!(
            out,
            "ferry_inbox_write_seconds_count {}",
            self.write_seconds.count()
        );
        let _ = writeln!(
            out,
            "# HELP ferry_inbox_cleanup_deleted_total Rows the cleanup deleted.\n\
             # TYPE ferry_inbox_cleanup_deleted_total counter\n\
             ferry_inbox_cleanup_deleted_total{{what=\"dedup\"}} {}\n\
             ferry_inbox_cleanup_deleted_total{{what=\"processed\"}} {}",
            self.cleanup_dedup.load(Relaxed),
            self.cleanup_processed.load(Relaxed)
        );
        gauge(
            out,
            "ferry_inbox_cleanup_longest_delete_seconds",
            "The longest single DELETE of the latest cleanup.",
            self.cleanup_longest_micros.load(Relaxed) as f64 / 1e6,
        );
        crate::telemetry::process::ProcessStats::read().render(out);
    }
}
