//! Kafka authorization failures: which ACL Ferry's principal lacks, and the `kafka-acls`
//! command that grants it.
//!
//! A broker that refuses an operation (TOPIC_, CLUSTER_, TRANSACTIONAL_ID_ or
//! GROUP_AUTHORIZATION_FAILED) refuses it again on every retry until an operator grants an ACL,
//! so Ferry stops with the grant in the message instead of retrying. The ACLs Ferry needs, per
//! mode, are in the README ("Kafka ACLs (least privilege)"):
//!
//! | resource | operations | when |
//! |---|---|---|
//! | each outbox topic | Write | always |
//! | the progress topic | Read, Write, Create | always |
//! | transactional id `ferry-<system id>-<slot>` | Write | `kafka.exactly_once` |
//!
//! Kafka implies Describe from Read and Write, so it needs no ACL of its own.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// What a refused request was for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    /// An outbox (or dead-letter) topic Ferry produces to.
    Topic(String),
    /// Ferry's progress topic.
    ProgressTopic(String),
    /// An exactly-once producer's transactional id.
    TransactionalId(String),
    /// The cluster: an idempotent producer id, which a Kafka 3+ broker grants to a principal
    /// allowed to Write to some topic (older brokers: IdempotentWrite on the cluster).
    Cluster,
}

impl Resource {
    /// The operations Ferry needs on the resource, as `kafka-acls --operation` names them
    /// (Describe too, which Kafka implies from Read and Write).
    pub fn operations(&self) -> &'static [&'static str] {
        match self {
            Resource::Topic(_) | Resource::TransactionalId(_) => &["Write"],
            Resource::ProgressTopic(_) => &["Read", "Write", "Create"],
            Resource::Cluster => &["IdempotentWrite"],
        }
    }

    fn describe(&self) -> String {
        match self {
            Resource::Topic(t) => format!("topic {t:?}"),
            Resource::ProgressTopic(t) => {
                format!("the progress topic {t:?} (kafka.progress_topic)")
            }
            Resource::TransactionalId(t) => format!("transactional id {t:?} (kafka.exactly_once)"),
            Resource::Cluster => "the cluster (an idempotent producer id)".into(),
        }
    }

    fn acls_arg(&self) -> String {
        match self {
            Resource::Topic(t) | Resource::ProgressTopic(t) => format!("--topic {}", shell_word(t)),
            Resource::TransactionalId(t) => format!("--transactional-id {}", shell_word(t)),
            Resource::Cluster => "--cluster".into(),
        }
    }
}

/// Whether `code` says the broker refused the principal (rather than the request).
pub fn is_authorization(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
            | RDKafkaErrorCode::GroupAuthorizationFailed
            | RDKafkaErrorCode::DelegationTokenAuthorizationFailed
    )
}

/// The error's code, if it is an authorization failure.
pub fn authorization_code(e: &KafkaError) -> Option<RDKafkaErrorCode> {
    match e {
        // rust-rdkafka gives no code for an admin operation's error.
        KafkaError::AdminOp(code) => Some(*code),
        e => e.rdkafka_error_code(),
    }
    .filter(|c| is_authorization(*c))
}

/// Ferry's principal as the broker names it: `User:<sasl.username>` with SASL/PLAIN or SCRAM,
/// else a placeholder (with TLS client certificates the principal is the certificate's
/// distinguished name, mapped by the broker's `ssl.principal.mapping.rules`).
pub fn principal(properties: &[(String, String)]) -> String {
    properties
        .iter()
        .rev()
        .find(|(k, _)| k == "sasl.username")
        .map(|(_, v)| format!("User:{v}"))
        .unwrap_or_else(|| "User:<Ferry's principal>".into())
}

/// The `kafka-acls.sh` command that grants `resource`'s operations to Ferry's principal.
pub fn grant_command(resource: &Resource, properties: &[(String, String)]) -> String {
    let brokers = crate::kafka_client::bootstrap_servers(properties);
    let ops: String = resource
        .operations()
        .iter()
        .map(|o| format!(" --operation {o}"))
        .collect();
    format!(
        "kafka-acls.sh --bootstrap-server {brokers} --command-config <an admin's client properties> --add \
         --allow-principal {}{ops} {}",
        shell_word(&principal(properties)),
        resource.acls_arg()
    )
}

