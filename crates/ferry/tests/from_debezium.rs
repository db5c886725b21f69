//! `ferry config from-debezium` as a command: the TOML on standard output (or `--output`), the
//! notes on standard error, exit code 2 for what cannot be translated. The translation itself,
//! its fixtures and golden files are `ferry-debezium`'s (`crates/ferry-debezium/tests`); this
//! checks that the command prints exactly what the library returns.

use std::path::{Path, PathBuf};
use std::process::Command;

use ferry::config;
use ferry::debezium::{translate, Options, Translation};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ferry-debezium/tests/debezium")
}

fn run(name: &str) -> Translation {
    let json = std::fs::read_to_string(dir().join(format!("{name}.json"))).unwrap();
    let options = Options {
        brokers: None,
        source: Some(format!("{name}.json")),
        worker: None,
    };
    translate(&json, &options).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn notes_text(t: &Translation) -> String {
    t.notes.iter().map(|n| format!("{n}\n")).collect()
}

#[test]
fn the_cli_prints_the_toml_and_the_notes_and_exits_0() {
    let bin = env!("CARGO_BIN_EXE_ferry");
    let path = dir().join("ssl_sasl.json");
    let out = Command::new(bin)
        .args(["config", "from-debezium"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let t = run("ssl_sasl");
    assert_eq!(String::from_utf8(out.stdout).unwrap(), t.toml);
    assert_eq!(String::from_utf8(out.stderr).unwrap(), notes_text(&t));
    assert!(notes_text(&t)
        .lines()
        .all(|l| l.starts_with("not translated: ")));

    let tmp = std::env::temp_dir().join(format!("ferry-from-debezium-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let written = tmp.join("ferry.toml");
    let out = Command::new(bin)
        .args(["config", "from-debezium", "--brokers", "k:9092", "--output"])
        .arg(&written)
        .arg(dir().join("defaults.json"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty());
    let text = std::fs::read_to_string(&written).unwrap();
    assert_eq!(
        config::load(Some(&text), []).unwrap().kafka.brokers.0,
        ["k:9092"]
    );

    let bad = tmp.join("bad.json");
    std::fs::write(&bad, r#"{"config": {"transforms": ""}}"#).unwrap();
    let out = Command::new(bin)
        .args(["config", "from-debezium"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no Outbox Event Router"));
    std::fs::remove_dir_all(&tmp).unwrap();
}
