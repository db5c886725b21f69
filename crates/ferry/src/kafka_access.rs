//! Why Ferry cannot talk to the brokers at all: the SASL credentials refused, the brokers' TLS
//! certificate not signed by a CA Ferry trusts, or a plaintext client on a TLS/SASL listener.
//!
//! librdkafka reports these as client errors and log lines, and retries them forever; the
//! request Ferry waits on only fails with a transport error that says nothing of why. Every
//! Ferry client context hands its errors and log lines to [`observe`], which keeps the newest
//! diagnosis; the pipeline's supervisor and `ferry check` [`take`] it when a Kafka request
//! failed, and say what is wrong and how to fix it. A refused password or an untrusted
//! certificate does not fix itself, so `ferry run` stops at it ([`Diagnosis::permanent`]); a
//! connection closed during the first request usually means the wrong `security.protocol`, but
//! could be a broker going down, so it is retried, with the hint in the warning.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::error::RDKafkaErrorCode;

/// What is wrong with the connection to the brokers, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    pub message: String,
    /// Whether retrying cannot help without an operator.
    pub permanent: bool,
}

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
const CONFIRMATIONS: u32 = 3;

/// The diagnosis of a client error or log line (`code` for errors, `None` for log lines), if it
/// is one of the access problems this module knows.
pub fn diagnose(code: Option<RDKafkaErrorCode>, text: &str) -> Option<Diagnosis> {
    let sasl = text.contains("SASL authentication error")
        || text.contains("Authentication failed")
        || matches!(code, Some(RDKafkaErrorCode::SaslAuthenticationFailed));
    if sasl {
        return Some(Diagnosis {
            message: format!(
                "the brokers refused Ferry's SASL credentials ({}). Fix: check kafka.properties \
                 sasl.username and sasl.password (or kafka.property_files.\"sasl.password\") and \
                 sasl.mechanism against the user the brokers know",
                trim(text)
            ),
            permanent: true,
        });
    }
    if text.contains("SSL handshake failed") && text.contains("certificate verify failed") {
        return Some(Diagnosis {
            message: format!(
                "the brokers' TLS certificate is not signed by a CA Ferry trusts ({}). Fix: set \
                 kafka.properties ssl.ca.location to the CA certificate (PEM) that signed the \
                 brokers' certificates",
                trim(text)
            ),
            permanent: true,
        });
    }
    if text.contains("SSL handshake failed") {
        return Some(Diagnosis {
            message: format!(
                "the TLS handshake with the brokers failed ({}). Fix: check that the listener \
                 speaks TLS (security.protocol SSL or SASL_SSL) and kafka.properties ssl.*",
                trim(text)
            ),
            permanent: false,
        });
    }
    if text.contains("Disconnected") && text.contains("APIVERSION_QUERY") {
        return Some(Diagnosis {
            message: format!(
                "the brokers closed the connection at Ferry's first request ({}): the listener \
                 most likely expects TLS or SASL. Fix: set kafka.properties security.protocol to \
                 the listener's (SASL_SSL, SSL or SASL_PLAINTEXT) with its sasl.* and ssl.* \
                 settings, or point kafka.brokers at a plaintext listener",
                trim(text)
            ),
            permanent: false,
        });
    }
    None
}

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

/// librdkafka's text without its broker-thread prefix, shortened.
fn trim(text: &str) -> String {
    let t = text.trim();
    let t: String = t.chars().take(300).collect();
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(permanent: bool, times: u32, at: Instant) -> Seen {
        Seen {
            diagnosis: Diagnosis {
                message: "m".into(),
                permanent,
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

    #[test]
    fn a_refused_password_is_permanent_and_names_the_settings() {
        let d = diagnose(
            Some(RDKafkaErrorCode::Authentication),
            "sasl_ssl://k:9093/bootstrap: SASL authentication error: Authentication failed during \
             authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512",
        )
        .unwrap();
        assert!(d.permanent);
        assert!(d.message.contains("sasl.password"), "{}", d.message);
    }

    #[test]
    fn an_untrusted_certificate_is_permanent_and_names_ssl_ca_location() {
        let d = diagnose(
            None,
            "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker \
             certificate could not be verified",
        )
        .unwrap();
        assert!(d.permanent);
        assert!(d.message.contains("ssl.ca.location"), "{}", d.message);
    }

    #[test]
    fn a_disconnect_at_the_first_request_hints_at_security_protocol_and_is_retried() {
        let d = diagnose(
            None,
            "127.0.0.1:9093/bootstrap: Disconnected: connection closed by peer: receive 0 after \
             POLLIN (after 75ms in state APIVERSION_QUERY)",
        )
        .unwrap();
        assert!(!d.permanent);
        assert!(d.message.contains("security.protocol"), "{}", d.message);
        assert_eq!(
            diagnose(None, "Disconnected (after 60000ms in state UP)"),
            None
        );
    }
}
