//! The pipeline's errors: each is transient (reconnect and resume) or permanent (stop, exit
//! non-zero, confirm nothing past it), and each permanent one says how to fix it.

use ferry_router::RouteError;
use ferry_wal::conn::ReaderError;
use ferry_wal::slot::SetupError;
use ferry_wal::Lsn;
use rdkafka::error::KafkaError;

use crate::producer;
use ferry_core::watermark::WatermarkError;

/// Why a session or the pipeline ended.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("PostgreSQL: {0}")]
    Reader(#[from] ReaderError),
    #[error("PostgreSQL set-up:\n{0}")]
    Setup(#[from] SetupError),
    #[error(
        "cannot route outbox event (transaction commit {commit_lsn}): {error}. \
         on_error = \"fail\" stops Ferry here and confirms nothing past it; fix the row's data or the \
         route configuration, or set route.on_error = \"skip\" or \"dead_letter\""
    )]
    Route { error: RouteError, commit_lsn: Lsn },
    #[error("Kafka did not accept a record for topic {topic:?}: {error}; fix: {fix}")]
    Delivery {
        topic: String,
        error: KafkaError,
        fix: &'static str,
        transient: bool,
    },
    #[error("Kafka producer configuration: {0}; check [kafka] brokers and properties")]
    ProducerConfig(KafkaError),
    #[error("Kafka producer fatal error: {0}")]
    ProducerFatal(String),
    #[error("acknowledgement bookkeeping: {0} (a bug in Ferry; nothing past it was confirmed)")]
    Watermark(#[from] WatermarkError),
    #[error(
        "acknowledgement bookkeeping: a delivery report for a record this producer has no record of (key {key}); \
         a bug in Ferry or librdkafka, so nothing past it is confirmed"
    )]
    UnknownReport { key: usize },
    #[error(
        "{records} records were still unacknowledged when the drain timeout passed; they are not confirmed \
         and will be produced again on the next start"
    )]
    DrainTimeout { records: u64 },
    #[error(
        "another Ferry instance fenced this one: it started with the same transactional.id {transactional_id:?} \
         (the same slot on the same server) and took over; this instance stops without committing. If that \
         other instance should not run, stop it; otherwise this one was the zombie ({error})"
    )]
    Fenced {
        transactional_id: String,
        error: KafkaError,
    },
    #[error("Kafka transaction failed ({error}); the producer is replaced and the events replayed from the last committed position")]
    Transaction { error: KafkaError },
    #[error("progress topic: {0}")]
    Progress(#[from] crate::progress::ProgressTopicError),
    #[error(
        "the outbox table changed while streaming in binary mode: column {column:?} is now of type OID \
         {type_oid}, which Ferry reads only as text; reconnecting to stream text"
    )]
    TextNeeded { column: String, type_oid: u32 },
}

impl PipelineError {
    /// Whether a new session may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            PipelineError::Reader(e) => e.is_transient(),
            PipelineError::Setup(e) => e.is_transient(),
            PipelineError::Delivery { transient, .. } => *transient,
            PipelineError::ProducerFatal(_)
            | PipelineError::TextNeeded { .. }
            | PipelineError::Transaction { .. } => true,
            PipelineError::Progress(e) => e.is_transient(),
            PipelineError::Fenced { .. } => false,
            PipelineError::Route { .. }
            | PipelineError::ProducerConfig(_)
            | PipelineError::Watermark(_)
            | PipelineError::UnknownReport { .. }
            | PipelineError::DrainTimeout { .. } => false,
        }
    }

    /// Whether another process streams the slot (this instance stands by).
    pub fn is_standby(&self) -> bool {
        matches!(self, PipelineError::Reader(ReaderError::SlotInUse { .. }))
    }

    pub(crate) fn delivery(topic: &str, error: KafkaError) -> PipelineError {
        PipelineError::Delivery {
            topic: topic.to_string(),
            transient: producer::is_transient(&error),
            fix: producer::fix_for(&error),
            error,
        }
    }
}
