//! HALO: hierarchical, locality-optimised all-to-all over any number of levels.
//!
//! The levels HALO aggregates at (default: the node) and the top of the tree make
//! *tiers* `t_0 < t_1 < ... < t_m = system`. Every rank starts holding one packet:
//! its own row, for the whole system. At tier `j` (from the top down) a rank splits
//! each packet it holds for its `t_j` domain into the `t_{j-1}` domains inside it:
//! the part for its own `t_{j-1}` domain stays with it; every other part goes, as
//! one message, to the *rank-aligned* peer in that domain (same local index, so the
//! same NIC position: Frontier's GCD i talks to GCD i). At tier 0 (inside the node)
//! every block goes straight to its destination. With two levels this is the paper's
//! Phase I (intra-node exchange of own blocks, no dependencies, runs alongside),
//! Phase II (one aggregated message per remote node to the aligned peer) and
//! Phase III (redistribution of what arrived, per arriving chunk).
//!
//! Packets are laid out in *routing order* (ranks sorted by their domains at the
//! tiers, outermost first), so every domain is one contiguous byte range of a packet:
//! forwarding never re-packs, and a rank's own row is sent straight from the send
//! buffer when its blocks are contiguous there. Messages at tiers >= 1 are cut into
//! chunks of `chunk_bytes`; forwarding a piece depends only on the chunks covering it,
//! so redistribution of one chunk overlaps the transfer of the next.
//!
//! Per rank, two levels, `R` ranks per node, `H` nodes: `R-1` own intra-node
//! messages, `H-1` inter-node messages (instead of `N-R`), and about `(H-1)(R-1)`
//! forwarded blocks; inter-node bytes are those of the flat fan-out.
//!
//! Large uniform packets are *spread* (`Builder::spread`): once a Phase II packet is
//! cut into chunks, each chunk (one or two blocks) goes to a rank it holds a block
//! for rather than every chunk to the aligned peer, so a packet's chunks do not queue
//! on one ordered channel and Phase III forwards at most one block per chunk; with
//! one block per chunk (from 128 KiB per peer on 8-rank nodes by default) Phase II
//! is the flat fan-out's network traffic and Phase III is empty.
//!
//! Tags: `tier << 44 | chunk << 32 | source rank`, unique per (sender, receiver).

use super::BuildCtx;
use super::pack::contiguous;
use crate::error::{CollectiveError, Result};
use crate::schedule::{Buf, Region, Schedule, ScheduleBuilder, StepId};
use halo_topology::{Level, Rank, Topology};

fn tag(tier: usize, chunk: usize, src: Rank) -> u64 {
    ((tier as u64) << 44) | ((chunk as u64) << 32) | src as u64
}

/// The tier of relayed intra-node messages (`build` refuses 15 levels or more).
const RELAY_TIER: usize = 15;
/// Most chunks of one relayed block (6 bits of the chunk field; the destination's
/// position in its node takes the other 6).
const RELAY_CHUNKS: usize = 64;

/// Tag of chunk `c` of `src`'s block for the rank at position `dst` of the node, on
/// every hop of its relay path.
fn relay_tag(dst: usize, c: usize, src: Rank) -> u64 {
    tag(RELAY_TIER, (dst << 6) | c, src)
}

/// The intra-node phase's own paths over peers ([`halo_topology::NodeLinks::balanced_routes`]).
struct Relay {
    /// This rank's node's ranks, by position.
    ranks: Vec<u32>,
    /// Per ordered pair of positions `i * n + j`, the positions its blocks visit.
    paths: Vec<Vec<usize>>,
    /// This rank's position.
    me: usize,
}

impl Relay {
    /// The relay this rank's build uses, if any: a uniform all-to-all of blocks of at
    /// least `node_relay_bytes`, aggregating first at the node level, on a topology
    /// whose link matrix has better paths than the fabric's for this rank's node.
    fn new(ctx: &BuildCtx<'_>, tiers: &[Level]) -> Option<Relay> {
        let topo = ctx.topology;
        let s = ctx.sizes.uniform()?;
        if s <= crate::layout::META_BLOCK || s < ctx.options.node_relay_bytes {
            return None;
        }
        if tiers.first() != Some(&Level::Node) {
            return None;
        }
        let links = topo.node_links()?;
        let node = topo.domain(ctx.rank, Level::Node);
        let ranks = topo.ranks(Level::Node, node).to_vec();
        let (paths, _) = links.balanced_routes(ranks.len())?;
        Some(Relay {
            me: topo.local_index(ctx.rank, Level::Node),
            ranks,
            paths,
        })
    }

