//! A TCP fault proxy: sits between Ferry and PostgreSQL, or Ferry and the broker, and breaks
//! the link on command.
//!
//! Faults ([`Fault`]): `Cut` resets every open connection (SO_LINGER 0, then close: the client
//! reads ECONNRESET, not a clean end of stream); `Blackhole` keeps connections open and accepts
//! new ones but forwards nothing in either direction until healed (what a dropped route looks
//! like: bytes wait in the kernel buffers, nobody answers); `Delay` adds a latency to every
//! chunk; `Throttle` limits each direction of each connection to a number of bytes per second.
//! [`Proxy::heal`] returns to plain forwarding; bytes held by a blackhole then flow, as after a
//! healed partition.
//!
//! **Kafka.** A client reaches a broker through the addresses the broker *advertises* in its
//! Metadata and FindCoordinator responses, not through its bootstrap address: a plain proxy
//! would be bypassed after the first metadata request. The proxy sits in front of a broker
//! that advertises its own address (a shared test broker cannot advertise one proxy per test),
//! so in [`Proxy::kafka`] mode it frames the
//! Kafka protocol (a 4-byte length, then the message), remembers which correlation ids were
//! Metadata (api key 3) or FindCoordinator (10) requests, and in their responses replaces the
//! upstream's port after its host string with the proxy's own port. Host strings keep their
//! length (the proxy listens on the upstream's IP), so no length field changes.
//!
//! [`Proxy::kafka_hiding`] also plays a broker that lacks some APIs (issue 30: a Kafka-protocol
//! broker without transactions): it remembers the ApiVersions requests (api key 18) and removes
//! the hidden keys from their responses, so the client believes the broker does not serve them,
//! while everything else stays the real broker's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does to the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Reset every open connection (new ones are accepted as usual).
    Cut,
    /// Forward nothing until healed; connections stay open.
    Blackhole,
    /// Add this latency to every chunk forwarded.
    Delay(Duration),
    /// At most this many bytes per second per direction per connection.
    Throttle(u64),
    /// Forward nothing more, for good, on the connections open now; connections opened later
    /// pass as usual (a NAT or conntrack entry lost: the old flows' packets go nowhere while
    /// both ends live on, new flows work). Not undone by [`Proxy::heal`].
    Strand,
}

/// The proxy's state: plain forwarding or a standing fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pass,
    Blackhole,
    Delay(Duration),
    Throttle(u64),
}

/// A running proxy; dropping it stops accepting and closes every connection.
#[derive(Debug)]
pub struct Proxy {
    listen: SocketAddr,
    mode: watch::Sender<Mode>,
    /// Bumped by every [`Fault::Cut`]; connections reset when it changes.
    cuts: watch::Sender<u64>,
    /// Bumped by every [`Fault::Strand`]; a connection accepted before it forwards nothing more.
    strands: watch::Sender<u64>,
    accept: JoinHandle<()>,
}

/// How the Kafka mode rewrites advertised addresses.
#[derive(Debug, Clone)]
struct Rewrite {
    /// The upstream's host string followed by its port (big-endian i32): what to look for.
    needle: Vec<u8>,
    /// The proxy's port, big-endian i32: what replaces the upstream's port.
    port: [u8; 4],
    /// API keys removed from ApiVersions responses.
    hide: Vec<i16>,
}

const CHUNK: usize = 16 * 1024;
const API_METADATA: i16 = 3;
const API_FIND_COORDINATOR: i16 = 10;
const API_VERSIONS: i16 = 18;

impl Proxy {
    /// A byte-level proxy to `upstream`, listening on a free port of the upstream's IP.
    pub async fn tcp(upstream: SocketAddr) -> std::io::Result<Proxy> {
        Proxy::start(upstream, None).await
    }

    /// A proxy to a Kafka-protocol broker at `upstream` that makes clients come back through
    /// it (see the module notes).
    pub async fn kafka(upstream: SocketAddr) -> std::io::Result<Proxy> {
        Proxy::start(upstream, Some(Vec::new())).await
    }

