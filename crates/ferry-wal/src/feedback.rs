//! Progress tracking: what Ferry tells the server, and when. Pure; the reader task drives it.
//!
//! # The rules
//!
//! A logical slot remembers one position that matters, `confirmed_flush_lsn`: the server will
//! never again send a transaction whose commit ends at or before it, and may recycle the WAL
//! behind it. It is set from the **flush** LSN of our standby status updates. Therefore:
//!
//! 1. **`flush_lsn` is only ever what the caller confirmed.** The caller (the pipeline)
//!    confirms a transaction's `end_lsn` after Kafka acknowledged every record of it and of
//!    every earlier transaction. Receiving, decoding or handing a record to the producer
//!    confirms nothing.
//! 2. **It never moves backwards.** It starts at the resume point (the slot's
//!    `confirmed_flush_lsn` when streaming started); a lower confirmation is a bug in the caller
//!    and is rejected.
//! 3. **`write_lsn` is what we received** (informational: `pg_stat_replication.write_lsn`), never
//!    below `flush_lsn`. `apply_lsn` equals `flush_lsn`.
//! 4. **An idle outbox must not pin WAL.** When the pipeline has nothing in flight (no open or
//!    unacknowledged transaction), it may confirm a keepalive's `wal_end`: every transaction that
//!    committed before it has already been sent to us, so nothing at or below it is owed. This
//!    is decided by the pipeline's watermark, which alone knows what is in flight; this module
//!    just reports what it is given.
//! 5. **Updates are prompt and regular.** A new confirmation is reported within
//!    [`Progress::min_gap`] (coalescing bursts of acknowledgements), a keepalive that asks for a
//!    reply is answered at once, and an update goes out at least every
//!    [`Progress::interval`], well inside the server's `wal_sender_timeout` (60 s by default),
//!    even while the pipeline applies backpressure and we are not reading.
//! 6. **Resuming is checked.** After `START_REPLICATION` the reader checks that the slot's
//!    `confirmed_flush_lsn` has not moved past the point we resumed from: if it has, something
//!    else consumed or advanced the slot and transactions were skipped, which Ferry reports and
//!    stops on rather than hiding.

use std::time::{Duration, Instant};

use crate::wire::{PgTimestamp, StandbyStatusUpdate};
use crate::Lsn;

/// A confirmation below the current one: the caller's bookkeeping is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("confirmation rewinds from {current} to {requested}: the flush LSN never moves backwards")]
pub struct RewindError {
    pub current: Lsn,
    pub requested: Lsn,
}

/// Feedback state of one replication session.
#[derive(Debug, Clone)]
pub struct Progress {
    confirmed: Lsn,
    received: Lsn,
    last_sent_flush: Lsn,
    last_sent_at: Option<Instant>,
    reply_pending: bool,
    interval: Duration,
    min_gap: Duration,
}

impl Progress {
    /// Starts at the resume point, reporting at least every `interval` and new confirmations
    /// at most `min_gap` late.
    pub fn new(resume: Lsn, interval: Duration, min_gap: Duration) -> Progress {
        Progress {
            confirmed: resume,
            received: resume,
            last_sent_flush: resume,
            last_sent_at: None,
            reply_pending: false,
            interval,
            min_gap: min_gap.min(interval),
        }
    }

    /// The most recent confirmed LSN (what `flush_lsn` reports).
    pub fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    /// The highest WAL position received.
    pub fn received(&self) -> Lsn {
        self.received
    }

    /// The regular update interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// How late a new confirmation may be reported.
    pub fn min_gap(&self) -> Duration {
        self.min_gap
    }

    /// Records WAL received up to `lsn`.
    pub fn on_received(&mut self, lsn: Lsn) {
        self.received = self.received.max(lsn);
    }

    /// Records a keepalive; a requested reply becomes due at once.
    pub fn on_keepalive(&mut self, wal_end: Lsn, reply_requested: bool) {
        self.on_received(wal_end);
        self.reply_pending |= reply_requested;
    }

