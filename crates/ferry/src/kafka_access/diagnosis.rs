//! What librdkafka's error texts and log lines say is wrong with the brokers, and how to fix it:
//! pure functions over the texts (no client, no I/O), tested against the strings librdkafka 2.12
//! writes (`rdkafka_broker.c`, `rdkafka_transport.c`).
//!
//! librdkafka reports every one of these as `BrokerTransportFailure` (or `BadMessage`,
//! `Resolve`) to the request that waited; only its per-broker text says why:
//!
//! | cause | librdkafka's text |
//! |---|---|
//! | [`Cause::Refused`] | `Connect to ipv4#127.0.0.1:9 failed: Connection refused` |
//! | [`Cause::Unresolvable`] | `Failed to resolve 'nohost:9092': Name or service not known` |
//! | [`Cause::NotKafka`] | `Receive failed: Invalid response size 1213486160 (0..100000000): increase receive.message.max.bytes` |
//! | [`Cause::TimedOut`] | `Connection setup timed out in state CONNECT`, `Connect to ... failed: Connection timed out`, `No route to host`, `1 request(s) timed out: disconnect` |
//! | [`Cause::ClosedAtFirstRequest`] | `Disconnected ... (after 75ms in state APIVERSION_QUERY)` |
//! | [`Cause::SaslRefused`], [`Cause::UntrustedCertificate`], [`Cause::TlsHandshake`] | `SASL authentication error`, `SSL handshake failed` |
//!
//! "Invalid response size" is what a port that is not Kafka looks like: librdkafka reads the
//! first four bytes of the answer as a Kafka response length. Its advice, "increase
//! receive.message.max.bytes", is wrong there and is never relayed: the bytes themselves tell
//! an HTTP server (`HTTP`) or a TLS listener (a TLS alert record, `0x15 0x03`) apart. Every
//! librdkafka text Ferry logs goes through [`relayed`], which puts the cause and fix in its
//! place (or at least drops that advice).

/// Why the brokers cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The credentials were refused.
    SaslRefused,
    /// The brokers' certificate is signed by a CA Ferry does not trust.
    UntrustedCertificate,
    /// Another TLS handshake failure.
    TlsHandshake,
    /// The connection was closed at Ferry's first request (a TLS or SASL listener, most likely).
    ClosedAtFirstRequest,
    /// Nothing listens at the address.
    Refused,
    /// The host name does not resolve.
    Unresolvable,
    /// Something answers at the address, but not in the Kafka protocol.
    NotKafka,
    /// Nothing answers: a silent host, or a firewall dropping packets.
    TimedOut,
}

impl Cause {
    /// Whether one attempt on a broker is enough to know: waiting longer only repeats it.
    /// (A timeout is known only when the time is up.)
    pub fn certain(self) -> bool {
        !matches!(self, Cause::TimedOut | Cause::TlsHandshake)
    }
}

/// What is wrong with the connection to the brokers, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    /// What is wrong, then " Fix: " and how to fix it.
    pub message: String,
    /// Whether retrying cannot help without an operator.
    pub permanent: bool,
    pub cause: Cause,
    /// The broker as librdkafka names it (`host:port`, from `kafka.brokers`), when the text says.
    pub broker: Option<String>,
}

impl Diagnosis {
    /// The message's two halves: what is wrong, and the fix.
    pub fn what_and_fix(&self) -> (&str, &str) {
        self.message
            .split_once(" Fix: ")
            .unwrap_or((self.message.as_str(), "see the error"))
    }
}

