//! Schema changes and bad input under load: while a writer inserts outbox rows continuously,
//! the outbox table, the publication or the server changes under Ferry, and each scenario
//! asserts what Ferry does (continues, or stops with an error that says what, why and how to
//! fix it) and that nothing is lost: every row committed before the change, and every row after
//! it that Ferry can route, is delivered, in commit order per key (first occurrences; a restart
//! replays from the slot's checkpoint). The README's table "Schema changes and bad input under
//! load" is written from these scenarios.
//!
//! The writer inserts one row per transaction with literals only (`'k-3'`, `'{"seq": 17}'`), so
//! its statement stays valid whatever type a column changes to, and names only the columns
//! no scenario renames or drops (`type` and `aggregatetype` have defaults). A statement that
//! fails (the table is being swapped) is retried with the same `seq`: `seq` is the commit order.
//!
//! Waits are conditions with deadlines (rows read back, a log line, an exit). The writer's
//! pause between rows only paces the load.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ferry_testkit::kafka;
use ferry_testkit::pg::{self, ClusterOptions, PgCluster, Postgres};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

/// The outbox of these scenarios: Debezium's columns, with defaults for the two the writer does
/// not name, and a `note` no route reads.
const DDL: &str = "CREATE TABLE outbox (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregatetype text NOT NULL DEFAULT 'ev',
    aggregateid text NOT NULL,
    type text NOT NULL DEFAULT 'Happened',
    payload jsonb,
    note text
)";

const AGGREGATE: &str = "ev";
const PARTITIONS: i32 = 3;
const KEYS: u64 = 8;
/// Rows read back before a change, and written after it, in every scenario.
const BATCH: u64 = 150;
const DEADLINE: Duration = Duration::from_secs(90);

/// How the writer spells a key, so that a type change of `aggregateid` can convert it.
#[derive(Clone, Copy, Debug)]
enum Keys {
    /// `k-3`
    Text,
    /// `3` (converts to int)
    Int,
    /// `00000000-0000-0000-0000-000000000003` (converts to uuid)
    Uuid,
}

impl Keys {
    fn of(self, seq: u64) -> String {
        let k = seq % KEYS;
        match self {
            Keys::Text => format!("k-{k}"),
            Keys::Int => k.to_string(),
            Keys::Uuid => format!("00000000-0000-0000-0000-{k:012}"),
        }
    }
}

/// A task inserting `seq = 0, 1, 2, …` one row per transaction until stopped.
struct Writer {
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicU64>,
    /// Statements that failed (retried): the table was being swapped, the server was away.
    failures: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    /// Writes into the world's database; when the server goes away (a restart), reconnects.
    async fn start(w: &World, keys: Keys) -> Writer {
        let url = w.db.url.clone();
        let mut sql = w.db.client().await;
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(AtomicU64::new(0));
        let task = {
            let (stop, committed, failures) = (stop.clone(), committed.clone(), failures.clone());
            tokio::spawn(async move {
                let mut seq = 0;
                while !stop.load(Ordering::Relaxed) {
                    if sql.is_closed() {
                        match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
                            Ok((client, conn)) => {
                                tokio::spawn(conn);
                                sql = client;
                            }
                            Err(_) => {
                                failures.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(100)).await; // pacing
                                continue;
                            }
                        }
                    }
                    let insert = format!(
                        "INSERT INTO outbox (aggregateid, payload) VALUES ('{}', '{{\"seq\": {seq}}}')",
                        keys.of(seq)
                    );
                    match sql.batch_execute(&insert).await {
                        Ok(()) => {
                            seq += 1;
                            committed.store(seq, Ordering::Relaxed);
                        }
                        Err(_) => {
                            failures.fetch_add(1, Ordering::Relaxed);
                            // Not committed: the same seq again, after a pause (pacing).
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await; // pacing: ~300 rows/s
                }
            })
        };
        Writer {
            stop,
            committed,
            failures,
            task,
        }
    }

    /// Rows committed so far (`0..n`).
    fn committed(&self) -> u64 {
        self.committed.load(Ordering::Relaxed)
    }

    /// Statements that failed so far.
    fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Waits until `n` more rows than now are committed.
    async fn wait_more(&self, n: u64) {
        let target = self.committed() + n;
        wait_until(
            &format!("the writer committed {target} rows"),
            DEADLINE,
            || async { self.committed() >= target },
        )
        .await;
    }

