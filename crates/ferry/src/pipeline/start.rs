//! Before a session streams: the start-time verdict (read the slot, then the progress topic,
//! and ask [`ferry_core::verdict`] whether streaming from the slot would hide lost events), the
//! checks of an exactly-once first start, and what a stop at a table no entry relays means.
//!
//! [`StartFacts`] is what the verdict is decided on; `ferry run` and `ferry check` both read it
//! here, so the two never judge a slot differently.

use std::future::Future;
use std::time::{Duration, Instant};

use ferry_core::progress_record as record;
use ferry_core::verdict::{self, Acceptance, Notice, Refusal, SlotSeen, StartInput, Verdict};
use ferry_wal::assembly::{AssemblyError, SourceTable};
use ferry_wal::conn::{answered, ReaderError, SystemIdentity};
use ferry_wal::{slot, Lsn};

use super::driver::Driver;
use super::{PipelineError, PipelineSettings};
use crate::progress_topic::{self, Sighting};
use rdkafka::error::KafkaError;

/// How long reading the progress topic, or creating it, may take at a session's start.
pub(super) const PROGRESS_TIMEOUT: Duration = Duration::from_secs(30);

/// Set (to anything), sessions skip [`transactions_probe`]: the end-to-end tests use it to
/// reach the transaction calls of a broker without transactions. Nothing else reads it.
pub const SKIP_API_CHECK_ENV: &str = "FERRY_TEST_SKIP_API_CHECK";

/// How long asking the brokers for their API versions may take (exactly-once).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a failed first exactly-once start waits for its walsender to release the slot it
/// created, to drop it.
const SLOT_DROP_TIMEOUT: Duration = Duration::from_secs(10);

/// What the start-time verdict is decided on: the slot and the server (read together), then
/// what the progress topic remembers of the slot.
pub(crate) struct StartFacts {
    pub state: Option<slot::SlotState>,
    pub identity: SystemIdentity,
    /// `None` on a standby (no current WAL position there).
    pub current_wal_lsn: Option<Lsn>,
    pub history: progress_topic::SlotHistory,
    /// What the history says, seen from this server.
    pub remembered: verdict::Remembered,
    /// This read's CreateTopics created the progress topic ([`Reading::Ensure`]).
    pub created_topic: bool,
    /// A read to the stable end, kept open where it ended: exactly-once's read after the
    /// fencing takes up from there ([`progress_topic::Cursor`]).
    pub cursor: Option<progress_topic::Cursor>,
}

/// Why [`StartFacts`] could not be read.
#[derive(Debug)]
pub(crate) enum FactsError {
    Server(ReaderError),
    /// The progress topic could not be read (transient or not: [`crate::progress_topic::ProgressTopicError`]).
    Topic(progress_topic::ProgressTopicError),
    /// The blocking read was lost.
    Join(String),
}

impl From<FactsError> for PipelineError {
    fn from(e: FactsError) -> Self {
        match e {
            FactsError::Server(e) => e.into(),
            FactsError::Topic(e) => e.into(),
            FactsError::Join(e) => {
                PipelineError::ProducerFatal(format!("reading the progress topic: {e}"))
            }
        }
    }
}

/// How [`StartFacts::read`] comes to what the progress topic remembers.
pub(crate) enum Reading {
    /// The topic was found (or created) before: read it.
    Read,
    /// Create the topic, or find it, first ([`progress_topic::Way::AtStart`];
    /// `absent`: the broker probe's answer said the brokers do not know it). A topic this
    /// CreateTopics created holds nothing, and is not read: the request goes out after the
    /// slot was read, so its "nothing" is the topic's state after the slot's, as a read's
    /// would be (a first start's verdict no longer waits for the new topic to settle and then
    /// for a reader's connections, ~20–30 ms). `admin`: the admin client made when the probe
    /// answered ([`progress_topic::Admin::ahead`]).
    Ensure {
        replication_factor: i32,
        absent: bool,
        admin: Option<progress_topic::Admin>,
    },
}

/// What runs beside the progress read ([`StartFacts::read`]): finished, or still running when
/// the read was done. The caller waits for it only if it still wants it: a start the verdict
/// refuses says why at once, not after a connection still being opened beside it (a host list
/// whose first hosts time out holds that for a connect timeout each).
pub(crate) enum Beside<B: Future> {
    Done(B::Output),
    Running(std::pin::Pin<Box<B>>),
}

