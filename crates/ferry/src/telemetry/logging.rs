//! Process-wide logging setup: `tracing` events to stderr, as text or JSON lines.
//!
//! # A log sink that goes away never stops the relay
//!
//! Stderr may be a pipe whose reader exits (`ferry run 2>&1 | head -1`), a closed descriptor, or a
//! full disk. Rust ignores SIGPIPE, so such writes return `EPIPE`/`EBADF`/`ENOSPC` rather than
//! killing the process; `tracing-subscriber` would then report its own failure with `eprintln!`,
//! which panics on the same closed stderr. So [`init`] writes through [`Swallow`]: a failed write
//! is dropped and counted (`ferry_log_write_errors_total`, one per event not written, see
//! [`write_errors`]), and the subscriber's internal error reporting is off. The relay carries on;
//! the counter shows on `/metrics` that logs are being lost.
//!
//! [`init`] installs the global subscriber once, at startup. The configured level is a single level
//! name (`info`) or a directive list (`info,ferry=debug,rdkafka=warn`); a non-empty `RUST_LOG`
//! replaces it entirely, with the usual `EnvFilter` syntax. Records of the `log` crate (librdkafka's
//! and tokio-postgres's logs arrive that way) are forwarded into the same output. Text gets colours
//! only when stderr is a terminal; JSON puts each event's fields at the top level of its object, next
//! to `timestamp`, `level`, `target` and `message`.
//!
//! # Log fields
//!
//! Events carry data in fields, not in the message: the message is a short fixed phrase
//! (`"confirmed flush position"`), the numbers go in fields, so logs can be filtered and
//! aggregated. The same name means the same thing everywhere in Ferry:
//!
//! | Field | Meaning |
//! |-------|---------|
//! | `lsn` | A WAL position, logged with `%` so it prints as `X/X`. |
//! | `commit_lsn`, `end_lsn`, `wal_end`, `flush_lsn` | The named LSN meanings of `ferry_wal::lsn`, also `X/X`. |
//! | `xid` | A transaction id. |
//! | `slot` | The replication slot name. |
//! | `publication` | The publication name. |
//! | `topic`, `partition` | A Kafka destination. |
//! | `records` | A count of records. |
//! | `bytes` | A size in bytes. |
//! | `elapsed_ms` | A duration, in milliseconds. |
//! | `attempt` | A retry or reconnect attempt, from 1. |
//! | `component` | `postgres` or `kafka`, as in the `ferry_reconnects_total` label. |
//! | `error` | An error, logged with `%` (its `Display`, which includes the fix for permanent errors). |
//! | `repeated` | How many events of the same kind were left out since the last line of that kind (see `telemetry::repeats`). |
//!
//! Never logged: record payloads, keys and header values (they are the application's data, often
//! personal), and secrets (passwords, connection strings with credentials, TLS keys; configuration
//! types keep those in wrappers that do not print).

use std::fmt;
use std::io::{self, IsTerminal};
use std::str::FromStr;

use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

use super::metrics::Counter;

/// Events the process could not write to its log sink (`ferry_log_write_errors_total`).
static WRITE_ERRORS: Counter = Counter::new();

/// How many log events were dropped because stderr failed, since the process started.
pub fn write_errors() -> u64 {
    WRITE_ERRORS.get()
}

/// How events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (`tracing_subscriber`'s full format).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl FromStr for LogFormat {
    type Err = LoggingError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(LoggingError::InvalidFormat(other.to_string())),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("invalid log format {0:?}: expected \"text\" or \"json\"")]
    InvalidFormat(String),
    #[error("invalid log level {level:?}: expected trace, debug, info, warn, error, off or directives like \"info,ferry=debug\"{detail}")]
    InvalidLevel { level: String, detail: String },
    #[error("invalid RUST_LOG {value:?}: {detail}")]
    InvalidRustLog { value: String, detail: String },
    #[error("logging is already initialised: {0}")]
    AlreadyInitialized(String),
}

