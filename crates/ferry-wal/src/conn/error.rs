//! The reader's errors, in two families (CONVENTIONS.md "Two error families"):
//!
//! - **transient**: the network, a restarting server, a slot held by another Ferry. The caller
//!   reconnects with backoff and resumes from the slot's `confirmed_flush_lsn`.
//! - **permanent**: configuration, privileges, an invalidated slot, bytes that do not decode.
//!   The caller stops, exits non-zero, and advances nothing. Every permanent error says how to
//!   fix it.
//!
//! A server that breaks the protocol and a bug in Ferry have variants of their own (framing,
//! malformed and unexpected messages, a rewound confirmation, a failed reader task), never a
//! free-form string: [`ReaderError::is_transient`] classifies each by its type.

use std::io;

use crate::Lsn;

/// An error the server sent (ErrorResponse), with its SQLSTATE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    pub severity: String,
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} (SQLSTATE {})",
            self.severity, self.message, self.code
        )?;
        if let Some(d) = &self.detail {
            write!(f, "; detail: {d}")?;
        }
        if let Some(h) = &self.hint {
            write!(f, "; hint: {h}")?;
        }
        Ok(())
    }
}

impl ServerError {
    /// Whether retrying later can succeed.
    pub fn is_transient(&self) -> bool {
        let class = self.code.get(..2).unwrap_or("");
        match self.code.as_str() {
            // admin_shutdown, crash_shutdown, cannot_connect_now, idle_session_timeout
            "57P01" | "57P02" | "57P03" | "57P05" => return true,
            // object_in_use: "replication slot ... is active for PID ..."
            "55006" => return true,
            // object_not_in_prerequisite_state: an invalidated slot, or wal_level too low.
            "55000" => return false,
            // configuration_limit_exceeded: "all replication slots are in use". Retrying waits for
            // someone to drop a slot; the operator has to act, so say it once, loudly.
            "53400" => return false,
            // too_many_connections is transient, except the walsender limit: "number of requested
            // standby connections exceeds max_wal_senders" holds until the setting changes or
            // another consumer goes away.
            "53300" if self.message.contains("max_wal_senders") => return false,
            _ => {}
        }
        // 08 connection, 53 resources (too many connections), 58 system/I-O, 40 rollback
        matches!(class, "08" | "53" | "58" | "40" | "57" | "XX")
    }
}

impl ServerError {
    /// Adds the fix to refusals the server sends without a hint.
    pub(crate) fn with_fix(mut self) -> ServerError {
        if self.hint.is_none() && self.code == "53300" && self.message.contains("max_wal_senders") {
            self.hint = Some(
                "every WAL sender is taken: stop a replication consumer you no longer need (see pg_stat_replication), \
                 or raise max_wal_senders and restart PostgreSQL (`ferry check` shows how many are in use)"
                    .into(),
            );
        }
        if self.code == "53400" && self.message.contains("replication slots") {
            // The server's own hint ("Free one or increase max_replication_slots.") names no query.
            self.hint = Some(
                "every replication slot is taken: drop one nothing uses (SELECT slot_name, active, \
                 confirmed_flush_lsn FROM pg_replication_slots; SELECT pg_drop_replication_slot('name')), \
                 or raise max_replication_slots and restart PostgreSQL"
                    .into(),
            );
        }
        if self.hint.is_none()
            && self.code == "28000"
            && self.message.contains("no pg_hba.conf entry")
        {
            self.hint = Some(
                if self.message.contains("no encryption") {
                    "the server accepts this connection only over TLS (a hostssl line in pg_hba.conf): \
                     set sslmode=verify-full with sslrootcert=/path/to/ca.pem (or at least sslmode=require)"
                } else {
                    "add a pg_hba.conf line for this user, database and client address (or connect as a user it allows)"
                }
                .into(),
            );
        }
        self
    }
}

