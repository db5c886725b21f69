//! The inbox's database: its tables, the statements, and carrying out what the machine asks
//! (load offsets, write a batch, clean up). No decisions: the machine makes them.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ferry_core::inbox::{
    DeadLetter, InboxRecord, Loaded, Partition, PayloadType, Write, WriteOutcome,
};
use ferry_core::source_position::SourcePosition;
use ferry_router::TableName;
use futures_util::SinkExt;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use tokio_postgres::Client;

/// The inbox's tables, quoted, and how their statements are written.
#[derive(Debug, Clone)]
pub struct Tables {
    pub inbox: String,
    pub dedup: String,
    pub dead_letters: String,
    pub offsets: String,
    pub marks: String,
    /// Bare names, for index names.
    base: String,
    schema: String,
    pub payload: PayloadType,
}

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

impl Tables {
    pub fn new(table: &TableName, payload: PayloadType) -> Tables {
        let q = |suffix: &str| {
            format!(
                "{}.{}",
                quote(&table.schema),
                quote(&format!("{}{suffix}", table.name))
            )
        };
        Tables {
            inbox: q(""),
            dedup: q("_dedup"),
            dead_letters: q("_dead_letters"),
            offsets: q("_offsets"),
            marks: q("_marks"),
            base: table.name.clone(),
            schema: table.schema.clone(),
            payload,
        }
    }

    fn index(&self, suffix: &str) -> String {
        quote(&format!("{}_{suffix}", self.base))
    }

    /// The tables, as `sql/inbox.sql` holds them for the defaults (a test keeps the two equal).
    pub fn ddl(&self) -> String {
        let payload = self.payload.sql();
        let mut s = String::new();
        let _ = write!(
            s,
            "-- The inbox: one row per record stored, in the consuming service's database.\n\
             CREATE TABLE IF NOT EXISTS {inbox} (\n\
             \x20   topic           text        NOT NULL,\n\
             \x20   \"partition\"     integer     NOT NULL,\n\
             \x20   \"offset\"        bigint      NOT NULL,\n\
             \x20   key             bytea,\n\
             \x20   headers         jsonb       NOT NULL,\n\
             \x20   event_id        text,\n\
             \x20   payload         {payload},\n\
             \x20   kafka_timestamp timestamptz,\n\
             \x20   received_at     timestamptz NOT NULL DEFAULT now(),\n\
             \x20   processed_at    timestamptz,\n\
             \x20   PRIMARY KEY (topic, \"partition\", \"offset\")\n\
             );\n\
             -- The application's queue: unprocessed rows, per key in offset order.\n\
             CREATE INDEX IF NOT EXISTS {unprocessed} ON {inbox} (topic, \"partition\", \"offset\") WHERE processed_at IS NULL;\n\
             CREATE INDEX IF NOT EXISTS {by_key} ON {inbox} (topic, key, \"partition\", \"offset\") WHERE processed_at IS NULL;\n\
             -- The cleanup of processed rows.\n\
             CREATE INDEX IF NOT EXISTS {processed} ON {inbox} (processed_at) WHERE processed_at IS NOT NULL;\n\
             \n\
             -- Event ids stored within the retention window (inbox.dedup_retention).\n\
             CREATE TABLE IF NOT EXISTS {dedup} (\n\
             \x20   event_id    text        PRIMARY KEY,\n\
             \x20   received_at timestamptz NOT NULL DEFAULT now()\n\
             );\n\
             CREATE INDEX IF NOT EXISTS {dedup_received} ON {dedup} (received_at);\n\
             \n\
             -- Records that cannot be stored in the inbox, with why.\n\
             CREATE TABLE IF NOT EXISTS {dead} (\n\
             \x20   topic           text        NOT NULL,\n\
             \x20   \"partition\"     integer     NOT NULL,\n\
             \x20   \"offset\"        bigint      NOT NULL,\n\
             \x20   key             bytea,\n\
             \x20   headers         jsonb       NOT NULL,\n\
             \x20   event_id        text,\n\
             \x20   payload         bytea,\n\
             \x20   kafka_timestamp timestamptz,\n\
             \x20   reason          text        NOT NULL,\n\
             \x20   received_at     timestamptz NOT NULL DEFAULT now(),\n\
             \x20   PRIMARY KEY (topic, \"partition\", \"offset\")\n\
             );\n\
             \n\
             -- Each partition's next offset, per consumer group: written in the same transaction as the rows.\n\
             CREATE TABLE IF NOT EXISTS {offsets} (\n\
             \x20   consumer_group text        NOT NULL,\n\
             \x20   topic          text        NOT NULL,\n\
             \x20   \"partition\"    integer     NOT NULL,\n\
             \x20   next_offset    bigint,\n\
             \x20   updated_at     timestamptz NOT NULL DEFAULT now(),\n\
             \x20   PRIMARY KEY (consumer_group, topic, \"partition\")\n\
             );\n\
             \n\
             -- The highest source position stored per partition and `ferry run` source (inbox.positions).\n\
             CREATE TABLE IF NOT EXISTS {marks} (\n\
             \x20   consumer_group text    NOT NULL,\n\
             \x20   topic          text    NOT NULL,\n\
             \x20   \"partition\"    integer NOT NULL,\n\
             \x20   source         text    NOT NULL,\n\
             \x20   commit_lsn     pg_lsn  NOT NULL,\n\
             \x20   row_index      integer NOT NULL,\n\
             \x20   PRIMARY KEY (consumer_group, topic, \"partition\", source)\n\
             );\n",
            inbox = self.inbox,
            unprocessed = self.index("unprocessed"),
            by_key = self.index("by_key"),
            processed = self.index("processed"),
            dedup = self.dedup,
            dedup_received = self.index("dedup_received"),
            dead = self.dead_letters,
            offsets = self.offsets,
            marks = self.marks,
        );
        s
    }

