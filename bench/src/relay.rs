//! Contender 4, what people build instead of CDC: a polling relay over the same outbox table.
//!
//! Written the way a careful team would write it: one worker (more would break per-aggregate
//! order), a partial index on `seq WHERE published_at IS NULL` so each poll is an index range
//! scan, prepared statements, a batch of up to `batch` rows per transaction, every record of
//! the batch handed to the producer before waiting for any acknowledgement, and the `UPDATE`
//! only after all of them are durable:
//!
//! ```sql
//! BEGIN;
//! SELECT seq, id::text, aggregateid, type, payload FROM outbox WHERE published_at IS NULL
//!   ORDER BY seq LIMIT 1000 FOR UPDATE SKIP LOCKED;
//! -- produce all, wait for every ack
//! UPDATE outbox SET published_at = now() WHERE seq = ANY($1) AND published_at IS NULL;
//! COMMIT;
//! ```
//!
//! It produces the same records as Ferry with Ferry's producer settings, and is measured from
//! its first poll until a poll finds nothing left. The table's autovacuum is off during the
//! benchmark (so no contender pays for another's dead rows), which spares the relay the vacuum
//! it would need in production. CPU is this process's (the relay's client side, not
//! PostgreSQL's work for it).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio_postgres::types::Type;

use crate::workload::Kind;
use crate::{kafka, procfs, Res, Sample};

/// Rows per poll.
pub const BATCH: i64 = 1000;

pub async fn publish_all(
    db_url: &str,
    brokers: &str,
    kind: Kind,
    topic_suffix: &str,
    rows: u64,
) -> Res<Sample> {
    let mut sql = ferry_testkit::pg::connect(db_url).await;
    let producer: FutureProducer = kafka::client_config(brokers, "ferry-bench-relay")?.create()?;
    kafka::warm_up(&producer).await?;
    let poll = sql
        .prepare_typed(
            &format!(
                "SELECT seq, id::text, aggregatetype, aggregateid, type, {} FROM outbox \
                 WHERE published_at IS NULL ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED",
                kind.payload_bytes_expr()
            ),
            &[Type::INT8],
        )
        .await?;
    let mark = sql
        .prepare(
            "UPDATE outbox SET published_at = now() WHERE seq = ANY($1) AND published_at IS NULL",
        )
        .await?;
    let cpu = procfs::self_cpu_seconds();
    let start = Instant::now();
    let mut published = 0u64;
    loop {
        let tx = sql.transaction().await?;
        let batch = tx.query(&poll, &[&BATCH]).await?;
        if batch.is_empty() {
            tx.commit().await?;
            break;
        }
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let mut seqs = Vec::with_capacity(batch.len());
        let mut acks = Vec::with_capacity(batch.len());
        for row in &batch {
            seqs.push(row.get::<_, i64>(0));
            let (id, aggregate_type, key, kind): (&str, &str, &str, &str) =
                (row.get(1), row.get(2), row.get(3), row.get(4));
            let payload: &[u8] = row.get(5);
            let topic = format!("{aggregate_type}.{topic_suffix}");
            let headers = OwnedHeaders::new_with_capacity(2)
                .insert(Header {
                    key: "id",
                    value: Some(id),
                })
                .insert(Header {
                    key: "type",
                    value: Some(kind),
                });
            let record = FutureRecord::to(&topic)
                .key(key)
                .payload(payload)
                .headers(headers)
                .timestamp(now_ms);
            // A batch is far below librdkafka's queue limit: a refusal is an error.
            let ack = producer
                .send_result(record)
                .map_err(|(e, _)| format!("relay: producer refused a record: {e}"))?;
            acks.push(ack);
        }
        for ack in acks {
            ack.await?
                .map_err(|(e, _)| format!("relay: delivery failed: {e}"))?;
        }
        tx.execute(&mark, &[&seqs]).await?;
        tx.commit().await?;
        published += seqs.len() as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = procfs::self_cpu_seconds() - cpu;
    if published != rows {
        return Err(format!("relay published {published} rows, expected {rows}").into());
    }
    Ok(Sample {
        secs,
        cpu: Some(cpu),
        ..Sample::default()
    })
}
