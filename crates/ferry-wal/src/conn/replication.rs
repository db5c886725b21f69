//! The replication connection: PostgreSQL's frontend/backend protocol, spoken directly on top of
//! `postgres-protocol`, because the released tokio-postgres cannot open one.
//!
//! Startup with `replication=database`, authentication (cleartext, MD5, SCRAM-SHA-256), the
//! simple-query protocol for replication commands (`IDENTIFY_SYSTEM`, `START_REPLICATION`), and
//! CopyBoth streaming. postgres-protocol does not parse CopyBothResponse (`'W'`), so messages are
//! framed by the pure [`crate::frame`] (which also reads the COPY messages) and only the others
//! are handed to its parser. CopyData payloads are zero-copy slices of the read buffer.

use std::collections::HashMap;
use std::pin::Pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};
use postgres_protocol::message::{backend, frontend};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::config::{ConnectConfig, SslMode, TargetSessionAttrs};
use super::error::{timed, ReaderError, ServerError};
use super::net;
use super::tls;
use crate::frame::{self, StreamFrame};

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// How long [`ReplicationConnection::close`] waits for the server to end the stream.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Session settings that make the output plugin's text output deterministic, whatever the
/// server's defaults: timestamps in ISO form in UTC, bytea in hex, floats round-tripping.
const SESSION_SETTINGS: &[(&str, &str)] = &[
    ("client_encoding", "UTF8"),
    ("DateStyle", "ISO, MDY"),
    ("TimeZone", "UTC"),
    ("IntervalStyle", "postgres"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
];

/// [`SESSION_SETTINGS`] as SQL for an ordinary connection, so that what it reads as text reads
/// as the output plugin sends it (`ferry replay`).
pub fn session_settings_sql() -> String {
    SESSION_SETTINGS
        .iter()
        .map(|(k, v)| format!("SET {k} = '{v}';"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One frame read from the server.
pub(crate) enum Frame {
    /// A CopyData payload (during COPY BOTH: a replication message).
    CopyData(Bytes),
    /// Any other backend message.
    Other(backend::Message),
    /// CopyBothResponse: streaming started.
    CopyBoth,
    /// CopyDone: the server ended the copy.
    CopyDone,
}

/// A replication connection after startup and authentication.
pub struct ReplicationConnection {
    io: Pin<Box<dyn Io>>,
    read: BytesMut,
    write: BytesMut,
    /// `ParameterStatus` values the server reported (server_version, ...).
    pub parameters: HashMap<String, String>,
    /// The walsender's process id (`pg_stat_replication.pid`, `pg_replication_slots.active_pid`).
    pub backend_pid: i32,
    /// The TCP socket under `io` (also under TLS), for socket options; `None` on a Unix socket.
    tcp_fd: Option<std::os::fd::RawFd>,
}

impl std::fmt::Debug for ReplicationConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationConnection")
            .field("backend_pid", &self.backend_pid)
            .finish_non_exhaustive()
    }
}

impl ReplicationConnection {
    /// Connects, negotiates TLS per `sslmode`, starts a `replication=database` session and
    /// authenticates.
    ///
    /// With several hosts, each is tried in turn (each within `connect_timeout`) until one
    /// connects and suits `target_session_attrs`.
    pub async fn connect(cfg: &ConnectConfig) -> Result<ReplicationConnection, ReaderError> {
        let mut attempts = Vec::new();
        for target in cfg.targets() {
            match Self::connect_one(&target).await {
                Ok(conn) => return Ok(conn),
                Err(e) => attempts.push((target.server(), e)),
            }
        }
        Err(ReaderError::from_attempts(attempts))
    }

    async fn connect_one(cfg: &ConnectConfig) -> Result<ReplicationConnection, ReaderError> {
        let timeout = cfg.connect_timeout.unwrap_or(Duration::from_secs(3600));
        let what = "connecting to PostgreSQL for replication";
        let mut conn = timed(timeout, what, Self::connect_inner(cfg)).await?;
        conn.check_session_attrs(cfg).await?;
        Ok(conn)
    }

    /// Whether this server suits `target_session_attrs`, as libpq decides it: from the
    /// `default_transaction_read_only` and `in_hot_standby` the server reports at startup
    /// (PostgreSQL 14+), else by asking (`SHOW transaction_read_only`,
    /// `SELECT pg_is_in_recovery()`, which a `replication=database` session accepts).
    async fn check_session_attrs(&mut self, cfg: &ConnectConfig) -> Result<(), ReaderError> {
        let on = |v: Option<&String>| v.map(|v| v == "on");
        let (what, wanted) = match cfg.target_session_attrs {
            TargetSessionAttrs::Any => return Ok(()),
            TargetSessionAttrs::ReadWrite => {
                let read_only = match (
                    on(self.parameters.get("default_transaction_read_only")),
                    on(self.parameters.get("in_hot_standby")),
                ) {
                    (Some(d), Some(h)) => d || h,
                    _ => self.first_value("SHOW transaction_read_only").await? == "on",
                };
                if !read_only {
                    return Ok(());
                }
                ("read-only", "read-write")
            }
            TargetSessionAttrs::Primary => {
                let standby = match on(self.parameters.get("in_hot_standby")) {
                    Some(h) => h,
                    None => {
                        self.first_value("SELECT pg_catalog.pg_is_in_recovery()")
                            .await?
                            == "t"
                    }
                };
                if !standby {
                    return Ok(());
                }
                ("a standby (in recovery)", "primary")
            }
        };
        let server = cfg.server();
        self.close_quietly().await;
        Err(ReaderError::Unsuitable {
            server,
            what,
            wanted,
        })
    }

    async fn first_value(&mut self, sql: &str) -> Result<String, ReaderError> {
        let rows = self.simple_query(sql).await?;
        Ok(rows
            .first()
            .and_then(|r| r.first())
            .cloned()
            .flatten()
            .unwrap_or_default())
    }

    /// Ends a session that never streamed: Terminate, best effort.
    async fn close_quietly(&mut self) {
        frontend::terminate(&mut self.write);
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.flush()).await;
    }

    async fn connect_inner(cfg: &ConnectConfig) -> Result<ReplicationConnection, ReaderError> {
        let tls_config = tls::client_config(cfg)?;
        let mut tcp_fd = None;
        let io: Pin<Box<dyn Io>> = match net::open(cfg).await? {
            net::Socket::Unix(unix) => Box::pin(unix),
            net::Socket::Tcp(mut tcp, host) => {
                tcp_fd = Some(std::os::fd::AsRawFd::as_raw_fd(&tcp));
                match tls_config {
                    None => Box::pin(tcp),
                    Some(tls_config) => {
                        let mut buf = BytesMut::new();
                        frontend::ssl_request(&mut buf);
                        tcp.write_all(&buf)
                            .await
                            .map_err(ReaderError::io("sending SSLRequest"))?;
                        let answer = tcp
                            .read_u8()
                            .await
                            .map_err(ReaderError::io("reading the SSLRequest answer"))?;
                        match answer {
                            b'S' => {
                                let name = tls::server_name(&host)?;
                                let stream = tokio_rustls::TlsConnector::from(tls_config)
                                    .connect(name, tcp)
                                    .await
                                    .map_err(|e| match tls::rejected_certificate(&e) {
                                        Some(reason) => tls::certificate_error(reason, cfg),
                                        None => ReaderError::io("TLS handshake with PostgreSQL")(e),
                                    })?;
                                Box::pin(stream)
                            }
                            b'N' if cfg.sslmode == SslMode::Prefer => Box::pin(tcp),
                            b'N' => {
                                return Err(ReaderError::TlsRefused {
                                    server: cfg.server(),
                                    sslmode: cfg.sslmode.to_string(),
                                })
                            }
                            answer => return Err(ReaderError::UnexpectedSslAnswer { answer }),
                        }
                    }
                }
            }
        };
        let mut conn = ReplicationConnection {
            io,
            read: BytesMut::with_capacity(frame::READ_CHUNK),
            write: BytesMut::with_capacity(1024),
            parameters: HashMap::new(),
            backend_pid: 0,
            tcp_fd,
        };
        conn.startup(cfg).await?;
        Ok(conn)
    }

    async fn startup(&mut self, cfg: &ConnectConfig) -> Result<(), ReaderError> {
        let mut params: Vec<(&str, &str)> = vec![
            ("user", &cfg.user),
            ("database", &cfg.dbname),
            ("replication", "database"),
            ("application_name", &cfg.application_name),
        ];
        params.extend_from_slice(SESSION_SETTINGS);
        frontend::startup_message(params.iter().copied(), &mut self.write)
            .map_err(ReaderError::io("encoding the startup message"))?;
        self.flush().await?;
        self.authenticate(cfg).await?;
        loop {
            match self.next_frame().await? {
                Frame::Other(backend::Message::ParameterStatus(p)) => {
                    let name = p.name().map_err(ReaderError::io("ParameterStatus"))?;
                    let value = p.value().map_err(ReaderError::io("ParameterStatus"))?;
                    self.parameters.insert(name.to_owned(), value.to_owned());
                }
                Frame::Other(backend::Message::BackendKeyData(k)) => {
                    self.backend_pid = k.process_id()
                }
                Frame::Other(backend::Message::ReadyForQuery(_)) => return Ok(()),
                Frame::Other(backend::Message::NoticeResponse(_)) => {}
                Frame::Other(backend::Message::ErrorResponse(e)) => {
                    return Err(ReaderError::Server(startup_error(server_error(&e), cfg)))
                }
                other => return Err(unexpected(&other, "during startup")),
            }
        }
    }

    async fn authenticate(&mut self, cfg: &ConnectConfig) -> Result<(), ReaderError> {
        let auth_err = |reason: String| ReaderError::Auth {
            user: cfg.user.clone(),
            reason,
        };
        let password = |method: &str| {
            cfg.password
                .as_deref()
                .ok_or_else(|| auth_err(no_password(method, cfg)))
        };
        // The method the server asked for, named in its refusal.
        let mut method = None;
        loop {
            match self.next_frame().await? {
                Frame::Other(backend::Message::AuthenticationOk) => return Ok(()),
                Frame::Other(backend::Message::AuthenticationCleartextPassword) => {
                    method = Some("password");
                    frontend::password_message(password("password")?.as_bytes(), &mut self.write)
                        .map_err(ReaderError::io("encoding the password message"))?;
                    self.flush().await?;
                }
                Frame::Other(backend::Message::AuthenticationMd5Password(body)) => {
                    method = Some("md5");
                    let hash = postgres_protocol::authentication::md5_hash(
                        cfg.user.as_bytes(),
                        password("md5")?.as_bytes(),
                        body.salt(),
                    );
                    frontend::password_message(hash.as_bytes(), &mut self.write)
                        .map_err(ReaderError::io("encoding the password message"))?;
                    self.flush().await?;
                }
                Frame::Other(backend::Message::AuthenticationSasl(body)) => {
                    let mut has_scram = false;
                    let mut mechanisms = body.mechanisms();
                    while let Some(m) = fallible_next(&mut mechanisms)? {
                        has_scram |= m == SCRAM_SHA_256;
                    }
                    if !has_scram {
                        return Err(auth_err(
                            "the server offers no SASL mechanism Ferry supports (SCRAM-SHA-256)".into(),
                        ));
                    }
                    self.scram(password("SCRAM-SHA-256")?, &auth_err).await?;
                }
                Frame::Other(backend::Message::ErrorResponse(e)) => {
                    let e = server_error(&e);
                    let by = method.map_or(String::new(), |m| format!("by {m}: "));
                    return Err(if e.code.starts_with("28") && e.hint.is_some() {
                        auth_err(format!("{by}{e}"))
                    } else if e.code.starts_with("28") {
                        auth_err(format!("{by}{e}; check the user name and password, and pg_hba.conf"))
                    } else {
                        ReaderError::Server(e)
                    });
                }
                other => {
                    return Err(auth_err(format!(
                        "unsupported authentication request {} (Ferry supports password, md5 and SCRAM-SHA-256)",
                        describe(&other)
                    )))
                }
            }
        }
    }

    async fn scram(
        &mut self,
        password: &str,
        auth_err: &(dyn Fn(String) -> ReaderError + Sync),
    ) -> Result<(), ReaderError> {
        let mut scram = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
        frontend::sasl_initial_response(SCRAM_SHA_256, scram.message(), &mut self.write)
            .map_err(ReaderError::io("encoding SASLInitialResponse"))?;
        self.flush().await?;
        match self.next_frame().await? {
            Frame::Other(backend::Message::AuthenticationSaslContinue(body)) => {
                scram
                    .update(body.data())
                    .map_err(|e| auth_err(format!("SCRAM: {e}")))?;
            }
            Frame::Other(backend::Message::ErrorResponse(e)) => {
                return Err(auth_err(format!("by SCRAM-SHA-256: {}", server_error(&e))))
            }
            other => return Err(auth_err(format!("SCRAM: unexpected {}", describe(&other)))),
        }
        frontend::sasl_response(scram.message(), &mut self.write)
            .map_err(ReaderError::io("encoding SASLResponse"))?;
        self.flush().await?;
        match self.next_frame().await? {
            Frame::Other(backend::Message::AuthenticationSaslFinal(body)) => scram
                .finish(body.data())
                .map_err(|e| auth_err(format!("SCRAM: the server's proof is wrong: {e}"))),
            Frame::Other(backend::Message::ErrorResponse(e)) => Err(auth_err(format!(
                "by SCRAM-SHA-256: {}; check the password",
                server_error(&e)
            ))),
            other => Err(auth_err(format!("SCRAM: unexpected {}", describe(&other)))),
        }
    }

    /// Runs one simple query and returns its rows as text (replication commands such as
    /// `IDENTIFY_SYSTEM`). Errors are returned after the server is ready again.
    pub async fn simple_query(
        &mut self,
        sql: &str,
    ) -> Result<Vec<Vec<Option<String>>>, ReaderError> {
        frontend::query(sql, &mut self.write).map_err(ReaderError::io("encoding a query"))?;
        self.flush().await?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            match self.next_frame().await? {
                Frame::Other(backend::Message::DataRow(row)) => {
                    let buf = row.buffer();
                    let mut cols = Vec::new();
                    let mut ranges = row.ranges();
                    while let Some(r) = fallible_next(&mut ranges)? {
                        cols.push(r.map(|r| String::from_utf8_lossy(&buf[r]).into_owned()));
                    }
                    rows.push(cols);
                }
                Frame::Other(backend::Message::ErrorResponse(e)) => error = Some(server_error(&e)),
                Frame::Other(backend::Message::ReadyForQuery(_)) => {
                    return match error {
                        Some(e) => Err(ReaderError::Server(e)),
                        None => Ok(rows),
                    }
                }
                Frame::Other(_) => {}
                other => return Err(unexpected(&other, format!("in reply to {sql:?}"))),
            }
        }
    }

    /// Sends `START_REPLICATION` (built by the caller) and waits for CopyBothResponse.
    pub async fn start_copy_both(&mut self, command: &str) -> Result<(), ReaderError> {
        frontend::query(command, &mut self.write)
            .map_err(ReaderError::io("encoding START_REPLICATION"))?;
        self.flush().await?;
        loop {
            match self.next_frame().await? {
                Frame::CopyBoth => return Ok(()),
                Frame::Other(backend::Message::ErrorResponse(e)) => {
                    return Err(ReaderError::Server(server_error(&e)))
                }
                Frame::Other(backend::Message::NoticeResponse(_)) => {}
                other => return Err(unexpected(&other, "in reply to START_REPLICATION")),
            }
        }
    }

    /// Sets the socket's receive low-water mark (`SO_RCVLOWAT`): the socket reports readable
    /// only once `bytes` are queued, so a fast stream is read in large batches instead of one
    /// wake-up per message. Lowering it reports readable at once if enough is queued (Linux
    /// signals EPOLLIN when the mark is set). Returns false where it does not apply (a Unix
    /// socket) or the kernel refused it.
    pub fn set_read_low_watermark(&self, bytes: usize) -> bool {
        let Some(fd) = self.tcp_fd else {
            return false;
        };
        let value = libc::c_int::try_from(bytes)
            .unwrap_or(libc::c_int::MAX)
            .max(1);
        set_rcvlowat(fd, value)
    }

    /// The next CopyData payload of the stream. Cancel-safe: partial frames stay buffered.
    pub async fn recv_copy_data(&mut self) -> Result<Bytes, ReaderError> {
        loop {
            let frame = self.next_frame().await?;
            if let Some(data) = streaming_frame(frame)? {
                return Ok(data);
            }
        }
    }

    /// The next CopyData payload if a whole one is already buffered, without reading the
    /// socket: lets the caller handle everything one read brought before it waits again.
    pub fn buffered_copy_data(&mut self) -> Result<Option<Bytes>, ReaderError> {
        while let Some(frame) = self.parse_frame()? {
            if let Some(data) = streaming_frame(frame)? {
                return Ok(Some(data));
            }
        }
        Ok(None)
    }

    /// Bytes read from the socket and not yet taken as messages (the start of a partial one).
    pub fn buffered_bytes(&self) -> usize {
        self.read.len()
    }

    /// Sends one CopyData message (a standby status update) and flushes it.
    pub async fn send_copy_data(&mut self, payload: &[u8]) -> Result<(), ReaderError> {
        frame::encode_copy_data(payload, &mut self.write);
        self.flush().await
    }

    /// Ends the session politely, best effort: CopyDone, then — within [`CLOSE_TIMEOUT`] — reads
    /// (and drops) what the server still sends until it ends the copy and is ready for a query,
    /// and only then Terminate.
    ///
    /// The server handles messages in order, so once it is ready again it has applied
    /// everything sent before, the final standby status update included: when `close` returns
    /// the slot's `confirmed_flush_lsn` has moved. Closing the socket straight after the update
    /// would not promise that, and closing it with unread data pending makes the kernel reset
    /// the connection, which can discard the update on the server's side.
    pub async fn close(mut self) {
        frontend::copy_done(&mut self.write);
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
            self.flush().await?;
            loop {
                if let Frame::Other(
                    backend::Message::ReadyForQuery(_) | backend::Message::ErrorResponse(_),
                ) = self.next_frame().await?
                {
                    return Ok::<(), ReaderError>(());
                }
            }
        })
        .await;
        frontend::terminate(&mut self.write);
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.flush()).await;
    }

    async fn flush(&mut self) -> Result<(), ReaderError> {
        self.io
            .write_all(&self.write)
            .await
            .map_err(ReaderError::io("writing to PostgreSQL"))?;
        self.write.clear();
        self.io
            .flush()
            .await
            .map_err(ReaderError::io("writing to PostgreSQL"))
    }

    /// Reads until one whole frame is buffered. Cancel-safe.
    async fn next_frame(&mut self) -> Result<Frame, ReaderError> {
        loop {
            if let Some(frame) = self.parse_frame()? {
                return Ok(frame);
            }
            let n = self
                .io
                .read_buf(&mut self.read)
                .await
                .map_err(ReaderError::io("reading from PostgreSQL"))?;
            if n == 0 {
                return Err(ReaderError::Io {
                    context: "reading from PostgreSQL",
                    source: std::io::ErrorKind::UnexpectedEof.into(),
                });
            }
        }
    }

    /// The first whole message in the read buffer, if one is there (making room for the rest
    /// of a partial one, moving it to a new chunk only when it does not fit: [`frame::room_for`]).
    fn parse_frame(&mut self) -> Result<Option<Frame>, ReaderError> {
        let Some(raw) = frame::split(&mut self.read)? else {
            let total = frame::frame_len(&self.read)?;
            if let Some(more) = frame::room_for(self.read.len(), self.read.capacity(), total) {
                self.read.reserve(more);
            }
            return Ok(None);
        };
        Ok(Some(match StreamFrame::decode(raw)? {
            StreamFrame::CopyData(data) => Frame::CopyData(data),
            StreamFrame::CopyBothResponse(_) => Frame::CopyBoth,
            StreamFrame::CopyDone => Frame::CopyDone,
            StreamFrame::Other(raw) => {
                let tag = raw.tag();
                let mut message = raw.into_message();
                match backend::Message::parse(&mut message) {
                    Ok(Some(m)) if message.is_empty() => Frame::Other(m),
                    Ok(_) => {
                        return Err(ReaderError::Malformed {
                            tag,
                            reason: "postgres-protocol did not read the whole message".into(),
                        })
                    }
                    Err(e) => {
                        return Err(ReaderError::Malformed {
                            tag,
                            reason: e.to_string(),
                        })
                    }
                }
            }
        }))
    }
}

