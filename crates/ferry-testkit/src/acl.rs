//! Kafka ACLs for tests, created through the plaintext listener (a super user) with librdkafka's
//! admin API (`rd_kafka_CreateAcls`: rust-rdkafka 0.39 does not wrap it), so no JVM starts per
//! grant. See [`crate::kafka::Security`] for the listener they apply to.

use std::ffi::{CStr, CString};
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};

/// What an ACL is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    /// A topic, by its literal name.
    Topic(String),
    /// A consumer group, by its literal name.
    Group(String),
    /// A transactional id, by its literal name.
    TransactionalId(String),
    /// Every transactional id that starts with the prefix.
    TransactionalIdPrefix(String),
    /// The cluster (`kafka-cluster`).
    Cluster,
}

/// An ACL operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Read,
    Write,
    Create,
    Describe,
    DescribeConfigs,
    IdempotentWrite,
}

/// One `ALLOW` ACL for a principal (`User:<name>`) from any host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    pub user: String,
    pub resource: Resource,
    pub operation: Operation,
}

impl Acl {
    /// ALLOW `User:<user>` `operation` on `resource`.
    pub fn allow(user: &str, operation: Operation, resource: Resource) -> Acl {
        Acl {
            user: user.to_string(),
            resource,
            operation,
        }
    }

    /// The `kafka-acls.sh` arguments that grant this ACL (for messages and documentation).
    pub fn kafka_acls_args(&self) -> String {
        let op = match self.operation {
            Operation::Read => "Read",
            Operation::Write => "Write",
            Operation::Create => "Create",
            Operation::Describe => "Describe",
            Operation::DescribeConfigs => "DescribeConfigs",
            Operation::IdempotentWrite => "IdempotentWrite",
        };
        let on = match &self.resource {
            Resource::Topic(t) => format!("--topic {t}"),
            Resource::Group(g) => format!("--group {g}"),
            Resource::TransactionalId(t) => format!("--transactional-id {t}"),
            Resource::TransactionalIdPrefix(t) => {
                format!("--resource-pattern-type prefixed --transactional-id {t}")
            }
            Resource::Cluster => "--cluster".to_string(),
        };
        format!(
            "--add --allow-principal User:{} --operation {op} {on}",
            self.user
        )
    }
}

/// Creates `acls` through `brokers` (a listener where the harness is a super user) and waits
/// for the broker's answer; panics with the broker's error for any ACL it refuses.
pub fn create_acls(brokers: &str, acls: &[Acl]) {
    if acls.is_empty() {
        return;
    }
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client for CreateAcls");
    let errors = create_with(&producer, acls, Duration::from_secs(30));
    assert!(errors.is_empty(), "CreateAcls refused: {errors:?}");
}

#[allow(unsafe_code)]
fn create_with(producer: &BaseProducer, acls: &[Acl], timeout: Duration) -> Vec<String> {
    let rk = producer.client().native_ptr();
    let mut errors = Vec::new();
    let mut bindings: Vec<*mut rd::rd_kafka_AclBinding_t> = Vec::new();
    let any_host = CString::new("*").expect("no NUL");
    for acl in acls {
        let pattern = match &acl.resource {
            Resource::TransactionalIdPrefix(_) => {
                rd::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_PREFIXED
            }
            _ => rd::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_LITERAL,
        };
        let (restype, name) = match &acl.resource {
            Resource::Topic(t) => (
                rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_TOPIC,
                t.as_str(),
            ),
            Resource::Group(g) => (
                rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_GROUP,
                g.as_str(),
            ),
            Resource::TransactionalId(t) | Resource::TransactionalIdPrefix(t) => (
                rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_TRANSACTIONAL_ID,
                t.as_str(),
            ),
            Resource::Cluster => (
                rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_BROKER,
                "kafka-cluster",
            ),
        };
        use rd::rd_kafka_AclOperation_t::*;
        let op = match acl.operation {
            Operation::Read => RD_KAFKA_ACL_OPERATION_READ,
            Operation::Write => RD_KAFKA_ACL_OPERATION_WRITE,
            Operation::Create => RD_KAFKA_ACL_OPERATION_CREATE,
            Operation::Describe => RD_KAFKA_ACL_OPERATION_DESCRIBE,
            Operation::DescribeConfigs => RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS,
            Operation::IdempotentWrite => RD_KAFKA_ACL_OPERATION_IDEMPOTENT_WRITE,
        };
        let name = CString::new(name).expect("no NUL in a resource name");
        let principal = CString::new(format!("User:{}", acl.user)).expect("no NUL in a user");
        let mut errstr = [0 as std::os::raw::c_char; 512];
        // SAFETY: every pointer is a live NUL-terminated string for the call; librdkafka copies
        // them. The binding returned is ours until rd_kafka_AclBinding_destroy below.
        let b = unsafe {
            rd::rd_kafka_AclBinding_new(
                restype,
                name.as_ptr(),
                pattern,
                principal.as_ptr(),
                any_host.as_ptr(),
                op,
                rd::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW,
                errstr.as_mut_ptr(),
                errstr.len(),
            )
        };
        if b.is_null() {
            // SAFETY: librdkafka wrote a NUL-terminated message into errstr.
            let msg = unsafe { CStr::from_ptr(errstr.as_ptr()) };
            errors.push(format!("{acl:?}: {}", msg.to_string_lossy()));
        } else {
            bindings.push(b);
        }
    }
    // SAFETY: `rk` is live while `producer` is borrowed; the queue, options and event are ours
    // and destroyed exactly once below; the result's pointers live as long as the event.
    unsafe {
        if errors.is_empty() {
            let queue = rd::rd_kafka_queue_new(rk);
            let options = rd::rd_kafka_AdminOptions_new(
                rk,
                rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_CREATEACLS,
            );
            rd::rd_kafka_CreateAcls(rk, bindings.as_mut_ptr(), bindings.len(), options, queue);
            let event = rd::rd_kafka_queue_poll(
                queue,
                i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX),
            );
            if event.is_null() {
                errors.push(format!("no CreateAcls answer within {timeout:?}"));
            } else {
                if rd::rd_kafka_event_error(event)
                    != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                {
                    let s = CStr::from_ptr(rd::rd_kafka_event_error_string(event));
                    errors.push(s.to_string_lossy().into_owned());
                } else {
                    let result = rd::rd_kafka_event_CreateAcls_result(event);
                    let mut n = 0usize;
                    let results = rd::rd_kafka_CreateAcls_result_acls(result, &mut n);
                    for (i, acl) in acls.iter().enumerate().take(n) {
                        let e = rd::rd_kafka_acl_result_error(*results.add(i));
                        if !e.is_null() {
                            let s = CStr::from_ptr(rd::rd_kafka_error_string(e));
                            errors.push(format!("{acl:?}: {}", s.to_string_lossy()));
                        }
                    }
                }
                rd::rd_kafka_event_destroy(event);
            }
            rd::rd_kafka_AdminOptions_destroy(options);
            rd::rd_kafka_queue_destroy(queue);
        }
        for b in bindings {
            rd::rd_kafka_AclBinding_destroy(b);
        }
    }
    let _ = producer.flush(Duration::ZERO);
    errors
}
