//! The PostgreSQL connector's own options to `[postgres]` and `outbox.table`.
//!
//! Defaults are Debezium's (`PostgresConnectorConfig`): `database.port` 5432, `database.sslmode`
//! `disable`, `plugin.name` `decoderbufs`, `slot.name` `debezium`, `publication.name`
//! `dbz_publication`, `publication.autocreate.mode` `all_tables`, `status.update.interval.ms`
//! 10000, `snapshot.mode` `initial`.

use std::time::Duration;

use super::outbox::parse_bool;
use super::render::{Doc, Value, OUTBOX, POSTGRES};
use super::{is_provider_ref, Source, CHANGE_ME};

const DEFAULT_SLOT: &str = "debezium";
const DEFAULT_PUBLICATION: &str = "dbz_publication";

/// Translates the connection, slot, publication and table options.
pub(super) fn translate(src: &mut Source<'_>, doc: &mut Doc) {
    url(src, doc);
    slot(src, doc);
    table(src, doc);
    if let Some(v) = src.take("status.update.interval.ms") {
        let max = src.target.max_status_interval();
        match v.parse::<u64>() {
            Ok(ms) if ms > 0 => {
                let d = Duration::from_millis(ms).min(max);
                doc.set(
                    POSTGRES,
                    "status_interval",
                    Value::Str(src.target.format_duration(d)),
                    Some("status.update.interval.ms"),
                );
                if Duration::from_millis(ms) > max {
                    doc.caveat(
                        POSTGRES,
                        "status_interval",
                        format!(
                            "status.update.interval.ms = {ms} exceeds Ferry's limit ({}): the server \
                             drops a client that reports less often than wal_sender_timeout.",
                            src.target.format_duration(max)
                        ),
                    );
                }
            }
            _ => src.note(
                "status.update.interval.ms",
                "not a positive number of milliseconds",
            ),
        }
    }
    match src
        .peek("snapshot.mode")
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("never" | "no_data") | None => {
            src.take("snapshot.mode");
        }
        Some(_) => src.note(
            "snapshot.mode",
            "Ferry never snapshots: it relays the rows inserted after its slot's position. With \
             the connector's slot kept nothing is lost (the snapshot ran when the connector first \
             started); a new slot starts where Ferry creates it (see plugin.name for the overlap)",
        ),
    }
    match src.peek("heartbeat.interval.ms").map(str::parse::<u64>) {
        Some(Ok(0)) => {
            src.take("heartbeat.interval.ms");
        }
        _ => src.note(
            "heartbeat.interval.ms",
            "Ferry confirms the server's keepalive positions itself whenever nothing is in flight, \
             so its slot advances on a quiet outbox without heartbeat records or writes",
        ),
    }
    if src.peek("slot.drop.on.stop").and_then(parse_bool) == Some(false) {
        src.take("slot.drop.on.stop");
    } else {
        src.note(
            "slot.drop.on.stop",
            "Ferry never drops its slot (that would lose its position and every row written while \
             it is stopped); drop it by hand when retiring it: SELECT pg_drop_replication_slot('<slot>')",
        );
    }
    if src.peek("flush.lsn.source").and_then(parse_bool) == Some(true) {
        src.take("flush.lsn.source");
    } else {
        src.note(
            "flush.lsn.source",
            "Ferry always confirms the slot's position, once Kafka has acknowledged every record at \
             or below it: that is its checkpoint",
        );
    }
    if src.peek("tasks.max").is_some() {
        // The PostgreSQL connector always runs one task; Ferry is one process per slot.
        src.take("tasks.max");
    }
    // Debezium 3 adds four context headers to every record unless this is false (seen on
    // Debezium 3.6.1 by the parity test); Ferry sends none of them.
    match src.peek("extended.headers.enabled").map(parse_bool) {
        Some(Some(false)) => {
            src.take("extended.headers.enabled");
        }
        Some(_) => src.note("extended.headers.enabled", CONTEXT_HEADERS),
        None => src.note_value(
            "extended.headers.enabled",
            "(unset: Debezium's default is true)",
            CONTEXT_HEADERS,
        ),
    }
}

/// What Ferry does instead of Debezium's context headers.
const CONTEXT_HEADERS: &str = "Debezium 3 adds the headers __debezium.context.connectorName, \
     .connectorLogicalName, .taskId and .runId (a new UUID per task start) to every record; Ferry \
     sends none of them: a consumer that reads them needs another source (every other header and \
     byte is the same)";