    /// Creates what is missing (`inbox.create_tables`).
    ///
    /// Two copies starting together would race: `CREATE TABLE IF NOT EXISTS` is not safe
    /// against a concurrent one (the loser fails with a unique violation on `pg_type`). So the
    /// copies take turns under a transaction-level advisory lock on the inbox's name, and each
    /// runs the DDL only if a table or index is still missing once it holds the lock: `CREATE
    /// INDEX IF NOT EXISTS` locks its table (SHARE) before it looks, and a copy starting next to
    /// one that writes would otherwise hold those locks across its whole transaction and
    /// deadlock with the writes.
    pub async fn create(&self, client: &mut Client) -> Result<(), tokio_postgres::Error> {
        let tx = client.transaction().await?;
        let key = format!("ferry inbox tables {}", self.inbox);
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&key])
            .await?;
        let mut names: Vec<String> = ["", "_dedup", "_dead_letters", "_offsets", "_marks"]
            .iter()
            .map(|suffix| format!("{}{suffix}", self.base))
            .collect();
        names.extend(
            ["unprocessed", "by_key", "processed", "dedup_received"]
                .iter()
                .map(|suffix| format!("{}_{suffix}", self.base)),
        );
        let absent: i64 = tx
            .query_one(
                "SELECT count(*) FROM unnest($2::text[]) AS n \
                 WHERE to_regclass(format('%I.%I', $1::text, n)) IS NULL",
                &[&self.schema, &names],
            )
            .await?
            .get(0);
        if absent > 0 {
            tx.batch_execute(&self.ddl()).await?;
        }
        tx.commit().await
    }

    /// The tables that do not exist, as [`Tables::all`] names them.
    pub async fn missing(&self, client: &Client) -> Result<Vec<String>, tokio_postgres::Error> {
        let mut missing = Vec::new();
        for name in self.all() {
            let row = client
                .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&name])
                .await?;
            if !row.get::<_, bool>(0) {
                missing.push(name.to_owned());
            }
        }
        Ok(missing)
    }

    /// The five tables, quoted.
    pub fn all(&self) -> [&str; 5] {
        [
            &self.inbox,
            &self.dedup,
            &self.dead_letters,
            &self.offsets,
            &self.marks,
        ]
    }

    pub fn schema(&self) -> &str {
        &self.schema
    }
}

/// Reads (creating the offset rows of) `partitions`' stored offsets and marks.
pub async fn load(
    client: &Client,
    t: &Tables,
    group: &str,
    partitions: &[Partition],
) -> Result<Vec<Loaded>, tokio_postgres::Error> {
    let topics: Vec<&str> = partitions.iter().map(|p| &*p.topic).collect();
    let parts: Vec<i32> = partitions.iter().map(|p| p.partition).collect();
    client
        .execute(
            &format!(
                "INSERT INTO {} (consumer_group, topic, \"partition\") \
                 SELECT $1, t, p FROM unnest($2::text[], $3::int4[]) AS v(t, p) \
                 ON CONFLICT DO NOTHING",
                t.offsets
            ),
            &[&group, &topics, &parts],
        )
        .await?;
    let rows = client
        .query(
            &format!(
                "SELECT o.topic, o.\"partition\", o.next_offset FROM {} o \
                 JOIN unnest($2::text[], $3::int4[]) AS v(t, p) ON o.topic = v.t AND o.\"partition\" = v.p \
                 WHERE o.consumer_group = $1",
                t.offsets
            ),
            &[&group, &topics, &parts],
        )
        .await?;
    let marks = client
        .query(
            &format!(
                "SELECT m.topic, m.\"partition\", m.source, m.commit_lsn::text, m.row_index FROM {} m \
                 JOIN unnest($2::text[], $3::int4[]) AS v(t, p) ON m.topic = v.t AND m.\"partition\" = v.p \
                 WHERE m.consumer_group = $1",
                t.marks
            ),
            &[&group, &topics, &parts],
        )
        .await?;
    let mut loaded: Vec<Loaded> = rows
        .iter()
        .map(|r| Loaded {
            partition: Partition::new(r.get::<_, String>(0), r.get(1)),
            next: r.get(2),
            marks: Vec::new(),
        })
        .collect();
    for m in &marks {
        let p = Partition::new(m.get::<_, String>(0), m.get(1));
        let lsn: String = m.get(3);
        let index: i32 = m.get(4);
        let (Ok(commit_lsn), Ok(index)) = (lsn.parse(), u32::try_from(index)) else {
            continue;
        };
        if let Some(l) = loaded.iter_mut().find(|l| l.partition == p) {
            l.marks.push((
                m.get::<_, String>(2).into(),
                SourcePosition { commit_lsn, index },
            ));
        }
    }
    Ok(loaded)
}