    /// The path (positions) from position `i` to position `j` when it is relayed.
    fn relayed(&self, i: usize, j: usize) -> Option<&[usize]> {
        let p = &self.paths[i * self.ranks.len() + j];
        (p.len() > 2).then_some(p.as_slice())
    }
}

/// The routing order and the intervals of every domain at every tier below the top.
struct Plan {
    tiers: Vec<Level>,
    /// order[i]: the rank at position i.
    order: Vec<u32>,
    /// pos[r]: the position of rank r (the inverse of `order`).
    pos: Vec<u32>,
    /// Per tier j < m, per domain: [lo, hi) in `order`.
    span: Vec<Vec<(u32, u32)>>,
    /// Whether `order` is the identity (every domain is the run of ranks `span` gives).
    identity: bool,
}

impl Plan {
    fn new(topo: &Topology, levels: &[Level]) -> Plan {
        let mut tiers = levels.to_vec();
        tiers.push(Level::System);
        let n = topo.size();
        if let Some(plan) = Plan::contiguous(topo, &tiers) {
            return plan;
        }
        // LSD radix sort: by rank (given), then by domain at t_0, t_1, ... (stable).
        let mut order: Vec<u32> = (0..n as u32).collect();
        let mut next = vec![0u32; n];
        for &level in &tiers[..tiers.len() - 1] {
            let d = topo.num_domains(level);
            let mut start = vec![0usize; d + 1];
            for &r in &order {
                start[topo.domain(r as usize, level) + 1] += 1;
            }
            for i in 1..=d {
                start[i] += start[i - 1];
            }
            for &r in &order {
                let k = topo.domain(r as usize, level);
                next[start[k]] = r;
                start[k] += 1;
            }
            std::mem::swap(&mut order, &mut next);
        }
        let span = tiers[..tiers.len() - 1]
            .iter()
            .map(|&level| {
                let mut s = vec![(u32::MAX, 0u32); topo.num_domains(level)];
                for (i, &r) in order.iter().enumerate() {
                    let e = &mut s[topo.domain(r as usize, level)];
                    e.0 = e.0.min(i as u32);
                    e.1 = i as u32 + 1;
                }
                s
            })
            .collect();
        let mut pos = vec![0u32; n];
        for (i, &r) in order.iter().enumerate() {
            pos[r as usize] = i as u32;
        }
        Plan {
            tiers,
            order,
            pos,
            span,
            identity: false,
        }
    }

    /// The plan without sorting when every tier's domains are runs of consecutive
    /// ranks in domain order (every preset, and most machines): the routing order is
    /// then the ranks' own, and the spans are the runs. O(N) reads, no domain lookups.
    fn contiguous(topo: &Topology, tiers: &[Level]) -> Option<Plan> {
        let n = topo.size();
        let mut span = Vec::with_capacity(tiers.len() - 1);
        for &level in &tiers[..tiers.len() - 1] {
            let d = topo.num_domains(level);
            let mut s = Vec::with_capacity(d);
            let mut at = 0u32;
            for k in 0..d {
                let members = topo.ranks(level, k);
                if members.is_empty()
                    || members.iter().enumerate().any(|(i, &r)| r != at + i as u32)
                {
                    return None;
                }
                let end = at + members.len() as u32;
                s.push((at, end));
                at = end;
            }
            if at as usize != n {
                return None;
            }
            span.push(s);
        }
        let order: Vec<u32> = (0..n as u32).collect();
        Some(Plan {
            tiers: tiers.to_vec(),
            pos: order.clone(),
            order,
            span,
            identity: true,
        })
    }

    fn m(&self) -> usize {
        self.tiers.len() - 1
    }