impl<B: Future> Beside<B> {
    /// Runs `other` to its end, going on with this meanwhile.
    pub async fn alongside<F: Future>(&mut self, other: F) -> F::Output {
        let Beside::Running(running) = self else {
            return other.await;
        };
        let mut other = std::pin::pin!(other);
        let done = tokio::select! {
            out = other.as_mut() => return out,
            done = running.as_mut() => done,
        };
        *self = Beside::Done(done);
        other.await
    }

    /// Its output, waiting for it if it still runs.
    pub async fn finish(self) -> B::Output {
        match self {
            Beside::Done(out) => out,
            Beside::Running(running) => running.await,
        }
    }
}

impl StartFacts {
    /// Reads the slot, the server, then the progress topic (to `until`, within `timeout`).
    /// `refuse_active`: a slot another process streams is [`ReaderError::SlotInUse`].
    /// `beside` runs while the progress topic is read (after the slot and the server are); it
    /// comes back with the facts, finished or not ([`Beside`]), and it is dropped unfinished
    /// when the read fails.
    pub async fn read<B: Future>(
        s: &PipelineSettings,
        sql: &tokio_postgres::Client,
        reading: Reading,
        until: progress_topic::Until,
        timeout: Duration,
        refuse_active: bool,
        beside: B,
    ) -> Result<(StartFacts, Beside<B>), FactsError> {
        let name = &s.slot.slot;
        let within = s.stream.receive_timeout;
        let what = "the reads of the slot and the server";
        // Sent at once: the connection pipelines the three (their errors are taken in order).
        let (state, identity, in_recovery) = answered(within, what, async {
            Ok::<_, ReaderError>(tokio::join!(
                slot::slot_state(sql, name),
                slot::system_identity(sql),
                slot::in_recovery(sql)
            ))
        })
        .await
        .map_err(FactsError::Server)?;
        let state = state.map_err(FactsError::Server)?;
        if let Some(pid) = state
            .as_ref()
            .and_then(|st| st.active_pid)
            .filter(|_| refuse_active)
        {
            // Another process streams it (another Ferry, which keeps it and its record in step).
            return Err(FactsError::Server(ReaderError::SlotInUse {
                slot: name.clone(),
                pid,
            }));
        }
        let identity = identity.map_err(FactsError::Server)?;
        let current_wal_lsn = match in_recovery.map_err(FactsError::Server)? {
            true => None,
            false => Some(
                answered(within, what, slot::current_wal_lsn(sql))
                    .await
                    .map_err(FactsError::Server)?,
            ),
        };
        tracing::debug!("start-up: slot and server read");
        let (properties, topic, slot_name) = (
            s.producer_properties.clone(),
            s.progress_topic.clone(),
            name.clone(),
        );
        let history = async {
            if let Reading::Ensure {
                replication_factor,
                absent,
                admin,
            } = reading
            {
                let ensured = progress_topic::ensure_topic_as(
                    &properties,
                    &topic,
                    replication_factor,
                    timeout,
                    progress_topic::Way::AtStart { absent },
                    admin,
                )
                .await
                .map_err(FactsError::Topic)?;
                tracing::debug!("start-up: progress topic ensured");
                if ensured == progress_topic::Ensured::Created {
                    // Created by this request, sent after the slot was read: it holds nothing.
                    let empty = progress_topic::SlotHistory {
                        topic_exists: true,
                        records: Vec::new(),
                    };
                    return Ok((empty, true, None));
                }
            }
            let read = tokio::task::spawn_blocking(move || match until {
                // Exactly-once: taken up again after fencing (`ferry check` drops it).
                progress_topic::Until::Stable => {
                    progress_topic::read_slot_open(&properties, &topic, &slot_name, timeout, until)
                }
                progress_topic::Until::End => {
                    progress_topic::read_slot(&properties, &topic, &slot_name, timeout, until)
                        .map(|history| (history, None))
                }
            })
            .await;
            tracing::debug!("start-up: progress topic read");
            let (history, cursor) = read
                .map_err(|e| FactsError::Join(e.to_string()))?
                .map_err(FactsError::Topic)?;
            Ok((history, false, cursor))
        };
        // Both, but a failed read returns at once (what runs beside is dropped).
        let mut beside = Beside::Running(Box::pin(beside));
        let (history, created_topic, cursor) = beside.alongside(history).await?;
        let remembered = history.remembered(identity.system_id);
        let facts = StartFacts {
            state,
            identity,
            current_wal_lsn,
            history,
            remembered,
            created_topic,
            cursor,
        };
        Ok((facts, beside))
    }

