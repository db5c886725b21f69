//! `ferry check` and `ferry status`: what an operator runs before and while Ferry runs.
//!
//! `check` lists every problem it finds, each with its fix, and exits 1 if any is an error.
//! It never creates anything. It checks what `ferry run` would find: the columns the router
//! reads (with their types), and one sample row per aggregate type routed as `run` would route
//! it, so a row `run` would stop at is an error here, named by its id.

use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use ferry_router::SimpleRow;
use ferry_wal::conn::ReaderError;
use ferry_wal::slot::{self, Problem, Severity};
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseProducer, Producer as _};

use crate::config::Config;
use crate::kafka_client::{self, Role};
use crate::pipeline::start::{FactsError, Reading, StartFacts};
use crate::pipeline::{binary, PipelineSettings};
use crate::stdio::{errln, outln};
use ferry_core::verdict;

/// How long `check` waits for the brokers.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);
/// Most rows `check` routes: one per distinct aggregate type (and topic column values).
const SAMPLE_ROWS: i64 = 100;
/// Longest the sampling query may run (it reads the whole outbox table to find its distinct
/// aggregate types).
const SAMPLE_TIMEOUT: &str = "10s";

/// `ferry check`.
pub async fn check(config: Config) -> Result<ExitCode, ExitCode> {
    let settings = match PipelineSettings::from_config(&config) {
        Ok(s) => s,
        Err(e) => {
            errln!("ferry: the configuration cannot be used:\n{e}");
            return Err(ExitCode::from(2));
        }
    };
    let mut problems: Vec<Problem> = Vec::new();
    let mut topics: Vec<String> = Vec::new();

    outln!("PostgreSQL {}", settings.postgres);
    let mut found: Vec<Problem> = Vec::new();
    match slot::connect_sql(&settings.postgres).await {
        Err(e) => found.push(error(
            format!("cannot connect to PostgreSQL: {e}"),
            match &e {
                // A privilege the role lacks (CONNECT): the server's refusal carries the GRANT.
                ferry_wal::conn::ReaderError::Server(s) if s.code == "42501" => s.hint.as_deref(),
                _ => None,
            }
            .unwrap_or("check postgres.url (host, port, user, password, sslmode) and that the server accepts the connection (pg_hba.conf)"),
        )),
        Ok(sql) => {
            // A server that stops answering (gone, or a lock it waits on) is said, not waited
            // for: within postgres.receive_timeout, as a session's set-up queries are.
            let inspected = async {
                match slot::check(&sql, &settings.slot).await {
                    Ok(p) => found.extend(p),
                    Err(e) => found.push(error(format!("cannot inspect the database: {e}"), "see the error")),
                }
                if let Ok(mode) = binary::decide(&sql, &settings).await {
                    let what = match mode {
                        binary::Mode::Binary => "values will stream in pgoutput's binary mode (bytea read raw, not as hex text)".to_string(),
                        binary::Mode::Text(why) => format!("values will stream as text: {why}"),
                    };
                    found.push(Problem { severity: Severity::Note, what, fix: "none needed (postgres.binary chooses)".into() });
                }
                let sample = sample_rows(&sql, &settings, &config).await;
                topics = sample.topics;
                found.extend(sample.problems);
                Ok::<_, ferry_wal::conn::ReaderError>(())
            };
            let within = settings.stream.receive_timeout;
            if ferry_wal::conn::answered(within, "the checks' queries", inspected).await.is_err() {
                // What it waited on, still running on the server, is cancelled.
                slot::cancel_sql(&settings.postgres, &sql.cancel_token()).await;
                found.push(error(
                    format!(
                        "cannot inspect the database: the server did not answer within {:?} (postgres.receive_timeout)",
                        within.unwrap_or_default()
                    ),
                    "the server stopped answering (down, unreachable, or a query waiting on a lock: see pg_stat_activity); run the check again once it answers",
                ));
            }
        }
    }
    // Asked now, printed in their own sections below: the slot's line must agree with the
    // progress record, which is read only from brokers that can be used.
    let kafka = kafka_topics(&settings).await;
    let progress = match kafka.is_ok() {
        true => progress_problems(&settings).await,
        false => ProgressFindings {
            problems: vec![Problem {
                severity: Severity::Note,
                what: "not compared with the slot: the brokers cannot be used (see Kafka above)"
                    .into(),
                fix: "fix the brokers first; `ferry run` makes the comparison at every start"
                    .into(),
            }],
            slot_lost: None,
        },
    };
    if let Some(remembered) = progress.slot_lost {
        slot_lost(&mut found, &settings.slot.slot, remembered);
    }
    print_problems(&found);
    problems.append(&mut found);

    outln!("Kafka {}", brokers(&settings));
    match kafka {
        Err(p) => found.extend(p),
        Ok((existing, auto_create, txn_max_timeout)) => {
            if let Some(eo) = &settings.exactly_once {
                found.extend(exactly_once(&settings, eo, &existing, txn_max_timeout).await);
            }
            for t in topics.iter().filter(|t| !existing.contains(t)) {
                let (severity, fix) = match auto_create {
                    _ if settings.create_topics.enabled => (Severity::Note, "none needed: Ferry creates it (route.create_topics)"),
                    Some(true) => (Severity::Note, "none needed: the brokers create it on first use (auto.create.topics.enable), with their default partition count"),
                    Some(false) => (Severity::Error, "create it (kafka-topics.sh --create --topic ...), or set route.create_topics.enabled = true so Ferry creates the topics it routes to; until then its records wait and nothing past them is confirmed"),
                    None => (Severity::Warning, "create it, unless the brokers auto-create topics (auto.create.topics.enable), or set route.create_topics.enabled = true"),
                };
                found.push(Problem {
                    severity,
                    what: format!("topic {t:?} (where current outbox rows route) does not exist"),
                    fix: fix.into(),
                });
            }
        }
    }
    print_problems(&found);
    problems.append(&mut found);

    outln!(
        "Progress (kafka.progress_topic {:?})",
        settings.progress_topic
    );
    found.extend(progress.problems);
    print_problems(&found);
    problems.append(&mut found);

    let count = |s: Severity| problems.iter().filter(|p| p.severity == s).count();
    let errors = count(Severity::Error);
    if errors == 0 {
        outln!(
            "OK: Ferry can run ({} warning(s))",
            count(Severity::Warning)
        );
        Ok(ExitCode::SUCCESS)
    } else {
        outln!("{errors} problem(s) must be fixed before Ferry can run");
        Err(ExitCode::from(1))
    }
}

