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

/// What [`watch_server`] asks with: each query answered within `within` (the stream's receive
/// timeout), or the connection taken for lost and the query cancelled (on `postgres`, best
/// effort).
pub(super) struct Asking {
    pub within: Option<Duration>,
    pub postgres: ferry_wal::conn::ConnectConfig,
}

/// What the watch's queries are called where a timeout names them.
const WATCH: &str = "the session's watch (the WAL position for the lag metric, the publication)";

/// How long the watch waits once more for an answer past the timeout, as the stream does
/// before it gives a connection up: an answer that came while Ferry was stopped or starved of
/// CPU waits in the socket for the connection's task.
const LAST_LOOK: Duration = Duration::from_secs(1);

/// `query`'s answer. `Ok(None)` for a failure that leaves the connection usable (skipped: a
/// standby has no WAL position, a catalog query may fail); an error when the connection is
/// lost: closed, or the query unanswered within the receive timeout and a last look (then
/// cancelled).
async fn ask<T>(
    sql: &tokio_postgres::Client,
    asking: &Asking,
    query: impl std::future::Future<Output = Result<T, ferry_wal::conn::ReaderError>>,
) -> Result<Option<T>, PipelineError> {
    let mut query = std::pin::pin!(query);
    let mut answer = ferry_wal::conn::answered(asking.within, WATCH, &mut query).await;
    if matches!(answer, Err(ferry_wal::conn::ReaderError::Unanswered { .. })) {
        if let Ok(late) = tokio::time::timeout(LAST_LOOK, &mut query).await {
            answer = late;
        }
    }
    match answer {
        Ok(answer) => Ok(Some(answer)),
        Err(e @ ferry_wal::conn::ReaderError::Unanswered { .. }) => {
            slot::cancel_sql_soon(&asking.postgres, sql.cancel_token());
            Err(e.into())
        }
        Err(e) if sql.is_closed() => Err(PipelineError::SqlClosed {
            cause: e.to_string(),
        }),
        Err(_) => Ok(None),
    }
}

/// Samples `pg_current_wal_lsn()` for the WAL lag metric, warns when the role loses the
/// REPLICATION attribute (before the next connection fails on it), and watches that the publication
/// still covers the outbox table as it did when the session started
/// ([`slot::publication_membership`]): a table dropped and recreated, or taken out of the
/// publication (and perhaps added back), means rows the stream never carried, which must stop
/// Ferry rather than pass unnoticed. A failed query is skipped, but a connection lost (closed,
/// or a query left unanswered for the receive timeout) ends the session through `left`: this
/// connection holds the hand-over lock too, and a watch that went on without it would freeze
/// the lag metric at its last sample and stop watching the publication, unnoticed.
pub(super) async fn watch_server(
    sql: Arc<tokio_postgres::Client>,
    metrics: Arc<Metrics>,
    every: Duration,
    asking: Asking,
    (spec, membership, left): MembershipWatch,
    wal_clock: WalClock,
    (walsender_pid, walsender): (i32, super::driver::OwnBackend),
) {
    let mut left = Some(left);
    let lost = watching(
        &sql,
        &metrics,
        every,
        &asking,
        (&spec, &membership, &mut left),
        &wal_clock,
        (walsender_pid, &walsender),
    )
    .await;
    tracing::debug!(error = %lost, "the session's SQL connection is lost");
    if let Some(tx) = left.take() {
        let _ = tx.send(lost);
    }
}

/// [`watch_server`]'s loop, until the connection is lost.
async fn watching(
    sql: &tokio_postgres::Client,
    metrics: &Metrics,
    every: Duration,
    asking: &Asking,
    (spec, membership, left): (
        &slot::SlotSpec,
        &[Option<String>],
        &mut Option<tokio::sync::oneshot::Sender<PipelineError>>,
    ),
    wal_clock: &WalClock,
    (walsender_pid, walsender): (i32, &super::driver::OwnBackend),
) -> PipelineError {
    let mut could_replicate = true;
    let mut recorded = false;
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        // Which backend this session's walsender is, for a later session of this instance that
        // finds the slot still held by it (read until it is).
        if !recorded {
            match ask(sql, asking, slot::backend(sql, Some(walsender_pid))).await {
                Ok(Some(Some(b))) => {
                    *walsender.lock().unwrap_or_else(|p| p.into_inner()) = Some(b);
                    recorded = true;
                }
                Ok(_) => {}
                Err(lost) => return lost,
            }
        }
        // On a standby there is no current WAL position (and no clock sample).
        match ask(sql, asking, slot::wal_clock(sql)).await {
            Ok(Some((lsn, micros))) => {
                metrics.set_server_wal_lsn(lsn.0);
                let mut samples = wal_clock.lock().unwrap_or_else(|p| p.into_inner());
                if samples.len() == WAL_CLOCK_SAMPLES {
                    samples.pop_front();
                }
                samples.push_back((lsn, micros));
            }
            Ok(None) => {}
            Err(lost) => return lost,
        }
        // Said once per loss: streaming goes on, but the next connection will be refused.
        match ask(sql, asking, slot::replication_privilege(sql)).await {
            Ok(Some((role, can))) => {
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
            Ok(None) => {}
            Err(lost) => return lost,
        }
        if left.is_none() {
            continue;
        }
        let now = match ask(sql, asking, slot::publication_membership(sql, spec)).await {
            Ok(Some(now)) => now,
            Ok(None) => continue,
            Err(lost) => return lost,
        };
        let changed = spec
            .tables
            .iter()
            .zip(now.iter().zip(membership))
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
        match ask(sql, asking, slot::unrelayed_tables(sql, spec)).await {
            Ok(Some(tables)) => {
                if let Some(table) = tables.into_iter().next() {
                    if let Some(tx) = left.take() {
                        let _ = tx.send(PipelineError::UnrelayedTable {
                            publication: spec.publication.clone(),
                            table,
                            at: None,
                        });
                    }
                }
            }
            Ok(None) => {}
            Err(lost) => return lost,
        }
    }
}