    /// [`Proxy::kafka`], and the broker behind it seems to lack the APIs `hide` (their keys:
    /// 26 is EndTxn) in every ApiVersions answer.
    pub async fn kafka_hiding(upstream: SocketAddr, hide: &[i16]) -> std::io::Result<Proxy> {
        Proxy::start(upstream, Some(hide.to_vec())).await
    }

    /// `kafka`: the API keys to hide, for a Kafka proxy; `None` for a byte-level one.
    async fn start(upstream: SocketAddr, kafka: Option<Vec<i16>>) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(SocketAddr::new(upstream.ip(), 0)).await?;
        let listen = listener.local_addr()?;
        let rewrite = kafka.map(|hide| {
            let host = upstream.ip().to_string();
            let mut needle = host.into_bytes();
            needle.extend_from_slice(&i32::from(upstream.port()).to_be_bytes());
            Rewrite {
                needle,
                port: i32::from(listen.port()).to_be_bytes(),
                hide,
            }
        });
        let (mode, _) = watch::channel(Mode::Pass);
        let (cuts, _) = watch::channel(0u64);
        let (strands, _) = watch::channel(0u64);
        let (mode_rx, cuts_rx, strands_rx) =
            (mode.subscribe(), cuts.subscribe(), strands.subscribe());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (m, c, r) = (mode_rx.clone(), cuts_rx.clone(), rewrite.clone());
                let stranded = Stranded::from(strands_rx.clone());
                tokio::spawn(connection(client, upstream, m, c, stranded, r));
            }
        });
        Ok(Proxy {
            listen,
            mode,
            cuts,
            strands,
            accept,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// Applies `fault`. A cut is momentary; the others stand until [`Proxy::heal`].
    pub fn inject(&self, fault: Fault) {
        match fault {
            Fault::Cut => {
                self.cuts.send_modify(|n| *n += 1);
            }
            Fault::Blackhole => {
                self.mode.send_replace(Mode::Blackhole);
            }
            Fault::Delay(d) => {
                self.mode.send_replace(Mode::Delay(d));
            }
            Fault::Throttle(bps) => {
                self.mode.send_replace(Mode::Throttle(bps.max(1)));
            }
            Fault::Strand => {
                self.strands.send_modify(|n| *n += 1);
            }
        }
    }

    /// Back to plain forwarding.
    pub fn heal(&self) {
        self.mode.send_replace(Mode::Pass);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Connections end with the next cut generation they see.
        self.cuts.send_modify(|n| *n += 1);
    }
}

/// Waits while the proxy blackholes. Returns false when the proxy is gone.
async fn pass_blackhole(mode: &mut watch::Receiver<Mode>) -> bool {
    mode.wait_for(|m| *m != Mode::Blackhole).await.is_ok()
}

/// Whether a [`Fault::Strand`] came after the connection was accepted.
#[derive(Clone)]
struct Stranded {
    strands: watch::Receiver<u64>,
    born: u64,
}

impl From<watch::Receiver<u64>> for Stranded {
    fn from(strands: watch::Receiver<u64>) -> Stranded {
        let born = *strands.borrow();
        Stranded { strands, born }
    }
}

impl Stranded {
    /// Returns at once while the connection is not stranded; once it is, never (the connection
    /// ends with the proxy).
    async fn pass(&self) {
        if *self.strands.borrow() != self.born {
            std::future::pending::<()>().await;
        }
    }
}

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<Mode>,
    mut cuts: watch::Receiver<u64>,
    stranded: Stranded,
    rewrite: Option<Rewrite>,
) {
    cuts.mark_unchanged();
    // A blackhole also swallows the connect: the client sees an accepted connection that
    // never answers.
    tokio::select! {
        ok = pass_blackhole(&mut mode) => if !ok { return },
        _ = cuts.changed() => return reset(&client),
    }
    let server = match TcpStream::connect(upstream).await {
        Ok(s) => s,
        // The upstream is down: the client sees a reset, as if it had connected to it.
        Err(_) => return reset(&client),
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client, server) = (Arc::new(client), Arc::new(server));
    let requests: Arc<Mutex<HashMap<i32, (i16, i16)>>> = Arc::default();
    let up = pump(
        client.clone(),
        server.clone(),
        mode.clone(),
        stranded.clone(),
        rewrite
            .as_ref()
            .map(|_| Direction::Requests(requests.clone())),
    );
    let down = pump(
        server.clone(),
        client.clone(),
        mode,
        stranded,
        rewrite.map(|r| Direction::Responses(requests, r)),
    );
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = cuts.changed() => {
            reset(&client);
            reset(&server);
        }
    }
}

