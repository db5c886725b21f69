//! `ferry-bench chaos --chain`: the whole outbox pattern under kill -9. An outbox database →
//! `ferry run` (at-least-once) → Kafka → `ferry inbox` → an inbox database, both Ferrys killed
//! with SIGKILL at seeded moments and started again at once, while the chaos load's writers
//! commit outbox rows with per-key sequence numbers (one transaction in ten rolled back).
//!
//! `ferry run` replays what it had produced but not confirmed after each kill, so Kafka holds
//! duplicates; `ferry run` sets the `id` header to the outbox row's id, and the inbox drops
//! every record whose id it stored before. At the end (both processes alive, the load stopped,
//! `ferry run`'s slot past the last commit, the inbox's stored offsets at the topic's end) the
//! inbox table is read in each partition's offset order and held against what the writers
//! committed: every committed row exactly once, nothing rolled back, each key's rows in
//! sequence order; and nothing dead-lettered. Exit code 1 otherwise.
//!
//! The inbox's consumer runs with `session.timeout.ms=6000` (the broker's minimum): a consumer
//! killed with SIGKILL never leaves its group, and its partitions wait for the session to
//! expire (45 s by default) before the new one gets them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_testkit::faults::Rng;
use ferry_testkit::kafka::{self as testkafka, LocalBroker};
use ferry_testkit::pg::{self, PgCluster};
use ferry_wal::Lsn;

use super::{check, load, ChaosArgs, Ferry, CATCH_UP};
use crate::{kafka, procfs, Res, PUBLICATION};

const SLOT: &str = "ferry_chain";
const TOPIC: &str = "chain";
const PARTITIONS: i32 = kafka::PARTITIONS;

/// Which process a kill hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Relay,
    Inbox,
    Both,
}

/// The kills of a run: when (from the start of the faults) and which, from the seed alone.
fn schedule(seed: u64, duration: Duration, every: f64) -> Vec<(Duration, Target)> {
    let mut rng = Rng::new(seed ^ 0xC4A1_4C4A_1400_0000);
    let mut out = Vec::new();
    let mean_ms = (every * 1e3) as u64;
    let mut at = Duration::ZERO;
    loop {
        at += Duration::from_millis(rng.range(mean_ms / 2, mean_ms * 3 / 2));
        if at >= duration {
            return out;
        }
        let target = match rng.below(5) {
            0 | 1 => Target::Relay,
            2 | 3 => Target::Inbox,
            _ => Target::Both,
        };
        out.push((at, target));
    }
}

/// What the monitor saw of both processes.
#[derive(Debug, Default)]
struct Seen {
    exits: Vec<String>,
    peak_rss_relay: u64,
    peak_rss_inbox: u64,
}