    /// Stops the writer; returns the number of rows committed.
    async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("writer task");
        self.committed.load(Ordering::Relaxed)
    }
}

/// A world with this file's outbox table, a topic of [`PARTITIONS`] partitions, and quick
/// reconnects.
async fn world_on(db: pg::TestDb, brokers: String, ddl: &str) -> (World, String) {
    let mut w = World::bare(db, brokers).await;
    w.sql.batch_execute(ddl).await.expect("create outbox");
    for (k, v) in [
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MIN", "100ms"),
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MAX", "1s"),
    ] {
        w.env.push((k.into(), v.into()));
    }
    let topic = w.create_topic(AGGREGATE, PARTITIONS).await;
    (w, topic)
}

async fn world() -> (World, String) {
    world_on(
        pg::shared().create_db().await,
        kafka::shared().brokers(),
        DDL,
    )
    .await
}

/// One record read back.
#[derive(Debug)]
struct Event {
    partition: i32,
    key: String,
    seq: u64,
}

/// Reads `topic` from the beginning until every seq of `0..n` arrived (panics at the deadline
/// naming what is missing); the records in partition and offset order.
async fn read_back(brokers: &str, topic: &str, n: u64) -> Vec<Event> {
    read_back_seqs(brokers, topic, (0..n).collect()).await
}

/// [`read_back`] until every seq of `wanted` arrived.
async fn read_back_seqs(brokers: &str, topic: &str, wanted: Vec<u64>) -> Vec<Event> {
    let (brokers, topic) = (brokers.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let parts = kafka::partition_count(&brokers, &topic).expect("topic exists");
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", pg::unique_name("ferry-schema"))
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..parts {
            tpl.add_partition_offset(&topic, p, Offset::Beginning)
                .expect("offset");
        }
        consumer.assign(&tpl).expect("assign");
        let n = wanted.len();
        let mut missing: HashSet<u64> = wanted.into_iter().collect();
        let mut out = Vec::new();
        let start = Instant::now();
        while !missing.is_empty() {
            assert!(
                start.elapsed() < DEADLINE,
                "{} of {n} rows never arrived in {topic} (lowest missing seq {:?}, {} records read)",
                missing.len(),
                missing.iter().min(),
                out.len()
            );
            let Some(m) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let m = m.unwrap_or_else(|e| panic!("consume {topic}: {e}"));
            let value: serde_json::Value =
                serde_json::from_slice(m.payload().expect("a value")).expect("JSON value");
            let seq = value["seq"].as_u64().expect("seq in the value");
            missing.remove(&seq);
            out.push((m.partition(), m.offset(), m.key().map(<[u8]>::to_vec), seq));
        }
        out.sort_by_key(|e| (e.0, e.1));
        out.into_iter()
            .map(|(partition, _, key, seq)| Event {
                partition,
                key: String::from_utf8(key.expect("a key")).expect("UTF-8 key"),
                seq,
            })
            .collect()
    })
    .await
    .expect("consumer task")
}

/// Nothing of `0..n` lost, nothing else delivered, and per key the first occurrences (in offset
/// order) are that key's seqs in commit order; every record carries its key as written.
fn assert_complete_in_key_order(events: &[Event], n: u64, keys: Keys) {
    assert_in_key_order(events, n, &(0..n).collect::<Vec<_>>(), keys)
}

/// Every seq of `wanted` delivered, nothing but seqs below `n` delivered, and per key the first
/// occurrences (in offset order) ascending (commit order); every record carries its key as
/// written. Seqs below `n` outside `wanted` may be missing (rows the stream did not carry).
fn assert_in_key_order(events: &[Event], n: u64, wanted: &[u64], keys: Keys) {
    let mut seen = HashSet::new();
    let mut firsts: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut partition_of = BTreeMap::new();
    for e in events {
        assert!(e.seq < n, "seq {} was never committed", e.seq);
        assert_eq!(e.key, keys.of(e.seq), "key of seq {}", e.seq);
        let p = *partition_of.entry(e.key.clone()).or_insert(e.partition);
        assert_eq!(p, e.partition, "key {} in two partitions", e.key);
        if seen.insert(e.seq) {
            firsts.entry(e.seq % KEYS).or_default().push(e.seq);
        }
    }
    for k in 0..KEYS {
        let got = firsts.remove(&k).unwrap_or_default();
        let delivered: HashSet<u64> = got.iter().copied().collect();
        let mut want: Vec<u64> = got.clone();
        want.sort_unstable();
        want.extend(
            wanted
                .iter()
                .filter(|s| *s % KEYS == k && !delivered.contains(s)),
        );
        if got != want {
            let at = got.iter().zip(&want).position(|(g, w)| g != w);
            panic!(
                "key {}: first occurrences differ from commit order (at {at:?}; {} vs {} rows)",
                keys.of(k),
                got.len(),
                want.len()
            );
        }
    }
}

