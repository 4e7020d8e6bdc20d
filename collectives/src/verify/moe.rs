//! The MoE dispatch and combine checker ([`verify_moe`]).
//!
//! The three schedules of a plan ([`crate::build_moe_dispatch`],
//! [`crate::build_moe_gather`], [`crate::build_moe_return`]) go through the same
//! passes as every other schedule — shape, matching, the symbolic replay (deadlock
//! freedom, read-before-write, dependencies on writers, single writes) — with the
//! caller's buffers as one block per rank. Placement is then checked against the
//! routing itself ([`MoeRoutes`]), not the plans:
//!
//! - **dispatch**: row `p` of rank `q`'s receive buffer holds exactly the bytes of
//!   token `t` of rank `s`, where `(e, s, t)` is the `p`-th of the `(expert, source,
//!   token)` pairs routed to `q`, ascending — so every (token, expert) pair is
//!   delivered exactly once, at its place, and nothing else is written there;
//! - **combine**: at each relay, every gathered row is the output row of the expert
//!   the relay entry names for that (token, slot); every partial returned to a source
//!   is the relay's partial of that source's token; and for every token, the
//!   contributions the source adds (its send groups in order, each partial in slot
//!   order) are **exactly its k experts, each once, in (node ascending, slot
//!   ascending) order** — the summation order both modes share.

use super::content::RankState;
use super::{Expectation, VerifyReport, err, matching, replay, shape};
use crate::algo::moe::{
    MoeOrigin, MoePlan, MoeRoutes, build_moe_dispatch, build_moe_gather, build_moe_return,
    moe_node_of,
};
use crate::error::VerifyError;
use crate::schedule::{Schedule, Step};
use halo_topology::Topology;

/// What [`verify_moe`] proved, with the traffic of each schedule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoeVerifyReport {
    /// The dispatch's messages and copies.
    pub dispatch: VerifyReport,
    /// The combine's gather (outputs to the relays).
    pub gather: VerifyReport,
    /// The combine's return (partials to the sources).
    pub returned: VerifyReport,
    /// Bytes the dispatch sends between ranks on different nodes.
    pub dispatch_inter_node_bytes: u64,
    /// Bytes the combine (gather and return) sends between ranks on different nodes.
    pub combine_inter_node_bytes: u64,
}

/// An expectation with one block per rank: `send_rows` rows in the send buffer,
/// `recv_rows` rows in the receive buffer.
fn one_block(send_rows: &[usize], recv_rows: &[usize], row: usize) -> Expectation {
    let n = send_rows.len();
    let send = (0..n)
        .map(|r| {
            (0..n)
                .map(|q| {
                    if q == r {
                        (0, send_rows[r] * row)
                    } else {
                        (0, 0)
                    }
                })
                .collect()
        })
        .collect();
    let recv = (0..n)
        .map(|r| {
            (0..n)
                .map(|q| {
                    if q == 0 {
                        (0, recv_rows[r] * row)
                    } else {
                        (0, 0)
                    }
                })
                .collect()
        })
        .collect();
    Expectation {
        n,
        send,
        recv,
        any_dst: false,
    }
}

fn run<'s>(
    schedules: &'s [Schedule],
    topology: &Topology,
    expect: &Expectation,
) -> Result<(Vec<RankState<'s>>, VerifyReport), VerifyError> {
    shape::check(schedules, topology, expect)?;
    let partners = matching::check_and_match(schedules, topology.size(), expect)?;
    replay::replay(schedules, expect, &partners)
}

