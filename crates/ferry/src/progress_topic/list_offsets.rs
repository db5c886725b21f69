//! The ends of the progress topic's partition, asked of its leader with ListOffsets by the
//! reader's own client, through librdkafka's Admin API (`rd_kafka_ListOffsets`).
//!
//! rust-rdkafka offers ListOffsets only as the watermark query (`fetch_watermarks`, librdkafka's
//! `rd_kafka_query_watermark_offsets`), which asks with the client's own `isolation.level`: the
//! reader is `read_committed`, and a read to the end needs the high watermark. The Admin API
//! takes the isolation level as an option of the request instead, and works on any client
//! handle, a consumer's included, so [`ends`] is unsafe code over librdkafka 2.12.1's C API.
//! What it relies on, from librdkafka's source:
//!
//! - `rd_kafka_ListOffsets` (rdkafka_admin.c) copies the partition list and the options, and
//!   puts its one result event on the queue it is given: a temporary queue of [`ends`]' own
//!   (`rd_kafka_queue_new`), so nothing reaches the consumer's queues. The isolation level is
//!   the options' (`rd_kafka_ListOffsetsRequest_admin`, rdkafka_request.c).
//! - It refuses a partition listed twice in one call ("Partitions must not contain
//!   duplicates"), so the log's start (`RD_KAFKA_OFFSET_SPEC_EARLIEST`) and end
//!   (`RD_KAFKA_OFFSET_SPEC_LATEST`) are two calls, sent at once onto the same queue and told
//!   apart by the opaque of their options.
//! - The partition's leader is looked up in the client's metadata cache
//!   (`rd_kafka_topic_partition_list_query_leaders_async`, rdkafka_partition.c), which the
//!   reader's own metadata request has just filled; only a topic missing from the cache costs a
//!   metadata request of its own. The request is then sent to that leader, once its connection
//!   is up: the admin worker waits for the broker's state to change
//!   (`rd_kafka_admin_common_get_broker`), it is not dropped and asked again later.
//! - No leader known (none elected, or its broker unknown) fails the call as a whole with
//!   `_NOENT` ("Failed to query partition leaders: No leaders found"). So does a topic whose
//!   cache entry failed for good (an authorization failure, say), which is asked again like a
//!   moving leader until the deadline; the metadata check just before each call reports such
//!   a topic first, with its own error. A broker's answer is not
//!   retried: a partition's error (`OFFSET_NOT_AVAILABLE`, `NOT_LEADER_OR_FOLLOWER`,
//!   `FENCED_LEADER_EPOCH`, ...) comes back in the partition's `err`, and for
//!   `NOT_LEADER_OR_FOLLOWER` and `LEADER_NOT_AVAILABLE` the topic's cache entry is dropped
//!   (`rd_kafka_ListOffsets_handle_result`), so the next lookup asks for fresh metadata.
//! - A request to the leader that fails as a whole (its timeout, its connection lost) does *not*
//!   fail the call: the call's result keeps the partition as it was before any answer, offset
//!   `RD_KAFKA_OFFSET_INVALID` (-1001) with no error (`rd_kafka_admin_fanout_worker` merges the
//!   failed request's empty result with `rd_kafka_ListOffsets_response_merge`, and its error is
//!   not carried over). A partition without an offset is therefore a failure here, never an end.
//! - Destroying the queue while a call is still out is safe: the queue is reference counted,
//!   and a result that arrives at a destroyed (disabled) queue is destroyed by librdkafka
//!   (`rd_kafka_q_enq1`, `rd_kafka_op_reply`).
//!
//! ListOffsets needs `Describe` on the topic, the metadata lookup too: what the reader's own
//! metadata request needs (README, "Kafka ACLs"). Nothing is asked of the controller or a group.

// The FFI is this module's purpose; every unsafe block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void, CStr};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use rdkafka::bindings as rd;
use rdkafka::client::Client;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

/// Where the end of the log is, for ListOffsets (`IsolationLevel` in the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Isolation {
    /// The high watermark: the end of the log, open transactions included.
    ReadUncommitted,
    /// The last stable offset: before the first open transaction.
    ReadCommitted,
}