/// `database.*` to `postgres.url` (without the password).
fn url(src: &mut Source<'_>, doc: &mut Doc) {
    let part = |src: &mut Source<'_>, key: &str, default: &str| match src.take(key) {
        Some(v) if is_provider_ref(&v) => {
            src.note(
                key,
                "a Kafka Connect config provider reference, resolved by the worker: replace \
                 CHANGE-ME in postgres.url with its value",
            );
            CHANGE_ME.to_owned()
        }
        Some(v) if !v.is_empty() => v,
        _ => default.to_owned(),
    };
    let host = part(src, "database.hostname", CHANGE_ME);
    let port = part(src, "database.port", "5432");
    let user = part(src, "database.user", CHANGE_ME);
    let dbname = part(src, "database.dbname", "");
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        encode(&host, "")
    };
    let mut url = format!(
        "postgres://{}@{host}:{}",
        encode(&user, ""),
        encode(&port, "")
    );
    if !dbname.is_empty() {
        url.push('/');
        url.push_str(&encode(&dbname, ""));
    }
    let mut params: Vec<(&str, String)> = Vec::new();
    let mut caveats: Vec<String> = Vec::new();
    let sslmode = src.take("database.sslmode").map(|m| m.to_ascii_lowercase());
    match sslmode.as_deref() {
        None => caveats.push(
            "database.sslmode is unset: Debezium connected without TLS (its default is disable); \
             Ferry's default, prefer, uses TLS when the server offers it but verifies nothing. Use \
             sslmode=verify-full with sslrootcert where the server has a certificate."
                .to_owned(),
        ),
        Some(m @ ("disable" | "prefer" | "require" | "verify-ca" | "verify-full")) => {
            params.push(("sslmode", m.to_owned()))
        }
        Some("allow") => {
            params.push(("sslmode", "prefer".to_owned()));
            caveats.push(
                "database.sslmode = allow: Ferry does not support allow; prefer also connects with \
                 or without TLS, trying TLS first."
                    .to_owned(),
            );
        }
        Some(_) => src.note(
            "database.sslmode",
            "not an sslmode; use disable, prefer, require, verify-ca or verify-full in postgres.url",
        ),
    }
    let tls = sslmode.as_deref() != Some("disable");
    for (key, param) in [
        ("database.sslrootcert", "sslrootcert"),
        ("database.sslcert", "sslcert"),
        ("database.sslkey", "sslkey"),
    ] {
        match src.peek(key).map(str::to_owned) {
            Some(v) if tls && !v.is_empty() && !is_provider_ref(&v) => {
                src.take(key);
                if param == "sslkey" && (v.ends_with(".pk8") || v.ends_with(".der")) {
                    caveats.push(format!(
                        "database.sslkey is a PKCS#8 DER key (the JDBC driver's format); Ferry reads \
                         PEM: openssl pkcs8 -inform DER -in {v} -out key.pem -nocrypt, then point \
                         sslkey at key.pem."
                    ));
                }
                params.push((param, v));
            }
            Some(_) if !tls => src.note(key, "sslmode is disable, so it was unused; Ferry refuses it with disable"),
            _ => src.note(key, "a config provider reference or empty: add sslrootcert/sslcert/sslkey to postgres.url"),
        }
    }
    if !params.is_empty() {
        let query: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{k}={}", encode(v, "/")))
            .collect();
        url.push('?');
        url.push_str(&query.join("&"));
    }
    doc.set(
        POSTGRES,
        "url",
        Value::Str(url.clone()),
        Some("database.hostname, .port, .user, .dbname, .ssl*"),
    );
    for c in caveats {
        doc.caveat(POSTGRES, "url", c);
    }
    if let Some(pw) = src.peek("database.password").map(str::to_owned) {
        let with_password = url.replacen('@', ":<password>@", 1);
        let provider = if is_provider_ref(&pw) {
            " (here a Kafka Connect config provider reference: resolve it)"
        } else {
            ""
        };
        src.note(
            "database.password",
            format!(
                "Ferry writes no secrets into its file, and TOML cannot read the environment: set \
                 FERRY_POSTGRES_URL={with_password}{provider}; it overrides postgres.url"
            ),
        );
        doc.caveat(
            POSTGRES,
            "url",
            "No password here: set the whole URL with it in FERRY_POSTGRES_URL, which overrides this line.",
        );
    }
    src.note(
        "database.sslpassword",
        "Ferry cannot read an encrypted client key: decrypt it (openssl pkey -in key.pem -out \
         key-plain.pem) and protect the file instead",
    );
    let factory_reason = match src.peek("database.sslfactory") {
        Some(f) if f.contains("NonValidatingFactory") => {
            "Ferry has no non-validating factory: sslmode=require encrypts without verifying the \
             certificate, as libpq does"
        }
        _ => "a JDBC socket factory class; Ferry's TLS is configured by sslmode and sslrootcert",
    };
    src.note("database.sslfactory", factory_reason);
}

