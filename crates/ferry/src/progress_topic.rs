//! The progress topic, seen from Kafka: reading back where Ferry was, and creating the topic.
//!
//! What a progress record holds and why it exists is written in [`ferry_core::progress_record`]. This
//! module does the I/O: [`read`] finds the newest committed record of one slot and server, and
//! [`ensure_topic`] creates the topic (one partition, compacted) or checks the one that exists;
//! [`keeping`] judges what an existing topic's configuration keeps ([`describe_keeping`]).
//!
//! # Reading to the end
//!
//! The newest record is the last one of the key *at the end of the partition*, and the end must be
//! the real one: a transaction of a Ferry that crashed may still be open or its commit in flight,
//! and transaction markers sit at the tail, so the last offset is never trusted to be a record.
//! [`read`] therefore takes the high watermark first (the end of the log, transactions open or
//! not), then reads with `isolation.level=read_committed` from the beginning until its position
//! passes that watermark: every transaction that had written before the read began is then
//! decided (committed records are seen, aborted ones never are). The end comes from the broker's
//! ListOffsets, asked of the partition's leader, and not from the watermarks a fetch response
//! carries: right after a leader election the new leader's high watermark trails for a moment,
//! and ListOffsets says so (`OFFSET_NOT_AVAILABLE`, asked again until the deadline, then a
//! transient error) where a fetch answers with the trailing value, and a follower a consumer may
//! fetch from (`client.rack`) answers with its own; a read ending there could miss the newest
//! record. One client does it all: the reader asks ListOffsets itself, through librdkafka's
//! Admin API, at the isolation level the read needs (`read_uncommitted` for the high watermark,
//! `read_committed` for [`Until::Stable`]'s last stable offset) whatever its own, and the log's
//! start with it (past 0 once records were deleted); `list_offsets` says what librdkafka does
//! there. An exactly-once Ferry reads after `init_transactions`, which has aborted whatever its
//! previous incarnation left open, so the read does not wait for the transaction timeout. The
//! topic is compacted and small (one record per slot once compacted; segments roll every
//! [`SEGMENT_MS`]), so reading it whole at start-up is cheap.
//!
//! An exactly-once start reads the topic twice: to its last stable offset for the verdict,
//! before it may fence anyone, and to its end after fencing. The second read takes the first up
//! where it ended ([`read_slot_open`], [`Cursor`]): on the same client, from the first read's
//! position, with what it found standing, so that the topic is neither read whole again nor a
//! client made and connected for it.
//!
//! Every call is blocking (librdkafka's consumer); callers run it off the async runtime.

use std::time::{Duration, Instant};

use ferry_core::progress_record::{ProgressError, ProgressKey, ProgressRecord};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientContext;
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::kafka_client::{self, Role};

pub mod keeping;
mod list_offsets;

use list_offsets::Ends;

/// How often the progress topic's segments roll, so that compaction can drop old records.
///
/// Compaction never touches the active segment, and a start reads the topic whole: a busy Ferry
/// writes about five progress records a second (`ferry_core::session::remember::INTERVAL`), so
/// a segment holds up to ~3,000 of them at 10 minutes. At an hour (18,000 records, a batch
/// each) a restart took ~30 ms more than on an empty topic, 33 ms more of Ferry's CPU
/// (`ferry-bench --startup-fill`); with 3,000, within the spread. Once rolled, a segment is
/// cleaned at the cleaner's next pass: its records are nearly all dirty (one clean record per
/// key before them), far past `min.cleanable.dirty.ratio`.
pub const SEGMENT_MS: u64 = 10 * 60 * 1000;

/// One poll of the consumer while reading to the end.
const POLL: Duration = Duration::from_millis(100);

/// Why the progress topic could not be read or created.
#[derive(Debug, thiserror::Error)]
pub enum ProgressTopicError {
    #[error("cannot reach Kafka to read the progress topic {topic}: {error}")]
    Kafka { topic: String, error: KafkaError },
    #[error(
        "the progress topic {topic} has {partitions} partitions; Ferry needs exactly 1 (its records are ordered): delete it and let Ferry create it, or name another topic in kafka.progress_topic"
    )]
    Partitions { topic: String, partitions: usize },
    #[error(
        "the progress topic {topic} could not be read to its end within {}s (position {position}, end {end}): a transaction of another producer may be open on it; it ends within the broker's transaction timeout",
        timeout.as_secs()
    )]
    Timeout {
        topic: String,
        timeout: Duration,
        position: i64,
        end: i64,
    },
    #[error("the progress topic {topic} holds an unreadable record for {key} at offset {offset}: {error}")]
    Record {
        topic: String,
        key: String,
        offset: i64,
        error: ProgressError,
    },
    #[error(
        "the progress topic {topic} does not exist and Ferry may not create it: {error}. Create it with 1 partition, cleanup.policy=compact and segment.ms={segment_ms}, or grant Ferry CREATE on the cluster",
        segment_ms = SEGMENT_MS
    )]
    Create { topic: String, error: String },
    /// The broker refused Ferry's principal an operation on the topic (an ACL is missing): the
    /// message names it and the grant (`crate::authz`).
    #[error("{0}")]
    Denied(String),
}

/// `error` from a request about `topic`, as a [`ProgressTopicError`]: an authorization failure
/// is [`ProgressTopicError::Denied`] (permanent), anything else [`ProgressTopicError::Kafka`].
fn kafka_error(
    topic: &str,
    doing: &str,
    properties: &[(String, String)],
    error: KafkaError,
) -> ProgressTopicError {
    match crate::authz::authorization_code(&error) {
        Some(code) => ProgressTopicError::Denied(crate::authz::denied(
            code,
            doing,
            &crate::authz::Resource::ProgressTopic(topic.to_string()),
            properties,
        )),
        None => ProgressTopicError::Kafka {
            topic: topic.to_string(),
            error,
        },
    }
}

