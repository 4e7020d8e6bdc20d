//! All-to-all-v: the counts are exchanged first, so that every pair agrees on every
//! size — zeros included — before a byte of data moves, and bad arguments or a count
//! mismatch on any rank is an error on every rank: never a hang, never wrong bytes.
//!
//! A call is one or two metadata passes, then the data pass — or, where the counts are
//! exchanged directly (small communicators) and no block is larger than 512 KiB plus
//! the eager bytes, one round of messages that carries the data too (*eager* and
//! *remainders behind the counts*, below). Three collective sequence numbers are taken either way (the data
//! pass, when there is one, runs with the third), so the sequence stays aligned
//! whichever way a call went.
//!
//! **One metadata pass (the common case).** Each rank all-gathers its whole row of
//! counts: for every rank `q`, [`META_BLOCK`] (16) bytes `[bytes I send to q, bytes I
//! expect from q]` (`u64` little endian; `u64::MAX` throughout when this rank's own
//! arguments are invalid), `16 n` bytes in all. Every rank then holds the whole `n x n`
//! matrix, checks every pair itself and reaches the same decision as every other rank
//! without an agreement pass; the forwarding algorithms (Bruck, HALO, 2D) read the
//! sizes of the blocks they route from it ([`KnownSizes::from_matrix`]), so any
//! algorithm may run the data pass. The all-gather is the direct one-round exchange
//! (the flat fan-out: `n - 1` messages of `16 n` bytes per rank, against `2 (n - 1)`
//! messages of 16 bytes for the two passes below) or, where the model finds it
//! cheaper, recursive doubling or Bruck's all-gather.
//!
//! **Eager blocks: one pass of messages.** With the direct exchange the message from
//! rank `p` to rank `q` also carries the first `min(count, C)` bytes of `p`'s block for
//! `q`: `[p's row][data]`, `16 n + min(count, C)` bytes, which `q` takes with a
//! receive of *up to* `F = 16 n + C` bytes ([`Session::post_recv_up_to`], an MPI
//! receive's semantics: every transport tells the length that arrived) and checks
//! against the count in the row — another length is a size mismatch naming both ranks
//! (the ranks carry different `C`), a longer message than `F` one at the transport. So
//! a pair of small blocks sends few bytes whatever `C` is, and across hosts `C` is at
//! least [`EAGER_V_DIRECT`] (8 KiB: a network message saved is worth more than the
//! copy out of the count message; on one host, where it is not, `C` as learned).
//! Where the count messages take another algorithm (below) they are a uniform
//! all-to-all, padded to a *fixed* `F` bytes, `[p's row][data][zeros]`. `C` is
//! [`EAGER_V`] (1 KiB) on a communicator's first call and then *learned*: every rank
//! holds the same checked matrix after each call, so every rank computes the same `C`
//! for the next one ([`learn_eager`]): the largest block plus an eighth where that is at
//! most 4 KiB (so that the next step of an MoE layer, whose counts change a little, is
//! again one pass; down to 64 bytes, so that tiny blocks do not pad to 1 KiB), kept
//! while the blocks fit, back to 1 KiB when a block is larger than 4 KiB or when padding
//! every block to `C` would send over four times the data. `HALO_A2AV_EAGER=<bytes>`
//! (the same on every rank) or [`Communicator::set_eager_v`] fix `C` instead (0 turns
//! it off, at most [`EAGER_V_MAX`]); the logarithmic all-gathers and the three passes
//! carry none. Every rank checks the gathered rows exactly as without (the same
//! errors on every rank), then copies the eager parts into place.
//! [`Communicator::eager_v`] tells a communicator's `C`.
//!
//! **Remainders behind the counts.** A block of `count > C` bytes whose remainder
//! `count - C` is at most `S` ([`SPECULATE_V`], 512 KiB) goes in a second message
//! that its sender posts right behind the count message, without waiting for
//! anything. The receiver reads each count message as it lands ([`Session::read`]):
//! the sender's row says whether a remainder follows and its exact length, so the
//! receiver posts that receive at once — into its receive buffer where its own count
//! for the pair agrees, into scratch (dropped) where not, one such at a time in `S`
//! bytes of scratch; so no transport ever sees a length it did not expect and no
//! message is left unread, whatever the counts. Then every rank checks the matrix as
//! above. Every rank knows the whole matrix, so all decide alike: if no block exceeds
//! `C + S` the call is over (one round of messages, as Open MPI's `MPI_Alltoallv`;
//! [`Communicator::last_algorithm`] says `Flat`), otherwise the data pass runs for the
//! larger blocks' remainders only (counts `c - C`, displacements `d + C` on both
//! sides, and so in the matrix the forwarding algorithms read).
//! `HALO_A2AV_SPECULATE=<bytes>` or [`Communicator::set_speculate_v`] (the same on
//! every rank) change `S` (0: every remainder takes the data pass, as before); a forced
//! algorithm other than `Flat` carries every remainder in its data pass.
//!
//! **Count messages across hosts.** In automatic mode, when the last call's blocks all
//! fitted in `C` (so none is expected to need more), the count messages go a way that
//! sends fewer messages over the network than the direct exchange (`n - 1` per rank):
//! - across hosts of the same number of ranks, in **two hops** ([`hops`]): each
//!   rank sends one message per other host, to the rank of its own local index there
//!   (its row and its first bytes for each of that host's ranks), which hands each
//!   rank of its host its part in one message per host peer (the rows and first bytes
//!   it holds for it); the same host's ranks exchange directly. All unpadded (receives
//!   of up to a bound, every length checked against the rows the message carries), so
//!   `C` is learned up to 16 KiB there ([`EAGER_V_LEARN_MAX_UNPADDED`]) with no padding
//!   rule. 4 hosts x 2: 3 messages per rank over the network instead of 6;
//! - elsewhere (hosts of different sizes), as a uniform all-to-all of `F`-byte blocks
//!   (`[p's row][p's first bytes for q][zeros]`, padded) with the algorithm the cost
//!   model prefers for `F` bytes, where that is not the direct exchange (across hosts,
//!   for small `F`, HALO's hierarchical all-to-all).
//!
//! Remainders, if any, then take the data pass, and the next call goes direct with
//! its remainders behind the counts. Every rank decides alike (the topology and the
//! model are deterministic, the last call's matrix the same everywhere), and
//! [`Communicator::last_algorithm`] names the algorithm that carried the count
//! messages of a call without a data pass (`Halo` for the two hops). On one host the
//! count messages go direct. After a size mismatch a rank sends poison in place of
//! the second hops it has not sent, so that its host's ranks fail at once too.
//!
//! **Three passes (large communicators).** The gathered matrix is `16 n^2` bytes on
//! every rank: on a network it costs more than two latency-bound passes once `n` is a
//! few dozen (simulated on Frontier: 0.5-0.6x of the two passes at 8-16 ranks, 1.08x at
//! 32, 1.2x at 64, 1.7x at 128, 2.9x at 256; `cargo run --release -p halo-collectives
//! --example v_meta_crossover`, docs/bench/JOURNAL.md "All-to-all-v in one metadata
//! pass"). So for each communicator the first call compares, with the simulator
//! ([`halo_collectives::simulate`], deterministic, so every rank agrees), the best
//! all-gather of the rows against two uniform passes of 16 bytes with the automatic
//! algorithm, and gathers only where that is no slower, never above
//! [`GATHER_MAX_RANKS`]. `HALO_A2AV_GATHER_MAX=K` (the same on every rank) overrides
//! the model: gather up to `K` ranks, three passes above (0: always three passes). The
//! three passes:
//!
//! 1. **Metadata**: a uniform all-to-all of [`META_BLOCK`] bytes per pair, the same
//!    16 bytes to rank `q` as above. It runs with the data pass's algorithm when that
//!    one forwards other ranks' blocks, so that the forwarding ranks learn the sizes
//!    they will route ([`KnownSizes::routed_from_meta`]); otherwise with the automatic
//!    choice.
//! 2. **Agreement**: every rank checks both directions of each pair against what it
//!    received, then a uniform all-to-all of 16-byte status blocks (`[code u32, peer
//!    u32, total bytes this rank sends u64]`) tells every rank about every other.
//! 3. **Data** with the agreed sizes.
//!
//! **Errors**, alike both ways: if any rank had invalid arguments or any pair
//! disagrees, *every* rank returns an error — the two ranks of a disagreeing pair
//! [`Error::InvalidUsage`] naming each other and both counts, a rank with bad arguments
//! its own [`Error::InvalidArgument`], the others [`Error::InvalidUsage`] naming the
//! first rank (in rank order) that reported a problem. Nobody hangs, and the
//! communicator stays usable. The receive buffer of a failed call holds nothing of a
//! disagreeing pair's block; blocks of pairs that agreed may have landed already
//! (remainders behind the counts arrive before every count is known), as MPI leaves
//! a failed call's receive buffer undefined.
//!
//! **Automatic mode** measures ([`crate::tune`], the same tuner as the uniform
//! all-to-all's, with its own keys, asked through the communicator's policy,
//! `src/policy.rs`, once per call): the data pass's algorithm is chosen per size class
//! of the mean block over all pairs (total bytes / `n^2`) that the data pass moves —
//! after eager bytes, the remainders' — which every rank knows alike after either count
//! exchange (the gathered matrix, or every rank's total in the status blocks), so every
//! rank is at the same point of the same class's trials. A call that fails in the count
//! exchange fails on every rank before the data pass and records no trial; a call with
//! no data pass (every block eager) records none either. [`Communicator::tuned_v`]
//! tells what was measured and chosen.
//!
//! # Files
//! - `mod.rs`: the entry points ([`Communicator::all_to_all_v`], the C ABI's raw one,
//!   [`Communicator::eager_v`], [`Communicator::tuned_v`]), the arguments and their
//!   checks, the per-communicator state ([`VState`]) and the call itself, which picks
//!   the count exchange and then the data pass.
//! - [`knobs`]: the tuning constants, the environment (`HALO_A2AV_EAGER`,
//!   `HALO_A2AV_GATHER_MAX`, `HALO_A2AV_SPECULATE`, read through `halo_params`), the
//!   setters of `C` and `S` and the values in effect; [`learn_eager`].
//! - [`plan`]: which way a communicator exchanges its counts (the model) and how one
//!   call's count messages go.
//! - [`wire`]: the count rows and the gathered matrix (writing, reading, checking every
//!   pair) and the length of a count message (the error for another length).
//! - The count exchanges: [`agreed`] (the three passes' metadata and agreement
//!   passes), [`gathered`] (one all-gather of the rows), [`eager`] (one pass with the
//!   first bytes of every block), carried by [`direct`] (the driven direct exchange,
//!   remainders behind the counts) or [`hops`] (two hops across hosts) or a uniform
//!   all-to-all.
//! - [`data`]: the data pass; `tests.rs`: the tests of every way.
//!
//! The files use one another one way only: [`wire`] and [`knobs`] use none of the
//! others; [`agreed`], [`gathered`], [`direct`], [`hops`] and [`data`] use [`wire`];
//! [`plan`] uses [`gathered`], [`hops`] and [`knobs`]; [`eager`] uses [`plan`],
//! [`knobs`], [`direct`], [`hops`] and [`wire`]. They use this file's shared items
//! where they need them ([`V_CALL`], [`MetaPlan`], the fields of [`VState`]), and
//! this file's call uses the exchanges, the plan and the data pass.
//!
//! [`META_BLOCK`]: halo_collectives::META_BLOCK
//! [`KnownSizes::from_matrix`]: halo_collectives::KnownSizes::from_matrix
//! [`KnownSizes::routed_from_meta`]: halo_collectives::KnownSizes::routed_from_meta
//! [`Session::post_recv_up_to`]: halo_collectives::Session::post_recv_up_to
//! [`Session::read`]: halo_collectives::Session::read
//! [`EAGER_V`]: knobs::EAGER_V
//! [`EAGER_V_DIRECT`]: knobs::EAGER_V_DIRECT
//! [`EAGER_V_MAX`]: knobs::EAGER_V_MAX
//! [`EAGER_V_LEARN_MAX_UNPADDED`]: knobs::EAGER_V_LEARN_MAX_UNPADDED
//! [`GATHER_MAX_RANKS`]: knobs::GATHER_MAX_RANKS
//! [`learn_eager`]: knobs::learn_eager

