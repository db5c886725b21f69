//! Figures from samples, the markdown report (`results.md`) and the targets Ferry is held to.
//!
//! Every figure is a median over runs (rows/s, CPU); peak RSS is the maximum over runs, the
//! figure a memory budget cares about. MB/s counts payload bytes as Kafka receives them (jsonb
//! text, raw bytea). "% of pg_recvlogical" divides medians.

use std::fmt::Write as _;

use crate::latency::{Latency, Relay};
use crate::machine::Machine;
use crate::workload::{thousands, Workload};
use crate::{Contender, Sample};

/// One workload's samples, all runs and contenders.
#[derive(Debug, Clone)]
pub struct WorkloadResult {
    pub workload: Workload,
    pub rows: u64,
    /// Total payload bytes of the backlog.
    pub payload_bytes: u64,
    pub insert_secs: Vec<f64>,
    pub samples: Vec<(Contender, Sample)>,
}

/// A contender's figures on one workload.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub rate: f64,
    pub rate_min: f64,
    pub rate_max: f64,
    pub mb_s: f64,
    pub cpu_per_100k: Option<f64>,
    pub peak_rss_mib: Option<f64>,
    pub first_ack: Option<f64>,
    /// Rows/s until Kafka held every record, from the start (Ferry, Debezium).
    pub kafka_rate: Option<f64>,
    /// Rows/s from the first record in Kafka until Kafka held every record.
    pub kafka_rate_from_first: Option<f64>,
    /// Seconds from the start to the first record in Kafka.
    pub kafka_first: Option<f64>,
}

impl WorkloadResult {
    pub fn stats(&self, c: Contender) -> Option<Stats> {
        let s: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|(k, _)| *k == c)
            .map(|(_, s)| s)
            .collect();
        if s.is_empty() {
            return None;
        }
        let rows = self.rows as f64;
        let rates: Vec<f64> = s.iter().map(|s| rows / s.secs).collect();
        let rate = median(&rates);
        let cpus: Vec<f64> = s
            .iter()
            .filter_map(|s| s.cpu.map(|c| c / rows * 100_000.0))
            .collect();
        let rss = s
            .iter()
            .filter_map(|s| s.peak_rss_kib)
            .max()
            .map(|k| k as f64 / 1024.0);
        let first: Vec<f64> = s.iter().filter_map(|s| s.first_ack).collect();
        let kafka: Vec<f64> = s.iter().filter_map(|s| Some(rows / s.kafka_all?)).collect();
        let kafka_from_first: Vec<f64> = s
            .iter()
            .filter_map(|s| Some(rows / (s.kafka_all? - s.kafka_first?)))
            .collect();
        let kafka_first: Vec<f64> = s.iter().filter_map(|s| s.kafka_first).collect();
        let med = |v: &[f64]| (!v.is_empty()).then(|| median(v));
        Some(Stats {
            rate,
            rate_min: rates.iter().copied().fold(f64::INFINITY, f64::min),
            rate_max: rates.iter().copied().fold(0.0, f64::max),
            mb_s: rate * self.payload_bytes as f64 / rows / 1e6,
            cpu_per_100k: (!cpus.is_empty()).then(|| median(&cpus)),
            peak_rss_mib: rss,
            first_ack: (!first.is_empty()).then(|| median(&first)),
            kafka_rate: med(&kafka),
            kafka_rate_from_first: med(&kafka_from_first),
            kafka_first: med(&kafka_first),
        })
    }
}

/// A contender's rows/s over pg_recvlogical's, run by run: the i-th run of each is a pair (the
/// contenders of one run drain the same WAL back to back, taking turns going first), so drift
/// of the machine between runs cancels out of each ratio. The targets are held to the
/// median of these ratios, with their interquartile range beside it.
#[derive(Debug, Clone)]
pub struct Paired {
    /// Ferry's rows/s over pg_recvlogical's, per pair.
    pub ratios: Vec<f64>,
    /// The same after Ferry's first acknowledgement (its time less the time to its first
    /// acknowledged record), per pair.
    pub after_first_ack: Vec<f64>,
}

