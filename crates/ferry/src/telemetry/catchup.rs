//! Catch-up you can watch: while Ferry is behind, one `catching up` log line every ~10 s.
//!
//! A separate task ([`run`]) samples the metrics registry every [`INTERVAL`] and hands two
//! consecutive [`Sample`]s to the pure [`CatchUp::step`], which decides what to log. The session
//! keeps the registry current (received and confirmed LSN, records produced, the latest
//! commit-to-acknowledgement lag) and its lag sampler stores the server's `pg_current_wal_lsn()`
//! (`ferry_server_wal_lsn`), so this module needs nothing from the pipeline but the registry.
//!
//! The line, at INFO, message `catching up`, with these fields:
//!
//! | Field | Meaning |
//! |-------|---------|
//! | `lag_bytes` | Server WAL position (last poll) minus the confirmed LSN. |
//! | `lag_seconds` | Commit-to-acknowledgement time of the latest transaction; only when records were produced in the interval (otherwise absent). |
//! | `rows_per_sec` | Records Kafka acknowledged per second over the interval. |
//! | `bytes_per_sec` | WAL bytes confirmed per second over the interval. |
//! | `eta_seconds` | `lag_bytes` divided by how fast the lag shrank over the interval; absent while it does not shrink. |
//!
//! Ferry is *behind* while it streams and either the lag in bytes is at least [`BEHIND_BYTES`] or
//! records flowed in the interval with a latest lag of at least [`BEHIND_SECONDS`]. Nothing is
//! logged while caught up, except one `caught up` line when a catch-up ends. A standby or
//! reconnecting instance logs nothing here (its own lines say why it is not streaming).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::metrics::Metrics;

/// How often the registry is sampled, and so how often the line appears while behind.
pub const INTERVAL: Duration = Duration::from_secs(10);
/// Lag in bytes from which Ferry counts as behind (a few seconds of a busy server's WAL).
pub const BEHIND_BYTES: u64 = 16 * 1024 * 1024;
/// Commit-to-acknowledgement lag from which Ferry counts as behind.
pub const BEHIND_SECONDS: f64 = 10.0;

/// What [`CatchUp::step`] reads of the registry at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub at: Instant,
    pub streaming: bool,
    pub confirmed_lsn: u64,
    pub server_wal_lsn: u64,
    pub records_produced: u64,
    /// `ferry_replication_lag_latest_seconds`.
    pub latest_lag_seconds: f64,
}

impl Sample {
    /// Reads `metrics` now.
    pub fn of(metrics: &Metrics, at: Instant) -> Sample {
        Sample {
            at,
            streaming: metrics.streaming.get() != 0,
            confirmed_lsn: metrics.confirmed_lsn.get(),
            server_wal_lsn: metrics.server_wal_lsn.get(),
            records_produced: metrics.records_produced.get(),
            latest_lag_seconds: metrics.replication_lag_latest.get(),
        }
    }

    fn lag_bytes(&self) -> u64 {
        self.server_wal_lsn.saturating_sub(self.confirmed_lsn)
    }
}

/// The figures of one `catching up` line (see the module docs for each field).
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub lag_bytes: u64,
    pub lag_seconds: Option<f64>,
    pub rows_per_sec: u64,
    pub bytes_per_sec: u64,
    pub eta: Option<Duration>,
}

/// What to log after a sample.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    CatchingUp(Progress),
    CaughtUp,
}

impl Line {
    /// Emits the line through `tracing`.
    pub fn log(&self) {
        match self {
            Line::CatchingUp(p) => tracing::info!(
                lag_bytes = p.lag_bytes,
                lag_seconds = p.lag_seconds,
                rows_per_sec = p.rows_per_sec,
                bytes_per_sec = p.bytes_per_sec,
                eta_seconds = p.eta.map(|d| d.as_secs()),
                "catching up"
            ),
            Line::CaughtUp => tracing::info!("caught up"),
        }
    }
}

/// Whether a catch-up is under way: the only state between samples.
#[derive(Debug, Default)]
pub struct CatchUp {
    behind: bool,
}

impl CatchUp {
    /// The line for the interval from `prev` to `now`, if any.
    pub fn step(&mut self, prev: &Sample, now: &Sample) -> Option<Line> {
        let secs = now.at.saturating_duration_since(prev.at).as_secs_f64();
        if secs <= 0.0 {
            return None;
        }
        let rows = now.records_produced.saturating_sub(prev.records_produced);
        let lag_bytes = now.lag_bytes();
        let lag_seconds = (rows > 0 && now.latest_lag_seconds.is_finite())
            .then(|| (now.latest_lag_seconds * 10.0).round() / 10.0);
        let behind = now.streaming
            && (lag_bytes >= BEHIND_BYTES || lag_seconds.is_some_and(|s| s >= BEHIND_SECONDS));
        if !behind {
            let was = std::mem::replace(&mut self.behind, false);
            return (was && now.streaming).then_some(Line::CaughtUp);
        }
        self.behind = true;
        let confirmed = now.confirmed_lsn.saturating_sub(prev.confirmed_lsn);
        let shrunk = prev.lag_bytes().saturating_sub(lag_bytes);
        let eta = (shrunk > 0).then(|| {
            let closing_per_sec = shrunk as f64 / secs;
            Duration::from_secs_f64((lag_bytes as f64 / closing_per_sec).min(1e9).round())
        });
        Some(Line::CatchingUp(Progress {
            lag_bytes,
            lag_seconds,
            rows_per_sec: (rows as f64 / secs).round() as u64,
            bytes_per_sec: (confirmed as f64 / secs).round() as u64,
            eta,
        }))
    }
}

