//! Property tests: routed topics are always legal and match a simple reference model of the rules;
//! equal aggregate ids always give equal partitions; hostile values never panic.

mod common;

use bytes::Bytes;
use common::{base_row, router, COMMIT_MICROS};
use ferry_router::{
    java_partition, oid, validate_topic, RouteConfig, Router, RuleConfig, SimpleRow,
};
use proptest::prelude::*;

fn legal_name() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9._-]{1,60}".prop_filter("not . or ..", |s| s != "." && s != "..")
}

/// Values that are sometimes legal in a topic and sometimes not.
fn any_value() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z]{1,3}",
        2 => legal_name(),
        1 => "[a-z .é/]{0,5}",
        1 => Just(String::new()),
        1 => Just("..".to_owned()),
        1 => "[a-z]{240,260}",
    ]
}

/// A topic rule in the reference model: exact match, or "starts with prefix" (as a regex rule
/// `<prefix>(.*)` routed to `<topic>$1`).
#[derive(Debug, Clone)]
enum ModelRule {
    Equals(String, String),
    Prefix(String, String),
}

fn model_rule() -> impl Strategy<Value = ModelRule> {
    prop_oneof![
        ("[a-z]{1,3}", legal_name()).prop_map(|(v, t)| ModelRule::Equals(v, t)),
        ("[a-z]{0,2}", "[a-z]{1,5}\\.").prop_map(|(p, t)| ModelRule::Prefix(p, t)),
    ]
}

fn model_topic(rules: &[ModelRule], tenant: &str, aggregate_type: &str) -> String {
    for r in rules {
        match r {
            ModelRule::Equals(v, t) if aggregate_type == v => return t.clone(),
            ModelRule::Prefix(p, t) if aggregate_type.starts_with(p.as_str()) => {
                return format!("{t}{}", &aggregate_type[p.len()..])
            }
            _ => {}
        }
    }
    format!("{tenant}.events.{aggregate_type}")
}

