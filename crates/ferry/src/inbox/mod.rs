//! `ferry inbox`: Kafka into the consuming service's PostgreSQL, exactly once.
//!
//! The decisions are [`ferry_core::inbox::Inbox`]'s (read its module docs first). This driver
//! carries them out:
//!
//! - [`consumer`]: the Kafka consumer on its own thread (records, assignments, revocations in
//!   order; seeks and advisory commits);
//! - [`store`]: the tables and statements (load offsets, write a batch, clean up);
//! - [`metrics`]: what `/metrics` and `/readyz` say;
//! - this module: three database connections (writes, loads, cleanup: a long cleanup never
//!   delays a write or a rebalance), each reconnecting on its own, and the loop that feeds the
//!   machine and does what it says.

pub mod check;
pub mod consumer;
pub mod metrics;
pub mod store;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::inbox::{Inbox, InboxAction, InboxConfig, Loaded, Partition, Write, WriteOutcome};
use ferry_wal::conn::ConnectConfig;
use tokio::sync::mpsc;
use tokio_postgres::Client;

use crate::config::Config;
use consumer::{Command, Event};
use metrics::InboxMetrics;
use store::{Cleaned, Statements, Tables};

/// Everything `ferry inbox` needs, resolved from the configuration.
pub struct InboxSettings {
    pub postgres: ConnectConfig,
    pub kafka: Vec<(String, String)>,
    /// `kafka.brokers`, comma-separated, for messages.
    pub brokers: String,
    pub topics: Vec<String>,
    pub group: String,
    pub tables: Tables,
    pub create_tables: bool,
    pub machine: InboxConfig,
    pub start: rdkafka::Offset,
    pub dedup_retention: Duration,
    pub processed_retention: Option<Duration>,
    pub cleanup_batch: i64,
    pub notify_channel: String,
    /// `postgres.receive_timeout` (`None`: `0s`): how long a write or a load of offsets may go
    /// unanswered before it is given up on ([`answered`]).
    pub receive_timeout: Option<Duration>,
}

/// Without the Kafka properties and the password: they hold secrets.
impl std::fmt::Debug for InboxSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxSettings")
            .field("postgres", &self.postgres.to_string())
            .field("topics", &self.topics)
            .field("group", &self.group)
            .field("tables", &self.tables)
            .finish_non_exhaustive()
    }
}

impl InboxSettings {
    /// The settings, or every reason they cannot be made (key path: what and how to fix).
    pub fn from_config(c: &Config) -> Result<InboxSettings, String> {
        let i = &c.inbox;
        let mut problems = Vec::new();
        if i.topics.0.is_empty() {
            problems.push(
                "inbox.topics: required by `ferry inbox`: the topics to consume \
                 (FERRY_INBOX_TOPICS=outbox.event.order,outbox.event.customer, or \
                 topics = [\"outbox.event.order\"] under [inbox])"
                    .to_owned(),
            );
        }
        let postgres = c
            .postgres
            .connect_config()
            .map_err(|e| problems.push(e))
            .ok();
        let kafka = c
            .kafka
            .producer_properties()
            .map_err(|e| problems.push(e))
            .ok();
        let table = i
            .table_name()
            .map_err(|e| problems.push(format!("inbox.table: {e}")))
            .ok();
        let (Some(postgres), Some(kafka), Some(table), true) =
            (postgres, kafka, table, problems.is_empty())
        else {
            return Err(problems.join("\n"));
        };
        let payload = i.payload();
        let event_id_header = (!i.event_id_header.is_empty()).then(|| i.event_id_header.clone());
        let max_buffered = usize::try_from(i.max_buffered_bytes).unwrap_or(usize::MAX);
        Ok(InboxSettings {
            postgres,
            kafka,
            brokers: c.kafka.brokers.0.join(","),
            topics: i.topics.0.clone(),
            group: i.group_id.clone(),
            tables: Tables::new(&table, payload),
            create_tables: i.create_tables,
            machine: InboxConfig {
                max_batch_records: usize::try_from(i.max_batch_records).unwrap_or(usize::MAX),
                max_batch_bytes: (max_buffered / 4).max(1 << 20),
                max_batch_delay: i.max_batch_delay.get(),
                max_buffered_bytes: max_buffered,
                event_id_header,
                positions: i.positions,
                payload,
                cleanup_interval: Some(i.cleanup_interval.get()),
                ..InboxConfig::default()
            },
            start: if i.start == "latest" {
                rdkafka::Offset::End
            } else {
                rdkafka::Offset::Beginning
            },
            dedup_retention: i.dedup_retention.get(),
            processed_retention: (!i.processed_retention.is_zero())
                .then(|| i.processed_retention.get()),
            cleanup_batch: i64::try_from(i.cleanup_batch).unwrap_or(i64::MAX),
            notify_channel: i.notify_channel.clone(),
            receive_timeout: Some(c.postgres.receive_timeout.get()).filter(|t| !t.is_zero()),
        })
    }
}

