//! The machine itself: partitions, the batch being gathered, the write in flight.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::validate::{event_id, payload_problem};
use super::{
    DeadLetter, InboxAction, InboxConfig, InboxError, InboxRecord, InboxStats, Loaded, MarkAdvance,
    OffsetAdvance, Partition, Row, SeekTo, Write, WriteOutcome,
};
use crate::source_position::{SourcePosition, POSITION_HEADER, SOURCE_HEADER};

/// The inbox machine. See the [module docs](super).
#[derive(Debug)]
pub struct Inbox {
    config: InboxConfig,
    parts: BTreeMap<Partition, Part>,
    next_epoch: u64,
    next_load: u64,
    next_write: u64,
    pending: Pending,
    in_flight: Option<InFlight>,
    /// Revoked partitions the write in flight still touches.
    revoking: Vec<Partition>,
    /// After a failure: when to load every partition again, and with which load.
    retry: Option<(Instant, u64)>,
    backoff: Duration,
    cleanup_at: Option<Instant>,
    cleaning: bool,
    stopping: bool,
    stopped: bool,
    actions: VecDeque<InboxAction>,
    stats: InboxStats,
}

#[derive(Debug)]
enum Part {
    /// Its stored offset is being read (or will be, after a failure's wait) by this load.
    Loading {
        load: u64,
    },
    Active(Active),
}

#[derive(Debug)]
struct Active {
    /// The epoch of the latest seek: records fetched before it are not accepted.
    epoch: u64,
    /// The next offset the database holds.
    stored: Option<i64>,
    /// The next offset to accept (past what is gathered or in flight).
    next: Option<i64>,
    /// Each source's highest position, gathered or in flight included.
    marks: HashMap<Arc<str>, SourcePosition>,
}

#[derive(Debug)]
struct InFlight {
    id: u64,
    partitions: BTreeSet<Partition>,
}

#[derive(Debug, Default)]
struct Pending {
    entries: VecDeque<Entry>,
    bytes: usize,
    /// Event ids of the gathered rows: a repeat inside the batch is dropped.
    ids: HashSet<String>,
    /// When the oldest gathered record came.
    since: Option<Instant>,
}

#[derive(Debug)]
struct Entry {
    partition: Partition,
    offset: i64,
    size: usize,
    mark: Option<(Arc<str>, SourcePosition)>,
    fate: Fate,
}

#[derive(Debug)]
enum Fate {
    Row(Row),
    Dead(DeadLetter),
    RepeatedId,
    BelowMark,
}

impl Pending {
    fn clear(&mut self) {
        *self = Pending::default();
    }

    fn retain(&mut self, keep: impl Fn(&Partition) -> bool) {
        self.entries.retain(|e| keep(&e.partition));
        self.recount();
    }

    fn recount(&mut self) {
        self.bytes = self.entries.iter().map(|e| e.size).sum();
        self.ids = self
            .entries
            .iter()
            .filter_map(|e| match &e.fate {
                Fate::Row(r) => r.event_id.clone(),
                _ => None,
            })
            .collect();
        if self.entries.is_empty() {
            self.since = None;
        }
    }
}

impl Inbox {
    pub fn new(config: InboxConfig, now: Instant) -> Inbox {
        let cleanup_at = config.cleanup_interval.map(|i| now + i);
        Inbox {
            backoff: config.retry_min,
            config,
            parts: BTreeMap::new(),
            next_epoch: 1,
            next_load: 1,
            next_write: 1,
            pending: Pending::default(),
            in_flight: None,
            revoking: Vec::new(),
            retry: None,
            cleanup_at,
            cleaning: false,
            stopping: false,
            stopped: false,
            actions: VecDeque::new(),
            stats: InboxStats::default(),
        }
    }

    pub fn poll_action(&mut self) -> Option<InboxAction> {
        self.actions.pop_front()
    }

