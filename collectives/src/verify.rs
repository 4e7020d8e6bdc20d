//! The verifier: symbolic execution of every rank's program.
//!
//! It proves, for one set of schedules (one per rank):
//! - every send meets exactly one receive with the same (source, destination, tag)
//!   and the same size, and tags, peers and regions are in range;
//! - the steps, joined by their matches, cannot deadlock: a send and its receive
//!   complete together (rendezvous, the strictest transport), and the graph of
//!   dependencies and matches has no cycle;
//! - every byte of every block from every source lands exactly once at its place in
//!   the destination's receive buffer, and nothing else is written there;
//! - no step reads scratch (or receive) bytes before they are written, and every
//!   read of such bytes depends on the step that wrote them (directly or through
//!   other steps of the same rank), so any execution order gives the same result;
//! - scratch and receive bytes are written at most once (no reuse, so no
//!   write-after-read hazards);
//! - the blocks a schedule lists as routed ([`crate::RoutedBlock`]) really sit there.
//!
//! Content is tracked per byte range (interval maps), not per byte, so large blocks
//! cost no more than small ones.

use crate::error::VerifyError;
use crate::layout::{BlockSizes, Layout, UniformSizes};
use crate::schedule::{Buf, Region, Schedule, Step, StepId, TAG_BITS};
use halo_topology::Topology;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// The buffer layouts of every rank: where each block sits before and after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    n: usize,
    /// Per rank, per peer: (offset, len) in the send buffer.
    send: Vec<Vec<(usize, usize)>>,
    /// Per rank, per peer: (offset, len) in the receive buffer.
    recv: Vec<Vec<(usize, usize)>>,
    /// All-gather: a source's one block is meant for every rank (see [`Expectation::all_gather`]).
    any_dst: bool,
}

impl Expectation {
    /// Uniform all-to-all: `block` bytes per pair, block q at q * block.
    pub fn uniform(n: usize, block: usize) -> Self {
        let row: Vec<(usize, usize)> = (0..n).map(|q| (q * block, block)).collect();
        Expectation {
            n,
            send: vec![row.clone(); n],
            recv: vec![row; n],
            any_dst: false,
        }
    }

    /// All-to-all-v with packed buffers: displacements are prefix sums of the counts in rank order.
    pub fn packed(n: usize, sizes: &dyn BlockSizes) -> Self {
        let mut send = Vec::with_capacity(n);
        let mut recv = Vec::with_capacity(n);
        for r in 0..n {
            let (mut so, mut ro) = (0, 0);
            let mut srow = Vec::with_capacity(n);
            let mut rrow = Vec::with_capacity(n);
            for q in 0..n {
                let s = sizes.bytes(r, q);
                srow.push((so, s));
                so += s;
                let v = sizes.bytes(q, r);
                rrow.push((ro, v));
                ro += v;
            }
            send.push(srow);
            recv.push(rrow);
        }
        Expectation {
            n,
            send,
            recv,
            any_dst: false,
        }
    }

    /// From every rank's layout.
    pub fn from_layouts(layouts: &[Layout<'_>]) -> Self {
        let n = layouts.len();
        let region = |r: Region| (r.offset, r.len);
        Expectation {
            n,
            send: layouts
                .iter()
                .map(|l| (0..n).map(|q| region(l.send_region(q))).collect())
                .collect(),
            recv: layouts
                .iter()
                .map(|l| (0..n).map(|q| region(l.recv_region(q))).collect())
                .collect(),
            any_dst: false,
        }
    }

    /// All-gather: each rank's send buffer is one block of `block` bytes, and every
    /// rank receives the block of rank `q` at `q * block`. The same bytes are meant for
    /// every destination, so a piece of rank `q`'s block may land at any rank.
    pub fn all_gather(n: usize, block: usize) -> Self {
        let send = (0..n)
            .map(|r| {
                (0..n)
                    .map(|q| if q == r { (0, block) } else { (0, 0) })
                    .collect()
            })
            .collect();
        let row: Vec<(usize, usize)> = (0..n).map(|q| (q * block, block)).collect();
        Expectation {
            n,
            send,
            recv: vec![row; n],
            any_dst: true,
        }
    }

    fn buf_len(&self, rank: usize, buf: Buf, scratch: usize) -> usize {
        let end = |v: &Vec<(usize, usize)>| v.iter().map(|(o, l)| o + l).max().unwrap_or(0);
        match buf {
            Buf::Send => end(&self.send[rank]),
            Buf::Recv => end(&self.recv[rank]),
            Buf::Scratch => scratch,
        }
    }
}

/// What a verified set of schedules does, in total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Messages (matched send/receive pairs).
    pub messages: usize,
    /// Bytes carried by messages.
    pub message_bytes: u64,
    /// Local copies.
    pub copies: usize,
    /// Bytes copied.
    pub copy_bytes: u64,
}

