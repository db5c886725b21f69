//! The standard `process_*` metrics, read from `/proc` at scrape time (Linux only).
//!
//! The names and meanings are the Prometheus client libraries' (client_golang's process
//! collector), so dashboards and alerts written for any exporter work on Ferry:
//!
//! | Name | Type | Source | Meaning |
//! |------|------|--------|---------|
//! | `process_resident_memory_bytes` | gauge | `VmRSS` of `/proc/self/status` | Resident set size. |
//! | `process_virtual_memory_bytes` | gauge | `VmSize` of `/proc/self/status` | Virtual memory size. |
//! | `process_cpu_seconds_total` | counter | `utime + stime` of `/proc/self/stat` | User and system CPU time. |
//! | `process_open_fds` | gauge | entries of `/proc/self/fd` | Open file descriptors. |
//! | `process_max_fds` | gauge | `Max open files` of `/proc/self/limits` | The soft limit (omitted when unlimited). |
//! | `process_start_time_seconds` | gauge | `btime` of `/proc/stat` + `starttime` | Start time, seconds since the Unix epoch. |
//!
//! Nothing is sampled in the background: a scrape reads five small files. A value that cannot be
//! read is left out of the output rather than reported as zero; on other systems the whole set is
//! left out. Clock ticks are `USER_HZ`, which Linux fixes at 100 for everything `/proc` reports
//! (the same assumption as the Prometheus `procfs` library), so no `sysconf` call is needed.
//! The parsers are pure functions over the files' text, tested on fixtures.

use std::fmt::{self, Write as _};

pub const RESIDENT_MEMORY_BYTES: &str = "process_resident_memory_bytes";
pub const VIRTUAL_MEMORY_BYTES: &str = "process_virtual_memory_bytes";
pub const CPU_SECONDS_TOTAL: &str = "process_cpu_seconds_total";
pub const OPEN_FDS: &str = "process_open_fds";
pub const MAX_FDS: &str = "process_max_fds";
pub const START_TIME_SECONDS: &str = "process_start_time_seconds";

/// Clock ticks per second in `/proc/<pid>/stat` (Linux's `USER_HZ`).
const USER_HZ: f64 = 100.0;

/// One reading of the process's resources; `None` where the source could not be read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessStats {
    pub resident_memory_bytes: Option<u64>,
    pub virtual_memory_bytes: Option<u64>,
    pub cpu_seconds: Option<f64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// Reads the current process's figures from `/proc` (all `None` off Linux).
    pub fn read() -> ProcessStats {
        if !cfg!(target_os = "linux") {
            return ProcessStats::default();
        }
        let file = |path: &str| std::fs::read_to_string(path).ok();
        let status = file("/proc/self/status");
        let stat = file("/proc/self/stat").and_then(|s| parse_stat(&s));
        let boot_time = file("/proc/stat").and_then(|s| parse_boot_time(&s));
        ProcessStats {
            resident_memory_bytes: status.as_deref().and_then(|s| status_kib(s, "VmRSS")),
            virtual_memory_bytes: status.as_deref().and_then(|s| status_kib(s, "VmSize")),
            cpu_seconds: stat.map(|s| s.cpu_ticks as f64 / USER_HZ),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as u64),
            max_fds: file("/proc/self/limits").and_then(|s| parse_max_open_files(&s)),
            start_time_seconds: stat
                .zip(boot_time)
                .map(|(s, boot)| boot as f64 + s.start_ticks as f64 / USER_HZ),
        }
    }

    /// Appends the families that have a value, in the Prometheus text format 0.0.4.
    pub fn render(&self, out: &mut String) {
        // Writing to a String cannot fail.
        let _ = self.write(out);
    }

    fn write(&self, out: &mut String) -> fmt::Result {
        let families: [(&str, &str, &str, Option<f64>); 6] = [
            (
                RESIDENT_MEMORY_BYTES,
                "gauge",
                "Resident memory size in bytes.",
                self.resident_memory_bytes.map(|v| v as f64),
            ),
            (
                VIRTUAL_MEMORY_BYTES,
                "gauge",
                "Virtual memory size in bytes.",
                self.virtual_memory_bytes.map(|v| v as f64),
            ),
            (
                CPU_SECONDS_TOTAL,
                "counter",
                "Total user and system CPU time spent in seconds.",
                self.cpu_seconds,
            ),
            (
                OPEN_FDS,
                "gauge",
                "Number of open file descriptors.",
                self.open_fds.map(|v| v as f64),
            ),
            (
                MAX_FDS,
                "gauge",
                "Maximum number of open file descriptors.",
                self.max_fds.map(|v| v as f64),
            ),
            (
                START_TIME_SECONDS,
                "gauge",
                "Start time of the process since unix epoch in seconds.",
                self.start_time_seconds,
            ),
        ];
        for (name, kind, help, value) in families {
            if let Some(v) = value {
                writeln!(out, "# HELP {name} {help}")?;
                writeln!(out, "# TYPE {name} {kind}")?;
                writeln!(out, "{name} {v}")?;
            }
        }
        Ok(())
    }
}

