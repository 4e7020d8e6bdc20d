//! Point-to-point, all-gather, all-reduce and split on the [`Communicator`].
//!
//! # Tags
//!
//! A message tag is 64 bits. The low [`TAG_BITS`] (48) belong to the schedule; the 16
//! above them are the communicator's:
//!
//! ```text
//!  63       59  58   57        48 47                                0
//! +-----------+----+------------+-----------------------------------+
//! | comm id   |p2p | sequence   | schedule tag / p2p message number |
//! +-----------+----+------------+-----------------------------------+
//! ```
//!
//! - **comm id** (5 bits): 0 for a communicator made at init; a sub-communicator gets
//!   the lowest id that no member rank has in use (see [`Communicator::split`]), so two
//!   communicators that share a pair of ranks never share an id, and parent and
//!   children never match each other's messages.
//! - **sequence** (10 bits): collectives are called by every rank in the same order, so
//!   each call takes the next number of a per-communicator counter that all ranks
//!   advance together (one per call for all-gather, all-reduce and split — an
//!   all-reduce's rounds are told apart by the schedule tag — three for all-to-all-v).
//!   It wraps at 1024, far more than ranks of one communicator can drift apart.
//! - **p2p**: point-to-point calls are made by two ranks only, so they cannot take a
//!   sequence number. They set this bit (sequence 0) and number their messages per
//!   ordered pair: the k-th `send` from a to b carries k in the low 48 bits and
//!   matches the k-th `recv` at b from a, whatever the transport's ordering. A count
//!   advances only when its call succeeds, so a failed call, retried on both sides,
//!   matches again.

use super::{Communicator, Core, SEQ_BITS, exec_options, overlaps, sized};
use crate::error::{Error, Result};
use crate::transport::{Backend, MAX_COMMS};
use halo_collectives::{
    AllGatherAlgorithm, AllReduceAlgorithm, Buf, Buffers, Landing, Region, Schedule,
    ScheduleBuilder, TAG_BITS, all_reduce_plan, build_all_gather, exchange,
};
use halo_topology::Topology;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// The `color` that keeps a rank out of every sub-communicator in
/// [`Communicator::split`] (MPI's `MPI_UNDEFINED`, NCCL's `NCCL_SPLIT_NOCOLOR`).
pub const SPLIT_NOCOLOR: i32 = -1;

/// The point-to-point bit of a tag.
const P2P_FLAG: u64 = 1 << (TAG_BITS + SEQ_BITS);
/// Where the communicator id starts.
const COMM_SHIFT: u32 = TAG_BITS + SEQ_BITS + 1;
const _: () = assert!(1u64 << (64 - COMM_SHIFT) == MAX_COMMS as u64);
/// Point-to-point message numbers wrap at 2^48.
const P2P_COUNT_MASK: u64 = (1 << TAG_BITS) - 1;

/// A reduction operation for [`Communicator::all_reduce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceOp {
    /// Sum (integers wrap around, as in two's complement; `bf16`/`f16` are added in
    /// `f32` and rounded to nearest-even).
    Sum,
    /// Maximum (a NaN operand gives NaN).
    Max,
    /// Minimum (a NaN operand gives NaN).
    Min,
}

mod sealed {
    /// Keeps [`super::Reducible`] to the element types HALO implements it for.
    #[allow(unreachable_pub)]
    pub trait Sealed {}
}

/// Element types [`Communicator::all_reduce`] can reduce: `f32`, `f64`, `i32`, `i64`,
/// `u32`, `u64`, [`half::bf16`] and [`half::f16`], with every [`ReduceOp`].
pub trait Reducible: bytemuck::Pod + sealed::Sealed {
    /// Combines `other` into `acc` element by element: `acc[i] = other[i] ⊕ acc[i]` when
    /// `other_first`, else `acc[i] ⊕ other[i]`. The operand order is fixed by the
    /// algorithm, so every rank computes the same bits.
    fn reduce(op: ReduceOp, acc: &mut [Self], other: &[Self], other_first: bool);
}

