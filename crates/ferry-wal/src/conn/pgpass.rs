//! libpq's password file (`~/.pgpass`, `PGPASSFILE`, the `passfile` parameter), read as libpq
//! reads it (libpq documentation, "The Password File"; `passwordFromFile` in fe-connect.c):
//!
//! - one entry a line, `hostname:port:database:username:password`; the first line whose first
//!   four fields match wins; `*` in any of those four matches anything;
//! - `\` escapes the next character (`\:` a colon, `\\` a backslash); lines starting with `#`
//!   are comments;
//! - the host of a Unix-socket connection is matched as its directory, except that the default
//!   socket directory (`/tmp`, or `/var/run/postgresql` and `/run/postgresql` as Debian builds
//!   it) matches `localhost`;
//! - a file that is not a regular file, or that group or others may read, write or execute
//!   (`chmod 0600` fixes it), is ignored. libpq prints a warning; here the reason travels with
//!   the settings and is shown if the server then asks for a password.
//!
//! [`read_secret_file`] reads a secret kept alone in a file (`postgres.password_file`, a
//! mounted Kubernetes Secret).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::config::Host;

/// Reads a secret from a file (a Kubernetes Secret or Docker secret mounted as a file): its
/// text without the trailing newline(s) an editor or `echo` adds. An empty, unreadable or
/// non-UTF-8 file is an error saying so; the contents never appear in it.
pub fn read_secret_file(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| {
        format!(
            "cannot read {}: {e}; mount the secret there (a Kubernetes Secret volume, a Docker secret) or fix the path",
            path.display()
        )
    })?;
    let text =
        String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(secret.to_owned())
}

/// The outcome of looking up a password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// A matching entry.
    Found(String),
    /// No file, or no matching entry.
    NotFound,
    /// The file was ignored, with why and the fix.
    Ignored(String),
}

/// Looks up the password for one connection target.
pub fn lookup(file: &Path, host: &Host, port: u16, dbname: &str, user: &str) -> Lookup {
    let meta = match std::fs::metadata(file) {
        Ok(m) => m,
        Err(_) => return Lookup::NotFound,
    };
    if !meta.is_file() {
        return Lookup::Ignored(format!(
            "the password file {} was ignored: it is not a plain file",
            file.display()
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Lookup::Ignored(format!(
            "the password file {} was ignored: group or others may access it (as libpq does); run chmod 0600 {}",
            file.display(),
            file.display()
        ));
    }
    let Ok(text) = std::fs::read_to_string(file) else {
        return Lookup::Ignored(format!(
            "the password file {} cannot be read as UTF-8 text",
            file.display()
        ));
    };
    let host_name = match host {
        Host::Tcp(h) => h.clone(),
        Host::Unix(dir) if is_default_socket_dir(dir) => "localhost".to_owned(),
        Host::Unix(dir) => dir.display().to_string(),
    };
    let port = port.to_string();
    let wanted = [host_name.as_str(), port.as_str(), dbname, user];
    for line in text.lines() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some(fields) = split_fields(line) else {
            continue;
        };
        let matches = fields[..4]
            .iter()
            .zip(wanted)
            .all(|(field, want)| field == "*" || field == want);
        if matches {
            return Lookup::Found(fields[4].clone());
        }
    }
    Lookup::NotFound
}

fn is_default_socket_dir(dir: &Path) -> bool {
    ["/tmp", "/var/run/postgresql", "/run/postgresql"]
        .iter()
        .any(|d| dir == Path::new(d))
}

/// The five fields of an entry, unescaped; `None` for a line with fewer. The password is the
/// rest of the line after the fourth unescaped colon (unescaped itself).
fn split_fields(line: &str) -> Option<[String; 5]> {
    let mut fields: Vec<String> = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    fields.last_mut()?.push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut()?.push(c),
        }
    }
    fields.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    struct File(PathBuf);
    impl File {
        fn new(text: &str, mode: u32) -> File {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "ferry-pgpass-{}-{}",
                std::process::id(),
                N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ));
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            File(path)
        }
    }
    impl Drop for File {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn tcp(h: &str) -> Host {
        Host::Tcp(h.into())
    }

    #[test]
    fn the_first_matching_line_wins_with_wildcards_and_escapes() {
        let f = File::new(
            "# comment\n\
             db1:5432:app:ferry:first\n\
             db1:5432:app:ferry:second\n\
             *:5433:*:ferry:any-host\n\
             db\\:colon:5432:app:ferry:esc\\:aped\\\\pw\n\
             localhost:5432:app:ferry:socket\n\
             /srv/pg:5432:app:ferry:dir\n\
             db2:5432:app:ferry:with:colons\n\
             short:line\n",
            0o600,
        );
        let cases = [
            (
                tcp("db1"),
                5432,
                "app",
                "ferry",
                Lookup::Found("first".into()),
            ),
            (
                tcp("db9"),
                5433,
                "x",
                "ferry",
                Lookup::Found("any-host".into()),
            ),
            (
                tcp("db:colon"),
                5432,
                "app",
                "ferry",
                Lookup::Found("esc:aped\\pw".into()),
            ),
            (
                Host::Unix("/tmp".into()),
                5432,
                "app",
                "ferry",
                Lookup::Found("socket".into()),
            ),
            (
                Host::Unix("/srv/pg".into()),
                5432,
                "app",
                "ferry",
                Lookup::Found("dir".into()),
            ),
            (
                tcp("db2"),
                5432,
                "app",
                "ferry",
                Lookup::Found("with:colons".into()),
            ),
            (tcp("db1"), 5432, "app", "other", Lookup::NotFound),
            (tcp("db1"), 5434, "app", "ferry", Lookup::NotFound),
            (tcp("short"), 5432, "app", "ferry", Lookup::NotFound),
        ];
        for (host, port, db, user, expected) in cases {
            assert_eq!(
                lookup(&f.0, &host, port, db, user),
                expected,
                "{host:?} {port} {db} {user}"
            );
        }
    }

    #[test]
    fn a_file_others_may_read_is_ignored_saying_how_to_fix_it() {
        let f = File::new("*:*:*:*:pw\n", 0o644);
        match lookup(&f.0, &tcp("h"), 5432, "d", "u") {
            Lookup::Ignored(why) => assert!(why.contains("chmod 0600"), "{why}"),
            other => panic!("{other:?}"),
        }
        let f = File::new("*:*:*:*:pw\n", 0o400);
        assert_eq!(
            lookup(&f.0, &tcp("h"), 5432, "d", "u"),
            Lookup::Found("pw".into())
        );
        assert_eq!(
            lookup(Path::new("/nonexistent/pgpass"), &tcp("h"), 5432, "d", "u"),
            Lookup::NotFound
        );
        match lookup(&std::env::temp_dir(), &tcp("h"), 5432, "d", "u") {
            Lookup::Ignored(why) => assert!(why.contains("not a plain file"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
