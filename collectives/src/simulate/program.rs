//! Compact programs: every rank's schedule flattened into global step arrays, with
//! sends matched to receives.
//!
//! A [`Schedule`] is dropped once it is added, so that 8,192 ranks of the flat
//! fan-out (67 million messages) fit in memory: per step the simulator keeps 12
//! bytes (operation, dependency count, dependants offset), per message 16.

use crate::error::{CollectiveError, Result};
use crate::schedule::{Schedule, Step};

/// Step kinds, in the top two bits of [`Program::op`].
pub(crate) const SEND: u32 = 0;
pub(crate) const RECV: u32 = 1;
pub(crate) const COPY: u32 = 2;
const KIND_SHIFT: u32 = 30;
const INDEX_MASK: u32 = (1 << KIND_SHIFT) - 1;
/// Most messages (or copies) one simulation holds.
const MAX_INDEX: usize = INDEX_MASK as usize;
/// An operation not yet matched.
const UNMATCHED: u32 = u32::MAX;

pub(crate) fn decode(op: u32) -> (u32, usize) {
    (op >> KIND_SHIFT, (op & INDEX_MASK) as usize)
}

fn encode(kind: u32, index: usize) -> u32 {
    (kind << KIND_SHIFT) | index as u32
}

/// A matched send/receive pair.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Msg {
    /// Bytes carried.
    pub(crate) bytes: u64,
    /// Global step id of the send.
    pub(crate) send: u32,
    /// Global step id of the receive.
    pub(crate) recv: u32,
}

/// A local copy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CopyOp {
    pub(crate) bytes: u64,
    pub(crate) step: u32,
}

/// Every rank's steps, flattened: rank `r` owns global steps
/// `rank_start[r]..rank_start[r + 1]`.
#[derive(Debug)]
pub(crate) struct Program {
    pub(crate) n: usize,
    pub(crate) algorithm: &'static str,
    pub(crate) rank_start: Vec<u32>,
    /// Per step: kind << 30 | message or copy index.
    pub(crate) op: Vec<u32>,
    /// Per step: how many steps it depends on.
    pub(crate) ndeps: Vec<u32>,
    /// Dependants of step s: `dependants[dep_start[s]..dep_start[s + 1]]`.
    pub(crate) dep_start: Vec<u32>,
    pub(crate) dependants: Vec<u32>,
    pub(crate) msgs: Vec<Msg>,
    /// Per message: the next message between the same two ranks in the sender's step
    /// order ([`NONE`] for the last).
    pub(crate) next: Vec<u32>,
    pub(crate) copies: Vec<CopyOp>,
}

/// No message.
pub(crate) const NONE: u32 = u32::MAX;

impl Program {
    /// The rank that owns global step `s`.
    pub(crate) fn rank_of(&self, s: u32) -> usize {
        self.rank_start.partition_point(|&x| x <= s) - 1
    }

    pub(crate) fn dependants(&self, s: u32) -> &[u32] {
        let s = s as usize;
        &self.dependants[self.dep_start[s] as usize..self.dep_start[s + 1] as usize]
    }

    /// Words for a step, for error messages.
    pub(crate) fn describe(&self, s: u32) -> String {
        let rank = self.rank_of(s);
        let local = s - self.rank_start[rank];
        let (kind, i) = decode(self.op[s as usize]);
        let what = match kind {
            SEND => {
                let m = self.msgs[i];
                format!("send of {} bytes to rank {}", m.bytes, self.rank_of(m.recv))
            }
            RECV => {
                let m = self.msgs[i];
                format!(
                    "receive of {} bytes from rank {}",
                    m.bytes,
                    self.rank_of(m.send)
                )
            }
            _ => format!("copy of {} bytes", self.copies[i].bytes),
        };
        format!("rank {rank} step {local} ({what})")
    }
}

/// One send or receive awaiting its match.
#[derive(Debug, Clone, Copy)]
struct Key {
    tag: u64,
    len: u64,
    peer: u32,
    step: u32,
}

/// Adds schedules rank by rank, then matches sends with receives.
#[derive(Debug)]
pub(crate) struct ProgramBuilder {
    p: Program,
    sends: Vec<Key>,
    send_start: Vec<usize>,
    recvs: Vec<Key>,
    recv_start: Vec<usize>,
}

