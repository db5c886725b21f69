//! `producer.override.*` (Java producer properties) to `[kafka]` keys and librdkafka's names in
//! `[kafka.properties]`, and the brokers.
//!
//! Java and librdkafka share many property names but not all, and librdkafka refuses unknown
//! ones, so only properties known to mean the same in both pass through ([`java_property`], from
//! librdkafka's CONFIGURATION.md and Kafka's ProducerConfig); the rest are listed. A SASL JAAS
//! config becomes `sasl.username` (or the Kerberos keytab and principal); Java key stores become
//! librdkafka's PEM or PKCS#12 settings where the format allows. Secrets (SASL and key store
//! passwords) are never written into the file: their line is commented out and the note names
//! the `FERRY_KAFKA_PROPERTIES_*` variable. Properties Ferry controls (`acks`,
//! `enable.idempotence`, the partitioner) are dropped when they already agree, noted otherwise.

use super::outbox::parse_bool;
use super::render::{Doc, Value, KAFKA, KAFKA_PROPERTIES, ROUTE};
use super::Target;
use super::{is_provider_ref, Options, Source, CHANGE_ME};

const OVERRIDE: &str = "producer.override.";

/// Translates the brokers and every `producer.override.*` option.
pub(super) fn translate(src: &mut Source<'_>, doc: &mut Doc, options: &Options) {
    brokers(src, doc, options);
    jaas(src, doc);
    stores(src, doc);
    for key in src.keys_with_prefix(OVERRIDE) {
        let Some(value) = src.peek(&key).map(str::to_owned) else {
            continue;
        };
        if is_provider_ref(&value) {
            src.note(
                &key,
                "a Kafka Connect config provider reference: put its value under librdkafka's \
                 name in [kafka.properties] (or its FERRY_KAFKA_PROPERTIES_* variable)",
            );
            continue;
        }
        match java_property(src.target, &key[OVERRIDE.len()..], &value) {
            Action::Property("message.max.bytes", v) => {
                payload_limit(doc, &key, &v);
                property(src, doc, &key, "message.max.bytes", v);
            }
            Action::Property(librdkafka, v) => property(src, doc, &key, librdkafka, v),
            Action::Key(ferry_key, v) => {
                src.take(&key);
                doc.set(KAFKA, ferry_key, v, Some(&key));
            }
            Action::Same => {
                src.take(&key);
            }
            Action::Note(why) => src.note(&key, why),
        }
    }
    for key in src.keys_with_prefix("producer.") {
        src.note(
            &key,
            "a worker property, not a connector option (those are producer.override.*): Kafka \
             Connect ignored it here",
        );
    }
}

/// `max.request.size` raised the largest record Debezium's producer sent: Ferry's payload limit
/// follows it, with the margin its default keeps under librdkafka's default `message.max.bytes`
/// (for the key, headers and batch overhead), so no event Debezium delivered is refused as too
/// large. A value the margin does not fit leaves the default (and `ferry` says what it refuses).
fn payload_limit(doc: &mut Doc, key: &str, value: &str) {
    use ferry_router::config::{DEFAULT_MAX_PAYLOAD_BYTES, LIBRDKAFKA_MESSAGE_MAX_BYTES};
    let margin = LIBRDKAFKA_MESSAGE_MAX_BYTES - DEFAULT_MAX_PAYLOAD_BYTES;
    let Some(limit) = value
        .trim()
        .parse::<usize>()
        .ok()
        .and_then(|v| v.checked_sub(margin))
        .filter(|l| *l > 0)
    else {
        return;
    };
    doc.set(
        ROUTE,
        "max_payload_bytes",
        Value::Int(limit as u64),
        Some(&format!(
            "{key} less {margin} bytes for the key, headers and batch"
        )),
    );
}