impl Isolation {
    fn native(self) -> rd::rd_kafka_IsolationLevel_t {
        match self {
            Isolation::ReadUncommitted => {
                rd::rd_kafka_IsolationLevel_t::RD_KAFKA_ISOLATION_LEVEL_READ_UNCOMMITTED
            }
            Isolation::ReadCommitted => {
                rd::rd_kafka_IsolationLevel_t::RD_KAFKA_ISOLATION_LEVEL_READ_COMMITTED
            }
        }
    }
}

/// Partition 0's log start offset and end offset, as its leader answered ListOffsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ends {
    /// The log start offset (`EARLIEST`): past 0 once records were deleted.
    pub low: i64,
    /// The end (`LATEST`) at the isolation level asked.
    pub high: i64,
}

/// One of the two offsets asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spec {
    Earliest,
    Latest,
}

impl Spec {
    /// The offset spec in the request's partition list: librdkafka's `RD_KAFKA_OFFSET_SPEC_*`
    /// values are those of rust-rdkafka's `Offset::Beginning` (-2) and `Offset::End` (-1).
    fn offset(self) -> Offset {
        match self {
            Spec::Earliest => Offset::Beginning,
            Spec::Latest => Offset::End,
        }
    }

    /// The call's opaque: a tag, never dereferenced.
    fn tag(self) -> *mut c_void {
        std::ptr::without_provenance_mut(match self {
            Spec::Earliest => 1,
            Spec::Latest => 2,
        })
    }

    fn of_tag(tag: *mut c_void) -> Option<Spec> {
        [Spec::Earliest, Spec::Latest]
            .into_iter()
            .find(|s| s.tag().addr() == tag.addr())
    }
}

/// Whether `e`, from [`ends`], says that the partition's leadership is moving or was just
/// moved: no leader known, the leader no longer it, a stale or unknown leader epoch, or a new
/// leader whose high watermark has not caught up yet (`OFFSET_NOT_AVAILABLE`). Asking again
/// after fresh metadata can succeed; none of them is an end.
pub(super) fn leader_moving(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as E;
    matches!(
        e.rdkafka_error_code(),
        Some(
            E::NoEnt
                | E::LeaderNotAvailable
                | E::NotLeaderForPartition
                | E::FencedLeaderEpoch
                | E::UnknownLeaderEpoch
                | E::OffsetNotAvailable
                | E::ReplicaNotAvailable
        )
    )
}

/// How long one call may wait for its leader's answer, at most. A request waits for its
/// broker's connection for its whole timeout: a leader whose broker is down (the usual case
/// in a failover) would otherwise hold the call until the read's deadline, and the caller
/// could never ask again with fresh metadata. A call that times out comes back unanswered
/// (`BrokerTransportFailure`), which the caller asks again.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether a call failed for its own timeout ([`CALL_TIMEOUT`]; librdkafka's leader lookup
/// says `_TIMED_OUT`): asking again before the read's deadline can succeed.
pub(super) fn timed_out(e: &KafkaError) -> bool {
    e.rdkafka_error_code() == Some(RDKafkaErrorCode::OperationTimedOut)
}

