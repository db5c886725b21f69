//! Trace context (`outbox.tracing_column`): its configuration (valid and invalid, with the error
//! text), routing fixtures (a bare `traceparent`, Debezium's `tracingspancontext`, malformed
//! values), and property tests. W3C Trace Context Level 1: §3.2 `traceparent`, §3.3
//! `tracestate`.

mod common;

use bytes::Bytes;
use common::{assert_problem, base_row, header, header_names, problems, router, COMMIT_MICROS};
use ferry_router::{oid, Record, TraceOutcome, TraceProblem};
use proptest::prelude::*;

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

mod config {
    use super::*;

    #[test]
    fn tracing_column_valid_and_invalid() {
        assert_eq!(
            problems("[outbox]\ntracing_column = \"tracingspancontext\""),
            []
        );
        assert_problem(
            "[outbox]\ntracing_column = \"\"",
            "outbox.tracing_column",
            "must not be empty",
        );
        // The headers it sends cannot also be configured.
        assert_problem(
            "[outbox]\ntracing_column = \"tc\"\n[[route.headers]]\ncolumn = \"t\"\nname = \"traceparent\"",
            "route.headers[0]",
            "is what outbox.tracing_column sends",
        );
        assert_problem(
            "[outbox]\ntracing_column = \"tc\"\n[route]\nadditional_placement = \"ts:header:tracestate\"",
            "route.additional_placement[0]",
            "is what outbox.tracing_column sends",
        );
        // Without the key, a traceparent header placed by hand stays legal (the old way).
        assert_eq!(
            problems("[route]\nadditional_placement = \"tc:header:traceparent\""),
            []
        );
        let r = router("[outbox]\ntracing_column = \"tc\"");
        let req = r
            .required_columns()
            .iter()
            .find(|c| c.column == "tc")
            .unwrap();
        assert_eq!(req.config_key, "outbox.tracing_column");
    }
}

mod trace {
    use super::*;

    const CONFIG: &str = "[outbox]\ntracing_column = \"tracingspancontext\"";

    fn route(value: Option<&str>) -> Record {
        let row = match value {
            Some(v) => base_row().with("tracingspancontext", oid::VARCHAR, v),
            None => base_row().null("tracingspancontext", oid::VARCHAR),
        };
        router(CONFIG).route_row(&row, COMMIT_MICROS).unwrap()
    }

    #[test]
    fn a_bare_traceparent_becomes_the_header() {
        let r = route(Some(TP));
        assert_eq!(header(&r, "traceparent"), Some(TP.as_bytes()));
        assert_eq!(header(&r, "tracestate"), None);
        assert_eq!(header_names(&r), ["id", "type", "traceparent"]);
        assert_eq!(r.trace_context, TraceOutcome::Propagated);
    }

    /// What Debezium's outbox extension stores (`Properties.store` of what
    /// `W3CTraceContextPropagator.inject` set), read back as `ActivateTracingSpan` would.
    #[test]
    fn debezium_tracingspancontext_becomes_both_headers() {
        let stored = format!(
            "#Mon Nov 23 22:21:17 UTC 2026\ntraceparent={TP}\ntracestate=congo\\=t61rcWkgMzE\n"
        );
        let r = route(Some(&stored));
        assert_eq!(header(&r, "traceparent"), Some(TP.as_bytes()));
        assert_eq!(header(&r, "tracestate"), Some(&b"congo=t61rcWkgMzE"[..]));
        assert_eq!(r.trace_context, TraceOutcome::Propagated);
    }

    #[test]
    fn null_or_blank_is_no_context_and_not_counted() {
        for v in [None, Some(""), Some("  ")] {
            let r = route(v);
            assert_eq!(header_names(&r), ["id", "type"], "{v:?}");
            assert_eq!(r.trace_context, TraceOutcome::None);
        }
        // No tracing column configured: nothing read, nothing sent.
        let r = router("").route_row(&base_row(), COMMIT_MICROS).unwrap();
        assert_eq!(r.trace_context, TraceOutcome::None);
    }

