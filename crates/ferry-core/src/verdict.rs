//! The start-time verdict: may Ferry stream from this slot, or would that hide lost events?
//!
//! A slot alone cannot tell whether it is the slot Ferry used before. A slot that was dropped
//! (by hand, by a cleanup script, by a failover to a server without it) and is created again
//! starts at the server's current position: every event in between is gone, and the new slot
//! looks perfectly healthy. So at every session start Ferry compares the slot with what it
//! remembers outside the slot (the progress record, [`crate::progress_record`]) and [`decide`] says
//! what to do. It is a pure function of everything it needs, so every case is a table row in
//! the tests below; both delivery modes use it.
//!
//! # The cases
//!
//! | slot                       | remembered (this server)    | verdict                                  |
//! |----------------------------|-----------------------------|------------------------------------------|
//! | missing                    | nothing, nowhere            | first start: create the slot              |
//! | missing                    | a record                    | **lost**: the slot was dropped or is on another server |
//! | present, ≤ record          | a record                    | stream (the slot may lag: duplicates)     |
//! | present, > record          | a record                    | **ahead**: something advanced the slot    |
//! | invalidated                | anything                    | **invalidated**: its WAL is gone          |
//! | any                        | only under other systems    | **server changed** (restore, pg_upgrade, not a physical standby) |
//! | present, ≤ record, other timeline | a record             | stream, saying so (a promoted standby)    |
//! | present                    | nothing, nowhere            | at-least-once: stream with a warning (upgrade from a Ferry without progress records); exactly-once: **progress missing** |
//!
//! Every bold case is a [`Gap`]: a permanent error that says what happened, the remembered
//! position, how many bytes of WAL the gap spans where known, and the operator's action. The
//! action names the remembered position (`ferry run --accept-gap <LSN>`), so a flag left in a
//! deployment accepts that one gap and never a later one. Exactly-once's "progress missing" is
//! accepted with `--initialize-progress` instead: it is not a gap Ferry saw, but a position it
//! cannot vouch for.
//!
//! After every verdict that streams without a record to trust (first start, upgrade, an
//! accepted gap) the caller writes a fresh record at the slot's position before streaming, so
//! the next start has something to compare with.

use std::fmt;

use ferry_pgtypes::Lsn;

use crate::progress_record::{Mode, ProgressRecord};

/// The slot as the server shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotSeen {
    Missing,
    Present {
        confirmed_flush_lsn: Lsn,
    },
    /// `wal_status = lost`: the WAL it needs is gone.
    Invalidated {
        confirmed_flush_lsn: Lsn,
    },
}

/// The server Ferry is connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Server {
    pub system_id: u64,
    pub timeline: u32,
    /// `pg_current_wal_lsn()` (`None` where unknown, e.g. on a standby).
    pub current_wal_lsn: Option<Lsn>,
}

/// What the progress topic holds for this slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Remembered {
    /// The newest record under this server's system identifier.
    pub this_system: Option<ProgressRecord>,
    /// The newest record under each other system identifier.
    pub other_systems: Vec<(u64, ProgressRecord)>,
}

/// How much earlier than the bound a record keeps a replay starts: concurrent transactions
/// take their commit timestamps before they write their commit records, so one committed
/// just after the recorded position may carry a slightly earlier time. Duplicates cost
/// nothing (consumers deduplicate on the id header), a missed event everything.
pub const REPLAY_MARGIN_MILLIS: i64 = 10_000;

impl Remembered {
    /// The record that names the remembered position: this server's, else the newest of the
    /// other servers'.
    fn naming(&self) -> Option<&ProgressRecord> {
        self.this_system.as_ref().or_else(|| {
            self.other_systems
                .iter()
                .map(|(_, r)| r)
                .max_by_key(|r| r.written_unix_millis)
        })
    }

    /// From when to replay (Unix milliseconds) when events after the remembered position may
    /// be missing: the record's bound on what committed after its position, less
    /// [`REPLAY_MARGIN_MILLIS`]; for a record of an older Ferry, which has none, when it was
    /// written, which can be later than events still in flight then ([`Refusal`] says so).
    pub fn replay_since(&self) -> Option<ReplaySince> {
        let r = self.naming()?;
        Some(match r.since_unix_millis {
            Some(t) => ReplaySince::Bound(t - REPLAY_MARGIN_MILLIS),
            None => ReplaySince::Written(r.written_unix_millis),
        })
    }
}

