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

pub mod privileges;
pub use privileges::{RoleGrants, TableGrants};

use crate::conn::config::{ConnectConfig, Host, SslMode, TargetSessionAttrs};
use crate::conn::error::ReaderError;
use crate::conn::tls;
use crate::Lsn;

/// What the outbox needs from the database.
#[derive(Debug, Clone)]
pub struct SlotSpec {
    pub slot: String,
    pub publication: String,
    /// The outbox tables (at least one), all in the one publication.
    pub tables: Vec<TableSpec>,
    pub create_slot: bool,
    pub create_publication: bool,
    /// A failover slot (PostgreSQL 17+): created with `failover = true`, or made one, so a
    /// standby with `sync_replication_slots` keeps a copy that survives a promotion.
    pub failover: bool,
}

/// An outbox table and the columns read from it.
#[derive(Debug, Clone)]
pub struct TableSpec {
    pub schema: String,
    pub table: String,
    /// The configuration key that names the table (`outbox.table`), for messages.
    pub config_key: String,
    /// Columns the router reads, with the types it accepts.
    pub required_columns: Vec<RequiredColumn>,
}

impl TableSpec {
    /// A table read with no column requirements, named by `outbox.table`.
    pub fn new(schema: impl Into<String>, table: impl Into<String>) -> Self {
        TableSpec {
            schema: schema.into(),
            table: table.into(),
            config_key: "outbox.table".into(),
            required_columns: Vec::new(),
        }
    }

    /// The quoted, schema-qualified name (`"public"."outbox"`).
    pub fn qualified(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.table))
    }
}

