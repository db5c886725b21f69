//! The telemetry HTTP endpoint: `/metrics`, `/healthz` and `/readyz` over a minimal HTTP/1.1 server.
//!
//! | Route | Answer |
//! |-------|--------|
//! | `GET /metrics` | 200, the registry in the Prometheus text format 0.0.4 |
//! | `GET /healthz` | 200 `ok` while the process runs (liveness) |
//! | `GET /readyz` | 200 `ready`, or 503 with the one-line reason (see [`super::readiness`]) |
//!
//! `HEAD` is answered like `GET` without the body; another method on these paths gets 405 with
//! `Allow: GET, HEAD`, any other path 404. The server is hand-written rather than a framework
//! because three fixed routes do not justify one; what keeps it safe to expose is in [`Limits`]:
//! request heads are capped in size (431) and must arrive within a deadline (408, which also bounds
//! idle keep-alive connections), responses must be taken within a deadline, connections are capped
//! (503 beyond the cap, so a flood cannot exhaust file descriptors) and each one serves a bounded
//! number of requests. Every connection runs in its own task, so a slow client delays nobody else.
//! HTTP/1.1 connections are kept alive unless the client says `Connection: close`; HTTP/1.0 ones are
//! closed. A request announcing a body is answered and the connection closed (bodies are never read).
//! Request parsing is the pure `request` module.
//!
//! [`serve`] runs until its `shutdown` future completes, then stops accepting and drops every open
//! connection: scrapes are not worth delaying a shutdown for.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::timeout;

use super::metrics::{Metrics, CONTENT_TYPE};
use super::readiness::{self, DEFAULT_STALL_AFTER};
use super::request::{self, HeadError, Method, RequestHead};

/// Bounds on what one client can make the server spend.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request head accepted (request line + headers), in bytes.
    pub max_head_bytes: usize,
    /// Deadline for a complete request head, counted from the end of the previous response (or the
    /// accept): bounds slow clients and idle keep-alive connections alike.
    pub request_timeout: Duration,
    /// Deadline for writing one response.
    pub write_timeout: Duration,
    /// Open connections beyond this are answered 503 and closed at once.
    pub max_connections: usize,
    /// Requests served on one connection before it is closed.
    pub max_requests_per_connection: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head_bytes: 8 * 1024,
            request_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            max_connections: 64,
            max_requests_per_connection: 1000,
        }
    }
}

/// What the routes read: the registry, the readiness window and the server's limits.
#[derive(Debug)]
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    /// How long records may be in flight without the confirmed LSN rising before `/readyz` fails.
    pub stall_after: Duration,
    pub limits: Limits,
}

impl HttpState {
    /// State with the default readiness window and limits.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        HttpState {
            metrics,
            stall_after: DEFAULT_STALL_AFTER,
            limits: Limits::default(),
        }
    }
}

