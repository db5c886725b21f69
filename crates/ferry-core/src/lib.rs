//! Ferry's core: every decision of a streaming session, with no I/O.
//!
//! The binary's driver (`crates/ferry/src/pipeline/driver.rs`) reads the replication stream and
//! the sink's delivery reports, feeds them to one [`Session`] machine, and carries out the
//! [`SessionAction`]s it returns (produce, produce the progress record, begin, commit or abort a
//! Kafka transaction, confirm the slot, count, stop) without deciding anything. Everything that
//! decides what Kafka receives and what PostgreSQL may forget is here, where it can be tested
//! without a server, a broker or a clock: the simulation (`tests/simulation.rs`) drives the
//! machine, in both delivery modes, with a simulated PostgreSQL and a simulated Kafka for
//! thousands of seeds. This crate cannot reach tokio or rdkafka (`.ci/run` checks its dependency
//! tree), the same way `ferry-wal --no-default-features` proves the reader's pure core.
//!
//! # What is confirmed when
//!
//! *Confirming* an LSN tells PostgreSQL it may forget the WAL up to it: the reader reports it as
//! `flush_lsn` and the slot's `confirmed_flush_lsn` moves there. After that the server will
//! never send those transactions again, so an LSN may be confirmed only once Kafka holds every
//! record at or below it, **and** a progress record saying Ferry got there: the progress record
//! is how a restart tells a slot Ferry moved from one moved by someone else
//! ([`verdict`]), and how exactly-once mode knows what it already delivered.
//!
//! 1. **Durable, in commit order.** The [`watermark`] registers transactions in commit order and
//!    records in any order; its confirmed LSN is the `end_lsn` of the newest transaction all of
//!    whose records, and all earlier transactions' records, the sink reported durable. A
//!    failure freezes it: it is never stepped over. The session drains what is in flight and
//!    ends; the next one resumes from the confirmed LSN and the server replays the rest.
//! 2. **At-least-once: remembered, then confirmed.** The watermark's LSN goes to
//!    [`session::remember`], which writes it as a progress record (one in flight; one per
//!    200 ms, the end of a burst sooner) through the same idempotent producer. The slot is
//!    confirmed up to the LSN of the newest progress record Kafka *acknowledged*, never beyond
//!    the watermark. A crash repeats what was acknowledged past the slot: duplicates, never loss.
//! 3. **Exactly-once: committed together.** Each event's exact position (commit LSN and events
//!    handled inside its transaction, or the end LSN after its commit) goes to
//!    [`session::transaction`], which commits a Kafka transaction holding the records *and* a
//!    progress record with that position, by time, size or drain. Its records' reports are held
//!    until the commit, so the watermark moves only then, and the slot is confirmed up to the
//!    lower of the watermark and the committed record's end LSN. A restart reads the record back
//!    and skips every event it covers: nothing is repeated.
//! 4. **Idle.** A keepalive's `wal_end` is confirmed when nothing is registered or in flight (one
//!    that came between transactions while records were in flight, once they land), so an
//!    idle outbox pins no WAL (in both modes: through a progress record first).
//! 5. **Never backwards**, in a session or across: the watermark never lowers its LSN, a session
//!    starts at the slot's position, and a progress record is never written below the newest.
//!
//! And around those: memory is bounded by the window (no WAL is taken while the in-flight records
//! or bytes are at their bound, [`window`]); poison rows go by policy (`route.on_error`,
//! [`route`]), and one named poison event may be passed once ([`pass`]).
//!
//! # Where to change what
//!
//! - When the slot may move: [`relay`] (`Relay::confirm_advanced`, the one place a confirm is queued)
//!   and [`session`] (what each mode holds back). `cargo test -p ferry-core --test simulation`
//!   says within seconds whether the guarantees still hold.
//! - What a sink must promise: [`sink`].

pub mod guard;
pub mod inbox;
pub mod inflight;
pub mod pass;
pub mod progress_record;
pub mod relay;
pub mod route;
pub mod session;
pub mod sink;
pub mod source_position;
#[doc(hidden)]
pub mod testing;
pub mod verdict;
pub mod watermark;
mod window;

pub use guard::unreadable;
pub use inflight::DeliveryKey;
pub use progress_record::{ProgressKey, ProgressRecord};
pub use relay::{Action, CoreError, Count, End, Position, Relay, RelayConfig, RowOutcome};
pub use route::RouteErrorKind;
pub use session::{
    Action as SessionAction, CommitOutcome, Session, SessionConfig, SinkError, SinkErrors,
    TransactionLimits, PROGRESS_DELIVERY_KEY,
};
pub use source_position::{source_id, SourcePosition};
pub use watermark::Watermark;
