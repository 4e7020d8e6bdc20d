//! The device path's program, and its CPU twin.
//!
//! On a device, NCCL / RCCL run point-to-point in groups with no tags: a schedule runs
//! as **waves** ([`halo_collectives::group_waves`]: each step in the first wave after
//! its dependencies', the two ends of a message in the same wave), each wave's copies
//! then one group of its sends and receives. Grouping needs every rank's schedule, so
//! a plan builds them all (the all-to-all-v first all-gathers the count matrix on the
//! host transport, which also makes every rank see any disagreement), groups them, and
//! proves the grouping sound with [`halo_collectives::verify_waves`] before anything
//! is enqueued — a device has no timeout to save a deadlocked group.
//!
//! [`Communicator::all_to_all_waves`] and [`Communicator::all_to_all_v_waves`] run the
//! same plan over the communicator's host transport ([`halo_collectives::SessionWaves`]:
//! the waves and copies, not NCCL), so grouping, ordering and byte placement are tested
//! byte-exact without a GPU. The device backend runs it in `transport::device`.

use super::all_to_all_v::Args;
use super::{Communicator, Core, Partition, exec_options, overlaps, sized};
use crate::error::{Error, Result};
use crate::policy::Ask;
use crate::transport::Program;
use halo_collectives::{
    Algorithm, BlockSizes, Buffers, BuildCtx, Layout, MatrixSizes, Schedule, UniformSizes, Waves,
    build, group_waves, verify_waves,
};
use std::sync::Arc;

/// One rank's schedule grouped into waves, proven sound for all ranks.
#[derive(Debug)]
pub(crate) struct WavePlan {
    /// This rank's schedule.
    pub(crate) schedule: Schedule,
    /// Its waves.
    pub(crate) waves: Waves,
}

/// Builds every rank's schedule, groups them into waves, proves the grouping sound and
/// returns rank `me`'s part.
fn plan<'l>(
    core: &Core,
    algorithm: Algorithm,
    layout: &dyn Fn(usize) -> Layout<'l>,
    sizes: &dyn BlockSizes,
) -> Result<WavePlan> {
    let n = core.size;
    let mut all = Vec::with_capacity(n);
    for rank in 0..n {
        let ctx = BuildCtx {
            topology: &core.topology,
            rank,
            layout: layout(rank),
            sizes,
            options: &core.options,
        };
        all.push(build(algorithm, &ctx)?);
    }
    let mut waves = group_waves(&all)?;
    verify_waves(&all, &waves).map_err(|e| {
        Error::internal(format!(
            "{algorithm}: grouping into waves is not sound ({e}); this is a bug in HALO"
        ))
    })?;
    let me = core.rank;
    Ok(WavePlan {
        waves: waves.swap_remove(me),
        schedule: all.swap_remove(me),
    })
}

impl Core {
    /// The plan of a uniform all-to-all of `block` bytes per pair (cached).
    pub(super) fn wave_plan_uniform(&mut self, block: usize) -> Result<Arc<WavePlan>> {
        let algorithm = self.choose(Ask::Waves { block })?.algorithm;
        if let Some((a, b, p)) = &self.ext.waves
            && *a == algorithm
            && *b == block
        {
            return Ok(Arc::clone(p));
        }
        let p = Arc::new(plan(
            self,
            algorithm,
            &|_| Layout::Uniform { block },
            &UniformSizes(block),
        )?);
        self.ext.waves = Some((algorithm, block, Arc::clone(&p)));
        self.last = Some(algorithm);
        Ok(p)
    }
}

impl Communicator {
    /// Checks an all-to-all-v's arguments on this rank (extents `send_len` / `recv_len`
    /// in elements), then all-gathers every rank's byte counts and displacements (send
    /// counts, send displacements, receive counts, receive displacements; all ones when
    /// its arguments are invalid) and checks every pair. Every rank sees the same
    /// table, so every rank fails alike: a rank with bad arguments with its own error,
    /// the ranks of a disagreeing pair naming each other and both sizes, the others
    /// naming the pair. Returns the send matrix (row = source, in bytes) and the table
    /// (a builder's program depends on the displacements too: a contiguous run of
    /// blocks is sent as it lies, a scattered one packed first).
    pub(super) fn exchange_counts(
        &mut self,
        args: &Args<'_>,
        pre: Result<()>,
    ) -> Result<(MatrixSizes, Vec<u64>)> {
        let (n, me) = (self.size(), self.rank());
        let local = pre.and_then(|()| self.validate_v(&[], &[], args));
        let mut row = vec![u64::MAX; 4 * n];
        if local.is_ok() {
            for q in 0..n {
                row[q] = self.pool.send_bytes[q] as u64;
                row[n + q] = self.pool.send_displs[q] as u64;
                row[2 * n + q] = self.pool.recv_bytes[q] as u64;
                row[3 * n + q] = self.pool.recv_displs[q] as u64;
            }
        }
        let mut all = vec![0u64; 4 * n * n];
        self.all_gather(&row, &mut all)?;
        local?;
        let at = |r: usize, i: usize| all[r * 4 * n + i];
        if let Some(bad) = (0..n).find(|&r| at(r, 0) == u64::MAX && at(r, 2 * n) == u64::MAX) {
            return Err(Error::InvalidUsage {
                peer: Some(bad),
                message: format!(
                    "all_to_all_v: rank {bad} passed invalid counts or displacements (it reports why)"
                ),
            });
        }
        for a in 0..n {
            for b in 0..n {
                let (sends, expects) = (at(a, b), at(b, 2 * n + a));
                if sends != expects {
                    let message = format!(
                        "all_to_all_v: rank {a} sends {sends} bytes to rank {b}, but rank {b} expects {expects} bytes from rank {a}"
                    );
                    let peer = if a == me { b } else { a };
                    return Err(Error::InvalidUsage {
                        peer: Some(peer),
                        message,
                    });
                }
            }
        }
        let m: Vec<usize> = (0..n)
            .flat_map(|a| (0..n).map(move |b| (a, b)))
            .map(|(a, b)| at(a, b) as usize)
            .collect();
        Ok((MatrixSizes::new(n, m), all))
    }