fn combine<T: Copy>(acc: &mut [T], other: &[T], other_first: bool, f: impl Fn(T, T) -> T) {
    if other_first {
        for (a, &b) in acc.iter_mut().zip(other) {
            *a = f(b, *a);
        }
    } else {
        for (a, &b) in acc.iter_mut().zip(other) {
            *a = f(*a, b);
        }
    }
}

macro_rules! int_reducible {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Reducible for $t {
            fn reduce(op: ReduceOp, acc: &mut [Self], other: &[Self], other_first: bool) {
                match op {
                    ReduceOp::Sum => combine(acc, other, other_first, <$t>::wrapping_add),
                    ReduceOp::Max => combine(acc, other, other_first, <$t>::max),
                    ReduceOp::Min => combine(acc, other, other_first, <$t>::min),
                }
            }
        }
    )*};
}
int_reducible!(i32, i64, u32, u64);

/// Max (`>`) or min (`<`) of two floats: `a` when it wins or is NaN, else `b`, so a NaN
/// on either side gives NaN.
macro_rules! pick {
    ($t:ty, $cmp:tt) => {
        |a: $t, b: $t| if a $cmp b || a.is_nan() { a } else { b }
    };
}

macro_rules! float_reducible {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Reducible for $t {
            fn reduce(op: ReduceOp, acc: &mut [Self], other: &[Self], other_first: bool) {
                match op {
                    ReduceOp::Sum => combine(acc, other, other_first, |a, b| a + b),
                    ReduceOp::Max => combine(acc, other, other_first, pick!($t, >)),
                    ReduceOp::Min => combine(acc, other, other_first, pick!($t, <)),
                }
            }
        }
    )*};
}
float_reducible!(f32, f64);

macro_rules! half_reducible {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Reducible for $t {
            fn reduce(op: ReduceOp, acc: &mut [Self], other: &[Self], other_first: bool) {
                let via = |f: fn(f32, f32) -> f32| {
                    move |a: $t, b: $t| <$t>::from_f32(f(a.to_f32(), b.to_f32()))
                };
                match op {
                    ReduceOp::Sum => combine(acc, other, other_first, via(|a, b| a + b)),
                    ReduceOp::Max => combine(acc, other, other_first, via(pick!(f32, >))),
                    ReduceOp::Min => combine(acc, other, other_first, via(pick!(f32, <))),
                }
            }
        }
    )*};
}
half_reducible!(half::bf16, half::f16);

/// State of the collectives in this file, per communicator.
#[derive(Debug, Default)]
pub(super) struct Ext {
    /// Messages sent to / received from each rank (point-to-point).
    sent: Vec<u64>,
    received: Vec<u64>,
    /// Point-to-point messages this rank sent itself, in order.
    to_self: VecDeque<Vec<u8>>,
    /// All-reduce receive buffer (`u64` words: aligned for every element type).
    tmp: Vec<u64>,
    gather_scratch: Vec<u8>,
    /// The last all-gather schedule (algorithm, block bytes).
    gather: Option<(AllGatherAlgorithm, usize, Schedule)>,
    gather_forced: Option<AllGatherAlgorithm>,
    reduce_forced: Option<AllReduceAlgorithm>,
}

impl Core {
    fn check_peer(&self, peer: usize, what: &str) -> Result<()> {
        if peer >= self.size {
            return Err(Error::invalid_argument_peer(
                peer,
                format!("{what}: rank {peer} out of range for {} ranks", self.size),
            ));
        }
        Ok(())
    }
}

