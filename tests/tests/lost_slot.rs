//! Loss never goes unnoticed (issue 12 §3): Ferry remembers its position in the progress topic
//! and compares the slot with it at every start. A slot dropped under Ferry, or advanced by
//! someone else, stops it with the gap and the action; `--accept-gap` continues; a first start
//! and an upgrade from a Ferry without progress records start on their own; a progress topic
//! Ferry cannot use is a clear error.
//!
//! Each test has its own database, slot, topics and progress topic; waits are conditions with
//! deadlines.

mod common;

use std::time::Duration;

use common::*;
use ferry::progress_topic::{self as progress, Remembered};
use ferry_core::progress_record::{Mode, ProgressKey, ProgressRecord};
use ferry_testkit::kafka;
use ferry_wal::Lsn;

const AGGREGATE: &str = "order";
const EXIT: Duration = Duration::from_secs(60);

async fn insert(w: &World, ids: std::ops::Range<u32>) {
    for i in ids {
        w.insert(
            AGGREGATE,
            &format!("k{i}"),
            "created",
            &format!("{{\"n\":{i}}}"),
        )
        .await;
    }
}

/// The server's system identifier (what the progress key names).
async fn system_id(w: &World) -> u64 {
    let s: String = w
        .sql
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await
        .expect("system identifier")
        .get(0);
    s.parse().expect("number")
}

/// The newest progress record of the world's slot on this server.
async fn remembered(w: &World) -> Option<ProgressRecord> {
    let key = ProgressKey {
        system_id: system_id(w).await,
        slot: w.slot.clone(),
    };
    let (brokers, topic) = (w.brokers.clone(), w.progress_topic());
    let got = tokio::task::spawn_blocking(move || {
        progress::read(
            &[("bootstrap.servers".to_string(), brokers)],
            &topic,
            &key,
            Duration::from_secs(30),
        )
    })
    .await
    .expect("join")
    .expect("read the progress topic");
    match got {
        Remembered::Record { record, .. } => Some(record),
        Remembered::NoTopic | Remembered::Nothing => None,
    }
}

/// Waits until the slot is confirmed at or past `lsn` and a progress record holds it.
async fn wait_remembered(w: &World, lsn: Lsn) -> ProgressRecord {
    wait_until(
        &format!("the slot is confirmed and remembered at or past {lsn}"),
        Duration::from_secs(60),
        || async { w.confirmed_lsn().await.is_some_and(|c| c >= lsn) },
    )
    .await;
    // The slot first, then the record: Ferry writes a record before it confirms its LSN, so
    // a record read after the slot is never behind it (the other order races with Ferry).
    let slot = w.confirmed_lsn().await.expect("slot");
    let record = remembered(w).await.expect("a progress record");
    assert!(
        record.end_lsn >= slot,
        "the slot ({slot}) is ahead of the progress record ({})",
        record.end_lsn
    );
    assert_eq!(record.mode, Mode::AtLeastOnce);
    record
}

/// Terminates the walsender of the world's slot and drops the slot, retrying while Ferry
/// reconnects and takes it again.
async fn drop_slot_under_ferry(w: &World) {
    let sql = &w.sql;
    let slot = w.slot.clone();
    wait_until(
        "the slot is dropped from under Ferry",
        Duration::from_secs(30),
        || {
            let slot = slot.clone();
            async move {
                let _ = sql
                    .execute(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                         WHERE slot_name = $1 AND active_pid IS NOT NULL",
                        &[&slot],
                    )
                    .await;
                sql.execute("SELECT pg_drop_replication_slot($1)", &[&slot])
                    .await
                    .is_ok()
            }
        },
    )
    .await;
}

