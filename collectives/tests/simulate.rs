//! The simulator against hand-computed answers, determinism, and every algorithm on
//! several presets (uniform and -v).

use halo_collectives::{
    Algorithm, Buf, CollectiveError, Egress, MoeSizes, Region, ResourceClass, Schedule,
    ScheduleBuilder, Sharing, SimOptions, SimReport, Traffic, simulate, simulate_all_to_all,
};
use halo_topology::{Level, Topology, TopologySpec};

const MB: usize = 1_000_000;

/// Options without per-message gaps, so that answers are pure latency + bytes / bandwidth.
fn no_gap() -> SimOptions {
    SimOptions {
        nic_gap: 0.0,
        ..SimOptions::default()
    }
}

fn maxmin(o: &SimOptions) -> SimOptions {
    SimOptions {
        sharing: Sharing::MaxMin,
        ..o.clone()
    }
}

#[track_caller]
fn close(got: f64, want: f64) {
    assert!(
        (got - want).abs() <= 1e-9 * want.abs().max(1e-12),
        "got {got:e} s, want {want:e} s"
    );
}

/// A program per rank: `steps[r]` lists (step, deps) pushed in order.
enum S {
    Send(usize, u64, usize),
    Recv(usize, u64, usize),
    Copy(usize),
}

fn programs(n: usize, steps: Vec<Vec<(S, Vec<u32>)>>) -> Vec<Schedule> {
    steps
        .into_iter()
        .enumerate()
        .map(|(rank, list)| {
            let mut b = ScheduleBuilder::new(rank, n, "test");
            let mut at = 0;
            for (step, deps) in list {
                match step {
                    S::Send(peer, tag, len) => {
                        b.send(peer, tag, Region::new(Buf::Send, 0, len), &deps);
                    }
                    S::Recv(peer, tag, len) => {
                        b.recv(peer, tag, Region::new(Buf::Recv, at, len), &deps);
                        at += len;
                    }
                    S::Copy(len) => {
                        b.copy(
                            Region::new(Buf::Send, 0, len),
                            Region::new(Buf::Scratch, 0, len),
                            &deps,
                        );
                    }
                }
            }
            b.finish()
        })
        .collect()
}

fn both(topo: &Topology, s: &[Schedule], o: &SimOptions) -> SimReport {
    let ps = simulate(topo, s, o).unwrap();
    let mm = simulate(topo, s, &maxmin(o)).unwrap();
    assert_eq!(ps.rank_time.len(), mm.rank_time.len());
    for (a, b) in ps.rank_time.iter().zip(&mm.rank_time) {
        close(*a, *b);
    }
    ps
}

#[test]
fn one_message_on_one_link() {
    // nodes:2x1: one rank per host, one 12.5 GB/s NIC each, 5 us between hosts.
    let topo = Topology::preset("nodes:2x1").unwrap();
    let s = programs(
        2,
        vec![
            vec![(S::Send(1, 7, MB), vec![])],
            vec![(S::Recv(0, 7, MB), vec![])],
        ],
    );
    let r = both(&topo, &s, &no_gap());
    close(r.time, 5e-6 + 1e6 / 12.5e9); // 85 us
    close(r.rank_time[0], 85e-6);
    close(r.rank_time[1], 85e-6);
    assert_eq!(r.level(Level::System).messages, 1);
    assert_eq!(r.level(Level::System).bytes, MB as u64);
    assert_eq!(r.messages(), 1);
    // The NIC's per-message gap is paid on injection and on ejection, which overlap.
    let gap = SimOptions {
        nic_gap: 1e-6,
        ..SimOptions::default()
    };
    close(simulate(&topo, &s, &gap).unwrap().time, 86e-6);
    close(simulate(&topo, &s, &maxmin(&gap)).unwrap().time, 86e-6);

    // Inside a host: the node link, 5 GB/s and 1 us.
    let topo = Topology::preset("nodes:1x2").unwrap();
    let r = both(&topo, &s, &no_gap());
    close(r.time, 1e-6 + 1e6 / 5e9); // 201 us
    assert_eq!(r.level(Level::Node).messages, 1);
}