/// Installs the global subscriber: `format` to stderr at `level`, unless `RUST_LOG` is set.
pub fn init(format: LogFormat, level: &str) -> Result<(), LoggingError> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = filter(level, rust_log.as_deref())?;
    let ansi = std::io::stderr().is_terminal();
    subscriber(
        format,
        filter,
        Swallow::new(io::stderr, &WRITE_ERRORS),
        ansi,
    )
    .try_init()
    .map_err(|e| LoggingError::AlreadyInitialized(e.to_string()))
}

/// The filter for the configured `level`, replaced by `rust_log` when that is set and not blank.
/// A configured level without `=` or `,` must be a level name, so that a typo (`warning`) is an
/// error rather than a directive enabling a target of that name.
pub fn filter(level: &str, rust_log: Option<&str>) -> Result<EnvFilter, LoggingError> {
    if let Some(value) = rust_log.map(str::trim).filter(|v| !v.is_empty()) {
        return EnvFilter::builder()
            .parse(value)
            .map_err(|e| LoggingError::InvalidRustLog {
                value: value.to_string(),
                detail: e.to_string(),
            });
    }
    let level = level.trim();
    let invalid = |detail: String| LoggingError::InvalidLevel {
        level: level.to_string(),
        detail,
    };
    if !level.contains(['=', ',']) {
        // `LevelFilter` reads "" as ERROR; an empty setting is a mistake, not a level.
        let single = Some(level)
            .filter(|l| !l.is_empty())
            .and_then(|l| LevelFilter::from_str(l).ok())
            .ok_or_else(|| invalid(String::new()))?;
        return Ok(EnvFilter::default().add_directive(single.into()));
    }
    EnvFilter::builder()
        .parse(level)
        .map_err(|e| invalid(format!(" ({e})")))
}

/// The subscriber [`init`] installs, writing to `writer` (tests capture it).
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    ansi: bool,
) -> Box<dyn tracing::Subscriber + Send + Sync + 'static>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    // A failed write is the writer's business (see `Swallow`); the default would `eprintln!`
    // about it, and that panics when stderr itself is what failed.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .log_internal_errors(false);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
        LogFormat::Json => Box::new(builder.json().flatten_event(true).with_ansi(false).finish()),
    }
}

/// A [`MakeWriter`] whose writers never fail: an error from the inner writer drops the rest of
/// that event and counts it once in `errors`. `Interrupted` is passed on so `write_all` retries.
#[derive(Debug, Clone, Copy)]
pub struct Swallow<M> {
    make: M,
    errors: &'static Counter,
}

impl<M> Swallow<M> {
    pub fn new(make: M, errors: &'static Counter) -> Self {
        Swallow { make, errors }
    }
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Swallow<M> {
    type Writer = SwallowWriter<M::Writer>;
    fn make_writer(&'a self) -> Self::Writer {
        SwallowWriter {
            inner: self.make.make_writer(),
            errors: self.errors,
            failed: false,
        }
    }
}

/// One event's writer of [`Swallow`]; counts the event on drop if any write of it failed.
#[derive(Debug)]
pub struct SwallowWriter<W> {
    inner: W,
    errors: &'static Counter,
    failed: bool,
}

impl<W: io::Write> io::Write for SwallowWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.failed || buf.is_empty() {
            return Ok(buf.len());
        }
        match self.inner.write(buf) {
            Ok(0) => {
                self.failed = true;
                Ok(buf.len())
            }
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(e),
            Err(_) => {
                self.failed = true;
                Ok(buf.len())
            }
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        if !self.failed && self.inner.flush().is_err() {
            self.failed = true;
        }
        Ok(())
    }
}

impl<W> Drop for SwallowWriter<W> {
    fn drop(&mut self) {
        if self.failed {
            self.errors.inc();
        }
    }
}