    pub fn stats(&self) -> InboxStats {
        self.stats
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Whether the driver may hand over more records now (memory is bounded by
    /// `max_buffered_bytes` plus the write in flight).
    pub fn wants_records(&self) -> bool {
        !self.stopping && self.pending.bytes < self.config.max_buffered_bytes
    }

    /// Partitions whose offsets are loaded and sought: the ones being consumed.
    pub fn active_partitions(&self) -> impl Iterator<Item = &Partition> {
        self.parts
            .iter()
            .filter(|(_, p)| matches!(p, Part::Active(_)))
            .map(|(k, _)| k)
    }

    /// Record bytes gathered and not yet in flight.
    pub fn buffered_bytes(&self) -> usize {
        self.pending.bytes
    }

    /// When [`Inbox::handle_timeout`] is next due, if anything waits on time.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let batch = match (self.in_flight.is_none(), self.pending.since) {
            (true, Some(since)) => Some(since + self.config.max_batch_delay),
            _ => None,
        };
        // A reload waits for the write in flight (its outcome comes first): its time is not due
        // until then.
        let retry = self
            .retry
            .filter(|_| self.in_flight.is_none())
            .map(|(at, _)| at);
        // No cleanup is asked for while stopping: its time must not wake the driver then.
        let cleanup = self.cleanup_at.filter(|_| !self.cleaning && !self.stopping);
        [batch, retry, cleanup].into_iter().flatten().min()
    }

    pub fn handle_assigned(&mut self, partitions: Vec<Partition>, now: Instant) {
        let load = match self.retry {
            Some((_, load)) => load,
            None => self.new_load(),
        };
        let fresh: Vec<Partition> = partitions
            .into_iter()
            .filter(|p| !self.parts.contains_key(p))
            .collect();
        for p in &fresh {
            self.parts.insert(p.clone(), Part::Loading { load });
        }
        if self.retry.is_none() && !fresh.is_empty() {
            self.actions.push_back(InboxAction::Load {
                load,
                partitions: fresh,
            });
        }
        self.pump(now);
    }

    pub fn handle_revoked(&mut self, partitions: Vec<Partition>, now: Instant) {
        let gone: BTreeSet<Partition> = partitions.into_iter().collect();
        for p in &gone {
            self.parts.remove(p);
        }
        self.pending.retain(|p| !gone.contains(p));
        let (wait, done): (Vec<Partition>, Vec<Partition>) = gone.into_iter().partition(|p| {
            self.in_flight
                .as_ref()
                .is_some_and(|f| f.partitions.contains(p))
        });
        self.revoking.extend(wait);
        if !done.is_empty() {
            self.actions.push_back(InboxAction::Revoked(done));
        }
        self.pump(now);
    }

    pub fn handle_loaded(&mut self, load: u64, result: Result<Vec<Loaded>, String>, now: Instant) {
        let ours = |p: &Part| matches!(p, Part::Loading { load: l } if *l == load);
        match result {
            Err(_) => {
                if self.parts.values().any(ours) {
                    self.fail(now);
                }
            }
            Ok(loaded) => {
                for l in loaded {
                    let Some(part) = self.parts.get_mut(&l.partition) else {
                        continue;
                    };
                    if !ours(part) {
                        continue;
                    }
                    let epoch = self.next_epoch;
                    self.next_epoch += 1;
                    *part = Part::Active(Active {
                        epoch,
                        stored: l.next,
                        next: l.next,
                        marks: l.marks.into_iter().collect(),
                    });
                    self.actions.push_back(InboxAction::Seek {
                        partition: l.partition,
                        to: l.next.map_or(SeekTo::Start, SeekTo::Offset),
                        epoch,
                    });
                }
            }
        }
        self.pump(now);
    }

    pub fn handle_record(&mut self, record: InboxRecord, now: Instant) {
        if self.stopping {
            return;
        }
        let Some(Part::Active(part)) = self.parts.get_mut(&record.partition) else {
            self.stats.stale += 1;
            return;
        };
        if record.epoch != part.epoch || part.next.is_some_and(|n| record.offset < n) {
            self.stats.stale += 1;
            return;
        }
        part.next = Some(record.offset + 1);
        self.stats.records += 1;
        let config = &self.config;
        let mut mark = None;
        let below = config.positions
            && match position_of(&record) {
                Some((source, pos)) => match part.marks.get_key_value(source) {
                    Some((_, m)) if *m >= pos => true,
                    found => {
                        let source: Arc<str> =
                            found.map_or_else(|| source.into(), |(k, _)| k.clone());
                        part.marks.insert(source.clone(), pos);
                        mark = Some((source, pos));
                        false
                    }
                },
                None => false,
            };
        let size = record.size();
        let partition = record.partition.clone();
        let offset = record.offset;
        let fate = if below {
            Fate::BelowMark
        } else {
            self.fate(record)
        };
        self.pending.bytes += size;
        self.pending.since.get_or_insert(now);
        self.pending.entries.push_back(Entry {
            partition,
            offset,
            size,
            mark,
            fate,
        });
        self.pump(now);
    }

