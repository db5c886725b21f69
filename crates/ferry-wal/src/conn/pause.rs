//! The reader's pause inside a transaction (see `stream::Task::pause_inside_transaction`): when
//! it may end before its length, once the rest of a transaction has come ([`Pace`]), and its
//! timer ([`Pause`], on [`crate::timer::Timer`]: tokio's timer wheel counts whole milliseconds
//! while the pause is a fraction of one). Where there is no such timer, the reader does not
//! pause.

use std::time::{Duration, Instant};

/// While transactions begin within this of the last one's commit, on average, the stream is
/// busy ([`Pace`]). Twice the longest pause: at the steady rate of bench/README.md (1,000
/// ten-row transactions a second) the stream is busy, at 200 a second it is idle.
pub(crate) const BUSY_GAP: Duration = Duration::from_millis(1);

/// The most one gap counts for in [`Pace`]'s average, so that after a quiet spell (or a backlog,
/// when the pace is not kept) a busy stream is seen as busy again within a few transactions.
const GAP_CAP: Duration = Duration::from_millis(8);

/// What a message is to the transaction it comes in ([`Pace::message`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    Begin,
    Commit,
    /// Anything else: a row, a relation, a logical message (inside a transaction or not).
    Other,
}

/// How a pause inside a transaction ends ([`Pace::pause`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PauseUntil {
    /// When its timer runs out.
    ItsEnd,
    /// When this many more bytes have come, the rest of a transaction like the last ones (or
    /// its timer runs out first).
    Rest(usize),
}

/// What the reader knows of the stream's pace, to tell whether and how it pauses inside a
/// transaction: the sizes of the last transactions, and whether this one began close behind
/// the last.
///
/// - **A busy stream** (transactions begin within [`BUSY_GAP`] of the last one's commit, on
///   average over the last ones: the newest counts for an eighth, so that one late
///   transaction does not change the mode): the pause runs its length. The server decodes
///   each transaction while the next ones wait, and sends it a message at a time; a pause of
///   its length reads the rest, and the keepalive after it, at once.
/// - **An idle one**: the pause ends once the rest of a transaction like the last ones has
///   come ([`RecentSizes`]), and beyond that, or with nothing known, there is none. A server
///   idle between transactions sends each at once, and a pause of its length would only delay
///   it.
#[derive(Debug, Default)]
pub(crate) struct Pace {
    sizes: RecentSizes,
    /// When the last transaction's commit was read.
    last_commit: Option<Instant>,
    /// The time from a commit to the next transaction's begin, on average (exponential: the
    /// newest counts for an eighth).
    gap: Option<Duration>,
    /// Whether that average was under [`BUSY_GAP`] when the open transaction began.
    busy: bool,
    /// Whether a transaction's begin was read and not yet its commit.
    open: bool,
    /// The open transaction's bytes on the wire so far (0 between transactions).
    txn_bytes: usize,
    /// Whether the open transaction has brought nothing but its begin so far.
    txn_empty: bool,
    /// Whether the last message read ended a transaction that [`RecentSizes`] recorded.
    after_commit: bool,
}

impl Pace {
    /// A message read at `now`, `wire` bytes on the wire. Out of line: the reader calls it
    /// only while it keeps the pace, and its every message should not pay for the code.
    #[inline(never)]
    pub(crate) fn message(&mut self, now: Instant, wire: usize, bound: Bound) {
        self.after_commit = false;
        match bound {
            Bound::Begin => {
                // What came before (of a transaction whose end the pace did not see) is no
                // part of this one.
                self.open = true;
                self.txn_bytes = wire;
                self.txn_empty = true;
                if let Some(commit) = self.last_commit {
                    let gap = now.saturating_duration_since(commit).min(GAP_CAP);
                    let average = self
                        .gap
                        .map_or(gap, |average| average - average / 8 + gap / 8);
                    self.gap = Some(average);
                    self.busy = average < BUSY_GAP;
                }
            }
            Bound::Other => {
                if self.open {
                    self.txn_bytes += wire;
                    self.txn_empty = false;
                }
            }
            Bound::Commit => {
                // A transaction with nothing in it (PostgreSQL 14 sends one for every
                // transaction that wrote to the database) tells nothing of the next one's size.
                if std::mem::take(&mut self.open) && !self.txn_empty {
                    self.sizes.record(self.txn_bytes + wire);
                    self.after_commit = true;
                }
                self.txn_bytes = 0;
                self.last_commit = Some(now);
            }
        }
    }