/// A missing slot whose progress record says Ferry streamed from it is not one to create: `run`
/// refuses (events may be lost), so the slot's line says so and points at the Progress
/// section's fix, instead of "none needed: Ferry creates it" (or creating it by hand, which
/// `run` refuses too: a new slot is past the record).
fn slot_lost(found: &mut [Problem], slot: &str, remembered: ferry_wal::Lsn) {
    let missing = format!("replication slot {slot:?} does not exist");
    for p in found.iter_mut().filter(|p| p.what == missing) {
        if p.severity != Severity::Error {
            p.severity = Severity::Warning;
        }
        p.what = format!(
            "{missing}, but its progress record says Ferry streamed from it (to {remembered}): it was dropped"
        );
        p.fix = "do not create it by hand: `ferry run` refuses to start from a new slot until the gap is dealt with; \
                 see the Progress section below (events may be lost) for what to do"
            .into();
    }
}

pub(crate) fn print_problems(problems: &[Problem]) {
    for p in problems {
        let tag = match p.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        };
        outln!("  {tag}: {}\n    fix: {}", p.what, p.fix);
    }
}

fn error(what: String, fix: &str) -> Problem {
    Problem {
        severity: Severity::Error,
        what,
        fix: fix.into(),
    }
}

fn brokers(settings: &PipelineSettings) -> String {
    settings
        .producer_properties
        .iter()
        .find(|(k, _)| k == "bootstrap.servers")
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

/// What routing the sampled rows found: the topics they go to, and a problem per row that
/// cannot be routed.
struct Sample {
    topics: Vec<String>,
    problems: Vec<Problem>,
}

/// Samples every outbox table ([`sample_table`]); a table that cannot be read is a problem of its
/// own, and the others are still sampled.
async fn sample_rows(
    sql: &tokio_postgres::Client,
    settings: &PipelineSettings,
    config: &Config,
) -> Sample {
    let mut all = Sample {
        topics: Vec::new(),
        problems: Vec::new(),
    };
    let outboxes = std::iter::once(&config.outbox).chain(config.tables.iter().map(|t| &t.outbox));
    let several = settings.slot.tables.len() > 1;
    for (i, ((router, table), outbox)) in settings
        .routers
        .iter()
        .zip(&settings.slot.tables)
        .zip(outboxes)
        .enumerate()
    {
        let prefix = ferry_router::tables::key_prefix(i);
        match sample_table(
            sql,
            router,
            table,
            outbox,
            several,
            &prefix,
            &settings.slot.slot,
        )
        .await
        {
            Ok(sample) => {
                for t in sample.topics {
                    if !all.topics.contains(&t) {
                        all.topics.push(t);
                    }
                }
                all.problems.extend(sample.problems);
            }
            Err(p) => all.problems.push(p),
        }
    }
    all
}

/// Routes one row per distinct aggregate type (and per distinct value of the other columns the
/// topic depends on), at most [`SAMPLE_ROWS`], to learn the topics they need and whether each
/// can be routed at all. `several`: name the table in messages; `prefix`: its keys'. A row that
/// cannot be routed is an error only if slot `slot_name` has not passed it (else a note).
async fn sample_table(
    sql: &tokio_postgres::Client,
    router: &ferry_router::Router,
    spec: &slot::TableSpec,
    outbox: &ferry_router::OutboxConfig,
    several: bool,
    prefix: &str,
    slot_name: &str,
) -> Result<Sample, Problem> {
    let table = spec.qualified();
    let slot_name = slot_name.to_string();
    let Ok(columns) = slot::column_types(sql, &spec.schema, &spec.table).await else {
        return Ok(Sample {
            topics: Vec::new(),
            problems: Vec::new(),
        });
    };
    if columns.is_empty() {
        // The missing table is reported by slot::check.
        return Ok(Sample {
            topics: Vec::new(),
            problems: Vec::new(),
        });
    }
    let has = |c: &str| columns.iter().any(|t| t.name == c);
    let select = columns
        .iter()
        .map(|c| format!("{}::text", slot::quote_ident(&c.name)))
        .collect::<Vec<_>>()
        .join(", ");
    // One row per combination of the columns that choose the topic, plus the aggregate type.
    let mut distinct: Vec<&str> = vec![outbox.aggregate_type_column.as_str()];
    distinct.extend(router.topic_columns().iter().map(String::as_str));
    distinct.sort_unstable();
    distinct.dedup();
    distinct.retain(|c| has(c));
    // Whether the slot has passed the row: its transaction is older than the slot's
    // catalog_xmin, so it finished before the slot's restart position and `run` never reads it
    // again. Conservative: a row committed just before the slot's position may still count as
    // not passed (catalog_xmin follows the confirmed position at the server's running-xacts
    // records). Without a slot, no row is passed. Rows not passed are sampled first.
    let passed = "age(xmin) > coalesce((SELECT age(catalog_xmin) FROM pg_replication_slots \
                  WHERE slot_name = $1), 2147483647)";
    let query = if distinct.is_empty() {
        format!("SELECT {select}, {passed} AS passed FROM {table} ORDER BY passed LIMIT 1")
    } else {
        let on = distinct
            .iter()
            .map(|c| slot::quote_ident(c))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "SELECT DISTINCT ON ({on}) {select}, {passed} AS passed FROM {table} \
             ORDER BY {on}, passed LIMIT {SAMPLE_ROWS}"
        )
    };
    let cannot_read = |e: tokio_postgres::Error| {
        let timed_out = e.code().is_some_and(|c| c.code() == "57014");
        Problem {
            severity: Severity::Warning,
            what: format!(
                "cannot read {table} to learn its topics: {}",
                slot::sql_error(e)
            ),
            fix: if timed_out {
                format!(
                    "the outbox holds too many rows to find its aggregate types within {SAMPLE_TIMEOUT}: \
                     delete relayed rows (Ferry reads the WAL, not the table), then run check again"
                )
            } else {
                "GRANT SELECT ON the outbox to Ferry's role (sql/role.sql) so check can verify topics"
                    .into()
            },
        }
    };
    let rows = match sql
        .simple_query(&format!(
            "BEGIN READ ONLY; SET LOCAL statement_timeout = '{SAMPLE_TIMEOUT}'"
        ))
        .await
    {
        Ok(_) => {
            let rows = sql.query(&query, &[&slot_name]).await;
            let _ = sql.simple_query("ROLLBACK").await;
            rows.map_err(cannot_read)?
        }
        Err(e) => return Err(cannot_read(e)),
    };
    let id_index = columns.iter().position(|c| c.name == outbox.id_column);
    let type_index = columns
        .iter()
        .position(|c| c.name == outbox.aggregate_type_column);
    let mut sample = Sample {
        topics: Vec::new(),
        problems: Vec::new(),
    };
    for r in rows {
        let mut row = SimpleRow::new();
        for (i, c) in columns.iter().enumerate() {
            let v: Option<String> = r.get(i);
            row.push(&c.name, c.type_oid, v.map(Bytes::from));
        }
        let passed: bool = r.get(columns.len());
        match router.route_row(&row, 0) {
            Ok(record) => {
                if !sample.topics.iter().any(|t| **t == *record.topic) {
                    sample.topics.push(record.topic.to_string());
                }
            }
            // A column the configuration names that the table lacks: one configuration problem,
            // reported by slot::check with the nearest column, not one per sampled row.
            Err(e)
                if matches!(
                    e.reason,
                    ferry_router::RouteErrorReason::MissingColumn { .. }
                ) => {}
            Err(e) => {
                let text = |i: Option<usize>| {
                    i.and_then(|i| r.get::<_, Option<String>>(i))
                        .unwrap_or_else(|| "NULL".into())
                };
                let (severity, consequence) = match router.on_error() {
                    ferry_router::OnError::Fail => (
                        Severity::Error,
                        format!("under {prefix}route.on_error = \"fail\" `ferry run` stops at this row"),
                    ),
                    ferry_router::OnError::Skip => (
                        Severity::Warning,
                        format!("{prefix}route.on_error = \"skip\" will skip it"),
                    ),
                    ferry_router::OnError::DeadLetter => (
                        Severity::Warning,
                        format!("{prefix}route.on_error = \"dead_letter\" will send it to the dead-letter topic"),
                    ),
                };
                let of = if several {
                    format!("of {table} ")
                } else {
                    String::new()
                };
                if passed {
                    sample.problems.push(Problem {
                        severity: Severity::Note,
                        what: format!(
                            "outbox row {} {of}(aggregate type {:?}) cannot be routed, but the slot has already passed it: {}",
                            text(id_index),
                            text(type_index),
                            e.reason
                        ),
                        fix: "none needed: `ferry run` does not read it again (fix the writer if it still writes such rows)".into(),
                    });
                    continue;
                }
                sample.problems.push(Problem {
                    severity,
                    what: format!(
                        "outbox row {} {of}(aggregate type {:?}) cannot be routed: {}",
                        text(id_index),
                        text(type_index),
                        e.reason
                    ),
                    fix: format!(
                        "{consequence}; the row is committed, so changing it in the table changes nothing: \
                         pass it with the `ferry run --skip-event` / `--dead-letter-event` command that run's \
                         error prints, or change {prefix}route.on_error; then fix the writer (or the route \
                         configuration, if it is wrong)"
                    ),
                });
            }
        }
    }
    if let Some(dlq) = router.dead_letter_topic() {
        sample.topics.push(dlq.to_string());
    }
    Ok(sample)
}

