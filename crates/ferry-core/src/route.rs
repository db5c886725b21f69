//! From a decoded outbox event to the record to produce: the real router, and the poison-row
//! policy (`route.on_error`) for an event it cannot route.
//!
//! - `fail`: the session stops with [`crate::CoreError::Route`]; nothing past the row is
//!   confirmed, and Ferry exits with the fix in the message.
//! - `skip`: the row is counted and left out; its transaction confirms without it.
//! - `dead_letter`: the router renders the row for the dead-letter topic, which is produced in
//!   its place (and like any record, must be acknowledged before its transaction confirms).
//!
//! The policy is for poison *rows*. A table row without a column the configuration reads is not
//! one: the table changed under Ferry (a column renamed or dropped) and every later row fails
//! alike, so `skip` would silently drop, and `dead_letter` divert, every event from then on. It
//! stops the session whatever `on_error` says (a table-less message lacking a member is a bad
//! document like any other, and follows the policy).

use std::sync::Arc;

use bytes::Bytes;
use ferry_router::{
    ColumnRef, OnError, Record, RouteError, RouteErrorReason, Router, Slot, TableName,
};
use ferry_wal::assembly::{OutboxRow, RelationInfo};
use ferry_wal::pgoutput::ValueRef;

use crate::pass::PassAction;

/// Why the router rejected an event, as a closed set (a metric label; no data in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteErrorKind {
    MissingColumn,
    NullValue,
    NullPayload,
    InvalidValue,
    InvalidTopic,
    PayloadTooLarge,
    InvalidMessage,
}

impl RouteErrorKind {
    pub fn of(reason: &RouteErrorReason) -> Self {
        use RouteErrorReason as R;
        match reason {
            R::MissingColumn { .. } => RouteErrorKind::MissingColumn,
            R::NullValue { .. } => RouteErrorKind::NullValue,
            R::NullPayload { .. } => RouteErrorKind::NullPayload,
            R::InvalidValue { .. } => RouteErrorKind::InvalidValue,
            R::InvalidTopic { .. } => RouteErrorKind::InvalidTopic,
            R::PayloadTooLarge { .. } => RouteErrorKind::PayloadTooLarge,
            R::InvalidMessage { .. } => RouteErrorKind::InvalidMessage,
        }
    }
}

/// What the policy decided for an event.
#[derive(Debug)]
pub(crate) enum Routed {
    /// Produce this record (the routed one, or its dead-letter rendering). Boxed: it moves
    /// through the relay's and the session's action queues to the driver, and a pointer moves
    /// where 168 bytes were copied, about ten times a record.
    Produce {
        record: Box<Record>,
        dead_letter: bool,
    },
    /// `on_error = skip`.
    Skip,
    /// `on_error = fail`.
    Fail(RouteError),
}

/// Routes an outbox row, applying `route.on_error` if the router rejects it. `Err` carries the
/// kind of a rejection (for the metric) alongside the decision.
pub(crate) fn row(
    router: &Router,
    wal: &WalRow<'_>,
    commit_unix_micros: i64,
) -> (Routed, Option<RouteErrorKind>) {
    match router.route_row(wal, commit_unix_micros) {
        Ok(record) => (
            Routed::Produce {
                record: Box::new(record),
                dead_letter: false,
            },
            None,
        ),
        Err(e) if matches!(e.reason, RouteErrorReason::MissingColumn { .. }) => {
            let kind = Some(RouteErrorKind::of(&e.reason));
            (Routed::Fail(e), kind)
        }
        Err(e) => policy(router, Some(router.table()), e, |err| {
            router.dead_letter(wal, err, commit_unix_micros)
        }),
    }
}

/// Routes a transactional logical message with the outbox prefix, like [`row`].
pub(crate) fn message(
    router: &Router,
    content: &Bytes,
    commit_unix_micros: i64,
) -> (Routed, Option<RouteErrorKind>) {
    match router.route_message(content, commit_unix_micros) {
        Ok(record) => (
            Routed::Produce {
                record: Box::new(record),
                dead_letter: false,
            },
            None,
        ),
        Err(e) => policy(router, None, e, |err| {
            router.dead_letter_message(content, err, commit_unix_micros)
        }),
    }
}

