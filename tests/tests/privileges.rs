//! Every PostgreSQL privilege `ferry run` needs, `ferry check` tests first: a role lacking just
//! that one fails `check` with the privilege named and the command that grants it (or the way
//! around it), and `run` refuses the same way before it creates anything. The list, and why each
//! is needed, is in `crates/ferry-wal/src/slot/privileges.rs`.
//!
//! Each test makes its own role (roles are cluster-wide: unique names) and drops it.

mod common;

use std::time::Duration;

use common::*;

const PASSWORD: &str = "priv-Pw-1";

/// Creates a role with LOGIN and `attributes` (e.g. "REPLICATION"), and points Ferry at it.
async fn role(w: &mut World, attributes: &str) -> String {
    let role = ferry_testkit::pg::unique_name("ferry_priv");
    w.sql
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN {attributes} PASSWORD '{PASSWORD}'"
        ))
        .await
        .unwrap();
    w.env
        .push(("FERRY_POSTGRES_URL".into(), w.db.url_as(&role, PASSWORD)));
    role
}

async fn drop_role(w: &World, role: &str) {
    // Its sessions may still be closing; DROP OWNED also revokes its grants on the database.
    wait_until(
        &format!("DROP ROLE {role}"),
        Duration::from_secs(30),
        || async {
            w.sql
                .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
                .await
                .is_ok()
        },
    )
    .await;
}

/// Runs `ferry check`: its exit code and output.
async fn check(w: &World) -> (Option<i32>, String) {
    let mut ferry = Ferry::spawn(w, &["check"]);
    let status = ferry.wait_exit(Duration::from_secs(60)).await;
    (status.code(), ferry.log_text())
}

/// Runs `ferry run`, which must stop (exit 1) at set-up; its output.
async fn run_refuses(w: &World) -> String {
    let mut ferry = w.start_ferry();
    let status = ferry.wait_exit(Duration::from_secs(90)).await;
    let log = ferry.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    log
}

/// Whether the world's slot and publication exist.
async fn created(w: &World) -> (bool, bool) {
    let row = w
        .sql
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1), \
                    EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $2)",
            &[&w.slot, &w.publication],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// `run`'s log names the problem and its fix on one line (`...; fix: ...`).
fn assert_refused(log: &str, what: &str, fix: &str) {
    assert!(
        log.lines().any(|l| l.contains(what) && l.contains(fix)),
        "run should stop with {what:?} and the fix {fix:?}:\n{log}"
    );
}