/// What Ferry uses of `/proc/self/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// `utime + stime`, in clock ticks.
    pub cpu_ticks: u64,
    /// `starttime`: ticks after boot at which the process started.
    pub start_ticks: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may itself contain
/// spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let after = &text[text.rfind(')')? + 1..];
    // Fields from 3 (state) on; proc(5) numbers them from 1.
    let fields: Vec<&str> = after.split_ascii_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: field(14)?.checked_add(field(15)?)?,
        start_ticks: field(22)?,
    })
}

/// A `kB` line of `/proc/<pid>/status` (`VmRSS:   1234 kB`), in bytes.
pub fn status_kib(text: &str, key: &str) -> Option<u64> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// `btime` of `/proc/stat`: boot time, seconds since the epoch.
pub fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// The soft limit of `Max open files` in `/proc/<pid>/limits`; `None` when unlimited.
pub fn parse_max_open_files(text: &str) -> Option<u64> {
    let rest = text
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?;
    rest.split_ascii_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    // proc(5) layouts, from a real system; the command name has a space and a parenthesis.
    const STAT: &str = "4242 (ferry (x) y) S 1 4242 4242 0 -1 4194560 2719 0 0 0 123 45 0 0 20 0 \
                        9 0 987654 123456789 4321 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 \
                        0 17 1 0 0 0 0 0\n";
    const STATUS: &str = "Name:\tferry\nVmPeak:\t  130000 kB\nVmSize:\t  120000 kB\n\
                          VmRSS:\t   17284 kB\nThreads:\t9\n";
    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units     \n\
                          Max cpu time              unlimited            unlimited            seconds   \n\
                          Max open files            1024                 1048576              files     \n";

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        assert_eq!(
            parse_stat(STAT),
            Some(Stat {
                cpu_ticks: 168,
                start_ticks: 987_654
            })
        );
        assert_eq!(parse_stat("4242 (ferry) S 1 2"), None, "truncated");
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn status_limits_and_boot_time_parse() {
        assert_eq!(status_kib(STATUS, "VmRSS"), Some(17_284 * 1024));
        assert_eq!(status_kib(STATUS, "VmSize"), Some(120_000 * 1024));
        assert_eq!(status_kib(STATUS, "VmSwap"), None);
        assert_eq!(parse_max_open_files(LIMITS), Some(1024));
        assert_eq!(
            parse_max_open_files(&LIMITS.replace("1024 ", "unlimited ")),
            None
        );
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1763900000\nprocesses 5\n"),
            Some(1_763_900_000)
        );
    }

    #[test]
    fn only_known_values_are_rendered() {
        let stats = ProcessStats {
            resident_memory_bytes: Some(17_698_816),
            cpu_seconds: Some(1.68),
            ..ProcessStats::default()
        };
        let mut out = String::new();
        stats.render(&mut out);
        assert_eq!(
            out,
            "# HELP process_resident_memory_bytes Resident memory size in bytes.\n\
             # TYPE process_resident_memory_bytes gauge\n\
             process_resident_memory_bytes 17698816\n\
             # HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n\
             # TYPE process_cpu_seconds_total counter\n\
             process_cpu_seconds_total 1.68\n"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_plausibly() {
        let before = ProcessStats::read();
        let files: Vec<std::fs::File> = (0..16)
            .map(|_| std::fs::File::open("/proc/self/status").unwrap())
            .collect();
        let after = ProcessStats::read();
        drop(files);

        let rss = after.resident_memory_bytes.unwrap();
        assert!(rss > 1 << 20, "{rss}");
        assert!(after.virtual_memory_bytes.unwrap() >= rss);
        // Other tests run in parallel threads and may open or close files meanwhile.
        assert!(after.open_fds.unwrap() >= before.open_fds.unwrap() + 8);
        assert!(after.max_fds.is_none_or(|m| m >= after.open_fds.unwrap()));
        assert!(after.cpu_seconds.unwrap() >= before.cpu_seconds.unwrap());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = after.start_time_seconds.unwrap();
        assert!(
            started <= now + 1.0 && started > now - 3600.0,
            "{started} vs {now}"
        );
    }
}
