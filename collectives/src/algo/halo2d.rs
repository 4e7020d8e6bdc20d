//! HALO-2D: aggregation on the sending side, the RCCL/MSCCL "2D" all-to-all.
//!
//! Ranks are grouped by their *node* — the innermost level of
//! [`AlgoOptions::halo_levels`](super::AlgoOptions::halo_levels) (by default the node
//! level). For a destination `q` on another node `B`, the *forwarder* on node `A` is
//! the rank of `A` whose local index is `local_index(q) mod size(A)`: the rank
//! aligned with `q` (same NIC position), wrapping around when the nodes are uneven.
//! Rank `r` of node `A` then runs three independent groups of steps:
//!
//! - **Direct** (intra-node): its block for every other rank of `A` goes straight
//!   there, one message each, no dependencies (HALO's Phase I).
//! - **Phase A** (intra-node gather by local index, the first "stride copy" and
//!   exchange): to every other rank `p` of `A`, one message holding `r`'s blocks for
//!   every remote `q` that `p` forwards, in (node, rank) order — packed by `Copy` steps
//!   from the send buffer unless they already follow each other there. The blocks for
//!   the remote ranks `r` forwards itself stay where they are.
//! - **Phase B** (inter-node exchange, the second stride copy): to every remote `q` it
//!   forwards, one message holding the blocks `(s, q)` of every rank `s` of `A`, in
//!   rank order — packed from its own send buffer and its Phase A receives (each pack
//!   copy depends on the receive it reads) and cut into chunks of
//!   [`AlgoOptions::chunk_bytes`](super::AlgoOptions::chunk_bytes), each chunk
//!   depending only on the copies that fill it. `q` receives it straight into its
//!   receive buffer when the blocks' places there follow each other in that order
//!   (ranks of a node numbered consecutively, packed displacements), otherwise into
//!   scratch followed by one copy per run of blocks.
//!
//! Every receive is posted with no dependency, so rendezvous transports cannot
//! deadlock. All-to-all-v: a forwarder learns the sizes of the blocks it gathers
//! from the metadata pass — every block that lands in its scratch from another rank
//! is recorded with `ScheduleBuilder::note_routed` — and a destination knows its own
//! column. Zero-size blocks are skipped; a message whose blocks are all empty is
//! skipped by both ends, which compute the same length.
//!
//! Without a node level (`flat:N`, or no HALO level) this is the flat fan-out.
//!
//! Per rank, `H` nodes of `R` ranks (`H, R > 1`), uniform blocks of `B` bytes:
//! - sends: `R-1` direct + `R-1` Phase A + `H-1` Phase B messages (times the chunks
//!   of each, `ceil(R*B / chunk_bytes)`); the same number of receives;
//! - bytes sent: `(R-1)B` direct + `(R-1)(H-1)B` Phase A + `(H-1)R*B` Phase B; the
//!   inter-node bytes are those of the flat fan-out, in `H-1` messages instead of
//!   `(H-1)R`;
//! - copies: 1 (self) + `(R-1)(H-1)` Phase A packs (none when `H = 2`: one block is
//!   sent as it is) + `(H-1)R` Phase B packs (at most 3 when `H = 2`: the one-block
//!   Phase A receives then sit next to each other in scratch); nothing on the
//!   receiving side.
//!
//! Tags: `phase << 44 | chunk << 32` (phase 0 direct, 1 Phase A, 2 Phase B); one
//! message per (sender, receiver) and phase.

use super::BuildCtx;
use super::pack::{CopyRuns, contiguous, gather};
use crate::error::Result;
use crate::schedule::{Buf, Region, Schedule, ScheduleBuilder, StepId};
use halo_topology::{Level, Rank, Topology};

const DIRECT: u64 = 0;
const PHASE_A: u64 = 1;
const PHASE_B: u64 = 2;

