//! The pipeline: slot → router → Kafka → confirmed LSN, supervised.
//!
//! [`run`] is what `ferry run` calls and what tests call with their own shutdown future. It runs
//! streaming *sessions* ([`session`]) one after another:
//!
//! - a session that ends with a **transient** error (Postgres restarted, network dropped, the
//!   brokers unreachable past the delivery timeout) is followed by a new one after a backoff;
//!   the new session resumes from the slot's `confirmed_flush_lsn`, so what was in flight is
//!   produced again (duplicates, never loss);
//! - a slot streamed by another process makes this instance a **hot standby**: it polls until
//!   the slot is free and then takes over;
//! - a **permanent** error (privileges, an invalidated slot, a record Kafka refuses, a routing
//!   error under `on_error = "fail"`, a row without a column the route reads under any
//!   `on_error`, a gap the start-time verdict found: a slot lost, moved or on another server,
//!   see `ferry_core::verdict`) ends `run` with that error: `ferry` exits non-zero and nothing
//!   past the failed record was confirmed. An `--accept-gap` holds until the progress record
//!   written after the accepted gap is acknowledged, across reconnects; then it is used up;
//! - the outbox table leaving the publication while a session streams (dropped and recreated,
//!   `ALTER PUBLICATION ... DROP TABLE`, even if added back since) means rows the stream never
//!   carried: the session drains and confirms what it streamed, then ends with a permanent
//!   error saying so (watched every lag sample; see `session::watch_server`);
//! - the shutdown future ends the current session gracefully: stop reading, wait for in-flight
//!   deliveries (up to the drain timeout), confirm, send a final status update.
//!
//! Every session drains its in-flight records before it ends, whatever the reason: a record of
//! an earlier session can therefore never be appended after a replayed copy, which keeps
//! per-key order across reconnects.

pub mod binary;
mod error;
mod session;
pub mod settings;
pub mod transactional;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use error::PipelineError;
pub use settings::PipelineSettings;

use crate::producer::Producer;
use crate::telemetry::{Component, Metrics};

/// Runs sessions until `shutdown` resolves (Ok) or a permanent error (Err).
pub async fn run(
    settings: PipelineSettings,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PipelineError> {
    let settings = Arc::new(settings);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut backoff = settings.reconnect_backoff_min;
    let mut producer: Option<(Producer, session::Core)> = None;
    let mut standing_by = false;
    // `--accept-gap`: good until the fresh progress record after the accepted gap is written.
    let mut acceptance = settings.acceptance;
    // Lives as long as the pipeline: every producer reports its topics to it.
    let topic_watch = crate::topics::TopicWatch::start(
        &settings.producer_properties,
        settings.create_topics.clone(),
        metrics.clone(),
    )
    .map_err(PipelineError::ProducerConfig)?;
    if settings.exactly_once.is_some() {
        return run_exactly_once(&settings, &metrics, shutdown.as_mut(), &topic_watch).await;
    }
    loop {
        if producer
            .as_ref()
            .is_some_and(|(p, _)| p.fatal_error().is_some())
        {
            producer = None;
        }
        let (p, core) = match producer.take() {
            Some(p) => p,
            None => Producer::new(
                &settings.producer_properties,
                settings.report_capacity(),
                topic_watch.topics(),
            )
            .map(|(p, rx)| (p, session::Core::new(rx, &settings)))
            .map_err(PipelineError::ProducerConfig)?,
        };
        let outcome = session::Session::new(&settings, &metrics, &p, core, &mut acceptance)
            .run(shutdown.as_mut())
            .await;
        producer = Some((p, outcome.core));
        match outcome.result {
            Ok(session::End::Shutdown) => {
                // Every report is in (the session drained), so this returns at once; it waits
                // for anything librdkafka itself still has to send. Blocking: off the runtime.
                if let Some((p, _)) = producer.take() {
                    let _ =
                        tokio::task::spawn_blocking(move || p.flush(Duration::from_secs(5))).await;
                }
                return Ok(());
            }
            Ok(session::End::Streamed) => backoff = settings.reconnect_backoff_min,
            Err(e) if e.is_standby() => {
                if !standing_by {
                    tracing::info!(slot = %settings.stream.slot, "{e}; standing by");
                }
                standing_by = true;
                metrics.standby.set_flag(true);
                if sleep_or_shutdown(settings.standby_poll_interval, shutdown.as_mut()).await {
                    return Ok(());
                }
                continue;
            }
            Err(e) if e.is_transient() => {
                metrics.reconnects.inc(e.component());
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "session ended; reconnecting");
                if sleep_or_shutdown(backoff, shutdown.as_mut()).await {
                    return Ok(());
                }
                backoff = (backoff * 2).min(settings.reconnect_backoff_max);
            }
            Err(e) => return Err(e),
        }
        if standing_by {
            tracing::info!(slot = %settings.stream.slot, "slot is free; taking over");
            standing_by = false;
            metrics.standby.set_flag(false);
        }
    }
}

/// [`run`] in exactly-once mode: every session makes its own transactional producer once the
/// slot is its own (a standby must never fence the instance streaming), and any transaction
/// failure ends the session: the next one fences the old producer and starts over from what
/// Kafka holds (see [`transactional`]).
async fn run_exactly_once(
    settings: &Arc<PipelineSettings>,
    metrics: &Arc<Metrics>,
    mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    topic_watch: &crate::topics::TopicWatch,
) -> Result<(), PipelineError> {
    let mut backoff = settings.reconnect_backoff_min;
    let mut standing_by = false;
    let mut acceptance = settings.acceptance;
    loop {
        let session = session::Session::exactly_once(
            settings,
            metrics,
            topic_watch.topics(),
            &mut acceptance,
        );
        let outcome = session.run(shutdown.as_mut()).await;
        match outcome.result {
            Ok(session::End::Shutdown) => return Ok(()),
            Ok(session::End::Streamed) => backoff = settings.reconnect_backoff_min,
            Err(e) if e.is_standby() => {
                if !standing_by {
                    tracing::info!(slot = %settings.stream.slot, "{e}; standing by");
                }
                standing_by = true;
                metrics.standby.set_flag(true);
                if sleep_or_shutdown(settings.standby_poll_interval, shutdown.as_mut()).await {
                    return Ok(());
                }
                continue;
            }
            Err(e) if e.is_transient() => {
                metrics.reconnects.inc(e.component());
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "session ended; starting over from the progress topic");
                if sleep_or_shutdown(backoff, shutdown.as_mut()).await {
                    return Ok(());
                }
                backoff = (backoff * 2).min(settings.reconnect_backoff_max);
            }
            Err(e) => return Err(e),
        }
        if standing_by {
            tracing::info!(slot = %settings.stream.slot, "slot is free; taking over");
            standing_by = false;
            metrics.standby.set_flag(false);
        }
    }
}

/// Sleeps for `d`; returns true if `shutdown` resolved first.
async fn sleep_or_shutdown(
    d: Duration,
    shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = shutdown => true,
    }
}

impl PipelineError {
    fn component(&self) -> Component {
        match self {
            PipelineError::Delivery { .. }
            | PipelineError::ProducerFatal(_)
            | PipelineError::ProgressTopic(_)
            | PipelineError::Transaction { .. }
            | PipelineError::Fenced { .. } => Component::Kafka,
            _ => Component::Postgres,
        }
    }
}
