//! All-reduce as data: a plan of exchange rounds with local reductions between them.
//!
//! A schedule has no reduction step (it only moves bytes), so an all-reduce is a sequence of
//! *rounds*. In a round a rank sends a range of its accumulator to one peer and/or
//! receives a range from one peer (each round runs as a small [`exchange`] schedule);
//! after the round the received elements are either reduced into the accumulator or
//! replace part of it ([`Landing`]). Both ends of a message compute the same ranges, so
//! they always agree on its size.
//!
//! Non-power-of-two sizes are folded in first (MPICH's scheme): with `p` the largest
//! power of two <= N and `e = N - p`, each even rank `r < 2e` sends its vector to `r + 1`
//! and sits out; the `p` remaining ranks run the power-of-two algorithm on *new ranks*;
//! at the end each odd rank `r < 2e` sends the result back to `r - 1`.
//!
//! | algorithm | rounds (p = 2^k) | bytes sent per rank | for |
//! |---|---|---|---|
//! | [`AllReduceAlgorithm::RecursiveDoubling`] | log2 p | log2 p x L | small vectors |
//! | [`AllReduceAlgorithm::Rabenseifner`] | 2 log2 p | about 2 x L | large vectors |
//!
//! Rabenseifner is a reduce-scatter by recursive halving (rank `i` ends up owning the
//! fully reduced segment `i` of `p`, segment `i` being elements `i*L/p .. (i+1)*L/p`)
//! followed by an all-gather by recursive doubling.
//!
//! **Identical results on every rank.** Every reduction combines two partial results
//! in a fixed operand order — the one covering the lower ranks first — so both ends of a
//! recursive-doubling exchange compute the same expression, and in Rabenseifner each
//! element is reduced on one rank only and then copied. [`verify_all_reduce`] proves it
//! for any plan: it tracks the expression tree of every element on every rank and
//! checks that all ranks end with the *same* tree, containing every rank exactly once.
//! So with a deterministic element-wise operation the bits are equal on every rank.

use crate::error::{CollectiveError, Result, VerifyError};
use crate::schedule::{Region, Schedule, ScheduleBuilder};
use halo_topology::Rank;
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

/// An all-reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllReduceAlgorithm {
    /// log2 p rounds, each exchanging the whole vector: latency-optimal, for small vectors.
    RecursiveDoubling,
    /// Reduce-scatter by recursive halving, then all-gather by recursive doubling:
    /// about 2 x L bytes per rank, for large vectors.
    Rabenseifner,
}

/// Bytes per rank up to which the automatic choice takes recursive doubling.
pub const ALL_REDUCE_SMALL: usize = 8 << 10;

impl AllReduceAlgorithm {
    /// Every all-reduce algorithm.
    pub const ALL: [AllReduceAlgorithm; 2] = [
        AllReduceAlgorithm::RecursiveDoubling,
        AllReduceAlgorithm::Rabenseifner,
    ];

    /// The name used on command lines and in output.
    pub fn name(self) -> &'static str {
        match self {
            AllReduceAlgorithm::RecursiveDoubling => "recursive-doubling",
            AllReduceAlgorithm::Rabenseifner => "rabenseifner",
        }
    }

    /// The automatic choice for `size` ranks and vectors of `len` elements, `bytes` bytes:
    /// recursive doubling up to [`ALL_REDUCE_SMALL`] bytes or fewer elements than ranks,
    /// Rabenseifner above.
    pub fn auto(size: usize, len: usize, bytes: usize) -> AllReduceAlgorithm {
        if bytes <= ALL_REDUCE_SMALL || len < size {
            AllReduceAlgorithm::RecursiveDoubling
        } else {
            AllReduceAlgorithm::Rabenseifner
        }
    }
}

impl fmt::Display for AllReduceAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AllReduceAlgorithm {
    type Err = CollectiveError;

    fn from_str(s: &str) -> Result<Self> {
        AllReduceAlgorithm::ALL
            .iter()
            .copied()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                CollectiveError::InvalidArgument(format!(
                    "unknown all-reduce algorithm '{s}' (expected recursive-doubling or rabenseifner)"
                ))
            })
    }
}

/// A range of accumulator elements moved to or from one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// The other rank.
    pub peer: Rank,
    /// Elements of the accumulator.
    pub range: Range<usize>,
}

/// What happens to received elements after their round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landing {
    /// They arrive in a temporary buffer and are reduced into the accumulator's range:
    /// `acc = peer ⊕ acc` when `peer_first` (the peer's partial covers lower ranks),
    /// else `acc = acc ⊕ peer`.
    Reduce {
        /// Whether the received operand comes first.
        peer_first: bool,
    },
    /// They are final values and land straight in the accumulator's range, which the
    /// round's send does not read.
    Replace,
}