    /// Interval of `rank`'s domain at tier `j` (the whole order at the top).
    fn interval(&self, topo: &Topology, rank: Rank, j: usize) -> (usize, usize) {
        if j == self.m() {
            return (0, self.order.len());
        }
        let (lo, hi) = self.span[j][topo.domain(rank, self.tiers[j])];
        (lo as usize, hi as usize)
    }

    /// The `t_{j-1}` domains inside the `t_j` domain spanning `[lo, hi)`, as intervals.
    fn children<'p>(
        &'p self,
        topo: &'p Topology,
        j: usize,
        lo: usize,
        hi: usize,
    ) -> impl Iterator<Item = (usize, usize)> + 'p {
        let level = self.tiers[j - 1];
        let span = &self.span[j - 1];
        let order = &self.order;
        let topo_domain = move |i: usize| topo.domain(order[i] as usize, level);
        let mut at = lo;
        std::iter::from_fn(move || {
            if at >= hi {
                return None;
            }
            let (a, b) = span[topo_domain(at)];
            at = b as usize;
            Some((a as usize, b as usize))
        })
    }

    /// Positions `[lo, hi)` that `x` keeps of a packet it receives at tier `j`: its
    /// own `t_{j-2}` domain, or its own position at tier 1.
    fn kept(&self, topo: &Topology, x: Rank, j: usize) -> (usize, usize) {
        if j >= 2 {
            self.interval(topo, x, j - 2)
        } else {
            let p = self.pos[x] as usize;
            (p, p + 1)
        }
    }

    /// Appends the ranks `g` that send packets for `x`'s `t_{j-1}` domain to `x` at
    /// tier `j` to `out`: those in `x`'s `t_j` domain, outside its `t_{j-1}` domain,
    /// whose aligned peer there is `x`.
    fn senders_to(&self, topo: &Topology, x: Rank, j: usize, out: &mut Vec<Rank>) {
        let level = self.tiers[j - 1];
        let mine = topo.domain(x, level);
        let my_size = topo.domain_size(level, mine);
        let k = topo.local_index(x, level);
        if j == self.m() && self.identity {
            // Every domain of t_{m-1} is a run of ranks, in index order.
            for (d, &(a, b)) in self.span[j - 1].iter().enumerate() {
                if d != mine {
                    out.extend((a as usize + k..b as usize).step_by(my_size));
                }
            }
            return;
        }
        let mut push = |d: usize| {
            let members = topo.ranks(level, d);
            let mut p = k;
            while p < members.len() {
                out.push(members[p] as usize);
                p += my_size;
            }
        };
        if j == self.m() {
            // The children of the top are every domain of t_{m-1}, in index order (the
            // routing order's first key).
            for d in (0..topo.num_domains(level)).filter(|&d| d != mine) {
                push(d);
            }
            return;
        }
        let (lo, hi) = self.interval(topo, x, j);
        for (a, _) in self.children(topo, j, lo, hi) {
            let d = topo.domain(self.order[a] as usize, level);
            if d != mine {
                push(d);
            }
        }
    }

    /// Appends the sources whose packet for `x`'s `t_j` domain `x` holds to `out`.
    fn sources(&self, topo: &Topology, x: Rank, j: usize, out: &mut Vec<Rank>) {
        if j == self.m() {
            out.push(x);
            return;
        }
        self.sources(topo, x, j + 1, out);
        if j + 1 == self.m() {
            // The senders' sources at the top are the senders themselves.
            self.senders_to(topo, x, j + 1, out);
            return;
        }
        let mut senders = Vec::new();
        self.senders_to(topo, x, j + 1, &mut senders);
        for g in senders {
            self.sources(topo, g, j + 1, out);
        }
    }
}

/// Where a held packet's bytes are.
#[derive(Clone, Copy)]
enum Loc {
    /// This rank's own row: block q at `layout.send_region(q)`.
    Own,
    /// Contiguous in scratch from `start`, received as the chunks
    /// `Builder::chunks[first..end]`.
    Scratch { start: usize, first: u32, end: u32 },
}

#[derive(Clone, Copy)]
struct Packet {
    src: Rank,
    lo: usize,
    hi: usize,
    at: Loc,
}

