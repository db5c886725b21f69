//! Table-driven tests of loading, environment overrides, validation and redaction.

use std::time::Duration;

use super::env::{var_name, KEYS, SECTIONS};
use super::*;

const EXAMPLE: &str = include_str!("../../ferry.example.toml");
const URL: &str = "postgres://ferry:hunter2@localhost:5432/app";

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The smallest valid configuration: environment only.
fn minimal_env() -> Vec<(String, String)> {
    env(&[
        ("FERRY_POSTGRES_URL", URL),
        ("FERRY_KAFKA_BROKERS", "localhost:9092"),
    ])
}

fn valid() -> Config {
    load(None, minimal_env()).unwrap()
}

fn problems(err: ConfigError) -> Vec<String> {
    match err {
        ConfigError::Invalid(e) => e.problems.iter().map(ToString::to_string).collect(),
        ConfigError::Toml(e) => panic!("unexpected TOML error: {e}"),
    }
}

#[test]
fn environment_alone_is_enough_and_everything_else_defaults() {
    let c = valid();
    assert_eq!(c.postgres.url.expose(), URL);
    assert_eq!(c.kafka.brokers.0, ["localhost:9092"]);
    let pg = &c.postgres;
    assert_eq!(pg.slot, defaults::SLOT);
    assert_eq!(pg.publication, defaults::PUBLICATION);
    assert_eq!((pg.create_slot, pg.create_publication), (true, true));
    assert_eq!(pg.status_interval, Duration::from_secs(1));
    assert_eq!(pg.connect_timeout, Duration::from_secs(10));
    assert_eq!(pg.reconnect_backoff_min, Duration::from_millis(500));
    assert_eq!(pg.reconnect_backoff_max, Duration::from_secs(30));
    assert_eq!(pg.standby_poll_interval, Duration::from_secs(2));
    assert!(pg.binary, "binary mode where it helps");
    assert_eq!(c.outbox, ferry_router::OutboxConfig::default());
    assert_eq!(c.route, ferry_router::RouteConfig::default());
    let k = &c.kafka;
    assert_eq!(k.compression, Compression::Lz4);
    assert_eq!(k.max_in_flight_records, 10_000);
    assert_eq!(k.max_in_flight_bytes, 16 * 1024 * 1024);
    assert_eq!(
        k.delivery_timeout,
        Duration::ZERO,
        "records never time out by default"
    );
    assert_eq!(k.linger, Duration::from_millis(1));
    assert!(k.properties.0.is_empty());
    assert_eq!(
        c.http.listen.addr(),
        Some("127.0.0.1:9187".parse().unwrap())
    );
    assert_eq!(c.log.format, crate::telemetry::LogFormat::Text);
    assert_eq!(c.log.level, "info");
    assert_eq!(c.shutdown.drain_timeout, Duration::from_secs(30));
    // An empty file is the same as no file.
    assert_eq!(load(Some(""), minimal_env()).unwrap(), c);
}

#[test]
fn the_example_file_loads_validates_and_documents_every_key() {
    let c = load(Some(EXAMPLE), []).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.kafka.brokers.0.len(), 2);
    assert_eq!(c.kafka.properties.0["sasl.mechanism"], "SCRAM-SHA-512");
    for k in KEYS {
        let documented = EXAMPLE.lines().any(|l| {
            let l = l.trim_start_matches(['#', ' ']);
            l.starts_with(&format!("{} =", k.key))
        });
        assert!(
            documented,
            "ferry.example.toml does not mention {}.{}",
            k.section, k.key
        );
    }
}

/// (variable, value, the key's value read back, expected)
type EnvCase = (
    &'static str,
    &'static str,
    fn(&Config) -> String,
    &'static str,
);

