//! The sink: where the session's records go (Kafka), seen from the core. The core never calls
//! it (it does no I/O): the session machine ([`crate::session`]) asks for produce, progress
//! record, begin, commit and abort actions, and the driver carries them out on its sink and
//! hands every report back. This is what the core relies on a sink to promise.
//!
//! # What a sink promises
//!
//! 1. **Accepted is not durable.** A produce that succeeds means the record was accepted; it is
//!    durable only when a report for its token says `Ok`. Every accepted record gets exactly one
//!    report, eventually (librdkafka: within `delivery.timeout.ms`). A refused record gets none.
//! 2. **A report `Ok` means the record is durable and will be seen by consumers**, so the core
//!    may count it towards confirming its transaction's `end_lsn`.
//! 3. **Order per key.** Records of one key handed over in order are appended in that order, or
//!    fail from the first that failed on (idempotent producer: a failed record fails those queued
//!    behind it on its partition). After a failure the machine asks for an abandon
//!    ([`crate::session::Action::Abandon`]), and the sink stops anything still queued from
//!    landing ahead of the failed record's replay.
//!
//! # The two kinds
//!
//! - **At-least-once, per-record idempotent sink** (librdkafka with `enable.idempotence=true`,
//!   `acks=all`). Reports arrive per record as the brokers acknowledge them, in any order across
//!   partitions. Progress records go through the same sink, on their own. A crash duplicates
//!   what was acknowledged past the confirmed LSN; it never loses or reorders.
//! - **Transactional sink** (exactly-once): records and, last, the progress record go into a
//!   Kafka transaction the machine began; a commit makes them all durable at once and a failed
//!   commit or an abort none of them. The machine holds the records' reports until the commit's
//!   outcome and releases them then, so the relay core's rules do not change: it confirms a WAL
//!   transaction only when all its records are reported `Ok`, which for this sink is only after
//!   the Kafka transaction carrying them committed.
