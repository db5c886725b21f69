//! A fault schedule from a seed: which fault, when, for how long. The same seed gives the same
//! schedule on every machine (a SplitMix64 generator, no wall clock, no OS randomness), so a
//! failing chaos run can be replayed by its seed; only the timing of the load around it varies.

use std::time::Duration;

/// SplitMix64, the repository's one test generator.
pub use ferry_core::testing::Rng;

/// The faults a chaos run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// Reset every connection between Ferry and PostgreSQL.
    PgCut,
    /// Ferry's PostgreSQL link forwards nothing.
    PgBlackhole,
    /// Latency on Ferry's PostgreSQL link.
    PgDelay,
    /// Ferry's PostgreSQL link throttled.
    PgThrottle,
    /// Reset every connection between Ferry and the broker.
    KafkaCut,
    /// Ferry's broker link forwards nothing.
    KafkaBlackhole,
    /// Latency on Ferry's broker link.
    KafkaDelay,
    /// Ferry's broker link throttled.
    KafkaThrottle,
    /// `kill -9` of Ferry, then a new Ferry.
    FerryKill,
    /// SIGSTOP of Ferry, SIGCONT when healed.
    FerryPause,
    /// PostgreSQL stopped with a fast shutdown, then started again.
    PgStopFast,
    /// PostgreSQL stopped with an immediate shutdown (a crash), then started again.
    PgStopImmediate,
    /// The broker stopped (SIGTERM, or SIGKILL where the run asks), then started again with
    /// its data.
    BrokerKill,
    /// One node of a cluster killed with SIGKILL (the node chosen by the seed), then started
    /// again with its data.
    NodeKill,
    /// The node leading one partition Ferry writes (the partition chosen by the seed) killed
    /// with SIGKILL, then started again with its data.
    LeaderKill,
    /// One node of a cluster stopped cleanly (SIGTERM: Kafka's controlled shutdown), then
    /// started again with its data.
    NodeRestart,
    /// One node of a cluster stopped with SIGSTOP, SIGCONT when healed.
    NodePause,
}

impl FaultKind {
    pub const ALL: [FaultKind; 17] = [
        FaultKind::PgCut,
        FaultKind::PgBlackhole,
        FaultKind::PgDelay,
        FaultKind::PgThrottle,
        FaultKind::KafkaCut,
        FaultKind::KafkaBlackhole,
        FaultKind::KafkaDelay,
        FaultKind::KafkaThrottle,
        FaultKind::FerryKill,
        FaultKind::FerryPause,
        FaultKind::PgStopFast,
        FaultKind::PgStopImmediate,
        FaultKind::BrokerKill,
        FaultKind::NodeKill,
        FaultKind::LeaderKill,
        FaultKind::NodeRestart,
        FaultKind::NodePause,
    ];

    /// A fault on one node of a broker cluster.
    pub fn is_node_fault(self) -> bool {
        matches!(
            self,
            FaultKind::NodeKill
                | FaultKind::LeaderKill
                | FaultKind::NodeRestart
                | FaultKind::NodePause
        )
    }

    /// A fault on Ferry's link to the broker (through the fault proxy).
    pub fn is_broker_link_fault(self) -> bool {
        matches!(
            self,
            FaultKind::KafkaCut
                | FaultKind::KafkaBlackhole
                | FaultKind::KafkaDelay
                | FaultKind::KafkaThrottle
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::PgCut => "pg link reset",
            FaultKind::PgBlackhole => "pg link blackhole",
            FaultKind::PgDelay => "pg link delay",
            FaultKind::PgThrottle => "pg link throttle",
            FaultKind::KafkaCut => "broker link reset",
            FaultKind::KafkaBlackhole => "broker link blackhole",
            FaultKind::KafkaDelay => "broker link delay",
            FaultKind::KafkaThrottle => "broker link throttle",
            FaultKind::FerryKill => "ferry kill -9",
            FaultKind::FerryPause => "ferry SIGSTOP/SIGCONT",
            FaultKind::PgStopFast => "postgres stop fast",
            FaultKind::PgStopImmediate => "postgres stop immediate",
            FaultKind::BrokerKill => "broker stop/kill + restart",
            FaultKind::NodeKill => "broker node kill -9 + restart",
            FaultKind::LeaderKill => "partition leader kill -9 + restart",
            FaultKind::NodeRestart => "broker node SIGTERM + restart",
            FaultKind::NodePause => "broker node SIGSTOP/SIGCONT",
        }
    }
}

/// One fault of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// From the start of the run.
    pub at: Duration,
    pub kind: FaultKind,
    /// How long the fault stands before it is healed (0 for a momentary one).
    pub hold: Duration,
    /// The fault's size: delay in ms, throttle in bytes/s; for a node fault the node (the
    /// runner takes it modulo the cluster's size), for a leader kill the partition (modulo
    /// the partitions the runner picks from); 0 otherwise.
    pub param: u64,
}

/// Relative weights of the kinds, and the pace.
#[derive(Debug, Clone)]
pub struct Mix {
    /// Weight per kind (kinds missing weigh 0).
    pub weights: Vec<(FaultKind, u32)>,
    /// Quiet time between the heal of one fault and the next, drawn in this range (ms).
    pub gap_ms: (u64, u64),
}