/// Runs `ddl` while the writer writes, and asserts Ferry streams on through it: rows before and
/// after are all delivered, in key order, without Ferry exiting.
async fn continues_through(w: &World, topic: &str, keys: Keys, ddl: &str) -> Ferry {
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let writer = Writer::start(w, keys).await;
    writer.wait_more(BATCH).await;
    read_back(&w.brokers, topic, writer.committed()).await;
    w.sql
        .batch_execute(ddl)
        .await
        .unwrap_or_else(|e| panic!("{ddl}: {e}"));
    writer.wait_more(BATCH).await;
    watched_since_now(&ferry, w).await;
    let n = writer.finish().await;
    let events = read_back(&w.brokers, topic, n).await;
    assert_complete_in_key_order(&events, n, keys);
    assert!(
        ferry.is_running(),
        "Ferry exited; log:\n{}",
        ferry.log_text()
    );
    ferry
}

/// Waits until Ferry looked at the server (WAL position, publication) twice after this moment, so
/// a change made before was seen (needs WAL to move: the writer runs).
async fn watched_since_now(ferry: &Ferry, w: &World) {
    for _ in 0..2 {
        let lsn = w.current_wal_lsn().await.0 as f64;
        wait_until(
            "Ferry samples the server after the change",
            Duration::from_secs(30),
            || async { ferry.metric("ferry_server_wal_lsn").await.unwrap_or(0.0) > lsn },
        )
        .await;
    }
}

/// Waits for Ferry to exit by itself; asserts it failed (non-zero) and logged every `needle`.
async fn exits_permanently(ferry: &mut Ferry, needles: &[&str]) -> String {
    let status = ferry.wait_exit(Duration::from_secs(60)).await;
    let log = ferry.log_text();
    assert!(!status.success(), "Ferry exited 0; log:\n{log}");
    for needle in needles {
        assert!(log.contains(needle), "the log lacks {needle:?}:\n{log}");
    }
    eprintln!(
        "Ferry exited ({status}): {}",
        log.lines().last().unwrap_or("")
    );
    log
}

// 1. A column added ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nullable_column_added_under_load_changes_nothing() {
    let (w, topic) = world().await;
    continues_through(
        &w,
        &topic,
        Keys::Text,
        "ALTER TABLE outbox ADD COLUMN tenant text",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_added_with_a_default_and_an_unread_one_dropped_under_load_change_nothing() {
    let (w, topic) = world().await;
    // A volatile default rewrites the table under an exclusive lock; a constant one does not.
    continues_through(
        &w,
        &topic,
        Keys::Text,
        "ALTER TABLE outbox ADD COLUMN region text NOT NULL DEFAULT 'eu';
         ALTER TABLE outbox ADD COLUMN created_at timestamptz NOT NULL DEFAULT clock_timestamp();
         ALTER TABLE outbox DROP COLUMN note",
    )
    .await;
}

// 2. A column the router reads renamed or dropped ----------------------------------------------

/// The router reads `type` (the type header). Renamed, the first row without it stops Ferry
/// with the fix; the operator maps the new name and restarts; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_column_renamed_under_load_stops_with_the_fix_and_resumes_once_mapped() {
    let (mut w, topic) = world().await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let writer = Writer::start(&w, Keys::Text).await;
    writer.wait_more(BATCH).await;
    read_back(&w.brokers, &topic, writer.committed()).await;

    w.sql
        .batch_execute("ALTER TABLE outbox RENAME COLUMN type TO event_type")
        .await
        .unwrap();
    exits_permanently(
        &mut ferry,
        &[
            "no column \"type\"",
            "outbox.type_column",
            "Map the new column in the configuration",
        ],
    )
    .await;
    writer.wait_more(BATCH).await;

    w.env
        .push(("FERRY_OUTBOX_TYPE_COLUMN".into(), "event_type".into()));
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    writer.wait_more(BATCH).await;
    let n = writer.finish().await;
    let events = read_back(&w.brokers, &topic, n).await;
    assert_complete_in_key_order(&events, n, Keys::Text);
    assert!(ferry.is_running());
}

