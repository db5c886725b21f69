//! The pipeline's errors: each is transient (reconnect and resume) or permanent (stop, exit
//! non-zero, confirm nothing past it), and each permanent one says how to fix it.

use ferry_core::pass::{EventPosition, Pass, PassAction};
use ferry_router::{RouteError, RouteErrorReason};
use ferry_wal::conn::ReaderError;
use ferry_wal::slot::SetupError;
use ferry_wal::Lsn;
use rdkafka::error::KafkaError;

use crate::authz;
use crate::producer;
use crate::progress_topic::ProgressTopicError;
use ferry_core::watermark::WatermarkError;

/// Why a session or the pipeline ended.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("PostgreSQL: {0}")]
    Reader(#[from] ReaderError),
    #[error("PostgreSQL set-up:\n{0}")]
    Setup(#[from] SetupError),
    #[error("{}", route_failure(self))]
    Route {
        error: RouteError,
        /// The event's position: what `--skip-event` / `--dead-letter-event` name.
        at: EventPosition,
        /// The row's (or message's) own LSN.
        lsn: Lsn,
        /// With several outbox tables, which one the row is of: its position and name.
        table: Option<(usize, String)>,
        /// The row's table's `route.dead_letter_topic`, if set.
        dead_letter_topic: Option<String>,
        /// The one-shot pass given for this run, if any.
        pass: Option<Pass>,
    },
    #[error("Kafka did not accept a record for topic {topic:?}: {error}; fix: {fix}")]
    Delivery {
        topic: String,
        error: KafkaError,
        fix: &'static str,
        transient: bool,
    },
    /// The broker refused Ferry's principal an operation (an ACL is missing): the message names
    /// the resource, the operation and the grant (`crate::authz`).
    #[error("{0}")]
    NotAuthorized(String),
    /// The brokers cannot be reached for a reason retrying does not fix (`crate::kafka_access`).
    #[error("cannot use the Kafka brokers: {0}")]
    KafkaAccess(String),
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
    /// Exactly-once mode on brokers without (usable) transactions (`crate::broker_apis`): what
    /// is missing, then the fix. Permanent.
    #[error("{what}. Fix: {}", crate::broker_apis::FIX)]
    TransactionsUnsupported { what: String },
    #[error(
        "the outbox table {table} changed while streaming in binary mode: column {column:?} is now of \
         type {type_name}, which Ferry reads only as text; reconnecting to stream text"
    )]
    TextNeeded {
        column: String,
        type_oid: u32,
        /// PostgreSQL's name for it (`format_type`), or `type OID n` where it could not be asked.
        type_name: String,
        table: String,
    },
    /// The start-time verdict found a gap (`ferry_core::verdict`): the message says what
    /// happened, the remembered position, the bytes of WAL where known, and the action.
    #[error("{0}")]
    Gap(ferry_core::verdict::Refusal),
    #[error("{0}")]
    ProgressTopic(#[from] ProgressTopicError),
    #[error(
        "the SQL connection reached the server with system identifier {sql}, the replication connection \
         the one with {replication}: postgres.url names several servers that are not one cluster's primary and \
         standbys, or a failover happened between the two connections; reconnecting"
    )]
    TwoServers { sql: u64, replication: u64 },
    #[error(
        "replication slot {slot:?} was created, dropped or moved by another process while Ferry compared it with \
         its progress record; comparing again"
    )]
    SlotChanged { slot: String },
    #[error(
        "the outbox table {table} left publication {publication:?} while Ferry streamed: {what}. PostgreSQL \
         does not decode a table's rows for a publication while the table is out of it, so rows committed in \
         between are not in the stream and Ferry cannot relay them. Everything streamed before was delivered and \
         confirmed. Fix: run `ALTER PUBLICATION {publication} ADD TABLE {table}` if the table is not back in it, \
         re-insert the outbox rows committed while it was out (if consumers need them), then start Ferry again"
    )]
    PublicationChanged {
        publication: String,
        table: String,
        /// What the session saw: out of the publication, or back in with another identity.
        what: String,
    },
    /// The publication lists a table no entry relays, found while streaming: by the reader at
    /// one of its rows (`at`), or by the publication watch. At start the same problem is a
    /// [`PipelineError::Setup`] error, in the same words (`slot::unrelayed_table`).
    #[error("{}", unrelayed_message(publication, table, at.as_deref()))]
    UnrelayedTable {
        publication: String,
        table: String,
        /// The row the reader stopped at: its xid and LSN.
        at: Option<String>,
    },
    /// A row the reader refused is relayed or skipped by a new session, which maps the
    /// relations anew (`Session::unrelayed`).
    #[error("{why}; reconnecting")]
    Remap { why: String },
    /// The session's SQL connection closed while the replication connection streamed on
    /// (`watch::watch_server`): a backend ended by `pg_terminate_backend` or the server's
    /// `idle_session_timeout`, say.
    #[error(
        "the session's SQL connection closed while it streamed ({cause}): it holds the slot's hand-over lock \
         and samples the WAL position for the lag metric and watches the publication, so the session ends \
         after the records in flight and the next one connects again. If something ends connections it takes \
         for idle (the server's idle_session_timeout, a script that runs pg_terminate_backend), exempt Ferry's role"
    )]
    SqlClosed { cause: String },
}

