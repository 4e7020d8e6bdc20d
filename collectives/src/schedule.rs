//! Schedules: one rank's program of sends, receives and copies.

use halo_topology::Rank;
use std::fmt;

/// Which of the caller's buffers a region points into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    /// The caller's send buffer (read only).
    Send,
    /// The caller's receive buffer.
    Recv,
    /// Scratch space owned by the library, [`Schedule::scratch_len`] bytes.
    Scratch,
}

impl fmt::Display for Buf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Buf::Send => "send",
            Buf::Recv => "recv",
            Buf::Scratch => "scratch",
        })
    }
}

/// A byte range of one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    /// The buffer.
    pub buf: Buf,
    /// First byte.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

impl Region {
    /// A region.
    pub const fn new(buf: Buf, offset: usize, len: usize) -> Self {
        Region { buf, offset, len }
    }

    /// One past the last byte.
    pub const fn end(&self) -> usize {
        self.offset + self.len
    }

    /// The sub-region `[at, at + len)` relative to this region's start.
    pub fn sub(&self, at: usize, len: usize) -> Region {
        debug_assert!(at + len <= self.len, "sub-region out of bounds");
        Region::new(self.buf, self.offset + at, len)
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}..{}]", self.buf, self.offset, self.end())
    }
}

/// Message tags carried by schedules use the low [`TAG_BITS`] bits; the communicator
/// puts its own sequence number above them so that collectives never match each
/// other's messages.
pub const TAG_BITS: u32 = 48;

/// One step of a rank's program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Send a region to `peer`; the pair (this rank, `peer`, `tag`) is unique in the collective.
    Send {
        /// Destination rank.
        peer: u32,
        /// Tag, below 2^[`TAG_BITS`].
        tag: u64,
        /// What to send.
        region: Region,
    },
    /// Receive exactly `region.len` bytes from `peer` with `tag` into `region`.
    Recv {
        /// Source rank.
        peer: u32,
        /// Tag, below 2^[`TAG_BITS`].
        tag: u64,
        /// Where the bytes land.
        region: Region,
    },
    /// Copy bytes locally (same length on both sides, non-overlapping).
    Copy {
        /// Read from.
        src: Region,
        /// Write to.
        dst: Region,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Send { peer, tag, region } => {
                write!(f, "send {region} to rank {peer} (tag {tag:#x})")
            }
            Step::Recv { peer, tag, region } => {
                write!(f, "recv {region} from rank {peer} (tag {tag:#x})")
            }
            Step::Copy { src, dst } => write!(f, "copy {src} -> {dst}"),
        }
    }
}

/// The index of a step inside its schedule.
pub type StepId = u32;

/// A block of some rank's data that sits in this rank's scratch once the schedule
/// has run: `(src, dst)` at `offset`. Store-and-forward algorithms list the blocks
/// they route through a rank, so that a uniform pass of the same algorithm over the
/// all-to-all-v *counts* tells every forwarding rank the sizes it will forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutedBlock {
    /// Rank the data comes from.
    pub src: u32,
    /// Rank the data is for.
    pub dst: u32,
    /// Byte offset of the block in scratch.
    pub offset: usize,
}

/// One rank's program for one collective: steps with their dependencies.
///
/// A step may start once every step it depends on has completed. Steps are stored in
/// a valid start order (every dependency comes before its dependants).
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    rank: Rank,
    size: usize,
    algorithm: &'static str,
    steps: Vec<Step>,
    dep_start: Vec<u32>,
    deps: Vec<StepId>,
    scratch_len: usize,
    routed: Vec<RoutedBlock>,
}