/// Sets SO_LINGER 0 so that the close that follows sends RST.
fn reset(s: &TcpStream) {
    #[allow(deprecated)] // tokio 1.47 deprecates set_linger for blocking closes; ours is zero.
    let _ = s.set_linger(Some(Duration::ZERO));
}

/// What the Kafka mode does with the frames of one direction.
enum Direction {
    /// Client to broker: remember the Metadata, FindCoordinator and ApiVersions correlation
    /// ids (with the api key and version).
    Requests(Arc<Mutex<HashMap<i32, (i16, i16)>>>),
    /// Broker to client: rewrite the advertised port in their responses, and the hidden APIs
    /// out of ApiVersions responses.
    Responses(Arc<Mutex<HashMap<i32, (i16, i16)>>>, Rewrite),
}

/// Forwards `from` to `to` under the current mode until either side ends.
async fn pump(
    from: Arc<TcpStream>,
    to: Arc<TcpStream>,
    mut mode: watch::Receiver<Mode>,
    stranded: Stranded,
    kafka: Option<Direction>,
) {
    let mut buf = vec![0u8; CHUNK];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        if !pass_blackhole(&mut mode).await {
            return;
        }
        let cap = match *mode.borrow() {
            // Chunks of a tenth of a second's worth keep a throttle smooth.
            Mode::Throttle(bps) => (bps / 10).clamp(1, CHUNK as u64) as usize,
            _ => CHUNK,
        };
        let n = match read(&from, &mut buf[..cap]).await {
            Ok(0) | Err(_) => {
                shutdown_write(&to);
                return;
            }
            Ok(n) => n,
        };
        // A blackhole that began while we waited holds what was read.
        if !pass_blackhole(&mut mode).await {
            return;
        }
        let current = *mode.borrow();
        match current {
            Mode::Delay(d) => tokio::time::sleep(d).await,
            Mode::Throttle(bps) => {
                tokio::time::sleep(Duration::from_secs_f64(n as f64 / bps as f64)).await
            }
            Mode::Pass | Mode::Blackhole => {}
        }
        // A strand that came while we read or waited holds what was read, for good.
        stranded.pass().await;
        let out: Vec<u8> = match &kafka {
            None => buf[..n].to_vec(),
            Some(dir) => {
                pending.extend_from_slice(&buf[..n]);
                take_frames(&mut pending, dir)
            }
        };
        if write_all(&to, &out).await.is_err() {
            return;
        }
    }
}