/// Dropped, the same, even with `on_error = "skip"` (which would otherwise skip every row from
/// then on): Ferry stops with the fix; the operator stops sending the type header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_column_dropped_under_load_stops_with_the_fix_even_when_skipping_and_resumes_once_unmapped(
) {
    let (mut w, topic) = world().await;
    w.env.push(("FERRY_ROUTE_ON_ERROR".into(), "skip".into()));
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let writer = Writer::start(&w, Keys::Text).await;
    writer.wait_more(BATCH).await;
    read_back(&w.brokers, &topic, writer.committed()).await;

    w.sql
        .batch_execute("ALTER TABLE outbox DROP COLUMN type")
        .await
        .unwrap();
    exits_permanently(
        &mut ferry,
        &[
            "no column \"type\"",
            "route.type_header",
            "whatever route.on_error says",
        ],
    )
    .await;
    writer.wait_more(BATCH).await;

    w.env
        .push(("FERRY_ROUTE_TYPE_HEADER".into(), String::new()));
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    writer.wait_more(BATCH).await;
    let n = writer.finish().await;
    let events = read_back(&w.brokers, &topic, n).await;
    assert_complete_in_key_order(&events, n, Keys::Text);
    assert!(ferry.is_running());
}

// 3. A read column's type changed --------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_jsonb_to_text_and_key_text_to_uuid_under_load_continue() {
    let (w, topic) = world().await;
    continues_through(
        &w,
        &topic,
        Keys::Uuid,
        "ALTER TABLE outbox ALTER COLUMN payload TYPE text;
         ALTER TABLE outbox ALTER COLUMN aggregateid TYPE uuid USING aggregateid::uuid",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_text_to_int_under_load_continues() {
    let (w, topic) = world().await;
    continues_through(
        &w,
        &topic,
        Keys::Int,
        "ALTER TABLE outbox ALTER COLUMN aggregateid TYPE int USING aggregateid::int",
    )
    .await;
}

/// With a bytea payload Ferry streams pgoutput's binary mode. A key changed to uuid is still
/// read in binary; `type` changed to an enum (read only as text) ends the binary session, and
/// the next one streams text from the checkpoint: nothing lost, Ferry still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn type_changes_in_binary_mode_switch_to_text_without_loss() {
    let (w, topic) = world_on(
        pg::shared().create_db().await,
        kafka::shared().brokers(),
        &DDL.replace("payload jsonb", "payload bytea"),
    )
    .await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    assert!(
        ferry
            .log_text()
            .contains("values stream in pgoutput's binary mode"),
        "not streaming binary; log:\n{}",
        ferry.log_text()
    );
    let writer = Writer::start(&w, Keys::Uuid).await;
    writer.wait_more(BATCH).await;
    read_back(&w.brokers, &topic, writer.committed()).await;

    w.sql
        .batch_execute(
            "ALTER TABLE outbox ALTER COLUMN aggregateid TYPE uuid USING aggregateid::uuid",
        )
        .await
        .unwrap();
    writer.wait_more(BATCH).await;
    read_back(&w.brokers, &topic, writer.committed()).await;
    assert_eq!(
        ferry
            .metric_labeled("ferry_reconnects_total", "component", "postgres")
            .await
            .unwrap_or(0.0),
        0.0,
        "a uuid key needs no text session"
    );

    w.sql
        .batch_execute(
            "CREATE TYPE event_kind AS ENUM ('Happened');
             ALTER TABLE outbox ALTER COLUMN type DROP DEFAULT;
             ALTER TABLE outbox ALTER COLUMN type TYPE event_kind USING type::event_kind;
             ALTER TABLE outbox ALTER COLUMN type SET DEFAULT 'Happened'",
        )
        .await
        .unwrap();
    writer.wait_more(BATCH).await;
    let n = writer.finish().await;
    let events = read_back(&w.brokers, &topic, n).await;
    assert_complete_in_key_order(&events, n, Keys::Uuid);
    let log = ferry.log_text();
    assert!(
        log.contains("reads only as text; reconnecting to stream text")
            && log.contains("values stream as text"),
        "no switch to text mode in the log:\n{log}"
    );
    // The type by its PostgreSQL name, in both messages, never by OID.
    assert!(
        log.contains("column \"type\" is now of type event_kind, which Ferry reads only as text")
            && log.contains(
                "values stream as text: column \"type\" is of type event_kind, which Ferry reads only as text"
            )
            && !log.contains("type OID"),
        "a type not named by its name:\n{log}"
    );
    assert!(ferry.is_running(), "Ferry exited; log:\n{log}");
}

