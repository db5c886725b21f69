//! The slot's row in `pg_replication_slots` ([`SlotState`]), and dropping a slot nothing streams.

use super::sql_error;
use crate::conn::error::ReaderError;
use crate::Lsn;

/// The slot as `pg_replication_slots` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotState {
    pub confirmed_flush_lsn: Lsn,
    pub restart_lsn: Lsn,
    pub active_pid: Option<i32>,
    pub wal_status: Option<String>,
    pub plugin: Option<String>,
    pub database: Option<String>,
    pub slot_type: String,
    /// `failover` (PostgreSQL 17+; `None` before).
    pub failover: Option<bool>,
    /// `synced`: a standby's copy of a primary's failover slot (PostgreSQL 17+).
    pub synced: Option<bool>,
}

/// The slot's row in `pg_replication_slots`, if it exists.
pub async fn slot_state(
    client: &tokio_postgres::Client,
    slot: &str,
) -> Result<Option<SlotState>, ReaderError> {
    let row = client
        .query_opt(
            // Columns newer than PostgreSQL 14 through to_jsonb, so one query serves every version.
            "SELECT confirmed_flush_lsn::text, restart_lsn::text, active_pid, wal_status, plugin, database::text, slot_type, \
                    (to_jsonb(s) ->> 'failover')::bool, (to_jsonb(s) ->> 'synced')::bool \
             FROM pg_replication_slots s WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(sql_error)?;
    Ok(row.map(|r| SlotState {
        confirmed_flush_lsn: lsn_col(r.get(0)),
        restart_lsn: lsn_col(r.get(1)),
        active_pid: r.get(2),
        wal_status: r.get(3),
        plugin: r.get(4),
        database: r.get(5),
        slot_type: r.get(6),
        failover: r.get(7),
        synced: r.get(8),
    }))
}

/// Drops `slot` once no process streams it (its walsender may take a moment to exit after the
/// replication connection closed), waiting at most `timeout`, for the server's answers too. A
/// slot already gone is fine. Only for a slot Ferry itself just created and never confirmed (a
/// failed first start).
pub async fn drop_inactive(
    client: &tokio_postgres::Client,
    slot: &str,
    timeout: std::time::Duration,
) -> Result<(), ReaderError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let dropped = drop_when_inactive(client, slot, deadline);
    crate::conn::error::timed(timeout, "dropping the slot", dropped).await
}

async fn drop_when_inactive(
    client: &tokio_postgres::Client,
    slot: &str,
    deadline: tokio::time::Instant,
) -> Result<(), ReaderError> {
    loop {
        let row = client
            .query_opt(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND active_pid IS NULL",
                &[&slot],
            )
            .await
            .map_err(sql_error)?;
        let state = slot_state(client, slot).await?;
        if state.is_none() {
            return Ok(());
        }
        if row.is_some() || tokio::time::Instant::now() >= deadline {
            // Dropped by the query above only if it is gone now; still active past the deadline.
            return Err(ReaderError::SlotInUse {
                slot: slot.to_string(),
                pid: state.and_then(|st| st.active_pid).unwrap_or(0),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

pub(super) fn lsn_col(v: Option<String>) -> Lsn {
    v.and_then(|s| s.parse().ok()).unwrap_or(Lsn::ZERO)
}
