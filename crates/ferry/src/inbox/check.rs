//! `ferry inbox check` and `ferry inbox status`: what an operator runs before and while the
//! inbox runs. `check` lists every problem with its fix and creates nothing; `status` says
//! where each partition is, how far behind, and what the tables hold.

use std::process::ExitCode;
use std::time::Duration;

use ferry_wal::slot::{Problem, Severity};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::TopicPartitionList;
use serde::Serialize;
use tokio_postgres::Client;

use super::store::describe;
use super::InboxSettings;
use crate::config::Config;
use crate::kafka_client::{self, Role};
use crate::stdio::{errln, outln};

const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

fn problem(severity: Severity, what: impl Into<String>, fix: impl Into<String>) -> Problem {
    Problem {
        severity,
        what: what.into(),
        fix: fix.into(),
    }
}

fn settings(config: &Config) -> Result<InboxSettings, ExitCode> {
    InboxSettings::from_config(config).map_err(|e| {
        errln!("ferry: the configuration cannot be used:\n{e}");
        ExitCode::from(2)
    })
}

/// `ferry inbox check`.
pub async fn check(config: Config) -> Result<ExitCode, ExitCode> {
    let s = settings(&config)?;
    let mut all = Vec::new();
    outln!("PostgreSQL {}", s.postgres);
    let found = match super::connect(&s.postgres).await {
        Err(e) => vec![problem(
            Severity::Error,
            e,
            "check postgres.url (host, port, user, password, sslmode) and that the server accepts the connection (pg_hba.conf)",
        )],
        Ok(sql) => database(&sql, &s).await,
    };
    crate::check::print_problems(&found);
    all.extend(found);

    outln!("Kafka {}", s.brokers);
    let found = kafka(&s).await;
    crate::check::print_problems(&found);
    all.extend(found);

    let errors = all.iter().filter(|p| p.severity == Severity::Error).count();
    if errors == 0 {
        outln!(
            "OK: the inbox can run ({} warning(s))",
            all.iter()
                .filter(|p| p.severity == Severity::Warning)
                .count()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        outln!("{errors} problem(s) must be fixed before the inbox can run");
        Err(ExitCode::from(1))
    }
}

async fn database(sql: &Client, s: &InboxSettings) -> Vec<Problem> {
    let t = &s.tables;
    let mut found = Vec::new();
    let missing = match t.missing(sql).await {
        Ok(m) => m,
        Err(e) => {
            return vec![problem(
                Severity::Error,
                format!("cannot look up the inbox's tables: {}", describe(&e)),
                "see the error",
            )]
        }
    };
    if !missing.is_empty() {
        let may_create: bool = sql
            .query_one("SELECT has_schema_privilege($1, 'CREATE')", &[&t.schema()])
            .await
            .map(|r| r.get(0))
            .unwrap_or(false);
        let what = format!("the inbox's tables {} do not exist", missing.join(", "));
        found.push(match (s.create_tables, may_create) {
            (true, true) => problem(Severity::Note, what, "none needed: `ferry inbox` creates them (inbox.create_tables)"),
            (true, false) => problem(
                Severity::Error,
                format!("{what}, and this role may not create tables in schema {:?}", t.schema()),
                format!("create them from sql/inbox.sql as a role that may, or GRANT CREATE ON SCHEMA {} TO <this role>", t.schema()),
            ),
            (false, _) => problem(Severity::Error, what, "create them from sql/inbox.sql (psql -f sql/inbox.sql), or set inbox.create_tables = true"),
        });
    }
    for table in t.all() {
        if missing.iter().any(|m| m == table) {
            continue;
        }
        let ok: bool = sql
            .query_one(
                "SELECT has_table_privilege($1::text::regclass, 'SELECT, INSERT, UPDATE, DELETE')",
                &[&table],
            )
            .await
            .map(|r| r.get(0))
            .unwrap_or(false);
        if !ok {
            found.push(problem(
                Severity::Error,
                format!("this role lacks SELECT, INSERT, UPDATE or DELETE on {table}"),
                format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO <this role>"),
            ));
        }
    }
    if missing.is_empty() {
        let ty: Option<String> = sql
            .query_opt(
                "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = $1::text::regclass AND attname = 'payload' AND NOT attisdropped",
                &[&t.inbox],
            )
            .await
            .ok()
            .flatten()
            .map(|r| r.get(0));
        let want = t.payload.sql();
        match ty {
            Some(ty) if ty == want => {}
            Some(ty) => found.push(problem(
                Severity::Error,
                format!("{}.payload is {ty}, but inbox.payload_type is {want:?}", t.inbox),
                format!("set inbox.payload_type = \"{ty}\" if it is jsonb, text or bytea, or ALTER TABLE {} ALTER COLUMN payload TYPE {want} USING ...", t.inbox),
            )),
            None => found.push(problem(
                Severity::Error,
                format!("{} has no payload column", t.inbox),
                "create the table as sql/inbox.sql does",
            )),
        }
    }
    found
}

fn consumer(s: &InboxSettings) -> Result<BaseConsumer, KafkaError> {
    let mut cc = kafka_client::config(&s.kafka, Role::InboxConsumer);
    cc.set("group.id", &s.group);
    cc.create()
}

async fn kafka(s: &InboxSettings) -> Vec<Problem> {
    let topics = s.topics.clone();
    let c = match consumer(s) {
        Ok(c) => c,
        Err(e) => {
            return vec![problem(
                Severity::Error,
                format!("cannot create a Kafka consumer: {e}"),
                "check [kafka] properties",
            )]
        }
    };
    let group = s.group.clone();
    tokio::task::spawn_blocking(move || {
        let mut found = Vec::new();
        let md = match c.fetch_metadata(None, KAFKA_TIMEOUT) {
            Ok(md) => md,
            Err(e) => {
                return vec![problem(
                    Severity::Error,
                    format!("the brokers do not answer: {e}"),
                    "check kafka.brokers, the network, and kafka.properties (security.protocol, sasl.*)",
                )]
            }
        };
        let mut tpl = TopicPartitionList::new();
        for t in &topics {
            match md.topics().iter().find(|m| m.name() == t) {
                None => found.push(problem(
                    Severity::Error,
                    format!("topic {t:?} does not exist (or this principal may not describe it)"),
                    format!("create it, or grant DESCRIBE and READ on topic {t:?}; the inbox waits for it until then"),
                )),
                Some(m) if m.error().is_some() => found.push(problem(
                    Severity::Error,
                    format!("topic {t:?}: {:?}", m.error()),
                    format!("grant DESCRIBE and READ on topic {t:?} to this principal"),
                )),
                Some(m) => {
                    for p in m.partitions() {
                        tpl.add_partition(t, p.id());
                    }
                }
            }
        }
        if tpl.count() > 0 {
            match c.committed_offsets(tpl, KAFKA_TIMEOUT) {
                Ok(_) => {}
                Err(e) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::GroupAuthorizationFailed) => {
                    found.push(problem(
                        Severity::Error,
                        format!("this principal may not use consumer group {group:?}"),
                        format!("grant READ on group {group:?} (kafka-acls.sh --add --allow-principal User:<name> --operation Read --group {group})"),
                    ))
                }
                Err(e) => found.push(problem(
                    Severity::Warning,
                    format!("cannot read consumer group {group:?}'s offsets: {e}"),
                    "check the brokers' logs; the inbox keeps its offsets in the database and needs the group only to share partitions",
                )),
            }
        }
        found
    })
    .await
    .unwrap_or_default()
}

