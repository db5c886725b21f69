//! The command line: `ferry run | check | status | config`.
//!
//! Exit codes: 0 success; 1 a permanent runtime error (Ferry stopped, nothing past the failed
//! record was confirmed) or `check` found problems; 2 the configuration cannot be used; 141
//! standard output was closed before the output was written (`ferry status | head -1`; see
//! [`crate::stdio`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::config::{self, Config};
use crate::pipeline::{self, PipelineSettings};
use crate::stdio::{errln, out};
use crate::telemetry::{self, HttpState, Metrics};

const ABOUT: &str = "Relays the transactional outbox from PostgreSQL to Kafka by tailing the WAL.";

const LONG_ABOUT: &str = "\
Relays the transactional outbox from PostgreSQL to Kafka by tailing the WAL.

Ferry reads committed INSERTs into your outbox table from a logical replication slot
(pgoutput), turns each row into a Kafka record (topic from the aggregate type, key from the
aggregate id, event id and type as headers, the payload as the value), produces it with an
idempotent producer (acks=all), and confirms the slot's position only after Kafka has
acknowledged every record at or below it. A crash may cause duplicates (consumers deduplicate
on the `id` header), never loss, never reordering within a key.

Configuration comes from a TOML file (--config, or FERRY_CONFIG) and environment variables
FERRY_<SECTION>_<KEY> that override it (FERRY_POSTGRES_URL, FERRY_KAFKA_BROKERS, ...); with no
file, the environment alone configures Ferry. Every key, with its default:
crates/ferry/ferry.example.toml in the source, /usr/share/doc/ferry/ferry.example.toml in the image.

Typical use:
  ferry check --config ferry.toml     # verify PostgreSQL, Kafka and the outbox first
  ferry run --config ferry.toml       # relay until SIGTERM or SIGINT
  ferry status --config ferry.toml    # where the slot is, how far behind, what WAL it retains
  ferry config from-debezium connector.json > ferry.toml   # migrate a Debezium outbox connector";

/// Ferry's command line.
#[derive(Debug, Parser)]
#[command(name = "ferry", version, about = ABOUT, long_about = LONG_ABOUT)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Args)]
struct ConfigArg {
    /// The configuration file (TOML). Without it, FERRY_* environment variables alone configure Ferry.
    #[arg(long, short, env = "FERRY_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Accept the gap that a previous start refused with "events may be lost", for this start:
    /// LSN is the remembered position that error names (`--accept-gap 16/B374D848`), so the flag
    /// accepts that one gap and never a later one. Logged at WARN with the gap; Ferry continues
    /// from the slot's position (creating the slot if it is gone) and writes a new progress
    /// record. Then send the gap's events again from the outbox table, while Ferry runs: `ferry
    /// replay --since <TIME>` with the time the error names (README, "When Ferry says events may
    /// be lost").
    #[arg(long, value_name = "LSN")]
    accept_gap: Option<ferry_wal::Lsn>,
    /// Skip the one outbox event that stopped Ferry with "cannot route outbox event": POSITION is
    /// what that error prints (`--skip-event 16/B374D848:2`: the transaction's commit LSN and the
    /// event's place in it, from 1). Only that event, and only if it cannot be routed; logged at
    /// WARN and counted in ferry_rows_skipped_total. A position the slot has already passed, or
    /// that the stream passes without meeting, is reported at WARN and does nothing.
    #[arg(long, value_name = "POSITION", conflicts_with = "dead_letter_event")]
    skip_event: Option<ferry_core::pass::EventPosition>,
    /// Like --skip-event, but send the event to route.dead_letter_topic (set it, also under
    /// on_error = "fail") instead of leaving it out; counted in ferry_rows_dead_lettered_total.
    #[arg(long, value_name = "POSITION")]
    dead_letter_event: Option<ferry_core::pass::EventPosition>,
    /// Exactly-once mode only: start from a slot that was used before but has no progress record
    /// (events before its position may be missing from Kafka or duplicated). Nothing to do in
    /// at-least-once mode, which starts from such a slot with a warning.
    #[arg(long)]
    initialize_progress: bool,
}

