//! Table-driven routing tests: one case per option and per error, each a config (TOML), a change to
//! the base row, and what the record (or error) must look like. Each case is its own `#[test]`
//! (`options::fixed_topic`, `errors::null_id`), so a failure names the case and the others still
//! run; `cargo test -p ferry-router --test routing fixed_topic` runs one.

mod common;

use common::{base_row, router, COMMIT_MICROS, COMMIT_MS, EVENT_ID};
use ferry_router::{oid, Record, RouteError, SimpleRow};

#[derive(Debug)]
enum Want {
    Topic(&'static str),
    Key(Option<&'static [u8]>),
    Value(Option<&'static [u8]>),
    /// The value parsed as JSON equals this JSON text.
    JsonValue(&'static str),
    /// Header names, in order.
    HeaderNames(&'static [&'static str]),
    Header(&'static str, Option<&'static [u8]>),
    Partition(Option<i32>),
    Timestamp(i64),
    /// Error code, and a fragment its Display must contain.
    Err(&'static str, &'static str),
    /// The event id the error names.
    ErrEventId(Option<&'static str>),
}

struct Case {
    name: &'static str,
    config: &'static str,
    row: fn(SimpleRow) -> SimpleRow,
    want: &'static [Want],
}

fn same(r: SimpleRow) -> SimpleRow {
    r
}

fn check(case: &Case, got: &Result<Record, RouteError>) {
    let name = case.name;
    for w in case.want {
        match (w, got) {
            (Want::Err(code, fragment), Err(e)) => {
                assert_eq!(e.code(), *code, "{name}: {e}");
                let text = e.to_string();
                assert!(
                    text.contains(fragment),
                    "{name}: {text:?} lacks {fragment:?}"
                );
            }
            (Want::ErrEventId(id), Err(e)) => {
                assert_eq!(e.event_id.as_deref(), *id, "{name}: {e}")
            }
            (Want::Err(..) | Want::ErrEventId(_), Ok(r)) => {
                panic!("{name}: expected an error, got {r:?}")
            }
            (_, Err(e)) => panic!("{name}: expected a record, got error: {e}"),
            (Want::Topic(t), Ok(r)) => assert_eq!(&*r.topic, *t, "{name}"),
            (Want::Key(k), Ok(r)) => assert_eq!(r.key.as_deref(), *k, "{name}"),
            (Want::Value(v), Ok(r)) => assert_eq!(r.value.as_deref(), *v, "{name}"),
            (Want::JsonValue(j), Ok(r)) => {
                let got: serde_json::Value =
                    serde_json::from_slice(r.value.as_deref().expect("a value"))
                        .expect("JSON value");
                let want: serde_json::Value = serde_json::from_str(j).unwrap();
                assert_eq!(got, want, "{name}");
            }
            (Want::HeaderNames(names), Ok(r)) => {
                let got: Vec<&str> = r.headers.iter().map(|(n, _)| &**n).collect();
                assert_eq!(&got, names, "{name}");
            }
            (Want::Header(h, v), Ok(r)) => {
                let found = r.headers.iter().find(|(n, _)| &**n == *h);
                let found = found.unwrap_or_else(|| panic!("{name}: no header {h}"));
                assert_eq!(found.1.as_deref(), *v, "{name}: header {h}");
            }
            (Want::Partition(p), Ok(r)) => assert_eq!(r.partition, *p, "{name}"),
            (Want::Timestamp(t), Ok(r)) => assert_eq!(r.timestamp_ms, Some(*t), "{name}"),
        }
    }
    if let Ok(r) = got {
        assert!(
            ferry_router::validate_topic(r.topic.as_bytes()).is_ok(),
            "{name}"
        );
    }
}

fn run(case: &Case) {
    let router = router(case.config);
    let row = (case.row)(base_row());
    check(case, &router.route_row(&row, COMMIT_MICROS));
}

/// One `#[test]` per case, named by its identifier.
macro_rules! cases {
    ($($test:ident: $case:expr,)*) => {
        $(
            #[test]
            fn $test() {
                run(&$case);
            }
        )*
    };
}

const PAYLOAD: &[u8] = br#"{"total": 39.98}"#;
const ID_BYTES: &[u8] = EVENT_ID.as_bytes();

mod options {
    use super::*;

    cases! {
        defaults_are_debeziums: Case {
            name: "defaults are Debezium's",
            config: "",
            row: same,
            want: &[
                Want::Topic("outbox.event.order"),
                Want::Key(Some(b"42")),
                Want::Value(Some(PAYLOAD)),
                Want::HeaderNames(&["id", "type"]),
                Want::Header("id", Some(ID_BYTES)),
                Want::Header("type", Some(b"OrderCreated")),
                Want::Partition(None),
                Want::Timestamp(COMMIT_MS),
            ],
        },
        every_column_renamed: Case {
            name: "every column renamed",
            config: r#"[outbox]
                id_column = "event_id"
                aggregate_type_column = "kind"
                aggregate_id_column = "entity"
                type_column = "event_type"
                payload_column = "body""#,
            row: |r| {
                r.without("id")
                    .without("aggregatetype")
                    .without("aggregateid")
                    .without("type")
                    .without("payload")
                    .with("event_id", oid::INT8, "1001")
                    .with("kind", oid::TEXT, "invoice")
                    .with("entity", oid::TEXT, "inv-7")
                    .with("event_type", oid::TEXT, "InvoicePaid")
                    .with("body", oid::JSON, "{}")
            },
            want: &[
                Want::Topic("outbox.event.invoice"),
                Want::Key(Some(b"inv-7")),
                Want::Value(Some(b"{}")),
                Want::Header("id", Some(b"1001")),
                Want::Header("type", Some(b"InvoicePaid")),
            ],
        },
        fixed_topic: Case {
            name: "fixed topic",
            config: "[route]\ntopic = \"all-events\"",
            row: |r| r.null("aggregatetype", oid::VARCHAR),
            want: &[Want::Topic("all-events")],
        },
        fixed_topic_needs_no_aggregate_type_column: Case {
            name: "fixed topic needs no aggregate type column",
            config: "[route]\ntopic = \"all-events\"",
            row: |r| r.without("aggregatetype"),
            want: &[Want::Topic("all-events")],
        },
        template_over_two_columns: Case {
            name: "template over two columns",
            config: "[route]\ntopic = \"{tenant}.{aggregatetype}.v{version}\"",
            row: same,
            want: &[Want::Topic("acme.order.v7")],
        },
        equals_rule_matches: Case {
            name: "equals rule matches",
            config: r#"[[route.rules]]
                column = "aggregatetype"
                equals = "order"
                topic = "orders""#,
            row: same,
            want: &[Want::Topic("orders")],
        },
        equals_rule_does_not_match_default_template: Case {
            name: "equals rule does not match: default template",
            config: r#"[[route.rules]]
                column = "aggregatetype"
                equals = "Order"
                topic = "orders""#,
            row: same,
            want: &[Want::Topic("outbox.event.order")],
        },
        regex_rule_with_a_named_group_debezium_route_topic_regex: Case {
            name: "regex rule with a named group (Debezium route.topic.regex)",
            config: r#"[[route.rules]]
                column = "aggregatetype"
                regex = "(?<routedByValue>.*)"
                topic = "outbox.event.${routedByValue}""#,
            row: same,
            want: &[Want::Topic("outbox.event.order")],
        },
        regex_rule_with_numbered_groups_and_a_column: Case {
            name: "regex rule with numbered groups and a column",
            config: r#"[[route.rules]]
                column = "type"
                regex = "([A-Z][a-z]+)([A-Z][a-z]+)"
                topic = "{tenant}.$1.$2""#,
            row: same,
            want: &[Want::Topic("acme.Order.Created")],
        },
        regex_must_match_the_whole_value: Case {
            name: "regex must match the whole value",
            config: r#"[[route.rules]]
                column = "type"
                regex = "Order"
                topic = "orders""#,
            row: same,
            want: &[Want::Topic("outbox.event.order")],
        },
        first_matching_rule_wins: Case {
            name: "first matching rule wins",
            config: r#"[[route.rules]]
                column = "tenant"
                equals = "other"
                topic = "never"
                [[route.rules]]
                column = "tenant"
                regex = "ac.*"
                topic = "second"
                [[route.rules]]
                column = "aggregatetype"
                equals = "order"
                topic = "third""#,
            row: same,
            want: &[Want::Topic("second")],
        },
        a_rule_on_a_null_column_does_not_match: Case {
            name: "a rule on a NULL column does not match",
            config: r#"[[route.rules]]
                column = "tenant"
                regex = ".*"
                topic = "tenant-topic""#,
            row: |r| r.null("tenant", oid::TEXT),
            want: &[Want::Topic("outbox.event.order")],
        },
        extra_headers_named_and_unnamed_null_value: Case {
            name: "extra headers, named and unnamed, NULL value",
            config: r#"[[route.headers]]
                column = "tenant"
                name = "tenant-id"
                [[route.headers]]
                column = "version"
                [[route.headers]]
                column = "missing_value""#,
            row: |r| r.null("missing_value", oid::TEXT),
            want: &[
                Want::HeaderNames(&["id", "type", "tenant-id", "version", "missing_value"]),
                Want::Header("tenant-id", Some(b"acme")),
                Want::Header("version", Some(b"7")),
                Want::Header("missing_value", None),
            ],
        },
        id_and_type_headers_renamed: Case {
            name: "id and type headers renamed",
            config: "[route]\nid_header = \"eventId\"\ntype_header = \"eventType\"",
            row: same,
            want: &[
                Want::HeaderNames(&["eventId", "eventType"]),
                Want::Header("eventType", Some(b"OrderCreated")),
            ],
        },
        id_and_type_headers_off: Case {
            name: "id and type headers off",
            config: "[route]\nid_header = \"\"\ntype_header = \"\"",
            row: |r| r.without("type"),
            want: &[Want::HeaderNames(&[])],
        },
        null_type_gives_a_null_type_header: Case {
            name: "NULL type gives a null type header",
            config: "",
            row: |r| r.null("type", oid::VARCHAR),
            want: &[Want::Header("type", None)],
        },
        envelope_with_fields: Case {
            name: "envelope with fields",
            config: "[route]\nenvelope = true\nenvelope_fields = [\"type\", \"version\", \"tenant\", \"nothing\"]",
            row: |r| r.null("nothing", oid::TEXT),
            want: &[Want::JsonValue(
                r#"{"payload": {"total": 39.98}, "type": "OrderCreated", "version": 7, "tenant": "acme", "nothing": null}"#,
            )],
        },
        envelope_with_a_text_payload_embeds_a_string: Case {
            name: "envelope with a text payload embeds a string",
            config: "[route]\nenvelope = true",
            row: |r| r.with("payload", oid::TEXT, "not json \"quoted\""),
            want: &[Want::JsonValue(r#"{"payload": "not json \"quoted\""}"#)],
        },
        envelope_with_a_bytea_payload_embeds_base64: Case {
            name: "envelope with a bytea payload embeds base64",
            config: "[route]\nenvelope = true",
            row: |r| r.with("payload", oid::BYTEA, "\\x666f6f"),
            want: &[Want::JsonValue(r#"{"payload": "Zm9v"}"#)],
        },
        tombstone_on_null_payload: Case {
            name: "tombstone on NULL payload",
            config: "[route]\ntombstone_on_null_payload = true",
            row: |r| r.null("payload", oid::JSONB),
            want: &[Want::Value(None), Want::Key(Some(b"42"))],
        },
        tombstone_on_blank_payload_debezium_parity: Case {
            name: "tombstone on blank payload (Debezium parity)",
            config: "[route]\ntombstone_on_null_payload = true",
            row: |r| r.with("payload", oid::TEXT, " \n"),
            want: &[Want::Value(None)],
        },
        blank_payload_is_a_value_when_tombstones_are_off: Case {
            name: "blank payload is a value when tombstones are off",
            config: "",
            row: |r| r.with("payload", oid::TEXT, ""),
            want: &[Want::Value(Some(b""))],
        },
        send_null_payload_as_a_null_value: Case {
            name: "send_null_payload: a NULL payload is a null value with its key (Debezium parity)",
            config: "[route]\nsend_null_payload = true",
            row: |r| r.null("payload", oid::JSONB),
            want: &[Want::Value(None), Want::Key(Some(b"42"))],
        },
        send_null_payload_keeps_a_blank_payload: Case {
            name: "send_null_payload keeps blank text a payload (unlike a tombstone)",
            config: "[route]\nsend_null_payload = true",
            row: |r| r.with("payload", oid::TEXT, " \n"),
            want: &[Want::Value(Some(b" \n"))],
        },
        send_null_payload_in_an_envelope: Case {
            name: "send_null_payload in an envelope: the payload field is null",
            config: "[route]\nsend_null_payload = true\nenvelope = true",
            row: |r| r.null("payload", oid::JSONB),
            want: &[Want::JsonValue(r#"{"payload": null}"#)],
        },
        envelope_keeps_a_tombstone_a_tombstone: Case {
            name: "envelope keeps a tombstone a tombstone",
            config: "[route]\ntombstone_on_null_payload = true\nenvelope = true",
            row: |r| r.null("payload", oid::JSONB),
            want: &[Want::Value(None)],
        },
        bytea_payload_is_sent_as_raw_bytes: Case {
            name: "bytea payload is sent as raw bytes",
            config: "",
            row: |r| r.with("payload", oid::BYTEA, "\\x00ff0a"),
            want: &[Want::Value(Some(b"\x00\xff\x0a"))],
        },
        text_payload_is_sent_as_stored: Case {
            name: "text payload is sent as stored",
            config: "",
            row: |r| r.with("payload", oid::TEXT, "plain text, not JSON"),
            want: &[Want::Value(Some(b"plain text, not JSON"))],
        },
        timestamp_column: Case {
            name: "timestamp column",
            config: "[outbox]\ntimestamp_column = \"created_at\"",
            row: same,
            want: &[Want::Timestamp(1_795_341_600_123)],
        },
        null_timestamp_column_falls_back_to_commit_time: Case {
            name: "NULL timestamp column falls back to commit time",
            config: "[outbox]\ntimestamp_column = \"created_at\"",
            row: |r| r.null("created_at", oid::TIMESTAMPTZ),
            want: &[Want::Timestamp(COMMIT_MS)],
        },
        integer_timestamp_column_is_epoch_ms: Case {
            name: "integer timestamp column is epoch ms",
            config: "[outbox]\ntimestamp_column = \"created_at\"",
            row: |r| r.with("created_at", oid::INT8, "1700000000123"),
            want: &[Want::Timestamp(1_700_000_000_123)],
        },
        timestamp_without_time_zone_is_utc: Case {
            name: "timestamp without time zone is UTC",
            config: "[outbox]\ntimestamp_column = \"created_at\"",
            row: |r| r.with("created_at", oid::TIMESTAMP, "2026-11-22 10:00:00"),
            want: &[Want::Timestamp(1_795_341_600_000)],
        },
        partition_column: Case {
            name: "partition column",
            config: "[outbox]\npartition_column = \"part\"",
            row: same,
            want: &[Want::Partition(Some(3)), Want::Key(Some(b"42"))],
        },
        null_partition_column_by_key: Case {
            name: "NULL partition column: by key",
            config: "[outbox]\npartition_column = \"part\"",
            row: |r| r.null("part", oid::INT4),
            want: &[Want::Partition(None)],
        },
        debezium_additional_placement: Case {
            name: "Debezium additional placement",
            config: "[route]\nenvelope = true\nadditional_placement = \"type:header:eventType,tenant:envelope:tenantId,part:partition,version:envelope\"",
            row: same,
            want: &[
                Want::HeaderNames(&["id", "type", "eventType"]),
                Want::Header("eventType", Some(b"OrderCreated")),
                Want::JsonValue(r#"{"payload": {"total": 39.98}, "tenantId": "acme", "version": 7}"#),
                Want::Partition(Some(3)),
            ],
        },
        bytea_aggregate_id_is_decoded_for_the_key: Case {
            name: "bytea aggregate id is decoded for the key",
            config: "",
            row: |r| r.with("aggregateid", oid::BYTEA, "\\x6b6579"),
            want: &[Want::Key(Some(b"key"))],
        },
        null_aggregate_id_keyless_record: Case {
            name: "NULL aggregate id: keyless record",
            config: "",
            row: |r| r.null("aggregateid", oid::VARCHAR),
            want: &[Want::Key(None)],
        },
        uuid_aggregate_id_is_its_text_never_json_quoted: Case {
            name: "uuid aggregate id is its text, never JSON-quoted",
            config: "",
            row: |r| r.with("aggregateid", oid::UUID, EVENT_ID),
            want: &[Want::Key(Some(ID_BYTES))],
        },
        binary_format_columns: Case {
            name: "binary-format columns",
            config: "[outbox]\ntimestamp_column = \"created_at\"",
            row: |r| {
                r.binary(
                    "id",
                    oid::UUID,
                    &[
                        0x4d, 0x47, 0xe1, 0x90, 0x04, 0x02, 0x40, 0x48, 0xbc, 0x2c, 0x89, 0xdd, 0x54,
                        0x34, 0x3c, 0xdc,
                    ],
                )
                .binary("payload", oid::JSONB, b"\x01{\"total\": 39.98}")
                .binary("aggregateid", oid::INT8, &42i64.to_be_bytes())
                .binary("created_at", oid::TIMESTAMPTZ, &0i64.to_be_bytes())
            },
            want: &[
                Want::Header("id", Some(ID_BYTES)),
                Want::Value(Some(PAYLOAD)),
                Want::Key(Some(b"42")),
                Want::Timestamp(946_684_800_000),
            ],
        },
        payload_exactly_at_the_limit: Case {
            name: "payload exactly at the limit",
            config: "[route]\nmax_payload_bytes = 16",
            row: same,
            want: &[Want::Value(Some(PAYLOAD))],
        },
    }
}

mod errors {
    use super::*;

    cases! {
        no_id_column: Case {
            name: "no id column",
            config: "",
            row: |r| r.without("id"),
            want: &[
                Want::Err("missing_column", "no column \"id\""),
                Want::Err("missing_column", "outbox.id_column"),
                Want::ErrEventId(None),
            ],
        },
        null_id: Case {
            name: "NULL id",
            config: "",
            row: |r| r.null("id", oid::UUID),
            want: &[
                Want::Err("null_value", "\"id\" (the event id) is NULL"),
                Want::ErrEventId(None),
            ],
        },
        no_aggregate_type_column: Case {
            name: "no aggregate type column",
            config: "",
            row: |r| r.without("aggregatetype"),
            want: &[
                Want::Err("missing_column", "no column \"aggregatetype\""),
                Want::Err("missing_column", EVENT_ID),
                Want::ErrEventId(Some(EVENT_ID)),
            ],
        },
        null_aggregate_type_with_a_template_that_needs_it: Case {
            name: "NULL aggregate type with a template that needs it",
            config: "",
            row: |r| r.null("aggregatetype", oid::VARCHAR),
            want: &[
                Want::Err("null_value", "topic template needs its value"),
                Want::ErrEventId(Some(EVENT_ID)),
            ],
        },
        no_aggregate_id_column: Case {
            name: "no aggregate id column",
            config: "",
            row: |r| r.without("aggregateid"),
            want: &[Want::Err("missing_column", "outbox.aggregate_id_column")],
        },
        no_payload_column: Case {
            name: "no payload column",
            config: "",
            row: |r| r.without("payload"),
            want: &[Want::Err("missing_column", "outbox.payload_column")],
        },
        null_payload_without_tombstones: Case {
            name: "NULL payload without tombstones",
            config: "",
            row: |r| r.null("payload", oid::JSONB),
            want: &[Want::Err(
                "null_payload",
                "route.tombstone_on_null_payload = true",
            )],
        },
        no_type_column_with_the_type_header_on: Case {
            name: "no type column with the type header on",
            config: "",
            row: |r| r.without("type"),
            want: &[Want::Err("missing_column", "route.type_header = \"\"")],
        },
        illegal_character_in_the_routed_topic: Case {
            name: "illegal character in the routed topic",
            config: "",
            row: |r| r.with("aggregatetype", oid::VARCHAR, "purchase order"),
            want: &[Want::Err(
                "invalid_topic",
                "\"outbox.event.purchase order\" is not a legal Kafka topic name: ' ' at byte 21",
            )],
        },
        non_ascii_in_the_routed_topic: Case {
            name: "non-ASCII in the routed topic",
            config: "",
            row: |r| r.with("aggregatetype", oid::VARCHAR, "commande-réglée"),
            want: &[Want::Err("invalid_topic", "'é'")],
        },
        routed_topic_too_long: Case {
            name: "routed topic too long",
            config: "[route]\ntopic = \"{aggregatetype}\"",
            row: |r| r.with("aggregatetype", oid::VARCHAR, &"x".repeat(250)),
            want: &[Want::Err("invalid_topic", "250 characters long")],
        },
        empty_routed_topic: Case {
            name: "empty routed topic",
            config: "[route]\ntopic = \"{aggregatetype}\"",
            row: |r| r.with("aggregatetype", oid::VARCHAR, ""),
            want: &[Want::Err("invalid_topic", "empty")],
        },
        routed_topic: Case {
            name: "routed topic '..'",
            config: "[route]\ntopic = \"{aggregatetype}\"",
            row: |r| r.with("aggregatetype", oid::VARCHAR, ".."),
            want: &[Want::Err("invalid_topic", "\"..\" are not legal")],
        },
        regex_capture_yields_an_illegal_topic: Case {
            name: "regex capture yields an illegal topic",
            config: r#"[[route.rules]]
                column = "tenant"
                regex = "(.*)"
                topic = "t.$1""#,
            row: |r| r.with("tenant", oid::TEXT, "a/b"),
            want: &[Want::Err("invalid_topic", "\"t.a/b\"")],
        },
        no_column_for_a_rule: Case {
            name: "no column for a rule",
            config: r#"[[route.rules]]
                column = "region"
                equals = "eu"
                topic = "eu""#,
            row: same,
            want: &[
                Want::Err("missing_column", "no column \"region\""),
                Want::Err("missing_column", "route.rules"),
            ],
        },
        payload_over_the_limit: Case {
            name: "payload over the limit",
            config: "[route]\nmax_payload_bytes = 15",
            row: same,
            want: &[Want::Err(
                "payload_too_large",
                "16 bytes, over route.max_payload_bytes = 15",
            )],
        },
        envelope_over_the_limit: Case {
            name: "envelope over the limit",
            config: "[route]\nmax_payload_bytes = 20\nenvelope = true",
            row: same,
            want: &[Want::Err(
                "payload_too_large",
                "over route.max_payload_bytes = 20",
            )],
        },
        unparsable_timestamp: Case {
            name: "unparsable timestamp",
            config: "[outbox]\ntimestamp_column = \"created_at\"",
            row: |r| r.with("created_at", oid::TEXT, "Sun Nov 22 10:00:00 2026"),
            want: &[
                Want::Err("invalid_value", "\"created_at\" (the timestamp)"),
                Want::Err("invalid_value", "DateStyle"),
            ],
        },
        no_timestamp_column: Case {
            name: "no timestamp column",
            config: "[outbox]\ntimestamp_column = \"created\"",
            row: same,
            want: &[Want::Err("missing_column", "outbox.timestamp_column")],
        },
        negative_partition: Case {
            name: "negative partition",
            config: "[outbox]\npartition_column = \"part\"",
            row: |r| r.with("part", oid::INT4, "-1"),
            want: &[Want::Err("invalid_value", "partition -1 is out of range")],
        },
        non_integer_partition: Case {
            name: "non-integer partition",
            config: "[outbox]\npartition_column = \"part\"",
            row: |r| r.with("part", oid::TEXT, "three"),
            want: &[Want::Err("invalid_value", "not an integer")],
        },
        no_partition_column: Case {
            name: "no partition column",
            config: "[route]\nadditional_placement = \"shard:partition\"",
            row: same,
            want: &[Want::Err("missing_column", "no column \"shard\"")],
        },
        bad_bytea_text: Case {
            name: "bad bytea text",
            config: "",
            row: |r| r.with("payload", oid::BYTEA, "\\x0g"),
            want: &[Want::Err("invalid_value", "non-hex digit")],
        },
        no_column_for_an_extra_header: Case {
            name: "no column for an extra header",
            config: "[[route.headers]]\ncolumn = \"trace\"",
            row: same,
            want: &[Want::Err("missing_column", "route.headers")],
        },
        no_column_for_an_envelope_field: Case {
            name: "no column for an envelope field",
            config: "[route]\nenvelope = true\nenvelope_fields = [\"trace\"]",
            row: same,
            want: &[Want::Err("missing_column", "route.envelope_fields")],
        },
        unsupported_binary_type: Case {
            name: "unsupported binary type",
            config: "",
            row: |r| r.binary("aggregateid", oid::NUMERIC, &[0, 1, 0, 0]),
            want: &[Want::Err("invalid_value", "use text format")],
        },
        non_utf_8_text_in_an_envelope: Case {
            name: "non-UTF-8 text in an envelope",
            config: "[route]\nenvelope = true",
            row: |r| r.binary("payload", oid::TEXT, b"\xff\xfe"),
            want: &[Want::Err("invalid_value", "not valid UTF-8")],
        },
    }
}

#[test]
fn error_display_says_what_why_and_how() {
    let r = router("");
    let e = r
        .route_row(&base_row().null("payload", oid::JSONB), COMMIT_MICROS)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("cannot route outbox event \"{EVENT_ID}\": the payload column \"payload\" is NULL; set route.tombstone_on_null_payload = true to send a tombstone (null value) instead")
    );
    let e = r
        .route_row(&base_row().without("id"), COMMIT_MICROS)
        .unwrap_err();
    assert!(e.to_string().starts_with("cannot route outbox event (event id unknown): the outbox relation has no column \"id\""), "{e}");
}

#[test]
fn payload_is_zero_copy() {
    let r = router("");
    let row = base_row();
    let stored = row.columns.iter().find(|c| c.name == "payload").unwrap();
    let stored = stored.value.clone().unwrap();
    let rec = r.route_row(&row, COMMIT_MICROS).unwrap();
    assert_eq!(rec.value.unwrap().as_ptr(), stored.as_ptr());
}

#[test]
fn repeated_topics_share_one_allocation() {
    for config in [
        "",
        "[route]\ntopic = \"{tenant}.{aggregatetype}\"",
        "[[route.rules]]\ncolumn = \"aggregatetype\"\nregex = \"(o.*)\"\ntopic = \"x.$1\"",
    ] {
        let r = router(config);
        let a = r.route_row(&base_row(), COMMIT_MICROS).unwrap();
        let b = r.route_row(&base_row(), COMMIT_MICROS).unwrap();
        assert!(std::sync::Arc::ptr_eq(&a.topic, &b.topic), "{config}");
        let c = r
            .route_row(
                &base_row().with("aggregatetype", oid::TEXT, "order2"),
                COMMIT_MICROS,
            )
            .unwrap();
        assert_ne!(a.topic, c.topic, "{config}");
    }
}

#[test]
fn topic_cache_never_changes_answers() {
    // Many distinct values (over the cache capacity) then the first ones again.
    let r = router("[route]\ntopic = \"t.{aggregatetype}\"");
    let n = ferry_router::TOPIC_CACHE_CAPACITY + 10;
    for round in 0..2 {
        for i in 0..n {
            let v = format!("agg{i}");
            let rec = r
                .route_row(
                    &base_row().with("aggregatetype", oid::TEXT, &v),
                    COMMIT_MICROS,
                )
                .unwrap();
            assert_eq!(&*rec.topic, format!("t.agg{i}"), "round {round}");
        }
    }
    // A value that fails is never cached as a success.
    for _ in 0..2 {
        let e = r
            .route_row(
                &base_row().with("aggregatetype", oid::TEXT, "a b"),
                COMMIT_MICROS,
            )
            .unwrap_err();
        assert_eq!(e.code(), "invalid_topic");
    }
}

#[test]
fn record_partition_and_size() {
    let r = router("");
    let rec = r.route_row(&base_row(), COMMIT_MICROS).unwrap();
    assert_eq!(
        rec.java_partition(17),
        Some(ferry_router::java_partition(b"42", 17))
    );
    assert_eq!(
        rec.size_bytes(),
        2 + PAYLOAD.len() + "id".len() + EVENT_ID.len() + "type".len() + "OrderCreated".len()
    );
    let explicit = router("[outbox]\npartition_column = \"part\"")
        .route_row(&base_row(), COMMIT_MICROS)
        .unwrap();
    assert_eq!(explicit.java_partition(17), Some(3));
    let keyless = r
        .route_row(&base_row().null("aggregateid", oid::TEXT), COMMIT_MICROS)
        .unwrap();
    assert_eq!(keyless.java_partition(17), None);
    assert_eq!(rec.event_id_text(), EVENT_ID);
}

#[test]
fn commit_time_before_the_epoch_rounds_down() {
    let rec = router("").route_row(&base_row(), -1).unwrap();
    assert_eq!(rec.timestamp_ms, Some(-1));
}
