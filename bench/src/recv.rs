//! Contender 1, the physical read limit: `pg_recvlogical -P pgoutput` drains the backlog from
//! its own slot into `/dev/null` with the options Ferry starts replication with
//! (`proto_version 1`, the same publication, `messages true`, and `binary true` where Ferry
//! chooses binary mode: a bytea payload), stopping at the backlog's end.

use std::time::Instant;

use ferry_testkit::pg;
use ferry_wal::Lsn;

use crate::{procfs, Res, Sample, PUBLICATION};

/// `pg_recvlogical`'s arguments: drain `slot` to `end` into `/dev/null` with the options Ferry
/// starts replication with (the instruction counts run it with the same).
pub fn args(db_url: &str, slot: &str, end: Lsn, binary: bool) -> Vec<String> {
    let mut a: Vec<String> = [
        "-d",
        db_url,
        "--slot",
        slot,
        "--start",
        "--no-loop",
        "-P",
        "pgoutput",
        "-o",
        "proto_version=1",
        "-o",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push(format!("publication_names={PUBLICATION}"));
    a.extend(
        ["-o", "messages=true", "-f", "/dev/null", "-F", "0"]
            .iter()
            .map(|s| s.to_string()),
    );
    if binary {
        a.extend(["-o".to_string(), "binary=true".to_string()]);
    }
    a.extend(["-E".to_string(), end.to_string()]);
    a
}

pub async fn drain(db_url: &str, slot: &str, end: Lsn, binary: bool) -> Res<Sample> {
    let before = procfs::children_cpu_seconds();
    let start = Instant::now();
    let out = tokio::process::Command::new(pg::pg_bindir().join("pg_recvlogical"))
        .args(args(db_url, slot, end, binary))
        .kill_on_drop(true)
        .output()
        .await?;
    let secs = start.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(format!("pg_recvlogical: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(Sample {
        secs,
        cpu: Some(procfs::children_cpu_seconds() - before),
        ..Sample::default()
    })
}
