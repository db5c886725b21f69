//! The machine and versions reported with the numbers.

use std::process::Command;

/// What the numbers were measured on.
#[derive(Debug, Clone, Default)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub os: String,
    pub date: String,
    pub postgres: String,
    pub broker: String,
    pub librdkafka: String,
    pub ferry: String,
    pub commit: String,
    /// Debezium, Kafka Connect, the JVM and its options, when the `debezium` contender ran.
    pub debezium: String,
    /// 1-minute load averages seen during the run (start, between workloads, end).
    pub loads: Vec<f64>,
    /// `--pinned`: PostgreSQL on CPU 0, everything else on CPU 1.
    pub pinned: bool,
}

impl Machine {
    pub fn probe() -> Machine {
        let cpuinfo = read("/proc/cpuinfo");
        let meminfo = read("/proc/meminfo");
        let mem_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        Machine {
            cpu: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
                .unwrap_or_else(|| "unknown CPU".into()),
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
            memory_gib: mem_kib / 1024.0 / 1024.0,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            os: read("/etc/os-release")
                .lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
                .unwrap_or_default(),
            date: output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            librdkafka: rdkafka::util::get_rdkafka_version().1,
            commit: commit(),
            loads: vec![load_average()],
            pinned: false,
            ..Machine::default()
        }
    }

    /// "1 core … 24 GiB" line for headers.
    pub fn summary(&self) -> String {
        format!(
            "{} × {}, {:.0} GiB RAM, Linux {}{}{}",
            self.cores,
            self.cpu,
            self.memory_gib,
            self.kernel,
            if self.os.is_empty() {
                String::new()
            } else {
                format!(" ({})", self.os)
            },
            if self.pinned {
                "; pinned: PostgreSQL on CPU 0, the rest on CPU 1"
            } else {
                "; shared: every process on every CPU"
            }
        )
    }
}

/// The commit the sources are at, marked when Ferry's own sources have uncommitted changes.
fn commit() -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let head = output("git", &["-C", root, "rev-parse", "--short", "HEAD"]);
    let dirty = Command::new("git")
        .args(["-C", root, "status", "--porcelain", "--", "crates"])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    match (head.is_empty(), dirty) {
        (true, _) => "unknown".into(),
        (false, true) => format!("{head} + uncommitted changes under crates/"),
        (false, false) => head,
    }
}

/// The 1-minute load average.
pub fn load_average() -> f64 {
    read("/proc/loadavg")
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// A command's first output line, or "" if it cannot run.
pub fn output(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| first_line(&o.stdout))
        .unwrap_or_default()
}

/// The first line of a command's output, trimmed.
fn first_line(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

/// The page cache's dirty and writeback bytes, in KiB (`Dirty` + `Writeback` of
/// `/proc/meminfo`).
pub fn unwritten_kib() -> u64 {
    read("/proc/meminfo")
        .lines()
        .filter(|l| l.starts_with("Dirty:") || l.starts_with("Writeback:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Writes every dirty page of the page cache back to disk (`sync(2)`), and says how many KiB
/// there were and how long it took. A broker's log written just before a latency run is
/// otherwise written back by the kernel during it, beside PostgreSQL's WAL flushes.
pub fn write_back() -> (u64, std::time::Duration) {
    let kib = unwritten_kib();
    let t = std::time::Instant::now();
    let _ = Command::new("sync").status();
    (kib, t.elapsed())
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The first line `java -version` prints (to stderr), e.g. `openjdk version "17.0.15"`.
pub fn java_version() -> String {
    Command::new(ferry_testkit::kafka::java())
        .arg("-version")
        .output()
        .ok()
        .map(|o| first_line(&o.stderr))
        .unwrap_or_default()
}
