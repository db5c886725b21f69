//! What `postgres.failover_slot` needs (PostgreSQL 17 and standbys that keep a copy of the slot):
//! [`read`] asks the server ([`FailoverFacts`]), [`judge`] says what the answers mean, as part of
//! [`check`](super::check())'s problem list.

use super::problems::Findings;
use super::{in_recovery, quote_ident, server_version_num, sql_error, SlotSpec, SlotState};
use crate::conn::error::ReaderError;

/// What `postgres.failover_slot` depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailoverFacts {
    /// `server_version_num` (e.g. 170002). Nothing else is read before 17.
    pub version: i32,
    /// `pg_is_in_recovery()` (read on 17+; false before).
    pub in_recovery: bool,
    /// The physical slots `synchronized_standby_slots` names, in its order (read on a 17+
    /// primary; empty otherwise).
    pub standby_slots: Vec<StandbySlot>,
}

/// A slot named in `synchronized_standby_slots`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StandbySlot {
    pub name: String,
    /// `active` of the physical slot of that name; `None` when there is no such physical slot.
    pub active: Option<bool>,
}

/// The [`FailoverFacts`]: the server's version; from 17 on whether it is a standby; on a
/// primary, the slots `synchronized_standby_slots` names (a setting PostgreSQL 17 added) and
/// whether a standby streams each.
pub(super) async fn read(client: &tokio_postgres::Client) -> Result<FailoverFacts, ReaderError> {
    let mut facts = FailoverFacts {
        version: server_version_num(client).await?,
        in_recovery: false,
        standby_slots: Vec::new(),
    };
    if facts.version < 170000 {
        return Ok(facts);
    }
    facts.in_recovery = in_recovery(client).await?;
    if facts.in_recovery {
        return Ok(facts);
    }
    let setting: String = client
        .query_one("SELECT current_setting('synchronized_standby_slots')", &[])
        .await
        .map_err(sql_error)?
        .get(0);
    for name in standby_slot_names(&setting) {
        let active: Option<bool> = client
            .query_opt(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1 AND slot_type = 'physical'",
                &[&name],
            )
            .await
            .map_err(sql_error)?
            .map(|r| r.get(0));
        facts.standby_slots.push(StandbySlot {
            name: name.to_string(),
            active,
        });
    }
    Ok(facts)
}

/// The slot names in a `synchronized_standby_slots` value (`'a, "b"'`: comma-separated, each
/// perhaps double-quoted), blanks left out.
pub(crate) fn standby_slot_names(setting: &str) -> Vec<&str> {
    setting
        .split(',')
        .map(|n| n.trim().trim_matches('"'))
        .filter(|n| !n.is_empty())
        .collect()
}

/// What `postgres.failover_slot` needs: PostgreSQL 17, and `synchronized_standby_slots` naming
/// the standbys' physical slots. Without it the primary may send a logical consumer a
/// transaction that no standby has received; if the primary then fails over, that transaction
/// never happened, but Ferry has already published it (a phantom event).
pub(super) fn judge(
    spec: &SlotSpec,
    facts: &FailoverFacts,
    existing: Option<&SlotState>,
    out: &mut Findings,
) {
    let version = facts.version;
    if version < 170000 {
        out.error(
            format!(
                "postgres.failover_slot needs PostgreSQL 17 or later; this server is {}",
                version / 10000
            ),
            "set postgres.failover_slot = false (the slot is then lost on a failover), or upgrade to 17+".into(),
        );
        return;
    }
    let in_recovery = facts.in_recovery;
    match existing {
        // `synced` stays true on a promoted standby's leftover copies: it means "a copy" only
        // while the server is in recovery.
        Some(s) if in_recovery && s.synced == Some(true) => out.note(
            format!(
                "replication slot {:?} is a standby's synchronized copy (this server is a standby)",
                spec.slot
            ),
            "none needed: Ferry streams from it once this server is promoted".into(),
        ),
        Some(s) if s.failover != Some(true) => out.note(
            format!("replication slot {:?} is not a failover slot", spec.slot),
            format!(
                "none needed: Ferry makes it one when it starts streaming (ALTER_REPLICATION_SLOT {} (FAILOVER true))",
                quote_ident(&spec.slot)
            ),
        ),
        Some(_) => out.note(
            format!("replication slot {:?} is a failover slot", spec.slot),
            "none needed: standbys with sync_replication_slots = on keep a copy of it".into(),
        ),
        None => {}
    }
    if in_recovery {
        return;
    }
    if facts.standby_slots.is_empty() {
        out.warning(
            "synchronized_standby_slots is empty: PostgreSQL may send Ferry a transaction no standby has yet, \
             and after a failover that transaction never happened although Ferry published it (a phantom event)"
                .into(),
            "name the standbys' physical slots: ALTER SYSTEM SET synchronized_standby_slots = 'standby_slot'; \
             SELECT pg_reload_conf() (and on each standby: sync_replication_slots = on, hot_standby_feedback = on, \
             primary_slot_name set, dbname in primary_conninfo)"
                .into(),
        );
    }
    for standby in &facts.standby_slots {
        let name = &standby.name;
        match standby.active {
            Some(true) => out.note(
                format!("standby slot {name:?} (synchronized_standby_slots) is streaming"),
                "none needed".into(),
            ),
            Some(false) => out.warning(
                format!(
                    "standby slot {name:?} named in synchronized_standby_slots has no standby connected: \
                     PostgreSQL holds back every logical consumer, Ferry too, until it catches up"
                ),
                "start the standby, or remove its slot from synchronized_standby_slots".into(),
            ),
            None => out.warning(
                format!(
                    "synchronized_standby_slots names {name:?}, which is not a physical replication slot here: \
                     PostgreSQL holds back every logical consumer, Ferry too"
                ),
                "create it (SELECT pg_create_physical_replication_slot(...)) for the standby, or correct the setting".into(),
            ),
        }
    }
}
