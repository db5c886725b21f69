//! The one-shot pass for a poison event: `ferry run --skip-event <POSITION>` and
//! `ferry run --dead-letter-event <POSITION>`.
//!
//! A row the router rejects under `route.on_error = "fail"` stops Ferry, and nothing past its
//! transaction is confirmed. The row is already committed: Ferry reads the WAL, not the table,
//! so changing the row in the table changes nothing, and every restart meets the same event.
//! The operator's way past *this one* event, without changing the policy for every later row, is
//! a flag naming its position, as `--accept-gap` names the gap it accepts.
//!
//! # The position
//!
//! `<commit LSN>:<n>`: the transaction's commit LSN (pgoutput's Begin `final_lsn`) and the
//! event's place among the transaction's outbox events (rows and messages, in WAL order,
//! counting from 1), the same count a progress record's `partial` keeps. A row's own LSN would
//! not do: the rows of one `COPY` into the outbox share one WAL record, so one LSN. The stop
//! error prints the position, and the command to copy.
//!
//! # The rules
//!
//! - The pass acts only on the event it names, and only if that event would stop Ferry (the
//!   router rejected it and the policy is to stop). A named event that routes, or that the
//!   policy already skips or dead-letters, is handled as usual, and the pass is dropped with a
//!   WARN: a flag can never drop an event that Ferry could deliver.
//! - Any other event that stops Ferry stops it as before, and the error says which position the
//!   flag named (the flag passes one event; a second poison row still stops Ferry).
//! - The pass holds, across reconnects, until the slot is confirmed past the named transaction
//!   (a transaction replayed after a reconnect meets the same decision). Then it is used up.
//! - A position the stream passes without meeting it (its transaction has fewer events, or no
//!   transaction commits there) drops the pass with a WARN: nothing was skipped. A position the
//!   slot has already passed at a start (a flag left in a deployment, or a typo) is ignored with
//!   a WARN: Ferry starts normally.

use std::fmt;
use std::str::FromStr;

use ferry_pgtypes::Lsn;

use crate::progress_record::ProgressRecord;

/// An outbox event's position: its transaction's commit LSN and its place (from 1) among the
/// transaction's outbox events. Written `16/B374D848:3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventPosition {
    pub commit_lsn: Lsn,
    /// 1 for the transaction's first outbox event.
    pub event: u64,
}

impl fmt::Display for EventPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.commit_lsn, self.event)
    }
}

/// A position that does not parse, with what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{input:?} is not an event position: expected <commit LSN>:<n>, e.g. 16/B374D848:1 (the \
     transaction's commit LSN, and the event's place in it counting from 1), as the error that \
     stopped Ferry prints it"
)]
pub struct ParsePositionError {
    input: String,
}

impl FromStr for EventPosition {
    type Err = ParsePositionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParsePositionError {
            input: s.to_owned(),
        };
        let (lsn, event) = s.rsplit_once(':').ok_or_else(err)?;
        let commit_lsn: Lsn = lsn.parse().map_err(|_| err())?;
        if event.is_empty() || !event.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let event: u64 = event.parse().map_err(|_| err())?;
        if event == 0 {
            return Err(err());
        }
        Ok(EventPosition { commit_lsn, event })
    }
}

/// What the pass does with the event it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassAction {
    /// Leave it out (counted as skipped).
    Skip,
    /// Produce its dead-letter rendering to `route.dead_letter_topic` (counted as dead-lettered).
    DeadLetter,
}

impl PassAction {
    /// The `ferry run` flag that asks for it.
    pub fn flag(self) -> &'static str {
        match self {
            PassAction::Skip => "--skip-event",
            PassAction::DeadLetter => "--dead-letter-event",
        }
    }
}

/// A one-shot pass, and whether its event was met; see the [module documentation](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    pub at: EventPosition,
    pub action: PassAction,
    /// The named event was met and the action applied (a replay applies it again).
    pub met: bool,
}

impl fmt::Display for Pass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.action.flag(), self.at)
    }
}

/// What the pass says about an event the router just handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meeting {
    /// Not the named event: as usual.
    Other,
    /// The named event, which would stop Ferry: apply the action.
    Apply(PassAction),
    /// The named event, which does not stop Ferry (it routes, or the policy handles it): as
    /// usual, and the pass is dropped.
    NotStopping,
}

/// How the stream moved, for [`Pass::after`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moved {
    /// A transaction with this commit LSN began.
    Begin(Lsn),
    /// The transaction with this commit LSN committed.
    Commit(Lsn),
    /// Idle: the server's WAL end, with no transaction open.
    Idle(Lsn),
    /// The slot is confirmed to this LSN.
    Confirmed(Lsn),
}

/// What becomes of the pass after the stream moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Still armed.
    Armed,
    /// The stream passed the position without meeting the event: nothing was done (WARN).
    Unmet,
    /// The event was met and its transaction is confirmed: the pass is used up.
    Used,
}

impl Pass {
    pub fn new(at: EventPosition, action: PassAction) -> Self {
        Pass {
            at,
            action,
            met: false,
        }
    }

    /// At a session's start from `resume` (the slot's position) and, in exactly-once mode, the
    /// `remembered` progress record: whether the named event can still be met. A position
    /// behind both is never streamed again.
    pub fn behind(&self, resume: Lsn, remembered: Option<&ProgressRecord>) -> bool {
        // The server replays every transaction whose commit record starts at or after `resume`.
        self.at.commit_lsn < resume
            || remembered.is_some_and(|r| r.covers(self.at.commit_lsn, self.at.event - 1))
    }