/// The one-shot pass's `action` for an event whose outcome was `Routed::Fail` ([`crate::pass`]):
/// left out, or produced as `dead_letter` renders it. Without a dead-letter topic there is
/// nothing to produce, and the event still fails.
pub(crate) fn pass(
    routed: Routed,
    action: PassAction,
    dead_letter: impl FnOnce(&RouteError) -> Option<Record>,
) -> Routed {
    let Routed::Fail(error) = routed else {
        return routed;
    };
    match action {
        PassAction::Skip => Routed::Skip,
        PassAction::DeadLetter => match dead_letter(&error) {
            Some(record) => Routed::Produce {
                record: Box::new(record),
                dead_letter: true,
            },
            None => Routed::Fail(error),
        },
    }
}

/// `table`: the row's outbox table (`None` for a table-less message), for the log line.
fn policy(
    router: &Router,
    table: Option<&TableName>,
    error: RouteError,
    dead_letter: impl FnOnce(&RouteError) -> Option<Record>,
) -> (Routed, Option<RouteErrorKind>) {
    let kind = Some(RouteErrorKind::of(&error.reason));
    let routed = match router.on_error() {
        OnError::Fail => Routed::Fail(error),
        OnError::Skip => {
            tracing::warn!(error = %error, table = table.map(tracing::field::display),
                "skipping an outbox event that cannot be routed (on_error = skip)");
            Routed::Skip
        }
        OnError::DeadLetter => match dead_letter(&error) {
            Some(record) => {
                tracing::warn!(error = %error, topic = %record.topic, table = table.map(tracing::field::display),
                    "sending an outbox event that cannot be routed to the dead-letter topic");
                Routed::Produce {
                    record: Box::new(record),
                    dead_letter: true,
                }
            }
            // The router renders a dead letter whenever the policy is `dead_letter` (and the
            // configuration requires its topic), so this is unreachable; were it not, there is
            // nothing to produce.
            None => Routed::Skip,
        },
    };
    (routed, kind)
}

/// Where a router's slot columns ([`ferry_router::Slot`]) are in one table's relation: found
/// by name when a row of a relation not seen before comes (a Relation message describes the
/// table anew after each change of it), then by place. Finding five columns by name took ~500
/// instructions a row.
#[derive(Debug, Default)]
pub(crate) struct Places {
    /// Held, so that its address cannot be another relation's while it is compared.
    relation: Option<Arc<RelationInfo>>,
    at: [Option<usize>; Slot::COUNT],
}

impl Places {
    /// The places of `router`'s slot columns in `relation`.
    pub(crate) fn of(
        &mut self,
        relation: &Arc<RelationInfo>,
        router: &Router,
    ) -> &[Option<usize>; Slot::COUNT] {
        if !self
            .relation
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(r, relation))
        {
            self.at = router
                .slot_columns()
                .map(|name| name.and_then(|n| relation.column_index(n)));
            self.relation = Some(relation.clone());
        }
        &self.at
    }
}

/// No place known: every column by name.
const BY_NAME: [Option<usize>; Slot::COUNT] = [None; Slot::COUNT];

/// A decoded row, as the router reads it.
pub(crate) struct WalRow<'a> {
    row: &'a OutboxRow,
    /// Where the slot columns are in `row`'s relation ([`Places::of`]).
    at: &'a [Option<usize>; Slot::COUNT],
}

impl<'a> WalRow<'a> {
    /// `row`, whose router's slot columns are at `at` in its relation.
    pub(crate) fn placed(row: &'a OutboxRow, at: &'a [Option<usize>; Slot::COUNT]) -> Self {
        WalRow { row, at }
    }

    /// `row`, every column found by name.
    pub(crate) fn by_name(row: &'a OutboxRow) -> Self {
        WalRow { row, at: &BY_NAME }
    }

    fn at(&self, i: usize) -> Option<ColumnRef<'_>> {
        let (type_oid, value) = self.row.at(i)?;
        let (value, binary) = match value {
            ValueRef::Null | ValueRef::UnchangedToast => (None, false),
            ValueRef::Text(v) => (Some(v), false),
            ValueRef::Binary(v) => (Some(v), true),
        };
        Some(ColumnRef {
            type_oid,
            value,
            binary,
        })
    }
}

impl ferry_router::OutboxRow for WalRow<'_> {
    fn column(&self, name: &str) -> Option<ColumnRef<'_>> {
        self.at(self.row.relation.column_index(name)?)
    }

    fn column_for(&self, slot: Slot, name: &str) -> Option<ColumnRef<'_>> {
        match self.at[slot as usize] {
            Some(i) => {
                // A slot names one column for its router ([`Router::slot_columns`]).
                debug_assert_eq!(self.row.relation.columns[i].name, name);
                self.at(i)
            }
            None => self.column(name),
        }
    }
}