/// Test support: a log writer that keeps what is written, shared by its clones (a
/// `MakeWriter` as `move || capture.clone()`).
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct Capture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl std::io::Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
impl Capture {
    /// Everything written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(format: LogFormat, level: &str, body: impl FnOnce()) -> String {
        let out = Capture::default();
        let writer = out.clone();
        let subscriber = subscriber(
            format,
            filter(level, None).unwrap(),
            move || writer.clone(),
            false,
        );
        tracing::subscriber::with_default(subscriber, body);
        out.text()
    }

    #[test]
    fn json_lines_carry_fields_at_the_top_level() {
        let out = capture(LogFormat::Json, "info", || {
            tracing::info!(lsn = %"0/16B3748", xid = 750u32, records = 3u64, "confirmed flush position");
            tracing::debug!(bytes = 1u64, "filtered out");
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let event: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(event["level"], "INFO");
        assert_eq!(event["message"], "confirmed flush position");
        assert_eq!(event["lsn"], "0/16B3748");
        assert_eq!(event["xid"], 750);
        assert_eq!(event["records"], 3);
        assert!(event["timestamp"].is_string());
        assert!(event["target"].as_str().unwrap().starts_with("ferry"));
    }

    #[test]
    fn text_lines_are_plain_key_value() {
        let out = capture(LogFormat::Text, "debug", || {
            tracing::debug!(topic = "orders", elapsed_ms = 12u64, "produced");
        });
        assert!(out.contains(" DEBUG "), "{out}");
        assert!(
            out.contains("produced topic=\"orders\" elapsed_ms=12"),
            "{out}"
        );
        assert!(!out.contains('\x1b'), "no colours when not a terminal");
    }

    #[test]
    fn levels_and_directives_are_checked() {
        for ok in [
            "info",
            " WARN ",
            "off",
            "trace",
            "info,ferry=debug",
            "ferry::telemetry=trace",
        ] {
            assert!(filter(ok, None).is_ok(), "{ok}");
        }
        for bad in ["warning", "loud", ""] {
            let err = filter(bad, None).unwrap_err();
            assert!(
                matches!(err, LoggingError::InvalidLevel { .. }),
                "{bad}: {err}"
            );
        }
        assert!(filter("info,ferry=[", None).is_err());
    }

    #[test]
    fn rust_log_overrides_the_configured_level() {
        let out = Capture::default();
        let writer = out.clone();
        let debug = filter("error", Some("debug")).unwrap();
        let subscriber = subscriber(LogFormat::Text, debug, move || writer.clone(), false);
        tracing::subscriber::with_default(subscriber, || tracing::debug!("visible"));
        assert!(out.text().contains("visible"));

        assert!(
            filter("error", Some("  ")).is_ok(),
            "blank RUST_LOG is ignored"
        );
        assert!(matches!(
            filter("info", Some("x=[")),
            Err(LoggingError::InvalidRustLog { .. })
        ));
    }

    /// A sink that fails like a pipe whose reader has gone.
    struct Broken;

    impl io::Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
    }

    #[test]
    fn a_failing_sink_drops_and_counts_events_without_panicking() {
        let errors: &'static Counter = Box::leak(Box::default());
        for format in [LogFormat::Text, LogFormat::Json] {
            let sink = Swallow::new(|| Broken, errors);
            let subscriber = subscriber(format, filter("info", None).unwrap(), sink, false);
            tracing::subscriber::with_default(subscriber, || {
                tracing::info!(records = 1u64, "first");
                tracing::warn!("second");
                tracing::debug!("filtered out, never written");
            });
        }
        assert_eq!(errors.get(), 4, "one per event written, per format");
    }

    #[test]
    fn a_working_sink_through_swallow_counts_nothing() {
        let errors: &'static Counter = Box::leak(Box::default());
        let out = Capture::default();
        let writer = out.clone();
        let sink = Swallow::new(move || writer.clone(), errors);
        let subscriber = subscriber(LogFormat::Text, filter("info", None).unwrap(), sink, false);
        tracing::subscriber::with_default(subscriber, || tracing::info!("kept"));
        assert!(out.text().contains("kept"));
        assert_eq!(errors.get(), 0);
    }

    #[test]
    fn formats_parse_and_print() {
        assert_eq!("json".parse::<LogFormat>().unwrap(), LogFormat::Json);
        assert_eq!(LogFormat::Text.to_string(), "text");
        assert!("yaml".parse::<LogFormat>().is_err());
        let parsed: LogFormat = serde_json::from_str("\"json\"").unwrap();
        assert_eq!(parsed, LogFormat::Json);
    }
}