/// One rank's build. Every buffer is reused from packet to packet: building allocates
/// a fixed number of times, not per packet (docs/bench/JOURNAL.md, "Schedule build time").
struct Builder<'c, 'a> {
    ctx: &'c BuildCtx<'a>,
    plan: Plan,
    b: ScheduleBuilder,
    /// The steps the region last returned by `region` depends on.
    deps: Vec<StepId>,
    /// Every received chunk `(start, end, step)`, absolute scratch offsets; packets
    /// refer to ranges of it.
    chunks: Vec<(usize, usize, StepId)>,
    /// Block offsets of the packet being handled (see `offsets`).
    off: Vec<usize>,
    /// Sources of the packets being received.
    srcs: Vec<Rank>,
    /// Senders of the packets being received.
    senders: Vec<Rank>,
    /// The intra-node phase's own paths, when it relays.
    relay: Option<Relay>,
}

impl Builder<'_, '_> {
    fn bytes(&self, src: Rank, pos: usize) -> usize {
        self.ctx.sizes.bytes(src, self.plan.order[pos] as usize)
    }

    /// Byte offsets of the blocks at positions lo..hi relative to lo (len hi-lo+1),
    /// written into `off`.
    fn offsets(&self, src: Rank, lo: usize, hi: usize, off: &mut Vec<usize>) {
        off.clear();
        off.reserve(hi - lo + 1);
        let mut acc = 0usize;
        off.push(0);
        for i in lo..hi {
            acc += self.bytes(src, i);
            off.push(acc);
        }
    }

    /// The region holding positions `a..b` of packet `p` (whose offsets are `off`),
    /// with the steps it depends on left in `self.deps`. Own rows that are not
    /// contiguous in the send buffer are packed into scratch first.
    fn region(&mut self, p: &Packet, off: &[usize], a: usize, b: usize) -> Region {
        self.deps.clear();
        let (ra, rb) = (off[a - p.lo], off[b - p.lo]);
        let len = rb - ra;
        match p.at {
            Loc::Scratch { start, first, end } => {
                let (s, e) = (start + ra, start + rb);
                self.deps.extend(
                    self.chunks[first as usize..end as usize]
                        .iter()
                        .filter(|c| c.0 < e && c.1 > s)
                        .map(|c| c.2),
                );
                Region::new(Buf::Scratch, s, len)
            }
            Loc::Own => {
                let layout = self.ctx.layout;
                let order = &self.plan.order;
                if let Some(run) = contiguous((a..b).map(|i| layout.send_region(order[i] as usize)))
                {
                    return run;
                }
                let pack = self.b.scratch(len);
                let mut at = 0;
                for i in a..b {
                    let r = layout.send_region(self.plan.order[i] as usize);
                    if r.len > 0 {
                        let c = self.b.copy(r, pack.sub(at, r.len), &[]);
                        self.deps.push(c);
                        at += r.len;
                    }
                }
                pack
            }
        }
    }

    fn chunk_plan(&self, len: usize) -> (usize, usize) {
        self.ctx.options.chunks(len)
    }

    /// How a relayed block of `len` bytes is cut: in chunks of about `chunk_bytes`, at
    /// most [`RELAY_CHUNKS`] of them (not `max_chunks`: each hop of a relay waits for
    /// the whole chunk before it, so fewer, larger chunks leave the links idle longer).
    fn relay_chunks(&self, len: usize) -> (usize, usize) {
        let k = len
            .div_ceil(self.ctx.options.chunk_bytes.max(1))
            .clamp(1, RELAY_CHUNKS);
        (k, len.div_ceil(k))
    }

    /// Appends to `out` the sources whose blocks for `dst` rank `g` (of `dst`'s node)
    /// sends it at tier 0: its own and those it received for `dst`.
    fn tier0_sources(&self, g: Rank, dst: Rank, out: &mut Vec<Rank>) {
        let topo = self.ctx.topology;
        let (lo, hi) = self.plan.interval(topo, dst, 0);
        if let Some(bpc) = self.spread(hi - lo) {
            // g's own block, and those of the spread chunks holding dst's block that g
            // received.
            out.push(g);
            let mine = self.plan.pos[dst] as usize;
            let pa = lo + (mine - lo) / bpc * bpc;
            let pb = (pa + bpc).min(hi);
            let pos = self.plan.pos[g] as usize;
            if (pa..pb).contains(&pos) {
                self.spread_senders(pa, pb, pos, out);
            }
        } else {
            self.plan.sources(topo, g, 0, out);
        }
    }

