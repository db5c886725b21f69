//! Several outbox tables: one Ferry, one slot, one publication, and a router per table.
//!
//! `[outbox]` and `[route]` describe the first table (and route table-less messages); each
//! `[[tables]]` entry adds one more, with its own `outbox` and `route` sections (the same keys,
//! the same defaults), so tables of different structures — one per schema or per service — can
//! share a slot:
//!
//! ```toml
//! [outbox]
//! table = "orders.outbox"
//!
//! [[tables]]
//! outbox.table = "billing.events"
//! outbox.payload_column = "body"
//! route.topic = "billing.{aggregatetype}"
//! ```
//!
//! A row is routed by the router of the table it was inserted into; the reader tells them apart by
//! the relation's schema and name, which it matches once per Relation message, so the per-row cost
//! is an index. Two keys stay global because they are about the whole pipeline: table-less
//! messages (`outbox.message_prefix`) are routed by the first table's `[route]`, and
//! `[route.create_topics]` applies to every topic whichever table routes to it.
//!
//! Ordering: the tables share the WAL, so events reach Kafka in commit order across tables too, and
//! two rows with the same key — whichever tables they come from — keep their commit order when
//! they go to the same topic and partition.
//!
//! This module gathers the two halves under one path: the configuration and its validation
//! (compile layer) and the routers (route layer).

pub use crate::compile::tables::{key_prefix, validate_tables, TableConfig};
pub use crate::route::routers::Routers;
