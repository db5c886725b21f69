//! Ferry: the pipeline from the replication slot to Kafka.