impl Schedule {
    /// The rank this program is for.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Number of ranks in the collective.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Name of the algorithm that built it.
    pub fn algorithm(&self) -> &'static str {
        self.algorithm
    }

    /// The steps, in a valid start order.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether the program is empty (a one-rank collective with nothing to copy).
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The steps `step` depends on.
    pub fn deps(&self, step: StepId) -> &[StepId] {
        let s = step as usize;
        &self.deps[self.dep_start[s] as usize..self.dep_start[s + 1] as usize]
    }

    /// Scratch bytes the program needs.
    pub fn scratch_len(&self) -> usize {
        self.scratch_len
    }

    /// Blocks of other ranks that sit in scratch after the program ran (see [`RoutedBlock`]).
    pub fn routed(&self) -> &[RoutedBlock] {
        &self.routed
    }

    /// For each step, the steps that depend on it (the reverse of [`Schedule::deps`]), as CSR.
    pub fn dependants(&self) -> (Vec<u32>, Vec<StepId>) {
        let (mut start, mut out) = (Vec::new(), Vec::new());
        self.dependants_into(&mut start, &mut out);
        (start, out)
    }

    /// [`Schedule::dependants`] into vectors the caller keeps (the executor reuses
    /// them from call to call): `start` gets `len() + 1` offsets into `out`.
    pub fn dependants_into(&self, start: &mut Vec<u32>, out: &mut Vec<StepId>) {
        let n = self.steps.len();
        start.clear();
        start.resize(n + 1, 0);
        for &d in &self.deps {
            start[d as usize + 1] += 1;
        }
        for i in 1..=n {
            start[i] += start[i - 1];
        }
        out.clear();
        out.resize(self.deps.len(), 0);
        // `start[d]` serves as the fill position of `d`'s range (no second vector);
        // once filled, each holds the end of its range, so shifting by one restores them.
        for s in 0..n {
            for &d in self.deps(s as StepId) {
                let at = &mut start[d as usize];
                out[*at as usize] = s as StepId;
                *at += 1;
            }
        }
        // Every `start[d]` now holds the end of its range, the old `start[d + 1]`.
        for i in (1..=n).rev() {
            start[i] = start[i - 1];
        }
        start[0] = 0;
    }

    /// Message and byte counts of this program.
    pub fn stats(&self) -> ScheduleStats {
        let mut st = ScheduleStats::default();
        for s in &self.steps {
            match s {
                Step::Send { region, .. } => {
                    st.sends += 1;
                    st.bytes_sent += region.len as u64;
                }
                Step::Recv { region, .. } => {
                    st.recvs += 1;
                    st.bytes_received += region.len as u64;
                }
                Step::Copy { dst, .. } => {
                    st.copies += 1;
                    st.bytes_copied += dst.len as u64;
                }
            }
        }
        st
    }

    /// A program with its steps edited, for tests that break schedules on purpose.
    /// `edit` gets the steps and the dependency lists and returns nothing.
    pub fn edited(&self, edit: impl FnOnce(&mut Vec<Step>, &mut Vec<Vec<StepId>>)) -> Schedule {
        let mut steps = self.steps.clone();
        let mut deps: Vec<Vec<StepId>> = (0..self.steps.len())
            .map(|s| self.deps(s as StepId).to_vec())
            .collect();
        edit(&mut steps, &mut deps);
        let mut b = ScheduleBuilder::new(self.rank, self.size, self.algorithm);
        b.scratch_len = self.scratch_len;
        b.routed = self.routed.clone();
        for (s, d) in steps.into_iter().zip(deps) {
            b.steps.push(s);
            b.deps.extend(d);
            b.dep_start.push(b.deps.len() as u32);
        }
        b.finish()
    }
}

/// Counts of what one program does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScheduleStats {
    /// Send steps.
    pub sends: usize,
    /// Receive steps.
    pub recvs: usize,
    /// Copy steps.
    pub copies: usize,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Bytes copied locally.
    pub bytes_copied: u64,
}

/// Builds a [`Schedule`] step by step. Dependencies must name steps already pushed.
#[derive(Debug)]
pub struct ScheduleBuilder {
    rank: Rank,
    size: usize,
    algorithm: &'static str,
    steps: Vec<Step>,
    dep_start: Vec<u32>,
    deps: Vec<StepId>,
    scratch_len: usize,
    routed: Vec<RoutedBlock>,
}

