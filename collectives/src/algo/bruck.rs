//! Bruck's all-to-all: `K = ceil(log2 N)` rounds of one message each, for small blocks.
//!
//! Rank `me` looks at its row through a rotation: *position* `i` (0 <= i < N) starts
//! holding the block for `(me + i) mod N`. In round `k` (`d = 2^k`) it sends to
//! `(me + d) mod N` every position `i` with bit `k` set, and receives from
//! `(me - d) mod N` the same positions, which replace its own. After `k` rounds,
//! position `i` of rank `x` holds block `(src, src + i)` with
//! `src = x - (i mod 2^k) (mod N)`; after all `K` rounds it holds the block
//! `(x - i) -> x`. Works for any N >= 1, powers of two or not.
//!
//! No bytes are copied back between rounds: the builder tracks where every position
//! currently is (the send buffer, or the scratch region a round received into).
//! Each round
//! 1. *packs* the outgoing positions into a fresh scratch region, one `Copy` per run of
//!    positions that are already contiguous (a message that is one run is sent as it
//!    is, with no copy);
//! 2. *sends* it as one message (tag = round number) once the copies are done;
//! 3. *receives* into a fresh scratch region — no dependency on anything, so a
//!    rendezvous transport cannot deadlock — or straight into the receive buffer when
//!    every block of the message has reached its destination and their places there
//!    follow each other (the last round, unless the source ranks wrap around N).
//!
//! A message lists its positions in *descending* order, so the blocks that reach their
//! destination in a round (positions `2^k .. 2^(k+1)`, sources `me - i`) come last
//! and in ascending source order: the final copies into the receive buffer merge into
//! about one per round. The self block is one copy from the send buffer. Scratch is
//! written once.
//!
//! All-to-all-v: both ends of a round compute its length from the block sizes they
//! know — the sender its own row and the blocks it received earlier, the receiver its
//! own column and the blocks it is about to receive, all of which it records as
//! routed (`ScheduleBuilder::note_routed`), so the uniform metadata pass teaches
//! every rank the sizes it forwards. Zero-size blocks are skipped; a round whose
//! message would be empty is skipped by both ends.
//!
//! Per rank, uniform blocks of `B` bytes, `N > 1`:
//! - `K` sends and `K` receives (one per round);
//! - `B * S` bytes sent and received, `S = sum_{i=1}^{N-1} popcount(i)`
//!   (`K * N / 2` blocks when N is a power of two) — against `N - 1` for the flat
//!   fan-out: fewer, larger messages at the price of `log2 N / 2` times the bytes;
//! - copies: 1 (self) + the pack runs (at most `S` in total, about `N` in practice)
//!   + the final copies (at most `N - 1`, about `K` to `2K` in practice).

use super::BuildCtx;
use crate::error::Result;
use crate::schedule::{Buf, Region, Schedule, ScheduleBuilder, StepId};

/// Where a position's bytes are: a region and the step that wrote it (`None` for the
/// caller's send buffer).
type Loc = (Region, Option<StepId>);

/// Sorted, de-duplicated dependency list.
pub(super) fn dedup(mut deps: Vec<StepId>) -> Vec<StepId> {
    deps.sort_unstable();
    deps.dedup();
    deps
}

/// One message's bytes, gathered from where they are.
#[derive(Debug)]
pub(super) struct Gathered {
    /// What to send.
    pub(super) region: Region,
    /// The steps that wrote the message's bytes, as `(start, end, step)` with offsets
    /// relative to `region`.
    pub(super) writers: Vec<(usize, usize, StepId)>,
}

impl Gathered {
    /// The steps a piece `[at, at + len)` of the message depends on.
    pub(super) fn deps(&self, at: usize, len: usize) -> Vec<StepId> {
        dedup(
            self.writers
                .iter()
                .filter(|w| w.0 < at + len && w.1 > at)
                .map(|w| w.2)
                .collect(),
        )
    }
}

