//! libpq's connection settings against a real server, for both connections Ferry makes (the
//! replication stream and the SQL connection): several hosts tried in order (the first a closed
//! port), `target_session_attrs=read-write` passing over a read-only server, the password from
//! a password file (`passfile`, libpq's format and permission rule), and connection errors that
//! keep their cause (a refused port, a name that does not resolve, a wrong password).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use common::*;
use ferry_testkit::pg;
use ferry_testkit::process::free_port;
use ferry_wal::conn::config::Host;
use ferry_wal::conn::{ConnectConfig, ReaderError};
use ferry_wal::slot;

/// Host, port and database of the test server, over TCP.
fn server(s: &Setup) -> (String, u16, String) {
    let Host::Tcp(host) = s.cfg.host.clone() else {
        panic!("the test server is reached over TCP: {}", s.cfg)
    };
    (host, s.cfg.port, s.cfg.dbname.clone())
}

/// Starts streaming with `cfg` (replication connection and SQL connection both made with it)
/// and reads one row back.
async fn streams(cfg: &ConnectConfig, s: &Setup) {
    let sql = slot::connect_sql(cfg)
        .await
        .unwrap_or_else(|e| panic!("connect_sql as {cfg}: {e}"));
    let mut r = ferry_wal::conn::start(cfg, &sql, options(&s.spec, None))
        .await
        .unwrap_or_else(|e| panic!("conn::start as {cfg}: {e}"));
    let note = pg::unique_name("note");
    s.sql
        .execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, note) VALUES ('a', '1', 't', $1)",
            &[&note],
        )
        .await
        .unwrap();
    let t = next_txn(&mut r).await;
    assert_eq!(text(&t.rows[0], "note"), Some(note));
    r.confirm(t.end_lsn);
    r.shutdown().await.unwrap();
    // The next reader starts after this one's walsender has let the slot go.
    wait_released(&s.sql, &s.spec.slot).await;
}

/// A file in a directory of its own, with `mode`.
struct TempFile(PathBuf);