/// Row `p` of `rank`'s receive buffer: `(source rank, row of its send buffer)`.
fn row_at(
    states: &[RankState<'_>],
    rank: usize,
    p: usize,
    row: usize,
) -> Result<(usize, usize), VerifyError> {
    let pieces = states[rank].recv.read(p * row, row).map_err(|at| {
        err(
            rank,
            None,
            None,
            format!("receive row {p}: byte {at} was never written"),
        )
    })?;
    let first = pieces[0];
    let mut off = first.off;
    for pc in &pieces {
        if pc.src != first.src || pc.off != off {
            return Err(err(
                rank,
                pc.writer,
                None,
                format!(
                    "receive row {p} is not one whole row: it mixes bytes of ranks {} and {} or out of order",
                    first.src, pc.src
                ),
            ));
        }
        off += pc.len;
    }
    if !first.off.is_multiple_of(row) {
        return Err(err(
            rank,
            first.writer,
            None,
            format!(
                "receive row {p} starts at byte {} of rank {}'s buffer, not at a row",
                first.off, first.src
            ),
        ));
    }
    Ok((first.src as usize, first.off / row))
}

fn inter_node(schedules: &[Schedule], topology: &Topology) -> u64 {
    let mut bytes = 0;
    for s in schedules {
        let me = moe_node_of(topology, s.rank());
        for step in s.steps() {
            if let Step::Send { peer, region, .. } = step
                && moe_node_of(topology, *peer as usize) != me
            {
                bytes += region.len as u64;
            }
        }
    }
    bytes
}

/// Builds and verifies the dispatch, gather and return schedules of `plans` (one per
/// rank, as [`crate::moe_plans`] makes them) against `routes`; see the module
/// documentation for what is proven.
pub fn verify_moe(
    topology: &Topology,
    routes: &MoeRoutes,
    plans: &[MoePlan],
) -> Result<MoeVerifyReport, VerifyError> {
    let n = topology.size();
    if plans.len() != n || routes.experts.len() != n {
        return Err(err(
            0,
            None,
            None,
            format!(
                "{} plans and {} routings for {n} ranks",
                plans.len(),
                routes.experts.len()
            ),
        ));
    }
    let build = |f: fn(&MoePlan) -> crate::Result<Schedule>| -> Result<Vec<Schedule>, VerifyError> {
        plans
            .iter()
            .enumerate()
            .map(|(r, p)| f(p).map_err(|e| err(r, None, None, format!("building: {e}"))))
            .collect()
    };
    let row = plans[0].row;
    if let Some((r, _)) = plans
        .iter()
        .enumerate()
        .find(|(r, p)| p.row != row || p.rank as usize != *r)
    {
        return Err(err(
            r,
            None,
            None,
            "plans disagree on the row size or are out of rank order",
        ));
    }
    let k = routes.top_k.max(1);
    let expected: Vec<Vec<(u32, u32, u32)>> = (0..n).map(|q| routes.expected_rows(q)).collect();
    let tokens: Vec<usize> = (0..n).map(|r| routes.tokens(r)).collect();
    let mut report = MoeVerifyReport::default();

    // Dispatch.
    let dispatch = build(build_moe_dispatch)?;
    let recv_rows: Vec<usize> = expected.iter().map(Vec::len).collect();
    let (states, rep) = run(&dispatch, topology, &one_block(&tokens, &recv_rows, row))?;
    report.dispatch = rep;
    report.dispatch_inter_node_bytes = inter_node(&dispatch, topology);
    for (q, rows) in expected.iter().enumerate() {
        for (p, &(e, s, t)) in rows.iter().enumerate() {
            let got = row_at(&states, q, p, row)?;
            if got != (s as usize, t as usize) {
                return Err(err(
                    q,
                    None,
                    Some((s as usize, q)),
                    format!(
                        "receive row {p} should be token {t} of rank {s} (expert {e}), holds token {} of rank {}",
                        got.1, got.0
                    ),
                ));
            }
        }
    }
    drop(states);

    // Gather: outputs (the dispatch's receive order) to the relays.
    let gather = build(build_moe_gather)?;
    let gather_rows: Vec<usize> = plans.iter().map(MoePlan::gather_rows).collect();
    let (states, rep) = run(&gather, topology, &one_block(&recv_rows, &gather_rows, row))?;
    report.gather = rep;
    // Per relay, per entry, per token: the (expert, source, token) of each slot's output.
    let mut partial: Vec<Vec<Vec<Vec<MoeOrigin>>>> = Vec::with_capacity(n);
    for (r, plan) in plans.iter().enumerate() {
        let offs = plan.gather_offsets();
        let mut per_entry = Vec::with_capacity(plan.relays.len());
        for (ei, e) in plan.relays.iter().enumerate() {
            let mut per_token = Vec::with_capacity(e.tokens.len());
            for (i, list) in e.experts.iter().enumerate() {
                let mut got = Vec::with_capacity(list.len());
                for (j, &x) in list.iter().enumerate() {
                    let (q, p) = row_at(&states, r, offs[ei][i] + j, row)?;
                    let origin = *expected[q].get(p).ok_or_else(|| {
                        err(
                            r,
                            None,
                            None,
                            format!(
                                "gathered row {} comes from row {p} of rank {q}, which has {} rows",
                                offs[ei][i] + j,
                                expected[q].len()
                            ),
                        )
                    })?;
                    if origin != (x, e.src, e.tokens[i]) {
                        return Err(err(
                            r,
                            None,
                            Some((q, r)),
                            format!(
                                "gathered row for (token {} of rank {}, expert {x}) holds the output of (token {} of rank {}, expert {})",
                                e.tokens[i], e.src, origin.2, origin.1, origin.0
                            ),
                        ));
                    }
                    got.push(origin);
                }
                per_token.push(got);
            }
            per_entry.push(per_token);
        }
        partial.push(per_entry);
    }
    drop(states);

    // Return: one partial per (token, node) to the source, then the source's sum.
    let ret = build(build_moe_return)?;
    let partial_rows: Vec<usize> = plans.iter().map(|p| p.partial_offsets().1).collect();
    let return_rows: Vec<usize> = plans.iter().map(|p| p.return_offsets().1).collect();
    let (states, rep) = run(&ret, topology, &one_block(&partial_rows, &return_rows, row))?;
    report.returned = rep;
    report.combine_inter_node_bytes = inter_node(&gather, topology) + inter_node(&ret, topology);
    for (s, plan) in plans.iter().enumerate() {
        let (roffs, _) = plan.return_offsets();
        let mut sums: Vec<Vec<u32>> = vec![Vec::new(); tokens[s]];
        let mut last_node = None;
        for (si, g) in plan.sends.iter().enumerate() {
            if last_node.is_some_and(|l| l >= g.node) {
                return Err(err(
                    s,
                    None,
                    None,
                    "send groups are not in ascending node order",
                ));
            }
            last_node = Some(g.node);
            for (i, &t) in g.tokens.iter().enumerate() {
                let (relay, pp) = row_at(&states, s, roffs[si] + i, row)?;
                let (poffs, _) = plans[relay].partial_offsets();
                let ei = poffs.partition_point(|&o| o <= pp) - 1;
                let e = &plans[relay].relays[ei];
                let ti = pp - poffs[ei];
                if e.src as usize != s || e.tokens.get(ti) != Some(&t) {
                    return Err(err(
                        s,
                        None,
                        Some((relay, s)),
                        format!(
                            "returned row {} for token {t} is rank {relay}'s partial of token {:?} of rank {}",
                            roffs[si] + i,
                            e.tokens.get(ti),
                            e.src
                        ),
                    ));
                }
                let contrib = sums
                    .get_mut(t as usize)
                    .ok_or_else(|| err(s, None, None, format!("token {t} out of range")))?;
                contrib.extend(partial[relay][ei][ti].iter().map(|o| o.0));
            }
        }
        for (t, got) in sums.iter().enumerate() {
            let ids = &routes.experts[s][t * k..(t + 1) * k];
            let mut want: Vec<(u32, usize, u32)> = ids
                .iter()
                .enumerate()
                .map(|(j, &x)| {
                    (
                        moe_node_of(topology, routes.expert_rank[x as usize] as usize),
                        j,
                        x,
                    )
                })
                .collect();
            want.sort_unstable();
            let want: Vec<u32> = want.into_iter().map(|w| w.2).collect();
            if *got != want {
                return Err(err(
                    s,
                    None,
                    None,
                    format!(
                        "token {t} sums the outputs of experts {got:?}, expected exactly {want:?} in (node, slot) order"
                    ),
                ));
            }
        }
    }
    Ok(report)
}
