//! The route layer: an outbox row, or a table-less outbox message, to the record to produce.
//! The [`Router`](router::Router) compiled from the configuration, a router per table, and the
//! message reader. The top layer: it may import every other one.

pub mod message;
pub(crate) mod router;
pub(crate) mod routers;
