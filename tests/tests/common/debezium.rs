//! Debezium beside Ferry in end-to-end tests: the connector JSON a user would POST for a test
//! world, and what `ferry config from-debezium` makes of it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ferry_testkit::debezium;
use ferry_testkit::pg::{self, TestDb};

use super::binary;

/// Debezium 3's context headers (`extended.headers.enabled`, on by default): connector name,
/// logical name, task id and run id. Ferry does not send them (README: a known difference).
pub const CONTEXT_HEADER_PREFIX: &str = "__debezium.context.";

/// `headers` without Debezium's context headers.
pub fn without_context_headers(
    headers: &[(String, Option<Vec<u8>>)],
) -> Vec<(String, Option<Vec<u8>>)> {
    headers
        .iter()
        .filter(|(n, _)| !n.starts_with(CONTEXT_HEADER_PREFIX))
        .cloned()
        .collect()
}

/// An outbox connector's configuration for `db` (the superuser, its password included, as a
/// user's JSON holds it): `slot` of `publication`, table `public.outbox`, no snapshot.
pub fn connector(db: &TestDb, slot: &str, publication: &str) -> BTreeMap<String, String> {
    let (host, port) = host_port(&db.url);
    let mut c = debezium::outbox_connector(
        (&host, port, &db.name, "postgres"),
        slot,
        publication,
        "public.outbox",
    );
    c.insert("database.password".into(), pg::SUPERUSER_PASSWORD.into());
    c
}

/// The host and port of a test database URL (`postgres://u:p@host:port/db?...`).
pub fn host_port(url: &str) -> (String, u16) {
    let rest = url.split_once('@').map(|(_, r)| r).unwrap_or(url);
    let hp = rest.split('/').next().unwrap_or(rest);
    let (h, p) = hp.rsplit_once(':').expect("host:port in the test URL");
    (h.to_string(), p.parse().expect("port"))
}

/// Writes `connector.json` (`{"name", "config"}`) and `worker.properties` (`bootstrap.servers`
/// plus `worker`) into `dir` and runs `ferry config from-debezium` on them as a user would.
/// Returns the `ferry.toml` path and what the command printed on standard error (its
/// "not translated" notes). Panics when it fails.
pub fn translate(
    dir: &Path,
    name: &str,
    config: &BTreeMap<String, String>,
    worker: &[(&str, &str)],
    brokers: &str,
) -> (PathBuf, String) {
    std::fs::create_dir_all(dir).expect("create dir");
    let json = serde_json::json!({ "name": name, "config": config });
    std::fs::write(dir.join("connector.json"), json.to_string()).expect("write connector.json");
    let mut props = format!("bootstrap.servers={brokers}\n");
    for (k, v) in worker {
        writeln!(props, "{k}={v}").expect("format");
    }
    std::fs::write(dir.join("worker.properties"), props).expect("write worker.properties");
    let toml = dir.join("ferry.toml");
    let out = std::process::Command::new(binary())
        .args(["config", "from-debezium"])
        .arg(dir.join("connector.json"))
        .arg("--worker")
        .arg(dir.join("worker.properties"))
        .arg("--output")
        .arg(&toml)
        .output()
        .expect("run ferry config from-debezium");
    let notes = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "from-debezium failed: {notes}");
    (toml, notes)
}