    /// A keepalive read, `wire` bytes on the wire. One straight after a commit (the server
    /// sends one once it has caught up) counts with its transaction, so that a pause's read
    /// takes it too.
    pub(crate) fn keepalive(&mut self, wire: usize) {
        if std::mem::take(&mut self.after_commit) {
            self.sizes.grow_last(wire);
        }
    }

    /// How the reader pauses in the open transaction, of which `buffered` more bytes than the
    /// messages read so far came; `None`: it does not.
    pub(crate) fn pause(&self, buffered: usize) -> Option<PauseUntil> {
        if self.busy {
            return Some(PauseUntil::ItsEnd);
        }
        if !self.open {
            // Its begin came while the pace was not kept: nothing is known of its size.
            return None;
        }
        self.sizes
            .rest(self.txn_bytes + buffered)
            .map(PauseUntil::Rest)
    }
}

/// How many transactions [`RecentSizes`] remembers.
const RECENT: usize = 8;

/// The sizes on the wire of the last few transactions the reader read whole, to tell how much
/// of the next one is still to come once its first part is read: as much as the smallest of
/// them still lacks. Under a steady load of like transactions that is the rest of this one,
/// to its commit; a smaller transaction than all of them waits for the pause's end instead.
#[derive(Debug, Default)]
pub(crate) struct RecentSizes {
    sizes: [u32; RECENT],
    /// Where the next size goes.
    next: usize,
    /// How many of `sizes` are real.
    filled: usize,
}

impl RecentSizes {
    /// A transaction read whole, `bytes` on the wire.
    pub(crate) fn record(&mut self, bytes: usize) {
        self.sizes[self.next] = u32::try_from(bytes).unwrap_or(u32::MAX);
        self.next = (self.next + 1) % RECENT;
        self.filled = (self.filled + 1).min(RECENT);
    }

    /// Adds `bytes` to the transaction recorded last (what came straight after its commit).
    pub(crate) fn grow_last(&mut self, bytes: usize) {
        if self.filled > 0 {
            let last = &mut self.sizes[(self.next + RECENT - 1) % RECENT];
            *last = last.saturating_add(u32::try_from(bytes).unwrap_or(u32::MAX));
        }
    }

    /// The bytes still to come of a transaction of which `so_far` came: what the smallest
    /// recent transaction has beyond it. `None` before any transaction was read whole, or when
    /// this one is already as large as the smallest.
    pub(crate) fn rest(&self, so_far: usize) -> Option<usize> {
        let smallest = self.sizes[..self.filled].iter().min()?;
        usize::try_from(*smallest)
            .ok()?
            .checked_sub(so_far)
            .filter(|rest| *rest > 0)
    }
}

/// A one-shot timer on the runtime's poller ([`crate::timer::Timer`]), of a fixed length.
#[derive(Debug)]
pub(crate) struct Pause {
    timer: crate::timer::Timer,
    length: Duration,
}

impl Pause {
    /// A new timer that runs `length` from each start, or `None` where there is none (the
    /// reader then reads without pausing). Must be called within a tokio runtime.
    pub(crate) fn new(length: Duration) -> Option<Self> {
        Some(Pause {
            timer: crate::timer::Timer::new()?,
            length,
        })
    }

    /// Starts the timer: [`Pause::over`] returns its length from now. Starting it again moves
    /// the end, and forgets an end that passed unread. False if the kernel refused (the caller
    /// then does not wait for it).
    pub(crate) fn start(&mut self) -> bool {
        // A zero value would disarm the timer; the shortest pause is a nanosecond.
        self.timer.set(self.length.max(Duration::from_nanos(1)))
    }

    /// Stops the timer before its end, so that an end nobody waits for does not wake the
    /// runtime's thread, and forgets an end that passed unread.
    pub(crate) fn stop(&mut self) {
        self.timer.set(Duration::ZERO);
    }

    /// Waits until the timer started last has run out (cancel-safe: [`crate::timer::Timer::over`]).
    pub(crate) async fn over(&mut self) {
        self.timer.over().await;
    }
}

#[cfg(test)]
mod sizes_tests {
    use super::*;

    /// A transaction of `rows` rows of 1,000 bytes: its Begin read at `begin`, its Commit at
    /// `commit`, each message 1,000 bytes on the wire; `rows + 2` thousand in all.
    fn transaction(pace: &mut Pace, begin: Instant, rows: usize, commit: Instant) {
        pace.message(begin, 1_000, Bound::Begin);
        for _ in 0..rows {
            pace.message(begin, 1_000, Bound::Other);
        }
        pace.message(commit, 1_000, Bound::Commit);
    }