impl Mix {
    /// Every kind; process kills weigh most, as they are the faults the promise is about.
    pub fn standard() -> Mix {
        use FaultKind::*;
        Mix {
            weights: vec![
                (PgCut, 2),
                (PgBlackhole, 1),
                (PgDelay, 1),
                (PgThrottle, 1),
                (KafkaCut, 2),
                (KafkaBlackhole, 1),
                (KafkaDelay, 1),
                (KafkaThrottle, 1),
                (FerryKill, 6),
                (FerryPause, 1),
                (PgStopFast, 1),
                (PgStopImmediate, 1),
                (BrokerKill, 1),
            ],
            gap_ms: (1500, 4000),
        }
    }

    /// For a cluster of brokers that Ferry reaches directly (no fault proxy on its broker
    /// link, which fronts one broker only): the standard mix without the broker link faults
    /// and the whole-broker restart, with the node faults instead, one node at a time.
    pub fn cluster() -> Mix {
        use FaultKind::*;
        let mut mix = Mix::standard();
        mix.weights
            .retain(|(k, _)| !k.is_broker_link_fault() && *k != BrokerKill);
        mix.weights.extend([
            (NodeKill, 2),
            (LeaderKill, 2),
            (NodeRestart, 2),
            (NodePause, 2),
        ]);
        mix
    }
}

/// Faults one after another (each healed before the next) over `duration`, from `seed`.
pub fn schedule(seed: u64, duration: Duration, mix: &Mix) -> Vec<Planned> {
    let mut rng = Rng::new(seed);
    let total: u64 = mix.weights.iter().map(|(_, w)| u64::from(*w)).sum();
    let mut out = Vec::new();
    if total == 0 {
        return out;
    }
    let mut t = Duration::from_millis(rng.range(mix.gap_ms.0, mix.gap_ms.1));
    while t < duration {
        let mut pick = rng.range(0, total - 1);
        let kind = mix
            .weights
            .iter()
            .find(|(_, w)| {
                let hit = pick < u64::from(*w);
                pick = pick.saturating_sub(u64::from(*w));
                hit
            })
            .map(|(k, _)| *k)
            .expect("a weight covers every pick");
        let (hold_ms, param) = match kind {
            FaultKind::PgCut | FaultKind::KafkaCut | FaultKind::FerryKill => (0, 0),
            FaultKind::PgDelay | FaultKind::KafkaDelay => {
                (rng.range(1000, 4000), rng.range(20, 300))
            }
            FaultKind::PgThrottle | FaultKind::KafkaThrottle => {
                (rng.range(1000, 4000), rng.range(20_000, 500_000))
            }
            FaultKind::NodeKill | FaultKind::NodeRestart | FaultKind::LeaderKill => {
                (rng.range(500, 6000), rng.range(0, 1 << 16))
            }
            // Up to 15 s: a pause longer than the controller's broker session (9 s) fences the
            // node and moves its leaderships; a shorter one only stalls it.
            FaultKind::NodePause => (rng.range(1000, 15_000), rng.range(0, 1 << 16)),
            _ => (rng.range(500, 6000), 0),
        };
        out.push(Planned {
            at: t,
            kind,
            hold: Duration::from_millis(hold_ms),
            param,
        });
        t += Duration::from_millis(hold_ms + rng.range(mix.gap_ms.0, mix.gap_ms.1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let d = Duration::from_secs(600);
        let a = schedule(42, d, &Mix::standard());
        assert_eq!(a, schedule(42, d, &Mix::standard()));
        assert_ne!(a, schedule(43, d, &Mix::standard()));
        assert!(a.len() > 50, "{}", a.len());
        assert!(
            a.windows(2).all(|w| w[0].at + w[0].hold < w[1].at),
            "faults overlap"
        );
        assert!(a.last().unwrap().at < d);
        for k in FaultKind::ALL {
            assert_eq!(
                a.iter().any(|p| p.kind == k),
                !k.is_node_fault(),
                "{k:?}: every kind but the node faults is drawn by the standard mix"
            );
        }
    }

    #[test]
    fn the_cluster_mix_has_node_faults_and_no_broker_link_or_whole_broker_faults() {
        let a = schedule(12, Duration::from_secs(600), &Mix::cluster());
        for k in FaultKind::ALL {
            let expected = !k.is_broker_link_fault() && k != FaultKind::BrokerKill;
            assert_eq!(a.iter().any(|p| p.kind == k), expected, "{k:?}");
        }
        assert!(
            a.windows(2).all(|w| w[0].at + w[0].hold < w[1].at),
            "faults overlap"
        );
    }

    #[test]
    fn a_mix_of_one_kind_draws_only_that_kind() {
        let mix = Mix {
            weights: vec![(FaultKind::FerryKill, 1)],
            gap_ms: (100, 100),
        };
        let s = schedule(7, Duration::from_secs(10), &mix);
        assert_eq!(s.len(), 99);
        assert!(s.iter().all(|p| p.kind == FaultKind::FerryKill));
    }
}
