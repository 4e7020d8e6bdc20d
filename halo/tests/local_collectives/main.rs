//! Point-to-point, all-gather, all-reduce and split on the in-process transport: real
//! threads, real bytes.
//!
//! - send/recv: rings and pairs, several messages in order (zero-length ones among
//!   them), messages to self, a length mismatch, and a timeout that names the peer;
//! - all-gather: every algorithm for 1, 2, 3, 5 and 8 ranks, byte-exact;
//! - all-reduce: every element type x operation x rank count in {1,2,3,4,5,7,8} x
//!   length in {0,1,7,1000}, both algorithms and the automatic choice, exact against a
//!   reference (integer-valued data, so every order of summation is exact), and bitwise
//!   equal on every rank for random floats;
//! - split: by parity and by halves with reversed keys, all-to-all on the children,
//!   children and parent used alternately, no color (`None`), nested splits, concurrent
//!   use refused, communicator ids released on drop.
//!
//! One test binary, one file per family: [`p2p`], [`reduce`] (all-gather, all-reduce,
//! reduce-scatter), [`split`] and [`rooted`] (broadcast, gather, scatter).

#[path = "../local_common/mod.rs"]
mod local_common;

mod p2p;
mod reduce;
mod rooted;
mod split;

use halo::local::{self, Emulation};
use halo::topology::Topology;
use halo::{
    AllGatherAlgorithm, AllReduceAlgorithm, BroadcastAlgorithm, Communicator, Error, ReduceOp,
    Reducible, bf16, f16,
};
use local_common::{Rng, buildable};
use std::fmt::Debug;
use std::time::{Duration, Instant};

/// Runs `f` on every rank of `topo` with a 30 s timeout and returns the results,
/// failing the test with every rank's error.
fn run_ok<R: Send>(
    topo: &Topology,
    f: impl Fn(&mut Communicator) -> halo::Result<R> + Sync,
) -> Vec<R> {
    let out = local::run(topo, Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(30));
        f(comm)
    });
    let errors: Vec<String> = out
        .iter()
        .enumerate()
        .filter_map(|(r, x)| x.as_ref().err().map(|e| format!("rank {r}: {e}")))
        .collect();
    assert!(errors.is_empty(), "{}:\n{}", topo.name(), errors.join("\n"));
    out.into_iter().map(|x| x.expect("checked")).collect()
}

fn flat(n: usize) -> Topology {
    Topology::preset(&format!("flat:{n}")).unwrap()
}

/// A payload that names its sender, receiver, message number and position.
fn payload(src: usize, dst: usize, k: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| (src as u32) << 24 | (dst as u32) << 16 | (k as u32) << 10 | i as u32)
        .collect()
}

/// Runs `f` on `n` ranks with a `timeout` and returns every rank's outcome.
fn run_all<R: Send>(
    n: usize,
    timeout: Duration,
    f: impl Fn(&mut Communicator) -> halo::Result<R> + Sync,
) -> Vec<halo::Result<R>> {
    local::run(&flat(n), Emulation::off(), |comm| {
        comm.set_timeout(timeout);
        f(comm)
    })
}
