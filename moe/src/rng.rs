//! A small deterministic PRNG (SplitMix64, hand-written).
//!
//! SplitMix64 is chosen over `rand`/`rand_chacha` because the model needs only uniform numbers
//! and stream derivation from a few integers (seed, group, step, index), and because its output
//! is pure integer arithmetic: the same seed gives the same bits on every platform and every
//! future version of this crate, which a dependency's value-stability policy need not promise.
//! Uniform floats are made from the top 24 bits, so they too are exact on every platform.

/// SplitMix64 generator (Steele, Lea, Flood 2014; the seeding generator of xoshiro).
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting at `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// A generator for the stream named by `parts` under `seed` (e.g. `[group, layer, expert]`
    /// or `[step, sequence]`): each part is folded in through one mixing step, so distinct
    /// part lists give unrelated streams.
    pub fn derive(seed: u64, parts: &[u64]) -> Self {
        let mut h = mix(seed ^ 0x6a09_e667_f3bc_c909);
        for &p in parts {
            h = mix(h ^ mix(p.wrapping_add(0x9e37_79b9_7f4a_7c15)));
        }
        SplitMix64 { state: h }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.state)
    }

    /// Uniform in `[0, 1)` with 24 random bits (exactly representable in f32).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `0..n` (`n > 0`), by multiply-shift of 32 random bits (bias at
    /// most `n / 2^32`).
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * u64::from(n)) >> 32) as u32
    }

    /// Uniform in `[-a, a)`.
    pub fn symmetric(&mut self, a: f32) -> f32 {
        (2.0 * self.next_f32() - 1.0) * a
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_reference_values() {
        // First outputs of SplitMix64 seeded with 0 (the published reference sequence).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn below_stays_in_range_and_covers() {
        let mut r = SplitMix64::new(7);
        let mut seen = [false; 5];
        for _ in 0..200 {
            let x = r.below(5);
            assert!(x < 5);
            seen[x as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn derive_separates_streams() {
        let a = SplitMix64::derive(1, &[2, 3]).next_u64();
        let b = SplitMix64::derive(1, &[3, 2]).next_u64();
        let c = SplitMix64::derive(1, &[2, 3]).next_u64();
        assert_ne!(a, b);
        assert_eq!(a, c);
    }
}
