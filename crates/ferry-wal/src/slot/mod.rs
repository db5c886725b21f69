//! Slot and publication management over an ordinary SQL connection (tokio-postgres).
//!
//! [`check`](check()) inspects everything Ferry needs and returns every problem it finds, each
//! with its fix; [`ensure`] first creates what is missing (the publication and the slot, when
//! the configuration allows) and then checks. Identifiers are always quoted.
//!
//! A partitioned outbox table is published with `publish_via_partition_root = true`, so changes
//! arrive under the table's own name rather than each partition's.
//!
//! # Parts
//!
//! Everything is used through this module (`ferry_wal::slot::...`); the parts are private:
//!
//! - `spec`: what the outbox needs from the database ([`SlotSpec`], [`TableSpec`]), and the
//!   quoting of identifiers and literals;
//! - `connect`: the SQL connection ([`connect_sql`]) and its errors ([`sql_error`]);
//! - `server`: what the server is and where its WAL stands ([`system_identity`],
//!   [`server_version_num`], [`in_recovery`], [`current_wal_lsn`], [`wal_clock`]), and whether
//!   the role may replicate ([`replication_privilege`]);
//! - `state`: the slot's row ([`slot_state`]) and [`drop_inactive`];
//! - `tables`: the outbox tables' kind, columns and types ([`column_types`], [`type_name`]);
//! - `publication`: what the publication covers ([`publication_membership`],
//!   [`unrelayed_tables`], [`other_tables`], [`standing`]);
//! - `check`: reads the facts the check judges, deciding nothing; `problems` judges them into
//!   the problem list without I/O ([`Problem`], [`Severity`]), with `capacity`, `failover` and
//!   [`privileges`] judging their own facts; all of it unit-tested without a server;
//! - [`handover`]: the advisory lock an instance streaming from the slot holds, which a standby
//!   waits for, so that it takes over when the instance's session ends, not at its next poll;
//! - `setup`: [`ensure`], whose decisions (what to create, with which SQL, what a failure means)
//!   are pure functions too.
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
//!   `confirmed_flush_lsn` yet and, for a moment, no plugin: [`check`](check()) reports it as
//!   being created by that process (a warning), and `START_REPLICATION` on it fails with 55006
//!   (object_in_use), which makes the loser a standby.

mod capacity;
mod check;
mod connect;
mod failover;
pub mod handover;
pub mod privileges;
mod problems;
mod publication;
mod server;
mod setup;
mod spec;
mod state;
mod tables;

pub use capacity::{capacity, Capacity};
pub use check::{check, role_grants};
pub use connect::{cancel_sql, cancel_sql_soon, connect_sql, sql_error};
pub use privileges::{RoleGrants, TableGrants};
pub(crate) use problems::invalidated_slot_fix;
pub use problems::{Problem, Severity};
pub use publication::{
    other_tables, outbox_oids, publication_membership, standing, unrelayed_table, unrelayed_tables,
    Standing,
};
pub use server::{
    backend, current_wal_lsn, end_backend, in_recovery, replication_privilege, server_version_num,
    system_identity, wal_clock, wal_sender_timeout, Backend,
};
pub use setup::{ensure, ensure_surveyed, SetupError, Survey};
pub use spec::{quote_ident, quote_literal, AcceptedTypes, RequiredColumn, SlotSpec, TableSpec};
pub use state::{drop_inactive, slot_state, SlotState};
pub use tables::{column_types, format_type, nearest_column, type_name, TableColumn};