/// A JSON text sent as a `jsonb` value in binary form (format version 1, then the text): the
/// server parses it as `jsonb_in` would, and the client copies it once, into the message.
#[derive(Debug, Clone, Copy)]
struct Jsonb<'a>(&'a [u8]);

impl ToSql for Jsonb<'_> {
    fn to_sql(
        &self,
        _: &Type,
        w: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        w.reserve(1 + self.0.len());
        w.extend_from_slice(&[1]);
        w.extend_from_slice(self.0);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB
    }

    to_sql_checked!();
}

/// One batch's rows as statement parameters (arrays, one element per row), borrowed from the
/// records: nothing is copied but the headers, which become JSON text.
#[derive(Default)]
struct Columns<'a> {
    topic: Vec<&'a str>,
    partition: Vec<i32>,
    offset: Vec<i64>,
    key: Vec<Option<&'a [u8]>>,
    /// Every row's headers as a JSON object, one after another; `header_ends` ends each.
    header_text: String,
    header_ends: Vec<usize>,
    event_id: Vec<Option<&'a str>>,
    /// The payload as `jsonb` (its text), `text`, or `bytea`, by the column's type.
    payload_json: Vec<Option<Jsonb<'a>>>,
    payload_text: Vec<Option<Cow<'a, str>>>,
    payload_bytes: Vec<Option<&'a [u8]>>,
    timestamp: Vec<Option<std::time::SystemTime>>,
}

impl<'a> Columns<'a> {
    fn with_capacity(n: usize) -> Columns<'a> {
        Columns {
            topic: Vec::with_capacity(n),
            partition: Vec::with_capacity(n),
            offset: Vec::with_capacity(n),
            key: Vec::with_capacity(n),
            header_text: String::with_capacity(n * 64),
            header_ends: Vec::with_capacity(n),
            event_id: Vec::with_capacity(n),
            timestamp: Vec::with_capacity(n),
            ..Columns::default()
        }
    }

    fn push(&mut self, r: &'a InboxRecord, event_id: Option<&'a str>, payload: PayloadType) {
        self.topic.push(&r.partition.topic);
        self.partition.push(r.partition.partition);
        self.offset.push(r.offset);
        self.key.push(r.key.as_deref());
        write_headers_json(&mut self.header_text, &r.headers);
        self.header_ends.push(self.header_text.len());
        self.event_id.push(event_id);
        let p = r.payload.as_deref();
        match payload {
            PayloadType::Bytea => self.payload_bytes.push(p),
            // The machine let only UTF-8 text through for these types.
            PayloadType::Jsonb => self.payload_json.push(p.map(Jsonb)),
            PayloadType::Text => self.payload_text.push(p.map(String::from_utf8_lossy)),
        }
        self.timestamp.push(r.timestamp_ms.and_then(|ms| {
            u64::try_from(ms)
                .ok()
                .map(|ms| std::time::UNIX_EPOCH + Duration::from_millis(ms))
        }));
    }

    /// The headers, one `jsonb` per row.
    fn headers(&self) -> Vec<Jsonb<'_>> {
        let mut start = 0;
        self.header_ends
            .iter()
            .map(|&end| {
                let j = Jsonb(&self.header_text.as_bytes()[start..end]);
                start = end;
                j
            })
            .collect()
    }

    /// Row `i`'s payload.
    fn payload_at(&self, payload: PayloadType, i: usize) -> &(dyn ToSql + Sync) {
        match payload {
            PayloadType::Bytea => &self.payload_bytes[i],
            PayloadType::Jsonb => &self.payload_json[i],
            PayloadType::Text => &self.payload_text[i],
        }
    }

    fn payload(&self, payload: PayloadType) -> &(dyn ToSql + Sync) {
        match payload {
            PayloadType::Bytea => &self.payload_bytes,
            PayloadType::Jsonb => &self.payload_json,
            PayloadType::Text => &self.payload_text,
        }
    }
}

