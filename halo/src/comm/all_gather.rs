//! All-gather: [`Communicator::all_gather`] over the builders of
//! `halo_collectives::gather` (ring, recursive doubling, Bruck).

use super::{Communicator, call_of, exec_options, overlaps, sized};
use crate::error::{Error, Result};
use crate::policy::Built;
use halo_collectives::{AllGatherAlgorithm, Buffers, CallKind, build_all_gather};

impl Communicator {
    /// Forces an all-gather algorithm (`None`: automatic, the default). A forced
    /// algorithm that does not support the communicator's size (recursive doubling on
    /// a size that is not a power of two) gives way to the automatic choice. Every rank
    /// must make the same choice.
    pub fn set_all_gather_algorithm(&mut self, algorithm: Option<AllGatherAlgorithm>) {
        self.core.policy.forced_mut().all_gather = algorithm;
    }

    /// The forced all-gather algorithm, if any.
    pub fn all_gather_algorithm(&self) -> Option<AllGatherAlgorithm> {
        self.core.policy.forced().all_gather
    }

    /// All-gather (`ncclAllGather`): every rank's `send` lands at block `r` of every
    /// rank's `recv`, which holds `size() * send.len()` elements, rank `r`'s block at
    /// `r * send.len()`. Every rank must pass the same `send.len()`.
    ///
    /// The algorithm is ring for large totals and recursive doubling (or Bruck, when the
    /// size is not a power of two) for small ones, unless forced
    /// ([`Communicator::set_all_gather_algorithm`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `recv.len() != size() * send.len()` or the buffers
    /// overlap; [`Error::InvalidUsage`] when ranks pass different lengths (where the
    /// transport sees it; otherwise [`Error::Timeout`]); [`Error::Timeout`],
    /// [`Error::Aborted`], [`Error::RemoteError`] as they happen.
    pub fn all_gather<E: bytemuck::Pod>(&mut self, send: &[E], recv: &mut [E]) -> Result<()> {
        self.all_gather_as(CallKind::AllGather, send, recv)
    }

    /// [`Communicator::all_gather`] whose messages say they are part of a call of
    /// `kind` (a split's exchange is one).
    pub(super) fn all_gather_as<E: bytemuck::Pod>(
        &mut self,
        kind: CallKind,
        send: &[E],
        recv: &mut [E],
    ) -> Result<()> {
        let tag_base = self.core.next_tag_base();
        self.core.check_aborted()?;
        let n = self.size();
        if send.len().checked_mul(n) != Some(recv.len()) {
            return Err(Error::invalid_argument(format!(
                "all_gather: recv has {} elements, expected {n} ranks x {} elements",
                recv.len(),
                send.len()
            )));
        }
        let send: &[u8] = bytemuck::cast_slice(send);
        let recv: &mut [u8] = bytemuck::cast_slice_mut(recv);
        if overlaps(send.as_ptr(), send.len(), recv.as_ptr(), recv.len()) {
            return Err(Error::invalid_argument(
                "all_gather: send and receive buffers overlap (out-of-place only)",
            ));
        }
        let core = &mut self.core;
        let block = send.len();
        let algorithm = core.policy.all_gather(n, block);
        let rank = core.rank;
        let schedule = core.policy.built(Built::AllGather(algorithm, block), || {
            build_all_gather(algorithm, rank, n, block)
        })?;
        let scratch = sized(&mut core.ext.gather_scratch, schedule.scratch_len());
        let opts = exec_options(core.timeout, &core.abort);
        core.backend.run(
            schedule,
            tag_base,
            Buffers {
                send,
                recv,
                scratch,
                call: call_of(kind, block),
            },
            &opts,
        )?;
        Ok(())
    }
}
