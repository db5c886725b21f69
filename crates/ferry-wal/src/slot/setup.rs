//! [`ensure`]: what is missing is created (the publication and the slot, when the configuration
//! allows) between two [`check`](super::check())s; losing a creation race to another Ferry is
//! no error (see the module's notes on two instances starting together).

use super::tables::table_kind;
use super::{
    check, server_version_num, slot_state, sql_error, Problem, Severity, SlotSpec, SlotState,
};
use crate::conn::error::ReaderError;

/// Setup failed: the problems, each with its fix.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{}", .0.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n"))]
    Problems(Vec<Problem>),
    #[error(transparent)]
    Connection(#[from] ReaderError),
}

impl SetupError {
    /// Whether retrying later can succeed (the connection failed transiently).
    pub fn is_transient(&self) -> bool {
        match self {
            SetupError::Problems(_) => false,
            SetupError::Connection(e) => e.is_transient(),
        }
    }
}

/// Whether a failed `CREATE` means another session created the same object first (see the
/// module's notes on two instances starting together).
fn created_concurrently(e: &tokio_postgres::Error) -> bool {
    matches!(e.code().map(|c| c.code()), Some("42710") | Some("23505"))
}

/// Creates the publication, and the slot when `spec.create_slot` allows, then [`check`](check())s.
/// Returns the slot's state when there is no error-level problem.
///
/// A missing slot is not always Ferry's to create: a slot Ferry streamed before and that is now
/// gone means lost events, and creating a new one would hide them. The pipeline therefore
/// decides first (`ferry_core::verdict`, from the progress record) and sets `create_slot` only
/// for a first start or a gap the operator accepted.
pub async fn ensure(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
) -> Result<SlotState, SetupError> {
    // Validate before creating anything: a start that fails anyway must not leave a new slot
    // behind (it would retain WAL until someone drops it). What is missing and may be created is
    // a note here, not an error.
    let errors = errors_of(check(client, spec).await?);
    if !errors.is_empty() {
        return Err(SetupError::Problems(errors));
    }
    let exists: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)",
            &[&spec.publication],
        )
        .await
        .map_err(sql_error)?
        .get(0);
    let mut all_exist = true;
    for t in &spec.tables {
        all_exist &= table_kind(client, t).await?.is_some();
    }
    if !exists && spec.create_publication && all_exist {
        let sql = spec.create_publication_sql();
        if let Err(e) = client.batch_execute(&sql).await {
            if !created_concurrently(&e) {
                let err = sql_error(e);
                if err.is_transient() {
                    return Err(err.into());
                }
                return Err(SetupError::Problems(vec![Problem {
                    severity: Severity::Error,
                    what: format!("cannot create publication {:?}: {err}", spec.publication),
                    fix: format!(
                        "have the table's owner run `{sql}` (see sql/publication.sql), or grant Ferry's role ownership of the table"
                    ),
                }]));
            }
        }
    }
    // An existing publication is never altered: the operator owns it (it may serve other
    // subscribers, which would start receiving an added table's rows). A table it lacks is an
    // error from check() below, with the ALTER PUBLICATION to run.
    if spec.create_slot && slot_state(client, &spec.slot).await?.is_none() {
        // failover (the fifth argument) exists from PostgreSQL 17 on; check() refuses it before.
        let failover = spec.failover && server_version_num(client).await? >= 170000;
        let res = client
            .query_one(
                if failover {
                    "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
                } else {
                    "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')"
                },
                &[&spec.slot],
            )
            .await;
        if let Err(e) = res {
            if !created_concurrently(&e) {
                let err = sql_error(e);
                if err.is_transient() {
                    return Err(err.into());
                }
                return Err(SetupError::Problems(vec![Problem {
                    severity: Severity::Error,
                    what: format!("cannot create replication slot {:?}: {err}", spec.slot),
                    fix: "check wal_level, max_replication_slots and the REPLICATION privilege (run `ferry check`)".into(),
                }]));
            }
        }
    }
    // Whatever is still missing now could not be created: an error, not a note.
    let created = SlotSpec {
        create_slot: false,
        create_publication: false,
        ..spec.clone()
    };
    let errors = errors_of(check(client, &created).await?);
    if !errors.is_empty() {
        return Err(SetupError::Problems(errors));
    }
    Ok(slot_state(client, &spec.slot)
        .await?
        .expect("check() reports a missing slot"))
}

fn errors_of(problems: Vec<Problem>) -> Vec<Problem> {
    problems
        .into_iter()
        .filter(|p| p.severity == Severity::Error)
        .collect()
}
