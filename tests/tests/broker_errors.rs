//! A `kafka.brokers` that cannot be used, as a new user meets it: a port nothing listens on, a
//! name that does not resolve, a port that is not Kafka. `ferry check` (exit 1) and `ferry run`
//! (at WARN, while it retries) each name the cause and its fix, within a bound, and `run`
//! backs off between attempts instead of reconnecting every few milliseconds.
//!
//! No broker is started but in the last test (a broker stopped mid-run): the "brokers" are a
//! free port, a name under `.invalid` (RFC 6761: it never resolves), and listeners in the test.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ferry_testkit::process::free_port;

/// How long `check` may take, from its start, to name a cause that one attempt shows (it took
/// 20 s before: a 10 s metadata request, then a 10 s progress read).
const CHECK_BOUND: Duration = Duration::from_secs(8);

/// How long `run` may take, from its start, to log the cause.
const RUN_BOUND: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_port_is_named_with_start_the_broker_or_fix_the_port() {
    let at = format!("127.0.0.1:{}", free_port());
    names_the_cause(
        &at,
        &format!(
            "cannot use the Kafka brokers: nothing listens at {at}: the connection was refused"
        ),
        "start the broker, or correct the port in kafka.brokers",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_name_is_named_with_the_host_and_dns() {
    names_the_cause(
        "ferry-no-such-broker.invalid:9092",
        "cannot use the Kafka brokers: the host name \"ferry-no-such-broker.invalid\" in kafka.brokers does not resolve",
        "correct the host name in kafka.brokers, or make it resolvable where Ferry runs (DNS",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_that_is_not_kafka_is_named_without_the_receive_size_advice() {
    let at = listener(|| Some(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")).await;
    names_the_cause(
        &at,
        &format!("cannot use the Kafka brokers: the port at {at} does not speak the Kafka protocol (an HTTP server"),
        "check the host and port in kafka.brokers (the broker's listener, often 9092) and kafka.properties security.protocol",
    )
    .await;
}

/// A port that accepts and then says nothing (a TLS or SASL listener waiting for its
/// handshake, a hung service): nothing is certain before the probe's deadline (10 s), and then
/// the cause is the unanswered first request, told from a connection never accepted (a
/// firewall) by librdkafka's state change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_that_accepts_and_stays_silent_is_named_after_the_probe_deadline() {
    let at = listener(|| Some(b"")).await;
    let w = world(&at).await;
    let started = Instant::now();
    let mut check = Ferry::spawn(&w, &["check"]);
    let status = check.wait_exit(Duration::from_secs(60)).await;
    let took = started.elapsed();
    let out = check.log_text();
    eprintln!("ferry check ({took:?}):\n{out}");
    assert_eq!(status.code(), Some(1), "{out}");
    assert_problem(
        &out,
        &format!("cannot use the Kafka brokers: {at} accepted the connection but did not answer Ferry's first Kafka request within 10s"),
        "set kafka.properties security.protocol to the listener's",
    );
    assert!(
        took < Duration::from_secs(10) + CHECK_BOUND,
        "check took {took:?}:\n{out}"
    );
}

/// librdkafka alone reconnects to a broker nothing answers on every ~11 ms while a request
/// waits (at Ferry's `reconnect.backoff.ms` of 20; see `kafka_access::probe`). Counted at a
/// listener that accepts and closes at once (a cause one attempt shows, as a refused port),
/// over a window that starts at the first attempt: Ferry probes, says why, says it again
/// after 0.5 s, 1 s, 2 s, 4 s, 8 s, ..., and probes quietly once a second meanwhile: about one
/// attempt a second (9 in 10 s measured), where a client left to itself makes ~90.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_backs_off_from_a_broker_that_closes_every_connection() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = attempts.clone();
    let at = listener(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        None
    })
    .await;
    let w = world(&at).await;
    let mut ferry = w.start_ferry();
    wait_until("a first connection attempt", RUN_BOUND, || {
        let a = attempts.clone();
        async move { a.load(Ordering::SeqCst) > 0 }
    })
    .await;
    let first = attempts.load(Ordering::SeqCst);
    // A window to count in, not a synchronisation: the rate is what is measured.
    let window = Duration::from_secs(10);
    tokio::time::sleep(window).await;
    let in_window = attempts.load(Ordering::SeqCst) - first;
    eprintln!("connection attempts in the {window:?} after the first: {in_window}");
    assert!(
        in_window <= 12,
        "{in_window} connection attempts in {window:?}: no backoff\n{}",
        ferry.log_text()
    );
    let log = ferry.log_text();
    assert!(
        log.contains(&format!(
            "the Kafka brokers cannot be used: {at} closed the connection at Ferry's first request"
        )),
        "{log}"
    );
    assert!(log.contains("retry_in_ms="), "{log}");
    assert!(ferry.is_running());
    ferry.terminate().await;
}

/// The same for a refused port, counted by librdkafka itself: with `debug=broker` every client
/// logs each attempt ("Connecting to ipv4#127.0.0.1:<port>"), and before a broker answers the
/// only clients Ferry has are its probes, which pass their lines to the log. (The old build's
/// producer alone logged ~80 a second while its first metadata request waited.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_backs_off_from_a_refused_port() {
    let port = free_port();
    let mut w = world(&format!("127.0.0.1:{port}")).await;
    w.env.push(("FERRY_LOG_LEVEL".into(), "debug".into()));
    w.env
        .push(("FERRY_KAFKA_PROPERTIES_DEBUG".into(), "broker".into()));
    let mut ferry = w.start_ferry();
    let attempt: &'static str =
        Box::leak(format!("Connecting to ipv4#127.0.0.1:{port}").into_boxed_str());
    ferry.wait_log(attempt, RUN_BOUND).await;
    let count = |log: &str| log.lines().filter(|l| l.contains(attempt)).count();
    let first = count(&ferry.log_text());
    // A window to count in, not a synchronisation: the rate is what is measured.
    let window = Duration::from_secs(10);
    tokio::time::sleep(window).await;
    let log = ferry.log_text();
    let in_window = count(&log) - first;
    eprintln!("refused connection attempts in the {window:?} after the first: {in_window}");
    assert!(
        in_window <= 12,
        "{in_window} connection attempts in {window:?}: no backoff"
    );
    assert!(
        log.contains(&format!(
            "the Kafka brokers cannot be used: nothing listens at 127.0.0.1:{port}"
        )),
        "{log}"
    );
    assert!(ferry.is_running());
    ferry.terminate().await;
}

/// A broker that stops while Ferry streams: the producer's client errors, which librdkafka
/// repeats while it reconnects, name the cause and its fix (they relayed librdkafka's "Connect
/// to ... failed: Connection refused" alone). librdkafka's own timers still ask for a
/// connection about twice a second while the producer holds records; Ferry cannot drop that
/// client without dropping them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_names_the_cause_while_it_retries_a_broker_stopped_mid_run() {
    let broker = ferry_testkit::kafka::LocalBroker::start().await;
    let w = World::on(
        ferry_testkit::pg::shared().create_db().await,
        broker.brokers(),
    )
    .await;
    let topic = w.create_topic("order", 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.insert("order", "o-0", "Created", "{}").await;
    w.consume(&topic, 1).await;
    tokio::task::block_in_place(|| broker.stop());
    w.insert("order", "o-1", "Created", "{}").await;
    let said: &'static str = Box::leak(
        format!(
            "Kafka client error: nothing listens at {}: the connection was refused",
            broker.brokers()
        )
        .into_boxed_str(),
    );
    ferry.wait_log(said, Duration::from_secs(30)).await;
    let log = ferry.log_text();
    assert!(log.contains("Fix: start the broker"), "{log}");
    assert!(ferry.is_running(), "{log}");
    ferry.terminate().await;
}

/// Ferry started while the broker is away says why and waits the session backoff before it says
/// so again (a minute here), but asks again quietly meanwhile: it goes on once the broker is back,
/// without waiting out the backoff. (It waited out the backoff, up to 30 s by default, before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_goes_on_once_the_broker_is_back_without_waiting_out_its_backoff() {
    let broker = ferry_testkit::kafka::LocalBroker::start().await;
    let mut w = World::on(
        ferry_testkit::pg::shared().create_db().await,
        broker.brokers(),
    )
    .await;
    for k in [
        "FERRY_POSTGRES_RECONNECT_BACKOFF_MIN",
        "FERRY_POSTGRES_RECONNECT_BACKOFF_MAX",
    ] {
        w.env.push((k.into(), "60s".into()));
    }
    let topic = w.create_topic("order", 1).await;
    tokio::task::block_in_place(|| broker.stop());
    let mut ferry = w.start_ferry();
    let said: &'static str = Box::leak(
        format!(
            "the Kafka brokers cannot be used: nothing listens at {}",
            broker.brokers()
        )
        .into_boxed_str(),
    );
    ferry.wait_log(said, RUN_BOUND).await;
    let log = ferry.log_text();
    assert!(
        log.contains("retry_in_ms=60000"),
        "the backoff is a minute: {log}"
    );
    tokio::task::block_in_place(|| broker.start_again());
    // Well within the minute the backoff would take.
    ferry
        .wait_log("a Kafka broker answers", Duration::from_secs(30))
        .await;
    ferry.wait_ready().await;
    w.insert("order", "o-0", "Created", "{}").await;
    let records = w.consume(&topic, 1).await;
    assert_eq!(records[0].key.as_deref(), Some(&b"o-0"[..]));
    let log = ferry.log_text();
    assert_eq!(
        log.matches(said).count(),
        1,
        "the quiet probes say nothing: {log}"
    );
    ferry.terminate().await;
}

