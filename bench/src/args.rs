//! Command-line flags. Without any, the full matrix runs and its report is written to `bench/`.

use std::path::PathBuf;

use crate::workload::{extras, matrix, Workload};
use crate::{Contender, Res};

pub const USAGE: &str = "\
ferry-bench: Ferry against pg_recvlogical, a raw rdkafka producer and a polling relay on the same WAL

usage: ferry-bench [flags]

  --runs N              runs per workload; figures are medians (default 3)
  --workloads a,b       workloads to run, or `none` (default: all):
                        backlog-1k, backlog-100b, backlog-16k, bytea-1k, single-row-txns, one-1m-txn;
                        and only when named: backlog-256k (1,000 rows of ~256 KB)
  --contenders a,b      recv, raw, ferry, ferry-cold, relay, debezium (default: all)
  --scale F             multiply every workload's rows by F (default 1)
  --rates a,b           steady rates for the latency runs, rows/s, or `none` (default 2000,10000)
  --latency-secs S      length of each latency run (default 30)
  --compression C       the codec every contender produces with: none, gzip, snappy, lz4, zstd
                        (default: Ferry's default, lz4)
  --startup N           start-up runs of each kind: cold start, restart after kill -9, standby
                        takeover (default 7; 0 skips them)
  --startup-fill N      before each kill -9, write N records of another key to the killed Ferry's
                        progress topic, as an hour of streaming leaves in its active segment
                        (default 0)
  --outage-for S        after the start-up runs, as many outages: the local broker stopped for S
                        seconds under a running Ferry, timed from its return to every record
                        written meanwhile acknowledged (default 0: none)
  --pg-outage-for S     after the start-up runs, as many PostgreSQL outages: the benchmark's own
                        cluster stopped (fast shutdown) for S seconds under a running Ferry, timed
                        from it accepting connections again to a transaction written then
                        acknowledged (default 0: none)
  --startup-topics N    before the start-up runs, give the broker N other topics (one partition
                        each, kept for later runs on a --keep-broker broker), as a cluster in use
                        holds them (default 0)
  --out DIR             write results.md and results.svg to DIR (default: bench/ of the source
                        tree for a full-matrix run, nowhere otherwise)
  --pinned              PostgreSQL on CPU 0, the contenders, the broker and this harness on CPU 1
                        (needs 2 CPUs): a deployment where the relay does not share the database's
                        cores; without it everything shares every CPU
  --keep-broker         one local broker for every run, loaded for 15 s before the first (default:
                        a fresh one per run, whose JVM compiles while the run goes on)
  --stall-broker        stop the local broker (SIGSTOP) 0.7 s into every Ferry drain, for 4 s:
                        Ferry's peak RSS with its window full and nothing acknowledged (a memory
                        figure: the rates of such a run compare with nothing)
  --instructions a,b    instead of the matrix: instructions per row counted by callgrind, Ferry
                        and pg_recvlogical on the same fixed WAL of these workloads, split by
                        component (see bench/README.md, Instructions); needs valgrind
  --instr-rows N        rows of the difference between the two databases (default 20000)
  --instr-small S       rows of the small database (default 1000)
  --instr-runs R        runs of each (default 1); the spread over runs is printed
  --instr-files DIR     with --instructions: no runs, the report of the callgrind files an
                        earlier run left in DIR (--out D leaves them in D/callgrind)
  --smoke               tiny version of everything, one run (the CI stage): --runs 1 --scale 0.01
                        --latency-secs 2
  -h, --help            this text

Starts a private PostgreSQL cluster and a local broker, unless FERRY_TEST_PG_URL /
FERRY_TEST_KAFKA_BROKERS name existing ones. The ferry binary is FERRY_BIN, else the one
beside this executable.";