    fn fate(&mut self, record: InboxRecord) -> Fate {
        let id = match &self.config.event_id_header {
            None => Ok(None),
            Some(h) => match record.header(h) {
                None => Ok(None),
                Some(v) => event_id(v, h).map(Some),
            },
        };
        let id = match id {
            Err(reason) => return Fate::Dead(DeadLetter { record, reason }),
            Ok(id) => id,
        };
        if let Some(reason) = record
            .payload
            .as_deref()
            .and_then(|p| payload_problem(p, self.config.payload))
        {
            return Fate::Dead(DeadLetter { record, reason });
        }
        if let Some(id) = &id {
            if !self.pending.ids.insert(id.clone()) {
                return Fate::RepeatedId;
            }
        }
        Fate::Row(Row {
            record,
            event_id: id,
        })
    }

    pub fn handle_written(&mut self, write: Write, outcome: WriteOutcome, now: Instant) {
        if self.in_flight.as_ref().map(|f| f.id) != Some(write.id) {
            return;
        }
        self.in_flight = None;
        match outcome {
            WriteOutcome::Committed {
                inserted,
                duplicates,
                dead_lettered,
            } => {
                self.stats.writes += 1;
                self.stats.inserted += inserted;
                self.stats.duplicates_by_id += duplicates + write.dropped_by_id;
                self.stats.duplicates_by_position += write.dropped_by_position;
                self.stats.dead_lettered += dead_lettered;
                let mut commits = Vec::with_capacity(write.offsets.len());
                for o in write.offsets {
                    if let Some(Part::Active(a)) = self.parts.get_mut(&o.partition) {
                        a.stored = Some(o.next);
                    }
                    commits.push((o.partition, o.next));
                }
                self.backoff = self.config.retry_min;
                self.actions.push_back(InboxAction::CommitOffsets(commits));
            }
            WriteOutcome::Fenced {
                partition,
                expected,
                found,
            } => {
                self.stop(Err(InboxError::Fenced {
                    partition,
                    expected,
                    found,
                }));
            }
            WriteOutcome::Rejected { .. } if !write.careful => self.again_carefully(write),
            WriteOutcome::Rejected { .. } | WriteOutcome::Failed { .. } => self.fail(now),
        }
        if self.in_flight.is_none() && !self.revoking.is_empty() {
            let done = std::mem::take(&mut self.revoking);
            self.actions.push_back(InboxAction::Revoked(done));
        }
        self.pump(now);
    }

    /// The same batch, row by row: what is still ours of it (a rebalance may have taken some).
    fn again_carefully(&mut self, mut write: Write) {
        let ours = |p: &Partition, parts: &BTreeMap<Partition, Part>| {
            matches!(parts.get(p), Some(Part::Active(_)))
        };
        let parts = &self.parts;
        write.rows.retain(|r| ours(&r.record.partition, parts));
        write
            .dead_letters
            .retain(|d| ours(&d.record.partition, parts));
        write.offsets.retain(|o| ours(&o.partition, parts));
        write.marks.retain(|m| ours(&m.partition, parts));
        if write.offsets.is_empty() {
            return;
        }
        write.careful = true;
        self.stats.careful_writes += 1;
        self.in_flight = Some(InFlight {
            id: write.id,
            partitions: write.offsets.iter().map(|o| o.partition.clone()).collect(),
        });
        self.actions.push_back(InboxAction::Write(write));
    }

    pub fn handle_cleaned(&mut self, result: Result<(), String>, now: Instant) {
        self.cleaning = false;
        if result.is_ok() {
            self.stats.cleanups += 1;
        }
        self.cleanup_at = self.config.cleanup_interval.map(|i| now + i);
        self.pump(now);
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.pump(now);
    }

    /// Write what is gathered, then stop.
    pub fn shutdown(&mut self, now: Instant) {
        self.stopping = true;
        self.pump(now);
    }

    fn new_load(&mut self) -> u64 {
        let l = self.next_load;
        self.next_load += 1;
        l
    }

    /// Forget everything in memory; after a wait, load every partition from the database again.
    fn fail(&mut self, now: Instant) {
        self.stats.failures += 1;
        self.pending.clear();
        let load = self.new_load();
        for part in self.parts.values_mut() {
            *part = Part::Loading { load };
        }
        self.retry = Some((now + self.backoff, load));
        self.backoff = (self.backoff * 2).min(self.config.retry_max);
        if self.stopping && self.in_flight.is_none() {
            // Nothing in memory is worth a retry when stopping: the database has what it has.
            self.stop(Ok(()));
        }
    }