#[derive(Debug, clap::Args)]
struct ReplayCli {
    #[command(flatten)]
    config: ConfigArg,
    /// Rows committed at or after this time, with its zone (2026-11-26T07:12:03Z): for a gap,
    /// the time its refusal names.
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Rows committed before this time.
    #[arg(long, value_name = "TIME")]
    until: Option<String>,
    /// An SQL condition on the table's columns, ANDed with the times (`--where "aggregatetype =
    /// 'order'"`; `--where true` for every row).
    #[arg(long = "where", value_name = "SQL")]
    predicate: Option<String>,
    /// Only this outbox table (schema.table); default: every configured one, in order.
    #[arg(long, value_name = "TABLE")]
    table: Option<String>,
    /// The timestamptz column that says when a row was committed (default: the commit
    /// timestamp when track_commit_timestamp is on, else outbox.timestamp_column, else
    /// created_at).
    #[arg(long, value_name = "COLUMN")]
    time_column: Option<String>,
    /// With a time column rather than the commit timestamp, how far --since moves back: such a
    /// column (created_at DEFAULT now()) holds when the transaction began, before its commit.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = crate::config::duration::parse)]
    margin: std::time::Duration,
    /// Route and count per topic, send nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, clap::Args)]
struct StatusArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Relay the outbox to Kafka until SIGTERM or SIGINT.
    ///
    /// Creates the publication and the slot when missing (if allowed), streams from the slot's
    /// confirmed position, and on a signal stops reading, waits for in-flight deliveries (up to
    /// shutdown.drain_timeout), confirms, and exits 0. Transient failures (network, restarts,
    /// brokers away) are retried with backoff without exiting; permanent ones exit 1 with what
    /// to fix. When another process streams the slot, this one stands by and takes over when
    /// the slot is free.
    ///
    /// A slot Ferry streamed before that is now gone, invalidated, ahead of where Ferry left it,
    /// or on another server (Ferry remembers its position in kafka.progress_topic) stops Ferry
    /// with "events may be lost" and the gap; --accept-gap continues past it, and `ferry replay`
    /// then sends the gap's events again from the outbox table.
    ///
    /// A row that cannot be routed stops Ferry under route.on_error = "fail" with its position;
    /// --skip-event or --dead-letter-event passes that one event, once.
    Run(RunArgs),
    /// Check everything Ferry needs and list every problem with its fix (exit 1 if any).
    ///
    /// PostgreSQL connectivity, wal_level, every privilege `run` needs (REPLICATION; USAGE on the
    /// schema; CREATE on the database and table ownership to create the publication), the outbox
    /// table and its columns, the publication, the slot's state; Kafka connectivity and the topics that the
    /// outbox's current rows route to (rows committed before the slot exists are never relayed: a
    /// first start sees only what commits after it); the slot against the position Ferry
    /// remembers in kafka.progress_topic (a gap `ferry run` would stop at is an error).
    Check(ConfigArg),
    /// Send again the outbox rows the table still holds, chosen by commit time or SQL, with
    /// their original ids.
    ///
    /// For the events of a gap accepted with --accept-gap (the refusal names the --since to
    /// give), a backfill after a consumer bug, or rows committed before Ferry's first start.
    /// Routes each row as `ferry run` would and waits until Kafka acknowledged every record
    /// (exit 0), or stops at the first it refuses (exit 1). Consumers deduplicate on the `id`
    /// header. Touches neither the slot nor the progress record, so it runs beside `ferry run`.
    /// Rows are sent in commit order (the commit timestamp when track_commit_timestamp is on,
    /// else the table's time column); table-less messages (outbox.message_prefix) are not in a
    /// table and cannot be replayed.
    Replay(ReplayCli),
    /// Consume topics into an inbox table in the consuming service's PostgreSQL, exactly once.
    ///
    /// The other half of the outbox pattern: each record goes into [inbox].table (created from
    /// sql/inbox.sql when missing, unless inbox.create_tables = false) in batched transactions
    /// that also advance each partition's offset, kept in the same database; a zombie or a second
    /// copy is fenced by that offset and stops. Duplicates are dropped by event id (the `id`
    /// header, remembered for inbox.dedup_retention) and, with inbox.positions, by `ferry run`'s
    /// position headers. A record that cannot be stored goes to the dead-letter table in the same
    /// transaction. On SIGTERM or SIGINT it writes what it gathered and exits 0. `ferry inbox
    /// check` and `ferry inbox status` are its check and status.
    Inbox(InboxCli),
    /// Show the slot's position, its lag behind the server, and the WAL it retains.
    ///
    /// With --json, one JSON object with stable field names for scripts (see the README).
    Status(StatusArgs),
    /// Configuration tools.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct InboxCli {
    #[command(subcommand)]
    command: Option<InboxCommand>,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Debug, Subcommand)]
