//! Whether a session asks pgoutput for binary values (`binary 'true'`, PostgreSQL 14+).
//!
//! In binary mode the walsender sends each value in its type's send format where the type has
//! one (text otherwise; the tuple data marks each value). That pays off for bytea, which text
//! mode sends as hex (twice the bytes, encoded by the walsender and decoded by Ferry): measured
//! on a 1 KB bytea backlog, 103k -> 134k rows/s and 0.79 -> 0.48 CPU-s per 100k rows. For json,
//! jsonb and text the two formats cost the same, so text mode, the long-tested path, stays.
//!
//! Binary mode is only safe while the router can render every column it reads from binary
//! ([`ferry_router::renders_binary`]): an enum, a domain or an extension type has its own OID.
//! The choice is made per session from the table's current column types, and a session in
//! binary mode checks every new relation layout the stream announces (the relay core's guard,
//! `ferry_core::guard`); a column that changed to
//! a type read only as text ends the session with a transient error, and the next session
//! (replaying from the confirmed LSN) streams text. Nothing is routed from a value it cannot read.

pub use ferry_core::unreadable;
use ferry_router::oid;
use ferry_wal::conn::ReaderError;
use ferry_wal::slot;

use super::PipelineSettings;

/// The first server version whose pgoutput has the `binary` option.
pub const MIN_SERVER_VERSION: i32 = 140_000;

/// The choice and, for text mode, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Binary,
    Text(String),
}

/// Chooses the mode from the configuration, the server version, the columns the router reads
/// and the table's columns with their type OIDs and names (`format_type`).
pub fn choose(
    enabled: bool,
    server_version: i32,
    read: &[&str],
    columns: &[(String, u32, String)],
) -> Mode {
    if !enabled {
        return Mode::Text("postgres.binary = false".into());
    }
    if server_version < MIN_SERVER_VERSION {
        return Mode::Text(format!(
            "PostgreSQL {server_version} has no binary mode (14 or later has)"
        ));
    }
    if let Some((column, type_oid)) = unreadable(read, columns.iter().map(|(n, t, _)| (n, *t))) {
        let type_name = columns
            .iter()
            .find(|(n, t, _)| *n == column && *t == type_oid)
            .map_or_else(|| slot::type_name(type_oid), |(_, _, name)| name.clone());
        return Mode::Text(format!(
            "column {column:?} is of type {type_name}, which Ferry reads only as text"
        ));
    }
    let bytea = read
        .iter()
        .any(|r| columns.iter().any(|(n, t, _)| n == r && *t == oid::BYTEA));
    if !bytea {
        return Mode::Text(format!("{NO_GAIN}, and text costs the same"));
    }
    Mode::Binary
}

/// Chooses the mode for a session (or `ferry check`) from the server as it is now: binary only
/// if every outbox table allows it, and at least one gains from it.
pub async fn decide(
    sql: &tokio_postgres::Client,
    s: &PipelineSettings,
) -> Result<Mode, ReaderError> {
    // Sent at once: the connection pipelines them (their errors are taken in order).
    let (version, columns) = tokio::join!(
        slot::server_version_num(sql),
        futures_util::future::join_all(s.slot.tables.iter().map(|table| slot::column_types(
            sql,
            &table.schema,
            &table.table
        )))
    );
    let version = version?;
    let mut modes = Vec::with_capacity(s.slot.tables.len());
    for ((table, router), columns) in s.slot.tables.iter().zip(s.routers.iter()).zip(columns) {
        let columns: Vec<(String, u32, String)> = columns?
            .into_iter()
            .map(|c| (c.name, c.type_oid, c.type_name))
            .collect();
        modes.push((
            table,
            choose(s.binary, version, &router.columns(), &columns),
        ));
    }
    Ok(combine(modes.iter().map(|(t, m)| (t.qualified(), m))))
}

/// One mode for the session from each table's: text if any table needs it (saying which), binary
/// if any table gains from it and none needs text.
fn combine<'m>(modes: impl Iterator<Item = (String, &'m Mode)>) -> Mode {
    let modes: Vec<(String, &Mode)> = modes.collect();
    let several = modes.len() > 1;
    let why = |table: &str, why: &str| match several {
        true => format!("{table}: {why}"),
        false => why.to_string(),
    };
    let needs_text = |why: &str| !why.starts_with(NO_GAIN);
    if let Some((table, Mode::Text(reason))) = modes
        .iter()
        .find(|(_, m)| matches!(m, Mode::Text(w) if needs_text(w)))
    {
        return Mode::Text(why(table, reason));
    }
    if modes.iter().any(|(_, m)| **m == Mode::Binary) {
        return Mode::Binary;
    }
    match modes.first() {
        Some((_, Mode::Text(reason))) if !several => Mode::Text(reason.clone()),
        _ => Mode::Text(format!(
            "{NO_GAIN} in any outbox table, and text costs the same"
        )),
    }
}

