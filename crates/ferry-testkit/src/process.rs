//! Child processes that cannot outlive the test process.
//!
//! Every server a test starts (postgres, a broker, the ferry binary) is spawned with
//! `PR_SET_PDEATHSIG`, so a test binary that panics, is killed, or simply exits takes its
//! servers with it. The kernel ties that signal to the *thread* that forked the child, so all
//! spawns go through one long-lived spawner thread: a test thread or a tokio worker that ends
//! would otherwise kill the servers it started.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("ferry-testkit-spawner".into())
            .spawn(move || {
                // Lives as long as the process: the parent-death signal of every child is tied to it.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawn the testkit spawner thread");
        Mutex::new(tx)
    })
}

/// Spawns `cmd` so that it receives `signal` when the test process dies.
pub fn spawn_owned(mut cmd: Command, signal: libc::c_int) -> io::Result<Child> {
    // SAFETY: prctl and pthread_sigmask are async-signal-safe and touch no memory of the
    // parent; this is the documented way to tie a child's lifetime to its parent on Linux.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // A server starts with no signal blocked, whatever its parent blocks (a harness
            // that waits for SIGTERM with sigwait blocks it in every thread, and a blocked
            // mask survives exec): the server's own SIGTERM handling must see the signal.
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, tx))
        .map_err(|_| io::Error::other("testkit spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("testkit spawner thread is gone"))?
}

/// Sends `signal` to a child (no-op if it already exited).
pub fn signal(child: &Child, signal: libc::c_int) {
    signal_pid(child.id(), signal);
}

/// Sends SIGTERM to `child` and waits for it to exit, at most `deadline`; past it, kills it
/// with SIGKILL and reaps it. Returns whether it exited by itself (a SIGTERM it ignores, or a
/// shutdown that hangs, ends in SIGKILL: what a crash would do).
pub fn terminate_within(child: &mut Child, deadline: Duration) -> bool {
    signal(child, libc::SIGTERM);
    let start = Instant::now();
    while matches!(child.try_wait(), Ok(None)) {
        if start.elapsed() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.wait();
    true
}

/// Sends `signal` to process `pid`, one this process started (no-op if it already exited).
pub fn signal_pid(pid: u32, signal: libc::c_int) {
    #[allow(unsafe_code)]
    // SAFETY: kill(2) with a pid we own; a stale pid at worst gets ESRCH.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `n` distinct free ports: each is held until all are found (one after another, a port just
/// released may be handed out again).
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("local addr").port())
        .collect()
}

/// Waits until `cond` holds, polling with a short backoff, or panics with `what` at the deadline.
pub async fn wait_until<F, Fut>(what: &str, deadline: std::time::Duration, cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    if !wait_for(deadline, cond).await {
        panic!("timed out after {deadline:?} waiting for: {what}");
    }
}

/// [`wait_until`] that returns whether `cond` came to hold before the deadline, for a caller
/// whose failure says more than what it waited for.
pub async fn wait_for<F, Fut>(deadline: std::time::Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(5);
    loop {
        if cond().await {
            return true;
        }
        if start.elapsed() > deadline {
            return false;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(200));
    }
}

/// The uid/gid to run servers as: `postgres` when we are root (initdb refuses root), else
/// ourselves (`None`). An error when root and there is no `postgres` user.
pub fn server_user() -> Result<Option<(u32, u32)>, String> {
    #[allow(unsafe_code)]
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Ok(None);
    }
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, "postgres"]).output().ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    match (id("-u"), id("-g")) {
        (Some(uid), Some(gid)) => Ok(Some((uid, gid))),
        _ => Err(
            "the tests run as root, and initdb refuses root, so local PostgreSQL clusters \
                  run as the user `postgres`, which does not exist here \
                  (`useradd --system --user-group postgres` creates it; so does .ci/install-deps)"
                .into(),
        ),
    }
}

/// The file whose presence in a server's directory keeps it from [`sweep_stale_dirs`]: a failed
/// test's logs stay for a look.
pub const KEEP_MARKER: &str = "KEPT-FOR-A-FAILED-TEST";

/// Removes the temporary directories (`<prefix>_<pid>_…` under the temp dir) that test
/// processes which are no longer running left behind: a cluster or broker shared by a whole
/// test process lives in a static and is never dropped, so its directory outlives it. A
/// directory holding [`KEEP_MARKER`] stays.
pub fn sweep_stale_dirs(prefix: &str) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        let Some(pid) = rest.strip_prefix('_').and_then(|r| r.split('_').next()) else {
            continue;
        };
        if pid.parse::<u32>().is_ok()
            && !std::path::Path::new("/proc").join(pid).exists()
            && !e.path().join(KEEP_MARKER).exists()
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Runs the repository's set-up command, `bash .ci/install-deps`, once per test process, so that
/// `cargo test --workspace` on a fresh machine installs what the tests need (PostgreSQL, a JDK,
/// Apache Kafka's jars) instead of failing for want of it. Concurrent test processes serialize
/// on a lock file; the script installs nothing that is already there. `Err` carries what the
/// script printed, for the caller's panic message (no root and no sudo, no apt-get, no network).
pub fn install_deps_once() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.ci/install-deps");
        if !script.is_file() {
            return Err(format!("{} is missing", script.display()));
        }
        eprintln!(
            "ferry-testkit: a test dependency is missing; running {} (once per machine)",
            script.display()
        );
        let lock = std::env::temp_dir().join("ferry-install-deps.lock");
        let out = Command::new("flock")
            .arg(&lock)
            .arg("bash")
            .arg(&script)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("run flock bash {}: {e}", script.display()))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprint!("{text}");
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} failed ({}):\n{text}",
                script.display(),
                out.status
            ))
        }
    })
    .clone()
}

/// A directory of jars for a JVM server of the tests: the one `env_var` names, else the one
/// `find` finds under `~/.cache/ferry`; when neither has them and `env_var` is unset, runs
/// `.ci/install-deps` once ([`install_deps_once`]) and looks again. Panics with what to do.
pub fn jars(
    env_var: &str,
    find: fn(Option<std::path::PathBuf>, &std::path::Path) -> Result<std::path::PathBuf, String>,
) -> std::path::PathBuf {
    let env = std::env::var_os(env_var).map(std::path::PathBuf::from);
    let cache = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("/root"))
        .join(".cache/ferry");
    find(env.clone(), &cache)
        .or_else(|e| {
            if env.is_some() {
                return Err(e);
            }
            install_deps_once().map_err(|i| format!("{e}\n{i}"))?;
            find(None, &cache)
        })
        .unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminate_within_waits_for_an_exit_and_kills_past_the_deadline() {
        // A shell that has set its SIGTERM disposition once it says "ready".
        let sh = |script: &str| {
            let mut c = Command::new("sh")
                .args([
                    "-c",
                    &format!("{script}; echo ready; while :; do sleep 1; done"),
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("sh");
            let mut line = String::new();
            io::BufRead::read_line(
                &mut io::BufReader::new(c.stdout.take().expect("stdout")),
                &mut line,
            )
            .expect("read");
            assert_eq!(line, "ready\n");
            c
        };
        // Exits on SIGTERM: reaped, by itself.
        let mut obeys = sh("true");
        assert!(terminate_within(&mut obeys, Duration::from_secs(30)));
        // Ignores SIGTERM: killed at the deadline, and reaped.
        let mut ignores = sh("trap '' TERM");
        let start = Instant::now();
        assert!(!terminate_within(&mut ignores, Duration::from_millis(300)));
        assert!(start.elapsed() < Duration::from_secs(10));
        assert!(matches!(ignores.try_wait(), Ok(Some(_))));
    }
}
