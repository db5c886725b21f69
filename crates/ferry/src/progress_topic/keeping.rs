//! Whether the progress topic's configuration keeps what a start needs, and only that: judged
//! from its DescribeConfigs answer, with no I/O here.
//!
//! Ferry creates the topic compacted, with segments rolling every [`SEGMENT_MS`]. A topic made
//! another way (an administrator's, a broker's auto-creation with its defaults) can differ in two
//! ways that matter, and nothing else ever says so:
//!
//! - **Records deleted** (`cleanup.policy` includes `delete`, with a finite `retention.ms` or
//!   `retention.bytes`). Ferry writes a progress record only when its position moves, and Kafka's
//!   time retention deletes even the active segment of a topic nobody writes to. A Ferry
//!   stopped, or a server that writes no WAL, for longer than `retention.ms` finds no record at
//!   its next start; so does one whose record other slots' records pushed past
//!   `retention.bytes` on a topic they share (size retention never deletes the newest segment).
//!   A slot dropped meanwhile then looks like a first start, and the gap goes unnoticed in
//!   either mode; exactly-once mode refuses to start from a slot whose record is gone.
//! - **Records piling up** (no `compact`, or segments that roll rarely). A start reads the topic
//!   whole. Compaction keeps one record per slot, but never touches the active segment, which
//!   rolls every `segment.ms` (or `max.compaction.lag.ms`, if shorter): at Kafka's default of 7
//!   days, an at-least-once Ferry's ~5 records a second pile up to ~3 million, and every restart
//!   reads them all (~1.9 ms per 1,000 records).

use super::SEGMENT_MS;

/// Above this segment roll, the records a restart reads are worth a warning: an hour's worth
/// is ~18,000 records of an at-least-once Ferry, ~34 ms of a restart (100,000 records cost
/// ~190 ms, `ferry-bench --startup-fill`).
pub const SEGMENT_MS_WARN: i64 = 60 * 60 * 1000;

/// How many progress records Ferry writes, as the warnings say it.
const RATE: &str =
    "~5 a second while an at-least-once Ferry is busy, one per transaction in exactly-once mode";

/// The progress topic's settings that decide what it keeps (DescribeConfigs: the topic's own
/// values or the brokers' defaults); `None` where the answer did not say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keeping {
    /// `cleanup.policy`, as listed (`compact`, `delete`, `compact,delete`).
    pub cleanup_policy: Option<String>,
    pub retention_ms: Option<i64>,
    pub retention_bytes: Option<i64>,
    pub segment_ms: Option<i64>,
    /// `max.compaction.lag.ms`: a compacted topic's segments also roll this often.
    pub max_compaction_lag_ms: Option<i64>,
}

/// What is wrong with a [`Keeping`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flaw {
    /// Records older than `retention_ms`, or past `retention_bytes`, are deleted.
    Deletes {
        retention_ms: Option<i64>,
        retention_bytes: Option<i64>,
    },
    /// Not compacted: every record is kept until deleted, and a start reads them all.
    Uncompacted,
    /// Compacted, but the active segment (which compaction never touches) holds `roll_ms`'s
    /// records.
    LongSegments { roll_ms: i64 },
}