impl WorkloadResult {
    /// The pairs of `c` and pg_recvlogical (`None` without both).
    pub fn paired(&self, c: Contender) -> Option<Paired> {
        let of = |k: Contender| -> Vec<&Sample> {
            self.samples
                .iter()
                .filter(|(x, _)| *x == k)
                .map(|(_, s)| s)
                .collect()
        };
        let (recv, ferry) = (of(Contender::Recv), of(c));
        if recv.is_empty() || ferry.is_empty() {
            return None;
        }
        let rows = self.rows as f64;
        let mut p = Paired {
            ratios: Vec::new(),
            after_first_ack: Vec::new(),
        };
        for (r, f) in recv.iter().zip(&ferry) {
            let base = rows / r.secs;
            p.ratios.push(rows / f.secs / base);
            let after = f.secs - f.first_ack.unwrap_or(0.0);
            if after > 0.0 {
                p.after_first_ack.push(rows / after / base);
            }
        }
        Some(p)
    }
}

/// The `q` quantile (0..=1) by nearest rank; NaN for none.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}

/// `median (q1–q3)` of ratios, as percentages.
pub fn ratio_cell(v: &[f64]) -> String {
    if v.is_empty() {
        return "–".into();
    }
    format!(
        "{:.0}% ({:.0}–{:.0}%)",
        median(v) * 100.0,
        quantile(v, 0.25) * 100.0,
        quantile(v, 0.75) * 100.0
    )
}

/// Median (upper median for even counts); NaN for none.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Everything one invocation measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub machine: Machine,
    pub command: String,
    pub runs: u32,
    pub workloads: Vec<WorkloadResult>,
    pub latency: Vec<Latency>,
    pub startup: Option<crate::startup::Startup>,
}

/// One target from the issue and how Ferry did.
#[derive(Debug, Clone)]
pub struct Target {
    pub what: String,
    pub measured: String,
    pub met: bool,
}

