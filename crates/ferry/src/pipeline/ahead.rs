//! What a session reads while the progress topic is read.
//!
//! The start-time verdict ([`super::start`]) reads the slot, then the progress topic, and nothing
//! is created or streamed before it decides. What the session reads after the verdict (the
//! facts [`slot::ensure`] decides on, how the publication covers each table, the values'
//! mode, the other tables and the oids) and its replication connection decide nothing, so they
//! are read and opened beside the progress read instead of after it: 15–20 ms of a restart's
//! start-up, where the progress read takes 20–30.
//!
//! Only the reading moves. Each answer is used at the place it was asked before; a read or a
//! connection that failed ahead is done again there, so its error is reported where it always
//! was, after the verdict's own: a refused start still reports why it was refused, not a
//! table's problem, and at once, dropping what is still being read ahead
//! ([`super::start::Beside`]). A first start (the slot or the publication missing) reads the
//! tables and connects after `ensure` created them, as before, and only its survey is reused.
//! The survey is taken between the verdict's two reads of the slot, which must agree.
//!
//! At-least-once sessions only. An exactly-once session asks the brokers whether they serve
//! transactions after the verdict (up to 30 s) and reads the progress topic to its stable end:
//! facts read ahead could be that much older, and an idle replication connection held that
//! long takes a WAL sender and may be closed by the server (`idle_session_timeout`).

use ferry_wal::conn::{answered, ReaderError, Replication};
use ferry_wal::slot;

use super::binary::{self, Mode};
use super::{PipelineError, PipelineSettings};

/// The publication and the tables as a session streams them ([`tables`]).
pub(super) struct Tables {
    /// How the publication covers each table ([`slot::publication_membership`]).
    pub membership: Vec<Option<String>>,
    pub mode: Mode,
    pub other_tables: ferry_wal::assembly::OtherTables,
    pub oids: Vec<(u32, usize)>,
    /// The server's `wal_sender_timeout` (`None`: off): the receive timeout is never shorter
    /// ([`ferry_wal::slot::wal_sender_timeout`]).
    pub wal_sender_timeout: Option<std::time::Duration>,
}

/// Reads [`Tables`], all at once (the connection pipelines the queries); an error is the first
/// in this order that failed.
pub(super) async fn tables(
    sql: &tokio_postgres::Client,
    s: &PipelineSettings,
) -> Result<Tables, PipelineError> {
    // ensure() checked the publication covers the table; how it does is watched while streaming.
    let (membership, mode, other_tables, oids, wal_sender_timeout) = answered(
        s.stream.receive_timeout,
        "the reads of the publication and the tables",
        async {
            Ok::<_, ReaderError>(tokio::join!(
                slot::publication_membership(sql, &s.slot),
                binary::decide(sql, s),
                slot::other_tables(sql, &s.slot),
                slot::outbox_oids(sql, &s.slot),
                slot::wal_sender_timeout(sql),
            ))
        },
    )
    .await?;
    let tables = Tables {
        membership: membership?,
        mode: mode?,
        other_tables: other_tables?,
        oids: oids?,
        wal_sender_timeout: wal_sender_timeout?,
    };
    tracing::debug!("start-up: publication membership, binary mode, other tables and oids read");
    Ok(tables)
}

/// What was read ahead; `None` where nothing was (the caller then reads it in its place).
#[derive(Default)]
pub(super) struct Ahead {
    pub survey: Option<Result<slot::Survey, ReaderError>>,
    pub tables: Option<Result<Tables, PipelineError>>,
    pub replication: Option<Result<Replication, ReaderError>>,
}

/// Reads ahead (at-least-once): the survey, and beside it the tables; when the survey shows
/// the slot and the publication both there, the replication connection opens, and the tables are
/// kept. A first start keeps only the survey (its tables, read before the publication exists or
/// covers them, are dropped) and opens nothing here: it connects after creating the slot, which
/// can wait on long transactions while an idle connection might be closed by the server
/// (`idle_session_timeout`).
pub(super) async fn read(s: &PipelineSettings, sql: &tokio_postgres::Client) -> Ahead {
    if s.exactly_once.is_some() {
        return Ahead::default();
    }
    let survey_then_connect = async {
        let survey = survey(sql, s).await;
        tracing::debug!("start-up: slot and publication surveyed (ahead)");
        if !matches!(&survey, Ok(survey) if survey.all_exist()) {
            return (survey, None);
        }
        let replication = Replication::connect(&s.postgres).await;
        tracing::debug!("start-up: replication connection open (ahead)");
        (survey, Some(replication))
    };
    let ((survey, replication), tables) = tokio::join!(survey_then_connect, tables(sql, s));
    Ahead {
        survey: Some(survey),
        // Kept where the connection opened: the slot and the publication are there.
        tables: replication.is_some().then_some(tables),
        replication,
    }
}

/// The facts [`slot::ensure_surveyed`] decides on ([`slot::Survey::read`]), answered within the
/// receive timeout.
pub(super) async fn survey(
    sql: &tokio_postgres::Client,
    s: &PipelineSettings,
) -> Result<slot::Survey, ReaderError> {
    answered(
        s.stream.receive_timeout,
        "the reads of the slot and the publication",
        slot::Survey::read(sql, &s.slot),
    )
    .await
}