    /// The verdict's input for slot `slot_name` in `mode`, with what the operator accepted.
    pub fn input<'a>(
        &'a self,
        slot_name: &'a str,
        mode: record::Mode,
        acceptance: Acceptance,
    ) -> StartInput<'a> {
        let slot = match &self.state {
            None => SlotSeen::Missing,
            Some(st) if st.wal_status.as_deref() == Some("lost") => SlotSeen::Invalidated {
                confirmed_flush_lsn: st.confirmed_flush_lsn,
            },
            Some(st) => SlotSeen::Present {
                confirmed_flush_lsn: st.confirmed_flush_lsn,
            },
        };
        StartInput {
            slot_name,
            slot,
            server: verdict::Server {
                system_id: self.identity.system_id,
                timeline: self.identity.timeline,
                current_wal_lsn: self.current_wal_lsn,
            },
            remembered: &self.remembered,
            mode,
            acceptance,
        }
    }
}

/// What the verdict let a session do.
pub(super) struct Start {
    /// The slot may be created (first start, or a lost slot the operator accepted).
    pub create_slot: bool,
    /// The progress record the slot was compared with; `None`: write a fresh one first.
    pub remembered: Option<Lsn>,
    pub identity: SystemIdentity,
    /// An accepted gap: the acceptance is used up once the fresh record is written.
    pub accepted: bool,
    /// Exactly-once: the verdict's read of the progress topic, to be taken up after fencing.
    pub cursor: Option<progress_topic::Cursor>,
}

