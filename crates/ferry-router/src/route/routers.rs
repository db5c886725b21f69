//! A router per outbox table ([`Routers`]), compiled from `[outbox]`/`[route]` and each
//! `[[tables]]` entry (see [`crate::tables`]).

use crate::compile::config::{OutboxConfig, RouteConfig, TableName};
use crate::compile::tables::{key_prefix, validate_tables, TableConfig};
use crate::compile::validate::{ConfigErrors, ConfigProblem};
use crate::route::router::Router;

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
            // A property of the source, set in `[route]` for every table (an entry may not set it).
            let table_route = RouteConfig {
                position_headers: route.position_headers,
                ..t.route.clone()
            };
            let router = Router::new(&t.outbox, &table_route).map_err(|e| ConfigErrors {
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

    /// `route.position_headers` (set in `[route]`, for every table).
    pub fn position_headers(&self) -> bool {
        self.primary().position_headers()
    }

    /// The prefix of table-less outbox messages, if configured (the first table's).
    pub fn message_prefix(&self) -> Option<&str> {
        self.primary().message_prefix()
    }
}