fn model_legal(t: &str) -> bool {
    !t.is_empty()
        && t != "."
        && t != ".."
        && t.len() <= 249
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn model_router(rules: &[ModelRule]) -> Router {
    let route = RouteConfig {
        topic: Some("{tenant}.events.{aggregatetype}".into()),
        rules: rules
            .iter()
            .map(|r| match r {
                ModelRule::Equals(v, t) => RuleConfig {
                    column: "aggregatetype".into(),
                    equals: Some(v.clone()),
                    regex: None,
                    topic: t.clone(),
                },
                ModelRule::Prefix(p, t) => RuleConfig {
                    column: "aggregatetype".into(),
                    equals: None,
                    regex: Some(format!("{}(.*)", regex_escape(p))),
                    topic: format!("{t}$1"),
                },
            })
            .collect(),
        ..RouteConfig::default()
    };
    Router::new(&Default::default(), &route).unwrap()
}

fn regex_escape(s: &str) -> String {
    // The model's prefixes are [a-z]*, which need no escaping.
    assert!(s.bytes().all(|b| b.is_ascii_lowercase()));
    s.to_owned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any row whose aggregate type is a legal topic suffix routes, to exactly that topic.
    #[test]
    fn valid_rows_route_to_legal_topics(
        agg_type in "[a-zA-Z0-9._-]{1,236}",
        agg_id in ".{0,40}",
        payload in ".{0,200}",
        event_type in "[A-Za-z]{0,20}",
    ) {
        let r = router("");
        let row = base_row()
            .with("aggregatetype", oid::VARCHAR, &agg_type)
            .with("aggregateid", oid::TEXT, &agg_id)
            .with("type", oid::TEXT, &event_type)
            .with("payload", oid::TEXT, &payload);
        let rec = r.route_row(&row, COMMIT_MICROS).unwrap();
        prop_assert!(validate_topic(rec.topic.as_bytes()).is_ok());
        prop_assert_eq!(&*rec.topic, format!("outbox.event.{agg_type}"));
        prop_assert_eq!(rec.key.as_deref(), Some(agg_id.as_bytes()));
        prop_assert_eq!(rec.value.as_deref(), Some(payload.as_bytes()));
    }

    /// Routing agrees with the reference model for any rules and values, including across repeated
    /// rows (the topic cache never changes an answer), and never yields an illegal topic.
    #[test]
    fn topics_match_the_reference_model(
        rules in prop::collection::vec(model_rule(), 0..5),
        rows in prop::collection::vec((any_value(), any_value()), 1..30),
    ) {
        let r = model_router(&rules);
        for pass in 0..2 {
            for (tenant, agg_type) in &rows {
                let row = base_row()
                    .with("tenant", oid::TEXT, tenant)
                    .with("aggregatetype", oid::TEXT, agg_type);
                let want = model_topic(&rules, tenant, agg_type);
                match r.route_row(&row, COMMIT_MICROS) {
                    Ok(rec) => {
                        prop_assert!(model_legal(&want), "pass {}: routed {:?}, model says illegal {:?}", pass, rec.topic, want);
                        prop_assert_eq!(&*rec.topic, want.as_str());
                        prop_assert!(validate_topic(rec.topic.as_bytes()).is_ok());
                    }
                    Err(e) => {
                        prop_assert!(!model_legal(&want), "pass {}: {} but model routes to {:?}", pass, e, want);
                        prop_assert_eq!(e.code(), "invalid_topic");
                    }
                }
            }
        }
    }

    /// Equal aggregate ids give equal partitions, whatever else differs between the rows, and the
    /// partition is the Java client's for the key bytes.
    #[test]
    fn equal_aggregate_ids_give_equal_partitions(
        agg_id in prop::collection::vec(any::<u8>(), 0..64),
        others in prop::collection::vec(("[a-z]{1,10}", ".{0,50}", "[a-f0-9-]{1,36}"), 2..6),
        n in 1i32..1000,
    ) {
        let r = router("");
        let hex: String = agg_id.iter().map(|b| format!("{b:02x}")).collect();
        let mut partitions = Vec::new();
        for (agg_type, payload, id) in &others {
            let row = base_row()
                .with("id", oid::TEXT, id)
                .with("aggregatetype", oid::TEXT, agg_type)
                .with("payload", oid::TEXT, payload)
                .with("aggregateid", oid::BYTEA, &format!("\\x{hex}"));
            let rec = r.route_row(&row, COMMIT_MICROS).unwrap();
            prop_assert_eq!(rec.key.as_deref(), Some(agg_id.as_slice()));
            partitions.push(rec.java_partition(n).unwrap());
        }
        let want = java_partition(&agg_id, n);
        prop_assert!((0..n).contains(&want));
        prop_assert!(partitions.iter().all(|p| *p == want), "{:?} vs {}", partitions, want);
    }

    /// Hostile column values of any type, text or binary, give a record or an error, never a panic.
    #[test]
    fn hostile_values_never_panic(
        cols in prop::collection::vec(
            (
                prop::sample::select(vec!["id", "aggregatetype", "aggregateid", "type", "payload", "ts", "p", "h"]),
                prop::sample::select(vec![
                    oid::BOOL, oid::BYTEA, oid::INT2, oid::INT4, oid::INT8, oid::TEXT, oid::JSON,
                    oid::JSONB, oid::UUID, oid::TIMESTAMP, oid::TIMESTAMPTZ, oid::NUMERIC, 9999,
                ]),
                prop::option::of(prop::collection::vec(any::<u8>(), 0..24)),
                any::<bool>(),
            ),
            0..10,
        ),
        commit in any::<i64>(),
    ) {
        let r = router(
            "[outbox]\ntimestamp_column = \"ts\"\npartition_column = \"p\"\n[route]\nenvelope = true\nenvelope_fields = [\"h\"]\n[[route.headers]]\ncolumn = \"h\"",
        );
        let mut row = SimpleRow::new();
        for (name, ty, value, binary) in cols {
            row.push_column(ferry_router::SimpleColumn {
                name: name.to_owned(),
                type_oid: ty,
                value: value.map(Bytes::from),
                binary,
            });
        }
        if let Ok(rec) = r.route_row(&row, commit) {
            prop_assert!(validate_topic(rec.topic.as_bytes()).is_ok());
        }
    }

    /// Arbitrary message content never panics either.
    #[test]
    fn hostile_messages_never_panic(
        content in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64),
            r#"\{("[a-z]{1,3}": ("[^"]{0,5}"|[0-9.e-]{1,5}|null|true|\{\}|\[\]),? ?){0,6}\}"#
                .prop_map(String::into_bytes),
        ],
    ) {
        let r = router("[outbox]\ntimestamp_column = \"a\"");
        let _ = r.route_message(&Bytes::from(content), COMMIT_MICROS);
    }
}

/// A JSON document as the generator builds it (objects with distinct keys; numbers as i32,
/// i64 or finite f64).
fn json_doc() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i32>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        (-1e12f64..1e12).prop_map(serde_json::Value::from),
        "[a-z\"\\\\\n\u{1}é😀]{0,6}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::btree_map("[a-z]{1,4}", inner, 0..5)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// `Value` with what Debezium's expansion leaves out removed: null members and empty arrays.
fn without_nulls(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => serde_json::Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        serde_json::Value::Array(a) => {
            serde_json::Value::Array(a.iter().map(without_nulls).collect())
        }
        other => other.clone(),
    }
}