/// Headers as a JSON object, appended to `out`: each value as text when it is UTF-8, `{"base64":
/// …}` when not, `null` when absent; a name given twice keeps its last value (as `jsonb` reads
/// an object whose key repeats).
fn write_headers_json(out: &mut String, headers: &[(String, Option<bytes::Bytes>)]) {
    out.push('{');
    for (i, (k, v)) in headers.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        if k.contains('\0') {
            json_string(out, &k.replace('\0', ""));
        } else {
            json_string(out, k);
        }
        out.push(':');
        match v {
            None => out.push_str("null"),
            Some(b) => match std::str::from_utf8(b) {
                Ok(s) if !s.contains('\0') => json_string(out, s),
                _ => {
                    out.push_str("{\"base64\":\"");
                    out.push_str(&base64(b));
                    out.push_str("\"}");
                }
            },
        }
    }
    out.push('}');
}

/// `s` as a JSON string literal, appended to `out`.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    let mut plain = 0;
    for (i, c) in s.char_indices() {
        let escape = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            c if (c as u32) < 0x20 => "",
            _ => continue,
        };
        out.push_str(&s[plain..i]);
        if escape.is_empty() {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push_str(escape);
        }
        plain = i + c.len_utf8();
    }
    out.push_str(&s[plain..]);
    out.push('"');
}

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// The statements of one writer, prepared once per connection, and the connection's backend.
#[derive(Debug)]
pub struct Statements {
    /// The connection's backend on the server: ended if a write on it is given up on
    /// ([`ferry_wal::slot::end_backend`]); `None` if it could not be read.
    pub backend: Option<ferry_wal::slot::Backend>,
    advance: tokio_postgres::Statement,
    insert: tokio_postgres::Statement,
    insert_no_dedup: tokio_postgres::Statement,
    /// The batch's event ids into the deduplication table: how many were new, and which when
    /// not all were.
    fresh_ids: tokio_postgres::Statement,
    /// `COPY` of rows into the inbox table (binary).
    copy: String,
    dead: tokio_postgres::Statement,
    marks: tokio_postgres::Statement,
    current: tokio_postgres::Statement,
    notify: Option<String>,
}

impl Statements {
    pub async fn prepare(
        client: &Client,
        t: &Tables,
        notify_channel: &str,
    ) -> Result<Statements, tokio_postgres::Error> {
        let payload_param = match t.payload {
            PayloadType::Bytea => "bytea[]",
            PayloadType::Text => "text[]",
            PayloadType::Jsonb => "jsonb[]",
        };
        // The arrays unnested side by side in the select list (a ProjectSet streams them; a
        // function scan in FROM, or a CTE read twice, would first copy the whole batch into a
        // tuplestore, spilled to a temporary file past work_mem).
        let batch = format!(
            "SELECT unnest($1::text[]) AS topic, unnest($2::int4[]) AS part, unnest($3::int8[]) AS off, \
             unnest($4::bytea[]) AS key, unnest($5::jsonb[]) AS headers, unnest($6::text[]) AS event_id, \
             unnest($7::{payload_param}) AS payload, unnest($8::timestamptz[]) AS ts"
        );
        let insert_cols =
            "(topic, \"partition\", \"offset\", key, headers, event_id, payload, kafka_timestamp)";
        let insert = format!(
            "WITH fresh AS (INSERT INTO {dedup} (event_id) \
             SELECT e FROM unnest($6::text[]) AS e WHERE e IS NOT NULL ORDER BY e \
             ON CONFLICT DO NOTHING RETURNING event_id) \
             INSERT INTO {inbox} {insert_cols} \
             SELECT b.topic, b.part, b.off, b.key, b.headers, b.event_id, b.payload, b.ts FROM ({batch}) AS b \
             WHERE b.event_id IS NULL OR b.event_id IN (SELECT event_id FROM fresh)",
            dedup = t.dedup,
            inbox = t.inbox,
        );
        let insert_no_dedup = format!("INSERT INTO {inbox} {insert_cols} {batch}", inbox = t.inbox);
        let fresh_ids = format!(
            "WITH f AS (INSERT INTO {dedup} (event_id) SELECT e FROM unnest($1::text[]) AS e ORDER BY e \
             ON CONFLICT DO NOTHING RETURNING event_id) \
             SELECT count(*)::int8, CASE WHEN count(*) < $2::int8 THEN coalesce(array_agg(event_id), '{{}}') END FROM f",
            dedup = t.dedup,
        );
        let copy = format!(
            "COPY {inbox} {insert_cols} FROM STDIN (FORMAT binary)",
            inbox = t.inbox
        );
        let dead = format!(
            "INSERT INTO {} (topic, \"partition\", \"offset\", key, headers, event_id, payload, kafka_timestamp, reason) \
             SELECT * FROM unnest($1::text[], $2::int4[], $3::int8[], $4::bytea[], $5::jsonb[], $6::text[], $7::bytea[], $8::timestamptz[], $9::text[]) \
             ON CONFLICT DO NOTHING",
            t.dead_letters
        );
        let advance = format!(
            "UPDATE {} o SET next_offset = v.next, updated_at = now() \
             FROM unnest($2::text[], $3::int4[], $4::int8[], $5::int8[]) AS v(topic, part, expected, next) \
             WHERE o.consumer_group = $1 AND o.topic = v.topic AND o.\"partition\" = v.part \
             AND o.next_offset IS NOT DISTINCT FROM v.expected RETURNING o.topic, o.\"partition\"",
            t.offsets
        );
        let marks = format!(
            "INSERT INTO {} (consumer_group, topic, \"partition\", source, commit_lsn, row_index) \
             SELECT $1, v.topic, v.part, v.source, v.lsn::pg_lsn, v.idx \
             FROM unnest($2::text[], $3::int4[], $4::text[], $5::text[], $6::int4[]) AS v(topic, part, source, lsn, idx) \
             ON CONFLICT (consumer_group, topic, \"partition\", source) \
             DO UPDATE SET commit_lsn = EXCLUDED.commit_lsn, row_index = EXCLUDED.row_index",
            t.marks
        );
        let current = format!(
            "SELECT next_offset FROM {} WHERE consumer_group = $1 AND topic = $2 AND \"partition\" = $3",
            t.offsets
        );
        Ok(Statements {
            backend: ferry_wal::slot::backend(client, None).await.ok().flatten(),
            advance: client.prepare(&advance).await?,
            insert: client.prepare(&insert).await?,
            insert_no_dedup: client.prepare(&insert_no_dedup).await?,
            fresh_ids: client.prepare(&fresh_ids).await?,
            copy,
            dead: client.prepare(&dead).await?,
            marks: client.prepare(&marks).await?,
            current: client.prepare(&current).await?,
            notify: (!notify_channel.is_empty())
                .then(|| format!("NOTIFY {}", quote(notify_channel))),
        })
    }
}

