//! Slot and publication management over an ordinary SQL connection (tokio-postgres).
//!
//! [`check`] inspects everything Ferry needs and returns every problem it finds, each with its
//! fix; [`ensure`] first creates what is missing (the publication and the slot, when the
//! configuration allows) and then checks. Identifiers are always quoted.
//!
//! A partitioned outbox table is published with `publish_via_partition_root = true`, so changes
//! arrive under the table's own name rather than each partition's.
//!
//! # Two instances starting together
//!
//! An active and a standby Ferry started at the same moment both find the publication and the
//! slot missing and both create them. Losing that race is never an error: whichever creation
//! committed first is the one both use. What the loser sees depends on timing:
//!
//! - `CREATE PUBLICATION` after the winner committed: 42710 (duplicate_object); while the
//!   winner's transaction is still open, the catalog's unique index makes the loser wait, then
//!   fail with 23505 (unique_violation on `pg_publication_pubname_index`);
//! - `pg_create_logical_replication_slot`: 42710 ("replication slot ... already exists"), since
//!   slot names are checked under a lock rather than in a catalog;
//! - a slot the winner is still creating (a logical slot waits for running transactions to
//!   finish before it has a consistent start point) is listed with the winner's pid, no
//!   `confirmed_flush_lsn` yet and, for a moment, no plugin: [`check`] reports it as being
//!   created by that process (a warning), and `START_REPLICATION` on it fails with 55006
//!   (object_in_use), which makes the loser a standby.

use std::time::Duration;

use crate::conn::config::{ConnectConfig, Host, SslMode};
use crate::conn::error::ReaderError;
use crate::conn::tls;
use crate::Lsn;

/// What the outbox needs from the database.
#[derive(Debug, Clone)]
pub struct SlotSpec {
    pub slot: String,
    pub publication: String,
    pub schema: String,
    pub table: String,
    pub create_slot: bool,
    pub create_publication: bool,
    /// Columns the router reads, with the types it accepts.
    pub required_columns: Vec<RequiredColumn>,
}

/// A column the router needs.
#[derive(Debug, Clone)]
pub struct RequiredColumn {
    pub name: String,
    /// The configuration key that names it, for the error message (`outbox.payload_column`).
    pub config_key: String,
    /// Accepted type OIDs; `None` accepts any type.
    pub accepted_types: Option<Vec<u32>>,
}

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
}

/// Setup failed: the problems, each with its fix.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{}", .0.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n"))]
    Problems(Vec<Problem>),
    #[error(transparent)]
    Connection(#[from] ReaderError),
}

impl SetupError {
    /// Whether retrying later can succeed (the connection failed transiently).
    pub fn is_transient(&self) -> bool {
        match self {
            SetupError::Problems(_) => false,
            SetupError::Connection(e) => e.is_transient(),
        }
    }
}

/// Whether a failed `CREATE` means another session created the same object first (see the
/// module's notes on two instances starting together).
fn created_concurrently(e: &tokio_postgres::Error) -> bool {
    matches!(e.code().map(|c| c.code()), Some("42710") | Some("23505"))
}

/// Quotes an SQL identifier.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Quotes an SQL string literal.
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Opens an ordinary SQL connection with the same TLS settings as the replication stream; the
/// connection task runs on the current runtime.
pub async fn connect_sql(cfg: &ConnectConfig) -> Result<tokio_postgres::Client, ReaderError> {
    let mut pg = tokio_postgres::Config::new();
    match &cfg.host {
        Host::Tcp(h) => pg.host(h),
        Host::Unix(d) => pg.host_path(d),
    };
    pg.port(cfg.port)
        .user(&cfg.user)
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
    if let Some(t) = cfg.connect_timeout {
        pg.connect_timeout(t);
    }
    let timeout = cfg.connect_timeout.unwrap_or(Duration::from_secs(3600));
    // TLS over a Unix socket is impossible (the configuration allows at most `prefer` there),
    // and tokio-postgres would ask the TLS connector for a server name the socket lacks.
    let tls_config = match cfg.host {
        Host::Unix(_) => None,
        Host::Tcp(_) => tls::client_config(cfg)?,
    };
    let connect = async {
        match tls_config {
            None => {
                let (client, conn) = pg.connect(tokio_postgres::NoTls).await.map_err(sql_error)?;
                tokio::spawn(conn);
                Ok(client)
            }
            Some(tls_config) => {
                let (client, conn) = pg
                    .connect(tls::MakeRustlsConnect::new(tls_config))
                    .await
                    .map_err(|e| match tls::rejected_certificate(&e) {
                        Some(reason) => tls::certificate_error(reason, cfg),
                        None => sql_error(e),
                    })?;
                tokio::spawn(conn);
                Ok(client)
            }
        }
    };
    tokio::time::timeout(timeout, connect)
        .await
        .map_err(|_| ReaderError::Timeout {
            what: "connecting to PostgreSQL",
            secs: timeout.as_secs(),
        })?
}