    /// This rank's part in the relays of its node: every block whose path passes
    /// through it is received from the previous rank of the path and sent on to the
    /// next, chunk by chunk.
    fn relay_through(&mut self) {
        let Some(relay) = self.relay.take() else {
            return;
        };
        let n = relay.ranks.len();
        let mut srcs = Vec::new();
        for i in 0..n {
            for j in (0..n).filter(|&j| j != i) {
                let Some(path) = relay.relayed(i, j) else {
                    continue;
                };
                let Some(t) = path[1..path.len() - 1].iter().position(|&x| x == relay.me) else {
                    continue;
                };
                let (prev, next) = (relay.ranks[path[t]], relay.ranks[path[t + 2]]);
                let (gi, gj) = (relay.ranks[i] as usize, relay.ranks[j] as usize);
                srcs.clear();
                self.tier0_sources(gi, gj, &mut srcs);
                for &src in &srcs {
                    let len = self.ctx.sizes.bytes(src, gj);
                    if len == 0 {
                        continue;
                    }
                    let buf = self.b.scratch(len);
                    let (k, cs) = self.relay_chunks(len);
                    for c in 0..k {
                        let piece = buf.sub(c * cs, cs.min(len - c * cs));
                        let id = self.b.recv(prev as usize, relay_tag(j, c, src), piece, &[]);
                        self.b
                            .send(next as usize, relay_tag(j, c, src), piece, &[id]);
                    }
                }
            }
        }
        self.relay = Some(relay);
    }

    /// Blocks per Phase II chunk when this build *spreads* its chunks, for a packet
    /// of `width` blocks (the receiving node's ranks); `None` to send every chunk of a
    /// packet to the one aligned peer.
    ///
    /// Spreading: in a uniform all-to-all with one aggregation level, a packet that
    /// [`AlgoOptions::chunks`](super::AlgoOptions::chunks) cuts into several chunks is
    /// cut instead at block boundaries into chunks of at most two blocks (and at most
    /// `max_chunks` chunks), and each chunk goes to one of the ranks whose blocks it
    /// holds (the sender's local index modulo the chunk's width), which keeps its own
    /// block and forwards the other; a chunk of one block is received in place. The network carries
    /// the same messages and bytes as sending every chunk to the aligned peer, but
    /// (a) a packet's chunks no longer queue one after the other on one ordered
    /// channel — they go to different peers and leave together, as flat's messages
    /// do — and (b) Phase III forwards only the chunk's other blocks (none when a
    /// chunk is one block). Every rank can place every block only when all sizes are
    /// equal, so all-to-all-v keeps the aligned routing; so does the metadata pass of
    /// all-to-all-v (blocks of `META_BLOCK` bytes), whose routes the data pass reads.
    fn spread(&self, width: usize) -> Option<usize> {
        let s = self.ctx.sizes.uniform()?;
        if self.plan.m() != 1 || s <= crate::layout::META_BLOCK || width == 0 {
            return None;
        }
        let (k, _) = self.chunk_plan(width.saturating_mul(s));
        if k < 2 {
            return None;
        }
        // At most two blocks per chunk (fewer when the chunk size asks for it) and at
        // most `max_chunks` chunks: simulated on Frontier (docs/SIMULATION.md, table
        // 1b), two blocks per chunk beat one, four and eight from 32 to 64 KiB per peer.
        let most = self
            .ctx
            .options
            .max_chunks
            .clamp(1, crate::algo::MAX_CHUNKS);
        Some(width.div_ceil(k).min(2).max(width.div_ceil(most)))
    }

    /// The rank that receives the chunk holding positions `[pa, pb)` from `sender`
    /// when chunks are spread (see `spread`).
    fn spread_target(&self, sender: Rank, pa: usize, pb: usize) -> Rank {
        let idx = self.ctx.topology.local_index(sender, self.plan.tiers[0]);
        self.plan.order[pa + idx % (pb - pa)] as usize
    }

