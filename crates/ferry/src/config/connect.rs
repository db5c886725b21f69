//! From `[postgres]` to the settings both PostgreSQL connections use (the replication stream and
//! the SQL connection): the URL parsed with libpq's meaning, `postgres.connect_timeout` unless
//! the URL sets its own, and the password from, in order: the URL, `postgres.password_file`,
//! `PGPASSWORD`, the password file (`passfile`, `PGPASSFILE`, `~/.pgpass`, per host). Both files
//! are read again at every connection attempt, so a rotated Secret is used on the next reconnect.

use ferry_wal::conn::ConnectConfig;

use super::secret::read_secret_file;
use super::PostgresConfig;

impl PostgresConfig {
    /// The resolved connection settings. The error names the key at fault
    /// (`postgres.url: ...`, `postgres.password_file: ...`).
    pub fn connect_config(&self) -> Result<ConnectConfig, String> {
        self.connect_config_with(&|name| std::env::var(name).ok())
    }

    /// [`PostgresConfig::connect_config`] with the environment read through `env`.
    pub fn connect_config_with(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ConnectConfig, String> {
        let mut c =
            ConnectConfig::parse(self.url.expose()).map_err(|e| format!("postgres.url: {e}"))?;
        if !c.connect_timeout_given {
            c.connect_timeout = Some(self.connect_timeout.get());
        }
        if let Some(path) = &self.password_file {
            if c.password.is_some() {
                return Err(
                    "postgres.password_file: postgres.url holds a password too: keep one of them"
                        .into(),
                );
            }
            // Read now to fail at start-up; the connections read it again at every attempt.
            read_secret_file(path).map_err(|e| format!("postgres.password_file: {e}"))?;
            c.password_file = Some(path.clone());
        }
        c.resolve_passwords(env);
        Ok(c)
    }
}
