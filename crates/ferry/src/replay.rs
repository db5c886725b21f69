//! `ferry replay`: send again the outbox rows the table still holds, chosen by commit time (or
//! any SQL condition), with their original ids, through the same routes as `ferry run`.
//!
//! What it is for: the events of a gap that Ferry refused and the operator accepted
//! (`ferry run --accept-gap`; the refusal names the `--since` to give), a backfill after a
//! consumer bug, or rows committed before Ferry's first start. Consumers deduplicate on the `id`
//! header, which is the row's own id, not a copy's.
//!
//! How: one read-only `REPEATABLE READ` transaction per table (one consistent snapshot), rows
//! streamed in commit-time order (`ORDER BY <time>, ctid`) and routed exactly as the reader's rows
//! are (every column as its text form, which is what pgoutput sends in text mode), produced by
//! the same idempotent producer (`acks=all`), at most `kafka.max_in_flight_records` at a time.
//! It ends once Kafka acknowledged every record, or at the first record Kafka refuses (exit 1,
//! with how many were delivered before). It never touches the slot or the progress record, so it
//! runs beside a running Ferry.
//!
//! The time of a row: its transaction's commit time when `track_commit_timestamp` is on, else
//! the table's `outbox.timestamp_column`, else a `created_at` column (sql/outbox.sql's), which
//! `now()` fills with the time the transaction began. `--time-column` chooses.
//!
//! The SQL is built by pure functions ([`select_sql`], [`TimeSource::choose`]) tested below; the
//! driver ([`replay`]) only carries it out.

use std::collections::BTreeMap;
use std::process::ExitCode;

use ferry_router::row::SimpleRow;
use ferry_router::{OnError, Router};
use ferry_wal::slot::{self, quote_ident, TableColumn};
use futures_util::{pin_mut, TryStreamExt};

use crate::config::Config;
use crate::pipeline::PipelineSettings;
use crate::producer::{Producer, SendError};
use crate::stdio::{errln, outln};
use crate::telemetry::Metrics;
use crate::topics::Topics;

/// What `ferry replay` was asked for.
#[derive(Debug, Clone)]
pub struct ReplayArgs {
    /// Rows committed at or after this time (PostgreSQL's `timestamptz` input, e.g. RFC 3339).
    pub since: Option<String>,
    /// Rows committed before this time.
    pub until: Option<String>,
    /// An SQL condition on the table's columns, ANDed with the times.
    pub predicate: Option<String>,
    /// `schema.table`: only this outbox table (default: every configured one).
    pub table: Option<String>,
    /// The column that says when a row was committed.
    pub time_column: Option<String>,
    /// Route and count, produce nothing.
    pub dry_run: bool,
    /// With a time column (not the commit timestamp), how far `--since` moves back: such a
    /// column holds when the transaction began, earlier than its commit.
    pub margin: std::time::Duration,
}

impl Default for ReplayArgs {
    fn default() -> Self {
        ReplayArgs {
            since: None,
            until: None,
            predicate: None,
            table: None,
            time_column: None,
            dry_run: false,
            margin: DEFAULT_MARGIN,
        }
    }
}

/// `--margin`'s default: longer than any transaction an outbox writer should keep open.
pub const DEFAULT_MARGIN: std::time::Duration = std::time::Duration::from_secs(300);

/// What says when a row was committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimeSource {
    /// `pg_xact_commit_timestamp(xmin)`: the commit time itself (`track_commit_timestamp`);
    /// for rows committed before it was on (no timestamp kept), the column named here if any.
    CommitTimestamp { fallback: Option<String> },
    /// A `timestamptz` column. `created_at DEFAULT now()` holds when the transaction began, so
    /// `--since` moves back by `--margin` for it.
    Column(String),
    /// Nothing: rows only by `--where`, in table order.
    None,
}