/// One round of an all-reduce on one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReduceRound {
    /// The message tag of this round (the round's index in the whole plan, the same on
    /// every rank).
    pub tag: u64,
    /// What this rank sends, if anything.
    pub send: Option<Transfer>,
    /// What this rank receives, if anything.
    pub recv: Option<Transfer>,
    /// What happens to the received elements.
    pub landing: Landing,
}

/// Elements of segment `i` of `p` over `len` elements.
fn segment(i: usize, p: usize, len: usize) -> usize {
    ((i as u128 * len as u128) / p as u128) as usize
}

/// Builds `rank`'s all-reduce plan for `size` ranks and vectors of `len` elements.
/// Rounds with nothing to do on this rank are left out; tags are global round numbers.
///
/// # Errors
/// [`CollectiveError::InvalidArgument`] when `rank` is out of range.
pub fn all_reduce_plan(
    algorithm: AllReduceAlgorithm,
    rank: Rank,
    size: usize,
    len: usize,
) -> Result<Vec<ReduceRound>> {
    if rank >= size {
        return Err(CollectiveError::InvalidArgument(format!(
            "rank {rank} out of range for {size} ranks"
        )));
    }
    let mut out = Vec::new();
    if size == 1 || len == 0 {
        return Ok(out);
    }
    let p = 1usize << (usize::BITS - 1 - size.leading_zeros());
    let extra = size - p;
    let levels = p.trailing_zeros() as u64;
    let whole = 0..len;
    let real = |nr: usize| if nr < extra { 2 * nr + 1 } else { nr + extra };
    let new_rank = if rank < 2 * extra {
        (!rank.is_multiple_of(2)).then_some(rank / 2)
    } else {
        Some(rank - extra)
    };
    let mut tag = 0u64;
    if extra > 0 {
        if rank < 2 * extra {
            out.push(if rank.is_multiple_of(2) {
                ReduceRound {
                    tag,
                    send: Some(Transfer {
                        peer: rank + 1,
                        range: whole.clone(),
                    }),
                    recv: None,
                    landing: Landing::Replace,
                }
            } else {
                ReduceRound {
                    tag,
                    send: None,
                    recv: Some(Transfer {
                        peer: rank - 1,
                        range: whole.clone(),
                    }),
                    landing: Landing::Reduce { peer_first: true },
                }
            });
        }
        tag += 1;
    }
    let middle = match algorithm {
        AllReduceAlgorithm::RecursiveDoubling => levels,
        AllReduceAlgorithm::Rabenseifner => 2 * levels,
    };
    if let Some(nr) = new_rank {
        match algorithm {
            AllReduceAlgorithm::RecursiveDoubling => {
                for k in 0..levels {
                    let pnr = nr ^ (1 << k);
                    let peer = real(pnr);
                    out.push(ReduceRound {
                        tag: tag + k,
                        send: Some(Transfer {
                            peer,
                            range: whole.clone(),
                        }),
                        recv: Some(Transfer {
                            peer,
                            range: whole.clone(),
                        }),
                        landing: Landing::Reduce {
                            peer_first: pnr < nr,
                        },
                    });
                }
            }
            AllReduceAlgorithm::Rabenseifner => {
                let elems = |a: usize, b: usize| segment(a, p, len)..segment(b, p, len);
                // Reduce-scatter by recursive halving: segments [lo, hi) shrink to {nr}.
                let (mut lo, mut hi) = (0usize, p);
                for (j, k) in (0..levels).rev().enumerate() {
                    let d = 1usize << k;
                    let pnr = nr ^ d;
                    let peer = real(pnr);
                    let mid = lo + (hi - lo) / 2;
                    let (keep, give) = if nr & d == 0 {
                        ((lo, mid), (mid, hi))
                    } else {
                        ((mid, hi), (lo, mid))
                    };
                    let (send, recv) = (elems(give.0, give.1), elems(keep.0, keep.1));
                    push_nonempty(
                        &mut out,
                        tag + j as u64,
                        peer,
                        send,
                        recv,
                        Landing::Reduce {
                            peer_first: pnr < nr,
                        },
                    );
                    (lo, hi) = keep;
                }
                // All-gather by recursive doubling: [lo, hi) grows back to [0, p).
                for k in 0..levels {
                    let d = 1usize << k;
                    let peer = real(nr ^ d);
                    let theirs = if nr & d == 0 {
                        (hi, hi + d)
                    } else {
                        (lo - d, lo)
                    };
                    push_nonempty(
                        &mut out,
                        tag + levels + k,
                        peer,
                        elems(lo, hi),
                        elems(theirs.0, theirs.1),
                        Landing::Replace,
                    );
                    (lo, hi) = (lo.min(theirs.0), hi.max(theirs.1));
                }
            }
        }
    }
    tag += middle;
    if extra > 0 && rank < 2 * extra {
        out.push(if !rank.is_multiple_of(2) {
            ReduceRound {
                tag,
                send: Some(Transfer {
                    peer: rank - 1,
                    range: whole,
                }),
                recv: None,
                landing: Landing::Replace,
            }
        } else {
            ReduceRound {
                tag,
                send: None,
                recv: Some(Transfer {
                    peer: rank + 1,
                    range: whole,
                }),
                landing: Landing::Replace,
            }
        });
    }
    Ok(out)
}