    /// Transactions of a begin and a commit, each begun `step` after the last one's commit (at
    /// most `most` of them): the first whose pause runs its length (`busy`) or does not.
    fn first_to_be(
        pace: &mut Pace,
        t: &mut Instant,
        step: Duration,
        busy: bool,
        most: usize,
    ) -> Option<usize> {
        let mut first = None;
        for n in 1..=most {
            *t += step;
            pace.message(*t, 1_000, Bound::Begin);
            if first.is_none() && (pace.pause(0) == Some(PauseUntil::ItsEnd)) == busy {
                first = Some(n);
            }
            pace.message(*t, 1_000, Bound::Commit);
        }
        first
    }

    #[test]
    fn an_idle_stream_pauses_until_the_rest_of_a_transaction_like_the_last_ones() {
        let mut pace = Pace::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // The first transaction: nothing known, no pause.
        pace.message(t0, 1_000, Bound::Begin);
        assert_eq!(pace.pause(0), None);
        pace.message(t0, 1_000, Bound::Other);
        pace.message(t0 + ms(1), 1_000, Bound::Commit);
        pace.keepalive(23);
        // A keepalive later, not straight after a commit, counts for nothing.
        pace.keepalive(23);
        // The next began long after; the pause ends with its rest (the keepalive after the
        // last commit included).
        pace.message(t0 + ms(6), 1_000, Bound::Begin);
        assert_eq!(pace.pause(0), Some(PauseUntil::Rest(2_023)));
        // What is buffered counts as come.
        assert_eq!(pace.pause(500), Some(PauseUntil::Rest(1_523)));
        pace.message(t0 + ms(6), 1_000, Bound::Other);
        pace.message(t0 + ms(6), 1_000, Bound::Other);
        assert_eq!(pace.pause(0), Some(PauseUntil::Rest(23)));
        // Beyond what is known: no pause.
        pace.message(t0 + ms(6), 1_000, Bound::Other);
        assert_eq!(pace.pause(0), None);
        pace.message(t0 + ms(7), 1_000, Bound::Commit);
        // The smallest recent transaction (3,023 bytes) sets the rest.
        pace.message(t0 + ms(12), 1_000, Bound::Begin);
        assert_eq!(pace.pause(0), Some(PauseUntil::Rest(2_023)));
    }

    #[test]
    fn a_stream_is_busy_while_transactions_come_close_behind_on_average() {
        let mut pace = Pace::default();
        let mut t = Instant::now();
        let ms = Duration::from_millis;
        // 5 ms from each commit to the next begin: idle.
        for _ in 0..4 {
            transaction(&mut pace, t, 1, t);
            t += ms(5);
        }
        pace.message(t, 1_000, Bound::Begin);
        assert_eq!(pace.pause(0), Some(PauseUntil::Rest(2_000)));
        pace.message(t, 1_000, Bound::Commit);
        // Then each begins as its predecessor commits (read by the same wake-up): busy once
        // the average is under the gap, 5 ms × (7/8)^n < 1 ms from the 13th on.
        for n in 1..=20 {
            pace.message(t, 1_000, Bound::Begin);
            let expected = if n < 13 {
                Some(PauseUntil::Rest(2_000))
            } else {
                Some(PauseUntil::ItsEnd)
            };
            assert_eq!(pace.pause(0), expected, "transaction {n}");
            pace.message(t, 1_000, Bound::Other);
            pace.message(t, 1_000, Bound::Commit);
        }
        // Busy: the pause runs its length, whatever came so far.
        pace.message(t, 1_000, Bound::Begin);
        assert_eq!(pace.pause(70_000), Some(PauseUntil::ItsEnd));
        pace.message(t, 1_000, Bound::Commit);
        // One late transaction does not make it idle.
        t += ms(3);
        pace.message(t, 1_000, Bound::Begin);
        assert_eq!(pace.pause(0), Some(PauseUntil::ItsEnd));
        pace.message(t, 1_000, Bound::Commit);
        // A begin read before the commit's clock read counts as close behind.
        pace.message(t - ms(1), 1_000, Bound::Begin);
        assert_eq!(pace.pause(0), Some(PauseUntil::ItsEnd));
        pace.message(t, 1_000, Bound::Commit);
        // Late ones again: idle after two.
        assert_eq!(first_to_be(&mut pace, &mut t, ms(3), false, 5), Some(2));
    }

