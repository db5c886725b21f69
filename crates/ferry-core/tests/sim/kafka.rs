//! The simulated Kafka: outbox partitions that acknowledge in order within one partition and out
//! of order across them (a failure fails the rest of its partition; a partition may stall), a
//! progress topic of one partition, and, in exactly-once mode, one transactional producer whose
//! records and progress record become visible to read_committed consumers together when its
//! transaction commits.

use std::collections::VecDeque;

use ferry_core::progress_record::{Mode as RecordMode, ProgressRecord};
use ferry_core::{DeliveryKey, Position};

/// Outbox partitions; the progress topic's single partition comes after them.
pub const PARTITIONS: usize = 3;
pub const PROGRESS: usize = PARTITIONS;

/// A record handed to the producer and not yet acknowledged.
#[derive(Debug, Clone)]
pub struct Flying {
    pub token: DeliveryKey,
    /// The event it carries, or 0 for a progress record.
    pub id: u64,
    pub key: u8,
    pub dead_letter: bool,
    pub bytes: u64,
    /// The progress record's LSN.
    pub lsn: u64,
    /// Its WAL transaction's end LSN (outbox records).
    pub txn_end: u64,
    /// The session of the process that produced it.
    pub session: u64,
}

/// A record of the open Kafka transaction.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    pub id: u64,
    pub key: u8,
    pub dead_letter: bool,
}

#[derive(Debug, Default)]
pub struct Kafka {
    /// In flight per partition (the progress topic's last), oldest first.
    pub queues: [VecDeque<Flying>; PARTITIONS + 1],
    /// Until which tick each partition is stalled.
    pub stalled: [u64; PARTITIONS + 1],
    /// The progress topic's newest record (at-least-once: the last one appended; exactly-once:
    /// the last one committed).
    pub progress: Option<ProgressRecord>,
    /// Exactly-once: a transaction is begun, its records, and its progress record.
    pub open: bool,
    pub written: Vec<Written>,
    pub written_progress: Option<Position>,
}

impl Kafka {
    pub fn partition(key: u8, dead_letter: bool) -> usize {
        (key as usize + usize::from(dead_letter)) % PARTITIONS
    }

    /// Records in flight, and their bytes.
    pub fn in_flight(&self) -> (u64, u64) {
        let outbox = self.queues[..PARTITIONS].iter().flatten();
        outbox.fold((0, 0), |(n, b), f| (n + 1, b + f.bytes))
    }

    /// Whether partition `p` can acknowledge at `tick`.
    pub fn ready(&self, p: usize, tick: u64) -> bool {
        self.stalled[p] <= tick && !self.queues[p].is_empty()
    }

    /// The first tick after `tick` at which a stalled partition with records resumes.
    pub fn next_resume(&self, tick: u64) -> Option<u64> {
        (0..=PARTITIONS)
            .filter(|&p| !self.queues[p].is_empty() && self.stalled[p] > tick)
            .map(|p| self.stalled[p])
            .min()
    }

    /// The end LSN of the newest progress record, if any.
    pub fn progress_lsn(&self) -> Option<u64> {
        self.progress.as_ref().map(|r| r.end_lsn.0)
    }

    /// At-least-once: the progress record at `lsn` was appended to the progress topic.
    pub fn append_progress(&mut self, lsn: u64) {
        self.progress = Some(ProgressRecord::whole(
            RecordMode::AtLeastOnce,
            1,
            ferry_wal::Lsn(lsn),
            0,
        ));
    }

    /// Exactly-once: the open transaction commits; returns what becomes visible, in the order
    /// written, and the progress record it held, if any.
    pub fn commit(&mut self) -> (Vec<Written>, Option<Position>) {
        self.open = false;
        let written = std::mem::take(&mut self.written);
        let position = self.written_progress.take();
        if let Some(p) = position {
            self.progress = Some(ProgressRecord::at(RecordMode::ExactlyOnce, 1, &p, 0));
        }
        (written, position)
    }

    /// Exactly-once: the open transaction is aborted (or fenced by the next producer): nothing
    /// of it is ever visible, and what was in flight goes with it.
    pub fn abort(&mut self) {
        self.open = false;
        self.written.clear();
        self.written_progress = None;
        for q in &mut self.queues {
            q.clear();
        }
    }
}
