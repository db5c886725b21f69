//! The privileges `ferry run` needs in PostgreSQL, and what to tell an operator whose role lacks
//! one. Pure: [`super::role_grants`] asks the server,
//! [`lookup_problems`] and [`publication_problems`] judge.
//!
//! What `run` does against PostgreSQL, and what each step needs (the same in 14 to 18):
//!
//! - **connects** (an SQL session, then a `replication=database` one): LOGIN, a pg_hba.conf
//!   line, and CONNECT on the database (PUBLIC has it unless revoked). Without CONNECT the
//!   server refuses the connection (42501 "permission denied for database", detail "User does
//!   not have CONNECT privilege"): [`connect_refusal_hint`] adds the GRANT;
//! - **reads the catalogs and settings** (`pg_class`, `pg_publication*`, `pg_replication_slots`,
//!   `pg_stat_replication`, `wal_level`, `max_replication_slots`, `max_wal_senders`,
//!   `synchronized_standby_slots`, `pg_control_system()`, `pg_current_wal_lsn()`): every role may;
//! - **looks each outbox table up by name** (`regclass`, to see whether the publication covers
//!   it): USAGE on the table's schema ("permission denied for schema" without it);
//! - **creates the publication** when it is missing and `postgres.create_publication = true`:
//!   CREATE on the database, and ownership of every table it lists (`FOR TABLE`). Ferry never
//!   creates `FOR ALL TABLES` or `FOR TABLES IN SCHEMA` (15+) publications (superuser only), and
//!   never alters an existing publication, so it needs no ownership of one;
//! - **creates, alters and streams the slot** (`pg_create_logical_replication_slot`,
//!   `ALTER_REPLICATION_SLOT`, `START_REPLICATION`): the REPLICATION attribute or superuser
//!   (`rds_replication` on Amazon RDS), which [`super::check()`] tests;
//! - **reads no outbox rows and deletes none**: logical decoding needs no SELECT (only a
//!   subscriber's initial copy does, which Ferry does not make); `ferry check` samples rows,
//!   and without SELECT only warns. Pruning the outbox is the application's
//!   (`sql/housekeeping.sql`).
//!
//! A superuser passes every test here: PostgreSQL's `has_*_privilege` and `pg_has_role` answer
//! true for one.

use super::{quote_ident, Problem, Severity, SlotSpec};

/// What the server says the current role may do, for the outbox tables of a [`SlotSpec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleGrants {
    /// `current_user`.
    pub role: String,
    /// `current_database()`.
    pub database: String,
    /// `has_database_privilege(current_database(), 'CREATE')`.
    pub create_on_database: bool,
    /// One per [`SlotSpec::tables`], in its order.
    pub tables: Vec<TableGrants>,
}

/// The current role and one outbox table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableGrants {
    /// USAGE on the table's schema (true when there is no such schema: the missing table is
    /// reported on its own).
    pub schema_usage: bool,
    /// The table's owner and whether the role has its privileges (`pg_has_role(owner,
    /// 'USAGE')`: it is the owner, inherits from it, or is a superuser); `None` when there is
    /// no such table.
    pub owner: Option<(String, bool)>,
}

/// What every start needs: USAGE on each outbox table's schema. Each missing privilege is an
/// error with its fix.
pub fn lookup_problems(spec: &SlotSpec, grants: &RoleGrants) -> Vec<Problem> {
    let role = quote_ident(&grants.role);
    let mut problems = Vec::new();
    for (t, g) in spec.tables.iter().zip(&grants.tables) {
        if !g.schema_usage {
            problems.push(Problem {
                severity: Severity::Error,
                what: format!(
                    "role {:?} lacks USAGE on schema {:?}, so it cannot look up table {}",
                    grants.role,
                    t.schema,
                    t.qualified()
                ),
                fix: format!(
                    "run GRANT USAGE ON SCHEMA {} TO {role} as the schema's owner or a superuser",
                    quote_ident(&t.schema)
                ),
            });
        }
    }
    problems
}

/// What creating the publication needs (when it is missing and Ferry may create it): CREATE on
/// the database and ownership of every table. Each missing privilege is an error whose fix also
/// offers the way around it: the table's owner creates the publication once.
pub fn publication_problems(spec: &SlotSpec, grants: &RoleGrants) -> Vec<Problem> {
    let role = quote_ident(&grants.role);
    let mut problems = Vec::new();
    let create = spec.create_publication_sql();
    if !grants.create_on_database {
        problems.push(Problem {
            severity: Severity::Error,
            what: format!(
                "role {:?} lacks CREATE on database {:?}, which creating publication {:?} needs \
                 (postgres.create_publication = true)",
                grants.role, grants.database, spec.publication
            ),
            fix: format!(
                "run GRANT CREATE ON DATABASE {} TO {role} as a superuser or the database's owner, \
                 or have the table's owner create the publication once: `{create}` \
                 (sql/publication.sql; Ferry then uses it)",
                quote_ident(&grants.database)
            ),
        });
    }
    for (t, g) in spec.tables.iter().zip(&grants.tables) {
        let Some((owner, false)) = &g.owner else {
            continue;
        };
        let table = t.qualified();
        problems.push(Problem {
            severity: Severity::Error,
            what: format!(
                "role {:?} does not own table {table} (its owner is {owner:?}), and creating \
                 publication {:?} FOR TABLE needs ownership",
                grants.role, spec.publication
            ),
            fix: format!(
                "have {} (or a superuser) create the publication once: `{create}` \
                 (sql/publication.sql; Ferry then uses it), or run ALTER TABLE {table} OWNER TO {role}",
                quote_ident(owner)
            ),
        });
    }
    problems
}