/// The diagnosis of a client error or log line (`code` for errors, `None` for log lines), if it
/// is one of the access problems this module knows.
pub fn diagnose(code: Option<rdkafka::error::RDKafkaErrorCode>, text: &str) -> Option<Diagnosis> {
    let text = without_thread(text);
    let (broker, detail) = split_broker(text);
    let at = broker.unwrap_or("the brokers");
    let (cause, message) = if text.contains("SASL authentication error")
        || text.contains("Authentication failed")
        || matches!(
            code,
            Some(rdkafka::error::RDKafkaErrorCode::SaslAuthenticationFailed)
        ) {
        (
            Cause::SaslRefused,
            format!(
                "the brokers refused Ferry's SASL credentials ({}). Fix: check kafka.properties \
                 sasl.username and sasl.password (or kafka.property_files.\"sasl.password\") and \
                 sasl.mechanism against the user the brokers know",
                trim(text)
            ),
        )
    } else if text.contains("SSL handshake failed") && text.contains("certificate verify failed") {
        (
            Cause::UntrustedCertificate,
            format!(
                "the brokers' TLS certificate is not signed by a CA Ferry trusts ({}). Fix: set \
                 kafka.properties ssl.ca.location to the CA certificate (PEM) that signed the \
                 brokers' certificates",
                trim(text)
            ),
        )
    } else if text.contains("SSL handshake failed") {
        (
            Cause::TlsHandshake,
            format!(
                "the TLS handshake with the brokers failed ({}). Fix: check that the listener \
                 speaks TLS (security.protocol SSL or SASL_SSL) and kafka.properties ssl.*",
                trim(text)
            ),
        )
    } else if text.contains("Disconnected") && text.contains("APIVERSION_QUERY") {
        (
            Cause::ClosedAtFirstRequest,
            format!(
                "{at} closed the connection at Ferry's first request ({}): the listener \
                 most likely expects TLS or SASL. Fix: set kafka.properties security.protocol to \
                 the listener's (SASL_SSL, SSL or SASL_PLAINTEXT) with its sasl.* and ssl.* \
                 settings, or point kafka.brokers at a plaintext listener",
                trim(text)
            ),
        )
    } else if let Some(name) = unresolved_name(detail) {
        let host = name.rsplit_once(':').map_or(name, |(h, _)| h);
        (
            Cause::Unresolvable,
            format!(
                "the host name {host:?} in kafka.brokers does not resolve ({}). Fix: correct \
                 the host name in kafka.brokers, or make it resolvable where Ferry runs (DNS, \
                 /etc/hosts; in a container, the broker's service name, not localhost)",
                trim(detail)
            ),
        )
    } else if detail.contains("Connect to ") && detail.contains("Connection refused") {
        (
            Cause::Refused,
            format!(
                "nothing listens at {at}: the connection was refused ({}). Fix: start the \
                 broker, or correct the port in kafka.brokers; a running broker accepts \
                 connections only on its listeners (server.properties listeners), and clients \
                 then use the addresses in its advertised.listeners",
                trim(detail)
            ),
        )
    } else if let Some(size) = invalid_response_size(detail) {
        (Cause::NotKafka, not_kafka(at, size))
    } else if detail.contains("Connection setup timed out")
        || (detail.contains("Connect to ")
            && ["timed out", "No route to host", "Network is unreachable"]
                .iter()
                .any(|t| detail.contains(t)))
        || detail.contains("request(s) timed out: disconnect")
    {
        (
            Cause::TimedOut,
            format!(
                "no answer from {at} ({}): a silent host, or a firewall dropping the packets. \
                 Fix: check the address and port in kafka.brokers, and that the network lets \
                 Ferry reach them (firewall, security group, routing)",
                trim(detail)
            ),
        )
    } else {
        return None;
    };
    Some(Diagnosis {
        message,
        permanent: matches!(cause, Cause::SaslRefused | Cause::UntrustedCertificate),
        cause,
        broker: broker.map(str::to_owned),
    })
}

/// A diagnosis for a broker that did not answer within `waited` (no text from librdkafka said
/// why): `connected` when its TCP connection was accepted (see [`connected`]).
pub fn silent(broker: &str, waited: std::time::Duration, connected: bool) -> Diagnosis {
    let message = if connected {
        format!(
            "{broker} accepted the connection but did not answer Ferry's first Kafka request \
             within {}s: the listener most likely expects TLS or SASL, or the service is not \
             Kafka. Fix: set kafka.properties security.protocol to the listener's (SASL_SSL, SSL \
             or SASL_PLAINTEXT) with its sasl.* and ssl.* settings, or check the port in \
             kafka.brokers",
            waited.as_secs()
        )
    } else {
        format!(
            "no answer from {broker} within {}s: a silent host, or a firewall dropping the \
             packets. Fix: check the address and port in kafka.brokers, and that the network \
             lets Ferry reach them (firewall, security group, routing)",
            waited.as_secs()
        )
    };
    Diagnosis {
        message,
        permanent: false,
        cause: Cause::TimedOut,
        broker: Some(broker.to_owned()),
    }
}