/// A piece of some block: bytes `off..off+len` of the block `src -> dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    len: usize,
    src: u32,
    dst: u32,
    off: usize,
    /// The step that wrote it (None: the caller's send buffer).
    writer: Option<StepId>,
}

/// Content of one buffer: start offset -> piece.
#[derive(Debug, Default)]
struct Content(BTreeMap<usize, Piece>);

impl Content {
    /// The pieces covering `[a, a+len)`, or the first unwritten offset.
    fn read(&self, a: usize, len: usize) -> Result<Vec<Piece>, usize> {
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
    fn write(&mut self, a: usize, pieces: &[Piece], writer: StepId) -> Result<(), usize> {
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

struct RankState<'s> {
    schedule: &'s Schedule,
    send: Content,
    recv: Content,
    scratch: Content,
}

impl RankState<'_> {
    fn buf(&self, b: Buf) -> &Content {
        match b {
            Buf::Send => &self.send,
            Buf::Recv => &self.recv,
            Buf::Scratch => &self.scratch,
        }
    }

    fn buf_mut(&mut self, b: Buf) -> &mut Content {
        match b {
            Buf::Send => &mut self.send,
            Buf::Recv => &mut self.recv,
            Buf::Scratch => &mut self.scratch,
        }
    }

    /// Whether `anc` is `step` or one of its ancestors through this rank's dependencies.
    fn depends_on(&self, step: StepId, anc: StepId) -> bool {
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

fn err(
    rank: usize,
    step: Option<StepId>,
    block: Option<(usize, usize)>,
    message: impl Into<String>,
) -> VerifyError {
    VerifyError {
        rank,
        step,
        block,
        message: message.into(),
    }
}

/// Verifies an all-to-all(-v) with packed buffers (displacements are prefix sums of
/// the counts; uniform blocks when `sizes` is uniform).
pub fn verify_all_to_all(
    schedules: &[Schedule],
    topology: &Topology,
    sizes: &dyn BlockSizes,
) -> Result<VerifyReport, VerifyError> {
    let expect = Expectation::packed(topology.size(), sizes);
    verify(schedules, topology, &expect, sizes)
}

/// Verifies an all-gather of `block` bytes per rank ([`Expectation::all_gather`]).
pub fn verify_all_gather(
    schedules: &[Schedule],
    topology: &Topology,
    block: usize,
) -> Result<VerifyReport, VerifyError> {
    let expect = Expectation::all_gather(topology.size(), block);
    verify(schedules, topology, &expect, &UniformSizes(block))
}

/// Verifies one schedule per rank against the expected layouts (see the module docs
/// for what is proven). `sizes` gives the block sizes, used to check routed blocks.
pub fn verify(
    schedules: &[Schedule],
    topology: &Topology,
    expect: &Expectation,
    sizes: &dyn BlockSizes,
) -> Result<VerifyReport, VerifyError> {
    let n = topology.size();
    if schedules.len() != n || expect.n != n {
        return Err(err(
            0,
            None,
            None,
            format!(
                "{} schedules and {} layouts for a topology of {n} ranks",
                schedules.len(),
                expect.n
            ),
        ));
    }
    for (r, s) in schedules.iter().enumerate() {
        if s.rank() != r || s.size() != n {
            return Err(err(
                r,
                None,
                None,
                format!(
                    "schedule says rank {} of {}, expected rank {r} of {n}",
                    s.rank(),
                    s.size()
                ),
            ));
        }
    }

    // 1. Static checks and matching.
    let mut sends: HashMap<(u32, u32, u64), (usize, StepId)> = HashMap::new();
    let mut recvs: HashMap<(u32, u32, u64), (usize, StepId)> = HashMap::new();
    for (r, s) in schedules.iter().enumerate() {
        let in_bounds = |step: StepId, reg: Region| -> Result<(), VerifyError> {
            let cap = expect.buf_len(r, reg.buf, s.scratch_len());
            if reg.end() > cap {
                return Err(err(
                    r,
                    Some(step),
                    None,
                    format!(
                        "region {reg} is outside the {} buffer of {cap} bytes",
                        reg.buf
                    ),
                ));
            }
            Ok(())
        };
        for (i, step) in s.steps().iter().enumerate() {
            let id = i as StepId;
            for &d in s.deps(id) {
                if d >= id {
                    return Err(err(
                        r,
                        Some(id),
                        None,
                        format!("depends on step {d}, which does not come before it"),
                    ));
                }
            }
            match *step {
                Step::Send { peer, tag, region } | Step::Recv { peer, tag, region } => {
                    let is_send = matches!(step, Step::Send { .. });
                    if peer as usize >= n || peer as usize == r {
                        return Err(err(
                            r,
                            Some(id),
                            None,
                            format!("{step}: peer {peer} is not another rank of {n}"),
                        ));
                    }
                    if tag >> TAG_BITS != 0 {
                        return Err(err(
                            r,
                            Some(id),
                            None,
                            format!("{step}: tag uses more than {TAG_BITS} bits"),
                        ));
                    }
                    in_bounds(id, region)?;
                    if region.len == 0 {
                        return Err(err(r, Some(id), None, format!("{step}: empty message")));
                    }
                    if is_send {
                        if let Some((pr, ps)) = sends.insert((r as u32, peer, tag), (r, id)) {
                            return Err(err(
                                r,
                                Some(id),
                                None,
                                format!(
                                    "{step}: crossed tags: rank {pr} step {ps} already sends to rank {peer} with this tag"
                                ),
                            ));
                        }
                    } else {
                        if region.buf == Buf::Send {
                            return Err(err(
                                r,
                                Some(id),
                                None,
                                format!("{step}: receives into the send buffer"),
                            ));
                        }
                        if let Some((_, ps)) = recvs.insert((peer, r as u32, tag), (r, id)) {
                            return Err(err(
                                r,
                                Some(id),
                                None,
                                format!(
                                    "{step}: crossed tags: step {ps} already receives from rank {peer} with this tag"
                                ),
                            ));
                        }
                    }
                }
                Step::Copy { src, dst } => {
                    in_bounds(id, src)?;
                    in_bounds(id, dst)?;
                    if src.len != dst.len {
                        return Err(err(r, Some(id), None, format!("{step}: lengths differ")));
                    }
                    if dst.buf == Buf::Send {
                        return Err(err(
                            r,
                            Some(id),
                            None,
                            format!("{step}: writes the send buffer"),
                        ));
                    }
                    if src.buf == dst.buf && src.offset < dst.end() && dst.offset < src.end() {
                        return Err(err(
                            r,
                            Some(id),
                            None,
                            format!("{step}: source and destination overlap"),
                        ));
                    }
                }
            }
        }
    }
    // Every send has its receive (same size), every receive its send.
    let mut partner: Vec<Vec<Option<(usize, StepId)>>> =
        schedules.iter().map(|s| vec![None; s.len()]).collect();
    for (&(src, dst, tag), &(r, sid)) in &sends {
        let Some(&(q, rid)) = recvs.get(&(src, dst, tag)) else {
            return Err(err(
                r,
                Some(sid),
                None,
                format!(
                    "{}: rank {dst} posts no matching receive (from {src}, tag {tag:#x})",
                    schedules[r].steps()[sid as usize]
                ),
            ));
        };
        let (Step::Send { region: a, .. }, Step::Recv { region: b, .. }) = (
            schedules[r].steps()[sid as usize],
            schedules[q].steps()[rid as usize],
        ) else {
            unreachable!("maps hold sends and receives");
        };
        if a.len != b.len {
            return Err(err(
                r,
                Some(sid),
                None,
                format!(
                    "sends {} bytes to rank {dst} (tag {tag:#x}) but rank {dst} step {rid} receives {} bytes",
                    a.len, b.len
                ),
            ));
        }
        partner[r][sid as usize] = Some((q, rid));
        partner[q][rid as usize] = Some((r, sid));
    }
    for (&(src, dst, tag), &(q, rid)) in &recvs {
        if !sends.contains_key(&(src, dst, tag)) {
            return Err(err(
                q,
                Some(rid),
                None,
                format!(
                    "{}: rank {src} sends nothing to rank {dst} with tag {tag:#x}",
                    schedules[q].steps()[rid as usize]
                ),
            ));
        }
    }

    // 2. Deadlock freedom: Kahn's algorithm over steps, a matched pair released as one.
    let dependants: Vec<(Vec<u32>, Vec<StepId>)> =
        schedules.iter().map(|s| s.dependants()).collect();
    let mut waiting: Vec<Vec<u32>> = schedules
        .iter()
        .map(|s| {
            (0..s.len())
                .map(|i| s.deps(i as StepId).len() as u32)
                .collect()
        })
        .collect();
    let mut queue: VecDeque<(usize, StepId)> = VecDeque::new();
    let mut queued: Vec<Vec<bool>> = schedules.iter().map(|s| vec![false; s.len()]).collect();
    // A pair is ready when both ends have no waiting dependency; it is queued once, by its send.
    let ready = |r: usize, s: StepId, waiting: &Vec<Vec<u32>>| -> Option<(usize, StepId)> {
        if waiting[r][s as usize] != 0 {
            return None;
        }
        match partner[r][s as usize] {
            None => Some((r, s)),
            Some((q, t)) => {
                if waiting[q][t as usize] != 0 {
                    return None;
                }
                // Queue by the send side.
                if matches!(schedules[r].steps()[s as usize], Step::Send { .. }) {
                    Some((r, s))
                } else {
                    Some((q, t))
                }
            }
        }
    };
    for (r, s) in schedules.iter().enumerate() {
        for i in 0..s.len() as StepId {
            if let Some((a, b)) = ready(r, i, &waiting)
                && !queued[a][b as usize]
            {
                queued[a][b as usize] = true;
                queue.push_back((a, b));
            }
        }
    }
    let mut states: Vec<RankState<'_>> = schedules
        .iter()
        .enumerate()
        .map(|(r, s)| {
            let mut send = Content::default();
            for (q, &(off, len)) in expect.send[r].iter().enumerate() {
                if len > 0 {
                    send.0.insert(
                        off,
                        Piece {
                            len,
                            src: r as u32,
                            dst: q as u32,
                            off: 0,
                            writer: None,
                        },
                    );
                }
            }
            RankState {
                schedule: s,
                send,
                recv: Content::default(),
                scratch: Content::default(),
            }
        })
        .collect();
    let mut report = VerifyReport::default();
    let mut executed = 0usize;
    let total: usize = schedules.iter().map(|s| s.len()).sum();

    // Reads `region` on rank `r` for step `id`, checking it was written by an ancestor.
    let read = |states: &Vec<RankState<'_>>,
                r: usize,
                id: StepId,
                region: Region|
     -> Result<Vec<Piece>, VerifyError> {
        let st = &states[r];
        let pieces = st
            .buf(region.buf)
            .read(region.offset, region.len)
            .map_err(|at| {
                let what = if region.buf == Buf::Send {
                    "send-buffer bytes that belong to no block"
                } else {
                    "bytes before they are written"
                };
                err(
                    r,
                    Some(id),
                    None,
                    format!(
                        "{}: reads {what} ({}[{at}])",
                        st.schedule.steps()[id as usize],
                        region.buf
                    ),
                )
            })?;
        for p in &pieces {
            if let Some(w) = p.writer
                && !st.depends_on(id, w)
            {
                return Err(err(
                    r,
                    Some(id),
                    Some((p.src as usize, p.dst as usize)),
                    format!(
                        "{}: reads bytes written by step {w} ({}) without depending on it",
                        st.schedule.steps()[id as usize],
                        st.schedule.steps()[w as usize]
                    ),
                ));
            }
        }
        Ok(pieces)
    };
    let write = |states: &mut Vec<RankState<'_>>,
                 r: usize,
                 id: StepId,
                 region: Region,
                 pieces: &[Piece]|
     -> Result<(), VerifyError> {
        let st = &mut states[r];
        let step = st.schedule.steps()[id as usize];
        st.buf_mut(region.buf)
            .write(region.offset, pieces, id)
            .map_err(|at| {
                err(
                    r,
                    Some(id),
                    None,
                    format!("{step}: writes {}[{at}] a second time", region.buf),
                )
            })
    };

    while let Some((r, s)) = queue.pop_front() {
        let step = schedules[r].steps()[s as usize];
        let mut released: Vec<(usize, StepId)> = vec![(r, s)];
        match step {
            Step::Copy { src, dst } => {
                let pieces = read(&states, r, s, src)?;
                write(&mut states, r, s, dst, &pieces)?;
                report.copies += 1;
                report.copy_bytes += src.len as u64;
            }
            Step::Send { region, .. } => {
                let (q, t) = partner[r][s as usize].expect("matched");
                let pieces = read(&states, r, s, region)?;
                let Step::Recv { region: into, .. } = schedules[q].steps()[t as usize] else {
                    unreachable!("partner of a send is a receive");
                };
                write(&mut states, q, t, into, &pieces)?;
                report.messages += 1;
                report.message_bytes += region.len as u64;
                released.push((q, t));
            }
            Step::Recv { .. } => unreachable!("pairs are queued by their send"),
        }
        for (a, b) in released {
            executed += 1;
            let (start, deps) = &dependants[a];
            for &d in &deps[start[b as usize] as usize..start[b as usize + 1] as usize] {
                waiting[a][d as usize] -= 1;
                if let Some((x, y)) = ready(a, d, &waiting)
                    && !queued[x][y as usize]
                {
                    queued[x][y as usize] = true;
                    queue.push_back((x, y));
                }
            }
        }
    }
    if executed < total {
        // Name the first stuck step of the lowest rank.
        for (r, s) in schedules.iter().enumerate() {
            for i in 0..s.len() {
                if !queued[r][i] && partner[r][i].is_none_or(|(q, t)| !queued[q][t as usize]) {
                    let why = match partner[r][i] {
                        Some((q, t)) if waiting[r][i] == 0 => {
                            format!(
                                "its partner, rank {q} step {t} ({}), never becomes ready",
                                schedules[q].steps()[t as usize]
                            )
                        }
                        _ => {
                            let pending: Vec<StepId> = s
                                .deps(i as StepId)
                                .iter()
                                .copied()
                                .filter(|&d| {
                                    !queued[r][d as usize]
                                        && partner[r][d as usize]
                                            .is_none_or(|(q, t)| !queued[q][t as usize])
                                })
                                .collect();
                            format!("it waits on steps {pending:?} that never complete")
                        }
                    };
                    return Err(err(
                        r,
                        Some(i as StepId),
                        None,
                        format!("deadlock: step {} cannot complete: {why}", s.steps()[i]),
                    ));
                }
            }
        }
        return Err(err(0, None, None, "deadlock"));
    }

    // 3. Every block at its place, exactly once, and nothing else in the receive buffers.
    for (q, st) in states.iter().enumerate() {
        let mut got = vec![0usize; n];
        for (&at, p) in &st.recv.0 {
            let src = p.src as usize;
            let (off, len) = expect.recv[q][src];
            if (!expect.any_dst && p.dst as usize != q) || at != off + p.off || p.off + p.len > len
            {
                return Err(err(
                    q,
                    p.writer,
                    Some((src, p.dst as usize)),
                    format!(
                        "bytes {}..{} of block {src}->{} landed at recv[{at}], expected the block from {src} at recv[{off}..{}]",
                        p.off,
                        p.off + p.len,
                        p.dst,
                        off + len
                    ),
                ));
            }
            got[src] += p.len;
        }
        for (src, &g) in got.iter().enumerate() {
            let (off, len) = expect.recv[q][src];
            if g != len {
                return Err(err(
                    q,
                    None,
                    Some((src, q)),
                    format!(
                        "only {g} of {len} bytes from rank {src} reached recv[{off}..{}]",
                        off + len
                    ),
                ));
            }
        }
        for b in st.schedule.routed() {
            let len = sizes.bytes(b.src as usize, b.dst as usize);
            let ok = match st.scratch.read(b.offset, len) {
                Ok(pieces) => {
                    let mut at = 0;
                    pieces.iter().all(|p| {
                        let good = p.src == b.src && p.dst == b.dst && p.off == at;
                        at += p.len;
                        good
                    })
                }
                Err(_) => false,
            };
            if !ok {
                return Err(err(
                    q,
                    None,
                    Some((b.src as usize, b.dst as usize)),
                    format!(
                        "routed block is not at scratch[{}..{}]",
                        b.offset,
                        b.offset + len
                    ),
                ));
            }
        }
    }
    Ok(report)
}