/// Writes a librdkafka property, or its commented line and a note when it is a secret, or a
/// note when Ferry refuses it.
fn property(src: &mut Source<'_>, doc: &mut Doc, key: &str, name: &'static str, value: String) {
    if let Some(why) = src.target.property_rule(name, &value) {
        src.note(key, format!("as {name}: {why}"));
    } else if src.target.is_secret_property(name) {
        src.note(
            key,
            format!(
                "a secret, not written into the file: set {} (librdkafka's {name})",
                env_name(name)
            ),
        );
        doc.commented(
            KAFKA_PROPERTIES,
            name,
            Value::str(""),
            Some(&format!("set {}", env_name(name))),
        );
    } else {
        src.take(key);
        doc.set(KAFKA_PROPERTIES, name, Value::Str(value), Some(key));
    }
}

/// `FERRY_KAFKA_PROPERTIES_<NAME>` for a librdkafka property.
fn env_name(property: &str) -> String {
    format!(
        "FERRY_KAFKA_PROPERTIES_{}",
        property.replace('.', "_").to_ascii_uppercase()
    )
}

fn brokers(src: &mut Source<'_>, doc: &mut Doc, options: &Options) {
    let key = "producer.override.bootstrap.servers";
    let from_connector = src
        .peek(key)
        .filter(|b| !is_provider_ref(b))
        .map(str::to_owned);
    if let Some(b) = options.brokers.as_deref().filter(|b| !b.trim().is_empty()) {
        doc.set(KAFKA, "brokers", Value::str(b.trim()), Some("--brokers"));
        if from_connector.is_some() {
            src.take(key);
        }
    } else if let Some(b) = from_connector {
        src.take(key);
        doc.set(KAFKA, "brokers", Value::Str(b), Some(key));
    } else {
        doc.set(
            KAFKA,
            "brokers",
            Value::Str(format!("{CHANGE_ME}:9092")),
            Some("not in a connector config"),
        );
        doc.caveat(
            KAFKA,
            "brokers",
            "A connector config has no brokers (they are the Kafka Connect worker's \
             bootstrap.servers): set them here or in FERRY_KAFKA_BROKERS.",
        );
        src.note_value(
            "bootstrap.servers",
            "(not in a connector config)",
            "set kafka.brokers (CHANGE-ME:9092 in the output) or FERRY_KAFKA_BROKERS to the \
             worker's bootstrap.servers, or pass --brokers",
        );
    }
}

