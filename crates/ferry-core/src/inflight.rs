//! The in-flight table: one entry per record handed to the sink and not yet reported, under the
//! [`DeliveryKey`] the record travels with (the producer's per-message opaque).
//!
//! It is the one place that decides whether a delivery report is genuine: a report finds its
//! entry by token, and the entry is removed by that first report, so a second report, or one for
//! a token never handed out, finds nothing and is refused. Every entry remembers the session it
//! was produced in; a report from an earlier session (a record that outlived its session's drain)
//! is recognised here and never reaches the new session's watermark.
//!
//! A slab (entries in a vector, free keys on a free list): no allocation per record once the
//! table has grown to the in-flight window, nothing hashed, nothing freed across threads. The
//! table also counts records and bytes in flight across sessions: that is what the in-flight
//! window bounds (librdkafka holds them all, whichever session produced them).
//!
//! It knows the oldest record in flight too (when it was handed over, and its transaction's
//! commit time), which is what says how long records have waited for Kafka during an outage:
//! the keys in the order they were handed out, each with a sequence number, in a queue whose
//! front is dropped once reported (lazily, when asked). A record that stays in flight while
//! later ones are reported leaves those behind it in the queue; the queue is compacted when it
//! grows past twice the records in flight, so it stays within a small multiple of the window.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use crate::watermark;

/// The key a record travels with through the sink; its delivery report carries it back.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DeliveryKey(pub usize);

/// What the core keeps per record until its report.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The record's place in its transaction's watermark.
    pub mark: watermark::Mark,
    /// The session it was produced in.
    pub session: u64,
    /// Commit time of its transaction, µs since the Unix epoch (for the lag metric).
    pub commit_unix_micros: i64,
    /// Its topic (shared, not copied), for errors.
    pub topic: Arc<str>,
    /// When it was handed to the sink.
    pub handed_at: Instant,
}

/// The oldest record in flight: when it was handed over, and its transaction's commit time
/// (µs since the Unix epoch, 0 if unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oldest {
    pub handed_at: Instant,
    pub commit_unix_micros: i64,
}

/// See the [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    /// Each with the sequence number it was inserted under.
    entries: Vec<Option<(u64, Entry)>>,
    free: Vec<usize>,
    records: u64,
    bytes: u64,
    /// Keys in insertion order with their sequence numbers; some already reported.
    order: VecDeque<(u64, usize)>,
    next_seq: u64,
}

impl InFlight {
    /// Stores the entry of a record handed to the sink; returns its token.
    pub fn insert(&mut self, entry: Entry) -> DeliveryKey {
        self.records += 1;
        self.bytes += u64::from(entry.mark.bytes());
        let seq = self.next_seq;
        self.next_seq += 1;
        let key = match self.free.pop() {
            Some(key) => {
                self.entries[key] = Some((seq, entry));
                key
            }
            None => {
                self.entries.push(Some((seq, entry)));
                self.entries.len() - 1
            }
        };
        if self.order.len() as u64 >= 2 * self.records + 64 {
            let entries = &self.entries;
            self.order
                .retain(|&(s, k)| matches!(&entries[k], Some((live, _)) if *live == s));
        }
        self.order.push_back((seq, key));
        DeliveryKey(key)
    }

    /// The oldest record in flight (the first handed over of those not yet reported).
    pub fn oldest(&mut self) -> Option<Oldest> {
        while let Some(&(seq, key)) = self.order.front() {
            match &self.entries[key] {
                Some((live, e)) if *live == seq => {
                    return Some(Oldest {
                        handed_at: e.handed_at,
                        commit_unix_micros: e.commit_unix_micros,
                    })
                }
                _ => {
                    self.order.pop_front();
                }
            }
        }
        None
    }

    /// Takes the entry of `token`: `None` for a token never handed out or already reported.
    pub fn remove(&mut self, token: DeliveryKey) -> Option<Entry> {
        let (_, entry) = self.entries.get_mut(token.0)?.take()?;
        self.free.push(token.0);
        self.records -= 1;
        self.bytes -= u64::from(entry.mark.bytes());
        Some(entry)
    }