impl Driver<'_> {
    /// The reader stopped at a row of a table the publication carries and no entry relays
    /// ([`AssemblyError::UnrelayedInsert`]). Still listed: the operator decides (relay it or take
    /// it out), a permanent error. Taken out since: the rows committed while it was in are
    /// skipped from now on, and the next session resumes. Any other error is returned as it is.
    pub(super) async fn unrelayed(
        &mut self,
        e: PipelineError,
        sql: &tokio_postgres::Client,
    ) -> PipelineError {
        let PipelineError::Reader(ReaderError::Assembly(AssemblyError::UnrelayedInsert {
            xid,
            lsn,
            oid,
            namespace,
            name,
        })) = &e
        else {
            return e;
        };
        let s = self.settings;
        let table = format!(
            "{}.{}",
            slot::quote_ident(namespace),
            slot::quote_ident(name)
        );
        let at = format!("an INSERT of transaction {xid} at {lsn}");
        let standing = answered(
            s.stream.receive_timeout,
            "the read of the table's standing in the publication",
            slot::standing(sql, &s.slot, *oid),
        );
        let standing = match standing.await {
            Ok(standing) => standing,
            // Asked again by the next session.
            Err(e) => return e.into(),
        };
        match standing {
            // Relayed, by oid, once the next session maps it (never skipped).
            slot::Standing::Outbox { now } => PipelineError::Remap {
                why: format!(
                    "rows of outbox table {now} arrive as {table}, the name or partition they were committed \
                     under ({at})"
                ),
            },
            slot::Standing::WholeSchema => PipelineError::Remap {
                why: format!(
                    "publication {:?} now covers the schema of table {table} wholesale ({at})",
                    s.slot.publication
                ),
            },
            slot::Standing::Listed { .. } => PipelineError::UnrelayedTable {
                publication: s.slot.publication.clone(),
                table,
                at: Some(at),
            },
            slot::Standing::Out => {
                tracing::warn!(
                    table = %table,
                    publication = %s.slot.publication,
                    "table {table}, which no entry relays, is no longer in publication {:?}, but rows committed \
                     while it was (the first at {at}) are still in the WAL: they are skipped, as taking it out asked",
                    s.slot.publication
                );
                self.carry.tables_taken_out.push(SourceTable {
                    schema: namespace.clone(),
                    table: name.clone(),
                });
                PipelineError::Remap {
                    why: format!("skipping the rows of table {table}, which left the publication"),
                }
            }
        }
    }

    /// An exactly-once session failed between creating the slot (`created`) and committing its
    /// first progress record, before anything was produced: nothing remembers the slot, and the
    /// next start would refuse it as a used slot without a record (issue 30). So that it does
    /// not:
    /// - a transient failure leaves the slot to the next session of this process, which may
    ///   start from it (the acceptance `--initialize-progress` gives, used up by the first
    ///   record): this process made it and produced nothing from it;
    /// - a permanent one (brokers without transactions, a missing ACL) drops it, as does a
    ///   shutdown in that window: Ferry exits, and the next start, once the cause is fixed, is a
    ///   first start again. A fenced session keeps it (another Ferry took over);
    /// - a commit whose outcome is unknown is transient: kept, and the next session reads what
    ///   Kafka holds (a `kill -9` in that moment still needs `--initialize-progress`: README).
    pub(super) async fn first_start_failed(
        &mut self,
        sql: &tokio_postgres::Client,
        created: bool,
        e: PipelineError,
    ) -> PipelineError {
        if !created || matches!(e, PipelineError::Fenced { .. }) {
            return e;
        }
        if e.is_transient() {
            self.acceptance.initialize_progress = true;
            return e;
        }
        self.drop_created_slot(sql, true).await;
        e
    }

    /// Drops the slot this session created (`created`) before any record remembered it; see
    /// [`Driver::first_start_failed`].
    pub(super) async fn drop_created_slot(&self, sql: &tokio_postgres::Client, created: bool) {
        if !created {
            return;
        }
        let name = &self.settings.slot.slot;
        match slot::drop_inactive(sql, name, SLOT_DROP_TIMEOUT).await {
            Ok(()) => tracing::warn!(
                slot = %name,
                "the first exactly-once start ended before its first progress record; dropped the slot it \
                 created, so that the next start is a first start again"
            ),
            Err(drop) => tracing::warn!(
                slot = %name,
                error = %drop,
                "the first exactly-once start ended before its first progress record, and the slot it created \
                 could not be dropped: drop it (SELECT pg_drop_replication_slot('{name}')) before the next start, \
                 or start once with `ferry run --initialize-progress`"
            ),
        }
    }

    /// The start-time verdict (see the module docs): may this session stream from the slot?
    /// `beside` runs while the progress topic is read ([`StartFacts::read`]) and the slot is
    /// read again; its output is waited for, and returned, only with a verdict that lets the
    /// session start (a refusal drops it unfinished).
    pub(super) async fn verdict<B: Future>(
        &mut self,
        sql: &tokio_postgres::Client,
        beside: B,
    ) -> Result<(Start, B::Output), PipelineError> {
        let s = self.settings;
        let name = &s.slot.slot;
        let until = match s.exactly_once {
            Some(_) => progress_topic::Until::Stable,
            None => progress_topic::Until::End,
        };
        // The progress topic is created or checked after the slot is read, until a session
        // found it; on a restart the broker probe's answer already showed it.
        // A first start's admin client, made when the probe answered (dropped if unused).
        let admin = self.carry.progress_topic_admin.take();
        let reading = match self.carry.progress_topic {
            Sighting::Settled => Reading::Read,
            sighting => Reading::Ensure {
                replication_factor: s.create_topics.replication_factor,
                absent: sighting == Sighting::Absent,
                admin,
            },
        };
        let ensuring = matches!(reading, Reading::Ensure { .. });
        // The probe's answer speaks for the first try only.
        if self.carry.progress_topic == Sighting::Absent {
            self.carry.progress_topic = Sighting::Unsure;
        }
        // The slot first, then the progress topic (see the module docs for why this order).
        let read = StartFacts::read(s, sql, reading, until, PROGRESS_TIMEOUT, true, beside).await;
        if let (Err(FactsError::Server(ReaderError::SlotInUse { .. })), true) = (&read, ensuring) {
            // A standby: the topic is created or checked while it waits (and waited for until
            // it settled: a standby is in no hurry), as before the verdict read the slot first,
            // so that a takeover reads it instead of waiting for its CreateTopics. Its error is
            // the session's, as it was then.
            progress_topic::ensure_topic(
                &s.producer_properties,
                &s.progress_topic,
                s.create_topics.replication_factor,
                PROGRESS_TIMEOUT,
            )
            .await?;
            self.carry.progress_topic = Sighting::Settled;
        }
        let (facts, mut beside) = read?;
        // A topic this start created may still be settling: a later session looks first.
        self.carry.progress_topic = match facts.created_topic {
            true => Sighting::Unsure,
            false => Sighting::Settled,
        };
        // The slot again: another Ferry starting at the same moment may have created it (and
        // written its first record) between the two reads, which would look like a lost slot.
        // A slot that changed while Ferry looked is judged on the next attempt.
        let again = answered(
            s.stream.receive_timeout,
            "the second read of the slot",
            beside.alongside(slot::slot_state(sql, name)),
        )
        .await?;
        if let Some(pid) = again.as_ref().and_then(|st| st.active_pid) {
            return Err(ReaderError::SlotInUse {
                slot: name.clone(),
                pid,
            }
            .into());
        }
        let position = |st: &Option<slot::SlotState>| {
            st.as_ref()
                .map(|st| (st.confirmed_flush_lsn, st.wal_status.clone()))
        };
        if position(&facts.state) != position(&again) {
            return Err(PipelineError::SlotChanged { slot: name.clone() });
        }
        let remembered = &facts.remembered;
        let mode = match s.exactly_once {
            Some(_) => record::Mode::ExactlyOnce,
            None => record::Mode::AtLeastOnce,
        };
        let verdict = verdict::decide(&facts.input(name, mode, *self.acceptance));
        let record_lsn = remembered.this_system.as_ref().map(|r| r.end_lsn);
        if let Some(r) = record_lsn {
            self.metrics.progress_lsn.set(r.0);
        }
        let mut start = self
            .start_of(verdict, facts.identity, record_lsn, &facts.remembered)
            .map_err(|refusal| PipelineError::Gap(*refusal))?;
        start.cursor = facts.cursor;
        Ok((start, beside.finish().await))
    }

    /// What the verdict lets this session do, said in the log.
    fn start_of(
        &self,
        verdict: Verdict,
        identity: SystemIdentity,
        record_lsn: Option<Lsn>,
        remembered: &verdict::Remembered,
    ) -> Result<Start, Box<Refusal>> {
        let s = self.settings;
        let name = &s.slot.slot;
        let start = |create_slot, remembered, accepted| Start {
            create_slot,
            remembered,
            identity,
            accepted,
            cursor: None,
        };
        match verdict {
            Verdict::CreateSlot => {
                tracing::info!(slot = %name, "first start: no progress record and no slot; the slot is created once the set-up checks pass");
                Ok(start(true, None, false))
            }
            Verdict::Stream {
                notice,
                fresh_record,
            } => {
                match notice {
                    Some(Notice::TimelineChanged { from, to }) => tracing::info!(
                        slot = %name,
                        from_timeline = from,
                        to_timeline = to,
                        "the server's timeline changed since the progress record (a promoted standby); the slot is not ahead of the record, continuing"
                    ),
                    Some(Notice::NoRecord { confirmed }) => tracing::warn!(
                        slot = %name,
                        lsn = %confirmed,
                        topic = %s.progress_topic,
                        "the slot exists but no progress record remembers it (created by hand, or used by a Ferry without progress records): \
                         continuing from the slot's position and writing progress records from now on"
                    ),
                    None => {}
                }
                Ok(start(
                    false,
                    (!fresh_record).then_some(record_lsn).flatten(),
                    false,
                ))
            }
            Verdict::Accepted { gap, create_slot } => {
                tracing::warn!(
                    slot = %name,
                    gap = gap.kind(),
                    remembered = gap.accept_with().map(tracing::field::display),
                    bytes = gap.bytes(),
                    "accepting a gap (--accept-gap): {gap}; continuing from {}",
                    if create_slot { "a new slot" } else { "the slot's position" }
                );
                Ok(start(create_slot, None, true))
            }
            Verdict::Refuse { gap, offered } => Err(Box::new(Refusal {
                slot: name.clone(),
                gap,
                offered,
                replay_since: remembered.replay_since(),
            })),
        }
    }
}

