//! The whole chain at a steady rate: a writer commits outbox rows (10-row transactions of ~1 KB
//! jsonb, the latency runs' writer) into an outbox database, `ferry run` relays them to a topic
//! of 6 partitions, `ferry inbox` stores them in an inbox database of the same cluster.
//!
//! Latency is **outbox commit → inbox commit**: each outbox row's `pg_xact_commit_timestamp`
//! against that of the inbox row with its id as `event_id` (`ferry run` sets the `id` header to
//! the row's id). Both databases are on one cluster, so both stamps come from one clock; the
//! inbox's commit is when the row becomes visible to the application. Exact quantiles over
//! every row of the run. The topic stamps records with the broker's clock as it appends them
//! (`message.timestamp.type=LogAppendTime`; the inbox stores that as `kafka_timestamp`), which
//! splits it in two: outbox commit → in Kafka (`ferry run`), in Kafka → inbox commit
//! (`ferry inbox`); the broker stamps whole milliseconds, so half a millisecond is added.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use ferry_testkit::pg;

use super::{micros, quantile, wait_rows, Ctx, InboxProc};
use crate::ferry::Running;
use crate::workload::thousands;
use crate::{procfs, Res};

const WARM_UP_ROWS: u64 = 100;

pub async fn run(ctx: &Ctx) -> Res<()> {
    let (rate, secs) = (ctx.args.rate, ctx.args.latency_secs);
    println!(
        "\n[latency] writer → ferry run → Kafka → ferry inbox at {} rows/s for {secs} s ({}-row transactions of ~1 KB jsonb)",
        thousands(rate),
        crate::latency::TXN_ROWS
    );
    let w = crate::latency::workload();
    let (out_db, out_url) = crate::world::create_db(&ctx.admin, &ctx.world, &w).await?;
    let outbox = pg::connect(&out_url).await;
    let slot = "bench_inbox_latency";
    outbox
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .await?;
    let topic = ctx
        .topic_with(
            "inbox-latency",
            &[("message.timestamp.type", "LogAppendTime")],
        )
        .await;
    let brokers = ctx.world.brokers();
    let mut relay = Running::spawn(&out_url, &brokers, slot, &topic)?;
    let (in_db, in_url) = ctx.inbox_db("bench_inbox_latency").await?;
    let inbox_sql = pg::connect(&in_url).await;
    let mut inbox = InboxProc::spawn(ctx, &in_url, &topic, "bench-latency", &[], None)?;
    // Warm up: the relay's producer id, the inbox's group join and its first write.
    w.insert_one_txn(&outbox, 0, WARM_UP_ROWS).await?;
    wait_rows(
        &inbox_sql,
        WARM_UP_ROWS as i64,
        Duration::from_secs(120),
        &mut inbox,
    )
    .await?;
    relay.check_alive()?;
    let (cpu_relay, cpu_inbox) = (
        procfs::cpu_seconds(relay.child.id())?,
        procfs::cpu_seconds(inbox.pid())?,
    );
    let writes_before = procfs::histogram(inbox.port, "ferry_inbox_write_seconds").await?;
    let writer_start = SystemTime::now();
    let crate::latency::Written { rows, elapsed, .. } =
        crate::latency::write_load(&out_url, rate, secs, false).await?;
    wait_rows(
        &inbox_sql,
        (WARM_UP_ROWS + rows) as i64,
        Duration::from_secs(300),
        &mut inbox,
    )
    .await?;
    let writes = procfs::diff(
        &procfs::histogram(inbox.port, "ferry_inbox_write_seconds").await?,
        &writes_before,
    );
    let cpu_relay = procfs::cpu_seconds(relay.child.id())? - cpu_relay;
    let cpu_inbox = procfs::cpu_seconds(inbox.pid())? - cpu_inbox;
    let rss = procfs::peak_rss_kib(inbox.pid())?;
    relay.stop().await;
    inbox.stop().await;

    let stamp = "(extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1e6)::bigint";
    let since = micros(writer_start);
    let commits: HashMap<String, i64> = outbox
        .query(&format!("SELECT id::text, {stamp} FROM outbox"), &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .filter(|(_, t): &(String, i64)| *t >= since)
        .collect();
    let visible: Vec<(String, i64, i64)> = inbox_sql
        .query(
            &format!(
                "SELECT event_id, {stamp}, (extract(epoch FROM kafka_timestamp) * 1e6)::bigint + 500 \
                 FROM ferry_inbox"
            ),
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let (mut lat, mut relay_lat, mut inbox_lat) = (Vec::new(), Vec::new(), Vec::new());
    for (id, t, k) in &visible {
        if let Some(c) = commits.get(id) {
            lat.push((t - c) as f64 / 1e3);
            relay_lat.push((k - c) as f64 / 1e3);
            inbox_lat.push((t - k) as f64 / 1e3);
        }
    }
    if lat.len() as u64 != rows || commits.len() as u64 != rows {
        return Err(format!(
            "the writer committed {rows} rows, the outbox holds {} of the run, the inbox {} of them",
            commits.len(),
            lat.len()
        )
        .into());
    }
    for v in [&mut lat, &mut relay_lat, &mut inbox_lat] {
        v.sort_by(f64::total_cmp);
    }
    let q = |v: &[f64]| {
        format!(
            "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            quantile(v, 0.50),
            quantile(v, 0.99),
            quantile(v, 1.0)
        )
    };
    drop((outbox, inbox_sql));
    ctx.drop_db(&out_db).await?;
    ctx.drop_db(&in_db).await?;
    println!(
        "[latency] {} rows at {} rows/s achieved: outbox commit → inbox commit p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms \
         (outbox commit → in Kafka {}; in Kafka → inbox commit {}); \
         {} inbox transactions, BEGIN → COMMIT's answer p50 {:.1} ms, p99 {:.1} ms (ferry_inbox_write_seconds); \
         CPU s / 100k rows: ferry run {:.2}, ferry inbox {:.2}; ferry inbox peak RSS {:.1} MiB",
        thousands(rows),
        thousands((rows as f64 / elapsed).round() as u64),
        quantile(&lat, 0.50),
        quantile(&lat, 0.99),
        quantile(&lat, 0.999),
        quantile(&lat, 1.0),
        q(&relay_lat),
        q(&inbox_lat),
        writes.last().map_or(0, |b| b.1),
        procfs::quantile(&writes, 0.5) * 1e3,
        procfs::quantile(&writes, 0.99) * 1e3,
        cpu_relay / rows as f64 * 1e5,
        cpu_inbox / rows as f64 * 1e5,
        rss as f64 / 1024.0,
    );
    Ok(())
}
