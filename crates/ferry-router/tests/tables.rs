//! Several outbox tables (`[[tables]]`): validation with key paths per entry, and a router per
//! table that reads its own columns.

mod common;

use common::{base_row, COMMIT_MICROS};
use ferry_router::{
    oid, validate_tables, OutboxConfig, RouteConfig, Routers, SimpleRow, TableConfig,
};
use serde::Deserialize;

/// `[outbox]`, `[route]` and `[[tables]]`, as the binary embeds them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    outbox: OutboxConfig,
    #[serde(default)]
    route: RouteConfig,
    #[serde(default)]
    tables: Vec<TableConfig>,
}

fn config(text: &str) -> Config {
    toml::from_str(text).unwrap_or_else(|e| panic!("{text}\n{e}"))
}

fn problems(text: &str) -> Vec<(String, String)> {
    let c = config(text);
    match validate_tables(&c.outbox, &c.route, &c.tables) {
        Ok(()) => Vec::new(),
        Err(e) => e
            .problems
            .into_iter()
            .map(|p| (p.path, p.message))
            .collect(),
    }
}

fn has(problems: &[(String, String)], path: &str, fragment: &str) {
    assert!(
        problems
            .iter()
            .any(|(p, m)| p == path && m.contains(fragment)),
        "no problem at {path} containing {fragment:?} in {problems:#?}"
    );
}

const BILLING: &str = r#"
[[tables]]
outbox.table = "billing.events"
outbox.id_column = "event_id"
outbox.aggregate_id_column = "account"
outbox.payload_column = "body"
route.topic = "billing.{aggregatetype}"
route.id_header = "event-id"
"#;

#[test]
fn each_table_routes_with_its_own_columns_and_topic() {
    let c = config(BILLING);
    let routers = Routers::new(&c.outbox, &c.route, &c.tables).unwrap();
    assert_eq!(routers.len(), 2);
    let tables: Vec<String> = routers.tables().map(ToString::to_string).collect();
    assert_eq!(tables, ["public.outbox", "billing.events"]);

    let first = routers
        .get(0)
        .unwrap()
        .route_row(&base_row(), COMMIT_MICROS)
        .unwrap();
    assert_eq!(&*first.topic, "outbox.event.order");

    let row = SimpleRow::new()
        .with("event_id", oid::INT8, "7")
        .with("account", oid::TEXT, "acct-1")
        .with("aggregatetype", oid::TEXT, "invoice")
        .with("type", oid::TEXT, "Invoiced")
        .with("body", oid::TEXT, "hello");
    let second = routers
        .get(1)
        .unwrap()
        .route_row(&row, COMMIT_MICROS)
        .unwrap();
    assert_eq!(&*second.topic, "billing.invoice");
    assert_eq!(second.key.as_deref(), Some(&b"acct-1"[..]));
    assert_eq!(second.value.as_deref(), Some(&b"hello"[..]));
    assert_eq!(common::header(&second, "event-id"), Some(&b"7"[..]));
    // The second table's row lacks the first's columns: the first router cannot route it.
    assert!(routers
        .get(0)
        .unwrap()
        .route_row(&row, COMMIT_MICROS)
        .is_err());
    assert!(routers.get(2).is_none());
}

#[test]
fn messages_are_routed_by_the_first_table() {
    let c = config(&format!("[outbox]\nmessage_prefix = \"outbox\"\n{BILLING}"));
    let routers = Routers::new(&c.outbox, &c.route, &c.tables).unwrap();
    assert_eq!(routers.message_prefix(), Some("outbox"));
    assert_eq!(routers.primary().table().to_string(), "public.outbox");
}

#[test]
fn an_entry_s_problems_carry_its_index() {
    let p = problems(
        r#"
[[tables]]
outbox.table = "a.ok"

[[tables]]
outbox.table = "b.events"
outbox.payload_column = ""
route.topic = "bad topic {x}"
"#,
    );
    has(&p, "tables[1].outbox.payload_column", "must not be empty");
    has(&p, "tables[1].route.topic", "");
    assert!(
        p.iter().all(|(path, _)| path.starts_with("tables[1].")),
        "{p:#?}"
    );
    // Routers::new reports the same.
    let c = config("[[tables]]\noutbox.table = \"b.events\"\noutbox.id_column = \"\"\n");
    let e = Routers::new(&c.outbox, &c.route, &c.tables).unwrap_err();
    assert_eq!(e.problems[0].path, "tables[0].outbox.id_column");
}