/// `timestamptz`: a time column must say its zone (a `timestamp` would be read in the replay
/// session's zone, which need not be the writer's).
const TIMESTAMPTZ: u32 = 1184;
const TIMESTAMP: u32 = 1114;

impl TimeSource {
    /// The time of a row: `--time-column`, else the commit timestamp when PostgreSQL keeps it,
    /// else the configured timestamp column, else `created_at`. `Err` says why none fits when
    /// a time was asked for.
    pub fn choose(
        asked: Option<&str>,
        track_commit_timestamp: bool,
        configured: Option<&str>,
        columns: &[TableColumn],
        times_given: bool,
    ) -> Result<TimeSource, String> {
        let type_of = |name: &str| columns.iter().find(|c| c.name == name).map(|c| c.type_oid);
        if let Some(name) = asked {
            return match type_of(name) {
                Some(TIMESTAMPTZ) => Ok(TimeSource::Column(name.to_string())),
                Some(TIMESTAMP) => Err(format!(
                    "--time-column {name:?} is a timestamp without time zone: which instant it means depends on \
                     the writer's time zone, which Ferry cannot know; choose rows with --where \
                     (e.g. --where \"{name} >= '2026-11-26 07:00'\")"
                )),
                Some(_) => Err(format!("--time-column {name:?} is not a timestamptz column")),
                None => Err(format!("--time-column {name:?}: the table has no such column")),
            };
        }
        let column = configured
            .into_iter()
            .chain(["created_at"])
            .find(|name| type_of(name) == Some(TIMESTAMPTZ))
            .map(str::to_string);
        if track_commit_timestamp {
            return Ok(TimeSource::CommitTimestamp { fallback: column });
        }
        if let Some(c) = column {
            return Ok(TimeSource::Column(c));
        }
        if times_given {
            return Err(
                "cannot tell when its rows were committed: track_commit_timestamp is off and the table has no \
                 timestamptz column Ferry knows (outbox.timestamp_column, created_at). Name one with \
                 --time-column, or choose rows with --where"
                    .to_string(),
            );
        }
        Ok(TimeSource::None)
    }

    /// The SQL expression of a row's time (`timestamptz`).
    fn expr(&self) -> Option<String> {
        match self {
            TimeSource::CommitTimestamp { fallback: None } => {
                Some("pg_xact_commit_timestamp(xmin)".into())
            }
            TimeSource::CommitTimestamp { fallback: Some(c) } => Some(format!(
                "COALESCE(pg_xact_commit_timestamp(xmin), {})",
                quote_ident(c)
            )),
            TimeSource::Column(c) => Some(quote_ident(c)),
            TimeSource::None => None,
        }
    }

    /// Whether `--since` moves back by the margin: the time is not the commit's.
    fn needs_margin(&self) -> bool {
        matches!(self, TimeSource::Column(_))
    }
}

impl std::fmt::Display for TimeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TimeSource::CommitTimestamp { fallback: None } => {
                f.write_str("the commit timestamp (track_commit_timestamp)")
            }
            TimeSource::CommitTimestamp { fallback: Some(c) } => write!(
                f,
                "the commit timestamp (track_commit_timestamp), else column {c:?}"
            ),
            TimeSource::Column(c) => write!(f, "column {c:?}"),
            TimeSource::None => f.write_str("none (table order)"),
        }
    }
}

/// A column's value as pgoutput sends it in text mode: its type's output function (`format`'s
/// `%s`; a cast to text differs for some types, e.g. boolean `true` against `t`), NULL kept.
fn as_text(column: &str) -> String {
    let c = quote_ident(column);
    format!("CASE WHEN {c} IS NULL THEN NULL ELSE format('%s', {c}) END")
}

