//! Connection settings, parsed from a libpq connection URL
//! (`postgres://user:password@host:port/dbname?sslmode=verify-full&sslrootcert=/ca.pem`) or a
//! libpq keyword/value string (`host=... user=... sslmode=require`).
//!
//! Only the libpq parameters Ferry honours are accepted; any other is an error that names it,
//! so a typo in `sslmode` never silently downgrades to plaintext. A host starting with `/` is a
//! Unix-socket directory, as in libpq. The password never prints.

use std::fmt;
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

/// Parsed connection settings.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectConfig {
    pub host: Host,
    pub port: u16,
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
}

impl fmt::Debug for ConnectConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("dbname", &self.dbname)
            .field("sslmode", &self.sslmode)
            .field("sslrootcert", &self.sslrootcert)
            .field("sslcert", &self.sslcert)
            .field("sslkey", &self.sslkey)
            .field("application_name", &self.application_name)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl fmt::Display for ConnectConfig {
    /// `user@host:port/dbname`, never the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Tcp(h) => write!(f, "{}@{}:{}/{}", self.user, h, self.port, self.dbname),
            Host::Unix(d) => write!(
                f,
                "{}@{}/.s.PGSQL.{}/{}",
                self.user,
                d.display(),
                self.port,
                self.dbname
            ),
        }
    }
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

/// The application name Ferry reports to the server (`pg_stat_activity.application_name`).
pub const DEFAULT_APPLICATION_NAME: &str = "ferry";

impl ConnectConfig {
    /// Parses a `postgres://` / `postgresql://` URL or a keyword/value string.
    pub fn parse(s: &str) -> Result<ConnectConfig, ConfigError> {
        let s = s.trim();
        let mut c = ConnectConfig {
            host: Host::Tcp("localhost".into()),
            port: 5432,
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
        };
        let params = if let Some(rest) = s
            .strip_prefix("postgres://")
            .or_else(|| s.strip_prefix("postgresql://"))
        {
            parse_url(rest, &mut c)?
        } else if s.contains("://") {
            return Err(ConfigError::new(
                "the URL scheme must be postgres:// or postgresql://",
            ));
        } else {
            parse_keyword_value(s)?
        };
        for (k, v) in params {
            c.set(&k, v)?;
        }
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
        if matches!(c.host, Host::Unix(_)) && c.sslmode > SslMode::Prefer {
            return Err(ConfigError::new(
                "TLS over a Unix socket is not possible: use sslmode=disable or prefer with a socket directory host",
            ));
        }
        Ok(c)
    }

    fn set(&mut self, key: &str, value: String) -> Result<(), ConfigError> {
        match key {
            "host" | "hostaddr" => {
                if value.contains(',') {
                    return Err(ConfigError::new(
                        "several hosts are not supported: give the one primary (Ferry needs the primary's replication slot)",
                    ));
                }
                self.host = if value.starts_with('/') {
                    Host::Unix(PathBuf::from(value))
                } else {
                    Host::Tcp(value)
                };
            }
            "port" => {
                self.port = value
                    .parse()
                    .map_err(|_| ConfigError::new(format!("port={value:?} is not a port number")))?;
            }
            "user" => self.user = value,
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
            "application_name" => self.application_name = value,
            "connect_timeout" => {
                let secs: u64 = value.parse().map_err(|_| {
                    ConfigError::new(format!("connect_timeout={value:?} is not a whole number of seconds"))
                })?;
                self.connect_timeout = (secs > 0).then(|| Duration::from_secs(secs.max(2)));
                self.connect_timeout_given = true;
            }
            // Ferry always connects to the server as given and decides replication itself.
            "replication" => {
                return Err(ConfigError::new(
                    "do not set replication= in the URL: Ferry opens its replication connection itself",
                ))
            }
            other => {
                return Err(ConfigError::new(format!(
                    "unsupported parameter {other:?}; supported: host, port, user, password, dbname, sslmode, \
                     sslrootcert, sslcert, sslkey, application_name, connect_timeout"
                )))
            }
        }
        Ok(())
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

fn parse_url(rest: &str, c: &mut ConnectConfig) -> Result<Vec<(String, String)>, ConfigError> {
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
    if !hostport.is_empty() {
        let (h, p) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| ConfigError::new("unterminated [ in an IPv6 host"))?;
            (h.to_string(), after.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (hostport.to_string(), None),
            }
        };
        let h = percent_decode(&h)?;
        if h.contains(',') {
            return Err(ConfigError::new(
                "several hosts are not supported: give the one primary (Ferry needs the primary's replication slot)",
            ));
        }
        if !h.is_empty() {
            c.host = if h.starts_with('/') {
                Host::Unix(PathBuf::from(h))
            } else {
                Host::Tcp(h)
            };
        }
        if let Some(p) = p.filter(|p| !p.is_empty()) {
            c.port = p
                .parse()
                .map_err(|_| ConfigError::new(format!("port {p:?} is not a port number")))?;
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
            ("postgres://u@h1,h2/d", "several hosts"),
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
}