/// How a write's statements went.
enum Step {
    Done(WriteOutcome),
    Error(tokio_postgres::Error),
}

/// Carries out `write` in one transaction on `client`. The outcome says what the database holds
/// (see [`WriteOutcome`]); it never guesses: an error on COMMIT is `Failed`.
/// `answers` counts the database's answers as they come (one a statement, one a chunk of COPY
/// data taken): the caller gives the write up only when none came for a while, however long the
/// write as a whole takes (a careful batch is three round trips a row).
pub async fn write(
    client: &mut Client,
    s: &Statements,
    t: &Tables,
    group: &str,
    w: &Write,
    dedup: bool,
    answers: &AtomicU64,
) -> WriteOutcome {
    match write_inner(client, s, t, group, w, dedup, answers).await {
        Step::Done(o) => o,
        Step::Error(e) => {
            if is_data_error(&e) {
                WriteOutcome::Rejected {
                    error: describe(&e),
                }
            } else {
                WriteOutcome::Failed {
                    error: describe(&e),
                }
            }
        }
    }
}

/// The statement's value, the answer counted; or the write's end with its error.
macro_rules! tri {
    ($answers:expr, $e:expr) => {
        match $e {
            Ok(v) => {
                $answers.fetch_add(1, Ordering::Relaxed);
                v
            }
            Err(e) => return Step::Error(e),
        }
    };
}