/// From when to replay the events of a gap ([`Remembered::replay_since`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplaySince {
    /// Every event after the position committed at or after this time (Unix milliseconds).
    Bound(i64),
    /// Only when the record was written is known (a record of an older Ferry).
    Written(i64),
}

/// What the operator accepted for this start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Acceptance {
    /// `--accept-gap <LSN>`: a gap whose remembered position is this LSN.
    pub gap_from: Option<Lsn>,
    /// `--initialize-progress`: exactly-once may start from a used slot without a record.
    pub initialize_progress: bool,
}

/// Everything [`decide`] looks at.
#[derive(Debug, Clone)]
pub struct StartInput<'a> {
    pub slot_name: &'a str,
    pub slot: SlotSeen,
    pub server: Server,
    pub remembered: &'a Remembered,
    pub mode: Mode,
    pub acceptance: Acceptance,
}

/// Events may be missing between the remembered position and where the slot would resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gap {
    /// A progress record, and no slot.
    SlotLost {
        remembered: Lsn,
        current_wal_lsn: Option<Lsn>,
    },
    /// The slot is past the record: something other than Ferry confirmed or advanced it (or
    /// dropped it and created it again).
    SlotAhead { remembered: Lsn, confirmed: Lsn },
    /// The slot was invalidated.
    SlotInvalidated {
        remembered: Option<Lsn>,
        confirmed: Lsn,
        current_wal_lsn: Option<Lsn>,
    },
    /// Records exist only under another server's system identifier.
    ServerChanged {
        remembered_system: u64,
        remembered: Lsn,
        system: u64,
    },
    /// Exactly-once, a slot that exists, and no record anywhere.
    ProgressMissing { confirmed: Lsn },
}

/// Why a start streams while something is unusual, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The server's timeline differs from the record's: a standby was promoted (INFO).
    TimelineChanged { from: u32, to: u32 },
    /// A used slot without any record: a Ferry without progress records ran it (WARN).
    NoRecord { confirmed: Lsn },
}

/// What to do at this start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Stream from the slot. `fresh_record`: write a record at the slot's position first.
    Stream {
        notice: Option<Notice>,
        fresh_record: bool,
    },
    /// First start: create the slot, write a record at its position, stream.
    CreateSlot,
    /// A gap the operator accepted (log it at WARN): create the slot if `create_slot`, write a
    /// fresh record at its position, stream.
    Accepted { gap: Gap, create_slot: bool },
    /// Stop with a permanent error. `offered`: an `--accept-gap` LSN that is not this gap's.
    Refuse { gap: Gap, offered: Option<Lsn> },
}

/// The verdict; see the [module documentation](self).
pub fn decide(input: &StartInput<'_>) -> Verdict {
    let server = input.server;
    let remembered = input.remembered;
    let record = remembered.this_system.as_ref();
    let gap = match (input.slot, record) {
        (
            SlotSeen::Invalidated {
                confirmed_flush_lsn,
            },
            _,
        ) => Gap::SlotInvalidated {
            remembered: record.map(|r| r.end_lsn),
            confirmed: confirmed_flush_lsn,
            current_wal_lsn: server.current_wal_lsn,
        },
        (_, None) if !remembered.other_systems.is_empty() => {
            // The newest of the other servers' records names what was remembered.
            let (system, r) = remembered
                .other_systems
                .iter()
                .max_by_key(|(_, r)| r.written_unix_millis)
                .expect("not empty");
            Gap::ServerChanged {
                remembered_system: *system,
                remembered: r.end_lsn,
                system: server.system_id,
            }
        }
        (SlotSeen::Missing, None) => return Verdict::CreateSlot,
        (
            SlotSeen::Present {
                confirmed_flush_lsn,
            },
            None,
        ) => match input.mode {
            Mode::AtLeastOnce => {
                return Verdict::Stream {
                    notice: Some(Notice::NoRecord {
                        confirmed: confirmed_flush_lsn,
                    }),
                    fresh_record: true,
                }
            }
            Mode::ExactlyOnce if input.acceptance.initialize_progress => {
                return Verdict::Stream {
                    notice: Some(Notice::NoRecord {
                        confirmed: confirmed_flush_lsn,
                    }),
                    fresh_record: true,
                }
            }
            Mode::ExactlyOnce => {
                return Verdict::Refuse {
                    gap: Gap::ProgressMissing {
                        confirmed: confirmed_flush_lsn,
                    },
                    offered: None,
                }
            }
        },
        (SlotSeen::Missing, Some(r)) => Gap::SlotLost {
            remembered: r.end_lsn,
            current_wal_lsn: server.current_wal_lsn,
        },
        (
            SlotSeen::Present {
                confirmed_flush_lsn,
            },
            Some(r),
        ) => {
            if confirmed_flush_lsn > r.end_lsn {
                Gap::SlotAhead {
                    remembered: r.end_lsn,
                    confirmed: confirmed_flush_lsn,
                }
            } else {
                let notice = (r.timeline != server.timeline).then_some(Notice::TimelineChanged {
                    from: r.timeline,
                    to: server.timeline,
                });
                return Verdict::Stream {
                    notice,
                    fresh_record: false,
                };
            }
        }
    };
    match input.acceptance.gap_from {
        Some(lsn)
            if Some(lsn) == gap.accept_with() && !matches!(gap, Gap::SlotInvalidated { .. }) =>
        {
            Verdict::Accepted {
                create_slot: input.slot == SlotSeen::Missing,
                gap,
            }
        }
        offered => Verdict::Refuse { gap, offered },
    }
}

