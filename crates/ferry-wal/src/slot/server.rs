//! What the server is and where its WAL stands, read over SQL: its identity, version and recovery
//! state, its WAL position with its clock, and whether the current role may replicate.

use super::sql_error;
use super::state::lsn_col;
use crate::conn::error::ReaderError;
use crate::Lsn;

/// The server's current WAL insert position (`pg_current_wal_lsn()`).
pub async fn current_wal_lsn(client: &tokio_postgres::Client) -> Result<Lsn, ReaderError> {
    let row = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .map_err(sql_error)?;
    Ok(lsn_col(row.get(0)))
}

/// The server's system identifier and timeline over SQL, so that Ferry knows which server it
/// talks to before it touches the slot (every role may call these functions). The identifier is
/// `pg_control_system()`'s. The timeline is that of the current WAL segment's name on a
/// primary (exact at once after a promotion, when the latest checkpoint may still be on the old
/// timeline); a standby has no current WAL position, so there it is the latest checkpoint's.
pub async fn system_identity(
    client: &tokio_postgres::Client,
) -> Result<crate::conn::SystemIdentity, ReaderError> {
    let row = client
        .query_one(
            "SELECT (SELECT system_identifier::text FROM pg_control_system()), \
                    CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint()) \
                         ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END",
            &[],
        )
        .await
        .map_err(sql_error)?;
    let id: String = row.get(0);
    Ok(crate::conn::SystemIdentity {
        system_id: id
            .parse()
            .map_err(|_| ReaderError::ServerVersion { shown: id.clone() })?,
        timeline: row.get::<_, i32>(1) as u32,
    })
}

/// Whether the server is a standby (`pg_is_in_recovery()`).
pub async fn in_recovery(client: &tokio_postgres::Client) -> Result<bool, ReaderError> {
    Ok(client
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .map_err(sql_error)?
        .get(0))
}

/// The current role, and whether it may start a walsender: the REPLICATION attribute,
/// superuser, or (Amazon RDS) membership in `rds_replication`. PostgreSQL checks it only when a
/// replication connection starts, so a role that loses it streams on until the next one.
pub async fn replication_privilege(
    client: &tokio_postgres::Client,
) -> Result<(String, bool), ReaderError> {
    let role = client
        .query_one(
            "SELECT current_user::text, r.rolreplication OR r.rolsuper OR \
               (EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication') \
                AND pg_has_role(current_user, 'rds_replication', 'member')) \
             FROM pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await
        .map_err(sql_error)?;
    Ok((role.get(0), role.get(1)))
}

/// The server's clock (Unix microseconds), then `pg_current_wal_lsn()`, read in that order: a
/// transaction whose commit record lies past that LSN wrote it after that time, so its commit
/// timestamp is at most the moment between taking it and writing the record earlier.
pub async fn wal_clock(client: &tokio_postgres::Client) -> Result<(Lsn, i64), ReaderError> {
    let row = client
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8, pg_current_wal_lsn()::text",
            &[],
        )
        .await
        .map_err(sql_error)?;
    Ok((lsn_col(row.get(1)), row.get(0)))
}

/// The server's `wal_sender_timeout` for this role (`None`: off). While a walsender decodes
/// changes it sends nothing for, it reads its client's messages (and so answers a request for a
/// reply) only every half of it (PostgreSQL 14.4+; [`crate::feedback::Silence`]).
pub async fn wal_sender_timeout(
    client: &tokio_postgres::Client,
) -> Result<Option<std::time::Duration>, ReaderError> {
    let ms: i64 = client
        .query_one(
            "SELECT setting::int8 FROM pg_settings WHERE name = 'wal_sender_timeout'",
            &[],
        )
        .await
        .map_err(sql_error)?
        .get(0);
    Ok((ms > 0).then(|| std::time::Duration::from_millis(ms as u64)))
}

/// The server's `server_version_num` (e.g. 150004).
pub async fn server_version_num(client: &tokio_postgres::Client) -> Result<i32, ReaderError> {
    let v: String = client
        .query_one("SHOW server_version_num", &[])
        .await
        .map_err(sql_error)?
        .get(0);
    v.trim()
        .parse()
        .map_err(|_| ReaderError::ServerVersion { shown: v.clone() })
}

/// A backend on the server, told apart from a later one given the same pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    pub pid: i32,
    /// `backend_start`, in microseconds since the epoch.
    started: i64,
}

const BACKEND_START_MICROS: &str = "(extract(epoch FROM backend_start) * 1000000)::int8";

/// Backend `pid` (`None`: the connection's own, `pg_backend_pid()`), if it is there.
pub async fn backend(
    client: &tokio_postgres::Client,
    pid: Option<i32>,
) -> Result<Option<Backend>, ReaderError> {
    let row = client
        .query_opt(
            &format!(
                "SELECT pid, {BACKEND_START_MICROS} FROM pg_stat_activity \
                 WHERE pid = coalesce($1, pg_backend_pid())"
            ),
            &[&pid],
        )
        .await
        .map_err(sql_error)?;
    // The start is hidden (NULL) from a role that may not see the backend: not found.
    Ok(row.and_then(|r| {
        Some(Backend {
            pid: r.get(0),
            started: r.get::<_, Option<i64>>(1)?,
        })
    }))
}

/// Ends `backend` (`pg_terminate_backend`), from another connection of the same role: `None`
/// when it is gone already, else whether the server signalled it and, with `wait`, saw it exit
/// within that (PostgreSQL 14+). Its transaction is rolled back and what it held let go (a
/// replication slot, locks). A backend waiting for its client's `COPY` data does not take a
/// cancel, only this.
pub async fn end_backend(
    client: &tokio_postgres::Client,
    backend: &Backend,
    wait: std::time::Duration,
) -> Result<Option<bool>, ReaderError> {
    let wait_ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
    let row = client
        .query_opt(
            &format!(
                "SELECT pg_terminate_backend(pid, $3) FROM pg_stat_activity \
                 WHERE pid = $1 AND {BACKEND_START_MICROS} = $2"
            ),
            &[&backend.pid, &backend.started, &wait_ms],
        )
        .await
        .map_err(sql_error)?;
    Ok(row.map(|r| r.get(0)))
}