/// The start of the reason for text mode when binary would gain nothing.
const NO_GAIN: &str = "no column Ferry reads is bytea";

#[cfg(test)]
mod tests {
    use super::*;

    const ENUM_OID: u32 = 16_400;

    fn cols(c: &[(&str, u32)]) -> Vec<(String, u32, String)> {
        let name = |t: u32| match t {
            ENUM_OID => "event_kind".to_string(),
            t => slot::type_name(t),
        };
        c.iter()
            .map(|(n, t)| (n.to_string(), *t, name(*t)))
            .collect()
    }

    #[test]
    fn choices() {
        let read = ["id", "aggregatetype", "aggregateid", "type", "payload"];
        let bytea = cols(&[
            ("id", oid::UUID),
            ("aggregatetype", oid::TEXT),
            ("aggregateid", oid::TEXT),
            ("type", oid::TEXT),
            ("payload", oid::BYTEA),
            ("note", ENUM_OID), // not read: its format does not matter
        ]);
        assert_eq!(choose(true, 150_004, &read, &bytea), Mode::Binary);
        let text = |m: Mode, want: &str| match m {
            Mode::Text(why) => assert!(why.contains(want), "{why:?} lacks {want:?}"),
            Mode::Binary => panic!("binary, expected text because {want}"),
        };
        text(
            choose(false, 150_004, &read, &bytea),
            "postgres.binary = false",
        );
        text(choose(true, 130_011, &read, &bytea), "14 or later");
        let mut jsonb = bytea.clone();
        jsonb[4].1 = oid::JSONB;
        text(
            choose(true, 150_004, &read, &jsonb),
            "no column Ferry reads is bytea",
        );
        let mut enum_type = bytea.clone();
        enum_type[1] = cols(&[("aggregatetype", ENUM_OID)]).remove(0);
        text(
            choose(true, 150_004, &read, &enum_type),
            "\"aggregatetype\" is of type event_kind, which Ferry reads only as text",
        );
        // A bytea column the router does not read does not count.
        let mut unread = jsonb.clone();
        unread[5].1 = oid::BYTEA;
        text(
            choose(true, 150_004, &read, &unread),
            "no column Ferry reads",
        );
    }

    /// Several tables share one session: binary only if every table allows it and one gains.
    #[test]
    fn the_session_mode_of_several_tables() {
        let binary = Mode::Binary;
        let no_gain = Mode::Text(format!("{NO_GAIN}, and text costs the same"));
        let needs_text = Mode::Text(
            "column \"kind\" is of type event_kind, which Ferry reads only as text".into(),
        );
        let of = |modes: &[(&str, &Mode)]| combine(modes.iter().map(|(t, m)| (t.to_string(), *m)));
        assert_eq!(of(&[("a", &binary), ("b", &no_gain)]), Mode::Binary);
        assert_eq!(
            of(&[("a", &binary), ("b", &needs_text)]),
            Mode::Text(
                "b: column \"kind\" is of type event_kind, which Ferry reads only as text".into()
            )
        );
        assert_eq!(
            of(&[("a", &no_gain), ("b", &no_gain)]),
            Mode::Text(format!(
                "{NO_GAIN} in any outbox table, and text costs the same"
            ))
        );
        // One table: its own reason, unprefixed.
        assert_eq!(of(&[("a", &no_gain)]), no_gain);
        assert_eq!(of(&[("a", &needs_text)]), needs_text);
        assert_eq!(of(&[("a", &binary)]), Mode::Binary);
    }

    #[test]
    fn unreadable_names_the_first_read_column() {
        let read = ["a", "b"];
        let layout = cols(&[("x", ENUM_OID), ("a", oid::TEXT), ("b", ENUM_OID)]);
        assert_eq!(
            unreadable(&read, layout.iter().map(|(n, t, _)| (n, *t))),
            Some(("b".to_string(), ENUM_OID))
        );
        let fine = cols(&[("a", oid::BYTEA), ("b", oid::TIMESTAMPTZ)]);
        assert_eq!(
            unreadable(&read, fine.iter().map(|(n, t, _)| (n, *t))),
            None
        );
    }
}
