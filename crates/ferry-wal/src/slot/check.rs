//! [`check`]: every problem that would stop Ferry, or that an operator should know, each with
//! its fix.

use super::privileges::{self, RoleGrants, TableGrants};
use super::publication::covers;
use super::tables::table_kind;
use super::{
    capacity, column_types, nearest_column, quote_ident, quote_literal, replication_privilege,
    server_version_num, slot_state, sql_error, unrelayed_table, unrelayed_tables, SlotSpec,
    SlotState, TableColumn,
};
use crate::conn::error::ReaderError;
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

/// One finding of [`check`]: what is wrong and how to fix it.
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

/// What the current role may do with the outbox tables ([`privileges`] judges it).
pub async fn role_grants(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
) -> Result<RoleGrants, ReaderError> {
    let row = client
        .query_one(
            "SELECT current_user::text, current_database()::text, \
                    has_database_privilege(current_database(), 'CREATE')",
            &[],
        )
        .await
        .map_err(sql_error)?;
    let mut tables = Vec::with_capacity(spec.tables.len());
    for t in &spec.tables {
        // By OID, never by name: a name lookup itself needs USAGE on the schema.
        let row = client
            .query_opt(
                "SELECT has_schema_privilege(n.oid, 'USAGE'), pg_get_userbyid(c.relowner)::text, \
                        pg_has_role(c.relowner, 'USAGE') \
                 FROM pg_namespace n LEFT JOIN pg_class c \
                   ON c.relnamespace = n.oid AND c.relname = $2 AND c.relkind IN ('r', 'p') \
                 WHERE n.nspname = $1",
                &[&t.schema, &t.table],
            )
            .await
            .map_err(sql_error)?;
        tables.push(match row {
            None => TableGrants {
                schema_usage: true,
                owner: None,
            },
            Some(r) => TableGrants {
                schema_usage: r.get(0),
                owner: r
                    .get::<_, Option<String>>(1)
                    .map(|o| (o, r.get::<_, Option<bool>>(2).unwrap_or(false))),
            },
        });
    }
    Ok(RoleGrants {
        role: row.get(0),
        database: row.get(1),
        create_on_database: row.get(2),
        tables,
    })
}

/// How to recover from an invalidated slot (`wal_status = lost`).
pub(crate) fn invalidated_slot_fix(slot: &str) -> String {
    format!(
        "drop it (SELECT pg_drop_replication_slot({})) so Ferry creates a new one, re-publish the lost \
         outbox rows if the table still holds them, and raise max_slot_wal_keep_size",
        quote_literal(slot)
    )
}