/// Appends a round, leaving out empty ranges (both ends compute the same ranges, so
/// they leave out the same messages).
fn push_nonempty(
    out: &mut Vec<ReduceRound>,
    tag: u64,
    peer: Rank,
    send: Range<usize>,
    recv: Range<usize>,
    landing: Landing,
) {
    let send = (!send.is_empty()).then_some(Transfer { peer, range: send });
    let recv = (!recv.is_empty()).then_some(Transfer { peer, range: recv });
    if send.is_some() || recv.is_some() {
        out.push(ReduceRound {
            tag,
            send,
            recv,
            landing,
        });
    }
}

/// A program of at most one receive and one send, both posted at once (receive
/// first): one round of an all-reduce, or a point-to-point operation.
///
/// Zero-length regions are allowed here (a point-to-point message may be empty); the
/// verifier rejects them in collective schedules.
pub fn exchange(
    rank: Rank,
    size: usize,
    name: &'static str,
    tag: u64,
    send: Option<(Rank, Region)>,
    recv: Option<(Rank, Region)>,
) -> Schedule {
    let mut b = ScheduleBuilder::new(rank, size, name);
    b.reserve(2, 0);
    if let Some((peer, region)) = recv {
        b.recv(peer, tag, region, &[]);
    }
    if let Some((peer, region)) = send {
        b.send(peer, tag, region, &[]);
    }
    b.finish()
}

/// What a verified set of all-reduce plans does, in total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReduceReport {
    /// Messages.
    pub messages: usize,
    /// Elements carried by messages.
    pub elements: u64,
    /// Element-wise reductions, over all ranks.
    pub reductions: u64,
    /// Rounds (distinct tags).
    pub rounds: usize,
}

/// An expression: a leaf (a rank's input) or a reduction of two expressions, in order.
#[derive(Debug, Default)]
pub(crate) struct Exprs {
    nodes: Vec<(u32, u32)>,
    interned: HashMap<(u32, u32), u32>,
    leaves: u32,
}

impl Exprs {
    fn op(&mut self, a: u32, b: u32) -> u32 {
        let next = self.leaves + self.nodes.len() as u32;
        *self.interned.entry((a, b)).or_insert_with(|| {
            self.nodes.push((a, b));
            next
        })
    }

    /// How often each rank occurs in expression `e`, memoised.
    pub(crate) fn counts<'m>(&self, e: u32, memo: &'m mut HashMap<u32, Vec<u32>>) -> &'m [u32] {
        if !memo.contains_key(&e) {
            let n = self.leaves as usize;
            let v = if e < self.leaves {
                let mut v = vec![0; n];
                v[e as usize] = 1;
                v
            } else {
                let (a, b) = self.nodes[(e - self.leaves) as usize];
                let va = self.counts(a, memo).to_vec();
                let vb = self.counts(b, memo);
                va.iter().zip(vb).map(|(x, y)| x + y).collect()
            };
            memo.insert(e, v);
        }
        &memo[&e]
    }
}

pub(crate) fn verr(rank: usize, message: impl Into<String>) -> VerifyError {
    VerifyError {
        rank,
        step: None,
        block: None,
        message: message.into(),
    }
}

/// Verifies one all-reduce plan per rank for vectors of `len` elements, symbolically:
/// - tags ascend on every rank, ranges are inside the vector, a round's `Replace`
///   range does not overlap what the same round sends;
/// - in every round each send meets exactly one receive from the same rank with the
///   same number of elements, and each receive one send (so executing the rounds in
///   tag order cannot deadlock);
/// - at the end every element of every rank holds the *same* expression — the same
///   reductions in the same operand order, hence bitwise-equal results for any
///   deterministic operation — and that expression contains every rank's input
///   exactly once.
pub fn verify_all_reduce(
    plans: &[Vec<ReduceRound>],
    len: usize,
) -> std::result::Result<ReduceReport, VerifyError> {
    let (acc, exprs, report) = replay_rounds(plans, len)?;
    let n = plans.len();
    // The same complete expression everywhere.
    let mut memo = HashMap::new();
    for (i, &e) in acc[0].iter().enumerate() {
        if let Some(r) = (1..n).find(|&r| acc[r][i] != e) {
            return Err(verr(
                r,
                format!(
                    "element {i} is reduced differently than on rank 0 (results could differ in the last bits)"
                ),
            ));
        }
        if let Some((q, c)) = exprs
            .counts(e, &mut memo)
            .iter()
            .enumerate()
            .find(|(_, c)| **c != 1)
        {
            return Err(verr(
                0,
                format!("element {i} holds the input of rank {q} {c} times"),
            ));
        }
    }
    Ok(report)
}