fn unrelayed_message(publication: &str, table: &str, at: Option<&str>) -> String {
    let problem = ferry_wal::slot::unrelayed_table(publication, table);
    match at {
        Some(at) => format!(
            "the stream met a row of table {table} ({at}), which joined publication {publication:?} while \
             Ferry streamed. Ferry stopped before that transaction's commit, so nothing from it on is \
             confirmed, and the row is relayed once the table has an entry. {problem}"
        ),
        None => format!(
            "table {table} joined publication {publication:?} while Ferry streamed; Ferry stopped after the \
             records in flight, before any of its rows. {problem}"
        ),
    }
}

/// The message of [`PipelineError::Route`]: the row's problem, then what stopping means and what
/// to do, which differs for a table that no longer matches the configuration.
///
/// The row is committed: Ferry reads it from the WAL, so changing it in the table changes
/// nothing. The ways on are the one-shot flag for this event ([`ferry_core::pass`]) or a policy
/// for every row; for the future, the writer.
fn route_failure(e: &PipelineError) -> String {
    let PipelineError::Route {
        error,
        at,
        lsn,
        table,
        dead_letter_topic,
        pass,
    } = e
    else {
        return String::new();
    };
    let commit_lsn = at.commit_lsn;
    let of = match table {
        None => String::new(),
        Some((0, name)) => format!("outbox table {name} ([outbox] and [route]): "),
        Some((i, name)) => {
            let prefix = ferry_router::tables::key_prefix(*i);
            format!("outbox table {name} (its keys are {prefix}outbox.* and {prefix}route.*): ")
        }
    };
    if let RouteErrorReason::MissingColumn { .. } = error.reason {
        return format!(
            "{of}{error} (transaction commit {commit_lsn}). The outbox table no longer has a column the \
             configuration reads (renamed or dropped?), so every later row would fail alike: Ferry stops \
             whatever route.on_error says and confirms nothing past this transaction. Map the new column \
             in the configuration (or restore the column) and start Ferry again; it resumes at this \
             transaction"
        );
    }
    let prefix = table
        .as_ref()
        .map_or(String::new(), |(i, _)| ferry_router::tables::key_prefix(*i));
    let given = match pass {
        Some(p) if p.at != *at => format!(
            " ({p} was given, but this event is at {at}: the flag passes only the event it names, once.)"
        ),
        Some(p) if p.action == PassAction::DeadLetter => format!(
            " ({p} was given, but {prefix}route.dead_letter_topic is not set, so there is nowhere to send \
             it: set it, or use --skip-event {at}.)"
        ),
        _ => String::new(),
    };
    let dead_letter = match dead_letter_topic {
        Some(topic) => format!(
            "`ferry run --dead-letter-event {at}` sends it to the dead-letter topic {topic:?}"
        ),
        None => format!(
            "`ferry run --dead-letter-event {at}` sends it to a dead-letter topic (set \
             {prefix}route.dead_letter_topic first)"
        ),
    };
    format!(
        "{of}{error} (event {at}: transaction commit {commit_lsn}, event {} of it, row LSN {lsn}). \
         on_error = \"fail\" stops Ferry here and confirms nothing past it.{given} The row is committed and \
         Ferry reads it from the WAL, not from the table: updating or deleting it changes nothing. To go on, \
         either (1) pass this one event, once: {dead_letter}, or `ferry run --skip-event {at}` leaves it \
         out; either is logged and counted, and every later row still goes by on_error; or (2) set \
         {prefix}route.on_error = \"dead_letter\" or \"skip\" for every row that cannot be routed. Then fix \
         the writer so that it stops committing such rows (or the route configuration, if it is wrong)",
        at.event
    )
}

impl PipelineError {
    /// The broker refused a record for `topic` (or, with CLUSTER_AUTHORIZATION_FAILED, the
    /// producer id it needs).
    pub(crate) fn not_authorized(
        code: rdkafka::error::RDKafkaErrorCode,
        topic: &str,
        progress: bool,
        properties: &[(String, String)],
    ) -> PipelineError {
        use rdkafka::error::RDKafkaErrorCode as C;
        let resource = match code {
            C::ClusterAuthorizationFailed => authz::Resource::Cluster,
            _ if progress => authz::Resource::ProgressTopic(topic.to_string()),
            _ => authz::Resource::Topic(topic.to_string()),
        };
        let doing = if progress {
            "a progress record".to_string()
        } else {
            format!("a record for topic {topic:?}")
        };
        PipelineError::NotAuthorized(authz::denied(code, &doing, &resource, properties))
    }

