//! All-to-all-v: the counts are exchanged first, so that every pair agrees on every
//! size — zeros included — before a byte of data moves.
//!
//! One call is three passes, each with its own collective sequence number:
//!
//! 1. **Metadata**: a uniform all-to-all of [`META_BLOCK`] (16) bytes per pair; to rank
//!    `q` this rank sends `[bytes I send to q, bytes I expect from q]` (`u64` little
//!    endian; `u64::MAX` twice when this rank's own arguments are invalid). It runs with
//!    the data pass's algorithm when that one forwards other ranks' blocks, so that the
//!    forwarding ranks learn the sizes they will route
//!    ([`KnownSizes::routed_from_meta`]); otherwise with the automatic choice.
//! 2. **Agreement**: every rank checks both directions of each pair against what it
//!    received, then a uniform all-to-all of 16-byte status blocks (`[code u32, peer
//!    u32, total bytes this rank sends u64]`) tells every rank about every other. If any
//!    rank had invalid arguments or any pair disagrees, *every* rank returns an error:
//!    the two ranks of a disagreeing pair [`Error::InvalidUsage`] naming each other and
//!    both counts, a rank with bad arguments its own [`Error::InvalidArgument`], the
//!    others [`Error::InvalidUsage`] naming the rank that reported. Nobody hangs.
//! 3. **Data**: the schedule is built with the agreed sizes. In automatic mode the
//!    algorithm is chosen for the mean block size over all pairs (the status blocks
//!    carry every rank's total, so all ranks choose alike).

use super::all_to_all::{raw_slice, raw_slice_mut};
use super::{Communicator, Kind, Partition, class, exec_options, overlaps, sized};
use crate::error::{Error, Result};
use halo_collectives::{Algorithm, Buffers, BuildCtx, KnownSizes, Layout, META_BLOCK, build};
use std::collections::HashMap;

/// Status codes of the agreement pass.
const OK: u32 = 0;
const MISMATCH: u32 = 1;
const INVALID: u32 = 2;

const STATUS_BLOCK: usize = 16;

fn read_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The arguments of one call, in elements.
pub(super) struct Args<'a> {
    pub(super) send_len: usize,
    pub(super) recv_len: usize,
    pub(super) send_counts: &'a [usize],
    pub(super) send_displs: &'a [usize],
    pub(super) recv_counts: &'a [usize],
    pub(super) recv_displs: &'a [usize],
    pub(super) elem: usize,
}

impl Communicator {
    /// All-to-all-v: rank `q`'s block of `send` (as `send_part` cuts it) goes to rank
    /// `q`; the block from rank `q` lands where `recv_part` puts rank `q`'s block of
    /// `recv`. Counts and displacements are in elements; any count may be zero.
    ///
    /// ```
    /// use halo::Partition;
    /// use halo::local::{self, Emulation};
    /// use halo::topology::Topology;
    ///
    /// let topo = Topology::preset("flat:3").unwrap();
    /// let out = local::run(&topo, Emulation::off(), |comm| {
    ///     let (me, n) = (comm.rank(), comm.size());
    ///     // Rank `me` sends q + 1 copies of its rank to rank q.
    ///     let send_counts: Vec<usize> = (0..n).map(|q| q + 1).collect();
    ///     let send: Vec<u32> = vec![me as u32; send_counts.iter().sum()];
    ///     let recv_counts = vec![me + 1; n];
    ///     let mut recv = vec![0u32; (me + 1) * n];
    ///     comm.all_to_all_v(
    ///         &send,
    ///         &Partition::packed(&send_counts),
    ///         &mut recv,
    ///         &Partition::packed(&recv_counts),
    ///     )?;
    ///     Ok(recv)
    /// });
    /// assert_eq!(out[1].as_ref().unwrap(), &[0, 0, 1, 1, 2, 2]);
    /// ```
    ///
    /// The counts are exchanged first (see the module documentation of `comm::all_to_all_v`), so a
    /// pair of ranks that disagree is an error on every rank, not a hang.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the peer when a count or displacement is out of
    /// its buffer or overflows, when the counts or displacements do not have `size()`
    /// entries, when receive blocks overlap, or when the buffers overlap;
    /// [`Error::InvalidUsage`] when a pair disagrees on a count (on both ranks, naming
    /// the peer and both counts) or another rank reported a problem;
    /// [`Error::Timeout`], [`Error::Aborted`], [`Error::RemoteError`] as they happen.
    pub fn all_to_all_v<E: bytemuck::Pod>(
        &mut self,
        send: &[E],
        send_part: &Partition<'_>,
        recv: &mut [E],
        recv_part: &Partition<'_>,
    ) -> Result<()> {
        let args = Args {
            send_len: send.len(),
            recv_len: recv.len(),
            send_counts: send_part.counts(),
            send_displs: send_part.displs(),
            recv_counts: recv_part.counts(),
            recv_displs: recv_part.displs(),
            elem: std::mem::size_of::<E>(),
        };
        let send: &[u8] = bytemuck::cast_slice(send);
        let recv: &mut [u8] = bytemuck::cast_slice_mut(recv);
        self.v_bytes(send, recv, &args, Ok(()))
    }

