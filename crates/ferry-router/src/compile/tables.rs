//! The `[[tables]]` entries ([`TableConfig`]) and the validation of all tables together
//! ([`validate_tables`]). What several tables mean is in [`crate::tables`]; the router per table is
//! [`crate::Routers`].

use serde::{Deserialize, Serialize};

use crate::compile::config::{CreateTopicsConfig, OutboxConfig, RouteConfig, TableName};
use crate::compile::validate::{position_header_clashes, validate, ConfigErrors, ConfigProblem};

/// One `[[tables]]` entry: another outbox table and how its rows become records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TableConfig {
    /// The table and its columns (the keys of `[outbox]`, except `message_prefix`).
    pub outbox: OutboxConfig,
    /// How its rows become records (the keys of `[route]`, except `create_topics` and
    /// `position_headers`, which `[route]` sets for every table).
    pub route: RouteConfig,
}

/// The key prefix of the `i`-th table's settings in messages: `""` for `[outbox]`/`[route]`,
/// `tables[0].` for the first `[[tables]]` entry.
pub fn key_prefix(i: usize) -> String {
    match i {
        0 => String::new(),
        i => format!("tables[{}].", i - 1),
    }
}

/// Validates `[outbox]`, `[route]` and every `[[tables]]` entry, with the rules that span them:
/// every problem at once, each with its key path (`tables[1].route.topic: ...`).
pub fn validate_tables(
    outbox: &OutboxConfig,
    route: &RouteConfig,
    tables: &[TableConfig],
) -> Result<(), ConfigErrors> {
    let mut problems = validate(outbox, route)
        .err()
        .map(|e| e.problems)
        .unwrap_or_default();
    let mut seen: Vec<(TableName, String)> = Vec::new();
    if let Ok(t) = outbox.table_name() {
        seen.push((t, "outbox.table".into()));
    }
    for (i, t) in tables.iter().enumerate() {
        let prefix = key_prefix(i + 1);
        if let Err(e) = validate(&t.outbox, &t.route) {
            problems.extend(e.problems.into_iter().map(|p| ConfigProblem {
                path: format!("{prefix}{}", p.path),
                message: p.message,
            }));
        }
        if t.outbox.message_prefix.is_some() {
            problems.push(ConfigProblem::new(
                format!("{prefix}outbox.message_prefix"),
                "table-less messages belong to no table: set outbox.message_prefix in [outbox], \
                 and [route] routes them",
            ));
        }
        if t.route.create_topics != CreateTopicsConfig::default() {
            problems.push(ConfigProblem::new(
                format!("{prefix}route.create_topics"),
                "topic creation applies to every topic Ferry routes to: set it once, in \
                 [route.create_topics]",
            ));
        }
        if t.route.position_headers {
            problems.push(ConfigProblem::new(
                format!("{prefix}route.position_headers"),
                "the position headers say where in the source's WAL a record comes from, the same \
                 for every table: set it once, in [route] (it applies to every [[tables]] entry)",
            ));
        } else if route.position_headers {
            problems.extend(position_header_clashes(&t.route, &prefix));
        }
        if let Ok(name) = t.outbox.table_name() {
            let path = format!("{prefix}outbox.table");
            if let Some((_, first)) = seen.iter().find(|(n, _)| *n == name) {
                problems.push(ConfigProblem::new(
                    path,
                    format!(
                        "table {name} is already relayed by {first}: one table is read once; \
                         use [[route.rules]] to send its rows to several topics"
                    ),
                ));
            } else {
                seen.push((name, path));
            }
        }
    }
    ConfigErrors::from_problems(problems)
}
