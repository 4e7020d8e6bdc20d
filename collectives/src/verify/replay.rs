//! Pass 3: the symbolic replay.
//!
//! Kahn's algorithm over the steps of all ranks, a matched send and receive released
//! as one (rendezvous: they complete together). Each released step moves symbolic
//! [`Piece`]s: a read must find bytes already written, by a step it depends on; a
//! write must find bytes never written before. Steps left over when the queue runs
//! dry are a deadlock, reported by [`deadlock`]. Deadlock freedom and data flow are
//! checked in the same walk: the order of the walk is what makes a read "before" a
//! write.

use super::content::{Content, Piece, RankState};
use super::matching::Partners;
use super::{Expectation, VerifyReport, err};
use crate::broadcast::ROOT_AGREEMENT_TAG;
use crate::error::VerifyError;
use crate::schedule::{Buf, Region, Schedule, Step, StepId};
use std::collections::VecDeque;

/// The state of Kahn's algorithm: unfinished dependencies per step, and the queue
/// of ready steps (a matched pair queued once, by its send).
struct Kahn<'a> {
    schedules: &'a [Schedule],
    partner: &'a Partners,
    /// Per rank, per step: dependencies not yet completed.
    waiting: Vec<Vec<u32>>,
    /// Per rank, per step: whether it has been queued.
    queued: Vec<Vec<bool>>,
    queue: VecDeque<(usize, StepId)>,
}

impl<'a> Kahn<'a> {
    /// Counts every step's dependencies and queues the steps ready from the start.
    fn new(schedules: &'a [Schedule], partner: &'a Partners) -> Self {
        let waiting = schedules
            .iter()
            .map(|s| {
                (0..s.len())
                    .map(|i| s.deps(i as StepId).len() as u32)
                    .collect()
            })
            .collect();
        let mut kahn = Kahn {
            schedules,
            partner,
            waiting,
            queued: schedules.iter().map(|s| vec![false; s.len()]).collect(),
            queue: VecDeque::new(),
        };
        for (r, s) in schedules.iter().enumerate() {
            for i in 0..s.len() as StepId {
                kahn.offer(r, i);
            }
        }
        kahn
    }

    /// A pair is ready when both ends have no waiting dependency; it is queued once,
    /// by its send. Returns what to queue for step `s` of rank `r`, if it is ready.
    fn ready(&self, r: usize, s: StepId) -> Option<(usize, StepId)> {
        if self.waiting[r][s as usize] != 0 {
            return None;
        }
        match self.partner[r][s as usize] {
            None => Some((r, s)),
            Some((q, t)) => {
                if self.waiting[q][t as usize] != 0 {
                    return None;
                }
                // Queue by the send side.
                if matches!(self.schedules[r].steps()[s as usize], Step::Send { .. }) {
                    Some((r, s))
                } else {
                    Some((q, t))
                }
            }
        }
    }

    /// Queues step `s` of rank `r` (or its pair) if it is ready and not yet queued.
    fn offer(&mut self, r: usize, s: StepId) {
        if let Some((a, b)) = self.ready(r, s)
            && !self.queued[a][b as usize]
        {
            self.queued[a][b as usize] = true;
            self.queue.push_back((a, b));
        }
    }
}

/// Replays every schedule symbolically; returns every rank's final buffers and the
/// totals, or the first data-flow error or deadlock.
pub(super) fn replay<'s>(
    schedules: &'s [Schedule],
    expect: &Expectation,
    partner: &Partners,
) -> Result<(Vec<RankState<'s>>, VerifyReport), VerifyError> {
    let dependants: Vec<(Vec<u32>, Vec<StepId>)> =
        schedules.iter().map(|s| s.dependants()).collect();
    let mut kahn = Kahn::new(schedules, partner);
    let mut states = initial_states(schedules, expect);
    let mut report = VerifyReport::default();
    let mut executed = 0usize;
    let total: usize = schedules.iter().map(|s| s.len()).sum();

    while let Some((r, s)) = kahn.queue.pop_front() {
        let step = schedules[r].steps()[s as usize];
        let mut released: Vec<(usize, StepId)> = vec![(r, s)];
        match step {
            Step::Copy { src, dst } => {
                let pieces = read(&states, r, s, src)?;
                write(&mut states, r, s, dst, &pieces)?;
                report.copies += 1;
                report.copy_bytes += src.len as u64;
            }
            Step::Send { region, tag, .. } => {
                let (q, t) = partner[r][s as usize].expect("matched");
                let Step::Recv { region: into, .. } = schedules[q].steps()[t as usize] else {
                    unreachable!("partner of a send is a receive");
                };
                // A rooted collective's agreement message carries only the call's
                // descriptor: its byte is neither read nor written, so a step that
                // used it would read unwritten scratch and fail here.
                if tag == ROOT_AGREEMENT_TAG {
                    report.agreement_messages += 1;
                } else {
                    let pieces = read(&states, r, s, region)?;
                    write(&mut states, q, t, into, &pieces)?;
                    report.messages += 1;
                    report.message_bytes += region.len as u64;
                }
                released.push((q, t));
            }
            Step::Recv { .. } => unreachable!("pairs are queued by their send"),
        }
        for (a, b) in released {
            executed += 1;
            let (start, deps) = &dependants[a];
            for &d in &deps[start[b as usize] as usize..start[b as usize + 1] as usize] {
                kahn.waiting[a][d as usize] -= 1;
                kahn.offer(a, d);
            }
        }
    }
    if executed < total {
        return Err(deadlock(&kahn));
    }
    Ok((states, report))
}

/// Every rank's buffers before the collective: its send buffer holds its blocks, the
/// receive and scratch buffers nothing.
fn initial_states<'s>(schedules: &'s [Schedule], expect: &Expectation) -> Vec<RankState<'s>> {
    schedules
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
        .collect()
}

/// Reads `region` on rank `r` for step `id`, checking it was written by an ancestor.
fn read(
    states: &[RankState<'_>],
    r: usize,
    id: StepId,
    region: Region,
) -> Result<Vec<Piece>, VerifyError> {
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
}

/// Writes `pieces` into `region` on rank `r` for step `id`, checking no byte there
/// was written before.
fn write(
    states: &mut [RankState<'_>],
    r: usize,
    id: StepId,
    region: Region,
    pieces: &[Piece],
) -> Result<(), VerifyError> {
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
}

/// The deadlock report, once the queue ran dry with steps left: names the first
/// stuck step of the lowest rank, and why it is stuck.
fn deadlock(kahn: &Kahn<'_>) -> VerifyError {
    let (queued, partner, waiting) = (&kahn.queued, kahn.partner, &kahn.waiting);
    let schedules = kahn.schedules;
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
                return err(
                    r,
                    Some(i as StepId),
                    None,
                    format!("deadlock: step {} cannot complete: {why}", s.steps()[i]),
                );
            }
        }
    }
    err(0, None, None, "deadlock")
}
