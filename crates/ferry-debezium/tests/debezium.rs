//! `ferry config from-debezium` on realistic connector configs (`tests/debezium/*.json`),
//! translated for the real configuration (`ferry::debezium`, the binary's `Target`).
//!
//! Every fixture's output must load and validate as a `ferry.toml` through
//! `ferry::config::load`, match its golden files (`<fixture>.toml`, and `<fixture>.notes` for the
//! "not translated" lines; `UPDATE_GOLDEN=1 cargo test -p ferry-debezium --test debezium` rewrites them
//! after a deliberate change), leak no secret, and leave no option unaccounted for. The
//! per-fixture tests then check the values that matter and route rows through the translated
//! router config to show the records are the ones Debezium produced.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ferry::config::{self, Config};
use ferry::debezium::{translate, Options, Translation};
use ferry_router::{oid, OnError, Record, Router, RuleConfig, SimpleRow};
use proptest::prelude::*;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/debezium")
}

fn fixture_json(name: &str) -> String {
    std::fs::read_to_string(dir().join(format!("{name}.json"))).unwrap()
}

fn run(name: &str) -> Translation {
    let options = Options {
        brokers: None,
        source: Some(format!("{name}.json")),
        worker: None,
    };
    translate(&fixture_json(name), &options).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn load(t: &Translation) -> Config {
    config::load(Some(&t.toml), []).unwrap_or_else(|e| panic!("{e}\n{}", t.toml))
}

fn notes_text(t: &Translation) -> String {
    t.notes.iter().map(|n| format!("{n}\n")).collect()
}

fn note<'a>(t: &'a Translation, option: &str) -> &'a str {
    t.notes
        .iter()
        .find(|n| n.option == option)
        .map(|n| n.reason.as_str())
        .unwrap_or_else(|| panic!("no note for {option}:\n{}", notes_text(t)))
}

fn noted(t: &Translation) -> BTreeSet<&str> {
    t.notes.iter().map(|n| n.option.as_str()).collect()
}

fn router(c: &Config) -> Router {
    Router::new(&c.outbox, &c.route).unwrap()
}

fn header<'a>(r: &'a Record, name: &str) -> Option<&'a [u8]> {
    r.headers
        .iter()
        .find(|(n, _)| &**n == name)
        .and_then(|(_, v)| v.as_deref())
}

fn header_names(r: &Record) -> Vec<&str> {
    r.headers.iter().map(|(n, _)| &**n).collect()
}

const FIXTURES: &[&str] = &[
    "defaults",
    "renamed_columns",
    "ssl_sasl",
    "unsupported",
    "debezium_1x",
    "tracing",
];

/// Options translated without a trace in the output's comments: what Ferry does anyway.
const CONSUMED: &[&str] = &[
    "name",
    "connector.class",
    "tasks.max",
    "transforms",
    "transforms.outbox.type",
    "database.port",
    "database.user",
    "database.dbname",
    "database.sslmode",
    "database.sslrootcert",
    "database.sslcert",
    "database.sslkey",
    "plugin.name",
    "snapshot.mode",
    "producer.override.acks",
    "producer.override.enable.idempotence",
];

#[test]
fn every_fixture_loads_validates_matches_its_golden_files_and_leaks_no_secret() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let on_disk: BTreeSet<String> = std::fs::read_dir(dir())
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".json").map(str::to_owned))
        .collect();
    let listed: BTreeSet<String> = FIXTURES.iter().map(|f| f.to_string()).collect();
    assert_eq!(on_disk, listed, "every fixture is tested");
    for name in FIXTURES.iter().filter(|_| update) {
        let t = run(name);
        std::fs::write(dir().join(format!("{name}.toml")), &t.toml).unwrap();
        std::fs::write(dir().join(format!("{name}.notes")), notes_text(&t)).unwrap();
    }
    for name in FIXTURES {
        let t = run(name);
        load(&t);
        for (ext, actual) in [("toml", t.toml.clone()), ("notes", notes_text(&t))] {
            let path = dir().join(format!("{name}.{ext}"));
            let expected = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(
                actual, expected,
                "{name}.{ext} differs from its golden file"
            );
        }
        assert!(
            t.notes.iter().all(|n| !n.reason.is_empty()),
            "every note says why"
        );
        let json: serde_json::Value = serde_json::from_str(&fixture_json(name)).unwrap();
        let map = json.get("config").unwrap_or(&json).as_object().unwrap();
        let everything = format!("{}{}", t.toml, notes_text(&t));
        for (key, value) in map {
            let value = value
                .as_str()
                .map(str::to_owned)
                .unwrap_or(value.to_string());
            // (Short values like the tutorial's "dbz" also occur in innocent words.)
            if config::is_secret_property(key) && !value.starts_with("${") && value.len() >= 6 {
                assert!(
                    !everything.contains(&value),
                    "{name}: the secret {key} leaked"
                );
            }
            // Nothing silently dropped: each option is named in the output, noted, or consumed
            // because Ferry does that anyway.
            assert!(
                everything.contains(key.as_str()) || CONSUMED.contains(&key.as_str()),
                "{name}: {key} is neither translated nor noted"
            );
        }
    }
}

