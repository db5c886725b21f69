//! Ferry: the pipeline from the replication slot to Kafka.
pub mod telemetry;
pub mod watermark;