/// Each outbox row's event id, by its aggregate id (one row per key in these tests).
async fn ids_by_key(w: &World) -> std::collections::HashMap<String, String> {
    w.sql
        .query("SELECT aggregateid, id::text FROM outbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The time the refusal names in `ferry replay --since <TIME>`.
fn replay_since(log: &str) -> String {
    let at = log
        .find("ferry replay --since ")
        .unwrap_or_else(|| panic!("no ferry replay --since in the log:\n{log}"));
    let rest = &log[at + "ferry replay --since ".len()..];
    rest[..rest.find('`').expect("the command ends")].to_string()
}

/// The LSN the refusal names in `ferry run --accept-gap <LSN>`.
fn accept_gap_lsn(log: &str) -> Lsn {
    let at = log
        .find("--accept-gap ")
        .unwrap_or_else(|| panic!("no --accept-gap in the log:\n{log}"));
    let rest = &log[at + "--accept-gap ".len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_hexdigit() || c == '/'))
        .unwrap_or(rest.len());
    rest[..end].parse().expect("an LSN")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_start_creates_the_slot_and_the_slot_never_passes_its_progress_record() {
    let w = World::new().await;
    let topic = w.create_topic(AGGREGATE, 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    assert!(
        ferry.log_text().contains("first start"),
        "{}",
        ferry.log_text()
    );
    // The slot's position is remembered before anything is streamed.
    let created = w.confirmed_lsn().await.expect("Ferry created the slot");
    wait_until(
        "the first progress record",
        Duration::from_secs(30),
        || async { remembered(&w).await.is_some() },
    )
    .await;
    insert(&w, 0..20).await;
    let end = w.current_wal_lsn().await;
    w.consume(&topic, 20).await;
    let record = wait_remembered(&w, end).await;
    assert!(record.end_lsn >= end && record.end_lsn > created);
    // Idle keepalives move it on: at least what was read back.
    let shown = ferry.metric("ferry_progress_lsn").await.unwrap_or(0.0);
    assert!(
        shown >= record.end_lsn.0 as f64,
        "ferry_progress_lsn {shown} behind the record read back ({})",
        record.end_lsn
    );
    assert_eq!(ferry.metric("ferry_progress_failing").await, Some(0.0));
    // A graceful stop writes the last record before the final status update.
    insert(&w, 20..25).await;
    w.consume(&topic, 25).await;
    assert!(ferry.terminate().await.success());
    let slot = w.confirmed_lsn().await.expect("slot");
    let last = remembered(&w).await.expect("record");
    assert!(last.end_lsn >= slot, "slot {slot} past {}", last.end_lsn);
    // And the next start finds them in step.
    let mut again = w.start_ferry();
    again.wait_ready().await;
    assert!(!again.log_text().contains("events may be lost"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_dropped_under_ferry_stops_it_with_the_gap_and_accept_gap_then_replay_recover_it() {
    let mut w = World::new().await;
    // sql/outbox.sql's time column: `ferry replay` reads when rows were committed from it when
    // track_commit_timestamp is off.
    w.sql
        .batch_execute(
            "ALTER TABLE outbox ADD COLUMN created_at timestamptz NOT NULL DEFAULT now()",
        )
        .await
        .unwrap();
    w.env.push((
        "FERRY_POSTGRES_RECONNECT_BACKOFF_MIN".into(),
        "100ms".into(),
    ));
    let topic = w.create_topic(AGGREGATE, 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    insert(&w, 0..10).await;
    let end = w.current_wal_lsn().await;
    w.consume(&topic, 10).await;
    let before = wait_remembered(&w, end).await;

    drop_slot_under_ferry(&w).await;
    // Rows committed while there is no slot: gone from any new slot's stream.
    insert(&w, 10..15).await;
    let status = ferry.wait_exit(EXIT).await;
    let log = ferry.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("events may be lost"), "{log}");
    assert!(log.contains("the replication slot is gone"), "{log}");
    assert!(log.contains("bytes of WAL"), "{log}");
    let remembered_at = accept_gap_lsn(&log);
    assert!(remembered_at >= before.end_lsn && remembered_at >= end);
    // The same procedure everywhere: accept the gap, then replay from the time it names.
    let since = replay_since(&log);
    // From the record's bound on when later transactions committed, not when it was written.
    assert!(
        log.contains("(every event after the remembered position committed after it)"),
        "{log}"
    );
    assert!(
        log.find("--accept-gap") < log.find("ferry replay --since"),
        "{log}"
    );
    assert_eq!(
        w.confirmed_lsn().await,
        None,
        "no slot was created silently"
    );
    // `ferry check` and `ferry status` say the same.
    let mut check = Ferry::spawn(&w, &["check"]);
    assert_eq!(check.wait_exit(EXIT).await.code(), Some(1));
    let out = check.log_text();
    assert!(out.contains("events may be lost"), "{out}");
    // The slot's line agrees with the Progress section: not "none needed: Ferry creates it".
    assert!(!out.contains("none needed: Ferry creates it at"), "{out}");
    assert!(
        out.contains(&format!(
            "warning: replication slot {:?} does not exist, but its progress record says Ferry streamed from it (to {remembered_at}): it was dropped\n    \
             fix: do not create it by hand: `ferry run` refuses to start from a new slot",
            w.slot
        )),
        "{out}"
    );
    assert!(out.contains("1 problem(s) must be fixed"), "{out}");

    // `ferry status --json` names the same time to replay from.
    let mut status = Ferry::spawn(&w, &["status", "--json"]);
    assert_eq!(status.wait_exit(EXIT).await.code(), Some(1));
    assert!(
        status
            .log_text()
            .contains(&format!("\"replay_since\": \"{since}\"")),
        "{}",
        status.log_text()
    );

    // Another gap's LSN accepts nothing.
    let wrong = Lsn(remembered_at.0 - 8).to_string();
    let mut refused = Ferry::spawn(&w, &["run", "--accept-gap", &wrong]);
    assert_eq!(refused.wait_exit(EXIT).await.code(), Some(1));
    assert!(
        refused
            .log_text()
            .contains("was given, but this gap starts at"),
        "{}",
        refused.log_text()
    );
    assert_eq!(w.confirmed_lsn().await, None);

    // The operator's action: continue from a new slot, logged at WARN with the gap.
    let lsn = remembered_at.to_string();
    let mut accepted = Ferry::spawn(&w, &["run", "--accept-gap", &lsn]);
    accepted.wait_ready().await;
    let log = accepted.log_text();
    assert!(log.contains("accepting a gap"), "{log}");
    assert!(log.contains("WARN"), "{log}");
    insert(&w, 15..25).await;
    let end = w.current_wal_lsn().await;
    let got = w.consume(&topic, 20).await;
    let ids: Vec<String> = got
        .iter()
        .filter_map(|c| {
            c.key
                .as_ref()
                .map(|k| String::from_utf8_lossy(k).into_owned())
        })
        .collect();
    for i in 15..25 {
        assert!(
            ids.contains(&format!("k{i}")),
            "row {i} after the gap: {ids:?}"
        );
    }
    // The gap was real: what was committed while there was no slot never arrived.
    for i in 10..15 {
        assert!(
            !ids.contains(&format!("k{i}")),
            "row {i} in the gap arrived: {ids:?}"
        );
    }
    let renewed = wait_remembered(&w, end).await;
    assert!(renewed.end_lsn > remembered_at);

    // Then the events of the gap, sent again from the outbox table with their own ids, while
    // Ferry runs.
    let mut replay = Ferry::spawn(&w, &["replay", "--since", &since]);
    let status = replay.wait_exit(EXIT).await;
    let out = replay.log_text();
    assert!(status.success(), "{out}");
    assert!(out.contains("public.outbox: "), "{out}");
    let ids = ids_by_key(&w).await;
    let got = kafka::consume_until(&w.brokers, &topic, "the gap's rows", EXIT, |records| {
        let keys: Vec<&[u8]> = records.iter().filter_map(|r| r.key.as_deref()).collect();
        (10..15).all(|i| keys.contains(&format!("k{i}").as_bytes()))
    })
    .await;
    for r in &got {
        let key = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned();
        assert_eq!(
            r.header("id").as_ref(),
            ids.get(&key),
            "record {key} carries its row's own id"
        );
    }
    assert!(accepted.terminate().await.success());
    // The acceptance was for that start: a plain start now finds slot and record in step.
    let mut plain = w.start_ferry();
    plain.wait_ready().await;
    assert!(!plain.log_text().contains("events may be lost"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_advanced_by_someone_else_stops_ferry_with_the_gap() {
    let w = World::new().await;
    let topic = w.create_topic(AGGREGATE, 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    insert(&w, 0..5).await;
    let end = w.current_wal_lsn().await;
    w.consume(&topic, 5).await;
    wait_remembered(&w, end).await;
    assert!(ferry.terminate().await.success());
    let record = remembered(&w).await.expect("record");

    insert(&w, 5..10).await;
    let advanced_to = w.current_wal_lsn().await;
    w.sql
        .execute(
            "SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)",
            &[&w.slot, &advanced_to.to_string()],
        )
        .await
        .expect("advance the slot");
    let slot = w.confirmed_lsn().await.expect("slot");
    assert!(slot > record.end_lsn);

    let mut ferry = w.start_ferry();
    let status = ferry.wait_exit(EXIT).await;
    let log = ferry.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("ahead of where Ferry left it"), "{log}");
    let bytes = slot.saturating_sub(record.end_lsn);
    assert!(log.contains(&format!("{bytes} bytes of WAL")), "{log}");
    assert!(
        log.contains(&format!("--accept-gap {}", record.end_lsn)),
        "{log}"
    );
    assert_eq!(w.confirmed_lsn().await, Some(slot), "nothing was streamed");

    let mut status = Ferry::spawn(&w, &["status", "--json"]);
    assert_eq!(status.wait_exit(EXIT).await.code(), Some(1));
    let text = status.log_text();
    assert!(text.contains("\"gap\": \"slot_ahead\""), "{text}");
    assert!(text.contains(&format!("\"gap_bytes\": {bytes}")), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_from_a_ferry_without_progress_records_continues_with_a_warning() {
    let w = World::new().await;
    let topic = w.create_topic(AGGREGATE, 1).await;
    // What an older Ferry left: the publication, then the slot (a slot older than its
    // publication cannot decode with it).
    w.sql
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = true)",
            w.publication
        ))
        .await
        .expect("create publication");
    w.sql
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&w.slot],
        )
        .await
        .expect("create slot");
    insert(&w, 0..5).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let log = ferry.log_text();
    assert!(log.contains("no progress record remembers it"), "{log}");
    assert!(log.contains("WARN"), "{log}");
    w.consume(&topic, 5).await;
    let end = w.current_wal_lsn().await;
    insert(&w, 5..6).await;
    w.consume(&topic, 6).await;
    wait_remembered(&w, end).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_topic_with_three_partitions_is_a_clear_error() {
    let w = World::new().await;
    w.create_topic(AGGREGATE, 1).await;
    ferry_testkit::kafka::create_topic(&w.brokers, &w.progress_topic(), 3).await;
    let mut ferry = w.start_ferry();
    let status = ferry.wait_exit(EXIT).await;
    let log = ferry.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("has 3 partitions; Ferry needs exactly 1"),
        "{log}"
    );
    assert!(log.contains("kafka.progress_topic"), "{log}");
    assert_eq!(
        w.confirmed_lsn().await,
        None,
        "no slot before the topic is usable"
    );
    // `ferry check` finds it first.
    let mut check = Ferry::spawn(&w, &["check"]);
    assert_eq!(check.wait_exit(EXIT).await.code(), Some(1));
    let out = check.log_text();
    assert!(
        out.contains("error: the progress topic") && out.contains("has 3 partitions"),
        "{out}"
    );
}

/// A progress topic that Kafka deletes records from (an administrator's, with the brokers'
/// `cleanup.policy=delete`) would let a dropped slot go unnoticed once its record is gone:
/// `ferry check` warns with the command that compacts it, and so does `ferry run`, at WARN, once
/// it streams. Compacted, `check` says the topic keeps each slot's newest record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_topic_that_deletes_records_is_said_with_its_fix() {
    let mut w = World::new().await;
    let topic = w.create_topic(AGGREGATE, 1).await;
    let progress_topic = w.progress_topic();
    kafka::create_topic_with(
        &w.brokers,
        &progress_topic,
        1,
        &[
            ("cleanup.policy", "delete"),
            ("retention.ms", "86400000"),
            ("segment.ms", "600000"),
        ],
    )
    .await;
    let deletes = "Kafka deletes its records 1 day after they are written (cleanup.policy=delete, retention.ms=86400000), and Ferry writes one only when its position moves";
    let fix = format!(
        "kafka-configs.sh --bootstrap-server {} --command-config <an admin's client properties> --alter --entity-type topics --entity-name {progress_topic} --add-config cleanup.policy=compact",
        w.brokers
    );
    let mut check = Ferry::spawn(&w, &["check"]);
    assert_eq!(check.wait_exit(EXIT).await.code(), Some(0));
    let out = check.log_text();
    let warning = out
        .lines()
        .position(|l| {
            l.trim_start().starts_with("warning: the progress topic") && l.contains(deletes)
        })
        .unwrap_or_else(|| panic!("no warning about the progress topic:\n{out}"));
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[warning].contains("the gap goes unnoticed, and exactly-once mode refuses to start"),
        "{out}"
    );
    assert_eq!(lines[warning + 1].trim(), format!("fix: {fix}"), "{out}");

    // The configuration read again every half second (ten minutes by default), so the
    // mending below is seen while Ferry runs.
    w.env
        .push((ferry::topics::JUDGE_INTERVAL_ENV.into(), "500".into()));
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    insert(&w, 0..1).await;
    w.consume(&topic, 1).await;
    wait_until(
        "the WARN about the progress topic",
        Duration::from_secs(30),
        || async {
            ferry
                .log_text()
                .lines()
                .any(|l| l.contains("WARN") && l.contains(deletes) && l.contains(&fix))
        },
    )
    .await;
    assert_eq!(ferry.metric("ferry_progress_topic_flawed").await, Some(1.0));

    kafka::alter_topic_configs(
        &w.brokers,
        &progress_topic,
        &[("cleanup.policy", "compact"), ("segment.ms", "600000")],
    )
    .await;
    // The running Ferry sees it mended: the gauge falls to 0, and an INFO line says so.
    wait_until(
        "the progress topic judged mended",
        Duration::from_secs(60),
        || async {
            ferry.metric("ferry_progress_topic_flawed").await == Some(0.0)
                && ferry.log_text().lines().any(|l| {
                    l.contains("INFO")
                        && l.contains("the progress topic's configuration keeps each slot's newest record now")
                })
        },
    )
    .await;
    ferry.terminate().await;
    let compacted = format!(
        "note: progress topic {progress_topic:?} keeps each slot's newest record (cleanup.policy=compact, segment.ms=600000)"
    );
    // The brokers apply a change a moment after they acknowledge it.
    wait_until("check sees the topic compacted", EXIT, || async {
        let mut check = Ferry::spawn(&w, &["check"]);
        check.wait_exit(Duration::from_secs(20)).await;
        check.log_text().contains(&compacted)
    })
    .await;
}

/// Deletes `topic` and waits until the broker no longer lists it.
async fn delete_topic(brokers: &str, topic: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    for r in admin
        .delete_topics(&[topic], &AdminOptions::new())
        .await
        .expect("delete_topics")
    {
        r.unwrap_or_else(|e| panic!("delete {topic}: {e:?}"));
    }
    let (b, t) = (brokers.to_string(), topic.to_string());
    wait_until("the topic is gone", Duration::from_secs(30), || {
        let (b, t) = (b.clone(), t.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                ferry_testkit::kafka::partition_count(&b, &t).is_none()
            })
            .await
            .unwrap_or(false)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_records_that_cannot_be_written_stop_confirming_visibly() {
    let broker =
        ferry_testkit::kafka::LocalBroker::start_with(ferry_testkit::kafka::ClusterOptions {
            auto_create_topics: false,
            ..Default::default()
        })
        .await;
    let mut w = World::on(
        ferry_testkit::pg::shared().create_db().await,
        broker.brokers(),
    )
    .await;
    w.env
        .push(("FERRY_KAFKA_DELIVERY_TIMEOUT".into(), "2s".into()));
    let topic = w.create_topic(AGGREGATE, 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    insert(&w, 0..5).await;
    let end = w.current_wal_lsn().await;
    w.consume(&topic, 5).await;
    let last = wait_remembered(&w, end).await;

    // The progress topic disappears: outbox records still flow, confirming stops, loudly.
    delete_topic(&w.brokers, &w.progress_topic()).await;
    insert(&w, 5..15).await;
    w.consume(&topic, 15).await;
    wait_until(
        "ferry_progress_failing and /readyz say so",
        Duration::from_secs(60),
        || async {
            ferry.metric("ferry_progress_failing").await == Some(1.0)
                && ferry
                    .http_get("/readyz")
                    .await
                    .is_some_and(|(code, body)| code == 503 && body.contains("progress"))
        },
    )
    .await;
    let errors = ferry
        .metric("ferry_progress_write_errors_total")
        .await
        .expect("metric");
    assert!(errors >= 1.0);
    let log = ferry.log_text();
    assert!(log.contains("cannot write the progress record"), "{log}");
    // The newest record Kafka acknowledged (before the topic went): the slot never passes it.
    let acknowledged = Lsn(ferry.metric("ferry_progress_lsn").await.expect("metric") as u64);
    assert!(acknowledged >= last.end_lsn);
    // Rows Kafka acknowledges now are confirmed by the core, yet not to the server: wait for
    // two more failed attempts after they arrived.
    insert(&w, 15..20).await;
    let after = w.current_wal_lsn().await;
    w.consume(&topic, 20).await;
    wait_until(
        "two more failed attempts",
        Duration::from_secs(60),
        || async {
            ferry
                .metric("ferry_progress_write_errors_total")
                .await
                .is_some_and(|e| e >= errors + 2.0)
        },
    )
    .await;
    let slot = w.confirmed_lsn().await.expect("slot");
    assert!(
        slot <= acknowledged && slot < after,
        "the slot ({slot}) moved past the last acknowledged progress record ({acknowledged}) while none could be written"
    );
    assert!(
        ferry.is_running(),
        "a transient failure is not a reason to exit"
    );

    // The topic is back: records are written again and the slot follows.
    ferry_testkit::kafka::create_topic(&w.brokers, &w.progress_topic(), 1).await;
    let end = w.current_wal_lsn().await;
    wait_remembered(&w, end).await;
    wait_until("ready again", Duration::from_secs(60), || async {
        ferry.metric("ferry_progress_failing").await == Some(0.0)
            && ferry
                .http_get("/readyz")
                .await
                .is_some_and(|(c, _)| c == 200)
    })
    .await;
    assert!(ferry
        .log_text()
        .contains("progress records are written again"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_remembered_only_on_another_server_stops_ferry() {
    let w = World::new().await;
    w.create_topic(AGGREGATE, 1).await;
    // What a Ferry wrote while this slot lived on another cluster (before a restore from
    // backup, say): the same slot name, another system identifier.
    ferry_testkit::kafka::create_topic(&w.brokers, &w.progress_topic(), 1).await;
    let other = system_id(&w).await ^ 1;
    let key = ProgressKey {
        system_id: other,
        slot: w.slot.clone(),
    }
    .encode();
    let value = ProgressRecord::whole(Mode::AtLeastOnce, 1, Lsn(0x5_0000_0000), 1).encode();
    let (brokers, topic) = (w.brokers.clone(), w.progress_topic());
    tokio::task::spawn_blocking(move || {
        use rdkafka::config::ClientConfig;
        use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
        let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .expect("producer");
        p.send(BaseRecord::to(&topic).key(&key).payload(&value))
            .map_err(|(e, _)| e)
            .expect("send");
        p.flush(Duration::from_secs(30)).expect("flush");
    })
    .await
    .expect("join");

    let mut ferry = w.start_ferry();
    let status = ferry.wait_exit(EXIT).await;
    let log = ferry.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("on another server"), "{log}");
    assert!(log.contains(&other.to_string()), "{log}");
    assert!(log.contains("--accept-gap 5/0"), "{log}");
    assert_eq!(w.confirmed_lsn().await, None, "no slot was created");
    // Accepting it starts afresh on this server.
    let mut accepted = Ferry::spawn(&w, &["run", "--accept-gap", "5/0"]);
    accepted.wait_ready().await;
    assert!(
        accepted.log_text().contains("server_changed"),
        "{}",
        accepted.log_text()
    );
}

/// `ferry replay` on its own: rows committed before Ferry ever ran, chosen by SQL, sent with
/// their own ids; a dry run counts without sending; a bad choice is a clear error (exit 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_sends_chosen_rows_again_with_their_ids_and_explains_a_bad_choice() {
    let w = World::new().await;
    w.sql
        .batch_execute(
            "ALTER TABLE outbox ADD COLUMN created_at timestamptz NOT NULL DEFAULT now()",
        )
        .await
        .unwrap();
    let topic = w.create_topic(AGGREGATE, 1).await;
    insert(&w, 0..5).await;
    let replay = |args: &[&str]| {
        let mut all = vec!["replay"];
        all.extend_from_slice(args);
        Ferry::spawn(&w, &all)
    };

    let mut dry = replay(&["--where", "true", "--dry-run"]);
    let status = dry.wait_exit(EXIT).await;
    let out = dry.log_text();
    assert!(status.success(), "{out}");
    assert!(out.contains("public.outbox: 5 rows"), "{out}");
    assert!(
        out.contains(&format!("would send 5 records\n  {topic}: 5")),
        "{out}"
    );

    for (args, says) in [
        (vec![], "say which rows"),
        (
            vec!["--since", "yesterday-ish"],
            "--since/--until take a time PostgreSQL can read",
        ),
        (
            vec!["--since", "2026-01-01T00:00:00Z", "--time-column", "nope"],
            "no such column",
        ),
        (
            vec!["--where", "no_such_column = 1"],
            "is ANDed to the query as SQL",
        ),
        (
            vec!["--where", "true", "--table", "public.elsewhere"],
            "none of the configured outbox tables",
        ),
    ] {
        let mut bad = replay(&args);
        let status = bad.wait_exit(EXIT).await;
        let out = bad.log_text();
        assert_eq!(status.code(), Some(2), "{args:?}: {out}");
        assert!(out.contains(says), "{args:?} should say {says:?}: {out}");
    }

    // Brokers that cannot be used are named before anything is read, not after a timeout.
    let mut away = Ferry::spawn_with(&w, &["replay", "--where", "true"], |c| {
        c.env("FERRY_KAFKA_BROKERS", "127.0.0.1:9");
    });
    let status = away.wait_exit(EXIT).await;
    let out = away.log_text();
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        out.contains("cannot use the Kafka brokers: nothing listens at 127.0.0.1:9"),
        "{out}"
    );

    let mut some = replay(&["--where", "aggregateid IN ('k1', 'k3')"]);
    let status = some.wait_exit(EXIT).await;
    assert!(status.success(), "{}", some.log_text());
    let ids = ids_by_key(&w).await;
    let got = kafka::consume_until(&w.brokers, &topic, "k1 and k3", EXIT, |records| {
        records.len() >= 2
    })
    .await;
    let mut keys: Vec<String> = got
        .iter()
        .map(|r| String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned())
        .collect();
    keys.sort();
    assert_eq!(keys, ["k1", "k3"], "only the chosen rows");
    for r in &got {
        let key = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned();
        assert_eq!(r.header("id").as_ref(), ids.get(&key), "{key}");
    }
}

/// A replayed record is the record `ferry run` relayed, byte for byte: every value reads as
/// pgoutput writes it (a boolean `t`, a padded `char(n)`, a time in ISO form and UTC), whatever
/// the database's DateStyle and TimeZone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_record_is_the_relayed_record_byte_for_byte() {
    let mut w = World::new().await;
    let db: String = w
        .sql
        .query_one("SELECT current_database()::text", &[])
        .await
        .unwrap()
        .get(0);
    w.sql
        .batch_execute(&format!(
            "ALTER TABLE outbox ADD COLUMN created_at timestamptz NOT NULL DEFAULT now(), \
               ADD COLUMN flag boolean DEFAULT true, ADD COLUMN code char(4) DEFAULT 'ab'; \
             ALTER DATABASE \"{db}\" SET DateStyle = 'SQL, DMY'; \
             ALTER DATABASE \"{db}\" SET TimeZone = 'Asia/Tokyo'"
        ))
        .await
        .unwrap();
    w.env.extend([
        (
            "FERRY_ROUTE_ADDITIONAL_PLACEMENT".to_string(),
            "flag:header,code:header,created_at:header".to_string(),
        ),
        ("FERRY_OUTBOX_TIMESTAMP_COLUMN".into(), "created_at".into()),
    ]);
    let topic = w.create_topic(AGGREGATE, 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    insert(&w, 0..3).await;
    w.consume(&topic, 3).await;
    assert!(ferry.terminate().await.success());
    let mut replay = Ferry::spawn(&w, &["replay", "--where", "true"]);
    let status = replay.wait_exit(EXIT).await;
    assert!(status.success(), "{}", replay.log_text());
    let got = w.consume(&topic, 6).await;
    let (relayed, replayed) = got.split_at(3);
    for (a, b) in relayed.iter().zip(replayed) {
        assert_eq!(
            (&a.key, &a.value, &a.headers, a.timestamp_ms),
            (&b.key, &b.value, &b.headers, b.timestamp_ms),
            "replayed differs from relayed"
        );
    }
    assert_eq!(
        relayed[0].header("flag").as_deref(),
        Some("t"),
        "{:?}",
        relayed[0].headers
    );
}
