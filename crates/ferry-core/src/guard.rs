//! The binary-mode relation guard: in pgoutput's binary mode, every new layout of the outbox
//! table that the stream announces is checked once; a column the router reads whose type it
//! cannot render from binary ends the session (transiently: the next session streams text, see
//! the binary's `pipeline::binary`). Nothing is routed from a value that cannot be read.

use std::sync::Arc;

use ferry_router::{renders_binary, Routers};
use ferry_wal::assembly::RelationInfo;

/// Per outbox table: the columns its router reads, and the last relation layout found readable.
#[derive(Debug)]
pub(crate) struct BinaryGuard {
    tables: Vec<(Vec<String>, Option<Arc<RelationInfo>>)>,
}

impl BinaryGuard {
    pub fn new(routers: &Routers) -> Self {
        BinaryGuard {
            tables: routers
                .iter()
                .map(|r| (r.columns().into_iter().map(String::from).collect(), None))
                .collect(),
        }
    }

    /// The first column read from the `table`-th outbox table that the layout gives a type
    /// readable only as text, if any. Each layout is checked once: rows share their relation's
    /// `Arc`.
    pub fn check(&mut self, table: usize, relation: &Arc<RelationInfo>) -> Option<(String, u32)> {
        let (read, checked) = self.tables.get_mut(table)?;
        if checked.as_ref().is_some_and(|c| Arc::ptr_eq(c, relation)) {
            return None;
        }
        let read: Vec<&str> = read.iter().map(String::as_str).collect();
        let layout = relation.columns.iter().map(|c| (&c.name, c.type_oid));
        if let Some(found) = unreadable(&read, layout) {
            return Some(found);
        }
        *checked = Some(relation.clone());
        None
    }
}

/// The first column the router reads whose type it cannot render from binary, if any.
/// `columns` is the table's layout (name, type OID); columns it lacks are the router's to report.
pub fn unreadable<'c, S: AsRef<str> + 'c>(
    read: &[&str],
    columns: impl IntoIterator<Item = (&'c S, u32)>,
) -> Option<(String, u32)> {
    columns
        .into_iter()
        .find(|(name, type_oid)| read.contains(&name.as_ref()) && !renders_binary(*type_oid))
        .map(|(name, type_oid)| (name.as_ref().to_string(), type_oid))
}