    #[test]
    fn a_quiet_spell_counts_for_a_few_transactions_only() {
        let mut pace = Pace::default();
        let mut t = Instant::now();
        // Busy, each transaction begun as the last committed.
        for _ in 0..40 {
            transaction(&mut pace, t, 1, t);
        }
        // An hour of nothing.
        t += Duration::from_secs(3600);
        pace.message(t, 1_000, Bound::Begin);
        assert_eq!(pace.pause(0), Some(PauseUntil::Rest(2_000)));
        pace.message(t, 1_000, Bound::Commit);
        // Busy again: seen as busy at once, not after dozens of transactions (an hour would
        // have weighed on the average for ~70).
        assert_eq!(
            first_to_be(&mut pace, &mut t, Duration::ZERO, true, 40),
            Some(1)
        );
    }

    #[test]
    fn a_transaction_begins_afresh_after_one_whose_end_was_not_seen() {
        let mut pace = Pace::default();
        let t = Instant::now();
        let ms = Duration::from_millis;
        transaction(&mut pace, t, 1, t);
        // A transaction's start, then (the pace not kept meanwhile) its end unseen.
        pace.message(t + ms(10), 50_000, Bound::Begin);
        // The next begins: only its own bytes count.
        pace.message(t + ms(20), 1_000, Bound::Begin);
        assert_eq!(pace.pause(0), Some(PauseUntil::Rest(2_000)));
        pace.message(t + ms(20), 1_000, Bound::Commit);
        // One whose begin the pace did not see: nothing known, no pause.
        pace.message(t + ms(30), 1_000, Bound::Other);
        assert_eq!(pace.pause(0), None);
    }

    #[test]
    fn an_empty_transaction_tells_nothing_of_the_next_ones_size() {
        let mut pace = Pace::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        transaction(&mut pace, t0, 5, t0);
        // A Begin and a Commit alone, then its keepalive.
        pace.message(t0 + ms(10), 51, Bound::Begin);
        pace.message(t0 + ms(10), 56, Bound::Commit);
        pace.keepalive(23);
        pace.message(t0 + ms(20), 1_000, Bound::Begin);
        assert_eq!(pace.pause(0), Some(PauseUntil::Rest(6_000)));
    }

    #[test]
    fn nothing_is_known_before_a_whole_transaction() {
        assert_eq!(RecentSizes::default().rest(0), None);
    }

    #[test]
    fn the_rest_is_what_the_smallest_recent_transaction_has_beyond_what_came() {
        let mut sizes = RecentSizes::default();
        for bytes in [9_000, 7_000, 8_000] {
            sizes.record(bytes);
        }
        assert_eq!(sizes.rest(0), Some(7_000));
        assert_eq!(sizes.rest(2_500), Some(4_500));
        // As large as the smallest already: nothing is known of its rest.
        assert_eq!(sizes.rest(7_000), None);
        assert_eq!(sizes.rest(7_001), None);
    }

    #[test]
    fn what_came_after_a_commit_grows_the_last_transaction() {
        let mut sizes = RecentSizes::default();
        // Nothing to grow yet.
        sizes.grow_last(23);
        assert_eq!(sizes.rest(0), None);
        sizes.record(7_000);
        sizes.grow_last(23);
        assert_eq!(sizes.rest(0), Some(7_023));
        for _ in 0..RECENT - 1 {
            sizes.record(9_000);
        }
        sizes.grow_last(23);
        assert_eq!(sizes.rest(0), Some(7_023));
        // The first one leaves the window: the last one grew, the others did not.
        sizes.record(9_000);
        assert_eq!(sizes.rest(0), Some(9_000));
    }

    #[test]
    fn only_the_last_transactions_count() {
        let mut sizes = RecentSizes::default();
        sizes.record(100);
        for _ in 0..RECENT - 1 {
            sizes.record(5_000);
        }
        assert_eq!(sizes.rest(0), Some(100));
        // The small one falls out of the window.
        sizes.record(6_000);
        assert_eq!(sizes.rest(0), Some(5_000));
        // A transaction larger than 4 GiB counts as 4 GiB.
        for _ in 0..RECENT {
            sizes.record(usize::MAX);
        }
        assert_eq!(sizes.rest(1), Some(u32::MAX as usize - 1));
    }
}