    /// All-to-all-v over raw memory, for the C ABI. Counts and displacements are in
    /// elements of `elem_size` bytes; the buffers' extents are what the counts and
    /// displacements reach.
    ///
    /// Invalid counts still take part in the count exchange (so the other ranks fail
    /// too instead of waiting), and overlap is checked before any reference to the
    /// memory is made.
    ///
    /// # Safety
    /// `send` must be valid for reads and `recv` for writes of the bytes the counts and
    /// displacements reach (either may be null when that is zero), and no other thread
    /// may write `send` or access `recv` during the call.
    ///
    /// # Errors
    /// As [`Communicator::all_to_all_v`]; also [`Error::InvalidArgument`] for a null
    /// pointer with a non-zero extent.
    pub(crate) unsafe fn all_to_all_v_raw(
        &mut self,
        send: *const u8,
        send_part: &Partition<'_>,
        recv: *mut u8,
        recv_part: &Partition<'_>,
        elem_size: usize,
    ) -> Result<()> {
        let (send_counts, send_displs) = (send_part.counts(), send_part.displs());
        let (recv_counts, recv_displs) = (recv_part.counts(), recv_part.displs());
        let n = self.size();
        let extent = |counts: &[usize], displs: &[usize], what: &str| -> Result<usize> {
            if counts.len() != n || displs.len() != n {
                return Err(Error::invalid_argument(format!(
                    "all_to_all_v: {what} counts and displacements need {n} entries, not {} and {}",
                    counts.len(),
                    displs.len()
                )));
            }
            let mut end = 0usize;
            for q in 0..n {
                if counts[q] == 0 {
                    continue;
                }
                let e = displs[q]
                    .checked_add(counts[q])
                    .filter(|e| e.checked_mul(elem_size).is_some_and(|b| b <= isize::MAX as usize))
                    .ok_or_else(|| {
                        Error::invalid_argument_peer(
                            q,
                            format!(
                                "all_to_all_v: {what} block of rank {q} ({} + {} elements of {elem_size} bytes) overflows",
                                displs[q], counts[q]
                            ),
                        )
                    })?;
                end = end.max(e);
            }
            Ok(end)
        };
        let extents = extent(send_counts, send_displs, "send")
            .and_then(|s| extent(recv_counts, recv_displs, "recv").map(|r| (s, r)));
        let (send_len, recv_len, pre) = match extents {
            Ok((s, r)) => (s, r, Ok(())),
            Err(e) => (0, 0, Err(e)),
        };
        let (sb, rb) = (send_len * elem_size, recv_len * elem_size);
        let pre = pre.and_then(|()| {
            if overlaps(send, sb, recv, rb) {
                Err(Error::invalid_argument(
                    "all_to_all_v: send and receive buffers overlap (HALO is out-of-place only)",
                ))
            } else {
                Ok(())
            }
        });
        let (send_s, recv_s, pre) = match pre {
            // SAFETY: the caller guarantees `send` valid for reads of the bytes the counts
            // reach (`sb`), unwritten during the call.
            Ok(()) => match unsafe { raw_slice(send, sb, "send") } {
                // SAFETY: likewise `recv` for writes of `rb` bytes, exclusive; it does not
                // overlap `send` (checked above).
                Ok(s) => match unsafe { raw_slice_mut(recv, rb, "recv") } {
                    Ok(r) => (s, r, Ok(())),
                    Err(e) => (&[][..], &mut [][..], Err(e)),
                },
                Err(e) => (&[][..], &mut [][..], Err(e)),
            },
            Err(e) => (&[][..], &mut [][..], Err(e)),
        };
        let args = Args {
            send_len: if pre.is_ok() { send_len } else { 0 },
            recv_len: if pre.is_ok() { recv_len } else { 0 },
            send_counts,
            send_displs,
            recv_counts,
            recv_displs,
            elem: elem_size,
        };
        self.v_bytes(send_s, recv_s, &args, pre)
    }