    fn stop(&mut self, result: Result<(), InboxError>) {
        if !self.stopped {
            self.stopped = true;
            self.stopping = true;
            self.pending.clear();
            // Nothing is in flight when a machine stops: the partitions a write held past their
            // revocation are released now, for Stop is the last action.
            if !self.revoking.is_empty() {
                let done = std::mem::take(&mut self.revoking);
                self.actions.push_back(InboxAction::Revoked(done));
            }
            self.actions.push_back(InboxAction::Stop(result));
        }
    }

    fn pump(&mut self, now: Instant) {
        if self.stopped {
            return;
        }
        if let Some((at, load)) = self.retry {
            if now >= at && self.in_flight.is_none() {
                self.retry = None;
                let partitions: Vec<Partition> = self
                    .parts
                    .iter()
                    .filter(|(_, p)| matches!(p, Part::Loading { load: l } if *l == load))
                    .map(|(k, _)| k.clone())
                    .collect();
                if !partitions.is_empty() {
                    self.actions
                        .push_back(InboxAction::Load { load, partitions });
                }
            }
        }
        if self.in_flight.is_none() && self.batch_due(now) {
            self.send(now);
        }
        if self.stopping && self.in_flight.is_none() && self.pending.entries.is_empty() {
            self.stop(Ok(()));
            return;
        }
        if !self.stopping && !self.cleaning && self.cleanup_at.is_some_and(|at| now >= at) {
            self.cleaning = true;
            self.actions.push_back(InboxAction::Cleanup);
        }
    }

    fn batch_due(&self, now: Instant) -> bool {
        let Some(since) = self.pending.since else {
            return false;
        };
        self.stopping
            || self.pending.entries.len() >= self.config.max_batch_records
            || self.pending.bytes >= self.config.max_batch_bytes
            || now >= since + self.config.max_batch_delay
    }

    fn send(&mut self, now: Instant) {
        let mut write = Write {
            id: self.next_write,
            careful: false,
            rows: Vec::new(),
            dead_letters: Vec::new(),
            offsets: Vec::new(),
            marks: Vec::new(),
            dropped_by_id: 0,
            dropped_by_position: 0,
        };
        self.next_write += 1;
        let mut next: BTreeMap<Partition, i64> = BTreeMap::new();
        let mut marks: BTreeMap<(Partition, Arc<str>), SourcePosition> = BTreeMap::new();
        let (mut count, mut bytes) = (0usize, 0usize);
        while let Some(e) = self.pending.entries.front() {
            if count > 0
                && (count >= self.config.max_batch_records
                    || bytes + e.size > self.config.max_batch_bytes)
            {
                break;
            }
            let e = self.pending.entries.pop_front().expect("front exists");
            count += 1;
            bytes += e.size;
            next.insert(e.partition.clone(), e.offset + 1);
            if let Some((source, pos)) = e.mark {
                marks.insert((e.partition.clone(), source), pos);
            }
            match e.fate {
                Fate::Row(r) => {
                    if let Some(id) = &r.event_id {
                        self.pending.ids.remove(id);
                    }
                    write.rows.push(r)
                }
                Fate::Dead(d) => write.dead_letters.push(d),
                Fate::RepeatedId => write.dropped_by_id += 1,
                Fate::BelowMark => write.dropped_by_position += 1,
            }
        }
        if self.pending.entries.is_empty() {
            self.pending.clear();
        } else {
            // What stays gathered: its bytes, and the ids of its rows (each row's id is in `ids`
            // once, a repeat being no row), without walking it.
            self.pending.bytes -= bytes;
            self.pending.since = Some(now);
        }
        for (partition, n) in next {
            let Some(Part::Active(a)) = self.parts.get(&partition) else {
                unreachable!("gathered records belong to active partitions")
            };
            write.offsets.push(OffsetAdvance {
                partition,
                expected: a.stored,
                next: n,
            });
        }
        write.marks = marks
            .into_iter()
            .map(|((partition, source), position)| MarkAdvance {
                partition,
                source,
                position,
            })
            .collect();
        self.in_flight = Some(InFlight {
            id: write.id,
            partitions: write.offsets.iter().map(|o| o.partition.clone()).collect(),
        });
        self.actions.push_back(InboxAction::Write(write));
    }
}

/// A record's source and position, when it carries both headers well formed.
fn position_of(record: &InboxRecord) -> Option<(&str, SourcePosition)> {
    let source = std::str::from_utf8(record.header(SOURCE_HEADER)?).ok()?;
    let pos = SourcePosition::parse(record.header(POSITION_HEADER)?)?;
    Some((source, pos))
}
