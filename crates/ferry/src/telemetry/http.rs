//! The telemetry HTTP endpoint: `/metrics`, `/healthz` and `/readyz`, served by hyper (HTTP/1.x).
//!
//! | Route | Answer |
//! |-------|--------|
//! | `GET /metrics` | 200, the registry in the Prometheus text format 0.0.4 |
//! | `GET /healthz` | 200 `ok` while the process runs (liveness) |
//! | `GET /readyz` | 200 `ready`, or 503 with the one-line reason (see [`super::readiness`]) |
//!
//! `HEAD` is answered like `GET` without the body; another method on these paths gets 405 with
//! `Allow: GET, HEAD`, any other path 404. hyper does the HTTP (parsing, keep-alive, pipelining,
//! HTTP/1.0); this module adds the routes and what keeps the endpoint safe to expose, in [`Limits`]:
//!
//! - request heads are capped in size (431 beyond, hyper's answer) and at 100 headers (400);
//! - a request head must arrive within `request_timeout`, counted from the accept or the end of the
//!   previous response: slow clients and idle keep-alive connections are closed without an answer;
//! - a response write that makes no progress for `write_timeout` closes the connection (a client
//!   that never reads cannot hold a connection slot);
//! - open connections are capped (503 `busy` beyond the cap, written straight to the fresh socket,
//!   so a flood cannot exhaust file descriptors), and each serves a bounded number of requests
//!   (the last response says `Connection: close`);
//! - request bodies are never read: a request announcing one is answered with `Connection: close`.
//!
//! Every connection runs in its own task on the process's (current-thread) runtime, so a slow
//! client delays nobody else. [`serve`] runs until its `shutdown` future completes, then stops
//! accepting and drops every open connection: scrapes are not worth delaying a shutdown for.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Sleep;

use super::metrics::{Metrics, CONTENT_TYPE};
use super::readiness::{self, DEFAULT_STALL_AFTER};

/// Bounds on what one client can make the server spend.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request head accepted (request line + headers), in bytes.
    pub max_head_bytes: usize,
    /// Deadline for a complete request head, counted from the end of the previous response (or the
    /// accept): bounds slow clients and idle keep-alive connections alike.
    pub request_timeout: Duration,
    /// How long a response write may make no progress before the connection is closed.
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
    /// `ferry inbox`'s registry and readiness, which then answer instead of the relay's.
    pub inbox: Option<Arc<crate::inbox::metrics::InboxMetrics>>,
}

impl HttpState {
    /// State with the default readiness window and limits.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        HttpState {
            metrics,
            stall_after: DEFAULT_STALL_AFTER,
            limits: Limits::default(),
            inbox: None,
        }
    }
}

/// The answer to a connection beyond the cap, written without hyper.
const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\
Content-Length: 5\r\nCache-Control: no-store\r\nConnection: close\r\n\r\nbusy\n";

/// hyper's smallest read buffer: heads up to `max_head_bytes` must fit in the buffer too.
const MIN_BUFFER: usize = 8192;

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
                        let _ = stream.try_write(BUSY);
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

/// Serves one connection with hyper, within [`Limits`].
async fn connection(stream: TcpStream, state: Arc<HttpState>) {
    let _ = stream.set_nodelay(true);
    let limits = state.limits.clone();
    let io = TokioIo::new(WriteDeadline::new(stream, limits.write_timeout));
    let served = Arc::new(AtomicUsize::new(0));
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let n = served.fetch_add(1, Ordering::Relaxed) + 1;
        let last = n >= limits.max_requests_per_connection;
        let response = respond(&state, &request, last);
        std::future::ready(Ok::<_, Infallible>(response))
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.request_timeout)
        .max_header_size(limits.max_head_bytes)
        .max_buf_size(limits.max_head_bytes.max(MIN_BUFFER))
        .max_headers(100);
    // An error here is the client's (reset, timeout, malformed request): nothing to report.
    let _ = builder.serve_connection(io, service).await;
}

/// The response to `request`; `last` when the connection serves no more requests after it.
fn respond(state: &HttpState, request: &Request<Incoming>, last: bool) -> Response<Full<Bytes>> {
    let reply = route(state, request.method(), request.uri().path());
    // Bodies are never read, so their bytes would be taken for the next request.
    let has_body = request.headers().contains_key(header::TRANSFER_ENCODING)
        || request
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    let mut response = Response::new(Full::new(Bytes::from(reply.body)));
    *response.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(reply.content_type),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if reply.allow {
        headers.insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    if last || has_body {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// The socket, closed (with an error to hyper) when a write makes no progress for `timeout`.
struct WriteDeadline {
    io: TcpStream,
    timeout: Duration,
    /// Running while a write, flush or shutdown is pending.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl WriteDeadline {
    fn new(io: TcpStream, timeout: Duration) -> Self {
        WriteDeadline {
            io,
            timeout,
            stalled: None,
        }
    }

    /// Passes `poll`'s result on, resetting the deadline on progress, or fails once it expires.
    fn guard<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let timeout = self.timeout;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took no response bytes within http write_timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for WriteDeadline {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteDeadline {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.guard(cx, poll)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.guard(cx, poll)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_flush(cx);
        this.guard(cx, poll)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_shutdown(cx);
        this.guard(cx, poll)
    }
}

fn route(state: &HttpState, method: &Method, path: &str) -> Reply {
    if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
        return Reply::text(404, "not found");
    }
    if method != Method::GET && method != Method::HEAD {
        return Reply {
            allow: true,
            ..Reply::text(405, "method not allowed")
        };
    }
    match path {
        "/metrics" => {
            let mut body = String::with_capacity(8192);
            match &state.inbox {
                Some(inbox) => inbox.render(&mut body),
                None => state.metrics.render(&mut body),
            }
            Reply {
                status: 200,
                content_type: CONTENT_TYPE,
                body: body.into_bytes(),
                allow: false,
            }
        }
        "/readyz" => match state.inbox.as_ref().map_or_else(
            || {
                readiness::check(&state.metrics, state.stall_after, Instant::now())
                    .map_err(|why| why.to_string())
            },
            |inbox| inbox.ready(),
        ) {
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
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