/// What a Java producer property becomes.
enum Action {
    /// A librdkafka property (name, value).
    Property(&'static str, String),
    /// A `[kafka]` key.
    Key(&'static str, Value),
    /// What Ferry does anyway.
    Same,
    /// No equivalent: why.
    Note(String),
}

/// Java producer properties with a librdkafka or `[kafka]` equivalent (CONFIGURATION.md of
/// librdkafka, Kafka's ProducerConfig), and why the others have none.
fn java_property(target: &dyn Target, name: &str, value: &str) -> Action {
    const SAME_NAME: &[&str] = &[
        "client.id",
        "sasl.mechanism",
        "sasl.kerberos.service.name",
        "sasl.kerberos.kinit.cmd",
        "sasl.kerberos.min.time.before.relogin",
        "batch.size",
        "retries",
        "retry.backoff.ms",
        "retry.backoff.max.ms",
        "request.timeout.ms",
        "metadata.max.age.ms",
        "connections.max.idle.ms",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "socket.connection.setup.timeout.ms",
        "client.dns.lookup",
        "max.in.flight.requests.per.connection",
    ];
    if let Some(same) = SAME_NAME.iter().find(|n| **n == name) {
        return Action::Property(same, value.to_owned());
    }
    let ms = || value.parse::<u64>().ok();
    match name {
        "security.protocol" => Action::Property("security.protocol", value.to_ascii_lowercase()),
        "send.buffer.bytes" => Action::Property("socket.send.buffer.bytes", value.to_owned()),
        "receive.buffer.bytes" => Action::Property("socket.receive.buffer.bytes", value.to_owned()),
        "max.request.size" => Action::Property("message.max.bytes", value.to_owned()),
        "ssl.endpoint.identification.algorithm" => Action::Property(
            "ssl.endpoint.identification.algorithm",
            if value.is_empty() {
                "none".to_owned()
            } else {
                value.to_ascii_lowercase()
            },
        ),
        "ssl.key.password" => Action::Property("ssl.key.password", value.to_owned()),
        "compression.type" => match target.compression(&value.to_ascii_lowercase()) {
            Ok(codec) => Action::Key("compression", Value::str(codec)),
            Err(why) => Action::Note(why),
        },
        "linger.ms" => match ms() {
            Some(ms) if ms <= 900_000 => Action::Key(
                "linger",
                Value::Str(target.format_duration(std::time::Duration::from_millis(ms))),
            ),
            _ => Action::Note("not 0 to 900000 milliseconds".to_owned()),
        },
        "buffer.memory" => match ms() {
            Some(b)
                if b >= ferry_router::config::DEFAULT_MAX_PAYLOAD_BYTES as u64
                    && b <= target.max_in_flight_bytes() =>
            {
                Action::Key("max_in_flight_bytes", Value::Int(b))
            }
            _ => Action::Note(
                "out of kafka.max_in_flight_bytes's range (at least route.max_payload_bytes); \
                 Ferry's default is 32 MiB"
                    .to_owned(),
            ),
        },
        "acks" if ["all", "-1"].contains(&value.to_ascii_lowercase().as_str()) => Action::Same,
        "enable.idempotence" if parse_bool(value) == Some(true) => Action::Same,
        "acks" | "enable.idempotence" | "transactional.id" | "transaction.timeout.ms" => {
            Action::Note(target.property_rule(name, value).unwrap_or_default())
        }
        "delivery.timeout.ms" => Action::Note(
            "Ferry's kafka.delivery_timeout is 0 (never time out) by default, which keeps each \
             key's order through a broker outage; a finite value fails the record and restarts \
             from the checkpoint. Set it only if you need that bound"
                .to_owned(),
        ),
        "key.serializer" | "value.serializer" => Action::Note(
            "Kafka Connect always serialises bytes; what a consumer reads is decided by the \
             converters (see key.converter and value.converter)"
                .to_owned(),
        ),
        "ssl.cipher.suites" => Action::Note(
            "Java names cipher suites the IANA way, librdkafka the OpenSSL way: set \
             ssl.cipher.suites in [kafka.properties] with OpenSSL names"
                .to_owned(),
        ),
        n if n.starts_with("partitioner.") => Action::Note(
            "Ferry partitions as the Java client's default does (murmur2 of the key; or the \
             partition placement); it runs no partitioner classes"
                .to_owned(),
        ),
        _ => Action::Note(
            "a Java client property with no librdkafka equivalent; librdkafka's properties go in \
             [kafka.properties]"
                .to_owned(),
        ),
    }
}

/// `sasl.jaas.config`: the login module's options to librdkafka's SASL properties.
fn jaas(src: &mut Source<'_>, doc: &mut Doc) {
    let key = format!("{OVERRIDE}sasl.jaas.config");
    let Some(text) = src.peek(&key).map(str::to_owned) else {
        return;
    };
    let Some((module, opts)) = parse_jaas(&text) else {
        src.note(
            &key,
            "not a JAAS login module configuration Ferry can read: set sasl.username in \
             [kafka.properties] and FERRY_KAFKA_PROPERTIES_SASL_PASSWORD",
        );
        return;
    };
    let get = |k: &str| opts.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    if module.ends_with("PlainLoginModule") || module.ends_with("ScramLoginModule") {
        match get("username") {
            Some(u) if !is_provider_ref(&u) => {
                doc.set(KAFKA_PROPERTIES, "sasl.username", Value::Str(u), Some(&key));
            }
            _ => doc.commented(
                KAFKA_PROPERTIES,
                "sasl.username",
                Value::str(""),
                Some(&key),
            ),
        }
        doc.commented(
            KAFKA_PROPERTIES,
            "sasl.password",
            Value::str(""),
            Some("set FERRY_KAFKA_PROPERTIES_SASL_PASSWORD"),
        );
        src.note(
            &key,
            "the username went to sasl.username; the password is a secret, not written into the \
             file: set FERRY_KAFKA_PROPERTIES_SASL_PASSWORD",
        );
    } else if module.ends_with("Krb5LoginModule") {
        for (jaas_key, property) in [
            ("keyTab", "sasl.kerberos.keytab"),
            ("principal", "sasl.kerberos.principal"),
        ] {
            if let Some(v) = get(jaas_key) {
                doc.set(KAFKA_PROPERTIES, property, Value::Str(v), Some(&key));
            }
        }
        src.take(&key);
    } else {
        src.note(
            &key,
            format!(
                "librdkafka has no JAAS: for {module}, set its options as librdkafka properties \
                 (for OAUTHBEARER: sasl.oauthbearer.method = \"oidc\", sasl.oauthbearer.client.id, \
                 sasl.oauthbearer.token.endpoint.url, and FERRY_KAFKA_PROPERTIES_SASL_OAUTHBEARER_CLIENT_SECRET)"
            ),
        );
    }
}

/// `<module class> <flag> key=value ...;` to the class and its options (values unquoted).
fn parse_jaas(text: &str) -> Option<(String, Vec<(String, String)>)> {
    let text = text.trim().strip_suffix(';').unwrap_or(text.trim());
    let (module, rest) = text.split_once(char::is_whitespace)?;
    let rest = rest.trim_start();
    let (_flag, mut rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let mut opts = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let (k, after) = rest.split_once('=')?;
        let after = after.trim_start();
        let (v, next) = if let Some(quoted) = after.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => v.extend(chars.next().map(|(_, c)| c)),
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => v.push(c),
                }
            }
            (v, &quoted[end?..])
        } else {
            let end = after.find(char::is_whitespace).unwrap_or(after.len());
            (after[..end].to_owned(), &after[end..])
        };
        opts.push((k.trim().to_owned(), v));
        rest = next;
    }
    Some((module.to_owned(), opts))
}

