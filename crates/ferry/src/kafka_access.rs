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

use rdkafka::error::RDKafkaErrorCode;

/// What is wrong with the connection to the brokers, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    pub message: String,
    /// Whether retrying cannot help without an operator.
    pub permanent: bool,
}

static NEWEST: Mutex<Option<Diagnosis>> = Mutex::new(None);

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
        *NEWEST.lock().unwrap_or_else(|e| e.into_inner()) = Some(d);
    }
}

/// The newest diagnosis since the last `take`, if any.
pub fn take() -> Option<Diagnosis> {
    NEWEST.lock().unwrap_or_else(|e| e.into_inner()).take()
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