/// Exactly-once: the brokers must serve Kafka transactions (issue 30; [`crate::broker_apis`]).
/// A broker that lacks them is a permanent error; brokers that do not answer a transient one
/// (no slot is created until they do); an answer Ferry cannot read is let through with a WARN
/// (the transaction calls themselves then fail permanently).
///
/// The question goes out at once, on a client of its own on the blocking pool
/// ([`transactions_probe`]); [`TransactionsProbe::judge`] waits for the answer and judges it, so
/// a session asks beside its verdict and judges after it.
pub(super) struct TransactionsProbe {
    /// `None` when the tests skip the check ([`SKIP_API_CHECK_ENV`]).
    answer: Option<tokio::task::JoinHandle<(Result<crate::broker_apis::Support, KafkaError>, u64)>>,
    /// When the question went out (a standby judges an answer it asked polls ago).
    pub asked: Instant,
}

/// Asks the brokers which APIs they serve, now (see [`TransactionsProbe`]).
pub(super) fn transactions_probe(s: &PipelineSettings) -> TransactionsProbe {
    if std::env::var_os(SKIP_API_CHECK_ENV).is_some() {
        // Tests only: the backstop behind this check (`first_start_failed`) is tested alone.
        return TransactionsProbe {
            answer: None,
            asked: Instant::now(),
        };
    }
    let (properties, topic) = (s.producer_properties.clone(), s.progress_topic.clone());
    TransactionsProbe {
        answer: Some(tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let support = crate::txn_probe::probe(&properties, &topic, PROBE_TIMEOUT);
            (support, started.elapsed().as_millis() as u64)
        })),
        asked: Instant::now(),
    }
}

