//! HALO's spread Phase II (a uniform all-to-all whose Phase II packets are cut into
//! chunks: each chunk of one or two blocks goes to a rank it holds a block for) run on
//! the in-process transport with real threads: receive buffers byte-exact, also with
//! a ragged last chunk, uneven nodes, and all-to-all-v (aligned routing) on the same
//! communicator afterwards.

use halo::local::{self, Emulation};
use halo::topology::Topology;
use halo::{AlgoOptions, Algorithm, Partition};
use std::time::Duration;

fn byte(src: usize, dst: usize, i: usize, salt: usize) -> u8 {
    (src.wrapping_mul(131) ^ dst.wrapping_mul(29) ^ i.wrapping_mul(7) ^ salt) as u8
}

fn check(spec: &str, block: usize, options: AlgoOptions) {
    let topo = Topology::preset(spec).unwrap();
    let n = topo.size();
    let salt = block + options.chunk_bytes;
    let out = local::run(&topo, Emulation::off(), |comm| {
        comm.set_timeout(Duration::from_secs(30));
        comm.set_algorithm(Some(Algorithm::Halo));
        comm.set_algo_options(options.clone());
        let me = comm.rank();
        let send: Vec<u8> = (0..n * block)
            .map(|k| byte(me, k / block, k % block, salt))
            .collect();
        let mut recv = vec![0xEEu8; n * block];
        comm.all_to_all(&send, &mut recv)?;
        assert_eq!(comm.last_algorithm(), Some(Algorithm::Halo));
        // All-to-all-v with the same counts keeps the aligned routing; same bytes.
        let counts = vec![block; n];
        let part = Partition::packed(&counts);
        let mut recv_v = vec![0xEEu8; n * block];
        comm.all_to_all_v(&send, &part, &mut recv_v, &part)?;
        Ok((recv, recv_v))
    });
    for (me, r) in out.into_iter().enumerate() {
        let (recv, recv_v) = r.unwrap_or_else(|e| panic!("{spec} rank {me}: {e}"));
        let want: Vec<u8> = (0..n * block)
            .map(|k| byte(k / block, me, k % block, salt))
            .collect();
        assert_eq!(recv, want, "{spec} block {block} {options:?}: rank {me}");
        assert_eq!(
            recv_v, want,
            "{spec} block {block} {options:?} (v): rank {me}"
        );
    }
}

fn opts(chunk_bytes: usize, max_chunks: usize) -> AlgoOptions {
    AlgoOptions {
        chunk_bytes,
        max_chunks,
        halo_levels: None,
        ..AlgoOptions::default()
    }
}

#[test]
fn two_block_chunks() {
    for spec in ["nodes:2x4", "nodes:3x4", "frontier:2"] {
        check(spec, 40, opts(80, 4096));
    }
}

#[test]
fn one_block_chunks_land_in_place() {
    for spec in ["nodes:2x4", "frontier:2"] {
        check(spec, 33, opts(33, 4096));
    }
}

#[test]
fn ragged_chunks_on_uneven_nodes() {
    for spec in [
        "nodes:4x4,ranks=14",
        "nodes:3x3,ranks=7",
        "nodes:2x4,ranks=7",
    ] {
        check(spec, 24, opts(1, 3));
        check(spec, 100, opts(150, 4096));
    }
}

#[test]
fn default_options_large_blocks() {
    // 8 blocks of 64 KiB: four chunks of two blocks (frontier:2's 8-rank nodes).
    check("frontier:2", 64 << 10, AlgoOptions::default());
}

/// HALO's intra-node phase relaying blocks over peers on a Frontier node's balanced
/// paths (`AlgoOptions::node_relay_bytes`), in chunks, with and without the spread
/// Phase II, on whole and cut nodes: byte-exact.
#[test]
fn relays_inside_frontier_nodes() {
    let relay = |chunk_bytes: usize| AlgoOptions {
        chunk_bytes,
        node_relay_bytes: 0,
        ..AlgoOptions::default()
    };
    for spec in ["frontier:1", "frontier:2", "frontier:2,ranks=13"] {
        check(spec, 40, relay(16));
        check(spec, 40, relay(1 << 20));
    }
    // The default: relayed from 128 KiB per peer (one node: the whole all-to-all).
    check("frontier:1", 256 << 10, AlgoOptions::default());
}
