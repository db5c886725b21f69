//! Ferry: the pipeline from the replication slot to Kafka.
pub mod authz;
pub mod broker_apis;
pub mod check;
pub mod cli;
pub mod config;
pub mod debezium;
pub mod kafka_access;
pub mod kafka_client;
pub mod malloc;
pub mod pipeline;
pub mod producer;
pub mod progress_topic;
pub mod replay;
pub mod stdio;
pub mod telemetry;
pub mod topics;
pub mod txn_probe;
