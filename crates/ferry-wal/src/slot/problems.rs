//! The problem list of [`check`](super::check()): what the [`Facts`] it read mean, each finding
//! with its fix, in the words `ferry check` and a refused start show. Pure, no I/O: every
//! finding is unit-tested from facts alone (`problems/tests.rs`).
//!
//! The list has a fixed order: the errors and warnings as found (the server's settings and the
//! role, each outbox table, the privileges, the publication, capacity, the slot, failover), then
//! the notes, in the same order. Capacity and failover are judged in their own modules
//! ([`capacity::judge`], [`failover::judge`]), privileges in [`privileges`].

use super::check::Facts;
use super::privileges;
use super::{capacity, failover};
use super::{
    quote_ident, quote_literal, unrelayed_table, SlotSpec, SlotState, TableColumn, TableSpec,
};
use crate::Lsn;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Ferry cannot run until it is fixed.
    Error,
    /// Ferry runs, but the operator should know (e.g. another process streams the slot).
    Warning,
    /// Information: something is missing that `ferry run` creates (the configuration allows it).
    Note,
}

/// One finding of [`check`](super::check()): what is wrong and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub severity: Severity,
    pub what: String,
    pub fix: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; fix: {}", self.what, self.fix)
    }
}

/// How to recover from an invalidated slot (`wal_status = lost`).
pub(crate) fn invalidated_slot_fix(slot: &str) -> String {
    format!(
        "drop it (SELECT pg_drop_replication_slot({})) so Ferry creates a new one, re-publish the lost \
         outbox rows if the table still holds them, and raise max_slot_wal_keep_size",
        quote_literal(slot)
    )
}

/// The problem list being written: errors and warnings in the order found, then the notes.
#[derive(Debug, Default)]
pub(super) struct Findings {
    problems: Vec<Problem>,
    notes: Vec<Problem>,
}

impl Findings {
    pub(super) fn error(&mut self, what: String, fix: String) {
        self.problems.push(Problem {
            severity: Severity::Error,
            what,
            fix,
        });
    }

    pub(super) fn warning(&mut self, what: String, fix: String) {
        self.problems.push(Problem {
            severity: Severity::Warning,
            what,
            fix,
        });
    }

    pub(super) fn note(&mut self, what: String, fix: String) {
        self.notes.push(Problem {
            severity: Severity::Note,
            what,
            fix,
        });
    }

    fn into_list(mut self) -> Vec<Problem> {
        self.problems.extend(self.notes);
        self.problems
    }
}

/// Every problem the facts show (or that an operator should know), with its fix: the list
/// [`check`](super::check()) returns.
pub(crate) fn problems(spec: &SlotSpec, facts: &Facts) -> Vec<Problem> {
    let mut out = Findings::default();
    server(facts, &mut out);
    for (t, table) in spec.tables.iter().zip(&facts.tables) {
        outbox_table(t, table.relkind.is_some(), &table.columns, &mut out);
    }
    // The privileges `run` needs (see `privileges` for the list and why each).
    for p in privileges::lookup_problems(spec, &facts.grants) {
        out.error(p.what, p.fix);
    }
    publication(spec, facts, &mut out);
    capacity::judge(spec, &facts.capacity, facts.slot.as_ref(), &mut out);
    slot(spec, facts.slot.as_ref(), &facts.database, &mut out);
    if let Some(f) = &facts.failover {
        failover::judge(spec, f, facts.slot.as_ref(), &mut out);
    }
    out.into_list()
}

/// `wal_level`, and the role's REPLICATION privilege.
fn server(facts: &Facts, out: &mut Findings) {
    let wal_level = &facts.wal_level;
    if wal_level != "logical" {
        out.error(
            format!("wal_level is {wal_level:?}, and logical decoding needs \"logical\""),
            "run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL (on Amazon RDS/Aurora set \
             rds.logical_replication = 1 in the parameter group; on Cloud SQL set cloudsql.logical_decoding = on; \
             on Azure set azure.replication_support = logical)"
                .into(),
        );
    }

    let user = &facts.role;
    if !facts.can_replicate {
        out.error(
            format!("role {user:?} lacks the REPLICATION attribute"),
            format!(
                "run ALTER ROLE {} WITH REPLICATION as a superuser (on Amazon RDS: GRANT rds_replication TO {})",
                quote_ident(user),
                quote_ident(user)
            ),
        );
    }
}

/// An outbox table: it exists, and has each required column, of a type the caller accepts.
fn outbox_table(t: &TableSpec, exists: bool, columns: &[TableColumn], out: &mut Findings) {
    let table = t.qualified();
    if !exists {
        out.error(
            format!("table {table} does not exist (or is not a table)"),
            format!(
                "create it (sql/outbox.sql has the Debezium-compatible DDL) or point {} at your outbox",
                t.config_key
            ),
        );
        return;
    }
    for req in &t.required_columns {
        match columns.iter().find(|c| c.name == req.name) {
            None => out.error(
                format!(
                    "table {table} has no column {:?} (named by {})",
                    req.name, req.config_key
                ),
                {
                    let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
                    match super::nearest_column(&req.name, &names) {
                        Some(near) => format!(
                            "set {} = {near:?} (the nearest of its columns: {}) or add the column",
                            req.config_key.split(' ').next().unwrap_or(&req.config_key),
                            names.join(", ")
                        ),
                        None => format!(
                            "set {} to one of its columns ({}) or add the column",
                            req.config_key,
                            names.join(", ")
                        ),
                    }
                },
            ),
            Some(TableColumn {
                type_oid: ty,
                type_name: shown,
                ..
            }) => {
                if let Some(ok) = &req.accepted_types {
                    if !ok.oids.contains(ty) {
                        out.error(
                            format!(
                                "column {}.{} ({}) is of type {shown}, which Ferry cannot use there",
                                table, req.name, req.config_key
                            ),
                            ok.fix.clone(),
                        );
                    }
                }
            }
        }
    }
}