/// What the database tasks answer.
enum Done {
    Loaded(u64, Result<Vec<Loaded>, String>),
    Written(Write, WriteOutcome, Duration),
    Cleaned(Result<Cleaned, String>),
}

/// Runs until `shutdown` (Ok, after writing what was gathered) or a permanent error.
pub async fn run(
    s: InboxSettings,
    metrics: Arc<InboxMetrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), String> {
    let s = Arc::new(s);
    let mut first = connect(&s.postgres).await?;
    let Some(prepared) = answered(s.receive_timeout, None, prepare_tables(&mut first, &s)).await
    else {
        return Err(unanswered_at_start("the look-up or creation of its tables", &first, &s).await);
    };
    prepared?;
    let prepared = answered(
        s.receive_timeout,
        None,
        Statements::prepare(&first, &s.tables, &s.notify_channel),
    )
    .await;
    let Some(prepared) = prepared else {
        return Err(unanswered_at_start("the preparation of its statements", &first, &s).await);
    };
    let statements = prepared.map_err(|e| {
        format!(
            "cannot prepare the inbox's statements on {}: {}; do the tables match sql/inbox.sql \
                 (inbox.payload_type = \"{}\")?",
            s.tables.inbox,
            store::describe(&e),
            s.tables.payload.sql()
        )
    })?;
    let (done_tx, mut done) = mpsc::channel::<Done>(64);
    let writer = spawn_writer(s.clone(), first, statements, done_tx.clone());
    let loader = spawn_loader(s.clone(), done_tx.clone());
    let cleaner = spawn_cleaner(s.clone(), done_tx);

    // Bursts of up to consumer::BURST records: the records waiting here are not counted in the
    // machine's max_buffered_bytes, so only a few.
    let (events_tx, mut events) = mpsc::channel::<Event>(4);
    let (commands, commands_rx) = std_mpsc::channel::<Command>();
    let thread = consumer::spawn(
        consumer::Settings {
            properties: s.kafka.clone(),
            group: s.group.clone(),
            topics: s.topics.clone(),
            start: s.start,
            revoke_wait: Duration::from_secs(60),
        },
        events_tx,
        commands_rx,
    )?;
    tracing::info!(
        topics = %s.topics.join(", "),
        group = %s.group,
        table = %s.tables.inbox,
        "consuming into the inbox"
    );

    let mut machine = Inbox::new(s.machine.clone(), Instant::now());
    let mut revokes: Vec<(BTreeSet<Partition>, std_mpsc::Sender<()>)> = Vec::new();
    let mut joined = false;
    let mut failing: Option<String> = None;
    tokio::pin!(shutdown);
    let mut shutting = false;
    let result = 'run: loop {
        while let Some(action) = machine.poll_action() {
            match action {
                InboxAction::Load { load, partitions } => {
                    let _ = loader.send((load, partitions)).await;
                }
                InboxAction::Seek {
                    partition,
                    to,
                    epoch,
                } => {
                    let _ = commands.send(Command::Seek {
                        partition,
                        to,
                        epoch,
                    });
                }
                InboxAction::Write(w) => {
                    let _ = writer.send(w).await;
                }
                InboxAction::CommitOffsets(o) => {
                    let _ = commands.send(Command::Commit(o));
                }
                InboxAction::Revoked(ps) => {
                    for (waiting, _) in &mut revokes {
                        for p in &ps {
                            waiting.remove(p);
                        }
                    }
                    revokes.retain(|(waiting, done)| {
                        let over = waiting.is_empty();
                        if over {
                            let _ = done.send(());
                        }
                        !over
                    });
                }
                InboxAction::Cleanup => {
                    let _ = cleaner.send(()).await;
                }
                InboxAction::Stop(r) => break 'run r.map_err(|e| e.to_string()),
            }
        }
        metrics.set_stats(machine.stats());
        metrics
            .partitions
            .store(machine.active_partitions().count() as u64, Relaxed);
        metrics
            .buffered_bytes
            .store(machine.buffered_bytes() as u64, Relaxed);
        metrics.set_not_ready(match (&failing, joined) {
            (Some(why), _) => Some(format!("the inbox's database fails: {why}")),
            (None, false) => Some("waiting for the consumer group to assign partitions".into()),
            _ => None,
        });
        let deadline = machine.poll_timeout();
        tokio::select! {
            biased;
            () = &mut shutdown, if !shutting => {
                shutting = true;
                tracing::info!("shutting down: writing what is gathered");
                machine.shutdown(Instant::now());
            }
            Some(d) = done.recv() => {
                let now = Instant::now();
                match d {
                    Done::Loaded(load, r) => {
                        failing = r.as_ref().err().cloned();
                        if let Err(e) = &r {
                            tracing::warn!(error = %e, "cannot read the partitions' offsets from the database; trying again");
                        }
                        machine.handle_loaded(load, r, now);
                    }
                    Done::Written(w, outcome, took) => {
                        match &outcome {
                            WriteOutcome::Committed { .. } => {
                                failing = None;
                                metrics.write_seconds.observe(took.as_secs_f64());
                            }
                            WriteOutcome::Failed { error } => {
                                tracing::warn!(%error, "a write to the inbox failed: nothing of it is assumed written; reading the offsets again");
                                failing = Some(error.clone());
                            }
                            WriteOutcome::Rejected { error } => {
                                tracing::warn!(%error, "the database refused a row of a batch: writing the batch again row by row, dead-lettering what it refuses");
                            }
                            WriteOutcome::Fenced { .. } => {}
                        }
                        machine.handle_written(w, outcome, now);
                    }
                    Done::Cleaned(r) => {
                        match &r {
                            Ok(c) => {
                                metrics.cleanup_dedup.fetch_add(c.dedup_rows, Relaxed);
                                metrics.cleanup_processed.fetch_add(c.processed_rows, Relaxed);
                                metrics.cleanup_longest_micros.store(c.longest.as_micros() as u64, Relaxed);
                                if c.dedup_rows + c.processed_rows > 0 {
                                    tracing::info!(dedup_rows = c.dedup_rows, processed_rows = c.processed_rows, longest_delete_ms = c.longest.as_millis() as u64, took_ms = c.took.as_millis() as u64, "cleanup deleted expired rows");
                                }
                            }
                            Err(e) => tracing::warn!(error = %e, "the inbox cleanup failed; it runs again at the next interval"),
                        }
                        machine.handle_cleaned(r.map(|_| ()), now);
                    }
                }
            }
            Some(ev) = events.recv(), if machine.wants_records() || shutting => {
                let now = Instant::now();
                match ev {
                    Event::Records(records) => {
                        for r in records {
                            machine.handle_record(r, now);
                        }
                    }
                    Event::Assigned(ps) => {
                        joined = true;
                        if !ps.is_empty() {
                            tracing::info!(partitions = %names(&ps), "partitions assigned");
                        }
                        machine.handle_assigned(ps, now);
                    }
                    Event::Revoked { partitions, done } => {
                        // Not ready until the group assigns again (at once in a rebalance; not
                        // while the brokers are away and the session timed out).
                        joined = false;
                        tracing::info!(partitions = %names(&partitions), "partitions revoked");
                        revokes.push((partitions.iter().cloned().collect(), done));
                        machine.handle_revoked(partitions, now);
                    }
                    Event::Failed(e) => break 'run Err(format!(
                        "the Kafka consumer failed fatally: {e}; nothing it held was written, and \
                         a restart reads the offsets from the database again (check the brokers \
                         and [kafka] properties if it repeats)"
                    )),
                }
            }
            () = sleep_until(deadline) => machine.handle_timeout(Instant::now()),
        }
    };
    // Let every revocation waiting on us go, then stop the consumer (its close commits nothing
    // the database does not hold: the advisory commits are sent after the transactions).
    for (_, done) in revokes {
        let _ = done.send(());
    }
    let _ = commands.send(Command::Stop);
    drop(events);
    let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    result
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