/// Gathers `pieces` (non-empty regions, in message order, with the step that wrote
/// each) into one region: the pieces themselves when they already follow each other
/// in one buffer, otherwise a fresh scratch region filled by one `Copy` per run of
/// pieces that follow each other. `None` when there is nothing to gather.
pub(super) fn gather(b: &mut ScheduleBuilder, pieces: &[Loc]) -> Option<Gathered> {
    // Runs of pieces that follow each other: (region, writers of the run).
    let mut runs: Vec<(Region, Vec<StepId>)> = Vec::new();
    for &(r, w) in pieces.iter().filter(|p| p.0.len > 0) {
        match runs.last_mut() {
            Some((run, ws)) if run.buf == r.buf && run.end() == r.offset => {
                run.len += r.len;
                ws.extend(w);
            }
            _ => runs.push((r, w.into_iter().collect())),
        }
    }
    match runs.len() {
        0 => None,
        1 => {
            let (region, ws) = runs.pop().expect("one run");
            // Relative ranges of each writer inside the run.
            let mut writers = Vec::with_capacity(ws.len());
            let mut at = 0;
            for &(r, w) in pieces.iter().filter(|p| p.0.len > 0) {
                if let Some(w) = w {
                    writers.push((at, at + r.len, w));
                }
                at += r.len;
            }
            Some(Gathered { region, writers })
        }
        _ => {
            let total: usize = runs.iter().map(|r| r.0.len).sum();
            let pack = b.scratch(total);
            let mut writers = Vec::with_capacity(runs.len());
            let mut at = 0;
            for (r, ws) in runs {
                let c = b.copy(r, pack.sub(at, r.len), &dedup(ws));
                writers.push((at, at + r.len, c));
                at += r.len;
            }
            Some(Gathered {
                region: pack,
                writers,
            })
        }
    }
}

/// Local copies, merged while both the source and the destination continue the
/// previous copy.
#[derive(Debug, Default)]
pub(super) struct CopyRuns {
    cur: Option<(Region, Region, Vec<StepId>)>,
}

impl CopyRuns {
    /// Adds a copy of `src` to `dst` (same length) that depends on `deps`.
    pub(super) fn add(
        &mut self,
        b: &mut ScheduleBuilder,
        src: Region,
        dst: Region,
        deps: &[StepId],
    ) {
        debug_assert_eq!(src.len, dst.len, "copy with different lengths");
        if src.len == 0 {
            return;
        }
        if let Some((s, d, ds)) = &mut self.cur
            && s.buf == src.buf
            && s.end() == src.offset
            && d.buf == dst.buf
            && d.end() == dst.offset
        {
            s.len += src.len;
            d.len += dst.len;
            ds.extend_from_slice(deps);
            return;
        }
        self.flush(b);
        self.cur = Some((src, dst, deps.to_vec()));
    }

    /// Pushes the pending copy.
    pub(super) fn flush(&mut self, b: &mut ScheduleBuilder) {
        if let Some((s, d, ds)) = self.cur.take() {
            b.copy(s, d, &dedup(ds));
        }
    }
}

/// If the regions (in order, empty ones ignored) follow each other in one buffer,
/// the region they make up.
pub(super) fn contiguous(regions: impl IntoIterator<Item = Region>) -> Option<Region> {
    let mut run: Option<Region> = None;
    for r in regions {
        if r.len == 0 {
            continue;
        }
        match &mut run {
            None => run = Some(r),
            Some(x) if x.buf == r.buf && x.end() == r.offset => x.len += r.len,
            Some(_) => return None,
        }
    }
    run
}