/// The whole message: what was refused, to whom, why Ferry stops, and the grant.
pub fn denied(
    code: RDKafkaErrorCode,
    doing: &str,
    resource: &Resource,
    properties: &[(String, String)],
) -> String {
    let why = match resource {
        Resource::Cluster => {
            "; a Kafka 3+ broker grants an idempotent producer id to a principal that may Write to \
             some topic, so this means Ferry may write to none of its topics: grant the topic ACLs \
             (README, \"Kafka ACLs (least privilege)\"), or on older brokers IdempotentWrite on the cluster"
        }
        _ => "",
    };
    format!(
        "Kafka refused {doing}: {code} ({}) for principal {} on {}{why}. The broker refuses this on every \
         retry until an ACL grants it, so Ferry stops instead of retrying. Grant it (README, \"Kafka \
         ACLs (least privilege)\"): {}",
        code_name(code),
        principal(properties),
        resource.describe(),
        grant_command(resource, properties)
    )
}

/// The protocol's name of an authorization error, as broker logs and Kafka's docs spell it.
fn code_name(code: RDKafkaErrorCode) -> &'static str {
    match code {
        RDKafkaErrorCode::TopicAuthorizationFailed => "TOPIC_AUTHORIZATION_FAILED",
        RDKafkaErrorCode::ClusterAuthorizationFailed => "CLUSTER_AUTHORIZATION_FAILED",
        RDKafkaErrorCode::TransactionalIdAuthorizationFailed => {
            "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
        }
        RDKafkaErrorCode::GroupAuthorizationFailed => "GROUP_AUTHORIZATION_FAILED",
        _ => "an authorization failure",
    }
}

/// `s` quoted for a POSIX shell when it needs it.
fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/,=@+".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props() -> Vec<(String, String)> {
        [
            ("bootstrap.servers", "k1:9093,k2:9093"),
            ("sasl.username", "ferry"),
            ("sasl.password", "hunter2"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    #[test]
    fn the_grant_names_the_principal_the_operations_and_the_resource() {
        assert_eq!(
            grant_command(&Resource::Topic("orders".into()), &props()),
            "kafka-acls.sh --bootstrap-server k1:9093,k2:9093 --command-config <an admin's client \
             properties> --add --allow-principal User:ferry --operation Write --topic orders"
        );
        assert!(grant_command(&Resource::ProgressTopic("p".into()), &props()).ends_with(
            "--allow-principal User:ferry --operation Read --operation Write --operation Create --topic p"
        ));
        assert!(
            grant_command(&Resource::TransactionalId("ferry-1-s".into()), &props())
                .ends_with("User:ferry --operation Write --transactional-id ferry-1-s")
        );
        assert!(grant_command(&Resource::Cluster, &props())
            .ends_with("--operation IdempotentWrite --cluster"));
    }

    #[test]
    fn without_sasl_the_principal_is_a_placeholder_quoted_for_the_shell() {
        let p = vec![("bootstrap.servers".to_string(), "k:9093".to_string())];
        assert!(grant_command(&Resource::Topic("a b".into()), &p)
            .contains("--allow-principal 'User:<Ferry'\\''s principal>' --operation"));
        assert!(grant_command(&Resource::Topic("a b".into()), &p).ends_with("--topic 'a b'"));
    }

    #[test]
    fn the_message_never_holds_the_password() {
        let m = denied(
            RDKafkaErrorCode::TopicAuthorizationFailed,
            "a record",
            &Resource::Topic("orders".into()),
            &props(),
        );
        assert!(!m.contains("hunter2"), "{m}");
        assert!(m.contains("TOPIC_AUTHORIZATION_FAILED"), "{m}");
        assert!(
            m.contains("principal User:ferry on topic \"orders\""),
            "{m}"
        );
    }

    #[test]
    fn an_admin_operation_refused_is_an_authorization_failure() {
        let e = KafkaError::AdminOp(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert_eq!(
            authorization_code(&e),
            Some(RDKafkaErrorCode::TopicAuthorizationFailed)
        );
        let e = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(authorization_code(&e), None);
    }

    #[test]
    fn only_authorization_codes_are_authorization_failures() {
        use RDKafkaErrorCode::*;
        for c in [
            TopicAuthorizationFailed,
            ClusterAuthorizationFailed,
            TransactionalIdAuthorizationFailed,
            GroupAuthorizationFailed,
        ] {
            assert!(is_authorization(c), "{c:?}");
        }
        for c in [
            SaslAuthenticationFailed,
            UnknownTopicOrPartition,
            MessageSizeTooLarge,
            Fatal,
        ] {
            assert!(!is_authorization(c), "{c:?}");
        }
    }
}
