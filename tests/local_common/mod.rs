//! Helpers shared by the `local_*` integration tests.
#![allow(dead_code, unreachable_pub, missing_docs)]

use halo::Algorithm;
use halo::topology::Topology;

/// A small xorshift64* generator: seeded, reproducible, no external crate.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// The algorithms whose builders work on `topology`; the others are printed (the
/// builders that are not written yet return an internal error).
pub fn buildable(topology: &Topology) -> Vec<Algorithm> {
    Algorithm::ALL
        .into_iter()
        .filter(
            |&a| match halo::select::buildable(topology, a, &halo::AlgoOptions::default()) {
                Ok(()) => true,
                Err(e) => {
                    println!("skipping {a} on {}: {e}", topology.name());
                    false
                }
            },
        )
        .collect()
}
