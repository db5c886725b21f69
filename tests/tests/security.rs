//! Ferry against a secured broker: SASL_SSL (SCRAM-SHA-512 over TLS) with Kafka's
//! StandardAuthorizer and no ACL but the ones a test grants. One broker for the file; every
//! test runs as users of its own (created with SCRAM at format time), so their ACLs never mix.
//!
//! What is verified: the least-privilege ACLs of each mode (README, "Kafka ACLs (least
//! privilege)") are enough to relay and restart and for `ferry check`; without any one of them
//! Ferry stops with a permanent error naming the resource, the operation and the grant; and a
//! wrong password, a CA that did not sign the brokers' certificates, or a plaintext client on the
//! TLS listener each end in a clear error.

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use ferry_testkit::acl::{self, Acl, Operation, Resource};
use ferry_testkit::kafka::{ClusterOptions, LocalBroker, Security};

const PASSWORD: &str = "s3cret-pw";

/// Every user a test of this file runs Ferry as (one broker: SCRAM users are made at format).
const USERS: &[&str] = &[
    "minimal-alo",
    "minimal-eos",
    "missing-alo-0",
    "missing-alo-1",
    "missing-alo-2",
    "missing-alo-3",
    "missing-alo-4",
    "missing-alo-5",
    "missing-alo-6",
    "missing-eos-0",
    "missing-eos-1",
    "missing-eos-2",
    "missing-eos-3",
    "missing-eos-4",
    "missing-eos-5",
    "missing-eos-6",
    "missing-eos-7",
    "mistakes",
    "no-create",
];

/// How long a Ferry that lacks an ACL may take to stop.
const STOP_DEADLINE: Duration = Duration::from_secs(45);

fn broker() -> &'static LocalBroker {
    static B: OnceLock<LocalBroker> = OnceLock::new();
    B.get_or_init(|| {
        LocalBroker::start_blocking_with(ClusterOptions {
            security: Some(Security {
                users: USERS
                    .iter()
                    .map(|u| (u.to_string(), PASSWORD.to_string()))
                    .collect(),
            }),
            ..Default::default()
        })
    })
}