impl Communicator {
    /// Sends `buf` to rank `peer` (NCCL's `ncclSend`, MPI's `MPI_Send`), blocking until
    /// the transport is done with `buf`.
    ///
    /// Messages between a pair of ranks match in order: the k-th `send` from a to b
    /// meets the k-th [`Communicator::recv`] at b from a, which must have the same
    /// length (zero included: an empty message is sent and must be received). Only the
    /// two ranks take part.
    ///
    /// The in-process transport is rendezvous: a send completes when the receiver has
    /// taken the bytes, so two ranks that both `send` to each other first wait for each
    /// other until the timeout (as MPI_Send may). Use [`Communicator::send_recv`] for
    /// exchanges and rings. A send to this rank itself is buffered and completes at once.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `peer` is out of range; [`Error::InvalidUsage`]
    /// when the receiver expects another length; [`Error::Timeout`] naming `peer` when
    /// it does not receive within the communicator's timeout; [`Error::Aborted`],
    /// [`Error::RemoteError`] as they happen.
    pub fn send<E: bytemuck::Pod>(&mut self, buf: &[E], peer: usize) -> Result<()> {
        self.p2p(Some((bytemuck::cast_slice(buf), peer)), None)
    }

    /// Receives exactly `buf.len()` elements from rank `peer` (NCCL's `ncclRecv`),
    /// blocking until they are in `buf`. See [`Communicator::send`] for the matching
    /// rules; a receive from this rank itself takes the oldest message this rank sent
    /// itself, and fails at once when there is none.
    ///
    /// # Errors
    /// As [`Communicator::send`]; [`Error::Timeout`] names `peer` when nothing arrives.
    pub fn recv<E: bytemuck::Pod>(&mut self, buf: &mut [E], peer: usize) -> Result<()> {
        self.p2p(None, Some((bytemuck::cast_slice_mut(buf), peer)))
    }

    /// Sends `send` to `dst` and receives `recv` from `src` at the same time
    /// (`MPI_Sendrecv`): both are posted at once, so rings and pairwise exchanges do not
    /// deadlock. Each half follows the matching rules of [`Communicator::send`] and
    /// [`Communicator::recv`].
    ///
    /// # Errors
    /// As [`Communicator::send`] and [`Communicator::recv`]; [`Error::InvalidArgument`]
    /// when the buffers overlap.
    pub fn send_recv<E: bytemuck::Pod>(
        &mut self,
        send: &[E],
        dst: usize,
        recv: &mut [E],
        src: usize,
    ) -> Result<()> {
        let send: &[u8] = bytemuck::cast_slice(send);
        let recv: &mut [u8] = bytemuck::cast_slice_mut(recv);
        if overlaps(send.as_ptr(), send.len(), recv.as_ptr(), recv.len()) {
            return Err(Error::invalid_argument(
                "send_recv: send and receive buffers overlap",
            ));
        }
        self.p2p(Some((send, dst)), Some((recv, src)))
    }