/// What a frame means during streaming: a payload, nothing (a notice), or the end of it.
fn streaming_frame(frame: Frame) -> Result<Option<Bytes>, ReaderError> {
    match frame {
        Frame::CopyData(data) => Ok(Some(data)),
        Frame::Other(backend::Message::NoticeResponse(_)) => Ok(None),
        Frame::Other(backend::Message::ErrorResponse(e)) => {
            Err(ReaderError::Server(server_error(&e)))
        }
        Frame::CopyDone => Err(ReaderError::StreamEnded),
        // A walsender stopping with the server (smart or fast shutdown) sends the
        // CommandComplete "COPY 0" with no CopyDone before it and exits (walsender.c
        // `WalSndDone`): the server ended the stream, a transient condition.
        Frame::Other(backend::Message::CommandComplete(_)) => Err(ReaderError::StreamEnded),
        other => Err(unexpected(&other, "during streaming")),
    }
}

#[allow(unsafe_code)]
fn set_rcvlowat(fd: std::os::fd::RawFd, value: libc::c_int) -> bool {
    // SAFETY: `fd` is the connection's own open TCP socket (owned by `io`, which lives as long
    // as the connection), and the option value is a c_int passed with its exact size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            std::ptr::addr_of!(value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    rc == 0
}

fn fallible_next<I>(it: &mut I) -> Result<Option<I::Item>, ReaderError>
where
    I: FallibleIterator<Error = std::io::Error>,
{
    it.next()
        .map_err(ReaderError::io("parsing a server message"))
}