impl TempFile {
    fn new(text: &str, mode: u32) -> TempFile {
        let dir = std::env::temp_dir().join(pg::unique_name("ferry-pgpass"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pgpass");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[tokio::test]
async fn the_second_host_is_used_when_the_first_port_is_closed() {
    let s = setup().await;
    let (host, port, db) = server(&s);
    let closed = free_port();
    for url in [
        format!(
            "postgresql://postgres:{pw}@{host}:{closed},{host}:{port}/{db}?target_session_attrs=read-write",
            pw = pg::SUPERUSER_PASSWORD
        ),
        format!(
            "host={host},{host} port={closed},{port} dbname={db} user=postgres password={pw} target_session_attrs=primary",
            pw = pg::SUPERUSER_PASSWORD
        ),
    ] {
        let cfg = ConnectConfig::parse(&url).unwrap();
        assert_eq!(cfg.hosts.len(), 2);
        streams(&cfg, &s).await;
    }
}

#[tokio::test]
async fn read_write_passes_over_a_read_only_server() {
    let s = setup().await;
    let (host, port, db) = server(&s);
    s.sql
        .batch_execute(&format!(
            "ALTER DATABASE \"{db}\" SET default_transaction_read_only = on"
        ))
        .await
        .unwrap();
    let url = |attrs: &str| {
        format!(
            "postgresql://postgres:{}@{host}:{port}/{db}?target_session_attrs={attrs}",
            pg::SUPERUSER_PASSWORD
        )
    };
    // Sessions of this database are read-only by default: not a read-write server ...
    let cfg = ConnectConfig::parse(&url("read-write")).unwrap();
    let err = slot::connect_sql(&cfg).await.unwrap_err();
    assert!(
        matches!(err, ReaderError::Unsuitable { .. }) && err.is_transient(),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!("{host}:{port} is read-only, and target_session_attrs=read-write asks for a read-write server")
    );
    let err = ferry_wal::conn::replication::ReplicationConnection::connect(&cfg)
        .await
        .unwrap_err();
    assert!(matches!(err, ReaderError::Unsuitable { .. }), "{err:?}");
    // ... but it is the primary, and any server will do without the attribute.
    for attrs in ["primary", "any"] {
        streams(&ConnectConfig::parse(&url(attrs)).unwrap(), &s).await;
    }
    // Several hosts that are all unsuitable: each says why.
    let two = format!(
        "postgresql://postgres:{}@{host}:{port},{host}:{port}/{db}?target_session_attrs=read-write",
        pg::SUPERUSER_PASSWORD
    );
    let err = slot::connect_sql(&ConnectConfig::parse(&two).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.to_string().matches("is read-only").count(), 2, "{err}");
    assert!(
        err.to_string().starts_with("no host could be used: "),
        "{err}"
    );
}

#[tokio::test]
async fn the_password_comes_from_the_password_file() {
    let s = setup().await;
    let (host, port, db) = server(&s);
    let role = pg::unique_name("pgpass");
    s.sql
        .batch_execute(&format!(
            "SET password_encryption = 'scram-sha-256';
             CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'from:file'"
        ))
        .await
        .unwrap();
    let entries = format!(
        "# other servers first\nelsewhere:5432:*:*:nope\n{host}:{port}:{db}:{role}:from\\:file\n*:*:*:*:catch-all\n"
    );
    let file = TempFile::new(&entries, 0o600);
    let url = format!(
        "postgresql://{role}@{host}:{port}/{db}?passfile={}",
        file.0.display()
    );
    let mut cfg = ConnectConfig::parse(&url).unwrap();
    cfg.resolve_passwords(&|_| None);
    streams(&cfg, &s).await;

    // libpq ignores a password file that others may read; the refusal says so.
    std::fs::set_permissions(&file.0, std::fs::Permissions::from_mode(0o644)).unwrap();
    for err in [
        slot::connect_sql(&cfg).await.unwrap_err(),
        ferry_wal::conn::replication::ReplicationConnection::connect(&cfg)
            .await
            .unwrap_err(),
    ] {
        let text = err.to_string();
        assert!(matches!(err, ReaderError::Auth { .. }), "{err:?}");
        assert!(text.contains("none is configured"), "{text}");
        assert!(
            text.contains(&format!("chmod 0600 {}", file.0.display())),
            "{text}"
        );
    }
    s.sql
        .batch_execute(&format!("DROP ROLE {role}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn connection_errors_keep_their_cause() {
    let s = setup().await;
    let (host, port, db) = server(&s);
    let closed = free_port();
    let pw = pg::SUPERUSER_PASSWORD;
    // (URL, what both connections' error says)
    let cases = [
        (
            format!("postgresql://postgres:{pw}@127.0.0.1:{closed}/{db}"),
            format!("the connection to 127.0.0.1:{closed} failed: Connection refused"),
        ),
        (
            format!("postgresql://postgres:{pw}@localhost:{closed}/{db}"),
            format!(
                "the connection to localhost:{closed} (127.0.0.1:{closed}) failed: Connection refused"
            ),
        ),
        (
            format!("postgresql://postgres:{pw}@nonexistent.invalid:{port}/{db}"),
            "cannot resolve the host name \"nonexistent.invalid\": ".to_owned(),
        ),
        (
            format!("postgresql://postgres:not-it@{host}:{port}/{db}"),
            "authentication as \"postgres\" failed: ".to_owned(),
        ),
    ];
    for (url, says) in cases {
        let cfg = ConnectConfig::parse(&url).unwrap();
        let sql = slot::connect_sql(&cfg).await.unwrap_err();
        let repl = ferry_wal::conn::replication::ReplicationConnection::connect(&cfg)
            .await
            .unwrap_err();
        for err in [sql, repl] {
            let text = err.to_string();
            assert!(
                text.starts_with(&says),
                "{says:?} is not the start of {text:?}"
            );
            assert!(
                !text.contains("not-it"),
                "the password never prints: {text}"
            );
        }
    }
    // The wrong password names the server's refusal, and on the replication connection the
    // method the server asked for.
    let cfg =
        ConnectConfig::parse(&format!("postgresql://postgres:not-it@{host}:{port}/{db}")).unwrap();
    let repl = ferry_wal::conn::replication::ReplicationConnection::connect(&cfg)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        repl.contains("by SCRAM-SHA-256: ") || repl.contains("by md5: "),
        "{repl}"
    );
    assert!(
        repl.contains("password authentication failed") && repl.contains("28P01"),
        "{repl}"
    );
}

#[tokio::test]
async fn hostaddr_is_connected_to_without_resolving_the_host() {
    let s = setup().await;
    let (host, port, db) = server(&s);
    let ip: std::net::IpAddr = tokio::net::lookup_host((host.as_str(), port))
        .await
        .unwrap()
        .next()
        .unwrap()
        .ip();
    let cfg = ConnectConfig::parse(&format!(
        "host=nonexistent.invalid hostaddr={ip} port={port} dbname={db} user=postgres password={}",
        pg::SUPERUSER_PASSWORD
    ))
    .unwrap();
    streams(&cfg, &s).await;
}