#[test]
fn every_scalar_key_is_overridable_from_the_environment() {
    #[rustfmt::skip]
    let cases: &[EnvCase] = &[
        ("FERRY_POSTGRES_URL", "host=db user=u", |c| c.postgres.url.expose().into(), "host=db user=u"),
        ("FERRY_POSTGRES_SLOT", "s2", |c| c.postgres.slot.clone(), "s2"),
        ("FERRY_POSTGRES_PUBLICATION", "p2", |c| c.postgres.publication.clone(), "p2"),
        ("FERRY_POSTGRES_PASSWORD_FILE", "/run/secrets/pg", |c| format!("{:?}", c.postgres.password_file), "Some(\"/run/secrets/pg\")"),
        ("FERRY_POSTGRES_CREATE_SLOT", "false", |c| c.postgres.create_slot.to_string(), "false"),
        ("FERRY_POSTGRES_CREATE_PUBLICATION", "false", |c| c.postgres.create_publication.to_string(), "false"),
        ("FERRY_POSTGRES_FAILOVER_SLOT", "true", |c| c.postgres.failover_slot.to_string(), "true"),
        ("FERRY_POSTGRES_STATUS_INTERVAL", "250ms", |c| format!("{:?}", c.postgres.status_interval), "250ms"),
        ("FERRY_POSTGRES_RECEIVE_TIMEOUT", "0s", |c| format!("{:?}", c.postgres.receive_timeout), "0ns"),
        ("FERRY_POSTGRES_CONNECT_TIMEOUT", "3s", |c| format!("{:?}", c.postgres.connect_timeout), "3s"),
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MIN", "1s", |c| format!("{:?}", c.postgres.reconnect_backoff_min), "1s"),
        ("FERRY_POSTGRES_RECONNECT_BACKOFF_MAX", "1h", |c| format!("{:?}", c.postgres.reconnect_backoff_max), "3600s"),
        ("FERRY_POSTGRES_STANDBY_POLL_INTERVAL", "9s", |c| format!("{:?}", c.postgres.standby_poll_interval), "9s"),
        ("FERRY_POSTGRES_BINARY", "false", |c| c.postgres.binary.to_string(), "false"),
        ("FERRY_OUTBOX_TABLE", "app.events", |c| c.outbox.table.clone(), "app.events"),
        ("FERRY_OUTBOX_ID_COLUMN", "event_id", |c| c.outbox.id_column.clone(), "event_id"),
        ("FERRY_OUTBOX_AGGREGATE_TYPE_COLUMN", "at", |c| c.outbox.aggregate_type_column.clone(), "at"),
        ("FERRY_OUTBOX_AGGREGATE_ID_COLUMN", "ai", |c| c.outbox.aggregate_id_column.clone(), "ai"),
        ("FERRY_OUTBOX_TYPE_COLUMN", "kind", |c| c.outbox.type_column.clone(), "kind"),
        ("FERRY_OUTBOX_PAYLOAD_COLUMN", "body", |c| c.outbox.payload_column.clone(), "body"),
        ("FERRY_OUTBOX_TIMESTAMP_COLUMN", "ts", |c| format!("{:?}", c.outbox.timestamp_column), "Some(\"ts\")"),
        ("FERRY_OUTBOX_PARTITION_COLUMN", "p", |c| format!("{:?}", c.outbox.partition_column), "Some(\"p\")"),
        ("FERRY_OUTBOX_MESSAGE_PREFIX", "outbox", |c| format!("{:?}", c.outbox.message_prefix), "Some(\"outbox\")"),
        ("FERRY_OUTBOX_TRACING_COLUMN", "tracingspancontext", |c| format!("{:?}", c.outbox.tracing_column), "Some(\"tracingspancontext\")"),
        ("FERRY_ROUTE_TOPIC", "events", |c| format!("{:?}", c.route.topic), "Some(\"events\")"),
        ("FERRY_ROUTE_ID_HEADER", "", |c| c.route.id_header.clone(), ""),
        ("FERRY_ROUTE_TYPE_HEADER", "t", |c| c.route.type_header.clone(), "t"),
        ("FERRY_ROUTE_ENVELOPE", "true", |c| c.route.envelope.to_string(), "true"),
        ("FERRY_ROUTE_ADDITIONAL_PLACEMENT", "x:header", |c| format!("{:?}", c.route.additional_placement), "Some(\"x:header\")"),
        ("FERRY_ROUTE_TOMBSTONE_ON_NULL_PAYLOAD", "true", |c| c.route.tombstone_on_null_payload.to_string(), "true"),
        ("FERRY_ROUTE_SEND_NULL_PAYLOAD", "true", |c| c.route.send_null_payload.to_string(), "true"),
        ("FERRY_ROUTE_MAX_PAYLOAD_BYTES", "1000", |c| c.route.max_payload_bytes.to_string(), "1000"),
        ("FERRY_ROUTE_ON_ERROR", "skip", |c| c.route.on_error.to_string(), "skip"),
        ("FERRY_ROUTE_DEAD_LETTER_TOPIC", "dlq", |c| format!("{:?}", c.route.dead_letter_topic), "Some(\"dlq\")"),
        ("FERRY_ROUTE_CLOUDEVENTS", "structured", |c| c.route.cloudevents.to_string(), "structured"),
        ("FERRY_ROUTE_CLOUDEVENTS_SOURCE", "/ferry/shop/outbox", |c| format!("{:?}", c.route.cloudevents_source), "Some(\"/ferry/shop/outbox\")"),
        ("FERRY_ROUTE_CLOUDEVENTS_SUBJECT", "", |c| format!("{:?}", c.route.cloudevents_subject), "Some(\"\")"),
        ("FERRY_ROUTE_CLOUDEVENTS_DATA_CONTENT_TYPE", "application/avro", |c| format!("{:?}", c.route.cloudevents_data_content_type), "Some(\"application/avro\")"),
        ("FERRY_ROUTE_KEY_FORMAT", "json", |c| c.route.key_format.to_string(), "json"),
        ("FERRY_ROUTE_VALUE_FORMAT", "json_with_schema", |c| c.route.value_format.to_string(), "json_with_schema"),
        ("FERRY_ROUTE_KEY_SCHEMA_OPTIONAL", "true", |c| c.route.key_schema_optional.to_string(), "true"),
        ("FERRY_ROUTE_VALUE_SCHEMA_OPTIONAL", "false", |c| c.route.value_schema_optional.to_string(), "false"),
        ("FERRY_ROUTE_EXPAND_NULL_BEHAVIOR", "optional_bytes", |c| c.route.expand_null_behavior.to_string(), "optional_bytes"),
        ("FERRY_ROUTE_POSITION_HEADERS", "true", |c| c.route.position_headers.to_string(), "true"),
        ("FERRY_KAFKA_BROKERS", "a:1, b:2", |c| c.kafka.brokers.0.join("|"), "a:1|b:2"),
        ("FERRY_KAFKA_COMPRESSION", "zstd", |c| c.kafka.compression.as_str().into(), "zstd"),
        ("FERRY_KAFKA_MAX_IN_FLIGHT_RECORDS", "7", |c| c.kafka.max_in_flight_records.to_string(), "7"),
        ("FERRY_KAFKA_MAX_IN_FLIGHT_BYTES", "2000000", |c| c.kafka.max_in_flight_bytes.to_string(), "2000000"),
        ("FERRY_KAFKA_DELIVERY_TIMEOUT", "5m", |c| format!("{:?}", c.kafka.delivery_timeout), "300s"),
        ("FERRY_KAFKA_LINGER", "0ms", |c| format!("{:?}", c.kafka.linger), "0ns"),
        ("FERRY_KAFKA_PROGRESS_TOPIC", "app.ferry-progress", |c| c.kafka.progress_topic.clone(), "app.ferry-progress"),
        ("FERRY_KAFKA_EXACTLY_ONCE", "true", |c| c.kafka.exactly_once.to_string(), "true"),
        ("FERRY_KAFKA_TRANSACTION_INTERVAL", "250ms", |c| format!("{:?}", c.kafka.transaction_interval), "250ms"),
        ("FERRY_KAFKA_TRANSACTION_MAX_RECORDS", "100", |c| c.kafka.transaction_max_records.to_string(), "100"),
        ("FERRY_KAFKA_TRANSACTION_MAX_BYTES", "1MiB", |c| c.kafka.transaction_max_bytes.to_string(), "1048576"),
        ("FERRY_KAFKA_PROPERTIES_SASL_MECHANISM", "PLAIN", |c| { c.kafka .properties .0 .get("sasl.mechanism") .cloned() .unwrap_or_default() }, "PLAIN"),
        ("FERRY_HTTP_LISTEN", "off", |c| c.http.listen.to_string(), "off"),
        ("FERRY_LOG_FORMAT", "json", |c| c.log.format.to_string(), "json"),
        ("FERRY_LOG_LEVEL", "debug", |c| c.log.level.clone(), "debug"),
        ("FERRY_SHUTDOWN_DRAIN_TIMEOUT", "1m", |c| format!("{:?}", c.shutdown.drain_timeout), "60s"),
        ("FERRY_INBOX_TOPICS", "a, b", |c| c.inbox.topics.0.join("|"), "a|b"),
        ("FERRY_INBOX_GROUP_ID", "orders", |c| c.inbox.group_id.clone(), "orders"),
        ("FERRY_INBOX_TABLE", "app.inbox", |c| c.inbox.table.clone(), "app.inbox"),
        ("FERRY_INBOX_CREATE_TABLES", "false", |c| c.inbox.create_tables.to_string(), "false"),
        ("FERRY_INBOX_PAYLOAD_TYPE", "bytea", |c| c.inbox.payload_type.clone(), "bytea"),
        ("FERRY_INBOX_EVENT_ID_HEADER", "event-id", |c| c.inbox.event_id_header.clone(), "event-id"),
        ("FERRY_INBOX_POSITIONS", "true", |c| c.inbox.positions.to_string(), "true"),
        ("FERRY_INBOX_START", "latest", |c| c.inbox.start.clone(), "latest"),
        ("FERRY_INBOX_DEDUP_RETENTION", "2d", |c| format!("{:?}", c.inbox.dedup_retention), "172800s"),
        ("FERRY_INBOX_PROCESSED_RETENTION", "0s", |c| format!("{:?}", c.inbox.processed_retention), "0ns"),
        ("FERRY_INBOX_CLEANUP_INTERVAL", "5m", |c| format!("{:?}", c.inbox.cleanup_interval), "300s"),
        ("FERRY_INBOX_CLEANUP_BATCH", "100", |c| c.inbox.cleanup_batch.to_string(), "100"),
        ("FERRY_INBOX_MAX_BATCH_RECORDS", "10", |c| c.inbox.max_batch_records.to_string(), "10"),
        ("FERRY_INBOX_MAX_BATCH_DELAY", "5ms", |c| format!("{:?}", c.inbox.max_batch_delay), "5ms"),
        ("FERRY_INBOX_MAX_BUFFERED_BYTES", "64MiB", |c| c.inbox.max_buffered_bytes.to_string(), "67108864"),
        ("FERRY_INBOX_NOTIFY_CHANNEL", "", |c| c.inbox.notify_channel.clone(), ""),
    ];
    for &(var, value, read, expected) in cases {
        let mut vars = minimal_env();
        vars.push((var.to_owned(), value.to_owned()));
        let c = Config::from_toml("").unwrap();
        let mut c2 = c.clone();
        env::apply(&mut c2, vars).unwrap_or_else(|e| panic!("{var}: {e:?}"));
        assert_eq!(read(&c2), expected, "{var}");
        assert_ne!(
            read(&c),
            expected,
            "{var}: the test value must differ from the default"
        );
    }
    // Every key has a case above.
    for k in KEYS {
        let name = var_name(k.section, k.key);
        assert!(cases.iter().any(|c| c.0 == name), "no test for {name}");
    }
}

#[test]
fn the_environment_wins_over_the_file_and_can_unset_optional_keys() {
    let file = "[outbox]\ntimestamp_column = \"ts\"\n[kafka]\nbrokers = \"file:9092\"\n";
    let mut vars = minimal_env();
    vars.push(("FERRY_OUTBOX_TIMESTAMP_COLUMN".into(), String::new()));
    let c = load(Some(file), vars).unwrap();
    assert_eq!(c.kafka.brokers.0, ["localhost:9092"]);
    assert_eq!(c.outbox.timestamp_column, None);
}

#[test]
fn every_key_of_every_section_is_either_overridable_or_file_only() {
    // serde lists a section's keys in its unknown-field error; compare with the override table.
    const FILE_ONLY: &[&str] = &[
        "route.rules",
        "route.headers",
        "route.envelope_fields",
        "route.create_topics",
        "kafka.properties",
        "kafka.property_files",
    ];
    for section in SECTIONS {
        let err = Config::from_toml(&format!("[{section}]\nzzz_unknown = 1\n")).unwrap_err();
        let p = problems(err);
        let listed = p[0]
            .split("the known keys here are")
            .nth(1)
            .unwrap_or_else(|| panic!("{}", p[0]));
        for key in listed.split('`').skip(1).step_by(2) {
            let path = format!("{section}.{key}");
            let env = KEYS.iter().any(|k| k.section == *section && k.key == key);
            assert!(
                env || FILE_ONLY.contains(&path.as_str()),
                "{path} has no FERRY_ variable"
            );
        }
    }
}