/// Maps a tokio-postgres error into the reader's families.
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
    ReaderError::Io {
        context: "talking to PostgreSQL",
        source: std::io::Error::other(e.to_string()),
    }
}

/// The slot's row in `pg_replication_slots`, if it exists.
pub async fn slot_state(
    client: &tokio_postgres::Client,
    slot: &str,
) -> Result<Option<SlotState>, ReaderError> {
    let row = client
        .query_opt(
            "SELECT confirmed_flush_lsn::text, restart_lsn::text, active_pid, wal_status, plugin, database, slot_type \
             FROM pg_replication_slots WHERE slot_name = $1",
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
    }))
}

fn lsn_col(v: Option<String>) -> Lsn {
    v.and_then(|s| s.parse().ok()).unwrap_or(Lsn::ZERO)
}

/// The server's current WAL insert position (`pg_current_wal_lsn()`).
pub async fn current_wal_lsn(client: &tokio_postgres::Client) -> Result<Lsn, ReaderError> {
    let row = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .map_err(sql_error)?;
    Ok(lsn_col(row.get(0)))
}

/// Creates the publication and the slot when missing and allowed, then [`check`]s. Returns
/// the slot's state when there is no error-level problem.
pub async fn ensure(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
) -> Result<SlotState, SetupError> {
    let exists: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)",
            &[&spec.publication],
        )
        .await
        .map_err(sql_error)?
        .get(0);
    if !exists && spec.create_publication && table_kind(client, spec).await?.is_some() {
        let sql = format!(
            "CREATE PUBLICATION {} FOR TABLE {}.{} WITH (publish = 'insert', publish_via_partition_root = true)",
            quote_ident(&spec.publication),
            quote_ident(&spec.schema),
            quote_ident(&spec.table)
        );
        if let Err(e) = client.batch_execute(&sql).await {
            if !created_concurrently(&e) {
                let err = sql_error(e);
                if err.is_transient() {
                    return Err(err.into());
                }
                return Err(SetupError::Problems(vec![Problem {
                    severity: Severity::Error,
                    what: format!("cannot create publication {:?}: {err}", spec.publication),
                    fix: format!(
                        "have the table's owner run `{sql}` (see sql/publication.sql), or grant Ferry's role ownership of the table"
                    ),
                }]));
            }
        }
    }
    if spec.create_slot && slot_state(client, &spec.slot).await?.is_none() {
        let res = client
            .query_one(
                "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&spec.slot],
            )
            .await;
        if let Err(e) = res {
            if !created_concurrently(&e) {
                let err = sql_error(e);
                if err.is_transient() {
                    return Err(err.into());
                }
                return Err(SetupError::Problems(vec![Problem {
                    severity: Severity::Error,
                    what: format!("cannot create replication slot {:?}: {err}", spec.slot),
                    fix: "check wal_level, max_replication_slots and the REPLICATION privilege (run `ferry check`)".into(),
                }]));
            }
        }
    }
    // Whatever is still missing now could not be created: an error, not a note.
    let created = SlotSpec {
        create_slot: false,
        create_publication: false,
        ..spec.clone()
    };
    let problems = check(client, &created).await?;
    let errors: Vec<Problem> = problems
        .into_iter()
        .filter(|p| p.severity == Severity::Error)
        .collect();
    if !errors.is_empty() {
        return Err(SetupError::Problems(errors));
    }
    Ok(slot_state(client, &spec.slot)
        .await?
        .expect("check() reports a missing slot"))
}

async fn table_kind(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
) -> Result<Option<(u32, i8)>, ReaderError> {
    let row = client
        .query_opt(
            "SELECT c.oid, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
            &[&spec.schema, &spec.table],
        )
        .await
        .map_err(sql_error)?;
    Ok(row.map(|r| (r.get::<_, u32>(0), r.get::<_, i8>(1))))
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
        .map_err(|_| ReaderError::Protocol(format!("server_version_num is not a number: {v:?}")))
}

/// A column of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableColumn {
    pub name: String,
    pub type_oid: u32,
    /// The type as PostgreSQL shows it (`format_type`), for messages.
    pub type_name: String,
}

