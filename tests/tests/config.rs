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
        // A bad value from a variable names the variable, then the key.
        "  FERRY_POSTGRES_SLOT: postgres.slot: invalid slot name \"Bad Slot\"",
        "  kafka.brokers: must not be empty",
    ] {
        assert!(stderr.contains(line), "{line:?} in\n{stderr}");
    }
}

#[test]
fn every_problem_of_the_file_is_listed_at_once_by_key_and_line() {
    // Issue 28: two unknown keys and three bad values gave one error per run, in serde's words.
    let file = std::env::temp_dir().join(format!("ferry-e2e-config-{}.toml", std::process::id()));
    std::fs::write(
        &file,
        "[postgres]\n\
         url = \"postgres://ferry@db.example.com/app\"\n\
         slott = \"ferry\"\n\
         \n\
         [kafka]\n\
         brokers = \"k1:9092\"\n\
         max_in_flight_records = -5\n\
         lingr = \"5ms\"\n\
         exactly_once = \"yes\"\n\
         \n\
         [shutdown]\n\
         drain_timeout = 30\n",
    )
    .unwrap();
    let out = ferry(&["check", "--config", file.to_str().unwrap()], &[]);
    std::fs::remove_file(&file).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let expected = "\
5 configuration problems:
  postgres.slott (line 3): unknown key `slott`; did you mean `slot`?
  kafka.max_in_flight_records (line 7): must be a whole number ≥ 0, got -5
  kafka.lingr (line 8): unknown key `lingr`; did you mean `linger`?
  kafka.exactly_once (line 9): must be true or false, got the string \"yes\"
  shutdown.drain_timeout (line 12): must be a duration string like";
    assert!(stderr.contains(expected), "{expected}\nin\n{stderr}");
}

/// `ferry status` (which needs PostgreSQL only) against the shared test server with `url` and
/// extra variables: (exit code, stdout, stderr).
fn status(url: &str, extra: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut vars = vec![
        ("FERRY_POSTGRES_URL", url),
        ("FERRY_KAFKA_BROKERS", "localhost:9092"),
        ("FERRY_POSTGRES_SLOT", "ferry_config_test_no_slot"),
    ];
    vars.extend_from_slice(extra);
    let out = ferry(&["status"], &vars);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Host, port and database name of a fresh database on the shared test server, over TCP.
async fn test_db() -> (ferry_testkit::pg::TestDb, String, u16) {
    let db = ferry_testkit::pg::shared().create_db().await;
    let cfg = ferry_wal::conn::ConnectConfig::parse(&db.url).unwrap();
    let ferry_wal::conn::config::Host::Tcp(host) = cfg.host.clone() else {
        panic!("the test server is reached over TCP: {cfg}")
    };
    (db, host, cfg.port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_errors_print_their_cause() {
    let (db, host, port) = test_db().await;
    let closed = ferry_testkit::process::free_port();
    let name = &db.name;
    let pw = ferry_testkit::pg::SUPERUSER_PASSWORD;
    // (URL, the line ferry prints)
    let cases = [
        (
            format!("postgres://postgres:{pw}@127.0.0.1:{closed}/{name}"),
            format!("ferry: cannot connect to PostgreSQL: the connection to 127.0.0.1:{closed} failed: Connection refused (os error 111)"),
        ),
        (
            format!("postgres://postgres:{pw}@nonexistent.invalid:{port}/{name}"),
            "ferry: cannot connect to PostgreSQL: cannot resolve the host name \"nonexistent.invalid\": ".to_owned(),
        ),
        (
            format!("postgres://postgres:not-it@{host}:{port}/{name}"),
            "ferry: cannot connect to PostgreSQL: authentication as \"postgres\" failed: FATAL: password authentication failed for user \"postgres\" (SQLSTATE 28P01)".to_owned(),
        ),
        (
            format!("postgres://postgres@{host}:{port}/{name}?target_session_attrs=read-write&connect_timeout=2&passfile=/nonexistent"),
            "ferry: cannot connect to PostgreSQL: authentication as \"postgres\" failed: the server asks for a password".to_owned(),
        ),
    ];
    for (url, says) in cases {
        let (code, _, stderr) = status(&url, &[]);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stderr.lines().any(|l| l.starts_with(&says)),
            "{says:?} not at the start of a line of:\n{stderr}"
        );
        assert!(
            !stderr.contains("not-it"),
            "the password never prints: {stderr}"
        );
    }
}

/// A file only its owner may read, in a directory of its own.
struct Secret(std::path::PathBuf);

impl Secret {
    fn new(contents: &str) -> Secret {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(ferry_testkit::pg::unique_name("ferry-secret"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, contents).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        Secret(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_comes_from_a_password_file_or_pgpass() {
    let (db, host, port) = test_db().await;
    let name = &db.name;
    let closed = ferry_testkit::process::free_port();
    let pw = ferry_testkit::pg::SUPERUSER_PASSWORD;
    // Two hosts, the first a closed port: the second serves.
    let url = format!(
        "postgres://postgres@{host}:{closed},{host}:{port}/{name}?target_session_attrs=read-write"
    );
    let connected = |(code, stdout, stderr): (Option<i32>, String, String)| {
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stdout.contains("slot \"ferry_config_test_no_slot\" does not exist"),
            "connected and looked for the slot:\n{stdout}\n{stderr}"
        );
    };
    let file = Secret::new(&format!("{pw}\n"));
    connected(status(
        &url,
        &[("FERRY_POSTGRES_PASSWORD_FILE", file.path())],
    ));
    let pgpass = Secret::new(&format!("{host}:{port}:{name}:postgres:{pw}\n"));
    connected(status(&url, &[("PGPASSFILE", pgpass.path())]));
    connected(status(&url, &[("PGPASSWORD", pw)]));
    // A password file that cannot be read stops before connecting, naming it.
    let (code, _, stderr) = status(&url, &[("FERRY_POSTGRES_PASSWORD_FILE", "/nonexistent/pw")]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "postgres.password_file: cannot read /nonexistent/pw: No such file or directory"
        ),
        "{stderr}"
    );
}
