//! The relay end to end: rows committed in PostgreSQL arrive in Kafka as the router says, and
//! the slot is confirmed only past what Kafka acknowledged.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_row_arrives_with_topic_key_partition_headers_and_value() {
    let w = World::new().await;
    let topic = w.create_topic("order", 3).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;

    w.sql
        .batch_execute(
            "BEGIN;
             INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
               ('00000000-0000-0000-0000-000000000001', 'order', 'o-1', 'OrderCreated', '{\"n\": 1, \"name\": \"Zoë\"}'),
               ('00000000-0000-0000-0000-000000000002', 'order', 'o-2', 'OrderCreated', '{\"n\": 2}');
             COMMIT;
             BEGIN;
             INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
               ('00000000-0000-0000-0000-00000000dead', 'order', 'o-1', 'Never', '{}');
             ROLLBACK;
             INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
               ('00000000-0000-0000-0000-000000000003', 'order', 'o-1', 'OrderPaid', '{\"n\": 3}');",
        )
        .await
        .unwrap();
    let got = w.consume(&topic, 3).await;
    let by_id: HashMap<String, _> = got.iter().map(|r| (r.header("id").unwrap(), r)).collect();
    assert_eq!(by_id.len(), 3, "{got:#?}");
    assert!(!by_id.contains_key("00000000-0000-0000-0000-00000000dead"));
    let first = by_id["00000000-0000-0000-0000-000000000001"];
    assert_eq!(
        first.key.as_deref(),
        Some(&b"o-1"[..]),
        "key is the plain aggregate id"
    );
    assert_eq!(first.header("type").as_deref(), Some("OrderCreated"));
    assert_eq!(
        String::from_utf8(first.value.clone().unwrap()).unwrap(),
        "{\"n\": 1, \"name\": \"Zoë\"}",
        "the payload as stored (jsonb text form)"
    );
    for r in &got {
        let expected = ferry_router::java_partition(r.key.as_deref().unwrap(), 3);
        assert_eq!(
            r.partition, expected,
            "Java-compatible murmur2 partition for {:?}",
            r.key
        );
    }
    // Per-aggregate order: o-1's events in commit order.
    let o1: Vec<_> = got
        .iter()
        .filter(|r| r.key.as_deref() == Some(&b"o-1"[..]))
        .map(|r| r.header("type").unwrap())
        .collect();
    assert_eq!(o1, ["OrderCreated", "OrderPaid"]);

    // The slot is confirmed past the last transaction once Kafka acknowledged it.
    let target = w.current_wal_lsn().await;
    wait_until(
        "confirmed_flush_lsn reaches the last commit",
        Duration::from_secs(30),
        || async { w.confirmed_lsn().await.unwrap() >= target },
    )
    .await;
    assert_eq!(
        ferry.metric("ferry_records_produced_total").await,
        Some(3.0)
    );
    let status = ferry.terminate().await;
    assert!(
        status.success(),
        "graceful shutdown exits 0: {status:?}\n{}",
        ferry.log_text()
    );
}

/// A bytea payload streams in pgoutput's binary mode (raw bytes, not hex) and arrives byte for
/// byte. When a column Ferry reads changes mid-stream to a type it reads only as text (an enum),
/// the session ends and the next one streams text: every row still arrives, none twice out of
/// order, and Ferry does not stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytea_streams_binary_and_a_type_change_falls_back_to_text() {
    let w = World::new().await;
    w.sql
        .batch_execute("ALTER TABLE outbox ALTER COLUMN payload TYPE bytea USING NULL")
        .await
        .unwrap();
    let topic = w.create_topic("order", 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    assert!(
        ferry.log_text().contains("binary mode"),
        "{}",
        ferry.log_text()
    );
    let insert = |n: u8| {
        format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES \
             ('00000000-0000-0000-0000-00000000000{n}', 'order', 'o-1', 'E', decode('00ff{n:02x}5c78', 'hex'));"
        )
    };
    w.sql
        .batch_execute(&format!("{}{}", insert(1), insert(2)))
        .await
        .unwrap();
    w.sql
        .batch_execute(&format!(
            "CREATE TYPE agg AS ENUM ('order');
             ALTER TABLE outbox ALTER COLUMN aggregatetype TYPE agg USING aggregatetype::agg;
             {}{}",
            insert(3),
            insert(4)
        ))
        .await
        .unwrap();
    let got = w.consume(&topic, 4).await;
    let mut first_seen: Vec<String> = Vec::new();
    for r in &got {
        let id = r.header("id").unwrap();
        let n = u8::from_str_radix(&id[id.len() - 1..], 16).unwrap();
        assert_eq!(
            r.value.as_deref(),
            Some(&[0x00, 0xff, n, b'\\', b'x'][..]),
            "raw bytes of row {n}"
        );
        if !first_seen.contains(&id) {
            first_seen.push(id);
        }
    }
    let want: Vec<String> = (1..=4)
        .map(|n| format!("00000000-0000-0000-0000-00000000000{n}"))
        .collect();
    assert_eq!(first_seen, want, "per-key order across the fallback");
    let log = ferry.log_text();
    assert!(log.contains("reconnecting to stream text"), "{log}");
    assert!(log.contains("which Ferry reads only as text"), "{log}");
    assert!(ferry.is_running(), "{log}");
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