    fn p2p(
        &mut self,
        send: Option<(&[u8], usize)>,
        recv: Option<(&mut [u8], usize)>,
    ) -> Result<()> {
        let core = &mut self.core;
        core.check_aborted()?;
        let (n, me) = (core.size, core.rank);
        if let Some((_, peer)) = send {
            core.check_peer(peer, "send")?;
        }
        if let Some((_, peer)) = &recv {
            core.check_peer(*peer, "recv")?;
        }
        let ext = &mut core.ext;
        if ext.sent.len() != n {
            ext.sent.resize(n, 0);
            ext.received.resize(n, 0);
        }
        // Messages to itself go through a queue: the transports reach only other ranks.
        let send = match send {
            Some((bytes, peer)) if peer == me => {
                ext.to_self.push_back(bytes.to_vec());
                None
            }
            other => other,
        };
        let recv = match recv {
            Some((buf, peer)) if peer == me => {
                let Some(msg) = ext.to_self.pop_front() else {
                    return Err(Error::InvalidUsage {
                        peer: Some(me),
                        message: format!(
                            "recv: rank {me} receives from itself but sent itself nothing"
                        ),
                    });
                };
                if msg.len() != buf.len() {
                    let got = msg.len();
                    ext.to_self.push_front(msg);
                    return Err(Error::InvalidUsage {
                        peer: Some(me),
                        message: format!(
                            "recv: rank {me} sent itself {got} bytes but receives {} bytes",
                            buf.len()
                        ),
                    });
                }
                buf.copy_from_slice(&msg);
                None
            }
            other => other,
        };
        let name = match (&send, &recv) {
            (None, None) => return Ok(()),
            (Some(_), None) => "send",
            (None, Some(_)) => "recv",
            (Some(_), Some(_)) => "send_recv",
        };
        let mut b = ScheduleBuilder::new(me, n, name);
        if let Some((buf, peer)) = &recv {
            let tag = ext.received[*peer] & P2P_COUNT_MASK;
            b.recv(*peer, tag, Region::new(Buf::Recv, 0, buf.len()), &[]);
        }
        if let Some((bytes, peer)) = &send {
            let tag = ext.sent[*peer] & P2P_COUNT_MASK;
            b.send(*peer, tag, Region::new(Buf::Send, 0, bytes.len()), &[]);
        }
        let schedule = b.finish();
        let (dst, src) = (send.as_ref().map(|s| s.1), recv.as_ref().map(|r| r.1));
        let bufs = Buffers {
            send: send.map_or(&[][..], |s| s.0),
            recv: match recv {
                Some((buf, _)) => buf,
                None => &mut [],
            },
            scratch: &mut [],
            block: None,
        };
        let opts = exec_options(core.timeout, &core.abort);
        core.backend
            .run(&schedule, core.comm_tag | P2P_FLAG, bufs, &opts)?;
        if let Some(d) = dst {
            core.ext.sent[d] = core.ext.sent[d].wrapping_add(1);
        }
        if let Some(s) = src {
            core.ext.received[s] = core.ext.received[s].wrapping_add(1);
        }
        Ok(())
    }

    /// Forces an all-gather algorithm (`None`: automatic, the default). A forced
    /// algorithm that does not support the communicator's size (recursive doubling on
    /// a size that is not a power of two) gives way to the automatic choice. Every rank
    /// must make the same choice.
    pub fn set_all_gather_algorithm(&mut self, algorithm: Option<AllGatherAlgorithm>) {
        self.core.ext.gather_forced = algorithm;
    }

    /// The forced all-gather algorithm, if any.
    pub fn all_gather_algorithm(&self) -> Option<AllGatherAlgorithm> {
        self.core.ext.gather_forced
    }

    /// Forces an all-reduce algorithm (`None`: automatic, the default). Every rank must
    /// make the same choice.
    pub fn set_all_reduce_algorithm(&mut self, algorithm: Option<AllReduceAlgorithm>) {
        self.core.ext.reduce_forced = algorithm;
    }

    /// The forced all-reduce algorithm, if any.
    pub fn all_reduce_algorithm(&self) -> Option<AllReduceAlgorithm> {
        self.core.ext.reduce_forced
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
        let algorithm = match core.ext.gather_forced {
            Some(a) if a.supports(n) => a,
            _ => AllGatherAlgorithm::auto(n, block),
        };
        let cached = matches!(&core.ext.gather, Some((a, b, _)) if *a == algorithm && *b == block);
        if !cached {
            let s = build_all_gather(algorithm, core.rank, n, block)?;
            core.ext.gather = Some((algorithm, block, s));
        }
        let Some((_, _, schedule)) = &core.ext.gather else {
            return Err(Error::internal("the all-gather schedule left its cache"));
        };
        let scratch = sized(&mut core.ext.gather_scratch, schedule.scratch_len());
        let opts = exec_options(core.timeout, &core.abort);
        core.backend.run(
            schedule,
            tag_base,
            Buffers {
                send,
                recv,
                scratch,
                block: None,
            },
            &opts,
        )?;
        Ok(())
    }