#[test]
fn defaults_only_outbox_becomes_debeziums_defaults() {
    let t = run("defaults");
    let c = load(&t);
    assert_eq!(
        c.postgres.url.expose(),
        "postgres://debezium@postgres:5432/orderdb"
    );
    assert_eq!(c.postgres.slot, "debezium");
    assert_eq!(c.postgres.publication, "dbz_publication");
    assert!(c.postgres.create_slot && c.postgres.create_publication);
    assert_eq!(c.outbox, ferry_router::OutboxConfig::default());
    assert_eq!(
        c.route.topic.as_deref(),
        Some("outbox.event.{aggregatetype}")
    );
    assert!(c.route.rules.is_empty());
    assert_eq!(
        (c.route.id_header.as_str(), c.route.type_header.as_str()),
        ("id", "")
    );
    assert!(!c.route.envelope && !c.route.tombstone_on_null_payload);
    assert_eq!(c.route.on_error, OnError::Fail);
    assert_eq!(c.kafka.brokers.0, ["CHANGE-ME:9092"]);
    assert_eq!(
        noted(&t),
        BTreeSet::from([
            "bootstrap.servers",
            "database.password",
            "extended.headers.enabled",
            "key.converter",
            "value.converter",
            "tombstones.on.delete",
            "topic.prefix"
        ])
    );
    assert!(note(&t, "extended.headers.enabled").contains("__debezium.context.connectorName"));
    // A NULL payload goes out as a null value, as Debezium's router sends it.
    assert!(c.route.send_null_payload);
    assert!(note(&t, "database.password")
        .contains("FERRY_POSTGRES_URL=postgres://debezium:<password>@postgres:5432/orderdb"));
    // Debezium's record for a row: topic from the aggregate type, key the aggregate id, the id
    // header alone, the payload as the value.
    let row = SimpleRow::new()
        .with("id", oid::UUID, "4d47e190-0402-4048-bc2c-89dd54343cdc")
        .with("aggregatetype", oid::VARCHAR, "order")
        .with("aggregateid", oid::VARCHAR, "1")
        .with("type", oid::VARCHAR, "OrderCreated")
        .with("payload", oid::JSONB, r#"{"id": 1, "customerId": 123}"#);
    let r = router(&c).route_row(&row, 1_556_890_294_484_000).unwrap();
    assert_eq!(&*r.topic, "outbox.event.order");
    assert_eq!(r.key.as_deref(), Some(&b"1"[..]));
    assert_eq!(header_names(&r), ["id"]);
    assert_eq!(
        r.value.as_deref(),
        Some(&br#"{"id": 1, "customerId": 123}"#[..])
    );
}

#[test]
fn renamed_columns_placements_and_a_custom_regex_route_as_debezium_did() {
    let t = run("renamed_columns");
    let c = load(&t);
    assert_eq!(
        c.postgres.url.expose(),
        "postgres://cdc_orders@orders-db.internal:6432/orders"
    );
    assert_eq!(
        (c.postgres.slot.as_str(), c.postgres.publication.as_str()),
        ("orders_outbox", "orders_outbox_pub")
    );
    let o = &c.outbox;
    assert_eq!(o.table, "orders.outbox_events");
    assert_eq!(
        [
            &o.id_column,
            &o.aggregate_id_column,
            &o.aggregate_type_column,
            &o.type_column,
            &o.payload_column
        ],
        [
            "event_id",
            "aggregate_id",
            "aggregate_type",
            "event_type",
            "body"
        ]
    );
    assert_eq!(o.timestamp_column.as_deref(), Some("occurred_at"));
    assert_eq!(
        c.route.rules,
        [RuleConfig {
            column: "aggregate_type".into(),
            equals: None,
            regex: Some("(?<routedByValue>[A-Za-z]+)Aggregate".into()),
            topic: "orders.${routedByValue}.events".into(),
        }]
    );
    assert_eq!(c.route.topic.as_deref(), Some("{aggregate_type}"));
    assert_eq!(
        c.route.additional_placement.as_deref(),
        Some("event_type:header:eventType,tenant_id:header:tenant,schema_version:envelope:schemaVersion")
    );
    assert!(c.route.envelope && c.route.tombstone_on_null_payload);
    assert!(note(&t, "database.password").contains("config provider"));
    assert_eq!(
        c.route.value_format,
        ferry_router::RecordFormat::JsonExpanded,
        "JsonConverter without schemas over an expanded payload"
    );
    for translated in [
        "value.converter",
        "transforms.outbox.table.expand.json.payload",
    ] {
        assert!(!noted(&t).contains(translated), "{translated}");
    }

    let row = |aggregate_type: &str, body: Option<&str>| {
        let r = SimpleRow::new()
            .with(
                "event_id",
                oid::UUID,
                "0b5a3c1e-2f4d-4e6a-8b9c-0d1e2f3a4b5c",
            )
            .with("aggregate_type", oid::VARCHAR, aggregate_type)
            .with("aggregate_id", oid::VARCHAR, "order-7")
            .with("event_type", oid::VARCHAR, "OrderShipped")
            .with("tenant_id", oid::VARCHAR, "acme")
            .with("schema_version", oid::INT4, "3")
            .with("occurred_at", oid::TIMESTAMPTZ, "2024-05-01 10:00:00+00");
        match body {
            Some(b) => r.with("body", oid::JSONB, b),
            None => r.null("body", oid::JSONB),
        }
    };
    let router = router(&c);
    let r = router
        .route_row(&row("OrderAggregate", Some(r#"{"n":1}"#)), 0)
        .unwrap();
    assert_eq!(
        &*r.topic, "orders.Order.events",
        "the regex rule, as RegexRouter"
    );
    assert_eq!(header_names(&r), ["id", "eventType", "tenant"]);
    assert_eq!(header(&r, "eventType"), Some(&b"OrderShipped"[..]));
    assert_eq!(r.key.as_deref(), Some(&b"order-7"[..]));
    assert_eq!(r.timestamp_ms, Some(1_714_557_600_000));
    assert_eq!(
        r.value.as_deref(),
        Some(&br#"{"payload":{"n":1},"schemaVersion":3}"#[..]),
        "the expanded struct as JsonConverter wrote it"
    );
    let unmatched = router.route_row(&row("Customer", Some("{}")), 0).unwrap();
    assert_eq!(
        &*unmatched.topic, "Customer",
        "RegexRouter leaves a non-matching topic as is"
    );
    let tombstone = router.route_row(&row("OrderAggregate", None), 0).unwrap();
    assert_eq!(tombstone.value, None);
}

#[test]
fn ssl_verify_full_and_sasl_producer_overrides() {
    let t = run("ssl_sasl");
    let c = load(&t);
    assert_eq!(
        c.postgres.url.expose(),
        "postgres://debezium@payments.cluster-c1x2y3z4.eu-west-1.rds.amazonaws.com:5432/payments\
         ?sslmode=verify-full&sslrootcert=/etc/ssl/certs/rds-global-bundle.pem\
         &sslcert=/etc/debezium/tls/client.crt&sslkey=/etc/debezium/tls/client.pk8"
    );
    assert!(
        t.toml.contains("# database.sslkey is a PKCS#8 DER key"),
        "{}",
        t.toml
    );
    assert_eq!(
        (c.postgres.slot.as_str(), c.postgres.publication.as_str()),
        ("payments_outbox", "payments_outbox")
    );
    assert!(
        !c.postgres.create_publication,
        "publication.autocreate.mode = disabled"
    );
    assert_eq!(
        c.postgres.status_interval,
        std::time::Duration::from_secs(10)
    );
    assert_eq!(c.outbox.table, "payments.outbox");
    assert_eq!(c.route.topic.as_deref(), Some("payments.{aggregatetype}"));
    assert_eq!(c.route.on_error, OnError::Skip, "errors.tolerance = all");
    assert_eq!(c.route.dead_letter_topic, None);
    let k = &c.kafka;
    assert_eq!(
        k.brokers.0,
        [
            "b-1.payments.kafka.eu-west-1.amazonaws.com:9096",
            "b-2.payments.kafka.eu-west-1.amazonaws.com:9096"
        ]
    );
    assert_eq!(k.compression, config::Compression::Lz4);
    assert_eq!(k.linger, std::time::Duration::from_millis(20));
    assert_eq!(k.max_in_flight_bytes, 67_108_864);
    let props: Vec<(&str, &str)> = k
        .properties
        .0
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        props,
        [
            ("batch.size", "262144"),
            ("client.id", "payments-outbox"),
            ("max.in.flight.requests.per.connection", "5"),
            ("message.max.bytes", "2097152"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", "payments-cdc"),
            ("security.protocol", "sasl_ssl"),
            ("ssl.endpoint.identification.algorithm", "https"),
        ]
    );
    let effective = k.producer_properties().unwrap();
    assert!(effective.contains(&("acks".into(), "all".into())));
    assert!(effective.contains(&("enable.idempotence".into(), "true".into())));
    assert!(note(&t, "producer.override.sasl.jaas.config")
        .contains("FERRY_KAFKA_PROPERTIES_SASL_PASSWORD"));
    assert!(t.toml.contains("# \"sasl.password\" = \"\""));
    assert!(note(&t, "producer.override.ssl.truststore.location").contains("ssl.ca.location"));
    assert!(note(&t, "producer.override.delivery.timeout.ms").contains("order"));
    assert!(note(&t, "errors.deadletterqueue.topic.name")
        .contains("route.dead_letter_topic = \"payments.outbox.dlq\""));
    assert!(note(&t, "heartbeat.interval.ms").contains("keepalive"));
    for consumed in [
        "snapshot.mode",
        "value.converter",
        "key.converter",
        "producer.override.acks",
        "producer.override.enable.idempotence",
    ] {
        assert!(
            !noted(&t).contains(consumed),
            "{consumed} is what Ferry does"
        );
    }
    for secret in ["Sup3r-S3cret!", "kafka-s3cret", "changeit"] {
        assert!(!t.toml.contains(secret) && !notes_text(&t).contains(secret));
    }
    // The placement makes the type a header named eventType, as Debezium sent it.
    let row = SimpleRow::new()
        .with("id", oid::UUID, "4d47e190-0402-4048-bc2c-89dd54343cdc")
        .with("aggregatetype", oid::VARCHAR, "refund")
        .with("aggregateid", oid::VARCHAR, "p-9")
        .with("type", oid::VARCHAR, "RefundIssued")
        .with(
            "trace_id",
            oid::TEXT,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .with("payload", oid::TEXT, "{}");
    let r = router(&c).route_row(&row, 0).unwrap();
    assert_eq!(&*r.topic, "payments.refund");
    assert_eq!(header_names(&r), ["id", "eventType", "traceparent"]);
}

#[test]
fn unsupported_options_are_listed_with_what_to_do_instead() {
    let t = run("unsupported");
    let c = load(&t);
    assert_eq!(
        c.postgres.slot, "ferry",
        "a decoderbufs slot cannot be read with pgoutput"
    );
    assert!(note(&t, "plugin.name").contains("pg_drop_replication_slot('debezium')"));
    assert!(note(&t, "snapshot.mode").contains("never snapshots"));
    assert_eq!(c.outbox.table, "public.outbox");
    // Every table of the include list is an outbox with the SMT's mapping (the first outbox
    // in it is [outbox]); the configuration validates with them all.
    let others: Vec<&str> = c.tables.iter().map(|t| t.outbox.table.as_str()).collect();
    assert_eq!(others, ["public.orders", "inventory.outboxevent"]);
    for t in &c.tables {
        assert_eq!(t.route, c.route);
        assert_eq!(
            ferry_router::OutboxConfig {
                table: c.outbox.table.clone(),
                ..t.outbox.clone()
            },
            c.outbox
        );
    }
    assert!(!noted(&t).contains("table.include.list"));
    assert!(note(&t, "slot.drop.on.stop").contains("never drops"));
    // JsonConverter with its default schemas.enable=true: the same {"schema", "payload"} key.
    assert_eq!(
        c.route.key_format,
        ferry_router::RecordFormat::JsonWithSchema
    );
    assert!(!noted(&t).contains("key.converter"));
    assert!(note(&t, "value.converter").contains("no schema registry"));
    assert!(note(&t, "transforms.prefix.type").contains("no SMT"));
    assert!(note(&t, "producer.override.acks").contains("acks=all"));
    assert!(note(&t, "producer.override.partitioner.class").contains("murmur2"));
    assert!(note(&t, "transforms.outbox.table.op.invalid.behavior").contains("UPDATE"));
    assert!(note(&t, "topic.creation.default.partitions").contains("creates no topics"));
    for option in [
        "database.server.name",
        "decimal.handling.mode",
        "time.precision.mode",
        "topic.creation.default.replication.factor",
        "transforms.outbox.table.expand.json.payload",
        "transforms.outbox.table.json.payload.null.behavior",
        "transforms.outbox.table.fields.additional.error.on.missing",
        "transforms.outbox.table.field.event.schema.version",
        "transforms.prefix.regex",
        "transforms.prefix.replacement",
        "value.converter.schema.registry.url",
    ] {
        note(&t, option);
    }
    assert_eq!(c.route.on_error, OnError::Fail);
    assert_eq!(
        c.outbox.tracing_column.as_deref(),
        Some("tracingspancontext")
    );
}

/// Debezium's tracing options: the outbox SMT's `tracing.span.context.field` wins over an
/// `ActivateTracingSpan` transform's and the connector's; the same value twice is one column,
/// a different one is noted; the span options say what they meant.
#[test]
fn tracing_span_context_field_becomes_the_tracing_column() {
    let t = run("tracing");
    let c = load(&t);
    assert_eq!(
        c.outbox.tracing_column.as_deref(),
        Some("tracingspancontext")
    );
    assert!(t.toml.contains("creates no spans"), "{}", t.toml);
    assert!(note(&t, "transforms.tracing.tracing.span.context.field")
        .contains("a second trace-context field"));
    assert!(
        !noted(&t).contains("tracing.span.context.field"),
        "same column"
    );
    assert!(note(&t, "transforms.tracing.type").contains("creates no spans"));
    for op in [
        "tracing.operation.name",
        "transforms.tracing.tracing.operation.name",
    ] {
        assert!(note(&t, op).contains("creates no spans"), "{op}");
    }
    assert!(
        note(&t, "transforms.outbox.tracing.with.context.field.only")
            .contains("which is what true did")
    );
    let option_notes = notes_text(&t);
    assert_eq!(
        option_notes
            .matches("transforms.outbox.tracing.with.context.field.only =")
            .count(),
        1,
        "each option noted once"
    );
    // A row written for Debezium: the stored Properties text becomes the traceparent header.
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let row = SimpleRow::new()
        .with("id", oid::UUID, "4d47e190-0402-4048-bc2c-89dd54343cdc")
        .with("aggregatetype", oid::VARCHAR, "Order")
        .with("aggregateid", oid::VARCHAR, "1")
        .with("type", oid::VARCHAR, "OrderCreated")
        .with("payload", oid::JSONB, "{}")
        .with(
            "tracingspancontext",
            oid::VARCHAR,
            &format!("#Mon Nov 23 22:21:17 UTC 2026\ntraceparent={tp}\n"),
        );
    let r = router(&c).route_row(&row, 0).unwrap();
    assert_eq!(header(&r, "traceparent"), Some(tp.as_bytes()));
}

#[test]
fn debezium_1x_option_names_are_read() {
    let t = run("debezium_1x");
    let c = load(&t);
    assert_eq!(c.outbox.table, "inventory.outboxevent");
    assert_eq!(c.route.topic.as_deref(), Some("{aggregatetype}.events"));
    assert!(c.route.envelope, "type:envelope:eventType");
    let row = SimpleRow::new()
        .with("id", oid::UUID, "4d47e190-0402-4048-bc2c-89dd54343cdc")
        .with("aggregatetype", oid::VARCHAR, "Order")
        .with("aggregateid", oid::VARCHAR, "1")
        .with("type", oid::VARCHAR, "OrderCreated")
        .with("payload", oid::JSONB, r#"{"id":1}"#);
    let r = router(&c).route_row(&row, 0).unwrap();
    let value: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
    assert_eq!(
        value,
        serde_json::json!({"payload": {"id": 1}, "eventType": "OrderCreated"})
    );
}

/// `producer.override.max.request.size` raises librdkafka's `message.max.bytes` and the payload
/// limit with it: a 1.2 MB event that Debezium's producer sent is routed, not refused as too
/// large (and so never skipped under `errors.tolerance = all`); one past the raised limit still is.
#[test]
fn a_raised_request_size_raises_the_payload_limit() {
    let json = r#"{"connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "plugin.name": "pgoutput", "table.include.list": "public.outbox",
        "errors.tolerance": "all",
        "producer.override.max.request.size": "2097152",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter"}"#;
    let o = Options {
        brokers: Some("k:9092".into()),
        source: None,
        worker: None,
    };
    let t = translate(json, &o).unwrap();
    let c = load(&t);
    assert_eq!(c.kafka.properties.0["message.max.bytes"], "2097152");
    assert_eq!(c.route.max_payload_bytes, 2_097_152 - 16_960);
    let big = format!(r#"{{"blob": "{}"}}"#, "x".repeat(1_200_000));
    let r = router(&c).route_row(&order_row(&big), 0).unwrap();
    assert_eq!(r.value.as_deref().map(<[u8]>::len), Some(big.len()));
    let too_big = format!(r#"{{"blob": "{}"}}"#, "x".repeat(2_100_000));
    assert!(router(&c).route_row(&order_row(&too_big), 0).is_err());
    // Without the override, the default limit stays.
    let t = translate(&json.replace("2097152", "x"), &o).unwrap();
    assert_eq!(
        load(&t).route.max_payload_bytes,
        ferry_router::config::DEFAULT_MAX_PAYLOAD_BYTES
    );
}

/// Debezium routes logical decoding messages through `DecodeLogicalDecodingMessageContent`
/// before the router: one literal prefix becomes `outbox.message_prefix`; a list or a pattern, or
/// no list (every prefix), is noted.
#[test]
fn decoded_logical_decoding_messages_become_the_message_prefix() {
    let with = |extra: &str| {
        let json = format!(
            r#"{{"connector.class": "io.debezium.connector.postgresql.PostgresConnector",
                "plugin.name": "pgoutput", "table.include.list": "public.outbox",
                "transforms": "decode,outbox",
                "transforms.decode.type": "io.debezium.connector.postgresql.transforms.DecodeLogicalDecodingMessageContent",
                "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter"{extra}}}"#
        );
        let o = Options {
            brokers: Some("k:9092".into()),
            source: None,
            worker: None,
        };
        translate(&json, &o).unwrap()
    };
    let t = with(r#", "message.prefix.include.list": "outbox""#);
    assert_eq!(load(&t).outbox.message_prefix.as_deref(), Some("outbox"));
    assert!(!noted(&t).contains("transforms.decode.type"));
    assert!(!noted(&t).contains("message.prefix.include.list"));
    let t = with(r#", "message.prefix.include.list": "app\\.events""#);
    assert_eq!(
        load(&t).outbox.message_prefix.as_deref(),
        Some("app.events")
    );
    for extra in [
        r#", "message.prefix.include.list": "a,b""#,
        r#", "message.prefix.include.list": "out.*""#,
        "",
    ] {
        let t = with(extra);
        assert_eq!(load(&t).outbox.message_prefix, None, "{extra}");
        assert!(
            note(&t, "message.prefix.include.list").contains("one prefix"),
            "{extra}"
        );
    }
}

/// An outbox row of the reference DDL (`aggregateid` "42") with `payload` as jsonb.
fn order_row(payload: &str) -> SimpleRow {
    SimpleRow::new()
        .with("id", oid::UUID, "4d47e190-0402-4048-bc2c-89dd54343cdc")
        .with("aggregatetype", oid::VARCHAR, "order")
        .with("aggregateid", oid::VARCHAR, "42")
        .with("type", oid::VARCHAR, "OrderCreated")
        .with("payload", oid::JSONB, payload)
}

/// The worker's converters (connect-distributed.properties) fill in what the connector config
/// leaves to them, and the records routed with the result are the connector's bytes.
#[test]
fn worker_converters_become_the_key_and_value_formats() {
    let worker = "# connect-distributed.properties\n\
                  bootstrap.servers=kafka-1:9092,kafka-2:9092\n\
                  group.id=connect-cluster\n\
                  key.converter=org.apache.kafka.connect.json.JsonConverter\n\
                  value.converter=org.apache.kafka.connect.json.JsonConverter\n\
                  key.converter.schemas.enable=false\n";
    let options = Options {
        brokers: None,
        source: None,
        worker: Some(worker.into()),
    };
    let t = translate(&fixture_json("defaults"), &options).unwrap();
    let c = load(&t);
    assert_eq!(c.kafka.brokers.0, ["kafka-1:9092", "kafka-2:9092"]);
    assert_eq!(c.route.key_format, ferry_router::RecordFormat::Json);
    assert_eq!(
        c.route.value_format,
        ferry_router::RecordFormat::JsonWithSchema
    );
    for gone in [
        "key.converter",
        "value.converter",
        "bootstrap.servers",
        "group.id",
    ] {
        assert!(!noted(&t).contains(gone), "{gone}:\n{}", notes_text(&t));
    }
    let row = order_row(r#"{"total": 39.98}"#);
    let r = router(&c).route_row(&row, 0).unwrap();
    assert_eq!(r.key.as_deref(), Some(&b"\"42\""[..]));
    assert_eq!(
        r.value.as_deref(),
        Some(&br#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"{\"total\": 39.98}"}"#[..])
    );
    // The connector's own setting wins over the worker's.
    let json = fixture_json("ssl_sasl");
    let t = translate(&json, &options).unwrap();
    assert_eq!(
        load(&t).route.value_format,
        ferry_router::RecordFormat::AsStored
    );
    // A malformed worker file is an error, not a silent default.
    let bad = Options {
        worker: Some("key.converter=\\u12".into()),
        ..options
    };
    assert!(translate(&json, &bad)
        .unwrap_err()
        .to_string()
        .contains("worker"));
}

/// `table.expand.json.payload = true` under JsonConverter with schemas (the worker's default
/// `schemas.enable`): the schema Debezium inferred from each payload, named after the payload
/// column; with envelope fields (whose struct Debezium named after topic.prefix) a note.
#[test]
fn an_expanded_payload_under_a_schema_becomes_json_expanded_with_schema() {
    let worker = "value.converter=org.apache.kafka.connect.json.JsonConverter\n";
    let options = Options {
        brokers: None,
        source: None,
        worker: Some(worker.into()),
    };
    // The connector config with one more option of the outbox SMT.
    let smt_option = |json: &str, option: &str, value: &str| {
        json.replace(
            "\"transforms.outbox.type\"",
            &format!(
                "\"transforms.outbox.{option}\": \"{value}\",\n    \"transforms.outbox.type\""
            ),
        )
    };
    let json = smt_option(
        &fixture_json("defaults"),
        "table.expand.json.payload",
        "true",
    );
    let t = translate(&json, &options).unwrap();
    let c = load(&t);
    assert_eq!(
        c.route.value_format,
        ferry_router::RecordFormat::JsonExpandedWithSchema
    );
    for gone in [
        "value.converter",
        "transforms.outbox.table.expand.json.payload",
    ] {
        assert!(!noted(&t).contains(gone), "{gone}:\n{}", notes_text(&t));
    }
    let row = order_row(r#"{"total": 39.98}"#);
    let r = router(&c).route_row(&row, 0).unwrap();
    assert_eq!(
        r.value.as_deref(),
        Some(&br#"{"schema":{"type":"struct","fields":[{"type":"double","optional":true,"field":"total"}],"optional":true,"name":"payload"},"payload":{"total":39.98}}"#[..])
    );
    // table.json.payload.null.behavior comes along.
    let nulls = smt_option(&json, "table.json.payload.null.behavior", "optional_bytes");
    let t = translate(&nulls, &options).unwrap();
    let c = load(&t);
    assert_eq!(
        c.route.expand_null_behavior,
        ferry_router::ExpandNullBehavior::OptionalBytes
    );
    assert!(!noted(&t).contains("null.behavior"), "{}", notes_text(&t));
    let r = router(&c)
        .route_row(&order_row(r#"{"a": null}"#), 0)
        .unwrap();
    assert_eq!(
        r.value.as_deref(),
        Some(&br#"{"schema":{"type":"struct","fields":[{"type":"bytes","optional":true,"field":"a"}],"optional":true,"name":"payload"},"payload":{"a":null}}"#[..])
    );
    // Envelope fields under a schema: no format reproduces them, and the notes say so.
    let json = smt_option(
        &json,
        "table.fields.additional.placement",
        "type:envelope:eventType",
    );
    let t = translate(&json, &options).unwrap();
    assert!(note(&t, "value.converter").contains("topic.prefix"));
    assert!(note(&t, "transforms.outbox.table.expand.json.payload").contains("without envelope"));
}

#[test]
fn brokers_from_the_flag_and_the_environment_over_the_file() {
    let json = fixture_json("defaults");
    let options = Options {
        brokers: Some("kafka-1:9092,kafka-2:9092".into()),
        source: None,
        worker: None,
    };
    let t = translate(&json, &options).unwrap();
    assert_eq!(load(&t).kafka.brokers.0, ["kafka-1:9092", "kafka-2:9092"]);
    assert!(!noted(&t).contains("bootstrap.servers"));
    let env = [
        (
            "FERRY_POSTGRES_URL",
            "postgres://debezium:dbz@postgres:5432/orderdb",
        ),
        ("FERRY_KAFKA_BROKERS", "kafka:9092"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let c = config::load(Some(&run("defaults").toml), env).unwrap();
    assert_eq!(
        c.postgres.url.expose(),
        "postgres://debezium:dbz@postgres:5432/orderdb"
    );
    assert_eq!(c.kafka.brokers.0, ["kafka:9092"]);
}

/// Option values that stress quoting, regexes, URLs and names.
fn hostile() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,24}",
        "\\PC{0,12}",
        Just("a\"b\\c\nd".to_owned()),
        Just("${file:/x:y}".to_owned()),
        Just("(?<v>.*)".to_owned()),
    ]
}

proptest! {
    /// Whatever the values, the translation succeeds and its output is a ferry.toml that parses
    /// (it may not validate: a note then says what to fix).
    #[test]
    fn any_option_values_give_parsable_toml(
        values in proptest::collection::vec(hostile(), 14),
    ) {
        let keys = [
            "database.hostname", "database.user", "database.dbname", "database.sslmode",
            "database.sslrootcert", "slot.name", "table.include.list",
            "transforms.o.route.topic.regex", "transforms.o.route.topic.replacement",
            "transforms.o.table.fields.additional.placement", "transforms.o.route.by.field",
            "producer.override.sasl.jaas.config", "producer.override.linger.ms",
            "status.update.interval.ms",
        ];
        let mut map = serde_json::Map::new();
        map.insert("transforms".into(), "o".into());
        map.insert("transforms.o.type".into(), ferry::debezium::EVENT_ROUTER_CLASS.into());
        for (k, v) in keys.iter().zip(values) {
            map.insert((*k).into(), v.into());
        }
        let json = serde_json::Value::Object(map).to_string();
        let t = translate(&json, &Options::default()).unwrap();
        prop_assert!(Config::from_toml(&t.toml).is_ok(), "{}", t.toml);
    }
}

/// A connector config with the outbox SMT and `extra` options.
fn with(extra: &[(&str, &str)]) -> Translation {
    let mut map = serde_json::Map::new();
    map.insert(
        "connector.class".into(),
        ferry::debezium::POSTGRES_CONNECTOR_CLASS.into(),
    );
    map.insert("database.hostname".into(), "db".into());
    map.insert("database.user".into(), "cdc".into());
    map.insert("plugin.name".into(), "pgoutput".into());
    map.insert("transforms".into(), "outbox".into());
    map.insert(
        "transforms.outbox.type".into(),
        ferry::debezium::EVENT_ROUTER_CLASS.into(),
    );
    for (k, v) in extra {
        map.insert((*k).into(), (*v).into());
    }
    translate(
        &serde_json::Value::Object(map).to_string(),
        &Options::default(),
    )
    .unwrap()
}

#[test]
fn key_stores_kerberos_and_oauth_map_to_librdkafka_or_say_how() {
    let t = with(&[
        ("producer.override.ssl.truststore.type", "PEM"),
        (
            "producer.override.ssl.truststore.location",
            "/etc/kafka/ca.pem",
        ),
        ("producer.override.ssl.keystore.type", "PKCS12"),
        (
            "producer.override.ssl.keystore.location",
            "/etc/kafka/client.p12",
        ),
        ("producer.override.ssl.keystore.password", "keystore-pass"),
        (
            "producer.override.sasl.jaas.config",
            "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true \
             keyTab=\"/etc/security/ferry.keytab\" principal=\"ferry@EXAMPLE.COM\";",
        ),
    ]);
    let c = load(&t);
    let p = &c.kafka.properties.0;
    assert_eq!(p["ssl.ca.location"], "/etc/kafka/ca.pem");
    assert_eq!(p["ssl.keystore.location"], "/etc/kafka/client.p12");
    assert!(!p.contains_key("ssl.keystore.password"));
    assert!(note(&t, "producer.override.ssl.keystore.password")
        .contains("FERRY_KAFKA_PROPERTIES_SSL_KEYSTORE_PASSWORD"));
    assert_eq!(p["sasl.kerberos.keytab"], "/etc/security/ferry.keytab");
    assert_eq!(p["sasl.kerberos.principal"], "ferry@EXAMPLE.COM");
    assert!(!t.toml.contains("keystore-pass") && !notes_text(&t).contains("keystore-pass"));

    let t = with(&[(
        "producer.override.sasl.jaas.config",
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required \
         clientId=\"ferry\" clientSecret=\"oauth-secret\";",
    )]);
    load(&t);
    assert!(note(&t, "producer.override.sasl.jaas.config").contains("sasl.oauthbearer.method"));
    assert!(!notes_text(&t).contains("oauth-secret"));
}

#[test]
fn zstd_compression_is_translated() {
    let t = with(&[("producer.override.compression.type", "zstd")]);
    assert_eq!(load(&t).kafka.compression, config::Compression::Zstd);
    assert!(
        !notes_text(&t).contains("compression.type"),
        "{}",
        notes_text(&t)
    );
}

#[test]
fn what_ferry_would_refuse_is_noted_not_hidden() {
    // A Java-only regex construct (look-ahead), and a placement duplicating the id header.
    let t = with(&[
        ("transforms.outbox.route.topic.regex", "(?=Order)(?<v>.*)"),
        ("transforms.outbox.route.topic.replacement", "t.${v}"),
        (
            "transforms.outbox.table.fields.additional.placement",
            "id:header",
        ),
    ]);
    assert!(Config::from_toml(&t.toml).is_ok(), "it still parses");
    let refused: Vec<&str> = t
        .notes
        .iter()
        .filter(|n| n.option == "(translated configuration)")
        .map(|n| n.reason.as_str())
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(refused[0].contains("route.rules[0].regex"), "{refused:?}");
    assert!(refused[1].contains("duplicate header name"), "{refused:?}");
}

#[test]
fn mixed_case_and_pattern_include_lists() {
    let t = with(&[("table.include.list", "Sales\\.OutboxEvent")]);
    assert_eq!(load(&t).outbox.table, "Sales.OutboxEvent");
    assert!(t.toml.contains("case-insensitively"));
    let t = with(&[("table.include.list", "public\\.outbox_.*")]);
    assert_eq!(load(&t).outbox.table, "public.outbox");
    assert!(note(&t, "table.include.list").contains("a pattern"));
    // Names and a pattern: the names are relayed (once each), the pattern is noted.
    let t = with(&[(
        "table.include.list",
        "outbox,billing\\.outbox,public.outbox,billing.outbox_.*",
    )]);
    let c = load(&t);
    assert_eq!(c.outbox.table, "outbox");
    let others: Vec<&str> = c.tables.iter().map(|t| t.outbox.table.as_str()).collect();
    assert_eq!(others, ["billing.outbox"]);
    assert!(note(&t, "table.include.list").contains("add a [[tables]] entry"));
}
