//! Ferry's telemetry: the metrics registry, the HTTP endpoint that exposes it, and logging setup.
//!
//! - [`metrics`]: one [`Metrics`] registry per process, atomics only, rendered in the Prometheus
//!   text format. Its module docs hold the table of every metric: that table is the telemetry spec.
//! - [`process`]: the standard `process_*` metrics, read from `/proc` at scrape time.
//! - [`readiness`]: the rule `/readyz` applies to the registry.
//! - [`brokers`]: what librdkafka's statistics say of the brokers (up, since when none is,
//!   connections re-established), for the registry.
//! - [`http`]: [`serve`] answers `/metrics`, `/healthz` and `/readyz` with hyper, within stated
//!   limits (head size, timeouts, connection count).
//! - [`catchup`]: the `catching up` log line (lag, rate, ETA every ~10 s while behind), computed
//!   from the registry by its own task.
//! - [`logging`]: [`logging::init`] installs text or JSON logging to stderr, and documents the log
//!   field names used across Ferry.
//! - [`repeats`]: a log event that repeats (librdkafka's client errors while the brokers are
//!   away) is logged once, then summarised with a count at most every 30 s.
//!
//! The pipeline owns an `Arc<Metrics>` and updates it as it goes; the HTTP server only reads it.

pub mod brokers;
pub mod catchup;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod process;
pub mod readiness;
pub mod repeats;

pub use http::{serve, HttpState, Limits};
pub use logging::LogFormat;
pub use metrics::{Component, Metrics, RoutingErrorReason};
