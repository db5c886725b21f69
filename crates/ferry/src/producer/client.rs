//! The librdkafka client under [`super::Producer`], with its events (delivery reports, client
//! errors, log lines) served on the pipeline's own thread.
//!
//! rust-rdkafka's `ThreadedProducer` serves them on a thread of its own, one delivery report
//! at a time: a callback per record, a channel send per record, a wake-up of the pipeline's
//! thread per report, and librdkafka's copy of every record freed on that thread although it was
//! allocated on the pipeline's (glibc then hands the chunk back to the other thread's arena).
//! Here the client's main queue wakes a task on the pipeline's runtime instead
//! (`rd_kafka_queue_cb_event_enable`: librdkafka calls back when the queue goes from empty to
//! not empty, so a wake-up is per batch, not per record), once the reports of the moment have
//! gathered (half the producer's linger, at most 500 µs: [`Gather`]), or sooner when the
//! pipeline's thread wakes for something else and serves them. The task takes each event off
//! the queue (one event is a produce response's whole batch of reports), hands its reports to
//! the relay over an in-thread channel, and destroys it, which frees the batch's record copies
//! on the thread that allocated them. A turn serves at most [`EVENTS_PER_TURN`] events and then lets
//! the pipeline's other tasks run.
//!
//! The same queue carries librdkafka's log (rust-rdkafka sets `log.queue`), which the task hands
//! to the context's `log` as rust-rdkafka's own poll would. A flush (and an exactly-once commit,
//! which flushes first) waits in librdkafka until the task has served every report
//! ([`Client::flush`]); rust-rdkafka's `commit_transaction`, called after it, finds nothing left
//! to flush. Those calls block, so they run on tokio's blocking pool while the task goes on
//! serving. The client must be created within the runtime. Dropping the client purges what it
//! still holds and serves the purge's reports itself, so that a producer dropped where the task
//! cannot run (on the runtime's thread, or on the warm-up thread) does not wait for it.

use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use ferry_router::Header;
use ferry_wal::timer::Timer;

use rdkafka::bindings as rd;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer as _, PurgeConfig};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;
use tokio::sync::Notify;

use super::{Context, Delivered, Delivery};

/// How many events one turn of the report task serves before it yields to the pipeline.
const EVENTS_PER_TURN: usize = 16;

/// How long dropping a client may take to collect the reports of what it purges (as long as
/// rust-rdkafka's own drop waits).
const DROP_DRAIN: Duration = Duration::from_millis(500);

/// A producer whose events are served by a task of the current runtime (see the module essay).
pub(super) struct Client {
    pub producer: BaseProducer<Context>,
    /// A reference to the client's main queue (where librdkafka puts reports, errors and its log).
    queue: Queue,
    /// Told by librdkafka (from its threads) when the queue stops being empty.
    wake: Arc<Gather>,
    /// One server at a time: the task, or the drop.
    serving: Mutex<()>,
    /// librdkafka's handle of every topic produced to (see [`Client::produce`]); destroyed in
    /// `drop`, before the client is.
    topics: Mutex<TopicHandles>,
}

/// Topic handles by name, and the last interned name used with its handle (records of one
/// topic come in runs: the name's address is compared before any hashing; the name is held, so
/// its address cannot be another topic's).
#[derive(Default)]
struct TopicHandles {
    last: Option<(Arc<str>, TopicHandle)>,
    by_name: HashMap<Arc<str>, TopicHandle>,
}

#[derive(Clone, Copy)]
struct TopicHandle(NonNull<rd::rd_kafka_topic_t>);

// SAFETY: a librdkafka topic handle may be used from any thread (it is reference counted and
// locked inside librdkafka).
#[allow(unsafe_code)]
unsafe impl Send for TopicHandle {}

/// One record for [`Client::produce`].
pub(super) struct Outgoing<'a> {
    pub topic: TopicName<'a>,
    /// `None`: by the configured partitioner.
    pub partition: Option<i32>,
    /// Copied by librdkafka (it always copies keys).
    pub key: Option<&'a [u8]>,
    /// Copied by librdkafka during the call; `None` is a null value (a tombstone).
    pub value: Option<&'a [u8]>,
    pub headers: &'a [Header],
    /// `None`: the time of the call.
    pub timestamp_ms: Option<i64>,
}

