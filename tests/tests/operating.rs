//! The process's edges, end to end with the real binary: a log sink that goes away does not stop
//! the relay, subcommands whose standard output is closed exit without a panic, and
//! `ferry status --json` gives scripts stable fields.

mod common;

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
        let mut cmd = Ferry::spawn_with(&w, args, |cmd| {
            cmd.stdout(Stdio::piped());
        });
        drop(cmd.child_mut().and_then(|c| c.stdout.take()));
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
