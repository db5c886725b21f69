//! PostgreSQL for tests: a throwaway PostgreSQL cluster with `wal_level=logical`, or the
//! server named by `FERRY_TEST_PG_URL` (for example the docker-compose one).
//!
//! - [`shared`] is one server per test process. Each test takes its own database from it with
//!   [`Postgres::create_db`], so tests run in parallel without seeing each other's slots or rows.
//! - [`PgCluster::start`] is a private cluster for tests that restart or crash the server, or
//!   need TLS.
//!
//! A local cluster runs as the `postgres` user when the tests run as root (initdb refuses root),
//! in a temporary directory, on a free port, with the superuser `postgres`/`postgres` over
//! SCRAM on TCP and trust on its Unix socket. It dies with the test process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::process::{self, spawn_owned};

/// Environment variable naming an existing server (superuser URL) to use instead of a local cluster.
pub const PG_URL_ENV: &str = "FERRY_TEST_PG_URL";
/// Environment variable naming the PostgreSQL server binaries directory.
pub const PG_BINDIR_ENV: &str = "FERRY_TEST_PG_BINDIR";
/// The superuser password of local clusters.
pub const SUPERUSER_PASSWORD: &str = "postgres";
/// A role that local clusters authenticate with MD5 (created by tests that need it).
pub const MD5_ROLE: &str = "ferry_md5_user";

/// A PostgreSQL server tests can use.
#[derive(Debug)]
pub enum Postgres {
    /// The server named by `FERRY_TEST_PG_URL`.
    External { admin_url: String },
    /// A cluster this process started.
    Local(PgCluster),
}

/// The server shared by all tests of this process.
pub fn shared() -> &'static Postgres {
    static SHARED: OnceLock<Postgres> = OnceLock::new();
    SHARED.get_or_init(|| match std::env::var(PG_URL_ENV) {
        Ok(url) if !url.is_empty() => Postgres::External { admin_url: url },
        _ => {
            process::sweep_stale_dirs("ferry-pg");
            Postgres::Local(PgCluster::start_blocking(ClusterOptions::default()))
        }
    })
}

impl Postgres {
    /// A superuser URL to the `postgres` database.
    pub fn admin_url(&self) -> String {
        match self {
            Postgres::External { admin_url } => admin_url.clone(),
            Postgres::Local(c) => c.url("postgres"),
        }
    }

    /// A fresh, uniquely named database (dropped at the end of the test on external servers;
    /// local clusters are thrown away whole).
    pub async fn create_db(&self) -> TestDb {
        let name = unique_name("ferry_t");
        let admin = connect(&self.admin_url()).await;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        let url = with_dbname(&self.admin_url(), &name);
        TestDb {
            name,
            url,
            admin_url: self.admin_url(),
            cleanup: matches!(self, Postgres::External { .. }),
        }
    }
}

/// A database of its own for one test.
#[derive(Debug)]
pub struct TestDb {
    /// Database name.
    pub name: String,
    /// Superuser URL to this database.
    pub url: String,
    admin_url: String,
    cleanup: bool,
}

impl TestDb {
    /// A new superuser connection to this database (its connection task runs on the current runtime).
    pub async fn client(&self) -> tokio_postgres::Client {
        connect(&self.url).await
    }

    /// This database's URL with another user and password.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        let rest = self.url.split_once('@').map(|(_, r)| r).unwrap_or("");
        format!("postgres://{user}:{password}@{rest}")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if !self.cleanup {
            return;
        }
        let (admin, name) = (self.admin_url.clone(), self.name.clone());
        // Drop runs inside or outside a runtime: do the clean-up on a thread of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let c = connect(&admin).await;
                let _ = c
                    .execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                         WHERE database = $1 AND NOT active",
                        &[&name],
                    )
                    .await;
                let _ = c
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .await;
            });
        })
        .join();
    }
}

