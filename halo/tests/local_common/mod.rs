//! Helpers shared by the `local_*` integration tests.
#![allow(dead_code, unreachable_pub, missing_docs)]

use halo::Algorithm;
use halo::topology::Topology;

#[allow(unused_imports)] // not every local test draws random inputs
pub use halo_test_support::Rng;

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
