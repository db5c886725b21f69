//! Ferry's logical-replication reader.
//!
//! The pure core (no I/O, always compiled): [`lsn`], [`pgoutput`] (the pgoutput decoder),
//! [`frame`] (the protocol's message framing: CopyData, CopyDone, CopyBothResponse), [`wire`]
//! (replication CopyData sub-messages), [`assembly`] (outbox transaction assembly) and
//! [`progress`] (the feedback rules). The `io` feature adds the replication connection and slot
//! management on top of tokio, and [`timer`], a timer finer than tokio's.

pub mod assembly;
pub mod frame;
pub use ferry_pgtypes::lsn;
pub mod feedback;
pub mod pgoutput;
pub mod wire;

#[cfg(feature = "io")]
pub mod conn;
#[cfg(feature = "io")]
pub mod slot;
#[cfg(feature = "io")]
pub mod timer;

pub use lsn::Lsn;
pub use wire::PgTimestamp;