fn database(w: &World) -> String {
    w.db.name.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_the_publication_needs_create_on_the_database() {
    let mut w = World::new().await;
    let role = role(&mut w, "REPLICATION").await;
    w.sql
        .batch_execute(&format!("ALTER TABLE outbox OWNER TO {role}"))
        .await
        .unwrap();
    let db = database(&w);
    let (what, fix) = (
        format!("role {role:?} lacks CREATE on database {db:?}, which creating publication"),
        format!("run GRANT CREATE ON DATABASE {db:?} TO {role:?}"),
    );
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(&out, &what, &fix);
    assert_problem(
        &out,
        &what,
        "or have the table's owner create the publication once: `CREATE PUBLICATION",
    );
    assert!(
        !out.contains("Ferry creates it (`CREATE PUBLICATION"),
        "{out}"
    );

    let log = run_refuses(&w).await;
    assert_refused(&log, &what, &fix);
    assert_eq!(created(&w).await, (false, false), "nothing was created");

    // Granting it is the whole fix.
    w.sql
        .batch_execute(&format!("GRANT CREATE ON DATABASE {db} TO {role}"))
        .await
        .unwrap();
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(0), "{out}");
    drop_role(&w, &role).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_the_publication_needs_ownership_of_the_table() {
    let mut w = World::new().await;
    let role = role(&mut w, "REPLICATION").await;
    let db = database(&w);
    w.sql
        .batch_execute(&format!("GRANT CREATE ON DATABASE {db} TO {role}"))
        .await
        .unwrap();
    let what = format!(
        "role {role:?} does not own table \"public\".\"outbox\" (its owner is \"postgres\")"
    );
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    let create = format!(
        "`CREATE PUBLICATION {:?} FOR TABLE \"public\".\"outbox\" WITH (publish = 'insert', publish_via_partition_root = true)`",
        w.publication
    );
    assert_problem(
        &out,
        &what,
        &format!("have \"postgres\" (or a superuser) create the publication once: {create}"),
    );
    assert_problem(
        &out,
        &what,
        &format!("or run ALTER TABLE \"public\".\"outbox\" OWNER TO {role:?}"),
    );

    let log = run_refuses(&w).await;
    assert_refused(&log, &what, "create the publication once");
    assert_eq!(created(&w).await, (false, false), "nothing was created");

    // The way around it: the owner creates the publication with the SQL given, and the role
    // needs no ownership to use it.
    w.sql.batch_execute(create.trim_matches('`')).await.unwrap();
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(0), "{out}");
    drop_role(&w, &role).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn looking_the_table_up_needs_usage_on_its_schema() {
    let mut w = World::bare(
        ferry_testkit::pg::shared().create_db().await,
        ferry_testkit::kafka::shared().brokers(),
    )
    .await;
    w.sql
        .batch_execute(&format!(
            "CREATE SCHEMA app; {}; CREATE PUBLICATION {} FOR TABLE app.outbox WITH (publish = 'insert')",
            OUTBOX_DDL.replace("CREATE TABLE outbox", "CREATE TABLE app.outbox"),
            w.publication
        ))
        .await
        .unwrap();
    w.env
        .push(("FERRY_OUTBOX_TABLE".into(), "app.outbox".into()));
    let role = role(&mut w, "REPLICATION").await;
    let what = format!(
        "role {role:?} lacks USAGE on schema \"app\", so it cannot look up table \"app\".\"outbox\""
    );
    let fix = format!("run GRANT USAGE ON SCHEMA \"app\" TO {role:?}");
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(&out, &what, &fix);
    assert!(!out.contains("cannot inspect the database"), "{out}");

    let log = run_refuses(&w).await;
    assert_refused(&log, &what, &fix);
    assert_eq!(created(&w).await, (false, true), "no slot was created");

    w.sql
        .batch_execute(&format!("GRANT USAGE ON SCHEMA app TO {role}"))
        .await
        .unwrap();
    let (code, out) = check(&w).await;
    // Without SELECT, check cannot sample the rows: a warning, since run needs none.
    assert_eq!(code, Some(0), "{out}");
    drop_role(&w, &role).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_needs_connect_on_the_database() {
    let mut w = World::new().await;
    let db = database(&w);
    w.sql
        .batch_execute(&format!("REVOKE CONNECT ON DATABASE {db} FROM PUBLIC"))
        .await
        .unwrap();
    let role = role(&mut w, "REPLICATION").await;
    let fix = format!("run GRANT CONNECT ON DATABASE {db:?} TO {role:?}");
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(1), "{out}");
    assert_problem(
        &out,
        &format!(
            "cannot connect to PostgreSQL: PostgreSQL FATAL: permission denied for database {db:?}"
        ),
        &fix,
    );

    let log = run_refuses(&w).await;
    assert!(log.contains(&fix), "{log}");
    assert_eq!(created(&w).await, (false, false), "nothing was created");

    w.sql
        .batch_execute(&format!(
            "GRANT CONNECT ON DATABASE {db} TO {role}; ALTER TABLE outbox OWNER TO {role}; \
             GRANT CREATE ON DATABASE {db} TO {role}"
        ))
        .await
        .unwrap();
    let (code, out) = check(&w).await;
    assert_eq!(code, Some(0), "{out}");
    drop_role(&w, &role).await;
}

/// REPLICATION (check's test of it is in check.rs): `run` refuses before it creates the
/// publication, which it could, and the slot, which it cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_needs_replication_and_run_creates_nothing_without_it() {
    let mut w = World::new().await;
    let role = role(&mut w, "").await;
    let db = database(&w);
    w.sql
        .batch_execute(&format!(
            "ALTER TABLE outbox OWNER TO {role}; GRANT CREATE ON DATABASE {db} TO {role}"
        ))
        .await
        .unwrap();
    let log = run_refuses(&w).await;
    assert_refused(
        &log,
        &format!("role {role:?} lacks the REPLICATION attribute"),
        &format!("ALTER ROLE {role:?} WITH REPLICATION"),
    );
    assert_eq!(created(&w).await, (false, false), "nothing was created");
    drop_role(&w, &role).await;
}