/// Partition 0 of `topic`: its log start offset and its end at `isolation`, asked of its leader
/// by `client` (see the [module documentation](self)), by `deadline`.
///
/// Errors are [`KafkaError::OffsetFetch`]: the call's or the partition's error; a request to the
/// leader that failed as a whole is `BrokerTransportFailure` before the deadline (librdkafka
/// does not say why: its connection, or [`CALL_TIMEOUT`]) and `OperationTimedOut` after it, as
/// is a call not answered by the deadline.
pub(super) fn ends<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    isolation: Isolation,
    deadline: Instant,
) -> Result<Ends, KafkaError> {
    let rk = client.native_ptr();
    let options = Options::new(rk, isolation, left(deadline).min(CALL_TIMEOUT))?;
    let queue = Queue::new(rk)?;
    for spec in [Spec::Latest, Spec::Earliest] {
        let mut partitions = TopicPartitionList::new();
        partitions.add_partition_offset(topic, 0, spec.offset())?;
        options.set_opaque(spec.tag());
        // SAFETY: `rk` is `client`'s live handle (borrowed for this call); the list and the
        // options are valid and only read (librdkafka copies both before returning); the queue
        // is ours, alive until the end of this function.
        unsafe {
            rd::rd_kafka_ListOffsets(rk, partitions.ptr(), options.0.as_ptr(), queue.0.as_ptr())
        };
    }
    let (mut low, mut high) = (None, None);
    loop {
        if let (Some(low), Some(high)) = (low, high) {
            return Ok(Ends { low, high });
        }
        let wait = left(deadline);
        if wait.is_zero() {
            return Err(KafkaError::OffsetFetch(RDKafkaErrorCode::OperationTimedOut));
        }
        let Some(event) = queue.poll(wait) else {
            continue;
        };
        let (spec, answer) = event.answer(topic);
        let offset = match answer {
            Answer::Offset(offset) => offset,
            Answer::Failed(code, why) => {
                tracing::debug!(topic, ?spec, %code, %why, "progress topic: ListOffsets failed");
                return Err(KafkaError::OffsetFetch(code));
            }
            Answer::Unanswered => {
                tracing::debug!(topic, ?spec, "progress topic: ListOffsets got no offset");
                return Err(KafkaError::OffsetFetch(if left(deadline).is_zero() {
                    RDKafkaErrorCode::OperationTimedOut
                } else {
                    RDKafkaErrorCode::BrokerTransportFailure
                }));
            }
        };
        match spec {
            Some(Spec::Earliest) => low = Some(offset),
            Some(Spec::Latest) => high = Some(offset),
            // Not one of ours (the queue is ours alone: never expected).
            None => {}
        }
    }
}

/// What is left until `deadline` (zero once past it).
fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// `d` in milliseconds for librdkafka, at least 1 (0 would not wait) and at most `max`.
fn millis(d: Duration, max: c_int) -> c_int {
    c_int::try_from(d.as_millis()).unwrap_or(max).clamp(1, max)
}

/// What one result event says of partition 0.
enum Answer {
    Offset(i64),
    /// The call failed, or the partition has an error: the code and librdkafka's words.
    Failed(RDKafkaErrorCode, String),
    /// The partition has no offset and no error: the request to the leader failed.
    Unanswered,
}

/// ListOffsets options: freed on drop.
struct Options(NonNull<rd::rd_kafka_AdminOptions_t>);

impl Options {
    /// For ListOffsets at `isolation`, its request timing out after `timeout`.
    fn new(
        rk: *mut rd::rd_kafka_t,
        isolation: Isolation,
        timeout: Duration,
    ) -> Result<Options, KafkaError> {
        // SAFETY: `rk` is a live client handle (the caller's borrow); the options are ours,
        // destroyed once, on drop.
        let options = unsafe {
            rd::rd_kafka_AdminOptions_new(
                rk,
                rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_LISTOFFSETS,
            )
        };
        let options = Options(NonNull::new(options).ok_or(KafkaError::AdminOpCreation(
            "librdkafka made no ListOffsets options".into(),
        ))?);
        // librdkafka takes 0 to 3,600,000 ms.
        let timeout = millis(timeout, 3_600_000);
        let mut why = [0 as std::ffi::c_char; 256];
        // SAFETY: valid options; `why` is writable for its length, which is passed.
        let err = unsafe {
            rd::rd_kafka_AdminOptions_set_request_timeout(
                options.0.as_ptr(),
                timeout,
                why.as_mut_ptr(),
                why.len(),
            )
        };
        if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            // SAFETY: librdkafka wrote a NUL-terminated message into `why` (zeroed before).
            let why = unsafe { CStr::from_ptr(why.as_ptr()) }.to_string_lossy();
            return Err(KafkaError::AdminOpCreation(format!(
                "ListOffsets request timeout {timeout} ms: {why}"
            )));
        }
        // SAFETY: valid options; the error returned, if any, is ours and destroyed below.
        let error = unsafe {
            rd::rd_kafka_AdminOptions_set_isolation_level(options.0.as_ptr(), isolation.native())
        };
        if let Some(error) = NonNull::new(error) {
            // SAFETY: a live error object, ours: read, then destroyed once.
            let code = unsafe {
                let code = rd::rd_kafka_error_code(error.as_ptr());
                rd::rd_kafka_error_destroy(error.as_ptr());
                code
            };
            return Err(KafkaError::AdminOpCreation(format!(
                "ListOffsets isolation level {isolation:?}: {}",
                RDKafkaErrorCode::from(code)
            )));
        }
        Ok(options)
    }

    fn set_opaque(&self, tag: *mut c_void) {
        // SAFETY: valid options; the opaque is a tag, stored and handed back, never
        // dereferenced.
        unsafe { rd::rd_kafka_AdminOptions_set_opaque(self.0.as_ptr(), tag) };
    }
}