/// Percent-encodes everything but unreserved characters and `keep`.
fn encode(s: &str, keep: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.as_bytes().contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `slot.name`, `plugin.name`, `publication.name`, `publication.autocreate.mode`.
fn slot(src: &mut Source<'_>, doc: &mut Doc) {
    let slot_from = if src.peek("slot.name").is_some() {
        "slot.name"
    } else {
        "slot.name (unset: Debezium's default)"
    };
    let slot = src
        .take("slot.name")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| DEFAULT_SLOT.to_owned());
    let plugin = src.take("plugin.name").map(|p| p.to_ascii_lowercase());
    if plugin.as_deref() == Some("pgoutput") {
        doc.set(POSTGRES, "slot", Value::str(&slot), Some(slot_from));
        doc.caveat(
            POSTGRES,
            "slot",
            "The connector's own slot (plugin.name = pgoutput): Ferry continues from its confirmed \
             position, so nothing is lost and the records since the connector's last offset commit \
             are sent again (consumers deduplicate on the id header). Start Ferry, then stop the \
             connector: Ferry stands by while the slot is in use and takes over when it is free. \
             With kafka.exactly_once, the first start is `ferry run --initialize-progress`: Ferry \
             has no progress record for a slot it did not create (README, \"Migrating from \
             Debezium\").",
        );
    } else {
        let new = if slot == "ferry" {
            "ferry_pgoutput"
        } else {
            "ferry"
        };
        doc.set(
            POSTGRES,
            "slot",
            Value::str(new),
            Some("new: plugin.name is not pgoutput"),
        );
        let shown = plugin
            .clone()
            .unwrap_or_else(|| "(unset: Debezium's default is decoderbufs)".into());
        src.note_value(
            "plugin.name",
            &shown,
            format!(
                "Ferry decodes only pgoutput (built into PostgreSQL 10+) and a slot keeps the plugin \
                 it was created with, so slot {slot:?} cannot be reused; the output names a new slot, \
                 {new:?}, which Ferry creates. Run Ferry and the connector side by side until Ferry \
                 relays (duplicates, never a gap: consumers deduplicate on the id header), stop the \
                 connector, then drop its slot, which retains WAL until dropped: \
                 SELECT pg_drop_replication_slot('{slot}'). If that slot was in fact created with \
                 pgoutput, set postgres.slot = {slot:?} instead"
            ),
        );
    }
    doc.set(
        POSTGRES,
        "create_slot",
        Value::Bool(true),
        Some("Debezium creates a missing slot too"),
    );
    let pub_from = if src.peek("publication.name").is_some() {
        "publication.name"
    } else {
        "publication.name (unset: Debezium's default)"
    };
    let publication = src
        .take("publication.name")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| DEFAULT_PUBLICATION.to_owned());
    doc.set(
        POSTGRES,
        "publication",
        Value::Str(publication),
        Some(pub_from),
    );
    let mode = src
        .peek("publication.autocreate.mode")
        .map(str::to_ascii_lowercase)
        .unwrap_or_else(|| "all_tables".into());
    let create = match mode.as_str() {
        "all_tables" | "filtered" => Some(true),
        "disabled" | "no_tables" => Some(false),
        _ => None,
    };
    match create {
        Some(create) => {
            src.take("publication.autocreate.mode");
            doc.set(
                POSTGRES,
                "create_publication",
                Value::Bool(create),
                Some(&format!("publication.autocreate.mode = {mode}")),
            );
            if create {
                doc.caveat(
                    POSTGRES,
                    "create_publication",
                    "When missing, Ferry creates it FOR TABLE <the outbox tables> WITH (publish = 'insert'). \
                     An existing FOR ALL TABLES publication also works, but streams every table's changes \
                     to Ferry only to be skipped.",
                );
            }
        }
        None => src.note(
            "publication.autocreate.mode",
            "not a mode Ferry knows; set postgres.create_publication = true (Ferry creates it for \
             the outbox table) or false (it must exist)",
        ),
    }
}

