//! The workloads: what the outbox table looks like and how each backlog is written.
//!
//! Every workload gets a database of its own with one outbox table, shaped like Debezium's
//! outbox plus the two columns a polling relay needs (`seq` for insertion order, `published_at`
//! for "done"), so all four contenders read the same rows from the same table. Ferry and
//! `pg_recvlogical` see the extra columns in the WAL and ignore them.
//!
//! Payloads are generated in SQL and look like real events rather than filler: a jsonb payload
//! is an object with an array of `{"sku": <md5 hex>, "qty": n}` items (repeated keys compress,
//! hex values mostly do not), sized by the number of items; a bytea payload is raw md5 bytes
//! (incompressible, like an Avro or protobuf body). Repeated `x` padding would let TOAST and lz4
//! shrink a 16 KB payload to a few hundred bytes and flatter every contender. The actual payload
//! bytes are measured after each insert and used for MB/s.

use std::time::{Duration, Instant};

use futures_util::{stream, StreamExt, TryStreamExt};

use crate::Res;

/// The payload column's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Jsonb,
    Bytea,
}

impl Kind {
    pub fn sql_type(self) -> &'static str {
        match self {
            Kind::Jsonb => "jsonb",
            Kind::Bytea => "bytea",
        }
    }

    /// The payload as the router emits it (jsonb: its text; bytea: the raw bytes), for SQL.
    pub fn payload_bytes_expr(self) -> &'static str {
        match self {
            Kind::Jsonb => "convert_to(payload::text, 'UTF8')",
            Kind::Bytea => "payload",
        }
    }
}

/// One backlog shape.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Short name used on the command line, in topic names and in the table.
    pub name: &'static str,
    /// Rows in the backlog (before `--scale`).
    pub rows: u64,
    /// Rows per transaction (`u64::MAX`: one transaction).
    pub txn_rows: u64,
    /// Target payload size, bytes.
    pub payload: usize,
    pub kind: Kind,
}

/// Every workload of the full matrix, in the order they run.
pub fn matrix() -> Vec<Workload> {
    let w = |name, rows, txn_rows, payload, kind| Workload {
        name,
        rows,
        txn_rows,
        payload,
        kind,
    };
    vec![
        w("backlog-1k", 200_000, 100, 1024, Kind::Jsonb),
        w("backlog-100b", 200_000, 100, 100, Kind::Jsonb),
        // 16 KB rows: 20,000 of them (~330 MB) keep the raw producer's in-memory copy and the
        // broker's storage bounded; rows/s and MB/s are per row and per byte either way.
        w("backlog-16k", 20_000, 100, 16 * 1024, Kind::Jsonb),
        w("bytea-1k", 200_000, 100, 1024, Kind::Bytea),
        // 200,000 single-row transactions, as issue 15 states its targets: with 50,000 the
        // drain took ~0.7 s, of which start-up (~0.1 s) was a seventh.
        w("single-row-txns", 200_000, 1, 1024, Kind::Jsonb),
        w("one-1m-txn", 1_000_000, u64::MAX, 100, Kind::Jsonb),
    ]
}

/// Workloads run only when named (`--workloads`), for questions the matrix does not ask.
pub fn extras() -> Vec<Workload> {
    vec![
        // 256 KB rows: since round 28 the reader moves a message it has partly read into a
        // chunk of up to 1 MiB (`ferry_wal::frame::room_for`); this is the peak RSS of such
        // rows, with the broker stalled or not. 1,000 of them are ~260 MB.
        Workload {
            name: "backlog-256k",
            rows: 1_000,
            txn_rows: 10,
            payload: 256 * 1024,
            kind: Kind::Jsonb,
        },
    ]
}

impl Workload {
    /// The same shape with `scale` times the rows (at least one transaction's worth).
    pub fn scaled(&self, scale: f64) -> Workload {
        let rows = ((self.rows as f64 * scale).round() as u64).max(1);
        Workload {
            rows,
            ..self.clone()
        }
    }

    /// "200,000 rows in 100-row transactions, ~1 KB jsonb".
    pub fn describe(&self) -> String {
        let txns = if self.txn_rows >= self.rows {
            "one transaction".to_string()
        } else if self.txn_rows == 1 {
            "single-row transactions".to_string()
        } else {
            format!("{}-row transactions", self.txn_rows)
        };
        format!(
            "{} rows in {txns}, ~{} {}",
            thousands(self.rows),
            size(self.payload),
            self.kind.sql_type()
        )
    }