/// A record's topic.
pub(super) enum TopicName<'a> {
    /// A router's interned name: the same allocation for every record of the topic, compared
    /// by address with the last one used.
    Interned(&'a Arc<str>),
    Named(&'a str),
}

struct Queue(NonNull<rd::rd_kafka_queue_t>);

// SAFETY: a librdkafka queue handle may be used from any thread; every queue operation takes the
// queue's own lock.
#[allow(unsafe_code)]
unsafe impl Send for Queue {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for Queue {}

impl Client {
    /// Takes over serving `producer`'s events: a task on the current tokio runtime (panics
    /// outside one), which lets reports gather for `gathering` before it wakes (see [`Gather`]).
    #[allow(unsafe_code)]
    pub fn new(producer: BaseProducer<Context>, gathering: Duration) -> Arc<Client> {
        // SAFETY: the client pointer is valid while `producer` lives; the queue reference we get
        // is ours and destroyed exactly once, in `drop`, before `producer` is.
        let queue = unsafe { rd::rd_kafka_queue_get_main(producer.client().native_ptr()) };
        let queue = Queue(NonNull::new(queue).expect("librdkafka returned no main queue"));
        let wake = Arc::new(Gather::new(gathering));
        // SAFETY: the opaque points at the `Gather` this client keeps alive (`wake`) until `drop`
        // disables the callback; `wake_up` uses it through a shared reference (it is `Sync`).
        unsafe {
            rd::rd_kafka_queue_cb_event_enable(
                queue.0.as_ptr(),
                Some(wake_up),
                Arc::as_ptr(&wake).cast_mut().cast::<c_void>(),
            )
        };
        let client = Arc::new(Client {
            producer,
            queue,
            wake,
            serving: Mutex::new(()),
            topics: Mutex::default(),
        });
        tokio::spawn(serve(Arc::downgrade(&client), client.wake.clone()));
        client
    }

    /// Hands `record` to librdkafka (`rd_kafka_produceva`); its report carries `key`. Unlike
    /// rust-rdkafka's `send`, nothing is allocated on Ferry's side per record: the topic goes
    /// as a handle made once per topic (not a C string per record, looked up by librdkafka
    /// under its lock), and header names with their lengths (not a C string each).
    ///
    /// The value is copied by librdkafka (`RD_KAFKA_MSG_F_COPY`). Borrowing it instead (the
    /// bytes kept alive until the report) was built and measured: it removed the copy (−17,900
    /// instructions a row on 16 KB rows) but kept each WAL read chunk alive until its last
    /// record's report, and peak RSS went from 47–67 MiB to 56–104 MiB (bench/README.md,
    /// "After this round's changes"), past the 64 MiB budget. Copying it into a buffer of
    /// Ferry's, lent to librdkafka until the report (round 24, branch `value-loans`), bought
    /// nothing the count or the clock could confirm (bench/README.md, "Round 24").
    #[allow(unsafe_code)]
    pub fn produce(&self, record: Outgoing<'_>, key: usize) -> Result<(), RDKafkaErrorCode> {
        let rk = self.producer.client().native_ptr();
        let rkt = self.topic(rk, record.topic)?;
        // A null pointer is what librdkafka takes for an absent value or key.
        let (value, value_len) = pointer_and_len(record.value);
        let (key_ptr, key_len) = pointer_and_len(record.key);
        // SAFETY: `rk` and `rkt` are live (the handle is destroyed only in `drop`). Every pointer
        // handed over is valid for the call; librdkafka copies the key, the value
        // (`RD_KAFKA_MSG_F_COPY`) and the headers during it. The headers list becomes
        // librdkafka's on success and stays ours on failure. The opaque is the key itself.
        let error = unsafe {
            let headers = rd::rd_kafka_headers_new(record.headers.len());
            for (name, value) in record.headers {
                let (ptr, len) = match value {
                    Some(v) => (v.as_ptr().cast::<c_void>(), v.len() as isize),
                    None => (std::ptr::null(), 0),
                };
                rd::rd_kafka_header_add(
                    headers,
                    name.as_ptr().cast(),
                    name.len() as isize,
                    ptr,
                    len,
                );
            }
            use rd::rd_kafka_vtype_t::*;
            type U = rd::rd_kafka_vu_s__bindgen_ty_1;
            type Mem = rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1;
            let vu = |vtype, u| rd::rd_kafka_vu_t { vtype, u };
            let vus = [
                vu(
                    RD_KAFKA_VTYPE_RKT,
                    U {
                        rkt: rkt.0.as_ptr(),
                    },
                ),
                vu(
                    RD_KAFKA_VTYPE_PARTITION,
                    U {
                        i32_: record.partition.unwrap_or(-1),
                    },
                ),
                vu(
                    RD_KAFKA_VTYPE_MSGFLAGS,
                    U {
                        i: rd::RD_KAFKA_MSG_F_COPY,
                    },
                ),
                vu(
                    RD_KAFKA_VTYPE_VALUE,
                    U {
                        mem: Mem {
                            ptr: value.cast_mut().cast(),
                            size: value_len,
                        },
                    },
                ),
                vu(
                    RD_KAFKA_VTYPE_KEY,
                    U {
                        mem: Mem {
                            ptr: key_ptr.cast_mut().cast(),
                            size: key_len,
                        },
                    },
                ),
                vu(
                    RD_KAFKA_VTYPE_OPAQUE,
                    U {
                        ptr: key as *mut c_void,
                    },
                ),
                vu(
                    RD_KAFKA_VTYPE_TIMESTAMP,
                    U {
                        i64_: record.timestamp_ms.unwrap_or(0),
                    },
                ),
                vu(RD_KAFKA_VTYPE_HEADERS, U { headers }),
            ];
            let error = rd::rd_kafka_produceva(rk, vus.as_ptr(), vus.len());
            if error.is_null() {
                None
            } else {
                let code = rd::rd_kafka_error_code(error);
                rd::rd_kafka_error_destroy(error);
                rd::rd_kafka_headers_destroy(headers);
                Some(code)
            }
        };
        match error {
            None => Ok(()),
            Some(code) => Err(code.into()),
        }
    }

    /// Waits up to `timeout` until every record handed to librdkafka is reported and its
    /// report served, or fails with `KafkaError::Flush` (blocking: off the runtime's thread,
    /// while the report task serves). librdkafka's `rd_kafka_flush`, not rust-rdkafka's
    /// `flush`: with reports as events, librdkafka waits on its count of records held, and the
    /// report task's destroying the last report wakes it. rust-rdkafka's asks without waiting
    /// and then polls the queue for 100 ms, and its poll waits out its whole timeout whatever
    /// comes; with the report task serving the queue, a flush that found one report not yet
    /// served took 100 ms. Every exactly-once commit did: its progress record is produced
    /// just before it (bench/README.md, "Round 37").
    #[allow(unsafe_code)]
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: the handle is live (destroyed only in `drop`); the call only waits.
        let code = unsafe { rd::rd_kafka_flush(self.producer.client().native_ptr(), ms) };
        match code {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR => Ok(()),
            code => Err(KafkaError::Flush(code.into())),
        }
    }

    /// The handle of `topic`, made on first use.
    #[allow(unsafe_code)]
    fn topic(
        &self,
        rk: *mut rd::rd_kafka_t,
        topic: TopicName<'_>,
    ) -> Result<TopicHandle, RDKafkaErrorCode> {
        let mut handles = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        let name = match topic {
            TopicName::Interned(t) => {
                if let Some((last, handle)) = &handles.last {
                    if Arc::ptr_eq(last, t) {
                        return Ok(*handle);
                    }
                }
                &**t
            }
            TopicName::Named(t) => t,
        };
        let handle = match handles.by_name.get(name) {
            Some(h) => *h,
            None => {
                // A name with a NUL byte is no Kafka topic name; librdkafka says so for it.
                let cname = CString::new(name).unwrap_or_default();
                // SAFETY: a live client and a NUL-terminated name (copied by librdkafka). The
                // handle is ours until `rd_kafka_topic_destroy` in `drop`.
                let raw =
                    unsafe { rd::rd_kafka_topic_new(rk, cname.as_ptr(), std::ptr::null_mut()) };
                let Some(raw) = NonNull::new(raw) else {
                    // SAFETY: reads the calling thread's last librdkafka error.
                    return Err(unsafe { rd::rd_kafka_last_error() }.into());
                };
                let h = TopicHandle(raw);
                handles.by_name.insert(name.into(), h);
                h
            }
        };
        if let TopicName::Interned(t) = topic {
            handles.last = Some((t.clone(), handle));
        }
        Ok(handle)
    }

    /// Serves up to [`EVENTS_PER_TURN`] events, waiting up to `wait_ms` for the first; whether
    /// more may be waiting.
    #[allow(unsafe_code)]
    fn serve_turn(&self, mut wait_ms: i32) -> bool {
        let _one = self.serving.lock().unwrap_or_else(|e| e.into_inner());
        let context = self.producer.context();
        for _ in 0..EVENTS_PER_TURN {
            // SAFETY: the queue reference is valid until `drop`; a non-null event is ours until
            // the `rd_kafka_event_destroy` below, and nothing borrowed from it outlives that.
            unsafe {
                let event = rd::rd_kafka_queue_poll(self.queue.0.as_ptr(), wait_ms);
                if event.is_null() {
                    return false;
                }
                wait_ms = 0;
                match rd::rd_kafka_event_type(event) {
                    rd::RD_KAFKA_EVENT_DR => {
                        deliveries(context, event, self.producer.client().native_ptr())
                    }
                    rd::RD_KAFKA_EVENT_ERROR => {
                        // A fatal error comes as its cause's code with the fatal flag: the
                        // context is told it is fatal (the producer must be replaced).
                        let code = if rd::rd_kafka_event_error_is_fatal(event) != 0 {
                            RDKafkaErrorCode::Fatal
                        } else {
                            rd::rd_kafka_event_error(event).into()
                        };
                        let reason = CStr::from_ptr(rd::rd_kafka_event_error_string(event));
                        context.error(KafkaError::Global(code), reason.to_string_lossy().trim());
                    }
                    // rust-rdkafka sends librdkafka's log to this queue (`log.queue`).
                    rd::RD_KAFKA_EVENT_LOG => {
                        let (mut facility, mut message) = (std::ptr::null(), std::ptr::null());
                        let mut level = 0;
                        if rd::rd_kafka_event_log(event, &mut facility, &mut message, &mut level)
                            == 0
                        {
                            context.log(
                                log_level(level),
                                CStr::from_ptr(facility).to_string_lossy().trim(),
                                CStr::from_ptr(message).to_string_lossy().trim(),
                            );
                        }
                    }
                    // Every `statistics.interval.ms` (see `telemetry::brokers`).
                    rd::RD_KAFKA_EVENT_STATS => {
                        let json = CStr::from_ptr(rd::rd_kafka_event_stats(event));
                        context.stats_raw(json.to_bytes());
                    }
                    // An OAUTHBEARER refresh is left alone, as rust-rdkafka's own poll leaves it
                    // for a context without a token generator.
                    _ => {}
                }
                rd::rd_kafka_event_destroy(event);
            }
        }
        true
    }
}

impl Drop for Client {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: disabling takes the queue's lock, which librdkafka holds while it calls
        // `wake_up`: once this returns, the callback never uses `wake` again.
        unsafe {
            rd::rd_kafka_queue_cb_event_enable(self.queue.0.as_ptr(), None, std::ptr::null_mut())
        };
        self.producer
            .purge(PurgeConfig::default().queue().inflight());
        let deadline = Instant::now() + DROP_DRAIN;
        // No task holds the client any more (this is its last reference): waiting on the queue
        // here blocks nobody else's turn.
        while self.producer.in_flight_count() > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.serve_turn(i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1));
        }
        // SAFETY: our reference, destroyed once; nothing polls it any more.
        unsafe { rd::rd_kafka_queue_destroy(self.queue.0.as_ptr()) };
        // Our topic handles, before the client (messages still held keep references of their
        // own inside librdkafka).
        let handles = std::mem::take(&mut *self.topics.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, h) in handles.by_name {
            // SAFETY: made by `rd_kafka_topic_new` in `topic`, destroyed once, never used after.
            unsafe { rd::rd_kafka_topic_destroy(h.0.as_ptr()) };
        }
        // The task finds the client gone and ends.
        self.wake.now.notify_one();
    }
}