/// The symbolic run of one reduce plan per rank over vectors of `len` elements (the
/// static checks and the matching of [`verify_all_reduce`]): every rank's accumulator
/// as expressions, the expressions, and the totals.
pub(crate) fn replay_rounds(
    plans: &[Vec<ReduceRound>],
    len: usize,
) -> std::result::Result<(Vec<Vec<u32>>, Exprs, ReduceReport), VerifyError> {
    let n = plans.len();
    let mut report = ReduceReport::default();
    if n == 0 {
        return Err(verr(0, "no plans"));
    }
    // Static checks.
    for (r, plan) in plans.iter().enumerate() {
        for w in plan.windows(2) {
            if w[1].tag <= w[0].tag {
                return Err(verr(
                    r,
                    format!("tag {} follows tag {}", w[1].tag, w[0].tag),
                ));
            }
        }
        for round in plan {
            for t in round.send.iter().chain(&round.recv) {
                if t.range.end > len || t.range.start > t.range.end {
                    return Err(verr(
                        r,
                        format!(
                            "round {}: range {:?} outside {len} elements",
                            round.tag, t.range
                        ),
                    ));
                }
                if t.peer >= n || t.peer == r {
                    return Err(verr(r, format!("round {}: peer {}", round.tag, t.peer)));
                }
            }
            if let (Some(s), Some(v), Landing::Replace) = (&round.send, &round.recv, round.landing)
                && s.range.start < v.range.end
                && v.range.start < s.range.end
            {
                return Err(verr(
                    r,
                    format!(
                        "round {}: receives {:?} into the accumulator while sending {:?} from it",
                        round.tag, v.range, s.range
                    ),
                ));
            }
        }
    }
    // Rounds by tag.
    let mut tags: Vec<u64> = plans.iter().flatten().map(|x| x.tag).collect();
    tags.sort_unstable();
    tags.dedup();
    report.rounds = tags.len();
    let mut exprs = Exprs {
        leaves: n as u32,
        ..Exprs::default()
    };
    let mut acc: Vec<Vec<u32>> = (0..n).map(|r| vec![r as u32; len]).collect();
    let mut next = vec![0usize; n];
    for tag in tags {
        let rounds: Vec<Option<&ReduceRound>> = (0..n)
            .map(|r| {
                let x = plans[r].get(next[r]).filter(|x| x.tag == tag);
                if x.is_some() {
                    next[r] += 1;
                }
                x
            })
            .collect();
        // Match and read every payload before any rank updates.
        let mut payloads: Vec<Option<Vec<u32>>> = vec![None; n];
        for (r, round) in rounds.iter().enumerate() {
            let Some(round) = round else { continue };
            if let Some(s) = &round.send {
                let q = s.peer;
                let Some(v) = rounds[q]
                    .and_then(|x| x.recv.as_ref())
                    .filter(|v| v.peer == r)
                else {
                    return Err(verr(
                        r,
                        format!("round {tag}: sends to rank {q}, which receives nothing from it"),
                    ));
                };
                if v.range.len() != s.range.len() {
                    return Err(verr(
                        r,
                        format!(
                            "round {tag}: sends {} elements to rank {q}, which receives {}",
                            s.range.len(),
                            v.range.len()
                        ),
                    ));
                }
                payloads[q] = Some(acc[r][s.range.clone()].to_vec());
                report.messages += 1;
                report.elements += s.range.len() as u64;
            }
        }
        for (q, round) in rounds.iter().enumerate() {
            let Some(round) = round else { continue };
            let Some(v) = &round.recv else { continue };
            let Some(data) = payloads[q].take() else {
                return Err(verr(
                    q,
                    format!(
                        "round {tag}: receives from rank {}, which sends nothing to it",
                        v.peer
                    ),
                ));
            };
            for (i, e) in v.range.clone().zip(data) {
                acc[q][i] = match round.landing {
                    Landing::Replace => e,
                    Landing::Reduce { peer_first: true } => exprs.op(e, acc[q][i]),
                    Landing::Reduce { peer_first: false } => exprs.op(acc[q][i], e),
                };
            }
            if matches!(round.landing, Landing::Reduce { .. }) {
                report.reductions += v.range.len() as u64;
            }
        }
    }
    Ok((acc, exprs, report))
}
