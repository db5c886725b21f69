//! The base layer: what the layers above share. The row the router reads and its values, the
//! record it produces, the routing errors, Kafka's topic-name rules, the `{column}` template
//! grammar, the parsed table name, and small pieces (sizes, spellings, murmur2, timestamps).
//! Nothing here imports another layer.

#[macro_use]
pub mod spelling;
pub mod error;
pub mod murmur2;
pub(crate) mod read;
pub(crate) mod record;
pub mod row;
pub mod size;
pub(crate) mod table_name;
pub mod template;
pub mod timestamp;
pub mod topic;
pub(crate) mod trace_outcome;
pub mod value;
