//! Reading the topic back and holding it against the ground truth.
//!
//! - **lost**: committed, never delivered;
//! - **phantom**: delivered, yet rolled back (or never written at all);
//! - **order violations**: within a key, a row delivered for the first time after a row of a
//!   higher seq had been delivered (redeliveries of earlier rows after a crash are duplicates,
//!   not reorderings: the promise is that every new row comes after those before it);
//! - **duplicates**: deliveries beyond the first.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::TopicPartitionList;

use super::load::Truth;
use crate::Res;

/// One delivered row, in its partition's offset order.
#[derive(Debug, Clone)]
pub struct Delivered {
    pub id: u64,
    pub key: String,
    pub seq: u64,
}

/// Reads every partition of `topic` from the start until every id in `want` has arrived and
/// the topic has been quiet for a moment, or nothing new came for `idle`. Blocking.
pub fn read_back(
    brokers: &str,
    topic: &str,
    partitions: i32,
    read_committed: bool,
    want: &HashSet<u64>,
    idle: Duration,
) -> Res<Vec<Vec<Delivered>>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "group.id",
            ferry_testkit::pg::unique_name("ferry-chaos-check"),
        )
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set(
            "isolation.level",
            if read_committed {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        )
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut out = vec![Vec::new(); partitions as usize];
    let mut seen: HashSet<u64> = HashSet::new();
    let mut last_new = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Err(e)) => return Err(format!("consume {topic}: {e}").into()),
            Some(Ok(m)) => {
                last_new = Instant::now();
                let v: serde_json::Value = serde_json::from_slice(m.payload().unwrap_or(b"null"))
                    .map_err(|e| {
                    format!("{topic}/{} @{}: not JSON: {e}", m.partition(), m.offset())
                })?;
                let d = Delivered {
                    id: v["id"].as_u64().ok_or("record without id")?,
                    key: v["key"].as_str().ok_or("record without key")?.to_string(),
                    seq: v["seq"].as_u64().ok_or("record without seq")?,
                };
                seen.insert(d.id);
                out[m.partition() as usize].push(d);
            }
            None => {
                let quiet = last_new.elapsed();
                let complete = want.iter().all(|id| seen.contains(id));
                if (complete && quiet > Duration::from_secs(2)) || quiet > idle {
                    return Ok(out);
                }
            }
        }
    }
}

/// The verdict.
#[derive(Debug, Default, Clone)]
pub struct Verdict {
    pub rows_committed: u64,
    pub rows_rolled_back: u64,
    pub delivered: u64,
    pub lost: u64,
    pub phantom: u64,
    pub order_violations: u64,
    pub duplicates: u64,
    /// A few examples of each problem, for the log.
    pub examples: Vec<String>,
}

pub fn judge(truth: &Truth, partitions: &[Vec<Delivered>]) -> Verdict {
    let mut v = Verdict {
        rows_committed: truth.committed.len() as u64,
        rows_rolled_back: truth.rolled_back.len() as u64,
        ..Verdict::default()
    };
    let committed: HashMap<u64, &super::load::Row> =
        truth.committed.iter().map(|r| (r.id, r)).collect();
    let mut first: HashSet<u64> = HashSet::new();
    let mut high: HashMap<&str, u64> = HashMap::new();
    for d in partitions.iter().flatten() {
        v.delivered += 1;
        if !first.insert(d.id) {
            v.duplicates += 1;
            continue;
        }
        match committed.get(&d.id) {
            None => {
                v.phantom += 1;
                if v.examples.len() < 20 {
                    let why = if truth.rolled_back.contains(&d.id) {
                        "rolled back"
                    } else {
                        "never written"
                    };
                    v.examples.push(format!(
                        "phantom: id {} key {} seq {} ({why})",
                        d.id, d.key, d.seq
                    ));
                }
            }
            Some(r) if r.key != d.key || r.seq != d.seq => {
                v.phantom += 1;
                v.examples.push(format!(
                    "phantom: id {} delivered as {}#{}, committed as {}#{}",
                    d.id, d.key, d.seq, r.key, r.seq
                ));
            }
            Some(_) => {}
        }
        let h = high.entry(d.key.as_str()).or_default();
        if d.seq < *h {
            v.order_violations += 1;
            if v.examples.len() < 20 {
                v.examples.push(format!(
                    "order: key {} seq {} first delivered after seq {}",
                    d.key, d.seq, h
                ));
            }
        }
        *h = (*h).max(d.seq);
    }
    for r in &truth.committed {
        if !first.contains(&r.id) {
            v.lost += 1;
            if v.examples.len() < 20 {
                v.examples
                    .push(format!("lost: id {} key {} seq {}", r.id, r.key, r.seq));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::super::load::Row;
    use super::*;

    fn d(id: u64, key: &str, seq: u64) -> Delivered {
        Delivered {
            id,
            key: key.into(),
            seq,
        }
    }

    #[test]
    fn the_judge_counts_loss_phantoms_reordering_and_duplicates() {
        let truth = Truth {
            committed: vec![
                Row {
                    id: 1,
                    key: "a".into(),
                    seq: 1,
                },
                Row {
                    id: 2,
                    key: "a".into(),
                    seq: 2,
                },
                Row {
                    id: 3,
                    key: "a".into(),
                    seq: 4,
                },
                Row {
                    id: 4,
                    key: "b".into(),
                    seq: 1,
                },
                Row {
                    id: 5,
                    key: "b".into(),
                    seq: 2,
                },
            ],
            rolled_back: [9].into_iter().collect(),
            ..Truth::default()
        };
        // Partition 0: a1 a2 a1(dup after a crash) a2(dup) a4; partition 1: b2 before b1,
        // a rolled-back row, and id 3 of key b... no: id 5 missing? b2 is id 5, b1 id 4.
        let parts = vec![
            vec![d(1, "a", 1), d(2, "a", 2), d(1, "a", 1), d(2, "a", 2)],
            vec![d(5, "b", 2), d(4, "b", 1), d(9, "b", 3)],
        ];
        let v = judge(&truth, &parts);
        assert_eq!(v.lost, 1, "{:?}", v.examples); // id 3
        assert_eq!(v.duplicates, 2);
        assert_eq!(v.order_violations, 1, "{:?}", v.examples); // b1 after b2
        assert_eq!(v.phantom, 1, "{:?}", v.examples); // id 9
        let clean = judge(
            &truth,
            &[vec![
                d(1, "a", 1),
                d(2, "a", 2),
                d(3, "a", 4),
                d(4, "b", 1),
                d(5, "b", 2),
            ]],
        );
        assert_eq!(
            (
                clean.lost,
                clean.phantom,
                clean.order_violations,
                clean.duplicates
            ),
            (0, 0, 0, 0)
        );
    }
}