fn unmatched_send(a: usize, b: usize, s: &Key) -> CollectiveError {
    CollectiveError::InvalidUsage(format!(
        "rank {a} sends {} bytes to rank {b} with tag {:#x}, which posts no matching receive",
        s.len, s.tag
    ))
}

fn unmatched_recv(b: usize, r: &Key) -> CollectiveError {
    CollectiveError::InvalidUsage(format!(
        "rank {b} receives {} bytes from rank {} with tag {:#x}, which sends no such message",
        r.len, r.peer, r.tag
    ))
}

fn too_large() -> CollectiveError {
    CollectiveError::InvalidArgument(
        "the schedules are too large to simulate (more than 2^32 steps or 2^30 messages)".into(),
    )
}

impl ProgramBuilder {
    pub(crate) fn new(n: usize) -> Self {
        ProgramBuilder {
            p: Program {
                n,
                algorithm: "",
                rank_start: vec![0],
                op: Vec::new(),
                ndeps: Vec::new(),
                dep_start: vec![0],
                dependants: Vec::new(),
                msgs: Vec::new(),
                next: Vec::new(),
                copies: Vec::new(),
            },
            sends: Vec::new(),
            send_start: vec![0],
            recvs: Vec::new(),
            recv_start: vec![0],
        }
    }

    /// Adds the next rank's schedule.
    pub(crate) fn add(&mut self, s: &Schedule) -> Result<()> {
        let rank = self.p.rank_start.len() - 1;
        if s.rank() != rank || s.size() != self.p.n {
            return Err(CollectiveError::InvalidArgument(format!(
                "schedule {rank} is for rank {} of {} ranks; expected rank {rank} of {}",
                s.rank(),
                s.size(),
                self.p.n
            )));
        }
        if rank == 0 {
            self.p.algorithm = s.algorithm();
        } else if self.p.algorithm != s.algorithm() {
            self.p.algorithm = "mixed";
        }
        let base = self.p.op.len();
        let end = base.checked_add(s.len()).filter(|&e| e < u32::MAX as usize);
        let end = end.ok_or_else(too_large)?;
        let (dstart, dlist) = s.dependants();
        let doff = self.p.dependants.len();
        if doff + dlist.len() >= u32::MAX as usize {
            return Err(too_large());
        }
        for (i, step) in s.steps().iter().enumerate() {
            let id = (base + i) as u32;
            let n = self.p.n as u32;
            let key = |peer: u32, tag: u64, len: usize| -> Result<Key> {
                if peer >= n {
                    return Err(CollectiveError::InvalidArgument(format!(
                        "rank {rank} step {i}: peer {peer} out of range for {n} ranks"
                    )));
                }
                Ok(Key {
                    tag,
                    len: len as u64,
                    peer,
                    step: id,
                })
            };
            match *step {
                Step::Send { peer, tag, region } => {
                    self.sends.push(key(peer, tag, region.len)?);
                    self.p.op.push(UNMATCHED);
                }
                Step::Recv { peer, tag, region } => {
                    self.recvs.push(key(peer, tag, region.len)?);
                    self.p.op.push(UNMATCHED);
                }
                Step::Copy { dst, .. } => {
                    if self.p.copies.len() >= MAX_INDEX {
                        return Err(too_large());
                    }
                    self.p.op.push(encode(COPY, self.p.copies.len()));
                    self.p.copies.push(CopyOp {
                        bytes: dst.len as u64,
                        step: id,
                    });
                }
            }
            self.p.ndeps.push(s.deps(i as u32).len() as u32);
            self.p
                .dep_start
                .push((doff + dstart[i + 1] as usize) as u32);
        }
        self.p
            .dependants
            .extend(dlist.iter().map(|&d| d + base as u32));
        self.p.rank_start.push(end as u32);
        self.send_start.push(self.sends.len());
        self.recv_start.push(self.recvs.len());
        Ok(())
    }

