//! A small deterministic generator (splitmix64) for the suites that kill processes at random
//! moments: the seed is printed, so a run can be replayed exactly.

/// Numbers from a seed.
#[derive(Debug)]
pub struct Seeded(u64);

impl Seeded {
    /// The numbers of `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next number.
    pub fn next_number(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The next number below `bound` (0 when `bound` is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_number() % bound.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_and_bounds_hold() {
        let (mut a, mut b) = (Seeded::new(7), Seeded::new(7));
        let first: Vec<u64> = (0..5).map(|_| a.next_number()).collect();
        let again: Vec<u64> = (0..5).map(|_| b.next_number()).collect();
        assert_eq!(first, again);
        assert!((0..100).all(|_| a.below(3) < 3));
        assert_eq!(a.below(0), 0);
    }
}