    /// All-reduce (`ncclAllReduce`): `recv[i]` becomes `send[i]` of every rank combined
    /// with `op`, on every rank. Every rank must pass the same length.
    ///
    /// Recursive doubling for small vectors, Rabenseifner (reduce-scatter by recursive
    /// halving, then all-gather) for large ones; sizes that are not a power of two fold
    /// their extra ranks in first (see [`halo_collectives::all_reduce_plan`]). Every
    /// rank gets the same bits: each reduction combines two partial results in a fixed
    /// order (the one covering lower ranks first), so partners in a recursive-doubling
    /// exchange compute the same expression, and in Rabenseifner every element is
    /// reduced on one rank and copied to the others. Floating-point results may differ
    /// in the last bits from a sequential sum in rank order, as with any parallel
    /// reduction.
    ///
    /// The whole call honours the communicator's timeout.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the lengths differ or the buffers overlap;
    /// [`Error::InvalidUsage`] when ranks pass different lengths (where the transport
    /// sees it; otherwise [`Error::Timeout`]); [`Error::Timeout`], [`Error::Aborted`],
    /// [`Error::RemoteError`] as they happen.
    pub fn all_reduce<E: Reducible>(
        &mut self,
        send: &[E],
        recv: &mut [E],
        op: ReduceOp,
    ) -> Result<()> {
        let tag_base = self.core.next_tag_base();
        self.core.check_aborted()?;
        if send.len() != recv.len() {
            return Err(Error::invalid_argument(format!(
                "all_reduce: send has {} elements but recv has {}",
                send.len(),
                recv.len()
            )));
        }
        let (sb, rb) = (std::mem::size_of_val(send), std::mem::size_of_val(recv));
        if overlaps(send.as_ptr().cast(), sb, recv.as_ptr().cast(), rb) {
            return Err(Error::invalid_argument(
                "all_reduce: send and receive buffers overlap (use all_reduce_in_place)",
            ));
        }
        recv.copy_from_slice(send);
        self.reduce_rounds(tag_base, recv, op)
    }

    /// [`Communicator::all_reduce`] in place (`MPI_IN_PLACE`): `buf` is this rank's
    /// input and becomes the result.
    ///
    /// # Errors
    /// As [`Communicator::all_reduce`].
    pub fn all_reduce_in_place<E: Reducible>(&mut self, buf: &mut [E], op: ReduceOp) -> Result<()> {
        let tag_base = self.core.next_tag_base();
        self.core.check_aborted()?;
        self.reduce_rounds(tag_base, buf, op)
    }

