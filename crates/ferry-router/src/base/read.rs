//! Reading a mapped column of a row: the column (or the routing error naming its role when the
//! relation has none) and its value's bytes (or the error saying why they cannot be used). The
//! router, the topic plan and the CloudEvents output read every column through these.

use bytes::Bytes;

use crate::base::error::{FieldRole, RouteErrorReason};
use crate::base::row::{ColumnRef, OutboxRow, Slot};
use crate::base::value::natural_bytes;

/// The column `name` of `row`, or [`RouteErrorReason::MissingColumn`] naming its `role`.
pub(crate) fn column<'r, R: OutboxRow + ?Sized>(
    row: &'r R,
    name: &str,
    role: FieldRole,
) -> Result<ColumnRef<'r>, RouteErrorReason> {
    row.column(name).ok_or_else(|| missing(role, name))
}

/// [`column`], read as `slot` ([`OutboxRow::column_for`]).
pub(crate) fn column_for<'r, R: OutboxRow + ?Sized>(
    row: &'r R,
    slot: Slot,
    name: &str,
    role: FieldRole,
) -> Result<ColumnRef<'r>, RouteErrorReason> {
    row.column_for(slot, name)
        .ok_or_else(|| missing(role, name))
}

/// [`RouteErrorReason::MissingColumn`]: the relation has no column `name` for its `role`.
fn missing(role: FieldRole, name: &str) -> RouteErrorReason {
    RouteErrorReason::MissingColumn {
        role,
        column: name.to_owned(),
    }
}

/// The column's value as its natural bytes ([`natural_bytes`]); `None` for NULL.
pub(crate) fn value(
    c: &ColumnRef<'_>,
    name: &str,
    role: FieldRole,
) -> Result<Option<Bytes>, RouteErrorReason> {
    match c.value {
        None => Ok(None),
        Some(v) => natural_bytes(c.type_oid, c.binary, v)
            .map(Some)
            .map_err(|problem| invalid(role, name, problem)),
    }
}

/// [`RouteErrorReason::InvalidValue`]: the `role` column's value cannot be used.
pub(crate) fn invalid(role: FieldRole, column: &str, problem: String) -> RouteErrorReason {
    RouteErrorReason::InvalidValue {
        role,
        column: column.to_owned(),
        problem,
    }
}