/// Connects with tokio-postgres (no TLS), retrying briefly, and drives the connection in a task.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let mut last = None;
    for _ in 0..50 {
        match tokio_postgres::connect(url, tokio_postgres::NoTls).await {
            Ok((client, conn)) => {
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                return client;
            }
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    panic!("connect to {url}: {last:?}");
}

/// `url` with its database name replaced.
pub fn with_dbname(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

/// A name unique across processes and calls: `<prefix>_<pid>_<nonce>_<n>`, where the nonce is
/// random once per process. The process id alone repeats: a directory a killed test process
/// left behind is only swept once its process id is free, and a new test process can get that
/// very id (CI once formatted a broker into a directory a run three hours earlier had left).
pub fn unique_name(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    static NONCE: OnceLock<u32> = OnceLock::new();
    let nonce = NONCE.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // `RandomState`'s keys come from the OS's random source once per process.
        let h = std::collections::hash_map::RandomState::new().build_hasher();
        h.finish() as u32 & 0xff_ffff
    });
    format!(
        "{prefix}_{}_{nonce:06x}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// How to set up a local cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// Serve TLS with a test CA (see [`PgCluster::ca_cert`]); the server certificate names
    /// `localhost` and `127.0.0.1`.
    pub tls: bool,
    /// Extra `postgresql.conf` lines.
    pub extra_conf: Vec<String>,
}

/// A local throwaway cluster.
#[derive(Debug)]
pub struct PgCluster {
    root: PathBuf,
    port: u16,
    bindir: PathBuf,
    owner: Option<(u32, u32)>,
    child: Mutex<Option<Child>>,
}

impl PgCluster {
    /// initdb + start. Blocking; call from async code through [`PgCluster::start`].
    pub fn start_blocking(opts: ClusterOptions) -> PgCluster {
        let bindir = pg_bindir();
        let owner = process::server_user().unwrap_or_else(|e| panic!("{e}: {PG_SETUP_HINT}"));
        let root = cluster_root(owner);
        let data = root.join("data");
        let pwfile = root.join("pwfile");
        std::fs::write(&pwfile, SUPERUSER_PASSWORD).expect("write pwfile");
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid)).expect("chown pwfile");
        }
        let mut initdb = Command::new(bindir.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync"])
            .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
            .arg(format!("--pwfile={}", pwfile.display()));
        as_owner(&mut initdb, owner);
        let out = initdb
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", bindir.join("initdb").display()));
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = process::free_port();
        let mut conf = vec![
            format!("port = {port}"),
            "listen_addresses = '127.0.0.1'".into(),
            format!(
                "unix_socket_directories = '{}'",
                root.join("sock").display()
            ),
            "wal_level = logical".into(),
            "max_wal_senders = 64".into(),
            "max_replication_slots = 64".into(),
            "max_connections = 300".into(),
            "fsync = off".into(),
            "full_page_writes = off".into(),
            "password_encryption = 'scram-sha-256'".into(),
            "shared_buffers = '64MB'".into(),
            "max_slot_wal_keep_size = -1".into(),
        ];
        let mut hba = vec![
            "local all all trust".to_string(),
            format!("host all {MD5_ROLE} 127.0.0.1/32 md5"),
        ];
        if opts.tls {
            make_certs(&root, owner);
            conf.push("ssl = on".into());
            conf.push(format!(
                "ssl_cert_file = '{}'",
                root.join("server.crt").display()
            ));
            conf.push(format!(
                "ssl_key_file = '{}'",
                root.join("server.key").display()
            ));
            // Over TLS only: a plaintext TCP connection is refused, so a test can tell.
            hba.push("hostssl all all 127.0.0.1/32 scram-sha-256".into());
            hba.push("hostssl replication all 127.0.0.1/32 scram-sha-256".into());
        } else {
            hba.push("host all all 127.0.0.1/32 scram-sha-256".into());
            // Physical replication, for standbys ("all" does not match it).
            hba.push("host replication all 127.0.0.1/32 scram-sha-256".into());
        }
        conf.extend(opts.extra_conf);
        append(&data.join("postgresql.conf"), &conf.join("\n"));
        std::fs::write(data.join("pg_hba.conf"), hba.join("\n") + "\n").expect("write pg_hba");
        let cluster = PgCluster {
            root,
            port,
            bindir,
            owner,
            child: Mutex::new(None),
        };
        cluster.spawn_postgres();
        cluster
    }

    /// initdb + start, off the async runtime's threads.
    pub async fn start(opts: ClusterOptions) -> PgCluster {
        tokio::task::spawn_blocking(move || PgCluster::start_blocking(opts))
            .await
            .expect("start cluster")
    }

    fn spawn_postgres(&self) {
        self.spawn_postgres_child();
        if let Err(status) = self.wait_ready() {
            panic!(
                "postgres exited ({status}) during start-up; log:\n{}",
                self.log()
            );
        }
    }

    /// Starts the postmaster, without waiting.
    fn spawn_postgres_child(&self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("postgres.log"))
            .expect("open postgres.log");
        let mut cmd = Command::new(self.bindir.join("postgres"));
        cmd.arg("-D")
            .arg(self.root.join("data"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log);
        as_owner(&mut cmd, self.owner);
        let child = spawn_owned(cmd, libc::SIGQUIT).expect("spawn postgres");
        *self.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
    }

    /// Waits until the server accepts connections (Ok), or the postmaster exits (its status).
    fn wait_ready(&self) -> Result<(), std::process::ExitStatus> {
        let sock = self.socket_dir();
        let start = std::time::Instant::now();
        loop {
            let ok = Command::new(client_tool(&self.bindir, "pg_isready"))
                .arg("-q")
                .arg("-h")
                .arg(&sock)
                .arg("-p")
                .arg(self.port.to_string())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return Ok(());
            }
            if let Some(status) = self.child_exited() {
                self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
                return Err(status);
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "postgres did not become ready within 60s; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn child_exited(&self) -> Option<std::process::ExitStatus> {
        let mut g = self.child.lock().unwrap_or_else(|e| e.into_inner());
        g.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// Stops the server: `fast` shutdown (SIGINT) or `immediate` (SIGQUIT, a crash: recovery on
    /// the next start). Waits for the postmaster to exit.
    pub fn stop(&self, immediate: bool) {
        let mut g = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut child) = g.take() {
            process::signal(
                &child,
                if immediate {
                    libc::SIGQUIT
                } else {
                    libc::SIGINT
                },
            );
            let _ = child.wait();
        }
    }

    /// A physical standby of this cluster, streaming from it: a copy of its data directory taken
    /// while it is stopped (so no base backup tool of the server's version is needed), started
    /// with `standby.signal` and `primary_conninfo` pointing here, plus `extra_conf` (for example
    /// `primary_slot_name`, `hot_standby_feedback`, `sync_replication_slots`). This cluster is
    /// stopped (fast) and started again in the middle. Blocking.
    pub fn standby_blocking(&self, extra_conf: Vec<String>) -> PgCluster {
        let root = cluster_root(self.owner);
        self.stop(false);
        let out = Command::new("cp")
            .arg("-a")
            .arg(self.root.join("data"))
            .arg(root.join("data"))
            .output()
            .expect("run cp");
        assert!(
            out.status.success(),
            "copy the data directory: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.start_again();
        let port = process::free_port();
        let data = root.join("data");
        let mut conf = vec![
            format!("port = {port}"),
            format!(
                "unix_socket_directories = '{}'",
                root.join("sock").display()
            ),
            format!(
                "primary_conninfo = 'host=127.0.0.1 port={} user=postgres password={SUPERUSER_PASSWORD} dbname=postgres application_name=standby'",
                self.port
            ),
        ];
        conf.extend(extra_conf);
        append(&data.join("postgresql.conf"), &conf.join("\n"));
        std::fs::write(data.join("standby.signal"), "").expect("write standby.signal");
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(data.join("standby.signal"), Some(uid), Some(gid))
                .expect("chown standby.signal");
        }
        let standby = PgCluster {
            root,
            port,
            bindir: self.bindir.clone(),
            owner: self.owner,
            child: Mutex::new(None),
        };
        standby.spawn_postgres();
        standby
    }

    /// Starts the server again on the same port after [`PgCluster::stop`].
    pub fn start_again(&self) {
        self.spawn_postgres();
    }

    /// [`PgCluster::start_again`] for a start that may fail (a setting the server refuses):
    /// Ok once it accepts connections, or Err with its exit status (the reason is in [`PgCluster::log`]).
    /// Blocking.
    pub fn try_start_again(&self) -> Result<(), std::process::ExitStatus> {
        self.spawn_postgres_child();
        self.wait_ready()
    }

    /// Appends `lines` to `postgresql.conf` (a later line wins over an earlier one); they take
    /// effect at the next start.
    pub fn append_conf(&self, lines: &[&str]) {
        append(
            &self.root.join("data").join("postgresql.conf"),
            &lines.join("\n"),
        );
    }

    /// Superuser URL to database `db` over TCP.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres:{SUPERUSER_PASSWORD}@127.0.0.1:{}/{db}",
            self.port
        )
    }

    /// TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Directory holding the Unix socket (`.s.PGSQL.<port>`).
    pub fn socket_dir(&self) -> PathBuf {
        self.root.join("sock")
    }

    /// The test CA's certificate (PEM), present when started with `tls`.
    pub fn ca_cert(&self) -> PathBuf {
        self.root.join("ca.crt")
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("postgres.log")).unwrap_or_default()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop(true);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A fresh directory for a cluster (its data directory goes in `data`, its socket in `sock`),
/// owned by the server's user.
fn cluster_root(owner: Option<(u32, u32)>) -> PathBuf {
    let root = std::env::temp_dir().join(unique_name("ferry-pg"));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("sock")).expect("create cluster dir");
    if let Some((uid, gid)) = owner {
        for p in [&root, &root.join("sock")] {
            std::os::unix::fs::chown(p, Some(uid), Some(gid)).expect("chown cluster dir");
        }
    }
    root
}