impl Drop for Options {
    fn drop(&mut self) {
        // SAFETY: ours, destroyed once; calls made with them copied them.
        unsafe { rd::rd_kafka_AdminOptions_destroy(self.0.as_ptr()) };
    }
}

/// A queue of our own for the results: destroyed on drop.
struct Queue(NonNull<rd::rd_kafka_queue_t>);

impl Queue {
    fn new(rk: *mut rd::rd_kafka_t) -> Result<Queue, KafkaError> {
        // SAFETY: `rk` is a live client handle (the caller's borrow, which outlives the queue).
        let queue = unsafe { rd::rd_kafka_queue_new(rk) };
        NonNull::new(queue)
            .map(Queue)
            .ok_or(KafkaError::AdminOpCreation(
                "librdkafka made no queue".into(),
            ))
    }

    /// The next event, waiting up to `wait`.
    fn poll(&self, wait: Duration) -> Option<Event> {
        // SAFETY: our live queue; the event returned, if any, is ours.
        let event = unsafe { rd::rd_kafka_queue_poll(self.0.as_ptr(), millis(wait, c_int::MAX)) };
        NonNull::new(event).map(Event)
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: ours, destroyed once. A call still out holds a reference of its own to the
        // queue; librdkafka destroys its result when it arrives (see the module documentation).
        unsafe { rd::rd_kafka_queue_destroy(self.0.as_ptr()) };
    }
}

/// An event taken off the queue: destroyed on drop (with the results it holds).
struct Event(NonNull<rd::rd_kafka_event_t>);

