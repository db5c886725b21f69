//! [`ensure`]: what is missing is created (the publication and the slot, when the configuration
//! allows) between two [`check`](super::check())s (one when nothing was missing); losing a
//! creation race to another Ferry is no error (see the module's notes on two instances starting
//! together).

use super::problems::problems;
use super::{check, server_version_num, sql_error, Problem, Severity, SlotSpec, SlotState};
use crate::conn::error::{answered, ReaderError};

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
    lost_race(e.code().map(|c| c.code()))
}

/// What [`ensure`] reads before it creates anything, read ahead of it: a restart's session
/// reads it while the progress topic is read (`ferry::pipeline::ahead`).
#[derive(Debug, Clone)]
pub struct Survey(check::Facts);

impl Survey {
    /// Reads the facts [`ensure`] decides on. Its answer does not depend on
    /// `spec.create_slot` or `spec.create_publication`.
    pub async fn read(
        client: &tokio_postgres::Client,
        spec: &SlotSpec,
    ) -> Result<Survey, ReaderError> {
        check::read(client, spec).await.map(Survey)
    }

    /// The slot and the publication both exist: [`ensure_surveyed`] will create nothing,
    /// whatever the spec allows (a restart's case).
    pub fn all_exist(&self) -> bool {
        self.0.slot.is_some() && self.0.publication.is_some()
    }
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
    ensure_surveyed(client, spec, Survey::read(client, spec).await?, None).await
}

/// [`ensure`] from facts read before ([`Survey::read`], with the same spec but for its
/// `create_*` flags). The reads around a creation are answered `within` ([`answered`]); the
/// creations are not bounded (they may wait on other transactions).
pub async fn ensure_surveyed(
    client: &tokio_postgres::Client,
    spec: &SlotSpec,
    survey: Survey,
    within: Option<std::time::Duration>,
) -> Result<SlotState, SetupError> {
    let Survey(facts) = survey;
    // Validate before creating anything: a start that fails anyway must not leave a new slot
    // behind (it would retain WAL until someone drops it). What is missing and may be created is
    // a note here, not an error.
    let errors = errors_of(problems(spec, &facts));
    if !errors.is_empty() {
        return Err(SetupError::Problems(errors));
    }
    // The facts say what exists: the publication's row, each table's kind, the slot's row.
    let exists = facts.publication.is_some();
    let all_exist = facts.tables.iter().all(|t| t.relkind.is_some());
    let mut created_any = false;
    if let Some(sql) = publication_to_create(spec, exists, all_exist) {
        created_any = true;
        if let Err(e) = client.batch_execute(&sql).await {
            if !created_concurrently(&e) {
                return Err(refused(Creating::Publication, spec, sql_error(e)));
            }
        }
    }
    // An existing publication is never altered: the operator owns it (it may serve other
    // subscribers, which would start receiving an added table's rows). A table it lacks is an
    // error from check() below, with the ALTER PUBLICATION to run.
    if spec.create_slot && facts.slot.is_none() {
        created_any = true;
        // failover (the fifth argument) exists from PostgreSQL 17 on; check() refuses it before.
        let version = answered(within, "the read of the server's version", async {
            match spec.failover {
                true => server_version_num(client).await,
                false => Ok(0),
            }
        });
        let failover = version.await? >= 170000;
        let res = client
            .query_one(create_slot_sql(failover), &[&spec.slot])
            .await;
        if let Err(e) = res {
            if !created_concurrently(&e) {
                return Err(refused(Creating::Slot, spec, sql_error(e)));
            }
        }
    }
    // Whatever is still missing now could not be created: an error, not a note. Nothing was
    // created: the facts read above are still the answer (a restart's case, one read instead
    // of two: ~6 ms of its start-up).
    let facts = match created_any {
        true => {
            answered(
                within,
                "the reads after creating",
                check::read(client, spec),
            )
            .await?
        }
        false => facts,
    };
    let errors = errors_of(problems(&created(spec), &facts));
    if !errors.is_empty() {
        return Err(SetupError::Problems(errors));
    }
    Ok(facts.slot.expect("check() reports a missing slot"))
}

/// The error-level problems of a check, in its order: what stops [`ensure`].
fn errors_of(problems: Vec<Problem>) -> Vec<Problem> {
    problems
        .into_iter()
        .filter(|p| p.severity == Severity::Error)
        .collect()
}

/// The SQL that creates the publication, when [`ensure`] should: it is missing, the
/// configuration allows creating it, and every table it lists exists (`CREATE PUBLICATION`
/// would fail on a missing one; check() reports it instead). `None` otherwise: an existing
/// publication is never altered.
fn publication_to_create(spec: &SlotSpec, exists: bool, all_tables_exist: bool) -> Option<String> {
    (!exists && spec.create_publication && all_tables_exist).then(|| spec.create_publication_sql())
}

/// The SQL that creates the slot (its one parameter is the slot's name): a failover slot
/// (the fifth argument, PostgreSQL 17+) or an ordinary one.
fn create_slot_sql(failover: bool) -> &'static str {
    if failover {
        "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
    } else {
        "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')"
    }
}

/// Whether a `CREATE` failed with the SQLSTATE of an object another session created first:
/// 42710 (duplicate_object), or 23505 (unique_violation, the catalog's unique index).
fn lost_race(code: Option<&str>) -> bool {
    matches!(code, Some("42710") | Some("23505"))
}

/// What [`ensure`] was creating when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Creating {
    Publication,
    Slot,
}