impl ProgressTopicError {
    /// Whether a later attempt can succeed without an operator.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ProgressTopicError::Kafka { .. } | ProgressTopicError::Timeout { .. }
        )
    }
}

/// What the progress topic holds for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remembered {
    /// The topic does not exist.
    NoTopic,
    /// The topic exists and holds no committed record for the key (or its newest is a tombstone).
    Nothing,
    /// The newest committed record for the key, and its offset.
    Record { record: ProgressRecord, offset: i64 },
}

/// The newest committed record of `key` in `topic`; see the [module documentation](self).
pub fn read(
    properties: &[(String, String)],
    topic: &str,
    key: &ProgressKey,
    timeout: Duration,
) -> Result<Remembered, ProgressTopicError> {
    let found = scan(properties, topic, timeout, Until::End, false, of_key(key))?;
    match found {
        None => Ok(Remembered::NoTopic),
        Some(found) => newest_of(topic, key, found.newest),
    }
}

/// The newest of `found` (every value of `key`'s encodings): two encodings of the key are two
/// keys to Kafka, and the newest of them counts.
fn newest_of(
    topic: &str,
    key: &ProgressKey,
    found: Vec<Found>,
) -> Result<Remembered, ProgressTopicError> {
    match found.into_iter().max_by_key(|(_, offset, _)| *offset) {
        None | Some((_, _, None)) => Ok(Remembered::Nothing),
        Some((_, offset, Some(value))) => {
            decode(topic, key, offset, &value).map(|record| Remembered::Record { record, offset })
        }
    }
}

/// A read of the progress topic kept open where it ended ([`read_slot_open`]), so that a later
/// read of one of its keys takes up only what came after ([`Cursor::read`]): exactly-once reads
/// the topic to its stable end for the verdict, then again to its end after fencing, and the
/// second read need not read the topic whole again (~1.9 ms per 1,000 records, a restart's
/// share of a busy segment) nor make, connect and point a client of its own (~5 ms).
pub struct Cursor {
    scan: Scan,
    topic: String,
    slot: String,
}

impl std::fmt::Debug for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cursor")
            .field("topic", &self.topic)
            .field("slot", &self.slot)
            .field("next", &self.scan.next)
            .finish()
    }
}

impl Cursor {
    /// [`read`] of `key`, from where the cursor's read ended: what the earlier read found of the
    /// key stands, and the records that came after it are read to the end of the log now (every
    /// transaction open then or since decided). A key of another slot or topic than the cursor
    /// read is read whole, as [`read`] does.
    pub fn read(
        mut self,
        properties: &[(String, String)],
        topic: &str,
        key: &ProgressKey,
        timeout: Duration,
    ) -> Result<Remembered, ProgressTopicError> {
        if topic != self.topic || key.slot != self.slot {
            return read(properties, topic, key, timeout);
        }
        let wanted = of_key(key);
        self.scan.newest.retain(|(k, _, _)| wanted(k));
        let deadline = Instant::now() + timeout;
        // Seen by the earlier read: a topic missing now is a transient answer (an error), not
        // "no record"; `None` does not come back.
        let Some(ends) = ends(&self.scan.consumer, topic, Until::End, deadline, true)
            .map_err(|e| e.error(topic, properties))?
        else {
            return Ok(Remembered::NoTopic);
        };
        // A log that ends before the earlier read did (truncated by an unclean leader election,
        // or the topic deleted and made again) is not the log it read: read whole.
        if ends.high < self.scan.next {
            tracing::debug!(
                end = ends.high,
                earlier = self.scan.next,
                "progress topic: the log ends before the earlier read did; reading it whole"
            );
            return read(properties, topic, key, timeout);
        }
        self.scan
            .drain(properties, topic, ends, deadline, timeout, false, &wanted)?;
        newest_of(topic, key, self.scan.newest)
    }
}

/// Where a read of the progress topic ends (see [`read_slot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// The end of the log: every open transaction is waited for.
    End,
    /// The last stable offset: open transactions are left undecided.
    Stable,
}

/// What the progress topic remembers of one slot, under every system identifier.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotHistory {
    /// Whether the topic exists.
    pub topic_exists: bool,
    /// The newest committed record per system identifier (tombstoned keys left out).
    pub records: Vec<(u64, ProgressRecord)>,
}

impl SlotHistory {
    /// In the verdict's terms, seen from the server with `system_id`.
    pub fn remembered(&self, system_id: u64) -> ferry_core::verdict::Remembered {
        let mut r = ferry_core::verdict::Remembered::default();
        for (id, record) in &self.records {
            if *id == system_id {
                r.this_system = Some(record.clone());
            } else {
                r.other_systems.push((*id, record.clone()));
            }
        }
        r
    }
}

/// Every server's newest committed record of `slot` (to see that the slot's server changed).
///
/// `until` says where the read ends: [`Until::End`] waits for every transaction open on the
/// topic to be decided (as [`read`] does); [`Until::Stable`] stops at the last stable offset,
/// before any open transaction. An exactly-once Ferry compares the slot with its progress before
/// it may fence the producer that left a transaction open, and a committed record it cannot see
/// yet can only be ahead of the slot (its slot is confirmed after its commit), never hide a gap;
/// it reads the exact position again after fencing.
pub fn read_slot(
    properties: &[(String, String)],
    topic: &str,
    slot: &str,
    timeout: Duration,
    until: Until,
) -> Result<SlotHistory, ProgressTopicError> {
    let found = scan(properties, topic, timeout, until, false, of_slot(slot))?;
    match found {
        Some(found) => slot_history(topic, &found.newest),
        None => Ok(SlotHistory::default()),
    }
}

