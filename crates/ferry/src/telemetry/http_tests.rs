//! Tests of the telemetry endpoint over real TCP on 127.0.0.1, with hand-written requests: what
//! the routes answer and that every limit of [`Limits`] holds.

use super::*;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// Failsafe against a hung test; never used to wait for something to happen.
const FAILSAFE: Duration = Duration::from_secs(20);

struct Server {
    addr: SocketAddr,
    state: Arc<HttpState>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

async fn start(state: HttpState) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = Arc::new(state);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, Arc::clone(&state), async {
        let _ = stopped.await;
    }));
    Server {
        addr,
        state,
        stop: Some(stop),
        task,
    }
}

async fn start_default() -> Server {
    start(HttpState::new(Metrics::new())).await
}

#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        Client {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, raw: &[u8]) {
        self.stream.write_all(raw).await.unwrap();
    }

    async fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 4096];
        let n = timeout(FAILSAFE, self.stream.read(&mut chunk))
            .await
            .expect("failsafe")
            .unwrap_or(0);
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }

    /// Reads one response; `head_only` for responses to HEAD, which have no body.
    async fn response(&mut self, head_only: bool) -> Response {
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            assert!(
                self.fill().await > 0,
                "connection closed before a response head"
            );
        };
        let head = String::from_utf8(self.buf.drain(..end).collect()).unwrap();
        let mut lines = head.trim_end().split("\r\n");
        let status_line = lines.next().unwrap();
        assert!(
            status_line.starts_with("HTTP/1.1 ") || status_line.starts_with("HTTP/1.0 "),
            "{status_line}"
        );
        let status = status_line[9..12].parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .map(|l| {
                let (n, v) = l.split_once(": ").unwrap();
                (n.to_string(), v.to_string())
            })
            .collect();
        let mut response = Response {
            status,
            headers,
            body: String::new(),
        };
        let len: usize = response.header("Content-Length").unwrap().parse().unwrap();
        if !head_only {
            while self.buf.len() < len {
                assert!(self.fill().await > 0, "connection closed inside a body");
            }
            response.body = String::from_utf8(self.buf.drain(..len).collect()).unwrap();
        }
        response
    }

    async fn get(&mut self, path: &str) -> Response {
        self.send(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
            .await;
        self.response(false).await
    }

    /// Whether the server closed the connection with nothing more to read.
    async fn closed(&mut self) -> bool {
        self.fill().await == 0 && self.buf.is_empty()
    }
}