/// CloudEvents binary mode and the trace-context column through the real binary: the Kafka
/// binding's headers (CloudEvents Kafka protocol binding §3.2.3.1: `ce_` + attribute name;
/// §3.2.1: `content-type`) with the required attributes (CloudEvents 1.0 §3.1.1), the value
/// untouched, and the stored `traceparent` sent on, while a malformed one is left out without
/// stopping anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_binary_headers_and_trace_context_arrive() {
    let mut w = World::new().await;
    w.env.extend([
        ("FERRY_ROUTE_CLOUDEVENTS".to_owned(), "binary".to_owned()),
        (
            "FERRY_ROUTE_CLOUDEVENTS_SOURCE".to_owned(),
            "/ferry/e2e/{aggregatetype}".to_owned(),
        ),
        ("FERRY_OUTBOX_TRACING_COLUMN".to_owned(), "note".to_owned()),
    ]);
    let topic = w.create_topic("order", 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    w.sql
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, note) VALUES
               ('00000000-0000-0000-0000-000000000001', 'order', 'o-1', 'OrderCreated', '{\"n\": 1}', $1),
               ('00000000-0000-0000-0000-000000000002', 'order', 'o-2', 'OrderPaid', '{\"n\": 2}', 'ff-bad')",
            &[&format!("#Mon Nov 23 22:21:17 UTC 2026\ntraceparent={tp}\n")],
        )
        .await
        .unwrap();
    let got = w.consume(&topic, 2).await;
    let by_id: HashMap<String, _> = got.iter().map(|r| (r.header("id").unwrap(), r)).collect();
    let first = by_id["00000000-0000-0000-0000-000000000001"];
    for (name, want) in [
        ("ce_specversion", "1.0"),
        ("ce_id", "00000000-0000-0000-0000-000000000001"),
        ("ce_source", "/ferry/e2e/order"),
        ("ce_type", "OrderCreated"),
        ("ce_subject", "o-1"),
        ("content-type", "application/json"),
        ("traceparent", tp),
        ("type", "OrderCreated"),
    ] {
        assert_eq!(
            first.header(name).as_deref(),
            Some(want),
            "{name}: {first:#?}"
        );
    }
    let time = first.header("ce_time").unwrap();
    assert!(
        time.len() == 24 && time.as_bytes()[10] == b'T' && time.ends_with('Z'),
        "RFC 3339: {time}"
    );
    assert_eq!(
        first.value.as_deref(),
        Some(&b"{\"n\": 1}"[..]),
        "value untouched"
    );
    let second = by_id["00000000-0000-0000-0000-000000000002"];
    assert_eq!(second.header("ce_type").as_deref(), Some("OrderPaid"));
    assert_eq!(second.header("traceparent"), None, "malformed: left out");
    wait_until(
        "the malformed trace context is counted",
        Duration::from_secs(30),
        || async {
            ferry
                .metric_labeled("ferry_trace_context_malformed_total", "problem", "length")
                .await
                == Some(1.0)
        },
    )
    .await;
    let status = ferry.terminate().await;
    assert!(status.success(), "{status:?}\n{}", ferry.log_text());
}

/// `route.key_format` / `route.value_format` as Kafka Connect's JsonConverter wrote them (with
/// and without schemas), through PostgreSQL and a real broker: the bytes are exact, a NULL
/// payload is `null` (not a tombstone), and the partition follows the key's formatted bytes, as
/// the Java client partitioned the connector's records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_converter_formats_arrive_byte_for_byte() {
    let mut w = World::new().await;
    w.env.extend([
        (
            "FERRY_ROUTE_KEY_FORMAT".to_owned(),
            "json_with_schema".to_owned(),
        ),
        ("FERRY_ROUTE_VALUE_FORMAT".to_owned(), "json".to_owned()),
    ]);
    let topic = w.create_topic("order", 3).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.sql
        .batch_execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
               ('00000000-0000-0000-0000-000000000001', 'order', 'o-1', 'OrderCreated', '{\"note\": \"x\\ny\", \"n\": 1}'),
               ('00000000-0000-0000-0000-000000000002', 'order', 'o-2', 'OrderVoided', NULL);",
        )
        .await
        .unwrap();
    let got = w.consume(&topic, 2).await;
    let by_id: HashMap<String, _> = got.iter().map(|r| (r.header("id").unwrap(), r)).collect();
    let first = by_id["00000000-0000-0000-0000-000000000001"];
    assert_eq!(
        first.key.as_deref(),
        Some(&br#"{"schema":{"type":"string","optional":false},"payload":"o-1"}"#[..])
    );
    assert_eq!(
        std::str::from_utf8(first.value.as_deref().unwrap()).unwrap(),
        r#""{\"n\": 1, \"note\": \"x\\ny\"}""#,
        "jsonb's text (its key order) as a JSON string"
    );
    let second = by_id["00000000-0000-0000-0000-000000000002"];
    assert_eq!(second.value.as_deref(), Some(&b"null"[..]));
    for r in &got {
        assert_eq!(
            r.partition,
            ferry_router::java_partition(r.key.as_deref().unwrap(), 3),
            "murmur2 of the formatted key"
        );
    }
    let status = ferry.terminate().await;
    assert!(status.success(), "{status:?}\n{}", ferry.log_text());
}