enum InboxCommand {
    /// Check everything the inbox needs and list every problem with its fix (exit 1 if any):
    /// the database, its tables, privileges and payload type; the brokers, the topics and the
    /// consumer group. Creates nothing.
    Check(ConfigArg),
    /// Show each partition's stored offset against Kafka's end, and what the tables hold
    /// (unprocessed rows, dead letters, event ids kept). With --json, one JSON object.
    Status(StatusArgs),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Print the effective configuration (file, environment, defaults) as TOML that loads again;
    /// secrets are shown as "<redacted>".
    Show(ConfigArg),
    /// Translate a Debezium PostgreSQL connector config with the Outbox Event Router into a ferry.toml.
    ///
    /// Reads the JSON posted to Kafka Connect ({"name": ..., "config": {...}} or the bare map;
    /// "-" for standard input), prints the equivalent ferry.toml (or writes it to --output), and
    /// lists every option without an equivalent on standard error as
    /// "not translated: <option> = <value>: <why / what to do>". Secrets are never written out.
    FromDebezium {
        /// The connector configuration (JSON).
        file: PathBuf,
        /// Write the ferry.toml here instead of standard output.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Kafka brokers (host:port,...): a connector config does not hold them.
        #[arg(long, value_name = "BROKERS")]
        brokers: Option<String>,
        /// The Kafka Connect worker's properties file (connect-distributed.properties): its
        /// converters decide the record bytes Ferry reproduces, its bootstrap.servers the brokers.
        #[arg(long, value_name = "FILE")]
        worker: Option<PathBuf>,
    },
}

/// Entry point of the `ferry` binary.
pub fn main() -> ExitCode {
    crate::malloc::tune();
    let cli = Cli::parse();
    // One thread for everything async: the reader task and the session hand events back and
    // forth for every socket read, and on a multi-threaded runtime each hand-over is a
    // cross-thread wake-up. librdkafka has its own threads for compression and the brokers.
    // Measured on the 200,000-row backlog: 1.15 -> 0.98 CPU-s per 100k rows; single-row
    // transactions 2.18 -> 1.36 (bench/README.md).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            errln!("ferry: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    // The command runs as a task, not as `block_on`'s own future: a task that wakes the
    // `block_on` future makes the scheduler look at the driver once more without waiting (an
    // `epoll_wait` with no timeout) before it polls it, and the session's tasks wake each other
    // several times per transaction. A woken task is only queued.
    let result = runtime.block_on(async move { tokio::spawn(dispatch(cli.command)).await });
    match result {
        Ok(outcome) => outcome.unwrap_or_else(|code| code),
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => {
                errln!("ferry: the main task was cancelled: {e}");
                ExitCode::from(1)
            }
        },
    }
}

async fn dispatch(command: Command) -> Result<ExitCode, ExitCode> {
    match command {
        Command::Run(c) => run(c).await,
        Command::Inbox(InboxCli {
            command: None,
            config,
        }) => inbox(config).await,
        Command::Inbox(InboxCli {
            command: Some(InboxCommand::Check(c)),
            ..
        }) => crate::inbox::check::check(load(&c)?).await,
        Command::Inbox(InboxCli {
            command: Some(InboxCommand::Status(s)),
            ..
        }) => crate::inbox::check::status(load(&s.config)?, s.json).await,
        Command::Check(c) => crate::check::check(load(&c)?).await,
        Command::Status(s) => crate::check::status(load(&s.config)?, s.json).await,
        Command::Replay(r) => {
            let args = crate::replay::ReplayArgs {
                since: r.since,
                until: r.until,
                predicate: r.predicate,
                table: r.table,
                time_column: r.time_column,
                dry_run: r.dry_run,
                margin: r.margin,
            };
            crate::replay::replay(load(&r.config)?, args).await
        }
        Command::Config(ConfigCommand::Show(c)) => {
            let config = load(&c)?;
            match config.to_toml() {
                Ok(text) => {
                    out!("{text}");
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    errln!("ferry: cannot print the configuration as TOML: {e}");
                    Err(ExitCode::from(1))
                }
            }
        }
        Command::Config(ConfigCommand::FromDebezium {
            file,
            output,
            brokers,
            worker,
        }) => from_debezium(&file, output.as_deref(), brokers, worker.as_deref()),
    }
}