fn tag(phase: u64, chunk: usize) -> u64 {
    (phase << 44) | ((chunk as u64) << 32)
}

/// The remote ranks that the rank of local index `j` on node `a` forwards: on every
/// other node, those whose local index is `j` modulo the size of `a`. Node order,
/// then rank order.
fn forwarded(topo: &Topology, level: Level, a: usize, j: usize, out: &mut Vec<Rank>) {
    out.clear();
    let sa = topo.domain_size(level, a);
    for node in (0..topo.num_domains(level)).filter(|&d| d != a) {
        let members = topo.ranks(level, node);
        out.extend(members.iter().skip(j).step_by(sa).map(|&q| q as Rank));
    }
}

/// Number of chunks and chunk size for a message of `len` bytes.
fn chunk_plan(ctx: &BuildCtx<'_>, len: usize) -> (usize, usize) {
    ctx.options.chunks(len)
}

/// The flat fan-out, for topologies without a node level.
fn flat(ctx: &BuildCtx<'_>, mut b: ScheduleBuilder) -> Schedule {
    let (me, n) = (ctx.rank, ctx.size());
    let layout = ctx.layout;
    for i in 1..n {
        let src = (me + n - i) % n;
        let r = layout.recv_region(src);
        if r.len > 0 {
            b.recv(src, tag(DIRECT, 0), r, &[]);
        }
    }
    for i in 1..n {
        let dst = (me + i) % n;
        let r = layout.send_region(dst);
        if r.len > 0 {
            b.send(dst, tag(DIRECT, 0), r, &[]);
        }
    }
    b.finish()
}