impl Gap {
    /// The LSN `--accept-gap` must name for this gap (the remembered position), if it can be
    /// accepted that way.
    pub fn accept_with(&self) -> Option<Lsn> {
        match self {
            Gap::SlotLost { remembered, .. }
            | Gap::SlotAhead { remembered, .. }
            | Gap::ServerChanged { remembered, .. } => Some(*remembered),
            Gap::SlotInvalidated { remembered, .. } => *remembered,
            Gap::ProgressMissing { .. } => None,
        }
    }

    /// Bytes of WAL between the remembered position and where streaming would resume, where
    /// known. For a lost or invalidated slot it is up to the server's current position: the
    /// most that can be missing.
    pub fn bytes(&self) -> Option<u64> {
        match self {
            Gap::SlotLost {
                remembered,
                current_wal_lsn,
            } => current_wal_lsn.map(|c| c.saturating_sub(*remembered)),
            Gap::SlotAhead {
                remembered,
                confirmed,
            } => Some(confirmed.saturating_sub(*remembered)),
            Gap::SlotInvalidated {
                remembered,
                confirmed,
                current_wal_lsn,
            } => current_wal_lsn.map(|c| c.saturating_sub(remembered.unwrap_or(*confirmed))),
            Gap::ServerChanged { .. } | Gap::ProgressMissing { .. } => None,
        }
    }

    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Gap::SlotLost { .. } => "slot_lost",
            Gap::SlotAhead { .. } => "slot_ahead",
            Gap::SlotInvalidated { .. } => "slot_invalidated",
            Gap::ServerChanged { .. } => "server_changed",
            Gap::ProgressMissing { .. } => "progress_missing",
        }
    }
}

/// `N bytes of WAL` or the reason it is unknown.
struct Span(Option<u64>);

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(b) => write!(f, "{b} bytes of WAL"),
            None => f.write_str("an unknown amount of WAL"),
        }
    }
}

impl fmt::Display for Gap {
    /// What happened and what it means; [`Refusal`] adds what to do.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let span = Span(self.bytes());
        match self {
            Gap::SlotLost { remembered, .. } => write!(
                f,
                "the replication slot is gone, but Ferry had streamed it up to {remembered} (its progress record says so): \
                 it was dropped, or this is a server that never had it (a failover to a server without the slot). \
                 Events committed after {remembered} and before a new slot would start may be lost: up to {span} \
                 (from {remembered} to the server's current position)"
            ),
            Gap::SlotAhead {
                remembered,
                confirmed,
            } => write!(
                f,
                "the replication slot is at {confirmed}, ahead of where Ferry left it ({remembered}, its progress record): \
                 something other than Ferry advanced it (pg_replication_slot_advance, another consumer, or the slot was \
                 dropped and created again). Events between {remembered} and {confirmed} ({span}) were never relayed"
            ),
            Gap::SlotInvalidated {
                remembered,
                confirmed,
                ..
            } => {
                let from = remembered.unwrap_or(*confirmed);
                write!(
                    f,
                    "the replication slot was invalidated (wal_status = lost): the WAL it needed was removed, \
                     so events after {from} are gone from the WAL (up to {span})"
                )
            }
            Gap::ServerChanged {
                remembered_system,
                remembered,
                system,
            } => write!(
                f,
                "Ferry streamed this slot on another server (system identifier {remembered_system}, up to {remembered}); \
                 this server's system identifier is {system}. A restored backup, a pg_upgrade or a cluster that is not a \
                 physical standby of the old one has its own WAL: where the old server's events stopped cannot be known here"
            ),
            Gap::ProgressMissing { confirmed } => write!(
                f,
                "exactly-once mode found the replication slot at {confirmed}, already used, but no progress record: \
                 Ferry cannot know which events before the slot's position are already in Kafka"
            ),
        }
    }
}

