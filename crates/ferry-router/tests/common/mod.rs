//! Shared test helpers: configs from TOML text and the Debezium-shaped base row.
#![allow(dead_code)]

use ferry_router::{oid, validate, OutboxConfig, Record, RouteConfig, Router, SimpleRow};
use serde::Deserialize;

/// The two sections as the binary embeds them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sections {
    #[serde(default)]
    pub outbox: OutboxConfig,
    #[serde(default)]
    pub route: RouteConfig,
}

pub fn sections(toml_text: &str) -> Sections {
    toml::from_str(toml_text).unwrap_or_else(|e| panic!("bad test config {toml_text:?}: {e}"))
}

pub fn router(toml_text: &str) -> Router {
    let s = sections(toml_text);
    Router::new(&s.outbox, &s.route).unwrap_or_else(|e| panic!("{toml_text}\n{e}"))
}

pub const EVENT_ID: &str = "4d47e190-0402-4048-bc2c-89dd54343cdc";
/// 2027-01-15 08:00:00 UTC, in µs since the Unix epoch.
pub const COMMIT_MICROS: i64 = 1_800_000_000_000_000;
pub const COMMIT_MS: i64 = 1_800_000_000_000;

/// A row of Debezium's reference outbox table, plus a few extra columns.
pub fn base_row() -> SimpleRow {
    SimpleRow::new()
        .with("id", oid::UUID, EVENT_ID)
        .with("aggregatetype", oid::VARCHAR, "order")
        .with("aggregateid", oid::VARCHAR, "42")
        .with("type", oid::VARCHAR, "OrderCreated")
        .with("payload", oid::JSONB, r#"{"total": 39.98}"#)
        .with("created_at", oid::TIMESTAMPTZ, "2026-11-22 10:00:00.123+00")
        .with("tenant", oid::TEXT, "acme")
        .with("part", oid::INT4, "3")
        .with("version", oid::INT4, "7")
}

pub fn header<'r>(r: &'r Record, name: &str) -> Option<&'r [u8]> {
    r.headers
        .iter()
        .find(|(n, _)| &**n == name)
        .and_then(|(_, v)| v.as_deref())
}

pub fn header_names(r: &Record) -> Vec<&str> {
    r.headers.iter().map(|(n, _)| &**n).collect()
}

pub fn problems(toml_text: &str) -> Vec<(String, String)> {
    let s = sections(toml_text);
    match validate(&s.outbox, &s.route) {
        Ok(()) => Vec::new(),
        Err(e) => {
            // Router::new reports the same problems.
            assert_eq!(Router::new(&s.outbox, &s.route).unwrap_err(), e);
            e.problems
                .into_iter()
                .map(|p| (p.path, p.message))
                .collect()
        }
    }
}

pub fn assert_problem(toml_text: &str, path: &str, fragment: &str) {
    let got = problems(toml_text);
    assert!(
        got.iter().any(|(p, m)| p == path && m.contains(fragment)),
        "{toml_text}\nwanted {path}: ..{fragment}.. in {got:?}"
    );
}