/// [`read_slot`], and the read kept open where it ended (`None`: no topic), for a later read of
/// one of the slot's keys ([`Cursor::read`]).
pub fn read_slot_open(
    properties: &[(String, String)],
    topic: &str,
    slot: &str,
    timeout: Duration,
    until: Until,
) -> Result<(SlotHistory, Option<Cursor>), ProgressTopicError> {
    let found = scan(properties, topic, timeout, until, true, of_slot(slot))?;
    let Some(found) = found else {
        return Ok((SlotHistory::default(), None));
    };
    let history = slot_history(topic, &found.newest)?;
    let cursor = Cursor {
        scan: found,
        topic: topic.to_string(),
        slot: slot.to_string(),
    };
    Ok((history, Some(cursor)))
}

/// What a read of one slot's keys found, newest per system identifier.
fn slot_history(topic: &str, found: &[Found]) -> Result<SlotHistory, ProgressTopicError> {
    // Newest per system identifier (two encodings of a key are two keys to Kafka).
    let mut newest: Vec<(ProgressKey, i64, Option<&Vec<u8>>)> = Vec::new();
    for (key, offset, value) in found {
        let (offset, value) = (*offset, value.as_ref());
        let key = ProgressKey::decode(key).expect("the filter decoded it");
        match newest.iter_mut().find(|(k, _, _)| *k == key) {
            Some(e) if e.1 < offset => *e = (key, offset, value),
            Some(_) => {}
            None => newest.push((key, offset, value)),
        }
    }
    let mut records = Vec::new();
    for (key, offset, value) in newest {
        let Some(value) = value else { continue };
        records.push((key.system_id, decode(topic, &key, offset, value)?));
    }
    records.sort_by_key(|(id, _)| *id);
    Ok(SlotHistory {
        topic_exists: true,
        records,
    })
}

fn decode(
    topic: &str,
    key: &ProgressKey,
    offset: i64,
    value: &[u8],
) -> Result<ProgressRecord, ProgressTopicError> {
    ProgressRecord::decode(value).map_err(|error| ProgressTopicError::Record {
        topic: topic.to_string(),
        key: key.to_string(),
        offset,
        error,
    })
}

/// A key's bytes as read, the offset of its newest committed value, and that value (`None`: a
/// tombstone).
type Found = (Vec<u8>, i64, Option<Vec<u8>>);

/// A read of the progress topic: its client, where it ended, and what it found.
struct Scan {
    consumer: Disposed<BaseConsumer<Reader>>,
    /// The offset after the last one read: every committed record below it was read, so a
    /// later read takes up from here ([`Cursor`]).
    next: i64,
    /// The consumer is assigned the partition (between reads, its position is `next`).
    assigned: bool,
    /// Its fetching is paused (a read ended; see [`Scan::drain`]).
    paused: bool,
    /// The newest committed value (and its offset) of every key the read accepted, in the
    /// order keys were first seen.
    newest: Vec<Found>,
}

/// Why the ends of the partition are not known.
enum Ended {
    Kafka(KafkaError),
    Topic(ProgressTopicError),
}

impl Ended {
    fn error(self, topic: &str, properties: &[(String, String)]) -> ProgressTopicError {
        match self {
            Ended::Kafka(e) => kafka_error(topic, "reading the progress topic", properties, e),
            Ended::Topic(e) => e,
        }
    }
}

/// The newest committed value (and its offset) of every key `wanted` accepts, read to the end
/// of the partition; `None` if the topic does not exist. `keep`: the read is to be taken up
/// ([`Cursor`]).
fn scan(
    properties: &[(String, String)],
    topic: &str,
    timeout: Duration,
    until: Until,
    keep: bool,
    wanted: impl Fn(&[u8]) -> bool,
) -> Result<Option<Scan>, ProgressTopicError> {
    let deadline = Instant::now() + timeout;
    let kafka = |error| kafka_error(topic, "reading the progress topic", properties, error);
    // Reads from the beginning with read_committed, commits nothing, creates no topic.
    let cc = kafka_client::config(properties, Role::ProgressReader);
    let consumer = Disposed::new(
        cc.create_with_context::<_, BaseConsumer<Reader>>(Reader)
            .map_err(kafka)?,
    );
    let ends =
        ends(&consumer, topic, until, deadline, false).map_err(|e| e.error(topic, properties))?;
    let Some(ends) = ends else {
        return Ok(None);
    };
    let mut scan = Scan {
        consumer,
        next: ends.low,
        assigned: false,
        paused: false,
        newest: Vec::new(),
    };
    scan.drain(properties, topic, ends, deadline, timeout, keep, &wanted)?;
    Ok(Some(scan))
}

