//! Scatter: [`Communicator::scatter`] over `halo_collectives::build_scatter` (flat).

use super::{Communicator, call_of, exec_options, overlaps};
use crate::error::{Error, Result};
use crate::policy::{Built, Rooted};
use halo_collectives::{Buffers, CallKind, build_scatter};

impl Communicator {
    /// Scatter (`MPI_Scatter`): block `r` of `send` on rank `root` (`size() *
    /// recv.len()` elements, block `r` at `r * recv.len()`) lands in `recv` of rank
    /// `r`. `send` is used only at the root (pass `&[]` elsewhere). Every rank passes
    /// the same `root` and `recv.len()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `root` is out of range, at the root when
    /// `send.len() != size() * recv.len()` or the buffers overlap;
    /// [`Error::InvalidUsage`] when ranks pass different lengths (at the root and the
    /// rank that differs); [`Error::Timeout`], [`Error::Aborted`],
    /// [`Error::RemoteError`] as they happen.
    pub fn scatter<E: bytemuck::Pod>(
        &mut self,
        send: &[E],
        recv: &mut [E],
        root: usize,
    ) -> Result<()> {
        let tag_base = self.core.next_tag_base();
        self.core.check_aborted()?;
        self.core.check_root(root, "scatter")?;
        let core = &mut self.core;
        let (n, me) = (core.size, core.rank);
        let recv: &mut [u8] = bytemuck::cast_slice_mut(recv);
        let send: &[u8] = if me == root {
            let send: &[u8] = bytemuck::cast_slice(send);
            if recv.len().checked_mul(n) != Some(send.len()) {
                return Err(Error::invalid_argument(format!(
                    "scatter: send has {} bytes at the root, expected {n} ranks x {} bytes",
                    send.len(),
                    recv.len()
                )));
            }
            if overlaps(send.as_ptr(), send.len(), recv.as_ptr(), recv.len()) {
                return Err(Error::invalid_argument(
                    "scatter: send and receive buffers overlap (out-of-place only)",
                ));
            }
            send
        } else {
            &[]
        };
        let block = recv.len();
        let opts = exec_options(core.timeout, &core.abort);
        let key = Built::Rooted(Rooted::Scatter, root, block);
        let schedule = core
            .policy
            .built(key, || build_scatter(me, n, root, block))?;
        core.backend.run(
            schedule,
            tag_base,
            Buffers {
                send,
                recv,
                scratch: super::sized(&mut self.pool.scratch, schedule.scratch_len()),
                call: call_of(CallKind::Scatter, block).root(root),
            },
            &opts,
        )?;
        Ok(())
    }
}