#[test]
fn bad_environment_values_and_unknown_variables_name_the_variable() {
    // (variable, value, expected substring of "VARIABLE: message")
    #[rustfmt::skip]
    let cases = [
        ("FERRY_POSTGRES_URLL", "x", "FERRY_POSTGRES_URLL: unknown variable (did you mean FERRY_POSTGRES_URL?); the [postgres] variables are FERRY_POSTGRES_URL, FERRY_POSTGRES_SLOT"),
        ("FERRY_KAFKA_BROKER", "x", "FERRY_KAFKA_PROPERTIES_<NAME>"),
        ("FERRY_KAFKAA_BROKERS", "x", "SECTION one of POSTGRES, OUTBOX, ROUTE, KAFKA, HTTP, LOG, SHUTDOWN"),
        ("FERRY_POSTGRES", "x", "unknown variable"),
        ("FERRY_postgres_url", "x", "unknown variable"),
        ("FERRY_POSTGRES_url", "x", "unknown variable"),
        ("FERRY_ROUTE_RULES", "x", "unknown variable"),
        ("FERRY_KAFKA_PROPERTIES_", "x", "upper case"),
        ("FERRY_KAFKA_PROPERTIES_sasl", "x", "upper case"),
        ("FERRY_POSTGRES_CREATE_SLOT", "yes", "FERRY_POSTGRES_CREATE_SLOT: postgres.create_slot: invalid boolean \"yes\""),
        ("FERRY_POSTGRES_STATUS_INTERVAL", "5", "postgres.status_interval: invalid duration \"5\""),
        ("FERRY_KAFKA_MAX_IN_FLIGHT_RECORDS", "-1", "kafka.max_in_flight_records: must be a whole number ≥ 0, got \"-1\""),
        ("FERRY_ROUTE_MAX_PAYLOAD_BYTES", "1e6", "invalid size \"1e6\""),
        ("FERRY_ROUTE_ON_ERROR", "explode", "unknown value \"explode\""),
        ("FERRY_ROUTE_CLOUDEVENTS", "json", "route.cloudevents: unknown value \"json\"; expected \"none\", \"binary\" or \"structured\""),
        ("FERRY_ROUTE_CLOUDEVENTS_SOURCE", "/x", "route.cloudevents_source: has no effect unless route.cloudevents"),
        ("FERRY_KAFKA_COMPRESSION", "brotli", "unknown compression \"brotli\""),
        ("FERRY_HTTP_LISTEN", "", "invalid listen address \"\""),
        ("FERRY_HTTP_LISTEN", "localhost:9187", "expected ip:port"),
        ("FERRY_LOG_FORMAT", "yaml", "invalid log format \"yaml\""),
    ];
    for (var, value, expected) in cases {
        let mut vars = minimal_env();
        vars.push((var.to_owned(), value.to_owned()));
        let problems = problems(load(None, vars).unwrap_err());
        assert_eq!(problems.len(), 1, "{var}: {problems:?}");
        assert!(
            problems[0].contains(expected),
            "{var}: {:?} lacks {expected:?}",
            problems[0]
        );
    }
}

#[test]
fn all_environment_problems_are_reported_and_other_variables_ignored() {
    let mut vars = minimal_env();
    vars.extend(env(&[
        ("FERRY_A", "1"),
        ("FERRY_B", "2"),
        ("FERRY_CONFIG", "/etc/ferry.toml"),
        ("FERRY_TEST_PG_URL", "postgres://x"),
        ("PATH", "/bin"),
        ("ferry_lower", "ignored: not FERRY_"),
    ]));
    let p = problems(load(None, vars).unwrap_err());
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(
        p[0].starts_with("FERRY_A: ") && p[1].starts_with("FERRY_B: "),
        "{p:?}"
    );
}

/// (file, the problem's key path and line, expected substrings of the message)
type FileCase = (&'static str, &'static str, &'static [&'static str]);

#[test]
fn file_problems_name_the_key_and_line_in_plain_words() {
    #[rustfmt::skip]
    let cases: &[FileCase] = &[
        ("[postgres]\nurl = \"x\"\nslott = \"s\"\n", "postgres.slott (line 3)", &["unknown key `slott`; did you mean `slot`?"]),
        ("[kafak]\n", "kafak (line 1)", &["unknown section `kafak`; did you mean `kafka`?"]),
        ("[kafka]\nbrokers = 5\n", "kafka.brokers (line 2)", &["comma-separated string or an array"]),
        ("[kafka]\nlinger = 5\n", "kafka.linger (line 2)", &["must be a duration string like", "got 5"]),
        ("[kafka]\nlinger = \"5 ms\"\n", "kafka.linger (line 2)", &["invalid duration \"5 ms\""]),
        ("[kafka]\nmax_in_flight_records = -5\n", "kafka.max_in_flight_records (line 2)", &["must be a whole number ≥ 0, got -5"]),
        ("[kafka]\nexactly_once = \"yes\"\n", "kafka.exactly_once (line 2)", &["must be true or false, got the string \"yes\""]),
        ("[kafka]\ncompression = \"brotli\"\n", "kafka.compression (line 2)", &["must be \"none\", \"gzip\"", "\"zstd\", got \"brotli\""]),
        ("[kafka]\ncompression = \"zstdd\"\n", "kafka.compression (line 2)", &["got \"zstdd\" (did you mean \"zstd\"?)"]),
        ("[kafka.properties]\n\"a.b\" = 1.5\n", "kafka.properties.\"a.b\" (line 2)", &["a string, integer or boolean"]),
        ("[http]\nlisten = \"nowhere\"\n", "http.listen (line 2)", &["invalid listen address"]),
        ("[log]\nformat = \"xml\"\n", "log.format (line 2)", &["got \"xml\""]),
        ("[outbox]\ntabel = \"x\"\n", "outbox.tabel (line 2)", &["did you mean `table`?"]),
        ("[[route.rules]]\ncolumn = \"a\"\ntopic = \"t\"\nequals = \"x\"\nequal = \"x\"\n", "route.rules[0].equal (line 5)", &["unknown key `equal`"]),
        ("[[route.rules]]\ncolumn = \"a\"\nequals = \"x\"\ntopic = \"t\"\n[[route.rules]]\ncolumn = \"b\"\nequals = \"y\"\ntopic = [1]\n", "route.rules[1].topic (line 8)", &["must be a string, got an array"]),
        ("stray = 1\n", "stray (line 1)", &["unknown key `stray`; the known keys here are `postgres`"]),
    ];
    for &(file, path, expected) in cases {
        let p = problems(load(Some(file), minimal_env()).unwrap_err());
        assert_eq!(p.len(), 1, "{file:?}: {p:?}");
        assert!(p[0].starts_with(&format!("{path}: ")), "{file:?}: {p:?}");
        for s in expected {
            assert!(p[0].contains(s), "{file:?}: {:?} lacks {s:?}", p[0]);
        }
        // serde's and Rust's own wording stays inside.
        for raw in [
            "expected u64",
            "invalid type",
            "invalid value:",
            "unknown field",
            "unknown variant",
            "invalid digit",
        ] {
            assert!(!p[0].contains(raw), "{file:?}: {:?} has {raw:?}", p[0]);
        }
    }
}

#[test]
fn every_problem_of_a_file_is_reported_in_one_round() {
    // Issue 28's file: two unknown keys and three bad values, all five reported at once, in
    // line order, each naming its key and line; and the valid rest is still checked (the
    // environment's unknown variable, validation's empty publication).
    let file = "\
[postgres]
url = \"postgres://ferry@db/app\"
slott = \"ferry\"
publication = \"\"

[kafka]
brokers = \"k:9092\"
max_in_flight_records = -5
lingr = \"5ms\"
exactly_once = \"yes\"

[shutdown]
drain_timeout = 30
";
    let mut vars = minimal_env();
    vars.push(("FERRY_KAFKA_BROKER".to_owned(), "x".to_owned()));
    let err = load(Some(file), vars).unwrap_err();
    let shown = err.to_string();
    let p = problems(err);
    let paths: Vec<&str> = p.iter().map(|p| p.split(": ").next().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "postgres.slott (line 3)",
            "kafka.max_in_flight_records (line 8)",
            "kafka.lingr (line 9)",
            "kafka.exactly_once (line 10)",
            "shutdown.drain_timeout (line 13)",
            "FERRY_KAFKA_BROKER",
            "postgres.publication",
        ],
        "{shown}"
    );
    assert!(shown.starts_with("7 configuration problems:"), "{shown}");
    assert!(p[0].ends_with("did you mean `slot`?"), "{shown}");
    assert!(
        p[1].ends_with("must be a whole number ≥ 0, got -5"),
        "{shown}"
    );
    assert!(p[2].ends_with("did you mean `linger`?"), "{shown}");
    // Config::from_toml, the file alone, reports the same five.
    let Err(ConfigError::Invalid(e)) = Config::from_toml(file) else {
        panic!("from_toml accepted {file}")
    };
    assert_eq!(e.problems.len(), 5, "{e}");
}