/// A world whose Ferry connects to the `SASL_SSL` listener as `user` (the harness itself uses
/// the plaintext listener, a super user).
async fn world_as(user: &str) -> World {
    let b = tokio::task::spawn_blocking(broker).await.unwrap();
    let mut w = World::on(ferry_testkit::pg::shared().create_db().await, b.brokers()).await;
    w.env.extend(
        [
            ("FERRY_KAFKA_BROKERS", b.sasl_brokers().unwrap()),
            (
                "FERRY_KAFKA_PROPERTIES_SECURITY_PROTOCOL",
                "SASL_SSL".into(),
            ),
            (
                "FERRY_KAFKA_PROPERTIES_SASL_MECHANISM",
                "SCRAM-SHA-512".into(),
            ),
            ("FERRY_KAFKA_PROPERTIES_SASL_USERNAME", user.into()),
            ("FERRY_KAFKA_PROPERTIES_SASL_PASSWORD", PASSWORD.into()),
            (
                "FERRY_KAFKA_PROPERTIES_SSL_CA_LOCATION",
                b.ca_cert().unwrap().display().to_string(),
            ),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    w
}

/// The `transactional.id` an exactly-once Ferry uses for this world's slot.
async fn transactional_id(w: &World) -> String {
    let id: i64 = w
        .sql
        .query_one("SELECT system_identifier FROM pg_control_system()", &[])
        .await
        .unwrap()
        .get(0);
    format!("ferry-{id}-{}", w.slot)
}

/// The least-privilege ACLs of a mode, for `user` in world `w` with outbox topic `topic`: what
/// the README's table says, one entry per (resource, operation).
async fn minimal_acls(w: &World, user: &str, topic: &str, exactly_once: bool) -> Vec<Acl> {
    let mut acls = vec![
        Acl::allow(user, Operation::Write, Resource::Topic(topic.into())),
        Acl::allow(user, Operation::Create, Resource::Topic(w.progress_topic())),
        Acl::allow(user, Operation::Read, Resource::Topic(w.progress_topic())),
        Acl::allow(user, Operation::Write, Resource::Topic(w.progress_topic())),
    ];
    if exactly_once {
        let id = transactional_id(w).await;
        acls.push(Acl::allow(
            user,
            Operation::Write,
            Resource::TransactionalId(id),
        ));
    }
    acls
}

/// `ferry check`'s own transactional producer (`ferry-check-<pid>`) in exactly-once mode.
fn check_acls(user: &str) -> Vec<Acl> {
    vec![Acl::allow(
        user,
        Operation::Write,
        Resource::TransactionalIdPrefix("ferry-check-".into()),
    )]
}

async fn grant(acls: Vec<Acl>) {
    let brokers = broker().brokers();
    tokio::task::spawn_blocking(move || acl::create_acls(&brokers, &acls))
        .await
        .unwrap();
}

async fn check(w: &World) -> (Option<i32>, String) {
    let mut ferry = Ferry::spawn(w, &["check"]);
    let status = ferry.wait_exit(Duration::from_secs(60)).await;
    (status.code(), ferry.log_text())
}

/// The denials the broker logged for `user`.
fn denials_of(user: &str) -> Vec<String> {
    let who = format!("Principal = User:{user} ");
    broker()
        .denials()
        .into_iter()
        .filter(|d| d.contains(&who))
        .collect()
}

/// [`world_as`] in exactly-once mode (50 ms transactions) or not.
async fn world_in_mode(user: &str, exactly_once: bool) -> World {
    let mut w = world_as(user).await;
    if exactly_once {
        w.env
            .push(("FERRY_KAFKA_EXACTLY_ONCE".into(), "true".into()));
        w.env
            .push(("FERRY_KAFKA_TRANSACTION_INTERVAL".into(), "50ms".into()));
    }
    w
}

/// Relays with exactly the least-privilege ACLs, restarts (reading its progress records back),
/// relays again, and `ferry check` passes; the broker denied nothing but the harmless group
/// lookup of the progress reader.
async fn relays_with_the_minimal_acls(user: &str, exactly_once: bool) {
    let started = Instant::now();
    let w = world_in_mode(user, exactly_once).await;
    let topic = w.create_topic("order", 1).await;
    let mut acls = minimal_acls(&w, user, &topic, exactly_once).await;
    if exactly_once {
        acls.extend(check_acls(user));
    }
    grant(acls).await;

    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.insert("order", "o-1", "OrderCreated", r#"{"n":1}"#).await;
    let got = w.consume(&topic, 1).await;
    assert_eq!(got[0].key.as_deref(), Some(&b"o-1"[..]));
    // A progress record is written once the record is confirmed; then restart, so that the
    // next start reads the progress topic back (Read) with records in it.
    wait_until("a progress record", Duration::from_secs(30), || {
        let (b, t) = (w.brokers.clone(), w.progress_topic());
        async move {
            tokio::task::spawn_blocking(move || {
                ferry_testkit::kafka::partition_count(&b, &t).is_some()
                    && watermark_high(&b, &t) > 0
            })
            .await
            .unwrap()
        }
    })
    .await;
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.insert("order", "o-2", "OrderCreated", r#"{"n":2}"#).await;
    let got = w.consume(&topic, 2).await;
    let keys: Vec<_> = got.iter().map(|c| c.key.clone().unwrap()).collect();
    assert_eq!(
        keys,
        [b"o-1".to_vec(), b"o-2".to_vec()],
        "{}",
        ferry.log_text()
    );
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
    let log = ferry.log_text();
    assert!(!log.contains("ERROR"), "{log}");

    let (code, out) = check(&w).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("OK: Ferry can run"), "{out}");
    // Without DescribeConfigs on the progress topic, `check` cannot judge its configuration
    // and says what it should be instead.
    assert!(
        out.contains(&format!(
            "note: cannot read the progress topic {:?}'s configuration",
            w.progress_topic()
        )) && out.contains("fix: make sure it is cleanup.policy=compact, segment.ms=600000"),
        "{out}"
    );

    let denied: Vec<String> = denials_of(user)
        .into_iter()
        .filter(|d| !d.contains("Group:LITERAL:ferry-progress-reader"))
        .collect();
    // `ferry check` asks the broker's configuration (DescribeConfigs on the cluster), which it
    // may lack: it then says it could not see it.
    let denied: Vec<String> = denied
        .into_iter()
        .filter(|d| !d.contains("operation = DESCRIBE_CONFIGS"))
        .collect();
    assert!(denied.is_empty(), "{denied:#?}");
    eprintln!("{user}: {:?}", started.elapsed());
}

fn watermark_high(brokers: &str, topic: &str) -> i64 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    c.fetch_watermarks(topic, 0, Duration::from_secs(5))
        .map(|(_, h)| h)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_ferry_relays_restarts_and_checks_with_only_the_minimal_acls() {
    relays_with_the_minimal_acls("minimal-alo", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_ferry_relays_restarts_and_checks_with_only_the_minimal_acls() {
    relays_with_the_minimal_acls("minimal-eos", true).await;
}

/// A progress topic an admin created (1 partition) needs no Create ACL: Ferry's CreateTopics
/// for it is answered "already exists" (or refused), and it goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_progress_topic_needs_no_create_acl() {
    let user = "no-create";
    let w = world_as(user).await;
    let topic = w.create_topic("order", 1).await;
    ferry_testkit::kafka::create_topic(&w.brokers, &w.progress_topic(), 1).await;
    let acls = minimal_acls(&w, user, &topic, false)
        .await
        .into_iter()
        .filter(|a| a.operation != Operation::Create)
        .collect();
    grant(acls).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.insert("order", "o-1", "OrderCreated", "{}").await;
    w.consume(&topic, 1).await;
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

/// One least-privilege ACL left out: Ferry must stop (exit non-zero) within the deadline with
/// a message that names the resource, the authorization error and the grant.
async fn stops_without(user: String, exactly_once: bool, left_out: usize) -> String {
    let w = world_in_mode(&user, exactly_once).await;
    let topic = w.create_topic("order", 1).await;
    let mut acls = minimal_acls(&w, &user, &topic, exactly_once).await;
    let missing = if left_out < acls.len() {
        Some(acls.remove(left_out))
    } else {
        // Past the list: no Write anywhere (the broker then refuses the idempotent producer id).
        acls.retain(|a| a.operation != Operation::Write);
        None
    };
    if matches!(&missing, Some(a) if a.operation == Operation::Read) {
        // Read matters once the progress topic holds records: an earlier run's (here one the
        // harness writes under another key).
        ferry_testkit::kafka::create_topic(&w.brokers, &w.progress_topic(), 1).await;
        produce_one(&w.brokers, &w.progress_topic()).await;
    }
    grant(acls).await;
    let started = Instant::now();
    let mut ferry = w.start_ferry();
    // A record to relay once Ferry streams (it creates the slot at the server's position then),
    // unless it stopped before.
    let deadline = Instant::now() + STOP_DEADLINE;
    while ferry.is_running() && w.confirmed_lsn().await.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w.insert("order", "o-1", "OrderCreated", "{}").await;
    eprintln!(
        "{user}: without {missing:?}, Ferry log {}",
        ferry.log.display()
    );
    let status = ferry.wait_exit(STOP_DEADLINE).await;
    let log = ferry.log_text();
    let what = format!("{user} without {missing:?}: {status}\n{log}");
    assert!(!status.success(), "{what}");
    let (code, resource, grant) = match &missing {
        None => (
            "CLUSTER_AUTHORIZATION_FAILED",
            "the cluster".to_string(),
            "--operation IdempotentWrite --cluster".to_string(),
        ),
        Some(a) => match &a.resource {
            Resource::Topic(t) if *t == topic => (
                "TOPIC_AUTHORIZATION_FAILED",
                format!("topic {t:?}"),
                format!("--operation Write --topic {t}"),
            ),
            Resource::Topic(t) => (
                "TOPIC_AUTHORIZATION_FAILED",
                format!("the progress topic {t:?}"),
                format!("--operation Read --operation Write --operation Create --topic {t}"),
            ),
            Resource::TransactionalId(t) => (
                "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
                format!("transactional id {t:?}"),
                format!("--operation Write --transactional-id {t}"),
            ),
            r => panic!("{r:?}"),
        },
    };
    let stop = log
        .lines()
        .find(|l| l.contains("stopping: permanent error"))
        .unwrap_or_else(|| panic!("no final error line: {what}"));
    // With no Write anywhere, two refusals race, and either names a grant that fixes it: the
    // producer id (IdempotentWrite on the cluster), or the outbox topic's metadata (Write on
    // the topic, which implies IdempotentWrite), whichever librdkafka reports first.
    let (code, resource, grant) = match missing {
        None if stop.contains("TOPIC_AUTHORIZATION_FAILED") => (
            "TOPIC_AUTHORIZATION_FAILED",
            format!("topic {topic:?}"),
            format!("--operation Write --topic {topic}"),
        ),
        _ => (code, resource, grant),
    };
    for needle in [
        code,
        &format!("for principal User:{user} on {resource}"),
        &format!("--allow-principal User:{user} {grant}"),
        "Ferry stops instead of retrying",
    ] {
        assert!(stop.contains(needle), "{needle:?} missing: {what}");
    }
    assert!(!log.contains(PASSWORD), "{what}");
    assert!(!log.contains("session ended"), "retried: {what}");
    format!(
        "{user}: {missing:?} -> stopped in {:?}: {stop}",
        started.elapsed()
    )
}

async fn produce_one(brokers: &str, topic: &str) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let p: FutureProducer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    p.send(
        FutureRecord::to(topic).key("not-ferry").payload("x"),
        Duration::from_secs(10),
    )
    .await
    .expect("produce");
}

/// Every case of a mode, a few at a time (each its own user, database and topics).
async fn every_acl_is_needed(exactly_once: bool, cases: usize) {
    let prefix = if exactly_once {
        "missing-eos"
    } else {
        "missing-alo"
    };
    let mut results = Vec::new();
    let all: Vec<usize> = (0..cases).collect();
    for chunk in all.chunks(3) {
        let runs = chunk
            .iter()
            .map(|&i| tokio::spawn(stops_without(format!("{prefix}-{i}"), exactly_once, i)));
        for r in runs.collect::<Vec<_>>() {
            results.push(r.await.unwrap());
        }
    }
    eprintln!("{}", results.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_ferry_stops_with_the_grant_when_any_minimal_acl_is_missing() {
    // Four ACLs left out one at a time, then no Write at all.
    every_acl_is_needed(false, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_ferry_stops_with_the_grant_when_any_minimal_acl_is_missing() {
    every_acl_is_needed(true, 5).await;
}

/// A CA certificate that signed nothing the brokers present.
fn wrong_ca() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ferry-wrong-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=not-the-brokers-ca", "-keyout"])
        .arg(dir.join("ca.key"))
        .arg("-out")
        .arg(dir.join("ca.crt"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    dir.join("ca.crt")
}

/// A client mistake: the environment to change, and what `run` and `check` must say.
struct Mistake {
    name: &'static str,
    set: Vec<(&'static str, String)>,
    /// Drop the SASL and TLS properties (a plaintext client).
    plaintext: bool,
    /// What the message names as the fix.
    fix: &'static str,
    /// Whether `ferry run` stops (a refused password, an untrusted CA) or retries with the
    /// hint (a connection closed at the first request may also be a broker going down).
    run_stops: bool,
}

fn mistakes() -> Vec<Mistake> {
    vec![
        Mistake {
            name: "a wrong password",
            set: vec![("FERRY_KAFKA_PROPERTIES_SASL_PASSWORD", "not-it".into())],
            plaintext: false,
            fix: "check kafka.properties sasl.username and sasl.password",
            run_stops: true,
        },
        Mistake {
            name: "a CA that did not sign the brokers' certificates",
            set: vec![(
                "FERRY_KAFKA_PROPERTIES_SSL_CA_LOCATION",
                wrong_ca().display().to_string(),
            )],
            plaintext: false,
            fix: "set kafka.properties ssl.ca.location to the CA certificate",
            run_stops: true,
        },
        Mistake {
            name: "a plaintext client on the SASL_SSL listener",
            set: vec![(
                "FERRY_KAFKA_PROPERTIES_SECURITY_PROTOCOL",
                "PLAINTEXT".into(),
            )],
            plaintext: true,
            fix: "set kafka.properties security.protocol to the listener's",
            run_stops: false,
        },
    ]
}

async fn mistaken_world(m: &Mistake) -> World {
    let mut w = world_as("mistakes").await;
    if m.plaintext {
        w.env.retain(|(k, _)| {
            !k.starts_with("FERRY_KAFKA_PROPERTIES_SASL")
                && !k.starts_with("FERRY_KAFKA_PROPERTIES_SSL")
        });
    }
    for (k, v) in &m.set {
        w.env.retain(|(key, _)| key != k);
        w.env.push((k.to_string(), v.clone()));
    }
    w
}

/// `ferry run` with each mistake: stops with what is wrong and the fix (a wrong password, a
/// wrong CA), or keeps retrying and says the likely fix (plaintext on the TLS listener).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_says_what_is_wrong_with_a_wrong_password_a_wrong_ca_or_plaintext_on_tls() {
    let started = Instant::now();
    let runs = mistakes().into_iter().map(|m| {
        tokio::spawn(async move {
            let w = mistaken_world(&m).await;
            let mut ferry = w.start_ferry();
            if m.run_stops {
                // Three probes in a row, 0.5 s and 1 s apart (see `pipeline::Supervisor`).
                let status = ferry.wait_exit(Duration::from_secs(30)).await;
                let log = ferry.log_text();
                assert_eq!(status.code(), Some(1), "{}: {log}", m.name);
                let stop = log
                    .lines()
                    .find(|l| l.contains("stopping: permanent error"))
                    .unwrap_or_default();
                assert!(
                    stop.contains("cannot use the Kafka brokers: "),
                    "{}: {log}",
                    m.name
                );
                assert!(stop.contains(m.fix), "{}: {log}", m.name);
            } else {
                ferry
                    .wait_log(
                        "the Kafka brokers cannot be used: ",
                        Duration::from_secs(30),
                    )
                    .await;
                assert!(
                    ferry.log_text().contains(m.fix),
                    "{}: {}",
                    m.name,
                    ferry.log_text()
                );
                assert!(ferry.is_running(), "{}", ferry.log_text());
            }
            assert!(!ferry.log_text().contains(PASSWORD), "{}", ferry.log_text());
        })
    });
    for r in runs.collect::<Vec<_>>() {
        r.await.unwrap();
    }
    eprintln!("run with mistakes: {:?}", started.elapsed());
}

/// `ferry check` with each mistake: an error that says what is wrong and the fix, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_says_what_is_wrong_with_a_wrong_password_a_wrong_ca_or_plaintext_on_tls() {
    let started = Instant::now();
    let runs = mistakes().into_iter().map(|m| {
        tokio::spawn(async move {
            let w = mistaken_world(&m).await;
            let (code, out) = check(&w).await;
            assert_eq!(code, Some(1), "{}: {out}", m.name);
            // Every mistake, the plaintext client's too, is seen at the first attempt (the
            // probe, `kafka_access::probe`), and named with its fix.
            let (error, fix) = ("error: cannot use the Kafka brokers", m.fix);
            let line = out
                .lines()
                .find(|l| l.contains(error))
                .unwrap_or_else(|| panic!("{}: {out}", m.name));
            let fix_line = out
                .lines()
                .skip_while(|l| *l != line)
                .nth(1)
                .unwrap_or_default();
            assert!(fix_line.contains(fix), "{}: {out}", m.name);
            assert!(!out.contains(PASSWORD), "{out}");
        })
    });
    for r in runs.collect::<Vec<_>>() {
        r.await.unwrap();
    }
    eprintln!("check with mistakes: {:?}", started.elapsed());
}