async fn write_inner(
    client: &mut Client,
    s: &Statements,
    t: &Tables,
    group: &str,
    w: &Write,
    dedup: bool,
    answers: &AtomicU64,
) -> Step {
    let tx = tri!(answers, client.transaction().await);
    // The offsets first: a fenced batch stops before it writes anything else.
    let topics: Vec<&str> = w.offsets.iter().map(|o| &*o.partition.topic).collect();
    let parts: Vec<i32> = w.offsets.iter().map(|o| o.partition.partition).collect();
    let expected: Vec<Option<i64>> = w.offsets.iter().map(|o| o.expected).collect();
    let next: Vec<i64> = w.offsets.iter().map(|o| o.next).collect();
    let updated = tri!(
        answers,
        tx.query(&s.advance, &[&group, &topics, &parts, &expected, &next])
            .await
    );
    if updated.len() != w.offsets.len() {
        let was_updated = |o: &&ferry_core::inbox::OffsetAdvance| {
            updated.iter().any(|r| {
                r.get::<_, &str>(0) == &*o.partition.topic
                    && r.get::<_, i32>(1) == o.partition.partition
            })
        };
        if let Some(o) = w.offsets.iter().find(|o| !was_updated(o)) {
            let found: Option<i64> = tri!(
                answers,
                tx.query_opt(
                    &s.current,
                    &[&group, &&*o.partition.topic, &o.partition.partition]
                )
                .await
            )
            .and_then(|r| r.get(0));
            return Step::Done(WriteOutcome::Fenced {
                partition: o.partition.clone(),
                expected: o.expected,
                found,
            });
        }
    }
    let mut inserted = 0u64;
    let mut dead_lettered = w.dead_letters.len() as u64;
    let mut candidates = 0u64;
    if w.careful {
        for r in &w.rows {
            let mut c = Columns::with_capacity(1);
            c.push(&r.record, r.event_id.as_deref(), t.payload);
            tri!(answers, tx.execute("SAVEPOINT ferry_row", &[]).await);
            match insert(&tx, s, &c, t.payload, dedup).await {
                Ok(k) => {
                    inserted += k;
                    candidates += 1;
                    tri!(
                        answers,
                        tx.execute("RELEASE SAVEPOINT ferry_row", &[]).await
                    );
                }
                Err(e) if is_data_error(&e) => {
                    tri!(
                        answers,
                        tx.execute("ROLLBACK TO SAVEPOINT ferry_row", &[]).await
                    );
                    tracing::warn!(
                        topic = &*r.record.partition.topic,
                        partition = r.record.partition.partition,
                        offset = r.record.offset,
                        error = %describe(&e),
                        "the database refused a record: it goes to the dead-letter table"
                    );
                    tri!(
                        answers,
                        dead_letter(
                            &tx,
                            s,
                            &[DeadLetter {
                                record: r.record.clone(),
                                reason: format!("the database refused it: {}", describe(&e)),
                            }]
                        )
                        .await
                    );
                    dead_lettered += 1;
                }
                Err(e) => return Step::Error(e),
            }
        }
    } else if !w.rows.is_empty() {
        let mut c = Columns::with_capacity(w.rows.len());
        for r in &w.rows {
            c.push(&r.record, r.event_id.as_deref(), t.payload);
        }
        candidates = w.rows.len() as u64;
        inserted = match copy_batch(&tx, s, &c, t.payload, dedup, answers).await {
            Ok(n) => n,
            Err(CopyError::Db(e)) => return Step::Error(e),
            Err(CopyError::Encode(error)) => return Step::Done(WriteOutcome::Failed { error }),
        };
    }
    if !w.dead_letters.is_empty() {
        for d in &w.dead_letters {
            tracing::warn!(
                topic = &*d.record.partition.topic,
                partition = d.record.partition.partition,
                offset = d.record.offset,
                reason = %d.reason,
                "a record cannot be stored in the inbox: it goes to the dead-letter table"
            );
        }
        tri!(answers, dead_letter(&tx, s, &w.dead_letters).await);
    }
    if !w.marks.is_empty() {
        let topics: Vec<&str> = w.marks.iter().map(|m| &*m.partition.topic).collect();
        let parts: Vec<i32> = w.marks.iter().map(|m| m.partition.partition).collect();
        let sources: Vec<&str> = w.marks.iter().map(|m| &*m.source).collect();
        let lsns: Vec<String> = w
            .marks
            .iter()
            .map(|m| m.position.commit_lsn.to_string())
            .collect();
        let idx: Vec<i32> = w
            .marks
            .iter()
            .map(|m| i32::try_from(m.position.index).unwrap_or(i32::MAX))
            .collect();
        tri!(
            answers,
            tx.execute(&s.marks, &[&group, &topics, &parts, &sources, &lsns, &idx])
                .await
        );
    }
    if inserted > 0 {
        if let Some(n) = &s.notify {
            tri!(answers, tx.batch_execute(n).await);
        }
    }
    tri!(answers, tx.commit().await);
    Step::Done(WriteOutcome::Committed {
        inserted,
        duplicates: candidates - inserted,
        dead_lettered,
    })
}

/// Why a batch's COPY failed.
enum CopyError {
    Db(tokio_postgres::Error),
    /// A value the client could not encode (as a statement parameter would fail to).
    Encode(String),
}

impl From<tokio_postgres::Error> for CopyError {
    fn from(e: tokio_postgres::Error) -> CopyError {
        CopyError::Db(e)
    }
}

/// Bytes of COPY data sent at a time.
const COPY_CHUNK: usize = 1 << 20;