/// Equal, numbers compared as doubles within 2 ulp (serde_json's own float reading, without its
/// `float_roundtrip` feature, may be one ulp off the correctly rounded value).
fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value as V;
    match (a, b) {
        (V::Number(x), V::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            x == y || (x - y).abs() <= 2.0 * f64::EPSILON * x.abs().max(y.abs())
        }
        (V::Array(x), V::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (V::Object(x), V::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((kx, vx), (ky, vy))| kx == ky && same_json(vx, vy))
        }
        (x, y) => x == y,
    }
}

proptest! {
    /// `json_expanded` on any object: either a routing error (a document Kafka Connect failed
    /// on), a JSON string holding the document (Debezium could not expand it), or an object
    /// equal to the document without its null members and empty arrays (numbers compared as
    /// doubles: Java wrote them as int, long or double). Never a panic.
    #[test]
    fn json_expanded_is_the_document_or_the_string(
        m in prop::collection::btree_map("[a-z]{1,4}", json_doc(), 0..6)
    ) {
        let doc = serde_json::Value::Object(m.into_iter().collect());
        let text = serde_json::to_string(&doc).unwrap();
        let row = base_row().with("payload", oid::JSON, &text);
        let r = router("[route]\nvalue_format = \"json_expanded\"").route_row(&row, COMMIT_MICROS);
        if let Ok(r) = r {
            let got: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            match got {
                serde_json::Value::String(s) => prop_assert_eq!(s, text),
                got => {
                    let want = without_nulls(&doc);
                    prop_assert!(same_json(&got, &want), "{} vs {}", got, want);
                }
            }
        }
    }

    /// `json_expanded_with_schema` on any object: the same outcome as `json_expanded`, its
    /// `payload` the same value, and its `schema` describing it (a struct per object with a
    /// field per member, an array's items per element, scalars by kind, all optional); where
    /// Debezium did not expand, the bytes of `json_with_schema`.
    #[test]
    fn json_expanded_with_schema_describes_its_payload(
        m in prop::collection::btree_map("[a-z]{1,4}", json_doc(), 0..6)
    ) {
        let doc = serde_json::Value::Object(m.into_iter().collect());
        let text = serde_json::to_string(&doc).unwrap();
        let row = base_row().with("payload", oid::JSON, &text);
        let route = |format: &str| {
            router(&format!("[route]\nvalue_format = \"{format}\""))
                .route_row(&row, COMMIT_MICROS)
                .map(|r| serde_json::from_slice::<serde_json::Value>(r.value.as_deref().unwrap()).unwrap())
        };
        match (route("json_expanded"), route("json_expanded_with_schema")) {
            (Err(_), Err(_)) => {}
            (Ok(serde_json::Value::String(_)), Ok(with)) => {
                prop_assert_eq!(with, route("json_with_schema").unwrap());
            }
            (Ok(without), Ok(with)) => {
                prop_assert_eq!(&with["payload"], &without);
                prop_assert_eq!(&with["schema"]["name"], "payload");
                prop_assert!(describes(&with["schema"], &without), "{} vs {}", with["schema"], without);
            }
            (a, b) => prop_assert!(false, "outcomes differ: {:?} vs {:?}", a, b),
        }
    }

    /// Hostile payload text never panics the expansion.
    #[test]
    fn json_expanded_survives_any_text(s in "\\{[\\[\\]{}\":,0-9a-z.eE+\\\\ -]{0,40}") {
        let row = base_row().with("payload", oid::JSON, &s);
        let _ = router("[route]\nvalue_format = \"json_expanded\"").route_row(&row, COMMIT_MICROS);
        let _ = router("[route]\nvalue_format = \"json_expanded_with_schema\"").route_row(&row, COMMIT_MICROS);
    }
}

/// Whether a Connect schema as `JsonConverter` writes it describes `v` (see above).
fn describes(schema: &serde_json::Value, v: &serde_json::Value) -> bool {
    use serde_json::Value;
    if schema["optional"] != Value::Bool(true) {
        return false;
    }
    match (schema["type"].as_str(), v) {
        (_, Value::Null) => true,
        (Some("struct"), Value::Object(members)) => {
            let fields = schema["fields"].as_array().unwrap();
            fields.len() == members.len()
                && fields.iter().all(|f| {
                    members
                        .get(f["field"].as_str().unwrap())
                        .is_some_and(|m| describes(f, m))
                })
        }
        (Some("array"), Value::Array(items)) => {
            items.iter().all(|i| describes(&schema["items"], i))
        }
        (Some("int32" | "int64"), Value::Number(n)) => n.is_i64(),
        (Some("double"), Value::Number(_)) => true,
        (Some("string"), Value::String(_)) => true,
        (Some("boolean"), Value::Bool(_)) => true,
        _ => false,
    }
}
