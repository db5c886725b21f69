//! The outbox tables as the catalog shows them: whether each exists and its kind, its columns and
//! their types; the names of types, and the column a mistyped name most likely meant.

use super::{sql_error, TableSpec};
use crate::conn::error::ReaderError;

pub(super) async fn table_kind(
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