/// The pointer and length librdkafka takes for `bytes`: a null pointer for none.
fn pointer_and_len(bytes: Option<&[u8]>) -> (*const u8, usize) {
    bytes.map_or((std::ptr::null(), 0), |b| (b.as_ptr(), b.len()))
}

/// A syslog level as librdkafka logs it (rust-rdkafka's own mapping is private).
fn log_level(level: i32) -> RDKafkaLogLevel {
    match level {
        0 => RDKafkaLogLevel::Emerg,
        1 => RDKafkaLogLevel::Alert,
        2 => RDKafkaLogLevel::Critical,
        3 => RDKafkaLogLevel::Error,
        4 => RDKafkaLogLevel::Warning,
        5 => RDKafkaLogLevel::Notice,
        6 => RDKafkaLogLevel::Info,
        _ => RDKafkaLogLevel::Debug,
    }
}

/// librdkafka's wake-up callback, called where an event is put on the queue (its threads, or a
/// caller's, such as a purge's) with the queue's lock held.
#[allow(unsafe_code)]
unsafe extern "C" fn wake_up(_client: *mut rd::rd_kafka_t, opaque: *mut c_void) {
    // SAFETY: `opaque` is the client's `Gather`, alive while the callback is enabled.
    let wake = unsafe { &*opaque.cast::<Gather>() };
    wake.came();
}

