//! What the benchmark reads about processes (`/proc`) and from Ferry's `/metrics`.

use std::error::Error;

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// Fields of `/proc/<pid>/stat` after the command name (field 3 is index 0).
fn stat_fields(path: &str) -> Res<Vec<u64>> {
    let s = std::fs::read_to_string(path)?;
    let rest = s.rsplit_once(')').ok_or("malformed stat")?.1;
    Ok(rest
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect())
}

/// User + system CPU seconds of a live process.
pub fn cpu_seconds(pid: u32) -> Res<f64> {
    let f = stat_fields(&format!("/proc/{pid}/stat"))?;
    // utime is field 14, stime 15 (1-based); index 0 here is field 4.
    Ok((f[10] + f[11]) as f64 / clock_ticks())
}

/// A process's time on a CPU and time spent runnable but waiting for one (`/proc/<pid>/schedstat`:
/// its main thread's `sum_exec_runtime` and `run_delay`), seconds; `None` without schedstats.
pub fn sched_seconds(pid: u32) -> Option<(f64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    let mut f = s.split_whitespace().map(|v| v.parse::<u64>().ok());
    let (run, wait) = (f.next()??, f.next()??);
    Some((run as f64 / 1e9, wait as f64 / 1e9))
}

/// User + system CPU seconds of this process (all threads).
pub fn self_cpu_seconds() -> f64 {
    stat_fields("/proc/self/stat")
        .map(|f| (f[10] + f[11]) as f64 / clock_ticks())
        .unwrap_or(0.0)
}

/// CPU seconds of this process's reaped children.
pub fn children_cpu_seconds() -> f64 {
    stat_fields("/proc/self/stat")
        .map(|f| (f[12] + f[13]) as f64 / clock_ticks())
        .unwrap_or(0.0)
}

/// Peak resident set size (VmHWM) of a live process, KiB.
pub fn peak_rss_kib(pid: u32) -> Res<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = s
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .ok_or("no VmHWM")?;
    Ok(line.split_whitespace().nth(1).ok_or("bad VmHWM")?.parse()?)
}

/// Bytes the TCP peers acknowledged on `pid`'s established connections to the broker(s) in
/// `brokers` (host:port list), from `ss -tinp`: what a producer put on the wire, after
/// compression, with Kafka's framing. `None` if `ss` is missing or shows no such socket.
pub fn tcp_bytes_acked(pid: u32, brokers: &str) -> Option<u64> {
    let ports: Vec<&str> = brokers
        .split(',')
        .filter_map(|b| b.rsplit_once(':').map(|(_, p)| p))
        .collect();
    let out = std::process::Command::new("ss")
        .args(["-tinpH", "state", "established"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let needle = format!("pid={pid},");
    let (mut total, mut found, mut ours) = (0u64, false, false);
    // Each socket is a line with the addresses and process, then a line of TCP info.
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) && !line.starts_with("\t") {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let peer_port = cols.get(3).and_then(|p| p.rsplit_once(':')).map(|(_, p)| p);
            ours = line.contains(&needle) && peer_port.is_some_and(|p| ports.contains(&p));
            continue;
        }
        if ours {
            if let Some(v) = line
                .split_whitespace()
                .find_map(|f| f.strip_prefix("bytes_acked:"))
                .and_then(|v| v.parse::<u64>().ok())
            {
                total += v;
                found = true;
            }
        }
    }
    found.then_some(total)
}

/// The text of Ferry's `/metrics` on `port`.
pub async fn fetch_metrics(port: u16) -> Res<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await?;
    let mut body = String::new();
    s.read_to_string(&mut body).await?;
    Ok(body)
}

/// The value of an unlabelled metric `name` in a `/metrics` text.
pub fn scalar(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Cumulative histogram buckets `(le, count)` of `name` from Ferry's `/metrics`.
pub async fn histogram(port: u16, name: &str) -> Res<Vec<(f64, u64)>> {
    buckets(&fetch_metrics(port).await?, name)
}

/// Cumulative histogram buckets `(le, count)` of `name` in a `/metrics` text.
pub fn buckets(body: &str, name: &str) -> Res<Vec<(f64, u64)>> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut out = Vec::new();
    for line in body.lines().filter_map(|l| l.strip_prefix(&prefix)) {
        let (le, rest) = line.split_once("\"}").ok_or("bad bucket line")?;
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse()?
        };
        out.push((le, rest.trim().parse()?));
    }
    if out.is_empty() {
        return Err(format!("no {name} histogram in /metrics").into());
    }
    Ok(out)
}

/// `after - before`, bucket by bucket.
pub fn diff(after: &[(f64, u64)], before: &[(f64, u64)]) -> Vec<(f64, u64)> {
    after
        .iter()
        .zip(before)
        .map(|(a, b)| (a.0, a.1 - b.1))
        .collect()
}

/// The `q` quantile, linearly interpolated within its bucket (Prometheus' histogram_quantile).
pub fn quantile(h: &[(f64, u64)], q: f64) -> f64 {
    let total = h.last().map(|b| b.1).unwrap_or(0);
    if total == 0 {
        return f64::NAN;
    }
    let rank = q * total as f64;
    let mut prev = (0.0, 0u64);
    for &(le, c) in h {
        if c as f64 >= rank {
            if le.is_infinite() {
                return prev.0;
            }
            let inside = (c - prev.1) as f64;
            let frac = if inside == 0.0 {
                0.0
            } else {
                (rank - prev.1 as f64) / inside
            };
            return prev.0 + (le - prev.0) * frac;
        }
        prev = (le, c);
    }
    prev.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_text_is_read_by_name() {
        let body = "# HELP ferry_streaming x\nferry_streaming 1\nferry_streaming_total 7\n\
                    h_bucket{le=\"0.5\"} 3\nh_bucket{le=\"+Inf\"} 4\n";
        assert_eq!(scalar(body, "ferry_streaming"), Some(1.0));
        assert_eq!(scalar(body, "ferry_missing"), None);
        assert_eq!(
            buckets(body, "h").unwrap(),
            vec![(0.5, 3), (f64::INFINITY, 4)]
        );
        assert!(buckets(body, "nope").is_err());
        assert!(self_cpu_seconds() >= 0.0);
    }

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let h = [(0.001, 50), (0.005, 90), (0.01, 100), (f64::INFINITY, 100)];
        assert!((quantile(&h, 0.5) - 0.001).abs() < 1e-12);
        assert!((quantile(&h, 0.7) - 0.003).abs() < 1e-12);
        assert!((quantile(&h, 0.95) - 0.0075).abs() < 1e-12);
        assert!(quantile(&[(1.0, 0), (f64::INFINITY, 0)], 0.5).is_nan());
    }
}
