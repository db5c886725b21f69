//! Configuration: defaults, TOML shape (closed sections), table names, and every `validate()`
//! problem with its key path.

mod common;

use common::sections;
use ferry_router::config::{
    DEFAULT_MAX_PAYLOAD_BYTES, KAFKA_BROKER_MESSAGE_MAX_BYTES, LIBRDKAFKA_MESSAGE_MAX_BYTES,
};
use ferry_router::{validate, OnError, OutboxConfig, RouteConfig, Router, TableName};

#[test]
fn defaults() {
    let o = OutboxConfig::default();
    assert_eq!(o.table, "public.outbox");
    assert_eq!(
        (
            o.id_column.as_str(),
            o.aggregate_type_column.as_str(),
            o.aggregate_id_column.as_str(),
            o.type_column.as_str(),
            o.payload_column.as_str()
        ),
        ("id", "aggregatetype", "aggregateid", "type", "payload")
    );
    assert_eq!(
        (o.timestamp_column, o.partition_column, o.message_prefix),
        (None, None, None)
    );
    let r = RouteConfig::default();
    assert_eq!(
        r.topic_template(&OutboxConfig::default()),
        "outbox.event.{aggregatetype}"
    );
    assert_eq!(
        (r.id_header.as_str(), r.type_header.as_str()),
        ("id", "type")
    );
    assert!(!r.envelope && !r.tombstone_on_null_payload);
    assert_eq!(r.on_error, OnError::Fail);
    assert_eq!(r.max_payload_bytes, DEFAULT_MAX_PAYLOAD_BYTES);
    const _: () = assert!(DEFAULT_MAX_PAYLOAD_BYTES < LIBRDKAFKA_MESSAGE_MAX_BYTES);
    const _: () = assert!(LIBRDKAFKA_MESSAGE_MAX_BYTES < KAFKA_BROKER_MESSAGE_MAX_BYTES);
    // An empty file is the default config, and it is valid.
    let s = sections("");
    assert_eq!(s.outbox, OutboxConfig::default());
    assert_eq!(s.route, RouteConfig::default());
    validate(&s.outbox, &s.route).unwrap();
}

#[test]
fn default_topic_follows_the_aggregate_type_column() {
    let s = sections("[outbox]\naggregate_type_column = \"kind\"");
    assert_eq!(s.route.topic_template(&s.outbox), "outbox.event.{kind}");
    let s = sections(
        "[outbox]\naggregate_type_column = \"kind\"\n[route]\ntopic = \"x.{aggregatetype}\"",
    );
    assert_eq!(s.route.topic_template(&s.outbox), "x.{aggregatetype}");
}

#[test]
fn full_example_parses_and_compiles() {
    let text = r#"
        [outbox]
        table = "app.outbox_events"
        id_column = "event_id"
        aggregate_type_column = "aggregate_type"
        aggregate_id_column = "aggregate_id"
        type_column = "event_type"
        payload_column = "body"
        timestamp_column = "created_at"
        partition_column = "shard"
        message_prefix = "outbox"

        [route]
        topic = "{tenant}.events.{aggregate_type}"
        id_header = "eventId"
        type_header = "eventType"
        envelope = true
        envelope_fields = ["event_type"]
        additional_placement = "tenant:header:tenantId,version:envelope:schemaVersion"
        tombstone_on_null_payload = true
        max_payload_bytes = 500000
        on_error = "dead_letter"
        dead_letter_topic = "outbox.dlq"

        [[route.rules]]
        column = "aggregate_type"
        equals = "Order"
        topic = "orders"

        [[route.rules]]
        column = "aggregate_type"
        regex = "legacy_(?<name>.+)"
        topic = "legacy.${name}"

        [[route.headers]]
        column = "trace_id"
        name = "traceparent"
    "#;
    let s = sections(text);
    assert_eq!(
        s.outbox.table_name().unwrap(),
        TableName {
            schema: "app".into(),
            name: "outbox_events".into()
        }
    );
    assert_eq!(s.route.rules.len(), 2);
    assert_eq!(s.route.headers[0].header_name(), "traceparent");
    assert_eq!(s.route.on_error, OnError::DeadLetter);
    let router = Router::new(&s.outbox, &s.route).unwrap();
    assert_eq!(router.table().to_string(), "app.outbox_events");
    assert_eq!(router.on_error(), OnError::DeadLetter);
}