fn names(ps: &[Partition]) -> String {
    ps.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

async fn connect(cfg: &ConnectConfig) -> Result<Client, String> {
    ferry_wal::slot::connect_sql(cfg)
        .await
        .map_err(|e| format!("cannot connect to the inbox's PostgreSQL: {e}"))
}

async fn prepare_tables(client: &mut Client, s: &InboxSettings) -> Result<(), String> {
    if s.create_tables {
        s.tables.create(client).await.map_err(|e| {
            format!(
                "cannot create the inbox's tables ({}): {}; create them from sql/inbox.sql as a role \
                 that may, and set inbox.create_tables = false, or grant CREATE on the schema",
                s.tables.inbox,
                store::describe(&e)
            )
        })
    } else {
        let missing =
            s.tables.missing(client).await.map_err(|e| {
                format!("cannot look up the inbox's tables: {}", store::describe(&e))
            })?;
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the inbox's tables {} do not exist; create them from sql/inbox.sql, or set \
                 inbox.create_tables = true",
                missing.join(", ")
            ))
        }
    }
}

/// A connection that is made again after it failed, at the next request.
struct Conn {
    cfg: ConnectConfig,
    client: Option<Client>,
}

impl Conn {
    async fn get(&mut self) -> Result<&Client, String> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = Some(connect(&self.cfg).await?);
        }
        Ok(self.client.as_ref().expect("just connected"))
    }
}

