//! The compile layer: the configuration and what it compiles to. The `[outbox]`, `[route]` and
//! `[[tables]]` sections, their validation (every problem at once, with key paths), the topic
//! plan, and the CloudEvents output's attributes. Imports the encode and base layers, never the
//! route layer.

pub(crate) mod cloudevents;
pub mod config;
pub mod tables;
pub mod topic_plan;
pub(crate) mod validate;