/// The partition's ends (`None`: no topic); `until` says which end is the high one. `seen`: an
/// earlier answer showed the topic, so an answer without it is transient, not "no topic".
fn ends(
    consumer: &BaseConsumer<Reader>,
    topic: &str,
    until: Until,
    deadline: Instant,
    mut seen: bool,
) -> Result<Option<Ends>, Ended> {
    // The end of the log, open transactions included (the high watermark), or for a read to
    // the stable end the last stable offset: asked with ListOffsets at that isolation level,
    // whatever the reader's own.
    let isolation = match until {
        Until::End => list_offsets::Isolation::ReadUncommitted,
        Until::Stable => list_offsets::Isolation::ReadCommitted,
    };
    // A topic seen once and then missing from a later answer (a broker whose metadata lags,
    // in the turmoil that made ListOffsets fail) is no proof the topic is gone: that answer is
    // a transient error, never "no topic" (which would read as no record).
    loop {
        // The topic's metadata first: it also puts the partition's leader in the client's
        // metadata cache, where ListOffsets looks it up. The leader must be known before
        // ListOffsets is asked: a lookup of its own made before the client has a connection up
        // skips its metadata request ("no usable brokers") and then waits for other metadata
        // to arrive or for its 3 s query timer (librdkafka's
        // `rd_kafka_topic_partition_list_query_leaders_async`). The second client's watermark
        // query, which this replaces, asked again only after a growing interval (100, 200,
        // 300 ms, ...): about one start in thirty waited ~700 ms until its end client asked
        // for the metadata first. This request waits for a connection.
        let metadata = until_deadline(deadline, || {
            consumer.fetch_metadata(Some(topic), remaining(deadline))
        })
        .map_err(Ended::Kafka)?;
        let shape = match metadata.topics().iter().find(|t| t.name() == topic) {
            Some(t) => TopicShape::of(t.error().map(RDKafkaErrorCode::from), t.partitions().len()),
            None => TopicShape::Missing,
        };
        match shape {
            TopicShape::Partitions(1) => seen = true,
            TopicShape::Missing if seen => {
                return Err(Ended::Kafka(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::UnknownTopicOrPartition,
                )))
            }
            TopicShape::Missing => return Ok(None),
            TopicShape::Partitions(partitions) => {
                return Err(Ended::Topic(ProgressTopicError::Partitions {
                    topic: topic.to_string(),
                    partitions,
                }))
            }
            TopicShape::Settling => {
                return Err(Ended::Kafka(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::LeaderNotAvailable,
                )))
            }
            TopicShape::Failed(code) => return Err(Ended::Kafka(KafkaError::MetadataFetch(code))),
        }
        match list_offsets::ends(consumer.client(), topic, isolation, deadline) {
            Ok(ends) => return Ok(Some(ends)),
            // A broker unreachable (as in `until_deadline`), the partition's leader being
            // elected or just elected, or a call past its own timeout (`CALL_TIMEOUT`, shorter
            // than the read's): asked again, with fresh metadata, until the deadline; then its
            // error, transient.
            Err(e)
                if (connection_trouble(&e)
                    || list_offsets::leader_moving(&e)
                    || list_offsets::timed_out(&e))
                    && Instant::now() + POLL < deadline =>
            {
                tracing::debug!(error = %e, "progress topic: ListOffsets failed; asking again");
                std::thread::sleep(POLL);
            }
            Err(e) => return Err(Ended::Kafka(e)),
        }
    }
}

impl Scan {
    /// Reads from where the scan ended (or the log's start, if past it) until its position
    /// passes `high`, keeping the newest value of every key `wanted` accepts. `keep`: the read
    /// is to be taken up (its fetching is paused when it ends).
    #[allow(clippy::too_many_arguments)]
    fn drain(
        &mut self,
        properties: &[(String, String)],
        topic: &str,
        Ends { low, high }: Ends,
        deadline: Instant,
        timeout: Duration,
        keep: bool,
        wanted: &dyn Fn(&[u8]) -> bool,
    ) -> Result<(), ProgressTopicError> {
        let kafka = |error| kafka_error(topic, "reading the progress topic", properties, error);
        // Records deleted since the last read (below the log's start) are gone; what it found
        // of them stands.
        let from = self.next.max(low);
        if high <= from {
            self.next = from;
            return Ok(());
        }
        let consumer = &self.consumer;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Offset(from))
            .map_err(kafka)?;
        // A read taken up goes on from where the consumer stopped.
        if !self.assigned || from != self.next {
            consumer.assign(&tpl).map_err(kafka)?;
            self.assigned = true;
        }
        if self.paused {
            consumer.resume(&tpl).map_err(kafka)?;
            self.paused = false;
        }
        let newest = &mut self.newest;
        // Whether the last poll brought a record.
        let mut after_record = false;
        loop {
            // What ends the log after an exactly-once Ferry's last commit is a transaction
            // marker (and, after a Ferry killed in a transaction, that transaction's aborted
            // records), and no poll returns either: librdkafka moves the position past them and
            // waits on for a record until the poll's timeout (a restart waited 100 ms for
            // nothing). A poll right after a record does not wait: what came in the same fetch is
            // taken off the queue, and the position read below is past it. When nothing more had
            // come, the next poll waits as usual (one position read per fetch drained, not per
            // record).
            let wait = if after_record { Duration::ZERO } else { POLL };
            let polled = match consumer.poll(wait) {
                // One broker of several unreachable is news, not a failure: the client goes on
                // with the others (and the deadline below bounds the wait for all of them).
                Some(Err(e)) if connection_trouble(&e) => None,
                // The coordinator lookup of a group the reader does not use (see `Reader`) is no
                // error of the read.
                Some(Err(e))
                    if e.rdkafka_error_code()
                        == Some(RDKafkaErrorCode::GroupAuthorizationFailed) =>
                {
                    None
                }
                other => other,
            };
            let mut past_record = None;
            if let Some(m) = polled {
                let m = m.map_err(kafka)?;
                past_record = Some(m.offset() + 1);
                if let Some(k) = m.key().filter(|k| wanted(k)) {
                    let value = m.payload().map(<[u8]>::to_vec);
                    match newest.iter_mut().find(|(seen, _, _)| seen.as_slice() == k) {
                        Some(entry) => *entry = (k.to_vec(), m.offset(), value),
                        None => newest.push((k.to_vec(), m.offset(), value)),
                    }
                }
            }
            // Past a record, the consumer's position is the offset after it. It is asked for
            // only after a poll that brought nothing (it also moves past transaction markers,
            // which no record stands for): asking after every record (librdkafka builds a list
            // of the assignment each time) cost a restart ~250 ms of CPU on 18,000 records, an
            // hour of progress records before the segment rolls.
            after_record = past_record.is_some();
            let position = match past_record {
                Some(next) => next,
                None => position(consumer, topic).map_err(kafka)?,
            };
            if position >= high {
                self.next = position;
                // Fetching stops until the read is taken up: a broker answers one connection's
                // requests in turn, and a fetch at the end of the log waits there for records
                // (`fetch.wait.max.ms`), so ListOffsets and the metadata request of a read taken
                // up waited behind two of them (~1 s of a restart at librdkafka's 500 ms). The
                // fetch already sent comes back within the reader's 10 ms. (Not pausing only
                // costs time: this read has its answer.)
                if keep {
                    self.paused = consumer.pause(&tpl).is_ok();
                }
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ProgressTopicError::Timeout {
                    topic: topic.to_string(),
                    timeout,
                    position,
                    end: high,
                });
            }
        }
    }
}