/// Everything that can go wrong reading the replication stream.
#[derive(Debug, thiserror::Error)]
pub enum ReaderError {
    #[error(transparent)]
    Config(#[from] super::config::ConfigError),
    #[error("TLS setup: {0}")]
    TlsSetup(#[from] super::tls::TlsSetupError),
    #[error("{context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("timed out after {secs}s {what}")]
    Timeout { what: &'static str, secs: u64 },
    /// The host name does not resolve (DNS).
    #[error("cannot resolve the host name {host:?}: {source}; check the host in postgres.url and this machine's DNS")]
    Resolve {
        host: String,
        #[source]
        source: io::Error,
    },
    /// The TCP (or Unix-socket) connection failed: refused, unreachable, reset.
    #[error("the connection to {server} failed: {source}")]
    Connect {
        server: String,
        #[source]
        source: io::Error,
    },
    /// The server accepted the connection but is not the kind `target_session_attrs` asks for
    /// (a standby, or read-only): the next host is tried, and after a failover one will be.
    #[error("{server} is {what}, and target_session_attrs={wanted} asks for a {wanted} server")]
    Unsuitable {
        server: String,
        what: &'static str,
        wanted: &'static str,
    },
    /// Every host of a connection string with several failed; each with its error, in order.
    #[error("no host could be used: {}", .0.iter().map(|(server, e)| format!("{server}: {e}")).collect::<Vec<_>>().join("; "))]
    Hosts(Vec<(String, ReaderError)>),
    #[error("the server at {server} does not accept TLS but sslmode={sslmode} requires it; enable ssl on the server or lower sslmode")]
    TlsRefused { server: String, sslmode: String },
    #[error("the TLS certificate of {server} was rejected (sslmode={sslmode}): {reason}; {fix}")]
    TlsCertificate {
        server: String,
        sslmode: String,
        reason: String,
        fix: String,
    },
    #[error("authentication as {user:?} failed: {reason}")]
    Auth { user: String, reason: String },
    #[error("PostgreSQL {0}")]
    Server(ServerError),
    #[error("unexpected answer {answer:#x} to SSLRequest (expected 'S' or 'N'): the server at that address is not a PostgreSQL server, or a proxy in between mangles the connection")]
    UnexpectedSslAnswer { answer: u8 },
    #[error(transparent)]
    Frame(#[from] crate::frame::FrameError),
    #[error("malformed message '{}' from the server: {reason}", char::from(*.tag))]
    Malformed { tag: u8, reason: String },
    #[error("protocol violation: unexpected {message} {during}")]
    UnexpectedMessage {
        message: &'static str,
        during: String,
    },
    #[error("IDENTIFY_SYSTEM shows no database: the connection is not a logical replication connection (Ferry connects with replication=database; check that no pooler such as PgBouncer sits between Ferry and PostgreSQL)")]
    NotLogicalReplication,
    #[error("server_version_num is {shown:?}, not a number: Ferry talks to PostgreSQL itself, not to a proxy that answers SHOW differently")]
    ServerVersion { shown: String },
    #[error("bug in Ferry: {0}; please report it")]
    Rewind(#[from] crate::feedback::RewindError),
    #[error("bug in Ferry: the reader task failed ({reason}); please report it")]
    TaskFailed { reason: String },
    #[error(transparent)]
    Wire(#[from] crate::wire::WireError),
    #[error(transparent)]
    Decode(#[from] crate::pgoutput::DecodeError),
    #[error(transparent)]
    Assembly(#[from] crate::assembly::AssemblyError),
    #[error("the server ended the replication stream")]
    StreamEnded,
    #[error(
        "replication slot {slot:?} is in use by another process (pid {pid}); another Ferry may be streaming it \
         (this instance stands by), or terminate it with SELECT pg_terminate_backend({pid})"
    )]
    SlotInUse { slot: String, pid: i32 },
    #[error(
        "replication slot {slot:?} has confirmed_flush_lsn {confirmed} beyond the resume point {resume}: \
         something other than Ferry advanced the slot, and the transactions between were skipped. \
         Find who consumed or advanced the slot; if the skipped events are not needed, restart Ferry to accept the new position"
    )]
    SlotAdvancedPastResume {
        slot: String,
        resume: Lsn,
        confirmed: Lsn,
    },
    #[error("the reader's caller went away")]
    Closed,
    /// The server sent nothing on the replication connection for the receive timeout, not even
    /// a reply it was asked for ([`crate::feedback::Silence`]).
    #[error(
        "the server sent nothing on the replication connection for {after:?}, not even a reply \
         it was asked for (postgres.receive_timeout): the connection is taken for lost, and Ferry \
         reconnects. If the server or the network was down, nothing needs doing; if the \
         server was only busy, raise postgres.receive_timeout"
    )]
    Silent { after: std::time::Duration },
    /// A query of a session's set-up (the slot, the server, the tables, `START_REPLICATION`)
    /// got no answer within the receive timeout ([`answered`]).
    #[error(
        "the server did not answer {what} within {after:?} (postgres.receive_timeout): the \
         connection is taken for lost, and Ferry reconnects. If the server or the network was \
         down, nothing needs doing; if the server was only busy, raise postgres.receive_timeout"
    )]
    Unanswered {
        what: &'static str,
        after: std::time::Duration,
    },
}