/// What the progress topic remembers of the slot, compared with the slot as `ferry run` would.
struct Inspection {
    remembered: Option<ferry_wal::Lsn>,
    /// When that position was recorded (Unix milliseconds).
    written_unix_millis: Option<i64>,
    /// From when to replay should events after it be missing.
    replay_since: Option<verdict::ReplaySince>,
    verdict: verdict::Verdict,
    topic_exists: bool,
}

/// Reads the slot, then the progress topic, and asks the start-time verdict (at-least-once
/// mode, nothing accepted) what `ferry run` would do.
async fn inspect(
    settings: &PipelineSettings,
    sql: &tokio_postgres::Client,
) -> Result<Inspection, InspectError> {
    let facts = StartFacts::read(
        settings,
        sql,
        Reading::Read,
        crate::progress_topic::Until::Stable,
        KAFKA_TIMEOUT,
        false,
        std::future::ready(()),
    )
    .await
    .map(|(facts, _)| facts);
    if let Err(FactsError::Server(ReaderError::Unanswered { .. })) = &facts {
        // What it waited on, still running on the server, is cancelled.
        slot::cancel_sql(&settings.postgres, &sql.cancel_token()).await;
    }
    let facts = facts.map_err(|e| match e {
        // Said for a check, which neither takes the connection for lost nor reconnects.
        FactsError::Server(ReaderError::Unanswered { what, after }) => InspectError::Unknown(
            format!("the server did not answer {what} within {after:?} (postgres.receive_timeout)"),
        ),
        FactsError::Server(e) => InspectError::Unknown(e.to_string()),
        FactsError::Join(e) => InspectError::Unknown(e),
        FactsError::Topic(e) if e.is_transient() => InspectError::Unknown(e.to_string()),
        // A topic `ferry run` cannot use (more than one partition, an unreadable record).
        FactsError::Topic(e) => InspectError::Unusable(e.to_string()),
    })?;
    let remembered = &facts.remembered;
    let v = verdict::decide(&facts.input(
        &settings.slot.slot,
        ferry_core::progress_record::Mode::AtLeastOnce,
        verdict::Acceptance::default(),
    ));
    Ok(Inspection {
        remembered: remembered.this_system.as_ref().map(|r| r.end_lsn),
        written_unix_millis: remembered
            .this_system
            .as_ref()
            .map(|r| r.written_unix_millis),
        replay_since: remembered.replay_since(),
        verdict: v,
        topic_exists: facts.history.topic_exists,
    })
}

