//! The sink: where the core's records go (Kafka), seen from the core. The driver carries the
//! core's actions to a [`Sink`] and carries the sink's delivery reports back to the core; the
//! core never calls the sink itself (it does no I/O).
//!
//! # What a sink promises
//!
//! 1. **Accepted is not durable.** [`Sink::produce`] returning `Ok` means the record was
//!    accepted; it is durable only when a report for its token says `Ok`. Every accepted record
//!    gets exactly one report, eventually (librdkafka: within `delivery.timeout.ms`).
//! 2. **A report `Ok` means the record is durable and will be seen by consumers**, so the core
//!    may count it towards confirming its transaction's `end_lsn`.
//! 3. **Order per key.** Records of one key handed over in order are appended in that order, or
//!    fail from the first that failed on (idempotent producer: a failed record fails those queued
//!    behind it on its partition). After a failure the core asks for [`Sink::abandon`], and the
//!    sink stops anything still queued from landing ahead of the failed record's replay.
//!
//! # The two kinds
//!
//! - **At-least-once, per-record idempotent sink** (today's: librdkafka with
//!   `enable.idempotence=true`, `acks=all`). Reports arrive per record as the brokers acknowledge
//!   them, in any order across partitions. [`Sink::commit_point`] is nothing to it. The core
//!   confirms the `end_lsn` of a transaction once every record of it, and of every earlier
//!   transaction, is reported `Ok`. A crash duplicates what was acknowledged past the confirmed
//!   LSN; it never loses or reorders.
//! - **Transactional sink** (exactly-once, issue 11): it opens a Kafka transaction, produces into
//!   it, and at a [`Sink::commit_point`] it may commit the Kafka transaction together with a
//!   progress record holding that `end_lsn` (the LSN a restart resumes from, read back from Kafka).
//!   It holds back the reports of the records in an open Kafka transaction and releases them all
//!   `Ok` once the commit succeeded, or all `Err` if it aborted. With that one rule the core's
//!   rules do not change: it confirms a WAL transaction only when all its records are reported
//!   `Ok`, which for this sink is only after the Kafka transaction carrying them committed.
//!   [`Sink::abandon`] aborts the open Kafka transaction. A sink that batches must not hold
//!   reports for more records than the in-flight window, or the core stops feeding it and the
//!   sink must commit at the last commit point it saw (the window is the sink's signal, through
//!   [`Sink::commit_point`] being the only place a batch may end).

use ferry_router::Record;
use ferry_wal::Lsn;

use crate::inflight::Token;
use crate::relay::Position;

/// A destination for the core's records; see the [module documentation](self).
pub trait Sink {
    /// Why a record was refused or failed.
    type Error;

    /// Hands `record` over (accepted, not yet durable); its report will carry `token`. `Err`
    /// means the record was not accepted and no report will come for it.
    fn produce(&mut self, token: Token, record: &Record) -> Result<(), Self::Error>;

    /// Every record produced so far belongs to WAL transactions ending at or before `end_lsn`,
    /// and the transaction ending there is complete. A transactional sink may end its batch here
    /// (committing `end_lsn` as its progress); an idempotent sink has nothing to do.
    fn commit_point(&mut self, end_lsn: Lsn) -> Result<(), Self::Error> {
        let _ = end_lsn;
        Ok(())
    }

    /// Exactly-once: every event up to `position` is handed over (or skipped by policy); a
    /// transactional sink may end its Kafka transaction here, with `position` as its progress
    /// record. It must end one before it holds half the in-flight window.
    fn position(&mut self, position: Position) -> Result<(), Self::Error> {
        let _ = position;
        Ok(())
    }

    /// A record failed: nothing accepted after it may land before its replay. The idempotent
    /// sink fails what is still queued; a transactional sink aborts its open transaction.
    fn abandon(&mut self);
}

/// A delivery report: the token a record was produced with, and whether it is durable.
#[derive(Debug)]
pub struct Report<E> {
    pub token: Token,
    pub result: Result<(), E>,
}