    /// The outbox table (and the relay's index), for a fresh database.
    pub fn ddl(&self) -> String {
        format!(
            "CREATE TABLE outbox (
                seq bigint GENERATED ALWAYS AS IDENTITY,
                id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
                aggregatetype text NOT NULL,
                aggregateid text NOT NULL,
                type text NOT NULL,
                payload {} NOT NULL,
                published_at timestamptz
            ) WITH (autovacuum_enabled = false);
            CREATE INDEX outbox_unpublished ON outbox (seq) WHERE published_at IS NULL;",
            self.kind.sql_type()
        )
    }

    /// `INSERT` of rows `$1..=$2` (bigint) in one statement.
    fn insert_sql(&self) -> String {
        let payload = match self.kind {
            // Object overhead ~45 bytes, each item ~55.
            Kind::Jsonb => {
                let items = (self.payload.saturating_sub(45) as f64 / 55.0).round() as usize;
                format!(
                    "jsonb_build_object('seq', g, 'status', 'paid', 'items', \
                       (SELECT coalesce(jsonb_agg(jsonb_build_object('sku', md5(g::text || '/' || i), 'qty', i)), '[]'::jsonb) \
                        FROM generate_series(1, {items}) i))"
                )
            }
            Kind::Bytea => {
                let md5s = self.payload.div_ceil(16);
                format!(
                    "substring((SELECT decode(string_agg(md5(g::text || '/' || i), ''), 'hex') \
                       FROM generate_series(1, {md5s}) i) FROM 1 FOR {})",
                    self.payload
                )
            }
        };
        format!(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
             SELECT 'order', 'o-' || (g % 1000), 'OrderUpdated', {payload} \
             FROM generate_series($1::bigint, $2::bigint) g"
        )
    }

    /// Writes the backlog: `rows` rows in transactions of `txn_rows`, pipelined over one
    /// connection (each statement its own transaction). Returns how long it took.
    pub async fn insert(&self, sql: &tokio_postgres::Client) -> Res<Duration> {
        let start = Instant::now();
        let stmt = sql.prepare(&self.insert_sql()).await?;
        let txn = self.txn_rows.min(self.rows);
        let ranges = (0..self.rows.div_ceil(txn)).map(|i| {
            let first = i * txn;
            (first as i64, (first + txn).min(self.rows) as i64 - 1)
        });
        stream::iter(ranges)
            .map(|(a, b)| {
                let stmt = &stmt;
                async move { sql.execute(stmt, &[&a, &b]).await }
            })
            .buffer_unordered(8)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(start.elapsed())
    }

    /// Writes `rows` rows starting at `first`, in one transaction (for the steady-rate writer).
    pub async fn insert_one_txn(
        &self,
        sql: &tokio_postgres::Client,
        first: u64,
        rows: u64,
    ) -> Res<()> {
        sql.execute(
            &self.insert_sql(),
            &[&(first as i64), &((first + rows) as i64 - 1)],
        )
        .await?;
        Ok(())
    }
}

/// Payload bytes of every row (as Kafka receives them) and rows in the table.
pub async fn measure(sql: &tokio_postgres::Client, kind: Kind) -> Res<(u64, u64)> {
    let row = sql
        .query_one(
            &format!(
                "SELECT count(*)::bigint, coalesce(sum(octet_length({})), 0)::bigint FROM outbox",
                kind.payload_bytes_expr()
            ),
            &[],
        )
        .await?;
    Ok((row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64))
}

/// 1234567 → "1,234,567".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// 100 → "100 B", 1024 → "1 KB", 16384 → "16 KB".
pub fn size(bytes: usize) -> String {
    if bytes >= 1024 && bytes % 1024 == 0 {
        format!("{} KB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_like_prose() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_000_000), "1,000,000");
        assert_eq!(size(100), "100 B");
        assert_eq!(size(16 * 1024), "16 KB");
    }

    #[test]
    fn workloads_describe_their_transactions() {
        let m = matrix();
        assert_eq!(
            m[0].describe(),
            "200,000 rows in 100-row transactions, ~1 KB jsonb"
        );
        let one = m.iter().find(|w| w.name == "one-1m-txn").unwrap();
        assert_eq!(
            one.describe(),
            "1,000,000 rows in one transaction, ~100 B jsonb"
        );
        assert_eq!(one.scaled(0.01).rows, 10_000);
        assert_eq!(one.scaled(0.0).rows, 1);
    }
}