// 4 and 5. The table out of the publication --------------------------------------------------

/// Runs `change` (which takes the outbox table out of the world's publication, one way or
/// another) under load, and asserts: Ferry stops with an error naming the publication and the
/// fix; everything committed before the change was delivered; once the table is back (`back`)
/// and Ferry restarted, every row committed after that is delivered, in key order. Rows
/// committed while the table was out are not in the stream (the error says so) and are not
/// required.
async fn leaves_the_publication(change: &str, back: &str) {
    let (w, topic) = world().await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let writer = Writer::start(&w, Keys::Text).await;
    writer.wait_more(BATCH).await;
    let before = writer.committed();
    let change = change.replace("{pub}", &w.publication);
    w.sql
        .batch_execute(&change)
        .await
        .unwrap_or_else(|e| panic!("{change}: {e}"));
    // A writer transaction in progress across the change is decoded with the catalog as it was
    // when it began: its row may be left out too. The next commit ends it.
    writer.wait_more(1).await;
    let mut after = writer.committed();
    exits_permanently(
        &mut ferry,
        &[
            "left publication",
            &format!(
                "ALTER PUBLICATION {} ADD TABLE \"public\".\"outbox\"",
                w.publication
            ),
        ],
    )
    .await;
    read_back(&w.brokers, &topic, before).await;
    writer.wait_more(20).await;

    let back = back.replace("{pub}", &w.publication);
    if !back.is_empty() {
        w.sql.batch_execute(&back).await.unwrap();
        writer.wait_more(1).await;
        after = writer.committed();
    }
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    writer.wait_more(BATCH).await;
    let n = writer.finish().await;
    let wanted: Vec<u64> = (0..before).chain(after..n).collect();
    let events = read_back_seqs(&w.brokers, &topic, wanted.clone()).await;
    assert_in_key_order(&events, n, &wanted, Keys::Text);
    assert!(ferry.is_running());
    let carried = events
        .iter()
        .map(|e| e.seq)
        .filter(|s| (before..after).contains(s))
        .collect::<HashSet<_>>()
        .len();
    eprintln!(
        "{} rows committed while the table was out of the publication; {carried} of them delivered",
        after - before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_dropped_and_recreated_under_load_stops_with_the_fix_and_resumes_once_published()
{
    leaves_the_publication(
        &format!("BEGIN; DROP TABLE outbox; {DDL}; COMMIT"),
        "ALTER PUBLICATION {pub} ADD TABLE outbox",
    )
    .await;
}

/// A publication `FOR ALL TABLES` covers the recreated table from its creation: no gap, so
/// Ferry streams on through it (the new relation's rows route like the old one's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_recreated_under_a_publication_for_all_tables_streams_on_without_loss() {
    let (w, topic) = world().await;
    w.sql
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR ALL TABLES WITH (publish = 'insert')",
            w.publication
        ))
        .await
        .unwrap();
    let ferry = continues_through(
        &w,
        &topic,
        Keys::Text,
        &format!("BEGIN; DROP TABLE outbox; {DDL}; COMMIT"),
    )
    .await;
    assert!(!ferry.log_text().contains("left publication"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_dropped_from_the_publication_under_load_stops_with_the_fix_and_resumes_once_added_back(
) {
    leaves_the_publication(
        "ALTER PUBLICATION {pub} DROP TABLE outbox",
        "ALTER PUBLICATION {pub} ADD TABLE outbox",
    )
    .await;
}

/// Taken out and added back at once (well within one look at the publication): the gap is
/// still noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_dropped_from_the_publication_and_added_back_at_once_is_still_noticed() {
    leaves_the_publication(
        "BEGIN; ALTER PUBLICATION {pub} DROP TABLE outbox; COMMIT; \
         BEGIN; ALTER PUBLICATION {pub} ADD TABLE outbox; COMMIT",
        "",
    )
    .await;
}

// 6. wal_level lowered -----------------------------------------------------------------------

/// `wal_level = replica` and a restart, with Ferry's logical slot on the server. PostgreSQL
/// refuses to start at all ("logical replication slot ... exists, but wal_level < logical";
/// seen on 14 to 18): Ferry cannot reach the server, says so at every attempt (a warning, the
/// reconnect counter, `/readyz` not ready) and keeps trying; the slot and everything not yet
/// confirmed stay on disk. Once `wal_level = logical` is back and the server started, Ferry
/// resumes where it was: nothing lost. A server that starts anyway (invalidating the slot
/// instead) must make Ferry exit with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_level_lowered_and_restarted_is_said_and_nothing_is_lost_once_restored() {
    let pg = Postgres::Local(PgCluster::start(ClusterOptions::default()).await);
    let Postgres::Local(cluster) = &pg else {
        unreachable!()
    };
    let (w, topic) = world_on(pg.create_db().await, kafka::shared().brokers(), DDL).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let writer = Writer::start(&w, Keys::Text).await;
    writer.wait_more(BATCH).await;
    read_back(&w.brokers, &topic, writer.committed()).await;

    cluster.append_conf(&["wal_level = replica"]);
    tokio::task::block_in_place(|| cluster.stop(false));
    let started = tokio::task::block_in_place(|| cluster.try_start_again());
    if started.is_ok() {
        // A server that starts with the slot invalid: Ferry must stop and say why.
        exits_permanently(&mut ferry, &["wal_level"]).await;
        panic!(
            "this server started with wal_level = replica and a logical slot; \
             the scenario's second half assumes it refuses (as 14 to 18 do)"
        );
    }
    let pg_log = cluster.log();
    assert!(
        pg_log.contains("exists, but \"wal_level\" < \"logical\"")
            || pg_log.contains("exists, but wal_level < logical"),
        "the server did not refuse for the slot; its log:\n{pg_log}"
    );
    let reconnects = || async {
        ferry
            .metric_labeled("ferry_reconnects_total", "component", "postgres")
            .await
            .unwrap_or(0.0)
    };
    let seen = reconnects().await;
    wait_until(
        "Ferry retries the server that does not start",
        DEADLINE,
        || async { reconnects().await >= seen + 3.0 },
    )
    .await;
    assert!(
        ferry.is_running(),
        "Ferry exited; log:\n{}",
        ferry.log_text()
    );
    assert_ne!(
        ferry.http_get("/readyz").await.map(|(code, _)| code),
        Some(200),
        "ready while the server is down"
    );
    assert!(
        ferry.log_text().contains("session ended; reconnecting"),
        "no warning while the server is down; log:\n{}",
        ferry.log_text()
    );

    assert!(
        writer.failures() > 0,
        "the writer never found the server down"
    );
    cluster.append_conf(&["wal_level = logical"]);
    tokio::task::block_in_place(|| cluster.start_again());
    writer.wait_more(BATCH).await;
    let n = writer.finish().await;
    let events = read_back(&w.brokers, &topic, n).await;
    assert_complete_in_key_order(&events, n, Keys::Text);
    assert!(
        ferry.is_running(),
        "Ferry exited; log:\n{}",
        ferry.log_text()
    );
}