mod agreed;
mod data;
mod direct;
mod eager;
mod gathered;
mod hops;
mod knobs;
mod plan;
#[cfg(test)]
mod tests;
mod wire;

pub use knobs::SPECULATE_V;

use super::all_to_all::{raw_slice, raw_slice_mut};
use super::{Communicator, Kind, Partition, overlaps};
use crate::error::{Error, Result};
use halo_collectives::{AllGatherAlgorithm, Call, CallKind, Schedule};

/// The descriptor every message of an all-to-all-v carries (its totals differ from rank
/// to rank: the count is carried only by the passes of a size every rank agrees on).
const V_CALL: Call = Call::new(CallKind::AllToAllV);

/// How a communicator exchanges all-to-all-v counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetaPlan {
    /// Metadata and agreement passes (three passes in all).
    Agreed,
    /// One all-gather of the rows, direct: every rank sends its row to every rank.
    Direct,
    /// One all-gather of the rows with a logarithmic algorithm.
    Gather(AllGatherAlgorithm),
}

/// Per-communicator state of the all-to-all-v count exchange.
#[derive(Debug, Default)]
pub(crate) struct VState {
    /// The plan, once chosen (the first call).
    plan: Option<MetaPlan>,
    /// Forced by a test (kept across [`VState::reset`]).
    forced: Option<MetaPlan>,
    /// The all-gather schedule of the plan (for `16 n`-byte rows).
    gather: Option<(MetaPlan, Schedule)>,
    /// The send matrix in bytes (row = source), for forwarding algorithms.
    matrix: Vec<usize>,
    /// Calls that took each way: (one metadata pass, three passes).
    pub(crate) calls: (u64, u64),
    /// Calls whose data all went with the counts (no data pass).
    pub(crate) eager_only: u64,
    /// Eager bytes per block fixed by [`Communicator::set_eager_v`] (kept across
    /// [`VState::reset`]).
    eager_forced: Option<usize>,
    /// Eager bytes per block learned from the last successful call
    /// ([`learn_eager`](knobs::learn_eager)).
    eager_learned: Option<usize>,
    /// The largest speculative remainder fixed by [`Communicator::set_speculate_v`]
    /// (kept across [`VState::reset`]).
    spec_forced: Option<usize>,
    /// The direct exchange's scratch: the `n` count messages out, the `n` in, then
    /// room for one speculative remainder to take and drop.
    stage: Vec<u8>,
    /// The largest block of the last successful call with eager bytes (the same on
    /// every rank).
    last_largest: Option<u64>,
    /// The driven direct exchange's bookkeeping, reused from call to call.
    drive: direct::DriveState,
    /// The two-hop exchange's, likewise.
    hops: hops::HopState,
}