/// The query that reads the chosen rows of `schema.table`: the row's time in Unix microseconds
/// (NULL without a time source), then every column as text, in commit-time order. `$1` is
/// `since` and `$2` `until`, when given, in that order; with a time that is not the commit's,
/// the last parameter is the margin `--since` moves back by (an interval).
pub fn select_sql(
    schema: &str,
    table: &str,
    columns: &[TableColumn],
    time: &TimeSource,
    args: &ReplayArgs,
) -> String {
    let expr = time.expr();
    let when = match &expr {
        Some(e) => format!("(extract(epoch FROM {e}) * 1000000)::int8"),
        None => "NULL::int8".into(),
    };
    let mut select = vec![when];
    select.extend(columns.iter().map(|c| as_text(&c.name)));
    // Parameters: $1 since, then until, then the margin, each when given (see [`params`]).
    let mut n = 0;
    let mut next = || {
        n += 1;
        n
    };
    let since = args.since.as_ref().map(|_| next());
    let until = args.until.as_ref().map(|_| next());
    let margin = (since.is_some() && time.needs_margin()).then(&mut next);
    let mut conditions = Vec::new();
    if let Some(e) = &expr {
        if let Some(i) = since {
            let back = margin.map_or(String::new(), |m| format!(" - ${m}::text::interval"));
            conditions.push(format!("{e} >= ${i}::text::timestamptz{back}"));
        }
        if let Some(i) = until {
            conditions.push(format!("{e} < ${i}::text::timestamptz"));
        }
    }
    if let Some(p) = &args.predicate {
        conditions.push(format!("({p})"));
    }
    let filter = match conditions.is_empty() {
        true => String::new(),
        false => format!(" WHERE {}", conditions.join(" AND ")),
    };
    let order = match &expr {
        Some(e) => format!("{e}, ctid"),
        None => "ctid".into(),
    };
    format!(
        "SELECT {} FROM {}.{}{filter} ORDER BY {order}",
        select.join(", "),
        quote_ident(schema),
        quote_ident(table)
    )
}

/// The query's parameters, in [`select_sql`]'s order: since, until, the margin.
fn params(time: &TimeSource, args: &ReplayArgs) -> Vec<String> {
    let mut p: Vec<String> = args
        .since
        .iter()
        .chain(args.until.iter())
        .cloned()
        .collect();
    if args.since.is_some() && time.needs_margin() {
        p.push(format!("{} seconds", args.margin.as_secs()));
    }
    p
}

/// What one table's replay did.
#[derive(Debug, Default)]
struct Tally {
    rows: u64,
    /// Records acknowledged (or, in a dry run, routed), per topic.
    topics: BTreeMap<String, u64>,
    skipped: u64,
    dead_lettered: u64,
}

/// Why a replay stopped.
type Failure = (ExitCode, String);

/// `ferry replay`.
pub async fn replay(config: Config, args: ReplayArgs) -> Result<ExitCode, ExitCode> {
    let settings = PipelineSettings::from_config(&config).map_err(|e| {
        errln!("ferry: the configuration cannot be used:\n{e}");
        ExitCode::from(2)
    })?;
    if args.since.is_none() && args.until.is_none() && args.predicate.is_none() {
        errln!(
            "ferry replay: say which rows: --since <TIME> (rows committed from then on, e.g. the time a refusal \
             names), --until <TIME>, and/or --where <SQL condition>; --where true replays every row"
        );
        return Err(ExitCode::from(2));
    }
    match run(&settings, &args).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err((code, message)) => {
            errln!("ferry replay: {message}");
            Err(code)
        }
    }
}