#[test]
fn zero_byte_message_costs_latency_and_gap() {
    let topo = Topology::preset("nodes:2x1").unwrap();
    let s = programs(
        2,
        vec![
            vec![(S::Send(1, 0, 0), vec![])],
            vec![(S::Recv(0, 0, 0), vec![])],
        ],
    );
    close(both(&topo, &s, &no_gap()).time, 5e-6);
    close(
        simulate(&topo, &s, &SimOptions::default()).unwrap().time,
        5.2e-6,
    );
}

#[test]
fn two_flows_sharing_a_nic() {
    // nodes:2x2: ranks 0 and 1 share host 0's NIC; 2 and 3 share host 1's.
    let topo = Topology::preset("nodes:2x2").unwrap();
    let s = programs(
        4,
        vec![
            vec![(S::Send(2, 0, MB), vec![])],
            vec![(S::Send(3, 0, MB), vec![])],
            vec![(S::Recv(0, 0, MB), vec![])],
            vec![(S::Recv(1, 0, MB), vec![])],
        ],
    );
    let r = both(&topo, &s, &no_gap());
    // Each at half of 12.5 GB/s: twice the time of one alone.
    for t in &r.rank_time {
        close(*t, 5e-6 + 2.0 * 80e-6);
    }
    let nic = r.load(ResourceClass::Nic).unwrap();
    close(nic.busiest, 2.0 * 80e-6);
    assert_eq!(nic.resources, 4);
}

#[test]
fn messages_to_one_peer_leave_in_order() {
    // Two messages from rank 0 to rank 1, both ready at once: the second leaves the
    // sender's NIC after the first (an ordered channel per peer), so they complete one
    // after the other instead of together.
    let topo = Topology::preset("nodes:2x1").unwrap();
    let s = programs(
        2,
        vec![
            vec![(S::Send(1, 1, MB), vec![]), (S::Send(1, 2, MB), vec![])],
            vec![(S::Recv(0, 1, MB), vec![]), (S::Recv(0, 2, MB), vec![])],
        ],
    );
    let r = simulate(&topo, &s, &no_gap()).unwrap();
    close(r.time, 5e-6 + 160e-6);
    // To two different peers they share the NIC and finish together at the same time.
    let topo = Topology::preset("nodes:3x1").unwrap();
    let s = programs(
        3,
        vec![
            vec![(S::Send(1, 1, MB), vec![]), (S::Send(2, 1, MB), vec![])],
            vec![(S::Recv(0, 1, MB), vec![])],
            vec![(S::Recv(0, 1, MB), vec![])],
        ],
    );
    let r = both(&topo, &s, &no_gap());
    close(r.rank_time[1], 165e-6);
    close(r.rank_time[2], 165e-6);
    // With a FIFO egress the NIC works through them one at a time, in program order.
    let fifo = SimOptions {
        egress: Egress::Fifo,
        ..no_gap()
    };
    let r = simulate(&topo, &s, &fifo).unwrap();
    close(r.rank_time[1], 85e-6);
    close(r.rank_time[2], 165e-6);
}

#[test]
fn dependency_chain_adds_up() {
    // Rank 0 sends twice, the second after the first; rank 1 receives both, then copies
    // 1 MB at its memory bandwidth (nodes: 10 GB/s, no latency).
    let topo = Topology::preset("nodes:2x1").unwrap();
    let s = programs(
        2,
        vec![
            vec![(S::Send(1, 1, MB), vec![]), (S::Send(1, 2, MB), vec![0])],
            vec![
                (S::Recv(0, 1, MB), vec![]),
                (S::Recv(0, 2, MB), vec![0]),
                (S::Copy(MB), vec![1]),
            ],
        ],
    );
    let r = both(&topo, &s, &no_gap());
    close(r.rank_time[0], 2.0 * 85e-6);
    close(r.rank_time[1], 2.0 * 85e-6 + 100e-6);
    assert_eq!(r.copies, 1);
    assert_eq!(r.copy_bytes, MB as u64);
}