pub async fn run(args: ChaosArgs) -> Res<bool> {
    let started = Instant::now();
    ferry_testkit::process::sweep_stale_dirs("ferry-pg");
    ferry_testkit::process::sweep_stale_dirs("ferry-broker");
    let cluster = PgCluster::start(pg::ClusterOptions::default()).await;
    let broker = LocalBroker::start().await;
    let admin = pg::connect(&cluster.url("postgres")).await;
    // One statement each: CREATE DATABASE cannot run in the implicit transaction of several.
    admin.batch_execute("CREATE DATABASE chain_out").await?;
    admin.batch_execute("CREATE DATABASE chain_in").await?;
    let (out_url, in_url) = (cluster.url("chain_out"), cluster.url("chain_in"));
    let out = pg::connect(&out_url).await;
    out.batch_execute(load::DDL).await?;
    out.batch_execute(&format!(
        "CREATE PUBLICATION {PUBLICATION} FOR TABLE outbox WITH (publish = 'insert')"
    ))
    .await?;
    let brokers = broker.brokers();
    testkafka::create_topic(&brokers, TOPIC, PARTITIONS).await;
    let dir = std::env::temp_dir().join(pg::unique_name("ferry-chain"));
    std::fs::create_dir_all(&dir)?;
    let common = |url: &str| -> Vec<(String, String)> {
        vec![
            ("FERRY_POSTGRES_URL".into(), url.to_string()),
            ("FERRY_KAFKA_BROKERS".into(), brokers.clone()),
            ("FERRY_LOG_LEVEL".into(), args.log_level.clone()),
        ]
    };
    let mut relay_env = common(&out_url);
    relay_env.extend(
        [
            ("FERRY_POSTGRES_SLOT", SLOT),
            ("FERRY_POSTGRES_PUBLICATION", PUBLICATION),
            ("FERRY_ROUTE_TOPIC", TOPIC),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    if args.exactly_once {
        relay_env.push(("FERRY_KAFKA_EXACTLY_ONCE".into(), "true".into()));
    }
    let mut inbox_env = common(&in_url);
    inbox_env.extend(
        [
            ("FERRY_INBOX_TOPICS", TOPIC),
            ("FERRY_INBOX_GROUP_ID", "chain"),
            ("FERRY_KAFKA_PROPERTIES_SESSION_TIMEOUT_MS", "6000"),
            ("FERRY_KAFKA_PROPERTIES_HEARTBEAT_INTERVAL_MS", "1000"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let proc = |command, env, log: &str| {
        Arc::new(Mutex::new(Ferry {
            command,
            child: None,
            port: 0,
            env,
            log: dir.join(log),
            spawns: 0,
        }))
    };
    let relay = proc("run", relay_env, "ferry-run.log");
    let inbox = proc("inbox", inbox_env, "ferry-inbox.log");
    lock(&relay).spawn()?;
    lock(&inbox).spawn()?;
    // Rows committed before the slot exists are not Ferry's to deliver.
    let slot_at = Instant::now();
    while out
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
            &[&SLOT],
        )
        .await?
        .is_none()
    {
        if slot_at.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "ferry run did not create its slot within 60 s; its log: {}",
                dir.join("ferry-run.log").display()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let every = args.kill_every.unwrap_or(6.0);
    let kills = schedule(args.seed, args.duration, every);
    println!(
        "ferry-bench chaos --chain: outbox → ferry run{} → Apache Kafka {} ({PARTITIONS} partitions) → ferry inbox → inbox; \
         seed {}, {} s, {} kill -9 planned (one every ~{every} s), {} writers; logs in {}",
        if args.exactly_once { " (exactly-once)" } else { " (at-least-once)" },
        testkafka::KAFKA_VERSION,
        args.seed,
        args.duration.as_secs(),
        kills.len(),
        args.writers,
        dir.display()
    );

    let seen = Arc::new(Mutex::new(Seen::default()));
    let on = Arc::new(AtomicBool::new(true));
    let monitor = tokio::spawn(watch(
        relay.clone(),
        inbox.clone(),
        seen.clone(),
        on.clone(),
    ));
    let load = load::Load::new(out_url.clone());
    let mut tasks = Vec::new();
    for w in 0..args.writers {
        tasks.push(tokio::spawn(load.clone().writer(w, args.seed)));
    }
    tasks.push(tokio::spawn(load.clone().deleter()));

    let t0 = Instant::now();
    let (mut relay_kills, mut inbox_kills) = (0u64, 0u64);
    for (at, target) in &kills {
        if let Some(wait) = at.checked_sub(t0.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        if matches!(target, Target::Relay | Target::Both) {
            let mut f = lock(&relay);
            f.kill();
            f.spawn()?;
            relay_kills += 1;
        }
        if matches!(target, Target::Inbox | Target::Both) {
            let mut f = lock(&inbox);
            f.kill();
            f.spawn()?;
            inbox_kills += 1;
        }
    }
    if let Some(wait) = args.duration.checked_sub(t0.elapsed()) {
        tokio::time::sleep(wait).await;
    }
    load.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }

    // The relay past the last commit, then the inbox at the topic's end.
    let last: Lsn = out
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get::<_, String>(0)
        .parse()?;
    let catch_up = Instant::now();
    let mut relayed = false;
    while catch_up.elapsed() < CATCH_UP {
        if crate::confirmed(&out, SLOT).await.is_ok_and(|c| c >= last) {
            relayed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let relay_caught_up = catch_up.elapsed();
    let inb = pg::connect(&in_url).await;
    let (b, t) = (brokers.clone(), TOPIC.to_string());
    let in_kafka = tokio::task::spawn_blocking(move || -> Res<i64> {
        kafka::high_watermarks(&kafka::consumer(&b)?, &t)
    })
    .await??;
    let mut stored = false;
    while catch_up.elapsed() < CATCH_UP * 2 {
        let at: Option<i64> = inb
            .query_one(
                "SELECT sum(next_offset)::int8 FROM ferry_inbox_offsets WHERE consumer_group = 'chain'",
                &[],
            )
            .await
            .ok()
            .and_then(|r| r.get(0));
        if at == Some(in_kafka) {
            stored = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let inbox_caught_up = catch_up.elapsed();
    on.store(false, Ordering::Relaxed);
    monitor.await?;

    let truth = std::mem::take(&mut *load.truth.lock().unwrap_or_else(|e| e.into_inner()));
    let (stored_rows, mismatched) = read_inbox(&inb).await?;
    let dead: i64 = inb
        .query_one("SELECT count(*) FROM ferry_inbox_dead_letters", &[])
        .await?
        .get(0);
    let verdict = check::judge(&truth, &stored_rows);
    for f in [&relay, &inbox] {
        let mut f = lock(f);
        if let Some(mut c) = f.child.take() {
            ferry_testkit::process::signal(&c, libc::SIGTERM);
            let _ = c.wait();
        }
    }
    let seen = std::mem::take(&mut *lock(&seen));
    let ok = relayed
        && stored
        && verdict.lost == 0
        && verdict.phantom == 0
        && verdict.order_violations == 0
        && verdict.duplicates == 0
        && dead == 0
        && mismatched == 0
        && seen.exits.is_empty();
    let (relay_spawns, inbox_spawns) = (lock(&relay).spawns, lock(&inbox).spawns);
    println!(
        "\n`{}` — seed {}, {} s of kills, run {:.0} s\n\n\
         | figure | value |\n| --- | ---: |\n\
         | kill -9 of ferry run / ferry inbox (both at once counted in each) | {relay_kills} / {inbox_kills} |\n\
         | processes started: ferry run / ferry inbox (exited on their own) | {relay_spawns} / {inbox_spawns} ({}) |\n\
         | transactions committed / rolled back / in doubt | {} / {} / {} |\n\
         | outbox rows committed | {} |\n\
         | outbox rows rolled back | {} |\n\
         | records in Kafka (ferry run's replays included) | {in_kafka} |\n\
         | replays dropped by the inbox (records in Kafka − rows stored) | {} |\n\
         | rows in the inbox | {} |\n\
         | **lost** | **{}** |\n\
         | **phantom** (rolled back, or never written) | **{}** |\n\
         | **per-key order violations** | **{}** |\n\
         | **duplicates in the inbox** | **{}** |\n\
         | dead letters | {dead} |\n\
         | rows whose event_id is not their payload's id | {mismatched} |\n\
         | after the load: relay caught up / inbox caught up | {} / {} |\n\
         | peak RSS: ferry run / ferry inbox | {:.1} / {:.1} MiB |",
        args.command.trim(),
        args.seed,
        args.duration.as_secs(),
        started.elapsed().as_secs_f64(),
        seen.exits.len(),
        truth.txns_committed,
        truth.txns_rolled_back,
        truth.txns_in_doubt,
        verdict.rows_committed,
        verdict.rows_rolled_back,
        in_kafka - verdict.delivered as i64,
        verdict.delivered,
        verdict.lost,
        verdict.phantom,
        verdict.order_violations,
        verdict.duplicates,
        if relayed {
            format!("{:.1} s", relay_caught_up.as_secs_f64())
        } else {
            "NO (deadline)".into()
        },
        if stored {
            format!("{:.1} s", inbox_caught_up.as_secs_f64())
        } else {
            "NO (deadline)".into()
        },
        seen.peak_rss_relay as f64 / 1024.0,
        seen.peak_rss_inbox as f64 / 1024.0,
    );
    for e in &verdict.examples {
        println!("  {e}");
    }
    for e in &seen.exits {
        println!("  exited on its own: {e}");
    }
    println!("\nverdict: {}", if ok { "PASS" } else { "FAIL" });
    if !ok || args.keep_logs {
        println!("logs (ferry-run.log, ferry-inbox.log): {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(ok)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The inbox's rows in each partition's offset order, as the chaos check reads a topic; and how
/// many rows' `event_id` differs from their payload's `id`.
async fn read_inbox(sql: &tokio_postgres::Client) -> Res<(Vec<Vec<check::Delivered>>, u64)> {
    let rows = sql
        .query(
            "SELECT \"partition\", event_id, (payload->>'id')::int8, payload->>'key', \
             (payload->>'seq')::int8 FROM ferry_inbox ORDER BY \"partition\", \"offset\"",
            &[],
        )
        .await?;
    let mut out = vec![Vec::new(); PARTITIONS as usize];
    let mut mismatched = 0;
    for r in &rows {
        let (p, event_id, id): (i32, Option<String>, i64) = (r.get(0), r.get(1), r.get(2));
        if event_id.as_deref() != Some(id.to_string().as_str()) {
            mismatched += 1;
        }
        out[p as usize].push(check::Delivered {
            id: id as u64,
            key: r.get(3),
            seq: r.get::<_, i64>(4) as u64,
        });
    }
    Ok((out, mismatched))
}

/// Every 100 ms: peak RSS of both; a process that exited on its own is counted and started
/// again (as a supervisor would).
async fn watch(
    relay: Arc<Mutex<Ferry>>,
    inbox: Arc<Mutex<Ferry>>,
    seen: Arc<Mutex<Seen>>,
    on: Arc<AtomicBool>,
) {
    while on.load(Ordering::Relaxed) {
        for (i, f) in [&relay, &inbox].into_iter().enumerate() {
            let mut f = lock(f);
            if let Some(status) = f.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                f.child = None;
                lock(&seen)
                    .exits
                    .push(format!("ferry {}: {status}", f.command));
                let _ = f.spawn();
            }
            if let Some(rss) = f.pid().and_then(|p| procfs::peak_rss_kib(p).ok()) {
                let mut s = lock(&seen);
                let peak = if i == 0 {
                    &mut s.peak_rss_relay
                } else {
                    &mut s.peak_rss_inbox
                };
                *peak = (*peak).max(rss);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kills_come_from_the_seed_alone() {
        let a = schedule(12, Duration::from_secs(60), 6.0);
        assert_eq!(a, schedule(12, Duration::from_secs(60), 6.0));
        assert_ne!(a, schedule(13, Duration::from_secs(60), 6.0));
        assert!((6..=20).contains(&a.len()), "{}", a.len());
        assert!(a.iter().any(|(_, t)| *t != Target::Relay));
        assert!(a.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