/// Removes the complete Kafka frames from the front of `pending`, tracked or rewritten for
/// `dir`, and returns them.
fn take_frames(pending: &mut Vec<u8>, dir: &Direction) -> Vec<u8> {
    let mut at = 0;
    let mut out = Vec::new();
    while pending.len() - at >= 4 {
        let len = i32::from_be_bytes(pending[at..at + 4].try_into().expect("4 bytes"));
        let Ok(len) = usize::try_from(len) else {
            break;
        };
        if pending.len() - at - 4 < len {
            break;
        }
        let frame = &mut pending[at + 4..at + 4 + len];
        let mut replaced = None;
        match dir {
            Direction::Requests(ids) if frame.len() >= 8 => {
                let api = i16::from_be_bytes([frame[0], frame[1]]);
                let version = i16::from_be_bytes([frame[2], frame[3]]);
                let corr = i32::from_be_bytes(frame[4..8].try_into().expect("4 bytes"));
                if api == API_METADATA || api == API_FIND_COORDINATOR || api == API_VERSIONS {
                    ids.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(corr, (api, version));
                }
            }
            Direction::Responses(ids, rw) if frame.len() >= 4 => {
                let corr = i32::from_be_bytes(frame[0..4].try_into().expect("4 bytes"));
                let tracked = ids.lock().unwrap_or_else(|e| e.into_inner()).remove(&corr);
                match tracked {
                    Some((API_VERSIONS, version)) if !rw.hide.is_empty() => {
                        replaced = hide_apis(frame, version, &rw.hide);
                    }
                    Some((API_VERSIONS, _)) | None => {}
                    Some(_) => rewrite_port(frame, rw),
                }
            }
            _ => {}
        }
        match replaced {
            Some(body) => {
                out.extend_from_slice(&(body.len() as i32).to_be_bytes());
                out.extend_from_slice(&body);
            }
            None => out.extend_from_slice(&pending[at..at + 4 + len]),
        }
        at += 4 + len;
    }
    pending.drain(..at);
    out
}

/// An ApiVersions response (`frame`: correlation id, then the body; its header is v0 in every
/// version) without the entries whose key is in `hide`; `None` if it does not parse (it is
/// then passed on as it is). Body: error_code INT16, api_keys ARRAY (from v3 a COMPACT_ARRAY,
/// each entry ending in a tag buffer) of api_key, min_version, max_version INT16, then fields
/// copied unchanged (throttle_time_ms, tags).
fn hide_apis(frame: &[u8], version: i16, hide: &[i16]) -> Option<Vec<u8>> {
    let flexible = version >= 3;
    let mut at = 6; // correlation id, error code
    let (count, header_end) = if flexible {
        let (n, used) = uvarint(frame.get(at..)?)?;
        (usize::try_from(n.checked_sub(1)?).ok()?, at + used)
    } else {
        let n = i32::from_be_bytes(frame.get(at..at + 4)?.try_into().ok()?);
        (usize::try_from(n).ok()?, at + 4)
    };
    at = header_end;
    let mut kept = Vec::new();
    let mut kept_count = 0usize;
    for _ in 0..count {
        let start = at;
        let key = i16::from_be_bytes(frame.get(at..at + 2)?.try_into().ok()?);
        at += 6;
        if flexible {
            let (tags, used) = uvarint(frame.get(at..)?)?;
            at += used;
            for _ in 0..tags {
                let (_, used) = uvarint(frame.get(at..)?)?;
                at += used;
                let (size, used) = uvarint(frame.get(at..)?)?;
                at = at
                    .checked_add(used)?
                    .checked_add(usize::try_from(size).ok()?)?;
            }
        }
        let entry = frame.get(start..at)?;
        if !hide.contains(&key) {
            kept.extend_from_slice(entry);
            kept_count += 1;
        }
    }
    let mut body = frame[..6].to_vec();
    if flexible {
        let mut n = kept_count as u64 + 1;
        while n >= 0x80 {
            body.push((n as u8) | 0x80);
            n >>= 7;
        }
        body.push(n as u8);
    } else {
        body.extend_from_slice(&(kept_count as i32).to_be_bytes());
    }
    body.extend_from_slice(&kept);
    body.extend_from_slice(frame.get(at..)?);
    Some(body)
}

/// An unsigned varint (Kafka's flexible versions): its value and its length in bytes.
fn uvarint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// Replaces the port after every occurrence of the upstream's host string.
fn rewrite_port(frame: &mut [u8], rw: &Rewrite) {
    let n = rw.needle.len();
    let mut i = 0;
    while i + n <= frame.len() {
        if frame[i..i + n] == rw.needle[..] {
            frame[i + n - 4..i + n].copy_from_slice(&rw.port);
            i += n;
        } else {
            i += 1;
        }
    }
}