#[test]
fn sections_are_closed() {
    let cases = [
        ("[outbox]\nid_colum = \"id\"", "unknown field `id_colum`"),
        ("[route]\ntopics = \"x\"", "unknown field `topics`"),
        (
            "[[route.rules]]\ncolumn = \"a\"\nequals = \"b\"\ntopic = \"c\"\nmatch = \"d\"",
            "unknown field `match`",
        ),
        (
            "[[route.headers]]\ncolumn = \"a\"\nalias = \"b\"",
            "unknown field `alias`",
        ),
        ("[route]\non_error = \"ignore\"", "unknown variant `ignore`"),
        ("[route]\nmax_payload_bytes = -1", "invalid value"),
        (
            "[[route.rules]]\ncolumn = \"a\"\nequals = \"b\"",
            "missing field `topic`",
        ),
    ];
    for (text, want) in cases {
        let err = toml::from_str::<common::Sections>(text)
            .expect_err(text)
            .to_string();
        assert!(err.contains(want), "{text}: {err}");
    }
}

#[test]
fn on_error_spellings() {
    for (s, v) in [
        ("fail", OnError::Fail),
        ("skip", OnError::Skip),
        ("dead_letter", OnError::DeadLetter),
    ] {
        assert_eq!(s.parse::<OnError>(), Ok(v));
        assert_eq!(v.to_string(), s);
    }
    assert!("dead-letter"
        .parse::<OnError>()
        .unwrap_err()
        .contains("expected"));
}

#[test]
fn table_names() {
    let t = |schema: &str, name: &str| TableName {
        schema: schema.into(),
        name: name.into(),
    };
    let ok = [
        ("outbox", t("public", "outbox")),
        ("public.outbox", t("public", "outbox")),
        ("App.Outbox", t("app", "outbox")),
        ("\"App\".\"Outbox\"", t("App", "Outbox")),
        ("\"my schema\".\"out.box\"", t("my schema", "out.box")),
        ("\"a\"\"b\".c", t("a\"b", "c")),
        ("  s.t  ", t("s", "t")),
    ];
    for (text, want) in ok {
        assert_eq!(text.parse::<TableName>(), Ok(want.clone()), "{text}");
        // Display round-trips.
        assert_eq!(want.to_string().parse::<TableName>(), Ok(want), "{text}");
    }
    for bad in [
        "", ".", "a.", ".b", "a.b.c", "\"a", "a b", "a\"b\"", "\"a\"x",
    ] {
        assert!(bad.parse::<TableName>().is_err(), "{bad:?}");
    }
}