/// The report task: serves a turn, then waits for reports to gather ([`Gather`]), or yields if
/// the turn stopped with events left. The gathering is over before the turn begins, so that a
/// report that comes during the turn, after its last look at the queue, starts the next.
async fn serve(client: Weak<Client>, wake: Arc<Gather>) {
    loop {
        let more = match client.upgrade() {
            Some(client) => {
                wake.begin_turn();
                client.serve_turn(0)
            }
            None => return,
        };
        if more {
            tokio::task::yield_now().await;
        } else {
            wake.over().await;
        }
    }
}

/// How the report task learns of reports: librdkafka calls back when the client's queue stops
/// being empty, and the task wakes a while later, once the other reports of the moment have
/// come too (or sooner, if the pipeline's thread wakes for something else and serves them:
/// [`Client::serve_waiting`]).
///
/// A transaction's records spread over the topic's partitions, and librdkafka sends each
/// partition's batch as a produce request of its own (its issue #1700). At 1,000 ten-row
/// transactions a second that was ~2.8 responses a transaction, arriving a little apart, and a
/// wake-up of the pipeline's thread for nearly every one. Waiting half the producer's linger
/// (at most 500 µs, as the reader's pause inside a transaction: `pause_for_linger`) serves them
/// together. It delays the acknowledgements, never the records: they are in Kafka when the
/// reports come.
struct Gather {
    /// The timer and the gathering's length; `None`: no wait (no linger, or no timer here),
    /// the task wakes at once.
    timer: Option<(Timer, Duration)>,
    /// Wakes the task at once: where there is no timer (or the kernel refused to set it), when
    /// [`Client::serve_waiting`] left events, and to end the task once the client is gone.
    now: Notify,
    /// Whether reports came since the task's last turn began: set where librdkafka calls back
    /// (its threads, or a caller's such as a purge's), once per gathering (the first sets the
    /// timer); cleared only on the runtime's thread, as a turn begins ([`Gather::begin_turn`])
    /// or when the pipeline's thread takes them ([`Gather::take`]).
    came: AtomicBool,
}