// 7. REPLICATION revoked ---------------------------------------------------------------------

/// Revoking REPLICATION does not end a walsender that is streaming: Ferry streams on, and warns
/// (within a lag sample) that the next connection will be refused. The next
/// connection (forced here by ending the walsender) is refused, and Ferry exits with the fix
/// instead of retrying; nothing past what Kafka acknowledged was confirmed. With the attribute
/// restored and Ferry started again, every row is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_revoked_under_load_exits_with_the_fix_and_resumes_once_restored() {
    const ROLE: &str = "ferry_relay";
    const PASSWORD: &str = "relay-secret";
    let pg = Postgres::Local(PgCluster::start(ClusterOptions::default()).await);
    let (mut w, topic) = world_on(pg.create_db().await, kafka::shared().brokers(), DDL).await;
    w.sql
        .batch_execute(&format!(
            "CREATE ROLE {ROLE} LOGIN REPLICATION PASSWORD '{PASSWORD}';
             GRANT SELECT ON outbox TO {ROLE};
             CREATE PUBLICATION {} FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = true)",
            w.publication
        ))
        .await
        .unwrap();
    w.env
        .push(("FERRY_POSTGRES_URL".into(), w.db.url_as(ROLE, PASSWORD)));
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let writer = Writer::start(&w, Keys::Text).await;
    writer.wait_more(BATCH).await;
    read_back(&w.brokers, &topic, writer.committed()).await;

    w.sql
        .batch_execute(&format!("ALTER ROLE {ROLE} NOREPLICATION"))
        .await
        .unwrap();
    writer.wait_more(BATCH).await;
    read_back(&w.brokers, &topic, writer.committed()).await;
    assert!(
        ferry.is_running(),
        "the streaming session ended at the revoke"
    );
    wait_until(
        "Ferry warns that the next connection will be refused",
        Duration::from_secs(30),
        || async {
            ferry
                .log_text()
                .contains("no longer has the REPLICATION attribute: this session streams on")
        },
    )
    .await;

    w.sql
        .execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1",
            &[&w.slot],
        )
        .await
        .unwrap();
    exits_permanently(
        &mut ferry,
        &[
            "lacks the REPLICATION attribute",
            &format!("ALTER ROLE \"{ROLE}\" WITH REPLICATION"),
        ],
    )
    .await;
    writer.wait_more(BATCH).await;

    w.sql
        .batch_execute(&format!("ALTER ROLE {ROLE} REPLICATION"))
        .await
        .unwrap();
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    writer.wait_more(BATCH).await;
    let n = writer.finish().await;
    let events = read_back(&w.brokers, &topic, n).await;
    assert_complete_in_key_order(&events, n, Keys::Text);
    assert!(ferry.is_running());
}