/// Extracts the fields of an ErrorResponse.
pub(crate) fn server_error(body: &backend::ErrorResponseBody) -> ServerError {
    let mut e = ServerError {
        severity: String::new(),
        code: String::new(),
        message: String::new(),
        detail: None,
        hint: None,
    };
    let mut fields = body.fields();
    while let Ok(Some(f)) = fields.next() {
        let v = String::from_utf8_lossy(f.value_bytes()).into_owned();
        match f.type_() {
            b'S' if e.severity.is_empty() => e.severity = v,
            b'V' => e.severity = v,
            b'C' => e.code = v,
            b'M' => e.message = v,
            b'D' => e.detail = Some(v),
            b'H' => e.hint = Some(v),
            _ => {}
        }
    }
    e.with_fix()
}

/// Why there is no password for `method`, with where one can be given (and why the password
/// file did not give one, if it was ignored).
pub(crate) fn no_password(method: &str, cfg: &ConnectConfig) -> String {
    let mut why = format!(
        "the server asks for a password ({method}) and none is configured: set it in postgres.url, \
         postgres.password_file, PGPASSWORD or a password file (~/.pgpass, PGPASSFILE)"
    );
    if let Some(note) = &cfg.password_note {
        why.push_str("; ");
        why.push_str(note);
    }
    why
}