pub(crate) fn build(ctx: &BuildCtx<'_>) -> Result<Schedule> {
    let topo = ctx.topology;
    let levels = ctx.options.halo_levels(topo)?;
    let (me, n) = (ctx.rank, ctx.size());
    let layout = ctx.layout;
    let sizes = ctx.sizes;
    let mut b = ScheduleBuilder::new(me, n, "halo2d");
    let (src, dst) = (layout.send_region(me), layout.recv_region(me));
    if src.len > 0 {
        b.copy(src, dst, &[]);
    }
    let Some(&level) = levels.first() else {
        return Ok(flat(ctx, b));
    };
    let a = topo.domain(me, level);
    let local = topo.ranks(level, a);
    let sa = local.len();
    let li = topo.local_index(me, level);
    b.reserve(4 * n, 4 * n);

    // The remote ranks this rank forwards.
    let mut mine: Vec<Rank> = Vec::new();
    forwarded(topo, level, a, li, &mut mine);

    // Direct receives.
    for &s in local {
        let s = s as Rank;
        let r = layout.recv_region(s);
        if s != me && r.len > 0 {
            b.recv(s, tag(DIRECT, 0), r, &[]);
        }
    }

    // Phase A receives: from every other local rank s, its blocks for `mine`.
    // held[iq * sa + js]: where block (local[js], mine[iq]) is, and what wrote it.
    let mut held: Vec<(Region, Option<StepId>)> =
        vec![(Region::new(Buf::Scratch, 0, 0), None); mine.len() * sa];
    for (js, &s) in local.iter().enumerate() {
        let s = s as Rank;
        if s == me {
            for (iq, &q) in mine.iter().enumerate() {
                let r = layout.send_region(q);
                let len = sizes.bytes(me, q);
                debug_assert_eq!(r.len, len, "send layout disagrees with sizes");
                held[iq * sa + js] = (Region::new(Buf::Send, r.offset, len), None);
            }
            continue;
        }
        let total: usize = mine.iter().map(|&q| sizes.bytes(s, q)).sum();
        if total == 0 {
            continue;
        }
        let region = b.scratch(total);
        let id = b.recv(s, tag(PHASE_A, 0), region, &[]);
        let mut at = 0;
        for (iq, &q) in mine.iter().enumerate() {
            let len = sizes.bytes(s, q);
            held[iq * sa + js] = (region.sub(at, len), Some(id));
            if len > 0 {
                b.note_routed(s, q, region.offset + at);
            }
            at += len;
        }
    }

    // Phase B receives: from the forwarder on every other node, the blocks of all its ranks.
    for node in (0..topo.num_domains(level)).filter(|&d| d != a) {
        let members = topo.ranks(level, node);
        let p = members[li % members.len()] as Rank;
        let lens: Vec<usize> = members
            .iter()
            .map(|&s| sizes.bytes(s as Rank, me))
            .collect();
        let total: usize = lens.iter().sum();
        if total == 0 {
            continue;
        }
        let (k, cs) = chunk_plan(ctx, total);
        // In place when every block's place agrees with its size and they follow each other.
        let direct = members
            .iter()
            .zip(&lens)
            .map(|(&s, &len)| {
                let place = layout.recv_region(s as Rank);
                (place.len == len).then_some(place)
            })
            .collect::<Option<Vec<Region>>>()
            .and_then(contiguous)
            .filter(|r| r.buf == Buf::Recv);
        let region = direct.unwrap_or_else(|| b.scratch(total));
        let mut chunks: Vec<(usize, usize, StepId)> = Vec::with_capacity(k);
        for c in 0..k {
            let at = c * cs;
            let len = cs.min(total - at);
            let id = b.recv(p, tag(PHASE_B, c), region.sub(at, len), &[]);
            chunks.push((at, at + len, id));
        }
        if direct.is_some() {
            continue;
        }
        // Through scratch: copy every block home once the chunks covering it arrived.
        let mut copies = CopyRuns::default();
        let mut at = 0;
        for (&s, &len) in members.iter().zip(&lens) {
            if len == 0 {
                continue;
            }
            let s = s as Rank;
            b.note_routed(s, me, region.offset + at);
            let deps: Vec<StepId> = chunks
                .iter()
                .filter(|c| c.0 < at + len && c.1 > at)
                .map(|c| c.2)
                .collect();
            copies.add(&mut b, region.sub(at, len), layout.recv_region(s), &deps);
            at += len;
        }
        copies.flush(&mut b);
    }

    // Direct sends.
    for &q in local {
        let q = q as Rank;
        let r = layout.send_region(q);
        if q != me && r.len > 0 {
            b.send(q, tag(DIRECT, 0), r, &[]);
        }
    }

    // Phase A sends: to every other local rank p, this rank's blocks for what p forwards.
    let mut theirs: Vec<Rank> = Vec::new();
    let mut pieces: Vec<(Region, Option<StepId>)> = Vec::new();
    for (jp, &p) in local.iter().enumerate() {
        let p = p as Rank;
        if p == me {
            continue;
        }
        forwarded(topo, level, a, jp, &mut theirs);
        pieces.clear();
        pieces.extend(theirs.iter().map(|&q| {
            let r = layout.send_region(q);
            let len = sizes.bytes(me, q);
            debug_assert_eq!(r.len, len, "send layout disagrees with sizes");
            (Region::new(Buf::Send, r.offset, len), None)
        }));
        if let Some(g) = gather(&mut b, &pieces) {
            let deps = g.deps(0, g.region.len);
            b.send(p, tag(PHASE_A, 0), g.region, &deps);
        }
    }

    // Phase B sends: to every remote rank this rank forwards, the blocks of every local rank.
    for (iq, &q) in mine.iter().enumerate() {
        let Some(g) = gather(&mut b, &held[iq * sa..(iq + 1) * sa]) else {
            continue;
        };
        let total = g.region.len;
        let (k, cs) = chunk_plan(ctx, total);
        for c in 0..k {
            let at = c * cs;
            let len = cs.min(total - at);
            let deps = g.deps(at, len);
            b.send(q, tag(PHASE_B, c), g.region.sub(at, len), &deps);
        }
    }
    Ok(b.finish())
}
