//! Generates the tables of docs/SIMULATION.md (all numbers simulated).
//!
//! ```text
//! cargo run --release -p halo-collectives --example sim_table            # all tables
//! cargo run --release -p halo-collectives --example sim_table -- frontier # one machine
//! cargo run --release -p halo-collectives --example sim_table -- frontier-fifo # FIFO egress
//! cargo run --release -p halo-collectives --example sim_table -- one frontier:128 halo 65536 [fifo] [maxmin] [gap=2e-7]
//! cargo run --release -p halo-collectives --example sim_table -- scale 1024   # wall time, memory
//! cargo run --release -p halo-collectives --example sim_table -- sharing      # PS vs max-min
//! cargo run --release -p halo-collectives --example sim_table -- gap          # NIC gap sensitivity
//! cargo run --release -p halo-collectives --example sim_table -- fastnode     # intra-node share
//! cargo run --release -p halo-collectives --example sim_table -- variants     # 2 groups, all algos
//! cargo run --release -p halo-collectives --example sim_table -- moe          # all-to-all-v
//! ```

use halo_collectives::{
    AlgoOptions, Algorithm, CollectiveError, Egress, MoeSizes, Sharing, SimOptions, SimReport,
    Traffic, simulate_all_to_all,
};
use halo_topology::{Level, Topology, fmt_seconds};
use std::time::Instant;

fn sim(topo: &Topology, algo: Algorithm, block: usize, opts: &SimOptions) -> SimReport {
    simulate_all_to_all(topo, algo, Traffic::Uniform(block), opts)
        .unwrap_or_else(|e| panic!("{} {algo} {block}: {e}", topo.name()))
}