/// Whether `e` is about a connection to one broker (refused, reset, its handle replaced while
/// a request waited on it, every broker down for now): librdkafka reports it and goes on,
/// reconnecting and asking another broker. With one node of a cluster down, every client that
/// lists it in `bootstrap.servers` gets such a report; failing the read on it would keep Ferry
/// from starting a session until that node is back.
fn connection_trouble(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as E;
    matches!(
        e.rdkafka_error_code(),
        Some(E::BrokerTransportFailure | E::AllBrokersDown | E::DestroyBroker | E::Resolve)
    )
}

/// `call` again, after a short pause, while it fails with [`connection_trouble`] and the
/// deadline is not reached.
fn until_deadline<T>(
    deadline: Instant,
    mut call: impl FnMut() -> Result<T, KafkaError>,
) -> Result<T, KafkaError> {
    loop {
        match call() {
            Err(e) if connection_trouble(&e) && Instant::now() + POLL < deadline => {
                tracing::debug!(error = %e, "progress topic: a broker is unreachable; asking again");
                std::thread::sleep(POLL);
            }
            other => return other,
        }
    }
}

/// The context of the progress reader. It reads by `assign`, which librdkafka allows only to a
/// client with a `group.id`, and such a client looks up the group's coordinator although it
/// joins no group and commits nothing: a principal without Describe on that group gets
/// GROUP_AUTHORIZATION_FAILED, which changes nothing for the read. It is logged at debug
/// level, so that the least-privilege ACLs need no group (README, "Kafka ACLs").
struct Reader;

impl ClientContext for Reader {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        crate::kafka_access::observe(None, message);
        let message = crate::kafka_access::relayed(None, message);
        tracing::debug!(
            ?level,
            facility = fac,
            "librdkafka (progress reader): {message}"
        );
    }

    fn error(&self, error: KafkaError, reason: &str) {
        crate::kafka_access::observe(error.rdkafka_error_code(), reason);
        let reason = crate::kafka_access::relayed(error.rdkafka_error_code(), reason);
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::GroupAuthorizationFailed) {
            tracing::debug!(%error, "progress reader: {reason} (it uses no group; harmless)");
        } else if connection_trouble(&error) {
            // One broker of several away: the read goes on with the others (see `scan`).
            tracing::warn!(%error, "librdkafka (progress reader): {reason}");
        } else {
            tracing::error!(%error, "librdkafka (progress reader): {reason}");
        }
    }
}

/// What a metadata answer says of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopicShape {
    /// The broker does not know it.
    Missing,
    /// Known, but not yet settled on the broker that answered: no partitions yet, or no
    /// leader yet (a topic just created; Apache Kafka answers so for a moment). Transient.
    Settling,
    /// This many partitions.
    Partitions(usize),
    /// Another error.
    Failed(RDKafkaErrorCode),
}

impl TopicShape {
    fn of(error: Option<RDKafkaErrorCode>, partitions: usize) -> TopicShape {
        match error {
            None if partitions == 0 => TopicShape::Settling,
            None => TopicShape::Partitions(partitions),
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => TopicShape::Missing,
            Some(RDKafkaErrorCode::LeaderNotAvailable) => TopicShape::Settling,
            Some(code) => TopicShape::Failed(code),
        }
    }
}

impl ConsumerContext for Reader {}

/// Whether a record's key is `key` (either encoding: two encodings are two keys to Kafka).
fn of_key(key: &ProgressKey) -> impl Fn(&[u8]) -> bool + '_ {
    let encoded = key.encode();
    move |k| k == encoded.as_slice() || same_key(k, key)
}

/// Whether a record's key is one of `slot`'s, under any system identifier.
fn of_slot(slot: &str) -> impl Fn(&[u8]) -> bool + '_ {
    move |k| ProgressKey::decode(k).is_ok_and(|k| k.slot == slot)
}

/// Another encoding of the same key (written by another serializer): compared decoded.
fn same_key(bytes: &[u8], key: &ProgressKey) -> bool {
    ProgressKey::decode(bytes).is_ok_and(|k| k == *key)
}

/// The consumer's next offset on partition 0 (`-1`: none yet, before the first fetch).
fn position(consumer: &BaseConsumer<Reader>, topic: &str) -> Result<i64, KafkaError> {
    let tpl = consumer.position()?;
    Ok(tpl
        .find_partition(topic, 0)
        .and_then(|p| match p.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        })
        .unwrap_or(-1))
}