impl ScheduleBuilder {
    /// A new, empty program for `rank` of `size`.
    pub fn new(rank: Rank, size: usize, algorithm: &'static str) -> Self {
        ScheduleBuilder {
            rank,
            size,
            algorithm,
            steps: Vec::new(),
            dep_start: vec![0],
            deps: Vec::new(),
            scratch_len: 0,
            routed: Vec::new(),
        }
    }

    /// Reserves capacity for `steps` steps and `deps` dependency entries.
    pub fn reserve(&mut self, steps: usize, deps: usize) {
        self.steps.reserve(steps);
        self.dep_start.reserve(steps);
        self.deps.reserve(deps);
    }

    /// Reserves capacity for `blocks` routed blocks ([`ScheduleBuilder::note_routed`]).
    pub fn reserve_routed(&mut self, blocks: usize) {
        self.routed.reserve(blocks);
    }

    /// Appends a step that may start once `deps` are complete; returns its id.
    pub fn push(&mut self, step: Step, deps: &[StepId]) -> StepId {
        debug_assert!(
            deps.iter().all(|&d| (d as usize) < self.steps.len()),
            "dependency on a later step"
        );
        let id = self.steps.len() as StepId;
        self.steps.push(step);
        // Most steps have no or one dependency: no memcpy call for those.
        match deps {
            [] => {}
            [d] => self.deps.push(*d),
            _ => self.deps.extend_from_slice(deps),
        }
        self.dep_start.push(self.deps.len() as u32);
        id
    }

    /// Appends a send.
    pub fn send(&mut self, peer: Rank, tag: u64, region: Region, deps: &[StepId]) -> StepId {
        self.push(
            Step::Send {
                peer: peer as u32,
                tag,
                region,
            },
            deps,
        )
    }

    /// Appends a receive.
    pub fn recv(&mut self, peer: Rank, tag: u64, region: Region, deps: &[StepId]) -> StepId {
        self.push(
            Step::Recv {
                peer: peer as u32,
                tag,
                region,
            },
            deps,
        )
    }

    /// Appends a copy.
    pub fn copy(&mut self, src: Region, dst: Region, deps: &[StepId]) -> StepId {
        debug_assert_eq!(src.len, dst.len, "copy with different lengths");
        self.push(Step::Copy { src, dst }, deps)
    }

    /// Reserves `len` bytes of scratch and returns their region.
    pub fn scratch(&mut self, len: usize) -> Region {
        let r = Region::new(Buf::Scratch, self.scratch_len, len);
        self.scratch_len += len;
        r
    }

    /// Records that block `(src, dst)` sits at `offset` of scratch once the program ran.
    pub fn note_routed(&mut self, src: Rank, dst: Rank, offset: usize) {
        self.routed.push(RoutedBlock {
            src: src as u32,
            dst: dst as u32,
            offset,
        });
    }

    /// Number of steps so far.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether no step was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The finished program.
    pub fn finish(self) -> Schedule {
        Schedule {
            rank: self.rank,
            size: self.size,
            algorithm: self.algorithm,
            steps: self.steps,
            dep_start: self.dep_start,
            deps: self.deps,
            scratch_len: self.scratch_len,
            routed: self.routed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependants_are_the_reverse_of_deps_also_in_reused_vectors() {
        let mut b = ScheduleBuilder::new(0, 4, "test");
        let r = Region::new(Buf::Send, 0, 1);
        let a = b.send(1, 0, r, &[]);
        let c = b.send(2, 1, r, &[]);
        let d = b.send(3, 2, r, &[a, c]);
        b.send(1, 3, r, &[a]);
        b.send(2, 4, r, &[d, a, c]);
        let s = b.finish();
        let (start, out) = s.dependants();
        assert_eq!(start, vec![0, 3, 5, 6, 6, 6]);
        assert_eq!(out, vec![2, 3, 4, 2, 4, 4]);
        // Vectors left over from a larger schedule give the same answer.
        let (mut start2, mut out2) = (vec![7u32; 40], vec![9; 40]);
        s.dependants_into(&mut start2, &mut out2);
        assert_eq!((start2, out2), (start, out));
    }
}
