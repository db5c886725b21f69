//! The delivery reports of one producer, from the client's report task (or rust-rdkafka's own
//! poll, inside `flush`) to the relay: a queue in two buffers that trade places.
//!
//! A channel message per record (tokio's unbounded channel) allocated a block for every 32
//! reports, and a message per produce response (a `Vec` of its reports) allocated one buffer of
//! ~13 KB per response. Both requests are past glibc's per-thread cache, and a request of that
//! size first consolidates every small chunk freed since the last one: ~300 instructions a record
//! either way. Here the sender appends to one buffer under a lock, and the receiver, once its own
//! buffer is empty, swaps it for the sender's: after the first window neither allocates again.
//! Both buffers hold at most an in-flight window's reports.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::Delivery;

/// A new queue: its one sending end and its receiving end.
pub(super) fn queue() -> (Sender, Reports) {
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue {
            reports: VecDeque::new(),
            sender_gone: false,
            receiver_gone: false,
        }),
        ready: Notify::new(),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Reports {
            shared,
            taken: VecDeque::new(),
        },
    )
}

#[derive(Debug)]
struct Shared {
    queue: Mutex<Queue>,
    /// Told after every hand-over and when the sender goes (one stored permit when no one waits,
    /// so a hand-over between the receiver's look and its wait is not missed).
    ready: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while appending or swapping leaves the buffers whole.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug)]
struct Queue {
    reports: VecDeque<Delivery>,
    sender_gone: bool,
    /// Reports for no one are dropped, not kept.
    receiver_gone: bool,
}

/// The sending end, held by the producer's context (one per producer).
#[derive(Debug)]
pub(super) struct Sender {
    shared: Arc<Shared>,
}

impl Sender {
    /// Appends `reports` in their order, and wakes the receiver. With the receiver gone they
    /// are read (the caller's iterator may do more than yield them) and dropped.
    pub(super) fn send(&self, reports: impl IntoIterator<Item = Delivery>) {
        let grew = {
            let mut q = self.shared.lock();
            if q.receiver_gone {
                drop(q);
                reports.into_iter().for_each(drop);
                return;
            }
            let before = q.reports.len();
            q.reports.extend(reports);
            before != q.reports.len()
        };
        if grew {
            self.shared.ready.notify_one();
        }
    }
}

impl Drop for Sender {
    /// The receiver takes what is left, then sees the end.
    fn drop(&mut self) {
        self.shared.lock().sender_gone = true;
        self.shared.ready.notify_one();
    }
}

/// The delivery reports of one producer, in the order librdkafka hands them over.
#[derive(Debug)]
pub struct Reports {
    shared: Arc<Shared>,
    /// Reports taken from the sender's buffer and not yet returned.
    taken: VecDeque<Delivery>,
}

impl Reports {
    /// The next report; `None` once the producer is gone and every report was taken.
    /// Cancel-safe: a report leaves the queue only when it is returned.
    pub async fn recv(&mut self) -> Option<Delivery> {
        loop {
            if let Some(d) = self.try_recv() {
                return Some(d);
            }
            if self.shared.lock().sender_gone {
                // The last hand-over happened before the sender went: take it first.
                return self.try_recv();
            }
            self.shared.ready.notified().await;
        }
    }

    /// The next report if one is already there.
    pub fn try_recv(&mut self) -> Option<Delivery> {
        if self.taken.is_empty() {
            // The emptied buffer goes to the sender, keeping its capacity.
            std::mem::swap(&mut self.taken, &mut self.shared.lock().reports);
        }
        self.taken.pop_front()
    }
}

impl Drop for Reports {
    /// What is queued, and what comes later, is for no one.
    fn drop(&mut self) {
        let mut q = self.shared.lock();
        q.receiver_gone = true;
        q.reports = VecDeque::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::Delivered;

    fn report(key: usize) -> Delivery {
        Delivery {
            key,
            result: Ok(Delivered {
                partition: 0,
                offset: key as i64,
            }),
            topic: None,
        }
    }

    fn keys(reports: &mut Reports) -> Vec<usize> {
        std::iter::from_fn(|| reports.try_recv())
            .map(|d| d.key)
            .collect()
    }

    #[test]
    fn reports_arrive_in_order_across_swaps() {
        let (tx, mut rx) = queue();
        tx.send((0..3).map(report));
        assert_eq!(rx.try_recv().map(|d| d.key), Some(0));
        // Handed over while the receiver still holds 1 and 2: they come after them.
        tx.send((3..5).map(report));
        tx.send(std::iter::empty());
        assert_eq!(keys(&mut rx), [1, 2, 3, 4]);
        assert!(rx.try_recv().is_none());
        tx.send([report(5)]);
        assert_eq!(keys(&mut rx), [5]);
    }

    #[tokio::test]
    async fn recv_waits_for_a_report_and_ends_after_the_last_once_the_sender_is_gone() {
        let (tx, mut rx) = queue();
        let waiting = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(d) = rx.recv().await {
                got.push(d.key);
            }
            got
        });
        tokio::task::yield_now().await;
        tx.send((0..2).map(report));
        tx.send([report(2)]);
        drop(tx);
        assert_eq!(waiting.await.expect("receiver"), [0, 1, 2]);
    }

    #[tokio::test]
    async fn a_cancelled_recv_loses_nothing() {
        let (tx, mut rx) = queue();
        // Polled once, waiting, and dropped.
        tokio::select! {
            biased;
            d = rx.recv() => panic!("nothing was sent, yet {d:?}"),
            () = std::future::ready(()) => {}
        }
        tx.send([report(7)]);
        assert_eq!(rx.recv().await.map(|d| d.key), Some(7));
        drop(tx);
        assert!(rx.recv().await.is_none());
    }

    #[test]
    fn reports_for_a_receiver_that_is_gone_are_dropped() {
        let (tx, rx) = queue();
        let shared = rx.shared.clone();
        tx.send((0..3).map(report));
        drop(rx);
        tx.send((3..5).map(report));
        let q = shared.lock();
        assert!(q.reports.is_empty() && q.reports.capacity() == 0);
    }

    #[test]
    fn the_emptied_buffer_goes_back_to_the_sender() {
        let (tx, mut rx) = queue();
        for round in 0..3 {
            tx.send((0..100).map(report));
            assert_eq!(keys(&mut rx).len(), 100, "round {round}");
            // The next hand-over appends to a buffer that has the room already.
            assert!(rx.shared.lock().reports.capacity() >= 100, "round {round}");
        }
    }
}