#[test]
fn a_table_named_twice_is_refused() {
    let p = problems(
        r#"
[outbox]
table = "shop.outbox"

[[tables]]
outbox.table = "billing.events"

[[tables]]
outbox.table = "SHOP.OUTBOX"
"#,
    );
    has(
        &p,
        "tables[1].outbox.table",
        "table shop.outbox is already relayed by outbox.table",
    );
    let p = problems(
        "[[tables]]\noutbox.table = \"b.e\"\n[[tables]]\noutbox.table = \"b.\\\"e\\\"\"\n",
    );
    has(
        &p,
        "tables[1].outbox.table",
        "already relayed by tables[0].outbox.table",
    );
    // Same name in another schema is another table.
    assert!(problems("[[tables]]\noutbox.table = \"audit.outbox\"\n").is_empty());
}

#[test]
fn pipeline_wide_keys_are_refused_in_an_entry() {
    let p = problems(
        r#"
[[tables]]
outbox.table = "billing.events"
outbox.message_prefix = "billing"
route.create_topics.enabled = true
"#,
    );
    has(
        &p,
        "tables[0].outbox.message_prefix",
        "set outbox.message_prefix in [outbox]",
    );
    has(
        &p,
        "tables[0].route.create_topics",
        "set it once, in [route.create_topics]",
    );
}

#[test]
fn position_headers_are_set_once_in_route_for_every_table() {
    let p = problems(&format!("{BILLING}route.position_headers = true\n"));
    has(
        &p,
        "tables[0].route.position_headers",
        "set it once, in [route]",
    );
    let c = config(&format!("[route]\nposition_headers = true\n{BILLING}"));
    let routers = Routers::new(&c.outbox, &c.route, &c.tables).unwrap();
    assert!(routers.position_headers());
    assert!(
        routers.iter().all(|r| r.position_headers()),
        "every table's"
    );
    // Room for the two headers the relay core adds: adding them does not grow the allocation.
    let record = routers
        .primary()
        .route_row(&base_row(), COMMIT_MICROS)
        .unwrap();
    assert!(record.headers.capacity() >= record.headers.len() + 2);
    assert!(
        record.headers.iter().all(|(n, _)| !n.starts_with("ferry-")),
        "the router itself adds none: {:?}",
        record.headers
    );
    let c = config(BILLING);
    let routers = Routers::new(&c.outbox, &c.route, &c.tables).unwrap();
    assert!(!routers.position_headers(), "off by default");
    assert!(routers.iter().all(|r| !r.position_headers()));
}

#[test]
fn no_configured_header_may_take_a_position_header_s_name() {
    let p = problems(&format!(
        "[route]\nposition_headers = true\nid_header = \"ferry-position\"\n{BILLING}\
         route.additional_placement = \"region:header:ferry-source\"\n"
    ));
    has(
        &p,
        "route.id_header",
        "header \"ferry-position\" is sent by route.position_headers = true; rename this one",
    );
    has(
        &p,
        "tables[0].route.additional_placement[0]",
        "header \"ferry-source\" is sent by route.position_headers",
    );
    // Without the setting the names are free.
    let p = problems("[route]\nid_header = \"ferry-position\"\n");
    assert!(p.is_empty(), "{p:#?}");
}

#[test]
fn an_entry_defaults_to_debeziums_outbox_like_the_first() {
    let c = config("[[tables]]\noutbox.table = \"orders.outbox\"\n");
    assert_eq!(
        c.tables[0].outbox,
        OutboxConfig {
            table: "orders.outbox".into(),
            ..OutboxConfig::default()
        }
    );
    assert_eq!(c.tables[0].route, RouteConfig::default());
    // An entry without a table names the default one, which [outbox] already does.
    let p = problems("[[tables]]\nroute.topic = \"x\"\n");
    has(
        &p,
        "tables[0].outbox.table",
        "already relayed by outbox.table",
    );
    // An unknown key is a parse error naming it.
    let e = toml::from_str::<Config>("[[tables]]\noutbox.tabel = \"x\"\n").unwrap_err();
    assert!(e.to_string().contains("tabel"), "{e}");
}