/// The fix for a connection the server refused because the role lacks CONNECT on the database
/// (42501, "permission denied for database ...", detail "User does not have CONNECT
/// privilege."), which it sends without a hint.
pub fn connect_refusal_hint(
    code: &str,
    message: &str,
    detail: Option<&str>,
    user: &str,
    database: &str,
) -> Option<String> {
    let connect = detail.is_some_and(|d| d.contains("CONNECT"));
    (code == "42501" && message.starts_with("permission denied for database") && connect).then(
        || {
            format!(
                "run GRANT CONNECT ON DATABASE {} TO {} as a superuser or the database's owner",
                quote_ident(database),
                quote_ident(user)
            )
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slot::TableSpec;

    fn spec() -> SlotSpec {
        SlotSpec {
            slot: "ferry".into(),
            publication: "ferry_outbox".into(),
            tables: vec![
                TableSpec::new("public", "outbox"),
                TableSpec::new("billing", "events"),
            ],
            create_slot: true,
            create_publication: true,
            failover: false,
        }
    }

    fn all_granted() -> RoleGrants {
        RoleGrants {
            role: "ferry".into(),
            database: "shop".into(),
            create_on_database: true,
            tables: vec![
                TableGrants {
                    schema_usage: true,
                    owner: Some(("ferry".into(), true)),
                },
                TableGrants {
                    schema_usage: true,
                    owner: Some(("billing_admin".into(), true)),
                },
            ],
        }
    }

    #[test]
    fn a_role_with_every_privilege_has_no_problem() {
        assert_eq!(lookup_problems(&spec(), &all_granted()), vec![]);
        assert_eq!(publication_problems(&spec(), &all_granted()), vec![]);
    }

    #[test]
    fn a_schema_without_usage_is_an_error() {
        let mut g = all_granted();
        g.tables[1].schema_usage = false;
        assert_eq!(publication_problems(&spec(), &g), vec![], "reported once");
        {
            let p = lookup_problems(&spec(), &g);
            assert_eq!(p.len(), 1, "{p:#?}");
            assert_eq!(p[0].severity, Severity::Error);
            assert_eq!(
                p[0].what,
                "role \"ferry\" lacks USAGE on schema \"billing\", so it cannot look up table \"billing\".\"events\""
            );
            assert!(p[0]
                .fix
                .starts_with("run GRANT USAGE ON SCHEMA \"billing\" TO \"ferry\""));
        }
    }

    #[test]
    fn creating_the_publication_needs_create_on_the_database() {
        let mut g = all_granted();
        g.create_on_database = false;
        assert_eq!(lookup_problems(&spec(), &g), vec![]);
        let p = publication_problems(&spec(), &g);
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(p[0].what.contains("lacks CREATE on database \"shop\""));
        assert!(p[0]
            .fix
            .contains("GRANT CREATE ON DATABASE \"shop\" TO \"ferry\""));
        assert!(p[0].fix.contains(
            "`CREATE PUBLICATION \"ferry_outbox\" FOR TABLE \"public\".\"outbox\", \"billing\".\"events\""
        ));
    }

    #[test]
    fn creating_the_publication_needs_ownership_of_every_table_named_each() {
        let mut g = all_granted();
        g.tables[1].owner = Some(("billing_admin".into(), false));
        assert_eq!(lookup_problems(&spec(), &g), vec![]);
        let p = publication_problems(&spec(), &g);
        assert_eq!(p.len(), 1, "{p:#?}");
        assert_eq!(
            p[0].what,
            "role \"ferry\" does not own table \"billing\".\"events\" (its owner is \"billing_admin\"), \
             and creating publication \"ferry_outbox\" FOR TABLE needs ownership"
        );
        assert!(p[0].fix.starts_with(
            "have \"billing_admin\" (or a superuser) create the publication once: `CREATE PUBLICATION"
        ));
        assert!(p[0]
            .fix
            .ends_with("or run ALTER TABLE \"billing\".\"events\" OWNER TO \"ferry\""));
    }

    #[test]
    fn a_missing_table_is_left_to_its_own_error() {
        let mut g = all_granted();
        g.tables[0].owner = None;
        assert_eq!(publication_problems(&spec(), &g), vec![]);
    }

    #[test]
    fn names_are_quoted_in_the_commands() {
        let mut g = all_granted();
        g.role = "Ferry \"svc\"".into();
        g.create_on_database = false;
        let p = publication_problems(&spec(), &g);
        assert!(p[0]
            .fix
            .contains("GRANT CREATE ON DATABASE \"shop\" TO \"Ferry \"\"svc\"\"\""));
    }

    #[test]
    fn only_a_refused_connect_gets_the_grant() {
        let detail = Some("User does not have CONNECT privilege.");
        assert_eq!(
            connect_refusal_hint(
                "42501",
                "permission denied for database \"shop\"",
                detail,
                "ferry",
                "shop"
            )
            .as_deref(),
            Some("run GRANT CONNECT ON DATABASE \"shop\" TO \"ferry\" as a superuser or the database's owner")
        );
        assert_eq!(
            connect_refusal_hint(
                "42501",
                "permission denied for database shop",
                None,
                "ferry",
                "shop"
            ),
            None,
            "CREATE PUBLICATION's refusal is not about CONNECT"
        );
        assert_eq!(
            connect_refusal_hint("28P01", "password authentication failed", detail, "f", "d"),
            None
        );
    }
}