    /// The caller confirms everything up to `lsn`. Equal is a no-op; lower is an error.
    pub fn confirm(&mut self, lsn: Lsn) -> Result<(), RewindError> {
        if lsn < self.confirmed {
            return Err(RewindError {
                current: self.confirmed,
                requested: lsn,
            });
        }
        self.confirmed = lsn;
        Ok(())
    }

    /// When the next update is due (may be in the past).
    pub fn next_due(&self, now: Instant) -> Instant {
        let Some(last) = self.last_sent_at else {
            return now;
        };
        if self.reply_pending {
            return now;
        }
        let regular = last + self.interval;
        if self.confirmed > self.last_sent_flush {
            regular.min(last + self.min_gap)
        } else {
            regular
        }
    }

    /// Whether an update is due at `now`.
    pub fn is_due(&self, now: Instant) -> bool {
        self.next_due(now) <= now
    }

    /// Builds the update to send now and records it as sent.
    pub fn take_update(&mut self, now: Instant, client_time: PgTimestamp) -> StandbyStatusUpdate {
        self.last_sent_at = Some(now);
        self.last_sent_flush = self.confirmed;
        self.reply_pending = false;
        StandbyStatusUpdate {
            write_lsn: self.received.max(self.confirmed),
            flush_lsn: self.confirmed,
            apply_lsn: self.confirmed,
            client_time,
            reply_requested: false,
        }
    }
}

/// How long the server may stay silent on the replication connection, and what the reader does
/// about it; pure, the reader task drives it with the clock.
///
/// A server that vanished without closing the connection (a host gone, a dropped route, a
/// proxy whose server died) sends nothing more, and the reader would wait forever: the status
/// updates it writes are acknowledged by a proxy, or retransmitted by the kernel for about 15
/// minutes (`tcp_retries2`) before the socket fails. PostgreSQL's own logical replication
/// worker ends such a connection after `wal_receiver_timeout` (60 s by default), asking the
/// walsender for a reply first. Ferry does the same with `postgres.receive_timeout` (`t`):
///
/// - after `t/4` of silence it **asks for a reply**: every status update from then on has
///   `reply_requested` set, until the server is heard. A walsender answers it with a keepalive
///   whenever it reads its client's messages: at once when idle or sending, and while it
///   decodes changes it sends nothing for (other tables' rows) at least every
///   `wal_sender_timeout / 2` (PostgreSQL 15, and 14.4 and later, where the same fix was
///   backpatched; every 100 changes with `wal_sender_timeout = 0`);
/// - the connection is **lost** once `t` has passed since the server was last heard *and*
///   `3t/4` since the first request: a reader that wakes late (its process stopped, or
///   starved of CPU) asks first and waits before it gives up.
///
/// Only the time the reader spends waiting on the socket counts: the reader marks the server
/// heard after every read it handled, including the waits for the pipeline inside it (a
/// pipeline that stops taking events stops the reader reading, which is not the server's
/// silence).
#[derive(Debug, Clone)]
pub struct Silence {
    timeout: Option<Duration>,
    heard_at: Instant,
    /// When the first request for a reply of this silence went out.
    asked_at: Option<Instant>,
}

/// The receive timeout a session streams with: the configured one, but never shorter than the
/// server's `wal_sender_timeout` (`server`, `None` when off). While a walsender decodes changes
/// it sends nothing for, it answers a request for a reply only every half of its own timeout
/// (PostgreSQL 14.4+); [`Silence`] asks from a quarter of its timeout on, so at least the
/// server's leaves a quarter to spare. A server without one reads replies every 100 changes.
/// `configured` `None`: never.
pub fn receive_timeout(configured: Option<Duration>, server: Option<Duration>) -> Option<Duration> {
    configured.map(|t| t.max(server.unwrap_or_default()))
}

/// What silence calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Silent {
    /// Nothing (more) yet.
    Fine,
    /// Ask the server for a reply (and keep asking in every status update until it is heard).
    Ask,
    /// The connection is lost.
    Lost,
}

