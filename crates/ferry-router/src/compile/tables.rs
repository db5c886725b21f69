//! Several outbox tables: one Ferry, one slot, one publication, and a router per table.
//!
//! `[outbox]` and `[route]` describe the first table (and route table-less messages); each
//! `[[tables]]` entry adds one more, with its own `outbox` and `route` sections (the same keys,
//! the same defaults), so tables of different structures — one per schema or per service — can
//! share a slot:
//!
//! ```toml
//! [outbox]
//! table = "orders.outbox"
//!
//! [[tables]]
//! outbox.table = "billing.events"
//! outbox.payload_column = "body"
//! route.topic = "billing.{aggregatetype}"
//! ```
//!
//! A row is routed by the router of the table it was inserted into; the reader tells them apart by
//! the relation's schema and name, which it matches once per Relation message, so the per-row cost
//! is an index. Two keys stay global because they are about the whole pipeline: table-less
//! messages (`outbox.message_prefix`) are routed by the first table's `[route]`, and
//! `[route.create_topics]` applies to every topic whichever table routes to it.
//!
//! Ordering: the tables share the WAL, so events reach Kafka in commit order across tables too, and
//! two rows with the same key — whichever tables they come from — keep their commit order when
//! they go to the same topic and partition.

use serde::{Deserialize, Serialize};

use crate::compile::config::{CreateTopicsConfig, OutboxConfig, RouteConfig, TableName};
use crate::compile::validate::{validate, ConfigErrors, ConfigProblem};
use crate::route::router::Router;

/// One `[[tables]]` entry: another outbox table and how its rows become records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TableConfig {
    /// The table and its columns (the keys of `[outbox]`, except `message_prefix`).
    pub outbox: OutboxConfig,
    /// How its rows become records (the keys of `[route]`, except `create_topics`).
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

/// A router per outbox table: index 0 is `[outbox]`/`[route]`, index `i` is `tables[i - 1]`.
/// The index is the one [`TableName`]s are listed in by [`Routers::tables`], which is how the
/// reader numbers the rows it yields.
#[derive(Debug)]
pub struct Routers {
    routers: Vec<Router>,
}

impl Routers {
    /// Validates everything ([`validate_tables`]) and compiles a router per table.
    pub fn new(
        outbox: &OutboxConfig,
        route: &RouteConfig,
        tables: &[TableConfig],
    ) -> Result<Routers, ConfigErrors> {
        validate_tables(outbox, route, tables)?;
        let mut routers = vec![Router::new(outbox, route)?];
        for (i, t) in tables.iter().enumerate() {
            let router = Router::new(&t.outbox, &t.route).map_err(|e| ConfigErrors {
                problems: e
                    .problems
                    .into_iter()
                    .map(|p| ConfigProblem {
                        path: format!("{}{}", key_prefix(i + 1), p.path),
                        message: p.message,
                    })
                    .collect(),
            })?;
            routers.push(router);
        }
        Ok(Routers { routers })
    }

    /// One table.
    pub fn single(router: Router) -> Routers {
        Routers {
            routers: vec![router],
        }
    }

    /// The router of the `i`-th table.
    pub fn get(&self, i: usize) -> Option<&Router> {
        self.routers.get(i)
    }

    /// The first table's router, which also routes table-less messages.
    pub fn primary(&self) -> &Router {
        &self.routers[0]
    }

    /// The number of tables (at least 1).
    pub fn len(&self) -> usize {
        self.routers.len()
    }

    /// Never: there is always the first table.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Every router, in table order.
    pub fn iter(&self) -> impl Iterator<Item = &Router> {
        self.routers.iter()
    }

    /// Every table, in order.
    pub fn tables(&self) -> impl Iterator<Item = &TableName> {
        self.routers.iter().map(Router::table)
    }

    /// The prefix of table-less outbox messages, if configured (the first table's).
    pub fn message_prefix(&self) -> Option<&str> {
        self.primary().message_prefix()
    }
}