/// The broker whose TCP connection was just accepted, if `text` is librdkafka's state change
/// out of CONNECT to anything but DOWN (`debug=broker`: `k:9092/bootstrap: Broker changed state
/// CONNECT -> APIVERSION_QUERY`, or `-> SSL_HANDSHAKE`).
pub fn connected(text: &str) -> Option<&str> {
    let (broker, detail) = split_broker(without_thread(text));
    let to = detail.strip_prefix("Broker changed state CONNECT -> ")?;
    let to = to.split_whitespace().next()?;
    (!matches!(to, "DOWN" | "INIT")).then_some(broker?)
}

/// librdkafka's text as Ferry logs it: for an address that cannot be used (refused,
/// unresolvable, not Kafka, silent), the diagnosis with its fix; otherwise the text, never with
/// the advice that misleads ("increase receive.message.max.bytes").
pub fn relayed(
    code: Option<rdkafka::error::RDKafkaErrorCode>,
    text: &str,
) -> std::borrow::Cow<'_, str> {
    match diagnose(code, text) {
        Some(d)
            if matches!(
                d.cause,
                Cause::Refused | Cause::Unresolvable | Cause::NotKafka | Cause::TimedOut
            ) =>
        {
            std::borrow::Cow::Owned(d.message)
        }
        _ if text.contains(ADVICE) => std::borrow::Cow::Owned(trim(text)),
        _ => std::borrow::Cow::Borrowed(text),
    }
}

/// The advice librdkafka gives with "Invalid response size", wrong on a port that is not Kafka.
const ADVICE: &str = ": increase receive.message.max.bytes";

/// The message for a port that answered, but not in Kafka: what its first bytes look like.
fn not_kafka(at: &str, size: i64) -> String {
    let bytes = (size as u32).to_be_bytes();
    if bytes[0] == 0x15 && bytes[1] == 0x03 {
        return format!(
            "the listener at {at} speaks TLS, and Ferry plaintext (its answer is a TLS alert). \
             Fix: set kafka.properties security.protocol to the listener's (SSL, or SASL_SSL \
             with sasl.*) and ssl.ca.location, or point kafka.brokers at a plaintext listener"
        );
    }
    let shown = if bytes.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        format!("{:?}", String::from_utf8_lossy(&bytes))
    } else {
        format!("0x{:08x}", size as u32)
    };
    let guess = if &bytes == b"HTTP" {
        "an HTTP server"
    } else {
        "an HTTP, TLS or other service?"
    };
    format!(
        "the port at {at} does not speak the Kafka protocol ({guess}: its answer began with \
         {shown}). Fix: check the host and port in kafka.brokers (the broker's listener, often \
         9092) and kafka.properties security.protocol"
    )
}

/// `Failed to resolve 'host:port': why` → `host:port`.
fn unresolved_name(detail: &str) -> Option<&str> {
    let rest = detail.split_once("Failed to resolve '")?.1;
    Some(rest.split_once('\'')?.0)
}

/// `Invalid response size 1213486160 (0..100000000)` → the size.
fn invalid_response_size(detail: &str) -> Option<i64> {
    let rest = detail.split_once("Invalid response size ")?.1;
    let digits: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    digits.parse().ok()
}

/// The text without librdkafka's `[thrd:...]: ` prefix (log lines carry it).
fn without_thread(text: &str) -> &str {
    let t = text.trim();
    match t.strip_prefix("[thrd:").and_then(|r| r.split_once("]: ")) {
        Some((_, rest)) => rest,
        None => t,
    }
}

/// `host:port/bootstrap: detail` → (`host:port`, `detail`); the broker part is the one
/// librdkafka's per-broker texts start with (`<name>/<id or bootstrap>: `).
fn split_broker(text: &str) -> (Option<&str>, &str) {
    if let Some((head, detail)) = text.split_once(": ") {
        if let Some((name, id)) = head.rsplit_once('/') {
            let id_like = id == "bootstrap" || id.parse::<i32>().is_ok();
            if id_like && !name.contains(' ') {
                return (Some(name), detail);
            }
        }
    }
    (None, text)
}