#[tokio::test]
async fn metrics_route_serves_the_registry() {
    let server = start_default().await;
    server.state.metrics.records_produced.add(42);
    let mut client = Client::connect(server.addr).await;
    let response = client.get("/metrics").await;
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("Content-Type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert_eq!(response.header("Connection"), None, "kept alive");
    let mut expected = String::new();
    server.state.metrics.render_registry(&mut expected);
    assert!(response.body.starts_with(&expected), "{}", response.body);
    assert!(
        response.body.contains("\nprocess_resident_memory_bytes "),
        "{}",
        response.body
    );
    assert!(response
        .body
        .contains("\nferry_records_produced_total 42\n"));
}

#[tokio::test]
async fn healthz_answers_get_and_head_on_one_connection() {
    let server = start_default().await;
    let mut client = Client::connect(server.addr).await;
    let response = client.get("/healthz?verbose=1").await;
    assert_eq!((response.status, response.body.as_str()), (200, "ok\n"));

    client.send(b"HEAD /healthz HTTP/1.1\r\n\r\n").await;
    let head = client.response(true).await;
    assert_eq!(head.status, 200);
    assert_eq!(head.header("Content-Length"), Some("3"));
    // Had the HEAD response carried a body, this next response would not parse.
    let again = client.get("/healthz").await;
    assert_eq!((again.status, again.body.as_str()), (200, "ok\n"));
}

#[tokio::test]
async fn readyz_follows_the_pipeline_state() {
    let mut state = HttpState::new(Metrics::new());
    state.stall_after = Duration::ZERO;
    let server = start(state).await;
    let metrics = &server.state.metrics;
    let mut client = Client::connect(server.addr).await;

    let response = client.get("/readyz").await;
    assert_eq!(response.status, 503);
    assert_eq!(
        response.body,
        "not ready: not streaming from the replication slot\n"
    );

    metrics.streaming.set_flag(true);
    let response = client.get("/readyz").await;
    assert_eq!((response.status, response.body.as_str()), (200, "ready\n"));

    // With a zero window, anything in flight is overdue.
    metrics.in_flight_records.set(3);
    let response = client.get("/readyz").await;
    assert_eq!(response.status, 503);
    assert!(
        response.body.ends_with("with 3 records in flight\n"),
        "{}",
        response.body
    );

    metrics.in_flight_records.set(0);
    metrics.standby.set_flag(true);
    let response = client.get("/readyz").await;
    assert_eq!(response.status, 503);
    assert!(
        response.body.starts_with("not ready: standing by"),
        "{}",
        response.body
    );
}

#[tokio::test]
async fn unknown_paths_are_404_and_other_methods_405() {
    let server = start_default().await;
    let mut client = Client::connect(server.addr).await;
    let response = client.get("/").await;
    assert_eq!(response.status, 404);
    let response = client.get("/metricsx").await;
    assert_eq!(response.status, 404);

    client.send(b"DELETE /healthz HTTP/1.1\r\n\r\n").await;
    let response = client.response(false).await;
    assert_eq!(response.status, 405);
    assert_eq!(response.header("Allow"), Some("GET, HEAD"));
    assert_eq!(response.header("Connection"), None, "kept alive");

    // A body is never read, so the connection cannot be reused after it.
    client
        .send(b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
        .await;
    let response = client.response(false).await;
    assert_eq!(response.status, 405);
    assert_eq!(response.header("Connection"), Some("close"));
    assert!(client.closed().await);
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let server = start_default().await;
    let mut client = Client::connect(server.addr).await;
    client.send(b"GET /healthz HTTP/1.1\r\n\r\nGET /nope HTTP/1.1\r\n\r\nGET /readyz HTTP/1.1\r\nConnection: close\r\n\r\n").await;
    assert_eq!(client.response(false).await.status, 200);
    assert_eq!(client.response(false).await.status, 404);
    let last = client.response(false).await;
    assert_eq!(last.status, 503);
    assert_eq!(last.header("Connection"), Some("close"));
    assert!(client.closed().await);
}

#[tokio::test]
async fn http_1_0_connections_are_closed_after_one_response() {
    let server = start_default().await;
    let mut client = Client::connect(server.addr).await;
    client.send(b"GET /healthz HTTP/1.0\r\n\r\n").await;
    let response = client.response(false).await;
    assert_eq!(response.status, 200);
    assert!(client.closed().await);
}

#[tokio::test]
async fn connections_serve_a_bounded_number_of_requests() {
    let mut state = HttpState::new(Metrics::new());
    state.limits.max_requests_per_connection = 2;
    let server = start(state).await;
    let mut client = Client::connect(server.addr).await;
    assert_eq!(client.get("/healthz").await.header("Connection"), None);
    assert_eq!(
        client.get("/healthz").await.header("Connection"),
        Some("close")
    );
    assert!(client.closed().await);
}

#[tokio::test]
async fn a_slow_client_neither_blocks_others_nor_stays_forever() {
    let mut state = HttpState::new(Metrics::new());
    state.limits.request_timeout = Duration::from_millis(300);
    let server = start(state).await;
    let mut slow = Client::connect(server.addr).await;
    slow.send(b"GET /metr").await;

    let mut quick = Client::connect(server.addr).await;
    assert_eq!(quick.get("/healthz").await.status, 200);

    assert!(
        slow.closed().await,
        "an incomplete head is not waited for beyond the request timeout"
    );
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_silently() {
    let mut state = HttpState::new(Metrics::new());
    state.limits.request_timeout = Duration::from_millis(200);
    let server = start(state).await;
    let mut client = Client::connect(server.addr).await;
    assert_eq!(client.get("/healthz").await.status, 200);
    assert!(
        client.closed().await,
        "no 408 for a connection that sent nothing"
    );
}

#[tokio::test]
async fn an_oversized_request_is_refused_and_the_server_carries_on() {
    let server = start_default().await;
    let mut big = Client::connect(server.addr).await;
    let mut raw = b"GET /metrics HTTP/1.1\r\nX-Filler: ".to_vec();
    raw.resize(20 * 1024, b'a');
    big.send(&raw).await;
    let response = big.response(false).await;
    assert_eq!(response.status, 431);
    assert!(big.closed().await);

    let mut next = Client::connect(server.addr).await;
    assert_eq!(next.get("/healthz").await.status, 200);
}

#[tokio::test]
async fn malformed_requests_and_unknown_versions_get_400() {
    let server = start_default().await;
    let mut client = Client::connect(server.addr).await;
    client.send(b"GET /healthz\r\n\r\n").await;
    assert_eq!(client.response(false).await.status, 400);
    assert!(client.closed().await);

    let mut client = Client::connect(server.addr).await;
    client.send(b"GET /healthz HTTP/2.0\r\n\r\n").await;
    assert_eq!(client.response(false).await.status, 400);
    assert!(client.closed().await);
}

#[tokio::test]
async fn connections_beyond_the_cap_are_turned_away() {
    let mut state = HttpState::new(Metrics::new());
    state.limits.max_connections = 1;
    let server = start(state).await;
    let mut first = Client::connect(server.addr).await;
    // Answered, so its connection task is running and stays open (keep-alive).
    assert_eq!(first.get("/healthz").await.status, 200);

    let mut second = Client::connect(server.addr).await;
    let response = second.response(false).await;
    assert_eq!((response.status, response.body.as_str()), (503, "busy\n"));
    assert!(second.closed().await);

    assert_eq!(
        first.get("/healthz").await.status,
        200,
        "the admitted client is unaffected"
    );
}

#[tokio::test]
async fn shutdown_stops_accepting_and_closes_open_connections() {
    let mut server = start_default().await;
    let mut client = Client::connect(server.addr).await;
    assert_eq!(client.get("/healthz").await.status, 200);

    server.stop.take().unwrap().send(()).unwrap();
    timeout(FAILSAFE, &mut server.task)
        .await
        .expect("serve returns after shutdown")
        .unwrap();
    assert!(client.closed().await);
    assert!(
        TcpStream::connect(server.addr).await.is_err(),
        "the listener is gone"
    );
}

#[tokio::test]
async fn a_client_that_never_reads_is_dropped_after_the_write_timeout() {
    let mut state = HttpState::new(Metrics::new());
    state.limits.write_timeout = Duration::from_millis(200);
    state.limits.max_connections = 1;
    let server = start(state).await;
    let mut hog = Client::connect(server.addr).await;
    // Far more response bytes than the socket buffers hold (each /metrics answer is several KiB),
    // and never a byte read back.
    let many = "GET /metrics HTTP/1.1\r\n\r\n".repeat(900);
    let (_, mut write) = hog.stream.split();
    let _ = timeout(Duration::from_millis(500), write.write_all(many.as_bytes())).await;

    // The only slot frees once the hog's stalled write times out; until then, "busy".
    let deadline = Instant::now() + FAILSAFE;
    loop {
        let mut next = Client::connect(server.addr).await;
        let response = next.get("/healthz").await;
        if response.status == 200 {
            break;
        }
        assert_eq!(response.body, "busy\n");
        assert!(
            Instant::now() < deadline,
            "the stalled connection was never dropped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
