//! Start-up: how long until Ferry's first record is acknowledged, three ways.
//!
//! - **cold start**: a 10-row transaction waits in a fresh slot; `ferry run` is spawned; the
//!   clock runs from the spawn until Ferry's `ferry_records_produced_total` (records Kafka
//!   acknowledged) is above zero. Includes process start, configuration, the check queries,
//!   the topic watch, the Kafka producer getting its producer id, the replication connection.
//! - **standby takeover**: Ferry stands by while another connection holds the slot (its producer
//!   warmed up meanwhile); the clock runs from the holder letting go until the first
//!   acknowledgement: noticing the free slot (polled every 50 ms here), connecting, streaming.
//! - **restart after kill -9**: a Ferry that has relayed a transaction is killed with SIGKILL
//!   and a new one spawned at once on the same slot, which holds a new 10-row transaction; the
//!   clock runs from the kill until the new process's first acknowledgement (the walsender
//!   has to notice the dead connection first: until then the slot is active and the new Ferry
//!   stands by).
//!
//! The first acknowledgement is observed by polling Ferry's `/metrics` every 2 ms, so each
//! figure is late by up to that (and by the HTTP listener's own start for a cold start, which
//! comes before the pipeline). Figures are medians over `--startup N` runs of each kind.

use std::time::{Duration, Instant};

use ferry_testkit::pg;
use ferry_testkit::process::signal;

use crate::ferry::{Holder, Running};
use crate::workload::{Kind, Workload};
use crate::{confirmed, current_lsn, Res};

/// What the start-up runs measured, seconds per run.
#[derive(Debug, Clone, Default)]
pub struct Startup {
    pub cold: Vec<f64>,
    pub takeover: Vec<f64>,
    pub restart: Vec<f64>,
}

impl Startup {
    /// The markdown table: median and min–max per kind, milliseconds.
    pub fn table(&self) -> String {
        let mut o = String::from(
            "| from → first acknowledgement | runs | median | min–max |\n|---|--:|--:|--:|\n",
        );
        for (what, v) in [
            ("process start (cold)", &self.cold),
            ("kill -9 → restarted process", &self.restart),
            ("slot freed → warm standby", &self.takeover),
        ] {
            if v.is_empty() {
                continue;
            }
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = v.iter().copied().fold(0.0, f64::max);
            o += &format!(
                "| {what} | {} | {:.0} ms | {:.0}–{:.0} ms |\n",
                v.len(),
                crate::report::median(v) * 1e3,
                min * 1e3,
                max * 1e3
            );
        }
        o
    }
}

/// The small transaction each run relays.
fn workload() -> Workload {
    Workload {
        name: "startup",
        rows: 10,
        txn_rows: 10,
        payload: 1024,
        kind: Kind::Jsonb,
    }
}

/// Polls until Ferry reports an acknowledged record; seconds since `since`.
async fn first_ack(ferry: &mut Running, since: Instant) -> Res<f64> {
    loop {
        if ferry.produced().await.is_some_and(|p| p > 0.0) {
            return Ok(since.elapsed().as_secs_f64());
        }
        ferry.check_alive()?;
        if since.elapsed() > Duration::from_secs(60) {
            return Err("no record acknowledged within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// One run of each kind on fresh slots of the database at `url` (which has the outbox table).
pub async fn run(url: &str, brokers: &str, topic: &str, run: u32, out: &mut Startup) -> Res<()> {
    let sql = pg::connect(url).await;
    let w = workload();
    let slot = |kind: &str| format!("bench_start_{kind}_{run}");
    for s in ["cold", "takeover"] {
        sql.execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot(s)],
        )
        .await?;
    }

    // Cold start (its Ferry is then killed for the restart).
    w.insert_one_txn(&sql, 0, w.rows).await?;
    let spawned = Instant::now();
    let mut ferry = Running::spawn(url, brokers, &slot("cold"), topic)?;
    out.cold.push(first_ack(&mut ferry, spawned).await?);
    let end = current_lsn(&sql).await?;
    while confirmed(&sql, &slot("cold")).await? < end {
        ferry.check_alive()?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Restart after kill -9: the new transaction is written before the kill, so that what the
    // replacement acknowledges first is new work, not only a replay.
    w.insert_one_txn(&sql, 100, w.rows).await?;
    signal(&ferry.child, libc::SIGKILL);
    let killed = Instant::now();
    let _ = ferry.child.wait();
    let mut again = Running::spawn(url, brokers, &slot("cold"), topic)?;
    out.restart.push(first_ack(&mut again, killed).await?);
    again.stop().await;

    // Standby takeover: the holder has the slot while Ferry starts and warms up.
    let holder = Holder::hold(url, &slot("takeover")).await?;
    w.insert_one_txn(&sql, 200, w.rows).await?;
    let mut standby = Running::spawn(url, brokers, &slot("takeover"), topic)?;
    let spawned = Instant::now();
    while spawned.elapsed() < Duration::from_millis(1500)
        || standby.metric("ferry_standby").await != Some(1.0)
    {
        standby.check_alive()?;
        if spawned.elapsed() > Duration::from_secs(60) {
            return Err("ferry did not stand by within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let released = Instant::now();
    drop(holder);
    out.takeover.push(first_ack(&mut standby, released).await?);
    standby.stop().await;

    for s in ["cold", "takeover"] {
        // The walsender of a killed or stopped Ferry may take a moment to go.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match sql
                .execute("SELECT pg_drop_replication_slot($1)", &[&slot(s)])
                .await
            {
                Ok(_) => break,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    sql.batch_execute("TRUNCATE outbox").await?;
    Ok(())
}