/// Each config must produce exactly these `path: fragment` problems.
#[test]
fn every_problem_with_its_path() {
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("[outbox]\ntable = \"a.b.c\"", &[("outbox.table", "too many parts")]),
        ("[outbox]\nid_column = \"\"", &[("outbox.id_column", "must not be empty")]),
        (
            "[outbox]\naggregate_type_column = \"\"\naggregate_id_column = \"\"\ntype_column = \"\"\npayload_column = \"a\\u0000\"",
            &[
                ("outbox.aggregate_type_column", "must not be empty"),
                ("outbox.aggregate_id_column", "must not be empty"),
                ("outbox.type_column", "must not be empty"),
                ("outbox.payload_column", "NUL"),
            ],
        ),
        (
            "[outbox]\ntimestamp_column = \"\"\npartition_column = \"\"\nmessage_prefix = \"\"",
            &[
                ("outbox.timestamp_column", "must not be empty"),
                ("outbox.partition_column", "must not be empty"),
                ("outbox.message_prefix", "leave it unset"),
            ],
        ),
        ("[outbox]\naggregate_type_column = \"a}b\"", &[("route.topic (default, from outbox.aggregate_type_column)", "closes nothing")]),
        ("[route]\ntopic = \"outbox.{aggregatetype\"", &[("route.topic", "unclosed '{'")]),
        ("[route]\ntopic = \"outbox events\"", &[("route.topic", "not legal in a Kafka topic name")]),
        ("[route]\ntopic = \"\"", &[("route.topic", "empty")]),
        ("[route]\ntopic = \"..\"", &[("route.topic", "are not legal topic names")]),
        ("[route]\ntopic = \"$1\"", &[("route.topic", "only available in a rule with a regex")]),
        (
            r#"[[route.rules]]
               column = "aggregatetype"
               equals = "a"
               topic = "fine"
               [[route.rules]]
               column = ""
               equals = "a"
               regex = "b"
               topic = "x"
               [[route.rules]]
               column = "c"
               topic = "bad topic"
               [[route.rules]]
               column = "c"
               regex = "(unclosed"
               topic = "t"
               [[route.rules]]
               column = "c"
               regex = "(?<known>.*)"
               topic = "t.${unknown}.$2.${known}.$1"
               [[route.rules]]
               column = "c"
               equals = "x"
               topic = "t.$1""#,
            &[
                ("route.rules[1].column", "must not be empty"),
                ("route.rules[1]", "not both"),
                ("route.rules[2]", "set `equals"),
                ("route.rules[2].topic", "' ' at byte 3"),
                ("route.rules[3].regex", "invalid regex"),
                ("route.rules[4].topic", "${unknown} names no capture group"),
                ("route.rules[4].topic", "$2 names no capture group"),
                ("route.rules[5].topic", "only available in a rule with a regex"),
            ],
        ),
        (
            r#"[route]
               id_header = "x"
               type_header = "x"
               [[route.headers]]
               column = ""
               name = ""
               [[route.headers]]
               column = "id"
               [[route.headers]]
               column = "tenant"
               name = "x""#,
            &[
                ("route.headers[0].column", "must not be empty"),
                ("route.headers[0].name", "omit it"),
                ("route.type_header", "duplicate header name \"x\" (also set by route.id_header)"),
                ("route.headers[2]", "duplicate header name \"x\""),
            ],
        ),
        (
            "[route]\nenvelope_fields = [\"type\"]",
            &[("route.envelope_fields", "unless route.envelope = true")],
        ),
        (
            "[route]\nenvelope = true\nenvelope_fields = [\"type\", \"\", \"type\", \"payload\"]",
            &[
                ("route.envelope_fields[1]", "must not be empty"),
                ("route.envelope_fields[3]", "\"payload\" is the envelope's payload key"),
                ("route.envelope_fields[2]", "duplicate envelope field \"type\""),
            ],
        ),
        (
            "[route]\nadditional_placement = \"type:header,bad,x:nowhere,a:b:c:d,t:envelope,p:partition,q:partition,id:header:id\"",
            &[
                ("route.additional_placement[1]", "not column:location"),
                ("route.additional_placement[2]", "unknown location \"nowhere\""),
                ("route.additional_placement[3]", "not column:location"),
            ],
        ),
        (
            "[route]\nadditional_placement = \"t:envelope,p:partition,q:partition,id:header:id,type:header\"",
            &[
                ("route.additional_placement[0]", "needs route.envelope = true"),
                ("route.additional_placement", "at most one column"),
                ("route.additional_placement[3]", "duplicate header name \"id\""),
                ("route.additional_placement[4]", "duplicate header name \"type\""),
            ],
        ),
        (
            "[outbox]\npartition_column = \"a\"\n[route]\nadditional_placement = \"b:partition\"",
            &[("route.additional_placement", "conflicts with outbox.partition_column")],
        ),
        ("[route]\nmax_payload_bytes = 0", &[("route.max_payload_bytes", "between 1 and")]),
        ("[route]\nmax_payload_bytes = 1000000001", &[("route.max_payload_bytes", "between 1 and")]),
        ("[route]\non_error = \"dead_letter\"", &[("route.dead_letter_topic", "is required")]),
        (
            "[route]\non_error = \"dead_letter\"\ndead_letter_topic = \"dead letters\"",
            &[("route.dead_letter_topic", "not legal in a topic name")],
        ),
        (
            "[route]\non_error = \"skip\"\ndead_letter_topic = \"dlq\"",
            &[("route.dead_letter_topic", "only used when route.on_error = \"dead_letter\"")],
        ),
    ];
    for (text, want) in cases {
        let s = sections(text);
        let errors = validate(&s.outbox, &s.route).expect_err(text);
        let got: Vec<(String, String)> = errors
            .problems
            .iter()
            .map(|p| (p.path.clone(), p.message.clone()))
            .collect();
        assert_eq!(got.len(), want.len(), "{text}\n{errors}");
        for (path, fragment) in *want {
            assert!(
                got.iter().any(|(p, m)| p == path && m.contains(fragment)),
                "{text}\nmissing {path}: ..{fragment}.. in\n{errors}"
            );
        }
        // Router::new reports the same problems.
        assert_eq!(Router::new(&s.outbox, &s.route).unwrap_err(), errors);
    }
}

#[test]
fn template_literal_longer_than_a_topic() {
    let route = RouteConfig {
        topic: Some(format!("{}{{x}}", "a".repeat(250))),
        ..RouteConfig::default()
    };
    let e = validate(&OutboxConfig::default(), &route).unwrap_err();
    assert_eq!(e.problems.len(), 1);
    assert_eq!(e.problems[0].path, "route.topic");
    assert!(
        e.problems[0]
            .message
            .contains("literal text alone is longer"),
        "{e}"
    );
}

#[test]
fn problems_display_with_paths() {
    let s = sections("[outbox]\nid_column = \"\"\n[route]\non_error = \"dead_letter\"");
    let e = validate(&s.outbox, &s.route).unwrap_err();
    assert_eq!(
        e.to_string(),
        "2 configuration problems:\n  outbox.id_column: must not be empty\n  route.dead_letter_topic: is required when route.on_error = \"dead_letter\""
    );
    // Each section also validates alone.
    assert_eq!(s.outbox.validate().unwrap_err().problems.len(), 1);
    assert_eq!(s.route.validate().unwrap_err().problems.len(), 1);
}