    /// The plan of an all-to-all-v over the agreed matrix `m` and every rank's layout
    /// (`table`, from [`Communicator::exchange_counts`]).
    pub(super) fn wave_plan_v(&mut self, m: &MatrixSizes, table: &[u64]) -> Result<WavePlan> {
        let n = self.size();
        let total: usize = (0..n).map(|r| m.row(r).iter().sum::<usize>()).sum();
        let block = (total / (n * n)).max(1);
        let algorithm = self.core.choose(Ask::Waves { block })?.algorithm;
        let rows: Vec<Vec<usize>> = (0..n)
            .map(|r| {
                table[r * 4 * n..(r + 1) * 4 * n]
                    .iter()
                    .map(|&x| x as usize)
                    .collect()
            })
            .collect();
        let layout = |r: usize| Layout::V {
            send_counts: &rows[r][..n],
            send_displs: &rows[r][n..2 * n],
            recv_counts: &rows[r][2 * n..3 * n],
            recv_displs: &rows[r][3 * n..],
        };
        let p = plan(&self.core, algorithm, &layout, m)?;
        self.core.last = Some(algorithm);
        Ok(p)
    }

    /// The device path's uniform all-to-all over this communicator's host transport
    /// (the CPU twin): the same schedules grouped into the same waves, each wave's
    /// copies then its messages posted together and waited for together. The bytes
    /// land as with [`Communicator::all_to_all`]; it exists to test the device path's
    /// grouping, ordering and placement without a GPU.
    ///
    /// # Errors
    /// As [`Communicator::all_to_all`].
    pub fn all_to_all_waves<E: bytemuck::Pod>(&mut self, send: &[E], recv: &mut [E]) -> Result<()> {
        let tag_base = self.core.next_tag_base();
        self.core.check_aborted()?;
        let n = self.size();
        if send.len() != recv.len() || !send.len().is_multiple_of(n) {
            return Err(Error::invalid_argument(format!(
                "all_to_all: send has {} elements and recv {}: both must be the same multiple of the {n} ranks",
                send.len(),
                recv.len()
            )));
        }
        let block = send.len() / n * std::mem::size_of::<E>();
        let send: &[u8] = bytemuck::cast_slice(send);
        let recv: &mut [u8] = bytemuck::cast_slice_mut(recv);
        if overlaps(send.as_ptr(), send.len(), recv.as_ptr(), recv.len()) {
            return Err(Error::invalid_argument(
                "all_to_all: send and receive buffers overlap (HALO is out-of-place only)",
            ));
        }
        let plan = self.core.wave_plan_uniform(block)?;
        let scratch = sized(&mut self.pool.scratch, plan.schedule.scratch_len());
        let core = &mut self.core;
        let opts = exec_options(core.timeout, &core.abort);
        core.backend.run_program(
            Program::Waves(&plan.schedule, &plan.waves),
            tag_base,
            Buffers {
                send,
                recv,
                scratch,
                call: super::call_of(halo_collectives::CallKind::AllToAll, block),
            },
            &opts,
        )?;
        Ok(())
    }

    /// The device path's all-to-all-v over this communicator's host transport (the CPU
    /// twin): the count matrix is all-gathered and checked, the schedules grouped into
    /// waves, and the waves run as in [`Communicator::all_to_all_waves`]. The bytes land
    /// as with [`Communicator::all_to_all_v`].
    ///
    /// # Errors
    /// As [`Communicator::all_to_all_v`] (every rank fails alike when one rank's
    /// arguments are wrong or a pair disagrees).
    pub fn all_to_all_v_waves<E: bytemuck::Pod>(
        &mut self,
        send: &[E],
        send_part: &Partition<'_>,
        recv: &mut [E],
        recv_part: &Partition<'_>,
    ) -> Result<()> {
        let args = Args::typed(send, send_part, recv, recv_part);
        let send: &[u8] = bytemuck::cast_slice(send);
        let recv: &mut [u8] = bytemuck::cast_slice_mut(recv);
        let pre = if overlaps(send.as_ptr(), send.len(), recv.as_ptr(), recv.len()) {
            Err(Error::invalid_argument(
                "all_to_all_v: send and receive buffers overlap (HALO is out-of-place only)",
            ))
        } else {
            Ok(())
        };
        let (m, table) = self.exchange_counts(&args, pre)?;
        let tag_base = self.core.next_tag_base();
        self.core.check_aborted()?;
        let plan = self.wave_plan_v(&m, &table)?;
        let scratch = sized(&mut self.pool.scratch, plan.schedule.scratch_len());
        let core = &mut self.core;
        let opts = exec_options(core.timeout, &core.abort);
        core.backend.run_program(
            Program::Waves(&plan.schedule, &plan.waves),
            tag_base,
            Buffers {
                send,
                recv,
                scratch,
                call: halo_collectives::Call::new(halo_collectives::CallKind::AllToAllV),
            },
            &opts,
        )?;
        Ok(())
    }
}