/// Adds the fix to a startup refusal that lacks one: a role without REPLICATION is refused a
/// walsender with no hint, worded "must be superuser or replication role to start walsender" up
/// to PostgreSQL 15 and "permission denied to start WAL sender" from 16 on; a role without
/// CONNECT on the database, "permission denied for database".
fn startup_error(mut e: ServerError, cfg: &ConnectConfig) -> ServerError {
    let walsender = e.message.contains("walsender") || e.message.contains("WAL sender");
    if e.code == "42501" && e.hint.is_none() && walsender {
        let role = crate::slot::quote_ident(&cfg.user);
        e.hint = Some(format!(
            "run ALTER ROLE {role} WITH REPLICATION as a superuser (on Amazon RDS: GRANT rds_replication TO {role})"
        ));
    }
    if e.hint.is_none() {
        e.hint = crate::slot::privileges::connect_refusal_hint(
            &e.code,
            &e.message,
            e.detail.as_deref(),
            &cfg.user,
            &cfg.dbname,
        );
    }
    e
}

/// A message that has no place where it came.
fn unexpected(frame: &Frame, during: impl Into<String>) -> ReaderError {
    ReaderError::UnexpectedMessage {
        message: describe(frame),
        during: during.into(),
    }
}

fn describe(frame: &Frame) -> &'static str {
    match frame {
        Frame::CopyData(_) => "CopyData",
        Frame::CopyBoth => "CopyBothResponse",
        Frame::CopyDone => "CopyDone",
        Frame::Other(m) => match m {
            backend::Message::AuthenticationGss
            | backend::Message::AuthenticationGssContinue(_) => "GSSAPI authentication",
            backend::Message::AuthenticationSspi => "SSPI authentication",
            backend::Message::AuthenticationKerberosV5 => "Kerberos V5 authentication",
            backend::Message::AuthenticationScmCredential => "SCM credential authentication",
            backend::Message::CommandComplete(_) => "CommandComplete",
            backend::Message::CopyOutResponse(_) => "CopyOutResponse",
            backend::Message::CopyInResponse(_) => "CopyInResponse",
            backend::Message::DataRow(_) => "DataRow",
            backend::Message::RowDescription(_) => "RowDescription",
            backend::Message::ReadyForQuery(_) => "ReadyForQuery",
            _ => "message",
        },
    }
}
