//! On a machine without PostgreSQL or the test broker, the harness says what to run instead of
//! failing on a bare "No such file or directory"; where both are installed it finds them.

use std::path::{Path, PathBuf};

use ferry_testkit::pg;

/// A fresh empty directory under the temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let p = std::env::temp_dir().join(pg::unique_name("ferry-testkit-scratch"));
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    /// Creates `rel/<name>` for each name (empty files stand for the binaries).
    fn files(&self, rel: &str, names: &[&str]) -> PathBuf {
        let d = self.0.join(rel);
        std::fs::create_dir_all(&d).unwrap();
        for n in names {
            std::fs::write(d.join(n), b"").unwrap();
        }
        d
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const SERVER: &[&str] = &["initdb", "postgres", "pg_isready"];

#[test]
fn missing_postgres_names_the_setup_command_and_the_alternatives() {
    let s = Scratch::new();
    let empty_path = std::ffi::OsString::from(s.0.join("nothing-here"));
    let e = pg::find_pg_bindir(None, &s.0, Some(&empty_path)).unwrap_err();
    assert!(e.contains("bash .ci/install-deps"), "{e}");
    assert!(e.contains("root or sudo"), "{e}");
    assert!(e.contains("FERRY_TEST_PG_URL"), "{e}");
    assert!(e.contains("initdb"), "{e}");
}

#[test]
fn an_install_without_initdb_does_not_count() {
    // A client-only install (psql, pg_dump) under /usr/lib/postgresql/<v>/bin is not a server.
    let s = Scratch::new();
    s.files("16/bin", &["psql", "pg_isready"]);
    let e = pg::find_pg_bindir(None, &s.0, None).unwrap_err();
    assert!(e.contains("bash .ci/install-deps"), "{e}");
}

#[test]
fn newest_complete_server_version_wins_then_path() {
    let s = Scratch::new();
    s.files("13/bin", SERVER);
    let v15 = s.files("15/bin", SERVER);
    s.files("16/bin", &["psql"]);
    assert_eq!(pg::find_pg_bindir(None, &s.0, None).unwrap(), v15);

    let t = Scratch::new();
    let on_path = t.files("local/bin", SERVER);
    let path = std::env::join_paths([t.0.join("elsewhere"), on_path.clone()]).unwrap();
    assert_eq!(
        pg::find_pg_bindir(None, &t.0.join("none"), Some(&path)).unwrap(),
        on_path
    );
}

#[test]
fn a_wrong_bindir_variable_is_named_not_skipped() {
    let s = Scratch::new();
    s.files("15/bin", SERVER);
    let wrong = s.files("empty", &[]);
    let e = pg::find_pg_bindir(Some(wrong.clone()), &s.0, None).unwrap_err();
    assert!(e.contains("FERRY_TEST_PG_BINDIR"), "{e}");
    assert!(e.contains(&wrong.display().to_string()), "{e}");
    let good = s.0.join("15/bin");
    assert_eq!(
        pg::find_pg_bindir(Some(good.clone()), Path::new("/nonexistent"), None).unwrap(),
        good
    );
}

#[cfg(feature = "kafka")]
#[test]
fn missing_broker_names_the_setup_command_and_the_alternative() {
    use ferry_testkit::kafka;
    let s = Scratch::new();
    let e = kafka::find_kafka_libs(None, &s.0).unwrap_err();
    assert!(e.contains("bash .ci/install-deps"), "{e}");
    assert!(e.contains("FERRY_TEST_KAFKA_BROKERS"), "{e}");
    assert!(e.contains("Maven Central"), "{e}");

    let e = kafka::find_kafka_libs(Some(s.0.join("no-such-dir")), &s.0).unwrap_err();
    assert!(e.contains("FERRY_TEST_KAFKA_LIBS"), "{e}");

    // A directory Maven was still filling (no `.complete`) is not an installation.
    let jar = format!("kafka_2.13-{}.jar", kafka::KAFKA_VERSION);
    let libs = s.files(&format!("kafka-{}/libs", kafka::KAFKA_VERSION), &[&jar]);
    assert!(kafka::find_kafka_libs(None, &s.0).is_err());
    s.files(
        &format!("kafka-{}/libs", kafka::KAFKA_VERSION),
        &[".complete"],
    );
    assert_eq!(kafka::find_kafka_libs(None, &s.0).unwrap(), libs);
}