#[test]
fn array_entries_taken_out_keep_their_file_index_and_hide_no_other() {
    // Entry 0 and 2 are refused; 1 and 3 are named by their place in the file, not in what is left.
    let file = "\
[[route.rules]]
column = \"a\"
topic = 1
[[route.rules]]
column = \"b\"
topicc = \"x\"
[[route.rules]]
column = \"c\"
equals = 5
topic = \"t\"
[[route.rules]]
column = 7
equals = \"x\"
topic = \"t\"
";
    let p = problems(load(Some(file), minimal_env()).unwrap_err());
    let paths: Vec<&str> = p.iter().map(|p| p.split(": ").next().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "route.rules[0].topic (line 3)",
            "route.rules[1].topicc (line 6)",
            "route.rules[2].equals (line 9)",
            "route.rules[3].column (line 12)",
        ],
        "{p:#?}"
    );
}

#[test]
fn a_file_that_is_not_toml_stops_at_its_position() {
    #[rustfmt::skip]
    let cases = [
        ("[postgres\n", 1, 10, Some("[postgres"), ""),
        ("[shutdown]\ndrain_timeout = \"30s\"\ndrain_timeout = \"1s\"\n", 3, 1, Some("[shutdown]"), "duplicate key"),
    ];
    for (file, line, column, section, expected) in cases {
        let err = load(Some(file), minimal_env()).unwrap_err();
        let ConfigError::Toml(e) = &err else {
            panic!("{file:?}: {err}")
        };
        assert_eq!(
            (e.line, e.column),
            (Some(line), Some(column)),
            "{file:?}: {err}"
        );
        assert_eq!(e.section.as_deref(), section, "{file:?}");
        assert!(e.message.contains(expected), "{file:?}: {err}");
        assert!(
            err.to_string()
                .contains(&format!("line {line}, column {column}")),
            "{err}"
        );
    }
}

#[test]
fn brokers_are_a_string_or_an_array() {
    #[rustfmt::skip]
    let cases = [
        ("brokers = \"a:1\"", vec!["a:1"]),
        ("brokers = \"a:1, b:2 ,c:3\"", vec!["a:1", "b:2", "c:3"]),
        ("brokers = [\"a:1\", \" b:2\"]", vec!["a:1", "b:2"]),
        ("brokers = []", vec![]),
        ("brokers = \"\"", vec![]),
    ];
    for (line, expected) in cases {
        let c = Config::from_toml(&format!("[kafka]\n{line}\n")).unwrap();
        assert_eq!(c.kafka.brokers.0, expected, "{line}");
    }
}

/// (what to change, expected problem "path: message" prefix)
type ValidateCase = (fn(&mut Config), &'static str);

#[test]
fn validate_reports_each_problem_with_its_key_path() {
    #[rustfmt::skip]
    let cases: &[ValidateCase] = &[
        (|c| c.postgres.url = PostgresUrl::default(), "postgres.url: required"),
        (|c| c.postgres.url = PostgresUrl::new("mysql://root@db/app"), "postgres.url: invalid PostgreSQL connection string"),
        (|c| c.postgres.url = PostgresUrl::new("postgres://u@db/app?sslmode=maybe"), "postgres.url: invalid PostgreSQL connection string: sslmode=\"maybe\""),
        (|c| c.postgres.slot = "Ferry".into(), "postgres.slot: invalid slot name \"Ferry\""),
        (|c| c.postgres.slot = String::new(), "postgres.slot: invalid slot name"),
        (|c| c.postgres.slot = "s".repeat(64), "postgres.slot: invalid slot name"),
        (|c| c.postgres.publication = String::new(), "postgres.publication: must be 1 to 63 bytes"),
        (|c| c.postgres.status_interval = Duration::ZERO.into(), "postgres.status_interval: must be greater than 0s"),
        (|c| c.postgres.receive_timeout = Duration::from_millis(500).into(), "postgres.receive_timeout: must be 0s (never) or at least 1s"),
        (|c| c.postgres.status_interval = Duration::from_secs(31).into(), "postgres.status_interval: must be at most 30s"),
        (|c| c.postgres.connect_timeout = Duration::ZERO.into(), "postgres.connect_timeout: must be greater than 0s"),
        (|c| c.postgres.reconnect_backoff_min = Duration::ZERO.into(), "postgres.reconnect_backoff_min: must be greater"),
        (|c| c.postgres.reconnect_backoff_max = Duration::from_millis(100).into(), "postgres.reconnect_backoff_max: must be at least postgres.reconnect_backoff_min (500ms)"),
        (|c| c.postgres.standby_poll_interval = Duration::ZERO.into(), "postgres.standby_poll_interval: must be greater"),
        (|c| c.outbox.id_column = String::new(), "outbox.id_column: "),
        (|c| c.route.rules = vec![ferry_router::RuleConfig { column: "aggregatetype".into(), equals: Some("a".into()), regex: None, topic: "bad topic!".into() }], "route.rules[0].topic: "),
        (|c| c.kafka.brokers = Brokers::default(), "kafka.brokers: must not be empty"),
        (|c| c.kafka.brokers = Brokers(vec!["a:1".into(), "b 2".into()]), "kafka.brokers[1]: invalid broker \"b 2\""),
        (|c| c.kafka.brokers = Brokers(vec!["a:1".into(), String::new()]), "kafka.brokers[1]: invalid broker \"\""),
        (|c| c.kafka.max_in_flight_records = 0, "kafka.max_in_flight_records: must be 1 to"),
        (|c| c.kafka.max_in_flight_bytes = 1000, "kafka.max_in_flight_bytes: must be at least route.max_payload_bytes (983040)"),
        (|c| c.kafka.max_in_flight_bytes = u64::MAX, "kafka.max_in_flight_bytes: must be at most"),
        (|c| { c.kafka.linger = Duration::from_secs(1000).into(); c.kafka.delivery_timeout = Duration::from_secs(1001).into(); }, "kafka.linger: must be at most 15m"),
        (|c| c.kafka.delivery_timeout = Duration::from_millis(1).into(), "kafka.delivery_timeout: must be 0 (never time out, the default) or longer than kafka.linger (1ms)"),
        (|c| c.kafka.delivery_timeout = Duration::from_secs(1 << 31).into(), "kafka.delivery_timeout: must be at most"),
        (|c| c.kafka.transaction_interval = Duration::ZERO.into(), "kafka.transaction_interval: must be 1ms to 6s"),
        (|c| c.kafka.transaction_interval = Duration::from_secs(7).into(), "kafka.transaction_interval: must be 1ms to 6s"),
        (|c| c.kafka.transaction_max_records = 0, "kafka.transaction_max_records: must be at least 1"),
        (|c| c.kafka.transaction_max_bytes = 0, "kafka.transaction_max_bytes: must be at least 1"),
        (|c| { c.kafka.exactly_once = true; c.kafka.delivery_timeout = Duration::from_secs(61).into(); }, "kafka.delivery_timeout: must be 0 or at most the transaction timeout (1m)"),
        (|c| { c.route.position_headers = true; c.kafka.delivery_timeout = Duration::from_secs(60).into(); }, "kafka.delivery_timeout: must be 0s (records never time out) with route.position_headers in at-least-once mode"),
        (|c| c.log.level = "loud".into(), "log.level: invalid log level \"loud\""),
        (|c| c.shutdown.drain_timeout = Duration::ZERO.into(), "shutdown.drain_timeout: must be greater than 0s"),
    ];
    for (change, expected) in cases {
        let mut c = valid();
        change(&mut c);
        let p: Vec<String> = c
            .validate()
            .unwrap_err()
            .problems
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(p.len(), 1, "{expected}: {p:?}");
        assert!(
            p[0].starts_with(expected),
            "{:?} does not start with {expected:?}",
            p[0]
        );
    }
}

#[test]
fn compression_must_be_built_into_librdkafka() {
    let features = kafka::builtin_features();
    assert!(features.iter().any(|f| f == "lz4"), "{features:?}");
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let mut c = valid();
        c.kafka.compression = codec.parse().unwrap();
        let built_in = codec == "none" || features.iter().any(|f| f == codec);
        match c.validate() {
            Ok(()) => assert!(built_in, "{codec}"),
            Err(e) => {
                assert!(!built_in, "{codec}: {e}");
                let p = e.problems[0].to_string();
                assert!(
                    p.starts_with(&format!("kafka.compression: {codec} is not built into")),
                    "{p}"
                );
            }
        }
    }
}