impl Keeping {
    /// From the answer's entries: `value(name)` is an entry's value, if the answer has it.
    pub fn from_entries<'a>(value: impl Fn(&str) -> Option<&'a str>) -> Keeping {
        let number = |name: &str| value(name).and_then(|v| v.trim().parse().ok());
        Keeping {
            cleanup_policy: value("cleanup.policy").map(str::to_string),
            retention_ms: number("retention.ms"),
            retention_bytes: number("retention.bytes"),
            segment_ms: number("segment.ms"),
            max_compaction_lag_ms: number("max.compaction.lag.ms"),
        }
    }

    /// Whether the answer said anything of the topic (a refused DescribeConfigs says nothing).
    pub fn is_said(&self) -> bool {
        self.cleanup_policy.is_some()
    }

    fn policy_has(&self, policy: &str) -> Option<bool> {
        let listed = self.cleanup_policy.as_deref()?;
        Some(listed.split(',').any(|p| p.trim() == policy))
    }

    /// How often the active segment rolls: `segment.ms`, or a compacted topic's
    /// `max.compaction.lag.ms` if shorter (Kafka's `LogConfig.maxSegmentMs`).
    fn roll_ms(&self) -> Option<i64> {
        let lag = self
            .max_compaction_lag_ms
            .filter(|lag| *lag > 0 && self.policy_has("compact") == Some(true));
        match (self.segment_ms, lag) {
            (Some(segment), Some(lag)) => Some(segment.min(lag)),
            (segment, _) => segment,
        }
    }

    /// What is wrong, in the order a reader should hear it; empty when the topic keeps every
    /// slot's newest record and little else (or when the answer did not say).
    pub fn flaws(&self) -> Vec<Flaw> {
        let mut flaws = Vec::new();
        let finite = |v: Option<i64>| v.filter(|v| *v >= 0);
        let (retention_ms, retention_bytes) =
            (finite(self.retention_ms), finite(self.retention_bytes));
        if self.policy_has("delete") == Some(true)
            && (retention_ms.is_some() || retention_bytes.is_some())
        {
            flaws.push(Flaw::Deletes {
                retention_ms,
                retention_bytes,
            });
        }
        match self.policy_has("compact") {
            Some(false) => flaws.push(Flaw::Uncompacted),
            Some(true) => {
                if let Some(roll_ms) = self.roll_ms().filter(|v| *v > SEGMENT_MS_WARN) {
                    flaws.push(Flaw::LongSegments { roll_ms });
                }
            }
            None => {}
        }
        flaws
    }

    /// The settings that mend `flaws`, as `kafka-configs.sh --add-config` takes them: compacted
    /// only, and segments that roll as often as Ferry's own (unless they do already).
    fn mend(&self, flaws: &[Flaw]) -> String {
        let mut configs = Vec::new();
        if flaws
            .iter()
            .any(|f| matches!(f, Flaw::Deletes { .. } | Flaw::Uncompacted))
        {
            configs.push("cleanup.policy=compact".to_string());
        }
        // Once compacted, segments rolling rarely would pile records up in their turn.
        let long = |ms: Option<i64>| ms.is_none_or(|ms| ms > SEGMENT_MS_WARN);
        let rolls_rarely = match flaws.contains(&Flaw::Uncompacted) {
            true => long(self.segment_ms),
            false => flaws.iter().any(|f| matches!(f, Flaw::LongSegments { .. })),
        };
        if rolls_rarely {
            configs.push(format!("segment.ms={SEGMENT_MS}"));
        }
        configs.join(",")
    }

    /// What is wrong with `topic` and what it costs, for the log and for `ferry check`; `None`
    /// when nothing is.
    pub fn warning(&self, topic: &str) -> Option<Warning> {
        let flaws = self.flaws();
        if flaws.is_empty() {
            return None;
        }
        let policy = self.cleanup_policy.as_deref().unwrap_or("?");
        let what = flaws
            .iter()
            .map(|f| match f {
                Flaw::Deletes {
                    retention_ms,
                    retention_bytes,
                } => {
                    let mut settings = vec![format!("cleanup.policy={policy}")];
                    let (mut when, mut without) = (Vec::new(), Vec::new());
                    if let Some(ms) = retention_ms {
                        when.push(format!("{} after they are written", span(*ms)));
                        settings.push(format!("retention.ms={ms}"));
                        without.push(
                            "a Ferry stopped, or a server that writes no WAL, for that long"
                                .to_string(),
                        );
                    }
                    if let Some(bytes) = retention_bytes {
                        when.push(format!("oldest first once it holds {bytes} bytes"));
                        settings.push(format!("retention.bytes={bytes}"));
                        without.push(
                            "a Ferry idle while other slots sharing the topic write past that size"
                                .to_string(),
                        );
                    }
                    format!(
                        "Kafka deletes its records {} ({}), and Ferry writes one only when its position moves: {} starts without its record. A slot dropped meanwhile then looks like a first start, so the gap goes unnoticed, and exactly-once mode refuses to start from a slot whose record is gone",
                        when.join(", and "),
                        settings.join(", "),
                        without.join(", or "),
                    )
                }
                Flaw::Uncompacted => format!(
                    "it is not compacted (cleanup.policy={policy}): it keeps every progress record ({RATE}), and every start reads them all (~1.9 ms per 1,000)"
                ),
                Flaw::LongSegments { roll_ms } => format!(
                    "its segments roll every {} ({}): compaction never touches the active segment, so a restart reads up to that long's progress records ({RATE}; ~1.9 ms of a restart per 1,000)",
                    span(*roll_ms),
                    match self.segment_ms == Some(*roll_ms) {
                        true => format!("segment.ms={roll_ms}"),
                        false => format!("max.compaction.lag.ms={roll_ms}"),
                    }
                ),
            })
            .collect::<Vec<_>>()
            .join("; ");
        Some(Warning {
            what: format!("the progress topic {topic:?}: {what}"),
            configs: self.mend(&flaws),
        })
    }
}

