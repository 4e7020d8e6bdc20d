//! The symbolic buffers of the replay: which piece of which block sits at each byte
//! range of a rank's send, receive and scratch buffers, and which step wrote it.

use crate::schedule::{Buf, Schedule, StepId};
use std::collections::BTreeMap;

/// A piece of some block: bytes `off..off+len` of the block `src -> dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece {
    pub(super) len: usize,
    pub(super) src: u32,
    pub(super) dst: u32,
    pub(super) off: usize,
    /// The step that wrote it (None: the caller's send buffer).
    pub(super) writer: Option<StepId>,
}

/// Content of one buffer: start offset -> piece.
#[derive(Debug, Default)]
pub(super) struct Content(pub(super) BTreeMap<usize, Piece>);

impl Content {
    /// The pieces covering `[a, a+len)`, or the first unwritten offset.
    pub(super) fn read(&self, a: usize, len: usize) -> Result<Vec<Piece>, usize> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let b = a + len;
        let mut out = Vec::new();
        let mut at = a;
        // A piece that starts before `a` may cover it.
        let first = self.0.range(..=a).next_back().map(|(&s, p)| (s, *p));
        let rest = self.0.range(a + 1..b).map(|(&s, p)| (s, *p));
        for (s, p) in first.into_iter().chain(rest) {
            let e = s + p.len;
            if e <= at {
                continue;
            }
            if s > at {
                return Err(at);
            }
            let skip = at - s;
            let take = e.min(b) - at;
            out.push(Piece {
                len: take,
                off: p.off + skip,
                ..p
            });
            at += take;
            if at >= b {
                break;
            }
        }
        if at < b { Err(at) } else { Ok(out) }
    }

    /// Writes pieces at `a`; fails with the first offset already written.
    pub(super) fn write(
        &mut self,
        a: usize,
        pieces: &[Piece],
        writer: StepId,
    ) -> Result<(), usize> {
        let len: usize = pieces.iter().map(|p| p.len).sum();
        let b = a + len;
        if let Some((&s, p)) = self.0.range(..b).next_back()
            && s + p.len > a
        {
            return Err(s.max(a));
        }
        let mut at = a;
        for p in pieces {
            self.0.insert(
                at,
                Piece {
                    writer: Some(writer),
                    ..*p
                },
            );
            at += p.len;
        }
        Ok(())
    }
}

/// One rank's schedule and symbolic buffers during the replay.
pub(super) struct RankState<'s> {
    pub(super) schedule: &'s Schedule,
    pub(super) send: Content,
    pub(super) recv: Content,
    pub(super) scratch: Content,
}

impl RankState<'_> {
    pub(super) fn buf(&self, b: Buf) -> &Content {
        match b {
            Buf::Send => &self.send,
            Buf::Recv => &self.recv,
            Buf::Scratch => &self.scratch,
        }
    }

    pub(super) fn buf_mut(&mut self, b: Buf) -> &mut Content {
        match b {
            Buf::Send => &mut self.send,
            Buf::Recv => &mut self.recv,
            Buf::Scratch => &mut self.scratch,
        }
    }

    /// Whether `anc` is `step` or one of its ancestors through this rank's dependencies.
    pub(super) fn depends_on(&self, step: StepId, anc: StepId) -> bool {
        if step == anc {
            return true;
        }
        if anc > step {
            return false;
        }
        let s = self.schedule;
        if s.deps(step).contains(&anc) {
            return true;
        }
        // Steps are in start order, so ancestors have smaller ids: search backwards,
        // never below `anc`.
        let mut seen = vec![false; (step - anc) as usize + 1];
        let mut stack = vec![step];
        while let Some(x) = stack.pop() {
            for &d in s.deps(x) {
                if d == anc {
                    return true;
                }
                if d > anc && !seen[(d - anc) as usize] {
                    seen[(d - anc) as usize] = true;
                    stack.push(d);
                }
            }
        }
        false
    }
}