// 8. A published table no entry relays ----------------------------------------------------------

/// A table the publication lists by name and no entry relays (issue 28, major 1). Before, its
/// rows were skipped and the slot confirmed past them. Now:
/// - `run` refuses to start, naming it, with both fixes (an entry, or out of the publication);
/// - one listed while Ferry streams stops it before that transaction's commit (the reader, at
///   its row) or as soon as it is listed (the publication watch), with the same fixes;
/// - taken out of the publication, its rows still in the WAL are skipped (PostgreSQL decodes
///   with the catalog as of each transaction), and the outbox row of that same transaction is
///   delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_table_no_entry_relays_stops_ferry_until_it_is_relayed_or_taken_out() {
    let w = World::new().await;
    let topic = w.create_topic("ev", 1).await;
    let publication = &w.publication;
    let fixes = [
        "which no [outbox] or [[tables]] entry relays",
        "outbox.table = \"public.audit\"",
        &format!("ALTER PUBLICATION \"{publication}\" DROP TABLE \"public\".\"audit\""),
    ];
    w.sql
        .batch_execute(&format!(
            "CREATE TABLE audit (id int PRIMARY KEY, what text); \
             CREATE PUBLICATION {publication} FOR TABLE outbox, audit WITH (publish = 'insert')"
        ))
        .await
        .unwrap();

    // At start: refused.
    let mut ferry = w.start_ferry();
    exits_permanently(&mut ferry, &fixes).await;

    // Taken out: Ferry runs; listed again while it streams: it stops, nothing of that
    // transaction on confirmed.
    w.sql
        .batch_execute(&format!("ALTER PUBLICATION {publication} DROP TABLE audit"))
        .await
        .unwrap();
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.insert("ev", "k-1", "Happened", r#"{"seq": 1}"#).await;
    w.consume(&topic, 1).await;
    w.sql
        .batch_execute(&format!(
            "ALTER PUBLICATION {publication} ADD TABLE audit; \
             BEGIN; INSERT INTO audit VALUES (1, 'a'); \
             INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('ev', 'k-2', 'Happened', '{{\"seq\": 2}}'); \
             COMMIT"
        ))
        .await
        .unwrap();
    let log = exits_permanently(&mut ferry, &fixes).await;
    let at_the_row = log.contains("the stream met a row of table \"public\".\"audit\"");
    assert!(
        at_the_row || log.contains("joined publication"),
        "neither the reader nor the watch stopped Ferry:\n{log}"
    );
    eprintln!(
        "stopped by {}",
        if at_the_row {
            "the reader, at the row"
        } else {
            "the publication watch"
        }
    );

    // Taken out again: the row of audit still in the WAL is skipped, the outbox row of its
    // transaction and every later one delivered.
    w.sql
        .batch_execute(&format!("ALTER PUBLICATION {publication} DROP TABLE audit"))
        .await
        .unwrap();
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.insert("ev", "k-3", "Happened", r#"{"seq": 3}"#).await;
    kafka::consume_until(
        &w.brokers,
        &topic,
        "k-1, k-2 and k-3",
        DEADLINE,
        |records| {
            let keys: HashSet<&[u8]> = records.iter().filter_map(|r| r.key.as_deref()).collect();
            [&b"k-1"[..], b"k-2", b"k-3"]
                .iter()
                .all(|k| keys.contains(k))
        },
    )
    .await;
    assert!(ferry.is_running(), "{}", ferry.log_text());
    if at_the_row {
        assert!(
            ferry.log_text().contains("is no longer in publication"),
            "{}",
            ferry.log_text()
        );
    }
}

/// A world whose outbox is [`PARTITIONED_DDL`], published through its root.
async fn partitioned_world() -> (World, String) {
    let (w, topic) = world_on(
        pg::shared().create_db().await,
        kafka::shared().brokers(),
        PARTITIONED_DDL,
    )
    .await;
    w.sql
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = true)",
            w.publication
        ))
        .await
        .unwrap();
    (w, topic)
}

