//! How the reader reaches PostgreSQL: SCRAM-SHA-256 and MD5 over TCP, a wrong password, a Unix
//! socket, and TLS under every `sslmode` against a server that accepts TCP only over TLS.
//!
//! Each connection is made twice, as Ferry makes it: the replication stream (`conn::start`) and
//! the ordinary SQL connection (`slot::connect_sql`), which must be equally protected.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::*;
use ferry_testkit::pg::{self, ClusterOptions, PgCluster};
use ferry_wal::conn::{ConnectConfig, ReaderError, ReaderHandle};
use ferry_wal::slot::{self, SlotSpec};

/// Inserts a row and reads it back through a reader started with `cfg` (whose SQL connection
/// is made with `cfg` too). Returns the reader, still streaming, and its SQL connection.
async fn stream_one_row(
    cfg: &ConnectConfig,
    spec: &SlotSpec,
    writer: &tokio_postgres::Client,
) -> (ReaderHandle, tokio_postgres::Client) {
    let sql = slot::connect_sql(cfg)
        .await
        .unwrap_or_else(|e| panic!("connect_sql as {cfg}: {e}"));
    let mut r = ferry_wal::conn::start(cfg, &sql, options(spec, None))
        .await
        .unwrap_or_else(|e| panic!("conn::start as {cfg}: {e}"));
    let note = pg::unique_name("row");
    writer
        .execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, note) VALUES ('a', '1', 't', $1)",
            &[&note],
        )
        .await
        .unwrap();
    let t = next_txn(&mut r).await;
    assert_eq!(text(&t.rows[0], "note").unwrap(), note);
    r.confirm(t.end_lsn);
    (r, sql)
}

/// The stored password's hash scheme (`SCRAM-SHA-256` or `md5`).
async fn password_scheme(sql: &tokio_postgres::Client, role: &str) -> String {
    sql.query_one(
        "SELECT CASE WHEN rolpassword LIKE 'md5%' THEN 'md5' ELSE split_part(rolpassword, '$', 1) END \
         FROM pg_authid WHERE rolname = $1",
        &[&role],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn scram_sha_256_over_tcp_streams() {
    let s = setup().await;
    let role = pg::unique_name("scram");
    s.sql
        .batch_execute(&format!(
            "SET password_encryption = 'scram-sha-256';
             CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'scram pw'"
        ))
        .await
        .unwrap();
    assert_eq!(password_scheme(&s.sql, &role).await, "SCRAM-SHA-256");
    let cfg = ConnectConfig::parse(&s.db.url_as(&role, "scram%20pw")).unwrap();
    let (r, _) = stream_one_row(&cfg, &s.spec, &s.sql).await;
    r.shutdown().await.unwrap();
    drop_role(&s.sql, &role).await;
}

#[tokio::test]
async fn md5_over_tcp_streams() {
    let s = setup().await;
    let role = pg::MD5_ROLE;
    // The role is cluster-wide and this is the only test that uses it; another process may
    // have created it already (a shared external server), so create it idempotently and
    // always (re)set its password with MD5 hashing.
    s.sql
        .batch_execute(&format!(
            "SET password_encryption = 'md5';
             DO $$ BEGIN CREATE ROLE {role}; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             ALTER ROLE {role} WITH LOGIN REPLICATION PASSWORD 'md5 pw';"
        ))
        .await
        .unwrap();
    assert_eq!(password_scheme(&s.sql, role).await, "md5");
    if let pg::Postgres::Local(_) = pg::shared() {
        let md5_rule: bool = s
            .sql
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_hba_file_rules WHERE $1 = ANY(user_name) AND auth_method = 'md5')",
                &[&role],
            )
            .await
            .unwrap()
            .get(0);
        assert!(md5_rule, "the harness authenticates {role} with md5");
    }
    let cfg = ConnectConfig::parse(&s.db.url_as(role, "md5%20pw")).unwrap();
    let (r, _) = stream_one_row(&cfg, &s.spec, &s.sql).await;
    r.shutdown().await.unwrap();
    // Otherwise the next start() stands by for the old walsender (SlotInUse) before connecting.
    wait_released(&s.sql, &s.spec.slot).await;

    let wrong = ConnectConfig::parse(&s.db.url_as(role, "nope")).unwrap();
    assert_wrong_password(&wrong, &s).await;
}

#[tokio::test]
async fn a_wrong_password_is_a_permanent_auth_error() {
    let s = setup().await;
    let cfg = ConnectConfig::parse(&s.db.url_as("postgres", "wrong")).unwrap();
    assert_wrong_password(&cfg, &s).await;
}