fn size_name(b: usize) -> String {
    if b >= 1 << 20 {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

/// Peak resident memory of this process, from /proc (Linux), in MiB.
fn peak_mib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

fn table(machine: &str, nodes: &[usize], sizes: &[usize], opts: &SimOptions) {
    println!("### {machine} (simulated)\n");
    println!("| nodes | ranks | bytes per peer | flat | halo | flat / halo |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut lo = f64::INFINITY;
    let mut hi: f64 = 0.0;
    for &n in nodes {
        let topo = Topology::preset(&format!("{machine}:{n}")).expect("preset");
        for &b in sizes {
            let f = sim(&topo, Algorithm::Flat, b, opts);
            let h = sim(&topo, Algorithm::Halo, b, opts);
            let r = f.time / h.time;
            lo = lo.min(r);
            hi = hi.max(r);
            println!(
                "| {n} | {} | {} | {} | {} | {r:.2}x |",
                topo.size(),
                size_name(b),
                fmt_seconds(f.time),
                fmt_seconds(h.time)
            );
        }
    }
    println!("\nSpeedup range (flat / halo): {lo:.2}x .. {hi:.2}x\n");
}

fn one(args: &[String]) {
    let topo = Topology::preset(&args[0]).expect("preset");
    let algo: Algorithm = args[1].parse().expect("algorithm");
    let block: usize = args[2].parse().expect("bytes per peer");
    let mut opts = SimOptions::default();
    for a in &args[3..] {
        match a.as_str() {
            "maxmin" => opts.sharing = Sharing::MaxMin,
            "fifo" => opts.egress = Egress::Fifo,
            g if g.starts_with("gap=") => opts.nic_gap = g[4..].parse().expect("seconds"),
            c if c.starts_with("chunk=") => opts.algo.chunk_bytes = c[6..].parse().expect("bytes"),
            other => panic!("unknown option '{other}' (maxmin, fifo, gap=SECONDS, chunk=BYTES)"),
        }
    }
    let t = Instant::now();
    let r = sim(&topo, algo, block, &opts);
    print!("{}", r.summary());
    println!(
        "wall {:.2} s, peak RSS {} MiB",
        t.elapsed().as_secs_f64(),
        peak_mib().unwrap_or(0)
    );
}

fn scale(nodes: usize) {
    let topo = Topology::preset(&format!("frontier:{nodes}")).expect("preset");
    for algo in [Algorithm::Flat, Algorithm::Halo] {
        let t = Instant::now();
        let r = sim(&topo, algo, 64 << 10, &SimOptions::default());
        println!(
            "frontier:{nodes} ({} ranks) {algo} 64 KiB: simulated {} | {} messages, {} events | wall {:.2} s, peak RSS {} MiB",
            topo.size(),
            fmt_seconds(r.time),
            r.messages(),
            r.events,
            t.elapsed().as_secs_f64(),
            peak_mib().unwrap_or(0)
        );
    }
}

fn sharing() {
    println!(
        "| topology | algorithm | bytes per peer | processor sharing | max-min | PS / max-min |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for preset in ["frontier:2", "frontier:4", "nodes:4x4", "dgx-h100:4"] {
        let topo = Topology::preset(preset).expect("preset");
        for algo in [Algorithm::Flat, Algorithm::Halo] {
            for b in [1 << 10, 64 << 10, 1 << 20] {
                let ps = sim(&topo, algo, b, &SimOptions::default());
                let mm = sim(
                    &topo,
                    algo,
                    b,
                    &SimOptions {
                        sharing: Sharing::MaxMin,
                        ..SimOptions::default()
                    },
                );
                println!(
                    "| {preset} | {algo} | {} | {} | {} | {:.3} |",
                    size_name(b),
                    fmt_seconds(ps.time),
                    fmt_seconds(mm.time),
                    ps.time / mm.time
                );
            }
        }
    }
}

fn variants() {
    // Every algorithm, and HALO aggregating at more levels, on a two-group Frontier slice.
    let topo = Topology::preset("frontier:256").expect("preset");
    println!("### frontier:256 (2 dragonfly groups, 2,048 ranks), 64 KiB per peer (simulated)\n");
    println!("| algorithm | time | network messages | busiest NIC | busiest group uplink |");
    println!("|---|---:|---:|---:|---:|");
    let deep = AlgoOptions {
        halo_levels: Some(vec![Level::Node, Level::Group]),
        ..AlgoOptions::default()
    };
    for (name, algo, algo_opts) in [
        ("flat", Algorithm::Flat, AlgoOptions::default()),
        ("halo (node)", Algorithm::Halo, AlgoOptions::default()),
        ("halo (node, group)", Algorithm::Halo, deep),
        ("halo2d", Algorithm::Halo2d, AlgoOptions::default()),
    ] {
        let opts = SimOptions {
            algo: algo_opts,
            ..SimOptions::default()
        };
        match simulate_all_to_all(&topo, algo, Traffic::Uniform(64 << 10), &opts) {
            Ok(r) => {
                let net: u64 = r
                    .levels
                    .iter()
                    .filter(|l| l.level > Level::Node)
                    .map(|l| l.messages)
                    .sum();
                let nic = r
                    .load(halo_collectives::ResourceClass::Nic)
                    .map_or(0.0, |l| l.busiest);
                let up = r
                    .load(halo_collectives::ResourceClass::Uplink(Level::Group))
                    .map_or(0.0, |l| l.busiest);
                println!(
                    "| {name} | {} | {net} | {} | {} |",
                    fmt_seconds(r.time),
                    fmt_seconds(nic),
                    fmt_seconds(up)
                );
            }
            Err(CollectiveError::Internal(e)) => println!("| {name} | not available: {e} | | | |"),
            Err(e) => panic!("{name}: {e}"),
        }
    }
    println!();
}

fn moe() {
    println!("### All-to-all-v, MoE-shaped (simulated)\n");
    println!("| topology | skew | flat | halo | flat / halo |");
    println!("|---|---:|---:|---:|---:|");
    for preset in ["frontier:16", "frontier:128"] {
        let topo = Topology::preset(preset).expect("preset");
        for skew in [0.0, 1.0] {
            // 256 experts, top-2, 4096 tokens per rank, hidden 5120 in bf16.
            let sizes = MoeSizes::new(topo.size(), 256, 2, skew, 4096, 5120 * 2, 7);
            let opts = SimOptions::default();
            let f = simulate_all_to_all(&topo, Algorithm::Flat, Traffic::V(&sizes), &opts)
                .expect("flat");
            let h = simulate_all_to_all(&topo, Algorithm::Halo, Traffic::V(&sizes), &opts)
                .expect("halo");
            println!(
                "| {preset} | {skew} | {} | {} | {:.2}x |",
                fmt_seconds(f.time),
                fmt_seconds(h.time),
                f.time / h.time
            );
        }
    }
    println!();
}

/// HALO / flat against the NIC's per-message gap, frontier:128.
fn gap() {
    let topo = Topology::preset("frontier:128").expect("preset");
    println!("### frontier:128: flat / halo against the NIC per-message gap (simulated)\n");
    println!("| NIC gap | 1 KiB flat | 1 KiB halo | ratio | 64 KiB flat | 64 KiB halo | ratio |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for g in [0.0, 0.2e-6, 0.5e-6, 1e-6, 2e-6] {
        let opts = SimOptions {
            nic_gap: g,
            ..SimOptions::default()
        };
        let mut row = format!("| {:.1} us |", g * 1e6);
        for b in [1 << 10, 64 << 10] {
            let f = sim(&topo, Algorithm::Flat, b, &opts);
            let h = sim(&topo, Algorithm::Halo, b, &opts);
            row += &format!(
                " {} | {} | {:.2}x |",
                fmt_seconds(f.time),
                fmt_seconds(h.time),
                f.time / h.time
            );
        }
        println!("{row}");
    }
    println!();
}

/// Where HALO's large-message time goes: the same runs with intra-node links 10x faster.
fn fastnode() {
    println!("### frontier:128, intra-node links as given and 10x faster (simulated)\n");
    println!(
        "| intra-node links | bytes per peer | flat | halo | flat / halo | halo busiest node-link ingress/egress |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let base = Topology::preset("frontier:128").expect("preset");
    let mut spec = base.to_spec();
    for l in ["package", "node"] {
        if let Some(c) = spec.links.get_mut(l) {
            c.bandwidth *= 10.0;
        }
    }
    let fast = spec.build().expect("spec");
    for (name, topo) in [("as given", &base), ("10x", &fast)] {
        for b in [64 << 10, 1 << 20] {
            let opts = SimOptions::default();
            let f = sim(topo, Algorithm::Flat, b, &opts);
            let h = sim(topo, Algorithm::Halo, b, &opts);
            let nl = h
                .load(halo_collectives::ResourceClass::Link(Level::Node))
                .map_or(0.0, |l| l.busiest);
            println!(
                "| {name} | {} | {} | {} | {:.2}x | {} |",
                size_name(b),
                fmt_seconds(f.time),
                fmt_seconds(h.time),
                f.time / h.time,
                fmt_seconds(nl)
            );
        }
    }
    println!();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<usize> = (10..=24).step_by(2).map(|p| 1usize << p).collect();
    let nodes = [16, 32, 64, 128];
    match args.first().map(String::as_str) {
        Some("one") => one(&args[1..]),
        Some("scale") => scale(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(128)),
        Some("sharing") => sharing(),
        Some("variants") => variants(),
        Some("moe") => moe(),
        Some("gap") => gap(),
        Some("fastnode") => fastnode(),
        Some("frontier") => table("frontier", &nodes, &sizes, &SimOptions::default()),
        Some("dgx-h100") => table("dgx-h100", &nodes, &sizes, &SimOptions::default()),
        Some("frontier-fifo") | Some("dgx-h100-fifo") => {
            let opts = SimOptions {
                egress: Egress::Fifo,
                ..SimOptions::default()
            };
            let machine = args[0].trim_end_matches("-fifo");
            println!("Egress: FIFO per port.\n");
            table(machine, &nodes, &sizes, &opts);
        }
        Some("nogap") => {
            let opts = SimOptions {
                nic_gap: 0.0,
                ..SimOptions::default()
            };
            table("frontier", &nodes, &sizes, &opts);
        }
        Some(other) => eprintln!("unknown mode '{other}'"),
        None => {
            table("frontier", &nodes, &sizes, &SimOptions::default());
            table("dgx-h100", &nodes, &sizes, &SimOptions::default());
        }
    }
}