    /// Appends to `out` the ranks outside this rank's node that send the spread chunk
    /// holding positions `[pa, pb)` (this node's) to the rank at position `at`.
    fn spread_senders(&self, pa: usize, pb: usize, at: usize, out: &mut Vec<Rank>) {
        let topo = self.ctx.topology;
        let level = self.plan.tiers[0];
        let mine = topo.domain(self.plan.order[pa] as usize, level);
        let (w, t) = (pb - pa, at - pa);
        for d in (0..topo.num_domains(level)).filter(|&d| d != mine) {
            let members = topo.ranks(level, d);
            out.extend(members.iter().skip(t).step_by(w).map(|&r| r as usize));
        }
    }

    /// Sends `region` (with `self.deps` the steps it depends on) to `peer` at tier `j`
    /// in chunks. `keep` is the part of it, relative to `region`, that `peer` keeps
    /// rather than forwards.
    ///
    /// Chunk order (against Phase III incast): the chunks go out starting after the
    /// one holding `keep`, rotated further by the sender's own `t_{j-1}` domain. So
    /// the ranks of one domain receiving from the same remote domain forward different
    /// chunks — for different local ranks — at any time, instead of all forwarding
    /// chunk `c` to local rank `c` at once; and the chunk each receives last is mostly
    /// its own (docs/SIMULATION.md, "HALO pays an extra intra-node hop").
    fn send_chunked(
        &mut self,
        peer: Rank,
        j: usize,
        src: Rank,
        region: Region,
        p: &Packet,
        keep: (usize, usize),
    ) {
        let (k, cs) = self.chunk_plan(region.len);
        let own = if keep.1 > keep.0 {
            (keep.1 - 1) / cs
        } else {
            keep.0 / cs
        };
        let node = self
            .ctx
            .topology
            .domain(self.ctx.rank, self.plan.tiers[j - 1]);
        let first = (own + 1 + node) % k;
        let mut deps = std::mem::take(&mut self.deps);
        let mine = deps.len();
        for c in (first..k).chain(0..first) {
            let at = c * cs;
            let len = cs.min(region.len - at);
            let piece = region.sub(at, len);
            // Depend only on what covers this piece.
            let d: &[StepId] = match p.at {
                Loc::Scratch {
                    first: c0, end: c1, ..
                } if region.buf == Buf::Scratch => {
                    deps.truncate(mine);
                    deps.extend(
                        self.chunks[c0 as usize..c1 as usize]
                            .iter()
                            .filter(|ch| ch.0 < piece.end() && ch.1 > piece.offset)
                            .map(|ch| ch.2),
                    );
                    &deps[mine..]
                }
                _ => &deps[..mine],
            };
            self.b.send(peer, tag(j, c, src), piece, d);
        }
        deps.clear();
        self.deps = deps;
    }

