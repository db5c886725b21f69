//! The ordinary SQL connection ([`connect_sql`]): the replication stream's hosts, sockets, TLS and
//! `target_session_attrs` check, and tokio-postgres's errors mapped into the reader's families.

use std::time::Duration;

use super::privileges;
use crate::conn::config::{ConnectConfig, Host, SslMode, TargetSessionAttrs};
use crate::conn::error::ReaderError;
use crate::conn::tls;

/// Opens an ordinary SQL connection with the same settings as the replication stream: the same
/// hosts tried in the same order, over sockets opened the same way, with the same TLS and the
/// same `target_session_attrs` check; the connection task runs on the current runtime.
pub async fn connect_sql(cfg: &ConnectConfig) -> Result<tokio_postgres::Client, ReaderError> {
    let mut attempts = Vec::new();
    for target in cfg.targets() {
        match connect_sql_one(&target).await {
            Ok(client) => return Ok(client),
            Err(e) => attempts.push((target.server(), e)),
        }
    }
    Err(ReaderError::from_attempts(attempts))
}

/// Asks the server to cancel what runs on the connection `token` is of: a query given up on
/// ([`crate::conn::answered`]) still runs on the server otherwise, and a backend waiting on a
/// lock (behind a partition's `DROP`, say) waits on, whoever asked. Best effort: the request
/// goes to each of `cfg`'s hosts in turn, each within the connect timeout; a server where
/// another backend has the process id ignores it (the secret key does not match).
pub async fn cancel_sql(cfg: &ConnectConfig, token: &tokio_postgres::CancelToken) {
    for target in cfg.targets() {
        let timeout = target.connect_timeout.unwrap_or(Duration::from_secs(10));
        let _ = tokio::time::timeout(timeout, cancel_one(&target, token)).await;
    }
}

/// [`cancel_sql`] in the background: the caller goes on (a new session, a new connection)
/// without waiting on a server that may not answer.
pub fn cancel_sql_soon(cfg: &ConnectConfig, token: tokio_postgres::CancelToken) {
    let cfg = cfg.clone();
    tokio::spawn(async move { cancel_sql(&cfg, &token).await });
}

async fn cancel_one(
    cfg: &ConnectConfig,
    token: &tokio_postgres::CancelToken,
) -> Result<(), ReaderError> {
    let tls_config = match cfg.host {
        Host::Unix(_) => None,
        Host::Tcp(_) => tls::client_config(cfg)?,
    };
    let sent = match (crate::conn::net::open(cfg).await?, tls_config) {
        (crate::conn::net::Socket::Unix(unix), _) => {
            token.cancel_query_raw(unix, tokio_postgres::NoTls).await
        }
        (crate::conn::net::Socket::Tcp(tcp, _), None) => {
            token.cancel_query_raw(tcp, tokio_postgres::NoTls).await
        }
        (crate::conn::net::Socket::Tcp(tcp, host), Some(tls_config)) => {
            token
                .cancel_query_raw(tcp, rustls(tls_config, &host)?)
                .await
        }
    };
    sent.map_err(sql_error)
}

/// TLS over rustls to `host` (the name the certificate must carry).
fn rustls(
    tls_config: std::sync::Arc<rustls::ClientConfig>,
    host: &str,
) -> Result<tls::RustlsConnect, ReaderError> {
    let connect = tokio_postgres::tls::MakeTlsConnect::<tokio::net::TcpStream>::make_tls_connect(
        &mut tls::MakeRustlsConnect::new(tls_config),
        host,
    )?;
    Ok(connect)
}