/// Stores a batch's rows: with deduplication, their event ids go into the deduplication table
/// first (insert-or-ignore, in sorted order so that two copies never deadlock) and only the rows
/// whose id was new, or that have none, are copied into the inbox table, in the same
/// transaction; the statement `insert` makes does the same in one. Binary COPY writes the rows
/// several to a page and a WAL record (heap_multi_insert), where INSERT writes one at a time.
/// Returns the rows stored.
async fn copy_batch(
    tx: &tokio_postgres::Transaction<'_>,
    s: &Statements,
    c: &Columns<'_>,
    payload: PayloadType,
    dedup: bool,
    answers: &AtomicU64,
) -> Result<u64, CopyError> {
    let ids: Vec<&str> = c.event_id.iter().flatten().copied().collect();
    let fresh: Option<std::collections::HashSet<String>> = if dedup && !ids.is_empty() {
        let row = tx
            .query_one(&s.fresh_ids, &[&ids, &(ids.len() as i64)])
            .await?;
        // All new: no list. Otherwise the new ones, none at all being an empty list.
        let new: i64 = row.get(0);
        (usize::try_from(new).ok() != Some(ids.len())).then(|| {
            row.get::<_, Option<Vec<String>>>(1)
                .unwrap_or_default()
                .into_iter()
                .collect()
        })
    } else {
        None
    };
    let keep = |i: usize| match (&fresh, c.event_id[i]) {
        (Some(fresh), Some(id)) => fresh.contains(id),
        _ => true,
    };
    if !(0..c.topic.len()).any(keep) {
        return Ok(0);
    }
    let payload_type = match payload {
        PayloadType::Bytea => Type::BYTEA,
        PayloadType::Text => Type::TEXT,
        PayloadType::Jsonb => Type::JSONB,
    };
    let headers = c.headers();
    let sink = tx.copy_in::<_, bytes::Bytes>(s.copy.as_str()).await?;
    let mut sink = std::pin::pin!(sink);
    let mut buf = bytes::BytesMut::with_capacity(COPY_CHUNK + (64 << 10));
    buf.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
    buf.extend_from_slice(&0i32.to_be_bytes());
    buf.extend_from_slice(&0i32.to_be_bytes());
    for i in (0..c.topic.len()).filter(|&i| keep(i)) {
        buf.extend_from_slice(&8i16.to_be_bytes());
        let fields: [(&(dyn ToSql + Sync), &Type); 8] = [
            (&c.topic[i], &Type::TEXT),
            (&c.partition[i], &Type::INT4),
            (&c.offset[i], &Type::INT8),
            (&c.key[i], &Type::BYTEA),
            (&headers[i], &Type::JSONB),
            (&c.event_id[i], &Type::TEXT),
            (c.payload_at(payload, i), &payload_type),
            (&c.timestamp[i], &Type::TIMESTAMPTZ),
        ];
        for (value, ty) in fields {
            let at = buf.len();
            buf.extend_from_slice(&0i32.to_be_bytes());
            let len = match value.to_sql_checked(ty, &mut buf) {
                Ok(IsNull::Yes) => -1,
                Ok(IsNull::No) => i32::try_from(buf.len() - at - 4)
                    .map_err(|_| CopyError::Encode("a value over 2 GiB".into()))?,
                Err(e) => {
                    return Err(CopyError::Encode(format!(
                        "cannot encode a value of the batch as {ty}: {e}"
                    )))
                }
            };
            buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
        }
        if buf.len() >= COPY_CHUNK {
            sink.send(buf.split().freeze()).await?;
            answers.fetch_add(1, Ordering::Relaxed);
        }
    }
    buf.extend_from_slice(&(-1i16).to_be_bytes());
    sink.send(buf.split().freeze()).await?;
    Ok(sink.finish().await?)
}

async fn insert(
    tx: &tokio_postgres::Transaction<'_>,
    s: &Statements,
    c: &Columns<'_>,
    payload: PayloadType,
    dedup: bool,
) -> Result<u64, tokio_postgres::Error> {
    let stmt = if dedup { &s.insert } else { &s.insert_no_dedup };
    tx.execute(
        stmt,
        &[
            &c.topic,
            &c.partition,
            &c.offset,
            &c.key,
            &c.headers(),
            &c.event_id,
            c.payload(payload),
            &c.timestamp,
        ],
    )
    .await
}

async fn dead_letter(
    tx: &tokio_postgres::Transaction<'_>,
    s: &Statements,
    dead: &[DeadLetter],
) -> Result<u64, tokio_postgres::Error> {
    let mut c = Columns::with_capacity(dead.len());
    let mut reasons = Vec::with_capacity(dead.len());
    for d in dead {
        c.push(&d.record, None, PayloadType::Bytea);
        reasons.push(d.reason.as_str());
    }
    // The event id, when there is one, for whoever reads the dead letters.
    let ids: Vec<Option<String>> = dead
        .iter()
        .map(|d| {
            d.record
                .header("id")
                .and_then(|v| std::str::from_utf8(v).ok())
                .map(|s| s.replace('\0', ""))
        })
        .collect();
    tx.execute(
        &s.dead,
        &[
            &c.topic,
            &c.partition,
            &c.offset,
            &c.key,
            &c.headers(),
            &ids,
            &c.payload_bytes,
            &c.timestamp,
            &reasons,
        ],
    )
    .await
}

/// An error about the data of a row (class 22, 23 and the like): the batch can go again row by
/// row, dead-lettering the row at fault.
fn is_data_error(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        let c = c.code();
        c.starts_with("22") || c.starts_with("23")
    })
}

/// The server's message with its detail and code, or the client's.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = db.message().to_owned();
            if let Some(d) = db.detail() {
                let _ = write!(s, " ({d})");
            }
            let _ = write!(s, " [SQLSTATE {}]", db.code().code());
            s
        }
        None => {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(inner) = src {
                let _ = write!(s, ": {inner}");
                src = inner.source();
            }
            s
        }
    }
}

/// What a cleanup deleted, its longest single DELETE (each is its own transaction), and how
/// long it took in all.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cleaned {
    pub dedup_rows: u64,
    pub processed_rows: u64,
    pub longest: Duration,
    pub took: Duration,
}