/// A refused start as the operator reads it: what happened, then the documented action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub slot: String,
    pub gap: Gap,
    pub offered: Option<Lsn>,
    /// The `--since` of the `ferry replay` that sends the gap's events again
    /// ([`Remembered::replay_since`]).
    pub replay_since: Option<ReplaySince>,
}

impl Refusal {
    /// What the operator does about it (the documented action).
    pub fn action(&self) -> String {
        match &self.gap {
            Gap::ProgressMissing { .. } => "To start from the slot's position, accepting that events before it may be \
                 missing or duplicated, run once with `ferry run --initialize-progress` (see README, \"When Ferry says \
                 events may be lost\")"
                .to_string(),
            Gap::SlotInvalidated { remembered, .. } => format!(
                "1. Drop the slot (SELECT pg_drop_replication_slot('{}')) and {}; raise max_slot_wal_keep_size so it \
                 does not happen again. 2. {}",
                self.slot.replace('\'', "''"),
                match remembered {
                    Some(lsn) => format!("run once with `ferry run --accept-gap {lsn}` to continue from a new slot"),
                    None => "start Ferry again: it creates a new slot".to_string(),
                },
                self.replay()
            ),
            gap => format!(
                "1. Continue, accepting the gap: run once with `ferry run --accept-gap {}` (it accepts this gap only, \
                 is logged, and writes a new progress record). 2. {}",
                gap.accept_with().expect("every other gap names its position"),
                self.replay()
            ),
        }
    }

    /// Step 2 of the action: send again what the outbox table still holds of the gap.
    fn replay(&self) -> String {
        let time =
            |t: i64| ferry_router::cloudevents::rfc3339_millis(t).unwrap_or_else(|| t.to_string());
        let command = match self.replay_since {
            Some(ReplaySince::Bound(t)) => format!(
                "`ferry replay --since {}` (every event after the remembered position committed after it)",
                time(t)
            ),
            Some(ReplaySince::Written(t)) => format!(
                "`ferry replay --since {}` (when the position was recorded, by a Ferry that did not keep the \
                 commit time: give it a margin as long as Ferry's replication lag then)",
                time(t)
            ),
            None => "`ferry replay --since <the time of the last event known to be in Kafka>`".to_string(),
        };
        format!(
            "Then send again the events the outbox table still holds from the gap, with their original ids \
             (consumers deduplicate on the id header): {command}. See README, \"When Ferry says events may be lost\""
        )
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "slot {:?}: events may be lost: {}. ",
            self.slot, self.gap
        )?;
        if let (Some(offered), Some(want)) = (self.offered, self.gap.accept_with()) {
            write!(
                f,
                "(--accept-gap {offered} was given, but this gap starts at {want}: it accepts only the gap it names.) "
            )?;
        }
        f.write_str(&self.action())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SYSTEM: u64 = 7_000_000_000_000_000_001;
    const OTHER: u64 = 7_000_000_000_000_000_002;

    fn rec(end: u64, timeline: u32) -> ProgressRecord {
        ProgressRecord::whole(Mode::AtLeastOnce, timeline, Lsn(end), 1_000)
    }

    fn server(timeline: u32) -> Server {
        Server {
            system_id: SYSTEM,
            timeline,
            current_wal_lsn: Some(Lsn(0x9000)),
        }
    }

    fn decide_with(
        slot: SlotSeen,
        remembered: &Remembered,
        mode: Mode,
        acceptance: Acceptance,
    ) -> Verdict {
        decide(&StartInput {
            slot_name: "ferry",
            slot,
            server: server(2),
            remembered,
            mode,
            acceptance,
        })
    }