/// Why the slot could not be compared with its progress record.
enum InspectError {
    /// Something could not be asked (the brokers away, a query failed).
    Unknown(String),
    /// The progress topic is one `ferry run` stops at.
    Unusable(String),
}

impl From<String> for InspectError {
    fn from(e: String) -> Self {
        InspectError::Unknown(e)
    }
}

/// `check`'s findings about the progress record, and the remembered position when the slot is
/// gone (for the slot's line in the PostgreSQL section).
struct ProgressFindings {
    problems: Vec<Problem>,
    slot_lost: Option<ferry_wal::Lsn>,
}

/// `check`'s findings about the progress record: the remembered position against the slot.
async fn progress_problems(settings: &PipelineSettings) -> ProgressFindings {
    let only = |problems| ProgressFindings {
        problems,
        slot_lost: None,
    };
    let sql = match slot::connect_sql(&settings.postgres).await {
        Ok(sql) => sql,
        // Reported in the PostgreSQL section.
        Err(_) => return only(Vec::new()),
    };
    let inspection = match inspect(settings, &sql).await {
        Ok(i) => i,
        Err(InspectError::Unknown(e)) => {
            return only(vec![Problem {
                severity: Severity::Warning,
                what: format!("cannot compare the slot with its progress record: {e}"),
                fix: "see the error; `ferry run` makes the same comparison at every start".into(),
            }])
        }
        Err(InspectError::Unusable(e)) => {
            return only(vec![Problem {
                severity: Severity::Error,
                what: e,
                fix: "`ferry run` stops at it too; see the message".into(),
            }])
        }
    };
    let slot_lost = match &inspection.verdict {
        verdict::Verdict::Refuse {
            gap: verdict::Gap::SlotLost { remembered, .. },
            ..
        } => Some(*remembered),
        _ => None,
    };
    let mut found = Vec::new();
    if !inspection.topic_exists {
        found.push(Problem {
            severity: Severity::Note,
            what: format!("progress topic {:?} does not exist", settings.progress_topic),
            fix: format!(
                "none needed: `ferry run` creates it (1 partition, cleanup.policy=compact, segment.ms={}); \
                 if Ferry may not create topics, create it so",
                crate::progress_topic::SEGMENT_MS
            ),
        });
    }
    if inspection.topic_exists {
        found.push(keeping_problem(settings).await);
    }
    let slot = &settings.slot.slot;
    let (severity, what, fix) = match inspection.verdict {
        verdict::Verdict::CreateSlot => (
            Severity::Note,
            format!("no progress record for slot {slot:?} and no slot: a first start"),
            "none needed: `ferry run` creates the slot and remembers its position".to_string(),
        ),
        verdict::Verdict::Stream {
            notice: Some(verdict::Notice::NoRecord { confirmed }),
            ..
        } => (
            Severity::Warning,
            format!(
                "slot {slot:?} (at {confirmed}) has no progress record: created by hand, or used by a Ferry without progress records"
            ),
            "none needed: `ferry run` continues from the slot and writes progress records from then on".into(),
        ),
        verdict::Verdict::Stream { notice, .. } => {
            let remembered = inspection.remembered.map(|l| l.to_string()).unwrap_or_default();
            let timeline = match notice {
                Some(verdict::Notice::TimelineChanged { from, to }) => {
                    format!("; the server's timeline changed from {from} to {to} (a promoted standby)")
                }
                _ => String::new(),
            };
            (
                Severity::Note,
                format!(
                    "slot {slot:?} is at or behind its progress record ({remembered}): no gap{timeline}"
                ),
                "none needed".into(),
            )
        }
        verdict::Verdict::Refuse { gap, .. } | verdict::Verdict::Accepted { gap, .. } => {
            let what = format!("slot {slot:?}: events may be lost: {gap}");
            let refusal = verdict::Refusal {
                slot: slot.clone(),
                gap,
                offered: None,
                replay_since: inspection.replay_since,
            };
            (Severity::Error, what, refusal.action())
        }
    };
    found.push(Problem {
        severity,
        what,
        fix,
    });
    ProgressFindings {
        problems: found,
        slot_lost,
    }
}