#[test]
fn validate_reports_every_problem_at_once_in_file_order() {
    let p =
        problems(load(Some("[postgres]\nslot = \"X\"\n[log]\nlevel = \"\"\n"), []).unwrap_err());
    let paths: Vec<&str> = p.iter().map(|p| p.split(':').next().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "postgres.url",
            "postgres.slot",
            "kafka.brokers",
            "log.level"
        ]
    );
}

#[test]
fn properties_ferry_controls_are_refused_with_the_reason() {
    // (property, value, expected message substring); None: accepted
    #[rustfmt::skip]
    let cases: &[(&str, &str, Option<&str>)] = &[
        ("enable.idempotence", "false", Some("always sets enable.idempotence=true")),
        ("acks", "1", Some("always sets acks=all")),
        ("request.required.acks", "all", Some("always sets acks=all")),
        ("ACKS", "all", Some("always sets acks=all")),
        ("partitioner", "consistent", Some("murmur2_random")),
        ("max.in.flight.requests.per.connection", "6", Some("must be 1 to 5")),
        ("max.in.flight", "100", Some("must be 1 to 5")),
        ("max.in.flight.requests.per.connection", "0", Some("must be 1 to 5")),
        ("max.in.flight.requests.per.connection", "5", None),
        ("max.in.flight", "1", None),
        ("queuing.strategy", "lifo", Some("FIFO")),
        ("enable.gapless.guarantee", "true", Some("not supported")),
        ("transactional.id", "ferry-1", Some("exactly-once")),
        ("transaction.timeout.ms", "60000", Some("kafka.transaction_interval")),
        ("bootstrap.servers", "x:1", Some("kafka.brokers")),
        ("metadata.broker.list", "x:1", Some("kafka.brokers")),
        ("delivery.report.only.error", "true", Some("never advance")),
        ("compression.codec", "gzip", Some("kafka.compression")),
        ("compression.type", "gzip", Some("kafka.compression")),
        ("linger.ms", "10", Some("kafka.linger")),
        ("queue.buffering.max.ms", "10", Some("kafka.linger")),
        ("message.timeout.ms", "1000", Some("kafka.delivery_timeout")),
        ("delivery.timeout.ms", "1000", Some("kafka.delivery_timeout")),
        ("queue.buffering.max.messages", "1", Some("kafka.max_in_flight_records")),
        ("queue.buffering.max.kbytes", "1", Some("kafka.max_in_flight_bytes")),
        ("dr_msg_cb", "x", Some("librdkafka's API")),
        ("opaque", "x", Some("librdkafka's API")),
        ("", "x", Some("empty property name")),
        ("sasl.mechanism", "PLAIN", None),
        ("compression.level", "3", None),
        ("client.id", "mine", None),
        ("message.max.bytes", "2000000", None),
    ];
    for &(name, value, expected) in cases {
        let mut c = valid();
        c.kafka
            .properties
            .0
            .insert(name.to_owned(), value.to_owned());
        match (c.validate(), expected) {
            (Ok(()), None) => {}
            (Err(e), Some(why)) => {
                let p = e.problems[0].to_string();
                assert_eq!(e.problems.len(), 1, "{name}");
                assert!(
                    p.starts_with(&format!("kafka.properties.{name:?}: ")),
                    "{p}"
                );
                assert!(p.contains(why), "{name}: {p}");
            }
            (got, _) => panic!("{name}={value}: {got:?}"),
        }
    }
}

