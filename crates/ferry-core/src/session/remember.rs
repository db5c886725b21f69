//! Remembering before confirming (at-least-once mode): the progress record goes to Kafka first,
//! the slot is confirmed after.
//!
//! The relay core confirms an LSN once Kafka holds every record up to it ([`crate::relay`]).
//! In at-least-once mode that LSN is not passed to the server at once: it is first written as
//! a progress record ([`crate::progress_record`]), and only the LSN of an *acknowledged* record may be
//! reported as `flush_lsn`. So the slot's `confirmed_flush_lsn` is never ahead of the newest
//! progress record, and a start that finds it ahead knows that something other than Ferry moved
//! it ([`crate::verdict`]).
//!
//! [`Remember`] is the part of the session machine ([`crate::session`]) between the relay core's
//! confirmations and the reader:
//!
//! - **one record in flight**, and one every [`INTERVAL`] at most while records are in flight:
//!   always the newest confirmed LSN, so a busy stream writes about five small records a second
//!   whatever its rate, and the slot is confirmed at most an interval plus one round trip later
//!   than before;
//! - **the end of a burst is written without waiting for the interval**: once the core has had
//!   no record in flight for [`QUIET`] (a backlog is drained, a burst is over), what it confirmed
//!   is final for now, and waiting for the interval would only leave the slot behind for up to
//!   200 ms. Such an early record is allowed once per [`EARLY_INTERVAL`], so a stream that pauses
//!   often (its pauses look like ends) writes at most one more record every 400 ms than a busy
//!   one. An early record restarts the interval like any other: the slot is never confirmed less
//!   often than without it;
//! - **the newest record is the truth**: records are written one at a time, so the order of
//!   their acknowledgements is their order in the (single-partition) topic, and what was last
//!   acknowledged is what a restart reads back. What may be reported to the server is the lower
//!   of the core's confirmed LSN and that record's LSN;
//! - **a failed write stops confirming**, never the stream: it is retried with the newest LSN
//!   after [`RETRY_AFTER`], and [`Remember::is_failing`] says so until a write succeeds (the
//!   driver shows it as a WARN, a metric and `/readyz`). Meanwhile the server keeps the WAL;
//! - a session starts from what the start-time verdict trusted: the remembered record's LSN, or
//!   none (first start, upgrade, accepted gap), in which case the slot's position is written at
//!   once and nothing is reported until it is acknowledged. A record of an earlier session still
//!   in flight keeps its place: its acknowledgement is the newest record when it lands.

use std::time::{Duration, Instant};

use ferry_pgtypes::Lsn;

/// Least time between a progress record and the next regular one (an early one may come
/// sooner: see [`QUIET`]).
pub const INTERVAL: Duration = Duration::from_millis(200);
/// How long the core must have had no record in flight before its confirmed LSN is written
/// without waiting for the interval.
pub const QUIET: Duration = Duration::from_millis(20);
/// Least time between two records written early (see [`QUIET`]).
pub const EARLY_INTERVAL: Duration = Duration::from_millis(400);
/// How long after a failed write the next one is tried.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Remember {
    /// LSN of the newest acknowledged record (`None`: no record this session may trust).
    remembered: Option<Lsn>,
    /// The core's confirmed LSN in this session.
    core: Lsn,
    /// What was last reported to the reader.
    reported: Lsn,
    /// The record written and not yet acknowledged.
    in_flight: Option<Lsn>,
    /// Earliest time of the next write.
    next_write: Option<Instant>,
    /// Since when the core has had no record in flight, as last told ([`Remember::settled`]).
    settled_since: Option<Instant>,
    /// Earliest time of the next early write.
    next_early: Option<Instant>,
    failing: bool,
}

impl Default for Remember {
    fn default() -> Self {
        Remember {
            remembered: None,
            core: Lsn::ZERO,
            reported: Lsn::ZERO,
            in_flight: None,
            next_write: None,
            settled_since: None,
            next_early: None,
            failing: false,
        }
    }
}

impl Remember {
    /// A session streams from `resume` (the slot's position); `remembered` is the record the
    /// verdict compared it with, `None` if a fresh one must be written at `resume` first.
    pub fn start(&mut self, resume: Lsn, remembered: Option<Lsn>) {
        self.core = resume;
        self.reported = resume;
        self.remembered = remembered;
        self.next_write = None;
        self.next_early = None;
    }