/// Whether the progress topic keeps each slot's newest record, and little else
/// ([`crate::progress_topic::keeping`]).
async fn keeping_problem(settings: &PipelineSettings) -> Problem {
    let (properties, topic) = (&settings.producer_properties, &settings.progress_topic);
    let ferrys = format!(
        "cleanup.policy=compact, segment.ms={}",
        crate::progress_topic::SEGMENT_MS
    );
    let described = crate::progress_topic::describe_keeping(properties, topic, KAFKA_TIMEOUT)
        .await
        .map_err(|e| e.to_string())
        .and_then(|keeping| keeping.ok_or_else(|| {
            "the brokers' answer holds none of its settings (Ferry's principal may lack DescribeConfigs on the topic)"
                .to_string()
        }));
    match described {
        Ok(keeping) => match keeping.warning(topic) {
            Some(w) => Problem {
                severity: Severity::Warning,
                what: w.what.clone(),
                fix: w.fix(kafka_client::bootstrap_servers(properties), topic),
            },
            None => Problem {
                severity: Severity::Note,
                what: format!(
                    "progress topic {topic:?} keeps each slot's newest record (cleanup.policy={}, segment.ms={})",
                    keeping.cleanup_policy.unwrap_or_default(),
                    keeping.segment_ms.map_or("?".to_string(), |v| v.to_string()),
                ),
                fix: "none needed".into(),
            },
        },
        Err(e) => Problem {
            severity: Severity::Note,
            what: format!("cannot read the progress topic {topic:?}'s configuration: {e}"),
            fix: format!(
                "make sure it is {ferrys}, as Ferry creates it; DescribeConfigs on the topic lets `ferry check` and `ferry run` read it"
            ),
        },
    }
}

