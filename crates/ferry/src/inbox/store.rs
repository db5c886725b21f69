//! The inbox's database: its tables, the statements, and carrying out what the machine asks
//! (load offsets, write a batch, clean up). No decisions: the machine makes them.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use ferry_core::inbox::{
    DeadLetter, InboxRecord, Loaded, Partition, PayloadType, Write, WriteOutcome,
};
use ferry_core::source_position::SourcePosition;
use ferry_router::TableName;
use tokio_postgres::types::ToSql;
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

/// What one batch's rows look like as statement parameters.
#[derive(Default)]
struct Columns {
    topic: Vec<String>,
    partition: Vec<i32>,
    offset: Vec<i64>,
    key: Vec<Option<Vec<u8>>>,
    headers: Vec<serde_json::Value>,
    event_id: Vec<Option<String>>,
    /// Text for jsonb and text columns (cast in SQL), bytes for bytea.
    payload_text: Vec<Option<String>>,
    payload_bytes: Vec<Option<Vec<u8>>>,
    timestamp: Vec<Option<std::time::SystemTime>>,
}

impl Columns {
    fn push(&mut self, r: &InboxRecord, event_id: Option<&str>, payload: PayloadType) {
        self.topic.push(r.partition.topic.to_string());
        self.partition.push(r.partition.partition);
        self.offset.push(r.offset);
        self.key.push(r.key.as_ref().map(|k| k.to_vec()));
        self.headers.push(headers_json(&r.headers));
        self.event_id.push(event_id.map(str::to_owned));
        match payload {
            PayloadType::Bytea => self
                .payload_bytes
                .push(r.payload.as_ref().map(|p| p.to_vec())),
            _ => self.payload_text.push(
                r.payload
                    .as_ref()
                    .map(|p| String::from_utf8_lossy(p).into_owned()),
            ),
        }
        self.timestamp.push(r.timestamp_ms.and_then(|ms| {
            u64::try_from(ms)
                .ok()
                .map(|ms| std::time::UNIX_EPOCH + Duration::from_millis(ms))
        }));
    }

    fn payload(&self, payload: PayloadType) -> &(dyn ToSql + Sync) {
        match payload {
            PayloadType::Bytea => &self.payload_bytes,
            _ => &self.payload_text,
        }
    }
}