/// `table.expand.json.payload` through JsonConverter without and with schemas, from the text a
/// real jsonb column gives (PostgreSQL's key order and spacing): the connector's bytes.
#[tokio::test]
async fn expanded_json_payloads_arrive_byte_for_byte() {
    for (format, want) in [
        (
            "json_expanded",
            r#"{"n":1,"lines":[{"qty":2,"sku":"a"}],"total":39.98}"#,
        ),
        (
            "json_expanded_with_schema",
            concat!(
                r#"{"schema":{"type":"struct","fields":[{"type":"int32","optional":true,"field":"n"},"#,
                r#"{"type":"array","items":{"type":"struct","fields":[{"type":"int32","optional":true,"field":"qty"},"#,
                r#"{"type":"string","optional":true,"field":"sku"}],"optional":true,"name":"payload.lines"},"#,
                r#""optional":true,"field":"lines"},{"type":"double","optional":true,"field":"total"}],"#,
                r#""optional":true,"name":"payload"},"#,
                r#""payload":{"n":1,"lines":[{"qty":2,"sku":"a"}],"total":39.98}}"#
            ),
        ),
    ] {
        let mut w = World::new().await;
        w.env
            .push(("FERRY_ROUTE_VALUE_FORMAT".to_owned(), format.to_owned()));
        let topic = w.create_topic("order", 1).await;
        let mut ferry = w.start_ferry();
        ferry.wait_ready().await;
        w.sql
            .batch_execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
                   ('00000000-0000-0000-0000-000000000001', 'order', 'o-1', 'OrderCreated',
                    '{\"total\": 39.98, \"n\": 1, \"gone\": null, \"lines\": [{\"sku\": \"a\", \"qty\": 2}]}');",
            )
            .await
            .unwrap();
        let got = w.consume(&topic, 1).await;
        assert_eq!(
            std::str::from_utf8(got[0].value.as_deref().unwrap()).unwrap(),
            want,
            "{format}"
        );
        let status = ferry.terminate().await;
        assert!(status.success(), "{status:?}\n{}", ferry.log_text());
    }
}

/// Every record's bytes reach Kafka as PostgreSQL renders the row, under a drain at full speed:
/// Ferry hands librdkafka raw pointers into WAL read buffers the reader reuses
/// (`ferry::producer::client`), so a value handed over after its buffer moved on, or borrowed
/// past the call, would arrive as other bytes. jsonb values of ~1 KB that differ row by row,
/// written in one transaction. (Seen failing when a value was handed over without librdkafka's
/// copy and its buffer released at once: 7,032 of 20,000 values wrong.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_arrives_byte_for_byte_at_full_speed() {
    const ROWS: usize = 20_000;
    let w = World::new().await;
    let topic = w.create_topic("order", 3).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    // One transaction: it reaches Ferry as one burst, at the walsender's speed.
    w.sql
        .batch_execute(&format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
             SELECT gen_random_uuid(), 'order', 'o-' || (i % 97), 'OrderCreated',
                    jsonb_build_object('i', i, 'pad', repeat(md5(i::text), 30))
             FROM generate_series(1, {ROWS}) AS i"
        ))
        .await
        .unwrap();
    let expected: HashMap<String, String> = w
        .sql
        .query("SELECT id::text, payload::text FROM outbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let got = w.consume(&topic, ROWS).await;
    assert_eq!(got.len(), ROWS);
    let mut wrong = 0;
    for r in &got {
        let id = r.header("id").unwrap();
        let value = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default());
        if expected.get(&id).map(String::as_str) != Some(&*value) {
            wrong += 1;
            if wrong <= 3 {
                eprintln!("record {id}: {:.120}", value);
            }
        }
    }
    assert_eq!(wrong, 0, "{wrong} of {ROWS} values are not the rows' bytes");
    let status = ferry.terminate().await;
    assert!(status.success(), "{status:?}\n{}", ferry.log_text());
}
