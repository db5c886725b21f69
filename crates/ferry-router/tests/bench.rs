//! Rough cost of routing a row, for the next engineer to measure (no timing is asserted):
//!
//! ```sh
//! cargo test --release -p ferry-router --test bench -- --ignored --nocapture
//! ```

mod common;

use std::hint::black_box;
use std::time::Instant;

use common::{base_row, router, COMMIT_MICROS};
use ferry_router::{oid, SimpleRow};

fn measure(name: &str, config: &str, distinct_types: usize) {
    let r = router(config);
    let rows: Vec<_> = (0..distinct_types)
        .map(|i| base_row().with("aggregatetype", oid::VARCHAR, &format!("agg{i}")))
        .collect();
    // Warm up (and fill the topic cache).
    for row in &rows {
        black_box(r.route_row(row, COMMIT_MICROS).unwrap());
    }
    let n = 1_000_000;
    let start = Instant::now();
    for i in 0..n {
        let rec = r.route_row(black_box(&rows[i % rows.len()]), COMMIT_MICROS);
        black_box(rec.unwrap());
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    println!("{name:<48} {ns:>8.1} ns/row");
}

#[test]
#[ignore = "measurement, run by hand with --release --ignored --nocapture"]
fn ns_per_row() {
    measure("default mapping", "", 8);
    measure("fixed topic", "[route]\ntopic = \"events\"", 8);
    measure(
        "two-column template",
        "[route]\ntopic = \"{tenant}.{aggregatetype}\"",
        8,
    );
    measure(
        "regex rule (cached)",
        "[[route.rules]]\ncolumn = \"aggregatetype\"\nregex = \"agg(\\\\d+)\"\ntopic = \"t.$1\"",
        8,
    );
    measure(
        "envelope + 2 fields + extra header",
        "[route]\nenvelope = true\nenvelope_fields = [\"type\", \"version\"]\n[[route.headers]]\ncolumn = \"tenant\"",
        8,
    );
    measure(
        "timestamp column (parse per row)",
        "[outbox]\ntimestamp_column = \"created_at\"",
        8,
    );
    measure_with(
        "tracing column, bare traceparent",
        "[outbox]\ntracing_column = \"tc\"",
        |row| row.with("tc", oid::TEXT, TRACEPARENT),
    );
    measure_with(
        "tracing column, Debezium Properties text",
        "[outbox]\ntracing_column = \"tc\"",
        |row| {
            row.with(
                "tc",
                oid::TEXT,
                &format!("#Mon Nov 23 22:21:17 UTC 2026\ntraceparent={TRACEPARENT}\ntracestate=congo\\=t61rcWkgMzE\n"),
            )
        },
    );
    measure_with(
        "tracing column, malformed (flagged, skipped)",
        "[outbox]\ntracing_column = \"tc\"",
        |row| row.with("tc", oid::TEXT, "00-not-a-traceparent"),
    );
    measure("cloudevents binary", "[route]\ncloudevents = \"binary\"", 8);
    measure(
        "cloudevents binary, source template",
        "[route]\ncloudevents = \"binary\"\ncloudevents_source = \"/shop/{tenant}\"",
        8,
    );
    measure(
        "cloudevents structured",
        "[route]\ncloudevents = \"structured\"",
        8,
    );
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn measure_with(name: &str, config: &str, row: impl Fn(SimpleRow) -> SimpleRow) {
    let r = router(config);
    let rows: Vec<_> = (0..8)
        .map(|i| row(base_row().with("aggregatetype", oid::VARCHAR, &format!("agg{i}"))))
        .collect();
    for row in &rows {
        black_box(r.route_row(row, COMMIT_MICROS).unwrap());
    }
    let n = 1_000_000;
    let start = Instant::now();
    for i in 0..n {
        let rec = r.route_row(black_box(&rows[i % rows.len()]), COMMIT_MICROS);
        black_box(rec.unwrap());
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    println!("{name:<48} {ns:>8.1} ns/row");
}