async fn assert_wrong_password(cfg: &ConnectConfig, s: &Setup) {
    let err = match ferry_wal::conn::start(cfg, &s.sql, options(&s.spec, None)).await {
        Ok(_) => panic!("a wrong password was accepted"),
        Err(e) => e,
    };
    assert!(!err.is_transient(), "{err}");
    let ReaderError::Auth { user, reason } = &err else {
        panic!("expected an Auth error, got {err:?}")
    };
    assert_eq!(user, &cfg.user);
    assert!(reason.contains("28P01"), "{reason}");
    assert!(reason.contains("check the"), "says how to fix it: {reason}");
    assert!(
        !err.to_string().contains("wrong"),
        "the password never prints"
    );

    let err = slot::connect_sql(cfg).await.unwrap_err();
    assert!(!err.is_transient(), "{err}");
    assert!(
        matches!(&err, ReaderError::Auth { reason, .. } if reason.contains("28P01") && reason.contains("check the")),
        "{err:?}"
    );
    assert!(
        !err.to_string().contains("wrong"),
        "the password never prints"
    );
}

async fn drop_role(sql: &tokio_postgres::Client, role: &str) {
    // The role's sessions may still be closing.
    ferry_testkit::wait_until(
        &format!("DROP ROLE {role}"),
        std::time::Duration::from_secs(30),
        || async {
            sql.batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
                .await
                .is_ok()
        },
    )
    .await;
}

/// One private cluster serving TLS (TCP only over TLS: `hostssl`), shared by the TLS tests and
/// the socket test; each test takes a database of its own.
fn tls_cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        PgCluster::start_blocking(ClusterOptions {
            tls: true,
            extra_conf: vec![],
        })
    })
}

/// A database on the TLS cluster with the outbox, its publication and a slot, set up over the
/// cluster's Unix socket.
struct TlsDb {
    name: String,
    admin: tokio_postgres::Client,
    spec: SlotSpec,
}

impl TlsDb {
    async fn new() -> TlsDb {
        let cluster = tls_cluster();
        let name = pg::unique_name("ferry_tls");
        let postgres = socket_client(cluster, "postgres").await;
        postgres
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let admin = socket_client(cluster, &name).await;
        admin.batch_execute(OUTBOX_DDL).await.unwrap();
        let spec = spec();
        slot::ensure(&admin, &spec).await.unwrap();
        TlsDb { name, admin, spec }
    }

    /// A superuser URL over TCP with the given query parameters.
    fn url(&self, host: &str, params: &str) -> ConnectConfig {
        let port = tls_cluster().port();
        let url = format!(
            "postgres://postgres:{}@{host}:{port}/{}?{params}",
            pg::SUPERUSER_PASSWORD,
            self.name
        );
        ConnectConfig::parse(&url).unwrap()
    }

    /// Whether the backend `pid` talks TLS.
    async fn uses_tls(&self, pid: i32) -> bool {
        self.admin
            .query_opt("SELECT ssl FROM pg_stat_ssl WHERE pid = $1", &[&pid])
            .await
            .unwrap()
            .is_some_and(|r| r.get(0))
    }
}