fn spawn_writer(
    s: Arc<InboxSettings>,
    first: Client,
    statements: Statements,
    done: mpsc::Sender<Done>,
) -> mpsc::Sender<Write> {
    let (tx, mut rx) = mpsc::channel::<Write>(1);
    tokio::spawn(async move {
        let mut client = Some((first, statements));
        let dedup = s.machine.event_id_header.is_some();
        while let Some(w) = rx.recv().await {
            let started = Instant::now();
            if client.as_ref().is_none_or(|(c, _)| c.is_closed()) {
                client = match connect(&s.postgres).await {
                    Ok(c) => match answered(
                        s.receive_timeout,
                        None,
                        Statements::prepare(&c, &s.tables, &s.notify_channel),
                    )
                    .await
                    {
                        Some(Ok(st)) => Some((c, st)),
                        outcome => {
                            let error = match outcome {
                                Some(Err(e)) => store::describe(&e),
                                _ => {
                                    ferry_wal::slot::cancel_sql_soon(&s.postgres, c.cancel_token());
                                    unanswered("the preparation of its statements", GOES_ON, &s)
                                }
                            };
                            let _ = done
                                .send(Done::Written(
                                    w,
                                    WriteOutcome::Failed { error },
                                    started.elapsed(),
                                ))
                                .await;
                            continue;
                        }
                    },
                    Err(error) => {
                        let _ = done
                            .send(Done::Written(
                                w,
                                WriteOutcome::Failed { error },
                                started.elapsed(),
                            ))
                            .await;
                        continue;
                    }
                };
            }
            let (c, st) = client.as_mut().expect("connected");
            let backend = st.backend;
            let answers = AtomicU64::new(0);
            let write = store::write(c, st, &s.tables, &s.group, &w, dedup, &answers);
            let (outcome, given_up) = match answered(s.receive_timeout, Some(&answers), write).await
            {
                Some(outcome) => (outcome, false),
                None => {
                    let error = unanswered("the write", GOES_ON, &s);
                    (WriteOutcome::Failed { error }, true)
                }
            };
            if matches!(outcome, WriteOutcome::Failed { .. }) {
                // Given up on, or its connection broke in the middle of the write (a reset from a
                // NAT that lost the flow, a keepalive that went unanswered): either may leave the
                // backend in the transaction.
                match backend {
                    Some(backend) if given_up || c.is_closed() => end_given_up(s.clone(), backend),
                    // Its backend unknown: what it waits on is cancelled at least.
                    None if given_up => {
                        ferry_wal::slot::cancel_sql_soon(&s.postgres, c.cancel_token())
                    }
                    _ => {}
                }
                // Whatever the connection's state, the next write starts on a fresh one.
                client = None;
            }
            if done
                .send(Done::Written(w, outcome, started.elapsed()))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    tx
}

/// How long [`end_given_up`] keeps trying to reach the database.
const END_GIVEN_UP_FOR: Duration = Duration::from_secs(30 * 60);

/// Ends the backend of a write given up on, or whose connection broke
/// ([`ferry_wal::slot::end_backend`]),
/// in the background, on a new connection as soon as the database answers one (for
/// [`END_GIVEN_UP_FOR`] at most). Its transaction may hold the offsets' rows for as long as its
/// connection lives on the server's side, and every load and write after it would wait on
/// them: a flow stranded by a lost NAT or conntrack entry lives until the server's TCP gives up
/// on it (about 15 minutes of retransmissions when its last reply went unacknowledged, over two
/// hours of keepalive when not), and through a proxy that lives on, for good. A cancel would
/// not do: a backend waiting for its client's `COPY` data does not take one.
fn end_given_up(s: Arc<InboxSettings>, backend: ferry_wal::slot::Backend) {
    tokio::spawn(async move {
        let since = Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            let ended = match connect(&s.postgres).await {
                Ok(c) => {
                    let end = ferry_wal::slot::end_backend(&c, &backend, Duration::ZERO);
                    answered(s.receive_timeout, None, end).await
                }
                Err(_) => None,
            };
            match ended {
                Some(Ok(Some(true))) => {
                    tracing::info!(
                        pid = backend.pid,
                        "ended the database backend of the write given up on: its transaction, \
                         and what it held of the offsets' rows, are rolled back"
                    );
                    return;
                }
                // Gone by itself.
                Some(Ok(None)) => return,
                Some(Err(ferry_wal::conn::ReaderError::Server(e))) if e.code == "42501" => {
                    tracing::warn!(
                        pid = backend.pid,
                        "cannot end the database backend of the write given up on ({}): until the \
                         server notices its client is gone, its transaction holds the offsets' rows \
                         and the inbox waits on them; end it as a superuser \
                         (SELECT pg_terminate_backend({}))",
                        e.message,
                        backend.pid
                    );
                    return;
                }
                // Not signalled, or the database does not answer yet.
                Some(Ok(Some(false))) | Some(Err(_)) | None => {}
            }
            if since.elapsed() >= END_GIVEN_UP_FOR {
                tracing::warn!(
                    pid = backend.pid,
                    "could not end the database backend of a write given up on within {:?}: if it \
                     is still there (pg_stat_activity), its transaction holds the offsets' rows and \
                     the inbox waits on them; end it (SELECT pg_terminate_backend({}))",
                    END_GIVEN_UP_FOR,
                    backend.pid
                );
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    });
}

/// `query`'s outcome, or `None` when the database left it unanswered for `within`
/// (`postgres.receive_timeout`: a server gone without closing the connection, a failover behind
/// a proxy, a lock it waits on); the caller then cancels it on the server ([`ferry_wal::slot::cancel_sql_soon`]),
/// or for a write ends its backend ([`end_given_up`]), and drops its client. `answers`: what the query counts of the database's answers as they come
/// (a write's statements, [`store::write`]); it is given up on only when none came for `within`
/// (checked every quarter of it), however long it takes as a whole. A write given up on is
/// `Failed`, and nothing is assumed of it: its transaction holds the offsets' rows until it
/// ends (committed late, or rolled back when its backend is ended), so the next load reads them
/// as they are then, and the next write's compare-and-set on them fences anything else.
async fn answered<T>(
    within: Option<Duration>,
    answers: Option<&AtomicU64>,
    query: impl Future<Output = T>,
) -> Option<T> {
    let Some(within) = within else {
        return Some(query.await);
    };
    let mut query = std::pin::pin!(query);
    let count = || answers.map(|a| a.load(Relaxed));
    let (mut seen, mut since) = (count(), Instant::now());
    loop {
        let check = tokio::time::sleep(match answers {
            Some(_) => within / 4,
            None => within.saturating_sub(since.elapsed()),
        });
        tokio::select! {
            outcome = &mut query => return Some(outcome),
            () = check => {}
        }
        if count() != seen {
            (seen, since) = (count(), Instant::now());
        } else if since.elapsed() >= within {
            return None;
        }
    }
}

/// Why a query [`answered`] gave up on failed; `then`: what happens to it and after it.
fn unanswered(what: &str, then: &str, s: &InboxSettings) -> String {
    format!(
        "the database did not answer {what} within {:?} (postgres.receive_timeout): {then}. If \
         the database or the network was down, nothing needs doing; if it was only busy (a \
         lock, a slow trigger), raise postgres.receive_timeout",
        s.receive_timeout.unwrap_or_default()
    )
}

/// [`unanswered`]'s `then` for a write's and a read's queries.
const GOES_ON: &str = "it is cancelled (a write's backend ended), and the inbox goes on on a new \
                       connection";

/// Why the start, a query of which [`answered`] gave up on, failed; the query cancelled first
/// (the process ends next, and a backend waiting on a lock would not notice its client gone:
/// a restart after each would queue one more behind the lock).
async fn unanswered_at_start(what: &str, client: &Client, s: &InboxSettings) -> String {
    ferry_wal::slot::cancel_sql(&s.postgres, &client.cancel_token()).await;
    format!(
        "the database did not answer {what} within {:?} (postgres.receive_timeout), so the inbox \
         stops without having consumed anything; check that the database is up and reachable. If \
         it was only busy (a transaction holding a lock on the inbox's tables), raise \
         postgres.receive_timeout",
        s.receive_timeout.unwrap_or_default()
    )
}

fn spawn_loader(
    s: Arc<InboxSettings>,
    done: mpsc::Sender<Done>,
) -> mpsc::Sender<(u64, Vec<Partition>)> {
    let (tx, mut rx) = mpsc::channel::<(u64, Vec<Partition>)>(16);
    tokio::spawn(async move {
        let mut conn = Conn {
            cfg: s.postgres.clone(),
            client: None,
        };
        while let Some((load, partitions)) = rx.recv().await {
            let r = match conn.get().await {
                Ok(c) => {
                    let load = store::load(c, &s.tables, &s.group, &partitions);
                    match answered(s.receive_timeout, None, load).await {
                        Some(r) => r.map_err(|e| store::describe(&e)),
                        None => {
                            ferry_wal::slot::cancel_sql_soon(&s.postgres, c.cancel_token());
                            Err(unanswered("the read of the offsets", GOES_ON, &s))
                        }
                    }
                }
                Err(e) => Err(e),
            };
            if r.is_err() {
                conn.client = None;
            }
            if done.send(Done::Loaded(load, r)).await.is_err() {
                return;
            }
        }
    });
    tx
}

fn spawn_cleaner(s: Arc<InboxSettings>, done: mpsc::Sender<Done>) -> mpsc::Sender<()> {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    tokio::spawn(async move {
        let mut conn = Conn {
            cfg: s.postgres.clone(),
            client: None,
        };
        while rx.recv().await.is_some() {
            let r = match conn.get().await {
                Ok(c) => {
                    let answers = AtomicU64::new(0);
                    let cleanup = store::cleanup(
                        c,
                        &s.tables,
                        s.dedup_retention,
                        s.processed_retention,
                        s.cleanup_batch,
                        &answers,
                    );
                    // A DELETE that stopped getting answers (a server gone behind a live proxy,
                    // a lock it waits on) would stop every cleanup after it, and the
                    // deduplication rows would grow for good.
                    match answered(s.receive_timeout, Some(&answers), cleanup).await {
                        Some(r) => r.map_err(|e| store::describe(&e)),
                        None => {
                            ferry_wal::slot::cancel_sql_soon(&s.postgres, c.cancel_token());
                            Err(unanswered(
                                "the cleanup",
                                "it is cancelled, and the next cleanup runs on a new connection",
                                &s,
                            ))
                        }
                    }
                }
                Err(e) => Err(e),
            };
            if r.is_err() {
                conn.client = None;
            }
            if done.send(Done::Cleaned(r)).await.is_err() {
                return;
            }
        }
    });
    tx
}

#[cfg(test)]
mod tests {
    use super::answered;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::time::Duration;

    const WITHIN: Option<Duration> = Some(Duration::from_secs(1));

    #[tokio::test]
    async fn a_query_answering_as_it_goes_is_waited_for_however_long_it_takes() {
        // Three times the bound as a whole, an answer every tenth of a second.
        let answers = AtomicU64::new(0);
        let long = async {
            for _ in 0..30 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                answers.fetch_add(1, Relaxed);
            }
            7
        };
        assert_eq!(answered(WITHIN, Some(&answers), long).await, Some(7));
    }

    #[tokio::test]
    async fn a_query_that_stops_answering_is_given_up_on() {
        let answers = AtomicU64::new(0);
        let stops = async {
            answers.fetch_add(1, Relaxed);
            std::future::pending::<()>().await
        };
        assert_eq!(answered(WITHIN, Some(&answers), stops).await, None);
        // Without a count, the bound is on the whole.
        let whole = tokio::time::sleep(Duration::from_secs(3));
        assert_eq!(answered(WITHIN, None, whole).await, None);
        // No bound: waited for.
        let short = tokio::time::sleep(Duration::from_millis(10));
        assert_eq!(answered(None, None, short).await, Some(()));
    }
}