impl Silence {
    /// Heard at `now`; `timeout` `None` (or zero) never takes the connection for lost.
    pub fn new(timeout: Option<Duration>, now: Instant) -> Silence {
        Silence {
            timeout: timeout.filter(|t| !t.is_zero()),
            heard_at: now,
            asked_at: None,
        }
    }

    /// The server was heard from (or the reader was busy, not waiting on it) at `now`.
    pub fn heard(&mut self, now: Instant) {
        if now >= self.heard_at {
            self.heard_at = now;
            self.asked_at = None;
        }
    }

    /// Whether status updates ask for a reply (the silence has lasted a quarter of the timeout).
    pub fn asking(&self) -> bool {
        self.asked_at.is_some()
    }

    /// When the connection is taken for lost if nothing is heard; `None` without a timeout.
    pub fn lost_at(&self) -> Option<Instant> {
        let t = self.timeout?;
        let by_silence = self.heard_at + t;
        Some(match self.asked_at {
            Some(asked) => by_silence.max(asked + t * 3 / 4),
            // Asked at a quarter at the earliest: three quarters after it.
            None => by_silence,
        })
    }

    /// When to look again: the first request's time until it is made, then the loss's.
    pub fn next_check(&self) -> Option<Instant> {
        let t = self.timeout?;
        match self.asked_at {
            None => Some(self.heard_at + t / 4),
            Some(_) => self.lost_at(),
        }
    }

    /// What the silence up to `now` calls for.
    pub fn check(&mut self, now: Instant) -> Silent {
        let Some(t) = self.timeout else {
            return Silent::Fine;
        };
        match self.asked_at {
            None if now.saturating_duration_since(self.heard_at) >= t / 4 => {
                self.asked_at = Some(now);
                Silent::Ask
            }
            Some(_) if self.lost_at().is_some_and(|lost| now >= lost) => Silent::Lost,
            _ => Silent::Fine,
        }
    }

    /// The timeout, for the error that reports it.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);
    const GAP: Duration = Duration::from_millis(20);

    fn t0() -> Instant {
        Instant::now()
    }

    #[test]
    fn flush_is_only_what_was_confirmed() {
        let now = t0();
        let mut p = Progress::new(Lsn(100), 10 * SEC, GAP);
        p.on_received(Lsn(500));
        let u = p.take_update(now, PgTimestamp(0));
        assert_eq!(
            (u.write_lsn, u.flush_lsn, u.apply_lsn),
            (Lsn(500), Lsn(100), Lsn(100))
        );
        p.confirm(Lsn(300)).unwrap();
        let u = p.take_update(now, PgTimestamp(0));
        assert_eq!((u.write_lsn, u.flush_lsn), (Lsn(500), Lsn(300)));
    }

    #[test]
    fn never_moves_backwards() {
        let mut p = Progress::new(Lsn(100), SEC, GAP);
        assert_eq!(
            p.confirm(Lsn(99)),
            Err(RewindError {
                current: Lsn(100),
                requested: Lsn(99)
            })
        );
        p.confirm(Lsn(100)).unwrap();
        p.confirm(Lsn(200)).unwrap();
        assert!(p.confirm(Lsn(150)).is_err());
        assert_eq!(p.confirmed(), Lsn(200));
    }

    #[test]
    fn first_update_is_due_at_once_then_regularly() {
        let now = t0();
        let mut p = Progress::new(Lsn(1), SEC, GAP);
        assert!(p.is_due(now));
        p.take_update(now, PgTimestamp(0));
        assert!(!p.is_due(now + SEC / 2));
        assert!(p.is_due(now + SEC));
    }

    #[test]
    fn new_confirmation_is_due_after_the_min_gap() {
        let now = t0();
        let mut p = Progress::new(Lsn(1), 10 * SEC, GAP);
        p.take_update(now, PgTimestamp(0));
        p.confirm(Lsn(2)).unwrap();
        assert_eq!(p.next_due(now), now + GAP);
        // An equal confirmation is not news.
        p.take_update(now + GAP, PgTimestamp(0));
        p.confirm(Lsn(2)).unwrap();
        assert_eq!(p.next_due(now + GAP), now + GAP + 10 * SEC);
    }