pub(crate) fn build(ctx: &BuildCtx<'_>) -> Result<Schedule> {
    let (me, n) = (ctx.rank, ctx.size());
    let layout = ctx.layout;
    let sizes = ctx.sizes;
    let mut b = ScheduleBuilder::new(me, n, "bruck");
    let rounds = n.next_power_of_two().trailing_zeros() as usize;
    b.reserve(3 * n + 2 * rounds, 3 * n);

    let (src, dst) = (layout.send_region(me), layout.recv_region(me));
    if src.len > 0 {
        b.copy(src, dst, &[]);
    }
    // loc[i]: where position i is now. Lengths come from the block sizes.
    let mut loc: Vec<Loc> = (0..n)
        .map(|i| {
            let q = (me + i) % n;
            let r = layout.send_region(q);
            let len = if i == 0 { 0 } else { sizes.bytes(me, q) };
            debug_assert!(i == 0 || r.len == len, "send layout disagrees with sizes");
            (Region::new(Buf::Send, r.offset, len), None)
        })
        .collect();
    // Positions already in the receive buffer.
    let mut placed = vec![false; n];
    let mut pos: Vec<usize> = Vec::with_capacity(n / 2 + 1);
    let mut pieces: Vec<Loc> = Vec::with_capacity(n / 2 + 1);
    // (position, offset in the round's message, length) of what arrives.
    let mut incoming: Vec<(usize, usize, usize)> = Vec::with_capacity(n / 2 + 1);
    for k in 0..rounds {
        let d = 1usize << k;
        let (to, from) = ((me + d) % n, (me + n - d) % n);
        pos.clear();
        pos.extend((1..n).rev().filter(|i| i & d != 0));

        // Receive: position i arrives holding block (src, src + i), src = me - (i mod 2d).
        incoming.clear();
        let mut total = 0usize;
        let mut all_final = true;
        for &i in &pos {
            let low = i & (2 * d - 1);
            let src = (me + n - low) % n;
            let len = sizes.bytes(src, (src + i) % n);
            all_final &= low == i || len == 0;
            incoming.push((i, total, len));
            total += len;
        }
        let mut received: Option<(Region, StepId)> = None;
        if total > 0 {
            // Straight into the receive buffer when every block is final and their
            // places there follow each other.
            let direct = if all_final {
                let mut places = Vec::with_capacity(incoming.len());
                let mut agree = true;
                for &(i, _, len) in incoming.iter().filter(|x| x.2 > 0) {
                    let place = layout.recv_region((me + n - i) % n);
                    agree &= place.len == len;
                    places.push(place);
                }
                contiguous(places).filter(|r| agree && r.buf == Buf::Recv)
            } else {
                None
            };
            match direct {
                Some(region) => {
                    b.recv(from, k as u64, region, &[]);
                    for &(i, _, len) in &incoming {
                        placed[i] = len > 0;
                    }
                }
                None => {
                    let region = b.scratch(total);
                    let id = b.recv(from, k as u64, region, &[]);
                    received = Some((region, id));
                }
            }
        }

        // Send what the positions hold before this round's receive replaces it.
        pieces.clear();
        pieces.extend(pos.iter().map(|&i| loc[i]));
        if let Some(g) = gather(&mut b, &pieces) {
            let deps = g.deps(0, g.region.len);
            b.send(to, k as u64, g.region, &deps);
        }

        // The positions now hold what arrived (nothing to track when it went straight home).
        for &(i, off, len) in &incoming {
            loc[i] = match received {
                Some((region, id)) => {
                    let at = region.sub(off, len);
                    if len > 0 {
                        let src = (me + n - (i & (2 * d - 1))) % n;
                        b.note_routed(src, (src + i) % n, at.offset);
                    }
                    (at, Some(id))
                }
                None => (Region::new(Buf::Scratch, 0, 0), None),
            };
        }
    }

    // Every position i > 0 now holds the block from me - i: copy it home. Descending
    // positions are ascending sources, so blocks received together merge into one copy.
    let mut copies = CopyRuns::default();
    for i in (1..n).rev() {
        let (at, writer) = loc[i];
        if placed[i] || at.len == 0 {
            continue;
        }
        debug_assert_eq!(at.buf, Buf::Scratch, "position {i} never moved");
        let home = layout.recv_region((me + n - i) % n);
        debug_assert_eq!(home.len, at.len, "receive layout disagrees with sizes");
        let deps: Vec<StepId> = writer.into_iter().collect();
        copies.add(&mut b, at, home, &deps);
    }
    copies.flush(&mut b);
    Ok(b.finish())
}
