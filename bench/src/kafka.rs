//! The producer settings every Kafka contender shares: Ferry's own, taken from
//! [`ferry::config::KafkaConfig::producer_properties`] with its defaults (idempotence,
//! `acks=all`, lz4, `linger.ms=5`, `murmur2_random`, Ferry's queue limits), so the raw producer
//! and the polling relay cannot drift from what Ferry runs with.

use std::sync::OnceLock;
use std::time::Duration;

use ferry::config::{Brokers, KafkaConfig};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::Res;

/// Topic the producers warm up on before a clock starts.
pub const WARMUP_TOPIC: &str = "bench-warmup";
/// Partitions of every benchmark topic.
pub const PARTITIONS: i32 = 6;

static COMPRESSION: OnceLock<String> = OnceLock::new();

/// Sets the codec every contender produces with (`--compression`; Ferry's default otherwise).
pub fn set_compression(codec: &str) {
    let _ = COMPRESSION.set(codec.to_owned());
}

/// The codec of this run, as `kafka.compression` spells it.
pub fn compression() -> String {
    COMPRESSION
        .get()
        .cloned()
        .unwrap_or_else(|| KafkaConfig::default().compression.as_str().to_owned())
}

/// Ferry's producer configuration for `brokers`, with `client_id` and this run's codec.
pub fn client_config(brokers: &str, client_id: &str) -> Res<ClientConfig> {
    let kafka = KafkaConfig {
        brokers: brokers.parse::<Brokers>()?,
        compression: compression().parse()?,
        ..KafkaConfig::default()
    };
    let mut cc = ClientConfig::new();
    for (k, v) in kafka.producer_properties()? {
        cc.set(k, v);
    }
    cc.set("client.id", client_id);
    Ok(cc)
}

/// The topic a contender's records go to: `order.<workload>.<contender>`.
pub fn topic(workload: &str, contender: &str) -> String {
    format!("order.{workload}.{contender}")
}

/// Sends one record and waits for its acknowledgement: an idempotent producer's first send
/// waits for its producer id, which is start-up, not throughput.
pub async fn warm_up(p: &FutureProducer) -> Res<()> {
    let r = FutureRecord::<str, str>::to(WARMUP_TOPIC)
        .key("warm-up")
        .payload("{}");
    p.send(r, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| format!("warm-up record: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_produce_with_ferrys_settings() {
        let cc = client_config("127.0.0.1:1,127.0.0.1:2", "x").unwrap();
        assert_eq!(cc.get("bootstrap.servers"), Some("127.0.0.1:1,127.0.0.1:2"));
        assert_eq!(cc.get("enable.idempotence"), Some("true"));
        assert_eq!(cc.get("acks"), Some("all"));
        assert_eq!(cc.get("compression.codec"), Some("lz4"));
        assert_eq!(cc.get("linger.ms"), Some("1"));
        assert_eq!(cc.get("partitioner"), Some("murmur2_random"));
        assert_eq!(topic("backlog-1k", "raw"), "order.backlog-1k.raw");
    }
}