    /// Matches every send with the receive of the same (source, destination, tag).
    pub(crate) fn finish(mut self) -> Result<Program> {
        let n = self.p.n;
        if self.p.rank_start.len() != n + 1 {
            return Err(CollectiveError::InvalidArgument(format!(
                "{} schedules for {n} ranks",
                self.p.rank_start.len() - 1
            )));
        }
        for r in 0..n {
            let by_peer = |a: &Key, b: &Key| a.peer.cmp(&b.peer).then(a.tag.cmp(&b.tag));
            self.sends[self.send_start[r]..self.send_start[r + 1]].sort_unstable_by(by_peer);
            self.recvs[self.recv_start[r]..self.recv_start[r + 1]].sort_unstable_by(by_peer);
        }
        if self.sends.len() > MAX_INDEX {
            return Err(too_large());
        }
        self.p.msgs.reserve_exact(self.sends.len());
        self.p.next.reserve_exact(self.sends.len());
        let mut cursor = vec![0usize; n];
        let mut ids: Vec<u32> = Vec::new();
        for a in 0..n {
            let sends = &self.sends[self.send_start[a]..self.send_start[a + 1]];
            let mut i = 0;
            while i < sends.len() {
                let b = sends[i].peer as usize;
                // Runs are short (usually one message): scan, do not bisect.
                let mut j = i + 1;
                while j < sends.len() && sends[j].peer as usize == b {
                    j += 1;
                }
                // Senders come in ascending order, so b's receives from a start at its
                // cursor unless b expects something from a sender that skipped it.
                let recvs = &self.recvs[self.recv_start[b]..self.recv_start[b + 1]];
                let lo = cursor[b];
                if let Some(r) = recvs.get(lo).filter(|r| (r.peer as usize) < a) {
                    return Err(unmatched_recv(b, r));
                }
                let mut hi = lo;
                while hi < recvs.len() && recvs[hi].peer as usize == a {
                    hi += 1;
                }
                cursor[b] = hi;
                let recvs = &recvs[lo..hi];
                let first = self.p.msgs.len();
                let (mut x, mut y) = (i, 0);
                while x < j || y < recvs.len() {
                    let (s, r) = (sends.get(x).filter(|_| x < j), recvs.get(y));
                    if x > i && x < j && sends[x - 1].tag == sends[x].tag {
                        return Err(CollectiveError::InvalidUsage(format!(
                            "rank {a} sends twice to rank {b} with tag {:#x}",
                            sends[x].tag
                        )));
                    }
                    match (s, r) {
                        (Some(s), Some(r)) if s.tag == r.tag => {
                            if r.len != s.len {
                                return Err(CollectiveError::InvalidUsage(format!(
                                    "rank {a} sends {} bytes to rank {b} with tag {:#x}, which expects {}",
                                    s.len, s.tag, r.len
                                )));
                            }
                            let m = self.p.msgs.len();
                            self.p.op[s.step as usize] = encode(SEND, m);
                            self.p.op[r.step as usize] = encode(RECV, m);
                            self.p.msgs.push(Msg {
                                bytes: s.len,
                                send: s.step,
                                recv: r.step,
                            });
                            x += 1;
                            y += 1;
                        }
                        (Some(s), None) => return Err(unmatched_send(a, b, s)),
                        (Some(s), Some(r)) if s.tag < r.tag => {
                            return Err(unmatched_send(a, b, s));
                        }
                        (_, Some(r)) => return Err(unmatched_recv(b, r)),
                        (None, None) => unreachable!("loop condition"),
                    }
                }
                // Chain the pair's messages in the sender's step order.
                self.p.next.resize(self.p.msgs.len(), NONE);
                if self.p.msgs.len() - first > 1 {
                    ids.clear();
                    ids.extend(first as u32..self.p.msgs.len() as u32);
                    ids.sort_unstable_by_key(|&m| self.p.msgs[m as usize].send);
                    for w in ids.windows(2) {
                        self.p.next[w[0] as usize] = w[1];
                    }
                }
                i = j;
            }
        }
        if self.p.msgs.len() != self.recvs.len() {
            let r = self
                .recvs
                .iter()
                .find(|k| self.p.op[k.step as usize] == UNMATCHED)
                .expect("an unmatched receive");
            return Err(unmatched_recv(self.p.rank_of(r.step), r));
        }
        Ok(self.p)
    }
}
