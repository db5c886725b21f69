//! What the publication covers: each outbox table's membership (and whether it was interrupted),
//! the tables it lists that no entry relays, the other tables it carries by design, and what a
//! relation whose row the reader refused is now.

use super::{quote_ident, server_version_num, sql_error, Problem, Severity, SlotSpec, TableSpec};
use crate::conn::error::ReaderError;

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
pub(super) async fn covers(
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