/// The publication: it exists (or Ferry may and can create it), publishes INSERTs, covers every
/// outbox table (a partitioned one via its root), and lists no table no entry relays.
fn publication(spec: &SlotSpec, facts: &Facts, out: &mut Findings) {
    let create_pub_sql = spec.create_publication_sql();
    match &facts.publication {
        None if spec.create_publication => {
            let cannot = privileges::publication_problems(spec, &facts.grants);
            if cannot.is_empty() {
                out.note(
                    format!("publication {:?} does not exist", spec.publication),
                    format!("none needed: Ferry creates it (`{create_pub_sql}`)"),
                );
            }
            for p in cannot {
                out.error(p.what, p.fix);
            }
        }
        None => out.error(
            format!("publication {:?} does not exist", spec.publication),
            format!("run `{create_pub_sql}` as the table's owner, or set postgres.create_publication = true"),
        ),
        Some(p) => {
            if !p.insert {
                out.error(
                    format!("publication {:?} does not publish INSERTs", spec.publication),
                    format!(
                        "run ALTER PUBLICATION {} SET (publish = 'insert')",
                        quote_ident(&spec.publication)
                    ),
                );
            }
            for ((t, facts), covered) in spec.tables.iter().zip(&facts.tables).zip(&p.covers) {
                let table = t.qualified();
                if *covered == Some(false) {
                    out.error(
                        format!(
                            "publication {:?} does not include table {table}",
                            spec.publication
                        ),
                        format!(
                            "stop every Ferry running a configuration without this table (it would skip the table's rows), then run ALTER PUBLICATION {} ADD TABLE {table} (Ferry never alters an existing publication)",
                            quote_ident(&spec.publication)
                        ),
                    );
                }
                if facts.relkind == Some(b'p') && !p.via_root {
                    out.error(
                        format!(
                            "table {table} is partitioned but publication {:?} publishes per partition",
                            spec.publication
                        ),
                        format!(
                            "run ALTER PUBLICATION {} SET (publish_via_partition_root = true)",
                            quote_ident(&spec.publication)
                        ),
                    );
                }
            }
            for table in &p.unrelayed {
                let Problem { what, fix, .. } = unrelayed_table(&spec.publication, table);
                out.error(what, fix);
            }
            if p.all_tables {
                out.note(
                    format!(
                        "publication {:?} is FOR ALL TABLES: PostgreSQL decodes every table's inserts for Ferry, \
                         which relays the outbox tables' and skips the rest",
                        spec.publication
                    ),
                    format!(
                        "none needed; a publication of the outbox tables only saves that work: `{create_pub_sql}`"
                    ),
                );
            }
        }
    }
}

/// The slot: it exists (or Ferry may create it), is a logical pgoutput slot of this database,
/// is not invalidated, and whether another process streams it or is still creating it.
fn slot(spec: &SlotSpec, existing: Option<&SlotState>, db: &str, out: &mut Findings) {
    match existing {
        None if spec.create_slot => out.note(
            format!("replication slot {:?} does not exist", spec.slot),
            "none needed: Ferry creates it at the server's current position".into(),
        ),
        None => out.error(
            format!("replication slot {:?} does not exist", spec.slot),
            format!(
                "set postgres.create_slot = true, or run SELECT pg_create_logical_replication_slot({}, 'pgoutput')",
                quote_literal(&spec.slot)
            ),
        ),
        Some(s) if s.active_pid.is_some() && s.confirmed_flush_lsn == Lsn::ZERO => {
            // No start point yet: another session (another Ferry starting at the same moment)
            // is creating it, and its plugin may not even be set yet. Once created it is
            // checked like any other slot; until then START_REPLICATION finds it in use.
            out.warning(
                format!(
                    "replication slot {:?} is being created by process {}",
                    spec.slot,
                    s.active_pid.unwrap_or_default()
                ),
                "if that is another Ferry, this one will stand by; otherwise wait for it to finish".into(),
            );
        }
        Some(s) => {
            if s.slot_type != "logical" || s.plugin.as_deref() != Some("pgoutput") {
                out.error(
                    format!(
                        "replication slot {:?} is a {} slot with plugin {:?}; Ferry needs a logical slot with pgoutput",
                        spec.slot,
                        s.slot_type,
                        s.plugin.as_deref().unwrap_or("none")
                    ),
                    "choose another postgres.slot name (Ferry creates it), or drop this slot if nothing uses it".into(),
                );
            } else if s.database.as_deref() != Some(db) {
                out.error(
                    format!(
                        "replication slot {:?} belongs to database {:?}, not {db:?}",
                        spec.slot,
                        s.database.as_deref().unwrap_or("?")
                    ),
                    "connect to the slot's database, or choose another postgres.slot name".into(),
                );
            }
            if s.wal_status.as_deref() == Some("lost") {
                out.error(
                    format!(
                        "replication slot {:?} was invalidated (wal_status = lost): the WAL it needed was removed, \
                         so events after {} are gone from the WAL",
                        spec.slot, s.confirmed_flush_lsn
                    ),
                    invalidated_slot_fix(&spec.slot),
                );
            }
            if let Some(pid) = s.active_pid {
                out.warning(
                    format!("replication slot {:?} is being streamed by process {pid}", spec.slot),
                    "if that is another Ferry, this one will stand by; otherwise stop that consumer".into(),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
