//! Table-less outbox messages (logical decoding messages) and dead-letter records.

mod common;

use bytes::Bytes;
use common::{base_row, router, COMMIT_MICROS, COMMIT_MS, EVENT_ID};
use ferry_router::{oid, DEAD_LETTER_CODE_HEADER, DEAD_LETTER_REASON_HEADER};

fn doc(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

#[test]
fn message_routes_like_a_row() {
    let r = router("[outbox]\nmessage_prefix = \"outbox\"");
    assert_eq!(r.message_prefix(), Some("outbox"));
    let content = doc(&format!(
        r#"{{"id": "{EVENT_ID}", "aggregatetype": "order", "aggregateid": 42,
            "type": "OrderCreated", "payload": {{"total": 39.98, "items": [1, 2]}}}}"#
    ));
    let rec = r.route_message(&content, COMMIT_MICROS).unwrap();
    assert_eq!(&*rec.topic, "outbox.event.order");
    assert_eq!(rec.key.as_deref(), Some(&b"42"[..]));
    assert_eq!(
        rec.value.as_deref(),
        Some(&br#"{"total": 39.98, "items": [1, 2]}"#[..])
    );
    assert_eq!(rec.event_id_text(), EVENT_ID);
    assert_eq!(rec.timestamp_ms, Some(COMMIT_MS));
    let type_header = rec.headers.iter().find(|(n, _)| &**n == "type").unwrap();
    assert_eq!(type_header.1.as_deref(), Some(&b"OrderCreated"[..]));
}

