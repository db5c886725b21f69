//! Contender 1, the physical read limit: `pg_recvlogical -P pgoutput` drains the backlog from
//! its own slot into `/dev/null` with the options Ferry starts replication with
//! (`proto_version 1`, the same publication, `messages true`, and `binary true` where Ferry
//! chooses binary mode: a bytea payload), stopping at the backlog's end.

use std::time::Instant;

use ferry_testkit::pg;
use ferry_wal::Lsn;

use crate::{procfs, Res, Sample, PUBLICATION};

pub async fn drain(db_url: &str, slot: &str, end: Lsn, binary: bool) -> Res<Sample> {
    let before = procfs::children_cpu_seconds();
    let start = Instant::now();
    let out = tokio::process::Command::new(pg::pg_bindir().join("pg_recvlogical"))
        .args(["-d", db_url, "--slot", slot, "--start", "--no-loop"])
        .args(["-P", "pgoutput", "-o", "proto_version=1", "-o"])
        .arg(format!("publication_names={PUBLICATION}"))
        .args(["-o", "messages=true", "-f", "/dev/null", "-F", "0"])
        .args(if binary {
            &["-o", "binary=true"][..]
        } else {
            &[]
        })
        .args(["-E", &end.to_string()])
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