/// A short-lived librdkafka client whose destruction happens on a thread of its own: destroying
/// a client that talked to a partition leader took ~100 ms (`rd_kafka_destroy` joining its
/// broker threads), three times on the way from a free slot to streaming: measured 300 of the
/// 380 ms from a standby's takeover to its first acknowledged record.
pub(crate) struct Disposed<T: Send + 'static>(Option<T>);

impl<T: Send + 'static> Disposed<T> {
    pub(crate) fn new(client: T) -> Self {
        Disposed(Some(client))
    }
}

impl<T: Send + 'static> std::ops::Deref for Disposed<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("taken only in drop")
    }
}

impl<T: Send + 'static> Drop for Disposed<T> {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            let spawned = std::thread::Builder::new()
                .name("ferry-kafka-drop".into())
                .spawn(move || drop(client));
            // Without a thread (resource limits), the caller waits instead.
            if let Err(e) = spawned {
                tracing::debug!(error = %e, "dropping a Kafka client inline");
            }
        }
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// How long [`ensure_topic`] waits before asking again for a topic no broker knows yet.
const METADATA_RETRY: Duration = Duration::from_millis(50);

/// What [`ensure_topic`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// This call's CreateTopics created the topic: it holds no record.
    Created,
    /// The topic exists, with one partition.
    Found,
}

/// Creates `topic` (one partition, compacted, segments rolling every [`SEGMENT_MS`]) unless it
/// exists; "already exists" (another Ferry at the same moment) is success. Checks the partition
/// count of one that exists.
///
/// A restart finds the topic: one metadata request settles it, with no admin client and no
/// CreateTopics (~10 ms of a restart, in its debug lines). Anything else (missing, settling, an
/// error) takes the way a first start once took: CreateTopics, then metadata until the answer
/// settles (a session's start no longer waits for it: [`Way::AtStart`]).
pub async fn ensure_topic(
    properties: &[(String, String)],
    topic: &str,
    replication_factor: i32,
    timeout: Duration,
) -> Result<Ensured, ProgressTopicError> {
    ensure_topic_as(
        properties,
        topic,
        replication_factor,
        timeout,
        Way::Settled,
        None,
    )
    .await
}

/// How [`ensure_topic_as`] goes about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Look first; wait for a topic it created to settle ([`ensure_topic`]).
    Settled,
    /// A session's start, whose verdict reads nothing from a topic it just created and so does
    /// not wait for it to settle (a producer waits for its leader; a later session looks at
    /// the topic again before it reads it). `absent`: the broker probe's answer said the brokers
    /// do not know it (a first start), so CreateTopics goes first; a topic that
    /// exists all the same (a broker whose metadata lags, a principal not allowed to describe
    /// it) answers "already exists" or refuses, and is then looked at as [`ensure_topic`] does.
    AtStart { absent: bool },
}

/// The admin client a first start's CreateTopics goes out on, made as soon as the broker
/// probe's answer said the brokers do not know the progress topic ([`Sighting::Absent`]). It
/// begins connecting while the session opens and reads the slot: to a bootstrap broker, which
/// it asks for metadata, and then, sparse connections being off for its role, to every broker
/// the answer names (the one CreateTopics goes to among them). Made when CreateTopics goes out,
/// after the slot was read, those round trips came first: bench/README.md, "Round 33".
pub struct Admin(Disposed<AdminClient<Reader>>);

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("progress_topic::Admin")
    }
}

impl Admin {
    /// `None` when it cannot be made: [`ensure_topic_as`] then makes its own, and says why that
    /// fails.
    pub fn ahead(properties: &[(String, String)]) -> Option<Admin> {
        kafka_client::config(properties, Role::ProgressTopic)
            .create_with_context::<_, AdminClient<Reader>>(Reader)
            .ok()
            .map(|admin| Admin(Disposed::new(admin)))
    }
}

