//! The sink: where the session machine's records go, in either delivery mode. One type for
//! both, so the driver carries every action out the same way; it decides nothing (what to
//! produce, when to begin, commit or abort, what a report means: [`ferry_core::session`]).
//!
//! - **At-least-once**: the idempotent producer shared across sessions; progress records go
//!   through it too, on their own (one partition of the progress topic).
//! - **Exactly-once**: this session's transactional producer ([`Txn`]); records and the
//!   progress record go into the open Kafka transaction.

use std::time::SystemTime;

use ferry_core::progress_record::{Mode, ProgressRecord};
use ferry_core::{CommitOutcome, DeliveryKey, Position};
use ferry_router::Record;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::transactional::Txn;
use super::PipelineError;
use crate::producer::{Producer, SendError};

/// See the [module documentation](self).
pub(super) enum Sink<'a> {
    Idempotent {
        producer: &'a Producer,
        progress_topic: &'a str,
        /// The progress record's key (server and slot) and the streaming server's timeline.
        key: Vec<u8>,
        timeline: u32,
    },
    Transactional(Txn),
}

impl Sink<'_> {
    /// Serves the producer's delivery reports that wait, if any.
    pub fn serve_waiting(&self) {
        match self {
            Sink::Idempotent { producer, .. } => producer.serve_waiting(),
            Sink::Transactional(txn) => txn.producer.serve_waiting(),
        }
    }

    /// Hands a record over (accepted, not durable); its report carries `token`.
    pub fn produce(&mut self, token: DeliveryKey, record: &Record) -> Result<(), KafkaError> {
        match self {
            Sink::Idempotent { producer, .. } => producer.send(record, token.0).map_err(send_error),
            Sink::Transactional(txn) => txn.produce(token, record),
        }
    }

    /// Hands the progress record holding `position` over; its report carries `token`.
    pub fn produce_progress(
        &mut self,
        token: DeliveryKey,
        position: Position,
    ) -> Result<(), KafkaError> {
        match self {
            Sink::Idempotent {
                producer,
                progress_topic,
                key,
                timeline,
            } => {
                let value =
                    ProgressRecord::at(Mode::AtLeastOnce, *timeline, &position, unix_millis())
                        .encode();
                producer
                    .send_progress(progress_topic, key, &value, token.0)
                    .map_err(send_error)
            }
            Sink::Transactional(txn) => txn.produce_progress(token, position),
        }
    }

    pub fn begin(&mut self) -> Result<(), KafkaError> {
        match self {
            Sink::Transactional(txn) => txn.begin(),
            Sink::Idempotent { .. } => Ok(()),
        }
    }

    pub async fn commit(
        &mut self,
        position: Position,
        records: usize,
    ) -> CommitOutcome<KafkaError> {
        match self {
            Sink::Transactional(txn) => txn.commit(position, records).await,
            Sink::Idempotent { .. } => CommitOutcome::Committed,
        }
    }

    pub async fn abort(&mut self) -> Result<(), KafkaError> {
        match self {
            Sink::Transactional(txn) => txn.abort().await,
            Sink::Idempotent { .. } => Ok(()),
        }
    }

    /// The session ends with a transaction open: abort it; only a fenced producer is an error.
    pub async fn end_open(&mut self) -> Result<(), PipelineError> {
        match self {
            Sink::Transactional(txn) => txn.end_open(super::driver::END_ABORT_TIMEOUT).await,
            Sink::Idempotent { .. } => Ok(()),
        }
    }

    /// A record failed: nothing queued behind it may land before its replay.
    pub fn abandon(&mut self) {
        if let Sink::Idempotent { producer, .. } = self {
            producer.purge_queued();
        }
    }

    /// This session's transactional producer, if it has one.
    pub fn txn(&self) -> Option<&Txn> {
        match self {
            Sink::Transactional(txn) => Some(txn),
            Sink::Idempotent { .. } => None,
        }
    }
}

pub(super) fn send_error(e: SendError) -> KafkaError {
    match e {
        SendError::QueueFull => KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull),
        SendError::Refused(e) => e,
    }
}

pub(super) fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
