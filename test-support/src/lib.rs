//! What the test suites of HALO's crates share, in one place (a dev-dependency only;
//! no library or tool depends on it, and it depends on nothing).
//!
//! - [`skip`] / [`all_required`]: tests that cannot run everywhere. Some tests need
//!   root (network namespaces), Open MPI, `setpriv` or numpy. Without them a
//!   developer's run prints why and skips; with `HALO_REQUIRE_ALL=1` (set by `.ci/run`
//!   and by `scripts/test.sh` when run as root, after `scripts/deps.sh test` installed
//!   everything) such a test fails instead, naming what was missing, so that a CI run
//!   can never pass by skipping.
//! - [`Rng`]: a seeded xorshift64* generator for random inputs that a failure can
//!   reproduce.
//! - [`scratch`]: a fresh directory for one test under cargo's `CARGO_TARGET_TMPDIR`.
//!
//! ```
//! let mut rng = halo_test_support::Rng::new(7);
//! assert!(rng.below(10) < 10);
//! ```

use std::path::PathBuf;

/// The switch: `HALO_REQUIRE_ALL=1` turns every skip into a failure.
pub const REQUIRE_ALL: &str = "HALO_REQUIRE_ALL";

/// Whether every test must run (`HALO_REQUIRE_ALL=1`).
pub fn all_required() -> bool {
    std::env::var(REQUIRE_ALL).as_deref() == Ok("1")
}

/// Skips the calling test, printing `why`; under `HALO_REQUIRE_ALL=1` fails it instead.
///
/// # Panics
/// When [`all_required`]: the test cannot run here and must not pass as skipped.
pub fn skip(why: &str) {
    assert!(
        !all_required(),
        "{REQUIRE_ALL}=1 but this test cannot run here: {why}"
    );
    eprintln!("skipped: {why} (set {REQUIRE_ALL}=1 to make this a failure)");
}

/// A small xorshift64* generator: seeded, reproducible, no external crate.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`, mixed so that small seeds give unrelated streams.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A generator whose state is `state` as given (non-zero), for suites whose
    /// recorded cases name the state itself.
    pub fn from_state(state: u64) -> Self {
        Rng(state)
    }

    /// The next 64 random bits.
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

/// A fresh, empty directory `BASE/GROUP/TEST`, where `BASE` is the calling test's
/// `env!("CARGO_TARGET_TMPDIR")` (cargo sets it for integration tests only, at their
/// compile time, so the caller passes it).
///
/// # Panics
/// When the directory cannot be created.
pub fn scratch(base: &str, group: &str, test: &str) -> PathBuf {
    let dir = PathBuf::from(base).join(group).join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_reproducible_and_in_range() {
        let (mut a, mut b) = (Rng::new(3), Rng::new(3));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut c = Rng::new(4);
        assert!((0..1000).all(|_| c.below(7) < 7));
        assert_ne!(Rng::new(3).next_u64(), Rng::new(4).next_u64());
    }

    #[test]
    fn scratch_is_fresh() {
        let base = std::env::temp_dir().join(format!("halo-ts-{}", std::process::id()));
        let d = scratch(base.to_str().unwrap(), "g", "t");
        std::fs::write(d.join("x"), b"1").unwrap();
        let d = scratch(base.to_str().unwrap(), "g", "t");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        std::fs::remove_dir_all(base).unwrap();
    }
}