async fn socket_client(cluster: &PgCluster, db: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::Config::new()
        .host_path(cluster.socket_dir())
        .port(cluster.port())
        .user("postgres")
        .dbname(db)
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

fn ca() -> String {
    tls_cluster().ca_cert().display().to_string()
}

/// A CA that did not sign the server's certificate, in a directory removed on drop.
struct OtherCa(PathBuf);

impl OtherCa {
    fn new() -> OtherCa {
        let dir = std::env::temp_dir().join(pg::unique_name("ferry-other-ca"));
        std::fs::create_dir_all(&dir).unwrap();
        let out = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
            .args(["-subj", "/CN=not-the-ferry-test-ca"])
            .args(["-keyout", "ca.key", "-out", "ca.crt"])
            .current_dir(&dir)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        OtherCa(dir)
    }

    fn cert(&self) -> String {
        self.0.join("ca.crt").display().to_string()
    }
}

impl Drop for OtherCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn verify_full_with_the_servers_ca_streams_over_tls() {
    let db = TlsDb::new().await;
    let cfg = db.url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", ca()),
    );
    let sql = slot::connect_sql(&cfg).await.unwrap();
    assert!(
        db.uses_tls(sql_pid(&sql).await).await,
        "the SQL connection is encrypted"
    );
    let mut r = ferry_wal::conn::start(&cfg, &sql, options(&db.spec, None))
        .await
        .unwrap();
    assert!(
        db.uses_tls(r.backend_pid).await,
        "the replication stream is encrypted"
    );
    insert_and_expect_note(&db.admin, &mut r, "over tls").await;
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn verify_full_accepts_the_ip_address_the_certificate_names() {
    let db = TlsDb::new().await;
    let cfg = db.url(
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={}", ca()),
    );
    let (r, sql) = stream_one_row(&cfg, &db.spec, &db.admin).await;
    assert!(db.uses_tls(r.backend_pid).await);
    assert!(db.uses_tls(sql_pid(&sql).await).await);
    r.shutdown().await.unwrap();
}

async fn sql_pid(sql: &tokio_postgres::Client) -> i32 {
    sql.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn sslmode_disable_is_refused_by_a_tls_only_server_with_a_clear_error() {
    let db = TlsDb::new().await;
    let cfg = db.url("127.0.0.1", "sslmode=disable");
    let err = match ferry_wal::conn::start(&cfg, &db.admin, options(&db.spec, None)).await {
        Ok(_) => panic!("a plaintext replication connection was accepted"),
        Err(e) => e,
    };
    assert!(!err.is_transient(), "{err}");
    assert!(matches!(err, ReaderError::Auth { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("no encryption"), "{msg}");
    assert!(
        msg.contains("sslmode=verify-full"),
        "says how to fix it: {msg}"
    );

    let err = slot::connect_sql(&cfg).await.unwrap_err();
    assert!(!err.is_transient(), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("no encryption"), "{msg}");
    assert!(
        msg.contains("sslmode=verify-full"),
        "says how to fix it: {msg}"
    );
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_rejected_permanently() {
    let db = TlsDb::new().await;
    let other = OtherCa::new();
    for mode in ["verify-full", "verify-ca", "require"] {
        // `require` with a root certificate verifies the chain, as libpq does.
        let cfg = db.url(
            "localhost",
            &format!("sslmode={mode}&sslrootcert={}", other.cert()),
        );
        let err = match ferry_wal::conn::start(&cfg, &db.admin, options(&db.spec, None)).await {
            Ok(_) => panic!("{mode}: a certificate from another CA was accepted"),
            Err(e) => e,
        };
        assert_certificate_rejected(mode, &err);
        let err = slot::connect_sql(&cfg).await.unwrap_err();
        assert_certificate_rejected(mode, &err);
    }
}

fn assert_certificate_rejected(mode: &str, err: &ReaderError) {
    assert!(!err.is_transient(), "{mode}: {err}");
    assert!(
        matches!(err, ReaderError::TlsCertificate { .. }),
        "{mode}: {err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("UnknownIssuer"), "{mode}: {msg}");
    assert!(
        msg.contains("sslrootcert"),
        "{mode}: says how to fix it: {msg}"
    );
}

#[tokio::test]
async fn require_without_a_root_certificate_encrypts_without_verifying() {
    let db = TlsDb::new().await;
    let cfg = db.url("127.0.0.1", "sslmode=require");
    let (r, sql) = stream_one_row(&cfg, &db.spec, &db.admin).await;
    assert!(db.uses_tls(r.backend_pid).await);
    assert!(db.uses_tls(sql_pid(&sql).await).await);
    r.shutdown().await.unwrap();
}

/// `verify-ca` checks the chain but not the name. The server's certificate names `localhost`
/// and `127.0.0.1`; the IPv4-mapped IPv6 address `::ffff:127.0.0.1` reaches the same server
/// under a name the certificate does not list.
#[tokio::test]
async fn verify_ca_checks_the_chain_but_not_the_name() {
    let db = TlsDb::new().await;
    let params = format!("sslmode=verify-full&sslrootcert={}", ca());
    let cfg = db.url("[::ffff:127.0.0.1]", &params);
    let err = match ferry_wal::conn::start(&cfg, &db.admin, options(&db.spec, None)).await {
        Ok(_) => panic!("verify-full accepted a certificate for another name"),
        Err(e) => e,
    };
    for err in [err, slot::connect_sql(&cfg).await.unwrap_err()] {
        assert!(!err.is_transient(), "{err}");
        assert!(matches!(err, ReaderError::TlsCertificate { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("not valid for name"), "{msg}");
        assert!(msg.contains("[::ffff:127.0.0.1]:"), "{msg}");
        assert!(
            msg.contains("sslmode=verify-ca"),
            "says how to fix it: {msg}"
        );
    }

    let cfg = db.url(
        "[::ffff:127.0.0.1]",
        &format!("sslmode=verify-ca&sslrootcert={}", ca()),
    );
    let (r, sql) = stream_one_row(&cfg, &db.spec, &db.admin).await;
    assert!(db.uses_tls(r.backend_pid).await);
    assert!(db.uses_tls(sql_pid(&sql).await).await);
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_unix_socket_streams_without_tls() {
    let db = TlsDb::new().await;
    let cluster = tls_cluster();
    // libpq's keyword form with the socket directory as the host; sslmode defaults to prefer.
    let cfg = ConnectConfig::parse(&format!(
        "host={} port={} user=postgres dbname={}",
        cluster.socket_dir().display(),
        cluster.port(),
        db.name
    ))
    .unwrap();
    let (r, sql) = stream_one_row(&cfg, &db.spec, &db.admin).await;
    assert!(!db.uses_tls(r.backend_pid).await);
    assert!(!db.uses_tls(sql_pid(&sql).await).await);
    r.shutdown().await.unwrap();
    wait_released(&db.admin, &db.spec.slot).await;
    // The URL form, percent-encoded, with TLS explicitly off.
    let dir = cluster
        .socket_dir()
        .display()
        .to_string()
        .replace('/', "%2F");
    let cfg = ConnectConfig::parse(&format!(
        "postgres://postgres@{dir}:{}/{}?sslmode=disable",
        cluster.port(),
        db.name
    ))
    .unwrap();
    let (r, _) = stream_one_row(&cfg, &db.spec, &db.admin).await;
    r.shutdown().await.unwrap();
}