    fn run(mut self) -> Schedule {
        let topo = self.ctx.topology;
        let me = self.ctx.rank;
        let m = self.plan.m();
        let mut held = vec![Packet {
            src: me,
            lo: 0,
            hi: topo.size(),
            at: Loc::Own,
        }];
        let mut next: Vec<Packet> = Vec::new();
        let mut off = std::mem::take(&mut self.off);
        let mut srcs = std::mem::take(&mut self.srcs);
        let mut senders = std::mem::take(&mut self.senders);
        for j in (1..=m).rev() {
            let child = self.plan.tiers[j - 1];
            let (mlo, mhi) = self.plan.interval(topo, me, j - 1);
            next.clear();
            // Receives first, so a transport can pre-post them.
            senders.clear();
            if let Some(bpc) = self.spread(mhi - mlo) {
                // Spread chunks (`spread`): the one holding this rank's block comes from
                // every sender whose local index selects this rank.
                let mine = self.plan.pos[me] as usize;
                let pa = mlo + (mine - mlo) / bpc * bpc;
                let pb = (pa + bpc).min(mhi);
                let c = (mine - mlo) / bpc;
                self.spread_senders(pa, pb, mine, &mut senders);
                for &g in &senders {
                    if pb - pa == 1 {
                        // A chunk of one block, this rank's own: straight into place.
                        let r = self.ctx.layout.recv_region(g);
                        self.b.recv(g, tag(j, c, g), r, &[]);
                        continue;
                    }
                    self.offsets(g, pa, pb, &mut off);
                    let len = off[off.len() - 1];
                    let base = self.b.scratch(len);
                    let first = self.chunks.len() as u32;
                    let id = self.b.recv(g, tag(j, c, g), base, &[]);
                    self.chunks.push((base.offset, base.offset + len, id));
                    for (i, pos) in (pa..pb).enumerate() {
                        self.b
                            .note_routed(g, self.plan.order[pos] as usize, base.offset + off[i]);
                    }
                    next.push(Packet {
                        src: g,
                        lo: pa,
                        hi: pb,
                        at: Loc::Scratch {
                            start: base.offset,
                            first,
                            end: first + 1,
                        },
                    });
                }
                senders.clear();
            } else {
                self.plan.senders_to(topo, me, j, &mut senders);
            }
            for &g in &senders {
                srcs.clear();
                self.plan.sources(topo, g, j, &mut srcs);
                for &src in &srcs {
                    self.offsets(src, mlo, mhi, &mut off);
                    let len = off[off.len() - 1];
                    if len == 0 {
                        continue;
                    }
                    let base = self.b.scratch(len);
                    let (k, cs) = self.chunk_plan(len);
                    let first = self.chunks.len() as u32;
                    for c in 0..k {
                        let at = c * cs;
                        let l = cs.min(len - at);
                        let id = self.b.recv(g, tag(j, c, src), base.sub(at, l), &[]);
                        self.chunks
                            .push((base.offset + at, base.offset + at + l, id));
                    }
                    for (i, pos) in (mlo..mhi).enumerate() {
                        self.b.note_routed(
                            src,
                            self.plan.order[pos] as usize,
                            base.offset + off[i],
                        );
                    }
                    next.push(Packet {
                        src,
                        lo: mlo,
                        hi: mhi,
                        at: Loc::Scratch {
                            start: base.offset,
                            first,
                            end: self.chunks.len() as u32,
                        },
                    });
                }
            }
            // Split what this rank holds.
            let mut children: Vec<(usize, usize)> = Vec::new();
            for p in &held {
                self.offsets(p.src, p.lo, p.hi, &mut off);
                children.clear();
                children.extend(self.plan.children(topo, j, p.lo, p.hi));
                // Start with the domain after this rank's own, so that the domains'
                // ranks do not all send to the same remote domain first (incast).
                if let Some(at) = children.iter().position(|c| c.0 == mlo) {
                    children.rotate_left(at + 1);
                }
                for &(a, b) in &children {
                    if a == mlo {
                        let at = match p.at {
                            Loc::Own => Loc::Own,
                            Loc::Scratch { start, first, end } => Loc::Scratch {
                                start: start + off[a - p.lo],
                                first,
                                end,
                            },
                        };
                        next.push(Packet {
                            src: p.src,
                            lo: a,
                            hi: b,
                            at,
                        });
                        continue;
                    }
                    if off[b - p.lo] == off[a - p.lo] {
                        continue;
                    }
                    if let Some(bpc) = self.spread(b - a) {
                        let k = (b - a).div_ceil(bpc);
                        // Rotated by this rank's node and local index, for egress
                        // models that serve a port's messages in order.
                        let first = (topo.domain(me, child) + topo.local_index(me, child)) % k;
                        for c in (first..k).chain(0..first) {
                            let pa = a + c * bpc;
                            let pb = (pa + bpc).min(b);
                            let target = self.spread_target(me, pa, pb);
                            let region = self.region(p, &off, pa, pb);
                            let deps = std::mem::take(&mut self.deps);
                            self.b.send(target, tag(j, c, p.src), region, &deps);
                            self.deps = deps;
                        }
                        continue;
                    }
                    let d = topo.domain(self.plan.order[a] as usize, child);
                    let peer = topo.aligned_peer(me, child, d);
                    let region = self.region(p, &off, a, b);
                    let (ka, kb) = self.plan.kept(topo, peer, j);
                    let base = off[a - p.lo];
                    let keep = (off[ka - p.lo] - base, off[kb - p.lo] - base);
                    self.send_chunked(peer, j, p.src, region, p, keep);
                }
            }
            std::mem::swap(&mut held, &mut next);
        }
        // Tier 0: straight to the destination. Receives first.
        let (lo, hi) = self.plan.interval(topo, me, 0);
        let layout = self.ctx.layout;
        for pos in lo..hi {
            let g = self.plan.order[pos] as usize;
            if g == me {
                continue;
            }
            srcs.clear();
            self.tier0_sources(g, me, &mut srcs);
            // Relayed: from the last rank before this one on the path.
            let last = self.relay.as_ref().and_then(|r| {
                let p = r.relayed(topo.local_index(g, Level::Node), r.me)?;
                Some((r.ranks[p[p.len() - 2]] as usize, r.me))
            });
            for &src in &srcs {
                let r = layout.recv_region(src);
                if r.len == 0 {
                    continue;
                }
                match last {
                    None => {
                        self.b.recv(g, tag(0, 0, src), r, &[]);
                    }
                    Some((prev, at)) => {
                        let (k, cs) = self.relay_chunks(r.len);
                        for c in 0..k {
                            let piece = r.sub(c * cs, cs.min(r.len - c * cs));
                            self.b.recv(prev, relay_tag(at, c, src), piece, &[]);
                        }
                    }
                }
            }
        }
        for p in &held {
            self.offsets(p.src, p.lo, p.hi, &mut off);
            for pos in p.lo..p.hi {
                if off[pos + 1 - p.lo] == off[pos - p.lo] {
                    continue;
                }
                let q = self.plan.order[pos] as usize;
                let region = self.region(p, &off, pos, pos + 1);
                let deps = std::mem::take(&mut self.deps);
                let first = self.relay.as_ref().and_then(|r| {
                    let at = topo.local_index(q, Level::Node);
                    let path = r.relayed(r.me, at)?;
                    Some((r.ranks[path[1]] as usize, at))
                });
                if q == me {
                    self.b.copy(region, layout.recv_region(p.src), &deps);
                } else if let Some((next, at)) = first {
                    let (k, cs) = self.relay_chunks(region.len);
                    for c in 0..k {
                        let piece = region.sub(c * cs, cs.min(region.len - c * cs));
                        self.b.send(next, relay_tag(at, c, p.src), piece, &deps);
                    }
                } else {
                    self.b.send(q, tag(0, 0, p.src), region, &deps);
                }
                self.deps = deps;
            }
        }
        self.relay_through();
        self.b.finish()
    }
}