/// `config from-debezium`: translation notes go to standard error, the TOML to stdout or `output`.
fn from_debezium(
    file: &std::path::Path,
    output: Option<&std::path::Path>,
    brokers: Option<String>,
    worker: Option<&std::path::Path>,
) -> Result<ExitCode, ExitCode> {
    let worker = match worker {
        Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
            errln!(
                "ferry: cannot read the worker properties {}: {e}",
                path.display()
            );
            ExitCode::from(2)
        })?),
        None => None,
    };
    let read = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(file)
    };
    let json = read.map_err(|e| {
        errln!("ferry: cannot read {}: {e}", file.display());
        ExitCode::from(2)
    })?;
    let options = crate::debezium::Options {
        brokers,
        worker,
        source: file
            .file_name()
            .filter(|_| file.as_os_str() != "-")
            .map(|n| n.to_string_lossy().into_owned()),
    };
    let t = crate::debezium::translate(&json, &options).map_err(|e| {
        errln!("ferry: {}: {e}", file.display());
        ExitCode::from(2)
    })?;
    match output {
        Some(path) => std::fs::write(path, &t.toml).map_err(|e| {
            errln!("ferry: cannot write {}: {e}", path.display());
            ExitCode::from(2)
        })?,
        None => out!("{}", t.toml),
    }
    for note in &t.notes {
        errln!("{note}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Loads and validates the configuration; on failure prints why and returns exit code 2.
fn load(arg: &ConfigArg) -> Result<Config, ExitCode> {
    let text = match &arg.config {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(t) => Some(t),
            Err(e) => {
                errln!(
                    "ferry: cannot read the configuration file {}: {e}",
                    path.display()
                );
                return Err(ExitCode::from(2));
            }
        },
        None => None,
    };
    config::load(text.as_deref(), std::env::vars()).map_err(|e| {
        errln!("ferry: the configuration cannot be used:\n{e}");
        ExitCode::from(2)
    })
}

async fn run(arg: RunArgs) -> Result<ExitCode, ExitCode> {
    let shutdown = shutdown_signal();
    let config = load(&arg.config)?;
    start_logging(&config)?;
    let mut settings = PipelineSettings::from_config(&config).map_err(|e| {
        errln!("ferry: the configuration cannot be used:\n{e}");
        ExitCode::from(2)
    })?;
    settings.acceptance = ferry_core::verdict::Acceptance {
        gap_from: arg.accept_gap,
        initialize_progress: arg.initialize_progress,
    };
    settings.pass = one_shot_pass(&arg, &settings)?;
    let metrics = Metrics::new();
    let stop_http = serve_telemetry(&config, HttpState::new(metrics.clone())).await?;
    let catch_up = tokio::spawn(telemetry::catchup::run(
        metrics.clone(),
        telemetry::catchup::INTERVAL,
    ));
    metrics
        .outbox_rows
        .set_tables(settings.routers.tables().map(ToString::to_string));
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        postgres = %settings.postgres,
        slot = %settings.slot.slot,
        publication = %settings.slot.publication,
        tables = %settings.routers.tables().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        "starting"
    );
    let result = pipeline::run(settings, metrics, shutdown).await;
    let _ = stop_http.send(true);
    catch_up.abort();
    ended(result)
}

/// Logging as `[log]` says, or exit 2.
fn start_logging(config: &Config) -> Result<(), ExitCode> {
    telemetry::logging::init(config.log.format, &config.log.level).map_err(|e| {
        errln!("ferry: log.level: {e}");
        ExitCode::from(2)
    })
}

/// Serves `/metrics`, `/healthz` and `/readyz` from `state` on `http.listen` (unless it is
/// "off") until the returned sender says stop; a port that cannot be bound exits 2.
async fn serve_telemetry(
    config: &Config,
    state: HttpState,
) -> Result<tokio::sync::watch::Sender<bool>, ExitCode> {
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    if let Some(addr) = config.http.listen.addr() {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            tracing::error!(%addr, error = %e, "cannot listen for HTTP (http.listen); choose another address or \"off\"");
            ExitCode::from(2)
        })?;
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
        tokio::spawn(telemetry::serve(listener, Arc::new(state), async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        }));
    }
    Ok(stop_tx)
}