    /// The event at `at` was routed; `stopping`: the outcome would stop Ferry.
    pub fn meet(&mut self, at: EventPosition, stopping: bool) -> Meeting {
        if at != self.at {
            return Meeting::Other;
        }
        if stopping {
            self.met = true;
            Meeting::Apply(self.action)
        } else {
            Meeting::NotStopping
        }
    }

    /// After the stream moved: still armed, passed unmet, or used up.
    pub fn after(&self, moved: Moved) -> Fate {
        let at = self.at.commit_lsn;
        match moved {
            Moved::Confirmed(lsn) if lsn > at => {
                if self.met {
                    Fate::Used
                } else {
                    Fate::Unmet
                }
            }
            _ if self.met => Fate::Armed,
            Moved::Begin(commit) | Moved::Idle(commit) if commit > at => Fate::Unmet,
            // The named transaction ended with fewer events than the position names.
            Moved::Commit(commit) if commit >= at => Fate::Unmet,
            _ => Fate::Armed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress_record::{Mode, Partial};

    fn pos(lsn: u64, event: u64) -> EventPosition {
        EventPosition {
            commit_lsn: Lsn(lsn),
            event,
        }
    }

    #[test]
    fn a_position_prints_and_parses_as_the_error_shows_it() {
        let p = pos(0x16_B374_D848, 3);
        assert_eq!(p.to_string(), "16/B374D848:3");
        assert_eq!("16/B374D848:3".parse::<EventPosition>(), Ok(p));
        assert_eq!("0/1:1".parse::<EventPosition>(), Ok(pos(1, 1)));
        for bad in [
            "",
            "16/B374D848",
            "16/B374D848:",
            "16/B374D848:0",
            ":1",
            "16/B374D848:-1",
            "16/B374D848:+1",
            "16/B374D848:1:1",
            "16B374D848:1",
            "16/B374D848: 1",
            "x/1:1",
        ] {
            let e = bad.parse::<EventPosition>().unwrap_err().to_string();
            assert!(e.contains("expected <commit LSN>:<n>"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn only_the_named_event_that_would_stop_ferry_is_passed() {
        let mut p = Pass::new(pos(100, 2), PassAction::Skip);
        assert_eq!(p.meet(pos(100, 1), true), Meeting::Other);
        assert_eq!(p.meet(pos(200, 2), true), Meeting::Other);
        assert!(!p.met);
        assert_eq!(p.meet(pos(100, 2), true), Meeting::Apply(PassAction::Skip));
        assert!(p.met);
        // A replay of the transaction meets the same decision.
        assert_eq!(p.meet(pos(100, 2), true), Meeting::Apply(PassAction::Skip));

        let mut routes = Pass::new(pos(100, 2), PassAction::DeadLetter);
        assert_eq!(routes.meet(pos(100, 2), false), Meeting::NotStopping);
        assert!(!routes.met);
    }

    #[test]
    fn a_met_pass_is_used_up_once_its_transaction_is_confirmed() {
        let mut p = Pass::new(pos(100, 1), PassAction::Skip);
        p.meet(pos(100, 1), true);
        assert_eq!(p.after(Moved::Commit(Lsn(100))), Fate::Armed);
        assert_eq!(p.after(Moved::Begin(Lsn(300))), Fate::Armed);
        assert_eq!(p.after(Moved::Confirmed(Lsn(100))), Fate::Armed);
        assert_eq!(p.after(Moved::Confirmed(Lsn(150))), Fate::Used);
    }

    #[test]
    fn a_position_the_stream_passes_without_meeting_it_is_unmet() {
        let p = Pass::new(pos(100, 3), PassAction::Skip);
        assert_eq!(p.after(Moved::Begin(Lsn(100))), Fate::Armed);
        assert_eq!(p.after(Moved::Begin(Lsn(50))), Fate::Armed);
        assert_eq!(p.after(Moved::Commit(Lsn(50))), Fate::Armed);
        assert_eq!(p.after(Moved::Idle(Lsn(100))), Fate::Armed);
        assert_eq!(p.after(Moved::Confirmed(Lsn(100))), Fate::Armed);
        // The named transaction ended with two events; no transaction commits at 100; ...
        assert_eq!(p.after(Moved::Commit(Lsn(100))), Fate::Unmet);
        assert_eq!(p.after(Moved::Begin(Lsn(101))), Fate::Unmet);
        assert_eq!(p.after(Moved::Idle(Lsn(101))), Fate::Unmet);
        assert_eq!(p.after(Moved::Confirmed(Lsn(101))), Fate::Unmet);
    }

    #[test]
    fn a_position_behind_the_slot_or_the_remembered_record_is_behind() {
        let p = Pass::new(pos(100, 2), PassAction::Skip);
        assert!(!p.behind(Lsn(100), None), "the server replays from 100");
        assert!(!p.behind(Lsn(50), None));
        assert!(p.behind(Lsn(101), None));
        let record = |end: u64, partial: Option<(u64, u64)>| ProgressRecord {
            format: crate::progress_record::FORMAT,
            mode: Mode::ExactlyOnce,
            timeline: 1,
            end_lsn: Lsn(end),
            partial: partial.map(|(c, e)| Partial {
                commit_lsn: Lsn(c),
                events: e,
            }),
            written_unix_millis: 0,
            since_unix_millis: None,
        };
        // Exactly-once: the slot may lag what Kafka holds.
        assert!(!p.behind(Lsn(50), Some(&record(90, Some((100, 1))))));
        assert!(p.behind(Lsn(50), Some(&record(90, Some((100, 2))))));
        assert!(p.behind(Lsn(50), Some(&record(150, None))));
    }
}