async fn run(settings: &PipelineSettings, args: &ReplayArgs) -> Result<(), Failure> {
    let fail = |what: String| (ExitCode::from(1), what);
    let wanted = match &args.table {
        Some(t) => Some(
            t.parse::<ferry_router::config::TableName>()
                .map_err(|e| (ExitCode::from(2), format!("--table {t:?}: {e}")))?,
        ),
        None => None,
    };
    let chosen: Vec<(usize, &Router)> = settings
        .routers
        .iter()
        .enumerate()
        .filter(|(_, r)| wanted.as_ref().is_none_or(|w| r.table() == w))
        .collect();
    if chosen.is_empty() {
        let known: Vec<String> = settings.routers.tables().map(ToString::to_string).collect();
        return Err((
            ExitCode::from(2),
            format!(
                "--table {:?} is none of the configured outbox tables ({})",
                args.table.as_deref().unwrap_or_default(),
                known.join(", ")
            ),
        ));
    }
    let mut sql = slot::connect_sql(&settings.postgres)
        .await
        .map_err(|e| fail(format!("cannot connect to PostgreSQL: {e}")))?;
    // The text of every value as the replication connection gets it (ISO times in UTC, hex
    // bytea, round-tripping floats): the router reads what pgoutput would send.
    sql.batch_execute(&ferry_wal::conn::session_settings_sql())
        .await
        .map_err(|e| fail(format!("PostgreSQL: {e}")))?;
    let track: String = sql
        .query_one("SELECT current_setting('track_commit_timestamp')", &[])
        .await
        .map_err(|e| fail(format!("PostgreSQL: {e}")))?
        .get(0);
    let producer = match args.dry_run {
        true => None,
        false => {
            // Plain idempotent produce: no transaction (exactly-once's transactional.id is
            // the running Ferry's, which this must never fence).
            // No statistics either: the brokers' view is for a running relay's readiness.
            let properties: Vec<(String, String)> = settings
                .producer_properties
                .iter()
                .filter(|(k, _)| k != "transactional.id" && k != "statistics.interval.ms")
                .cloned()
                .chain([("statistics.interval.ms".to_string(), "0".to_string())])
                .collect();
            // Brokers that cannot be used are named now, with their fix, rather than after
            // the first record's delivery timeout.
            let probe_props = properties.clone();
            tokio::task::spawn_blocking(move || {
                crate::kafka_access::probe(&probe_props, crate::kafka_access::PROBE_DEADLINE)
            })
            .await
            .map_err(|e| fail(format!("the broker probe failed: {e}")))?
            .map_err(|e| fail(format!("cannot use the Kafka brokers: {e}")))?;
            Some(
                Producer::new(&properties, Topics::default(), Metrics::new(), None)
                    .map_err(|e| fail(format!("cannot create the Kafka producer: {e}")))?,
            )
        }
    };
    let mut producer = producer;
    for (i, router) in chosen {
        let spec = &settings.slot.tables[i];
        let name = router.table().to_string();
        let columns = slot::column_types(&sql, &spec.schema, &spec.table)
            .await
            .map_err(|e| fail(format!("PostgreSQL: {e}")))?;
        if columns.is_empty() {
            return Err(fail(format!("table {name} does not exist")));
        }
        let time = TimeSource::choose(
            args.time_column.as_deref(),
            track == "on",
            router.timestamp_column(),
            &columns,
            args.since.is_some() || args.until.is_some(),
        )
        .map_err(|e| (ExitCode::from(2), format!("table {name}: {e}")))?;
        if let TimeSource::CommitTimestamp { fallback: None } = &time {
            if args.since.is_some() || args.until.is_some() {
                unstamped(&sql, &spec.schema, &spec.table, args).await?;
            }
        }
        let query = select_sql(&spec.schema, &spec.table, &columns, &time, args);
        let tally = replay_table(
            &mut sql,
            router,
            &columns,
            (&query, &params(&time, args)),
            args,
            producer.as_mut(),
            settings.max_in_flight_records.max(1),
        )
        .await
        .map_err(|(code, e)| (code, format!("table {name}: {e}")))?;
        let verb = if args.dry_run { "would send" } else { "sent" };
        let margin = match time.needs_margin() && args.since.is_some() {
            true => format!(
                ", which holds when a transaction began: --since moved back by --margin {}s",
                args.margin.as_secs()
            ),
            false => String::new(),
        };
        outln!(
            "{name}: {} rows (time: {time}{margin}); {verb} {} records{}{}",
            tally.rows,
            tally.topics.values().sum::<u64>(),
            match tally.skipped {
                0 => String::new(),
                n => format!(", skipped {n} (route.on_error)"),
            },
            match tally.dead_lettered {
                0 => String::new(),
                n => format!(", dead-lettered {n}"),
            },
        );
        for (topic, n) in &tally.topics {
            outln!("  {topic}: {n}");
        }
    }
    Ok(())
}

