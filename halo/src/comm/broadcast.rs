//! Broadcast: [`Communicator::broadcast`] over the builders of
//! `halo_collectives::build_broadcast` (binomial tree, pipelined chain).

use super::{Communicator, call_of, exec_options};
use crate::error::{Error, Result};
use crate::policy::{Built, Rooted};
use halo_collectives::{BroadcastAlgorithm, Buffers, CallKind, build_broadcast};

impl super::Core {
    /// Refuses a root out of range (`what` names the call).
    pub(super) fn check_root(&self, root: usize, what: &str) -> Result<()> {
        if root >= self.size {
            return Err(Error::invalid_argument(format!(
                "{what}: root {root} out of range for {} ranks",
                self.size
            )));
        }
        Ok(())
    }
}

impl Communicator {
    /// Forces a broadcast algorithm (`None`: automatic, the default). Every rank must
    /// make the same choice.
    pub fn set_broadcast_algorithm(&mut self, algorithm: Option<BroadcastAlgorithm>) {
        self.core.policy.forced_mut().broadcast = algorithm;
    }

    /// The forced broadcast algorithm, if any.
    pub fn broadcast_algorithm(&self) -> Option<BroadcastAlgorithm> {
        self.core.policy.forced().broadcast
    }

    /// Broadcast (`ncclBroadcast`, in place): `buf` of rank `root` is copied into
    /// `buf` of every other rank. Every rank passes the same `root` and length.
    ///
    /// A binomial tree up to [`halo_collectives::BROADCAST_SMALL`] bytes, a pipelined
    /// chain of 64 KiB chunks above, unless forced
    /// ([`Communicator::set_broadcast_algorithm`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `root` is out of range; [`Error::InvalidUsage`]
    /// when ranks pass different lengths (on the ranks that exchange with the one that
    /// differs; the others may complete, or time out waiting for it);
    /// [`Error::Timeout`], [`Error::Aborted`], [`Error::RemoteError`] as they happen.
    pub fn broadcast<E: bytemuck::Pod>(&mut self, buf: &mut [E], root: usize) -> Result<()> {
        let tag_base = self.core.next_tag_base();
        self.core.check_aborted()?;
        self.core.check_root(root, "broadcast")?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
        let core = &mut self.core;
        let (n, me, len) = (core.size, core.rank, bytes.len());
        let algorithm = core.policy.broadcast(n, len);
        let key = Built::Rooted(Rooted::Broadcast(algorithm), root, len);
        let opts = exec_options(core.timeout, &core.abort);
        let schedule = core
            .policy
            .built(key, || build_broadcast(algorithm, me, n, root, len))?;
        let (send, recv): (&[u8], &mut [u8]) = if me == root {
            (bytes, &mut [])
        } else {
            (&[], bytes)
        };
        core.backend.run(
            schedule,
            tag_base,
            Buffers {
                send,
                recv,
                scratch: super::sized(&mut self.pool.scratch, schedule.scratch_len()),
                call: call_of(CallKind::Broadcast, len).root(root),
            },
            &opts,
        )?;
        Ok(())
    }
}
