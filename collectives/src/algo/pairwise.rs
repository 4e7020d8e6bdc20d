//! Pairwise exchange: N-1 rounds. In round i, rank r sends to (r + i) mod N and
//! receives from (r - i) mod N; when N is a power of two both partners are r XOR i.
//! Round i starts when round i-1 has completed on this rank.
//!
//! Per rank: N-1 sends, N-1 receives, one local copy; at most one message in each
//! direction in flight.

use super::{BuildCtx, TAG_DIRECT};
use crate::schedule::{Schedule, ScheduleBuilder, StepId};

pub(crate) fn build(ctx: &BuildCtx<'_>) -> Schedule {
    let (me, n) = (ctx.rank, ctx.size());
    let mut b = ScheduleBuilder::new(me, n, "pairwise");
    b.reserve(2 * n, 2 * n);
    let pow2 = n.is_power_of_two();
    let mut prev: Vec<StepId> = Vec::with_capacity(2);
    let (src, dst) = (ctx.layout.send_region(me), ctx.layout.recv_region(me));
    if src.len > 0 {
        b.copy(src, dst, &[]);
    }
    for i in 1..n {
        let (to, from) = if pow2 {
            (me ^ i, me ^ i)
        } else {
            ((me + i) % n, (me + n - i) % n)
        };
        let mut round: Vec<StepId> = Vec::with_capacity(2);
        let r = ctx.layout.recv_region(from);
        if r.len > 0 {
            round.push(b.recv(from, TAG_DIRECT, r, &prev));
        }
        let s = ctx.layout.send_region(to);
        if s.len > 0 {
            round.push(b.send(to, TAG_DIRECT, s, &prev));
        }
        // A round with nothing to do on this rank does not delay the next one.
        if !round.is_empty() {
            prev = round;
        }
    }
    b.finish()
}