/// What exactly-once mode needs from Kafka: transactions (a transactional producer can be
/// initialised), a `transaction.max.timeout.ms` at or above what Ferry asks, the progress topic
/// (one partition), and consumers reading committed records only.
async fn exactly_once(
    settings: &PipelineSettings,
    eo: &crate::pipeline::settings::ExactlyOnce,
    existing: &[String],
    txn_max_timeout: Option<u64>,
) -> Vec<Problem> {
    let mut found = Vec::new();
    let asked = crate::config::defaults::TRANSACTION_TIMEOUT.as_millis() as u64;
    match txn_max_timeout {
        Some(max) if max < asked => found.push(error(
            format!("exactly-once: the brokers' transaction.max.timeout.ms is {max}, below the {asked} Ferry asks for (transaction.timeout.ms)"),
            "raise transaction.max.timeout.ms on the brokers (default 900000), or run without kafka.exactly_once",
        )),
        Some(max) => found.push(Problem {
            severity: Severity::Note,
            what: format!("exactly-once: Ferry asks transaction.timeout.ms = {asked}, the brokers allow up to {max} (transaction.max.timeout.ms)"),
            fix: "none needed".into(),
        }),
        None => found.push(Problem {
            severity: Severity::Warning,
            what: "exactly-once: the brokers did not say their transaction.max.timeout.ms".into(),
            fix: format!("make sure it is at least {asked} (Ferry's transaction.timeout.ms)"),
        }),
    }
    // Which APIs the brokers serve (issue 30): a broker can initialise a transactional producer
    // and still lack EndTxn, so initialising one proves too little.
    let (properties, topic) = (
        settings.producer_properties.clone(),
        settings.progress_topic.clone(),
    );
    let probe = tokio::task::spawn_blocking(move || {
        crate::txn_probe::probe(&properties, &topic, KAFKA_TIMEOUT)
    })
    .await;
    let names = crate::broker_apis::NEEDED.map(|n| n.name).join(", ");
    match probe {
        Ok(Ok(crate::broker_apis::Support::Supported)) => found.push(Problem {
            severity: Severity::Note,
            what: format!(
                "exactly-once: the brokers serve the transaction APIs Ferry uses ({names})"
            ),
            fix: "none needed".into(),
        }),
        Ok(Ok(crate::broker_apis::Support::Missing(missing))) => {
            found.push(error(
                crate::broker_apis::describe(&missing),
                crate::broker_apis::FIX,
            ));
            return found;
        }
        Ok(Ok(crate::broker_apis::Support::Unknown)) => found.push(Problem {
            severity: Severity::Warning,
            what: "exactly-once: could not read which APIs the brokers serve".into(),
            fix: format!("make sure they support Kafka transactions ({names})"),
        }),
        Ok(Err(e)) => found.push(Problem {
            severity: Severity::Warning,
            what: format!("exactly-once: could not ask the brokers which APIs they serve: {e}"),
            fix: format!("make sure they support Kafka transactions ({names})"),
        }),
        Err(e) => found.push(error(format!("API check failed: {e}"), "retry")),
    }
    // A throwaway transactional.id: initialising it fences nothing Ferry runs.
    let mut props = settings.producer_properties.clone();
    props.push((
        "transactional.id".into(),
        format!("ferry-check-{}", std::process::id()),
    ));
    let timeout = KAFKA_TIMEOUT;
    let init = tokio::task::spawn_blocking(move || {
        let p: BaseProducer = kafka_client::config(&props, Role::Verbatim).create()?;
        p.init_transactions(timeout)
    })
    .await;
    match init {
        Ok(Ok(())) => found.push(Problem {
            severity: Severity::Note,
            what: "exactly-once: a transactional producer initialises".into(),
            fix: "none needed".into(),
        }),
        Ok(Err(e)) => found.push(error(
            format!("exactly-once: cannot initialise a transactional producer: {e}"),
            "use brokers with transactions (Kafka 0.11+, with enough brokers for transaction.state.log.replication.factor), grant Ferry's principal WRITE and DESCRIBE on its transactional ids (prefix ferry-), or run without kafka.exactly_once",
        )),
        Err(e) => found.push(error(format!("transaction check failed: {e}"), "retry")),
    }
    let topic = &eo.progress_topic;
    if existing.iter().any(|t| t == topic) {
        found.push(Problem {
            severity: Severity::Note,
            what: format!("exactly-once: the progress topic {topic:?} exists"),
            fix: "none needed (Ferry checks at start that it has one partition)".into(),
        });
    } else {
        found.push(Problem {
            severity: Severity::Note,
            what: format!("exactly-once: the progress topic {topic:?} does not exist yet"),
            fix: "none needed if Ferry may create topics (it creates it with 1 partition, compacted); otherwise create it so".into(),
        });
    }
    found.push(Problem {
        severity: Severity::Note,
        what: "exactly-once: consumers see each event once only with isolation.level=read_committed".into(),
        fix: "set isolation.level=read_committed on every consumer (the Java client's default is read_uncommitted)".into(),
    });
    found
}