/// The table's columns, in column order (empty if there is no such table).
pub async fn column_types(
    client: &tokio_postgres::Client,
    schema: &str,
    table: &str,
) -> Result<Vec<TableColumn>, ReaderError> {
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
            &[&schema, &table],
        )
        .await
        .map_err(sql_error)?;
    Ok(rows
        .iter()
        .map(|r| TableColumn {
            name: r.get(0),
            type_oid: r.get(1),
            type_name: r.get(2),
        })
        .collect())
}

/// The name of a built-in type, for messages.
fn type_name(oid: u32) -> String {
    match oid {
        16 => "boolean".into(),
        17 => "bytea".into(),
        20 => "bigint".into(),
        21 => "smallint".into(),
        23 => "integer".into(),
        25 => "text".into(),
        26 => "oid".into(),
        114 => "json".into(),
        1043 => "varchar".into(),
        1114 => "timestamp".into(),
        1184 => "timestamptz".into(),
        2950 => "uuid".into(),
        3802 => "jsonb".into(),
        other => format!("type OID {other}"),
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
    let table = format!("{}.{}", quote_ident(&spec.schema), quote_ident(&spec.table));

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
    let (user, can_replicate): (String, bool) = (role.get(0), role.get(1));
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

    let kind = table_kind(client, spec).await?;
    match kind {
        None => error(
            format!("table {table} does not exist (or is not a table)"),
            "create it (sql/outbox.sql has the Debezium-compatible DDL) or point outbox.table at your outbox".into(),
        ),
        Some(_) => {
            let columns = column_types(client, &spec.schema, &spec.table).await?;
            for req in &spec.required_columns {
                match columns.iter().find(|c| c.name == req.name) {
                    None => error(
                        format!(
                            "table {table} has no column {:?} (named by {})",
                            req.name, req.config_key
                        ),
                        format!(
                            "set {} to one of its columns ({}) or add the column",
                            req.config_key,
                            columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
                        ),
                    ),
                    Some(TableColumn { type_oid: ty, type_name: shown, .. }) => {
                        if let Some(ok) = &req.accepted_types {
                            if !ok.contains(ty) {
                                error(
                                    format!(
                                        "column {}.{} ({}) is of type {shown}, which Ferry cannot use there",
                                        table, req.name, req.config_key
                                    ),
                                    format!(
                                        "use a column of a type Ferry reads there ({}), or set {} to another column",
                                        ok.iter().map(|t| type_name(*t)).collect::<Vec<_>>().join(", "),
                                        req.config_key.split(' ').next().unwrap_or(&req.config_key)
                                    ),
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    let publication = client
        .query_opt(
            "SELECT puballtables, pubinsert, pubviaroot FROM pg_publication WHERE pubname = $1",
            &[&spec.publication],
        )
        .await
        .map_err(sql_error)?;
    let create_pub_sql = format!(
        "CREATE PUBLICATION {} FOR TABLE {table} WITH (publish = 'insert', publish_via_partition_root = true)",
        quote_ident(&spec.publication)
    );
    match publication {
        None if spec.create_publication => notes.push(Problem {
            severity: Severity::Note,
            what: format!("publication {:?} does not exist", spec.publication),
            fix: format!("none needed: Ferry creates it (`{create_pub_sql}`; its role must own the table)"),
        }),
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
            if kind.is_some() && !all {
                let covered: bool = client
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid \
                         WHERE p.pubname = $1 AND pr.prrelid = $2::text::regclass) \
                         OR EXISTS (SELECT 1 FROM pg_publication_namespace pn JOIN pg_publication p ON p.oid = pn.pnpubid \
                         JOIN pg_namespace n ON n.oid = pn.pnnspid WHERE p.pubname = $1 AND n.nspname = $3)",
                        &[&spec.publication, &table, &spec.schema],
                    )
                    .await
                    .map_err(sql_error)?
                    .get(0);
                if !covered {
                    error(
                        format!("publication {:?} does not include table {table}", spec.publication),
                        format!(
                            "run ALTER PUBLICATION {} ADD TABLE {table}",
                            quote_ident(&spec.publication)
                        ),
                    );
                }
            }
            if matches!(kind, Some((_, k)) if k == b'p' as i8) && !via_root {
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
    }

    let db: String = client
        .query_one("SELECT current_database()::text", &[])
        .await
        .map_err(sql_error)?
        .get(0);
    match slot_state(client, &spec.slot).await? {
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
    problems.extend(notes);
    Ok(problems)
}