/// A creation that failed, not for a lost race: a transient error is retried as one; any other
/// is a problem with its fix.
fn refused(creating: Creating, spec: &SlotSpec, err: ReaderError) -> SetupError {
    if err.is_transient() {
        return err.into();
    }
    SetupError::Problems(vec![match creating {
        Creating::Publication => {
            let sql = spec.create_publication_sql();
            Problem {
                severity: Severity::Error,
                what: format!("cannot create publication {:?}: {err}", spec.publication),
                fix: format!(
                    "have the table's owner run `{sql}` (see sql/publication.sql), or grant Ferry's role ownership of the table"
                ),
            }
        }
        Creating::Slot => Problem {
            severity: Severity::Error,
            what: format!("cannot create replication slot {:?}: {err}", spec.slot),
            fix: "check wal_level, max_replication_slots and the REPLICATION privilege (run `ferry check`)".into(),
        },
    }])
}

/// The spec as [`ensure`] checks it after creating: nothing more is created, so whatever is
/// still missing is an error rather than a note.
fn created(spec: &SlotSpec) -> SlotSpec {
    SlotSpec {
        create_slot: false,
        create_publication: false,
        ..spec.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::error::ServerError;
    use crate::slot::TableSpec;

    fn spec() -> SlotSpec {
        SlotSpec {
            slot: "ferry".into(),
            publication: "ferry_outbox".into(),
            tables: vec![TableSpec::new("public", "outbox")],
            create_slot: true,
            create_publication: true,
            failover: false,
        }
    }

    fn server_error(code: &str, message: &str) -> ReaderError {
        ReaderError::Server(ServerError {
            severity: "ERROR".into(),
            code: code.into(),
            message: message.into(),
            detail: None,
            hint: None,
        })
    }

    fn problem(e: SetupError) -> Problem {
        match e {
            SetupError::Problems(mut p) => {
                assert_eq!(p.len(), 1, "{p:#?}");
                p.remove(0)
            }
            other => panic!("not a problem: {other:?}"),
        }
    }

    #[test]
    fn the_publication_is_created_only_when_missing_allowed_and_every_table_exists() {
        let create = spec().create_publication_sql();
        assert_eq!(publication_to_create(&spec(), false, true), Some(create));
        assert_eq!(
            publication_to_create(&spec(), true, true),
            None,
            "never altered"
        );
        assert_eq!(
            publication_to_create(&spec(), false, false),
            None,
            "a missing table is check()'s error"
        );
        let not_allowed = SlotSpec {
            create_publication: false,
            ..spec()
        };
        assert_eq!(publication_to_create(&not_allowed, false, true), None);
    }

    #[test]
    fn a_failover_slot_is_created_with_the_fifth_argument() {
        assert_eq!(
            create_slot_sql(true),
            "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
        );
        assert_eq!(
            create_slot_sql(false),
            "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')"
        );
    }

    #[test]
    fn a_duplicate_object_or_unique_violation_is_a_lost_race() {
        assert!(lost_race(Some("42710")));
        assert!(lost_race(Some("23505")));
        assert!(!lost_race(Some("42501")));
        assert!(!lost_race(None), "no SQLSTATE: the connection failed");
    }

    #[test]
    fn a_refused_publication_is_a_problem_with_the_create_for_the_tables_owner() {
        let err = server_error("42501", "must be owner of table outbox");
        let shown = err.to_string();
        let p = problem(refused(Creating::Publication, &spec(), err));
        assert_eq!(p.severity, Severity::Error);
        assert_eq!(
            p.what,
            format!("cannot create publication \"ferry_outbox\": {shown}")
        );
        assert!(p
            .what
            .contains("must be owner of table outbox (SQLSTATE 42501)"));
        assert_eq!(
            p.fix,
            format!(
                "have the table's owner run `{}` (see sql/publication.sql), or grant Ferry's role ownership of the table",
                spec().create_publication_sql()
            )
        );
    }

    #[test]
    fn a_refused_slot_is_a_problem_pointing_at_ferry_check() {
        let err = server_error("55000", "logical decoding requires wal_level >= logical");
        let shown = err.to_string();
        let p = problem(refused(Creating::Slot, &spec(), err));
        assert_eq!(p.severity, Severity::Error);
        assert_eq!(
            p.what,
            format!("cannot create replication slot \"ferry\": {shown}")
        );
        assert_eq!(
            p.fix,
            "check wal_level, max_replication_slots and the REPLICATION privilege (run `ferry check`)"
        );
    }

    #[test]
    fn a_transient_failure_to_create_is_retried_not_reported() {
        for creating in [Creating::Publication, Creating::Slot] {
            let e = refused(
                creating,
                &spec(),
                server_error(
                    "57P01",
                    "terminating connection due to administrator command",
                ),
            );
            assert!(matches!(e, SetupError::Connection(_)), "{e:?}");
            assert!(e.is_transient());
        }
    }

    #[test]
    fn after_creating_nothing_more_is_created() {
        let spec = SlotSpec {
            failover: true,
            ..spec()
        };
        let after = created(&spec);
        assert!(!after.create_slot && !after.create_publication);
        assert_eq!(
            (
                after.slot,
                after.publication,
                after.tables.len(),
                after.failover
            ),
            (spec.slot, spec.publication, 1, true)
        );
    }

    #[test]
    fn only_errors_stop_ensure() {
        let of = |severity, what: &str| Problem {
            severity,
            what: what.into(),
            fix: String::new(),
        };
        let errors = errors_of(vec![
            of(Severity::Note, "a"),
            of(Severity::Error, "b"),
            of(Severity::Warning, "c"),
            of(Severity::Error, "d"),
        ]);
        assert_eq!(
            errors,
            vec![of(Severity::Error, "b"), of(Severity::Error, "d")]
        );
        assert!(errors_of(vec![of(Severity::Warning, "c")]).is_empty());
    }
}
