//! The wait between sessions: exponential, and started over by a session that worked.
//!
//! Pure: the supervisor ([`super::Supervisor`]) asks it how long to wait and tells it what each
//! session did; it reads no clock of its own.
//!
//! A backoff that only grows punishes a long-lived instance for its past: after seven transient
//! errors over its life (a PostgreSQL restart a week, a network blip), every later one would
//! wait the maximum, 30 s by default, before trying again. So a session that **worked** starts
//! the backoff over from its minimum:
//!
//! - it confirmed a position past the one it started from: PostgreSQL, the stream and Kafka all
//!   did their part at least once; or
//! - it streamed for at least the backoff's maximum: an idle outbox confirms nothing, and a
//!   session that lasted longer than the longest wait is not one of a crash loop.
//!
//! A session that fails again before either (a walsender that errors at the same WAL position
//! every time, a server that accepts the connection and then drops it) keeps the backoff
//! growing, so a loop of such sessions is paced like any other failure.

use std::time::{Duration, Instant};

/// What a session did that bears on the wait after it (kept by the session's driver).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Lived {
    /// When the session began to stream (`START_REPLICATION` answered), if it did.
    pub streaming_since: Option<Instant>,
    /// Whether it confirmed a position past the one it started from.
    pub confirmed_past_start: bool,
    /// Whether it opened its SQL connection to PostgreSQL (its first step): a session that
    /// could not is followed by quiet attempts to connect during the backoff
    /// ([`super::Supervisor::retry`]).
    pub connected: bool,
}

/// The exponential backoff of the supervisor.
#[derive(Debug)]
pub(super) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        // A maximum below the minimum (the configuration refuses it) is read as the minimum.
        let max = max.max(min);
        Backoff {
            min,
            max,
            next: min,
        }
    }

    /// The wait before the next attempt.
    pub fn next(&self) -> Duration {
        self.next
    }

    /// The next wait is taken: the one after it doubles, up to the maximum.
    pub fn took(&mut self) {
        self.next = self.next.saturating_mul(2).min(self.max);
    }

    /// Back to the minimum.
    pub fn reset(&mut self) {
        self.next = self.min;
    }

    /// A session ended at `now` having done what `lived` says: one that worked (see the
    /// module's doc) starts the backoff over. Returns whether it did.
    pub fn session_ended(&mut self, lived: Lived, now: Instant) -> bool {
        let worked = lived.confirmed_past_start
            || lived
                .streaming_since
                .is_some_and(|since| now.saturating_duration_since(since) >= self.max);
        if worked {
            self.reset();
        }
        worked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(30);

    /// The waits of `n` attempts in a row, each taken.
    fn waits(b: &mut Backoff, n: usize) -> Vec<u64> {
        (0..n)
            .map(|_| {
                let w = b.next().as_millis() as u64;
                b.took();
                w
            })
            .collect()
    }

    #[test]
    fn doubles_up_to_the_maximum() {
        let mut b = Backoff::new(MIN, MAX);
        assert_eq!(
            waits(&mut b, 8),
            [500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]
        );
    }

    #[test]
    fn a_session_that_confirmed_past_its_start_starts_it_over() {
        let mut b = Backoff::new(MIN, MAX);
        let now = Instant::now();
        for _ in 0..10 {
            // Each session streams a moment, confirms something, and fails.
            assert_eq!(b.next(), MIN);
            b.took();
            let lived = Lived {
                streaming_since: Some(now),
                confirmed_past_start: true,
                connected: true,
            };
            assert!(b.session_ended(lived, now + Duration::from_millis(10)));
        }
        assert_eq!(b.next(), MIN);
    }

    #[test]
    fn a_session_that_streamed_as_long_as_the_maximum_starts_it_over() {
        let mut b = Backoff::new(MIN, MAX);
        waits(&mut b, 7);
        let since = Instant::now();
        let lived = Lived {
            streaming_since: Some(since),
            confirmed_past_start: false,
            connected: true,
        };
        assert!(!b.session_ended(lived, since + MAX - Duration::from_millis(1)));
        assert_eq!(b.next(), MAX);
        assert!(b.session_ended(lived, since + MAX));
        assert_eq!(b.next(), MIN);
    }

    #[test]
    fn sessions_that_fail_before_working_keep_it_growing() {
        let mut b = Backoff::new(MIN, MAX);
        let now = Instant::now();
        let mut seen = Vec::new();
        for lived in [
            // Never connected, never streamed.
            Lived::default(),
            // Streamed a moment, confirmed nothing: a walsender failing at the same place.
            Lived {
                streaming_since: Some(now),
                confirmed_past_start: false,
                connected: true,
            },
            Lived::default(),
            Lived {
                streaming_since: Some(now),
                confirmed_past_start: false,
                connected: true,
            },
        ] {
            seen.push(b.next().as_millis() as u64);
            b.took();
            assert!(!b.session_ended(lived, now + Duration::from_secs(5)));
        }
        assert_eq!(seen, [500, 1_000, 2_000, 4_000]);
        assert_eq!(b.next(), Duration::from_secs(8));
    }

    #[test]
    fn a_maximum_below_the_minimum_is_the_minimum() {
        let mut b = Backoff::new(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(waits(&mut b, 3), [2_000, 2_000, 2_000]);
    }
}
