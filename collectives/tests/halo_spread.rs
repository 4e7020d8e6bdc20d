//! HALO's spread Phase II (uniform all-to-all, one aggregation level, a packet cut into
//! several chunks): each chunk goes to one of the ranks whose blocks it holds instead
//! of every chunk to the aligned peer. Verified on even and uneven nodes; a chunk of
//! one block goes straight into place; simulated, it is never behind flat on Frontier.
mod common;
use common::*;
use halo_collectives::*;
use halo_topology::Topology;

fn opts(chunk_bytes: usize, max_chunks: usize) -> AlgoOptions {
    AlgoOptions {
        chunk_bytes,
        max_chunks,
        halo_levels: None,
        ..AlgoOptions::default()
    }
}

/// Peers outside `rank`'s node that its schedule sends to.
fn remote_peers(topo: &Topology, s: &Schedule, rank: usize) -> Vec<usize> {
    let node = topo.domain(rank, halo_topology::Level::Node);
    let mut peers: Vec<usize> = s
        .steps()
        .iter()
        .filter_map(|st| match st {
            Step::Send { peer, .. }
                if topo.domain(*peer as usize, halo_topology::Level::Node) != node =>
            {
                Some(*peer as usize)
            }
            _ => None,
        })
        .collect();
    peers.sort_unstable();
    peers.dedup();
    peers
}

#[test]
fn spread_schedules_verify() {
    for preset in [
        "nodes:2x2",
        "nodes:3x4",
        "nodes:4x4,ranks=14",
        "nodes:3x3,ranks=7",
        "frontier:2",
        "frontier:5,ranks=37",
    ] {
        let topo = Topology::preset(preset).unwrap();
        // Blocks above META_BLOCK (16 bytes); chunk plans of one, two and three blocks,
        // and ragged last chunks (max_chunks 3 on nodes of 4 and 8).
        for block in [17usize, 24, 100] {
            for o in [
                opts(block, 4096),
                opts(2 * block, 4096),
                opts(1, 3),
                opts(3 * block - 1, 4096),
            ] {
                let s = build_uniform(Algorithm::Halo, &topo, block, &o).unwrap();
                verify_all_to_all(&s, &topo, &UniformSizes(block)).unwrap_or_else(|e| {
                    panic!("{preset} block {block} chunk {}: {e}", o.chunk_bytes)
                });
            }
        }
    }
}

#[test]
fn chunks_of_one_block_go_straight_to_their_destination() {
    let topo = Topology::preset("frontier:3").unwrap();
    let n = topo.size();
    let block = 64;
    let s = build_uniform(Algorithm::Halo, &topo, block, &opts(block, 4096)).unwrap();
    verify_all_to_all(&s, &topo, &UniformSizes(block)).unwrap();
    for (rank, sched) in s.iter().enumerate() {
        // Every remote rank directly, as the flat fan-out does.
        assert_eq!(remote_peers(&topo, sched, rank).len(), n - 8, "rank {rank}");
        // No forwarding: the only copy is the rank's own block.
        let copies = sched
            .steps()
            .iter()
            .filter(|st| matches!(st, Step::Copy { .. }))
            .count();
        assert_eq!(copies, 1, "rank {rank}");
    }
}

#[test]
fn chunks_of_two_blocks_go_to_one_of_their_ranks() {
    let topo = Topology::preset("frontier:3").unwrap();
    let block = 40;
    // 8 blocks of 40 bytes cut into 4 chunks of 2 blocks.
    let o = opts(2 * block, 4096);
    let s = build_uniform(Algorithm::Halo, &topo, block, &o).unwrap();
    verify_all_to_all(&s, &topo, &UniformSizes(block)).unwrap();
    for (rank, sched) in s.iter().enumerate() {
        // 4 peers in each of the 2 other nodes: one rank of each pair, chosen by
        // this rank's local index.
        let peers = remote_peers(&topo, sched, rank);
        assert_eq!(peers.len(), 8, "rank {rank}: {peers:?}");
        let parity = rank % 8 % 2;
        assert!(
            peers.iter().all(|p| p % 8 % 2 == parity),
            "rank {rank}: {peers:?}"
        );
    }
    // The metadata pass of all-to-all-v (META_BLOCK bytes) and all-to-all-v itself keep
    // the aligned routing: one peer per remote node.
    let meta = build_uniform(Algorithm::Halo, &topo, META_BLOCK, &opts(1, 4096)).unwrap();
    for (rank, sched) in meta.iter().enumerate() {
        assert_eq!(remote_peers(&topo, sched, rank).len(), 2, "rank {rank}");
    }
    let m = MatrixSizes::new(topo.size(), vec![block; topo.size() * topo.size()]);
    let v = build_v(Algorithm::Halo, &topo, &m, &o).unwrap();
    verify_all_to_all(&v, &topo, &m).unwrap();
    for (rank, sched) in v.iter().enumerate() {
        assert_eq!(remote_peers(&topo, sched, rank).len(), 2, "rank {rank}");
    }
}

/// Issue 16's target on the simulator: HALO at least as fast as flat on frontier:16
/// from 64 KiB per peer (where it was 0.92-0.98x before spreading).
#[test]
fn halo_not_behind_flat_on_frontier_16() {
    let topo = Topology::preset("frontier:16").unwrap();
    let o = SimOptions::default();
    for block in [64 << 10, 256 << 10, 1 << 20] {
        let flat = simulate_all_to_all(&topo, Algorithm::Flat, Traffic::Uniform(block), &o)
            .unwrap()
            .time;
        let halo = simulate_all_to_all(&topo, Algorithm::Halo, Traffic::Uniform(block), &o)
            .unwrap()
            .time;
        assert!(halo <= flat, "{block} B: halo {halo} s, flat {flat} s");
    }
}
