//! The simulated Kafka: two topics of three partitions whose logs grow while the run goes, with
//! gaps in their offsets (transaction markers, compaction), and the producer that appends to
//! them:
//!
//! - events with an `id` header (a few with none, a few with an empty one: a dead letter);
//! - payloads that are not JSON (dead letters: the inbox's payload column is jsonb) and payloads
//!   the database refuses although they are JSON (header `sim-refuse`: a constraint);
//! - **upstream duplicates**: an event published again a little later (within [`DUP_WITHIN`]),
//!   in its partition or in any other;
//! - events of two `ferry run` sources with `ferry-source`/`ferry-position` headers, routed by
//!   key, and their **replays** (Ferry's at-least-once): a suffix of a source's recent records
//!   appended again to the partitions they went to.

use std::sync::Arc;

use bytes::Bytes;
use ferry_core::inbox::{InboxRecord, Partition};
use ferry_core::source_position::{SourcePosition, POSITION_HEADER, SOURCE_HEADER};
use ferry_core::testing::Rng;
use ferry_pgtypes::Lsn;

use super::Seen;

pub const TOPICS: [&str; 2] = ["orders", "payments"];
pub const PARTITIONS: usize = 3;
pub const LOGS: usize = TOPICS.len() * PARTITIONS;
/// The database refuses a row carrying this header (a constraint), valid JSON or not.
pub const REFUSE_HEADER: &str = "sim-refuse";
/// Upstream duplicates and replays copy events at most this many ticks old: well within the
/// deduplication window.
pub const DUP_WITHIN: u64 = 20;
const KEYS: u64 = 12;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Good,
    /// Good, without an `id` header: never deduplicated by id.
    NoId,
    NonJson,
    /// An empty `id` header.
    BadId,
    /// JSON the database refuses.
    Refuse,
}

impl Kind {
    /// Meant for the dead-letter table.
    pub fn poison(self) -> bool {
        matches!(self, Kind::NonJson | Kind::BadId | Kind::Refuse)
    }
}

/// What became of a record, once its partition's stored offset passed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Inbox,
    Dead,
    DupId,
    DupPos,
}

#[derive(Debug)]
pub struct Event {
    pub kind: Kind,
    /// The event id, when the header holds a valid one.
    pub id: Option<String>,
    pub key: Bytes,
    pub payload: Bytes,
    pub headers: Vec<(String, Option<Bytes>)>,
    pub position: Option<(Arc<str>, SourcePosition)>,
    /// The log its first copy went to (a replay goes there again).
    pub log: usize,
    pub produced: u64,
}

#[derive(Debug)]
pub struct KRecord {
    pub offset: i64,
    /// Index into [`Kafka::events`]: copies share their event.
    pub event: usize,
    /// When it was appended.
    pub produced: u64,
    pub fate: Option<Fate>,
}

#[derive(Debug, Default)]
pub struct Log {
    pub records: Vec<KRecord>,
    /// The offset the next record gets (or more: a gap).
    pub end: i64,
    /// The group's committed offset in Kafka (advisory: where a fresh assignment starts
    /// fetching before the machine seeks).
    pub committed: Option<i64>,
}

impl Log {
    /// The index of the first record at or past `offset`.
    pub fn from(&self, offset: i64) -> usize {
        self.records.partition_point(|r| r.offset < offset)
    }

    pub fn get(&self, offset: i64) -> Option<&KRecord> {
        let i = self.from(offset);
        self.records.get(i).filter(|r| r.offset == offset)
    }

    /// The offset after the last record: where a consumer that has everything stands.
    pub fn done_at(&self) -> Option<i64> {
        self.records.last().map(|r| r.offset + 1)
    }
}

#[derive(Debug)]
struct Source {
    name: Arc<str>,
    lsn: u64,
    index: u32,
    events: Vec<usize>,
}

#[derive(Debug)]
pub struct Kafka {
    pub partitions: Vec<Partition>,
    pub logs: Vec<Log>,
    pub events: Vec<Event>,
    sources: Vec<Source>,
}

impl Kafka {
    pub fn new(rng: &mut Rng) -> Kafka {
        let partitions = TOPICS
            .iter()
            .flat_map(|t| (0..PARTITIONS as i32).map(move |p| Partition::new(*t, p)))
            .collect();
        let sources = ["billing", "crm"]
            .into_iter()
            .map(|name| Source {
                name: name.into(),
                lsn: 0x16B_3748 + rng.below(1 << 40),
                index: 0,
                events: Vec::new(),
            })
            .collect();
        Kafka {
            partitions,
            logs: (0..LOGS).map(|_| Log::default()).collect(),
            events: Vec::new(),
            sources,
        }
    }

    pub fn log_of(&self, p: &Partition) -> usize {
        let t = TOPICS
            .iter()
            .position(|t| **t == *p.topic)
            .expect("a simulated topic");
        t * PARTITIONS + usize::try_from(p.partition).expect("a partition number")
    }

    pub fn record_count(&self) -> usize {
        self.logs.iter().map(|l| l.records.len()).sum()
    }

    /// The record as the consumer hands it over, tagged with the epoch of its fetch.
    pub fn inbox_record(&self, log: usize, r: &KRecord, epoch: u64) -> InboxRecord {
        let e = &self.events[r.event];
        InboxRecord {
            partition: self.partitions[log].clone(),
            offset: r.offset,
            epoch,
            key: Some(e.key.clone()),
            payload: Some(e.payload.clone()),
            headers: e.headers.clone(),
            timestamp_ms: Some(1_700_000_000_000 + e.produced as i64),
        }
    }