/// What to run.
#[derive(Debug, Clone)]
pub struct Args {
    pub runs: u32,
    pub workloads: Vec<Workload>,
    pub contenders: Vec<Contender>,
    pub rates: Vec<u64>,
    pub latency_secs: f64,
    /// Start-up runs of each kind (see `startup`).
    pub startup: u32,
    /// Records written to the progress topic before each kill -9 (see `startup`).
    pub startup_fill: u32,
    /// Other topics the broker holds before the start-up runs (see `startup`).
    pub startup_topics: u32,
    /// `--outage-for`: after the start-up runs, as many broker outages of this long (see
    /// `startup::outage`); zero: none.
    pub outage_for: std::time::Duration,
    /// `--pg-outage-for`: after the start-up runs, as many PostgreSQL outages of this long (see
    /// `startup::pg_outage`); zero: none.
    pub pg_outage_for: std::time::Duration,
    /// `kafka.compression` for Ferry and the same codec for the other producers.
    pub compression: String,
    pub out: Option<PathBuf>,
    pub smoke: bool,
    /// `--pinned` (see `pin`).
    pub pinned: bool,
    /// `--keep-broker`: no fresh broker per run (see `World::fresh_broker`).
    pub keep_broker: bool,
    /// `--stall-broker`: the local broker stopped during every Ferry drain (see `ferry::Stall`).
    pub stall_broker: bool,
    /// `--instructions`: the workloads to count instructions on (nothing else runs).
    pub instructions: Option<Vec<Workload>>,
    /// `--instr-rows`: N, the big database's rows beyond the small one's.
    pub instr_rows: u64,
    /// `--instr-small`: S, the small database's rows.
    pub instr_small: u64,
    /// `--instr-runs`.
    pub instr_runs: u32,
    /// `--instr-files`: report on an earlier run's callgrind files instead of running.
    pub instr_files: Option<PathBuf>,
    /// The flags as given, for the report.
    pub command: String,
}

