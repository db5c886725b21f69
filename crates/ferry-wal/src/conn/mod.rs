//! The replication connection and the reader task (feature `io`).
//!
//! - [`config`]: libpq connection strings (URL or keyword/value), `sslmode` included.
//! - [`pgpass`]: libpq's password file.
//! - [`tls`]: rustls for both connections, with libpq's `sslmode` semantics.
//! - [`replication`]: the frontend/backend protocol for a `replication=database` session.
//! - [`stream`]: the reader task that streams the slot into the pipeline.
//! - [`error`]: transient vs permanent errors.

pub mod config;
pub mod error;
pub(crate) mod net;
mod pause;
pub mod pgpass;
pub mod replication;
pub mod stream;
pub mod tls;

pub use config::{ConnectConfig, SslMode, TargetSessionAttrs};
pub use error::{answered, ReaderError, ServerError};
pub use replication::session_settings_sql;
pub use stream::{
    start, start_on, ReaderEvent, ReaderHandle, ReaderStats, Replication, SourceDelay,
    StreamOptions, SystemIdentity, SOURCE_DELAY_BOUNDS_MICROS,
};