/// The exit code of a command that ran until stopped: 0, or 1 with its permanent error.
fn ended(result: Result<(), impl std::fmt::Display>) -> Result<ExitCode, ExitCode> {
    match result {
        Ok(()) => {
            tracing::info!("stopped");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            // Printed once: the ERROR event (a text line, or a JSON object a log pipeline can
            // parse, with the whole error in `error`), or plain text when logging is filtered
            // below ERROR, so the exit code never comes without its reason.
            if tracing::event_enabled!(tracing::Level::ERROR) {
                tracing::error!(error = %e, "stopping: permanent error");
            } else {
                errln!("ferry: {e}");
            }
            Err(ExitCode::from(1))
        }
    }
}

async fn inbox(arg: ConfigArg) -> Result<ExitCode, ExitCode> {
    let shutdown = shutdown_signal();
    let config = load(&arg)?;
    start_logging(&config)?;
    let settings = crate::inbox::InboxSettings::from_config(&config).map_err(|e| {
        errln!("ferry: the configuration cannot be used:\n{e}");
        ExitCode::from(2)
    })?;
    let metrics = Arc::new(crate::inbox::metrics::InboxMetrics::default());
    let mut state = HttpState::new(Metrics::new());
    state.inbox = Some(metrics.clone());
    let stop_http = serve_telemetry(&config, state).await?;
    tracing::info!(version = env!("CARGO_PKG_VERSION"), postgres = %settings.postgres, "starting the inbox");
    let result = crate::inbox::run(settings, metrics, shutdown).await;
    let _ = stop_http.send(true);
    ended(result)
}

/// `--skip-event` / `--dead-letter-event`, checked against the configuration: a dead letter
/// needs a dead-letter topic to go to.
fn one_shot_pass(
    arg: &RunArgs,
    settings: &PipelineSettings,
) -> Result<Option<ferry_core::pass::Pass>, ExitCode> {
    use ferry_core::pass::{Pass, PassAction};
    let pass = match (arg.skip_event, arg.dead_letter_event) {
        (Some(at), _) => Pass::new(at, PassAction::Skip),
        (None, Some(at)) => Pass::new(at, PassAction::DeadLetter),
        (None, None) => return Ok(None),
    };
    if pass.action == PassAction::DeadLetter
        && settings
            .routers
            .iter()
            .all(|r| r.dead_letter_topic().is_none())
    {
        tracing::error!(
            "{pass}: no dead-letter topic to send the event to; set route.dead_letter_topic \
             (FERRY_ROUTE_DEAD_LETTER_TOPIC; allowed under on_error = \"fail\" for this flag), or use \
             --skip-event {}",
            pass.at
        );
        return Err(ExitCode::from(2));
    }
    tracing::warn!(position = %pass.at,
        "{pass}: the outbox event at {} will be passed once if it cannot be routed", pass.at);
    Ok(Some(pass))
}

/// Installs the SIGTERM and SIGINT handlers now and returns a future that resolves on either,
/// and resolves again at once whenever it is polled after that ([`Sticky`]).
///
/// Installed eagerly, not on the future's first poll: a SIGTERM that arrives while the pipeline
/// is still starting (before it first polls its shutdown future) must stop Ferry gracefully, not
/// kill it with the default action.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    Sticky(Some(Box::pin(signalled())))
}

/// A future of `()` that, once resolved, resolves at once on every later poll: a stop seen by
/// one session (which drained and ended) is seen again by whatever waits on it next (a backoff
/// before the next session), where an `async` block polled after completion would panic.
struct Sticky<F>(Option<std::pin::Pin<Box<F>>>);

impl<F: std::future::Future<Output = ()>> std::future::Future for Sticky<F> {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let Some(fut) = self.0.as_mut() else {
            return std::task::Poll::Ready(());
        };
        let done = fut.as_mut().poll(cx);
        if done.is_ready() {
            self.0 = None;
        }
        done
    }
}

/// The handlers, installed now, and the wait for either signal.
fn signalled() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        let (mut term, mut int) = match (term, int) {
            (Ok(t), Ok(i)) => (t, i),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "cannot install the SIGTERM/SIGINT handlers");
                std::future::pending::<()>().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Sticky;

    /// Polled again after it resolved, the stop resolves again (an `async` block would panic).
    #[tokio::test]
    async fn a_stop_seen_once_is_seen_again() {
        let mut stop = std::pin::pin!(Sticky(Some(Box::pin(async {}))));
        stop.as_mut().await;
        stop.as_mut().await;
        let pending = Sticky(Some(Box::pin(std::future::pending::<()>())));
        let waited = tokio::time::timeout(std::time::Duration::from_millis(10), pending).await;
        assert!(waited.is_err(), "a stop not yet seen resolved");
    }
}
