//! Reduce-scatter: [`Communicator::reduce_scatter`] as the ring plan of
//! `halo_collectives::reduce_scatter_plan`, run by the all-reduce's round runner over
//! a pooled copy of the send buffer.

use super::all_reduce::{reduction_call, run_rounds};
use super::{Communicator, overlaps};
use crate::comm::{ReduceOp, Reducible};
use crate::error::{Error, Result};
use halo_collectives::reduce_scatter_plan;
use std::time::Instant;

impl Communicator {
    /// Reduce-scatter (`ncclReduceScatter`): `send` holds `size() * recv.len()`
    /// elements; rank `r`'s `recv` becomes block `r` of `send` (elements `r * count ..
    /// (r+1) * count`, `count = recv.len()`) combined with `op` over every rank. Every
    /// rank must pass the same `recv.len()` and `op`.
    ///
    /// A ring of `size() - 1` rounds (bandwidth-optimal for any size); each block is
    /// reduced in an order fixed by the plan, so the bits are the same from run to run.
    /// [`ReduceOp::Avg`] divides the sum by `size()` at the end. The whole call honours
    /// the communicator's timeout.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `send.len() != size() * recv.len()` or the
    /// buffers overlap; [`Error::InvalidUsage`] when ranks pass different counts (where
    /// the transport sees it; otherwise [`Error::Timeout`]); [`Error::Timeout`],
    /// [`Error::Aborted`], [`Error::RemoteError`] as they happen.
    pub fn reduce_scatter<E: Reducible>(
        &mut self,
        send: &[E],
        recv: &mut [E],
        op: ReduceOp,
    ) -> Result<()> {
        let tag_base = self.core.next_tag_base();
        self.core.check_aborted()?;
        let (n, me, count) = (self.core.size, self.core.rank, recv.len());
        if count.checked_mul(n) != Some(send.len()) {
            return Err(Error::invalid_argument(format!(
                "reduce_scatter: send has {} elements, expected {n} ranks x {count} (recv)",
                send.len()
            )));
        }
        let (sb, rb) = (std::mem::size_of_val(send), std::mem::size_of_val(recv));
        if overlaps(send.as_ptr().cast(), sb, recv.as_ptr().cast(), rb) {
            return Err(Error::invalid_argument(
                "reduce_scatter: send and receive buffers overlap (out-of-place only)",
            ));
        }
        let start = Instant::now();
        let plan = reduce_scatter_plan(me, n, count)?;
        let mine = me * count..(me + 1) * count;
        if plan.is_empty() {
            recv.copy_from_slice(&send[mine]);
        } else {
            // The accumulator: a pooled copy of `send` (`u64` words: aligned for every
            // element type), lent out of the pool while the rounds borrow the core.
            let mut words = std::mem::take(&mut self.core.ext.reduce_scatter_acc);
            let need = sb.div_ceil(8);
            if words.len() < need {
                words.resize(need, 0);
            }
            let acc: &mut [E] = &mut bytemuck::cast_slice_mut::<u64, E>(&mut words)[..send.len()];
            acc.copy_from_slice(send);
            let r = run_rounds(
                &mut self.core,
                tag_base,
                &plan,
                acc,
                op,
                (
                    "reduce-scatter",
                    reduction_call::<E>(
                        halo_collectives::CallKind::ReduceScatter,
                        op,
                        count * std::mem::size_of::<E>(),
                    ),
                ),
                start,
            );
            if r.is_ok() {
                recv.copy_from_slice(&acc[mine]);
            }
            self.core.ext.reduce_scatter_acc = words;
            r?;
        }
        E::finish(op, recv, n);
        Ok(())
    }
}
