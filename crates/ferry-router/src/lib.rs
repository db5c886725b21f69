//! Ferry's router: a pure function from an outbox row to a Kafka record.