#[test]
fn copy_at_device_bandwidth() {
    let s = programs(1, vec![vec![(S::Copy(MB), vec![]), (S::Copy(MB), vec![0])]]);
    // A commodity host copies at 10 GB/s; two copies in a chain add.
    let topo = Topology::preset("flat:1").unwrap();
    close(both(&topo, &s, &no_gap()).time, 200e-6);
    // A Frontier GCD copies at 1.6 TB/s.
    let topo = Topology::preset("frontier:1,ranks=1").unwrap();
    close(both(&topo, &s, &no_gap()).time, 2.0 * 1e6 / 1.6e12);
    // Two independent copies share the memory: both end at twice the time of one.
    let s = programs(1, vec![vec![(S::Copy(MB), vec![]), (S::Copy(MB), vec![])]]);
    let topo = Topology::preset("flat:1").unwrap();
    close(both(&topo, &s, &no_gap()).time, 200e-6);
    // Messages a rank sends itself are copies too.
    let s = programs(
        1,
        vec![vec![
            (S::Recv(0, 1, MB), vec![]),
            (S::Recv(0, 2, MB), vec![]),
            (S::Send(0, 1, MB), vec![]),
            (S::Send(0, 2, MB), vec![]),
        ]],
    );
    for egress in [Egress::Fair, Egress::Fifo] {
        let o = SimOptions { egress, ..no_gap() };
        let r = simulate(&topo, &s, &o).unwrap();
        close(r.time, 200e-6);
        assert_eq!(r.level(Level::Device).messages, 2);
    }
}

const TWO_GROUPS: &str = r#"
name = "two groups"
[links]
device = { bandwidth = 1.0e12, latency = 0.0 }
node   = { bandwidth = 1.0e11, latency = 1.0e-6 }
group  = { bandwidth = 2.5e10, latency = 2.0e-6 }
system = { bandwidth = 2.5e10, latency = 4.0e-6, taper = TAPER }
[[ranks]]
rank = 0
node = 0
group = 0
[[ranks]]
rank = 1
node = 1
group = 1
[[nics]]
name = "hsn0"
bandwidth = 2.5e10
ranks = [0]
[[nics]]
name = "hsn0"
bandwidth = 2.5e10
ranks = [1]
"#;

#[test]
fn taper_on_a_global_link() {
    let s = programs(
        2,
        vec![
            vec![(S::Send(1, 0, MB), vec![])],
            vec![(S::Recv(0, 0, MB), vec![])],
        ],
    );
    let topo = |taper: &str| {
        TopologySpec::from_toml_str(&TWO_GROUPS.replace("TAPER", taper))
            .unwrap()
            .build()
            .unwrap()
    };
    // Untapered: the 25 GB/s NIC is the limit.
    let flat = both(&topo("1.0"), &s, &no_gap());
    close(flat.time, 4e-6 + 1e6 / 25e9); // 44 us
    assert!(flat.load(ResourceClass::Uplink(Level::Group)).is_none());
    // Taper 2: the group's share of the global links is its 25 GB/s of NICs / 2.
    let tapered = both(&topo("2.0"), &s, &no_gap());
    close(tapered.time, 4e-6 + 1e6 / 12.5e9); // 84 us
    let up = tapered.load(ResourceClass::Uplink(Level::Group)).unwrap();
    close(up.busiest, 80e-6);
    assert_eq!(tapered.level(Level::System).messages, 1);

    // Frontier: frontier:129 is a full group and a group of one node (4 NICs, 100 GB/s
    // of injection, 100 / 1.75 GB/s of global links). The 8 GCDs of node 0 each send
    // 1 MB to the GCD of the same index on node 128: the NICs alone would take 80 us
    // (two flows per 25 GB/s NIC); the small group's global links take 8 MB at
    // 57.14 GB/s = 140 us.
    let topo = Topology::preset("frontier:129").unwrap();
    let n = topo.size();
    let mut steps: Vec<Vec<(S, Vec<u32>)>> = (0..n).map(|_| Vec::new()).collect();
    for i in 0..8 {
        steps[i].push((S::Send(1024 + i, 0, MB), vec![]));
        steps[1024 + i].push((S::Recv(i, 0, MB), vec![]));
    }
    let s = programs(n, steps);
    let r = simulate(&topo, &s, &no_gap()).unwrap();
    close(r.time, 4.5e-6 + 8e6 * 1.75 / 100e9);
    assert_eq!(r.level(Level::System).messages, 8);
}