/// What [`Keeping::warning`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// What is wrong and what it costs.
    pub what: String,
    /// The settings that mend it (`cleanup.policy=compact,segment.ms=600000`).
    pub configs: String,
}

impl Warning {
    /// The command that mends it, run with an administrator's client properties (Ferry's own
    /// principal needs no AlterConfigs).
    pub fn fix(&self, brokers: &str, topic: &str) -> String {
        format!(
            "kafka-configs.sh --bootstrap-server {brokers} --command-config <an admin's client properties> --alter --entity-type topics --entity-name {topic} --add-config {}",
            self.configs
        )
    }
}

/// `ms` in the largest whole unit that fits (`7 days`, `1 hour`, `90 minutes`, `500 ms`).
fn span(ms: i64) -> String {
    const UNITS: [(i64, &str); 4] = [
        (24 * 60 * 60 * 1000, "day"),
        (60 * 60 * 1000, "hour"),
        (60 * 1000, "minute"),
        (1000, "second"),
    ];
    for (unit, name) in UNITS {
        if ms >= unit && ms % unit == 0 {
            let n = ms / unit;
            return format!("{n} {name}{}", if n == 1 { "" } else { "s" });
        }
    }
    format!("{ms} ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keeping(entries: &[(&'static str, &'static str)]) -> Keeping {
        Keeping::from_entries(|name| entries.iter().find(|(n, _)| *n == name).map(|(_, v)| *v))
    }

    /// Kafka's defaults for a topic created with nothing set (log.retention.hours=168,
    /// log.segment roll 7 days).
    const DEFAULTS: [(&str, &str); 4] = [
        ("cleanup.policy", "delete"),
        ("retention.ms", "604800000"),
        ("retention.bytes", "-1"),
        ("segment.ms", "604800000"),
    ];

    #[test]
    fn the_topic_ferry_creates_has_no_flaw() {
        let k = keeping(&[
            ("cleanup.policy", "compact"),
            ("retention.ms", "604800000"),
            ("retention.bytes", "-1"),
            ("segment.ms", "600000"),
        ]);
        assert_eq!(k.flaws(), vec![]);
        assert_eq!(k.warning("ferry.progress"), None);
    }

    #[test]
    fn a_topic_with_the_brokers_defaults_deletes_and_piles_up() {
        let k = keeping(&DEFAULTS);
        assert_eq!(
            k.flaws(),
            vec![
                Flaw::Deletes {
                    retention_ms: Some(604_800_000),
                    retention_bytes: None
                },
                Flaw::Uncompacted
            ]
        );
        let w = k.warning("ferry.progress").unwrap();
        assert!(
            w.what.starts_with(
                "the progress topic \"ferry.progress\": Kafka deletes its records 7 days after they are written (cleanup.policy=delete, retention.ms=604800000), and Ferry writes one only when its position moves: a Ferry stopped, or a server that writes no WAL, for that long starts without its record. A slot dropped meanwhile then looks like a first start, so the gap goes unnoticed, and exactly-once mode refuses to start from a slot whose record is gone; it is not compacted"
            ),
            "{}",
            w.what
        );
        assert_eq!(w.configs, "cleanup.policy=compact,segment.ms=600000");
        assert_eq!(
            w.fix("kafka:9092", "ferry.progress"),
            "kafka-configs.sh --bootstrap-server kafka:9092 --command-config <an admin's client properties> --alter --entity-type topics --entity-name ferry.progress --add-config cleanup.policy=compact,segment.ms=600000"
        );
    }

    #[test]
    fn compact_and_delete_with_a_finite_retention_deletes() {
        let k = keeping(&[
            ("cleanup.policy", "compact,delete"),
            ("retention.ms", "-1"),
            ("retention.bytes", "1073741824"),
            ("segment.ms", "600000"),
        ]);
        assert_eq!(
            k.flaws(),
            vec![Flaw::Deletes {
                retention_ms: None,
                retention_bytes: Some(1 << 30)
            }]
        );
        let w = k.warning("p").unwrap();
        assert!(
            w.what.contains("records oldest first once it holds 1073741824 bytes (cleanup.policy=compact,delete, retention.bytes=1073741824), and Ferry writes one only when its position moves: a Ferry idle while other slots sharing the topic write past that size starts without its record."),
            "{}",
            w.what
        );
        assert_eq!(w.configs, "cleanup.policy=compact");
    }

    #[test]
    fn deletion_without_a_limit_deletes_nothing_but_piles_up() {
        let k = keeping(&[
            ("cleanup.policy", "delete"),
            ("retention.ms", "-1"),
            ("retention.bytes", "-1"),
            ("segment.ms", "600000"),
        ]);
        assert_eq!(k.flaws(), vec![Flaw::Uncompacted]);
        // Its segments already roll often enough once it is compacted.
        assert_eq!(k.warning("p").unwrap().configs, "cleanup.policy=compact");
        // Rolling rarely, they would pile records up in their turn: both are mended.
        let k = Keeping {
            segment_ms: Some(604_800_000),
            ..k
        };
        assert_eq!(k.flaws(), vec![Flaw::Uncompacted]);
        assert_eq!(
            k.warning("p").unwrap().configs,
            "cleanup.policy=compact,segment.ms=600000"
        );
        let k = keeping(&[
            ("cleanup.policy", " compact , delete "),
            ("retention.ms", "-1"),
        ]);
        assert_eq!(k.flaws(), vec![]);
    }

    #[test]
    fn a_compacted_topic_whose_segments_roll_rarely_piles_up() {
        let mut entries = DEFAULTS;
        entries[0] = ("cleanup.policy", "compact");
        let k = keeping(&entries);
        assert_eq!(
            k.flaws(),
            vec![Flaw::LongSegments {
                roll_ms: 604_800_000
            }]
        );
        let w = k.warning("p").unwrap();
        assert!(
            w.what.contains("roll every 7 days (segment.ms=604800000)"),
            "{}",
            w.what
        );
        assert_eq!(w.configs, "segment.ms=600000");
        // Past an hour the warning begins.
        let k = Keeping {
            segment_ms: Some(SEGMENT_MS_WARN),
            ..keeping(&[("cleanup.policy", "compact")])
        };
        assert_eq!(k.flaws(), vec![]);
        let k = Keeping {
            segment_ms: Some(SEGMENT_MS_WARN + 1),
            ..k
        };
        assert_eq!(k.flaws().len(), 1);
        // A compacted topic's segments also roll at max.compaction.lag.ms, if shorter.
        let k = Keeping {
            segment_ms: Some(604_800_000),
            max_compaction_lag_ms: Some(SEGMENT_MS_WARN),
            ..k
        };
        assert_eq!(k.flaws(), vec![]);
        let k = Keeping {
            max_compaction_lag_ms: Some(2 * SEGMENT_MS_WARN),
            ..k
        };
        assert_eq!(
            k.flaws(),
            vec![Flaw::LongSegments {
                roll_ms: 2 * SEGMENT_MS_WARN
            }]
        );
        assert!(
            k.warning("p")
                .unwrap()
                .what
                .contains("roll every 2 hours (max.compaction.lag.ms=7200000)"),
            "{k:?}"
        );
    }

    #[test]
    fn what_the_answer_does_not_say_is_no_flaw() {
        assert!(!keeping(&[]).is_said());
        assert!(keeping(&DEFAULTS).is_said());
        assert_eq!(keeping(&[]).flaws(), vec![]);
        assert_eq!(keeping(&[("retention.ms", "1")]).flaws(), vec![]);
        assert_eq!(
            keeping(&[("cleanup.policy", "delete"), ("retention.ms", "soon")]).flaws(),
            vec![Flaw::Uncompacted]
        );
    }

    #[test]
    fn spans_are_said_in_the_largest_whole_unit() {
        assert_eq!(span(604_800_000), "7 days");
        assert_eq!(span(3_600_000), "1 hour");
        assert_eq!(span(5_400_000), "90 minutes");
        assert_eq!(span(1000), "1 second");
        assert_eq!(span(1500), "1500 ms");
        assert_eq!(span(0), "0 ms");
    }
}