async fn read(s: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        s.readable().await?;
        match s.try_read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

async fn write_all(s: &TcpStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        s.writable().await?;
        match s.try_write(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
        }
    }
    Ok(())
}

/// Passes a clean end of stream on (FIN), keeping the other direction open.
fn shutdown_write(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    #[allow(unsafe_code)]
    // SAFETY: shutdown(2) on a socket this process owns and keeps open; no memory is passed.
    unsafe {
        libc::shutdown(s.as_raw_fd(), libc::SHUT_WR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An echo server: what it reads it writes back.
    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn roundtrip(c: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
        c.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        c.read_exact(&mut got).await.unwrap();
        got
    }

    #[tokio::test]
    async fn bytes_pass_through_both_ways() {
        let p = Proxy::tcp(echo().await).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        let msg: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(roundtrip(&mut c, &msg).await, msg);
        // A clean end of stream passes on as one: the echo server closes, we read EOF.
        c.shutdown().await.unwrap();
        let mut rest = Vec::new();
        assert_eq!(c.read_to_end(&mut rest).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn cut_is_seen_as_a_reset_and_new_connections_work() {
        let p = Proxy::tcp(echo().await).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut c, b"before").await, b"before");
        p.inject(Fault::Cut);
        let mut buf = [0u8; 16];
        let err = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
            .await
            .expect("the cut reaches the client")
            .expect_err("a cut is a reset, not an end of stream");
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
        let mut c2 = TcpStream::connect(p.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut c2, b"after").await, b"after");
    }

    #[tokio::test]
    async fn blackhole_stalls_and_heal_delivers_what_was_held() {
        let p = Proxy::tcp(echo().await).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut c, b"ping").await, b"ping");
        p.inject(Fault::Blackhole);
        c.write_all(b"held").await.unwrap();
        let mut buf = [0u8; 4];
        let stalled =
            tokio::time::timeout(Duration::from_millis(500), c.read_exact(&mut buf)).await;
        assert!(stalled.is_err(), "a blackhole forwarded bytes");
        // New connections are accepted and stall too.
        let mut c2 = TcpStream::connect(p.addr()).await.unwrap();
        c2.write_all(b"new!").await.unwrap();
        p.heal();
        tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut buf))
            .await
            .expect("heal delivers the held bytes")
            .unwrap();
        assert_eq!(&buf, b"held");
        tokio::time::timeout(Duration::from_secs(10), c2.read_exact(&mut buf))
            .await
            .expect("heal connects the held connection")
            .unwrap();
        assert_eq!(&buf, b"new!");
    }

    #[tokio::test]
    async fn delay_and_throttle_slow_the_link_and_heal_restores_it() {
        let p = Proxy::tcp(echo().await).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        p.inject(Fault::Delay(Duration::from_millis(200)));
        let t = std::time::Instant::now();
        assert_eq!(roundtrip(&mut c, b"slow").await, b"slow");
        // One chunk each way, 200 ms each.
        assert!(
            t.elapsed() >= Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
        p.inject(Fault::Throttle(20_000));
        let msg = vec![7u8; 10_000];
        let t = std::time::Instant::now();
        assert_eq!(roundtrip(&mut c, &msg).await, msg);
        // 10 kB at 20 kB/s is half a second each way, pipelined: at least ~0.5 s.
        assert!(
            t.elapsed() >= Duration::from_millis(450),
            "{:?}",
            t.elapsed()
        );
        p.heal();
        let t = std::time::Instant::now();
        assert_eq!(roundtrip(&mut c, &msg).await, msg);
        assert!(
            t.elapsed() < Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn kafka_frames_rewrite_the_advertised_port_of_metadata_responses_only() {
        let ids: Arc<Mutex<HashMap<i32, (i16, i16)>>> = Arc::default();
        let rw = Rewrite {
            needle: [b"127.0.0.1".as_slice(), &9092i32.to_be_bytes()].concat(),
            port: 19092i32.to_be_bytes(),
            hide: Vec::new(),
        };
        let frame = |body: &[u8]| [&(body.len() as i32).to_be_bytes()[..], body].concat();
        // Metadata request (api 3, v1, correlation 7) and a Produce request (api 0, corr 8),
        // the first split across reads.
        let meta_req = frame(&[0, 3, 0, 1, 0, 0, 0, 7, 0xff, 0xff]);
        let produce_req = frame(&[0, 0, 0, 3, 0, 0, 0, 8]);
        let mut pending = meta_req[..5].to_vec();
        let req = Direction::Requests(ids.clone());
        assert!(take_frames(&mut pending, &req).is_empty());
        pending.extend_from_slice(&meta_req[5..]);
        pending.extend_from_slice(&produce_req);
        assert_eq!(
            take_frames(&mut pending, &req).len(),
            meta_req.len() + produce_req.len()
        );
        let broker = [&[0, 9][..], b"127.0.0.1", &9092i32.to_be_bytes()].concat();
        let resp = |corr: i32| frame(&[&corr.to_be_bytes()[..], &broker].concat());
        let mut pending = [resp(8), resp(7)].concat();
        let out = take_frames(&mut pending, &Direction::Responses(ids, rw));
        let rewritten = [&[0, 9][..], b"127.0.0.1", &19092i32.to_be_bytes()].concat();
        assert!(
            out[..resp(8).len()].ends_with(&broker),
            "a produce response is left alone"
        );
        assert!(
            out.ends_with(&rewritten),
            "the metadata response names the proxy"
        );
    }

    /// An ApiVersions v3 response (flexible: compact array, tag buffers) and a v0 one, each
    /// with Produce (0), EndTxn (26) and ApiVersions (18): hiding EndTxn removes its entry only.
    #[test]
    fn kafka_hiding_removes_the_hidden_apis_from_api_versions_responses() {
        let entry = |key: i16, flexible: bool| {
            let mut e = [key.to_be_bytes(), 0i16.to_be_bytes(), 5i16.to_be_bytes()].concat();
            if flexible {
                e.push(0); // no tags
            }
            e
        };
        let response = |corr: i32, flexible: bool, keys: &[i16]| {
            let mut b = [&corr.to_be_bytes()[..], &[0, 0]].concat();
            if flexible {
                b.push(keys.len() as u8 + 1);
            } else {
                b.extend_from_slice(&(keys.len() as i32).to_be_bytes());
            }
            for k in keys {
                b.extend_from_slice(&entry(*k, flexible));
            }
            b.extend_from_slice(&[0, 0, 0, 7]); // throttle_time_ms
            if flexible {
                b.extend_from_slice(&[1, 3, 1, 9]); // one tagged field (tag 3, 1 byte)
            }
            b
        };
        let frame = |body: &[u8]| [&(body.len() as i32).to_be_bytes()[..], body].concat();
        for (version, flexible) in [(3i16, true), (0, false)] {
            let ids: Arc<Mutex<HashMap<i32, (i16, i16)>>> = Arc::default();
            let req = [&[0, 18][..], &version.to_be_bytes(), &11i32.to_be_bytes()].concat();
            let mut pending = frame(&req);
            take_frames(&mut pending, &Direction::Requests(ids.clone()));
            let rw = Rewrite {
                needle: b"no such host".to_vec(),
                port: [0; 4],
                hide: vec![26],
            };
            let mut pending = frame(&response(11, flexible, &[0, 26, 18]));
            let out = take_frames(&mut pending, &Direction::Responses(ids, rw));
            assert_eq!(out, frame(&response(11, flexible, &[0, 18])), "v{version}");
            assert!(pending.is_empty());
            // Cut short anywhere in the entries, a response is left alone (None); past them the
            // rest is copied as it is. Never a panic.
            let whole = response(11, flexible, &[0, 26, 18]);
            let trailer = if flexible { 8 } else { 4 };
            for end in 0..whole.len() {
                let got = hide_apis(&whole[..end], version, &[26]);
                if end < whole.len() - trailer {
                    assert_eq!(got, None, "v{version} at {end}");
                }
            }
        }
    }
}
