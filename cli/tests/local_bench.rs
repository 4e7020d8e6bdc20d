//! The OSU-style benchmark library behind `halo bench`, with the ranks as threads.

use halo::Algorithm;
use halo::local::Emulation;
use halo::topology::Topology;
use halo_cli::bench::moe::MoeShape;
use halo_cli::bench::{self, BenchAlgo, BenchOptions, Op};

fn small(op: Op) -> BenchOptions {
    BenchOptions {
        op,
        algorithms: vec![
            BenchAlgo::Halo(Some(Algorithm::Flat)),
            BenchAlgo::Halo(Some(Algorithm::Halo)),
            BenchAlgo::Halo(None),
        ],
        min_size: 1,
        max_size: 64,
        iterations: Some(4),
        warmup: Some(1),
        validate: true,
        ..BenchOptions::default()
    }
}

fn topo() -> Topology {
    Topology::preset("nodes:2x2").unwrap()
}

#[test]
fn sizes_and_iterations_follow_osu() {
    let mut o = BenchOptions::default();
    assert_eq!(o.sizes().len(), 21); // 1 B .. 1 MiB
    assert_eq!(o.iterations_for(8192), (1000, 100));
    assert_eq!(o.iterations_for(16384), (100, 10));
    o.min_size = 3;
    o.max_size = 20;
    assert_eq!(o.sizes(), vec![4, 8, 16]);
    o.min_size = 0;
    assert_eq!(o.sizes(), vec![0, 1, 2, 4, 8, 16]);
    o.op = Op::Latency;
    assert_eq!(o.iterations_for(8), (10000, 1000));
    assert_eq!(Op::Latency.default_sizes(), (0, 4 << 20));
    o.op = Op::Bandwidth;
    assert_eq!(o.iterations_for(1 << 20), (20, 2));
}

#[test]
fn alltoall_rows_per_algorithm_and_size_validated() {
    let rows = bench::run_local_bench(&small(Op::AllToAll), &topo(), Emulation::on()).unwrap();
    assert_eq!(rows.len(), 3 * 7);
    for r in &rows {
        assert!(r.min_us <= r.avg_us && r.avg_us <= r.max_us, "{r:?}");
        assert!(r.min_us > 0.0 && r.bus_bw_gbs > 0.0, "{r:?}");
        assert_eq!((r.iterations, r.wrong, r.op), (4, 0, Op::AllToAll));
        let want = bench::bus_bandwidth(r.size, 4, r.avg_us * 1e-6);
        assert!((r.bus_bw_gbs - want).abs() < 1e-9);
    }
    assert_eq!(rows[0].algorithm, BenchAlgo::Halo(Some(Algorithm::Flat)));
    assert_eq!(rows[20].algorithm, BenchAlgo::Halo(None));
}

#[test]
fn alltoallv_moe_shaped_and_validated() {
    let mut o = small(Op::AllToAllV);
    o.moe = MoeShape {
        experts: 8,
        topk: 2,
        skew: 1.2,
        tokens: 64,
        ..MoeShape::default()
    };
    o.min_size = 0;
    o.max_size = 256;
    let rows = bench::run_local_bench(&o, &topo(), Emulation::off()).unwrap();
    assert_eq!(rows.len(), 3 * 10);
    assert!(rows.iter().all(|r| r.wrong == 0));
    // With a hidden size the sweep counts tokens and the label is the mean bytes per peer.
    o.moe.hidden = Some(16);
    o.min_size = 8;
    o.max_size = 8;
    let rows = bench::run_local_bench(&o, &topo(), Emulation::off()).unwrap();
    assert_eq!(rows[0].size, 8 * 2 * 32 / 4);
}

#[test]
fn latency_and_bandwidth_between_first_and_last_rank() {
    for op in [Op::Latency, Op::Bandwidth] {
        let mut o = small(op);
        o.min_size = 0;
        o.max_size = 4096;
        o.window = 8;
        let rows = bench::run_local_bench(&o, &topo(), Emulation::on()).unwrap();
        // One HALO path, whatever algorithms were asked for.
        assert_eq!(rows.len(), 14, "{op}");
        assert!(rows.iter().all(|r| r.algorithm == BenchAlgo::Halo(None)));
        assert!(rows.iter().all(|r| r.wrong == 0 && r.avg_us > 0.0));
        if op == Op::Bandwidth {
            let last = rows.last().unwrap();
            assert!((last.mb_per_s() - 4096.0 / last.avg_us).abs() < 1e-6);
        }
    }
}

#[test]
fn bad_options_are_clear_errors() {
    let one = Topology::preset("flat:1").unwrap();
    let e = bench::run_local_bench(&small(Op::Latency), &one, Emulation::off()).unwrap_err();
    assert!(
        e.to_string().contains("latency needs at least 2 ranks"),
        "{e}"
    );
    let mut o = small(Op::AllToAll);
    o.algorithms = vec![BenchAlgo::Mpi];
    let e = bench::run_local_bench(&o, &topo(), Emulation::off()).unwrap_err();
    assert!(e.to_string().contains("halo launch --mpi"), "{e}");
    let mut o = small(Op::AllToAllV);
    o.moe.topk = 0;
    let e = bench::run_local_bench(&o, &topo(), Emulation::off()).unwrap_err();
    assert!(e.to_string().contains("--topk 0"), "{e}");
    let mut o = small(Op::AllToAll);
    o.max_size = usize::MAX / 2;
    o.min_size = usize::MAX / 4;
    let e = bench::run_local_bench(&o, &topo(), Emulation::off()).unwrap_err();
    assert!(e.to_string().contains("overflows"), "{e}");
}