#[test]
fn message_payload_cases() {
    let r =
        router("[outbox]\ntimestamp_column = \"ts\"\n[route]\ntombstone_on_null_payload = true");
    type Case<'a> = (&'a str, Option<&'a [u8]>, i64);
    let cases: &[Case<'_>] = &[
        // A string payload is sent as the string's text.
        (r#""payload": "{\"a\":1}""#, Some(br#"{"a":1}"#), COMMIT_MS),
        (r#""payload": "plain text""#, Some(b"plain text"), COMMIT_MS),
        (r#""payload": [1,2]"#, Some(b"[1,2]"), COMMIT_MS),
        (r#""payload": 12.5"#, Some(b"12.5"), COMMIT_MS),
        (r#""payload": null"#, None, COMMIT_MS),
        (
            r#""payload": {}, "ts": 1700000000123"#,
            Some(b"{}"),
            1_700_000_000_123,
        ),
        (
            r#""payload": {}, "ts": "2026-11-22T10:00:00.5Z""#,
            Some(b"{}"),
            1_795_341_600_500,
        ),
        (r#""payload": {}, "ts": null"#, Some(b"{}"), COMMIT_MS),
    ];
    for (fields, value, ts) in cases {
        let content = doc(&format!(
            r#"{{"id": "e1", "aggregatetype": "order", "aggregateid": "a", "type": "T", {fields}}}"#
        ));
        let rec = r
            .route_message(&content, COMMIT_MICROS)
            .unwrap_or_else(|e| panic!("{fields}: {e}"));
        assert_eq!(rec.value.as_deref(), *value, "{fields}");
        assert_eq!(rec.timestamp_ms, Some(*ts), "{fields}");
    }
}

#[test]
fn message_errors() {
    let r = router("");
    let cases: &[(&str, &str, Option<&str>)] = &[
        ("not json", "invalid_message", None),
        ("[1]", "invalid_message", None),
        (r#"{"id": "e1", "id": "e2"}"#, "invalid_message", None),
        (
            r#"{"aggregatetype": "o", "aggregateid": "a", "type": "T", "payload": {}}"#,
            "missing_column",
            None,
        ),
        (
            r#"{"id": "e1", "aggregateid": "a", "type": "T", "payload": {}}"#,
            "missing_column",
            Some("e1"),
        ),
        (
            r#"{"id": "e1", "aggregatetype": null, "aggregateid": "a", "type": "T", "payload": {}}"#,
            "null_value",
            Some("e1"),
        ),
        (
            r#"{"id": "e1", "aggregatetype": "o", "aggregateid": "a", "type": "T", "payload": null}"#,
            "null_payload",
            Some("e1"),
        ),
        (
            r#"{"id": "e1", "aggregatetype": "a b", "aggregateid": "a", "type": "T", "payload": {}}"#,
            "invalid_topic",
            Some("e1"),
        ),
    ];
    for (content, code, id) in cases {
        let e = r.route_message(&doc(content), COMMIT_MICROS).unwrap_err();
        assert_eq!(e.code(), *code, "{content}: {e}");
        assert_eq!(e.event_id.as_deref(), *id, "{content}");
    }
    let e = r.route_message(&doc("nope"), 0).unwrap_err();
    assert!(e.to_string().contains("not a valid outbox document"), "{e}");
}

const DLT: &str = "[route]\non_error = \"dead_letter\"\ndead_letter_topic = \"outbox.dlq\"\nmax_payload_bytes = 100";

#[test]
fn dead_letter_record_carries_the_reason() {
    let r = router(DLT);
    assert_eq!(r.dead_letter_topic(), Some("outbox.dlq"));
    let row = base_row().with("aggregatetype", oid::TEXT, "bad topic");
    let err = r.route_row(&row, COMMIT_MICROS).unwrap_err();
    let dl = r.dead_letter(&row, &err, COMMIT_MICROS).unwrap();
    assert_eq!(&*dl.topic, "outbox.dlq");
    assert_eq!(dl.key.as_deref(), Some(&b"42"[..]));
    assert_eq!(dl.value.as_deref(), Some(&br#"{"total": 39.98}"#[..]));
    assert_eq!(dl.event_id_text(), EVENT_ID);
    assert_eq!(dl.partition, None);
    assert_eq!(dl.timestamp_ms, Some(COMMIT_MS));
    let names: Vec<&str> = dl.headers.iter().map(|(n, _)| &**n).collect();
    assert_eq!(
        names,
        ["id", DEAD_LETTER_REASON_HEADER, DEAD_LETTER_CODE_HEADER]
    );
    assert_eq!(dl.headers[0].1.as_deref(), Some(EVENT_ID.as_bytes()));
    assert_eq!(dl.headers[1].1.as_deref(), Some(err.to_string().as_bytes()));
    assert_eq!(dl.headers[2].1.as_deref(), Some(&b"invalid_topic"[..]));
}

#[test]
fn dead_letter_drops_an_oversized_payload() {
    let r = router(DLT);
    let big = format!("\"{}\"", "x".repeat(200));
    let row = base_row().with("payload", oid::JSONB, &big);
    let err = r.route_row(&row, COMMIT_MICROS).unwrap_err();
    assert_eq!(err.code(), "payload_too_large");
    let dl = r.dead_letter(&row, &err, COMMIT_MICROS).unwrap();
    assert_eq!(dl.value, None);
    assert_eq!(dl.key.as_deref(), Some(&b"42"[..]));
}

#[test]
fn dead_letter_without_an_event_id_or_a_parsable_message() {
    let r = router(DLT);
    let row = base_row().without("id");
    let err = r.route_row(&row, COMMIT_MICROS).unwrap_err();
    let dl = r.dead_letter(&row, &err, COMMIT_MICROS).unwrap();
    let names: Vec<&str> = dl.headers.iter().map(|(n, _)| &**n).collect();
    assert_eq!(names, [DEAD_LETTER_REASON_HEADER, DEAD_LETTER_CODE_HEADER]);
    assert_eq!(dl.event_id_text(), "");

    let content = doc("{broken");
    let err = r.route_message(&content, COMMIT_MICROS).unwrap_err();
    let dl = r
        .dead_letter_message(&content, &err, COMMIT_MICROS)
        .unwrap();
    assert_eq!(dl.value.as_deref(), Some(&b"{broken"[..]));
    assert_eq!(
        dl.headers.last().unwrap().1.as_deref(),
        Some(&b"invalid_message"[..])
    );

    let content = doc(r#"{"id": "e9", "aggregateid": "k", "payload": {"p": 1}}"#);
    let err = r.route_message(&content, COMMIT_MICROS).unwrap_err();
    let dl = r
        .dead_letter_message(&content, &err, COMMIT_MICROS)
        .unwrap();
    assert_eq!(dl.value.as_deref(), Some(&br#"{"p": 1}"#[..]));
    assert_eq!(dl.key.as_deref(), Some(&b"k"[..]));
    assert_eq!(dl.event_id_text(), "e9");
}

#[test]
fn no_dead_letter_unless_configured() {
    for config in ["", "[route]\non_error = \"skip\""] {
        let r = router(config);
        let row = base_row().without("payload");
        let err = r.route_row(&row, COMMIT_MICROS).unwrap_err();
        assert!(
            r.dead_letter(&row, &err, COMMIT_MICROS).is_none(),
            "{config}"
        );
        assert!(
            r.dead_letter_message(&doc("x"), &err, 0).is_none(),
            "{config}"
        );
    }
}

/// Under `fail`, a dead-letter topic is where `ferry run --dead-letter-event` sends the one
/// event it names: the router renders it (the policy still stops at every other event).
#[test]
fn a_dead_letter_topic_under_fail_renders_for_the_one_shot_flag() {
    let r = router("[route]\non_error = \"fail\"\ndead_letter_topic = \"outbox.dlq\"");
    assert_eq!(r.on_error(), ferry_router::OnError::Fail);
    let row = base_row().without("payload");
    let err = r.route_row(&row, COMMIT_MICROS).unwrap_err();
    let dl = r.dead_letter(&row, &err, COMMIT_MICROS).unwrap();
    assert_eq!(&*dl.topic, "outbox.dlq");
}

#[test]
fn optional_members_may_be_absent_in_a_message() {
    let r = router(
        "[outbox]\ntimestamp_column = \"ts\"\npartition_column = \"p\"\n[route]\nenvelope = true\nenvelope_fields = [\"v\"]\n[[route.headers]]\ncolumn = \"tenant\"",
    );
    let content = doc(
        r#"{"id": "e1", "aggregatetype": "o", "aggregateid": "a", "type": "T", "payload": {}}"#,
    );
    let rec = r.route_message(&content, COMMIT_MICROS).unwrap();
    assert_eq!(rec.timestamp_ms, Some(COMMIT_MS));
    assert_eq!(rec.partition, None);
    assert_eq!(
        rec.value.as_deref(),
        Some(&br#"{"payload":{},"v":null}"#[..])
    );
    assert_eq!(
        rec.headers.last().unwrap(),
        &(std::sync::Arc::from("tenant"), None)
    );
    // Required members stay required.
    let content = doc(r#"{"id": "e1", "aggregatetype": "o", "aggregateid": "a", "payload": {}}"#);
    assert_eq!(
        r.route_message(&content, COMMIT_MICROS).unwrap_err().code(),
        "missing_column"
    );
}