    /// Every combination of slot state, record, other systems, mode and acceptance, against
    /// the table in the module documentation.
    #[test]
    fn every_case_of_the_table() {
        let missing = SlotSeen::Missing;
        let at = |l: u64| SlotSeen::Present {
            confirmed_flush_lsn: Lsn(l),
        };
        let invalidated = SlotSeen::Invalidated {
            confirmed_flush_lsn: Lsn(0x100),
        };
        let none = Remembered::default();
        let mine = |end: u64, tl: u32| Remembered {
            this_system: Some(rec(end, tl)),
            other_systems: vec![],
        };
        let theirs = Remembered {
            this_system: None,
            other_systems: vec![(OTHER, rec(0x500, 1))],
        };
        let both = Remembered {
            this_system: Some(rec(0x500, 2)),
            other_systems: vec![(OTHER, rec(0x700, 1))],
        };
        let no = Acceptance::default();
        let gap_at = |l: u64| Acceptance {
            gap_from: Some(Lsn(l)),
            initialize_progress: false,
        };
        let init = Acceptance {
            gap_from: None,
            initialize_progress: true,
        };
        use Mode::*;
        let (mine_2, mine_1) = (mine(0x500, 2), mine(0x500, 1));
        let cases: Vec<(&str, SlotSeen, &Remembered, Mode, Acceptance, Verdict)> = vec![
            (
                "first start",
                missing,
                &none,
                AtLeastOnce,
                no,
                Verdict::CreateSlot,
            ),
            (
                "first start, exactly-once",
                missing,
                &none,
                ExactlyOnce,
                no,
                Verdict::CreateSlot,
            ),
            (
                "lost",
                missing,
                &mine_2,
                AtLeastOnce,
                no,
                Verdict::Refuse {
                    gap: Gap::SlotLost {
                        remembered: Lsn(0x500),
                        current_wal_lsn: Some(Lsn(0x9000)),
                    },
                    offered: None,
                },
            ),
            (
                "lost, accepted",
                missing,
                &mine_2,
                ExactlyOnce,
                gap_at(0x500),
                Verdict::Accepted {
                    gap: Gap::SlotLost {
                        remembered: Lsn(0x500),
                        current_wal_lsn: Some(Lsn(0x9000)),
                    },
                    create_slot: true,
                },
            ),
            (
                "lost, another gap accepted",
                missing,
                &mine_2,
                AtLeastOnce,
                gap_at(0x400),
                Verdict::Refuse {
                    gap: Gap::SlotLost {
                        remembered: Lsn(0x500),
                        current_wal_lsn: Some(Lsn(0x9000)),
                    },
                    offered: Some(Lsn(0x400)),
                },
            ),
            (
                "lost, initialize-progress is no acceptance of a gap",
                missing,
                &mine_2,
                ExactlyOnce,
                init,
                Verdict::Refuse {
                    gap: Gap::SlotLost {
                        remembered: Lsn(0x500),
                        current_wal_lsn: Some(Lsn(0x9000)),
                    },
                    offered: None,
                },
            ),
            (
                "slot at the record",
                at(0x500),
                &mine_2,
                AtLeastOnce,
                no,
                Verdict::Stream {
                    notice: None,
                    fresh_record: false,
                },
            ),
            (
                "slot behind the record",
                at(0x400),
                &mine_2,
                ExactlyOnce,
                no,
                Verdict::Stream {
                    notice: None,
                    fresh_record: false,
                },
            ),
            (
                "an acceptance without a gap changes nothing",
                at(0x400),
                &mine_2,
                AtLeastOnce,
                gap_at(0x500),
                Verdict::Stream {
                    notice: None,
                    fresh_record: false,
                },
            ),
            (
                "slot ahead",
                at(0x501),
                &mine_2,
                AtLeastOnce,
                no,
                Verdict::Refuse {
                    gap: Gap::SlotAhead {
                        remembered: Lsn(0x500),
                        confirmed: Lsn(0x501),
                    },
                    offered: None,
                },
            ),
            (
                "slot ahead, accepted",
                at(0x600),
                &mine_2,
                AtLeastOnce,
                gap_at(0x500),
                Verdict::Accepted {
                    gap: Gap::SlotAhead {
                        remembered: Lsn(0x500),
                        confirmed: Lsn(0x600),
                    },
                    create_slot: false,
                },
            ),
            (
                "invalidated, with a record",
                invalidated,
                &mine_2,
                AtLeastOnce,
                gap_at(0x500),
                Verdict::Refuse {
                    gap: Gap::SlotInvalidated {
                        remembered: Some(Lsn(0x500)),
                        confirmed: Lsn(0x100),
                        current_wal_lsn: Some(Lsn(0x9000)),
                    },
                    offered: Some(Lsn(0x500)),
                },
            ),
            (
                "invalidated, no record",
                invalidated,
                &none,
                AtLeastOnce,
                no,
                Verdict::Refuse {
                    gap: Gap::SlotInvalidated {
                        remembered: None,
                        confirmed: Lsn(0x100),
                        current_wal_lsn: Some(Lsn(0x9000)),
                    },
                    offered: None,
                },
            ),
            (
                "server changed, slot missing",
                missing,
                &theirs,
                AtLeastOnce,
                no,
                Verdict::Refuse {
                    gap: Gap::ServerChanged {
                        remembered_system: OTHER,
                        remembered: Lsn(0x500),
                        system: SYSTEM,
                    },
                    offered: None,
                },
            ),
            (
                "server changed, slot present",
                at(0x100),
                &theirs,
                ExactlyOnce,
                no,
                Verdict::Refuse {
                    gap: Gap::ServerChanged {
                        remembered_system: OTHER,
                        remembered: Lsn(0x500),
                        system: SYSTEM,
                    },
                    offered: None,
                },
            ),
            (
                "server changed, accepted",
                at(0x100),
                &theirs,
                AtLeastOnce,
                gap_at(0x500),
                Verdict::Accepted {
                    gap: Gap::ServerChanged {
                        remembered_system: OTHER,
                        remembered: Lsn(0x500),
                        system: SYSTEM,
                    },
                    create_slot: false,
                },
            ),
            (
                "this server's record wins over another's",
                at(0x500),
                &both,
                AtLeastOnce,
                no,
                Verdict::Stream {
                    notice: None,
                    fresh_record: false,
                },
            ),
            (
                "timeline changed (a promoted standby)",
                at(0x480),
                &mine_1,
                AtLeastOnce,
                no,
                Verdict::Stream {
                    notice: Some(Notice::TimelineChanged { from: 1, to: 2 }),
                    fresh_record: false,
                },
            ),
            (
                "timeline changed and the slot ahead is still a gap",
                at(0x600),
                &mine_1,
                AtLeastOnce,
                no,
                Verdict::Refuse {
                    gap: Gap::SlotAhead {
                        remembered: Lsn(0x500),
                        confirmed: Lsn(0x600),
                    },
                    offered: None,
                },
            ),
            (
                "upgrade: a used slot without a record",
                at(0x300),
                &none,
                AtLeastOnce,
                no,
                Verdict::Stream {
                    notice: Some(Notice::NoRecord {
                        confirmed: Lsn(0x300),
                    }),
                    fresh_record: true,
                },
            ),
            (
                "exactly-once, a used slot without a record",
                at(0x300),
                &none,
                ExactlyOnce,
                gap_at(0x300),
                Verdict::Refuse {
                    gap: Gap::ProgressMissing {
                        confirmed: Lsn(0x300),
                    },
                    offered: None,
                },
            ),
            (
                "exactly-once, initialized",
                at(0x300),
                &none,
                ExactlyOnce,
                init,
                Verdict::Stream {
                    notice: Some(Notice::NoRecord {
                        confirmed: Lsn(0x300),
                    }),
                    fresh_record: true,
                },
            ),
        ];
        for (name, slot, remembered, mode, acceptance, want) in cases {
            assert_eq!(
                decide_with(slot, remembered, mode, acceptance),
                want,
                "{name}"
            );
        }
    }

