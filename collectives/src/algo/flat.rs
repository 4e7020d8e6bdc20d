//! The flat fan-out: every send and every receive posted at once (RCCL / NCCL).
//!
//! Per rank: N-1 sends and N-1 receives of one block each, one local copy.

use super::{BuildCtx, TAG_DIRECT};
use crate::schedule::{Schedule, ScheduleBuilder};

pub(crate) fn build(ctx: &BuildCtx<'_>) -> Schedule {
    let (me, n) = (ctx.rank, ctx.size());
    let mut b = ScheduleBuilder::new(me, n, "flat");
    b.reserve(2 * n, 0);
    // Receives first so that a transport can pre-post them.
    for i in 1..n {
        let src = (me + n - i) % n;
        let region = ctx.layout.recv_region(src);
        if region.len > 0 {
            b.recv(src, TAG_DIRECT, region, &[]);
        }
    }
    for i in 1..n {
        let dst = (me + i) % n;
        let region = ctx.layout.send_region(dst);
        if region.len > 0 {
            b.send(dst, TAG_DIRECT, region, &[]);
        }
    }
    let (src, dst) = (ctx.layout.send_region(me), ctx.layout.recv_region(me));
    if src.len > 0 {
        b.copy(src, dst, &[]);
    }
    b.finish()
}