    /// The core confirmed `lsn`.
    pub fn confirmed(&mut self, lsn: Lsn) {
        self.core = self.core.max(lsn);
    }

    /// Whether the core has records in flight (`false`) or none (`true`), as of `now`. The driver
    /// tells it before each [`Remember::poll_write`] and [`Remember::poll_timeout`].
    pub fn settled(&mut self, settled: bool, now: Instant) {
        match settled {
            true => _ = self.settled_since.get_or_insert(now),
            false => self.settled_since = None,
        }
    }

    /// The LSN of the record to write now, if any (it is then in flight).
    pub fn poll_write(&mut self, now: Instant) -> Option<Lsn> {
        if self.in_flight.is_some() || !self.wants_write() {
            return None;
        }
        if self.next_write.is_some_and(|t| now < t) {
            if self.early_at().is_none_or(|t| now < t) {
                return None;
            }
            self.next_early = Some(now + EARLY_INTERVAL);
        }
        self.in_flight = Some(self.core);
        self.next_write = Some(now + INTERVAL);
        self.in_flight
    }

    /// When an early write may go, if the core is settled and no write is failing.
    fn early_at(&self) -> Option<Instant> {
        if self.failing {
            return None;
        }
        let quiet = self.settled_since? + QUIET;
        Some(self.next_early.map_or(quiet, |t| t.max(quiet)))
    }

    /// The record in flight was acknowledged (`ok`) or failed.
    pub fn acked(&mut self, ok: bool, now: Instant) {
        let Some(lsn) = self.in_flight.take() else {
            return;
        };
        if ok {
            self.remembered = Some(lsn);
            self.failing = false;
        } else {
            // A failed write may still have landed (a timed-out request the broker did
            // append): until a write succeeds, either record may be the newest.
            self.remembered = self.remembered.map(|r| r.min(lsn));
            self.failing = true;
            self.next_write = Some(now + RETRY_AFTER);
        }
    }

    /// The LSN to report to the server now, if it rose: never above the newest record.
    pub fn poll_confirm(&mut self) -> Option<Lsn> {
        // The record in flight becomes the newest when it lands: the slot must not pass it
        // either.
        let c = self
            .core
            .min(self.remembered?)
            .min(self.in_flight.unwrap_or(Lsn(u64::MAX)));
        (c > self.reported).then(|| {
            self.reported = c;
            c
        })
    }