impl VState {
    /// Forgets the plan and its schedule (the builder options changed).
    pub(crate) fn reset(&mut self) {
        self.plan = None;
        self.gather = None;
    }
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

impl<'a> Args<'a> {
    /// The arguments of a typed call: `send` and `recv` as `send_part` and `recv_part`
    /// cut them, elements of `E`.
    pub(super) fn typed<E>(
        send: &[E],
        send_part: &'a Partition<'_>,
        recv: &[E],
        recv_part: &'a Partition<'_>,
    ) -> Args<'a> {
        Args {
            send_len: send.len(),
            recv_len: recv.len(),
            send_counts: send_part.counts(),
            send_displs: send_part.displs(),
            recv_counts: recv_part.counts(),
            recv_displs: recv_part.displs(),
            elem: std::mem::size_of::<E>(),
        }
    }
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
        let args = Args::typed(send, send_part, recv, recv_part);
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

    /// What the automatic mode measured and chose for all-to-all-v data passes whose
    /// mean block over all pairs (total bytes the data pass moves for all ranks /
    /// `size()^2`: what is left of the blocks beyond the first
    /// [`Communicator::eager_v`] bytes of each, which go with the counts) is in the size
    /// class of `mean_block`, once the trials of that class are over and agreed on (see
    /// [`crate::tune`]); `None` before, when an algorithm is forced, or while every
    /// call's blocks all fit in the eager bytes (no data pass to measure). Kept apart
    /// from the uniform all-to-all's classes ([`Communicator::tuned`]).
    pub fn tuned_v(&self, mean_block: usize) -> Option<crate::tune::Tuned> {
        self.core.policy.tuned_v(mean_block)
    }

