//! The simulated PostgreSQL: the inbox, the deduplication table (event id → received), the dead
//! letters, the offsets (next offset per partition, nullable) and the marks, with a [`Write`]
//! applied atomically as the module docs of `ferry_core::inbox` say: every partition's offset
//! advanced only if it still is what the batch expected (else `Fenced`, rolled back), rows
//! stored only when their event id is new, a refused row rolling everything back (`Rejected`),
//! or, carefully, going to the dead letters alone.
//!
//! Applying a write also checks it against Kafka (the guarantees of `inbox_simulation.rs`): the
//! records of every partition between the offset it expected and the one it stores each get one
//! fate (a row, a dead letter, a duplicate by id or by position), each for a reason; none gets
//! two; rows of a partition come in offset order; an id is stored once; a partition someone
//! else committed since this copy loaded it is never committed by this copy, and a copy is
//! fenced only when someone else did.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use ferry_core::inbox::{Loaded, Partition, Write, WriteOutcome};
use ferry_core::source_position::SourcePosition;

use super::kafka::{Fate, Kafka, Kind, LOGS};
use super::Seen;

#[derive(Debug)]
pub struct Db {
    /// Per log: `None` while its row does not exist, then its nullable next offset.
    offsets: Vec<Option<Option<i64>>>,
    /// Every next offset each partition ever committed.
    history: Vec<HashSet<i64>>,
    marks: Vec<HashMap<Arc<str>, SourcePosition>>,
    /// The latest commit to each partition: by which instance, and its commit number.
    last_commit: Vec<Option<(usize, u64)>>,
    /// Commits so far (a load remembers the number it saw).
    pub seq: u64,
    /// Event ids in the inbox, with when they were stored.
    inbox_ids: HashMap<String, u64>,
    dead_ids: HashSet<String>,
    dedup: HashMap<String, u64>,
    /// Dedup rows in the order they were received (stale entries skipped lazily).
    dedup_order: VecDeque<(u64, String)>,
    /// Ids whose dedup row a cleanup deleted, and when (diagnostics).
    cleaned: HashMap<String, u64>,
    /// Per log, the offset of its last row (rows come in offset order).
    last_row: Vec<Option<i64>>,
    /// Ids dropped as repeats in a batch that did not write their first copy (a rebalance took
    /// that copy's partition): the id must be stored by the end.
    deferred: Vec<(String, usize, i64)>,
    window: u64,
    /// The longest a record waited between its append and its partition's commit past it.
    pub max_lag: u64,
    /// The longest between an id's first store and a later copy's commit.
    pub max_dup_gap: u64,
}

impl Db {
    pub fn new(window: u64) -> Db {
        Db {
            offsets: vec![None; LOGS],
            history: vec![HashSet::new(); LOGS],
            marks: vec![HashMap::new(); LOGS],
            last_commit: vec![None; LOGS],
            seq: 0,
            inbox_ids: HashMap::new(),
            dead_ids: HashSet::new(),
            dedup: HashMap::new(),
            dedup_order: VecDeque::new(),
            cleaned: HashMap::new(),
            last_row: vec![None; LOGS],
            deferred: Vec::new(),
            window,
            max_lag: 0,
            max_dup_gap: 0,
        }
    }

    pub fn stored(&self, log: usize) -> Option<i64> {
        self.offsets[log].flatten()
    }

    pub fn committed_ever(&self, log: usize, next: i64) -> bool {
        self.history[log].contains(&next)
    }

    /// Reads the partitions' offsets and marks, creating their offset rows; with the commit
    /// number the read saw.
    pub fn load(&mut self, kafka: &Kafka, partitions: &[Partition]) -> (Vec<Loaded>, u64) {
        let loaded = partitions
            .iter()
            .map(|p| {
                let l = kafka.log_of(p);
                let next = *self.offsets[l].get_or_insert(None);
                let mut marks: Vec<(Arc<str>, SourcePosition)> =
                    self.marks[l].iter().map(|(s, m)| (s.clone(), *m)).collect();
                // In one order, for the trace to replay alike.
                marks.sort();
                Loaded {
                    partition: p.clone(),
                    next,
                    marks,
                }
            })
            .collect();
        (loaded, self.seq)
    }