/// Samples `metrics` every `every` and logs what [`CatchUp::step`] says; runs until dropped.
pub async fn run(metrics: Arc<Metrics>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut prev = Sample::of(&metrics, Instant::now());
    let mut state = CatchUp::default();
    loop {
        tick.tick().await;
        let now = Sample::of(&metrics, Instant::now());
        if let Some(line) = state.step(&prev, &now) {
            line.log();
        }
        prev = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    /// A streaming sample `secs` after `t0`.
    fn at(t0: Instant, secs: u64, confirmed: u64, server: u64, records: u64, lag: f64) -> Sample {
        Sample {
            at: t0 + Duration::from_secs(secs),
            streaming: true,
            confirmed_lsn: confirmed,
            server_wal_lsn: server,
            records_produced: records,
            latest_lag_seconds: lag,
        }
    }

    #[test]
    fn a_backlog_being_drained_reports_lag_rate_and_eta() {
        let t0 = Instant::now();
        let mut c = CatchUp::default();
        // 1 GiB behind; in 10 s, 200 MiB confirmed while the server wrote 50 MiB more: the lag
        // shrank by 150 MiB, so the remaining 874 MiB take about 58 s.
        let prev = at(t0, 0, 0, 1024 * MIB, 1_000, 40.0);
        let now = at(t0, 10, 200 * MIB, 1074 * MIB, 201_000, 42.34);
        let line = c.step(&prev, &now).unwrap();
        assert_eq!(
            line,
            Line::CatchingUp(Progress {
                lag_bytes: 874 * MIB,
                lag_seconds: Some(42.3),
                rows_per_sec: 20_000,
                bytes_per_sec: 20 * MIB,
                eta: Some(Duration::from_secs(58)),
            })
        );
    }

    #[test]
    fn a_growing_lag_has_no_eta() {
        let t0 = Instant::now();
        let mut c = CatchUp::default();
        let prev = at(t0, 0, 0, 100 * MIB, 0, 0.0);
        let now = at(t0, 10, 10 * MIB, 200 * MIB, 500, 30.0);
        let Some(Line::CatchingUp(p)) = c.step(&prev, &now) else {
            panic!("behind")
        };
        assert_eq!(p.lag_bytes, 190 * MIB);
        assert_eq!(p.eta, None);
        assert_eq!(p.rows_per_sec, 50);
    }

    #[test]
    fn caught_up_is_silent_except_once_when_a_catch_up_ends() {
        let t0 = Instant::now();
        let mut c = CatchUp::default();
        let idle = at(t0, 0, 5 * MIB, 5 * MIB, 10, 0.002);
        let idle_later = at(t0, 10, 5 * MIB, 5 * MIB + 4096, 10, 0.002);
        assert_eq!(c.step(&idle, &idle_later), None, "idle and caught up");

        let behind = at(t0, 20, 6 * MIB, 100 * MIB, 5_000, 12.0);
        assert!(matches!(
            c.step(&idle_later, &behind),
            Some(Line::CatchingUp(_))
        ));
        let done = at(t0, 30, 100 * MIB, 100 * MIB + 100, 9_000, 0.004);
        assert_eq!(c.step(&behind, &done), Some(Line::CaughtUp));
        let still = at(t0, 40, 100 * MIB + 100, 100 * MIB + 100, 9_001, 0.003);
        assert_eq!(c.step(&done, &still), None);
    }

    #[test]
    fn a_stale_latest_lag_without_new_records_does_not_count() {
        let t0 = Instant::now();
        let mut c = CatchUp::default();
        // The last transaction took 30 s, long ago; nothing was produced since.
        let prev = at(t0, 0, MIB, MIB, 100, 30.0);
        let now = at(t0, 10, MIB, MIB + 512, 100, 30.0);
        assert_eq!(c.step(&prev, &now), None);
        // Records flowing with a high lag count even with little WAL behind (large rows far
        // apart, or a slow broker).
        let slow = at(t0, 20, MIB + 512, MIB + 1024, 150, 15.0);
        let Some(Line::CatchingUp(p)) = c.step(&now, &slow) else {
            panic!("behind by time")
        };
        assert_eq!(p.lag_seconds, Some(15.0));
    }

    #[test]
    fn not_streaming_logs_nothing() {
        let t0 = Instant::now();
        let mut c = CatchUp::default();
        let mut prev = at(t0, 0, 0, 1024 * MIB, 0, 0.0);
        let mut now = at(t0, 10, 0, 1024 * MIB, 0, 0.0);
        prev.streaming = false;
        now.streaming = false;
        assert_eq!(c.step(&prev, &now), None, "standby or reconnecting");
        assert_eq!(c.step(&now, &now), None, "no time passed");
    }

    #[test]
    fn the_line_carries_its_fields() {
        use crate::telemetry::logging::{filter, subscriber, Capture, LogFormat};
        let out = Capture::default();
        let writer = out.clone();
        let sub = subscriber(
            LogFormat::Json,
            filter("info", None).unwrap(),
            move || writer.clone(),
            false,
        );
        let line = Line::CatchingUp(Progress {
            lag_bytes: 5,
            lag_seconds: None,
            rows_per_sec: 7,
            bytes_per_sec: 9,
            eta: Some(Duration::from_secs(61)),
        });
        tracing::subscriber::with_default(sub, || line.log());
        let text = out.text();
        let event: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(event["message"], "catching up");
        assert_eq!(event["lag_bytes"], 5);
        assert_eq!(event["rows_per_sec"], 7);
        assert_eq!(event["bytes_per_sec"], 9);
        assert_eq!(event["eta_seconds"], 61);
        assert!(
            event.get("lag_seconds").is_none(),
            "absent, not null: {text}"
        );
    }
}
