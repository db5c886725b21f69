//! CloudEvents (`route.cloudevents*`): each key valid and invalid (with the error text), routing
//! fixtures for binary and structured mode, and property tests. Cited: CloudEvents 1.0 core (§3.1
//! attributes), its Kafka protocol binding (§3.2 binary mode, §3.3 structured mode) and its JSON
//! event format (§3.1 `data` / `data_base64`).

mod common;

use common::{
    assert_problem, base_row, header, header_names, problems, router, sections, COMMIT_MICROS,
    EVENT_ID,
};
use ferry_router::cloudevents::{rfc3339_millis, STRUCTURED_CONTENT_TYPE};
use ferry_router::{oid, CloudEventsMode, Record, SimpleRow};
use proptest::prelude::*;

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

mod config {
    use super::*;

    #[test]
    fn cloudevents_mode_valid_and_invalid() {
        for (text, mode) in [
            ("none", CloudEventsMode::None),
            ("binary", CloudEventsMode::Binary),
            ("structured", CloudEventsMode::Structured),
        ] {
            let s = sections(&format!("[route]\ncloudevents = \"{text}\""));
            assert_eq!(s.route.cloudevents, mode);
            assert_eq!(text.parse::<CloudEventsMode>(), Ok(mode));
            assert_eq!(mode.to_string(), text);
        }
        assert_eq!(sections("").route.cloudevents, CloudEventsMode::None);
        let err = toml::from_str::<common::Sections>("[route]\ncloudevents = \"json\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown variant `json`"), "{err}");
        assert!("Binary"
            .parse::<CloudEventsMode>()
            .unwrap_err()
            .contains("expected \"none\", \"binary\" or \"structured\""));
        // Its headers cannot also be configured.
        assert_problem(
            "[route]\ncloudevents = \"binary\"\nid_header = \"ce_id\"",
            "route.id_header",
            "is sent by route.cloudevents = \"binary\"",
        );
        assert_problem(
            "[route]\ncloudevents = \"structured\"\n[[route.headers]]\ncolumn = \"ct\"\nname = \"content-type\"",
            "route.headers[0]",
            "is sent by route.cloudevents = \"structured\"",
        );
    }

    #[test]
    fn cloudevents_source_valid_and_invalid() {
        assert_eq!(
            problems("[route]\ncloudevents = \"binary\"\ncloudevents_source = \"https://shop.example/{tenant}/orders\""),
            []
        );
        assert_problem(
            "[route]\ncloudevents = \"binary\"\ncloudevents_source = \"/x/{tenant\"",
            "route.cloudevents_source",
            "unclosed '{'",
        );
        assert_problem(
            "[route]\ncloudevents = \"binary\"\ncloudevents_source = \"\"",
            "route.cloudevents_source",
            "must not be empty",
        );
        assert_problem(
            "[route]\ncloudevents = \"binary\"\ncloudevents_source = \"/my shop/{tenant}\"",
            "route.cloudevents_source",
            "is not URI text",
        );
        assert_problem(
            "[route]\ncloudevents_source = \"/x\"",
            "route.cloudevents_source",
            "has no effect unless route.cloudevents",
        );
        let r = router("[route]\ncloudevents = \"binary\"\ncloudevents_source = \"/{tenant}\"");
        let req = r
            .required_columns()
            .iter()
            .find(|c| c.column == "tenant")
            .unwrap();
        assert_eq!(req.config_key, "route.cloudevents_source");
    }

    #[test]
    fn cloudevents_subject_valid_and_invalid() {
        assert_eq!(
            problems("[route]\ncloudevents = \"binary\"\ncloudevents_subject = \"\""),
            []
        );
        assert_eq!(
            problems("[route]\ncloudevents = \"structured\"\ncloudevents_subject = \"orders/{aggregateid}\""),
            []
        );
        assert_problem(
            "[route]\ncloudevents = \"binary\"\ncloudevents_subject = \"a}\"",
            "route.cloudevents_subject",
            "closes nothing",
        );
        assert_problem(
            "[route]\ncloudevents_subject = \"x\"",
            "route.cloudevents_subject",
            "has no effect unless route.cloudevents",
        );
    }

    #[test]
    fn cloudevents_data_content_type_valid_and_invalid() {
        assert_eq!(
            problems("[route]\ncloudevents = \"binary\"\ncloudevents_data_content_type = \"application/avro\""),
            []
        );
        assert_problem(
            "[route]\ncloudevents = \"binary\"\ncloudevents_data_content_type = \" \"",
            "route.cloudevents_data_content_type",
            "is not a media type",
        );
        assert_problem(
            "[route]\ncloudevents = \"binary\"\ncloudevents_data_content_type = \"a\\nb\"",
            "route.cloudevents_data_content_type",
            "is not a media type",
        );
        assert_problem(
            "[route]\ncloudevents_data_content_type = \"application/avro\"",
            "route.cloudevents_data_content_type",
            "has no effect unless route.cloudevents",
        );
    }

    #[test]
    fn cloudevents_reads_the_type_column_even_without_a_type_header() {
        let r = router("[route]\ncloudevents = \"binary\"\ntype_header = \"\"");
        assert!(r.columns().contains(&"type"));
        let req = r
            .required_columns()
            .iter()
            .find(|c| c.column == "type")
            .unwrap();
        assert_eq!(req.config_key, "outbox.type_column (the CloudEvents type)");
    }
}

