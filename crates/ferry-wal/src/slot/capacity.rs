//! How many replication slots and WAL senders the server has, and how many are taken.

use super::sql_error;
use crate::conn::error::ReaderError;

/// How many replication slots and WAL senders the server has, and how many are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub max_slots: i32,
    pub slots_used: i32,
    pub max_senders: i32,
    pub senders_used: i32,
}

/// Reads [`Capacity`]: `max_replication_slots` against `pg_replication_slots`, `max_wal_senders`
/// against the walsenders in `pg_stat_replication` (every role sees those rows).
pub async fn capacity(client: &tokio_postgres::Client) -> Result<Capacity, ReaderError> {
    let row = client
        .query_one(
            "SELECT current_setting('max_replication_slots')::int, \
                    (SELECT count(*) FROM pg_replication_slots)::int, \
                    current_setting('max_wal_senders')::int, \
                    (SELECT count(*) FROM pg_stat_replication)::int",
            &[],
        )
        .await
        .map_err(sql_error)?;
    Ok(Capacity {
        max_slots: row.get(0),
        slots_used: row.get(1),
        max_senders: row.get(2),
        senders_used: row.get(3),
    })
}
