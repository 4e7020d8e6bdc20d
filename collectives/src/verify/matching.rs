//! Pass 2: static checks of every step, then the matching of sends to receives.
//!
//! A step may depend only on earlier steps; a message names another rank, a tag of
//! at most [`TAG_BITS`] bits and a non-empty region inside its buffer; a receive or
//! copy never writes the send buffer; a copy's two regions have one length and do
//! not overlap. Every send then meets exactly one receive with the same (source,
//! destination, tag) and the same length, and every receive its send.

use super::{Expectation, err};
use crate::error::VerifyError;
use crate::schedule::{Buf, Region, Schedule, Step, StepId, TAG_BITS};
use std::collections::HashMap;

/// Per rank, per step: the (rank, step) at the other end of its message, or `None`
/// for a copy.
pub(super) type Partners = Vec<Vec<Option<(usize, StepId)>>>;

/// Posted messages by (source, destination, tag): the (rank, step) that posts it.
type Posts = HashMap<(u32, u32, u64), (usize, StepId)>;

/// Checks every step of every schedule and matches sends to receives; returns the
/// partner table.
pub(super) fn check_and_match(
    schedules: &[Schedule],
    n: usize,
    expect: &Expectation,
) -> Result<Partners, VerifyError> {
    let (sends, recvs) = check_steps(schedules, n, expect)?;
    pair(schedules, &sends, &recvs)
}

/// The static checks; collects the sends and receives, rejecting crossed tags.
fn check_steps(
    schedules: &[Schedule],
    n: usize,
    expect: &Expectation,
) -> Result<(Posts, Posts), VerifyError> {
    let mut sends = Posts::new();
    let mut recvs = Posts::new();
    for (r, s) in schedules.iter().enumerate() {
        for (i, step) in s.steps().iter().enumerate() {
            let at = At {
                rank: r,
                schedule: s,
                id: i as StepId,
                expect,
            };
            at.check_deps()?;
            match *step {
                Step::Send { peer, tag, region } => {
                    at.check_message(step, n, peer, tag, region)?;
                    if let Some((pr, ps)) = sends.insert((r as u32, peer, tag), (r, at.id)) {
                        return Err(at.fail(format!(
                            "{step}: crossed tags: rank {pr} step {ps} already sends to rank {peer} with this tag"
                        )));
                    }
                }
                Step::Recv { peer, tag, region } => {
                    at.check_message(step, n, peer, tag, region)?;
                    if region.buf == Buf::Send {
                        return Err(at.fail(format!("{step}: receives into the send buffer")));
                    }
                    if let Some((_, ps)) = recvs.insert((peer, r as u32, tag), (r, at.id)) {
                        return Err(at.fail(format!(
                            "{step}: crossed tags: step {ps} already receives from rank {peer} with this tag"
                        )));
                    }
                }
                Step::Copy { src, dst } => at.check_copy(step, src, dst)?,
            }
        }
    }
    Ok((sends, recvs))
}

/// The step being checked.
struct At<'a> {
    rank: usize,
    schedule: &'a Schedule,
    id: StepId,
    expect: &'a Expectation,
}

impl At<'_> {
    /// An error at this step.
    fn fail(&self, message: String) -> VerifyError {
        err(self.rank, Some(self.id), None, message)
    }

    /// Dependencies point to earlier steps only.
    fn check_deps(&self) -> Result<(), VerifyError> {
        for &d in self.schedule.deps(self.id) {
            if d >= self.id {
                return Err(self.fail(format!(
                    "depends on step {d}, which does not come before it"
                )));
            }
        }
        Ok(())
    }

    /// The region lies inside its buffer.
    fn in_bounds(&self, reg: Region) -> Result<(), VerifyError> {
        let cap = self
            .expect
            .buf_len(self.rank, reg.buf, self.schedule.scratch_len());
        if reg.end() > cap {
            return Err(self.fail(format!(
                "region {reg} is outside the {} buffer of {cap} bytes",
                reg.buf
            )));
        }
        Ok(())
    }

    /// A send or receive: another rank, a tag in range, a non-empty region in bounds.
    fn check_message(
        &self,
        step: &Step,
        n: usize,
        peer: u32,
        tag: u64,
        region: Region,
    ) -> Result<(), VerifyError> {
        if peer as usize >= n || peer as usize == self.rank {
            return Err(self.fail(format!("{step}: peer {peer} is not another rank of {n}")));
        }
        if tag >> TAG_BITS != 0 {
            return Err(self.fail(format!("{step}: tag uses more than {TAG_BITS} bits")));
        }
        self.in_bounds(region)?;
        if region.len == 0 {
            return Err(self.fail(format!("{step}: empty message")));
        }
        Ok(())
    }

    /// A copy: both regions in bounds, one length, not into the send buffer, no overlap.
    fn check_copy(&self, step: &Step, src: Region, dst: Region) -> Result<(), VerifyError> {
        self.in_bounds(src)?;
        self.in_bounds(dst)?;
        if src.len != dst.len {
            return Err(self.fail(format!("{step}: lengths differ")));
        }
        if dst.buf == Buf::Send {
            return Err(self.fail(format!("{step}: writes the send buffer")));
        }
        if src.buf == dst.buf && src.offset < dst.end() && dst.offset < src.end() {
            return Err(self.fail(format!("{step}: source and destination overlap")));
        }
        Ok(())
    }
}

/// Every send has its receive (same size), every receive its send.
fn pair(schedules: &[Schedule], sends: &Posts, recvs: &Posts) -> Result<Partners, VerifyError> {
    let mut partner: Partners = schedules.iter().map(|s| vec![None; s.len()]).collect();
    for (&(src, dst, tag), &(r, sid)) in sends {
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
    for (&(src, dst, tag), &(q, rid)) in recvs {
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
    Ok(partner)
}