// Shared with librdkafka's threads through the callback's opaque pointer.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<Gather>();
};

impl Gather {
    fn new(length: Duration) -> Gather {
        Gather {
            timer: (!length.is_zero())
                .then(Timer::new)
                .flatten()
                .map(|timer| (timer, length)),
            now: Notify::new(),
            came: AtomicBool::new(false),
        }
    }

    /// Reports came (librdkafka's callback).
    fn came(&self) {
        if !self.came.swap(true, Ordering::AcqRel) {
            match &self.timer {
                Some((timer, length)) if timer.set(*length) => {}
                _ => self.now.notify_one(),
            }
        }
    }

    fn begin_turn(&self) {
        self.came.store(false, Ordering::Release);
    }

    /// Whether reports came since the task's last turn began; if so, their gathering is over
    /// and the caller serves them. Runtime's thread only.
    fn take(&self) -> bool {
        if !self.came.load(Ordering::Acquire) {
            return false;
        }
        // The timer first, then the flag: a report that comes after the flag is cleared sets
        // the timer again, and one before it finds the flag set and is served by the caller's
        // turn, which polls after this. (Flag first, a report between the two would have its
        // timer unset under a set flag, and nothing would wake the task for any later one.)
        if let Some((timer, _)) = &self.timer {
            timer.set(Duration::ZERO);
        }
        self.came.swap(false, Ordering::AcqRel)
    }

    /// Events are left on the queue after a turn outside the task: it serves them (librdkafka
    /// will not call back while the queue is not empty).
    fn left(&self) {
        self.came.store(true, Ordering::Release);
        self.now.notify_one();
    }

