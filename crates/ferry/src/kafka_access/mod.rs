//! Why Ferry cannot talk to the brokers at all: nothing listens at the address, the name does
//! not resolve, the port is not Kafka, nothing answers, the SASL credentials refused, the
//! brokers' TLS certificate not signed by a CA Ferry trusts, or a plaintext client on a TLS/SASL
//! listener ([`diagnosis`] reads librdkafka's texts; pure).
//!
//! librdkafka reports these as client errors and log lines, and retries them forever; the
//! request Ferry waits on only fails with a transport error that says nothing of why. Every
//! Ferry client context hands its errors and log lines to [`observe`], which keeps the newest
//! diagnosis; the pipeline's supervisor and `ferry check` [`take`] it when a Kafka request
//! failed, and say what is wrong and how to fix it. A refused password or an untrusted
//! certificate does not fix itself, so `ferry run` stops at it ([`Diagnosis::permanent`]); a
//! connection closed during the first request usually means the wrong `security.protocol`, but
//! could be a broker going down, so it is retried, with the hint in the warning.
//!
//! Before `ferry check` asks the brokers anything, and before `ferry run` starts (and restarts
//! after a Kafka error), [`probe`] asks whether any bootstrap broker answers, and gives up as
//! soon as every one failed for a certain reason, rather than waiting out a request's timeout.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::error::RDKafkaErrorCode;

mod diagnosis;
mod probe;

pub use diagnosis::{diagnose, relayed, silent, Cause, Diagnosis};
pub use probe::{probe, probe_seeing, Unusable};

/// How long a probe of the brokers waits for one to answer (a refused port, a name that does
/// not resolve, a port that is not Kafka are said as soon as every bootstrap broker was tried
/// once): `check`, `run` between sessions, `replay` before it starts.
pub const PROBE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// The newest diagnosis, when it was first seen, and how often it was seen since.
static NEWEST: Mutex<Option<Seen>> = Mutex::new(None);

#[derive(Debug)]
struct Seen {
    diagnosis: Diagnosis,
    at: Instant,
    times: u32,
}

/// How recent a diagnosis must be for [`take`] to give it.
const FRESH: Duration = Duration::from_secs(60);

/// How often a permanent diagnosis must have been seen before [`take`] calls it permanent: a
/// wrong password or CA is refused at every reconnect, to every broker (librdkafka reconnects
/// within milliseconds at first), while one broker in the middle of a credential or certificate
/// change may refuse once or twice and then let Ferry in.
pub const CONFIRMATIONS: u32 = 3;

/// Keeps the diagnosis of a client error or log line, if it has one.
pub fn observe(code: Option<RDKafkaErrorCode>, text: &str) {
    if let Some(d) = diagnose(code, text) {
        let mut newest = NEWEST.lock().unwrap_or_else(|e| e.into_inner());
        match newest.as_mut() {
            Some(seen) if seen.diagnosis.permanent == d.permanent => {
                seen.times = seen.times.saturating_add(1);
                seen.diagnosis = d;
            }
            _ => {
                *newest = Some(Seen {
                    diagnosis: d,
                    at: Instant::now(),
                    times: 1,
                })
            }
        }
    }
}

/// Forgets what was seen: a session starts afresh, so a refusal an earlier one saw (one broker
/// in a credential change, hours ago) is never mistaken for why this one failed.
pub fn reset() {
    *NEWEST.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// The newest diagnosis since the last `take` or [`reset`], if it is fresh. A permanent one
/// seen fewer than [`CONFIRMATIONS`] times is given as transient (a hint, retried).
pub fn take() -> Option<Diagnosis> {
    let seen = NEWEST.lock().unwrap_or_else(|e| e.into_inner()).take()?;
    judge(seen, Instant::now())
}

fn judge(seen: Seen, now: Instant) -> Option<Diagnosis> {
    if now.saturating_duration_since(seen.at) > FRESH && seen.times < CONFIRMATIONS {
        return None;
    }
    let mut d = seen.diagnosis;
    d.permanent &= seen.times >= CONFIRMATIONS;
    Some(d)
}

/// A client context that only [`observe`]s (for `ferry check`'s short-lived clients); librdkafka's
/// lines go to the debug log.
#[derive(Debug, Clone, Copy, Default)]
pub struct Observer;

impl rdkafka::ClientContext for Observer {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        observe(None, message);
        tracing::debug!(?level, facility = fac, "librdkafka: {message}");
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        observe(error.rdkafka_error_code(), reason);
        tracing::debug!(%error, "librdkafka: {reason}");
    }
}

impl rdkafka::producer::ProducerContext for Observer {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::producer::DeliveryResult<'_>, _: ()) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(permanent: bool, times: u32, at: Instant) -> Seen {
        Seen {
            diagnosis: Diagnosis {
                message: "m".into(),
                permanent,
                cause: Cause::SaslRefused,
                broker: None,
            },
            at,
            times,
        }
    }

    #[test]
    fn a_refusal_is_permanent_only_when_repeated() {
        let now = Instant::now();
        assert!(!judge(seen(true, 1, now), now).unwrap().permanent);
        assert!(!judge(seen(true, 2, now), now).unwrap().permanent);
        assert!(judge(seen(true, 3, now), now).unwrap().permanent);
        assert!(!judge(seen(false, 9, now), now).unwrap().permanent);
        // One old refusal says nothing of now.
        let later = now + FRESH + Duration::from_secs(1);
        assert_eq!(judge(seen(true, 1, now), later), None);
    }
}