impl Report {
    /// The throughput table.
    pub fn throughput_table(&self) -> String {
        let mut o = String::new();
        o.push_str("| workload | contender | ends when | rows/s | MB/s | % of pg_recvlogical | CPU s / 100k rows | peak RSS MiB | rows/s min–max |\n");
        o.push_str("|---|---|---|--:|--:|--:|--:|--:|--:|\n");
        for w in &self.workloads {
            let base = w.stats(Contender::Recv).map(|s| s.rate);
            for c in Contender::ALL {
                let Some(s) = w.stats(c) else { continue };
                let pct = base.map_or("–".into(), |b| format!("{:.0}%", s.rate / b * 100.0));
                let cpu = s.cpu_per_100k.map_or("–".into(), |v| format!("{v:.2}"));
                let rss = s.peak_rss_mib.map_or("–".into(), |v| format!("{v:.0}"));
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {:.1} | {pct} | {cpu} | {rss} | {}–{} |",
                    w.workload.name,
                    c.label(),
                    c.ends_when(),
                    thousands(s.rate.round() as u64),
                    s.mb_s,
                    thousands(s.rate_min.round() as u64),
                    thousands(s.rate_max.round() as u64),
                );
            }
        }
        o
    }

    /// The table of the end every relay can be held to: Kafka holding all N records (the topic's
    /// high watermarks), from the start and from the first record in Kafka.
    pub fn kafka_end_table(&self) -> String {
        let mut o = String::new();
        o.push_str("| workload | contender | clock starts | rows/s to Kafka holding all N | rows/s from its first record in Kafka | first record in Kafka after | CPU s / 100k rows | peak RSS MiB |\n");
        o.push_str("|---|---|---|--:|--:|--:|--:|--:|\n");
        for w in &self.workloads {
            for c in [Contender::Ferry, Contender::FerryCold, Contender::Debezium] {
                let Some(s) = w.stats(c) else { continue };
                let Some(rate) = s.kafka_rate else { continue };
                let from = match c {
                    Contender::Ferry => "slot freed (warm standby)",
                    _ => "process start",
                };
                let f = |v: Option<f64>, d: usize| v.map_or("–".into(), |v| format!("{v:.d$}"));
                let _ = writeln!(
                    o,
                    "| {} | {} | {from} | {} | {} | {} s | {} | {} |",
                    w.workload.name,
                    c.label(),
                    thousands(rate.round() as u64),
                    s.kafka_rate_from_first
                        .map_or("–".into(), |v| thousands(v.round() as u64)),
                    f(s.kafka_first, 2),
                    f(s.cpu_per_100k, 2),
                    f(s.peak_rss_mib, 0),
                );
            }
        }
        o
    }

    /// The latency table.
    pub fn latency_table(&self) -> String {
        let mut o = String::new();
        o.push_str("| relay | rate rows/s | achieved (rows) | commit → ack p50 / p99 / p999 (Ferry's histogram) | commit → in Kafka p50 / p99 / p999 (all relays) | of which PostgreSQL: commit → sent p50 / p99 (`ferry_source_delay_seconds`) | the walsender: on a CPU / waiting for one | records | slot lag: first ¼ → last ¼ (max) | catch-up | CPU s / 100k | peak RSS MiB |\n");
        o.push_str("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
        let ms = |v: f64| {
            if v.is_nan() {
                "–".to_string()
            } else {
                format!("{:.1}", v * 1e3)
            }
        };
        let pct = |v: f64| {
            if v.is_nan() {
                "–".to_string()
            } else {
                format!("{:.0}%", v * 100.0)
            }
        };
        for l in &self.latency {
            let _ = writeln!(
                o,
                "| {} | {} | {} ({}) | {} / {} / {} ms | {} / {} / {} ms | {} / {} ms | {} / {} | {} | {} → {} ({}) | {:.2} s | {:.2} | {:.0} |",
                l.relay.label(),
                thousands(l.rate),
                thousands(l.achieved.round() as u64),
                thousands(l.rows),
                ms(l.p50),
                ms(l.p99),
                ms(l.p999),
                ms(l.kafka_p50),
                ms(l.kafka_p99),
                ms(l.kafka_p999),
                ms(l.source_p50),
                ms(l.source_p99),
                pct(l.walsender_cpu),
                pct(l.walsender_waiting),
                thousands(l.samples.max(l.kafka_samples)),
                kib(l.lag_first_quarter),
                kib(l.lag_last_quarter),
                kib(l.lag_max),
                l.catch_up,
                l.cpu_per_100k,
                l.peak_rss_mib
            );
        }
        o
    }

    /// The targets of the issue, for what this run measured.
    pub fn targets(&self) -> Vec<Target> {
        let mut t = Vec::new();
        let ferry = |name: &str| {
            self.workloads
                .iter()
                .find(|w| w.workload.name == name)
                .and_then(|w| Some((w.stats(Contender::Ferry)?, w.stats(Contender::Recv))))
        };
        if let Some((f, Some(r))) = ferry("backlog-1k") {
            let pct = f.rate / r.rate * 100.0;
            t.push(Target {
                what: "backlog drain ≥ 85% of pg_recvlogical (backlog-1k)".into(),
                measured: format!("{pct:.0}%"),
                met: pct >= 85.0,
            });
        }
        let all: Vec<(&str, usize, Stats)> = self
            .workloads
            .iter()
            .filter_map(|w| {
                let s = w.stats(Contender::Ferry)?;
                Some((w.workload.name, w.workload.payload, s))
            })
            .collect();
        // CPU per row grows with the row: the target is read for rows of up to ~1 KB.
        let cpu = all
            .iter()
            .filter(|(_, payload, _)| *payload <= 1024)
            .filter_map(|(n, _, s)| Some((*n, s.cpu_per_100k?)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((name, v)) = cpu {
            t.push(Target {
                what: "Ferry ≤ 1.0 CPU-s per 100k rows (worst workload with rows ≤ 1 KB)".into(),
                measured: format!("{v:.2} ({name})"),
                met: v <= 1.0,
            });
        }
        let rss = |pred: &dyn Fn(&str) -> bool| {
            all.iter()
                .filter(|(n, _, _)| pred(n))
                .filter_map(|(n, _, s)| Some((*n, s.peak_rss_mib?)))
                .max_by(|a, b| a.1.total_cmp(&b.1))
        };
        if let Some((name, v)) = rss(&|n| n != "one-1m-txn") {
            t.push(Target {
                what: "Ferry peak RSS ≤ 64 MiB draining a backlog (worst workload)".into(),
                measured: format!("{v:.0} MiB ({name})"),
                met: v <= 64.0,
            });
        }
        if let Some((_, v)) = rss(&|n| n == "one-1m-txn") {
            t.push(Target {
                what: "Ferry peak RSS ≤ 96 MiB through the 1,000,000-row transaction".into(),
                measured: format!("{v:.0} MiB"),
                met: v <= 96.0,
            });
        }
        // Issues 15 and 29: from process start, and after the first acknowledgement, against
        // the walsender as pg_recvlogical reads it, as the median of run-by-run ratios.
        for w in &self.workloads {
            let name = w.workload.name;
            let floor = match name {
                "backlog-100b" | "backlog-1k" | "single-row-txns" => 95.0,
                "backlog-16k" | "bytea-1k" => 90.0,
                _ => continue,
            };
            if let Some(p) = w.paired(Contender::FerryCold) {
                let pct = median(&p.ratios) * 100.0;
                t.push(Target {
                    what: format!(
                        "Ferry from process start ≥ {floor:.0}% of pg_recvlogical ({name})"
                    ),
                    measured: format!("{pct:.0}%"),
                    met: pct >= floor,
                });
            }
            // After the first acknowledgement: the warm standby's pairs (from process start's
            // without one).
            if let Some(p) = w
                .paired(Contender::Ferry)
                .or_else(|| w.paired(Contender::FerryCold))
            {
                let pct = median(&p.after_first_ack) * 100.0;
                t.push(Target {
                    what: format!("Ferry after its first ack ≥ 100% of pg_recvlogical ({name})"),
                    measured: format!("{pct:.0}%"),
                    met: pct >= 100.0,
                });
            }
        }
        if let Some((f, _)) = ferry("backlog-1k") {
            if let Some(v) = f.cpu_per_100k {
                t.push(Target {
                    what: "Ferry ≤ 0.5 CPU-s per 100k rows (backlog-1k)".into(),
                    measured: format!("{v:.2}"),
                    met: v <= 0.5,
                });
            }
        }
        let worst = self
            .workloads
            .iter()
            .flat_map(|w| {
                [Contender::Ferry, Contender::FerryCold]
                    .into_iter()
                    .filter_map(|c| Some((w.workload.name, w.stats(c)?.peak_rss_mib?)))
            })
            .chain(
                self.latency
                    .iter()
                    .filter(|l| l.relay == Relay::Ferry)
                    .map(|l| ("latency", l.peak_rss_mib)),
            )
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((name, v)) = worst {
            t.push(Target {
                what: "Ferry peak RSS ≤ 64 MiB on every workload".into(),
                measured: format!("{v:.0} MiB ({name})"),
                met: v <= 64.0,
            });
        }
        for l in self.latency.iter().filter(|l| l.relay == Relay::Ferry) {
            if l.rate == 10_000 {
                t.push(Target {
                    what: "p99 commit → ack ≤ 10 ms at 10,000 rows/s".into(),
                    measured: format!("{:.1} ms (buckets: 5, 7.5, 10, 15 ms)", l.p99 * 1e3),
                    met: l.p99 <= 0.010,
                });
            }
            if l.rate == 2000 {
                t.push(Target {
                    what: "p99 commit → ack ≤ 10 ms at 2,000 rows/s".into(),
                    measured: format!("{:.1} ms (buckets: 5, 7.5, 10, 15 ms)", l.p99 * 1e3),
                    met: l.p99 <= 0.010,
                });
            }
            if l.rate == 10_000 {
                t.push(Target {
                    what: "no lag growth at 10,000 rows/s".into(),
                    measured: format!(
                        "{} → {} (achieved {} rows/s)",
                        kib(l.lag_first_quarter),
                        kib(l.lag_last_quarter),
                        thousands(l.achieved.round() as u64)
                    ),
                    met: !l.lag_grows() && l.achieved >= 0.95 * l.rate as f64,
                });
            }
        }
        if let Some(st) = self.startup.as_ref().filter(|s| !s.cold.is_empty()) {
            let cold = median(&st.cold);
            t.push(Target {
                what: "cold start → first record acknowledged ≤ 100 ms (median)".into(),
                measured: format!("{:.0} ms", cold * 1e3),
                met: cold <= 0.100,
            });
        }
        t.extend(self.debezium_targets());
        t
    }

    /// Ferry against Debezium, both from process start and both until Kafka holds every record
    /// (`ferry-cold` and `debezium` on `backlog-1k`); latency: both commit → in Kafka.
    pub fn debezium_targets(&self) -> Vec<Target> {
        let mut t = Vec::new();
        let both = self
            .workloads
            .iter()
            .find(|w| w.workload.name == "backlog-1k")
            .and_then(|w| {
                Some((
                    w.stats(Contender::FerryCold)?,
                    w.stats(Contender::Debezium)?,
                ))
            });
        if let Some((f, d)) = both {
            if let (Some(fr), Some(dr)) = (f.kafka_rate, d.kafka_rate) {
                t.push(Target {
                    what: "Ferry drains backlog-1k from process start at ≥ 3× Debezium's rows/s (both: until Kafka holds all N)".into(),
                    measured: format!(
                        "{:.1}× ({} vs {} rows/s)",
                        fr / dr,
                        thousands(fr.round() as u64),
                        thousands(dr.round() as u64)
                    ),
                    met: fr >= 3.0 * dr,
                });
            }
            if let (Some(fc), Some(dc)) = (f.cpu_per_100k, d.cpu_per_100k) {
                t.push(Target {
                    what: "Ferry ≤ 1/10 of Debezium's CPU per row (backlog-1k, from process start)"
                        .into(),
                    measured: format!("{:.2} vs {:.2} CPU-s / 100k rows: 1/{:.1}", fc, dc, dc / fc),
                    met: fc * 10.0 <= dc,
                });
            }
            if let (Some(fm), Some(dm)) = (f.peak_rss_mib, d.peak_rss_mib) {
                t.push(Target {
                    what: "Ferry ≤ 1/20 of Debezium's peak RSS (backlog-1k)".into(),
                    measured: format!("{fm:.0} vs {dm:.0} MiB: 1/{:.1}", dm / fm),
                    met: fm * 20.0 <= dm,
                });
            }
        }
        for d in self.latency.iter().filter(|l| l.relay == Relay::Debezium) {
            let Some(f) = self
                .latency
                .iter()
                .find(|l| l.relay == Relay::Ferry && l.rate == d.rate)
            else {
                continue;
            };
            if f.kafka_p99.is_nan() || d.kafka_p99.is_nan() {
                continue;
            }
            t.push(Target {
                what: format!(
                    "Ferry ≤ 1/10 of Debezium's p99 commit → in Kafka at {} rows/s",
                    thousands(d.rate)
                ),
                measured: format!(
                    "{:.1} vs {:.1} ms: 1/{:.1}",
                    f.kafka_p99 * 1e3,
                    d.kafka_p99 * 1e3,
                    d.kafka_p99 / f.kafka_p99
                ),
                met: f.kafka_p99 * 10.0 <= d.kafka_p99,
            });
        }
        t
    }

    /// Ferry against pg_recvlogical run by run (see [`Paired`]).
    pub fn paired_table(&self) -> String {
        let mut o = String::from("| workload | Ferry | pairs | rows/s ÷ pg_recvlogical's, median (IQR) | after its first ack, median (IQR) |\n|---|---|--:|--:|--:|\n");
        for w in &self.workloads {
            for c in [Contender::FerryCold, Contender::Ferry] {
                if let Some(p) = w.paired(c) {
                    let _ = writeln!(
                        o,
                        "| {} | {} | {} | {} | {} |",
                        w.workload.name,
                        c.label(),
                        p.ratios.len(),
                        ratio_cell(&p.ratios),
                        ratio_cell(&p.after_first_ack)
                    );
                }
            }
        }
        o
    }

    pub fn targets_table(&self) -> String {
        let mut o = String::from("| target | measured | met |\n|---|---|---|\n");
        for t in self.targets() {
            let _ = writeln!(
                o,
                "| {} | {} | {} |",
                t.what,
                t.measured,
                if t.met { "yes" } else { "**no**" }
            );
        }
        o
    }

    /// The whole report, as committed in `bench/results.md`.
    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let mut o = String::from("# Ferry benchmark results\n\n");
        let _ = writeln!(o, "Measured {} with `{}`.\n", m.date, self.command);
        let _ = writeln!(o, "- Machine: {}", m.summary());
        let _ = writeln!(
            o,
            "- Load average (1 min) during the run: {} (other work shares these cores; contenders are interleaved so drift spreads over all of them)",
            m.loads
                .iter()
                .map(|l| format!("{l:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let _ = writeln!(o, "- PostgreSQL {}; broker: {}", m.postgres, m.broker);
        let _ = writeln!(
            o,
            "- Ferry {} (commit {}), librdkafka {}",
            m.ferry, m.commit, m.librdkafka
        );
        if !m.debezium.is_empty() {
            let _ = writeln!(
                o,
                "- {}; worker producer settings: {}",
                m.debezium,
                crate::debezium::worker_properties().join(", ")
            );
        }
        let _ = writeln!(
            o,
            "- {} run(s) per workload; each figure is the median; contenders take turns going first\n",
            self.runs
        );
        if !self.workloads.is_empty() {
            o.push_str("## Throughput\n\nWorkloads:\n\n");
            for w in &self.workloads {
                let _ = writeln!(
                    o,
                    "- `{}`: {} (measured payload {:.0} B/row)",
                    w.workload.name,
                    w.workload.describe(),
                    w.payload_bytes as f64 / w.rows.max(1) as f64
                );
            }
            o.push('\n');
            o.push_str(&self.throughput_table());
            o.push_str("\nCPU is the contender's own process: `ferry`, `pg_recvlogical`, or the benchmark process for the raw producer and the relay (their client side only, not PostgreSQL's work). Debezium's is its JVM's (all threads), from its spawn. Peak RSS is `VmHWM` of Ferry or Debezium's JVM, the largest over runs. Debezium confirms its slot lazily (an offset flush, then the next message), so its clock stops when Kafka holds all N records (the topic's high watermarks summed, polled every 5 ms); the next table holds Ferry to the same end.\n\n");
            if self
                .workloads
                .iter()
                .any(|w| w.samples.iter().any(|(_, s)| s.kafka_all.is_some()))
            {
                o.push_str(
                    "### The same end for Ferry and Debezium: Kafka holds all N records\n\n",
                );
                o.push_str(&self.kafka_end_table());
                o.push_str("\nCPU and peak RSS as above (Ferry's CPU runs to its slot confirmation, a few ms past Kafka holding everything).\n\n");
            }
            if self.workloads.iter().any(|w| {
                w.paired(Contender::FerryCold).is_some() || w.paired(Contender::Ferry).is_some()
            }) {
                o.push_str("### Ferry ÷ pg_recvlogical, run by run\n\nEach run drains the same WAL with every contender in turn (taking turns going first): the ratio of one run's pair is immune to the machine's drift between runs. The median ratio, with its interquartile range, is what the targets hold Ferry to.\n\n");
                o.push_str(&self.paired_table());
                o.push('\n');
            }
            o.push_str("![rows/s per workload and contender](results.svg)\n\n");
            for (c, what) in [
                (
                    Contender::Ferry,
                    "Ferry end to end: the clock starts when the slot is freed for it (a warm standby taking over; see `bench/README.md`); time from then to its first acknowledged record (median)",
                ),
                (
                    Contender::FerryCold,
                    "Ferry from process start: the clock, its CPU and its first acknowledgement count from spawning `ferry run` on the free slot, as `pg_recvlogical`'s do; time to its first acknowledged record (median)",
                ),
            ] {
                let firsts: Vec<String> = self
                    .workloads
                    .iter()
                    .filter_map(|w| {
                        let s = w.stats(c)?;
                        Some(format!(
                            "{} {:.2} s",
                            w.workload.name,
                            s.first_ack.unwrap_or(f64::NAN)
                        ))
                    })
                    .collect();
                if !firsts.is_empty() {
                    let _ = writeln!(o, "{what}: {}.\n", firsts.join(", "));
                }
            }
        }
        if !self.latency.is_empty() {
            o.push_str("## Latency at a steady rate\n\nCommit in PostgreSQL → acknowledgement by Kafka, from Ferry's `ferry_replication_lag_seconds` histogram (quantiles interpolated within its buckets: 1, 2.5, 5, 7.5, 10, 15, 25 ms, ...). 10-row transactions of ~1 KB jsonb rows. Commit → in Kafka, for every relay alike: each row's commit timestamp (`pg_xact_commit_timestamp`) against its record's `LogAppendTime` on the broker (same machine, same clock), exact quantiles over every record of the run, to the broker's millisecond (half a millisecond added for its truncation). Of which PostgreSQL: per transaction, its commit time to the walsender sending it (Ferry's `ferry_source_delay_seconds`, both times the server's clock): while the relay keeps up, as here, the part no relay can shorten (it also counts any wait for Ferry to read). The walsender's time on a CPU and runnable but waiting for one (`/proc/<pid>/schedstat`) are shares of the writer's run. Slot lag is `pg_current_wal_lsn() - confirmed_flush_lsn` sampled every 250 ms (Debezium confirms lazily: its lag is its offset flush, not its delivery); catch-up is the time from the writer's last commit to Ferry confirming it, or to Kafka holding every record for Debezium. CPU and peak RSS are the relay's process (Debezium: its JVM).\n\n");
            o.push_str(&self.latency_table());
            let colds: Vec<String> = self
                .latency
                .iter()
                .map(|l| format!("{} {:.2} s", l.relay.label(), l.cold_start))
                .collect();
            let _ = writeln!(
                o,
                "\nCold start (spawning the relay until its warm-up transaction is confirmed, for Ferry, or in Kafka, for Debezium): {}.\n",
                colds.join(", ")
            );
        }
        if let Some(st) = &self.startup {
            o.push_str("## Start-up\n\nTime until Ferry's first record is acknowledged (`ferry_records_produced_total` above zero, polled every 2 ms; a 10-row transaction of ~1 KB jsonb waiting): from spawning a cold `ferry run`; from the kill of a running Ferry with SIGKILL, a new one spawned at once; from another connection freeing the slot a warm standby waits for (see `bench/README.md`). For Ferry and Debezium alike: until a consumer at the topic's end sees the waiting transaction's first record (Debezium: the connector named on the worker's command line; its restart resumes from the killed worker's offsets, written after it relayed the previous transaction).\n\n");
            o.push_str(&st.table());
            o.push_str("\nCPU spent while each clock ran (means over the runs; Ferry: the process timed, a takeover's since the slot was freed; the broker when the harness started it; this harness's own polling). With `--pinned`, Ferry, the broker and the harness share CPU 1: a CPU ÷ wall near 100% means that core, not Ferry's chain of round trips, set the figure.\n\n");
            o.push_str(&st.cpu_table());
            o.push('\n');
        }
        let targets = self.targets();
        if !targets.is_empty() {
            o.push_str("## Targets\n\n");
            o.push_str(&self.targets_table());
        }
        o
    }
}

/// Bytes as KiB/MiB text.
pub fn kib(bytes: u64) -> String {
    if bytes >= 10 << 20 {
        format!("{:.0} MiB", bytes as f64 / (1 << 20) as f64)
    } else if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
    } else {
        format!("{:.0} KiB", bytes as f64 / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::matrix;

    fn sample(secs: f64, cpu: f64, rss: u64) -> Sample {
        Sample {
            secs,
            cpu: Some(cpu),
            peak_rss_kib: Some(rss),
            first_ack: Some(0.5),
            last_ack: None,
            wire_bytes: None,
            kafka_first: None,
            kafka_all: None,
        }
    }

    /// Ratios are taken within a run and then summarised: a slow run of both contenders (the
    /// machine busy) does not move the figure, where a ratio of medians would mix runs.
    #[test]
    fn ratios_pair_the_runs_and_targets_take_their_median() {
        let w = WorkloadResult {
            workload: matrix()[0].clone(),
            rows: 100,
            payload_bytes: 100,
            insert_secs: vec![1.0],
            samples: vec![
                (Contender::Recv, sample(1.0, 0.1, 0)),
                (Contender::FerryCold, sample(1.0, 1.0, 0)),
                // A busy run: both twice as slow.
                (Contender::FerryCold, sample(2.0, 1.0, 0)),
                (Contender::Recv, sample(2.0, 0.1, 0)),
                (Contender::Recv, sample(1.0, 0.1, 0)),
                (Contender::FerryCold, sample(1.25, 1.0, 0)),
            ],
        };
        let p = w.paired(Contender::FerryCold).unwrap();
        assert_eq!(p.ratios, [1.0, 1.0, 0.8]);
        // 100 rows in 0.5 s after the first ack at 0.5 s: twice pg_recvlogical's rate.
        assert_eq!(p.after_first_ack[0], 2.0);
        assert_eq!(ratio_cell(&p.ratios), "100% (100–100%)");
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.25), 2.0);
        assert!(w.paired(Contender::Ferry).is_none());
        let r = Report {
            workloads: vec![w],
            ..Report::default()
        };
        let t = r
            .targets()
            .into_iter()
            .find(|t| t.what.starts_with("Ferry from process start"))
            .unwrap();
        assert_eq!(t.measured, "100%");
        assert!(t.met);
        assert!(r
            .markdown()
            .contains("| backlog-1k | Ferry from process start | 3 | 100% (100–100%) |"));
    }

    #[test]
    fn figures_are_medians_and_targets_follow_them() {
        let w = WorkloadResult {
            workload: matrix()[0].clone(),
            rows: 200_000,
            payload_bytes: 200_000_000,
            insert_secs: vec![1.0],
            samples: vec![
                (Contender::Recv, sample(1.0, 0.1, 0)),
                (Contender::Ferry, sample(2.0, 2.0, 80 * 1024)),
                (Contender::Recv, sample(2.0, 0.1, 0)),
                (Contender::Ferry, sample(1.0, 1.0, 40 * 1024)),
                (Contender::Ferry, sample(1.25, 1.0, 50 * 1024)),
            ],
        };
        let f = w.stats(Contender::Ferry).unwrap();
        assert_eq!(f.rate, 160_000.0);
        assert_eq!((f.rate_min, f.rate_max), (100_000.0, 200_000.0));
        assert_eq!(f.mb_s, 160.0);
        assert_eq!(f.cpu_per_100k, Some(0.5));
        assert_eq!(f.peak_rss_mib, Some(80.0));
        assert!(w.stats(Contender::Relay).is_none());
        let r = Report {
            workloads: vec![w],
            ..Report::default()
        };
        let t = r.targets();
        assert_eq!(t[0].measured, "80%");
        assert!(!t[0].met);
        assert!(t[1].met, "0.5 CPU-s per 100k rows");
        assert!(!t[2].met, "80 MiB is over 64");
        assert!(r.markdown().contains("| backlog-1k | Ferry end to end | slot confirmed the end | 160,000 | 160.0 | 80% | 0.50 | 80 | 100,000–200,000 |"));
    }

    #[test]
    fn ferry_is_held_to_debeziums_end_against_debezium() {
        let kafka = |secs: f64, cpu: f64, rss: u64, first: f64| Sample {
            secs,
            cpu: Some(cpu),
            peak_rss_kib: Some(rss),
            kafka_first: Some(first),
            kafka_all: Some(secs),
            ..Sample::default()
        };
        let w = WorkloadResult {
            workload: matrix()[0].clone(),
            rows: 200_000,
            payload_bytes: 200_000_000,
            insert_secs: vec![1.0],
            samples: vec![
                (Contender::FerryCold, kafka(2.0, 1.4, 40 * 1024, 0.5)),
                (Contender::Debezium, kafka(20.0, 40.0, 1000 * 1024, 10.0)),
            ],
        };
        let d = w.stats(Contender::Debezium).unwrap();
        assert_eq!(d.kafka_rate, Some(10_000.0));
        assert_eq!(d.kafka_rate_from_first, Some(20_000.0));
        let lat = |relay, p99| Latency {
            relay,
            rate: 2000,
            kafka_p99: p99,
            ..Latency::default()
        };
        let r = Report {
            workloads: vec![w],
            latency: vec![lat(Relay::Ferry, 0.02), lat(Relay::Debezium, 0.1)],
            ..Report::default()
        };
        let t = r.debezium_targets();
        assert_eq!(t.len(), 4);
        assert!(t[0].met, "10x the rows/s: {}", t[0].measured);
        assert!(t[1].met, "0.70 vs 20 CPU-s");
        assert!(t[2].met, "40 vs 1000 MiB is 1/25");
        assert!(!t[3].met, "20 ms vs 100 ms is 1/5");
        let md = r.markdown();
        assert!(md
            .contains("| backlog-1k | Debezium from process start | Kafka holds all N | 10,000 |"));
        assert!(md.contains("| backlog-1k | Debezium from process start | process start | 10,000 | 20,000 | 10.00 s | 20.00 | 1000 |"));
    }

    #[test]
    fn lag_growth_needs_a_real_increase() {
        let l = |a, b| Latency {
            lag_first_quarter: a,
            lag_last_quarter: b,
            ..Latency::default()
        };
        assert!(!l(100_000, 150_000).lag_grows());
        assert!(!l(0, 1 << 20).lag_grows());
        assert!(l(1 << 20, 4 << 20).lag_grows());
        assert_eq!(kib(512), "0 KiB");
        assert_eq!(kib(3 << 20), "3.0 MiB");
    }
}
