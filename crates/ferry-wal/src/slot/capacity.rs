//! How many replication slots and WAL senders the server has, and how many are taken
//! ([`capacity`]); whether that leaves room for Ferry ([`judge`], part of the problem list of
//! [`check`](super::check())).

use super::problems::Findings;
use super::{sql_error, SlotSpec, SlotState};
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

/// Room for the slot (unless it exists) and for the replication connection (unless the slot is
/// streamed already: that walsender is not Ferry's problem, the slot's warning says it), and
/// the counts as a note.
pub(super) fn judge(
    spec: &SlotSpec,
    cap: &Capacity,
    existing: Option<&SlotState>,
    out: &mut Findings,
) {
    let slot_exists = existing.is_some();
    let slot_streamed = existing.is_some_and(|s| s.active_pid.is_some());
    if !slot_exists && cap.slots_used >= cap.max_slots {
        out.error(
            format!(
                "all {} replication slots are in use, so slot {:?} cannot be created",
                cap.max_slots, spec.slot
            ),
            "drop a slot nothing uses (SELECT slot_name, active FROM pg_replication_slots; \
             SELECT pg_drop_replication_slot('name')), or raise max_replication_slots and restart PostgreSQL"
                .into(),
        );
    }
    if cap.senders_used >= cap.max_senders && !slot_streamed {
        out.error(
            format!(
                "all {} WAL senders are in use (max_wal_senders), so Ferry cannot open its replication connection",
                cap.max_senders
            ),
            "stop a replication consumer you no longer need (see pg_stat_replication), or raise \
             max_wal_senders and restart PostgreSQL"
                .into(),
        );
    }
    out.note(
        format!(
            "replication slots: {} of {} in use; WAL senders: {} of {} in use",
            cap.slots_used, cap.max_slots, cap.senders_used, cap.max_senders
        ),
        "none needed".into(),
    );
}
