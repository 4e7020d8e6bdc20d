//! All-to-all-v in one pass (issue 16, item 3): on a small communicator a call sends one
//! round of count messages, which carry blocks of up to `Communicator::eager_v()` bytes
//! whole, and then a data pass only for blocks beyond that — counted on the in-process
//! transport's traffic counters, blocking and non-blocking alike — and the bytes are
//! right. (The three-pass way for large communicators, forced, the eager bytes forced
//! off, and the errors of each way are tested in `src/comm/all_to_all_v.rs`.)

use halo::local::{Emulation, LocalCluster};
use halo::topology::{Level, Topology};
use halo::{Algorithm, Partition};

/// Elements (`u64`) rank `s` sends to rank `d`: every pair non-zero, so the flat fan-out
/// sends one message per pair; `extra` more on every pair.
fn count(s: usize, d: usize, extra: usize) -> usize {
    1 + (s * 5 + d * 3) % 4 + extra
}

/// One checked call with `extra` elements more per block; the messages it sent and
/// whether every rank's eager bytes (the same on all) cover every block.
fn run(spec: &str, nonblocking: bool, extra: usize) -> (u64, bool) {
    let topo = Topology::preset(spec).unwrap();
    let n = topo.size();
    let cluster = LocalCluster::new(topo, Emulation::off()).unwrap();
    let traffic = cluster.traffic();
    let out = cluster.run(|comm| {
        comm.set_algorithm(Some(Algorithm::Flat));
        let me = comm.rank();
        let sc: Vec<usize> = (0..n).map(|d| count(me, d, extra)).collect();
        let rc: Vec<usize> = (0..n).map(|s| count(s, me, extra)).collect();
        let fits = (0..n).all(|d| (0..n).all(|s| count(s, d, extra) * 8 <= comm.eager_v()));
        let send: Vec<u64> = (0..n)
            .flat_map(|d| (0..sc[d]).map(move |i| (me * 1000 + d * 10 + i) as u64))
            .collect();
        let mut recv = vec![u64::MAX; rc.iter().sum()];
        let (sp, rp) = (Partition::packed(&sc), Partition::packed(&rc));
        if nonblocking {
            comm.scope(|s| s.all_to_all_v(&send, &sp, &mut recv, &rp).wait())?;
        } else {
            comm.all_to_all_v(&send, &sp, &mut recv, &rp)?;
        }
        let want: Vec<u64> = (0..n)
            .flat_map(|s| (0..rc[s]).map(move |i| (s * 1000 + me * 10 + i) as u64))
            .collect();
        assert_eq!(recv, want, "{spec} rank {me}");
        assert_eq!(comm.last_algorithm(), Some(Algorithm::Flat));
        Ok(fits)
    });
    let fits: Vec<bool> = out
        .into_iter()
        .enumerate()
        .map(|(r, x)| x.unwrap_or_else(|e| panic!("{spec} rank {r}: {e}")))
        .collect();
    assert!(fits.iter().all(|&f| f == fits[0]), "{spec}: {fits:?}");
    (traffic.messages_crossing(Level::Device), fits[0])
}

#[test]
fn a_small_communicator_sends_one_round_then_the_data_beyond_the_eager_bytes() {
    for spec in ["nodes:1x4", "nodes:2x2", "nodes:4x2"] {
        let n = Topology::preset(spec).unwrap().size() as u64;
        for nonblocking in [false, true] {
            // Blocks of 8-32 bytes go with the counts: n - 1 messages per rank in all.
            let (messages, fits) = run(spec, nonblocking, 0);
            println!("{spec} (non-blocking: {nonblocking}): {messages} messages, eager");
            assert!(fits, "{spec}: the default eager bytes hold 32-byte blocks");
            assert_eq!(messages, n * (n - 1), "{spec}");
            // Blocks of 2 KiB and more: n - 1 messages of counts (and each block's
            // first bytes) per rank, then n - 1 of the remainders (the flat fan-out);
            // three passes would be 3 n (n - 1) with the flat fan-out.
            let (messages, fits) = run(spec, nonblocking, 256);
            println!("{spec} (non-blocking: {nonblocking}): {messages} messages, 2 KiB+");
            assert!(!fits, "{spec}");
            assert_eq!(messages, 2 * n * (n - 1), "{spec}");
        }
    }
}
