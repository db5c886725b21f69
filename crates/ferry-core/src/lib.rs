//! Ferry's relay core: the decisions of a streaming session, with no I/O.
//!
//! The binary's session (`crates/ferry/src/pipeline/session.rs`) is a thin driver: it reads the
//! replication stream and the sink's delivery reports, feeds them to a [`Relay`], and carries out
//! the [`Action`]s it returns (produce, confirm, count, stop). Everything that decides what Kafka
//! receives and what PostgreSQL may forget is here, where it can be tested without a server, a
//! broker or a clock: the simulation test (`tests/simulation.rs`) drives it with a simulated
//! reader and a simulated Kafka for thousands of seeds. This crate cannot reach tokio or rdkafka
//! (`.ci/run` checks its dependency tree), the same way `ferry-wal --no-default-features` proves
//! the reader's pure core.
//!
//! # The rules
//!
//! 1. **Confirm only what is durable, in commit order.** The confirmed LSN is the `end_lsn` of the
//!    newest transaction all of whose records, and all earlier transactions' records, the sink
//!    reported durable ([`watermark`]). It is held in one place, the session's [`Watermark`]; the
//!    core emits [`Action::Confirm`] whenever it advances, and the driver's only job is to pass it
//!    on (to the reader, which reports it as `flush_lsn`, and to the metric). It never moves
//!    backwards.
//! 2. **A failure is never stepped over.** A failed record freezes the watermark: the session stops
//!    reading, waits for what is in flight (so that nothing of it lands after its replay), and
//!    ends; the next session resumes from the confirmed LSN and the server replays the rest.
//! 3. **An idle stream does not pin WAL.** A keepalive's `wal_end` is confirmed when nothing is
//!    registered or in flight.
//! 4. **Memory is bounded by the window.** No WAL is taken while the in-flight records or bytes
//!    are at their bound ([`window`]); the driver then stops reading, and PostgreSQL stops sending.
//! 5. **Poison rows go by policy** (`route.on_error`, [`route`]), decided here with the real router;
//!    one named poison event may be passed once ([`pass`]: `ferry run --skip-event`).
//!
//! # Sinks
//!
//! What a sink promises, and when the core may confirm with each kind (the per-record idempotent
//! sink of today, a transactional sink for exactly-once), is written in [`sink`]. The core's rules
//! are the same for both: a transactional sink reports its records durable only once the Kafka
//! transaction carrying them committed.

pub mod guard;
pub mod inflight;
pub mod pass;
pub mod progress;
pub mod relay;
pub mod route;
pub mod session;
pub mod sink;
#[doc(hidden)]
pub mod testing;
pub mod verdict;
pub mod watermark;
mod window;

pub use guard::unreadable;
pub use inflight::Token;
pub use progress::{ProgressKey, ProgressRecord};
pub use relay::{Action, CoreError, Count, End, Position, Relay, RelayConfig, RowOutcome};
pub use route::RouteErrorKind;
pub use session::{
    Action as SessionAction, CommitOutcome, Session, SessionConfig, SinkError, TransactionLimits,
    PROGRESS_TOKEN,
};
pub use sink::{Report, Sink};
pub use watermark::Watermark;
