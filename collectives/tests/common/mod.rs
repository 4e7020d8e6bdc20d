//! Shared helpers: build every rank's schedule the way the runtime does.
#![allow(dead_code)]

use halo_collectives::{
    AlgoOptions, Algorithm, BuildCtx, KnownSizes, Layout, META_BLOCK, MatrixSizes, Result,
    Schedule, UniformSizes, build, verify_all_to_all,
};
use halo_topology::Topology;
use std::collections::HashMap;

/// Uniform all-to-all schedules for every rank.
pub(crate) fn build_uniform(
    algo: Algorithm,
    topo: &Topology,
    block: usize,
    options: &AlgoOptions,
) -> Result<Vec<Schedule>> {
    let sizes = UniformSizes(block);
    (0..topo.size())
        .map(|rank| {
            let ctx = BuildCtx {
                topology: topo,
                rank,
                layout: Layout::Uniform { block },
                sizes: &sizes,
                options,
            };
            build(algo, &ctx)
        })
        .collect()
}

/// All-to-all-v schedules for every rank, each built only from what that rank can
/// know at run time: its own counts and the sizes of the blocks the metadata pass
/// (the same algorithm, uniform) routed through it. The metadata pass is verified too.
pub(crate) fn build_v(
    algo: Algorithm,
    topo: &Topology,
    m: &MatrixSizes,
    options: &AlgoOptions,
) -> Result<Vec<Schedule>> {
    let n = topo.size();
    let meta = build_uniform(algo, topo, META_BLOCK, options)?;
    verify_all_to_all(&meta, topo, &UniformSizes(META_BLOCK)).expect("metadata pass verifies");
    let mut out = Vec::with_capacity(n);
    for (rank, meta) in meta.iter().enumerate() {
        let routed: HashMap<(u32, u32), usize> = meta
            .routed()
            .iter()
            .map(|b| ((b.src, b.dst), m.row(b.src as usize)[b.dst as usize]))
            .collect();
        let send = m.row(rank).to_vec();
        let recv = m.column(rank);
        let known = KnownSizes::new(rank, &send, &recv, routed);
        let (mut sd, mut rd) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut so, mut ro) = (0, 0);
        for q in 0..n {
            sd.push(so);
            so += send[q];
            rd.push(ro);
            ro += recv[q];
        }
        let layout = Layout::V {
            send_counts: &send,
            send_displs: &sd,
            recv_counts: &recv,
            recv_displs: &rd,
        };
        let ctx = BuildCtx {
            topology: topo,
            rank,
            layout,
            sizes: &known,
            options,
        };
        out.push(build(algo, &ctx)?);
    }
    Ok(out)
}

#[allow(unused_imports)] // not every test binary draws random inputs
pub(crate) use halo_test_support::Rng;