impl Args {
    /// Parses `args` (without the program name). `Ok(None)` means help was asked for.
    pub fn parse(args: &[String]) -> Res<Option<Args>> {
        let mut a = Args {
            runs: 3,
            workloads: matrix(),
            contenders: Contender::ALL.to_vec(),
            rates: vec![2000, 10_000],
            latency_secs: 30.0,
            startup: 7,
            startup_fill: 0,
            startup_topics: 0,
            outage_for: std::time::Duration::ZERO,
            pg_outage_for: std::time::Duration::ZERO,
            compression: ferry::config::KafkaConfig::default()
                .compression
                .as_str()
                .to_owned(),
            out: None,
            smoke: false,
            pinned: false,
            keep_broker: false,
            stall_broker: false,
            instructions: None,
            instr_rows: 20_000,
            instr_small: 1_000,
            instr_runs: 1,
            instr_files: None,
            command: std::iter::once("ferry-bench".to_string())
                .chain(args.iter().cloned())
                .collect::<Vec<_>>()
                .join(" "),
        };
        let (mut scale, mut full, mut it) = (None, true, args.iter());
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "-h" | "--help" => return Ok(None),
                "--smoke" => {
                    a.smoke = true;
                    a.runs = 1;
                    a.latency_secs = 2.0;
                    a.startup = 1;
                    scale.get_or_insert(0.01);
                    full = false;
                }
                "--runs" => a.runs = value()?.parse()?,
                "--pinned" => {
                    a.pinned = true;
                    full = false;
                }
                "--keep-broker" => {
                    a.keep_broker = true;
                    full = false;
                }
                "--stall-broker" => {
                    a.stall_broker = true;
                    full = false;
                }
                "--scale" => {
                    scale = Some(value()?.parse()?);
                    full = false;
                }
                "--latency-secs" => a.latency_secs = value()?.parse()?,
                "--compression" => {
                    let v = value()?;
                    v.parse::<ferry::config::Compression>()
                        .map_err(|e| format!("--compression: {e}"))?;
                    a.compression = v.clone();
                    full = false;
                }
                "--startup" => {
                    a.startup = value()?.parse()?;
                    full = false;
                }
                "--startup-fill" => {
                    a.startup_fill = value()?.parse()?;
                    full = false;
                }
                flag @ ("--outage-for" | "--pg-outage-for") => {
                    let v = value()?;
                    let secs = v
                        .parse()
                        .ok()
                        .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
                        .ok_or_else(|| {
                            format!("{flag} {v}: not a number of seconds (0 or more)")
                        })?;
                    if flag == "--outage-for" {
                        a.outage_for = secs;
                    } else {
                        a.pg_outage_for = secs;
                    }
                    full = false;
                }
                "--startup-topics" => {
                    a.startup_topics = value()?.parse()?;
                    full = false;
                }
                "--out" => a.out = Some(value()?.into()),
                "--workloads" => {
                    let v = value()?;
                    full = false;
                    a.workloads = workloads(v)?;
                }
                "--instructions" => {
                    a.instructions = Some(workloads(value()?)?);
                    full = false;
                }
                "--instr-rows" => a.instr_rows = value()?.parse()?,
                "--instr-small" => a.instr_small = value()?.parse()?,
                "--instr-runs" => a.instr_runs = value()?.parse()?,
                "--instr-files" => a.instr_files = Some(value()?.into()),
                "--contenders" => {
                    let v = value()?;
                    full = false;
                    a.contenders = list(v)
                        .map(|n| {
                            Contender::ALL
                                .into_iter()
                                .find(|c| c.key() == n)
                                .ok_or_else(|| format!("unknown contender {n:?}\n\n{USAGE}"))
                        })
                        .collect::<Result<_, _>>()?;
                }
                "--rates" => {
                    let v = value()?;
                    full = false;
                    a.rates = list(v).map(str::parse).collect::<Result<_, _>>()?;
                }
                other => return Err(format!("unknown flag {other}\n\n{USAGE}").into()),
            }
        }
        if a.instr_runs == 0 || a.instr_rows == 0 {
            return Err("--instr-runs and --instr-rows must be at least 1".into());
        }
        if a.runs == 0 {
            return Err("--runs must be at least 1".into());
        }
        if let Some(s) = scale {
            a.workloads = a.workloads.iter().map(|w| w.scaled(s)).collect();
        }
        for (flag, d) in [
            ("--outage-for", a.outage_for),
            ("--pg-outage-for", a.pg_outage_for),
        ] {
            if !d.is_zero() && a.startup == 0 {
                return Err(format!(
                    "{flag} runs as many outages as --startup runs: --startup 0 runs none"
                )
                .into());
            }
        }
        if !a.pg_outage_for.is_zero() && a.pinned {
            return Err(
                "--pg-outage-for restarts PostgreSQL, and the restarted server would not be \
                 pinned (--pinned): leave one of them out"
                    .into(),
            );
        }
        if a.out.is_none() && full {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            a.out = dir.is_dir().then_some(dir);
        }
        Ok(Some(a))
    }
}

/// Workloads by name.
fn workloads(v: &str) -> Res<Vec<Workload>> {
    Ok(list(v)
        .map(|n| {
            matrix()
                .into_iter()
                .chain(extras())
                .find(|w| w.name == n)
                .ok_or_else(|| format!("unknown workload {n:?}\n\n{USAGE}"))
        })
        .collect::<Result<_, _>>()?)
}

