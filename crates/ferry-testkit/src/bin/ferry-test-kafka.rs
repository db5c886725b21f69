//! Apache Kafka in the foreground, as the tests start it (`ferry_testkit::kafka::LocalBroker`):
//! for the no-Docker demo (`demo/run-local.sh`) and for trying Ferry by hand.
//!
//! ```text
//! ferry-test-kafka [--port N] [--nodes N] [--property KEY=VALUE]...
//! ```
//!
//! Formats fresh storage in a temporary directory, starts the node(s) (KRaft, each broker and
//! controller), waits until the metadata lists every broker, prints the bootstrap list on
//! standard output, and runs until SIGTERM or SIGINT, when it stops the brokers cleanly and
//! removes the directory. The jars are the ones `.ci/install-broker` resolves from Maven Central
//! (installed by the first run when missing).
//!
//! Exit codes: 0 stopped by a signal, 1 the broker failed, 2 bad arguments.

use std::io::Write;
use std::process::ExitCode;

use ferry_testkit::kafka::{ClusterOptions, LocalBroker};

fn main() -> ExitCode {
    let mut opts = ClusterOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = args.next();
        if a == "--property" {
            match value {
                Some(v) if v.contains('=') => {
                    opts.properties.push(v);
                    continue;
                }
                _ => {
                    eprintln!(
                        "usage: ferry-test-kafka [--port N] [--nodes N] [--property KEY=VALUE]...  \
                         (--property takes a server.properties line, got {value:?})"
                    );
                    return ExitCode::from(2);
                }
            }
        }
        let parsed = match (a.as_str(), value.as_deref().map(str::parse::<u16>)) {
            ("--port", Some(Ok(p))) => {
                opts.port = Some(p);
                true
            }
            ("--nodes", Some(Ok(n))) if n >= 1 => {
                opts.nodes = usize::from(n);
                true
            }
            _ => false,
        };
        if !parsed {
            eprintln!(
                "usage: ferry-test-kafka [--port N] [--nodes N] [--property KEY=VALUE]...  \
                 (got {a:?} {value:?})"
            );
            return ExitCode::from(2);
        }
    }
    // Block the signals before any thread starts, so that every thread inherits the mask and
    // sigwait below is the one place they arrive.
    let set = signal_set();
    let broker = match std::panic::catch_unwind(|| LocalBroker::start_blocking_with(opts)) {
        Ok(b) => b,
        Err(_) => return ExitCode::from(1),
    };
    println!("{}", broker.brokers());
    let _ = std::io::stdout().flush();
    eprintln!(
        "ferry-test-kafka: Apache Kafka on {} (logs in {}); SIGTERM or Ctrl-C stops it",
        broker.brokers(),
        broker.dir().display()
    );
    wait_signal(&set);
    broker.stop();
    drop(broker);
    ExitCode::SUCCESS
}

fn signal_set() -> libc::sigset_t {
    #[allow(unsafe_code)]
    // SAFETY: sigset manipulation on a local set, and pthread_sigmask on the calling thread,
    // before any other thread exists.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_signal(set: &libc::sigset_t) {
    let mut sig = 0;
    #[allow(unsafe_code)]
    // SAFETY: sigwait on a set this thread has blocked; `sig` is a valid out pointer.
    unsafe {
        libc::sigwait(set, &mut sig);
    }
}