/// [`ensure_topic`], the [`Way`] asked; CreateTopics goes out on `ahead` when given
/// ([`Admin::ahead`]), else on an admin client made for it.
pub async fn ensure_topic_as(
    properties: &[(String, String)],
    topic: &str,
    replication_factor: i32,
    timeout: Duration,
    way: Way,
    ahead: Option<Admin>,
) -> Result<Ensured, ProgressTopicError> {
    let kafka = |error| kafka_error(topic, "checking the progress topic", properties, error);
    let deadline = Instant::now() + timeout;
    // A consumer: asking a producer-type client for a missing topic's metadata may create it
    // with the broker's defaults (librdkafka's `allow.auto.create.topics` is true for
    // producers), and this one must be compacted.
    let consumer = || {
        kafka_client::config(properties, Role::ProgressTopic)
            .create::<BaseConsumer>()
            .map(Disposed::new)
            .map_err(kafka)
    };
    let mut looked = None;
    if way != (Way::AtStart { absent: true }) {
        let consumer = consumer()?;
        let topic_owned = topic.to_string();
        let (consumer, found) = tokio::task::spawn_blocking(move || {
            let found = look(&consumer, &topic_owned, deadline);
            (consumer, found)
        })
        .await
        .map_err(|e| kafka(KafkaError::ClientCreation(e.to_string())))?;
        match found {
            Ok(TopicShape::Partitions(partitions)) => {
                return one_partition(topic, partitions).map(|()| Ensured::Found)
            }
            // No broker answered until the deadline: creating would not fare better.
            Err(e) if connection_trouble(&e) => return Err(kafka(e)),
            _ => {}
        }
        looked = Some(consumer);
    }
    let admin = match ahead {
        Some(Admin(admin)) => admin,
        None => Disposed::new(
            kafka_client::config(properties, Role::ProgressTopic)
                .create_with_context::<_, AdminClient<Reader>>(Reader)
                .map_err(kafka)?,
        ),
    };
    let segment_ms = SEGMENT_MS.to_string();
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(replication_factor))
        .set("cleanup.policy", "compact")
        .set("segment.ms", &segment_ms);
    // Bounded by the deadline, as the metadata requests are: a first start sends it without a
    // metadata request before it (`absent`), which would have found the brokers unreachable.
    // The request's own timeout a little after the broker's, so that a slow controller
    // answers REQUEST_TIMED_OUT before the client gives up.
    let opts = AdminOptions::new()
        .operation_timeout(Some(remaining(deadline)))
        .request_timeout(Some(remaining(deadline) + Duration::from_secs(1)));
    let result = admin.create_topics([&new], &opts).await.map_err(kafka)?;
    tracing::debug!(topic, "start-up: progress topic CreateTopics answered");
    let mut create_refused = None;
    let mut created = false;
    match result.into_iter().next() {
        Some(Ok(_)) => {
            tracing::info!(topic, "created the progress topic (1 partition, compacted)");
            if matches!(way, Way::AtStart { .. }) {
                return Ok(Ensured::Created);
            }
            created = true;
        }
        Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => {}
        // Kafka refuses CreateTopics without Create even when the topic exists: whether it
        // does is for the metadata below to say (an admin may have created it).
        Some(Err((_, code))) if crate::authz::is_authorization(code) => {
            create_refused = Some(code);
        }
        Some(Err((_, code))) => {
            return Err(ProgressTopicError::Create {
                topic: topic.to_string(),
                error: code.to_string(),
            })
        }
        None => {}
    }
    // A topic just created is in the controller's metadata before it is in every broker's:
    // for a moment a broker answers with no partitions or LEADER_NOT_AVAILABLE (Apache Kafka
    // does; measured right after CreateTopics on a single KRaft node). Wait for the answer
    // that settles it, until the deadline.
    // A topic Ferry was not allowed to create and no broker knows is not coming.
    let expected = create_refused.is_none();
    let consumer = match looked {
        Some(consumer) => consumer,
        None => consumer()?,
    };
    let topic_owned = topic.to_string();
    let shape = tokio::task::spawn_blocking(move || loop {
        match look(&consumer, &topic_owned, deadline) {
            // Created (or found existing) a moment ago: a broker that does not know it yet
            // will.
            Ok(TopicShape::Settling) if Instant::now() < deadline => {
                std::thread::sleep(METADATA_RETRY);
            }
            Ok(TopicShape::Missing) if expected && Instant::now() < deadline => {
                std::thread::sleep(METADATA_RETRY);
            }
            other => return other,
        }
    })
    .await
    .map_err(|e| kafka(KafkaError::ClientCreation(e.to_string())))?
    .map_err(kafka)?;
    match shape {
        TopicShape::Partitions(partitions) => {
            one_partition(topic, partitions).map(|()| match created {
                true => Ensured::Created,
                false => Ensured::Found,
            })
        }
        TopicShape::Missing | TopicShape::Settling => Err(match create_refused {
            // Not there, and Ferry may not create it.
            Some(code) => kafka_error(
                topic,
                "creating the progress topic",
                properties,
                KafkaError::AdminOp(code),
            ),
            None => kafka(KafkaError::MetadataFetch(
                RDKafkaErrorCode::LeaderNotAvailable,
            )),
        }),
        TopicShape::Failed(code) => Err(kafka(KafkaError::MetadataFetch(code))),
    }
}

/// What a DescribeConfigs answer for the progress topic says it keeps; `None` when it says
/// nothing: a resource the brokers refused (no DESCRIBE_CONFIGS on the topic) comes back with no
/// entries, its error dropped by rdkafka 0.39.
pub(crate) fn keeping_of(configs: &rdkafka::admin::ConfigResource) -> Option<keeping::Keeping> {
    Some(keeping::Keeping::from_entries(|name| {
        configs.get(name).and_then(|e| e.value.as_deref())
    }))
    .filter(keeping::Keeping::is_said)
}

/// The progress topic's [`keeping::Keeping`], asked of the brokers (DescribeConfigs) by an
/// admin client of its own; `None` when the answer says nothing ([`keeping_of`]).
pub async fn describe_keeping(
    properties: &[(String, String)],
    topic: &str,
    timeout: Duration,
) -> Result<Option<keeping::Keeping>, KafkaError> {
    let admin = Disposed::new(
        kafka_client::config(properties, Role::ProgressTopic)
            .create_with_context::<_, AdminClient<Reader>>(Reader)?,
    );
    let opts = AdminOptions::new().request_timeout(Some(timeout));
    let resource = rdkafka::admin::ResourceSpecifier::Topic(topic);
    let answer = admin.describe_configs([&resource], &opts).await?;
    match answer.into_iter().next() {
        Some(Ok(configs)) => Ok(keeping_of(&configs)),
        Some(Err(code)) => Err(KafkaError::AdminOp(code)),
        None => Err(KafkaError::AdminOp(RDKafkaErrorCode::Fail)),
    }
}

/// What the broker probe's answer showed of the progress topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sighting {
    /// Not asked, or shown another way (settling, another partition count, an error), or
    /// created by a session's start and not looked at since: for [`ensure_topic`] (or
    /// [`ensure_topic_as`]) to settle or say.
    #[default]
    Unsure,
    /// Settled with its one partition and that partition's leader: a restart's progress topic,
    /// found without a request of its own.
    Settled,
    /// Unknown to the brokers (left out of an answer for every topic, or answered
    /// `UNKNOWN_TOPIC_OR_PARTITION`): a first start's topic, for [`ensure_topic_as`] to create
    /// at once. A brokers' view only: a topic that exists all the same is found by that
    /// CreateTopics ("already exists") and read.
    Absent,
}