/// Trust and key stores: librdkafka reads PEM files (and PKCS#12 key stores), Java defaults to JKS.
fn stores(src: &mut Source<'_>, doc: &mut Doc) {
    let k = |n: &str| format!("{OVERRIDE}{n}");
    let trust_type = src
        .peek(&k("ssl.truststore.type"))
        .unwrap_or("JKS")
        .to_ascii_uppercase();
    if let Some(pem) = src
        .peek(&k("ssl.truststore.certificates"))
        .map(str::to_owned)
    {
        src.take(&k("ssl.truststore.certificates"));
        doc.set(
            KAFKA_PROPERTIES,
            "ssl.ca.pem",
            Value::Str(pem),
            Some(&k("ssl.truststore.certificates")),
        );
        src.take(&k("ssl.truststore.type"));
    }
    if let Some(location) = src.peek(&k("ssl.truststore.location")).map(str::to_owned) {
        if trust_type == "PEM" {
            src.take(&k("ssl.truststore.location"));
            src.take(&k("ssl.truststore.type"));
            src.take(&k("ssl.truststore.password"));
            doc.set(
                KAFKA_PROPERTIES,
                "ssl.ca.location",
                Value::Str(location),
                Some(&k("ssl.truststore.location")),
            );
        } else {
            src.note(
                &k("ssl.truststore.location"),
                format!(
                    "a {trust_type} trust store; librdkafka reads CA certificates as PEM: export them \
                     (keytool -exportcert -rfc -keystore {location} -alias <ca> > ca.pem, or \
                     openssl pkcs12 -in {location} -nokeys -out ca.pem) and set ssl.ca.location"
                ),
            );
        }
    }
    for n in ["ssl.truststore.type", "ssl.truststore.password"] {
        src.note(&k(n), "belongs to ssl.truststore.location (see there)");
    }
    let key_type = src
        .peek(&k("ssl.keystore.type"))
        .unwrap_or("JKS")
        .to_ascii_uppercase();
    if let Some(location) = src.peek(&k("ssl.keystore.location")).map(str::to_owned) {
        if key_type == "PKCS12" {
            src.take(&k("ssl.keystore.type"));
            property(
                src,
                doc,
                &k("ssl.keystore.location"),
                "ssl.keystore.location",
                location,
            );
            if let Some(pw) = src.peek(&k("ssl.keystore.password")).map(str::to_owned) {
                property(
                    src,
                    doc,
                    &k("ssl.keystore.password"),
                    "ssl.keystore.password",
                    pw,
                );
            }
        } else {
            src.note(
                &k("ssl.keystore.location"),
                format!(
                    "a {key_type} key store; librdkafka reads PKCS#12 (ssl.keystore.location) or PEM \
                     (ssl.certificate.location + ssl.key.location): convert it (keytool \
                     -importkeystore -srckeystore {location} -destkeystore client.p12 \
                     -deststoretype PKCS12)"
                ),
            );
        }
    }
    for (java, librdkafka) in [
        ("ssl.keystore.certificate.chain", "ssl.certificate.pem"),
        ("ssl.keystore.key", "ssl.key.pem"),
    ] {
        if let Some(v) = src.peek(&k(java)).map(str::to_owned) {
            src.take(&k("ssl.keystore.type"));
            property(src, doc, &k(java), librdkafka, v);
        }
    }
    for n in ["ssl.keystore.type", "ssl.keystore.password"] {
        src.note(&k(n), "belongs to ssl.keystore.location (see there)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jaas_configs_parse_into_module_and_options() {
        let (m, o) = parse_jaas(
            r#"org.apache.kafka.common.security.scram.ScramLoginModule required username="ferry" password="p\"w;x";"#,
        )
        .unwrap();
        assert_eq!(m, "org.apache.kafka.common.security.scram.ScramLoginModule");
        assert_eq!(
            o,
            [
                ("username".into(), "ferry".into()),
                ("password".into(), "p\"w;x".into())
            ]
        );
        let (_, o) = parse_jaas(
            "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true keyTab=/k.keytab principal=\"ferry@EX.COM\";",
        )
        .unwrap();
        assert_eq!(o[1], ("keyTab".into(), "/k.keytab".into()));
        assert_eq!(parse_jaas("justamodule"), None);
        assert_eq!(parse_jaas("M required user=\"unterminated"), None);
    }

    #[test]
    fn environment_names_of_properties() {
        assert_eq!(
            env_name("sasl.password"),
            "FERRY_KAFKA_PROPERTIES_SASL_PASSWORD"
        );
    }

    #[test]
    fn java_properties_map_to_librdkafka_names_or_notes() {
        let java_property = |n: &str, v: &str| super::java_property(&crate::TestTarget, n, v);
        let prop = |n: &str, v: &str| match java_property(n, v) {
            Action::Property(name, v) => Some((name, v)),
            _ => None,
        };
        assert_eq!(
            prop("security.protocol", "SASL_SSL"),
            Some(("security.protocol", "sasl_ssl".into()))
        );
        assert_eq!(
            prop("max.request.size", "2097152"),
            Some(("message.max.bytes", "2097152".into()))
        );
        assert_eq!(
            prop("send.buffer.bytes", "131072"),
            Some(("socket.send.buffer.bytes", "131072".into()))
        );
        assert_eq!(
            prop("ssl.endpoint.identification.algorithm", ""),
            Some(("ssl.endpoint.identification.algorithm", "none".into()))
        );
        assert!(matches!(java_property("acks", "all"), Action::Same));
        assert!(matches!(java_property("acks", "1"), Action::Note(n) if n.contains("acks=all")));
        assert!(
            matches!(java_property("linger.ms", "20"), Action::Key("linger", Value::Str(s)) if s == "20ms")
        );
        assert!(matches!(
            java_property("buffer.memory", "1000"),
            Action::Note(_)
        ));
        assert!(matches!(
            java_property("max.block.ms", "1000"),
            Action::Note(_)
        ));
    }
}