#[test]
fn deterministic() {
    let topo = Topology::preset("frontier:4").unwrap();
    let sizes = MoeSizes::new(topo.size(), 64, 2, 1.0, 512, 256, 3);
    for algo in [Algorithm::Flat, Algorithm::Halo] {
        let o = SimOptions::default();
        let a = simulate_all_to_all(&topo, algo, Traffic::V(&sizes), &o).unwrap();
        let b = simulate_all_to_all(&topo, algo, Traffic::V(&sizes), &o).unwrap();
        assert_eq!(a, b);
        let a = simulate_all_to_all(&topo, algo, Traffic::Uniform(4096), &o).unwrap();
        let b = simulate_all_to_all(&topo, algo, Traffic::Uniform(4096), &o).unwrap();
        assert_eq!(a, b);
    }
}

#[test]
fn halo_beats_flat_on_frontier_16_at_1_kib() {
    let topo = Topology::preset("frontier:16").unwrap();
    let o = SimOptions::default();
    let flat = simulate_all_to_all(&topo, Algorithm::Flat, Traffic::Uniform(1024), &o).unwrap();
    let halo = simulate_all_to_all(&topo, Algorithm::Halo, Traffic::Uniform(1024), &o).unwrap();
    assert!(
        halo.time * 1.5 < flat.time,
        "halo {} vs flat {}",
        halo.time,
        flat.time
    );
    // Same bytes leave the nodes, in 8x fewer messages.
    let off = |r: &SimReport| -> (u64, u64) {
        r.levels
            .iter()
            .filter(|l| l.level > Level::Node)
            .fold((0, 0), |(m, b), l| (m + l.messages, b + l.bytes))
    };
    let (fm, fb) = off(&flat);
    let (hm, hb) = off(&halo);
    assert_eq!(fb, hb);
    assert_eq!(fm, 8 * hm);
}

/// Simulates, or returns None for a builder a colleague has not written yet.
fn try_sim(topo: &Topology, algo: Algorithm, t: Traffic<'_>) -> Option<SimReport> {
    match simulate_all_to_all(topo, algo, t, &SimOptions::default()) {
        Ok(r) => Some(r),
        Err(CollectiveError::Internal(m)) if m.contains("not written yet") => None,
        Err(e) => panic!("{} {algo}: {e}", topo.name()),
    }
}

#[track_caller]
fn sane(r: &SimReport, n: usize) {
    assert_eq!(r.rank_time.len(), n);
    assert!(r.time.is_finite());
    if n > 1 && r.bytes() > 0 {
        assert!(r.time > 0.0);
    }
    // Every resource works at most at its capacity.
    for l in &r.loads {
        assert!(
            r.time >= l.busiest * (1.0 - 1e-9),
            "{}: {} < {l:?}",
            r.algorithm,
            r.time
        );
    }
    let max = r.rank_time.iter().copied().fold(0.0, f64::max);
    assert_eq!(max, r.time);
}

