//! All-reduce: [`Communicator::all_reduce`] as a plan of exchange rounds
//! (`halo_collectives::reduce`) with a local reduction between rounds, and the
//! element types and operations it reduces.

use super::{Communicator, Core, exec_options, overlaps};
use crate::error::{Error, Result};
use halo_collectives::{
    AllReduceAlgorithm, Buf, Buffers, Call, CallKind, CollectiveError, Landing, ReduceRound,
    Region, all_reduce_plan, exchange,
};
use std::time::Instant;

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
    /// Product (integers wrap around; `bf16`/`f16` are multiplied in `f32` and rounded
    /// to nearest-even).
    Prod,
    /// Average: the sum (as [`ReduceOp::Sum`]) divided by the number of ranks, as
    /// NCCL's `ncclAvg`: floats divide in their own type (`bf16`/`f16` through `f32`),
    /// integers with truncating division (towards zero) of the wrapped sum.
    Avg,
}

impl ReduceOp {
    /// The operation's code in a call's descriptor ([`halo_collectives::OP_NAMES`]:
    /// NCCL's `ncclRedOp_t` + 1).
    pub(crate) fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 1,
            ReduceOp::Prod => 2,
            ReduceOp::Max => 3,
            ReduceOp::Min => 4,
            ReduceOp::Avg => 5,
        }
    }
}

/// The descriptor of a reduction of `kind` over elements `E` with `op`, of `bytes`.
pub(super) fn reduction_call<E: Reducible>(kind: CallKind, op: ReduceOp, bytes: usize) -> Call {
    Call::new(kind)
        .op(op.code())
        .dtype(super::dtype_code::<E>())
        .count(bytes)
}

mod sealed {
    /// Keeps [`super::Reducible`] to the element types HALO implements it for.
    #[allow(unreachable_pub)]
    pub trait Sealed {}
}

/// Element types [`Communicator::all_reduce`] can reduce: `f32`, `f64`, `i8`, `u8`,
/// `i32`, `i64`, `u32`, `u64`, [`half::bf16`] and [`half::f16`], with every [`ReduceOp`].
pub trait Reducible: bytemuck::Pod + sealed::Sealed {
    /// Combines `other` into `acc` element by element: `acc[i] = other[i] ⊕ acc[i]` when
    /// `other_first`, else `acc[i] ⊕ other[i]`. The operand order is fixed by the
    /// algorithm, so every rank computes the same bits. [`ReduceOp::Avg`] combines as
    /// [`ReduceOp::Sum`]; [`Reducible::finish`] divides at the end.
    fn reduce(op: ReduceOp, acc: &mut [Self], other: &[Self], other_first: bool);

    /// Finishes a reduction over `ranks` ranks: [`ReduceOp::Avg`] divides every
    /// element by `ranks`; the other operations leave `acc` as it is.
    fn finish(op: ReduceOp, acc: &mut [Self], ranks: usize);
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
                    ReduceOp::Sum | ReduceOp::Avg => {
                        combine(acc, other, other_first, <$t>::wrapping_add)
                    }
                    ReduceOp::Prod => combine(acc, other, other_first, <$t>::wrapping_mul),
                    ReduceOp::Max => combine(acc, other, other_first, <$t>::max),
                    ReduceOp::Min => combine(acc, other, other_first, <$t>::min),
                }
            }

            fn finish(op: ReduceOp, acc: &mut [Self], ranks: usize) {
                if op == ReduceOp::Avg && ranks > 1 {
                    // In i128 every value of every integer type and every rank count
                    // fit; `/` truncates towards zero, as C's (and NCCL's) division.
                    let n = ranks as i128;
                    for a in acc {
                        *a = (i128::from(*a) / n) as $t;
                    }
                }
            }
        }
    )*};
}
int_reducible!(i8, u8, i32, i64, u32, u64);

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
                    ReduceOp::Sum | ReduceOp::Avg => combine(acc, other, other_first, |a, b| a + b),
                    ReduceOp::Prod => combine(acc, other, other_first, |a, b| a * b),
                    ReduceOp::Max => combine(acc, other, other_first, pick!($t, >)),
                    ReduceOp::Min => combine(acc, other, other_first, pick!($t, <)),
                }
            }

            fn finish(op: ReduceOp, acc: &mut [Self], ranks: usize) {
                if op == ReduceOp::Avg && ranks > 1 {
                    let n = ranks as $t;
                    for a in acc {
                        *a /= n;
                    }
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
                    ReduceOp::Sum | ReduceOp::Avg => {
                        combine(acc, other, other_first, via(|a, b| a + b))
                    }
                    ReduceOp::Prod => combine(acc, other, other_first, via(|a, b| a * b)),
                    ReduceOp::Max => combine(acc, other, other_first, via(pick!(f32, >))),
                    ReduceOp::Min => combine(acc, other, other_first, via(pick!(f32, <))),
                }
            }

            fn finish(op: ReduceOp, acc: &mut [Self], ranks: usize) {
                if op == ReduceOp::Avg && ranks > 1 {
                    let n = ranks as f32;
                    for a in acc {
                        *a = <$t>::from_f32(a.to_f32() / n);
                    }
                }
            }
        }
    )*};
}
half_reducible!(half::bf16, half::f16);

