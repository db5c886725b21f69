//! The simulated PostgreSQL: a WAL of random transactions (some larger than the in-flight
//! window, some empty, with messages and rows the router rejects), idle keepalives between them,
//! and a slot whose `confirmed_flush_lsn` moves when a status update reaches the server; every
//! session replays from it.

use std::sync::Arc;

use bytes::Bytes;
use ferry_core::testing::Rng;
use ferry_wal::assembly::{OutboxEvent, OutboxMessage, OutboxRow, RelationInfo};
use ferry_wal::pgoutput::TupleValue;
use ferry_wal::Lsn;

use crate::common::{begin, commit, relation};

/// Aggregate ids ("key-0" .. "key-4").
pub const KEYS: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Row,
    Message,
    /// A row the router rejects (NULL payload).
    Poison,
}

#[derive(Debug, Clone)]
pub struct Event {
    /// From 1, in WAL order across transactions.
    pub id: u64,
    pub key: u8,
    pub kind: Kind,
    pub payload_len: usize,
}

#[derive(Debug, Clone)]
pub struct Txn {
    pub xid: u32,
    pub commit_lsn: u64,
    pub end_lsn: u64,
    pub events: Vec<Event>,
    /// The keepalive `wal_end` sent after it (at most the next transaction's `commit_lsn`).
    pub keepalive: Option<u64>,
}

/// Random transactions: 20 to 60, a tenth empty, a tenth of 10 to 40 events (larger than the
/// window, sometimes), the rest of 1 to 4; a commit record sometimes starts exactly where the
/// previous one ended.
pub fn generate(rng: &mut Rng) -> Vec<Txn> {
    let mut txns = Vec::new();
    let mut lsn = 1_000 + rng.below(1_000);
    let mut id = 0;
    for xid in 0..(20 + rng.below(40)) as u32 {
        let commit_lsn = lsn + rng.below(3) * 8;
        let end_lsn = commit_lsn + 8 + rng.below(16);
        let n = match rng.below(10) {
            0 => 0,
            1 => 10 + rng.below(30),
            _ => 1 + rng.below(4),
        };
        let events = (0..n)
            .map(|_| {
                id += 1;
                let kind = match rng.below(100) {
                    0..=3 => Kind::Poison,
                    4..=14 => Kind::Message,
                    _ => Kind::Row,
                };
                Event {
                    id,
                    key: rng.below(KEYS as u64) as u8,
                    kind,
                    payload_len: rng.below(200) as usize,
                }
            })
            .collect();
        txns.push(Txn {
            xid,
            commit_lsn,
            end_lsn,
            events,
            keepalive: None,
        });
        lsn = end_lsn + rng.below(2) * (1 + rng.below(20));
    }
    for i in 0..txns.len() {
        let next = txns.get(i + 1).map_or(u64::MAX, |t| t.commit_lsn);
        if rng.percent(30) {
            let end = txns[i].end_lsn;
            txns[i].keepalive = Some(end + rng.below(next.saturating_sub(end).min(50) + 1));
        }
    }
    txns
}

/// What the reader hands over next.
#[derive(Debug)]
pub enum Next {
    Outbox(OutboxEvent),
    Keepalive(Lsn),
    /// The transaction is over and no keepalive follows it.
    Nothing,
}

/// The server: the WAL and the slot.
#[derive(Debug)]
pub struct Pg {
    pub txns: Vec<Txn>,
    rel: Arc<RelationInfo>,
    /// The slot's `confirmed_flush_lsn` (what a status update last reported).
    pub slot: u64,
    /// Where the slot was created.
    pub created_at: u64,
    /// Confirmed by Ferry, not yet carried to the server by a status update.
    pending: Option<u64>,
    /// The reader: transaction index, and its next step (0 = Begin, 1.. = events, len + 1 =
    /// Commit, len + 2 = the keepalive after it).
    pos: (usize, usize),
    /// The keepalive a session that resumes past the last transaction gets first, when the
    /// server's WAL end is past the slot (what it sends before it waits for more WAL).
    resend: Option<u64>,
}

impl Pg {
    pub fn new(rng: &mut Rng) -> Pg {
        let txns = generate(rng);
        let slot = txns[0].commit_lsn - 1;
        Pg {
            txns,
            rel: relation(ferry_router::oid::JSONB),
            slot,
            created_at: slot,
            pending: None,
            pos: (0, 0),
            resend: None,
        }
    }

    /// A session starts streaming: the server replays every transaction that ends after the
    /// slot. Returns the position it resumes from.
    pub fn resume(&mut self) -> u64 {
        let first = self
            .txns
            .iter()
            .position(|t| t.end_lsn > self.slot)
            .unwrap_or(self.txns.len());
        self.pos = (first, 0);
        self.resend =
            (first == self.txns.len() && self.idle_end() > self.slot).then(|| self.idle_end());
        self.slot
    }