#[test]
fn every_algorithm_completes_on_several_presets() {
    for preset in [
        "flat:1",
        "flat:5",
        "nodes:2x2",
        "nodes:4x4,ranks=14",
        "frontier:2",
        "frontier:5,ranks=37",
        "dgx-h100:3",
    ] {
        let topo = Topology::preset(preset).unwrap();
        let n = topo.size();
        let sizes = MoeSizes::new(n, 16, 2, 1.2, 64, 16, 11);
        for algo in Algorithm::ALL {
            if let Some(r) = try_sim(&topo, algo, Traffic::Uniform(1000)) {
                sane(&r, n);
                assert_eq!(r.algorithm, algo.name());
                if algo == Algorithm::Flat {
                    assert_eq!(r.bytes(), (n * (n - 1) * 1000) as u64);
                    assert_eq!(r.copy_bytes, (n * 1000) as u64);
                }
            }
            if let Some(r) = try_sim(&topo, algo, Traffic::V(&sizes)) {
                sane(&r, n);
            }
            let fifo = SimOptions {
                egress: Egress::Fifo,
                ..SimOptions::default()
            };
            if let Ok(r) = simulate_all_to_all(&topo, algo, Traffic::V(&sizes), &fifo) {
                sane(&r, n);
            }
            if let Some(r) = try_sim(&topo, algo, Traffic::Uniform(0)) {
                assert_eq!(r.time, 0.0, "{preset} {algo}: nothing to move");
            }
        }
    }
}

#[test]
fn processor_sharing_against_max_min() {
    // The approximation: independent processor sharing per resource against exact
    // max-min rates, on small all-to-alls. In symmetric traffic every flow on a
    // resource has the same bottleneck, and the two agree.
    for preset in ["frontier:2", "nodes:4x4"] {
        let topo = Topology::preset(preset).unwrap();
        for algo in [Algorithm::Flat, Algorithm::Halo] {
            for block in [1 << 10, 1 << 20] {
                let o = SimOptions::default();
                let t = Traffic::Uniform(block);
                let ps = simulate_all_to_all(&topo, algo, t, &o).unwrap();
                let mm = simulate_all_to_all(&topo, algo, t, &maxmin(&o)).unwrap();
                let ratio = ps.time / mm.time;
                // HALO rotates its send order per domain (against incast), which makes
                // its traffic less symmetric: there the two may differ by a few percent.
                let tolerance = if algo == Algorithm::Flat { 1e-6 } else { 0.1 };
                assert!(
                    (ratio - 1.0).abs() < tolerance,
                    "{preset} {algo} {block}: PS {} vs max-min {}",
                    ps.time,
                    mm.time
                );
            }
        }
    }
}

#[test]
fn where_processor_sharing_differs_from_max_min() {
    // nodes:6x1, 12.5 GB/s NICs. Rank 0 sends 1 MB to rank 1 (f) and 1 MB to rank 2
    // (g); ranks 3, 4, 5 also send 1 MB each to rank 1, whose NIC is the bottleneck.
    // Max-min: f gets a quarter of rank 1's NIC, so g takes the other three quarters
    // of rank 0's NIC and is done after 1 MB / 9.375 GB/s = 106.67 us. Processor sharing
    // splits rank 0's NIC in halves regardless, so g leaves it after 160 us. The
    // bottleneck, rank 1's NIC, drains 4 MB in 320 us in both.
    let topo = Topology::preset("nodes:6x1").unwrap();
    let mut steps: Vec<Vec<(S, Vec<u32>)>> = (0..6).map(|_| Vec::new()).collect();
    steps[0].push((S::Send(1, 0, MB), vec![]));
    steps[0].push((S::Send(2, 0, MB), vec![]));
    steps[2].push((S::Recv(0, 0, MB), vec![]));
    for src in [0, 3, 4, 5] {
        if src != 0 {
            steps[src].push((S::Send(1, 0, MB), vec![]));
        }
        steps[1].push((S::Recv(src, 0, MB), vec![]));
    }
    let s = programs(6, steps);
    let ps = simulate(&topo, &s, &no_gap()).unwrap();
    let mm = simulate(&topo, &s, &maxmin(&no_gap())).unwrap();
    close(ps.time, 5e-6 + 320e-6);
    close(mm.time, 5e-6 + 320e-6);
    close(mm.rank_time[2], 5e-6 + 1e6 / (0.75 * 12.5e9));
    close(ps.rank_time[2], 5e-6 + 160e-6);
}