    /// A malformed value is never fatal: the record goes, without the header, flagged.
    #[test]
    fn malformed_values_are_flagged_and_skipped() {
        let cases = [
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                TraceProblem::Length,
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                TraceProblem::VersionFf,
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                TraceProblem::ZeroTraceId,
            ),
            (
                "#date\nuber-trace-id=1:2:0:1\n",
                TraceProblem::NoTraceparent,
            ),
        ];
        for (v, problem) in cases {
            let r = route(Some(v));
            assert_eq!(r.trace_context, TraceOutcome::Malformed(problem), "{v:?}");
            assert_eq!(header_names(&r), ["id", "type"], "{v:?}");
            assert_eq!(r.value.as_deref(), Some(&br#"{"total": 39.98}"#[..]));
        }
        // A bytea column whose text does not decode: malformed too, not a routing error.
        let row = base_row().with("tracingspancontext", oid::BYTEA, "\\xzz");
        let r = router(CONFIG).route_row(&row, COMMIT_MICROS).unwrap();
        assert_eq!(
            r.trace_context,
            TraceOutcome::Malformed(TraceProblem::NotText)
        );
    }

    #[test]
    fn a_missing_column_is_a_configuration_mismatch() {
        let e = router(CONFIG)
            .route_row(&base_row(), COMMIT_MICROS)
            .unwrap_err();
        assert_eq!(e.code(), "missing_column");
        assert!(e.to_string().contains("outbox.tracing_column"), "{e}");
    }

    #[test]
    fn table_less_messages_carry_it_too() {
        let r = router(&format!("{CONFIG}\nmessage_prefix = \"outbox\""));
        let doc = format!(
            r#"{{"id":"e1","aggregatetype":"order","aggregateid":"1","type":"T","payload":{{}},"tracingspancontext":"{TP}"}}"#
        );
        let rec = r.route_message(&Bytes::from(doc), COMMIT_MICROS).unwrap();
        assert_eq!(header(&rec, "traceparent"), Some(TP.as_bytes()));
        // Absent member: no context.
        let doc =
            r#"{"id":"e1","aggregatetype":"order","aggregateid":"1","type":"T","payload":{}}"#;
        let rec = r.route_message(&Bytes::from(doc), COMMIT_MICROS).unwrap();
        assert_eq!(rec.trace_context, TraceOutcome::None);
    }
}

/// `Properties.store` escaping of a value (Java's `saveConvert` with `escapeSpace = false`,
/// `escUnicode = false`, as `store(Writer)` does): `\`, `=`, `:`, `#`, `!`, tab, line breaks and
/// form feed escaped, a leading space escaped.
fn java_store_escape(v: &str) -> String {
    let mut out = String::new();
    for (i, c) in v.chars().enumerate() {
        match c {
            ' ' if i == 0 => out.push_str("\\ "),
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\x0c' => out.push_str("\\f"),
            '=' | ':' | '#' | '!' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

fn hex(n: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(b"0123456789abcdef".to_vec()), n)
        .prop_map(|v| String::from_utf8(v).unwrap())
}

fn valid_traceparent() -> impl Strategy<Value = String> {
    (hex(2), hex(32), hex(16), hex(2))
        .prop_filter("valid", |(v, t, p, _)| {
            v != "ff" && t.bytes().any(|b| b != b'0') && p.bytes().any(|b| b != b'0')
        })
        .prop_map(|(v, t, p, f)| format!("{v}-{t}-{p}-{f}"))
}

fn tracestate() -> impl Strategy<Value = String> {
    proptest::collection::vec(("[a-z][a-z0-9_*/-]{0,8}", "[!-+\\--<>-~]{1,10}"), 0..5).prop_map(
        |members| {
            let mut seen = std::collections::HashSet::new();
            members
                .into_iter()
                .filter(|(k, _)| seen.insert(k.clone()))
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        },
    )
}

proptest! {
    /// Whatever `Properties.store` writes for a valid traceparent and tracestate, in either line
    /// ending and key order, the router sends exactly those two values.
    #[test]
    fn stored_properties_round_trip(
        tp in valid_traceparent(),
        ts in tracestate(),
        crlf in any::<bool>(),
        state_first in any::<bool>(),
    ) {
        let nl = if crlf { "\r\n" } else { "\n" };
        let mut lines = vec![format!("traceparent={}", java_store_escape(&tp))];
        if !ts.is_empty() {
            let l = format!("tracestate={}", java_store_escape(&ts));
            if state_first { lines.insert(0, l) } else { lines.push(l) }
        }
        let text = format!("#Mon Nov 23 22:21:17 UTC 2026{nl}{}{nl}", lines.join(nl));
        let r = router("[outbox]\ntracing_column = \"tc\"")
            .route_row(&base_row().with("tc", oid::TEXT, &text), COMMIT_MICROS)
            .unwrap();
        prop_assert_eq!(r.trace_context, TraceOutcome::Propagated);
        prop_assert_eq!(header(&r, "traceparent"), Some(tp.as_bytes()));
        let want_ts = (!ts.is_empty()).then_some(ts.as_bytes());
        prop_assert_eq!(header(&r, "tracestate"), want_ts);
    }

    /// Any text in the column: the record still goes, and a header is only sent if valid.
    #[test]
    fn hostile_trace_values_never_fail_the_record(v in ".{0,80}", raw in proptest::collection::vec(any::<u8>(), 0..80)) {
        let r = router("[outbox]\ntracing_column = \"tc\"");
        for row in [
            base_row().with("tc", oid::TEXT, &v),
            base_row().binary("tc", oid::BYTEA, &raw),
        ] {
            let rec = r.route_row(&row, COMMIT_MICROS).unwrap();
            if let Some(tp) = header(&rec, "traceparent") {
                prop_assert!(ferry_router::trace::validate_traceparent(tp).is_ok());
                prop_assert!(rec.trace_context != TraceOutcome::None);
            }
            if let Some(ts) = header(&rec, "tracestate") {
                prop_assert!(ferry_router::trace::validate_tracestate(ts).is_ok());
            }
        }
    }
}
