//! Connection settings, parsed from a libpq connection URL
//! (`postgres://user:password@host:port/dbname?sslmode=verify-full&sslrootcert=/ca.pem`) or a
//! libpq keyword/value string (`host=... user=... sslmode=require`).
//!
//! Only the libpq parameters Ferry honours are accepted; any other is an error that names it,
//! so a typo in `sslmode` never silently downgrades to plaintext. A host starting with `/` is a
//! Unix-socket directory, as in libpq. The password never prints.
//!
//! As in libpq:
//!
//! - **Several hosts** (`host=a,b port=5432,5433`, `postgresql://a:5432,b:5433/db`) are tried in
//!   order, each within `connect_timeout`; with `target_session_attrs=read-write` (or `primary`)
//!   a server that is read-only (or in recovery) is passed over like one that refused, which is
//!   how a client follows a failover. One port applies to every host; otherwise there is one
//!   per host.
//! - **The password** comes from the connection string, else `PGPASSWORD`, else the password
//!   file (`passfile`, else `PGPASSFILE`, else `~/.pgpass`; see [`super::pgpass`]), looked up per
//!   host. [`ConnectConfig::resolve_passwords`] applies the environment; [`ConnectConfig::targets`]
//!   gives each host's settings.
//!
//! Refused, each with its reason: `sslmode=allow`, `sslpassword` (encrypted client keys),
//! `target_session_attrs` other than `any`/`read-write`/`primary`, `replication`, `service`,
//! `options`, and any parameter not listed in [`SUPPORTED`].

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `sslmode`, with libpq's meanings.
/// Ordered from weakest to strongest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// TLS if the server offers it, without verification; plaintext otherwise. libpq's default.
    Prefer,
    /// TLS, failing if the server refuses it; the certificate is verified against `sslrootcert`
    /// when one is given (as libpq does), otherwise not verified.
    Require,
    /// TLS with the certificate chain verified against the roots; the host name is not checked.
    VerifyCa,
    /// TLS with the chain and the host name verified. What managed services should use.
    VerifyFull,
}

impl SslMode {
    fn parse(v: &str) -> Result<SslMode, ConfigError> {
        Ok(match v {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => {
                return Err(ConfigError::new(
                    "sslmode=allow is not supported: use prefer, require, verify-ca or verify-full",
                ))
            }
            other => {
                return Err(ConfigError::new(format!(
                    "sslmode={other:?} is not a libpq sslmode: use disable, prefer, require, verify-ca or verify-full"
                )))
            }
        })
    }
}

impl fmt::Display for SslMode {
    /// The libpq spelling (`verify-full`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        })
    }
}

/// Where the certificate roots for verification come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// A PEM file (`sslrootcert=/path`).
    File(PathBuf),
    /// The operating system's store (`sslrootcert=system`, and the default for verify modes).
    System,
}

/// Where to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A TCP host name or address.
    Tcp(String),
    /// A directory holding the server's Unix socket `.s.PGSQL.<port>`.
    Unix(PathBuf),
}

/// `target_session_attrs`: which server of several hosts is acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetSessionAttrs {
    /// The first that accepts the connection (libpq's default).
    Any,
    /// One whose sessions are read-write by default: neither in recovery nor with
    /// `default_transaction_read_only` on.
    ReadWrite,
    /// One that is not in recovery (not a hot standby).
    Primary,
}

/// Every parameter [`ConnectConfig::parse`] accepts.
pub const SUPPORTED: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "user",
    "password",
    "passfile",
    "dbname",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "application_name",
    "fallback_application_name",
    "connect_timeout",
    "target_session_attrs",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
];

/// TCP keepalive on Ferry's connections to PostgreSQL (libpq's `keepalives`,
/// `keepalives_idle`, `keepalives_interval`, `keepalives_count`; `None`: the kernel's
/// setting). Ferry's defaults ([`Keepalive::DEFAULT`]) are shorter than the kernel's two hours
/// of idle time: a connection idle for a minute is probed, so that a load balancer or NAT that
/// drops idle flows keeps it (Azure's load balancer after 4 minutes, AWS's NAT gateway and
/// Network Load Balancer after 350 s), and a peer gone without a word is noticed on an idle
/// connection within two minutes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub on: bool,
    pub idle: Option<Duration>,
    pub interval: Option<Duration>,
    pub count: Option<u32>,
}

impl Keepalive {
    pub const DEFAULT: Keepalive = Keepalive {
        on: true,
        idle: Some(Duration::from_secs(60)),
        interval: Some(Duration::from_secs(10)),
        count: Some(6),
    };
}

