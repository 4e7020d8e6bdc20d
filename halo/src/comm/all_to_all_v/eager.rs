//! The one-pass count exchange with eager bytes: every count message carries its
//! sender's row and the first `min(count, C)` bytes of its block for the receiver,
//! sent directly ([`super::direct`], the remainders right behind), in two hops across
//! hosts ([`super::hops`]) or as a uniform all-to-all of padded blocks; then every rank
//! checks the matrix, learns the next call's `C` and leaves the rest for the data
//! pass.

use super::V_CALL;
use super::direct::speculated;
use super::knobs::learn_eager;
use super::plan::CountRoute;
use super::wire::{check_matrix, read_u64};
use crate::comm::{Communicator, sized};
use crate::error::Result;
use halo_collectives::META_BLOCK;

impl Communicator {
    /// The one-pass count exchange with the first `c` bytes of every block, and the
    /// remainders of up to `s` bytes right behind: one message of `F = 16 n + c` bytes
    /// per ordered pair (this rank's whole row of counts, then the first `min(count,
    /// c)` bytes of its block for the receiver, then zeros: a fixed size, so that no
    /// transport ever sees a length it did not expect, whatever the counts), and, for a
    /// block of `count > c` bytes with `count - c <= s`, a second message with the rest
    /// posted at once behind it ([`speculated`]). A receiver reads each count message as
    /// it lands: the sender's count for it says whether a remainder follows and its
    /// exact length, and the receiver takes it into its receive buffer where its own
    /// count agrees, into scratch (dropped) where not — so no message is left unread and
    /// no length is unexpected, whatever the counts. Every rank then checks the gathered
    /// matrix as [`Communicator::meta_gathered`] does (the same errors), copies the
    /// eager parts into `recv` and leaves the blocks not yet sent for the data pass: the
    /// pooled byte counts and displacements and the matrix in `meta_recv` then describe
    /// what is left per pair. Returns the total left over all pairs (0: nothing, on
    /// every rank alike).
    pub(super) fn meta_eager(
        &mut self,
        base: u64,
        local: Result<()>,
        (c, s): (usize, usize),
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<u64> {
        let (n, me) = (self.size(), self.rank());
        let row = n * META_BLOCK;
        let valid = local.is_ok();
        let learns = self.eager_learns();
        let hops_here = super::hops::applies(&self.core.topology);
        let c_learned = c;
        let CountRoute { routed, hops, c, s } = self.count_route(c, s)?;
        let f = row + c;
        self.fill_meta_row(valid);
        let core = &mut self.core;
        let pool = &mut self.pool;
        // Scratch: the count messages out at 0, in at `n f`, the dropped remainder at
        // `2 n f`.
        let stage = sized(&mut pool.v.stage, 2 * n * f + s);
        for (q, b) in stage[..n * f].chunks_exact_mut(f).enumerate() {
            b[..row].copy_from_slice(&pool.meta_send[..row]);
            // A rank with invalid arguments sends no data (its counts say so).
            let k = if valid { pool.send_bytes[q].min(c) } else { 0 };
            if k > 0 {
                let d = pool.send_displs[q];
                b[row..row + k].copy_from_slice(&send[d..d + k]);
            }
            if routed.is_some() && !hops {
                // A uniform all-to-all's blocks: padded, with zeros.
                b[row + k..].fill(0);
            }
        }
        if hops {
            self.meta_hops(base, c, valid, send, &mut *recv)?;
        } else if let Some(a) = routed {
            let (out, inn) = pool.v.stage[..2 * n * f].split_at_mut(n * f);
            core.uniform(
                a,
                base,
                out,
                inn,
                f,
                &mut pool.meta_scratch,
                V_CALL.count(f),
            )?;
        } else {
            self.meta_direct(base, (c, s), valid, send, &mut *recv)?;
        }
        let pool = &mut self.pool;
        let sr = &pool.v.stage[n * f..2 * n * f];
        let mr = sized(&mut pool.meta_recv, n * row);
        for (p, m) in mr.chunks_exact_mut(row).enumerate() {
            m.copy_from_slice(&sr[p * f..p * f + row]);
        }
        local?;
        let (total, largest) = check_matrix(mr, n, me)?;
        pool.v.last_largest = Some(largest);
        if learns {
            let max_block = usize::try_from(largest).unwrap_or(usize::MAX);
            let next = learn_eager(c_learned, max_block, total, n, hops_here);
            if next != c_learned {
                tracing::debug!(
                    rank = me,
                    eager = next,
                    max_block,
                    "all-to-all-v eager bytes learned"
                );
            }
            pool.v.eager_learned = Some(next);
        }
        // Every pair agrees: rank p sent min(recv_bytes[p], c) bytes of its block.
        for p in 0..n {
            let k = pool.recv_bytes[p].min(c);
            if k > 0 {
                let d = pool.recv_displs[p];
                recv[d..d + k].copy_from_slice(&sr[p * f + row..p * f + row + k]);
            }
        }
        // What is left for the data pass, alike on every rank from the same matrix: the
        // remainders that did not go right behind the counts.
        let left = |v: u64| -> u64 {
            if speculated(v, c, s).is_some() {
                0
            } else {
                v - v.min(c as u64)
            }
        };
        let mut rest: u64 = 0;
        for i in 0..n * n {
            let at = (i / n) * row + (i % n) * META_BLOCK;
            for at in [at, at + 8] {
                let v = left(read_u64(mr, at));
                mr[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            rest = rest.saturating_add(read_u64(mr, at));
        }
        for (bytes, displs) in [
            (&mut pool.send_bytes, &mut pool.send_displs),
            (&mut pool.recv_bytes, &mut pool.recv_displs),
        ] {
            for (b, d) in bytes.iter_mut().zip(displs.iter_mut()) {
                let l = left(*b as u64) as usize;
                *d = if l == 0 { 0 } else { *d + (*b - l) };
                *b = l;
            }
        }
        Ok(rest)
    }
}