    /// How many bytes of each block all-to-all-v carries with the counts on this
    /// communicator: the first `min(count, eager_v())` bytes of every block travel in
    /// the count exchange, and a call whose blocks all fit is one pass of messages; the
    /// rest of larger blocks follows right behind the counts (up to
    /// [`Communicator::speculate_v`] bytes, in the same round) or in the data pass
    /// (whose automatic choice is measured by the mean of those remainders, see
    /// [`Communicator::tuned_v`]). 0 where
    /// the counts are gathered with a logarithmic algorithm or exchanged in three passes
    /// (large communicators), or with `HALO_A2AV_EAGER=0`; otherwise what
    /// [`Communicator::set_eager_v`] or `HALO_A2AV_EAGER` fixed (at most 1 MiB), or else
    /// what the next call will carry as learned from the last successful one (module
    /// documentation of all-to-all-v: 64 bytes to 4 KiB), 1024 bytes before any — and
    /// at least 8 KiB on a communicator across hosts whose next count messages go
    /// direct (unpadded). Chooses the communicator's way of exchanging the counts if no
    /// call has yet (deterministic: the same on every rank).
    pub fn eager_v(&mut self) -> usize {
        let plan = self.meta_plan();
        let eager = self.eager_for(plan);
        if eager == 0 {
            return 0;
        }
        let spec = self.speculate_v();
        match self.count_route(eager, spec) {
            Ok(r) => r.c,
            Err(_) => eager,
        }
    }

