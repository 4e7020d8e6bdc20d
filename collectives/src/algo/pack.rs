//! Gathering helpers shared by the builders that pack blocks into messages
//! (`bruck`, `halo2d`): merge pieces that already follow each other, copy the rest
//! into scratch, and track which step wrote which bytes.

use crate::schedule::{Region, ScheduleBuilder, StepId};

/// Where a position's bytes are: a region and the step that wrote it (`None` for the
/// caller's send buffer).
pub(super) type Loc = (Region, Option<StepId>);

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
