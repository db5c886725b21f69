//! Every default and limit of Ferry's own configuration sections, in one place. (`[outbox]` and
//! `[route]` keep theirs in `ferry_router::config`.)

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use crate::config::kafka::Compression;
use crate::telemetry::LogFormat;

// [postgres]
/// `postgres.slot`: the logical replication slot Ferry reads.
pub const SLOT: &str = "ferry";
/// `postgres.publication`: the publication the slot is read through (pgoutput `publication_names`).
pub const PUBLICATION: &str = "ferry_outbox";
/// `postgres.create_slot`: create the slot at startup when it does not exist.
pub const CREATE_SLOT: bool = true;
/// `postgres.create_publication`: create the publication (for the outbox table) when missing.
pub const CREATE_PUBLICATION: bool = true;
/// `postgres.failover_slot`: off, as Debezium's `slot.failover`; needs PostgreSQL 17.
pub const FAILOVER_SLOT: bool = false;
/// `postgres.status_interval`: standby status update cadence, the reader's own default.
pub const STATUS_INTERVAL: Duration = ferry_wal::conn::stream::DEFAULT_STATUS_INTERVAL;
/// Upper limit of `postgres.status_interval`: half of PostgreSQL's default `wal_sender_timeout`
/// (60s), after which the server drops a client that sent no status update.
pub const MAX_STATUS_INTERVAL: Duration = Duration::from_secs(30);
/// `postgres.receive_timeout`: how long the server may send nothing on the replication
/// connection before it is taken for lost (PostgreSQL's own `wal_receiver_timeout`), and may
/// leave a query of a session's set-up unanswered ([`ferry_wal::conn::answered`]).
pub const RECEIVE_TIMEOUT: Duration = ferry_wal::conn::stream::DEFAULT_RECEIVE_TIMEOUT;
/// `postgres.connect_timeout`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// `postgres.reconnect_backoff_min`: first delay after a transient failure.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(500);
/// `postgres.reconnect_backoff_max`: the delay doubles up to this.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// `postgres.standby_poll_interval`: how often a server in recovery is asked again.
pub const STANDBY_POLL_INTERVAL: Duration = Duration::from_secs(2);
/// `postgres.binary`: pgoutput's binary mode where it helps (bytea read raw, not as hex text);
/// measured on a 1 KB bytea backlog: 103k -> 134k rows/s, 0.79 -> 0.48 CPU-s per 100k rows.
pub const BINARY: bool = true;
/// Longest slot or publication name PostgreSQL keeps (`NAMEDATALEN - 1` bytes).
pub const MAX_NAME_BYTES: usize = 63;