    /// The producer's turn: a new event, an upstream duplicate of a recent one, or a source's
    /// replay. Returns what it did, for the trace.
    pub fn produce(&mut self, rng: &mut Rng, tick: u64, seen: &mut Seen) -> String {
        match rng.below(100) {
            0..=7 => {
                let recent: Vec<usize> = self
                    .recent(tick)
                    .filter(|&i| self.events[i].id.is_some() && self.events[i].position.is_none())
                    .collect();
                if !recent.is_empty() {
                    let e = recent[rng.below(recent.len() as u64) as usize];
                    let log = match rng.percent(50) {
                        true => self.events[e].log,
                        false => rng.below(LOGS as u64) as usize,
                    };
                    seen.upstream_duplicates += 1;
                    let at = self.append(rng, tick, log, e);
                    return format!("upstream duplicate of event {e} at {log}@{at}");
                }
            }
            8..=10 => {
                let s = rng.below(self.sources.len() as u64) as usize;
                let recent: Vec<usize> = self.sources[s]
                    .events
                    .iter()
                    .rev()
                    .take(5)
                    .take_while(|&&e| self.events[e].produced + DUP_WITHIN >= tick)
                    .copied()
                    .collect();
                if !recent.is_empty() {
                    let k = 1 + rng.below(recent.len() as u64) as usize;
                    seen.replays += 1;
                    let mut done = Vec::new();
                    for &e in recent[..k].iter().rev() {
                        let log = self.events[e].log;
                        let at = self.append(rng, tick, log, e);
                        done.push(format!("{e}→{log}@{at}"));
                    }
                    return format!("{} replays {}", self.sources[s].name, done.join(" "));
                }
            }
            _ => {}
        }
        self.new_event(rng, tick, seen)
    }

    /// Events produced within [`DUP_WITHIN`], newest first.
    fn recent(&self, tick: u64) -> impl Iterator<Item = usize> + '_ {
        (0..self.events.len())
            .rev()
            .take_while(move |&i| self.events[i].produced + DUP_WITHIN >= tick)
    }

    fn new_event(&mut self, rng: &mut Rng, tick: u64, seen: &mut Seen) -> String {
        let n = self.events.len();
        let kind = match rng.below(100) {
            0..=3 => Kind::NonJson,
            4..=5 => Kind::BadId,
            6..=9 => Kind::Refuse,
            10..=13 => Kind::NoId,
            _ => Kind::Good,
        };
        match kind {
            Kind::NonJson => seen.non_json += 1,
            Kind::BadId => seen.bad_ids += 1,
            Kind::Refuse => seen.refusing += 1,
            Kind::NoId => seen.no_ids += 1,
            Kind::Good => {}
        }
        let id = match kind {
            Kind::NoId | Kind::BadId => None,
            _ => Some(format!("ev-{n:05}")),
        };
        let key_n = rng.below(KEYS);
        let log = rng.below(TOPICS.len() as u64) as usize * PARTITIONS
            + (key_n % PARTITIONS as u64) as usize;
        let pad = "x".repeat(rng.below(100) as usize);
        let payload = match kind {
            Kind::NonJson if rng.percent(50) => Bytes::from(vec![0xff, 0xfe, b'{']),
            Kind::NonJson => Bytes::from(format!("not json {n} {pad}")),
            _ => Bytes::from(format!(r#"{{"n":{n},"pad":"{pad}"}}"#)),
        };
        let mut headers: Vec<(String, Option<Bytes>)> = Vec::new();
        match (&id, kind) {
            (_, Kind::BadId) => headers.push(("id".into(), Some(Bytes::new()))),
            (Some(id), _) => headers.push(("id".into(), Some(Bytes::from(id.clone())))),
            (None, _) => {}
        }
        if kind == Kind::Refuse {
            headers.push((REFUSE_HEADER.into(), Some(Bytes::from_static(b"1"))));
        }
        let position = match rng.percent(40) {
            false => None,
            true => {
                let src = &mut self.sources[rng.below(2) as usize];
                if rng.percent(50) {
                    src.lsn += rng.range(1, 4_000);
                    src.index = 0;
                } else {
                    src.index += 1;
                }
                let pos = SourcePosition {
                    commit_lsn: Lsn(src.lsn),
                    index: src.index,
                };
                let text = format!("{}:{}", pos.commit_lsn, pos.index);
                assert_eq!(SourcePosition::parse(text.as_bytes()), Some(pos), "{text}");
                headers.push((
                    SOURCE_HEADER.into(),
                    Some(Bytes::from(src.name.to_string())),
                ));
                headers.push((POSITION_HEADER.into(), Some(Bytes::from(text))));
                src.events.push(n);
                Some((src.name.clone(), pos))
            }
        };
        self.events.push(Event {
            kind,
            id,
            key: Bytes::from(format!("k{key_n}")),
            payload,
            headers,
            position,
            log,
            produced: tick,
        });
        let at = self.append(rng, tick, log, n);
        format!("event {n} {kind:?} at {log}@{at}")
    }

    /// Appends a copy of event `e` to `log`, sometimes after a gap; returns its offset.
    fn append(&mut self, rng: &mut Rng, tick: u64, log: usize, e: usize) -> i64 {
        let l = &mut self.logs[log];
        if rng.percent(10) {
            l.end += rng.range(1, 3) as i64;
        }
        let offset = l.end;
        l.end += 1;
        l.records.push(KRecord {
            offset,
            event: e,
            produced: tick,
            fate: None,
        });
        offset
    }
}