/// Streams one table's chosen rows, routes each, and produces the records, waiting for every
/// acknowledgement.
async fn replay_table(
    sql: &mut tokio_postgres::Client,
    router: &Router,
    columns: &[TableColumn],
    (query, params): (&str, &[String]),
    args: &ReplayArgs,
    mut producer: Option<&mut (Producer, crate::producer::Reports)>,
    window: usize,
) -> Result<Tally, Failure> {
    let fail = |what: String| (ExitCode::from(1), what);
    let txn = sql
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(|e| fail(format!("PostgreSQL: {e}")))?;
    let rows = txn
        .query_raw(query, params.iter())
        .await
        .map_err(|e| select_error(&e, args))?;
    pin_mut!(rows);
    let mut tally = Tally::default();
    let mut topics_of: Vec<String> = Vec::new();
    let mut in_flight = 0usize;
    let now_micros = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64)
    };
    while let Some(row) = rows.try_next().await.map_err(|e| select_error(&e, args))? {
        tally.rows += 1;
        let micros: Option<i64> = row.get(0);
        let mut outbox = SimpleRow::new();
        for (i, c) in columns.iter().enumerate() {
            let value: Option<String> = row.get(i + 1);
            outbox.push(&c.name, c.type_oid, value.map(bytes::Bytes::from));
        }
        let at = micros.unwrap_or_else(now_micros);
        let record = match router.route_row(&outbox, at) {
            Ok(record) => record,
            Err(e) => match router.on_error() {
                OnError::Skip => {
                    errln!("ferry replay: skipped (route.on_error = \"skip\"): {e}");
                    tally.skipped += 1;
                    continue;
                }
                OnError::DeadLetter => match router.dead_letter(&outbox, &e, at) {
                    Some(record) => {
                        tally.dead_lettered += 1;
                        record
                    }
                    None => return Err(fail(format!("{e}; and no dead-letter record could be made"))),
                },
                OnError::Fail => {
                    return Err(fail(format!(
                        "{e}. Nothing after it was sent (route.on_error = \"fail\"); leave the row out with \
                         --where (e.g. --where \"id <> '...'\"), or set route.on_error"
                    )))
                }
            },
        };
        let Some((p, reports)) = producer.as_deref_mut() else {
            *tally.topics.entry(record.topic.to_string()).or_default() += 1;
            continue;
        };
        while in_flight >= window {
            take_report(reports, &topics_of, &mut tally).await?;
            in_flight -= 1;
        }
        let key = topics_of.len();
        topics_of.push(record.topic.to_string());
        match p.send(&record, key) {
            Ok(()) => in_flight += 1,
            Err(SendError::QueueFull) => {
                return Err(fail("librdkafka's queue is full (kafka.properties lowered its limits below the in-flight window)".into()))
            }
            Err(SendError::Refused(e)) => {
                return Err(fail(format!("Kafka refused a record for topic {:?}: {e}", record.topic)))
            }
        }
    }
    if let Some((_, reports)) = producer {
        while in_flight > 0 {
            take_report(reports, &topics_of, &mut tally).await?;
            in_flight -= 1;
        }
    }
    txn.commit()
        .await
        .map_err(|e| fail(format!("PostgreSQL: {e}")))?;
    Ok(tally)
}