/// Headers as a JSON object: each value as text when it is UTF-8, `{"base64": …}` when not,
/// `null` when absent; a name given twice keeps its last value.
fn headers_json(headers: &[(String, Option<bytes::Bytes>)]) -> serde_json::Value {
    let mut m = serde_json::Map::with_capacity(headers.len());
    for (k, v) in headers {
        let v = match v {
            None => serde_json::Value::Null,
            Some(b) => match std::str::from_utf8(b) {
                Ok(s) if !s.contains('\0') => serde_json::Value::String(s.to_owned()),
                _ => serde_json::json!({ "base64": base64(b) }),
            },
        };
        m.insert(k.replace('\0', ""), v);
    }
    serde_json::Value::Object(m)
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

/// The statements of one writer, prepared once per connection.
#[derive(Debug)]
pub struct Statements {
    advance: tokio_postgres::Statement,
    insert: tokio_postgres::Statement,
    insert_no_dedup: tokio_postgres::Statement,
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
        let (payload_param, payload_expr) = match t.payload {
            PayloadType::Bytea => ("bytea[]", "b.payload"),
            PayloadType::Text => ("text[]", "b.payload"),
            PayloadType::Jsonb => ("text[]", "b.payload::jsonb"),
        };
        let batch = format!(
            "SELECT * FROM unnest($1::text[], $2::int4[], $3::int8[], $4::bytea[], $5::jsonb[], $6::text[], $7::{payload_param}, $8::timestamptz[]) \
             AS b(topic, part, off, key, headers, event_id, payload, ts)"
        );
        let insert_cols =
            "(topic, \"partition\", \"offset\", key, headers, event_id, payload, kafka_timestamp)";
        let insert = format!(
            "WITH b AS ({batch}), \
             fresh AS (INSERT INTO {dedup} (event_id) SELECT event_id FROM b WHERE event_id IS NOT NULL ORDER BY event_id ON CONFLICT DO NOTHING RETURNING event_id) \
             INSERT INTO {inbox} {insert_cols} \
             SELECT b.topic, b.part, b.off, b.key, b.headers, b.event_id, {payload_expr}, b.ts FROM b \
             WHERE b.event_id IS NULL OR b.event_id IN (SELECT event_id FROM fresh)",
            dedup = t.dedup,
            inbox = t.inbox,
        );
        let insert_no_dedup = format!(
            "WITH b AS ({batch}) INSERT INTO {inbox} {insert_cols} \
             SELECT b.topic, b.part, b.off, b.key, b.headers, b.event_id, {payload_expr}, b.ts FROM b",
            inbox = t.inbox,
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
            advance: client.prepare(&advance).await?,
            insert: client.prepare(&insert).await?,
            insert_no_dedup: client.prepare(&insert_no_dedup).await?,
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
pub async fn write(
    client: &mut Client,
    s: &Statements,
    t: &Tables,
    group: &str,
    w: &Write,
    dedup: bool,
) -> WriteOutcome {
    match write_inner(client, s, t, group, w, dedup).await {
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

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
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
) -> Step {
    let tx = tri!(client.transaction().await);
    // The offsets first: a fenced batch stops before it writes anything else.
    let topics: Vec<&str> = w.offsets.iter().map(|o| &*o.partition.topic).collect();
    let parts: Vec<i32> = w.offsets.iter().map(|o| o.partition.partition).collect();
    let expected: Vec<Option<i64>> = w.offsets.iter().map(|o| o.expected).collect();
    let next: Vec<i64> = w.offsets.iter().map(|o| o.next).collect();
    let updated = tri!(
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
            let mut c = Columns::default();
            c.push(&r.record, r.event_id.as_deref(), t.payload);
            tri!(tx.execute("SAVEPOINT ferry_row", &[]).await);
            match insert(&tx, s, &c, t.payload, dedup).await {
                Ok(k) => {
                    inserted += k;
                    candidates += 1;
                    tri!(tx.execute("RELEASE SAVEPOINT ferry_row", &[]).await);
                }
                Err(e) if is_data_error(&e) => {
                    tri!(tx.execute("ROLLBACK TO SAVEPOINT ferry_row", &[]).await);
                    tracing::warn!(
                        topic = &*r.record.partition.topic,
                        partition = r.record.partition.partition,
                        offset = r.record.offset,
                        error = %describe(&e),
                        "the database refused a record: it goes to the dead-letter table"
                    );
                    tri!(
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
        let mut c = Columns::default();
        for r in &w.rows {
            c.push(&r.record, r.event_id.as_deref(), t.payload);
        }
        candidates = w.rows.len() as u64;
        inserted = tri!(insert(&tx, s, &c, t.payload, dedup).await);
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
        tri!(dead_letter(&tx, s, &w.dead_letters).await);
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
            tx.execute(&s.marks, &[&group, &topics, &parts, &sources, &lsns, &idx])
                .await
        );
    }
    if inserted > 0 {
        if let Some(n) = &s.notify {
            tri!(tx.batch_execute(n).await);
        }
    }
    tri!(tx.commit().await);
    Step::Done(WriteOutcome::Committed {
        inserted,
        duplicates: candidates - inserted,
        dead_lettered,
    })
}

async fn insert(
    tx: &tokio_postgres::Transaction<'_>,
    s: &Statements,
    c: &Columns,
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
            &c.headers,
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
    let mut c = Columns::default();
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
            &c.headers,
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

/// What a cleanup deleted, and its longest single DELETE (each is its own transaction).
#[derive(Debug, Default, Clone, Copy)]
pub struct Cleaned {
    pub dedup_rows: u64,
    pub processed_rows: u64,
    pub longest: Duration,
}

/// Deletes expired deduplication rows and processed rows in batches of `batch`, each its own
/// short transaction, until none is left.
pub async fn cleanup(
    client: &Client,
    t: &Tables,
    dedup_retention: Duration,
    processed_retention: Option<Duration>,
    batch: i64,
) -> Result<Cleaned, tokio_postgres::Error> {
    let mut cleaned = Cleaned::default();
    let dedup = format!(
        "DELETE FROM {d} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {d} WHERE received_at < now() - make_interval(secs => $1) LIMIT $2))",
        d = t.dedup
    );
    cleaned.dedup_rows =
        batches(client, &dedup, dedup_retention, batch, &mut cleaned.longest).await?;
    if let Some(r) = processed_retention {
        let processed = format!(
            "DELETE FROM {i} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {i} WHERE processed_at < now() - make_interval(secs => $1) LIMIT $2))",
            i = t.inbox
        );
        cleaned.processed_rows =
            batches(client, &processed, r, batch, &mut cleaned.longest).await?;
    }
    Ok(cleaned)
}

async fn batches(
    client: &Client,
    sql: &str,
    retention: Duration,
    batch: i64,
    longest: &mut Duration,
) -> Result<u64, tokio_postgres::Error> {
    let stmt = client.prepare(sql).await?;
    let secs = retention.as_secs_f64();
    let mut total = 0;
    loop {
        let started = Instant::now();
        let n = client.execute(&stmt, &[&secs, &batch]).await?;
        *longest = (*longest).max(started.elapsed());
        total += n;
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

    #[test]
    fn headers_are_text_when_they_can_be() {
        let h = vec![
            ("id".to_owned(), Some(bytes::Bytes::from_static(b"abc"))),
            ("bin".to_owned(), Some(bytes::Bytes::from_static(&[0xff]))),
            ("none".to_owned(), None),
        ];
        assert_eq!(
            headers_json(&h).to_string(),
            r#"{"bin":{"base64":"/w=="},"id":"abc","none":null}"#
        );
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
