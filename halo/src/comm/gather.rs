//! Gather: [`Communicator::gather`] over `halo_collectives::build_gather` (flat).

use super::{Communicator, call_of, exec_options, overlaps};
use crate::error::{Error, Result};
use crate::policy::{Built, Rooted};
use halo_collectives::{Buffers, CallKind, build_gather};

impl Communicator {
    /// Gather (`MPI_Gather`): every rank's `send` lands at block `r` of `recv` on rank
    /// `root`, which holds `size() * send.len()` elements (rank `r`'s block at `r *
    /// send.len()`). `recv` is used only at the root (pass `&mut []` elsewhere). Every
    /// rank passes the same `root` and `send.len()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `root` is out of range, at the root when
    /// `recv.len() != size() * send.len()` or the buffers overlap;
    /// [`Error::InvalidUsage`] when ranks pass different lengths (at the root and the
    /// rank that differs); [`Error::Timeout`], [`Error::Aborted`],
    /// [`Error::RemoteError`] as they happen.
    pub fn gather<E: bytemuck::Pod>(
        &mut self,
        send: &[E],
        recv: &mut [E],
        root: usize,
    ) -> Result<()> {
        let tag_base = self.core.next_tag_base();
        self.core.check_aborted()?;
        self.core.check_root(root, "gather")?;
        let core = &mut self.core;
        let (n, me) = (core.size, core.rank);
        let send: &[u8] = bytemuck::cast_slice(send);
        let recv: &mut [u8] = if me == root {
            let recv: &mut [u8] = bytemuck::cast_slice_mut(recv);
            if send.len().checked_mul(n) != Some(recv.len()) {
                return Err(Error::invalid_argument(format!(
                    "gather: recv has {} bytes at the root, expected {n} ranks x {} bytes",
                    recv.len(),
                    send.len()
                )));
            }
            if overlaps(send.as_ptr(), send.len(), recv.as_ptr(), recv.len()) {
                return Err(Error::invalid_argument(
                    "gather: send and receive buffers overlap (out-of-place only)",
                ));
            }
            recv
        } else {
            &mut []
        };
        let block = send.len();
        let opts = exec_options(core.timeout, &core.abort);
        let key = Built::Rooted(Rooted::Gather, root, block);
        let schedule = core
            .policy
            .built(key, || build_gather(me, n, root, block))?;
        core.backend.run(
            schedule,
            tag_base,
            Buffers {
                send,
                recv,
                scratch: super::sized(&mut self.pool.scratch, schedule.scratch_len()),
                call: call_of(CallKind::Gather, block).root(root),
            },
            &opts,
        )?;
        Ok(())
    }
}