/// librdkafka's text, shortened, without the advice that misleads ("increase
/// receive.message.max.bytes" on a port that is not Kafka).
fn trim(text: &str) -> String {
    let t = text.trim();
    let t = t
        .split_once(ADVICE)
        .map_or(t.to_owned(), |(a, b)| format!("{a}{b}"));
    t.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::RDKafkaErrorCode;

    #[test]
    fn a_refused_password_is_permanent_and_names_the_settings() {
        let d = diagnose(
            Some(RDKafkaErrorCode::Authentication),
            "sasl_ssl://k:9093/bootstrap: SASL authentication error: Authentication failed during \
             authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512",
        )
        .unwrap();
        assert!(d.permanent);
        assert_eq!(d.cause, Cause::SaslRefused);
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
        assert_eq!(d.broker.as_deref(), Some("127.0.0.1:9093"));
        assert!(d.message.contains("security.protocol"), "{}", d.message);
        assert_eq!(
            diagnose(None, "Disconnected (after 60000ms in state UP)"),
            None
        );
    }

    #[test]
    fn a_refused_connection_says_nothing_listens_and_names_the_listeners() {
        // The error callback's text, and the same as a log line (with the thread prefix).
        for text in [
            "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)",
            "[thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT, 1 identical error(s) suppressed)",
        ] {
            let d = diagnose(Some(RDKafkaErrorCode::BrokerTransportFailure), text).unwrap();
            assert_eq!(d.cause, Cause::Refused);
            assert!(d.cause.certain() && !d.permanent);
            assert_eq!(d.broker.as_deref(), Some("127.0.0.1:1"));
            let (what, fix) = d.what_and_fix();
            assert!(what.starts_with("nothing listens at 127.0.0.1:1"), "{what}");
            assert!(fix.contains("start the broker") && fix.contains("advertised.listeners"), "{fix}");
        }
    }

    #[test]
    fn an_unresolvable_name_names_the_host_and_dns() {
        let d = diagnose(
            Some(RDKafkaErrorCode::Resolve),
            "nohost.invalid:9092/bootstrap: Failed to resolve 'nohost.invalid:9092': Name or \
             service not known (after 1ms in state CONNECT)",
        )
        .unwrap();
        assert_eq!(d.cause, Cause::Unresolvable);
        assert!(d.cause.certain());
        assert_eq!(d.broker.as_deref(), Some("nohost.invalid:9092"));
        let (what, fix) = d.what_and_fix();
        assert!(
            what.starts_with("the host name \"nohost.invalid\" in kafka.brokers does not resolve"),
            "{what}"
        );
        assert!(fix.contains("DNS"), "{fix}");
    }

    #[test]
    fn an_http_port_is_not_kafka_and_the_receive_size_advice_is_dropped() {
        // "HTTP" read as a big-endian length: 0x48545450 = 1213486160.
        let d = diagnose(
            Some(RDKafkaErrorCode::BadMessage),
            "127.0.0.1:39057/bootstrap: Receive failed: Invalid response size 1213486160 \
             (0..100000000): increase receive.message.max.bytes (after 0ms in state \
             APIVERSION_QUERY)",
        )
        .unwrap();
        assert_eq!(d.cause, Cause::NotKafka);
        assert!(d.cause.certain());
        assert!(
            !d.message.contains("receive.message.max.bytes"),
            "{}",
            d.message
        );
        let (what, fix) = d.what_and_fix();
        assert!(
            what.starts_with(
                "the port at 127.0.0.1:39057 does not speak the Kafka protocol (an HTTP server"
            ),
            "{what}"
        );
        assert!(what.contains("\"HTTP\""), "{what}");
        assert!(
            fix.contains("kafka.brokers") && fix.contains("security.protocol"),
            "{fix}"
        );
    }

    #[test]
    fn a_tls_port_is_told_from_its_alert() {
        // A TLS 1.2 alert record: 0x15 0x03 0x03, then the length's high byte.
        let size = i64::from(u32::from_be_bytes([0x15, 0x03, 0x03, 0x00]));
        let d = diagnose(
            None,
            &format!("k:9093/bootstrap: Receive failed: Invalid response size {size} (0..100000000): increase receive.message.max.bytes (after 2ms in state APIVERSION_QUERY)"),
        )
        .unwrap();
        assert_eq!(d.cause, Cause::NotKafka);
        let (what, fix) = d.what_and_fix();
        assert!(what.contains("speaks TLS"), "{what}");
        assert!(
            fix.contains("security.protocol to the listener's (SSL"),
            "{fix}"
        );
        // Other bytes: shown in hex, with the general guess.
        let d = diagnose(None, "k:1/bootstrap: Receive failed: Invalid response size -16777216 (0..100000000): increase receive.message.max.bytes").unwrap();
        assert!(d.message.contains("0xff000000"), "{}", d.message);
        assert!(d.message.contains("HTTP, TLS or other"), "{}", d.message);
    }

    #[test]
    fn timeouts_say_silent_host_or_firewall_and_are_not_certain() {
        for text in [
            "10.255.255.1:9092/bootstrap: Connection setup timed out in state CONNECT (after 30029ms in state CONNECT)",
            "10.255.255.1:9092/bootstrap: Connect to ipv4#10.255.255.1:9092 failed: Connection timed out (after 130000ms in state CONNECT)",
            "10.0.0.9:9092/bootstrap: Connect to ipv4#10.0.0.9:9092 failed: No route to host (after 3ms in state CONNECT)",
            "k:9092/1: 1 request(s) timed out: disconnect (average rtt 0.200ms)",
        ] {
            let d = diagnose(Some(RDKafkaErrorCode::BrokerTransportFailure), text)
                .unwrap_or_else(|| panic!("{text}"));
            assert_eq!(d.cause, Cause::TimedOut, "{text}");
            assert!(!d.cause.certain());
            assert!(d.message.contains("firewall"), "{}", d.message);
        }
        let d = silent("k:9092", std::time::Duration::from_secs(10), false);
        assert!(
            d.message.starts_with("no answer from k:9092 within 10s"),
            "{}",
            d.message
        );
        let d = silent("k:9092", std::time::Duration::from_secs(10), true);
        assert!(
            d.message
                .starts_with("k:9092 accepted the connection but did not answer"),
            "{}",
            d.message
        );
        assert!(
            d.message.contains("security.protocol to the listener's"),
            "{}",
            d.message
        );
    }

    #[test]
    fn an_accepted_connection_is_told_from_the_state_change() {
        let line = "[thrd:127.0.0.1:9093/bootstrap]: 127.0.0.1:9093/bootstrap: Broker changed state CONNECT -> APIVERSION_QUERY";
        assert_eq!(connected(line), Some("127.0.0.1:9093"));
        assert_eq!(
            connected("sasl_ssl://k:9093/bootstrap: Broker changed state CONNECT -> SSL_HANDSHAKE"),
            Some("sasl_ssl://k:9093")
        );
        assert_eq!(
            connected("127.0.0.1:1/bootstrap: Broker changed state CONNECT -> DOWN"),
            None
        );
        assert_eq!(
            connected("127.0.0.1:1/bootstrap: Broker changed state TRY_CONNECT -> CONNECT"),
            None
        );
    }

    #[test]
    fn relayed_texts_carry_the_cause_and_never_the_receive_size_advice() {
        let http = "[thrd:k:9092/1]: k:9092/1: Receive failed: Invalid response size 1213486160 (0..100000000): increase receive.message.max.bytes (after 0ms in state APIVERSION_QUERY)";
        let r = relayed(None, http);
        assert!(!r.contains("receive.message.max.bytes"), "{r}");
        assert!(r.contains("does not speak the Kafka protocol"), "{r}");
        let refused = "k:9092/1: Connect to ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT)";
        assert!(relayed(None, refused).starts_with("nothing listens at k:9092"));
        let other = "k:9092/1: Disconnected (after 60000ms in state UP)";
        assert_eq!(relayed(None, other), other);
    }

    #[test]
    fn other_texts_are_not_diagnosed() {
        for text in [
            "1/1 brokers are down",
            "k:9092/1: Disconnected (after 60000ms in state UP)",
            "Local: Broker transport failure",
        ] {
            assert_eq!(diagnose(None, text), None, "{text}");
        }
    }
}
