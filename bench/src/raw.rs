//! Contender 2, the broker/client limit: the backlog's records produced by rdkafka from memory.
//!
//! The rows are read from the outbox table before the clock starts and turned into the records
//! Ferry's router makes of them with the default configuration (key = `aggregateid`, headers
//! `id` and `type`, value = the payload as stored: jsonb text, raw bytea; one topic with as many
//! partitions as Ferry's). A producer with Ferry's properties is warmed up (its producer id
//! fetched), then the clock runs from the first send to the last acknowledgement. CPU is this
//! process's, which during the run is the producer's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use crate::workload::Kind;
use crate::{kafka, procfs, Res, Sample};

/// One record, as Ferry's router would make it.
struct Rec {
    id: String,
    key: String,
    kind: String,
    payload: Vec<u8>,
}

/// Reads the backlog into memory, in insertion order.
async fn load(sql: &tokio_postgres::Client, kind: Kind) -> Res<Vec<Rec>> {
    let rows = sql
        .query(
            &format!(
                "SELECT id::text, aggregateid, type, {} FROM outbox ORDER BY seq",
                kind.payload_bytes_expr()
            ),
            &[],
        )
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| Rec {
            id: r.get(0),
            key: r.get(1),
            kind: r.get(2),
            payload: r.get(3),
        })
        .collect())
}

#[derive(Default)]
struct Counts {
    acked: AtomicU64,
    failed: AtomicU64,
}

impl ClientContext for Counts {}

impl ProducerContext for Counts {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        match r {
            Ok(_) => self.acked.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.failed.fetch_add(1, Ordering::Relaxed),
        };
    }
}

pub async fn produce(
    sql: &tokio_postgres::Client,
    brokers: &str,
    kind: Kind,
    topic: &str,
) -> Res<Sample> {
    let recs = load(sql, kind).await?;
    let producer: ThreadedProducer<Counts> =
        kafka::client_config(brokers, "ferry-bench-raw")?.create_with_context(Counts::default())?;
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || run(&producer, &recs, &topic))
        .await?
        .map_err(|e| e.to_string().into())
}

fn run(p: &ThreadedProducer<Counts>, recs: &[Rec], topic: &str) -> Result<Sample, String> {
    // Warm up: the producer id, and metadata for the warm-up topic.
    send(
        p,
        BaseRecord::to(kafka::WARMUP_TOPIC).key("w").payload("{}"),
    )?;
    p.flush(Duration::from_secs(30))
        .map_err(|e| format!("warm-up: {e}"))?;
    let warm = p.context().acked.load(Ordering::Relaxed);
    let cpu = procfs::self_cpu_seconds();
    let start = Instant::now();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    for r in recs {
        let headers = OwnedHeaders::new_with_capacity(2)
            .insert(Header {
                key: "id",
                value: Some(&r.id),
            })
            .insert(Header {
                key: "type",
                value: Some(&r.kind),
            });
        let rec = BaseRecord::to(topic)
            .key(&r.key)
            .payload(&r.payload[..])
            .headers(headers)
            .timestamp(now_ms);
        send(p, rec)?;
    }
    p.flush(Duration::from_secs(600))
        .map_err(|e| format!("flush: {e}"))?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = procfs::self_cpu_seconds() - cpu;
    let (acked, failed) = (
        p.context().acked.load(Ordering::Relaxed) - warm,
        p.context().failed.load(Ordering::Relaxed),
    );
    if acked != recs.len() as u64 || failed != 0 {
        return Err(format!(
            "raw produce: {acked} of {} records acknowledged, {failed} failed",
            recs.len()
        ));
    }
    Ok(Sample {
        secs,
        cpu: Some(cpu),
        ..Sample::default()
    })
}

/// Hands a record to librdkafka, waiting while its queue is full (backpressure).
fn send<K, P>(p: &ThreadedProducer<Counts>, mut rec: BaseRecord<'_, K, P, ()>) -> Result<(), String>
where
    K: rdkafka::message::ToBytes + ?Sized,
    P: rdkafka::message::ToBytes + ?Sized,
{
    loop {
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                rec = r;
                // The producer's own thread serves delivery reports; give it the queue back.
                std::thread::sleep(Duration::from_micros(200));
            }
            Err((e, _)) => return Err(format!("raw produce: {e}")),
        }
    }
}
