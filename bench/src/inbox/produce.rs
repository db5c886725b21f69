//! The records `ferry inbox` is measured on: ~1 KB JSON events as `ferry run` makes them (key =
//! the aggregate id, spread over 1,000 keys; headers `id`, a UUID-shaped event id, and `type`;
//! the payload the jsonb text), produced with Ferry's own producer properties (lz4, idempotence,
//! `acks=all`) to a topic of 6 partitions: as a backlog, as fast as the broker takes them, or
//! at a steady rate.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_testkit::faults::Rng;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use crate::{kafka, Res};

/// Keys the records are spread over.
const KEYS: u64 = 1_000;

/// Makes the records: the same sequence for the same seed.
pub struct Records {
    rng: Rng,
    template: String,
}

impl Records {
    pub fn new(seed: u64) -> Records {
        // The latency runs' ~1 KB event (17 items with md5-like hex skus), its `seq` replaced.
        let template = crate::latency::steady_payload().to_string();
        Records {
            rng: Rng::new(seed),
            template,
        }
    }

    /// Record number `n`: (event id, key, payload).
    pub fn make(&mut self, n: u64) -> (String, String, String) {
        let (a, b) = (self.rng.next_u64(), self.rng.next_u64());
        let id = format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            0x8000 | (b >> 48) & 0x3fff,
            b & 0xffff_ffff_ffff
        );
        let key = format!("o-{}", self.rng.below(KEYS));
        let payload = self
            .template
            .replacen("\"seq\":0", &format!("\"seq\":{n}"), 1);
        (id, key, payload)
    }
}

#[derive(Default)]
pub struct Counts {
    pub acked: AtomicU64,
    pub failed: AtomicU64,
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

fn producer(brokers: &str) -> Res<ThreadedProducer<Counts>> {
    Ok(kafka::client_config(brokers, "ferry-bench-inbox")?
        // A backlog is written as fast as the broker takes it: bigger batches than Ferry's.
        .set("linger.ms", "5")
        .create_with_context(Counts::default())?)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Hands a record to librdkafka, waiting while its queue is full.
fn send(p: &ThreadedProducer<Counts>, topic: &str, id: &str, key: &str, payload: &str) -> Res<()> {
    let headers = OwnedHeaders::new_with_capacity(2)
        .insert(Header {
            key: "id",
            value: Some(id),
        })
        .insert(Header {
            key: "type",
            value: Some("OrderUpdated"),
        });
    let mut rec = BaseRecord::to(topic)
        .key(key)
        .payload(payload)
        .headers(headers)
        .timestamp(now_ms());
    loop {
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                rec = r;
                std::thread::sleep(Duration::from_micros(200));
            }
            Err((e, _)) => return Err(format!("produce: {e}").into()),
        }
    }
}

fn finish(p: &ThreadedProducer<Counts>, sent: u64) -> Res<()> {
    p.flush(Duration::from_secs(600))
        .map_err(|e| format!("flush: {e}"))?;
    let (acked, failed) = (
        p.context().acked.load(Ordering::Relaxed),
        p.context().failed.load(Ordering::Relaxed),
    );
    if acked != sent || failed != 0 {
        return Err(format!("{acked} of {sent} records acknowledged, {failed} failed").into());
    }
    Ok(())
}

/// Produces records `first..first + n` to `topic` as fast as the broker takes them; returns the
/// time it took.
pub async fn backlog(brokers: &str, topic: &str, seed: u64, first: u64, n: u64) -> Res<Duration> {
    let p = producer(brokers)?;
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || -> Res<Duration> {
        let mut recs = Records::new(seed ^ first);
        let start = Instant::now();
        for i in first..first + n {
            let (id, key, payload) = recs.make(i);
            send(&p, &topic, &id, &key, &payload)?;
        }
        finish(&p, n)?;
        Ok(start.elapsed())
    })
    .await?
}

/// A producer writing `rate` records/s to `topic` from a thread of its own until `stop`.
pub struct Steady {
    thread: std::thread::JoinHandle<Res<u64>>,
}

impl Steady {
    pub fn start(
        brokers: &str,
        topic: &str,
        seed: u64,
        rate: u64,
        stop: Arc<AtomicBool>,
    ) -> Res<Steady> {
        let p = producer(brokers)?;
        let topic = topic.to_string();
        let thread = std::thread::Builder::new()
            .name("bench-steady-producer".into())
            .spawn(move || -> Res<u64> {
                let mut recs = Records::new(seed);
                let start = Instant::now();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Records due by now; then a short sleep (1 ms granularity).
                    let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
                    while n < due {
                        let (id, key, payload) = recs.make(n);
                        send(&p, &topic, &id, &key, &payload)?;
                        n += 1;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                finish(&p, n)?;
                Ok(n)
            })?;
        Ok(Steady { thread })
    }

    /// Waits for the producer to stop (after `stop` was set) and every record's acknowledgement.
    pub async fn join(self) -> Res<u64> {
        tokio::task::spawn_blocking(move || self.thread.join())
            .await?
            .map_err(|_| "the steady producer panicked")?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_a_kilobyte_of_json_with_uuid_shaped_ids() {
        let mut r = Records::new(1);
        let (id, key, payload) = r.make(12345);
        assert_eq!(id.len(), 36, "{id}");
        assert!(key.starts_with("o-"));
        let v: serde_json::Value = serde_json::from_str(&payload).unwrap();
        assert_eq!(v["seq"], 12345);
        assert!((900..1100).contains(&payload.len()), "{}", payload.len());
        let (id2, _, _) = r.make(12346);
        assert_ne!(id, id2);
        assert_eq!(Records::new(1).make(12345).0, id);
    }
}
