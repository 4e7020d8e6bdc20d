//! Link emulation of the in-process transport: messages take at least their modelled
//! time (lower bounds only: the machine is noisy and shared).

use halo::local::{self, Emulation, LocalCluster};
use halo::topology::Topology;
use halo::{Algorithm, select};
use std::time::{Duration, Instant};

/// One message across nodes: the all-to-all takes at least the modelled time of its
/// cross-node message.
#[test]
fn cross_node_message_takes_at_least_the_modelled_time() {
    let topo = Topology::preset("nodes:2x1").unwrap();
    let emu = Emulation::on().scaled(200.0);
    let block = 256 * 1024;
    let cluster = LocalCluster::new(topo.clone(), emu).unwrap();
    let modelled = cluster
        .modelled_time(0, 1, block)
        .max(cluster.modelled_time(1, 0, block));
    // 200 x (5 us latency + 0.2 us gap + 256 KiB at 12.5 GB/s) ~ 5.2 ms.
    assert!(modelled > Duration::from_millis(5), "{modelled:?}");
    let out = local::run(&topo, emu, |comm| {
        comm.set_algorithm(Some(Algorithm::Flat));
        let send = vec![comm.rank() as u8; 2 * block];
        let mut recv = vec![0u8; 2 * block];
        comm.barrier()?;
        let t = Instant::now();
        comm.all_to_all(&send, &mut recv)?;
        let took = t.elapsed();
        assert_eq!(recv[block], 1);
        assert_eq!(recv[0], 0);
        Ok(took)
    });
    for (r, x) in out.into_iter().enumerate() {
        let took = x.unwrap();
        println!("rank {r}: {took:?} (modelled {modelled:?})");
        assert!(
            took >= modelled,
            "rank {r}: {took:?} < modelled {modelled:?}"
        );
    }
}

/// Inside a node there is no NIC: the same message is modelled much faster.
#[test]
fn intra_node_is_modelled_faster_than_inter_node() {
    let c = LocalCluster::new(Topology::preset("nodes:2x2").unwrap(), Emulation::on()).unwrap();
    let intra = c.modelled_time(0, 1, 4096);
    let inter = c.modelled_time(0, 2, 4096);
    assert!(
        intra > Duration::ZERO && intra < inter,
        "{intra:?} vs {inter:?}"
    );
    let off = LocalCluster::new(Topology::preset("nodes:2x2").unwrap(), Emulation::off()).unwrap();
    assert_eq!(off.modelled_time(0, 2, 4096), Duration::ZERO);
}

/// Many small messages leaving a node serialise on its NIC: with a per-message gap g,
/// the 16 one-byte messages that leave each node of `nodes:2x4` in a flat all-to-all
/// cannot all arrive before 16 g plus the latency.
#[test]
fn small_messages_serialise_on_the_nic() {
    let topo = Topology::preset("nodes:2x4").unwrap();
    let gap = 100e-6;
    let emu = Emulation {
        enabled: true,
        scale: 1.0,
        nic_message_gap: gap,
    };
    let out = local::run(&topo, emu, |comm| {
        comm.set_algorithm(Some(Algorithm::Flat));
        let send = vec![1u8; comm.size()];
        let mut recv = vec![0u8; comm.size()];
        comm.barrier()?;
        let start = Instant::now();
        comm.all_to_all(&send, &mut recv)?;
        Ok((start, Instant::now()))
    });
    let spans: Vec<(Instant, Instant)> = out.into_iter().map(|x| x.unwrap()).collect();
    let first = spans.iter().map(|s| s.0).min().unwrap();
    let last = spans.iter().map(|s| s.1).max().unwrap();
    let latency = topo.link(halo::topology::Level::System).latency;
    let bound = Duration::from_secs_f64(16.0 * gap + latency);
    let took = last - first;
    println!("flat 1-byte all-to-all on nodes:2x4 with g = 100 us: {took:?} (bound {bound:?})");
    assert!(took >= bound, "{took:?} < {bound:?}");
}

/// The cost model ranks HALO ahead of flat for small messages on a multi-node
/// topology, and every estimate is finite and positive.
#[test]
fn cost_model_prefers_aggregation_for_small_messages() {
    let topo = Topology::preset("nodes:4x4").unwrap();
    let ranked = select::ranked(&topo, 8);
    println!("{ranked:?}");
    for (a, t) in &ranked {
        assert!(t.is_finite() && *t > 0.0, "{a}: {t}");
    }
    let pos = |alg: Algorithm| ranked.iter().position(|(a, _)| *a == alg).unwrap();
    assert!(pos(Algorithm::Halo) < pos(Algorithm::Flat));
    // One node: HALO is the flat fan-out and costs the same.
    let one = Topology::preset("nodes:1x8").unwrap();
    assert_eq!(
        select::estimate(&one, Algorithm::Halo, 1024),
        select::estimate(&one, Algorithm::Flat, 1024)
    );
}