    /// Checks this rank's arguments and fills the pooled byte counts and displacements.
    pub(super) fn validate_v(&mut self, send: &[u8], recv: &[u8], a: &Args<'_>) -> Result<()> {
        let n = self.size();
        for (name, v) in [
            ("send_counts", a.send_counts),
            ("send_displs", a.send_displs),
            ("recv_counts", a.recv_counts),
            ("recv_displs", a.recv_displs),
        ] {
            if v.len() != n {
                return Err(Error::invalid_argument(format!(
                    "all_to_all_v: {name} has {} entries for {n} ranks",
                    v.len()
                )));
            }
        }
        let pool = &mut self.pool;
        let sides = [
            (
                "send",
                a.send_counts,
                a.send_displs,
                a.send_len,
                &mut pool.send_bytes,
                &mut pool.send_displs,
            ),
            (
                "recv",
                a.recv_counts,
                a.recv_displs,
                a.recv_len,
                &mut pool.recv_bytes,
                &mut pool.recv_displs,
            ),
        ];
        for (what, counts, displs, len, out_bytes, out_displs) in sides {
            out_bytes.clear();
            out_displs.clear();
            for q in 0..n {
                let (c, d) = (counts[q], displs[q]);
                let end = d.checked_add(c).ok_or_else(|| {
                    Error::invalid_argument_peer(
                        q,
                        format!("all_to_all_v: {what}_displs[{q}] + {what}_counts[{q}] = {d} + {c} overflows"),
                    )
                })?;
                if c > 0 && end > len {
                    return Err(Error::invalid_argument_peer(
                        q,
                        format!(
                            "all_to_all_v: the {what} block of rank {q} (elements {d}..{end}) is outside the {what} buffer of {len} elements"
                        ),
                    ));
                }
                // Inside a slice, so these products fit.
                let (cb, db) = (c.checked_mul(a.elem), d.checked_mul(a.elem));
                match (cb, db) {
                    (Some(cb), Some(db)) => {
                        out_bytes.push(cb);
                        out_displs.push(if c == 0 { 0 } else { db });
                    }
                    _ => {
                        return Err(Error::invalid_argument_peer(
                            q,
                            format!(
                                "all_to_all_v: the {what} block of rank {q} in bytes overflows"
                            ),
                        ));
                    }
                }
            }
        }
        // Receive blocks must not overlap: each byte is written once.
        pool.order.clear();
        pool.order.extend(
            (0..n)
                .filter(|&q| pool.recv_bytes[q] > 0)
                .map(|q| (pool.recv_displs[q], pool.recv_bytes[q], q)),
        );
        pool.order.sort_unstable();
        for w in pool.order.windows(2) {
            let ((d0, c0, q0), (d1, _, q1)) = (w[0], w[1]);
            if d0 + c0 > d1 {
                return Err(Error::invalid_argument_peer(
                    q1,
                    format!("all_to_all_v: the receive blocks from ranks {q0} and {q1} overlap"),
                ));
            }
        }
        if overlaps(send.as_ptr(), send.len(), recv.as_ptr(), recv.len()) {
            return Err(Error::invalid_argument(
                "all_to_all_v: send and receive buffers overlap (HALO is out-of-place only)",
            ));
        }
        Ok(())
    }

