//! The configuration as the real binary sees it: `ferry config show` prints TOML that loads
//! again, the variables Kubernetes injects for a Service named `ferry` are not refused, a
//! misspelt variable is, and every problem is listed at once.

#[allow(unused_imports)]
mod common;

use std::process::{Command, Output};

use common::binary;

fn ferry(args: &[&str], vars: &[(&str, &str)]) -> Output {
    Command::new(binary())
        .args(args)
        .env_clear()
        .envs(vars.iter().copied())
        .output()
        .expect("run ferry")
}

const BASE: &[(&str, &str)] = &[
    (
        "FERRY_POSTGRES_URL",
        "postgres://ferry@db.example.com/app?sslmode=verify-full",
    ),
    ("FERRY_KAFKA_BROKERS", "k1:9092,k2:9092"),
    ("FERRY_KAFKA_MAX_IN_FLIGHT_BYTES", "64MiB"),
    ("FERRY_KAFKA_PROPERTIES_SASL_PASSWORD", "k-SECRET"),
    // What kubelet injects into a pod for a Service `ferry` with port 9187 named `http`.
    ("FERRY_SERVICE_HOST", "10.96.12.7"),
    ("FERRY_SERVICE_PORT", "9187"),
    ("FERRY_SERVICE_PORT_HTTP", "9187"),
    ("FERRY_PORT", "tcp://10.96.12.7:9187"),
    ("FERRY_PORT_9187_TCP", "tcp://10.96.12.7:9187"),
    ("FERRY_PORT_9187_TCP_PROTO", "tcp"),
    ("FERRY_PORT_9187_TCP_PORT", "9187"),
    ("FERRY_PORT_9187_TCP_ADDR", "10.96.12.7"),
    ("FERRY_BIN", "/usr/local/bin/ferry"),
];

#[test]
fn config_show_prints_toml_that_loads_again_in_a_kubernetes_pod() {
    let out = ferry(&["config", "show"], BASE);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stdout.contains("k-SECRET"), "{stdout}");
    assert!(
        stdout.contains("\"sasl.password\" = \"<redacted>\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("max_in_flight_bytes = \"64MiB\""),
        "{stdout}"
    );
    // What it printed, with the secret put back, is the same configuration.
    let shown = stdout.replace("<redacted>", "k-SECRET");
    let env = |vars: &[(&str, &str)]| -> Vec<(String, String)> {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let from_env = ferry::config::load(None, env(BASE)).unwrap();
    let from_shown = ferry::config::load(Some(&shown), []).unwrap();
    assert_eq!(from_shown, from_env);
}

#[test]
fn every_problem_is_listed_at_once_with_the_nearest_variable() {
    let mut vars = BASE.to_vec();
    vars.retain(|(k, _)| *k != "FERRY_KAFKA_BROKERS");
    vars.push(("FERRY_KAFKA_BROKER", "k1:9092"));
    vars.push(("FERRY_POSTGRES_SLOT", "Bad Slot"));
    let out = ferry(&["run"], &vars);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for line in [
        "3 configuration problems:",
        "  FERRY_KAFKA_BROKER: unknown variable (did you mean FERRY_KAFKA_BROKERS?)",
        "  postgres.slot: invalid slot name \"Bad Slot\"",
        "  kafka.brokers: must not be empty",
    ] {
        assert!(stderr.contains(line), "{line:?} in\n{stderr}");
    }
}