    async fn over(&self) {
        match &self.timer {
            Some((timer, _)) => tokio::select! {
                () = timer.over() => {}
                () = self.now.notified() => {}
            },
            None => self.now.notified().await,
        }
    }
}

impl Client {
    /// Serves the reports that came since the report task's last turn, if any: the pipeline's
    /// thread woke for something else (the reader's data), so they need not wait for
    /// [`Gather`]'s timer and its wake-up.
    pub fn serve_waiting(&self) {
        if self.wake.take() && self.serve_turn(0) {
            self.wake.left();
        }
    }
}

/// Hands a delivery-report event's reports to the relay, and tells the topic watch how many
/// records of each topic were reported (once per run of one topic, not once per record).
///
/// # Safety
/// `event` is a live delivery-report event.
#[allow(unsafe_code)]
unsafe fn deliveries(context: &Context, event: *mut rd::rd_kafka_event_t, rk: *mut rd::rd_kafka_t) {
    let mut run: (*mut rd::rd_kafka_topic_t, u64) = (std::ptr::null_mut(), 0);
    // Read off the event as the relay's queue takes them, without a buffer in between.
    let reports = std::iter::from_fn(|| {
        // SAFETY: the caller's event; each message lives as long as the event.
        let message = unsafe { rd::rd_kafka_event_message_next(event) };
        let m = unsafe { message.as_ref() }?;
        if m.rkt != run.0 {
            // SAFETY: a topic handle of a message of this event.
            unsafe { tally(context, run) };
            run = (m.rkt, 0);
        }
        run.1 += 1;
        let result = if m.err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            Ok(Delivered {
                partition: m.partition,
                offset: m.offset,
            })
        } else if m.err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__FATAL {
            // SAFETY: the client of this event, live while its queue is served.
            Err(KafkaError::MessageProduction(unsafe { fatal_cause(rk) }))
        } else if m.err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__PURGE_QUEUE {
            // When the client's error turns fatal, librdkafka purges the records still queued
            // (`rd_kafka_set_fatal_error0`): such a record failed of that error, which must not
            // read as a purge a new session retries (a producer refused its producer id for
            // want of an ACL was retried once, by a race, before it stopped with the grant).
            // SAFETY: as above.
            let code = unsafe { fatal_error(rk) }.unwrap_or(RDKafkaErrorCode::PurgeQueue);
            Err(KafkaError::MessageProduction(code))
        } else {
            Err(KafkaError::MessageProduction(m.err.into()))
        };
        // The record's key travels as librdkafka's per-message opaque (see `Client::produce`).
        let key = m._private as usize;
        let topic = match &result {
            // SAFETY: a live topic handle's name, a NUL-terminated string it owns.
            Err(_) if !m.rkt.is_null() => Some(
                unsafe { CStr::from_ptr(rd::rd_kafka_topic_name(m.rkt)) }
                    .to_string_lossy()
                    .into(),
            ),
            _ => None,
        };
        Some(Delivery { key, result, topic })
    });
    context.hand_over(reports);
    // SAFETY: as above.
    unsafe { tally(context, run) };
}

/// What made the client's error fatal (librdkafka fails every record with `_FATAL` after it):
/// a record failed because of it is reported with the cause, so that one the broker will never
/// accept (an authorization failure) is not retried as a generic fatal error.
///
/// # Safety
/// `rk` is a live client.
#[allow(unsafe_code)]
pub(super) unsafe fn fatal_cause(rk: *mut rd::rd_kafka_t) -> RDKafkaErrorCode {
    // SAFETY: the caller's live client.
    unsafe { fatal_error(rk) }.unwrap_or(RDKafkaErrorCode::Fatal)
}

/// The client's fatal error, if it has one.
///
/// # Safety
/// `rk` is a live client.
#[allow(unsafe_code)]
unsafe fn fatal_error(rk: *mut rd::rd_kafka_t) -> Option<RDKafkaErrorCode> {
    let mut errstr = [0 as std::os::raw::c_char; 256];
    // SAFETY: the caller's live client; librdkafka writes at most `errstr.len()` bytes.
    let code = unsafe { rd::rd_kafka_fatal_error(rk, errstr.as_mut_ptr(), errstr.len()) };
    match code {
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR => None,
        c => Some(c.into()),
    }
}