/// Parsed connection settings.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectConfig {
    /// The host a connection attempt uses: the first of [`ConnectConfig::hosts`], or, in a
    /// configuration from [`ConnectConfig::targets`], that target's.
    pub host: Host,
    pub port: u16,
    /// Every host with its port, in the order they are tried.
    pub hosts: Vec<(Host, u16)>,
    /// `hostaddr` of each host (aligned with `hosts`): the address to connect to without
    /// resolving the name.
    pub hostaddrs: Vec<Option<IpAddr>>,
    /// The `hostaddr` of `host`, for the attempt that uses it.
    pub hostaddr: Option<IpAddr>,
    /// Which of the hosts is acceptable.
    pub target_session_attrs: TargetSessionAttrs,
    /// The password file to look the password up in when none is given (`passfile`, else
    /// `PGPASSFILE`, else `~/.pgpass`: see [`ConnectConfig::resolve_passwords`]).
    pub passfile: Option<PathBuf>,
    /// A file holding the password (not a libpq parameter: Ferry's `postgres.password_file`),
    /// read at every connection attempt, so a rotated Kubernetes Secret is used from the next
    /// reconnect on. Comes after a password in the connection string, before `PGPASSWORD` and
    /// the password file.
    pub password_file: Option<PathBuf>,
    /// Why no password was found where one was looked for (a password file ignored for its
    /// permissions), for the authentication error.
    pub password_note: Option<String>,
    pub user: String,
    pub password: Option<String>,
    pub dbname: String,
    pub sslmode: SslMode,
    pub sslrootcert: Option<RootCerts>,
    /// Client certificate and key (PEM) for certificate authentication.
    pub sslcert: Option<PathBuf>,
    pub sslkey: Option<PathBuf>,
    pub application_name: String,
    /// How long a connection attempt may take; `None` waits as long as the OS does.
    pub connect_timeout: Option<Duration>,
    /// Whether the connection string set `connect_timeout` (it then wins over Ferry's
    /// `postgres.connect_timeout`).
    pub connect_timeout_given: bool,
    /// TCP keepalive on each connection.
    pub keepalive: Keepalive,
    /// How long sent data may stay unacknowledged before the kernel closes the connection
    /// (libpq's `tcp_user_timeout`, Linux's `TCP_USER_TIMEOUT`); `None`: the kernel's (about
    /// 15 minutes of retransmissions).
    pub tcp_user_timeout: Option<Duration>,
    application_name_given: bool,
}

impl fmt::Debug for ConnectConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("hosts", &self.hosts)
            .field("hostaddrs", &self.hostaddrs)
            .field("target_session_attrs", &self.target_session_attrs)
            .field("passfile", &self.passfile)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("dbname", &self.dbname)
            .field("sslmode", &self.sslmode)
            .field("sslrootcert", &self.sslrootcert)
            .field("sslcert", &self.sslcert)
            .field("sslkey", &self.sslkey)
            .field("application_name", &self.application_name)
            .field("connect_timeout", &self.connect_timeout)
            .field("keepalive", &self.keepalive)
            .field("tcp_user_timeout", &self.tcp_user_timeout)
            .finish()
    }
}

impl fmt::Display for ConnectConfig {
    /// `user@host:port/dbname` (`user@a:5432,b:5433/dbname` for several hosts), never the
    /// password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@", self.user)?;
        if self.hosts.len() <= 1 {
            f.write_str(&server(&self.host, self.port))?;
            return write!(f, "/{}", self.dbname);
        }
        for (i, (host, port)) in self.hosts.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&server(host, *port))?;
        }
        write!(f, "/{}", self.dbname)
    }
}

/// `host:port` (`[::1]:5432`), or the socket path for a Unix socket.
pub fn server(host: &Host, port: u16) -> String {
    match host {
        Host::Tcp(h) if h.contains(':') => format!("[{h}]:{port}"),
        Host::Tcp(h) => format!("{h}:{port}"),
        Host::Unix(d) => format!("{}/.s.PGSQL.{port}", d.display()),
    }
}

/// Linux's largest `TCP_KEEPIDLE` and `TCP_KEEPINTVL` (seconds), and `TCP_KEEPCNT`.
const MAX_KEEPALIVE_SECS: u64 = 32_767;
const MAX_KEEPALIVE_COUNT: u64 = 127;

/// A whole number from 0 to `max` for `key` (libpq's seconds, or milliseconds for
/// `tcp_user_timeout`); `None` for 0, which leaves the kernel's setting, as in libpq.
fn whole(key: &str, value: &str, max: u64) -> Result<Option<u64>, ConfigError> {
    let n: u64 = value
        .trim()
        .parse()
        .ok()
        .filter(|n| *n <= max)
        .ok_or_else(|| {
            ConfigError::new(format!(
                "{key}={value:?} is not a whole number from 0 to {max} (0 leaves the kernel's setting)"
            ))
        })?;
    Ok((n > 0).then_some(n))
}

