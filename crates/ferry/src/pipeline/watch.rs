//! What a session watches on the server while it streams: the WAL position (the lag metric) and
//! the server's clock with it, the role's REPLICATION attribute, and the publication's coverage
//! of the outbox tables.

use std::sync::Arc;
use std::time::Duration;

use ferry_wal::{slot, Lsn};

use super::PipelineError;
use crate::telemetry::Metrics;

/// The server's clock sampled with its WAL position ([`slot::wal_clock`]), newest last.
pub(super) type WalClock = Arc<std::sync::Mutex<std::collections::VecDeque<(Lsn, i64)>>>;

/// Samples kept: a minute's at the default lag sample interval.
pub(super) const WAL_CLOCK_SAMPLES: usize = 12;

/// What [`watch_server`] watches the publication with: the tables' spec, how the publication
/// covered each when the session started, and where to say which table's coverage changed, and
/// how ([`PipelineError::PublicationChanged`]), or which table it lists that no entry relays
/// ([`PipelineError::UnrelayedTable`]).
pub(super) type MembershipWatch = (
    slot::SlotSpec,
    Vec<Option<String>>,
    tokio::sync::oneshot::Sender<PipelineError>,
);

/// Samples `pg_current_wal_lsn()` for the WAL lag metric, warns when the role loses the
/// REPLICATION attribute (before the next connection fails on it), and watches that the publication
/// still covers the outbox table as it did when the session started
/// ([`slot::publication_membership`]): a table dropped and recreated, or taken out of the
/// publication (and perhaps added back), means rows the stream never carried, which must stop
/// Ferry rather than pass unnoticed. A failed query is skipped (the replication connection
/// reports a lost server).
pub(super) async fn watch_server(
    sql: Arc<tokio_postgres::Client>,
    metrics: Arc<Metrics>,
    every: Duration,
    (spec, membership, left): MembershipWatch,
    wal_clock: WalClock,
) {
    let mut left = Some(left);
    let mut could_replicate = true;
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        // On a standby there is no current WAL position (and no clock sample).
        if let Ok((lsn, micros)) = slot::wal_clock(&sql).await {
            metrics.set_server_wal_lsn(lsn.0);
            let mut samples = wal_clock.lock().unwrap_or_else(|p| p.into_inner());
            if samples.len() == WAL_CLOCK_SAMPLES {
                samples.pop_front();
            }
            samples.push_back((lsn, micros));
        }
        // Said once per loss: streaming goes on, but the next connection will be refused.
        if let Ok((role, can)) = slot::replication_privilege(&sql).await {
            if could_replicate && !can {
                tracing::warn!(
                    role = %role,
                    "role {role:?} no longer has the REPLICATION attribute: this session streams on, but the \
                     next connection (a restart, a network cut) will be refused and Ferry will stop; run \
                     ALTER ROLE {} WITH REPLICATION as a superuser (on Amazon RDS: GRANT rds_replication TO {})",
                    slot::quote_ident(&role),
                    slot::quote_ident(&role)
                );
            }
            could_replicate = can;
        }
        if left.is_none() {
            continue;
        }
        let Ok(now) = slot::publication_membership(&sql, &spec).await else {
            continue;
        };
        let changed = spec
            .tables
            .iter()
            .zip(now.iter().zip(&membership))
            .find(|(_, (now, then))| now != then);
        if let Some((table, (now, _))) = changed {
            let what = match now {
                None => "it is no longer in the publication (dropped, or ALTER PUBLICATION ... DROP TABLE)".to_string(),
                Some(_) => "it is in the publication again, but was dropped and recreated or taken out and added back since the session started".to_string(),
            };
            if let Some(tx) = left.take() {
                let _ = tx.send(PipelineError::PublicationChanged {
                    publication: spec.publication.clone(),
                    table: table.qualified(),
                    what,
                });
            }
            continue;
        }
        // A table listed since the start that no entry relays: its first row would stop the
        // reader; this says so as soon as it is listed, rows or not.
        if let Ok(Some(table)) = slot::unrelayed_tables(&sql, &spec)
            .await
            .map(|t| t.into_iter().next())
        {
            if let Some(tx) = left.take() {
                let _ = tx.send(PipelineError::UnrelayedTable {
                    publication: spec.publication.clone(),
                    table,
                    at: None,
                });
            }
        }
    }
}