    #[test]
    fn requested_reply_is_due_at_once() {
        let now = t0();
        let mut p = Progress::new(Lsn(1), 10 * SEC, GAP);
        p.take_update(now, PgTimestamp(0));
        p.on_keepalive(Lsn(9), false);
        assert!(!p.is_due(now));
        p.on_keepalive(Lsn(10), true);
        assert!(p.is_due(now));
        let u = p.take_update(now, PgTimestamp(0));
        assert_eq!((u.write_lsn, u.flush_lsn), (Lsn(10), Lsn(1)));
        assert!(!p.is_due(now));
    }

    #[test]
    fn silence_asks_at_a_quarter_and_is_lost_at_the_whole() {
        let now = t0();
        let mut s = Silence::new(Some(60 * SEC), now);
        assert_eq!(s.next_check(), Some(now + 15 * SEC));
        assert_eq!(s.check(now + 14 * SEC), Silent::Fine);
        assert!(!s.asking());
        assert_eq!(s.check(now + 15 * SEC), Silent::Ask);
        // Every status update asks from then on; the first request is made once.
        assert!(s.asking());
        assert_eq!(s.check(now + 16 * SEC), Silent::Fine);
        assert_eq!(s.next_check(), Some(now + 60 * SEC));
        assert_eq!(s.lost_at(), Some(now + 60 * SEC));
        assert_eq!(s.check(now + 59 * SEC), Silent::Fine);
        assert_eq!(s.check(now + 60 * SEC), Silent::Lost);
    }

    #[test]
    fn a_reader_that_wakes_late_asks_before_it_gives_up() {
        let now = t0();
        let mut s = Silence::new(Some(60 * SEC), now);
        // Stopped for ten minutes: it asks first, and waits three quarters of the timeout.
        let woke = now + 600 * SEC;
        assert_eq!(s.check(woke), Silent::Ask);
        assert_eq!(s.next_check(), Some(woke + 45 * SEC));
        assert_eq!(s.check(woke + 44 * SEC), Silent::Fine);
        assert_eq!(s.check(woke + 45 * SEC), Silent::Lost);
    }

    #[test]
    fn hearing_from_the_server_starts_the_silence_over() {
        let now = t0();
        let mut s = Silence::new(Some(8 * SEC), now);
        assert_eq!(s.check(now + 2 * SEC), Silent::Ask);
        s.heard(now + 3 * SEC);
        assert!(!s.asking());
        assert_eq!(s.next_check(), Some(now + 5 * SEC));
        assert_eq!(s.check(now + 4 * SEC), Silent::Fine);
        assert_eq!(s.check(now + 5 * SEC), Silent::Ask);
        // An earlier instant changes nothing.
        s.heard(now);
        assert!(s.asking());
        assert_eq!(s.check(now + 11 * SEC), Silent::Lost);
    }

    #[test]
    fn the_receive_timeout_is_never_shorter_than_the_servers() {
        let (min, five) = (60 * SEC, 300 * SEC);
        assert_eq!(receive_timeout(Some(min), None), Some(min));
        assert_eq!(receive_timeout(Some(min), Some(30 * SEC)), Some(min));
        assert_eq!(receive_timeout(Some(min), Some(five)), Some(five));
        assert_eq!(receive_timeout(None, Some(five)), None);
    }

    #[test]
    fn no_timeout_never_loses_the_connection() {
        let now = t0();
        for timeout in [None, Some(Duration::ZERO)] {
            let mut s = Silence::new(timeout, now);
            assert_eq!(s.next_check(), None);
            assert_eq!(s.check(now + 3600 * SEC), Silent::Fine);
        }
    }

    #[test]
    fn write_never_below_flush() {
        let mut p = Progress::new(Lsn(50), SEC, GAP);
        p.confirm(Lsn(80)).unwrap();
        let u = p.take_update(t0(), PgTimestamp(0));
        assert!(u.write_lsn >= u.flush_lsn);
    }
}