    /// Forces the way the counts are exchanged (`None`: the model's choice), for tests.
    #[cfg(test)]
    pub(crate) fn force_meta_plan(&mut self, plan: Option<MetaPlan>) {
        self.pool.v.forced = plan;
        self.pool.v.reset();
    }

    /// Calls of all-to-all-v so far that exchanged the counts in one pass and in two.
    #[cfg(test)]
    pub(crate) fn v_calls(&self) -> (u64, u64) {
        self.pool.v.calls
    }

    /// Calls of all-to-all-v so far whose data all went with the counts (one pass).
    #[cfg(test)]
    pub(crate) fn v_eager_only(&self) -> u64 {
        self.pool.v.eager_only
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
        let local = pre.and_then(|()| self.validate_v(send, recv, a));
        let plan = self.meta_plan();
        let eager = self.eager_for(plan);
        let (kind, all) = if plan == MetaPlan::Agreed {
            self.pool.v.calls.1 += 1;
            let (meta_alg, all) = self.meta_agreed(bases[0], bases[1], local)?;
            (Kind::V(meta_alg), all)
        } else if eager > 0 {
            self.pool.v.calls.0 += 1;
            let spec = self.speculate_v();
            let rest = self.meta_eager(bases[0], local, (eager, spec), send, recv)?;
            if rest == 0 {
                // Every block went whole with the counts: one pass of messages.
                self.pool.v.eager_only += 1;
                return Ok(());
            }
            (Kind::VGathered, rest)
        } else {
            self.pool.v.calls.0 += 1;
            let all = self.meta_gathered(plan, bases[0], local)?;
            (Kind::VGathered, all)
        };
        self.data_pass(bases[2], send, recv, kind, all)
    }
}