/// `table.include.list` (or 1.x `table.whitelist`) to `outbox.table`.
fn table(src: &mut Source<'_>, doc: &mut Doc) {
    let key = if src.peek("table.include.list").is_some() {
        "table.include.list"
    } else {
        "table.whitelist"
    };
    let Some(list) = src.take(key) else {
        doc.set(
            OUTBOX,
            "table",
            Value::str("public.outbox"),
            Some("no table.include.list"),
        );
        src.note_value(
            "table.include.list",
            "(unset)",
            "the connector captured every table and the SMT routed them all: set outbox.table to \
             the outbox table (the output assumes public.outbox), and add a [[tables]] entry for \
             each other outbox table",
        );
        return;
    };
    let entries: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    let literal: Vec<String> = entries.iter().filter_map(|e| literal_table(e)).collect();
    let chosen = literal
        .iter()
        .find(|t| t.to_ascii_lowercase().contains("outbox"))
        .or_else(|| literal.first())
        .cloned();
    let Some(table) = chosen else {
        doc.set(OUTBOX, "table", Value::str("public.outbox"), Some(key));
        src.note_value(
            key,
            &list,
            "a pattern, not a table name: set outbox.table to the one outbox table it matches \
             (the output assumes public.outbox)",
        );
        return;
    };
    doc.set(OUTBOX, "table", Value::str(&table), Some(key));
    if table.chars().any(|c| c.is_ascii_uppercase()) {
        doc.caveat(
            OUTBOX,
            "table",
            "Debezium matched the name case-insensitively; Ferry folds an unquoted name to lower \
             case. If the table was created with a quoted mixed-case name, quote it: \"Schema\".\"Outbox\".",
        );
    }
    // One entry per table: `outbox` and `public.outbox` name the same one.
    let parsed = |t: &str| t.parse::<ferry_router::TableName>().ok();
    let mut others: Vec<&String> = Vec::new();
    for t in &literal {
        let name = parsed(t);
        if name != parsed(&table) && !others.iter().any(|o| parsed(o) == name) {
            others.push(t);
        }
    }
    for other in &others {
        doc.same_mapping_table(other, key);
    }
    if !others.is_empty() {
        doc.tables_intro(format!(
            "Debezium applied the outbox SMT to every table in {key}, so each is an outbox of the \
             same structure: [outbox] relays {table}, and each [[tables]] entry another, with the \
             same mapping, in the same slot and publication. Delete the entry of a table that is \
             not an outbox (one a transform predicate kept the SMT off); `ferry check` names a \
             table that lacks a column the mapping reads."
        ));
    }
    if literal.len() < entries.len() {
        src.note_value(
            key,
            &list,
            format!(
                "its patterns are not table names: the output relays {} only; add a [[tables]] \
                 entry (outbox.table and the mapping) for each outbox table a pattern matched",
                literal.join(", ")
            ),
        );
    }
}

/// An include-list entry that names one table (`public.outbox`, `public\.outbox`, `outbox`), as
/// `outbox.table` text, or `None` for a real pattern.
fn literal_table(entry: &str) -> Option<String> {
    let e = entry.strip_prefix('^').unwrap_or(entry);
    let e = e.strip_suffix('$').unwrap_or(e).replace("\\.", ".");
    let parts: Vec<&str> = e.split('.').collect();
    let ident = |p: &&str| {
        !p.is_empty()
            && !p.starts_with(|c: char| c.is_ascii_digit())
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    ((1..=2).contains(&parts.len()) && parts.iter().all(ident)).then_some(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_list_entries_that_name_one_table() {
        assert_eq!(
            literal_table("public.outbox").as_deref(),
            Some("public.outbox")
        );
        assert_eq!(
            literal_table("public\\.outbox").as_deref(),
            Some("public.outbox")
        );
        assert_eq!(
            literal_table("^inventory\\.OutboxEvent$").as_deref(),
            Some("inventory.OutboxEvent")
        );
        assert_eq!(literal_table("outbox").as_deref(), Some("outbox"));
        for pattern in [
            "public\\..*",
            "public.outbox_[0-9]+",
            "(a|b).outbox",
            "a.b.c",
            "",
        ] {
            assert_eq!(literal_table(pattern), None, "{pattern}");
        }
    }

    #[test]
    fn url_parts_are_percent_encoded() {
        assert_eq!(encode("app db/ü", ""), "app%20db%2F%C3%BC");
        assert_eq!(encode("/etc/ssl/ca.pem", "/"), "/etc/ssl/ca.pem");
    }
}