/// Waits for one delivery report; a failed one ends the replay.
async fn take_report(
    reports: &mut crate::producer::Reports,
    topics_of: &[String],
    tally: &mut Tally,
) -> Result<(), Failure> {
    let delivered = tally.topics.values().sum::<u64>();
    let Some(d) = reports.recv().await else {
        return Err((ExitCode::from(1), "the producer stopped".into()));
    };
    let topic = topics_of.get(d.key).cloned().unwrap_or_default();
    match d.result {
        Ok(_) => {
            *tally.topics.entry(topic).or_default() += 1;
            Ok(())
        }
        Err(e) => Err((
            ExitCode::from(1),
            format!(
                "Kafka did not accept a record for topic {topic:?}: {e} ({delivered} records were acknowledged \
                 before; running the same replay again sends them again, which consumers deduplicate on the id header)"
            ),
        )),
    }
}

/// Rows of the chosen ones that have no commit timestamp (committed before
/// `track_commit_timestamp` was on, or too long ago) are never chosen by time: said, counted.
async fn unstamped(
    sql: &tokio_postgres::Client,
    schema: &str,
    table: &str,
    args: &ReplayArgs,
) -> Result<(), Failure> {
    let query = format!(
        "SELECT count(*) FROM {}.{} WHERE pg_xact_commit_timestamp(xmin) IS NULL{}",
        quote_ident(schema),
        quote_ident(table),
        args.predicate
            .as_ref()
            .map_or(String::new(), |p| format!(" AND ({p})"))
    );
    let n: i64 = sql
        .query_one(&query, &[])
        .await
        .map_err(|e| select_error(&e, args))?
        .get(0);
    if n > 0 {
        errln!(
            "ferry replay: {n} rows of {schema}.{table} have no commit timestamp (committed before \
             track_commit_timestamp was on, or so long ago that PostgreSQL no longer keeps it): --since/--until \
             cannot choose them; name a timestamptz column with --time-column, or choose them with --where"
        );
    }
    Ok(())
}

/// The query's error, as the operator who wrote `--since`/`--until`/`--where` reads it: exit 2
/// for what they wrote (a value PostgreSQL cannot read, a condition it cannot run), 1 for
/// anything else (the connection lost).
fn select_error(e: &tokio_postgres::Error, args: &ReplayArgs) -> Failure {
    let theirs = e
        .code()
        .is_some_and(|c| c.code().starts_with("22") || c.code().starts_with("42"));
    let code = ExitCode::from(if theirs { 2 } else { 1 });
    (code, select_message(e, args))
}