/// The topics the brokers know, whether they auto-create topics and their
/// `transaction.max.timeout.ms` (if they say); or why the brokers cannot be used, one problem
/// per cause.
async fn kafka_topics(
    settings: &PipelineSettings,
) -> Result<(Vec<String>, Option<bool>, Option<u64>), Vec<Problem>> {
    let props = settings.producer_properties.clone();
    let probe = tokio::task::spawn_blocking(move || {
        crate::kafka_access::probe(&props, crate::kafka_access::PROBE_DEADLINE)
    })
    .await
    .map_err(|e| vec![error(format!("broker probe failed: {e}"), "retry")])?;
    if let Err(unusable) = probe {
        return Err(unusable
            .diagnoses
            .iter()
            .map(|d| {
                let (what, fix) = d.what_and_fix();
                error(format!("cannot use the Kafka brokers: {what}"), fix)
            })
            .collect());
    }
    let producer: BaseProducer<crate::kafka_access::Observer> =
        kafka_client::config(&settings.producer_properties, Role::Verbatim)
            .create_with_context(crate::kafka_access::Observer)
            .map_err(|e| {
                vec![error(
                    format!("invalid Kafka client configuration: {e}"),
                    "check [kafka] properties",
                )]
            })?;
    let md = tokio::task::spawn_blocking(move || {
        let md = producer
            .client()
            .fetch_metadata(None, KAFKA_TIMEOUT)
            .map(|md| {
                (
                    md.topics().iter().map(|t| t.name().to_string()).collect::<Vec<_>>(),
                    md.brokers().first().map(|b| b.id()),
                )
            });
        // The client's errors and log lines (why no broker answered) reach the context only
        // when polled.
        if md.is_err() {
            // One event per poll (rust-rdkafka), a few dozen queued at most.
            producer.poll(Duration::from_millis(100));
            for _ in 0..100 {
                producer.poll(Duration::ZERO);
            }
        }
        md
    })
    .await
    .map_err(|e| vec![error(format!("metadata task failed: {e}"), "retry")])?
    .map_err(|e| match crate::kafka_access::take() {
        // Why, when a client said: the message carries its own fix.
        Some(d) => {
            let (what, fix) = d.what_and_fix();
            vec![error(format!("cannot use the Kafka brokers ({e}): {what}"), fix)]
        }
        None => vec![error(
            format!("cannot reach the Kafka brokers: {e}"),
            "check kafka.brokers, network access, and the security settings in [kafka.properties] (security.protocol, sasl.*, ssl.*)",
        )],
    })?;
    let (topics, broker) = md;
    let mut auto_create = None;
    let mut txn_max_timeout = None;
    if let Some(id) = broker {
        let cc = kafka_client::config(&settings.producer_properties, Role::Verbatim);
        if let Ok(admin) = cc.create::<AdminClient<DefaultClientContext>>() {
            let opts = AdminOptions::new().request_timeout(Some(KAFKA_TIMEOUT));
            if let Ok(res) = admin
                .describe_configs([&ResourceSpecifier::Broker(id)], &opts)
                .await
            {
                let entries: Vec<_> = res.into_iter().flatten().flat_map(|r| r.entries).collect();
                let value = |name: &str| {
                    entries
                        .iter()
                        .find(|e| e.name == name)
                        .and_then(|e| e.value.clone())
                };
                auto_create = value("auto.create.topics.enable").map(|v| v == "true");
                txn_max_timeout = value("transaction.max.timeout.ms").and_then(|v| v.parse().ok());
            }
        }
    }
    Ok((topics, auto_create, txn_max_timeout))
}

/// `ferry status --json`: one object, field names stable (scripts read them; README documents
/// them). LSNs are `X/X` strings as PostgreSQL prints them; sizes are numbers of bytes.
#[derive(Debug, serde::Serialize)]
struct StatusJson {
    slot: String,
    /// False when the slot does not exist (`ferry run` creates it); the fields below are then null.
    exists: bool,
    /// Whether a walsender streams the slot (a Ferry is running on it).
    active: Option<bool>,
    active_pid: Option<i32>,
    server_wal_lsn: Option<String>,
    confirmed_flush_lsn: Option<String>,
    /// Server WAL not yet confirmed by Ferry.
    lag_bytes: Option<u64>,
    restart_lsn: Option<String>,
    /// WAL the server keeps for this slot.
    retained_wal_bytes: Option<u64>,
    /// `pg_replication_slots.wal_status`: reserved, extended, unreserved or lost.
    wal_status: Option<String>,
    /// True when the slot was invalidated (`wal_status` = lost): see `ferry check`.
    invalidated: Option<bool>,
    /// The position Ferry remembers for this slot on this server (its progress record in
    /// `kafka.progress_topic`); null when there is none or Kafka cannot be read.
    progress_lsn: Option<String>,
    /// When that record was written (RFC 3339).
    progress_written_at: Option<String>,
    /// With a gap, the `--since` of the `ferry replay` that sends its events again (RFC 3339).
    replay_since: Option<String>,
    /// What `ferry run` would refuse at its start, if anything: `slot_lost`, `slot_ahead`,
    /// `slot_invalidated`, `server_changed` (see README, "When Ferry says events may be lost").
    gap: Option<&'static str>,
    /// The WAL that gap spans, where known.
    gap_bytes: Option<u64>,
}