fn as_owner(cmd: &mut Command, owner: Option<(u32, u32)>) {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = owner {
        cmd.uid(uid).gid(gid);
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open postgresql.conf");
    writeln!(f, "\n{text}").expect("append postgresql.conf");
}

/// What to do when the tests have no PostgreSQL to start or use: every message about a missing
/// server ends with it.
pub const PG_SETUP_HINT: &str = "run `bash .ci/install-deps` once (installs PostgreSQL 15 and \
     Apache Kafka; needs root or sudo), or set FERRY_TEST_PG_URL to the superuser URL of a server \
     with wal_level = logical (README, \"Run the tests\")";

/// The PostgreSQL server binaries: `FERRY_TEST_PG_BINDIR`, else the newest
/// `/usr/lib/postgresql/*/bin`, else the directory on `PATH` holding `initdb`. Panics with what to
/// do when there are none (see [`find_pg_bindir`]).
///
/// When there are none and `FERRY_TEST_PG_BINDIR` is unset, it first runs `.ci/install-deps`
/// ([`process::install_deps_once`]), so a fresh machine needs no set-up step before the tests.
pub fn pg_bindir() -> PathBuf {
    let find = || {
        find_pg_bindir(
            std::env::var_os(PG_BINDIR_ENV).map(PathBuf::from),
            Path::new("/usr/lib/postgresql"),
            std::env::var_os("PATH").as_deref(),
        )
    };
    find()
        .or_else(|e| {
            if std::env::var_os(PG_BINDIR_ENV).is_some() {
                return Err(e);
            }
            process::install_deps_once().map_err(|i| format!("{e}\n{i}"))?;
            find()
        })
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The server binaries a local cluster needs. Client tools (`pg_isready`) may come from another
/// version's install (see [`client_tool`]): the server builds of the version matrix ship none.
const PG_SERVER_BINARIES: [&str; 2] = ["initdb", "postgres"];

/// [`pg_bindir`] with its inputs as arguments: the `FERRY_TEST_PG_BINDIR` value, the directory
/// of per-version installs (Debian's `/usr/lib/postgresql/<major>/bin`), and `PATH`. The error
/// says what is missing and how to get it.
pub fn find_pg_bindir(
    env_dir: Option<PathBuf>,
    versions_root: &Path,
    path: Option<&std::ffi::OsStr>,
) -> Result<PathBuf, String> {
    let complete = |dir: &Path| PG_SERVER_BINARIES.iter().all(|b| dir.join(b).is_file());
    if let Some(dir) = env_dir {
        if complete(&dir) {
            return Ok(dir);
        }
        return Err(format!(
            "{PG_BINDIR_ENV}={} does not hold the PostgreSQL server binaries the tests need ({}): \
             point it at the directory with initdb (e.g. /usr/lib/postgresql/15/bin), or unset it",
            dir.display(),
            PG_SERVER_BINARIES.join(", ")
        ));
    }
    if let Some(dir) = newest_version_bin(versions_root, |bin| complete(bin)) {
        return Ok(dir);
    }
    if let Some(dir) = path
        .map(std::env::split_paths)
        .into_iter()
        .flatten()
        .find(|d| complete(d))
    {
        return Ok(dir);
    }
    Err(format!(
        "no PostgreSQL server binaries for the tests ({} were looked for in {PG_BINDIR_ENV}, \
         {}/<version>/bin and PATH): {PG_SETUP_HINT}",
        PG_SERVER_BINARIES.join(", "),
        versions_root.display()
    ))
}

/// A client program (`pg_isready`, `psql`): from the server's `bindir` when it ships one, else
/// from the newest `/usr/lib/postgresql/*/bin`, else from `PATH`. Server builds of other major
/// versions (see `.ci/install-pg-versions`) ship only the server; the client tools of any version
/// talk to every server version.
pub fn client_tool(bindir: &Path, name: &str) -> PathBuf {
    let own = bindir.join(name);
    if own.exists() {
        return own;
    }
    newest_version_bin(Path::new("/usr/lib/postgresql"), |bin| {
        bin.join(name).exists()
    })
    .map(|bin| bin.join(name))
    .unwrap_or_else(|| PathBuf::from(name))
}

/// The `bin` directory of the newest major version under `versions_root` (Debian's
/// `/usr/lib/postgresql/<major>/bin`) that `usable` accepts.
fn newest_version_bin(versions_root: &Path, usable: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    std::fs::read_dir(versions_root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            usable(&bin).then_some((v, bin))
        })
        .max_by_key(|(v, _)| *v)
        .map(|(_, bin)| bin)
}

/// A test CA and a server certificate for `localhost` / `127.0.0.1`, made with the openssl CLI.
pub(crate) fn make_certs(root: &Path, owner: Option<(u32, u32)>) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(root)
            .output()
            .expect("run openssl (the test TLS certificates need the openssl command)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    std::fs::write(
        root.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .expect("write san.ext");
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=ferry-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.crt",
    ]);
    if let Some((uid, gid)) = owner {
        for f in ["server.key", "server.crt", "ca.crt"] {
            std::os::unix::fs::chown(root.join(f), Some(uid), Some(gid)).expect("chown cert");
        }
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        root.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("chmod server.key");
}