    fn reduce_rounds<E: Reducible>(
        &mut self,
        tag_base: u64,
        acc: &mut [E],
        op: ReduceOp,
    ) -> Result<()> {
        let start = Instant::now();
        let core = &mut self.core;
        let (n, me, len) = (core.size, core.rank, acc.len());
        let es = std::mem::size_of::<E>();
        let algorithm = core
            .ext
            .reduce_forced
            .unwrap_or_else(|| AllReduceAlgorithm::auto(n, len, len * es));
        let plan = all_reduce_plan(algorithm, me, n, len)?;
        let bytes = |r: &std::ops::Range<usize>| r.start * es..r.end * es;
        for round in &plan {
            let opts = exec_options(core.timeout.saturating_sub(start.elapsed()), &core.abort);
            let send = round.send.as_ref().map(|t| (t.peer, bytes(&t.range)));
            let region =
                |buf: Buf, at: usize, r: &std::ops::Range<usize>| Region::new(buf, at, r.len());
            let acc_bytes: &mut [u8] = bytemuck::cast_slice_mut(acc);
            match (&round.recv, round.landing) {
                (Some(v), Landing::Reduce { peer_first }) => {
                    let r = bytes(&v.range);
                    let words = r.len().div_ceil(8);
                    if core.ext.tmp.len() < words {
                        core.ext.tmp.resize(words, 0);
                    }
                    let tmp =
                        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut core.ext.tmp)[..r.len()];
                    let schedule = exchange(
                        me,
                        n,
                        "all-reduce",
                        round.tag,
                        send.map(|(p, s)| (p, region(Buf::Send, s.start, &s))),
                        Some((v.peer, region(Buf::Recv, 0, &r))),
                    );
                    core.backend.run(
                        &schedule,
                        tag_base,
                        Buffers {
                            send: acc_bytes,
                            recv: tmp,
                            scratch: &mut [],
                            block: None,
                        },
                        &opts,
                    )?;
                    let other: &[E] = bytemuck::cast_slice(
                        &bytemuck::cast_slice::<u64, u8>(&core.ext.tmp)[..r.len()],
                    );
                    E::reduce(op, &mut acc[v.range.clone()], other, peer_first);
                }
                (Some(v), Landing::Replace) => {
                    let r = bytes(&v.range);
                    // The received range and the sent range are disjoint parts of the
                    // accumulator: split it so both can be lent to the transport.
                    let (send_buf, recv_buf, s_region, r_region): (&[u8], &mut [u8], _, _) =
                        match &send {
                            None => (&[], acc_bytes, None, region(Buf::Recv, r.start, &r)),
                            Some((p, s)) if s.end <= r.start => {
                                let (lo, hi) = acc_bytes.split_at_mut(r.start);
                                (
                                    &*lo,
                                    hi,
                                    Some((*p, region(Buf::Send, s.start, s))),
                                    region(Buf::Recv, 0, &r),
                                )
                            }
                            Some((p, s)) if r.end <= s.start => {
                                let (lo, hi) = acc_bytes.split_at_mut(s.start);
                                (
                                    &*hi,
                                    lo,
                                    Some((*p, region(Buf::Send, 0, s))),
                                    region(Buf::Recv, r.start, &r),
                                )
                            }
                            Some(_) => {
                                return Err(Error::internal(format!(
                                    "all-reduce round {} receives into the range it sends",
                                    round.tag
                                )));
                            }
                        };
                    let schedule = exchange(
                        me,
                        n,
                        "all-reduce",
                        round.tag,
                        s_region,
                        Some((v.peer, r_region)),
                    );
                    core.backend.run(
                        &schedule,
                        tag_base,
                        Buffers {
                            send: send_buf,
                            recv: recv_buf,
                            scratch: &mut [],
                            block: None,
                        },
                        &opts,
                    )?;
                }
                (None, _) => {
                    let schedule = exchange(
                        me,
                        n,
                        "all-reduce",
                        round.tag,
                        send.map(|(p, s)| (p, region(Buf::Send, s.start, &s))),
                        None,
                    );
                    core.backend.run(
                        &schedule,
                        tag_base,
                        Buffers {
                            send: acc_bytes,
                            recv: &mut [],
                            scratch: &mut [],
                            block: None,
                        },
                        &opts,
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Splits this communicator (`MPI_Comm_split`, `ncclCommSplit`): the ranks that pass
    /// the same `color` form a new communicator, ordered by `key`, then by their rank
    /// here. A negative `color` ([`SPLIT_NOCOLOR`]) joins none and gets `None`. Every
    /// rank must call it (it is a collective: an all-gather of every rank's color and
    /// key).
    ///
    /// The new communicator's topology is this one's restricted to its members. It
    /// inherits the timeout, the forced algorithms and the builder options, and has its
    /// own abort handle and sequence numbers. It shares this rank's transport endpoint:
    /// no connection is opened; its messages carry its own communicator id in the tag,
    /// so it and this communicator (and any other split from it) never match each
    /// other's messages.
    ///
    /// Communicators split from one another (parents, children, siblings) may be used
    /// one after the other from one thread, or moved between threads, but not
    /// concurrently: an operation that finds the shared endpoint busy on another thread
    /// fails with [`Error::InvalidUsage`] rather than wait. At most 32 communicators can
    /// share a rank's endpoint at once; an id is free again when its communicator is
    /// dropped.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] when a member rank already has 32 communicators;
    /// errors of [`Communicator::all_gather`].
    pub fn split(&mut self, color: i32, key: i32) -> Result<Option<Communicator>> {
        let (n, me) = (self.size(), self.rank());
        let used = self.core.backend.share().ids_in_use();
        let mine = [color as u32, key as u32, used, 0];
        let mut all = vec![0u32; 4 * n];
        self.all_gather(&mine, &mut all)?;
        if color < 0 {
            return Ok(None);
        }
        let entry = |q: usize| (all[4 * q] as i32, all[4 * q + 1] as i32, all[4 * q + 2]);
        let mut members: Vec<usize> = (0..n).filter(|&q| entry(q).0 == color).collect();
        members.sort_by_key(|&q| (entry(q).1, q));
        let taken = members.iter().fold(0u32, |u, &q| u | entry(q).2);
        let id = (!taken).trailing_zeros();
        if id >= MAX_COMMS {
            return Err(Error::InvalidUsage {
                peer: None,
                message: format!(
                    "split: the ranks of color {color} already use {MAX_COMMS} communicators; drop some first"
                ),
            });
        }
        let rank = members
            .iter()
            .position(|&q| q == me)
            .ok_or_else(|| Error::internal("split: this rank is not among its color's members"))?;
        let topology = sub_topology(&self.core.topology, &members, color)?;
        let Backend::Shared(shared) = &self.core.backend else {
            return Err(Error::internal("split: the transport is not shared"));
        };
        let backend = shared.child(&members, id)?;
        debug_assert_ne!(shared.id(), id);
        let mut child = Communicator::from_backend(
            Backend::Shared(backend),
            rank,
            members.len(),
            Arc::new(topology),
        );
        let (c, p) = (&mut child.core, &self.core);
        c.comm_tag = u64::from(id) << COMM_SHIFT;
        c.timeout = p.timeout;
        c.forced = p.forced;
        c.options = p.options.clone();
        c.ext.gather_forced = p.ext.gather_forced;
        c.ext.reduce_forced = p.ext.reduce_forced;
        tracing::debug!(
            rank = me,
            color,
            new_rank = rank,
            size = members.len(),
            id,
            "split"
        );
        Ok(Some(child))
    }
}

/// `parent` restricted to `members` (new rank `i` = `members[i]`), built through the
/// topology's file form so that it is checked like any other.
fn sub_topology(parent: &Topology, members: &[usize], color: i32) -> Result<Topology> {
    let mut spec = parent.to_spec();
    let mut new_rank = vec![None; parent.size()];
    for (i, &m) in members.iter().enumerate() {
        new_rank[m] = Some(i as i64);
    }
    let mut ranks = Vec::with_capacity(members.len());
    for (i, &m) in members.iter().enumerate() {
        let mut r = spec
            .ranks
            .get(m)
            .filter(|r| r.rank == m as i64)
            .cloned()
            .ok_or_else(|| Error::internal(format!("split: rank {m} missing from the topology")))?;
        r.rank = i as i64;
        ranks.push(r);
    }
    spec.ranks = ranks;
    spec.nics = std::mem::take(&mut spec.nics)
        .into_iter()
        .filter_map(|mut nic| {
            let mut served: Vec<i64> = nic
                .ranks
                .iter()
                .filter_map(|&r| {
                    usize::try_from(r)
                        .ok()
                        .and_then(|r| new_rank.get(r).copied().flatten())
                })
                .collect();
            served.sort_unstable();
            nic.ranks = served;
            (!nic.ranks.is_empty()).then_some(nic)
        })
        .collect();
    spec.name = format!("{}/split({color})", parent.name());
    spec.build()
        .map_err(|e| Error::internal(format!("split: the sub-communicator's topology: {e}")))
}