/// An outbox partitioned by aggregate type, with the one partition the tests write to.
const PARTITIONED_DDL: &str = "CREATE TABLE outbox (
        id uuid NOT NULL DEFAULT gen_random_uuid(),
        aggregatetype text NOT NULL DEFAULT 'ev',
        aggregateid text NOT NULL,
        type text NOT NULL DEFAULT 'Happened',
        payload jsonb,
        note text,
        PRIMARY KEY (id, aggregatetype)
    ) PARTITION BY LIST (aggregatetype);
    CREATE TABLE outbox_ev PARTITION OF outbox FOR VALUES IN ('ev')";

/// A partitioned outbox with a partition locked while Ferry starts (ACCESS EXCLUSIVE, as a
/// `DROP` of an old partition waiting behind a long transaction holds it): the session's read of
/// the partitions waits on the lock, is given up on after `postgres.receive_timeout`, and is
/// cancelled on the server, so the sessions that follow leave no backends waiting behind it
/// (each would add one); once the lock goes, Ferry streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_locked_at_the_start_leaves_no_backends_waiting_behind_it() {
    let (mut w, topic) = partitioned_world().await;
    w.set_env(&[("FERRY_POSTGRES_RECEIVE_TIMEOUT", "2s")]);
    let mut locker = pg::connect(&w.db.url).await;
    let held = locker.transaction().await.unwrap();
    held.batch_execute("LOCK TABLE outbox_ev IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let mut ferry = w.start_ferry();
    let given_up = ferry_testkit::wait_for(Duration::from_secs(90), || async {
        ferry
            .log_text()
            .matches("the server did not answer")
            .count()
            >= 4
    })
    .await;
    assert!(
        given_up,
        "four sessions should have given up:\n{}",
        ferry.log_text()
    );
    let waiting: i64 = w
        .sql
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // The session waiting now, and perhaps the last one or two, their cancels on their way
    // (without the cancel, one for each session: four and more).
    assert!(
        waiting <= 3,
        "{waiting} backends wait on the lock after four sessions gave up:\n{}",
        ferry.log_text()
    );
    held.rollback().await.unwrap();
    ferry.wait_ready().await;
    w.insert(AGGREGATE, "k-1", "Happened", "{}").await;
    let got = w.consume(&topic, 1).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(ferry.is_running(), "{}", ferry.log_text());
}

/// A partitioned outbox whose publication is switched to publish per partition while Ferry
/// streams (review of issue 28, major 1): the rows arrive under the partition's name, which no
/// entry names, but the partition is the outbox's by oid, so they are relayed, never skipped as
/// a table no entry relays. (A restart then refuses the setting, as `check` does.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_outbox_published_per_partition_mid_stream_loses_nothing() {
    let (w, topic) = partitioned_world().await;
    let mut ferry = continues_through(
        &w,
        &topic,
        Keys::Text,
        &format!(
            "ALTER PUBLICATION {} SET (publish_via_partition_root = false)",
            w.publication
        ),
    )
    .await;
    let log = ferry.log_text();
    assert!(!log.contains("skipped"), "{log}");
    assert!(ferry.is_running(), "{log}");
}
