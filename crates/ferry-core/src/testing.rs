//! Support for the repository's simulations and fault tests (not part of the core's API).
//!
//! [`Rng`] is the one random generator of the repository's tests: the core's simulation
//! (`tests/simulation.rs`), the end-to-end fault tests, and the chaos runs' fault schedules
//! (`ferry_testkit::faults`, which re-exports it). It lives here because this crate is at the
//! bottom of the dependency graph and has no I/O: everything that needs a seeded generator
//! already depends on it, or can, without reaching tokio or a broker client.

/// SplitMix64: small, fast, and fully determined by its seed, so a failing seed replays the
/// same on every machine (no wall clock, no OS randomness).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub const fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// True `percent` times in 100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_splitmix64s() {
        // The reference values of SplitMix64 from seed 0: schedules and seeds written down in
        // issues and CI scripts keep meaning what they meant.
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        let mut r = Rng::new(7);
        for _ in 0..1_000 {
            assert!(r.below(10) < 10);
            assert!((3..=5).contains(&r.range(3, 5)));
        }
        assert_eq!(r.below(0), 0);
        assert!(!Rng::new(1).percent(0));
        assert!(Rng::new(1).percent(100));
    }
}