#[test]
fn producer_properties_pin_what_the_guarantee_needs() {
    let mut c = valid();
    c.kafka
        .properties
        .0
        .insert("sasl.mechanism".into(), "PLAIN".into());
    // Unvalidated forbidden values still lose: Ferry's settings come last.
    c.kafka.properties.0.insert("acks".into(), "0".into());
    let props = c.kafka.producer_properties().unwrap();
    let last = |k: &str| {
        props
            .iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(last("client.id"), Some("ferry"));
    assert_eq!(last("sasl.mechanism"), Some("PLAIN"));
    assert_eq!(last("bootstrap.servers"), Some("localhost:9092"));
    assert_eq!(last("enable.idempotence"), Some("true"));
    assert_eq!(last("acks"), Some("all"));
    assert_eq!(last("partitioner"), Some("murmur2_random"));
    assert_eq!(last("compression.codec"), Some("lz4"));
    assert_eq!(last("linger.ms"), Some("1"));
    let mut sub_ms = c.clone();
    sub_ms.kafka.linger = Duration::from_micros(500).into();
    let sub_ms_props = sub_ms.kafka.producer_properties().unwrap();
    assert!(
        sub_ms_props
            .iter()
            .any(|(n, v)| n == "linger.ms" && v == "0.5"),
        "a linger under a millisecond reaches librdkafka as a fraction of one"
    );
    assert_eq!(last("message.timeout.ms"), Some("0"));
    assert_eq!(last("queue.buffering.max.messages"), Some("20000"));
    assert_eq!(last("queue.buffering.max.kbytes"), Some("32768"));
    assert_eq!(last("transaction.timeout.ms"), None);
    let mut eos = c.clone();
    eos.kafka.exactly_once = true;
    let props = eos.kafka.producer_properties().unwrap();
    let last_eos = |k: &str| {
        props
            .iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(last_eos("transaction.timeout.ms").as_deref(), Some("60000"));
    assert_eq!(
        last_eos("message.timeout.ms").as_deref(),
        Some("60000"),
        "0 (never) is above any transaction timeout"
    );
    assert_eq!(eos.kafka.transaction_caps(), (4_000, 8 << 20));
    eos.kafka.max_in_flight_records = 100;
    eos.kafka.max_in_flight_bytes = 1 << 20;
    assert_eq!(
        eos.kafka.transaction_caps(),
        (50, 512 << 10),
        "clamped to half the window"
    );
    let txn = eos
        .kafka
        .transactional_properties(&props, 7_312_345_678_901_234_567, "orders");
    assert_eq!(
        txn.last().map(|(k, v)| (k.as_str(), v.as_str())),
        Some(("transactional.id", "ferry-7312345678901234567-orders"))
    );
    c.kafka
        .properties
        .0
        .insert("client.id".into(), "mine".into());
    let props = c.kafka.producer_properties().unwrap();
    assert_eq!(props.iter().filter(|(k, _)| k == "client.id").count(), 1);
}

/// Ferry's `reconnect.backoff.ms` and `reconnect.backoff.max.ms` are defaults: a passthrough of
/// either wins, and the other one stays Ferry's where librdkafka allows it (the maximum at least
/// the first), so that a Java client's `reconnect.backoff.ms = 50` alone does not bring back
/// librdkafka's maximum of 10 s.
#[test]
fn reconnect_backoff_is_a_default_the_passthrough_overrides() {
    let values = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        let mut c = Config::default();
        for (k, v) in pairs {
            c.kafka.properties.0.insert(k.to_string(), v.to_string());
        }
        c.kafka
            .producer_properties()
            .unwrap()
            .into_iter()
            .filter(|(k, _)| k.starts_with("reconnect.backoff"))
            .collect()
    };
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let (first, max) = ("reconnect.backoff.ms", "reconnect.backoff.max.ms");
    assert_eq!(values(&[]), pairs(&[(first, "20"), (max, "1000")]));
    assert_eq!(values(&[(max, "10")]), pairs(&[(first, "10"), (max, "10")]));
    assert_eq!(
        values(&[(max, "5000")]),
        pairs(&[(first, "20"), (max, "5000")])
    );
    assert_eq!(
        values(&[(first, "50")]),
        pairs(&[(max, "1000"), (first, "50")])
    );
    assert_eq!(
        values(&[(first, "2000")]),
        pairs(&[(max, "2000"), (first, "2000")])
    );
    assert_eq!(
        values(&[(first, "100"), (max, "300")]),
        pairs(&[(max, "300"), (first, "100")])
    );
    assert_eq!(values(&[(first, "soon")]), pairs(&[(first, "soon")]));
}

#[test]
fn secrets_never_appear_in_debug_output() {
    let file = r#"
        [postgres]
        url = "postgres://ferry:pg-SECRET-1@db/app?sslmode=require"
        [kafka]
        brokers = "k:9092"
        [kafka.properties]
        "sasl.username" = "ferry"
        "sasl.password" = "SECRET-2"
        "ssl.key.password" = "SECRET-3"
        "ssl.keystore.password" = "SECRET-4"
        "ssl.key.pem" = "-----BEGIN PRIVATE KEY----- SECRET-5"
        "sasl.oauthbearer.client.secret" = "SECRET-6"
        "sasl.oauthbearer.config" = "clientSecret=SECRET-7"
    "#;
    let c = load(Some(file), []).unwrap();
    for shown in [
        format!("{c:?}"),
        format!("{c:#?}"),
        c.postgres.url.to_string(),
    ] {
        assert!(!shown.contains("SECRET"), "{shown}");
    }
    let debug = format!("{c:?}");
    assert!(
        debug.contains("postgres://ferry:***@db/app?sslmode=require"),
        "{debug}"
    );
    assert!(debug.contains("\"sasl.username\": \"ferry\""), "{debug}");
    // An invalid URL's problem does not quote the password either.
    let mut bad = c.clone();
    bad.postgres.url = PostgresUrl::new("host=db password=pg SECRET-8 user=u");
    let p = bad.validate().unwrap_err().to_string();
    assert!(p.contains("postgres.url") && !p.contains("SECRET"), "{p}");
}

#[test]
fn an_unknown_variable_names_the_nearest_valid_one() {
    #[rustfmt::skip]
    let cases = [
        ("FERRY_KAFKA_BROKER", Some("FERRY_KAFKA_BROKERS")),
        ("FERRY_KAFKAA_BROKERS", Some("FERRY_KAFKA_BROKERS")),
        ("FERRY_POSTGRE_URL", Some("FERRY_POSTGRES_URL")),
        ("FERRY_postgres_url", Some("FERRY_POSTGRES_URL")),
        ("FERRY_KAFKA_MAX_INFLIGHT_RECORDS", Some("FERRY_KAFKA_MAX_IN_FLIGHT_RECORDS")),
        ("FERRY_LOG_LEVLE", Some("FERRY_LOG_LEVEL")),
        ("FERRY_SHUTDOWN_TIMEOUT", None),
        ("FERRY_WHATEVER", None),
    ];
    for (var, nearest) in cases {
        let mut vars = minimal_env();
        vars.push((var.to_owned(), "x".to_owned()));
        let p = problems(load(None, vars).unwrap_err());
        let mine = p
            .iter()
            .find(|p| p.starts_with(&format!("{var}: ")))
            .unwrap_or_else(|| panic!("{var}: {p:?}"));
        match nearest {
            Some(n) => assert!(mine.contains(&format!("(did you mean {n}?)")), "{mine}"),
            None => assert!(!mine.contains("did you mean"), "{mine}"),
        }
    }
}

/// What kubelet injects into a pod of a namespace with a Service `ferry` (ports 9187 named
/// `http` and 5005/UDP named `dbg`), a Service `ferry-metrics` (one unnamed port) and a
/// dual-stack Service `ferry-v6`: pkg/kubelet/envvars/envvars.go, `FromServices`.
const SERVICE_LINKS: &[(&str, &str)] = &[
    ("FERRY_SERVICE_HOST", "10.96.12.7"),
    ("FERRY_SERVICE_PORT", "9187"),
    ("FERRY_SERVICE_PORT_HTTP", "9187"),
    ("FERRY_SERVICE_PORT_DBG", "5005"),
    ("FERRY_PORT", "tcp://10.96.12.7:9187"),
    ("FERRY_PORT_9187_TCP", "tcp://10.96.12.7:9187"),
    ("FERRY_PORT_9187_TCP_PROTO", "tcp"),
    ("FERRY_PORT_9187_TCP_PORT", "9187"),
    ("FERRY_PORT_9187_TCP_ADDR", "10.96.12.7"),
    ("FERRY_PORT_5005_UDP", "udp://10.96.12.7:5005"),
    ("FERRY_PORT_5005_UDP_PROTO", "udp"),
    ("FERRY_PORT_5005_UDP_PORT", "5005"),
    ("FERRY_PORT_5005_UDP_ADDR", "10.96.12.7"),
    ("FERRY_METRICS_SERVICE_HOST", "10.96.0.9"),
    ("FERRY_METRICS_SERVICE_PORT", "80"),
    ("FERRY_METRICS_PORT", "tcp://10.96.0.9:80"),
    ("FERRY_METRICS_PORT_80_TCP", "tcp://10.96.0.9:80"),
    ("FERRY_METRICS_PORT_80_TCP_PROTO", "tcp"),
    ("FERRY_METRICS_PORT_80_TCP_PORT", "80"),
    ("FERRY_METRICS_PORT_80_TCP_ADDR", "10.96.0.9"),
    ("FERRY_V6_SERVICE_HOST", "fd00:10:96::7"),
    ("FERRY_V6_PORT", "sctp://[fd00:10:96::7]:9187"),
    ("FERRY_V6_PORT_9187_SCTP", "sctp://[fd00:10:96::7]:9187"),
];

#[test]
fn kubernetes_service_links_are_not_configuration() {
    let mut vars = minimal_env();
    vars.extend(env(SERVICE_LINKS));
    let c = load(None, vars).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c, valid());
}

#[test]
fn mistakes_shaped_like_service_links_are_still_refused() {
    #[rustfmt::skip]
    let cases = [
        ("FERRY_HTTP_PORT", "9187"),              // a port without tcp://: meant http.listen
        ("FERRY_PORT", "9187"),
        ("FERRY_SERVICE_HOST", "ferry.default.svc"), // kubelet writes the cluster IP
        ("FERRY_SERVICE_PORT", "http"),
        ("FERRY_PORT_9187_TCP", "tcp://10.96.12.7:9188"), // the port in the name and value differ
        ("FERRY_PORT_9187_TCP", "udp://10.96.12.7:9187"),
        ("FERRY_PORT_9187_HTTP", "http://10.96.12.7:9187"),
        ("FERRY_PORT_9187_TCP_PROTO", "udp"),
        ("FERRY_PORT_9187_TCP_PORT", "9188"),
        ("FERRY_PORT_9187_TCP_HOST", "10.96.12.7"),
        ("FERRY_PORT_09187_TCP_PORT", "09187"),
        ("FERRY_POSTGRES_SERVICE_HOST", ""),
        ("FERRY_postgres_SERVICE_HOST", "10.0.0.1"),
    ];
    for (var, value) in cases {
        assert!(
            !env::is_kubernetes_service_link(var, value),
            "{var}={value}"
        );
        let mut vars = minimal_env();
        vars.push((var.to_owned(), value.to_owned()));
        let p = problems(load(None, vars).unwrap_err());
        assert!(
            p[0].starts_with(&format!("{var}: unknown variable")),
            "{p:?}"
        );
    }
}

/// Every `FERRY_*` variable that Ferry's own tools read or tell users to set (the benchmark, the
/// test harness, CI, the demo, the deployment files) is accepted by `ferry run`.
#[test]
fn variables_of_ferrys_own_tools_are_accepted() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for dir in [
        "bench",
        "demo",
        ".ci",
        "deploy",
        "tests/src",
        "crates/ferry-testkit",
    ] {
        walk(&root.join(dir), &mut files);
    }
    // (Not README.md: it shows a misspelt variable as an example of the error.)
    for file in ["docker-compose.yml", "bench/README.md"] {
        files.push(root.join(file));
    }
    let mut seen = std::collections::BTreeSet::new();
    for path in files {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for (at, _) in text.match_indices("FERRY_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            // A prefix mentioned in prose (`FERRY_KAFKA_PROPERTIES_`), not a variable.
            if !name.ends_with('_') {
                seen.insert(name);
            }
        }
    }
    assert!(
        seen.contains("FERRY_BIN") && seen.contains("FERRY_TEST_PG_URL"),
        "{seen:?}"
    );
    for name in seen {
        let mut vars = minimal_env();
        vars.push((name.clone(), "1".to_owned()));
        let mut c = Config::default();
        let result = env::apply(&mut c, vars);
        // A configuration variable may refuse the value "1"; only "unknown" matters here.
        if let Err(p) = result {
            assert!(
                p.iter().all(|p| !p.message.starts_with("unknown variable")),
                "{name} is used by Ferry's tools but refused: {p:?}"
            );
        }
    }
}

fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            if path
                .file_name()
                .is_some_and(|n| n != "target" && n != "results")
            {
                walk(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

#[test]
fn environment_and_value_problems_are_reported_together() {
    let file = "[postgres]\nslot = \"Bad\"\n[kafka]\nbrokers = \"k:9092\"\n";
    let vars = env(&[
        ("FERRY_KAFKA_BROKER", "k:9092"),
        ("FERRY_POSTGRES_STATUS_INTERVAL", "5"),
        ("FERRY_LOG_LEVEL", "loud"),
    ]);
    let err = load(Some(file), vars).unwrap_err();
    let shown = err.to_string();
    let p = problems(err);
    let paths: Vec<&str> = p.iter().map(|p| p.split(':').next().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "FERRY_KAFKA_BROKER",
            "FERRY_POSTGRES_STATUS_INTERVAL",
            "postgres.url",
            "postgres.slot",
            // A bad value from the environment is named by its variable, then its key.
            "FERRY_LOG_LEVEL"
        ],
        "{shown}"
    );
    assert!(p[4].starts_with("FERRY_LOG_LEVEL: log.level: "), "{shown}");
    assert!(shown.starts_with("5 configuration problems:"), "{shown}");
}

#[test]
fn sizes_take_units_in_the_file_and_the_environment() {
    let file = "[route]\nmax_payload_bytes = \"512KiB\"\n[kafka]\nbrokers = \"k:9092\"\nmax_in_flight_bytes = \"64MiB\"\n";
    let c = load(Some(file), env(&[("FERRY_POSTGRES_URL", URL)])).unwrap();
    assert_eq!(c.route.max_payload_bytes, 512 * 1024);
    assert_eq!(c.kafka.max_in_flight_bytes, 64 << 20);
    let file = "[route]\nmax_payload_bytes = 1000\n[kafka]\nbrokers = \"k:9092\"\nmax_in_flight_bytes = 2000000\n";
    let c = load(Some(file), env(&[("FERRY_POSTGRES_URL", URL)])).unwrap();
    assert_eq!(
        (c.route.max_payload_bytes, c.kafka.max_in_flight_bytes),
        (1000, 2_000_000)
    );
    let mut vars = minimal_env();
    vars.extend(env(&[
        ("FERRY_KAFKA_MAX_IN_FLIGHT_BYTES", "1 GB"),
        ("FERRY_ROUTE_MAX_PAYLOAD_BYTES", "100kB"),
    ]));
    let c = load(None, vars).unwrap();
    assert_eq!(
        (c.route.max_payload_bytes, c.kafka.max_in_flight_bytes),
        (100_000, 1_000_000_000)
    );
    let err = Config::from_toml("[kafka]\nmax_in_flight_bytes = \"32mb\"\n").unwrap_err();
    assert!(
        err.to_string().contains("invalid size \"32mb\"") && err.to_string().contains("line 2"),
        "{err}"
    );
    let mut vars = minimal_env();
    vars.push((
        "FERRY_KAFKA_MAX_IN_FLIGHT_BYTES".into(),
        "32 mebibytes".into(),
    ));
    let p = problems(load(None, vars).unwrap_err());
    assert!(
        p[0].starts_with(
            "FERRY_KAFKA_MAX_IN_FLIGHT_BYTES: kafka.max_in_flight_bytes: invalid size"
        ),
        "{p:?}"
    );
}

#[test]
fn show_prints_toml_that_loads_back_to_the_same_configuration() {
    // Every section with values other than the defaults, and no secrets.
    let file = r#"
        [postgres]
        url = "postgres://ferry@db.example.com:6432/app?sslmode=verify-full&sslrootcert=/ca.pem"
        slot = "s2"
        status_interval = "250ms"
        reconnect_backoff_max = "1h"
        binary = false
        [outbox]
        table = "app.events"
        timestamp_column = "ts"
        tracing_column = "tracingspancontext"
        [route]
        topic = "events.{aggregatetype}"
        cloudevents = "structured"
        cloudevents_source = "/ferry/app/events"
        cloudevents_subject = ""
        id_header = ""
        envelope = true
        envelope_fields = ["type"]
        max_payload_bytes = "512KiB"
        on_error = "dead_letter"
        dead_letter_topic = "dlq"
        [[route.rules]]
        column = "aggregatetype"
        equals = "order"
        topic = "orders"
        [[route.headers]]
        column = "type"
        name = "kind"
        [[tables]]
        outbox.table = "billing.events"
        outbox.payload_column = "body"
        route.topic = "billing.{aggregatetype}"
        route.value_format = "json"
        [[tables.route.rules]]
        column = "aggregatetype"
        equals = "refund"
        topic = "refunds"
        [kafka]
        brokers = ["a:9092", "b:9092"]
        compression = "gzip"
        max_in_flight_bytes = 1000000
        delivery_timeout = "5m"
        [kafka.properties]
        "sasl.mechanism" = "PLAIN"
        "message.max.bytes" = 2000000
        [http]
        listen = "off"
        [log]
        format = "json"
        level = "info,ferry=debug"
        [shutdown]
        drain_timeout = "1m"
    "#;
    let c = load(Some(file), []).unwrap_or_else(|e| panic!("{e}"));
    let shown = c.to_toml().unwrap();
    let again = load(Some(&shown), []).unwrap_or_else(|e| panic!("{e}\n{shown}"));
    assert_eq!(again, c, "{shown}");
    for line in [
        "slot = \"s2\"",
        "status_interval = \"250ms\"",
        "max_in_flight_bytes = 1000000",
        "max_payload_bytes = 524288",
        "listen = \"off\"",
        "format = \"json\"",
        "[[route.rules]]",
        "[[tables]]",
        "[tables.outbox]",
        "table = \"billing.events\"",
        "[[tables.route.rules]]",
    ] {
        assert!(shown.lines().any(|l| l == line), "{line:?} in\n{shown}");
    }
    assert_eq!(c.tables.len(), 1);
    // Defaults are shown too, so the output documents what is in effect.
    let defaults = load(
        None,
        env(&[
            ("FERRY_POSTGRES_URL", "postgres://ferry@localhost/app"),
            ("FERRY_KAFKA_BROKERS", "localhost:9092"),
        ]),
    )
    .unwrap();
    let shown = defaults.to_toml().unwrap();
    for line in [
        "max_in_flight_bytes = \"16MiB\"",
        "linger = \"1ms\"",
        "listen = \"127.0.0.1:9187\"",
        "create_slot = true",
    ] {
        assert!(shown.lines().any(|l| l == line), "{line:?} in\n{shown}");
    }
    assert_eq!(load(Some(&shown), []).unwrap(), defaults);
}

#[test]
fn show_redacts_secrets_with_a_placeholder_that_cannot_load() {
    let file = r#"
        [postgres]
        url = "postgres://ferry:pg-SECRET-1@db/app?sslmode=require"
        [kafka]
        brokers = "k:9092"
        [kafka.properties]
        "sasl.username" = "ferry"
        "sasl.password" = "SECRET-2"
        "ssl.key.password" = "SECRET-3"
    "#;
    let c = load(Some(file), []).unwrap();
    let shown = c.to_toml().unwrap();
    assert!(!shown.contains("SECRET"), "{shown}");
    assert!(
        shown.contains("url = \"postgres://ferry:<redacted>@db/app?sslmode=require\""),
        "{shown}"
    );
    assert!(
        shown.contains("\"sasl.password\" = \"<redacted>\""),
        "{shown}"
    );
    assert!(shown.contains("\"sasl.username\" = \"ferry\""), "{shown}");
    let p = problems(load(Some(&shown), []).unwrap_err());
    let paths: Vec<&str> = p.iter().map(|p| p.split(": ").next().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "postgres.url",
            "kafka.properties.\"sasl.password\"",
            "kafka.properties.\"ssl.key.password\""
        ],
        "{p:?}"
    );
    assert!(p[0].contains("put the password back"), "{p:?}");
}