fn select_message(e: &tokio_postgres::Error, args: &ReplayArgs) -> String {
    let server = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| e.to_string());
    let mut hints = Vec::new();
    if server.contains("timestamp") || server.contains("date/time") {
        hints.push(format!(
            "--since/--until take a time PostgreSQL can read, with its zone, e.g. 2026-11-26T07:12:03Z (given: {})",
            [args.since.as_deref(), args.until.as_deref()]
                .into_iter()
                .flatten()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if let Some(p) = &args.predicate {
        hints.push(format!(
            "--where {p:?} is ANDed to the query as SQL on the table's columns"
        ));
    }
    match hints.is_empty() {
        true => format!("PostgreSQL refused the query: {server}"),
        false => format!(
            "PostgreSQL refused the query: {server}; {}",
            hints.join("; ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, type_oid: u32) -> TableColumn {
        TableColumn {
            name: name.into(),
            type_oid,
            type_name: String::new(),
        }
    }

    fn outbox() -> Vec<TableColumn> {
        vec![
            col("id", 2950),
            col("aggregateid", 25),
            col("payload", 3802),
            col("created_at", 1184),
            col("local_time", 1114),
        ]
    }

    #[test]
    fn the_time_of_a_row_is_the_commit_timestamp_first_then_the_columns() {
        let c = outbox();
        let choose = |asked, track, configured, times| {
            TimeSource::choose(asked, track, configured, &c, times)
        };
        assert_eq!(
            choose(None, true, None, true),
            Ok(TimeSource::CommitTimestamp {
                fallback: Some("created_at".into())
            })
        );
        assert_eq!(
            choose(None, false, None, true),
            Ok(TimeSource::Column("created_at".into()))
        );
        assert_eq!(
            choose(Some("created_at"), true, None, true),
            Ok(TimeSource::Column("created_at".into()))
        );
        assert!(choose(Some("payload"), true, None, true)
            .unwrap_err()
            .contains("not a timestamptz"));
        assert!(choose(Some("local_time"), true, None, true)
            .unwrap_err()
            .contains("without time zone"));
        assert!(choose(Some("nope"), true, None, true)
            .unwrap_err()
            .contains("no such column"));
        let bare = vec![col("id", 2950)];
        assert_eq!(
            TimeSource::choose(None, true, None, &bare, true),
            Ok(TimeSource::CommitTimestamp { fallback: None })
        );
        assert!(TimeSource::choose(None, false, None, &bare, true)
            .unwrap_err()
            .contains("--time-column"));
        assert_eq!(
            TimeSource::choose(None, false, None, &bare, false),
            Ok(TimeSource::None)
        );
    }

    #[test]
    fn the_query_reads_every_value_as_pgoutput_writes_it_in_commit_order() {
        let args = ReplayArgs {
            since: Some("2026-11-26T07:00:00Z".into()),
            until: Some("2026-11-26T08:00:00Z".into()),
            predicate: Some("aggregatetype = 'order'".into()),
            ..ReplayArgs::default()
        };
        let exact = TimeSource::CommitTimestamp { fallback: None };
        let q = select_sql("public", "outbox", &outbox()[..2], &exact, &args);
        assert_eq!(
            q,
            "SELECT (extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000000)::int8, \
             CASE WHEN \"id\" IS NULL THEN NULL ELSE format('%s', \"id\") END, \
             CASE WHEN \"aggregateid\" IS NULL THEN NULL ELSE format('%s', \"aggregateid\") END \
             FROM \"public\".\"outbox\" \
             WHERE pg_xact_commit_timestamp(xmin) >= $1::text::timestamptz AND \
             pg_xact_commit_timestamp(xmin) < $2::text::timestamptz AND (aggregatetype = 'order') \
             ORDER BY pg_xact_commit_timestamp(xmin), ctid"
        );
        assert_eq!(
            params(&exact, &args),
            ["2026-11-26T07:00:00Z", "2026-11-26T08:00:00Z"]
        );
        // A column holds when the transaction began: --since moves back by the margin ($3).
        let column = TimeSource::Column("created_at".into());
        let q = select_sql("s", "t", &outbox(), &column, &args);
        assert!(
            q.contains(
                "WHERE \"created_at\" >= $1::text::timestamptz - $3::text::interval AND \"created_at\" < \
                 $2::text::timestamptz AND"
            ),
            "{q}"
        );
        assert!(q.ends_with("ORDER BY \"created_at\", ctid"), "{q}");
        assert_eq!(params(&column, &args)[2], "300 seconds");
        let fallback = TimeSource::CommitTimestamp {
            fallback: Some("created_at".into()),
        };
        let q = select_sql("s", "t", &outbox(), &fallback, &args);
        assert!(
            q.contains("COALESCE(pg_xact_commit_timestamp(xmin), \"created_at\") >= $1::text::timestamptz AND"),
            "{q}"
        );
        let by_where = ReplayArgs {
            predicate: Some("true".into()),
            ..ReplayArgs::default()
        };
        let q = select_sql("s", "t", &outbox(), &TimeSource::None, &by_where);
        assert!(q.starts_with("SELECT NULL::int8, "), "{q}");
        assert!(q.ends_with("WHERE (true) ORDER BY ctid"), "{q}");
        assert!(params(&TimeSource::None, &by_where).is_empty());
    }
}
