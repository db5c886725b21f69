//! Rough cost of routing a row, for the next engineer to measure (no timing is asserted):
//!
//! ```sh
//! cargo test --release -p ferry-router --test bench -- --ignored --nocapture
//! ```
//!
//! Every case runs in several interleaved rounds and the best round is printed: on a machine
//! shared with other work, the minimum is the figure least disturbed by it, and interleaving
//! keeps one busy spell from landing on one case only.

mod common;

use std::hint::black_box;
use std::time::Instant;

use common::{base_row, router, COMMIT_MICROS};
use ferry_router::{oid, Router, SimpleRow};

const ROUNDS: usize = 5;
const ROWS_PER_ROUND: usize = 400_000;
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

struct Case {
    name: &'static str,
    router: Router,
    rows: Vec<SimpleRow>,
}

fn case(name: &'static str, config: &str, row: impl Fn(SimpleRow) -> SimpleRow) -> Case {
    let router = router(config);
    let rows: Vec<_> = (0..8)
        .map(|i| row(base_row().with("aggregatetype", oid::VARCHAR, &format!("agg{i}"))))
        .collect();
    // Warm up (and fill the topic cache).
    for row in &rows {
        black_box(router.route_row(row, COMMIT_MICROS).unwrap());
    }
    Case { name, router, rows }
}

/// A ~300-byte order as jsonb prints it: nested object, an array of objects, numbers, strings.
fn order(r: SimpleRow) -> SimpleRow {
    r.with(
        "payload",
        oid::JSONB,
        r#"{"id": 7312, "total": 139.97, "status": "created", "currency": "EUR", "customer": {"id": 42, "name": "Ada Lovelace", "email": "ada@example.com"}, "lines": [{"sku": "A-100", "qty": 2, "price": 39.99}, {"sku": "B-200", "qty": 1, "price": 59.99}], "placed_at": "2026-11-25T10:00:00Z"}"#,
    )
}

fn plain(name: &'static str, config: &str) -> Case {
    case(name, config, |r| r)
}

fn round(c: &Case) -> f64 {
    let start = Instant::now();
    for i in 0..ROWS_PER_ROUND {
        let rec = c
            .router
            .route_row(black_box(&c.rows[i % c.rows.len()]), COMMIT_MICROS);
        black_box(rec.unwrap());
    }
    start.elapsed().as_nanos() as f64 / ROWS_PER_ROUND as f64
}

#[test]
#[ignore = "measurement, run by hand with --release --ignored --nocapture"]
fn ns_per_row() {
    let cases = [
        plain("default mapping", ""),
        plain("fixed topic", "[route]\ntopic = \"events\""),
        plain(
            "two-column template",
            "[route]\ntopic = \"{tenant}.{aggregatetype}\"",
        ),
        plain(
            "regex rule (cached)",
            "[[route.rules]]\ncolumn = \"aggregatetype\"\nregex = \"agg(\\\\d+)\"\ntopic = \"t.$1\"",
        ),
        plain(
            "envelope + 2 fields + extra header",
            "[route]\nenvelope = true\nenvelope_fields = [\"type\", \"version\"]\n[[route.headers]]\ncolumn = \"tenant\"",
        ),
        plain(
            "timestamp column (parse per row)",
            "[outbox]\ntimestamp_column = \"created_at\"",
        ),
        case(
            "tracing column, bare traceparent",
            "[outbox]\ntracing_column = \"tc\"",
            |row| row.with("tc", oid::TEXT, TRACEPARENT),
        ),
        case(
            "tracing column, Debezium Properties text",
            "[outbox]\ntracing_column = \"tc\"",
            |row| {
                row.with(
                    "tc",
                    oid::TEXT,
                    &format!("#Mon Nov 23 22:21:17 UTC 2026\ntraceparent={TRACEPARENT}\ntracestate=congo\\=t61rcWkgMzE\n"),
                )
            },
        ),
        case(
            "tracing column, malformed (flagged, skipped)",
            "[outbox]\ntracing_column = \"tc\"",
            |row| row.with("tc", oid::TEXT, "00-not-a-traceparent"),
        ),
        plain("cloudevents binary", "[route]\ncloudevents = \"binary\""),
        plain(
            "cloudevents binary, source template",
            "[route]\ncloudevents = \"binary\"\ncloudevents_source = \"/shop/{tenant}\"",
        ),
        plain(
            "cloudevents structured",
            "[route]\ncloudevents = \"structured\"",
        ),
        plain(
            "key and value json (JsonConverter, no schemas)",
            "[route]\nkey_format = \"json\"\nvalue_format = \"json\"",
        ),
        plain(
            "value json_expanded (parse and rewrite the payload)",
            "[route]\nvalue_format = \"json_expanded\"",
        ),
        plain(
            "key and value json_with_schema",
            "[route]\nkey_format = \"json_with_schema\"\nvalue_format = \"json_with_schema\"",
        ),
        plain(
            "value json_expanded_with_schema",
            "[route]\nvalue_format = \"json_expanded_with_schema\"",
        ),
        case("default mapping, ~300 B order", "", order),
        case(
            "value json_expanded, ~300 B order",
            "[route]\nvalue_format = \"json_expanded\"",
            order,
        ),
        case(
            "value json_expanded_with_schema, ~300 B order",
            "[route]\nvalue_format = \"json_expanded_with_schema\"",
            order,
        ),
    ];
    let mut best = vec![f64::INFINITY; cases.len()];
    for _ in 0..ROUNDS {
        for (c, b) in cases.iter().zip(&mut best) {
            *b = b.min(round(c));
        }
    }
    for (c, ns) in cases.iter().zip(best) {
        println!("{:<48} {ns:>8.1} ns/row", c.name);
    }
}
