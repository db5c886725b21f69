//! The progress topic against a real broker: created once with one partition, read back to its
//! real end, committed records seen, aborted ones never, the newest record per key wins.

use std::time::Duration;

use ferry::progress_topic::{self as progress, Ensured, ProgressTopicError, Remembered};
use ferry_core::progress_record::{Mode, Partial, ProgressKey, ProgressRecord};
use ferry_wal::Lsn;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

const TIMEOUT: Duration = Duration::from_secs(30);

fn properties(brokers: &str) -> Vec<(String, String)> {
    vec![("bootstrap.servers".to_string(), brokers.to_string())]
}

fn unique(name: &str) -> String {
    format!(
        "progress-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

fn key(slot: &str) -> ProgressKey {
    ProgressKey {
        system_id: 7_312_345_678_901_234_567,
        slot: slot.to_string(),
    }
}

fn record(end: u64, partial: Option<(u64, u64)>) -> ProgressRecord {
    ProgressRecord {
        partial: partial.map(|(c, events)| Partial {
            commit_lsn: Lsn(c),
            events,
        }),
        ..ProgressRecord::whole(Mode::ExactlyOnce, 1, Lsn(end), 1)
    }
}

fn transactional(brokers: &str, id: &str) -> ThreadedProducer<DefaultProducerContext> {
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("transactional.id", id)
        .create()
        .unwrap();
    p.init_transactions(TIMEOUT).unwrap();
    p
}

fn send(
    p: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    k: &ProgressKey,
    r: &ProgressRecord,
) {
    let (kb, vb) = (k.encode(), r.encode());
    p.send(BaseRecord::to(topic).key(&kb).payload(&vb))
        .map_err(|(e, _)| e)
        .unwrap();
}

/// The shared broker, and a progress topic of its own made by `ensure_topic`.
async fn progress_topic(name: &str) -> (String, String) {
    let brokers = ferry_testkit::kafka::shared().brokers();
    let topic = unique(name);
    progress::ensure_topic(&properties(&brokers), &topic, 1, TIMEOUT)
        .await
        .unwrap();
    (brokers, topic)
}

/// A committed record of `k` (end 100), then a transaction left open holding the next (200),
/// written but undecided; its producer is returned to decide it.
fn committed_then_open(
    brokers: &str,
    topic: &str,
    k: &ProgressKey,
) -> ThreadedProducer<DefaultProducerContext> {
    committed_then_open_as(brokers, topic, k, &unique("tid"))
}

/// [`committed_then_open`] by a producer with `transactional.id` `tid`.
fn committed_then_open_as(
    brokers: &str,
    topic: &str,
    k: &ProgressKey,
    tid: &str,
) -> ThreadedProducer<DefaultProducerContext> {
    let p = transactional(brokers, tid);
    p.begin_transaction().unwrap();
    send(&p, topic, k, &record(100, None));
    p.commit_transaction(TIMEOUT).unwrap();
    p.begin_transaction().unwrap();
    send(&p, topic, k, &record(200, None));
    p.flush(TIMEOUT).unwrap();
    p
}

fn read(brokers: &str, topic: &str, k: &ProgressKey) -> Result<Remembered, ProgressTopicError> {
    progress::read(&properties(brokers), topic, k, TIMEOUT)
}

/// A first start sends CreateTopics first when the broker probe's answer said the brokers do not
/// know the topic,
/// and its verdict reads nothing from a topic that call created. A topic that exists all the
/// same (a broker whose metadata lagged, a principal that may not describe it) is found, never
/// taken for one just created: its records are read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_topic_this_start_created_is_taken_as_empty() {
    let brokers = ferry_testkit::kafka::shared().brokers();
    let topic = unique("absent");
    let props = properties(&brokers);
    // `ahead`: on an admin client made before (as when the probe answered), or on its own.
    let at_start = |absent, ahead: bool| {
        progress::ensure_topic_as(
            &props,
            &topic,
            1,
            TIMEOUT,
            progress::Way::AtStart { absent },
            // Made, or the call would quietly make its own and test nothing new.
            ahead.then(|| progress::Admin::ahead(&props).expect("an admin client made ahead")),
        )
    };
    assert_eq!(at_start(true, true).await.unwrap(), Ensured::Created);
    // Another start, the probe's answer (wrongly) without the topic, and one that saw it.
    assert_eq!(at_start(true, true).await.unwrap(), Ensured::Found);
    assert_eq!(at_start(true, false).await.unwrap(), Ensured::Found);
    assert_eq!(at_start(false, false).await.unwrap(), Ensured::Found);
    // ensure_topic waits for a topic it created to settle: a read right after finds it.
    let settled = unique("settled");
    assert_eq!(
        progress::ensure_topic(&properties(&brokers), &settled, 1, TIMEOUT)
            .await
            .unwrap(),
        Ensured::Created
    );
    assert_eq!(
        read(&brokers, &settled, &key("a")).unwrap(),
        Remembered::Nothing
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_records_are_read_to_the_end_and_aborted_ones_never() {
    let brokers = ferry_testkit::kafka::shared().brokers();
    let topic = unique("txn");
    let (a, b) = (key("a"), key("b"));
    assert_eq!(read(&brokers, &topic, &a).unwrap(), Remembered::NoTopic);
    progress::ensure_topic(&properties(&brokers), &topic, 1, TIMEOUT)
        .await
        .unwrap();
    // Created once; a second call (another Ferry) is fine.
    progress::ensure_topic(&properties(&brokers), &topic, 1, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(read(&brokers, &topic, &a).unwrap(), Remembered::Nothing);

    let (brokers2, topic2) = (brokers.clone(), topic.clone());
    let (a2, b2) = (a.clone(), b.clone());
    tokio::task::spawn_blocking(move || {
        let p = transactional(&brokers2, &unique("tid"));
        // Committed: a@100, b@50, then a@200 (newest for a).
        p.begin_transaction().unwrap();
        send(&p, &topic2, &a2, &record(100, None));
        send(&p, &topic2, &b2, &record(50, None));
        p.commit_transaction(TIMEOUT).unwrap();
        p.begin_transaction().unwrap();
        send(&p, &topic2, &a2, &record(200, Some((210, 4))));
        p.commit_transaction(TIMEOUT).unwrap();
        // Aborted: must never be seen, although it is the last thing in the log.
        p.begin_transaction().unwrap();
        send(&p, &topic2, &a2, &record(999, None));
        p.flush(TIMEOUT).unwrap();
        p.abort_transaction(TIMEOUT).unwrap();
    })
    .await
    .unwrap();

    let (brokers3, topic3) = (brokers.clone(), topic.clone());
    let got = tokio::task::spawn_blocking(move || {
        (
            read(&brokers3, &topic3, &a).unwrap(),
            read(&brokers3, &topic3, &b).unwrap(),
            read(&brokers3, &topic3, &key("c")).unwrap(),
        )
    })
    .await
    .unwrap();
    match got.0 {
        Remembered::Record { record: r, .. } => assert_eq!(r, record(200, Some((210, 4)))),
        other => panic!("a: {other:?}"),
    }
    match got.1 {
        Remembered::Record { record: r, .. } => assert_eq!(r, record(50, None)),
        other => panic!("b: {other:?}"),
    }
    assert_eq!(got.2, Remembered::Nothing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_with_more_than_one_partition_is_refused_with_the_fix() {
    let brokers = ferry_testkit::kafka::shared().brokers();
    let topic = unique("parts");
    ferry_testkit::kafka::create_topic(&brokers, &topic, 3).await;
    let e = progress::ensure_topic(&properties(&brokers), &topic, 1, TIMEOUT)
        .await
        .unwrap_err();
    assert!(
        matches!(e, ProgressTopicError::Partitions { partitions: 3, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("kafka.progress_topic"), "{e}");
    let (b, t) = (brokers.clone(), topic.clone());
    let e = tokio::task::spawn_blocking(move || read(&b, &t, &key("a")).unwrap_err())
        .await
        .unwrap();
    assert!(matches!(e, ProgressTopicError::Partitions { .. }), "{e}");
    assert!(!e.is_transient());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_at_the_tail_is_waited_for_and_never_guessed() {
    let (brokers, topic) = progress_topic("open").await;
    let (b, t, k) = (brokers.clone(), topic.clone(), key("a"));
    tokio::task::spawn_blocking(move || {
        let p = committed_then_open(&b, &t, &k);
        // While it is open, a read cannot reach the end: it says so instead of answering 100.
        let e = progress::read(&properties(&b), &t, &k, Duration::from_secs(2)).unwrap_err();
        assert!(matches!(e, ProgressTopicError::Timeout { .. }), "{e}");
        assert!(e.is_transient());
        assert!(e.to_string().contains("transaction"), "{e}");
        // Once it commits, its record is the answer.
        p.commit_transaction(TIMEOUT).unwrap();
        match progress::read(&properties(&b), &t, &k, TIMEOUT).unwrap() {
            Remembered::Record { record: r, .. } => assert_eq!(r, record(200, None)),
            other => panic!("{other:?}"),
        }
    })
    .await
    .unwrap();
}

/// A read to the last stable offset (an exactly-once Ferry's, before it fences; `ferry check`'s)
/// answers with what is committed below an open transaction at once, instead of waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_to_the_stable_end_stops_before_an_open_transaction() {
    let (brokers, topic) = progress_topic("stable").await;
    let (b, t, k) = (brokers.clone(), topic.clone(), key("a"));
    tokio::task::spawn_blocking(move || {
        let p = committed_then_open(&b, &t, &k);
        let stable = |timeout| {
            progress::read_slot(&properties(&b), &t, "a", timeout, progress::Until::Stable)
        };
        // The open transaction's record is neither waited for nor seen.
        let history = stable(TIMEOUT).unwrap();
        assert_eq!(history.records, vec![(k.system_id, record(100, None))]);
        // Once it commits, the stable end is past it.
        p.commit_transaction(TIMEOUT).unwrap();
        let history = stable(TIMEOUT).unwrap();
        assert_eq!(history.records, vec![(k.system_id, record(200, None))]);
    })
    .await
    .unwrap();
}

/// A read of `slot`'s records to the stable end, kept open to be taken up.
fn read_open(brokers: &str, topic: &str, slot: &str) -> (progress::SlotHistory, progress::Cursor) {
    let (history, cursor) = progress::read_slot_open(
        &properties(brokers),
        topic,
        slot,
        TIMEOUT,
        progress::Until::Stable,
    )
    .unwrap();
    (history, cursor.expect("the topic exists"))
}

/// Commits `r` of `k` in a transaction of its own.
fn commit_one(
    p: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    k: &ProgressKey,
    r: &ProgressRecord,
) {
    p.begin_transaction().unwrap();
    send(p, topic, k, r);
    p.commit_transaction(TIMEOUT).unwrap();
}

/// Exactly-once reads the progress topic to its stable end for the verdict, then, after
/// fencing, takes that read up where it ended: the first read's finding stands, and whatever was
/// decided or written since (the transaction open then, committed; a later one; an aborted one,
/// never) is read now, to the end of the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_taken_up_where_it_ended_sees_what_was_decided_since() {
    let (brokers, topic) = progress_topic("cursor").await;
    let (b, t, k) = (brokers.clone(), topic.clone(), key("a"));
    tokio::task::spawn_blocking(move || {
        let props = properties(&b);
        // 100 committed, 200 left open; the read to the stable end sees 100 only.
        let p = committed_then_open(&b, &t, &k);
        let (history, cursor) = read_open(&b, &t, "a");
        assert_eq!(history.records, vec![(k.system_id, record(100, None))]);
        let (_, first) = read_open(&b, &t, "a");
        // Another slot's key, read apart (a key the cursor did not read is read whole).
        let (_, other_slot) = read_open(&b, &t, "a");
        // The transaction open then commits: its record is the answer.
        p.commit_transaction(TIMEOUT).unwrap();
        match first.read(&props, &t, &k, TIMEOUT).unwrap() {
            Remembered::Record { record: r, .. } => assert_eq!(r, record(200, None)),
            other => panic!("{other:?}"),
        }
        // Then 300 is committed by another producer, 400 is aborted, and another server's record
        // of the slot comes.
        let q = transactional(&b, &unique("tid"));
        commit_one(&q, &t, &k, &record(300, None));
        q.begin_transaction().unwrap();
        send(&q, &t, &k, &record(400, None));
        q.flush(TIMEOUT).unwrap();
        q.abort_transaction(TIMEOUT).unwrap();
        let other_server = ProgressKey {
            system_id: 1,
            ..k.clone()
        };
        commit_one(&q, &t, &other_server, &record(900, None));
        let whole = read(&b, &t, &k).unwrap();
        let Remembered::Record { record: r, offset } = &whole else {
            panic!("{whole:?}");
        };
        assert_eq!(*r, record(300, None));
        assert_eq!(cursor.read(&props, &t, &k, TIMEOUT).unwrap(), whole);
        assert_eq!(
            other_slot.read(&props, &t, &key("b"), TIMEOUT).unwrap(),
            Remembered::Nothing
        );
        // A read taken up with nothing new: what it found stands.
        let (_, cursor) = read_open(&b, &t, "a");
        let again = cursor.read(&props, &t, &k, TIMEOUT).unwrap();
        assert_eq!(
            again,
            Remembered::Record {
                record: record(300, None),
                offset: *offset
            }
        );
    })
    .await
    .unwrap();
}

/// The read after fencing, as an exactly-once restart does it: the killed Ferry's transaction
/// is open when the verdict reads to the stable end; the new producer's `init_transactions`
/// aborts it; the read taken up passes the aborted record (which begins where the first read
/// ended) and answers with the record committed before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_taken_up_after_fencing_passes_what_the_fenced_producer_left_open() {
    let (brokers, topic) = progress_topic("fenced").await;
    let (b, t, k) = (brokers.clone(), topic.clone(), key("a"));
    tokio::task::spawn_blocking(move || {
        let props = properties(&b);
        let tid = unique("tid");
        let _killed = committed_then_open_as(&b, &t, &k, &tid);
        let (history, cursor) = read_open(&b, &t, "a");
        assert_eq!(history.records, vec![(k.system_id, record(100, None))]);
        // The successor fences the killed producer: its open transaction is aborted.
        let _successor = transactional(&b, &tid);
        let found = cursor.read(&props, &t, &k, TIMEOUT).unwrap();
        assert_eq!(
            found,
            Remembered::Record {
                record: record(100, None),
                offset: 0
            }
        );
        assert_eq!(read(&b, &t, &k).unwrap(), found);
    })
    .await
    .unwrap();
}

/// A read of an empty topic ends without ever fetching; taken up, it reads what came since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_an_empty_topic_taken_up_finds_what_came_since() {
    let (brokers, topic) = progress_topic("empty").await;
    let (b, t, k) = (brokers.clone(), topic.clone(), key("a"));
    tokio::task::spawn_blocking(move || {
        let (history, cursor) = read_open(&b, &t, "a");
        assert!(history.topic_exists && history.records.is_empty());
        commit_one(
            &transactional(&b, &unique("tid")),
            &t,
            &k,
            &record(100, None),
        );
        match cursor.read(&properties(&b), &t, &k, TIMEOUT).unwrap() {
            Remembered::Record { record: r, .. } => assert_eq!(r, record(100, None)),
            other => panic!("{other:?}"),
        }
    })
    .await
    .unwrap();
}

/// A read taken up does not read again what it read: a record it found stands even where it
/// was deleted since (a whole read finds nothing), and records deleted past where it ended are
/// skipped from the log's new start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_taken_up_keeps_what_it_found_and_starts_past_deleted_records() {
    let (brokers, topic) = progress_topic("kept").await;
    let k = key("a");
    // 100, 200, 300 at offsets 0, 2 and 4, each followed by its commit marker.
    three_committed(&brokers, &topic, &k).await;
    let (b, t, kk) = (brokers.clone(), topic.clone(), k.clone());
    let (first, second) = tokio::task::spawn_blocking(move || {
        let ((history, first), (_, second)) = (read_open(&b, &t, "a"), read_open(&b, &t, "a"));
        assert_eq!(history.records, vec![(kk.system_id, record(300, None))]);
        (first, second)
    })
    .await
    .unwrap();
    delete_records_before(&brokers, &topic, 6).await;
    let (b, t, kk) = (brokers.clone(), topic.clone(), k.clone());
    let second = tokio::task::spawn_blocking(move || {
        let props = properties(&b);
        assert_eq!(read(&b, &t, &kk).unwrap(), Remembered::Nothing);
        assert_eq!(
            first.read(&props, &t, &kk, TIMEOUT).unwrap(),
            Remembered::Record {
                record: record(300, None),
                offset: 4
            }
        );
        // 400 and 500 at offsets 6 and 8.
        let p = transactional(&b, &unique("tid"));
        for end in [400, 500] {
            commit_one(&p, &t, &kk, &record(end, None));
        }
        second
    })
    .await
    .unwrap();
    // The log now starts at 8, past where the second read ended (6).
    delete_records_before(&brokers, &topic, 8).await;
    let (b, t) = (brokers.clone(), topic.clone());
    tokio::task::spawn_blocking(move || {
        let want = Remembered::Record {
            record: record(500, None),
            offset: 8,
        };
        assert_eq!(second.read(&properties(&b), &t, &k, TIMEOUT).unwrap(), want);
        assert_eq!(read(&b, &t, &k).unwrap(), want);
    })
    .await
    .unwrap();
}

/// Deletes `topic`'s records before `offset` (`kafka-delete-records`). Kafka deletes records of
/// a topic whose cleanup policy includes `delete` only: the policy becomes `compact,delete`.
async fn delete_records_before(brokers: &str, topic: &str, offset: i64) {
    use rdkafka::admin::AdminOptions;
    use rdkafka::{Offset, TopicPartitionList};
    ferry_testkit::kafka::alter_topic_configs(
        brokers,
        topic,
        &[("cleanup.policy", "compact,delete")],
    )
    .await;
    let admin = ferry_testkit::kafka::admin(brokers);
    let mut before = TopicPartitionList::new();
    before
        .add_partition_offset(topic, 0, Offset::Offset(offset))
        .unwrap();
    // A broker applies the new policy a moment after the controller acknowledges it, and
    // refuses DeleteRecords of a compact-only topic (POLICY_VIOLATION); a broker just started
    // may not answer at once. Asked again until it succeeds, within the deadline.
    ferry_testkit::wait_until("DeleteRecords succeeds", TIMEOUT, || {
        let (admin, before) = (&admin, &before);
        async move {
            let deleted = admin.delete_records(before, &AdminOptions::new()).await;
            let done = deleted
                .as_ref()
                .is_ok_and(|d| d.elements().iter().all(|e| e.error().is_ok()));
            if !done {
                eprintln!("DeleteRecords, asked again: {deleted:?}");
            }
            done
        }
    })
    .await;
}

/// Three committed records of `k` (ends 100, 200, 300), a transaction each: records at offsets
/// 0, 2 and 4, each followed by its commit marker.
async fn three_committed(brokers: &str, topic: &str, k: &ProgressKey) {
    let (b, t, k) = (brokers.to_string(), topic.to_string(), k.clone());
    tokio::task::spawn_blocking(move || {
        let p = transactional(&b, &unique("tid"));
        for end in [100, 200, 300] {
            p.begin_transaction().unwrap();
            send(&p, &t, &k, &record(end, None));
            p.commit_transaction(TIMEOUT).unwrap();
        }
    })
    .await
    .unwrap();
}

/// A log whose start is past offset 0 (a topic an admin made with `cleanup.policy=compact,delete`,
/// its old records deleted by retention or `kafka-delete-records`) is read from its start, the
/// log start offset the broker reports, not from offset 0, which is out of range there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_starts_past_zero_is_read_from_its_start() {
    let (brokers, topic) = progress_topic("start").await;
    let k = key("a");
    three_committed(&brokers, &topic, &k).await;
    // Records 100 and 200 (and the first marker) deleted: the log starts at 3.
    delete_records_before(&brokers, &topic, 3).await;
    let (b, t) = (brokers.clone(), topic.clone());
    let found = tokio::task::spawn_blocking(move || read(&b, &t, &k))
        .await
        .unwrap()
        .unwrap();
    match found {
        Remembered::Record { record: r, offset } => {
            assert_eq!(r, record(300, None));
            assert_eq!(offset, 4);
        }
        other => panic!("{other:?}"),
    }
}

/// A log whose every record was deleted starts at its end: it holds nothing, and the read says
/// so at once (the log's start, asked beside its end, is where the read would begin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_whose_records_were_all_deleted_holds_nothing() {
    let (brokers, topic) = progress_topic("deleted").await;
    let k = key("a");
    three_committed(&brokers, &topic, &k).await;
    // Every record and marker: the log starts at its end, 6.
    delete_records_before(&brokers, &topic, 6).await;
    let (b, t) = (brokers.clone(), topic.clone());
    let found = tokio::task::spawn_blocking(move || {
        progress::read(&properties(&b), &t, &k, Duration::from_secs(5))
    })
    .await
    .unwrap();
    assert_eq!(found.unwrap(), Remembered::Nothing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_is_read_back_under_every_system_identifier() {
    let brokers = ferry_testkit::kafka::shared().brokers();
    let topic = unique("slot");
    assert!(
        !progress::read_slot(
            &properties(&brokers),
            &topic,
            "a",
            TIMEOUT,
            progress::Until::End
        )
        .unwrap()
        .topic_exists
    );
    progress::ensure_topic(&properties(&brokers), &topic, 1, TIMEOUT)
        .await
        .unwrap();
    let here = key("a");
    let there = ProgressKey {
        system_id: 1,
        ..key("a")
    };
    let (b, t) = (brokers.clone(), topic.clone());
    let (h2, t2) = (here.clone(), there.clone());
    let history = tokio::task::spawn_blocking(move || {
        let p = transactional(&b, &unique("tid"));
        p.begin_transaction().unwrap();
        send(&p, &t, &t2, &record(300, None));
        send(&p, &t, &h2, &record(100, None));
        send(&p, &t, &key("b"), &record(999, None));
        send(&p, &t, &h2, &record(200, None));
        p.commit_transaction(TIMEOUT).unwrap();
        progress::read_slot(&properties(&b), &t, "a", TIMEOUT, progress::Until::End).unwrap()
    })
    .await
    .unwrap();
    assert!(history.topic_exists);
    assert_eq!(
        history.records,
        vec![(1, record(300, None)), (here.system_id, record(200, None))],
        "the newest per server, slot b left out"
    );
    let seen = history.remembered(here.system_id);
    assert_eq!(seen.this_system, Some(record(200, None)));
    assert_eq!(seen.other_systems, vec![(1, record(300, None))]);
}

/// With one node of three down, the progress topic (replicated on all three) is still read:
/// every client naming the dead node in its bootstrap list gets a transport failure report for
/// it, which is news, not a failed read. Found by `ferry-bench chaos --cluster`: Ferry could not
/// start a session (nor after a kill -9) while any node was down, and its growing reconnect
/// backoff stalled it for up to 3 minutes after the node was back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topic_is_read_with_one_broker_of_three_down() {
    use ferry_testkit::kafka::{leader_of, ClusterOptions, LocalBroker};
    let cluster = LocalBroker::start_with(ClusterOptions {
        nodes: 3,
        ..ClusterOptions::default()
    })
    .await;
    let brokers = cluster.brokers();
    let topic = unique("down");
    progress::ensure_topic(&properties(&brokers), &topic, 3, TIMEOUT)
        .await
        .unwrap();
    let k = key("a");
    let (b, t, k2) = (brokers.clone(), topic.clone(), k.clone());
    let cluster = tokio::task::spawn_blocking(move || {
        let p = transactional(&b, &unique("tid"));
        p.begin_transaction().unwrap();
        send(&p, &t, &k2, &record(100, None));
        p.commit_transaction(TIMEOUT).unwrap();
        // A follower: the partition stays available, only the connections to it fail.
        let leader = leader_of(&b, &t, 0).expect("a leader");
        let down = (0..3)
            .find(|i| Some(*i) != cluster.node_of(leader))
            .unwrap();
        cluster.kill_node(down);
        cluster
    })
    .await
    .unwrap();
    for _ in 0..3 {
        let (b, t, k2) = (brokers.clone(), topic.clone(), k.clone());
        let read = tokio::task::spawn_blocking(move || read(&b, &t, &k2))
            .await
            .unwrap();
        assert!(
            matches!(read, Ok(Remembered::Record { record: ref r, .. }) if *r == record(100, None)),
            "{read:?}"
        );
        let (b, t) = (brokers.clone(), topic.clone());
        let history = tokio::task::spawn_blocking(move || {
            progress::read_slot(&properties(&b), &t, "a", TIMEOUT, progress::Until::End)
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(history.records.len(), 1);
    }
    drop(cluster);
}

/// The broker probe names the progress topic alone, and asking never creates it (the shared
/// broker auto-creates topics, Kafka's default): a first start's topic is then created by
/// Ferry's CreateTopics, compacted with one partition, not by the brokers with their defaults.
/// Unknown, it is `Absent` (a first start creates it at once); once made, `Settled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_sees_a_missing_progress_topic_without_creating_it() {
    use ferry::progress_topic::Sighting;
    let brokers = ferry_testkit::kafka::shared().brokers();
    let topic = unique("probed");
    let probe = |brokers: String, topic: String| {
        tokio::task::spawn_blocking(move || {
            ferry::kafka_access::probe_seeing(&properties(&brokers), TIMEOUT, Some(&topic))
                .expect("a broker answers")
        })
    };
    assert_eq!(
        probe(brokers.clone(), topic.clone()).await.unwrap(),
        Sighting::Absent
    );
    // Asked again after a pause longer than an auto-creation takes to show: still unknown.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        assert!(
            !ferry_testkit::kafka::topic_known(&brokers, &topic),
            "asking for {topic}'s metadata created it"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        probe(brokers.clone(), topic.clone()).await.unwrap(),
        Sighting::Absent
    );
    progress::ensure_topic(&properties(&brokers), &topic, 1, TIMEOUT)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        match probe(brokers.clone(), topic.clone()).await.unwrap() {
            Sighting::Settled => break,
            seen => assert!(
                std::time::Instant::now() < deadline,
                "the created topic seen {seen:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