/// Deletes expired deduplication rows and processed rows in batches of `batch`, each its own
/// short transaction, until none is left. `answers` counts the database's answers as they come
/// (one a statement), for the caller to give up on a cleanup that stops getting any.
pub async fn cleanup(
    client: &Client,
    t: &Tables,
    dedup_retention: Duration,
    processed_retention: Option<Duration>,
    batch: i64,
    answers: &AtomicU64,
) -> Result<Cleaned, tokio_postgres::Error> {
    let started = Instant::now();
    let mut cleaned = Cleaned::default();
    cleaned.dedup_rows = batches(
        client,
        &expired(&t.dedup, "received_at"),
        dedup_retention,
        batch,
        &mut cleaned.longest,
        answers,
    )
    .await?;
    if let Some(r) = processed_retention {
        cleaned.processed_rows = batches(
            client,
            &expired(&t.inbox, "processed_at"),
            r,
            batch,
            &mut cleaned.longest,
            answers,
        )
        .await?;
    }
    cleaned.took = started.elapsed();
    Ok(cleaned)
}

/// One batch of the cleanup of `table`: up to `$2` rows whose `column` is older than `$1`
/// seconds, taken in the order of `column`'s index from `$3` on (the highest value the batch
/// before deleted; NULL: from the start), deleted by their ctid. Answers how many, and the
/// highest value deleted.
///
/// Each batch starts where the one before stopped: a scan from the start of the index passed
/// every entry the batches before had deleted (dead until VACUUM), so the n-th batch read n
/// batches' worth of dead entries, and the last ones of 10,000,000 expired ids took 0.8-1.9 s
/// each. Rows tied on the value the batch before stopped at are read again, no more.
fn expired(table: &str, column: &str) -> String {
    format!(
        "WITH doomed AS (SELECT ctid FROM {table} \
           WHERE {column} >= coalesce($3::timestamptz, '-infinity') \
             AND {column} < now() - make_interval(secs => $1) \
           ORDER BY {column} LIMIT $2), \
         gone AS (DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM doomed)) RETURNING {column}) \
         SELECT count(*)::int8, max({column}) FROM gone"
    )
}

async fn batches(
    client: &Client,
    sql: &str,
    retention: Duration,
    batch: i64,
    longest: &mut Duration,
    answers: &AtomicU64,
) -> Result<u64, tokio_postgres::Error> {
    let stmt = client.prepare(sql).await?;
    answers.fetch_add(1, Ordering::Relaxed);
    let secs = retention.as_secs_f64();
    let mut total = 0;
    let mut from: Option<std::time::SystemTime> = None;
    loop {
        let started = Instant::now();
        let row = client.query_one(&stmt, &[&secs, &batch, &from]).await?;
        answers.fetch_add(1, Ordering::Relaxed);
        let n = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
        let took = started.elapsed();
        *longest = (*longest).max(took);
        tracing::debug!(
            rows = n,
            took_us = took.as_micros() as u64,
            "cleanup DELETE"
        );
        total += n;
        from = row.get::<_, Option<std::time::SystemTime>>(1).or(from);
        if n < batch as u64 {
            return Ok(total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(&[0xff, 0xfe, 0x00, 0x01]), "//4AAQ==");
    }

    fn headers_json(h: &[(&str, Option<&'static [u8]>)]) -> String {
        let h: Vec<(String, Option<bytes::Bytes>)> = h
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(bytes::Bytes::from_static)))
            .collect();
        let mut s = String::new();
        write_headers_json(&mut s, &h);
        s
    }

    #[test]
    fn headers_are_text_when_they_can_be() {
        let h = [
            ("id", Some(&b"abc"[..])),
            ("bin", Some(&[0xff][..])),
            ("none", None),
        ];
        assert_eq!(
            headers_json(&h),
            r#"{"id":"abc","bin":{"base64":"/w=="},"none":null}"#
        );
        assert_eq!(headers_json(&[]), "{}");
        // A value with a NUL is not text PostgreSQL can hold: base64; a name loses its NULs.
        assert_eq!(
            headers_json(&[("a\0b", Some(&b"x\0"[..]))]),
            r#"{"ab":{"base64":"eAA="}}"#
        );
    }

    #[test]
    fn header_json_escapes_what_json_must() {
        let v = "q\"b\\n\nr\rt\tc\u{1}é😀";
        let text = headers_json(&[("k\"", Some(v.as_bytes()))]);
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["k\""], v, "{text}");
        // A name given twice: the last value, as jsonb keeps it.
        let text = headers_json(&[("id", Some(&b"1"[..])), ("id", Some(&b"2"[..]))]);
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["id"], "2");
    }

    #[test]
    fn sql_inbox_holds_the_default_tables() {
        let t = Tables::new(&"public.ferry_inbox".parse().unwrap(), PayloadType::Jsonb);
        let file = include_str!("../../../../sql/inbox.sql");
        assert!(
            file.contains(&t.ddl()),
            "sql/inbox.sql no longer holds the tables `ferry inbox` creates; paste this into it:\n{}",
            t.ddl()
        );
    }
}