/// `ferry status` (`json`: one JSON object instead of text). Exit 1 when the slot is missing or
/// invalidated, or PostgreSQL cannot be asked.
pub async fn status(config: Config, json: bool) -> Result<ExitCode, ExitCode> {
    let settings = PipelineSettings::from_config(&config).map_err(|e| {
        errln!("ferry: the configuration cannot be used:\n{e}");
        ExitCode::from(2)
    })?;
    // PostgreSQL cannot be asked: the reason on stderr, and with --json also as one object on
    // stdout (`{"slot": ..., "error": ...}`), so a script always reads JSON.
    let failed = |what: String| {
        errln!("ferry: {what}");
        if json {
            let report = serde_json::json!({ "slot": settings.slot.slot, "error": what });
            outln!(
                "{}",
                serde_json::to_string_pretty(&report).unwrap_or_default()
            );
        }
        ExitCode::from(1)
    };
    let sql = slot::connect_sql(&settings.postgres)
        .await
        .map_err(|e| failed(format!("cannot connect to PostgreSQL: {e}")))?;
    let state = slot::slot_state(&sql, &settings.slot.slot)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let current = slot::current_wal_lsn(&sql)
        .await
        .map_err(|e| failed(e.to_string()))?;
    // Kafka unreachable leaves the progress fields empty; status is about the slot first.
    let inspection = inspect(&settings, &sql).await.ok();
    let progress_lsn = inspection
        .as_ref()
        .and_then(|i| i.remembered)
        .map(|l| l.to_string());
    let progress_written_at = inspection
        .as_ref()
        .and_then(|i| i.written_unix_millis)
        .and_then(ferry_router::cloudevents::rfc3339_millis);
    let gap = inspection.as_ref().and_then(|i| match &i.verdict {
        verdict::Verdict::Refuse { gap, .. } => Some(gap.clone()),
        _ => None,
    });
    let replay_since = gap
        .as_ref()
        .and(inspection.as_ref())
        .and_then(|i| match i.replay_since? {
            verdict::ReplaySince::Bound(t) | verdict::ReplaySince::Written(t) => {
                ferry_router::cloudevents::rfc3339_millis(t)
            }
        });
    let name = settings.slot.slot.clone();
    let lost = state
        .as_ref()
        .is_some_and(|s| s.wal_status.as_deref() == Some("lost"));
    if json {
        let report = match &state {
            None => StatusJson {
                slot: name,
                exists: false,
                active: None,
                active_pid: None,
                server_wal_lsn: Some(current.to_string()),
                confirmed_flush_lsn: None,
                lag_bytes: None,
                restart_lsn: None,
                retained_wal_bytes: None,
                wal_status: None,
                invalidated: None,
                progress_lsn: progress_lsn.clone(),
                progress_written_at: progress_written_at.clone(),
                replay_since: replay_since.clone(),
                gap: gap.as_ref().map(|g| g.kind()),
                gap_bytes: gap.as_ref().and_then(|g| g.bytes()),
            },
            Some(s) => StatusJson {
                slot: name,
                exists: true,
                active: Some(s.active_pid.is_some()),
                active_pid: s.active_pid,
                server_wal_lsn: Some(current.to_string()),
                confirmed_flush_lsn: Some(s.confirmed_flush_lsn.to_string()),
                lag_bytes: Some(current.saturating_sub(s.confirmed_flush_lsn)),
                restart_lsn: Some(s.restart_lsn.to_string()),
                retained_wal_bytes: Some(current.saturating_sub(s.restart_lsn)),
                wal_status: s.wal_status.clone(),
                invalidated: Some(lost),
                progress_lsn: progress_lsn.clone(),
                progress_written_at: progress_written_at.clone(),
                replay_since: replay_since.clone(),
                gap: gap.as_ref().map(|g| g.kind()),
                gap_bytes: gap.as_ref().and_then(|g| g.bytes()),
            },
        };
        // Serializing plain strings and numbers cannot fail.
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        outln!("{text}");
        return if state.is_none() || lost || gap.is_some() {
            Err(ExitCode::from(1))
        } else {
            Ok(ExitCode::SUCCESS)
        };
    }
    let Some(state) = state else {
        match &gap {
            Some(g) => outln!("slot {name:?} does not exist, and Ferry streamed it before: {g}; run `ferry check`"),
            None => outln!("slot {name:?} does not exist (ferry run creates it)"),
        }
        return Err(ExitCode::from(1));
    };
    outln!("slot                 {name}");
    outln!(
        "streaming            {}",
        match state.active_pid {
            Some(pid) => format!("yes (walsender pid {pid})"),
            None => "no".into(),
        }
    );
    outln!("server WAL position  {current}");
    outln!("confirmed_flush_lsn  {}", state.confirmed_flush_lsn);
    outln!(
        "lag                  {} bytes (server WAL not yet confirmed by Ferry)",
        current.saturating_sub(state.confirmed_flush_lsn)
    );
    outln!("restart_lsn          {}", state.restart_lsn);
    outln!(
        "retained WAL         {} bytes (kept on the server for this slot)",
        current.saturating_sub(state.restart_lsn)
    );
    outln!(
        "wal_status           {}",
        state.wal_status.as_deref().unwrap_or("unknown")
    );
    outln!(
        "progress record      {}",
        match (&inspection, &progress_lsn) {
            (None, _) => "unknown (cannot read kafka.progress_topic)".to_string(),
            (Some(_), Some(l)) => format!(
                "{l} (written {}; the slot is never confirmed past it)",
                progress_written_at
                    .as_deref()
                    .unwrap_or("at an unknown time")
            ),
            (Some(_), None) => "none".to_string(),
        }
    );
    if lost {
        outln!("the slot was invalidated: run `ferry check` for what to do");
        return Err(ExitCode::from(1));
    }
    if let Some(g) = gap {
        outln!("events may be lost: {g}; run `ferry check` for what to do");
        if let Some(t) = &replay_since {
            outln!(
                "replay from          {t} (ferry replay --since {t}, after ferry run --accept-gap)"
            );
        }
        return Err(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