    /// When [`Remember::poll_write`] will next have something, if it waits for the interval (or
    /// for an early write).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.in_flight.is_some() || !self.wants_write() {
            return None;
        }
        let regular = self.next_write?;
        Some(self.early_at().map_or(regular, |t| t.min(regular)))
    }

    /// Whether the newest write failed and none succeeded since.
    pub fn is_failing(&self) -> bool {
        self.failing
    }

    /// Whether a record is in flight.
    pub fn in_flight(&self) -> Option<Lsn> {
        self.in_flight
    }

    /// The newest acknowledged record's LSN, if any.
    pub fn remembered(&self) -> Option<Lsn> {
        self.remembered
    }

    /// Whether something confirmed is not yet remembered (or written).
    pub fn is_behind(&self) -> bool {
        self.in_flight.is_some() || self.wants_write()
    }

    /// Lets the next write go without waiting for the interval (a shutdown's last record).
    pub fn hurry(&mut self) {
        if !self.failing {
            self.next_write = None;
        }
    }

    fn wants_write(&self) -> bool {
        // A record at or below the newest one would say nothing new (records only go up).
        self.remembered.is_none_or(|r| self.core > r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    /// A small deterministic generator for the model tests.
    fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    #[test]
    fn confirms_only_what_an_acknowledged_record_holds() {
        let t = Instant::now();
        let mut r = Remember::default();
        r.start(Lsn(100), Some(Lsn(100)));
        assert_eq!(r.poll_write(t), None, "nothing new");
        assert_eq!(r.poll_confirm(), None);
        r.confirmed(Lsn(150));
        assert_eq!(r.poll_confirm(), None, "not remembered yet");
        assert_eq!(r.poll_write(t), Some(Lsn(150)));
        r.confirmed(Lsn(160));
        assert_eq!(r.poll_write(t), None, "one in flight");
        assert_eq!(r.poll_confirm(), None);
        r.acked(true, at(t, 5));
        assert_eq!(r.poll_confirm(), Some(Lsn(150)));
        assert_eq!(r.poll_confirm(), None);
        assert_eq!(r.poll_write(at(t, 100)), None, "throttled");
        assert_eq!(r.poll_timeout(), Some(at(t, 200)));
        r.confirmed(Lsn(170));
        assert_eq!(r.poll_write(at(t, 200)), Some(Lsn(170)), "the newest");
        r.acked(true, at(t, 210));
        assert_eq!(r.poll_confirm(), Some(Lsn(170)));
        assert!(!r.is_behind());
    }

    #[test]
    fn a_failed_write_stops_confirming_and_is_retried_with_the_newest_lsn() {
        let t = Instant::now();
        let mut r = Remember::default();
        r.start(Lsn(100), Some(Lsn(100)));
        r.confirmed(Lsn(200));
        assert_eq!(r.poll_write(t), Some(Lsn(200)));
        r.acked(false, at(t, 10));
        assert!(r.is_failing());
        assert_eq!(r.poll_confirm(), None);
        r.confirmed(Lsn(300));
        assert_eq!(r.poll_write(at(t, 500)), None, "waits RETRY_AFTER");
        assert_eq!(r.poll_timeout(), Some(at(t, 1010)));
        r.hurry();
        assert_eq!(
            r.poll_write(at(t, 500)),
            None,
            "a failing write is not hurried"
        );
        assert_eq!(r.poll_write(at(t, 1010)), Some(Lsn(300)));
        r.acked(true, at(t, 1020));
        assert!(!r.is_failing());
        assert_eq!(r.poll_confirm(), Some(Lsn(300)));
    }

    #[test]
    fn without_a_trusted_record_the_slot_position_is_written_first() {
        let t = Instant::now();
        let mut r = Remember::default();
        r.start(Lsn(100), None);
        r.confirmed(Lsn(120));
        assert_eq!(r.poll_write(t), Some(Lsn(120)));
        assert_eq!(r.poll_confirm(), None);
        r.acked(true, t);
        assert_eq!(r.poll_confirm(), Some(Lsn(120)));
        let mut fresh = Remember::default();
        fresh.start(Lsn(100), None);
        assert_eq!(
            fresh.poll_write(t),
            Some(Lsn(100)),
            "even with nothing confirmed"
        );
    }

    #[test]
    fn a_slot_behind_the_record_confirms_up_to_the_record_without_writing() {
        let t = Instant::now();
        let mut r = Remember::default();
        r.start(Lsn(100), Some(Lsn(500)));
        r.confirmed(Lsn(300));
        assert_eq!(r.poll_confirm(), Some(Lsn(300)));
        assert_eq!(r.poll_write(t), None, "the record already holds 300");
        r.confirmed(Lsn(600));
        assert_eq!(r.poll_confirm(), Some(Lsn(500)), "up to the record");
        assert_eq!(r.poll_write(t), Some(Lsn(600)));
        r.acked(true, t);
        assert_eq!(r.poll_confirm(), Some(Lsn(600)));
    }

    #[test]
    fn a_late_acknowledgement_from_an_earlier_session_is_the_newest_record() {
        let t = Instant::now();
        let mut r = Remember::default();
        r.start(Lsn(100), Some(Lsn(100)));
        r.confirmed(Lsn(400));
        assert_eq!(r.poll_write(t), Some(Lsn(400)));
        // The session ends; the next one read 100 from Kafka (400 had not landed).
        r.start(Lsn(100), Some(Lsn(100)));
        r.confirmed(Lsn(450));
        assert_eq!(r.poll_write(at(t, 300)), None, "400 still in flight");
        r.acked(true, at(t, 310));
        assert_eq!(r.remembered(), Some(Lsn(400)));
        assert_eq!(r.poll_confirm(), Some(Lsn(400)));
        assert_eq!(r.poll_write(at(t, 310)), Some(Lsn(450)));
    }

    /// Against a model: whatever the order of confirmations, acknowledgements, failures and
    /// session starts, the LSN reported never exceeds the newest acknowledged record.
    #[test]
    fn the_reported_lsn_never_passes_the_newest_acknowledged_record() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2_000 {
            let t0 = Instant::now();
            let mut r = Remember::default();
            let mut topic_newest: Option<Lsn> = None;
            let mut slot = Lsn(100);
            r.start(slot, None);
            let mut core = slot;
            let mut now = t0;
            for _ in 0..200 {
                now += Duration::from_millis(next() % 300);
                match next() % 7 {
                    0 | 1 => {
                        core = Lsn(core.0 + next() % 50);
                        r.confirmed(core);
                    }
                    2 => {
                        if let Some(lsn) = r.in_flight() {
                            // Failed and not appended, failed yet appended (a timeout), or ok.
                            let outcome = next() % 6;
                            if outcome != 0 {
                                topic_newest = Some(lsn);
                            }
                            r.acked(outcome > 1, now);
                        }
                    }
                    3 => {
                        // A new session from the slot, with what Kafka holds now.
                        core = slot;
                        r.start(slot, topic_newest);
                    }
                    4 => r.settled(next() % 2 == 0, now),
                    _ => {
                        let _ = r.poll_write(now);
                    }
                }
                if let Some(c) = r.poll_confirm() {
                    slot = c;
                }
                assert!(
                    topic_newest.is_some_and(|n| slot <= n) || slot == Lsn(100),
                    "slot {slot} ahead of the newest record {topic_newest:?}"
                );
            }
        }
    }

    #[test]
    fn the_end_of_a_burst_is_written_after_the_quiet_time() {
        let t = Instant::now();
        let mut r = Remember::default();
        r.start(Lsn(100), Some(Lsn(100)));
        r.confirmed(Lsn(150));
        assert_eq!(r.poll_write(t), Some(Lsn(150)));
        r.acked(true, at(t, 5));
        r.confirmed(Lsn(160));
        r.settled(false, at(t, 20));
        assert_eq!(r.poll_timeout(), Some(at(t, 200)), "busy: the interval");
        r.settled(true, at(t, 50));
        assert_eq!(r.poll_timeout(), Some(at(t, 70)), "settled: the quiet time");
        r.settled(true, at(t, 69));
        assert_eq!(r.poll_write(at(t, 69)), None);
        assert_eq!(r.poll_write(at(t, 70)), Some(Lsn(160)), "early");
        r.acked(true, at(t, 72));
        assert_eq!(r.poll_confirm(), Some(Lsn(160)));
        // The interval restarts from the early record; the next early one waits its own.
        r.confirmed(Lsn(170));
        assert_eq!(r.poll_timeout(), Some(at(t, 270)));
        r.settled(false, at(t, 100));
        r.settled(true, at(t, 110));
        assert_eq!(r.poll_timeout(), Some(at(t, 270)), "next early only at 470");
        assert_eq!(r.poll_write(at(t, 270)), Some(Lsn(170)), "regular");
    }

    #[test]
    fn a_failing_write_is_never_hurried_by_a_settled_core() {
        let t = Instant::now();
        let mut r = Remember::default();
        r.start(Lsn(100), Some(Lsn(100)));
        r.confirmed(Lsn(200));
        assert_eq!(r.poll_write(t), Some(Lsn(200)));
        r.acked(false, at(t, 10));
        r.confirmed(Lsn(300));
        r.settled(true, at(t, 20));
        assert_eq!(r.poll_timeout(), Some(at(t, 1010)), "RETRY_AFTER");
        assert_eq!(r.poll_write(at(t, 500)), None);
        assert_eq!(r.poll_write(at(t, 1010)), Some(Lsn(300)));
    }

    /// Whatever the pattern of bursts and pauses: at most one record per interval plus one early
    /// record per early interval (start-up reads the topic whole), and the slot never waits
    /// more than an interval for a record while something new is confirmed.
    #[test]
    fn early_records_are_bounded_and_never_slow_the_regular_ones() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        for _ in 0..500 {
            let t0 = Instant::now();
            let mut r = Remember::default();
            r.start(Lsn(100), Some(Lsn(100)));
            let (mut now, mut core, mut writes, mut last_write) = (t0, 100, 0u64, t0);
            for _ in 0..2_000 {
                now += Duration::from_millis(next() % 40);
                if next() % 2 == 0 {
                    core += 1 + next() % 10;
                    r.confirmed(Lsn(core));
                }
                r.settled(next() % 3 != 0, now);
                if r.poll_write(now).is_some() {
                    writes += 1;
                    last_write = now;
                    r.acked(true, now);
                }
                let ms = (now - t0).as_millis() as u64;
                let bound =
                    ms / INTERVAL.as_millis() as u64 + ms / EARLY_INTERVAL.as_millis() as u64 + 2;
                assert!(writes <= bound, "{writes} writes in {ms} ms");
                if let Some(due) = r.poll_timeout() {
                    assert!(
                        due <= last_write + INTERVAL,
                        "a record waits past the interval"
                    );
                }
            }
        }
    }
}