/// `fut`'s outcome, or [`ReaderError::Timeout`] naming `what` once `timeout` has passed (the
/// bounds of connecting: `postgres.connect_timeout`; of dropping a slot: its own).
pub(crate) async fn timed<T>(
    timeout: std::time::Duration,
    what: &'static str,
    fut: impl std::future::Future<Output = Result<T, ReaderError>>,
) -> Result<T, ReaderError> {
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| ReaderError::Timeout {
            what,
            secs: timeout.as_secs(),
        })?
}

/// `query`'s answer, waited for at most `within` (`None`: as long as it takes): a server that
/// vanished without closing the connection (a host gone, a dropped route, a proxy whose server
/// died) leaves a query unanswered until TCP gives up, ~15 minutes, or forever through a proxy.
/// Past `within`, [`ReaderError::Unanswered`] (transient: the connection is dropped, and the
/// next session connects afresh). For the queries a session asks before it streams, each of
/// which a live server answers in milliseconds; not for those that may wait on other
/// transactions (creating the slot or the publication).
pub async fn answered<T, E: From<ReaderError>>(
    within: Option<std::time::Duration>,
    what: &'static str,
    query: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, E> {
    // Zero is "never", as for the stream's silence.
    let Some(after) = within.filter(|t| !t.is_zero()) else {
        return query.await;
    };
    match tokio::time::timeout(after, query).await {
        Ok(answer) => answer,
        Err(_) => Err(ReaderError::Unanswered { what, after }.into()),
    }
}

impl ReaderError {
    /// Whether reconnecting later can succeed (see the module docs).
    pub fn is_transient(&self) -> bool {
        match self {
            ReaderError::Io { .. }
            | ReaderError::Timeout { .. }
            | ReaderError::Resolve { .. }
            | ReaderError::Connect { .. }
            | ReaderError::Unsuitable { .. }
            | ReaderError::StreamEnded
            | ReaderError::Silent { .. }
            | ReaderError::Unanswered { .. }
            | ReaderError::SlotInUse { .. } => true,
            ReaderError::Server(e) => e.is_transient(),
            // Every other variant by name, so a new one cannot join a family by default.
            ReaderError::Config(_)
            | ReaderError::TlsSetup(_)
            | ReaderError::TlsRefused { .. }
            | ReaderError::TlsCertificate { .. }
            | ReaderError::Auth { .. }
            | ReaderError::SlotAdvancedPastResume { .. }
            | ReaderError::Closed => false,
            // One host down and another refusing the password: the first may come back (a
            // failover in progress), so retry.
            ReaderError::Hosts(attempts) => attempts.iter().any(|(_, e)| e.is_transient()),
            // The server broke the protocol, or Ferry has a bug: reconnecting replays the same
            // bytes into the same code, so the reader stops instead of looping.
            ReaderError::UnexpectedSslAnswer { .. }
            | ReaderError::Frame(_)
            | ReaderError::Malformed { .. }
            | ReaderError::UnexpectedMessage { .. }
            | ReaderError::NotLogicalReplication
            | ReaderError::ServerVersion { .. }
            | ReaderError::Wire(_)
            | ReaderError::Decode(_)
            | ReaderError::Assembly(_)
            | ReaderError::Rewind(_)
            | ReaderError::TaskFailed { .. } => false,
        }
    }

    /// Whether the error says the server is away rather than refusing: down, restarting or
    /// shutting down, in recovery where `target_session_attrs` asks for another kind, or not
    /// reachable (what a restart or a failover shows while it lasts). An attempt to connect
    /// again soon then costs the server nothing, or a start-up it turns away. A refusal (a
    /// password, too many connections, TLS) is not such an error: trying it often would only
    /// repeat it, and a refused password many times over can lock the role out.
    pub fn is_server_away(&self) -> bool {
        match self {
            ReaderError::Io { .. }
            | ReaderError::Timeout { .. }
            | ReaderError::Resolve { .. }
            | ReaderError::Connect { .. }
            | ReaderError::Silent { .. }
            | ReaderError::Unanswered { .. }
            | ReaderError::Unsuitable { .. } => true,
            // admin_shutdown, crash_shutdown, cannot_connect_now (starting up, shutting down,
            // in recovery).
            ReaderError::Server(e) => matches!(e.code.as_str(), "57P01" | "57P02" | "57P03"),
            ReaderError::Hosts(attempts) => attempts.iter().all(|(_, e)| e.is_server_away()),
            _ => false,
        }
    }

    /// The outcome of trying every host in turn: the one error when there was one host.
    pub(crate) fn from_attempts(mut attempts: Vec<(String, ReaderError)>) -> ReaderError {
        if attempts.len() == 1 {
            return attempts.remove(0).1;
        }
        ReaderError::Hosts(attempts)
    }

    pub(crate) fn io(context: &'static str) -> impl FnOnce(io::Error) -> ReaderError {
        move |source| ReaderError::Io { context, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str, message: &str) -> ReaderError {
        ReaderError::Server(ServerError {
            severity: "FATAL".into(),
            code: code.into(),
            message: message.into(),
            detail: None,
            hint: None,
        })
    }

    fn refused() -> ReaderError {
        ReaderError::Connect {
            server: "127.0.0.1:5432".into(),
            source: io::Error::from(io::ErrorKind::ConnectionRefused),
        }
    }

    #[test]
    fn a_server_away_is_told_from_one_that_refuses() {
        let away = [
            refused(),
            ReaderError::Timeout {
                what: "connecting to PostgreSQL",
                secs: 10,
            },
            ReaderError::Io {
                context: "reading",
                source: io::Error::from(io::ErrorKind::ConnectionReset),
            },
            server("57P03", "the database system is starting up"),
            ReaderError::Silent {
                after: std::time::Duration::from_secs(60),
            },
            ReaderError::Unanswered {
                what: "START_REPLICATION",
                after: std::time::Duration::from_secs(60),
            },
            server(
                "57P01",
                "terminating connection due to administrator command",
            ),
            ReaderError::Hosts(vec![("a".into(), refused()), ("b".into(), refused())]),
        ];
        for e in &away {
            assert!(e.is_server_away(), "{e}");
            assert!(e.is_transient(), "{e}");
        }
        let refusing = [
            ReaderError::Auth {
                user: "ferry".into(),
                reason: "password authentication failed".into(),
            },
            server("53300", "sorry, too many clients already"),
            server("55006", "replication slot \"s\" is active for PID 1"),
            ReaderError::StreamEnded,
            // One host down, the other refusing the password: the refusal is what repeats.
            ReaderError::Hosts(vec![
                ("a".into(), refused()),
                (
                    "b".into(),
                    ReaderError::Auth {
                        user: "ferry".into(),
                        reason: "password authentication failed".into(),
                    },
                ),
            ]),
        ];
        for e in &refusing {
            assert!(!e.is_server_away(), "{e}");
        }
    }

    #[test]
    fn protocol_violations_and_bugs_are_permanent_and_say_what_they_are() {
        let rewind = crate::feedback::RewindError {
            current: Lsn(0x20),
            requested: Lsn(0x10),
        };
        let frame =
            crate::frame::split(&mut bytes::BytesMut::from(&b"d\xff\xff\xff\xff"[..])).unwrap_err();
        let cases: Vec<(ReaderError, &str)> = vec![
            (
                ReaderError::Frame(frame),
                "message 'd' from the server: invalid length -1",
            ),
            (
                ReaderError::UnexpectedSslAnswer { answer: b'E' },
                "not a PostgreSQL server",
            ),
            (
                ReaderError::UnexpectedMessage {
                    message: "DataRow",
                    during: "during streaming".into(),
                },
                "unexpected DataRow during streaming",
            ),
            (ReaderError::NotLogicalReplication, "replication=database"),
            (
                ReaderError::ServerVersion { shown: "x".into() },
                "not a number",
            ),
            (
                ReaderError::Rewind(rewind),
                "bug in Ferry: confirmation rewinds",
            ),
            (
                ReaderError::TaskFailed {
                    reason: "panicked".into(),
                },
                "bug in Ferry",
            ),
        ];
        for (e, says) in cases {
            assert!(!e.is_transient(), "{e}");
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    #[tokio::test]
    async fn a_query_unanswered_within_the_bound_is_a_transient_error_naming_it() {
        use std::time::Duration;
        let never = std::future::pending::<Result<(), ReaderError>>();
        let err = answered(Some(Duration::from_millis(10)), "the slot", never)
            .await
            .expect_err("never answered");
        assert!(
            matches!(
                err,
                ReaderError::Unanswered {
                    what: "the slot",
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("did not answer the slot within 10ms"),
            "{err}"
        );
        let zero = answered(Some(Duration::ZERO), "x", async { Ok::<_, ReaderError>(5) });
        assert_eq!(zero.await.unwrap(), 5);
        // An answer within the bound is the answer, an error included; no bound: waited for.
        let answer = answered(Some(Duration::from_secs(60)), "x", async {
            Ok::<_, ReaderError>(7)
        });
        assert_eq!(answer.await.unwrap(), 7);
        let refused = answered(Some(Duration::from_secs(60)), "x", async {
            Err::<(), _>(ReaderError::Closed)
        });
        assert!(matches!(refused.await, Err(ReaderError::Closed)));
        assert_eq!(
            answered(None, "x", async { Ok::<_, ReaderError>(3) })
                .await
                .unwrap(),
            3
        );
    }
}
