//! The one-pass count exchange without eager bytes: every rank all-gathers the rows
//! of counts (the direct exchange or a logarithmic all-gather) and checks the whole
//! matrix.

use super::wire::check_matrix;
use super::{MetaPlan, V_CALL};
use crate::comm::{Communicator, Core, cached_schedule, exec_options, sized};
use crate::error::Result;
use halo_collectives::{
    Algorithm, Buffers, BuildCtx, Layout, META_BLOCK, Schedule, UniformSizes, build,
    build_all_gather,
};

/// Every rank's schedule of the direct all-gather of `row`-byte rows: the flat fan-out
/// with rank `q`'s block at `q * row` of the receive buffer and the same `row` bytes of
/// the send buffer to everyone.
fn direct_gather(core: &Core, rank: usize, row: usize) -> halo_collectives::Result<Schedule> {
    let n = core.size;
    let counts = vec![row; n];
    let send_displs = vec![0; n];
    let recv_displs: Vec<usize> = (0..n).map(|q| q * row).collect();
    build(
        Algorithm::Flat,
        &BuildCtx {
            topology: &core.topology,
            rank,
            layout: Layout::V {
                send_counts: &counts,
                send_displs: &send_displs,
                recv_counts: &counts,
                recv_displs: &recv_displs,
            },
            sizes: &UniformSizes(row),
            options: &core.options,
        },
    )
}

/// The schedule of one all-gather plan for rank `rank`.
pub(super) fn gather_schedule(
    core: &Core,
    plan: MetaPlan,
    rank: usize,
    row: usize,
) -> halo_collectives::Result<Schedule> {
    match plan {
        MetaPlan::Gather(a) => build_all_gather(a, rank, core.size, row),
        _ => direct_gather(core, rank, row),
    }
}

impl Communicator {
    /// The one-pass count exchange: all-gathers the rows into `meta_recv` and checks
    /// every pair. Returns the total bytes all ranks send.
    pub(super) fn meta_gathered(
        &mut self,
        plan: MetaPlan,
        base: u64,
        local: Result<()>,
    ) -> Result<u64> {
        let (n, me) = (self.size(), self.rank());
        let row = n * META_BLOCK;
        self.fill_meta_row(local.is_ok());
        let core = &mut self.core;
        let pool = &mut self.pool;
        let schedule = cached_schedule(&mut pool.v.gather, plan, || {
            gather_schedule(core, plan, me, row)
        })?;
        let mr = sized(&mut pool.meta_recv, n * row);
        let scratch = sized(&mut pool.meta_scratch, schedule.scratch_len());
        let opts = exec_options(core.timeout, &core.abort);
        core.backend.run(
            schedule,
            base,
            Buffers {
                send: &pool.meta_send[..row],
                recv: mr,
                scratch,
                call: V_CALL,
            },
            &opts,
        )?;
        local?;
        check_matrix(mr, n, me).map(|(total, _)| total)
    }
}
