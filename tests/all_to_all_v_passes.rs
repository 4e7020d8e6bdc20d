//! All-to-all-v in one metadata pass (issue 16, item 3): on a small communicator a call
//! sends one round of count messages and then the data — counted on the in-process
//! transport's traffic counters, blocking and non-blocking alike — and the bytes are
//! right. (The three-pass way for large communicators, forced, and the errors of each
//! way are tested in `src/comm/all_to_all_v.rs`.)

use halo::local::{Emulation, LocalCluster};
use halo::topology::{Level, Topology};
use halo::{Algorithm, Partition};

/// Elements rank `s` sends to rank `d`: every pair non-zero, so the flat fan-out sends
/// one message per pair.
fn count(s: usize, d: usize) -> usize {
    1 + (s * 5 + d * 3) % 4
}

fn run(spec: &str, nonblocking: bool) -> u64 {
    let topo = Topology::preset(spec).unwrap();
    let n = topo.size();
    let cluster = LocalCluster::new(topo, Emulation::off()).unwrap();
    let traffic = cluster.traffic();
    let out = cluster.run(|comm| {
        comm.set_algorithm(Some(Algorithm::Flat));
        let me = comm.rank();
        let sc: Vec<usize> = (0..n).map(|d| count(me, d)).collect();
        let rc: Vec<usize> = (0..n).map(|s| count(s, me)).collect();
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
        Ok(())
    });
    for (r, x) in out.into_iter().enumerate() {
        x.unwrap_or_else(|e| panic!("{spec} rank {r}: {e}"));
    }
    traffic.messages_crossing(Level::Device)
}

#[test]
fn a_small_communicator_sends_one_round_of_counts_then_the_data() {
    for spec in ["nodes:1x4", "nodes:2x2", "nodes:4x2"] {
        let n = Topology::preset(spec).unwrap().size() as u64;
        for nonblocking in [false, true] {
            let messages = run(spec, nonblocking);
            println!("{spec} (non-blocking: {nonblocking}): {messages} messages");
            // n - 1 messages of counts per rank, then n - 1 of data (the flat fan-out);
            // three passes would be 3 n (n - 1) with the flat fan-out.
            assert_eq!(messages, 2 * n * (n - 1), "{spec}");
        }
    }
}
