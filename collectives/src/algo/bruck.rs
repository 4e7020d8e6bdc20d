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

use super::pack::{CopyRuns, Loc, contiguous, gather};

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
