//! Ferry's test harness: real servers for real tests.
//!
//! - [`pg`]: a throwaway PostgreSQL cluster with `wal_level=logical` (or `FERRY_TEST_PG_URL`),
//!   one database per test.
//! - [`kafka`] (feature `kafka`): a Kafka-protocol broker (or `FERRY_TEST_KAFKA_BROKERS`), topic
//!   creation, and reading records back.
//! - [`debezium`] (feature `kafka`): Kafka Connect standalone with Debezium's PostgreSQL
//!   connector and Outbox Event Router, the oracle of the parity tests and the benchmark's rival.
//! - [`acl`] (feature `kafka`): ACLs for the `SASL_SSL` listener of a secured local broker.
//! - [`proxy`]: a TCP fault proxy (reset, blackhole, delay, throttle) in front of PostgreSQL or
//!   a broker; [`faults`]: fault schedules from a seed, for chaos runs.
//! - [`process`]: children that die with the test process, free ports, condition waits with
//!   deadlines.

#[cfg(feature = "kafka")]
pub mod acl;
#[cfg(feature = "kafka")]
pub mod debezium;
pub mod faults;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod pg;
pub mod process;
pub mod proxy;

pub use process::{wait_for, wait_until};
