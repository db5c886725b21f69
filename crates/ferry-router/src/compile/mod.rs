//! The compile layer: the configuration and what it compiles to. The `[outbox]`, `[route]` and
//! `[[tables]]` sections, their validation (every problem at once, with key paths), and the topic
//! plan. Imports the encode and base layers, never the route layer.

pub mod config;
pub mod tables;
pub mod topic_plan;
pub(crate) mod validate;