/// "a,b" → ["a", "b"]; "none" → [].
fn list(v: &str) -> impl Iterator<Item = &str> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "none")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Args {
        let v: Vec<String> = s.split_whitespace().map(String::from).collect();
        Args::parse(&v).unwrap().unwrap()
    }

    #[test]
    fn no_flags_is_the_full_matrix_written_to_the_source_tree() {
        let a = parse("");
        assert_eq!(a.runs, 3);
        assert_eq!(a.workloads.len(), matrix().len());
        assert_eq!(a.contenders, Contender::ALL.to_vec());
        assert_eq!(a.rates, vec![2000, 10_000]);
        assert_eq!(a.startup, 7);
        assert!(a.out.is_some());
    }

    #[test]
    fn smoke_is_tiny_and_writes_nothing() {
        let a = parse("--smoke");
        assert_eq!(a.runs, 1);
        assert_eq!(a.workloads[0].rows, 2000);
        assert!(a.out.is_none());
        assert!(a.latency_secs <= 2.0);
        assert_eq!(a.contenders.len(), Contender::ALL.len());
    }

    #[test]
    fn a_workload_outside_the_matrix_runs_when_named() {
        let a = parse("--workloads backlog-256k,backlog-1k");
        let names: Vec<_> = a.workloads.iter().map(|w| w.name).collect();
        assert_eq!(names, ["backlog-256k", "backlog-1k"]);
        assert!(parse("--runs 1")
            .workloads
            .iter()
            .all(|w| w.name != "backlog-256k"));
    }

    #[test]
    fn selections_narrow_the_matrix() {
        let a = parse(
            "--workloads backlog-1k,one-1m-txn --contenders ferry,recv --rates none --runs 5",
        );
        assert_eq!(a.workloads.len(), 2);
        assert_eq!(a.contenders, vec![Contender::Ferry, Contender::Recv]);
        assert!(a.rates.is_empty());
        assert_eq!(a.runs, 5);
        assert!(a.out.is_none());
        let a = parse("--workloads none --rates none --startup 9");
        assert_eq!((a.startup, a.workloads.len(), a.startup_fill), (9, 0, 0));
        assert!(a.outage_for.is_zero());
        let a = parse("--workloads none --rates none --startup 3 --outage-for 8");
        assert_eq!(a.outage_for, std::time::Duration::from_secs(8));
        assert!(a.pg_outage_for.is_zero());
        assert!(a.out.is_none(), "not the full matrix");
        let a = parse("--workloads none --rates none --startup 3 --pg-outage-for 2.5");
        assert_eq!(a.pg_outage_for, std::time::Duration::from_millis(2_500));
        assert!(a.outage_for.is_zero());
        assert!(a.out.is_none(), "not the full matrix");
        for bad in [
            "--startup 3 --outage-for -1",
            "--startup 3 --outage-for soon",
            "--startup 0 --outage-for 8",
            "--startup 3 --pg-outage-for -1",
            "--startup 0 --pg-outage-for 8",
            "--startup 3 --pg-outage-for 8 --pinned",
        ] {
            let args: Vec<String> = bad.split_whitespace().map(String::from).collect();
            assert!(Args::parse(&args).is_err(), "{bad}");
        }
        let a = parse("--workloads none --rates none --startup 3 --startup-fill 18000");
        assert_eq!((a.startup, a.startup_fill), (3, 18_000));
        let a = parse("--workloads none --rates none --startup-topics 5000");
        assert_eq!((a.startup, a.startup_topics), (7, 5_000));
        assert!(a.out.is_none());
        let v: Vec<String> = vec!["--workloads".into(), "nope".into()];
        assert!(Args::parse(&v).is_err());
        assert!(Args::parse(&["--help".to_string()]).unwrap().is_none());
        assert!(Args::parse(&["--runs".to_string()]).is_err());
    }

    #[test]
    fn instructions_take_their_own_flags() {
        let a = parse("--instructions backlog-1k,bytea-1k --instr-runs 3 --instr-rows 500");
        let names: Vec<_> = a.instructions.unwrap().iter().map(|w| w.name).collect();
        assert_eq!(names, ["backlog-1k", "bytea-1k"]);
        assert_eq!((a.instr_runs, a.instr_rows, a.instr_small), (3, 500, 1000));
        assert!(a.out.is_none());
        assert!(parse("").instructions.is_none());
    }
}
