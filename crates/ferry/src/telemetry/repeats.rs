//! Repeated log events, summarised: the first of a kind is logged, the repeats within
//! [`WINDOW`] are counted, and the next one after the window is logged with that count.
//!
//! librdkafka raises a client error on every failed reconnect: with the brokers away,
//! `AllBrokersDown` comes about 20 times a second (measured: 254 lines in 15 s against a closed
//! port), which buries everything else in the log and costs a log collector real money. What an
//! operator needs is the first line, and then a reminder that it goes on: `repeated = N` says how
//! many were left out since the last line. Pure (the caller passes the time), so it is tested
//! without a clock.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the repeats of an event stay quiet after it was logged.
pub const WINDOW: Duration = Duration::from_secs(30);

/// At most this many kinds are remembered; past it the memory starts over (kinds are few: the
/// bound only keeps an unexpected variety of messages from growing it without end).
const MAX_KINDS: usize = 64;

#[derive(Debug)]
struct Seen {
    logged: Instant,
    left_out: u64,
}

/// Which occurrences of which kinds to log.
#[derive(Debug, Default)]
pub struct Repeats(Mutex<HashMap<String, Seen>>);

impl Repeats {
    /// Whether an event of `kind` at `now` is to be logged: `Some(n)` with the number of events
    /// of that kind left out since the last one logged, `None` to leave it out.
    pub fn admit(&self, kind: &str, now: Instant) -> Option<u64> {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = seen.get_mut(kind) {
            if now.saturating_duration_since(s.logged) < WINDOW {
                s.left_out += 1;
                return None;
            }
            let n = s.left_out;
            *s = Seen {
                logged: now,
                left_out: 0,
            };
            return Some(n);
        }
        if seen.len() >= MAX_KINDS {
            seen.clear();
        }
        seen.insert(
            kind.to_string(),
            Seen {
                logged: now,
                left_out: 0,
            },
        );
        Some(0)
    }
}

/// The kind of a message: the message without its digits, so that `1/1 brokers are down` and
/// `0/1 brokers are down`, or the same failure on two ports, are one kind.
pub fn kind_of(message: &str) -> String {
    message.chars().filter(|c| !c.is_ascii_digit()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_of_a_kind_is_logged_its_repeats_counted_within_the_window() {
        let r = Repeats::default();
        let t0 = Instant::now();
        assert_eq!(r.admit("down", t0), Some(0));
        for i in 1..=20 {
            assert_eq!(r.admit("down", t0 + Duration::from_millis(50 * i)), None);
        }
        // Another kind is not held back by the first.
        assert_eq!(r.admit("refused", t0 + Duration::from_secs(1)), Some(0));
        // After the window: logged, with what was left out.
        assert_eq!(r.admit("down", t0 + WINDOW), Some(20));
        assert_eq!(r.admit("down", t0 + WINDOW + Duration::from_secs(1)), None);
        assert_eq!(r.admit("down", t0 + WINDOW * 2), Some(1));
        // A quiet spell: the next one is logged with nothing left out.
        assert_eq!(r.admit("down", t0 + WINDOW * 5), Some(0));
    }

    #[test]
    fn a_window_is_measured_from_the_line_logged_not_from_the_last_repeat() {
        let r = Repeats::default();
        let t0 = Instant::now();
        assert_eq!(r.admit("x", t0), Some(0));
        assert_eq!(r.admit("x", t0 + WINDOW - Duration::from_millis(1)), None);
        assert_eq!(r.admit("x", t0 + WINDOW), Some(1));
    }

    #[test]
    fn kinds_are_bounded() {
        let r = Repeats::default();
        let t0 = Instant::now();
        for i in 0..(MAX_KINDS * 3) {
            assert_eq!(r.admit(&format!("kind {i:x}z"), t0), Some(0));
        }
        assert!(r.0.lock().unwrap().len() <= MAX_KINDS);
    }

    #[test]
    fn digits_do_not_make_a_kind() {
        assert_eq!(
            kind_of("1/1 brokers are down"),
            kind_of("0/1 brokers are down")
        );
        assert_eq!(
            kind_of("127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed"),
            kind_of("127.0.0.1:9093/bootstrap: Connect to ipv4#127.0.0.1:9093 failed")
        );
        assert_ne!(kind_of("brokers are down"), kind_of("Connection refused"));
    }
}