    fn v_bytes(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        a: &Args<'_>,
        pre: Result<()>,
    ) -> Result<()> {
        let bases = [
            self.core.next_tag_base(),
            self.core.next_tag_base(),
            self.core.next_tag_base(),
        ];
        self.core.check_aborted()?;
        let (n, me) = (self.size(), self.rank());
        let local = pre.and_then(|()| self.validate_v(send, recv, a));

        // 1. Metadata pass.
        let forced = self.core.forced;
        let meta_alg = match forced {
            Some(alg) if alg.forwards() => alg,
            _ => self.core.prepare_uniform(None, META_BLOCK)?,
        };
        {
            let ms = sized(&mut self.pool.meta_send, n * META_BLOCK);
            for q in 0..n {
                let (s, r) = match local {
                    Ok(()) => (
                        self.pool.send_bytes[q] as u64,
                        self.pool.recv_bytes[q] as u64,
                    ),
                    Err(_) => (u64::MAX, u64::MAX),
                };
                ms[q * META_BLOCK..q * META_BLOCK + 8].copy_from_slice(&s.to_le_bytes());
                ms[q * META_BLOCK + 8..q * META_BLOCK + 16].copy_from_slice(&r.to_le_bytes());
            }
        }
        let ms = &self.pool.meta_send[..n * META_BLOCK];
        let mr = sized(&mut self.pool.meta_recv, n * META_BLOCK);
        self.core.uniform(
            Some(meta_alg),
            bases[0],
            ms,
            mr,
            META_BLOCK,
            &mut self.pool.meta_scratch,
        )?;

        // 2. Check both directions of every pair, then agree.
        let mut mismatch: Option<(usize, String)> = None;
        let mut total: u64 = 0;
        if local.is_ok() {
            for q in 0..n {
                let (their_send, their_expect) = (
                    read_u64(mr, q * META_BLOCK),
                    read_u64(mr, q * META_BLOCK + 8),
                );
                if their_send == u64::MAX && their_expect == u64::MAX {
                    continue; // rank q's own arguments are invalid: the status pass says so
                }
                let (my_send, my_expect) = (
                    self.pool.send_bytes[q] as u64,
                    self.pool.recv_bytes[q] as u64,
                );
                total = total.saturating_add(my_send);
                if mismatch.is_some() {
                    continue;
                }
                if my_send != their_expect {
                    mismatch = Some((
                        q,
                        format!(
                            "all_to_all_v: rank {me} sends {my_send} bytes to rank {q}, but rank {q} expects {their_expect} bytes from rank {me}"
                        ),
                    ));
                } else if their_send != my_expect {
                    mismatch = Some((
                        q,
                        format!(
                            "all_to_all_v: rank {q} sends {their_send} bytes to rank {me}, but rank {me} expects {my_expect} bytes from rank {q}"
                        ),
                    ));
                }
            }
        }
        let (code, peer) = match (&local, &mismatch) {
            (Err(_), _) => (INVALID, u32::MAX),
            (Ok(()), Some((q, _))) => (MISMATCH, *q as u32),
            (Ok(()), None) => (OK, u32::MAX),
        };
        {
            let ss = sized(&mut self.pool.status_send, n * STATUS_BLOCK);
            for q in 0..n {
                let b = &mut ss[q * STATUS_BLOCK..(q + 1) * STATUS_BLOCK];
                b[0..4].copy_from_slice(&code.to_le_bytes());
                b[4..8].copy_from_slice(&peer.to_le_bytes());
                b[8..16].copy_from_slice(&total.to_le_bytes());
            }
        }
        let ss = &self.pool.status_send[..n * STATUS_BLOCK];
        let sr = sized(&mut self.pool.status_recv, n * STATUS_BLOCK);
        self.core.uniform(
            Some(meta_alg),
            bases[1],
            ss,
            sr,
            STATUS_BLOCK,
            &mut self.pool.status_scratch,
        )?;
        local?;
        if let Some((q, message)) = mismatch {
            return Err(Error::InvalidUsage {
                peer: Some(q),
                message,
            });
        }
        let mut all: u64 = 0;
        for r in 0..n {
            let b = &sr[r * STATUS_BLOCK..(r + 1) * STATUS_BLOCK];
            let (code, peer) = (read_u32(b, 0), read_u32(b, 4));
            match code {
                OK => all = all.saturating_add(read_u64(b, 8)),
                MISMATCH => {
                    return Err(Error::InvalidUsage {
                        peer: Some(r),
                        message: format!(
                            "all_to_all_v: ranks {r} and {peer} disagree on the size of a block between them"
                        ),
                    });
                }
                _ => {
                    return Err(Error::InvalidUsage {
                        peer: Some(r),
                        message: format!("all_to_all_v: rank {r} passed invalid arguments"),
                    });
                }
            }
        }

        // 3. Data pass with the agreed sizes.
        let mean = usize::try_from(all / (n as u64 * n as u64)).unwrap_or(usize::MAX);
        let candidates: Vec<Algorithm> = match forced {
            Some(alg) => vec![alg],
            None => {
                let key = (Kind::V(meta_alg), class(mean));
                match self.core.chosen.get(&key) {
                    Some(&alg) => vec![alg],
                    None => self
                        .core
                        .selector
                        .candidates(&self.core.topology, &self.core.options, mean)
                        .into_iter()
                        .filter(|alg| !alg.forwards() || *alg == meta_alg)
                        .collect(),
                }
            }
        };
        let core = &mut self.core;
        let pool = &mut self.pool;
        let meta_schedule = &core
            .cache
            .iter()
            .find(|(alg, b, _)| *alg == meta_alg && *b == META_BLOCK)
            .ok_or_else(|| Error::internal("the metadata schedule left the cache"))?
            .2;
        let layout = Layout::V {
            send_counts: &pool.send_bytes,
            send_displs: &pool.send_displs,
            recv_counts: &pool.recv_bytes,
            recv_displs: &pool.recv_displs,
        };
        let mut last_err = None;
        for alg in candidates {
            let routed = if alg.forwards() {
                KnownSizes::routed_from_meta(meta_schedule, &pool.meta_scratch)?
            } else {
                HashMap::new()
            };
            let sizes = KnownSizes::new(me, &pool.send_bytes, &pool.recv_bytes, routed);
            let ctx = BuildCtx {
                topology: &core.topology,
                rank: me,
                layout,
                sizes: &sizes,
                options: &core.options,
            };
            let schedule = match build(alg, &ctx) {
                Ok(s) => s,
                Err(e) if forced.is_none() => {
                    core.selector.mark_unavailable(alg, &e);
                    last_err = Some(e);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            if forced.is_none() {
                core.chosen.insert((Kind::V(meta_alg), class(mean)), alg);
            }
            let scratch = sized(&mut pool.scratch, schedule.scratch_len());
            let opts = exec_options(core.timeout, &core.abort);
            core.backend.run(
                &schedule,
                bases[2],
                Buffers {
                    send,
                    recv,
                    scratch,
                    block: None,
                },
                &opts,
            )?;
            core.last = Some(alg);
            return Ok(());
        }
        Err(match last_err {
            Some(e) => e.into(),
            None => Error::internal("no all-to-all-v algorithm builds on this topology"),
        })
    }
}