impl Communicator {
    /// Forces an all-reduce algorithm (`None`: automatic, the default). Every rank must
    /// make the same choice.
    pub fn set_all_reduce_algorithm(&mut self, algorithm: Option<AllReduceAlgorithm>) {
        self.core.policy.forced_mut().all_reduce = algorithm;
    }

    /// The forced all-reduce algorithm, if any.
    pub fn all_reduce_algorithm(&self) -> Option<AllReduceAlgorithm> {
        self.core.policy.forced().all_reduce
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
        let algorithm = core.policy.all_reduce(n, len, len * es);
        let plan = all_reduce_plan(algorithm, me, n, len)?;
        let call = reduction_call::<E>(CallKind::AllReduce, op, len * es);
        run_rounds(core, tag_base, &plan, acc, op, ("all-reduce", call), start)?;
        E::finish(op, acc, n);
        Ok(())
    }
}

/// Runs a plan of exchange rounds (`halo_collectives::reduce`) over the accumulator
/// `acc`: each round one small [`exchange`] schedule, received elements reduced with
/// `op` or landed in place, every message carrying `call`. The whole plan honours the
/// timeout counted from `start`.
pub(super) fn run_rounds<E: Reducible>(
    core: &mut Core,
    tag_base: u64,
    plan: &[ReduceRound],
    acc: &mut [E],
    op: ReduceOp,
    (name, call): (&'static str, Call),
    start: Instant,
) -> Result<()> {
    let (n, me) = (core.size, core.rank);
    let es = std::mem::size_of::<E>();
    let bytes = |r: &std::ops::Range<usize>| r.start * es..r.end * es;
    for (i, round) in plan.iter().enumerate() {
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
                let tmp = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut core.ext.tmp)[..r.len()];
                let schedule = exchange(
                    me,
                    n,
                    name,
                    round.tag,
                    send.map(|(p, s)| (p, region(Buf::Send, s.start, &s))),
                    Some((v.peer, region(Buf::Recv, 0, &r))),
                );
                core.backend
                    .run(
                        &schedule,
                        tag_base,
                        Buffers {
                            send: acc_bytes,
                            recv: tmp,
                            scratch: &mut [],
                            call,
                        },
                        &opts,
                    )
                    .map_err(|e| fail_rounds(core, tag_base, &plan[i + 1..], call, e))?;
                let other: &[E] = bytemuck::cast_slice(
                    &bytemuck::cast_slice::<u64, u8>(&core.ext.tmp)[..r.len()],
                );
                E::reduce(op, &mut acc[v.range.clone()], other, peer_first);
            }
            (Some(v), Landing::Replace) => {
                let r = bytes(&v.range);
                // The received range and the sent range are disjoint parts of the
                // accumulator: split it so both can be lent to the transport.
                let (send_buf, recv_buf, s_region, r_region): (&[u8], &mut [u8], _, _) = match &send
                {
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
                            "{name} round {} receives into the range it sends",
                            round.tag
                        )));
                    }
                };
                let schedule = exchange(me, n, name, round.tag, s_region, Some((v.peer, r_region)));
                core.backend
                    .run(
                        &schedule,
                        tag_base,
                        Buffers {
                            send: send_buf,
                            recv: recv_buf,
                            scratch: &mut [],
                            call,
                        },
                        &opts,
                    )
                    .map_err(|e| fail_rounds(core, tag_base, &plan[i + 1..], call, e))?;
            }
            (None, _) => {
                let schedule = exchange(
                    me,
                    n,
                    name,
                    round.tag,
                    send.map(|(p, s)| (p, region(Buf::Send, s.start, &s))),
                    None,
                );
                core.backend
                    .run(
                        &schedule,
                        tag_base,
                        Buffers {
                            send: acc_bytes,
                            recv: &mut [],
                            scratch: &mut [],
                            call,
                        },
                        &opts,
                    )
                    .map_err(|e| fail_rounds(core, tag_base, &plan[i + 1..], call, e))?;
            }
        }
    }
    Ok(())
}

/// A round of a plan failed with `e`. After a mismatch (the ranks made different
/// calls), the sends of the rounds not run yet are replaced by poison, as the engine
/// does for the steps of one schedule ([`halo_collectives::execute`]), so that the
/// ranks waiting for them fail now, told which call this rank made, instead of at
/// their timeout. Best effort: poison that cannot be delivered at once is dropped.
fn fail_rounds(
    core: &mut Core,
    tag_base: u64,
    rest: &[ReduceRound],
    call: Call,
    e: CollectiveError,
) -> CollectiveError {
    if matches!(e, CollectiveError::Mismatch { .. }) {
        let sends: Vec<(usize, u64)> = rest
            .iter()
            .filter_map(|r| r.send.as_ref().map(|t| (t.peer, r.tag)))
            .collect();
        core.backend
            .poison_after_mismatch(tag_base, call, &sends, &e);
    }
    e
}