#[derive(Debug, Serialize)]
struct PartitionStatus {
    topic: String,
    partition: i32,
    /// The next offset the database holds (none: nothing written yet).
    stored_next_offset: Option<i64>,
    /// The partition's end in Kafka (the last stable offset for read_committed).
    kafka_end_offset: Option<i64>,
    lag: Option<i64>,
}

#[derive(Debug, Serialize)]
struct StatusJson {
    group: String,
    table: String,
    partitions: Vec<PartitionStatus>,
    unprocessed_rows: i64,
    oldest_unprocessed_received_at: Option<String>,
    dead_letters: i64,
    dedup_rows: i64,
    oldest_dedup_received_at: Option<String>,
    error: Option<String>,
}

/// `ferry inbox status`.
pub async fn status(config: Config, json: bool) -> Result<ExitCode, ExitCode> {
    let s = settings(&config)?;
    let mut report = StatusJson {
        group: s.group.clone(),
        table: s.tables.inbox.clone(),
        partitions: Vec::new(),
        unprocessed_rows: 0,
        oldest_unprocessed_received_at: None,
        dead_letters: 0,
        dedup_rows: 0,
        oldest_dedup_received_at: None,
        error: None,
    };
    let result = async {
        let sql = super::connect(&s.postgres).await?;
        let t = &s.tables;
        let q = |e: tokio_postgres::Error| describe(&e);
        let rows = sql
            .query(
                &format!("SELECT topic, \"partition\", next_offset FROM {} WHERE consumer_group = $1 ORDER BY 1, 2", t.offsets),
                &[&s.group],
            )
            .await
            .map_err(q)?;
        let r = sql
            .query_one(
                &format!("SELECT count(*), min(received_at)::text FROM {} WHERE processed_at IS NULL", t.inbox),
                &[],
            )
            .await
            .map_err(q)?;
        report.unprocessed_rows = r.get(0);
        report.oldest_unprocessed_received_at = r.get(1);
        report.dead_letters = sql
            .query_one(&format!("SELECT count(*) FROM {}", t.dead_letters), &[])
            .await
            .map_err(q)?
            .get(0);
        let r = sql
            .query_one(&format!("SELECT count(*), min(received_at)::text FROM {}", t.dedup), &[])
            .await
            .map_err(q)?;
        report.dedup_rows = r.get(0);
        report.oldest_dedup_received_at = r.get(1);
        let stored: Vec<(String, i32, Option<i64>)> =
            rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
        let c = consumer(&s).ok();
        report.partitions = tokio::task::spawn_blocking(move || {
            stored
                .into_iter()
                .map(|(topic, partition, next)| {
                    let end = c
                        .as_ref()
                        .and_then(|c| c.fetch_watermarks(&topic, partition, KAFKA_TIMEOUT).ok())
                        .map(|(_, high)| high);
                    PartitionStatus {
                        lag: end.map(|e| e - next.unwrap_or(0)),
                        topic,
                        partition,
                        stored_next_offset: next,
                        kafka_end_offset: end,
                    }
                })
                .collect()
        })
        .await
        .unwrap_or_default();
        Ok::<(), String>(())
    }
    .await;
    if let Err(e) = &result {
        errln!("ferry: {e}");
        report.error = Some(e.clone());
    }
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else if result.is_ok() {
        outln!("inbox                {}", report.table);
        outln!("consumer group       {}", report.group);
        outln!(
            "unprocessed rows     {} (oldest received {})",
            report.unprocessed_rows,
            report
                .oldest_unprocessed_received_at
                .as_deref()
                .unwrap_or("-")
        );
        outln!("dead letters         {}", report.dead_letters);
        outln!(
            "event ids kept       {} (oldest {})",
            report.dedup_rows,
            report.oldest_dedup_received_at.as_deref().unwrap_or("-")
        );
        outln!("partition            stored next offset   Kafka end   lag");
        for p in &report.partitions {
            let show = |o: Option<i64>| o.map_or_else(|| "-".to_owned(), |n| n.to_string());
            outln!(
                "{:<20} {:>18}   {:>9}   {}",
                format!("{}[{}]", p.topic, p.partition),
                show(p.stored_next_offset),
                show(p.kafka_end_offset),
                show(p.lag)
            );
        }
    }
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(_) => Err(ExitCode::from(1)),
    }
}
