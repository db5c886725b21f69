//! [`check`]: every problem that would stop Ferry, or that an operator should know, each with
//! its fix.
//!
//! Two steps. [`read`] asks the server and writes its answers down as [`Facts`], deciding
//! nothing; [`problems`] then judges them without I/O, so every problem, note and warning the
//! check reports, its words and its place in the list are unit-tested without a server
//! (`problems/tests.rs`).
//!
//! The reader leaves out only what cannot be asked or cannot matter: a missing table has no
//! columns; whether the publication covers a table is asked only of an existing table whose
//! schema the role may use (the lookup is by name) and of a publication that is not `FOR ALL
//! TABLES`; the failover facts are read only for a failover slot (see [`failover::read`]).

use super::failover::{self, FailoverFacts};
use super::privileges::{RoleGrants, TableGrants};
use super::problems::problems;
use super::publication::covers;
use super::tables::table_kind;
use super::{
    capacity, column_types, replication_privilege, slot_state, sql_error, unrelayed_tables,
    Capacity, Problem, SlotSpec, SlotState, TableColumn,
};
use crate::conn::error::ReaderError;
use futures_util::future::try_join_all;

/// Every problem that would stop Ferry (or that an operator should know), with its fix.
pub async fn check(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
) -> Result<Vec<Problem>, ReaderError> {
    Ok(problems(spec, &read(client, spec).await?))
}

/// What [`check`] reads from the server, as the server answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Facts {
    /// `current_setting('wal_level')`.
    pub wal_level: String,
    /// `current_user`, and whether it may start a walsender ([`replication_privilege`]).
    pub role: String,
    pub can_replicate: bool,
    /// One per [`SlotSpec::tables`], in its order.
    pub tables: Vec<TableFacts>,
    /// What the role may do with the outbox tables ([`role_grants`]).
    pub grants: RoleGrants,
    /// The publication's row; `None` when there is no such publication.
    pub publication: Option<PublicationFacts>,
    /// `current_database()`.
    pub database: String,
    /// The server's replication slots and WAL senders ([`capacity`](capacity())).
    pub capacity: Capacity,
    /// The slot's row ([`slot_state`]); `None` when there is no such slot.
    pub slot: Option<SlotState>,
    /// Read only for a failover slot (`spec.failover`).
    pub failover: Option<FailoverFacts>,
}

/// One outbox table as the catalog shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableFacts {
    /// `pg_class.relkind`: `b'r'` for a table, `b'p'` for a partitioned one; `None` when there
    /// is no such table (or it is not a table).
    pub relkind: Option<u8>,
    /// Its columns in column order ([`column_types`]); empty when there is no such table.
    pub columns: Vec<TableColumn>,
}

/// The publication's row in `pg_publication`, and what it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublicationFacts {
    /// `puballtables`: `FOR ALL TABLES`.
    pub all_tables: bool,
    /// `pubinsert`: it publishes INSERTs.
    pub insert: bool,
    /// `pubviaroot`: `publish_via_partition_root`.
    pub via_root: bool,
    /// One per [`SlotSpec::tables`]: whether the publication lists the table or its schema
    /// ([`covers`]); `None` where it was not asked (a missing table, a schema without USAGE, a
    /// publication `FOR ALL TABLES`).
    pub covers: Vec<Option<bool>>,
    /// The tables it lists that no outbox table entry relays ([`unrelayed_tables`]).
    pub unrelayed: Vec<String>,
}

/// Asks the server everything [`check`] judges (see the module's notes on what is left out).
///
/// Every query that needs no other's answer goes out at once: tokio-postgres pipelines the
/// requests of one connection, so a read costs the round trips of its longest chain (a table's
/// kind, then its columns; then what the publication covers), not one per query.
pub(crate) async fn read(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
) -> Result<Facts, ReaderError> {
    let wal_level = async {
        client
            .query_one("SELECT current_setting('wal_level')", &[])
            .await
            .map_err(sql_error)
            .map(|r| r.get::<_, String>(0))
    };
    let tables = try_join_all(spec.tables.iter().map(|t| async move {
        let kind = table_kind(client, t).await?;
        let columns = match kind {
            Some(_) => column_types(client, &t.schema, &t.table).await?,
            None => Vec::new(),
        };
        Ok::<_, ReaderError>(TableFacts {
            relkind: kind.map(|(_, k)| k as u8),
            columns,
        })
    }));
    let publication = async {
        client
            .query_opt(
                "SELECT puballtables, pubinsert, pubviaroot FROM pg_publication WHERE pubname = $1",
                &[&spec.publication],
            )
            .await
            .map_err(sql_error)
    };
    let database = async {
        client
            .query_one("SELECT current_database()::text", &[])
            .await
            .map_err(sql_error)
            .map(|r| r.get::<_, String>(0))
    };
    let failover = async {
        match spec.failover {
            true => failover::read(client).await.map(Some),
            false => Ok(None),
        }
    };
    let (
        wal_level,
        (role, can_replicate),
        tables,
        grants,
        publication,
        database,
        capacity,
        slot,
        failover,
    ) = tokio::try_join!(
        wal_level,
        replication_privilege(client),
        tables,
        role_grants(client, spec),
        publication,
        database,
        capacity(client),
        slot_state(client, &spec.slot),
        failover,
    )?;

    let publication = match publication {
        None => None,
        Some(p) => {
            let (all_tables, insert, via_root): (bool, bool, bool) = (p.get(0), p.get(1), p.get(2));
            let covered = try_join_all(spec.tables.iter().zip(&tables).zip(&grants.tables).map(
                |((t, table), g)| async move {
                    // covers() looks the table up by name, which needs the table and USAGE on
                    // its schema (both reported on their own); FOR ALL TABLES covers every
                    // table.
                    let ask = table.relkind.is_some() && g.schema_usage && !all_tables;
                    match ask {
                        true => covers(client, spec, t).await.map(Some),
                        false => Ok(None),
                    }
                },
            ));
            let (covered, unrelayed) = tokio::try_join!(covered, unrelayed_tables(client, spec))?;
            Some(PublicationFacts {
                all_tables,
                insert,
                via_root,
                covers: covered,
                unrelayed,
            })
        }
    };
    Ok(Facts {
        wal_level,
        role,
        can_replicate,
        tables,
        grants,
        publication,
        database,
        capacity,
        slot,
        failover,
    })
}

/// What the current role may do with the outbox tables ([`privileges`](super::privileges)
/// judges it).
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