/// A connection string that cannot be used, with what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid PostgreSQL connection string: {0}")]
pub struct ConfigError(String);

impl ConfigError {
    fn new(msg: impl Into<String>) -> Self {
        ConfigError(msg.into())
    }
}

/// The application name Ferry reports to the server (`pg_stat_activity.application_name`)
/// unless the connection string sets `application_name` (or `fallback_application_name`).
pub const DEFAULT_APPLICATION_NAME: &str = "ferry";
/// libpq's default port.
pub const DEFAULT_PORT: u16 = 5432;

/// Every host with its port, and each one's `hostaddr`.
type HostsAndAddrs = (Vec<(Host, u16)>, Vec<Option<IpAddr>>);

/// The host and port lists as given, before they are paired.
#[derive(Default)]
struct HostLists {
    hosts: Vec<String>,
    hostaddrs: Vec<String>,
    ports: Vec<String>,
}

impl HostLists {
    /// Pairs hosts with ports as libpq does: no port is 5432, one port applies to every host,
    /// otherwise one per host. An empty host is `localhost`, an empty port 5432.
    fn resolve(self) -> Result<HostsAndAddrs, ConfigError> {
        // `hostaddr`: the address to connect to instead of resolving `host`, which still names
        // the server for TLS verification and the password file. Without `host`, the address
        // is the host.
        let hostaddrs: Vec<Option<IpAddr>> = self
            .hostaddrs
            .iter()
            .map(|a| {
                let a = a.trim();
                if a.is_empty() {
                    return Ok(None);
                }
                a.parse().map(Some).map_err(|_| {
                    ConfigError::new(format!(
                        "hostaddr {a:?} is not an IP address (a name goes in host)"
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        let hosts = if !self.hosts.is_empty() {
            if !hostaddrs.is_empty() && hostaddrs.len() != self.hosts.len() {
                return Err(ConfigError::new(format!(
                    "{} hostaddr values for {} hosts: give one per host",
                    hostaddrs.len(),
                    self.hosts.len()
                )));
            }
            self.hosts
        } else if !hostaddrs.is_empty() {
            self.hostaddrs.iter().map(|a| a.trim().to_owned()).collect()
        } else {
            vec![String::new()]
        };
        let hostaddrs = if hostaddrs.is_empty() {
            vec![None; hosts.len()]
        } else {
            hostaddrs
        };
        let port = |p: &str| -> Result<u16, ConfigError> {
            if p.is_empty() {
                return Ok(DEFAULT_PORT);
            }
            p.parse()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| ConfigError::new(format!("port {p:?} is not a port number")))
        };
        let ports: Vec<u16> = match self.ports.len() {
            0 => vec![DEFAULT_PORT; hosts.len()],
            1 => vec![port(&self.ports[0])?; hosts.len()],
            n if n == hosts.len() => self
                .ports
                .iter()
                .map(|p| port(p))
                .collect::<Result<_, _>>()?,
            n => {
                return Err(ConfigError::new(format!(
                    "{n} ports for {} hosts: give one port for all, or one per host",
                    hosts.len()
                )))
            }
        };
        let hosts = hosts
            .into_iter()
            .zip(ports)
            .map(|(h, p)| {
                let h = h.trim().to_owned();
                let host = if h.is_empty() {
                    Host::Tcp("localhost".into())
                } else if h.starts_with('/') {
                    Host::Unix(PathBuf::from(h))
                } else {
                    Host::Tcp(h)
                };
                (host, p)
            })
            .collect();
        Ok((hosts, hostaddrs))
    }
}

impl ConnectConfig {
    /// Parses a `postgres://` / `postgresql://` URL or a keyword/value string.
    pub fn parse(s: &str) -> Result<ConnectConfig, ConfigError> {
        let s = s.trim();
        let mut c = ConnectConfig {
            host: Host::Tcp("localhost".into()),
            port: DEFAULT_PORT,
            hosts: Vec::new(),
            hostaddrs: Vec::new(),
            hostaddr: None,
            target_session_attrs: TargetSessionAttrs::Any,
            passfile: None,
            password_file: None,
            password_note: None,
            user: String::new(),
            password: None,
            dbname: String::new(),
            sslmode: SslMode::Prefer,
            sslrootcert: None,
            sslcert: None,
            sslkey: None,
            application_name: DEFAULT_APPLICATION_NAME.into(),
            connect_timeout: Some(Duration::from_secs(10)),
            connect_timeout_given: false,
            keepalive: Keepalive::DEFAULT,
            tcp_user_timeout: None,
            application_name_given: false,
        };
        let mut lists = HostLists::default();
        let params = if let Some(rest) = s
            .strip_prefix("postgres://")
            .or_else(|| s.strip_prefix("postgresql://"))
        {
            parse_url(rest, &mut c, &mut lists)?
        } else if s.contains("://") {
            return Err(ConfigError::new(
                "the URL scheme must be postgres:// or postgresql://",
            ));
        } else {
            parse_keyword_value(s)?
        };
        let mut fallback_application_name = None;
        for (k, v) in params {
            match k.as_str() {
                "host" => lists.hosts = v.split(',').map(str::to_owned).collect(),
                "hostaddr" => lists.hostaddrs = v.split(',').map(str::to_owned).collect(),
                "port" => lists.ports = v.split(',').map(str::to_owned).collect(),
                "fallback_application_name" => fallback_application_name = Some(v),
                _ => c.set(&k, v)?,
            }
        }
        if !c.application_name_given {
            if let Some(name) = fallback_application_name {
                c.application_name = name;
            }
        }
        (c.hosts, c.hostaddrs) = lists.resolve()?;
        (c.host, c.port) = c.hosts[0].clone();
        c.hostaddr = c.hostaddrs[0];
        if c.user.is_empty() {
            return Err(ConfigError::new(
                "no user: put it in the URL (postgres://USER@host/db) or as user=USER",
            ));
        }
        if c.dbname.is_empty() {
            c.dbname = c.user.clone();
        }
        if c.sslmode == SslMode::Disable && c.sslrootcert.is_some() {
            return Err(ConfigError::new(
                "sslrootcert is set but sslmode=disable: remove one of them",
            ));
        }
        if c.hosts.iter().any(|(h, _)| matches!(h, Host::Unix(_))) && c.sslmode > SslMode::Prefer {
            return Err(ConfigError::new(
                "TLS over a Unix socket is not possible: use sslmode=disable or prefer with a socket directory host",
            ));
        }
        Ok(c)
    }

    fn set(&mut self, key: &str, value: String) -> Result<(), ConfigError> {
        match key {
            "user" => self.user = value,
            "passfile" => self.passfile = Some(PathBuf::from(value)),
            "target_session_attrs" => {
                self.target_session_attrs = match value.as_str() {
                    "any" => TargetSessionAttrs::Any,
                    "read-write" => TargetSessionAttrs::ReadWrite,
                    "primary" => TargetSessionAttrs::Primary,
                    "read-only" | "standby" | "prefer-standby" => {
                        return Err(ConfigError::new(format!(
                            "target_session_attrs={value} is not supported: Ferry creates its slot and publication and \
                             confirms on the primary; use read-write or primary to pick the primary of several hosts"
                        )))
                    }
                    other => {
                        return Err(ConfigError::new(format!(
                            "target_session_attrs={other:?} is not a libpq value: use any, read-write or primary"
                        )))
                    }
                }
            }
            "sslpassword" => {
                return Err(ConfigError::new(
                    "sslpassword is not supported: Ferry cannot read an encrypted client key; decrypt it \
                     (openssl pkey -in key.pem -out key-plain.pem), keep that file secret (mode 0600, a Kubernetes Secret), \
                     and point sslkey at it",
                ))
            }
            "service" => {
                return Err(ConfigError::new(
                    "service is not supported: Ferry does not read pg_service.conf; put the service's parameters in the connection string",
                ))
            }
            "options" => {
                return Err(ConfigError::new(
                    "options is not supported: Ferry sets the session settings its decoding depends on itself; \
                     set other settings on the role (ALTER ROLE ... SET)",
                ))
            }
            "password" => self.password = Some(value),
            "dbname" => self.dbname = value,
            "sslmode" => self.sslmode = SslMode::parse(&value)?,
            "sslrootcert" => {
                self.sslrootcert = Some(if value == "system" {
                    RootCerts::System
                } else {
                    RootCerts::File(PathBuf::from(value))
                })
            }
            "sslcert" => self.sslcert = Some(PathBuf::from(value)),
            "sslkey" => self.sslkey = Some(PathBuf::from(value)),
            "application_name" => {
                self.application_name = value;
                self.application_name_given = true;
            }
            "connect_timeout" => {
                let secs: u64 = value.parse().map_err(|_| {
                    ConfigError::new(format!("connect_timeout={value:?} is not a whole number of seconds"))
                })?;
                self.connect_timeout = (secs > 0).then(|| Duration::from_secs(secs.max(2)));
                self.connect_timeout_given = true;
            }
            // libpq's: any whole number, 0 off.
            "keepalives" => {
                self.keepalive.on = value.trim().parse::<i64>().map_err(|_| {
                    ConfigError::new(format!(
                        "keepalives={value:?} is not a whole number (1, the default, probes idle connections; 0 does not)"
                    ))
                })? != 0
            }
            "keepalives_idle" => {
                self.keepalive.idle = whole(key, &value, MAX_KEEPALIVE_SECS)?.map(Duration::from_secs)
            }
            "keepalives_interval" => {
                self.keepalive.interval =
                    whole(key, &value, MAX_KEEPALIVE_SECS)?.map(Duration::from_secs)
            }
            "keepalives_count" => {
                self.keepalive.count = whole(key, &value, MAX_KEEPALIVE_COUNT)?.map(|n| n as u32)
            }
            "tcp_user_timeout" if cfg!(target_os = "linux") => {
                self.tcp_user_timeout =
                    whole(key, &value, i32::MAX as u64)?.map(Duration::from_millis)
            }
            "tcp_user_timeout" => {
                return Err(ConfigError::new(
                    "tcp_user_timeout is supported on Linux only (TCP_USER_TIMEOUT): remove it",
                ))
            }
            // Ferry always connects to the server as given and decides replication itself.
            "replication" => {
                return Err(ConfigError::new(
                    "do not set replication= in the URL: Ferry opens its replication connection itself",
                ))
            }
            other => {
                return Err(ConfigError::new(format!(
                    "unsupported parameter {other:?}; supported: {}",
                    SUPPORTED.join(", ")
                )))
            }
        }
        Ok(())
    }

    /// Applies libpq's password environment: without a password in the connection string,
    /// `PGPASSWORD`; and the password file for per-host lookup (`passfile`, else `PGPASSFILE`,
    /// else `$HOME/.pgpass`). `env` reads a variable (the process environment, or a test's).
    pub fn resolve_passwords(&mut self, env: &dyn Fn(&str) -> Option<String>) {
        if self.password.is_some() || self.password_file.is_some() {
            return;
        }
        if let Some(p) = env("PGPASSWORD").filter(|p| !p.is_empty()) {
            self.password = Some(p);
            return;
        }
        if self.passfile.is_none() {
            self.passfile = env("PGPASSFILE")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
                .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".pgpass")));
        }
    }

    /// The settings for each host, in the order to try them: `host` and `port` set to that
    /// host's, and the password looked up in the password file for it when none is given.
    ///
    /// With one host, `host`, `port` and `hostaddr` are that host (so settings changed through
    /// those fields are the ones used).
    pub fn targets(&self) -> Vec<ConnectConfig> {
        let single = [((self.host.clone(), self.port), self.hostaddr)];
        let all: Vec<((Host, u16), Option<IpAddr>)> = if self.hosts.len() <= 1 {
            single.to_vec()
        } else {
            self.hosts
                .iter()
                .cloned()
                .zip(self.hostaddrs.iter().copied())
                .collect()
        };
        all.iter()
            .map(|((host, port), addr)| {
                let mut c = self.clone();
                c.host = host.clone();
                c.port = *port;
                c.hostaddr = *addr;
                c.hosts = vec![(host.clone(), *port)];
                c.hostaddrs = vec![*addr];
                if let (None, Some(file)) = (&c.password, &self.password_file) {
                    match super::pgpass::read_secret_file(file) {
                        Ok(p) => c.password = Some(p),
                        Err(e) => c.password_note = Some(format!("postgres.password_file: {e}")),
                    }
                } else if c.password.is_none() {
                    if let Some(file) = &self.passfile {
                        match super::pgpass::lookup(file, host, *port, &c.dbname, &c.user) {
                            super::pgpass::Lookup::Found(p) => c.password = Some(p),
                            super::pgpass::Lookup::NotFound => {}
                            super::pgpass::Lookup::Ignored(why) => c.password_note = Some(why),
                        }
                    }
                }
                c
            })
            .collect()
    }

    /// `host:port` of the host a connection attempt uses.
    pub fn server(&self) -> String {
        server(&self.host, self.port)
    }

    /// The same settings for a different database user (used by `ferry check` and tests).
    pub fn with_user(&self, user: &str, password: Option<&str>) -> ConnectConfig {
        ConnectConfig {
            user: user.into(),
            password: password.map(Into::into),
            ..self.clone()
        }
    }
}

fn parse_url(
    rest: &str,
    c: &mut ConnectConfig,
    lists: &mut HostLists,
) -> Result<Vec<(String, String)>, ConfigError> {
    let (main, query) = match rest.split_once('?') {
        Some((m, q)) => (m, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match main.split_once('/') {
        Some((a, p)) => (a, p),
        None => (main, ""),
    };
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if let Some(ui) = userinfo {
        let (u, p) = match ui.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (ui, None),
        };
        c.user = percent_decode(u)?;
        c.password = p.map(percent_decode).transpose()?;
    }
    // `a:5432,b:5433,[::1]:5434`: each host with its own port.
    if !hostport.is_empty() {
        for one in hostport.split(',') {
            let (h, p) = if let Some(v6) = one.strip_prefix('[') {
                let (h, after) = v6
                    .split_once(']')
                    .ok_or_else(|| ConfigError::new("unterminated [ in an IPv6 host"))?;
                (h.to_string(), after.strip_prefix(':'))
            } else {
                match one.rsplit_once(':') {
                    Some((h, p)) => (h.to_string(), Some(p)),
                    None => (one.to_string(), None),
                }
            };
            lists.hosts.push(percent_decode(&h)?);
            lists.ports.push(p.unwrap_or("").to_owned());
        }
        if lists.ports.iter().all(String::is_empty) {
            lists.ports.clear();
        }
    }
    if !path.is_empty() {
        c.dbname = percent_decode(path)?;
    }
    let mut params = Vec::new();
    for pair in query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            ConfigError::new(format!(
                "URL parameter {pair:?} has no value (expected key=value)"
            ))
        })?;
        params.push((percent_decode(k)?, percent_decode(v)?));
    }
    Ok(params)
}