#[test]
fn broken_schedules_are_errors() {
    let topo = Topology::preset("nodes:2x1").unwrap();
    let o = SimOptions::default();
    // A send nobody receives.
    let s = programs(2, vec![vec![(S::Send(1, 3, 8), vec![])], vec![]]);
    let e = simulate(&topo, &s, &o).unwrap_err();
    assert!(matches!(e, CollectiveError::InvalidUsage(_)), "{e}");
    assert!(e.to_string().contains("no matching receive"), "{e}");
    // A receive nobody sends.
    let s = programs(2, vec![vec![], vec![(S::Recv(0, 3, 8), vec![])]]);
    let e = simulate(&topo, &s, &o).unwrap_err();
    assert!(e.to_string().contains("sends no such message"), "{e}");
    // Sizes that differ.
    let s = programs(
        2,
        vec![
            vec![(S::Send(1, 3, 8), vec![])],
            vec![(S::Recv(0, 3, 9), vec![])],
        ],
    );
    let e = simulate(&topo, &s, &o).unwrap_err();
    assert!(e.to_string().contains("expects 9"), "{e}");
    // Each rank receives before it sends: a deadlock under rendezvous.
    let s = programs(
        2,
        vec![
            vec![(S::Recv(1, 0, 8), vec![]), (S::Send(1, 0, 8), vec![0])],
            vec![(S::Recv(0, 0, 8), vec![]), (S::Send(0, 0, 8), vec![0])],
        ],
    );
    let e = simulate(&topo, &s, &o).unwrap_err();
    assert!(e.to_string().contains("deadlock"), "{e}");
    // Schedules that do not fit the topology.
    let s = programs(1, vec![vec![]]);
    assert!(matches!(
        simulate(&topo, &s, &o).unwrap_err(),
        CollectiveError::InvalidArgument(_)
    ));
    let bad = SimOptions {
        nic_gap: -1.0,
        ..SimOptions::default()
    };
    assert!(simulate(&topo, &programs(2, vec![vec![], vec![]]), &bad).is_err());
}

#[test]
fn moe_sizes_are_a_deterministic_skewed_oracle() {
    use halo_collectives::BlockSizes;
    let uniform = MoeSizes::new(8, 8, 2, 0.0, 1000, 1, 5);
    let skewed = MoeSizes::new(8, 8, 2, 2.0, 1000, 1, 5);
    let col = |m: &MoeSizes, d| (0..8).map(|s| m.bytes(s, d)).sum::<usize>();
    let cols: Vec<usize> = (0..8).map(|d| col(&skewed, d)).collect();
    let (lo, hi) = (cols.iter().min().unwrap(), cols.iter().max().unwrap());
    assert!(
        *hi > 10 * lo.max(&1),
        "skew 2 concentrates traffic: {cols:?}"
    );
    for d in 0..8 {
        // 2000 choices per source spread over 8 ranks, jitter 0.5..1.5.
        let c = col(&uniform, d);
        assert!((8 * 125..=8 * 375).contains(&c), "{c}");
    }
    assert_eq!(
        skewed.bytes(3, 5),
        MoeSizes::new(8, 8, 2, 2.0, 1000, 1, 5).bytes(3, 5)
    );
}

/// One node of 3 ranks whose link matrix is `matrix` (one link: 50 GB/s, 1 us; the
/// node level's uniform figure 5 GB/s, 2 us).
fn node_of_3(matrix: &str) -> Topology {
    let toml = format!(
        "[links.device]\nbandwidth = 1e12\nlatency = 0.0\n\
         [links.node]\nbandwidth = 5e9\nlatency = 2e-6\n\
         [links.system]\nbandwidth = 1e9\nlatency = 5e-6\n\
         [[ranks]]\nrank = 0\nnode = 0\n[[ranks]]\nrank = 1\nnode = 0\n[[ranks]]\nrank = 2\nnode = 0\n\
         [node_links]\nmatrix = {matrix}\n\
         [node_links.link]\nbandwidth = 5e10\nlatency = 1e-6\n"
    );
    TopologySpec::from_toml_str(&toml).unwrap().build().unwrap()
}