/// What `metadata` (the broker probe's answer, for `topic` alone or for every topic) shows of
/// `topic`.
pub(crate) fn sighted_in(metadata: &rdkafka::metadata::Metadata, topic: &str) -> Sighting {
    let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Sighting::Absent;
    };
    if let Some(code) = t.error() {
        return sighted_as(code.into());
    }
    let settled = TopicShape::of(t.error().map(RDKafkaErrorCode::from), t.partitions().len())
        == TopicShape::Partitions(1)
        && t.partitions()
            .iter()
            .all(|p| p.error().is_none() && p.leader() >= 0);
    match settled {
        true => Sighting::Settled,
        false => Sighting::Unsure,
    }
}

/// What a broker's error `code` for the topic alone says of it.
pub(crate) fn sighted_as(code: RDKafkaErrorCode) -> Sighting {
    match TopicShape::of(Some(code), 0) {
        TopicShape::Missing => Sighting::Absent,
        _ => Sighting::Unsure,
    }
}

/// One metadata request for `topic` (asked again while no broker is reachable, until the
/// deadline): its shape.
fn look(consumer: &BaseConsumer, topic: &str, deadline: Instant) -> Result<TopicShape, KafkaError> {
    let shape = until_deadline(deadline, || {
        consumer.fetch_metadata(Some(topic), remaining(deadline))
    })
    .map(|m| {
        m.topics()
            .iter()
            .find(|t| t.name() == topic)
            .map_or(TopicShape::Settling, |t| {
                TopicShape::of(t.error().map(RDKafkaErrorCode::from), t.partitions().len())
            })
    });
    // librdkafka answers a request for one topic whose metadata has an error with that error
    // for the whole request: the same settling, said another way.
    match shape {
        Err(KafkaError::MetadataFetch(code)) => match TopicShape::of(Some(code), 0) {
            TopicShape::Failed(code) => Err(KafkaError::MetadataFetch(code)),
            settling => Ok(settling),
        },
        other => other,
    }
}

/// The progress topic must have one partition: its records are read back in order.
fn one_partition(topic: &str, partitions: usize) -> Result<(), ProgressTopicError> {
    match partitions {
        1 => Ok(()),
        partitions => Err(ProgressTopicError::Partitions {
            topic: topic.to_string(),
            partitions,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reports a client gets when one broker of several is down are waited through; a
    /// refusal or a broken topic is not.
    #[test]
    fn connection_trouble_with_one_broker_is_not_a_failed_read() {
        use RDKafkaErrorCode as E;
        for code in [
            E::BrokerTransportFailure,
            E::AllBrokersDown,
            E::DestroyBroker,
        ] {
            assert!(connection_trouble(&KafkaError::MessageConsumption(code)));
            assert!(connection_trouble(&KafkaError::MetadataFetch(code)));
        }
        for code in [
            E::TopicAuthorizationFailed,
            E::UnknownTopicOrPartition,
            E::OperationTimedOut,
        ] {
            assert!(!connection_trouble(&KafkaError::MessageConsumption(code)));
        }
        let start = Instant::now();
        let mut calls = 0;
        let r: Result<(), KafkaError> = until_deadline(start + Duration::from_millis(350), || {
            calls += 1;
            Err(KafkaError::MetadataFetch(E::DestroyBroker))
        });
        assert!(r.is_err());
        assert!((2..=4).contains(&calls), "{calls}");
        let mut calls = 0;
        let r = until_deadline(start + Duration::from_secs(5), || {
            calls += 1;
            if calls < 3 {
                Err(KafkaError::MessageConsumption(E::BrokerTransportFailure))
            } else {
                Ok(calls)
            }
        });
        assert_eq!(r.unwrap(), 3);
        let r: Result<(), KafkaError> = until_deadline(start + Duration::from_secs(5), || {
            Err(KafkaError::MetadataFetch(E::TopicAuthorizationFailed))
        });
        assert!(r.is_err());
    }

    #[test]
    fn only_a_topic_the_brokers_do_not_know_is_sighted_absent_from_its_error() {
        use RDKafkaErrorCode as E;
        assert_eq!(sighted_as(E::UnknownTopicOrPartition), Sighting::Absent);
        // Hidden or settling: ensure_topic looks, and says why.
        for code in [
            E::TopicAuthorizationFailed,
            E::LeaderNotAvailable,
            E::InvalidTopic,
        ] {
            assert_eq!(sighted_as(code), Sighting::Unsure, "{code:?}");
        }
    }

    #[test]
    fn a_topic_without_partitions_or_leader_is_settling_not_misconfigured() {
        use RDKafkaErrorCode as E;
        assert_eq!(TopicShape::of(None, 0), TopicShape::Settling);
        assert_eq!(
            TopicShape::of(Some(E::LeaderNotAvailable), 0),
            TopicShape::Settling
        );
        assert_eq!(TopicShape::of(None, 1), TopicShape::Partitions(1));
        assert_eq!(TopicShape::of(None, 3), TopicShape::Partitions(3));
        assert_eq!(
            TopicShape::of(Some(E::UnknownTopicOrPartition), 0),
            TopicShape::Missing
        );
        assert_eq!(
            TopicShape::of(Some(E::TopicAuthorizationFailed), 0),
            TopicShape::Failed(E::TopicAuthorizationFailed)
        );
    }
}