/// Tells the topic watch that `run.1` records of topic `run.0` were reported.
///
/// # Safety
/// `run.0` is null (then `run.1` is 0) or a topic handle of a live message.
#[allow(unsafe_code)]
unsafe fn tally(context: &Context, run: (*mut rd::rd_kafka_topic_t, u64)) {
    if run.1 == 0 || run.0.is_null() {
        return;
    }
    // SAFETY: a live topic handle's name, a NUL-terminated string it owns.
    let name = unsafe { CStr::from_ptr(rd::rd_kafka_topic_name(run.0)) };
    context.topics.reported(&name.to_string_lossy(), run.1);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::super::tests::a_record as record;
    use super::super::{report_gathering, Producer, Reports};
    use crate::telemetry::Metrics;
    use crate::topics::Topics;

    const DEADLINE: Duration = Duration::from_secs(60);

    /// A producer of brokers that never answer, whose reports gather for `gathering`: a record
    /// it holds is reported (failed) as soon as it is purged.
    fn unanswered(gathering: Duration) -> (Producer, Reports) {
        Producer::with_gathering(
            &super::super::tests::unanswered(),
            Topics::default(),
            Metrics::new(),
            Some(gathering),
            None,
        )
        .expect("producer")
    }

    /// Waits until librdkafka has called back: an event is on the queue (a purge's report, or
    /// first the brokers' refusal). Fails the test past [`DEADLINE`].
    async fn called_back(producer: &Producer) {
        tokio::time::timeout(DEADLINE, async {
            while !producer.inner.wake.came.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("librdkafka called back");
    }

    /// A record still queued when the client's error turns fatal is purged by librdkafka; its
    /// report carries the fatal error's cause (here an authorization failure, which stops
    /// Ferry with the grant), not the purge (which a new session would retry). Records purged
    /// without a fatal error still say so.
    #[tokio::test]
    #[allow(unsafe_code)]
    async fn a_record_purged_by_a_fatal_error_is_reported_with_its_cause() {
        use rdkafka::error::RDKafkaErrorCode;
        use rdkafka::producer::Producer as _;
        use rdkafka::types::RDKafkaRespErr;
        let (producer, mut reports) = unanswered(Duration::ZERO);
        producer.send(&record(), 1).expect("accepted");
        producer.purge_queued();
        let purged = tokio::time::timeout(DEADLINE, reports.recv())
            .await
            .expect("the report comes")
            .expect("alive");
        assert_eq!(
            purged.result.unwrap_err().rdkafka_error_code(),
            Some(RDKafkaErrorCode::PurgeQueue)
        );
        producer.send(&record(), 2).expect("accepted");
        let rk = producer.inner.producer.client().native_ptr();
        // SAFETY: a live client; the reason is a NUL-terminated string.
        let raised = unsafe {
            rdkafka::bindings::rd_kafka_test_fatal_error(
                rk,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED,
                c"a test: no producer id".as_ptr(),
            )
        };
        assert_eq!(raised, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
        let fatal = tokio::time::timeout(DEADLINE, reports.recv())
            .await
            .expect("the report comes")
            .expect("alive");
        assert_eq!(fatal.key, 2);
        assert_eq!(
            fatal.result.unwrap_err().rdkafka_error_code(),
            Some(RDKafkaErrorCode::ClusterAuthorizationFailed)
        );
    }

    /// Each report comes, one record after another, whether the task waits on the timer (a
    /// linger) or wakes at once (none): a gathering that never ends, or a report that came
    /// while nobody would set the timer, hangs here.
    #[tokio::test]
    async fn every_report_comes_after_its_gathering() {
        for gathering in [Duration::from_micros(500), Duration::ZERO] {
            let (producer, mut reports) = unanswered(gathering);
            for key in 0..20 {
                producer.send(&record(), key).expect("accepted");
                producer.purge_queued();
                let report = tokio::time::timeout(DEADLINE, reports.recv())
                    .await
                    .expect("the report comes")
                    .expect("the producer is alive");
                assert_eq!(report.key, key, "gathering {gathering:?}");
            }
        }
    }

    /// A report that came waits for its gathering (an hour here) unless the pipeline's thread,
    /// awake for something else, serves it: then it is handed over at once.
    #[tokio::test]
    async fn the_pipeline_thread_serves_reports_that_came() {
        let (producer, mut reports) = unanswered(Duration::from_secs(3600));
        // The report task's first turn, before anything comes.
        tokio::task::yield_now().await;
        producer.send(&record(), 7).expect("accepted");
        producer.purge_queued();
        let report = tokio::time::timeout(DEADLINE, async {
            loop {
                called_back(&producer).await;
                // Were the report task woken, it would run now.
                tokio::task::yield_now().await;
                assert!(
                    reports.try_recv().is_none(),
                    "a report did not wait for its gathering"
                );
                producer.serve_waiting();
                if let Some(report) = reports.try_recv() {
                    break report;
                }
            }
        })
        .await
        .expect("the report came, and the pipeline's thread served it");
        assert_eq!(report.key, 7);
        assert!(report.result.is_err(), "purged");
    }

    /// A flush waits in librdkafka for the report task to serve every report, and returns
    /// once it has; one that runs out of time says so. The task here gathers for an hour, so
    /// the report waits until the pipeline's thread serves it, while the flush waits on a
    /// thread of its own (as a commit's does, on tokio's blocking pool).
    #[tokio::test]
    async fn a_flush_returns_once_every_report_is_served() {
        let (producer, mut reports) = unanswered(Duration::from_secs(3600));
        tokio::task::yield_now().await;
        producer.send(&record(), 3).expect("accepted");
        producer.purge_queued();
        called_back(&producer).await;
        let client = producer.inner.clone();
        let short = tokio::task::spawn_blocking(move || client.flush(Duration::from_millis(1)))
            .await
            .expect("the flush");
        assert!(
            matches!(short, Err(rdkafka::error::KafkaError::Flush(_))),
            "a report nobody served yet: {short:?}"
        );
        let client = producer.inner.clone();
        let flush = tokio::task::spawn_blocking(move || client.flush(DEADLINE));
        let report = tokio::time::timeout(DEADLINE, async {
            loop {
                producer.serve_waiting();
                if let Some(report) = reports.try_recv() {
                    break report;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the report, served by the pipeline's thread");
        assert_eq!(report.key, 3);
        tokio::time::timeout(DEADLINE, flush)
            .await
            .expect("the flush returns once the report is served")
            .expect("the flush's thread")
            .expect("nothing left to flush");
    }

    /// A report that comes while the pipeline's thread takes the ones before it keeps its
    /// wake-up: a thread calls back without pause while the take runs, and whenever the flag is
    /// left set, the timer must be set too. (Taken flag first, the timer unset after it, the
    /// flag was left set with no timer, and the task slept through every later report.)
    #[tokio::test]
    async fn a_report_during_a_take_keeps_its_wake_up() {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        use std::sync::Arc;
        let gather = Arc::new(super::Gather::new(Duration::from_millis(1)));
        for _ in 0..500 {
            // A gathering under way.
            gather.came();
            let stop = Arc::new(AtomicBool::new(false));
            let calls = Arc::new(AtomicUsize::new(0));
            let caller = {
                let (gather, stop, calls) = (gather.clone(), stop.clone(), calls.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        gather.came();
                        calls.fetch_add(1, Ordering::Relaxed);
                    }
                })
            };
            while calls.load(Ordering::Relaxed) == 0 {
                std::thread::yield_now();
            }
            assert!(gather.take(), "a gathering was under way");
            stop.store(true, Ordering::Relaxed);
            caller.join().expect("the caller");
            if gather.came.load(Ordering::Acquire) {
                tokio::time::timeout(Duration::from_secs(10), gather.over())
                    .await
                    .expect("the wake-up of a report that came during the take");
            }
            gather.begin_turn();
        }
    }

    /// Half the producer's linger, at most 500 µs, as the reader's pause; librdkafka's own
    /// default (5 ms) where none is set.
    #[test]
    fn reports_gather_for_half_the_linger() {
        let gathering = |props: &[(&str, &str)]| {
            let mut cc = rdkafka::ClientConfig::new();
            for (k, v) in props {
                cc.set(*k, *v);
            }
            report_gathering(&cc)
        };
        let us = Duration::from_micros;
        assert_eq!(gathering(&[("linger.ms", "1")]), us(500));
        assert_eq!(gathering(&[("linger.ms", "0.4")]), us(200));
        assert_eq!(gathering(&[("linger.ms", "0")]), Duration::ZERO);
        assert_eq!(gathering(&[("linger.ms", "100")]), us(500));
        assert_eq!(
            gathering(&[("queue.buffering.max.ms", "0")]),
            Duration::ZERO
        );
        assert_eq!(gathering(&[]), us(500));
    }
}