pub(crate) fn build(ctx: &BuildCtx<'_>) -> Result<Schedule> {
    let levels = ctx.options.halo_levels(ctx.topology)?;
    if levels.len() >= 15 {
        return Err(CollectiveError::InvalidArgument(
            "too many HALO levels".into(),
        ));
    }
    let plan = Plan::new(ctx.topology, &levels);
    let n = ctx.size();
    let mut b = ScheduleBuilder::new(ctx.rank, n, "halo");
    // Reserved at once instead of grown (growing copies every step pushed so far):
    // at tier 0 at most one receive and one send or copy per block (2N), above it one
    // receive and one send per chunk of each packet (about N / R packets per tier,
    // chunked as the uniform packet of this rank's own blocks would be), a dependency
    // or two per forward, one routed block per rank.
    let r0 = levels
        .first()
        .map_or(1, |&l| ctx.topology.max_domain_size(l).max(1));
    let (k, _) = ctx
        .options
        .chunks(ctx.sizes.bytes(ctx.rank, ctx.rank).saturating_mul(r0));
    let per_tier = 2 * k * (n / r0 + 1);
    b.reserve(2 * n + levels.len() * per_tier + 64, 2 * n + 64);
    b.reserve_routed(n);
    let relay = Relay::new(ctx, &plan.tiers);
    let builder = Builder {
        ctx,
        relay,
        plan,
        b,
        deps: Vec::new(),
        chunks: Vec::new(),
        off: Vec::new(),
        srcs: Vec::new(),
        senders: Vec::new(),
    };
    Ok(builder.run())
}