impl TransactionsProbe {
    /// The answer, judged.
    pub(super) async fn judge(self) -> Result<(), PipelineError> {
        use crate::broker_apis::Support;
        let Some(answer) = self.answer else {
            return Ok(());
        };
        let asked_ms_ago = self.asked.elapsed().as_millis() as u64;
        let (support, probe_ms) = answer.await.map_err(|e| {
            PipelineError::ProducerFatal(format!("asking the brokers for their APIs: {e}"))
        })?;
        match support {
            Ok(Support::Supported) => {
                tracing::info!(
                    probe_ms,
                    asked_ms_ago,
                    "exactly-once: the Kafka brokers serve the transaction APIs Ferry uses"
                );
                Ok(())
            }
            Ok(Support::Missing(missing)) => Err(PipelineError::TransactionsUnsupported {
                what: crate::broker_apis::describe(&missing),
            }),
            Ok(Support::Unknown) => {
                tracing::warn!(
                    "exactly-once: could not read which APIs the Kafka brokers serve; assuming they support transactions"
                );
                Ok(())
            }
            Err(e) => Err(PipelineError::ProducerFatal(format!(
                "asking the Kafka brokers which APIs they serve: {e}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Beside;
    use std::time::Duration;
    use tokio::sync::oneshot;

    /// A deadline for a future that must not hang (a hang fails the test, it does not time it).
    async fn soon<F: std::future::Future>(f: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(30), f)
            .await
            .expect("hung: it should not wait for what runs beside")
    }

    #[tokio::test]
    async fn what_runs_beside_never_holds_up_the_read_it_runs_beside() {
        // Still running when the other ends: the other's answer comes at once, and the one
        // beside is still there to finish (or to drop, on a refusal).
        let (tx, rx) = oneshot::channel::<u32>();
        let mut beside = Beside::Running(Box::pin(async move { rx.await.unwrap() }));
        assert_eq!(soon(beside.alongside(async { 7 })).await, 7);
        assert!(matches!(beside, Beside::Running(_)));
        tx.send(3).unwrap();
        assert_eq!(soon(beside.finish()).await, 3);

        // Done first (the other waits for it): kept, and the other still runs to its end.
        let (tx, rx) = oneshot::channel::<u32>();
        let mut beside = Beside::Running(Box::pin(async move {
            tx.send(9).unwrap();
            5
        }));
        assert_eq!(soon(beside.alongside(async { rx.await.unwrap() })).await, 9);
        assert!(matches!(beside, Beside::Done(5)));
        assert_eq!(soon(beside.finish()).await, 5);
    }
}