mod cloudevents {
    use super::*;

    /// 2026-11-22 10:00:00.123 UTC, the base row's `created_at`.
    const CREATED_AT: &str = "2026-11-22T10:00:00.123Z";

    /// The spec's REQUIRED attributes (CloudEvents 1.0 §3.1.1: id, source, specversion, type)
    /// as the Kafka binding's binary-mode headers (§3.2.3.1: `ce_` + attribute name), UTF-8
    /// (§3.2.3), and `content-type` for `datacontenttype` (§3.2.1).
    #[test]
    fn binary_mode_headers_carry_the_required_attributes() {
        let r = router(
            "[outbox]\ntimestamp_column = \"created_at\"\n[route]\ncloudevents = \"binary\"",
        )
        .route_row(&base_row(), COMMIT_MICROS)
        .unwrap();
        assert_eq!(
            header_names(&r),
            [
                "id",
                "type",
                "ce_specversion",
                "ce_id",
                "ce_source",
                "ce_type",
                "ce_time",
                "ce_subject",
                "content-type"
            ]
        );
        assert_eq!(header(&r, "ce_specversion"), Some(&b"1.0"[..]));
        assert_eq!(header(&r, "ce_id"), Some(EVENT_ID.as_bytes()));
        assert_eq!(header(&r, "ce_source"), Some(&b"/ferry/public/outbox"[..]));
        assert_eq!(header(&r, "ce_type"), Some(&b"OrderCreated"[..]));
        assert_eq!(header(&r, "ce_time"), Some(CREATED_AT.as_bytes()));
        assert_eq!(header(&r, "ce_subject"), Some(&b"42"[..]));
        assert_eq!(header(&r, "content-type"), Some(&b"application/json"[..]));
        for (_, v) in &r.headers {
            std::str::from_utf8(v.as_deref().unwrap()).expect("§3.2.3: UTF-8 header values");
        }
        // §3.2.2: the data byte-sequence is the value, untouched.
        assert_eq!(r.value.as_deref(), Some(&br#"{"total": 39.98}"#[..]));
    }

    #[test]
    fn binary_mode_content_type_follows_the_payload() {
        let r = router("[route]\ncloudevents = \"binary\"");
        let text = r
            .route_row(
                &base_row().with("payload", oid::TEXT, "hello"),
                COMMIT_MICROS,
            )
            .unwrap();
        assert_eq!(
            header(&text, "content-type"),
            Some(&b"text/plain; charset=utf-8"[..])
        );
        let bytes = r
            .route_row(
                &base_row().with("payload", oid::BYTEA, "\\x0102"),
                COMMIT_MICROS,
            )
            .unwrap();
        assert_eq!(
            header(&bytes, "content-type"),
            Some(&b"application/octet-stream"[..])
        );
        assert_eq!(bytes.value.as_deref(), Some(&b"\x01\x02"[..]));
        let envelope = router("[route]\ncloudevents = \"binary\"\nenvelope = true")
            .route_row(
                &base_row().with("payload", oid::TEXT, "hello"),
                COMMIT_MICROS,
            )
            .unwrap();
        assert_eq!(
            header(&envelope, "content-type"),
            Some(&b"application/json"[..])
        );
        let avro = router("[route]\ncloudevents = \"binary\"\ncloudevents_data_content_type = \"application/avro\"")
            .route_row(&base_row(), COMMIT_MICROS)
            .unwrap();
        assert_eq!(
            header(&avro, "content-type"),
            Some(&b"application/avro"[..])
        );
    }

    #[test]
    fn time_is_the_commit_time_without_a_timestamp_column() {
        let r = router("[route]\ncloudevents = \"binary\"")
            .route_row(&base_row(), COMMIT_MICROS)
            .unwrap();
        assert_eq!(
            header(&r, "ce_time"),
            Some(&b"2027-01-15T08:00:00.000Z"[..])
        );
        assert_eq!(
            rfc3339_millis(r.timestamp_ms.unwrap()).as_deref(),
            Some("2027-01-15T08:00:00.000Z")
        );
    }

    #[test]
    fn source_and_subject_templates() {
        let r = router(
            "[route]\ncloudevents = \"binary\"\ncloudevents_source = \"https://shop.example/{tenant}\"\ncloudevents_subject = \"order/{aggregateid}/v{version}\"",
        );
        let rec = r.route_row(&base_row(), COMMIT_MICROS).unwrap();
        assert_eq!(
            header(&rec, "ce_source"),
            Some(&b"https://shop.example/acme"[..])
        );
        assert_eq!(header(&rec, "ce_subject"), Some(&b"order/42/v7"[..]));
        // subject is OPTIONAL (§3.1.2): a NULL column leaves it out.
        let rec = r
            .route_row(&base_row().null("version", oid::INT4), COMMIT_MICROS)
            .unwrap();
        assert_eq!(header(&rec, "ce_subject"), None);
        // source is REQUIRED (§3.1.1): a NULL column is a routing error.
        let e = r
            .route_row(&base_row().null("tenant", oid::TEXT), COMMIT_MICROS)
            .unwrap_err();
        assert_eq!(e.code(), "null_value");
        assert!(e.to_string().contains("route.cloudevents_source"), "{e}");
        // A column value that is not URI text makes the source invalid: a routing error.
        let e = r
            .route_row(
                &base_row().with("tenant", oid::TEXT, "acme corp"),
                COMMIT_MICROS,
            )
            .unwrap_err();
        assert_eq!(e.code(), "invalid_value");
        assert!(e.to_string().contains("not a URI reference"), "{e}");
        // subject = "": none; the default subject is the aggregate id, left out when NULL.
        let rec = router("[route]\ncloudevents = \"binary\"\ncloudevents_subject = \"\"")
            .route_row(&base_row(), COMMIT_MICROS)
            .unwrap();
        assert_eq!(header(&rec, "ce_subject"), None);
        let rec = router("[route]\ncloudevents = \"binary\"")
            .route_row(&base_row().null("aggregateid", oid::VARCHAR), COMMIT_MICROS)
            .unwrap();
        assert_eq!(header(&rec, "ce_subject"), None);
        assert_eq!(rec.key, None);
        // A bytea aggregate id that is not UTF-8: the key as is, no subject.
        let rec = router("[route]\ncloudevents = \"binary\"")
            .route_row(
                &base_row().binary("aggregateid", oid::BYTEA, b"\xff\x00"),
                COMMIT_MICROS,
            )
            .unwrap();
        assert_eq!(rec.key.as_deref(), Some(&b"\xff\x00"[..]));
        assert_eq!(header(&rec, "ce_subject"), None);
    }

    #[test]
    fn required_attributes_must_be_non_empty() {
        let r = router("[route]\ncloudevents = \"binary\"");
        let e = r
            .route_row(&base_row().with("type", oid::VARCHAR, ""), COMMIT_MICROS)
            .unwrap_err();
        assert_eq!(e.code(), "invalid_value");
        assert!(e.to_string().contains("non-empty"), "{e}");
        let e = r
            .route_row(&base_row().null("type", oid::VARCHAR), COMMIT_MICROS)
            .unwrap_err();
        assert_eq!(e.code(), "null_value");
        let e = r
            .route_row(&base_row().with("id", oid::TEXT, ""), COMMIT_MICROS)
            .unwrap_err();
        assert_eq!(e.code(), "invalid_value");
    }

    /// §3.2.2: in binary mode an event with no data is a message with no value (a tombstone);
    /// structured mode sends the same, since a structured event is never a tombstone (§3.3.2).
    #[test]
    fn tombstones_stay_tombstones_with_binary_headers() {
        for mode in ["binary", "structured"] {
            let r = router(&format!(
                "[route]\ncloudevents = \"{mode}\"\ntombstone_on_null_payload = true"
            ))
            .route_row(&base_row().null("payload", oid::JSONB), COMMIT_MICROS)
            .unwrap();
            assert_eq!(r.value, None, "{mode}");
            assert_eq!(header(&r, "ce_id"), Some(EVENT_ID.as_bytes()), "{mode}");
            assert!(!header_names(&r).contains(&"content-type"), "{mode}");
        }
    }

    fn structured(row: SimpleRow, extra: &str) -> (Record, serde_json::Value) {
        let r = router(&format!(
            "[outbox]\ntimestamp_column = \"created_at\"\n[route]\ncloudevents = \"structured\"\n{extra}"
        ))
        .route_row(&row, COMMIT_MICROS)
        .unwrap();
        let v = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        (r, v)
    }

    /// Kafka binding §3.3.1: `content-type: application/cloudevents+json; charset=UTF-8`;
    /// JSON format: the attributes as members, a JSON payload inline in `data`.
    #[test]
    fn structured_mode_is_one_json_event() {
        let (r, v) = structured(base_row(), "");
        assert_eq!(
            header(&r, "content-type"),
            Some(STRUCTURED_CONTENT_TYPE.as_bytes())
        );
        assert_eq!(header_names(&r), ["id", "type", "content-type"]);
        assert_eq!(
            v,
            serde_json::json!({
                "specversion": "1.0",
                "id": EVENT_ID,
                "source": "/ferry/public/outbox",
                "type": "OrderCreated",
                "subject": "42",
                "time": CREATED_AT,
                "datacontenttype": "application/json",
                "data": {"total": 39.98}
            })
        );
        // Byte fixture: the exact rendering.
        assert_eq!(
            std::str::from_utf8(r.value.as_deref().unwrap()).unwrap(),
            format!(
                r#"{{"specversion":"1.0","id":"{EVENT_ID}","source":"/ferry/public/outbox","type":"OrderCreated","subject":"42","time":"{CREATED_AT}","datacontenttype":"application/json","data":{{"total": 39.98}}}}"#
            )
        );
    }

    /// JSON format §3.1.1: binary data goes base64 in `data_base64`; JSON inline only when the
    /// datacontenttype declares JSON; text as a JSON string.
    #[test]
    fn structured_mode_data_by_payload_type() {
        let (_, v) = structured(base_row().with("payload", oid::TEXT, "say \"hi\""), "");
        assert_eq!(v["data"], "say \"hi\"");
        assert_eq!(v["datacontenttype"], "text/plain; charset=utf-8");
        let (_, v) = structured(base_row().with("payload", oid::BYTEA, "\\x00ff10"), "");
        assert_eq!(v["data_base64"], "AP8Q");
        assert!(v.get("data").is_none());
        assert_eq!(v["datacontenttype"], "application/octet-stream");
        // A JSON payload declared as something else is a string of its text; a vendor +json
        // type keeps it inline (JSON format §3.1.1).
        let (_, v) = structured(base_row(), "cloudevents_data_content_type = \"text/plain\"");
        assert_eq!(v["data"], r#"{"total": 39.98}"#);
        let (_, v) = structured(
            base_row(),
            "cloudevents_data_content_type = \"application/vnd.shop.order+json\"",
        );
        assert_eq!(v["data"], serde_json::json!({"total": 39.98}));
        // Text stays a string even when declared JSON: its runtime value is a string.
        let (_, v) = structured(
            base_row().with("payload", oid::TEXT, "{}"),
            "cloudevents_data_content_type = \"application/json\"",
        );
        assert_eq!(v["data"], "{}");
        let (_, v) = structured(
            base_row(),
            "envelope = true\nenvelope_fields = [\"tenant\"]",
        );
        assert_eq!(
            v["data"],
            serde_json::json!({"payload": {"total": 39.98}, "tenant": "acme"})
        );
    }

    #[test]
    fn structured_mode_respects_max_payload_bytes() {
        let r = router("[route]\ncloudevents = \"structured\"\nmax_payload_bytes = 100");
        let e = r.route_row(&base_row(), COMMIT_MICROS).unwrap_err();
        assert_eq!(e.code(), "payload_too_large");
    }

    #[test]
    fn trace_context_and_cloudevents_together() {
        let r = router("[outbox]\ntracing_column = \"tc\"\n[route]\ncloudevents = \"binary\"")
            .route_row(&base_row().with("tc", oid::TEXT, TP), COMMIT_MICROS)
            .unwrap();
        assert_eq!(header(&r, "traceparent"), Some(TP.as_bytes()));
        assert_eq!(header(&r, "ce_type"), Some(&b"OrderCreated"[..]));
    }
}

proptest! {
    /// Structured mode always yields one JSON object holding the REQUIRED attributes
    /// (CloudEvents 1.0 §3.1.1) and the payload back, whatever the ids and text.
    #[test]
    fn structured_events_are_always_valid_json(
        id in "[^\\x00]{1,20}",
        ty in "[^\\x00]{1,20}",
        text in "[^\\x00]{0,40}",
    ) {
        let r = router("[route]\ncloudevents = \"structured\"");
        let row = base_row()
            .with("id", oid::TEXT, &id)
            .with("type", oid::TEXT, &ty)
            .with("payload", oid::TEXT, &text);
        let rec = r.route_row(&row, COMMIT_MICROS).unwrap();
        let v: serde_json::Value = serde_json::from_slice(rec.value.as_deref().unwrap()).unwrap();
        prop_assert_eq!(&v["specversion"], "1.0");
        prop_assert_eq!(&v["id"], id.as_str());
        prop_assert_eq!(&v["type"], ty.as_str());
        prop_assert_eq!(&v["source"], "/ferry/public/outbox");
        prop_assert_eq!(&v["data"], text.as_str());
    }

    /// Binary mode for any id, type and aggregate id: the REQUIRED attributes (CloudEvents 1.0
    /// §3.1.1) as `ce_` headers (Kafka binding §3.2.3.1), every header value UTF-8 (§3.2.3), and
    /// the value untouched (§3.2.2).
    #[test]
    fn binary_events_always_carry_the_required_headers(
        id in "[^\\x00]{1,20}",
        ty in "[^\\x00]{1,20}",
        key in "[^\\x00]{0,20}",
        payload in "[^\\x00]{0,40}",
    ) {
        let r = router("[route]\ncloudevents = \"binary\"");
        let row = base_row()
            .with("id", oid::TEXT, &id)
            .with("type", oid::TEXT, &ty)
            .with("aggregateid", oid::TEXT, &key)
            .with("payload", oid::TEXT, &payload);
        let rec = r.route_row(&row, COMMIT_MICROS).unwrap();
        prop_assert_eq!(header(&rec, "ce_specversion"), Some(&b"1.0"[..]));
        prop_assert_eq!(header(&rec, "ce_id"), Some(id.as_bytes()));
        prop_assert_eq!(header(&rec, "ce_type"), Some(ty.as_bytes()));
        prop_assert!(header(&rec, "ce_source").is_some_and(|s| !s.is_empty()));
        let want_subject = (!key.is_empty()).then_some(key.as_bytes());
        prop_assert_eq!(header(&rec, "ce_subject"), want_subject);
        for (_, v) in &rec.headers {
            prop_assert!(std::str::from_utf8(v.as_deref().unwrap_or_default()).is_ok());
        }
        prop_assert_eq!(rec.value.as_deref(), Some(payload.as_bytes()));
    }
}