impl SlotSpec {
    /// The tables, quoted and comma-separated, as `CREATE PUBLICATION ... FOR TABLE` lists them.
    pub fn table_list(&self) -> String {
        self.tables
            .iter()
            .map(TableSpec::qualified)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// What the reader counts as the outbox: these tables, and the messages with `message_prefix`.
    pub fn outbox_source(&self, message_prefix: Option<String>) -> crate::assembly::OutboxSource {
        crate::assembly::OutboxSource {
            tables: self
                .tables
                .iter()
                .map(|t| crate::assembly::SourceTable {
                    schema: t.schema.clone(),
                    table: t.table.clone(),
                })
                .collect(),
            message_prefix,
            other_tables: crate::assembly::OtherTables::default(),
            oids: Vec::new(),
        }
    }

    /// The SQL that creates the publication for every table.
    pub fn create_publication_sql(&self) -> String {
        format!(
            "CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert', publish_via_partition_root = true)",
            quote_ident(&self.publication),
            self.table_list()
        )
    }
}

/// A column the router needs.
#[derive(Debug, Clone)]
pub struct RequiredColumn {
    pub name: String,
    /// The configuration key that names it, for the error message (`outbox.payload_column`).
    pub config_key: String,
    /// The types the caller can read there; `None` accepts any type.
    pub accepted_types: Option<AcceptedTypes>,
}

/// The types a [`RequiredColumn`] may have. Which types, and what to tell an operator whose
/// column has another, are the caller's policy (the router's), not the reader's.
#[derive(Debug, Clone)]
pub struct AcceptedTypes {
    /// Accepted type OIDs.
    pub oids: Vec<u32>,
    /// The fix reported when the column has another type, e.g. "use a column of type jsonb, ...".
    pub fix: String,
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
    /// `failover` (PostgreSQL 17+; `None` before).
    pub failover: Option<bool>,
    /// `synced`: a standby's copy of a primary's failover slot (PostgreSQL 17+).
    pub synced: Option<bool>,
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

/// Opens an ordinary SQL connection with the same settings as the replication stream: the same
/// hosts tried in the same order, over sockets opened the same way, with the same TLS and the
/// same `target_session_attrs` check; the connection task runs on the current runtime.
pub async fn connect_sql(cfg: &ConnectConfig) -> Result<tokio_postgres::Client, ReaderError> {
    let mut attempts = Vec::new();
    for target in cfg.targets() {
        match connect_sql_one(&target).await {
            Ok(client) => return Ok(client),
            Err(e) => attempts.push((target.server(), e)),
        }
    }
    Err(ReaderError::from_attempts(attempts))
}

async fn connect_sql_one(cfg: &ConnectConfig) -> Result<tokio_postgres::Client, ReaderError> {
    let mut pg = tokio_postgres::Config::new();
    pg.user(&cfg.user)
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
    let timeout = cfg.connect_timeout.unwrap_or(Duration::from_secs(3600));
    // TLS over a Unix socket is impossible (the configuration allows at most `prefer` there).
    let tls_config = match cfg.host {
        Host::Unix(_) => None,
        Host::Tcp(_) => tls::client_config(cfg)?,
    };
    let connect = async {
        let client = match (crate::conn::net::open(cfg).await?, tls_config) {
            (crate::conn::net::Socket::Unix(unix), _) => {
                let (client, conn) = pg
                    .connect_raw(unix, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| connect_error(e, cfg))?;
                tokio::spawn(conn);
                client
            }
            (crate::conn::net::Socket::Tcp(tcp, _), None) => {
                let (client, conn) = pg
                    .connect_raw(tcp, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| connect_error(e, cfg))?;
                tokio::spawn(conn);
                client
            }
            (crate::conn::net::Socket::Tcp(tcp, host), Some(tls_config)) => {
                let tls =
                    tokio_postgres::tls::MakeTlsConnect::<tokio::net::TcpStream>::make_tls_connect(
                        &mut tls::MakeRustlsConnect::new(tls_config),
                        &host,
                    )?;
                let (client, conn) =
                    pg.connect_raw(tcp, tls).await.map_err(
                        |e| match tls::rejected_certificate(&e) {
                            Some(reason) => tls::certificate_error(reason, cfg),
                            None => connect_error(e, cfg),
                        },
                    )?;
                tokio::spawn(conn);
                client
            }
        };
        check_session_attrs(&client, cfg).await?;
        Ok(client)
    };
    tokio::time::timeout(timeout, connect)
        .await
        .map_err(|_| ReaderError::Timeout {
            what: "connecting to PostgreSQL",
            secs: timeout.as_secs(),
        })?
}

/// `target_session_attrs` on the SQL connection, by asking as libpq does with servers that do
/// not report their state (the replication connection reads the reported state).
async fn check_session_attrs(
    client: &tokio_postgres::Client,
    cfg: &ConnectConfig,
) -> Result<(), ReaderError> {
    let first = |rows: Vec<tokio_postgres::SimpleQueryMessage>| {
        rows.into_iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .unwrap_or_default()
    };
    let (what, wanted) = match cfg.target_session_attrs {
        TargetSessionAttrs::Any => return Ok(()),
        TargetSessionAttrs::ReadWrite => {
            let rows = client
                .simple_query("SHOW transaction_read_only")
                .await
                .map_err(sql_error)?;
            if first(rows) != "on" {
                return Ok(());
            }
            ("read-only", "read-write")
        }
        TargetSessionAttrs::Primary => {
            let rows = client
                .simple_query("SELECT pg_catalog.pg_is_in_recovery()")
                .await
                .map_err(sql_error)?;
            if first(rows) != "t" {
                return Ok(());
            }
            ("a standby (in recovery)", "primary")
        }
    };
    Err(ReaderError::Unsuitable {
        server: cfg.server(),
        what,
        wanted,
    })
}

/// A failed connection attempt of tokio-postgres, with its cause kept: the server's refusal
/// (authentication as [`ReaderError::Auth`]), the I/O error, or a missing password.
fn connect_error(e: tokio_postgres::Error, cfg: &ConnectConfig) -> ReaderError {
    if let Some(db) = e.as_db_error() {
        if db.code().code().starts_with("28") {
            let server = crate::conn::error::ServerError {
                severity: db.severity().to_string(),
                code: db.code().code().to_string(),
                message: db.message().to_string(),
                detail: db.detail().map(Into::into),
                hint: db.hint().map(Into::into),
            }
            .with_fix();
            let fix = if server.hint.is_some() {
                ""
            } else {
                "; check the user name and password, and pg_hba.conf"
            };
            return ReaderError::Auth {
                user: cfg.user.clone(),
                reason: format!("{server}{fix}"),
            };
        }
        let mut err = sql_error(e);
        if let ReaderError::Server(s) = &mut err {
            if s.hint.is_none() {
                s.hint = privileges::connect_refusal_hint(
                    &s.code,
                    &s.message,
                    s.detail.as_deref(),
                    &cfg.user,
                    &cfg.dbname,
                );
            }
        }
        return err;
    }
    let text = e.to_string();
    if text == "invalid configuration" && cfg.password.is_none() {
        // tokio-postgres: "password missing" when the server asks for one.
        return ReaderError::Auth {
            user: cfg.user.clone(),
            reason: crate::conn::replication::no_password("password, md5 or SCRAM-SHA-256", cfg),
        };
    }
    sql_error(e)
}

/// Maps a tokio-postgres error into the reader's families, keeping its cause (tokio-postgres
/// prints only its kind, "error connecting to server", and keeps the reason as the source).
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
    let mut text = e.to_string();
    let mut kind = std::io::ErrorKind::Other;
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            kind = io.kind();
        }
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    ReaderError::Io {
        context: "talking to PostgreSQL",
        source: std::io::Error::new(kind, text),
    }
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
/// replication connection closed), waiting at most `timeout`. A slot already gone is fine.
/// Only for a slot Ferry itself just created and never confirmed (a failed first start).
pub async fn drop_inactive(
    client: &tokio_postgres::Client,
    slot: &str,
    timeout: std::time::Duration,
) -> Result<(), ReaderError> {
    let deadline = tokio::time::Instant::now() + timeout;
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

/// Creates the publication, and the slot when `spec.create_slot` allows, then [`check`]s.
/// Returns the slot's state when there is no error-level problem.
///
/// A missing slot is not always Ferry's to create: a slot Ferry streamed before and that is now
/// gone means lost events, and creating a new one would hide them. The pipeline therefore
/// decides first (`ferry_core::verdict`, from the progress record) and sets `create_slot` only
/// for a first start or a gap the operator accepted.
pub async fn ensure(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
) -> Result<SlotState, SetupError> {
    // Validate before creating anything: a start that fails anyway must not leave a new slot
    // behind (it would retain WAL until someone drops it). What is missing and may be created is
    // a note here, not an error.
    let errors = errors_of(check(client, spec).await?);
    if !errors.is_empty() {
        return Err(SetupError::Problems(errors));
    }
    let exists: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)",
            &[&spec.publication],
        )
        .await
        .map_err(sql_error)?
        .get(0);
    let mut all_exist = true;
    for t in &spec.tables {
        all_exist &= table_kind(client, t).await?.is_some();
    }
    if !exists && spec.create_publication && all_exist {
        let sql = spec.create_publication_sql();
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
    // An existing publication is never altered: the operator owns it (it may serve other
    // subscribers, which would start receiving an added table's rows). A table it lacks is an
    // error from check() below, with the ALTER PUBLICATION to run.
    if spec.create_slot && slot_state(client, &spec.slot).await?.is_none() {
        // failover (the fifth argument) exists from PostgreSQL 17 on; check() refuses it before.
        let failover = spec.failover && server_version_num(client).await? >= 170000;
        let res = client
            .query_one(
                if failover {
                    "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
                } else {
                    "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')"
                },
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
    let errors = errors_of(check(client, &created).await?);
    if !errors.is_empty() {
        return Err(SetupError::Problems(errors));
    }
    Ok(slot_state(client, &spec.slot)
        .await?
        .expect("check() reports a missing slot"))
}

fn errors_of(problems: Vec<Problem>) -> Vec<Problem> {
    problems
        .into_iter()
        .filter(|p| p.severity == Severity::Error)
        .collect()
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

async fn table_kind(
    client: &tokio_postgres::Client,
    t: &TableSpec,
) -> Result<Option<(u32, i8)>, ReaderError> {
    let row = client
        .query_opt(
            "SELECT c.oid, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
            &[&t.schema, &t.table],
        )
        .await
        .map_err(sql_error)?;
    Ok(row.map(|r| (r.get::<_, u32>(0), r.get::<_, i8>(1))))
}

/// How the publication covers each outbox table right now (in [`SlotSpec::tables`]' order), as an
/// identity that changes whenever the coverage was interrupted: `None` when it does not cover the
/// table (the table was dropped, or taken out with `ALTER PUBLICATION ... DROP TABLE`, or the
/// publication is gone).
///
/// Rows committed while a table is out of the publication are never decoded for it, so a session
/// that sees this identity change knows the stream may have a gap:
///
/// - `FOR ALL TABLES` covers every table from its creation: the identity is the publication's
///   OID, whatever happens to the table (a recreated table's rows are in the stream);
/// - `FOR TABLES IN SCHEMA` (15+) likewise: the schema membership row's OID;
/// - a table listed by name: the OID of its `pg_publication_rel` row, which a table dropped and
///   recreated, or taken out and added back, only gets anew, even when both happened between two
///   looks.
pub async fn publication_membership(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
) -> Result<Vec<Option<String>>, ReaderError> {
    let mut identity = Vec::with_capacity(spec.tables.len());
    for t in &spec.tables {
        identity.push(table_membership(client, spec, t).await?);
    }
    Ok(identity)
}

async fn table_membership(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
    t: &TableSpec,
) -> Result<Option<String>, ReaderError> {
    let table = t.qualified();
    let by_schema = if server_version_num(client).await? >= 150000 {
        "(SELECT 'schema membership ' || pn.oid FROM pg_publication_namespace pn \
         JOIN pg_namespace n ON n.oid = pn.pnnspid WHERE pn.pnpubid = p.oid AND n.nspname = $3)"
    } else {
        "(SELECT NULL::text WHERE $3::text IS NULL)"
    };
    let row = client
        .query_opt(
            &format!(
                "SELECT COALESCE( \
                   CASE WHEN p.puballtables THEN 'all tables ' || p.oid END, \
                   {by_schema}, \
                   (SELECT 'table membership ' || pr.oid FROM pg_publication_rel pr \
                     WHERE pr.prpubid = p.oid AND pr.prrelid = to_regclass($2)::oid)) \
                 FROM pg_publication p WHERE p.pubname = $1"
            ),
            &[&spec.publication, &table, &t.schema],
        )
        .await
        .map_err(sql_error)?;
    Ok(row.and_then(|r| r.get(0)))
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

/// The column of `columns` a mistyped `name` most likely meant: the nearest by edit distance
/// (case and `_` ignored), when it is near enough to be a typo (fewer edits than a quarter of
/// its length: `aggregatid` names `aggregateid`, `nope` does not name `note`); `None` otherwise.
pub fn nearest_column<'a>(name: &str, columns: &[&'a str]) -> Option<&'a str> {
    let fold = |s: &str| -> Vec<u8> {
        s.bytes()
            .filter(|b| *b != b'_')
            .map(|b| b.to_ascii_lowercase())
            .collect()
    };
    let want = fold(name);
    let (distance, column) = columns
        .iter()
        .map(|c| (edit_distance(&want, &fold(c)), *c))
        .min_by_key(|(d, _)| *d)?;
    (distance * 4 < column.len()).then_some(column)
}

/// Levenshtein distance in bytes.
fn edit_distance(a: &[u8], b: &[u8]) -> usize {
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = prev[j] + usize::from(ca != cb);
            cur[j + 1] = substitute.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
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

/// PostgreSQL's name for a type (`format_type`: `integer`, `public.event_kind` outside the
/// search path, `event_kind` within it), for messages.
pub async fn format_type(client: &tokio_postgres::Client, oid: u32) -> Result<String, ReaderError> {
    let row = client
        .query_one("SELECT format_type($1, NULL)", &[&oid])
        .await
        .map_err(sql_error)?;
    let name: Option<String> = row.get(0);
    Ok(name.unwrap_or_else(|| type_name(oid)))
}

/// The name of a built-in type, for messages where the server cannot be asked (the types Ferry
/// accepts are all built in); [`format_type`] where it can.
pub fn type_name(oid: u32) -> String {
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

/// The problem of a table the publication lists by name that no outbox table entry relays: the
/// same words at `ferry check`, at start and when the stream meets one of its rows.
pub fn unrelayed_table(publication: &str, table: &str) -> Problem {
    let name = table.replace('"', "");
    Problem {
        severity: Severity::Error,
        what: format!(
            "publication {publication:?} includes table {table}, which no [outbox] or [[tables]] entry \
             relays: Ferry would skip its rows and confirm the slot past them, so they would never reach Kafka"
        ),
        fix: format!(
            "relay it: add a [[tables]] entry with outbox.table = {name:?} (then restart Ferry); or, if Ferry \
             should not relay it, take it out: ALTER PUBLICATION {} DROP TABLE {table} (or give Ferry a \
             publication of its own: postgres.publication = \"ferry_outbox\" with postgres.create_publication = true)",
            quote_ident(publication)
        ),
    }
}

/// The tables the publication lists by name (`FOR TABLE`) that are none of `spec`'s tables nor
/// a partition of one, quoted and schema-qualified: each is an [`unrelayed_table`] problem.
pub async fn unrelayed_tables(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
) -> Result<Vec<String>, ReaderError> {
    let rows = client
        .query(
            "SELECT n.nspname::text, c.relname::text, rn.nspname::text, r.relname::text \
             FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid \
             JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_class r ON r.oid = COALESCE(pg_partition_root(c.oid), c.oid) JOIN pg_namespace rn ON rn.oid = r.relnamespace \
             WHERE p.pubname = $1 ORDER BY 1, 2",
            &[&spec.publication],
        )
        .await
        .map_err(sql_error)?;
    let ours = |schema: &str, table: &str| {
        spec.tables
            .iter()
            .any(|t| t.schema == schema && t.table == table)
    };
    Ok(rows
        .iter()
        .filter(|r| !ours(r.get(0), r.get(1)) && !ours(r.get(2), r.get(3)))
        .map(|r| format!("{}.{}", quote_ident(r.get(0)), quote_ident(r.get(1))))
        .collect())
}

/// Each outbox table's oid and its partitions', with the table's position in `spec.tables`
/// ([`OutboxSource::oids`](crate::assembly::OutboxSource::oids)).
pub async fn outbox_oids(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
) -> Result<Vec<(u32, usize)>, ReaderError> {
    let mut oids = Vec::new();
    for (i, t) in spec.tables.iter().enumerate() {
        let rows = client
            .query(
                "SELECT to_regclass($1)::oid WHERE to_regclass($1) IS NOT NULL \
                 UNION SELECT relid::oid FROM pg_partition_tree(to_regclass($1))",
                &[&t.qualified()],
            )
            .await
            .map_err(sql_error)?;
        oids.extend(rows.iter().map(|r| (r.get::<_, u32>(0), i)));
    }
    Ok(oids)
}

/// What a relation whose row the reader refused ([`AssemblyError::UnrelayedInsert`](crate::assembly::AssemblyError::UnrelayedInsert)) is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// An outbox table, or a partition of one, under another name than when the row was
    /// committed: a new session maps it by oid.
    Outbox { now: String },
    /// In a schema the publication now covers wholesale: a new session skips it by design.
    WholeSchema,
    /// Listed in the publication by name, and no entry relays it.
    Listed { now: String },
    /// Not in the publication any more (taken out, or dropped).
    Out,
}

/// What the relation `oid` is now, for the publication and the outbox tables of `spec`.
pub async fn standing(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
    oid: u32,
) -> Result<Standing, ReaderError> {
    let row = client
        .query_opt(
            "SELECT n.nspname::text, c.relname::text, rn.nspname::text, r.relname::text, \
               EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid \
                       WHERE p.pubname = $2 AND pr.prrelid = c.oid) \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_class r ON r.oid = COALESCE(pg_partition_root(c.oid), c.oid) \
             JOIN pg_namespace rn ON rn.oid = r.relnamespace WHERE c.oid = $1",
            &[&oid, &spec.publication],
        )
        .await
        .map_err(sql_error)?;
    let Some(row) = row else {
        return Ok(Standing::Out);
    };
    let (schema, name, root_schema, root): (String, String, String, String) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    let listed: bool = row.get(4);
    let now = format!("{}.{}", quote_ident(&schema), quote_ident(&name));
    let ours = |s: &str, t: &str| spec.tables.iter().any(|x| x.schema == s && x.table == t);
    if ours(&schema, &name) || ours(&root_schema, &root) {
        return Ok(Standing::Outbox { now });
    }
    if other_tables(client, spec).await?.skips(&schema, &name) {
        return Ok(Standing::WholeSchema);
    }
    Ok(match listed {
        true => Standing::Listed { now },
        false => Standing::Out,
    })
}

/// Which other tables' INSERTs the publication carries by design, so the reader skips them
/// rather than stop ([`OtherTables`](crate::assembly::OtherTables)): all of them for `FOR ALL
/// TABLES`, those of its schemas for `FOR TABLES IN SCHEMA` (15+), none otherwise.
pub async fn other_tables(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
) -> Result<crate::assembly::OtherTables, ReaderError> {
    let mut other = crate::assembly::OtherTables::default();
    let all: Option<bool> = client
        .query_opt(
            "SELECT puballtables FROM pg_publication WHERE pubname = $1",
            &[&spec.publication],
        )
        .await
        .map_err(sql_error)?
        .map(|r| r.get(0));
    other.all = all == Some(true);
    if !other.all && server_version_num(client).await? >= 150000 {
        other.schemas = client
            .query(
                "SELECT n.nspname::text FROM pg_publication_namespace pn JOIN pg_publication p ON p.oid = pn.pnpubid \
                 JOIN pg_namespace n ON n.oid = pn.pnnspid WHERE p.pubname = $1 ORDER BY 1",
                &[&spec.publication],
            )
            .await
            .map_err(sql_error)?
            .iter()
            .map(|r| r.get(0))
            .collect();
    }
    Ok(other)
}

/// Whether the publication lists the table, or its schema (`FOR TABLES IN SCHEMA`, 15+). A
/// publication `FOR ALL TABLES` is the caller's to check (`pg_publication.puballtables`).
async fn covers(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
    t: &TableSpec,
) -> Result<bool, ReaderError> {
    let by_schema = if server_version_num(client).await? >= 150000 {
        "OR EXISTS (SELECT 1 FROM pg_publication_namespace pn JOIN pg_publication p ON p.oid = pn.pnpubid \
         JOIN pg_namespace n ON n.oid = pn.pnnspid WHERE p.pubname = $1 AND n.nspname = $3)"
    } else {
        "OR $3::text IS NULL"
    };
    Ok(client
        .query_one(
            &format!(
                "SELECT EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid \
                 WHERE p.pubname = $1 AND pr.prrelid = $2::text::regclass) {by_schema}"
            ),
            &[&spec.publication, &t.qualified(), &t.schema],
        )
        .await
        .map_err(sql_error)?
        .get(0))
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

#[cfg(test)]
mod tests {
    use super::nearest_column;

    #[test]
    fn the_nearest_column_is_named_only_when_it_is_a_likely_typo() {
        let columns = ["id", "aggregatetype", "aggregateid", "type", "payload"];
        assert_eq!(
            nearest_column("aggregate_id", &columns),
            Some("aggregateid")
        );
        assert_eq!(nearest_column("AggregateId", &columns), Some("aggregateid"));
        assert_eq!(nearest_column("aggregatid", &columns), Some("aggregateid"));
        assert_eq!(nearest_column("payloads", &columns), Some("payload"));
        assert_eq!(nearest_column("event_body", &columns), None);
        assert_eq!(nearest_column("nope", &["payload", "note"]), None);
        assert_eq!(nearest_column("x", &[]), None);
    }
}