    /// The entry of `token`, if it is in flight.
    pub fn get(&self, token: DeliveryKey) -> Option<&Entry> {
        self.entries.get(token.0)?.as_ref().map(|(_, e)| e)
    }

    /// Records in flight (all sessions).
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Their bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watermark::Watermark;
    use ferry_pgtypes::Lsn;

    /// Against a map model: every token finds its own entry exactly once, keys are reused only
    /// once free, unknown or repeated tokens find nothing, and the counts agree.
    #[test]
    fn the_table_matches_a_map() {
        use std::collections::HashMap;
        let mut w = Watermark::new(Lsn(0));
        w.begin(Lsn(1)).unwrap();
        let topic: Arc<str> = Arc::from("t");
        let mut table = InFlight::default();
        let mut model: HashMap<usize, (u64, u32)> = HashMap::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 3 != 0 || model.is_empty() {
                let mark = w.add_record((x % 100) as usize).unwrap();
                let token = table.insert(Entry {
                    mark,
                    session: i,
                    commit_unix_micros: 0,
                    topic: topic.clone(),
                    handed_at: Instant::now(),
                });
                let fresh = model.insert(token.0, (i, mark.bytes())).is_none();
                assert!(fresh, "token {token:?} handed out twice");
            } else {
                let key = *model.keys().nth((x as usize / 3) % model.len()).unwrap();
                let got = table
                    .remove(DeliveryKey(key))
                    .map(|e| (e.session, e.mark.bytes()));
                assert_eq!(got, model.remove(&key));
                assert!(
                    table.remove(DeliveryKey(key)).is_none(),
                    "second report for {key}"
                );
            }
            assert_eq!(table.records(), model.len() as u64);
            let bytes: u64 = model.values().map(|(_, b)| u64::from(*b)).sum();
            assert_eq!(table.bytes(), bytes);
        }
        assert!(table.remove(DeliveryKey(usize::MAX)).is_none());
        assert!(table.capacity() <= 20_000);
    }

    /// The oldest is the first handed over of those not yet reported, whatever order reports
    /// come in; a record that stays in flight while thousands pass it keeps the queue bounded.
    #[test]
    fn the_oldest_is_the_first_handed_over_still_in_flight() {
        let mut w = Watermark::new(Lsn(0));
        w.begin(Lsn(1)).unwrap();
        let topic: Arc<str> = Arc::from("t");
        let start = Instant::now();
        let mut table = InFlight::default();
        let mut insert = |table: &mut InFlight, i: u64| {
            table.insert(Entry {
                mark: w.add_record(1).unwrap(),
                session: 1,
                commit_unix_micros: i as i64,
                topic: topic.clone(),
                handed_at: start + std::time::Duration::from_millis(i),
            })
        };
        assert_eq!(table.oldest(), None);
        let a = insert(&mut table, 1);
        let b = insert(&mut table, 2);
        let c = insert(&mut table, 3);
        assert_eq!(table.oldest().map(|o| o.commit_unix_micros), Some(1));
        table.remove(b).unwrap();
        assert_eq!(table.oldest().map(|o| o.commit_unix_micros), Some(1));
        table.remove(a).unwrap();
        assert_eq!(
            table.oldest(),
            Some(Oldest {
                handed_at: start + std::time::Duration::from_millis(3),
                commit_unix_micros: 3
            })
        );
        // `c` stays while 10 000 others come and go (reusing `a`'s and `b`'s keys).
        for i in 4..10_004 {
            let t = insert(&mut table, i);
            table.remove(t).unwrap();
            assert_eq!(table.oldest().map(|o| o.commit_unix_micros), Some(3));
            // Compacted before it passes twice the records in flight (two, during an insert)
            // plus 64.
            assert!(table.order.len() <= 2 * 2 + 64 + 1, "{}", table.order.len());
        }
        table.remove(c).unwrap();
        assert_eq!(table.oldest(), None);
    }
}