#[test]
fn config_round_trips_through_toml() {
    let text = "[outbox]\ntimestamp_column = \"ts\"\n[route]\ntopic = \"t\"\nadditional_placement = \"a:header\"\n[[route.rules]]\ncolumn = \"c\"\nregex = \".*\"\ntopic = \"x\"";
    let s = sections(text);
    #[derive(serde::Serialize)]
    struct Out<'a> {
        outbox: &'a OutboxConfig,
        route: &'a RouteConfig,
    }
    let back = toml::to_string(&Out {
        outbox: &s.outbox,
        route: &s.route,
    })
    .unwrap();
    let again = sections(&back);
    assert_eq!(again.outbox, s.outbox);
    assert_eq!(again.route, s.route);
}

/// The examples in `config.md` and the crate docs parse, validate and compile.
#[test]
fn documented_examples_are_valid() {
    let md = include_str!("../config.md");
    let start = md.find("```toml\n").unwrap() + "```toml\n".len();
    let example = &md[start..start + md[start..].find("```").unwrap()];
    let lib = include_str!("../src/lib.rs");
    let doc: String = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .skip_while(|l| *l != "```toml")
        .skip(1)
        .take_while(|l| *l != "```")
        .map(|l| format!("{l}\n"))
        .collect();
    for text in [example, doc.as_str()] {
        assert!(text.contains("[[route.rules]]"), "{text}");
        let s = sections(text);
        Router::new(&s.outbox, &s.route).unwrap_or_else(|e| panic!("{text}\n{e}"));
    }
}

/// The columns a router reads: the defaults, and every place a configuration can name one.
#[test]
fn columns_read() {
    let r = Router::new(&OutboxConfig::default(), &RouteConfig::default()).unwrap();
    assert_eq!(
        r.columns(),
        ["aggregateid", "aggregatetype", "id", "payload", "type"]
    );
    let outbox = OutboxConfig {
        timestamp_column: Some("created_at".into()),
        partition_column: Some("part".into()),
        ..OutboxConfig::default()
    };
    let route = RouteConfig {
        topic: Some("events.{tenant}".into()),
        type_header: String::new(),
        envelope: true,
        envelope_fields: vec!["extra".into()],
        ..RouteConfig::default()
    };
    let r = Router::new(&outbox, &route).unwrap();
    assert_eq!(
        r.columns(),
        [
            "aggregateid",
            "created_at",
            "extra",
            "id",
            "part",
            "payload",
            "tenant"
        ]
    );
}

/// The router lists every column it reads, with the key that names it and the types it reads
/// it from: what `ferry check` and the set-up check hold the table to.
#[test]
fn required_columns_name_every_column_read_with_its_key_and_types() {
    let outbox = OutboxConfig {
        timestamp_column: Some("created_at".into()),
        ..OutboxConfig::default()
    };
    let route = RouteConfig {
        topic: Some("{tenant}.{aggregatetype}".into()),
        rules: vec![ferry_router::RuleConfig {
            column: "region".into(),
            equals: Some("eu".into()),
            regex: None,
            topic: "eu.events".into(),
        }],
        additional_placement: Some("shard:partition".into()),
        ..RouteConfig::default()
    };
    let r = Router::new(&outbox, &route).unwrap();
    let find = |c: &str| {
        r.required_columns()
            .iter()
            .find(|x| x.column == c)
            .unwrap_or_else(|| panic!("{c} missing from {:?}", r.required_columns()))
            .clone()
    };
    assert_eq!(
        find("type").config_key,
        "outbox.type_column (route.type_header)"
    );
    assert_eq!(
        find("payload").accepted_types,
        Some(ferry_router::PAYLOAD_TYPES)
    );
    assert_eq!(
        find("created_at").accepted_types,
        Some(ferry_router::TIMESTAMP_TYPES)
    );
    assert_eq!(find("shard").config_key, "route.additional_placement");
    assert_eq!(
        find("shard").accepted_types,
        Some(ferry_router::PARTITION_TYPES)
    );
    assert_eq!(find("region").config_key, "route.rules[0].column");
    assert!(find("tenant").config_key.starts_with("route.topic"));
    assert!(find("aggregatetype").config_key.starts_with("route.topic"));
    assert_eq!(find("id").accepted_types, None);
    let mut names: Vec<&str> = r
        .required_columns()
        .iter()
        .map(|c| c.column.as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, r.columns(), "the same columns route_row reads");

    // No type header: the type column is not read.
    let r = Router::new(
        &OutboxConfig::default(),
        &RouteConfig {
            type_header: String::new(),
            ..RouteConfig::default()
        },
    )
    .unwrap();
    assert!(r.required_columns().iter().all(|c| c.column != "type"));
    assert_eq!(
        r.required_columns()
            .iter()
            .find(|c| c.column == "aggregatetype")
            .unwrap()
            .config_key,
        "outbox.aggregate_type_column (in the topic template)"
    );
}