/// Every problem that would stop Ferry (or that an operator should know), with its fix.
pub async fn check(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
) -> Result<Vec<Problem>, ReaderError> {
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let mut error = |what: String, fix: String| {
        problems.push(Problem {
            severity: Severity::Error,
            what,
            fix,
        })
    };
    let wal_level: String = client
        .query_one("SELECT current_setting('wal_level')", &[])
        .await
        .map_err(sql_error)?
        .get(0);
    if wal_level != "logical" {
        error(
            format!("wal_level is {wal_level:?}, and logical decoding needs \"logical\""),
            "run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL (on Amazon RDS/Aurora set \
             rds.logical_replication = 1 in the parameter group; on Cloud SQL set cloudsql.logical_decoding = on; \
             on Azure set azure.replication_support = logical)"
                .into(),
        );
    }

    let (user, can_replicate) = replication_privilege(client).await?;
    if !can_replicate {
        error(
            format!("role {user:?} lacks the REPLICATION attribute"),
            format!(
                "run ALTER ROLE {} WITH REPLICATION as a superuser (on Amazon RDS: GRANT rds_replication TO {})",
                quote_ident(&user),
                quote_ident(&user)
            ),
        );
    }

    let mut kinds = Vec::with_capacity(spec.tables.len());
    for t in &spec.tables {
        let kind = table_kind(client, t).await?;
        kinds.push(kind);
        let table = t.qualified();
        let Some(_) = kind else {
            error(
                format!("table {table} does not exist (or is not a table)"),
                format!(
                    "create it (sql/outbox.sql has the Debezium-compatible DDL) or point {} at your outbox",
                    t.config_key
                ),
            );
            continue;
        };
        let columns = column_types(client, &t.schema, &t.table).await?;
        for req in &t.required_columns {
            match columns.iter().find(|c| c.name == req.name) {
                None => error(
                    format!(
                        "table {table} has no column {:?} (named by {})",
                        req.name, req.config_key
                    ),
                    {
                        let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
                        match nearest_column(&req.name, &names) {
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
                            error(
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

    // The privileges `run` needs (see `privileges` for the list and why each).
    let grants = role_grants(client, spec).await?;
    for p in privileges::lookup_problems(spec, &grants) {
        error(p.what, p.fix);
    }

    let publication = client
        .query_opt(
            "SELECT puballtables, pubinsert, pubviaroot FROM pg_publication WHERE pubname = $1",
            &[&spec.publication],
        )
        .await
        .map_err(sql_error)?;
    let create_pub_sql = spec.create_publication_sql();
    match publication {
        None if spec.create_publication => {
            let cannot = privileges::publication_problems(spec, &grants);
            if cannot.is_empty() {
                notes.push(Problem {
                    severity: Severity::Note,
                    what: format!("publication {:?} does not exist", spec.publication),
                    fix: format!("none needed: Ferry creates it (`{create_pub_sql}`)"),
                });
            }
            for p in cannot {
                error(p.what, p.fix);
            }
        }
        None => error(
            format!("publication {:?} does not exist", spec.publication),
            format!("run `{create_pub_sql}` as the table's owner, or set postgres.create_publication = true"),
        ),
        Some(p) => {
            let (all, insert, via_root): (bool, bool, bool) = (p.get(0), p.get(1), p.get(2));
            if !insert {
                error(
                    format!("publication {:?} does not publish INSERTs", spec.publication),
                    format!(
                        "run ALTER PUBLICATION {} SET (publish = 'insert')",
                        quote_ident(&spec.publication)
                    ),
                );
            }
            for ((t, kind), g) in spec.tables.iter().zip(&kinds).zip(&grants.tables) {
                let table = t.qualified();
                // covers() looks the table up by name, which needs USAGE (reported above).
                if kind.is_some() && g.schema_usage && !all && !covers(client, spec, t).await? {
                    error(
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
                if matches!(kind, Some((_, k)) if *k == b'p' as i8) && !via_root {
                    error(
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
            for table in unrelayed_tables(client, spec).await? {
                let Problem { what, fix, .. } = unrelayed_table(&spec.publication, &table);
                error(what, fix);
            }
            if all {
                notes.push(Problem {
                    severity: Severity::Note,
                    what: format!(
                        "publication {:?} is FOR ALL TABLES: PostgreSQL decodes every table's inserts for Ferry, \
                         which relays the outbox tables' and skips the rest",
                        spec.publication
                    ),
                    fix: format!(
                        "none needed; a publication of the outbox tables only saves that work: `{create_pub_sql}`"
                    ),
                });
            }
        }
    }

    let db: String = client
        .query_one("SELECT current_database()::text", &[])
        .await
        .map_err(sql_error)?
        .get(0);
    let cap = capacity(client).await?;
    let existing = slot_state(client, &spec.slot).await?;
    let slot_exists = existing.is_some();
    // A slot another process streams is reported below; its walsender is not Ferry's problem.
    let slot_streamed = existing.as_ref().is_some_and(|s| s.active_pid.is_some());
    if !slot_exists && cap.slots_used >= cap.max_slots {
        error(
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
        error(
            format!(
                "all {} WAL senders are in use (max_wal_senders), so Ferry cannot open its replication connection",
                cap.max_senders
            ),
            "stop a replication consumer you no longer need (see pg_stat_replication), or raise \
             max_wal_senders and restart PostgreSQL"
                .into(),
        );
    }
    notes.push(Problem {
        severity: Severity::Note,
        what: format!(
            "replication slots: {} of {} in use; WAL senders: {} of {} in use",
            cap.slots_used, cap.max_slots, cap.senders_used, cap.max_senders
        ),
        fix: "none needed".into(),
    });
    match &existing {
        None if spec.create_slot => notes.push(Problem {
            severity: Severity::Note,
            what: format!("replication slot {:?} does not exist", spec.slot),
            fix: "none needed: Ferry creates it at the server's current position".into(),
        }),
        None => error(
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
            problems.push(Problem {
                severity: Severity::Warning,
                what: format!(
                    "replication slot {:?} is being created by process {}",
                    spec.slot,
                    s.active_pid.unwrap_or_default()
                ),
                fix: "if that is another Ferry, this one will stand by; otherwise wait for it to finish".into(),
            });
        }
        Some(s) => {
            if s.slot_type != "logical" || s.plugin.as_deref() != Some("pgoutput") {
                error(
                    format!(
                        "replication slot {:?} is a {} slot with plugin {:?}; Ferry needs a logical slot with pgoutput",
                        spec.slot,
                        s.slot_type,
                        s.plugin.as_deref().unwrap_or("none")
                    ),
                    "choose another postgres.slot name (Ferry creates it), or drop this slot if nothing uses it".into(),
                );
            } else if s.database.as_deref() != Some(db.as_str()) {
                error(
                    format!(
                        "replication slot {:?} belongs to database {:?}, not {db:?}",
                        spec.slot,
                        s.database.as_deref().unwrap_or("?")
                    ),
                    "connect to the slot's database, or choose another postgres.slot name".into(),
                );
            }
            if s.wal_status.as_deref() == Some("lost") {
                error(
                    format!(
                        "replication slot {:?} was invalidated (wal_status = lost): the WAL it needed was removed, \
                         so events after {} are gone from the WAL",
                        spec.slot, s.confirmed_flush_lsn
                    ),
                    invalidated_slot_fix(&spec.slot),
                );
            }
            if let Some(pid) = s.active_pid {
                problems.push(Problem {
                    severity: Severity::Warning,
                    what: format!("replication slot {:?} is being streamed by process {pid}", spec.slot),
                    fix: "if that is another Ferry, this one will stand by; otherwise stop that consumer".into(),
                });
            }
        }
    }
    if spec.failover {
        failover_checks(client, spec, existing.as_ref(), &mut problems, &mut notes).await?;
    }
    problems.extend(notes);
    Ok(problems)
}

/// What `postgres.failover_slot` needs: PostgreSQL 17, and `synchronized_standby_slots` naming
/// the standbys' physical slots. Without it the primary may send a logical consumer a
/// transaction that no standby has received; if the primary then fails over, that transaction
/// never happened, but Ferry has already published it (a phantom event).
async fn failover_checks(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
    existing: Option<&SlotState>,
    problems: &mut Vec<Problem>,
    notes: &mut Vec<Problem>,
) -> Result<(), ReaderError> {
    let version = server_version_num(client).await?;
    if version < 170000 {
        problems.push(Problem {
            severity: Severity::Error,
            what: format!(
                "postgres.failover_slot needs PostgreSQL 17 or later; this server is {}",
                version / 10000
            ),
            fix: "set postgres.failover_slot = false (the slot is then lost on a failover), or upgrade to 17+".into(),
        });
        return Ok(());
    }
    let in_recovery: bool = client
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .map_err(sql_error)?
        .get(0);
    match existing {
        // `synced` stays true on a promoted standby's leftover copies: it means "a copy" only
        // while the server is in recovery.
        Some(s) if in_recovery && s.synced == Some(true) => notes.push(Problem {
            severity: Severity::Note,
            what: format!(
                "replication slot {:?} is a standby's synchronized copy (this server is a standby)",
                spec.slot
            ),
            fix: "none needed: Ferry streams from it once this server is promoted".into(),
        }),
        Some(s) if s.failover != Some(true) => notes.push(Problem {
            severity: Severity::Note,
            what: format!("replication slot {:?} is not a failover slot", spec.slot),
            fix: format!(
                "none needed: Ferry makes it one when it starts streaming (ALTER_REPLICATION_SLOT {} (FAILOVER true))",
                quote_ident(&spec.slot)
            ),
        }),
        Some(_) => notes.push(Problem {
            severity: Severity::Note,
            what: format!("replication slot {:?} is a failover slot", spec.slot),
            fix: "none needed: standbys with sync_replication_slots = on keep a copy of it".into(),
        }),
        None => {}
    }
    if in_recovery {
        return Ok(());
    }
    let names: String = client
        .query_one("SELECT current_setting('synchronized_standby_slots')", &[])
        .await
        .map_err(sql_error)?
        .get(0);
    let names: Vec<&str> = names
        .split(',')
        .map(|n| n.trim().trim_matches('"'))
        .filter(|n| !n.is_empty())
        .collect();
    if names.is_empty() {
        problems.push(Problem {
            severity: Severity::Warning,
            what: "synchronized_standby_slots is empty: PostgreSQL may send Ferry a transaction no standby has yet, \
                   and after a failover that transaction never happened although Ferry published it (a phantom event)"
                .into(),
            fix: "name the standbys' physical slots: ALTER SYSTEM SET synchronized_standby_slots = 'standby_slot'; \
                  SELECT pg_reload_conf() (and on each standby: sync_replication_slots = on, hot_standby_feedback = on, \
                  primary_slot_name set, dbname in primary_conninfo)"
                .into(),
        });
    }
    for name in names {
        let active: Option<bool> = client
            .query_opt(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1 AND slot_type = 'physical'",
                &[&name],
            )
            .await
            .map_err(sql_error)?
            .map(|r| r.get(0));
        match active {
            Some(true) => notes.push(Problem {
                severity: Severity::Note,
                what: format!("standby slot {name:?} (synchronized_standby_slots) is streaming"),
                fix: "none needed".into(),
            }),
            Some(false) => problems.push(Problem {
                severity: Severity::Warning,
                what: format!(
                    "standby slot {name:?} named in synchronized_standby_slots has no standby connected: \
                     PostgreSQL holds back every logical consumer, Ferry too, until it catches up"
                ),
                fix: "start the standby, or remove its slot from synchronized_standby_slots".into(),
            }),
            None => problems.push(Problem {
                severity: Severity::Warning,
                what: format!(
                    "synchronized_standby_slots names {name:?}, which is not a physical replication slot here: \
                     PostgreSQL holds back every logical consumer, Ferry too"
                ),
                fix: "create it (SELECT pg_create_physical_replication_slot(...)) for the standby, or correct the setting".into(),
            }),
        }
    }
    Ok(())
}