    /// Deletes the dedup rows older than the window; returns how many.
    pub fn cleanup(&mut self, tick: u64) -> u64 {
        let mut deleted = 0;
        while let Some((received, id)) = self.dedup_order.front() {
            if received + self.window >= tick {
                break;
            }
            if self.dedup.get(id) == Some(received) {
                self.dedup.remove(id);
                self.cleaned.insert(id.clone(), tick);
                deleted += 1;
            }
            self.dedup_order.pop_front();
        }
        deleted
    }

    /// When the oldest dedup row was received, if before `before`.
    pub fn oldest_dedup(&mut self, before: u64) -> Option<(u64, &str)> {
        while let Some((received, id)) = self.dedup_order.front() {
            if *received >= before {
                // Rows come in the order received: none is older.
                return None;
            }
            if self.dedup.get(id) == Some(received) {
                break;
            }
            self.dedup_order.pop_front();
        }
        self.dedup_order.front().map(|(r, id)| (*r, id.as_str()))
    }

    /// One transaction, by instance `inst` whose loads saw commit numbers `loaded` (per log).
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &mut self,
        kafka: &mut Kafka,
        w: &Write,
        inst: usize,
        loaded: &HashMap<usize, u64>,
        positions: bool,
        tick: u64,
        seen: &mut Seen,
    ) -> WriteOutcome {
        // 1. `UPDATE … WHERE next_offset IS NOT DISTINCT FROM expected`, every partition.
        for o in &w.offsets {
            let l = kafka.log_of(&o.partition);
            let found = self.offsets[l].flatten();
            if self.offsets[l].is_some() && found == o.expected {
                continue;
            }
            let since = loaded.get(&l).copied().unwrap_or(0);
            match self.last_commit[l] {
                Some((by, at)) if by != inst && at > since => {}
                last => panic!(
                    "instance {inst} is fenced on {} (expected {:?}, found {found:?}) although no \
                     other instance committed it since its load (at commit {since}; last commit \
                     {last:?})",
                    o.partition, o.expected
                ),
            }
            return WriteOutcome::Fenced {
                partition: o.partition.clone(),
                expected: o.expected,
                found,
            };
        }

        // 2. Dedup ids (`ON CONFLICT DO NOTHING`), then the rows whose id was new; a refused row
        // rolls back, or is dead-lettered alone when careful.
        let mut row_fate = Vec::with_capacity(w.rows.len());
        let mut batch_ids: HashSet<&str> = HashSet::new();
        let mut refused = 0u64;
        for r in &w.rows {
            let l = kafka.log_of(&r.record.partition);
            let Some(rec) = kafka.logs[l].get(r.record.offset) else {
                panic!(
                    "a row for {}@{}, where the log has no record",
                    r.record.partition, r.record.offset
                );
            };
            let e = &kafka.events[rec.event];
            assert!(
                r.event_id == e.id && r.record.payload.as_ref() == Some(&e.payload),
                "the row of {}@{} is not its record",
                r.record.partition,
                r.record.offset
            );
            if let Some(id) = &r.event_id {
                assert!(
                    batch_ids.insert(id),
                    "two rows with event id {id} in write {}",
                    w.id
                );
            }
            let known = r
                .event_id
                .as_ref()
                .is_some_and(|id| self.dedup.contains_key(id));
            row_fate.push(if known {
                Fate::DupId
            } else if matches!(e.kind, Kind::NonJson | Kind::Refuse | Kind::BadId) {
                if !w.careful {
                    return WriteOutcome::Rejected {
                        error: format!(
                            "new row for relation \"inbox\" violates check constraint ({}@{})",
                            r.record.partition, r.record.offset
                        ),
                    };
                }
                refused += 1;
                Fate::Dead
            } else {
                Fate::Inbox
            });
        }

        // 3. The records each partition's advance covers: one fate each, for a reason.
        let rows: HashMap<(usize, i64), usize> = w
            .rows
            .iter()
            .enumerate()
            .map(|(i, r)| ((kafka.log_of(&r.record.partition), r.record.offset), i))
            .collect();
        let dead: HashSet<(usize, i64)> = w
            .dead_letters
            .iter()
            .map(|d| (kafka.log_of(&d.record.partition), d.record.offset))
            .collect();
        assert_eq!(
            (rows.len(), dead.len()),
            (w.rows.len(), w.dead_letters.len()),
            "a record twice in write {}",
            w.id
        );
        let (mut matched, mut by_position, mut by_id) = (0, 0, 0);
        let mut new_marks = Vec::new();
        for o in &w.offsets {
            let l = kafka.log_of(&o.partition);
            let p = &o.partition;
            let start = o.expected.unwrap_or(0);
            assert!(
                o.next > start,
                "write {} moves the offset of {p} from {start} to {}",
                w.id,
                o.next
            );
            if let Some(last) = self.last_commit[l] {
                let since = loaded.get(&l).copied().unwrap_or(0);
                assert!(
                    last.0 == inst || last.1 <= since,
                    "instance {inst} commits {p} although instance {} committed it (commit {}) \
                     after this one loaded it (at commit {since}): fencing failed",
                    last.0,
                    last.1
                );
            }
            let mut marks = self.marks[l].clone();
            let Kafka { logs, events, .. } = &mut *kafka;
            let log = &mut logs[l];
            let first = log.from(start);
            for rec in log.records[first..].iter_mut() {
                if rec.offset >= o.next {
                    break;
                }
                let e = &events[rec.event];
                let at = (l, rec.offset);
                let below = positions
                    && e.position
                        .as_ref()
                        .is_some_and(|(s, pos)| marks.get(s).is_some_and(|m| m >= pos));
                if positions && !below {
                    if let Some((s, pos)) = &e.position {
                        marks.insert(s.clone(), *pos);
                    }
                }
                let what = || format!("{p}@{} (event {}, {:?})", rec.offset, rec.event, e.kind);
                let fate = match (rows.get(&at), dead.contains(&at)) {
                    (Some(_), true) => panic!("{} is both a row and a dead letter", what()),
                    (Some(&i), false) => {
                        assert!(
                            !below,
                            "{} is at or below its source's mark: a replay, stored",
                            what()
                        );
                        matched += 1;
                        row_fate[i]
                    }
                    (None, true) => {
                        assert!(
                            !below,
                            "{} is at or below its source's mark: a replay, dead-lettered",
                            what()
                        );
                        assert!(
                            e.kind.poison(),
                            "{} is a good record, dead-lettered",
                            what()
                        );
                        matched += 1;
                        Fate::Dead
                    }
                    (None, false) if below => {
                        by_position += 1;
                        Fate::DupPos
                    }
                    (None, false) => {
                        let Some(id) = &e.id else {
                            panic!(
                                "{} is lost: write {} of instance {inst} moves the offset past \
                                 it without a row, a dead letter, or a reason to drop it",
                                what(),
                                w.id
                            );
                        };
                        by_id += 1;
                        if !batch_ids.contains(id.as_str()) && !self.dedup.contains_key(id) {
                            seen.deferred_id_drops += 1;
                            self.deferred.push((id.clone(), l, rec.offset));
                        }
                        Fate::DupId
                    }
                };
                if let Some(old) = rec.fate {
                    panic!(
                        "{} is stored twice: {old:?}, and now {fate:?} by write {} of instance \
                         {inst}",
                        what(),
                        w.id
                    );
                }
                rec.fate = Some(fate);
                if let Some(first) = e.id.as_ref().and_then(|id| self.inbox_ids.get(id)) {
                    self.max_dup_gap = self.max_dup_gap.max(tick - first);
                }
                self.max_lag = self.max_lag.max(tick - rec.produced);
            }
            for (s, pos) in &marks {
                if self.marks[l].get(s) != Some(pos) {
                    assert!(
                        w.marks
                            .iter()
                            .any(|m| m.partition == *p && m.source == *s && m.position == *pos),
                        "write {} does not advance the mark of {s} on {p} to {pos:?}: {:?}",
                        w.id,
                        w.marks
                    );
                }
            }
            new_marks.push((l, marks));
        }
        assert_eq!(
            matched,
            w.rows.len() + w.dead_letters.len(),
            "write {} holds records outside the offsets it advances: {:?}",
            w.id,
            w.offsets
        );
        let n_marks: usize = new_marks
            .iter()
            .map(|(l, m)| {
                m.iter()
                    .filter(|(s, p)| self.marks[*l].get(*s) != Some(p))
                    .count()
            })
            .sum();
        assert_eq!(
            n_marks,
            w.marks.len(),
            "write {}: marks {:?}",
            w.id,
            w.marks
        );
        if w.careful {
            // Sent again without a rebalance's partitions: the counts still hold theirs.
            assert!(
                w.dropped_by_position >= by_position && w.dropped_by_id >= by_id,
                "careful write {}: dropped {}+{} records by position and by id, fewer than the {}+{} \
                 its offsets pass",
                w.id,
                w.dropped_by_position,
                w.dropped_by_id,
                by_position,
                by_id
            );
        } else {
            assert_eq!(
                (w.dropped_by_position, w.dropped_by_id),
                (by_position, by_id),
                "write {}: records dropped by position and by id",
                w.id
            );
        }

        // 4. Commit.
        self.seq += 1;
        for o in &w.offsets {
            let l = kafka.log_of(&o.partition);
            self.offsets[l] = Some(Some(o.next));
            self.history[l].insert(o.next);
            self.last_commit[l] = Some((inst, self.seq));
        }
        for (l, marks) in new_marks {
            for (s, pos) in &marks {
                if let Some(old) = self.marks[l].get(s) {
                    assert!(old <= pos, "the mark of {s} on log {l} goes back");
                }
            }
            self.marks[l] = marks;
        }
        let (mut inserted, mut duplicates) = (0, 0);
        for (r, fate) in w.rows.iter().zip(&row_fate) {
            let l = kafka.log_of(&r.record.partition);
            match fate {
                Fate::DupId => duplicates += 1,
                Fate::Dead => {
                    if let Some(id) = &r.event_id {
                        self.dead_ids.insert(id.clone());
                    }
                }
                _ => {
                    inserted += 1;
                    let off = r.record.offset;
                    assert!(
                        self.last_row[l].is_none_or(|last| last < off),
                        "{}@{off} stored after offset {:?} of its partition: out of order",
                        r.record.partition,
                        self.last_row[l]
                    );
                    self.last_row[l] = Some(off);
                    if let Some(id) = &r.event_id {
                        if let Some(first) = self.inbox_ids.get(id) {
                            let why = match self.cleaned.get(id) {
                                Some(c) => format!(
                                    "its dedup row was cleaned at {c}: the duplicate came after \
                                     the window"
                                ),
                                None => "its dedup row was there".into(),
                            };
                            panic!(
                                "event id {id} stored twice ({}@{off} now, first at tick {first}; \
                                 {why})",
                                r.record.partition
                            );
                        }
                        self.inbox_ids.insert(id.clone(), tick);
                        self.dedup.insert(id.clone(), tick);
                        self.dedup_order.push_back((tick, id.clone()));
                    }
                }
            }
        }
        for d in &w.dead_letters {
            let l = kafka.log_of(&d.record.partition);
            if let Some(id) =
                &kafka.events[kafka.logs[l].get(d.record.offset).expect("checked").event].id
            {
                self.dead_ids.insert(id.clone());
            }
        }
        WriteOutcome::Committed {
            inserted,
            duplicates,
            dead_lettered: w.dead_letters.len() as u64 + refused,
        }
    }

    /// The end: every record has a fate, every good id is in the inbox once, ids dropped as
    /// repeats of a copy that another batch wrote are stored.
    pub fn finish(&self, kafka: &Kafka) {
        let mut good: HashSet<&str> = HashSet::new();
        for (l, log) in kafka.logs.iter().enumerate() {
            for rec in &log.records {
                let e = &kafka.events[rec.event];
                assert!(
                    rec.fate.is_some(),
                    "{}@{} (event {}) was never stored: the partition's offset is {:?}",
                    kafka.partitions[l],
                    rec.offset,
                    rec.event,
                    self.stored(l)
                );
                if let (Some(id), false) = (&e.id, e.kind.poison()) {
                    good.insert(id);
                }
            }
        }
        for id in good {
            assert!(
                self.inbox_ids.contains_key(id),
                "event id {id} is not in the inbox"
            );
        }
        for (id, l, offset) in &self.deferred {
            assert!(
                self.inbox_ids.contains_key(id) || self.dead_ids.contains(id),
                "{}@{offset} was dropped as a repeat of event id {id}, which never was stored",
                kafka.partitions[*l]
            );
        }
    }
}