/// A file in a fresh temporary directory, removed with it.
struct TempFile {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
}

impl TempFile {
    fn new(name: &str, contents: &[u8]) -> TempFile {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ferry-config-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        TempFile { dir, path }
    }

    fn path(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn secrets_are_read_from_files_without_their_trailing_newline() {
    let pg = TempFile::new("pg", b"pg pass\n");
    let kafka = TempFile::new("kafka", b"k-pass\r\n");
    let vars = env(&[
        ("FERRY_POSTGRES_URL", "postgres://ferry@db/app"),
        ("FERRY_POSTGRES_PASSWORD_FILE", pg.path()),
        ("FERRY_KAFKA_BROKERS", "k:9092"),
        ("FERRY_KAFKA_PROPERTY_FILES_SASL_PASSWORD", kafka.path()),
    ]);
    let c = load(None, vars).unwrap_or_else(|e| panic!("{e}"));
    let connect = c.postgres.connect_config().unwrap();
    assert_eq!(connect.targets()[0].password.as_deref(), Some("pg pass"));
    let props = c.kafka.producer_properties().unwrap();
    assert!(props.contains(&("sasl.password".into(), "k-pass".into())));
    // The file's path shows, its contents never.
    let shown = c.to_toml().unwrap();
    assert!(
        shown.contains(&format!("password_file = {:?}", pg.path())),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("\"sasl.password\" = {:?}", kafka.path())),
        "{shown}"
    );
    assert!(!shown.contains("pass\""), "{shown}");
    assert_eq!(load(Some(&shown), []).unwrap(), c);
    // The same from the file.
    let file = format!(
        "[postgres]\nurl = \"postgres://ferry@db/app\"\npassword_file = {:?}\n[kafka]\nbrokers = \"k:9092\"\n[kafka.property_files]\n\"sasl.password\" = {:?}\n",
        pg.path(),
        kafka.path()
    );
    assert_eq!(load(Some(&file), []).unwrap(), c);
}

#[test]
fn an_unusable_secret_file_is_a_problem_naming_the_key_and_the_file() {
    let empty = TempFile::new("empty", b"\n");
    let pg = TempFile::new("pg", b"pw\n");
    let binary = TempFile::new("bin", &[0xff, 0xfe]);
    let missing = "/nonexistent/ferry/secret";
    #[rustfmt::skip]
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (vec![("FERRY_POSTGRES_PASSWORD_FILE", missing)], "postgres.password_file: cannot read /nonexistent/ferry/secret: No such file or directory"),
        (vec![("FERRY_POSTGRES_PASSWORD_FILE", empty.path())], "is empty"),
        (vec![("FERRY_POSTGRES_PASSWORD_FILE", binary.path())], "is not UTF-8 text"),
        (vec![("FERRY_POSTGRES_PASSWORD_FILE", pg.path()), ("FERRY_POSTGRES_URL", URL)], "postgres.password_file: postgres.url holds a password too"),
        (vec![("FERRY_KAFKA_PROPERTY_FILES_SASL_PASSWORD", missing)], "kafka.property_files.\"sasl.password\": cannot read /nonexistent/ferry/secret"),
        (vec![("FERRY_KAFKA_PROPERTY_FILES_SASL_PASSWORD", pg.path()), ("FERRY_KAFKA_PROPERTIES_SASL_PASSWORD", "x")], "kafka.properties sets \"sasl.password\" too"),
        (vec![("FERRY_KAFKA_PROPERTY_FILES_ACKS", pg.path())], "kafka.property_files.\"acks\": Ferry always sets acks=all"),
        (vec![("FERRY_KAFKA_PROPERTY_FILES_sasl", pg.path())], "FERRY_KAFKA_PROPERTY_FILES_sasl: expected FERRY_KAFKA_PROPERTY_FILES_<NAME> in upper case"),
    ];
    for (extra, expected) in cases {
        let mut vars = env(&[
            ("FERRY_POSTGRES_URL", "postgres://ferry@db/app"),
            ("FERRY_KAFKA_BROKERS", "k:9092"),
        ]);
        vars.extend(env(&extra));
        let p = problems(load(None, vars).unwrap_err());
        assert_eq!(p.len(), 1, "{expected}: {p:?}");
        assert!(p[0].contains(expected), "{expected:?} not in {p:?}");
        assert!(!p[0].contains("pw"), "{p:?}");
    }
}

#[test]
fn the_password_file_comes_before_pgpassword_and_the_url_before_both() {
    let pg = TempFile::new("pg", b"from-file\n");
    let env_pw = |k: &str| (k == "PGPASSWORD").then(|| "from-env".to_owned());
    let mut c = valid().postgres;
    c.url = PostgresUrl::new("postgres://ferry@db/app");
    assert_eq!(
        c.connect_config_with(&env_pw).unwrap().password.as_deref(),
        Some("from-env")
    );
    c.password_file = Some(pg.path.clone());
    assert_eq!(
        c.connect_config_with(&env_pw).unwrap().targets()[0]
            .password
            .as_deref(),
        Some("from-file")
    );
    c.password_file = None;
    c.url = PostgresUrl::new("postgres://ferry:from-url@db/app");
    assert_eq!(
        c.connect_config_with(&env_pw).unwrap().password.as_deref(),
        Some("from-url")
    );
    // connect_timeout: the URL's wins over postgres.connect_timeout.
    c.url = PostgresUrl::new("postgres://ferry@db/app?connect_timeout=3");
    assert_eq!(
        c.connect_config_with(&env_pw).unwrap().connect_timeout,
        Some(Duration::from_secs(3))
    );
    c.url = PostgresUrl::new("postgres://ferry@db/app");
    assert_eq!(
        c.connect_config_with(&env_pw).unwrap().connect_timeout,
        Some(defaults::CONNECT_TIMEOUT)
    );
}

#[test]
fn route_create_topics_is_read_from_the_file_and_validated_with_its_key_paths() {
    let text = "[postgres]\nurl = \"host=db user=ferry\"\n[kafka]\nbrokers = \"k:9092\"\n\
                [route.create_topics]\nenabled = true\npartitions = 6\nreplication_factor = 3\n\
                configs = { \"retention.ms\" = \"1000\" }\n";
    let c = load(Some(text), []).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.route.create_topics.enabled);
    assert_eq!(c.route.create_topics.partitions, 6);
    assert_eq!(c.route.create_topics.replication_factor, 3);
    assert_eq!(c.route.create_topics.configs["retention.ms"], "1000");

    let bad = text
        .replace("partitions = 6", "partitions = 0")
        .replace("replication_factor = 3", "replication_factor = 0");
    let p = problems(load(Some(&bad), []).unwrap_err());
    assert!(
        p.iter()
            .any(|m| m.starts_with("route.create_topics.partitions: must be at least 1")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|m| m.starts_with("route.create_topics.replication_factor: must be at least 1")),
        "{p:?}"
    );
}

#[test]
fn tables_are_read_from_the_file_and_validated_with_their_index() {
    let file = r#"
        [[tables]]
        outbox.table = "billing.events"
        route.max_payload_bytes = "64MiB"

        [[tables]]
        outbox.table = "public.outbox"
    "#;
    let err = load(Some(file), minimal_env()).unwrap_err();
    let p = problems(err);
    for want in [
        "tables[1].outbox.table: table public.outbox is already relayed by outbox.table",
        "kafka.max_in_flight_bytes: must be at least tables[0].route.max_payload_bytes (67108864)",
    ] {
        assert!(p.iter().any(|l| l.starts_with(want)), "{want:?} in {p:#?}");
    }
    // An entry names its table: the default (public.outbox) would relay somebody else's table
    // with this entry's mapping.
    let file = "[outbox]\ntable = \"orders.outbox\"\n[[tables]]\nroute.topic = \"x\"\n";
    let p = problems(load(Some(file), minimal_env()).unwrap_err());
    assert!(
        p.iter()
            .any(|l| l.starts_with("tables[0].outbox.table: required")),
        "{p:#?}"
    );
    // There are no FERRY_TABLES_* variables: tables are file-only, and a variable that looks
    // like one is refused, not ignored.
    let err = load(
        None,
        minimal_env()
            .into_iter()
            .chain(env(&[("FERRY_TABLES_0_OUTBOX_TABLE", "x.y")])),
    )
    .unwrap_err();
    assert!(problems(err)
        .iter()
        .any(|l| l.starts_with("FERRY_TABLES_0_OUTBOX_TABLE: unknown variable")),);
}