impl Event {
    /// Which call this event answers, and what it says of partition 0 of `topic`. Everything
    /// is copied out: nothing borrowed from the event outlives it.
    fn answer(&self, topic: &str) -> (Option<Spec>, Answer) {
        let event = self.0.as_ptr();
        // SAFETY: our live event; its opaque is the tag we set (or null), only compared.
        let spec = Spec::of_tag(unsafe { rd::rd_kafka_event_opaque(event) });
        // SAFETY: our live event.
        let err = unsafe { rd::rd_kafka_event_error(event) };
        if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            // SAFETY: our live event; the string, if any, lives as long as the event and is
            // copied here.
            let why = unsafe { rd::rd_kafka_event_error_string(event) };
            let why = if why.is_null() {
                String::new()
            } else {
                // SAFETY: non-null, NUL-terminated, alive while the event is.
                unsafe { CStr::from_ptr(why) }
                    .to_string_lossy()
                    .into_owned()
            };
            return (spec, Answer::Failed(err.into(), why));
        }
        // SAFETY: our live event; null unless it is a ListOffsets result.
        let result = unsafe { rd::rd_kafka_event_ListOffsets_result(event) };
        if result.is_null() {
            return (
                spec,
                Answer::Failed(RDKafkaErrorCode::Fail, "not a ListOffsets result".into()),
            );
        }
        let mut count = 0usize;
        // SAFETY: a live ListOffsets result; librdkafka returns its array of `count` elements
        // (possibly null when empty), owned by the event.
        let infos = unsafe { rd::rd_kafka_ListOffsets_result_infos(result, &mut count) };
        let infos: &[*const rd::rd_kafka_ListOffsetsResultInfo_t] = if infos.is_null() {
            &[]
        } else {
            // SAFETY: `count` valid pointers, alive while the event is (this borrow of `self`).
            unsafe { std::slice::from_raw_parts(infos, count) }
        };
        for &info in infos.iter().filter(|i| !i.is_null()) {
            // SAFETY: an element of the event's result; its partition lives as long as it.
            let Some(p) =
                (unsafe { rd::rd_kafka_ListOffsetsResultInfo_topic_partition(info).as_ref() })
            else {
                continue;
            };
            // SAFETY: a partition's topic is a NUL-terminated name owned by it (null-checked).
            let name = (!p.topic.is_null()).then(|| unsafe { CStr::from_ptr(p.topic) });
            if p.partition != 0 || name.map(CStr::to_bytes) != Some(topic.as_bytes()) {
                continue;
            }
            if p.err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
                let code = RDKafkaErrorCode::from(p.err);
                return (spec, Answer::Failed(code, code.to_string()));
            }
            if p.offset < 0 {
                return (spec, Answer::Unanswered);
            }
            return (spec, Answer::Offset(p.offset));
        }
        (spec, Answer::Unanswered)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: ours, destroyed once; nothing read from it is kept (see `answer`).
        unsafe { rd::rd_kafka_event_destroy(self.0.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::consumer::{BaseConsumer, Consumer};

    #[test]
    fn the_specs_are_librdkafkas() {
        use rd::rd_kafka_OffsetSpec_t as S;
        assert_eq!(
            Spec::Earliest.offset().to_raw(),
            Some(S::RD_KAFKA_OFFSET_SPEC_EARLIEST as i64)
        );
        assert_eq!(
            Spec::Latest.offset().to_raw(),
            Some(S::RD_KAFKA_OFFSET_SPEC_LATEST as i64)
        );
        for s in [Spec::Earliest, Spec::Latest] {
            assert_eq!(Spec::of_tag(s.tag()), Some(s));
        }
        assert_eq!(Spec::of_tag(std::ptr::null_mut()), None);
    }

    #[test]
    fn a_moving_leader_is_asked_again_and_nothing_else() {
        use RDKafkaErrorCode as E;
        for code in [
            E::NoEnt,
            E::LeaderNotAvailable,
            E::NotLeaderForPartition,
            E::FencedLeaderEpoch,
            E::UnknownLeaderEpoch,
            E::OffsetNotAvailable,
            E::ReplicaNotAvailable,
        ] {
            assert!(leader_moving(&KafkaError::OffsetFetch(code)), "{code:?}");
        }
        for code in [
            E::UnknownTopicOrPartition,
            E::TopicAuthorizationFailed,
            E::OperationTimedOut,
            E::BrokerTransportFailure,
        ] {
            assert!(!leader_moving(&KafkaError::OffsetFetch(code)), "{code:?}");
        }
    }

    #[test]
    fn only_a_call_past_its_own_timeout_timed_out() {
        use RDKafkaErrorCode as E;
        assert!(timed_out(&KafkaError::OffsetFetch(E::OperationTimedOut)));
        for code in [
            E::BrokerTransportFailure,
            E::NoEnt,
            E::TopicAuthorizationFailed,
        ] {
            assert!(!timed_out(&KafkaError::OffsetFetch(code)), "{code:?}");
        }
    }

    #[test]
    fn millis_are_at_least_one_and_capped() {
        assert_eq!(millis(Duration::ZERO, 10), 1);
        assert_eq!(millis(Duration::from_micros(500), 10), 1);
        assert_eq!(millis(Duration::from_millis(7), 10), 7);
        assert_eq!(millis(Duration::from_secs(1), 10), 10);
        assert_eq!(millis(Duration::MAX, c_int::MAX), c_int::MAX);
    }

    /// With no broker to ask, the call ends by its deadline with a timeout, and everything it
    /// made is freed (the calls still out find their queue gone).
    #[test]
    fn no_broker_is_a_timeout_by_the_deadline() {
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("group.id", "ferry-test")
            .create()
            .unwrap();
        for isolation in [Isolation::ReadUncommitted, Isolation::ReadCommitted] {
            let start = Instant::now();
            let deadline = start + Duration::from_millis(300);
            let e = ends(consumer.client(), "t", isolation, deadline).unwrap_err();
            assert_eq!(
                e.rdkafka_error_code(),
                Some(RDKafkaErrorCode::OperationTimedOut),
                "{e}"
            );
            let took = start.elapsed();
            assert!(took >= Duration::from_millis(290), "{took:?}");
            assert!(took < Duration::from_secs(2), "{took:?}");
        }
    }
}