/// Serves the telemetry routes on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    state: Arc<HttpState>,
    shutdown: impl Future<Output = ()>,
) {
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    if connections.len() >= state.limits.max_connections {
                        // A fresh socket's send buffer takes this whole, without waiting.
                        let _ = stream.try_write(&Reply::text(503, "busy").encode(false, false));
                        continue;
                    }
                    connections.spawn(connection(stream, Arc::clone(&state)));
                }
                Err(error) => {
                    // Typically EMFILE/ENFILE: back off instead of spinning on the error.
                    tracing::warn!(%error, "telemetry endpoint failed to accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    connections.shutdown().await;
}

/// Why reading a request head ended without one.
enum ReadEnd {
    /// The peer closed or the socket failed: nothing to answer.
    Closed,
    Invalid(HeadError),
}

async fn connection(mut stream: TcpStream, state: Arc<HttpState>) {
    let _ = stream.set_nodelay(true);
    let limits = &state.limits;
    let mut buf = Vec::with_capacity(1024);
    for served in 1..=limits.max_requests_per_connection {
        let read = read_head(&mut stream, &mut buf, limits.max_head_bytes);
        let head = match timeout(limits.request_timeout, read).await {
            Ok(Ok(head)) => head,
            Ok(Err(ReadEnd::Closed)) => return,
            Ok(Err(ReadEnd::Invalid(error))) => {
                let reply = match error {
                    HeadError::TooLarge => Reply::text(431, "request head too large"),
                    HeadError::Version => {
                        Reply::text(505, "only HTTP/1.0 and HTTP/1.1 are supported")
                    }
                    HeadError::Malformed(why) => Reply::text(400, why),
                };
                return finish(stream, &reply.encode(false, false), limits.write_timeout).await;
            }
            // Idle keep-alive connection: close without a word.
            Err(_elapsed) if buf.iter().all(u8::is_ascii_whitespace) => return,
            Err(_elapsed) => {
                let reply = Reply::text(408, "request timeout");
                return finish(stream, &reply.encode(false, false), limits.write_timeout).await;
            }
        };
        let last = served == limits.max_requests_per_connection;
        let keep_alive = head.keep_alive && !head.has_body && !last;
        let bytes = route(&state, &head).encode(head.method == Method::Head, keep_alive);
        if !keep_alive {
            return finish(stream, &bytes, limits.write_timeout).await;
        }
        let write = timeout(limits.write_timeout, stream.write_all(&bytes)).await;
        if !matches!(write, Ok(Ok(()))) {
            return;
        }
    }
}

/// Reads until `buf` starts with a complete request head, which is removed from `buf`.
async fn read_head(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<RequestHead, ReadEnd> {
    let mut chunk = [0u8; 4096];
    loop {
        match request::parse(buf, max) {
            Ok(Some((head, consumed))) => {
                buf.drain(..consumed);
                return Ok(head);
            }
            Ok(None) => {}
            Err(error) => return Err(ReadEnd::Invalid(error)),
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return Err(ReadEnd::Closed),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Writes the last response, then closes gracefully: half-close, and discard what the client still
/// sends for a moment, so that unread request bytes do not turn the close into a reset that would
/// destroy the response before the client reads it.
async fn finish(mut stream: TcpStream, bytes: &[u8], write_timeout: Duration) {
    if !matches!(
        timeout(write_timeout, stream.write_all(bytes)).await,
        Ok(Ok(()))
    ) {
        return;
    }
    let _ = stream.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut left = 64 * 1024usize;
        while let Ok(n @ 1..) = stream.read(&mut sink).await {
            left = left.saturating_sub(n);
            if left == 0 {
                break;
            }
        }
    };
    let _ = timeout(Duration::from_secs(1), drain).await;
}

fn route(state: &HttpState, head: &RequestHead) -> Reply {
    let path = head.path.as_str();
    if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
        return Reply::text(404, "not found");
    }
    if head.method == Method::Other {
        return Reply {
            allow: true,
            ..Reply::text(405, "method not allowed")
        };
    }
    match path {
        "/metrics" => {
            let mut body = String::with_capacity(8192);
            state.metrics.render(&mut body);
            Reply {
                status: 200,
                content_type: CONTENT_TYPE,
                body: body.into_bytes(),
                allow: false,
            }
        }
        "/readyz" => match readiness::check(&state.metrics, state.stall_after, Instant::now()) {
            Ok(()) => Reply::text(200, "ready"),
            Err(why) => Reply::text(503, &format!("not ready: {why}")),
        },
        _ => Reply::text(200, "ok"),
    }
}

/// A response before encoding.
struct Reply {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
    /// Whether to send `Allow: GET, HEAD` (with 405).
    allow: bool,
}

impl Reply {
    /// A plain-text reply; `line` gets a newline appended.
    fn text(status: u16, line: &str) -> Reply {
        let body = format!("{line}\n").into_bytes();
        Reply {
            status,
            content_type: "text/plain; charset=utf-8",
            body,
            allow: false,
        }
    }

    /// The bytes on the wire. `head_only` keeps the body's `Content-Length` but leaves the body out.
    fn encode(&self, head_only: bool, keep_alive: bool) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            503 => "Service Unavailable",
            505 => "HTTP Version Not Supported",
            _ => "",
        };
        let connection = if keep_alive { "keep-alive" } else { "close" };
        let allow = if self.allow {
            "Allow: GET, HEAD\r\n"
        } else {
            ""
        };
        let head = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n\
             Cache-Control: no-store\r\nConnection: {connection}\r\n{allow}\r\n",
            self.status,
            self.content_type,
            self.body.len(),
        );
        let mut out = head.into_bytes();
        if !head_only {
            out.extend_from_slice(&self.body);
        }
        out
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