    /// Every transaction was handed over, and the keepalive owed a resumed session.
    pub fn done(&self) -> bool {
        self.pos.0 >= self.txns.len() && self.resend.is_none()
    }

    /// The transaction being read (the one a record produced now belongs to).
    pub fn current(&self) -> usize {
        self.pos.0
    }

    pub fn last_end(&self) -> u64 {
        self.txns.last().map_or(0, |t| t.end_lsn)
    }

    /// The server's WAL end once everything was sent: the last transaction's end, or the
    /// keepalive after it. Nothing follows, so the server sends no other keepalive to a session
    /// that already received it.
    pub fn idle_end(&self) -> u64 {
        self.txns
            .last()
            .map_or(0, |t| t.keepalive.unwrap_or(0).max(t.end_lsn))
    }

    /// The reader's next message.
    pub fn next(&mut self) -> Next {
        if let Some(k) = self.resend.take() {
            return Next::Keepalive(Lsn(k));
        }
        let (ti, step) = self.pos;
        let t = &self.txns[ti];
        self.pos.1 += 1;
        if step == 0 {
            return Next::Outbox(begin(t.xid, t.commit_lsn));
        }
        if let Some(e) = t.events.get(step - 1) {
            return Next::Outbox(outbox_event(&self.rel, t, e));
        }
        if step == t.events.len() + 1 {
            return Next::Outbox(commit(t.xid, t.commit_lsn, t.end_lsn));
        }
        self.pos = (ti + 1, 0);
        t.keepalive
            .map_or(Next::Nothing, |k| Next::Keepalive(Lsn(k)))
    }

    /// Ferry confirmed `lsn`: a status update carries it now, most of the time, or later.
    pub fn confirmed(&mut self, lsn: u64, now: bool) {
        if now {
            self.slot = self.slot.max(lsn);
        } else {
            self.pending = Some(self.pending.map_or(lsn, |p| p.max(lsn)));
        }
    }

    /// A status update (a periodic one, or the last one of a session that ends).
    pub fn status_update(&mut self) {
        if let Some(p) = self.pending.take() {
            self.slot = self.slot.max(p);
        }
    }

    /// The process died: what it confirmed and did not report is lost.
    pub fn crash(&mut self) {
        self.pending = None;
    }
}

/// The longest pad a payload has.
const MAX_PAD: usize = 200;

/// Texts every seed reuses, made once per test process: the router reads them many times a
/// second, and static bytes are shared without an allocation when it keeps them.
struct Texts {
    /// Event ids by number.
    ids: Vec<&'static str>,
    /// `{"pad": "xx…"}` by pad length.
    payloads: Vec<&'static str>,
    keys: [&'static str; KEYS],
}

fn texts() -> &'static Texts {
    static TEXTS: std::sync::OnceLock<Texts> = std::sync::OnceLock::new();
    TEXTS.get_or_init(|| {
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        Texts {
            ids: (0..MAX_EVENTS as u64)
                .map(|id| leak(event_id(id)))
                .collect(),
            payloads: (0..MAX_PAD)
                .map(|n| leak(format!(r#"{{"pad": "{}"}}"#, "x".repeat(n))))
                .collect(),
            keys: std::array::from_fn(|k| leak(format!("key-{k}"))),
        }
    })
}

/// More events than a WAL of [`generate`] holds.
const MAX_EVENTS: usize = 60 * 40 + 1;

fn event_id(id: u64) -> String {
    format!("00000000-0000-4000-8000-{id:012x}")
}

fn outbox_event(rel: &Arc<RelationInfo>, t: &Txn, e: &Event) -> OutboxEvent {
    let texts = texts();
    let payload = texts.payloads[e.payload_len];
    let key = texts.keys[e.key as usize];
    match e.kind {
        Kind::Row | Kind::Poison => {
            let text = |s: &'static str| TupleValue::Text(Bytes::from_static(s.as_bytes()));
            OutboxEvent::Row(OutboxRow {
                xid: t.xid,
                table: 0,
                lsn: Lsn(t.commit_lsn - 1),
                relation: rel.clone(),
                values: vec![
                    text(texts.ids[e.id as usize]),
                    text("order"),
                    text(key),
                    text("OrderCreated"),
                    match e.kind {
                        Kind::Poison => TupleValue::Null,
                        _ => text(payload),
                    },
                ]
                .into(),
            })
        }
        Kind::Message => {
            let doc = format!(
                r#"{{"id": "{}", "aggregatetype": "order", "aggregateid": "{key}", "type": "OrderCreated", "payload": {payload}}}"#,
                texts.ids[e.id as usize]
            );
            OutboxEvent::Message(OutboxMessage {
                xid: t.xid,
                lsn: Lsn(t.commit_lsn - 1),
                message_lsn: Lsn(t.commit_lsn - 1),
                content: Bytes::from(doc),
            })
        }
    }
}