async fn connect_sql_one(cfg: &ConnectConfig) -> Result<tokio_postgres::Client, ReaderError> {
    let mut pg = tokio_postgres::Config::new();
    pg.user(&cfg.user)
        .dbname(&cfg.dbname)
        .application_name(&cfg.application_name)
        .ssl_mode(match cfg.sslmode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
    if let Some(p) = &cfg.password {
        pg.password(p);
    }
    let timeout = cfg.connect_timeout.unwrap_or(Duration::from_secs(3600));
    // TLS over a Unix socket is impossible (the configuration allows at most `prefer` there).
    let tls_config = match cfg.host {
        Host::Unix(_) => None,
        Host::Tcp(_) => tls::client_config(cfg)?,
    };
    let connect = async {
        let client = match (crate::conn::net::open(cfg).await?, tls_config) {
            (crate::conn::net::Socket::Unix(unix), _) => {
                let (client, conn) = pg
                    .connect_raw(unix, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| connect_error(e, cfg))?;
                tokio::spawn(conn);
                client
            }
            (crate::conn::net::Socket::Tcp(tcp, _), None) => {
                let (client, conn) = pg
                    .connect_raw(tcp, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| connect_error(e, cfg))?;
                tokio::spawn(conn);
                client
            }
            (crate::conn::net::Socket::Tcp(tcp, host), Some(tls_config)) => {
                let tls = rustls(tls_config, &host)?;
                let (client, conn) =
                    pg.connect_raw(tcp, tls).await.map_err(
                        |e| match tls::rejected_certificate(&e) {
                            Some(reason) => tls::certificate_error(reason, cfg),
                            None => connect_error(e, cfg),
                        },
                    )?;
                tokio::spawn(conn);
                client
            }
        };
        check_session_attrs(&client, cfg).await?;
        Ok(client)
    };
    crate::conn::error::timed(timeout, "connecting to PostgreSQL", connect).await
}

/// `target_session_attrs` on the SQL connection, by asking as libpq does with servers that do
/// not report their state (the replication connection reads the reported state).
async fn check_session_attrs(
    client: &tokio_postgres::Client,
    cfg: &ConnectConfig,
) -> Result<(), ReaderError> {
    let first = |rows: Vec<tokio_postgres::SimpleQueryMessage>| {
        rows.into_iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .unwrap_or_default()
    };
    let (what, wanted) = match cfg.target_session_attrs {
        TargetSessionAttrs::Any => return Ok(()),
        TargetSessionAttrs::ReadWrite => {
            let rows = client
                .simple_query("SHOW transaction_read_only")
                .await
                .map_err(sql_error)?;
            if first(rows) != "on" {
                return Ok(());
            }
            ("read-only", "read-write")
        }
        TargetSessionAttrs::Primary => {
            let rows = client
                .simple_query("SELECT pg_catalog.pg_is_in_recovery()")
                .await
                .map_err(sql_error)?;
            if first(rows) != "t" {
                return Ok(());
            }
            ("a standby (in recovery)", "primary")
        }
    };
    Err(ReaderError::Unsuitable {
        server: cfg.server(),
        what,
        wanted,
    })
}

/// A failed connection attempt of tokio-postgres, with its cause kept: the server's refusal
/// (authentication as [`ReaderError::Auth`]), the I/O error, or a missing password.
fn connect_error(e: tokio_postgres::Error, cfg: &ConnectConfig) -> ReaderError {
    if let Some(db) = e.as_db_error() {
        if db.code().code().starts_with("28") {
            let server = crate::conn::error::ServerError {
                severity: db.severity().to_string(),
                code: db.code().code().to_string(),
                message: db.message().to_string(),
                detail: db.detail().map(Into::into),
                hint: db.hint().map(Into::into),
            }
            .with_fix();
            let fix = if server.hint.is_some() {
                ""
            } else {
                "; check the user name and password, and pg_hba.conf"
            };
            return ReaderError::Auth {
                user: cfg.user.clone(),
                reason: format!("{server}{fix}"),
            };
        }
        let mut err = sql_error(e);
        if let ReaderError::Server(s) = &mut err {
            if s.hint.is_none() {
                s.hint = privileges::connect_refusal_hint(
                    &s.code,
                    &s.message,
                    s.detail.as_deref(),
                    &cfg.user,
                    &cfg.dbname,
                );
            }
        }
        return err;
    }
    let text = e.to_string();
    if text == "invalid configuration" && cfg.password.is_none() {
        // tokio-postgres: "password missing" when the server asks for one.
        return ReaderError::Auth {
            user: cfg.user.clone(),
            reason: crate::conn::replication::no_password("password, md5 or SCRAM-SHA-256", cfg),
        };
    }
    sql_error(e)
}

/// Maps a tokio-postgres error into the reader's families, keeping its cause (tokio-postgres
/// prints only its kind, "error connecting to server", and keeps the reason as the source).
pub fn sql_error(e: tokio_postgres::Error) -> ReaderError {
    if let Some(db) = e.as_db_error() {
        return ReaderError::Server(
            crate::conn::error::ServerError {
                severity: db.severity().to_string(),
                code: db.code().code().to_string(),
                message: db.message().to_string(),
                detail: db.detail().map(Into::into),
                hint: db.hint().map(Into::into),
            }
            .with_fix(),
        );
    }
    let mut text = e.to_string();
    let mut kind = std::io::ErrorKind::Other;
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            kind = io.kind();
        }
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    ReaderError::Io {
        context: "talking to PostgreSQL",
        source: std::io::Error::new(kind, text),
    }
}