/// `check` exits 1 with `what` and `fix` within [`CHECK_BOUND`]; `run` logs them within
/// [`RUN_BOUND`], `/readyz` says them, and it keeps retrying.
async fn names_the_cause(brokers: &str, what: &str, fix: &str) {
    let w = world(brokers).await;
    let started = Instant::now();
    let mut check = Ferry::spawn(&w, &["check"]);
    let status = check.wait_exit(Duration::from_secs(60)).await;
    let took = started.elapsed();
    let out = check.log_text();
    eprintln!("ferry check ({took:?}):\n{out}");
    assert_eq!(status.code(), Some(1), "{out}");
    assert_problem(&out, what, fix);
    assert!(!out.contains("receive.message.max.bytes"), "{out}");
    assert!(took < CHECK_BOUND, "check took {took:?}:\n{out}");

    let mut ferry = w.start_ferry();
    let said: &'static str = Box::leak(
        format!(
            "the Kafka brokers cannot be used: {}",
            what.trim_start_matches("cannot use the Kafka brokers: ")
        )
        .into_boxed_str(),
    );
    let started = Instant::now();
    ferry.wait_log(said, RUN_BOUND).await;
    let log = ferry.log_text();
    let line = log.lines().find(|l| l.contains(said)).unwrap_or_default();
    eprintln!("ferry run ({:?}):\n{line}", started.elapsed());
    assert!(log.contains(&format!("Fix: {fix}")), "{log}");
    assert!(!log.contains("increase receive.message.max.bytes"), "{log}");
    let ready = ferry.http_get("/readyz").await;
    assert!(
        matches!(&ready, Some((503, body)) if body.contains(said)),
        "/readyz: {ready:?}"
    );
    assert!(ferry.is_running(), "{log}");
    ferry.terminate().await;
}

/// A world whose brokers are `brokers` (no broker is started).
async fn world(brokers: &str) -> World {
    World::on(
        ferry_testkit::pg::shared().create_db().await,
        brokers.to_string(),
    )
    .await
}

/// A TCP listener on 127.0.0.1 that, at each connection, calls `answer` and writes what it
/// gives (then holds the connection until the client closes it, up to a minute), or closes at
/// once; its address.
async fn listener(answer: impl Fn() -> Option<&'static [u8]> + Send + Sync + 'static) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut s, _)) = l.accept().await {
            if let Some(bytes) = answer() {
                tokio::spawn(async move {
                    let _ = s.write_all(bytes).await;
                    let _ = tokio::time::timeout(Duration::from_secs(60), async {
                        use tokio::io::AsyncReadExt;
                        let mut sink = [0u8; 1024];
                        while s.read(&mut sink).await.is_ok_and(|n| n > 0) {}
                    })
                    .await;
                });
            }
        }
    });
    at
}