    /// Exhaustive over a small domain: the slot is never streamed past a record without an
    /// acceptance naming that record, and a slot is only created when nothing is remembered
    /// anywhere (or a lost one was accepted).
    #[test]
    fn no_verdict_hides_a_gap() {
        let slots = [
            SlotSeen::Missing,
            SlotSeen::Present {
                confirmed_flush_lsn: Lsn(0x400),
            },
            SlotSeen::Present {
                confirmed_flush_lsn: Lsn(0x500),
            },
            SlotSeen::Present {
                confirmed_flush_lsn: Lsn(0x600),
            },
            SlotSeen::Invalidated {
                confirmed_flush_lsn: Lsn(0x400),
            },
        ];
        let rememberings = [
            Remembered::default(),
            Remembered {
                this_system: Some(rec(0x500, 1)),
                other_systems: vec![],
            },
            Remembered {
                this_system: Some(rec(0x500, 2)),
                other_systems: vec![],
            },
            Remembered {
                this_system: None,
                other_systems: vec![(OTHER, rec(0x500, 1))],
            },
            Remembered {
                this_system: Some(rec(0x500, 2)),
                other_systems: vec![(OTHER, rec(0x900, 1))],
            },
        ];
        let acceptances = [None, Some(Lsn(0x400)), Some(Lsn(0x500)), Some(Lsn(0x600))];
        for slot in slots {
            for r in &rememberings {
                for mode in [Mode::AtLeastOnce, Mode::ExactlyOnce] {
                    for gap_from in acceptances {
                        for initialize_progress in [false, true] {
                            let acc = Acceptance {
                                gap_from,
                                initialize_progress,
                            };
                            let v = decide_with(slot, r, mode, acc);
                            let record = r.this_system.as_ref().map(|r| r.end_lsn);
                            let ctx = format!("{slot:?} {r:?} {mode:?} {acc:?} -> {v:?}");
                            match &v {
                                Verdict::CreateSlot => {
                                    assert_eq!(slot, SlotSeen::Missing, "{ctx}");
                                    assert!(
                                        r.this_system.is_none() && r.other_systems.is_empty(),
                                        "{ctx}"
                                    );
                                }
                                Verdict::Stream { .. } => match (slot, record) {
                                    (
                                        SlotSeen::Present {
                                            confirmed_flush_lsn,
                                        },
                                        Some(end),
                                    ) => {
                                        assert!(confirmed_flush_lsn <= end, "{ctx}")
                                    }
                                    (SlotSeen::Present { .. }, None) => {
                                        assert!(r.other_systems.is_empty(), "{ctx}");
                                        assert!(
                                            mode == Mode::AtLeastOnce || initialize_progress,
                                            "{ctx}"
                                        );
                                    }
                                    _ => panic!("streams without a usable slot: {ctx}"),
                                },
                                Verdict::Accepted { gap, .. } => {
                                    assert_eq!(gap.accept_with(), gap_from, "{ctx}");
                                    assert!(!matches!(slot, SlotSeen::Invalidated { .. }), "{ctx}");
                                }
                                Verdict::Refuse { gap, .. } => {
                                    let shown = Refusal {
                                        slot: "ferry".into(),
                                        gap: gap.clone(),
                                        offered: None,
                                        replay_since: r.replay_since(),
                                    }
                                    .to_string();
                                    assert!(shown.contains("README"), "{shown}");
                                    assert!(
                                        shown.contains("--accept-gap")
                                            || shown.contains("--initialize-progress")
                                            || shown.contains("creates a new slot"),
                                        "{shown}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_refusal_says_what_happened_the_gap_and_the_action() {
        let r = Refusal {
            slot: "ferry".into(),
            gap: Gap::SlotLost {
                remembered: Lsn(0x1_0000_0500),
                current_wal_lsn: Some(Lsn(0x1_0000_1500)),
            },
            offered: None,
            replay_since: Some(ReplaySince::Bound(1_795_000_000_123)),
        };
        let s = r.to_string();
        // The procedure: accept the gap, then replay from when the position was recorded.
        assert!(s.contains("`ferry replay --since 2026-11-18T"), "{s}");
        assert!(
            s.find("--accept-gap") < s.find("ferry replay"),
            "accept first, then replay: {s}"
        );
        assert!(s.contains("slot \"ferry\""), "{s}");
        assert!(s.contains("1/500"), "{s}");
        assert!(s.contains("4096 bytes of WAL"), "{s}");
        assert!(s.contains("`ferry run --accept-gap 1/500`"), "{s}");
        let ahead = Refusal {
            offered: Some(Lsn(0x10)),
            gap: Gap::SlotAhead {
                remembered: Lsn(0x100),
                confirmed: Lsn(0x180),
            },
            ..r.clone()
        }
        .to_string();
        assert!(ahead.contains("128 bytes of WAL"), "{ahead}");
        assert!(
            ahead.contains("--accept-gap 0/10 was given, but this gap starts at 0/100"),
            "{ahead}"
        );
        let changed = Refusal {
            gap: Gap::ServerChanged {
                remembered_system: OTHER,
                remembered: Lsn(0x100),
                system: SYSTEM,
            },
            ..r
        }
        .to_string();
        assert!(
            changed.contains(&OTHER.to_string()) && changed.contains(&SYSTEM.to_string()),
            "{changed}"
        );
    }
}