fn parse_keyword_value(s: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(ConfigError::new(format!(
                "expected key=value, found {key:?} without '=' (is this meant to be a postgres:// URL?)"
            )));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    None => {
                        return Err(ConfigError::new(format!(
                            "unterminated quoted value for {key}"
                        )))
                    }
                    Some('\'') => break,
                    Some('\\') => value.push(chars.next().ok_or_else(|| {
                        ConfigError::new(format!("dangling backslash in the value of {key}"))
                    })?),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    value.push(chars.next().ok_or_else(|| {
                        ConfigError::new(format!("dangling backslash in the value of {key}"))
                    })?);
                } else {
                    value.push(c);
                }
            }
        }
        out.push((key, value));
    }
}

fn percent_decode(s: &str) -> Result<String, ConfigError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    ConfigError::new("bad %-escape in the URL (use %XX with two hex digits)")
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ConfigError::new("the URL decodes to invalid UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_url() {
        let c = ConnectConfig::parse(
            "postgres://ferry:s%40cret@db.example.com:6432/app?sslmode=verify-full&sslrootcert=/etc/ca.pem&application_name=relay",
        )
        .unwrap();
        assert_eq!(c.host, Host::Tcp("db.example.com".into()));
        assert_eq!(c.port, 6432);
        assert_eq!(c.user, "ferry");
        assert_eq!(c.password.as_deref(), Some("s@cret"));
        assert_eq!(c.dbname, "app");
        assert_eq!(c.sslmode, SslMode::VerifyFull);
        assert_eq!(c.sslrootcert, Some(RootCerts::File("/etc/ca.pem".into())));
        assert_eq!(c.application_name, "relay");
        assert!(!format!("{c:?}").contains("cret"));
        assert_eq!(c.to_string(), "ferry@db.example.com:6432/app");
    }

    /// libpq's keepalive parameters, over Ferry's defaults (probes after a minute idle); 0
    /// leaves the kernel's setting.
    #[test]
    fn parses_keepalive_parameters() {
        let c = ConnectConfig::parse("postgres://u@h/d").unwrap();
        assert_eq!(c.keepalive, Keepalive::DEFAULT);
        assert_eq!(c.tcp_user_timeout, None);
        let c = ConnectConfig::parse(
            "postgres://u@h/d?keepalives_idle=30&keepalives_interval=5&keepalives_count=3&tcp_user_timeout=20000",
        )
        .unwrap();
        assert_eq!(
            c.keepalive,
            Keepalive {
                on: true,
                idle: Some(Duration::from_secs(30)),
                interval: Some(Duration::from_secs(5)),
                count: Some(3),
            }
        );
        assert_eq!(c.tcp_user_timeout, Some(Duration::from_millis(20_000)));
        let c = ConnectConfig::parse("user=u keepalives=0 keepalives_idle=0").unwrap();
        assert!(!c.keepalive.on);
        assert_eq!(c.keepalive.idle, None);
        // Any whole number but 0 is on, as in libpq.
        assert!(
            ConnectConfig::parse("user=u keepalives=2")
                .unwrap()
                .keepalive
                .on
        );
    }

    #[test]
    fn parses_keyword_value_and_unix_sockets() {
        let c = ConnectConfig::parse(
            "host=/var/run/postgresql port=5433 user=u dbname='my db' password='it''s'",
        );
        assert!(c.is_err(), "'' is not an escape in libpq; backslash is");
        let c = ConnectConfig::parse(
            r"host=/var/run/postgresql port=5433 user=u dbname='my db' password='it\'s'",
        )
        .unwrap();
        assert_eq!(c.host, Host::Unix("/var/run/postgresql".into()));
        assert_eq!(c.port, 5433);
        assert_eq!(c.dbname, "my db");
        assert_eq!(c.password.as_deref(), Some("it's"));
        assert_eq!(c.sslmode, SslMode::Prefer);
        let c = ConnectConfig::parse("postgres://u@%2Ftmp%2Fsock/db").unwrap();
        assert_eq!(c.host, Host::Unix("/tmp/sock".into()));
    }

    #[test]
    fn defaults_follow_libpq() {
        let c = ConnectConfig::parse("postgres://u@h").unwrap();
        assert_eq!(
            (c.port, c.dbname.as_str(), c.sslmode),
            (5432, "u", SslMode::Prefer)
        );
        let c = ConnectConfig::parse("postgresql://u@[::1]:7000/d").unwrap();
        assert_eq!((c.host, c.port), (Host::Tcp("::1".into()), 7000));
    }

    #[test]
    fn rejects_what_it_cannot_honour() {
        for (bad, says) in [
            (
                "postgres://u@h/d?sslmode=verify_full",
                "not a libpq sslmode",
            ),
            ("postgres://u@h/d?sslmode=allow", "not supported"),
            (
                "postgres://u@h/d?sslmod=require",
                "unsupported parameter \"sslmod\"",
            ),
            (
                "postgres://u@h1:1,h2:2,h3:3/d?port=1,2",
                "2 ports for 3 hosts",
            ),
            ("host=a,b port=1,2,3 user=u", "3 ports for 2 hosts"),
            (
                "postgres://u@h/d?target_session_attrs=standby",
                "Ferry creates its slot",
            ),
            (
                "postgres://u@h/d?target_session_attrs=readwrite",
                "not a libpq value",
            ),
            ("postgres://u@h/d?sslpassword=x", "encrypted client key"),
            ("postgres://u@h/d?service=prod", "pg_service.conf"),
            (
                "postgres://u@h/d?options=-c%20x%3D1",
                "options is not supported",
            ),
            (
                "postgres://u@h/d?keepalives_max=1",
                "unsupported parameter \"keepalives_max\"; supported: host, hostaddr, port",
            ),
            ("postgres://u@h/d?keepalives=yes", "is not a whole number"),
            ("postgres://u@h/d?keepalives_idle=40000", "from 0 to 32767"),
            ("postgres://u@h/d?keepalives_count=128", "from 0 to 127"),
            (
                "postgres://u@h/d?keepalives_idle=1m",
                "is not a whole number",
            ),
            (
                "postgres://u@h/d?tcp_user_timeout=-1",
                "is not a whole number",
            ),
            ("postgres://u@h:0/d", "not a port"),
            ("postgres://h/d", "no user"),
            ("mysql://u@h/d", "scheme"),
            ("postgres://u@h:99999/d", "not a port"),
            ("postgres://u@h/d?replication=database", "replication"),
            (
                "postgres://u@h/d?sslmode=disable&sslrootcert=/x",
                "sslmode=disable",
            ),
            ("postgres://u@%2Ftmp/d?sslmode=require", "Unix socket"),
            ("user", "without '='"),
        ] {
            let err = ConnectConfig::parse(bad).unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn several_hosts_pair_with_their_ports_as_in_libpq() {
        let hosts = |s: &str| {
            let c = ConnectConfig::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!((c.host.clone(), c.port), c.hosts[0], "{s}");
            c.hosts
                .iter()
                .map(|(h, p)| server(h, *p))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let cases = [
            ("postgresql://u@a:1,b:2/d", "a:1 b:2"),
            ("postgresql://u@a,b:2,[::1]:3/d", "a:5432 b:2 [::1]:3"),
            ("postgresql://u@a,b/d", "a:5432 b:5432"),
            ("postgresql://u@a,b/d?port=7", "a:7 b:7"),
            ("host=a,b port=5432,5433 user=u", "a:5432 b:5433"),
            ("host=a,b port=6000 user=u", "a:6000 b:6000"),
            ("host=a,/tmp user=u", "a:5432 /tmp/.s.PGSQL.5432"),
            ("user=u", "localhost:5432"),
            ("host=a,,b user=u port=1,2,3", "a:1 localhost:2 b:3"),
        ];
        for (s, expected) in cases {
            assert_eq!(hosts(s), expected, "{s}");
        }
        let c =
            ConnectConfig::parse("postgresql://ferry@a:1,b:2/app?target_session_attrs=read-write")
                .unwrap();
        assert_eq!(c.target_session_attrs, TargetSessionAttrs::ReadWrite);
        assert_eq!(c.to_string(), "ferry@a:1,b:2/app");
        let targets = c.targets();
        assert_eq!(targets.len(), 2);
        assert_eq!(
            (
                targets[1].host.clone(),
                targets[1].port,
                targets[1].hosts.len()
            ),
            (Host::Tcp("b".into()), 2, 1)
        );
        // hostaddr: the address to use; host still names the server.
        let c = ConnectConfig::parse("host=db.example.com,b hostaddr=10.0.0.5,::1 user=u").unwrap();
        let targets = c.targets();
        assert_eq!(
            (targets[0].host.clone(), targets[0].hostaddr),
            (
                Host::Tcp("db.example.com".into()),
                Some("10.0.0.5".parse().unwrap())
            )
        );
        assert_eq!(targets[1].hostaddr, Some("::1".parse().unwrap()));
        let c = ConnectConfig::parse("hostaddr=10.0.0.5 user=u").unwrap();
        assert_eq!(c.host, Host::Tcp("10.0.0.5".into()));
        for bad in [
            "host=a hostaddr=db user=u",
            "host=a,b hostaddr=10.0.0.1 user=u",
        ] {
            assert!(ConnectConfig::parse(bad).is_err(), "{bad}");
        }
        for (attrs, expected) in [
            ("any", TargetSessionAttrs::Any),
            ("primary", TargetSessionAttrs::Primary),
        ] {
            let c = ConnectConfig::parse(&format!("host=a user=u target_session_attrs={attrs}"))
                .unwrap();
            assert_eq!(c.target_session_attrs, expected);
        }
    }

    #[test]
    fn application_name_defaults_to_ferry_and_the_fallback_yields_to_it() {
        let name = |s: &str| ConnectConfig::parse(s).unwrap().application_name;
        assert_eq!(name("host=a user=u"), "ferry");
        assert_eq!(name("host=a user=u fallback_application_name=x"), "x");
        assert_eq!(
            name("host=a user=u application_name=y fallback_application_name=x"),
            "y"
        );
        assert_eq!(
            name("host=a user=u fallback_application_name=x application_name=y"),
            "y"
        );
    }

    #[test]
    fn the_password_comes_from_the_string_then_pgpassword_then_the_password_file() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let mut c = ConnectConfig::parse("postgres://u:given@h/d").unwrap();
        c.resolve_passwords(&env(&[("PGPASSWORD", "env"), ("HOME", "/home/u")]));
        assert_eq!(
            (c.password.as_deref(), c.passfile.clone()),
            (Some("given"), None)
        );
        let mut c = ConnectConfig::parse("postgres://u@h/d").unwrap();
        c.resolve_passwords(&env(&[("PGPASSWORD", "env"), ("HOME", "/home/u")]));
        assert_eq!(c.password.as_deref(), Some("env"));
        let mut c = ConnectConfig::parse("postgres://u@h/d").unwrap();
        c.resolve_passwords(&env(&[("PGPASSFILE", "/p/file"), ("HOME", "/home/u")]));
        assert_eq!(c.passfile, Some(PathBuf::from("/p/file")));
        let mut c = ConnectConfig::parse("postgres://u@h/d").unwrap();
        c.resolve_passwords(&env(&[("HOME", "/home/u")]));
        assert_eq!(c.passfile, Some(PathBuf::from("/home/u/.pgpass")));
        let mut c = ConnectConfig::parse("postgres://u@h/d?passfile=/mine").unwrap();
        c.resolve_passwords(&env(&[("PGPASSFILE", "/p/file")]));
        assert_eq!(c.passfile, Some(PathBuf::from("/mine")));
    }

    #[test]
    fn the_password_file_is_read_at_every_attempt() {
        let path = std::env::temp_dir().join(format!("ferry-pw-{}", std::process::id()));
        std::fs::write(&path, "first\n").unwrap();
        let mut c = ConnectConfig::parse("host=a,b user=u").unwrap();
        c.password_file = Some(path.clone());
        c.resolve_passwords(&|_| Some("from-env".into()));
        let passwords = |c: &ConnectConfig| -> Vec<Option<String>> {
            c.targets().into_iter().map(|t| t.password).collect()
        };
        assert_eq!(passwords(&c), [Some("first".into()), Some("first".into())]);
        std::fs::write(&path, "rotated\n").unwrap();
        assert_eq!(
            passwords(&c),
            [Some("rotated".into()), Some("rotated".into())]
        );
        std::fs::remove_file(&path).unwrap();
        let t = &c.targets()[0];
        assert_eq!(t.password, None);
        let note = t.password_note.as_deref().unwrap();
        assert!(
            note.starts_with("postgres.password_file: cannot read"),
            "{note}"
        );
    }
}
