//! The process's edges, end to end with the real binary: a log sink that goes away does not stop
//! the relay, subcommands whose standard output is closed exit without a panic, and
//! `ferry status --json` gives scripts stable fields, and zstd-compressed records reach the broker.

mod common;

use std::io::Read;
use std::process::Stdio;
use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stderr_neither_stops_the_relay_nor_the_shutdown() {
    let w = World::new().await;
    let topic = w.create_topic("order", 1).await;
    // stderr is a pipe whose only reader is dropped before Ferry writes its first line: every log
    // write fails with EPIPE, from "starting" on.
    let mut ferry = Ferry::spawn_with(&w, &["run"], |cmd| {
        cmd.stderr(Stdio::piped());
    });
    drop(ferry.child_mut().and_then(|c| c.stderr.take()));
    ferry.wait_ready().await;
    for i in 0..5 {
        w.insert("order", &format!("a-{i}"), "Created", "{}").await;
    }
    let records = w.consume(&topic, 5).await;
    assert_eq!(records.len(), 5);
    let dropped = ferry
        .metric("ferry_log_write_errors_total")
        .await
        .expect("metrics served");
    assert!(
        dropped >= 1.0,
        "the dropped log lines are counted: {dropped}"
    );
    let status = ferry.terminate().await;
    assert!(
        status.success(),
        "SIGTERM with a closed stderr exits 0: {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subcommands_with_a_closed_stdout_exit_quietly_without_a_panic() {
    let w = World::new().await;
    // The slot must exist for `status` to print rather than fail.
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    assert!(ferry.terminate().await.success());

    for args in [&["check"][..], &["status"], &["config", "show"]] {
        // The reading end is closed before the child starts, so its first write meets EPIPE
        // however fast it writes (closing it after the spawn raced `config show`, which
        // writes before it touches the network).
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let mut cmd = Ferry::spawn_with(&w, args, |cmd| {
            cmd.stdout(writer);
        });
        let status = cmd.wait_exit(Duration::from_secs(60)).await;
        let log = cmd.log_text();
        assert!(!log.contains("panicked"), "{args:?} panicked:\n{log}");
        assert_eq!(
            status.code(),
            Some(141),
            "{args:?} exits 141 (128 + SIGPIPE) when nobody reads its output:\n{log}"
        );
    }
}

/// Runs `ferry status --json` for `w`: (exit code, the parsed object).
async fn status_json(w: &World) -> (Option<i32>, serde_json::Value) {
    let mut status = Ferry::spawn_with(w, &["status", "--json"], |cmd| {
        cmd.stdout(Stdio::piped());
    });
    let mut stdout = status
        .child_mut()
        .and_then(|c| c.stdout.take())
        .expect("piped stdout");
    let code = status.wait_exit(Duration::from_secs(60)).await.code();
    let mut text = String::new();
    stdout
        .read_to_string(&mut text)
        .expect("read status output");
    let value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}; log:\n{}", status.log_text()));
    (code, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_gives_scripts_stable_fields() {
    let w = World::new().await;
    let (code, missing) = status_json(&w).await;
    assert_eq!(code, Some(1), "no slot yet: {missing}");
    assert_eq!(missing["exists"], false);
    assert_eq!(missing["slot"], w.slot.as_str());
    assert!(missing["confirmed_flush_lsn"].is_null());

    let topic = w.create_topic("order", 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.insert("order", "a-1", "Created", "{}").await;
    w.consume(&topic, 1).await;

    let (code, s) = status_json(&w).await;
    assert_eq!(code, Some(0), "{s}");
    assert_eq!(s["exists"], true);
    assert_eq!(s["active"], true, "ferry streams the slot");
    assert!(s["active_pid"].as_i64().is_some_and(|p| p > 0), "{s}");
    let lsn = |key: &str| -> ferry_wal::Lsn {
        s[key]
            .as_str()
            .unwrap_or_else(|| panic!("{key}: {s}"))
            .parse()
            .unwrap()
    };
    let (server, confirmed, restart) = (
        lsn("server_wal_lsn"),
        lsn("confirmed_flush_lsn"),
        lsn("restart_lsn"),
    );
    assert!(confirmed <= server && restart <= server, "{s}");
    assert_eq!(
        s["lag_bytes"].as_u64(),
        Some(server.saturating_sub(confirmed))
    );
    assert_eq!(
        s["retained_wal_bytes"].as_u64(),
        Some(server.saturating_sub(restart))
    );
    assert!(s["wal_status"].is_string(), "{s}");
    assert_eq!(s["invalidated"], false);
    // The slot is never confirmed past the remembered position, and there is no gap.
    assert!(lsn("progress_lsn") >= confirmed, "{s}");
    assert!(
        s["gap"].is_null() && s["gap_bytes"].is_null() && s["replay_since"].is_null(),
        "{s}"
    );
    assert!(
        s["progress_written_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{s}"
    );
    assert!(
        missing["progress_lsn"].is_null() && missing["gap"].is_null(),
        "{missing}"
    );
    let mut fields: Vec<&str> = s.as_object().unwrap().keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "active",
            "active_pid",
            "confirmed_flush_lsn",
            "exists",
            "gap",
            "gap_bytes",
            "invalidated",
            "lag_bytes",
            "progress_lsn",
            "progress_written_at",
            "replay_since",
            "restart_lsn",
            "retained_wal_bytes",
            "server_wal_lsn",
            "slot",
            "wal_status"
        ],
        "the documented field set"
    );
    assert!(ferry.terminate().await.success());
}

/// PostgreSQL unreachable: `status --json` still prints one JSON object, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_says_why_when_postgres_cannot_be_asked() {
    let mut w = World::new().await;
    let closed = ferry_testkit::process::free_port();
    w.env.push((
        "FERRY_POSTGRES_URL".into(),
        format!("postgres://postgres:postgres@127.0.0.1:{closed}/postgres"),
    ));
    let (code, v) = status_json(&w).await;
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(v["slot"], w.slot.as_str());
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot connect to PostgreSQL")),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_compressed_with_zstd_are_delivered() {
    let mut w = World::new().await;
    w.env
        .push(("FERRY_KAFKA_COMPRESSION".into(), "zstd".into()));
    let topic = w.create_topic("order", 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    // Compressible payloads, several per batch.
    for i in 0..20 {
        let payload = format!("{{\"n\": {i}, \"text\": \"{}\"}}", "abc".repeat(200));
        w.insert("order", &format!("a-{}", i % 3), "Created", &payload)
            .await;
    }
    let records = w.consume(&topic, 20).await;
    assert_eq!(records.len(), 20);
    let value = String::from_utf8(records[0].value.clone().unwrap()).unwrap();
    assert!(value.contains(&"abc".repeat(200)), "{value}");
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

/// SIGTERM while the first session is still setting up (here: a PostgreSQL that accepts the
/// connection and never answers) stops Ferry at once and gracefully: exit 0, not death by the
/// signal's default action (the handler used to be installed at the shutdown future's first
/// poll, after the set-up), and not after the connect timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_start_up_stops_at_once_and_exits_zero() {
    // Accepts (the kernel completes the handshake into the backlog) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let mut w = World::new().await;
    w.env.extend([
        (
            "FERRY_POSTGRES_URL".to_string(),
            format!("postgres://ferry:secret@127.0.0.1:{port}/app?sslmode=disable"),
        ),
        ("FERRY_POSTGRES_CONNECT_TIMEOUT".into(), "600s".into()),
    ]);
    let mut ferry = w.start_ferry();
    ferry.wait_log("starting", Duration::from_secs(30)).await;
    ferry.send_signal(libc::SIGTERM);
    // Far below the 600 s connect timeout: the stop did not wait for it.
    let status = ferry.wait_exit(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0), "{status}:\n{}", ferry.log_text());
    let text = ferry.log_text();
    assert!(text.contains("SIGTERM received"), "{text}");
    assert!(text.contains("stopped before streaming began"), "{text}");
    drop(silent);
}