// [kafka]
/// `kafka.compression`: lz4 compresses JSON well at little CPU cost, and every broker since
/// Kafka 0.10 reads it.
pub const COMPRESSION: Compression = Compression::Lz4;
/// `kafka.max_in_flight_records`: far above what the brokers' round trip needs (at 100,000
/// rows/s and 20 ms per acknowledgement, 2,000 are in flight), and small enough that librdkafka's
/// per-message memory stays low; measured: 100,000 here doubled peak RSS and ran no faster.
pub const MAX_IN_FLIGHT_RECORDS: u64 = 10_000;
/// `kafka.max_in_flight_bytes`: 16 MiB, the memory bound of records waiting for Kafka. Binds
/// only on rows above ~1.6 KB (10,000 records of 1 KB are 10 MiB). Measured (bench/README.md),
/// 16 KB rows with PostgreSQL on a core of its own, the window full while Ferry drains: peak RSS
/// 48-50 MiB against 65-67 with 32 MiB, at the same rate (two alternating sets of 5 runs: 100%
/// and 94% of `pg_recvlogical` from process start against 100% and 110%; 103% and 100% as a warm
/// standby against 103% and 101%). At 10 ms to the brokers, 16 MiB in flight still carries
/// 1.6 GB/s.
pub const MAX_IN_FLIGHT_BYTES: u64 = 16 * 1024 * 1024;
/// `kafka.delivery_timeout` (librdkafka `message.timeout.ms`): `0` (the default) means records
/// never time out: during a Kafka outage they wait in the in-flight window (bounded memory) and
/// are delivered in order when the brokers return. A finite value makes a record fail after it,
/// the watermark freeze and the pipeline restart from the checkpoint; but librdkafka then skips
/// the timed-out records and may deliver later ones of the same partition, so a consumer can see
/// a key's later event before the replayed earlier one (librdkafka INTRODUCTION.md, "Message
/// timeout considerations"). Per-key order therefore needs the default.
pub const DELIVERY_TIMEOUT: Duration = Duration::ZERO;
/// `kafka.linger` (librdkafka `linger.ms`): 1 ms, not librdkafka's 5. An outbox event is
/// usually waited for by another service, and a draining backlog fills batches while earlier
/// requests are in flight whatever the linger. Measured (bench/README.md): commit -> ack p50
/// 6.0 -> 1.8 ms and p99 10.0 -> 4.2 ms at 2,000 rows/s, p99 16.6 -> 8.6 ms at 10,000 rows/s;
/// the 100-byte-row backlog drains at the same rate and CPU.
pub const LINGER: Duration = Duration::from_millis(1);
/// `kafka.progress_topic`.
pub const PROGRESS_TOPIC: &str = "ferry.progress";
/// `kafka.exactly_once`: off; it needs brokers with transactions and consumers reading with
/// `isolation.level=read_committed`.
pub const EXACTLY_ONCE: bool = false;
/// `kafka.transaction_interval`: how long a Kafka transaction collects records at most before
/// it commits, and the pace of commits: no more than one an interval on average (a burst that
/// ends commits sooner, within that pace). Read-committed consumers see a record only after its
/// commit, so up to this is added to their latency in a steady stream; each commit costs a few
/// broker round trips, so shorter costs throughput.
pub const TRANSACTION_INTERVAL: Duration = Duration::from_millis(100);
/// `kafka.transaction_max_records`: a Kafka transaction commits at this many records even
/// before the interval. Must stay below half the in-flight window: the transactional sink holds
/// every report until its commit, and the window must never fill with held reports.
pub const TRANSACTION_MAX_RECORDS: u64 = 4_000;
/// `kafka.transaction_max_bytes`: likewise in record bytes (half the default window).
pub const TRANSACTION_MAX_BYTES: u64 = 8 * 1024 * 1024;
/// `transaction.timeout.ms` Ferry asks for: far above the interval (a commit waits for every
/// record of the transaction), and below the brokers' default `transaction.max.timeout.ms`
/// (15 minutes), which `ferry check` compares.
pub const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);
/// The shortest `kafka.transaction_interval`.
pub const MIN_TRANSACTION_INTERVAL: Duration = Duration::from_millis(1);
/// The longest: a tenth of the transaction timeout.
pub const MAX_TRANSACTION_INTERVAL: Duration = Duration::from_secs(6);
/// librdkafka's upper limit of `linger.ms`.
pub const MAX_LINGER: Duration = Duration::from_millis(900_000);
/// librdkafka's upper limit of `message.timeout.ms` (`i32::MAX` ms).
pub const MAX_DELIVERY_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);
/// librdkafka's upper limit of `queue.buffering.max.messages` and `queue.buffering.max.kbytes`.
pub const LIBRDKAFKA_QUEUE_LIMIT: u64 = i32::MAX as u64;
/// Upper limit of `kafka.max_in_flight_bytes`: half of librdkafka's queue limit (in KiB).
pub const MAX_IN_FLIGHT_BYTES_LIMIT: u64 = LIBRDKAFKA_QUEUE_LIMIT / 2 * 1024;
/// `client.id` unless `kafka.properties` sets one.
pub const CLIENT_ID: &str = "ferry";
/// librdkafka's `reconnect.backoff.ms` unless `kafka.properties` sets it (or
/// `reconnect.backoff.max.ms`): librdkafka's default is 100, the Java client's 50.
pub const RECONNECT_BACKOFF_MS: u32 = 20;
/// librdkafka's `reconnect.backoff.max.ms` unless `kafka.properties` sets it (or
/// `reconnect.backoff.ms`): librdkafka's default is 10,000, the Java client's 1,000. A broker
/// connection lost in an outage is tried again at this pace at most, and the records for the
/// partitions it leads wait for it: at librdkafka's default they were delivered 7.8–9.2 s after
/// an 8 s outage ended, at 1,000 0.7 s after (bench/README.md, round 41).
pub const RECONNECT_BACKOFF_MAX_MS: u32 = 1000;
/// librdkafka's `statistics.interval.ms` for the relay's producers unless `kafka.properties`
/// sets it: the brokers' view (`ferry_kafka_brokers_up`, `/readyz`) is this fresh.
pub const STATISTICS_INTERVAL_MS: u32 = 1000;
/// librdkafka's `message.copy.max.bytes` for the relay's producers unless `kafka.properties`
/// sets it: a larger value goes into a produce request by reference to librdkafka's own copy of
/// it (which lives until its delivery report anyway), not copied again. librdkafka's default,
/// 65,535, copied 16 KB rows a second time whenever the request's buffer had room.
pub const MESSAGE_COPY_MAX_BYTES: u32 = 4096;

// [http]
/// `http.listen`: loopback only; set `0.0.0.0:9187` (or `[::]:9187`) to expose it.
pub const HTTP_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9187));

// [log]
/// `log.format`.
pub const LOG_FORMAT: LogFormat = LogFormat::Text;
/// `log.level`.
pub const LOG_LEVEL: &str = "info";

// [shutdown]
/// `shutdown.drain_timeout`: how long shutdown waits for in-flight deliveries.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// librdkafka's `topic.metadata.propagation.max.ms`: how long a record for a topic the brokers
/// lack waits for the topic before its delivery fails (then the session reconnects and the
/// record is produced again). The topic watch reports the wait meanwhile. 30 minutes: librdkafka
/// accepts up to an hour, but multiplies the value by 1000 in a C `int`, so anything above
/// 2 147 483 ms overflows and fails such records at once (measured: 3 600 000 failed them in 1 s).
pub const TOPIC_WAIT_MS: u32 = 1_800_000;
