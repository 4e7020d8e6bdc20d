//! The data pass of all-to-all-v with the agreed sizes (what is left of every block
//! after the eager bytes and the remainders behind the counts): the algorithm the
//! communicator's policy chooses (`src/policy.rs`: forced, or measured per size class of
//! the mean block, [`crate::tune`]), the block sizes of
//! the forwarding algorithms from the gathered matrix or the metadata pass.

use super::V_CALL;
use super::wire::read_u64;
use crate::comm::{Communicator, Kind, exec_options, sized};
use crate::error::{Error, Result};
use crate::policy::Ask;
use halo_collectives::{Buffers, BuildCtx, KnownSizes, Layout, META_BLOCK, build};
use std::collections::HashMap;

impl Communicator {
    /// The data pass with the agreed sizes; `kind` says how the counts were exchanged
    /// (which algorithms may run: after a uniform metadata pass only that pass's
    /// algorithm may forward), `all` is the total bytes all ranks send.
    pub(super) fn data_pass(
        &mut self,
        base: u64,
        send: &[u8],
        recv: &mut [u8],
        kind: Kind,
        all: u64,
    ) -> Result<()> {
        let (n, me) = (self.size(), self.rank());
        let mean = usize::try_from(all / (n as u64 * n as u64)).unwrap_or(usize::MAX);
        // Automatic: measured per size class of the mean block (crate::tune), which
        // every rank knows alike (`all` comes from the gathered matrix or from every
        // rank's status block), so every rank picks from the same trial state.
        let meta = match kind {
            Kind::V(meta_alg) => Some(meta_alg),
            Kind::VGathered => None,
        };
        let choice = self.core.choose(Ask::AllToAllV { mean, meta })?;
        let candidates = [choice.algorithm];
        let core = &mut self.core;
        let pool = &mut self.pool;
        if kind == Kind::VGathered && candidates.iter().any(|a| a.forwards()) {
            // The whole send matrix, for the sizes of routed blocks.
            let row = n * META_BLOCK;
            let m = &pool.meta_recv[..n * row];
            pool.v.matrix.clear();
            pool.v.matrix.extend(
                (0..n * n).map(|i| read_u64(m, (i / n) * row + (i % n) * META_BLOCK) as usize),
            );
        }
        let layout = Layout::V {
            send_counts: &pool.send_bytes,
            send_displs: &pool.send_displs,
            recv_counts: &pool.recv_bytes,
            recv_displs: &pool.recv_displs,
        };
        let mut last_err = None;
        for alg in candidates {
            let started = std::time::Instant::now();
            let sizes = match kind {
                Kind::VGathered if alg.forwards() => {
                    KnownSizes::from_matrix(me, &pool.send_bytes, &pool.recv_bytes, &pool.v.matrix)
                }
                Kind::V(meta_alg) if alg.forwards() => {
                    let meta_schedule = core
                        .policy
                        .cached_schedule(meta_alg, META_BLOCK)
                        .ok_or_else(|| Error::internal("the metadata schedule left the cache"))?;
                    let routed = KnownSizes::routed_from_meta(meta_schedule, &pool.meta_scratch)?;
                    KnownSizes::new(me, &pool.send_bytes, &pool.recv_bytes, routed)
                }
                _ => KnownSizes::new(me, &pool.send_bytes, &pool.recv_bytes, HashMap::new()),
            };
            let ctx = BuildCtx {
                topology: &core.topology,
                rank: me,
                layout,
                sizes: &sizes,
                options: &core.options,
            };
            let schedule = match build(alg, &ctx) {
                Ok(s) => s,
                Err(e) if !choice.forced => {
                    // Built with uniform blocks on the first and last rank, it does not
                    // build with these sizes: the next call chooses without it.
                    core.policy.unusable(&choice, &e);
                    last_err = Some(e);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let scratch = sized(&mut pool.scratch, schedule.scratch_len());
            let opts = exec_options(core.timeout, &core.abort);
            core.backend.run(
                &schedule,
                base,
                Buffers {
                    send,
                    recv,
                    scratch,
                    call: V_CALL,
                },
                &opts,
            )?;
            core.last = Some(alg);
            if let Some(key) = choice.key.filter(|_| choice.trial) {
                self.record_trial(key, alg, started.elapsed())?;
            }
            return Ok(());
        }
        Err(match last_err {
            Some(e) => e.into(),
            None => Error::internal("no all-to-all-v algorithm builds on this topology"),
        })
    }
}