    /// Whether a new session may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            PipelineError::Reader(e) => e.is_transient(),
            PipelineError::Setup(e) => e.is_transient(),
            PipelineError::Delivery { transient, .. } => *transient,
            PipelineError::ProducerFatal(_)
            | PipelineError::TextNeeded { .. }
            | PipelineError::TwoServers { .. }
            | PipelineError::SlotChanged { .. }
            | PipelineError::Remap { .. }
            | PipelineError::SqlClosed { .. }
            | PipelineError::Transaction { .. } => true,
            PipelineError::ProgressTopic(e) => e.is_transient(),
            PipelineError::Gap(_)
            | PipelineError::Fenced { .. }
            | PipelineError::TransactionsUnsupported { .. } => false,
            PipelineError::Route { .. }
            | PipelineError::ProducerConfig(_)
            | PipelineError::NotAuthorized(_)
            | PipelineError::KafkaAccess(_)
            | PipelineError::Watermark(_)
            | PipelineError::UnknownReport { .. }
            | PipelineError::DrainTimeout { .. }
            | PipelineError::PublicationChanged { .. }
            | PipelineError::UnrelayedTable { .. } => false,
        }
    }

    /// Whether PostgreSQL is away rather than refusing ([`ReaderError::is_server_away`]).
    pub fn is_server_away(&self) -> bool {
        matches!(self, PipelineError::Reader(e) if e.is_server_away())
    }

    /// Whether another process streams the slot (this instance stands by).
    pub fn is_standby(&self) -> bool {
        matches!(self, PipelineError::Reader(ReaderError::SlotInUse { .. }))
    }

    /// A record for `topic` failed; `progress` when `topic` is the progress topic. An
    /// authorization failure becomes [`PipelineError::NotAuthorized`] with its grant.
    pub(crate) fn delivery(
        topic: &str,
        error: KafkaError,
        progress: bool,
        properties: &[(String, String)],
    ) -> PipelineError {
        if let Some(code) = authz::authorization_code(&error) {
            return PipelineError::not_authorized(code, topic, progress, properties);
        }
        PipelineError::Delivery {
            topic: topic.to_string(),
            transient: producer::is_transient(&error),
            fix: producer::fix_for(&error),
            error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route_with(
        table: Option<(usize, String)>,
        dead_letter_topic: Option<&str>,
        pass: Option<Pass>,
    ) -> String {
        PipelineError::Route {
            error: RouteError {
                event_id: Some("7".into()),
                reason: RouteErrorReason::NullPayload {
                    column: "body".into(),
                },
            },
            at: "0/10:2".parse().unwrap(),
            lsn: Lsn(0x8),
            table,
            dead_letter_topic: dead_letter_topic.map(str::to_string),
            pass,
        }
        .to_string()
    }

    fn route(table: Option<(usize, String)>) -> String {
        route_with(table, None, None)
    }

    /// The row is in the WAL already: the advice is the one-shot flag with its exact position,
    /// or a policy, and the writer for the future; never "fix the row's data".
    #[test]
    fn a_route_failure_prints_the_commands_that_pass_this_one_event() {
        let s = route(None);
        assert!(!s.contains("fix the row"), "{s}");
        assert!(
            s.contains("event 0/10:2: transaction commit 0/10, event 2 of it, row LSN 0/8"),
            "{s}"
        );
        assert!(
            s.contains("Ferry reads it from the WAL, not from the table"),
            "{s}"
        );
        assert!(s.contains("`ferry run --skip-event 0/10:2`"), "{s}");
        assert!(
            s.contains("`ferry run --dead-letter-event 0/10:2` sends it to a dead-letter topic (set route.dead_letter_topic first)"),
            "{s}"
        );
        assert!(
            s.contains("route.on_error = \"dead_letter\" or \"skip\""),
            "{s}"
        );
        assert!(s.contains("fix the writer"), "{s}");
        let with_topic = route_with(None, Some("dlq"), None);
        assert!(
            with_topic.contains(
                "`ferry run --dead-letter-event 0/10:2` sends it to the dead-letter topic \"dlq\""
            ),
            "{with_topic}"
        );
        let second = route_with(
            None,
            None,
            Some(Pass::new("0/5:1".parse().unwrap(), PassAction::Skip)),
        );
        assert!(
            second.contains("(--skip-event 0/5:1 was given, but this event is at 0/10:2: the flag passes only the event it names, once.)"),
            "{second}"
        );
        let mut here = Pass::new("0/10:2".parse().unwrap(), PassAction::DeadLetter);
        here.met = true;
        let nowhere = route_with(Some((1, "public.b".into())), None, Some(here));
        assert!(
            nowhere.contains("(--dead-letter-event 0/10:2 was given, but tables[0].route.dead_letter_topic is not set"),
            "{nowhere}"
        );
    }

    /// With several outbox tables the error says which table's row it is, and under which keys.
    #[test]
    fn a_route_failure_names_the_table_when_there_are_several() {
        let one = route(None);
        assert!(one.starts_with("cannot route outbox event \"7\""), "{one}");
        let first = route(Some((0, "public.outbox".into())));
        assert!(
            first.starts_with("outbox table public.outbox ([outbox] and [route]): cannot route"),
            "{first}"
        );
        let second = route(Some((2, "billing.events".into())));
        assert!(
            second.starts_with(
                "outbox table billing.events (its keys are tables[1].outbox.* and tables[1].route.*): "
            ),
            "{second}"
        );
    }
}