#[test]
fn transfers_inside_a_node_cross_the_pairs_links() {
    // 0 - 1 two links, 1 - 2 one link, 0 - 2 none (routed over 1).
    let topo = node_of_3("[[0, 2, 0], [2, 0, 1], [0, 1, 0]]");
    let one = |from: usize, to: usize| {
        let mut steps: Vec<Vec<(S, Vec<u32>)>> = vec![vec![], vec![], vec![]];
        steps[from].push((S::Send(to, 1, MB), vec![]));
        steps[to].push((S::Recv(from, 1, MB), vec![]));
        both(&topo, &programs(3, steps), &no_gap())
    };
    // The node level's latency, the bytes at the route's thinnest link.
    close(one(0, 1).time, 2e-6 + 1e6 / 100e9);
    close(one(1, 2).time, 2e-6 + 1e6 / 50e9);
    let routed = one(0, 2);
    close(routed.time, 2e-6 + 1e6 / 50e9);
    let load = routed.load(ResourceClass::GpuLink).unwrap();
    assert_eq!(load.resources, 4, "two linked pairs, both directions");
    close(load.busiest, 1e6 / 50e9);
    // The uniform model: the node level's 5 GB/s for every pair.
    let uniform = topo.without_node_links();
    assert!(uniform.node_links().is_none());
    let mut steps: Vec<Vec<(S, Vec<u32>)>> = vec![vec![], vec![], vec![]];
    steps[0].push((S::Send(2, 1, MB), vec![]));
    steps[2].push((S::Recv(0, 1, MB), vec![]));
    let r = both(&uniform, &programs(3, steps), &no_gap());
    close(r.time, 2e-6 + 1e6 / 5e9);
    assert!(r.load(ResourceClass::GpuLink).is_none());
}

#[test]
fn a_routed_transfer_shares_the_link_it_crosses() {
    // 0 -> 2 routed over 1 and 1 -> 2 direct share the single link 1 -> 2: each gets
    // half, both finish together.
    let topo = node_of_3("[[0, 2, 0], [2, 0, 1], [0, 1, 0]]");
    let s = programs(
        3,
        vec![
            vec![(S::Send(2, 1, MB), vec![])],
            vec![(S::Send(2, 2, MB), vec![])],
            vec![(S::Recv(0, 1, MB), vec![]), (S::Recv(1, 2, MB), vec![])],
        ],
    );
    let r = both(&topo, &s, &no_gap());
    close(r.time, 2e-6 + 2e6 / 50e9);
    close(r.load(ResourceClass::GpuLink).unwrap().busiest, 2e6 / 50e9);
}

#[test]
fn frontier_node_all_to_all_is_bound_by_its_busiest_single_link() {
    // 8 GCDs, 16 MiB per pair: the fabric's routes put 4 transfers on a single 50 GB/s
    // link (NodeLinks::exchange_load); the uniform model has every GCD's 6 transfers
    // across packages share its one 50 GB/s node port.
    let s = 16 << 20;
    let topo = Topology::preset("frontier:1").unwrap();
    let links =
        simulate_all_to_all(&topo, Algorithm::Flat, Traffic::Uniform(s), &no_gap()).unwrap();
    let busiest = links.load(ResourceClass::GpuLink).unwrap().busiest;
    close(busiest, 4.0 * s as f64 / 50e9);
    assert!(
        links.time >= busiest && links.time < busiest * 1.01,
        "{}",
        links.summary()
    );
    let uniform = simulate_all_to_all(
        &topo.without_node_links(),
        Algorithm::Flat,
        Traffic::Uniform(s),
        &no_gap(),
    )
    .unwrap();
    let port = uniform
        .load(ResourceClass::Link(Level::Node))
        .unwrap()
        .busiest;
    close(port, 6.0 * s as f64 / 50e9);
    assert!(uniform.time >= port && uniform.time < port * 1.01);
}
