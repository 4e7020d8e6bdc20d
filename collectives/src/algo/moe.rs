//! The token de-duplicating MoE dispatch and its combine as schedules (issue 18).
//!
//! # Dispatch ([`build_moe_dispatch`])
//!
//! A source rank `s` holds `T` tokens (rows of `row` bytes, its send buffer) and, for
//! each, its top-k experts. For each node `n` that hosts one of a token's experts the
//! token is one *entry* `(s, n, token)` with a replication list (the token's experts on
//! `n`, in top-k slot order):
//!
//! - **Phase II** — `s` sends the rows of its unique tokens for `n` **once**, in one
//!   message, to its rank-aligned peer in `n` (the *relay*). The rows for the source's
//!   own node stay where they are (the source is its own relay there).
//! - **Phase III** — the relay replicates each row to the ranks of its experts, all in
//!   its node: one message per (relay, target, entry group `(s, n)`), so replication
//!   of one source's rows starts as soon as they arrived; rows for the relay's own
//!   experts are copied.
//!
//! With [`MoePlan`]s made with `dedup = false` (the all-to-all-v baseline) the source
//! is its own relay for every node: Phase II is empty and Phase III sends one row per
//! (token, expert) straight to the expert's rank.
//!
//! The target's receive buffer holds the rows **by expert** (ascending), **then by
//! source rank, then by token**; rows that arrive out of that order go through scratch
//! and are copied to their place.
//!
//! # Combine ([`build_moe_gather`], then [`build_moe_return`])
//!
//! The mirror of the dispatch, with the reduction between two schedules (a schedule
//! moves bytes; it does not add): the gather carries every expert output back to the
//! relay over the intra-node links (Phase III reversed), where the caller sums, per
//! entry, the gate-weighted outputs **in slot order, from 0.0**; the return carries
//! one partial row per entry — one per (token, node) — back to the source (Phase II
//! reversed), which adds the partials **in ascending node order, from 0.0**. The
//! summation order is the same in both modes, so dedup and all-to-all-v give bitwise
//! identical sums. [`crate::verify_moe`] proves all three schedules and the reduction
//! structure for a routing.
//!
//! # Metadata
//!
//! A plan is made from what the ranks tell each other before the data moves: the
//! source computes its [`MoeSend`]s ([`moe_sends`]) and tells each relay, per entry
//! group, the tokens and their replication lists ([`MoeRelayEntry`], made by
//! [`moe_relay_entries`]); each relay tells each target the `(token, expert)` pairs it
//! will forward to it ([`moe_forwards`]); the target places them ([`moe_lands`]).
//! [`moe_plans`] runs the same steps for all ranks at once (for the verifier, the
//! simulator and tests); `halo::MoeExchange` runs them over real exchanges.
//!
//! Over 800 lines: the dispatch and the combine share the entry table, the relay
//! choice and the replication lists; the builders, the reference plans and their
//! property tests stay together so that the two directions cannot drift apart.

use crate::error::{CollectiveError, Result};
use crate::schedule::{Buf, Region, Schedule, ScheduleBuilder, StepId};
use halo_topology::{Level, Topology};
use std::collections::BTreeMap;

/// Tag of a Phase II message (source <-> relay); the node is in the low bits.
const TAG_PHASE2: u64 = 1 << 44;
/// Tag of a Phase III message (relay <-> target); source and node in the low bits.
const TAG_PHASE3: u64 = 2 << 44;
/// Ranks and nodes the tags can name.
const MAX_RANKS: usize = 1 << 22;
const MAX_NODES: usize = 1 << 20;

fn tag2(node: u32) -> u64 {
    TAG_PHASE2 | u64::from(node)
}

fn tag3(src: u32, node: u32) -> u64 {
    TAG_PHASE3 | (u64::from(src) << 20) | u64::from(node)
}

/// What a source tells a relay about one entry group: `(src, node, tokens, experts
/// per token in slot order)`.
pub type MoeGroup = (u32, u32, Vec<u32>, Vec<Vec<u32>>);

/// What a relay tells a target about one entry group: `(src, node, [(token, expert)])`.
pub type MoeForward = (u32, u32, Vec<(u32, u32)>);

/// What a target heard from a relay: `(relay, src, node, [(token, expert)])`.
pub type MoeIncoming = (u32, u32, u32, Vec<(u32, u32)>);

/// `(expert, source, token)` of a received row.
pub type MoeOrigin = (u32, u32, u32);

/// The routing of every rank (for [`moe_plans`] and the verifier).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeRoutes {
    /// Experts per token.
    pub top_k: usize,
    /// The expert -> rank map.
    pub expert_rank: Vec<u32>,
    /// Per rank: its tokens' expert ids, `tokens x top_k`, token-major.
    pub experts: Vec<Vec<u32>>,
}

impl MoeRoutes {
    /// Tokens of `rank`.
    pub fn tokens(&self, rank: usize) -> usize {
        self.experts[rank].len() / self.top_k.max(1)
    }

    /// The rows `rank` must receive, in order: `(expert, source, token)` ascending.
    pub fn expected_rows(&self, rank: usize) -> Vec<MoeOrigin> {
        let k = self.top_k.max(1);
        let mut out = Vec::new();
        for (s, ids) in self.experts.iter().enumerate() {
            for (i, &e) in ids.iter().enumerate() {
                if self.expert_rank[e as usize] as usize == rank {
                    out.push((e, s as u32, (i / k) as u32));
                }
            }
        }
        out.sort_unstable();
        out
    }
}

/// The node of `rank` (its `Node` domain; itself where the topology has no node level).
pub fn moe_node_of(topology: &Topology, rank: usize) -> u32 {
    if topology.has_level(Level::Node) {
        topology.domain(rank, Level::Node) as u32
    } else {
        rank as u32
    }
}

/// The relay of `rank` in `node`: its rank-aligned peer there.
fn relay_in(topology: &Topology, rank: usize, node: u32) -> u32 {
    if topology.has_level(Level::Node) {
        topology.aligned_peer(rank, Level::Node, node as usize) as u32
    } else {
        node
    }
}

/// A source's rows for one node: sent once to `relay`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeSend {
    /// The destination node.
    pub node: u32,
    /// The rank that replicates them there (the source itself for its own node, and
    /// for every node without de-duplication).
    pub relay: u32,
    /// The tokens, ascending, each once.
    pub tokens: Vec<u32>,
    /// Per token: the top-k slots whose experts are on `node`, ascending.
    pub slots: Vec<Vec<u32>>,
}

/// Rows a relay replicates: one source's unique tokens for one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeRelayEntry {
    /// The source rank.
    pub src: u32,
    /// The node (the relay's own).
    pub node: u32,
    /// The tokens, in the source's order (ascending).
    pub tokens: Vec<u32>,
    /// Per token: its experts on the node, in top-k slot order.
    pub experts: Vec<Vec<u32>>,
    /// Per token: the ranks of those experts.
    pub targets: Vec<Vec<u32>>,
}

/// Rows a target receives from one relay for one entry group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeLand {
    /// The relay they come from (this rank for its own relay entries).
    pub relay: u32,
    /// The source of the tokens.
    pub src: u32,
    /// The node of the entry group (the target's own).
    pub node: u32,
    /// Row index in the receive buffer of each row, in message order.
    pub positions: Vec<u32>,
}

/// One rank's part in one MoE dispatch/combine: what it sends as a source, replicates
/// as a relay and receives as a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoePlan {
    /// This rank.
    pub rank: u32,
    /// Ranks in the collective.
    pub size: usize,
    /// Bytes per row.
    pub row: usize,
    /// Tokens (rows of the dispatch's send buffer).
    pub send_rows: usize,
    /// Source side, in ascending node order.
    pub sends: Vec<MoeSend>,
    /// Relay side, in ascending `(src, node)` order.
    pub relays: Vec<MoeRelayEntry>,
    /// Target side, in ascending `(relay, src, node)` order.
    pub lands: Vec<MoeLand>,
    /// Rows of the dispatch's receive buffer.
    pub recv_rows: usize,
    /// `(expert, source, token)` of each received row: ascending.
    pub origins: Vec<MoeOrigin>,
}

/// The source side of a plan: this rank's tokens grouped by the nodes of their
/// experts. `experts` is `tokens x top_k`; ids must be inside `expert_rank`, whose
/// ranks must be inside the topology.
pub fn moe_sends(
    topology: &Topology,
    rank: usize,
    top_k: usize,
    experts: &[u32],
    expert_rank: &[u32],
    dedup: bool,
) -> Result<Vec<MoeSend>> {
    let n = topology.size();
    if n > MAX_RANKS || topology.num_domains_or_ranks() > MAX_NODES {
        return Err(CollectiveError::InvalidArgument(format!(
            "MoE dispatch: at most {MAX_RANKS} ranks and {MAX_NODES} nodes"
        )));
    }
    if top_k == 0 || !experts.len().is_multiple_of(top_k) {
        return Err(CollectiveError::InvalidArgument(format!(
            "MoE dispatch: {} expert ids are not tokens x top_k = {top_k}",
            experts.len()
        )));
    }
    let mut by_node: BTreeMap<u32, MoeSend> = BTreeMap::new();
    for (t, ids) in experts.chunks(top_k).enumerate() {
        for (j, &e) in ids.iter().enumerate() {
            let q = *expert_rank.get(e as usize).ok_or_else(|| {
                CollectiveError::InvalidArgument(format!(
                    "MoE dispatch: expert {e} is not in the expert map ({} experts)",
                    expert_rank.len()
                ))
            })? as usize;
            if q >= n {
                return Err(CollectiveError::InvalidArgument(format!(
                    "MoE dispatch: expert {e} is mapped to rank {q}, outside {n} ranks"
                )));
            }
            let node = moe_node_of(topology, q);
            let relay = if dedup {
                relay_in(topology, rank, node)
            } else {
                rank as u32
            };
            let s = by_node.entry(node).or_insert_with(|| MoeSend {
                node,
                relay,
                tokens: Vec::new(),
                slots: Vec::new(),
            });
            if s.tokens.last() != Some(&(t as u32)) {
                s.tokens.push(t as u32);
                s.slots.push(Vec::new());
            }
            s.slots.last_mut().expect("pushed").push(j as u32);
        }
    }
    Ok(by_node.into_values().collect())
}

trait NodesOrRanks {
    fn num_domains_or_ranks(&self) -> usize;
}

impl NodesOrRanks for Topology {
    fn num_domains_or_ranks(&self) -> usize {
        if self.has_level(Level::Node) {
            self.num_domains(Level::Node)
        } else {
            self.size()
        }
    }
}

/// The relay side of a plan from what the sources told this relay: per entry group
/// `(src, node, tokens, experts per token)`. Sorted by `(src, node)`; targets looked up
/// in `expert_rank`.
pub fn moe_relay_entries(groups: Vec<MoeGroup>, expert_rank: &[u32]) -> Result<Vec<MoeRelayEntry>> {
    let mut out = Vec::with_capacity(groups.len());
    for (src, node, tokens, experts) in groups {
        if tokens.len() != experts.len() {
            return Err(CollectiveError::Internal(format!(
                "MoE relay entry from rank {src}: {} tokens, {} replication lists",
                tokens.len(),
                experts.len()
            )));
        }
        let targets = experts
            .iter()
            .map(|list| {
                list.iter()
                    .map(|&e| {
                        expert_rank.get(e as usize).copied().ok_or_else(|| {
                            CollectiveError::Internal(format!(
                                "MoE relay entry from rank {src}: expert {e} outside the map"
                            ))
                        })
                    })
                    .collect::<Result<Vec<u32>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        out.push(MoeRelayEntry {
            src,
            node,
            tokens,
            experts,
            targets,
        });
    }
    out.sort_by_key(|e| (e.src, e.node));
    if out
        .windows(2)
        .any(|w| (w[0].src, w[0].node) == (w[1].src, w[1].node))
    {
        return Err(CollectiveError::Internal(
            "MoE relay: two entry groups for one (source, node)".into(),
        ));
    }
    Ok(out)
}

/// What a relay forwards to `target`: per entry group (in entry order) with rows for
/// it, `(src, node, [(token, expert)])` in message order (row, then slot).
pub fn moe_forwards(relays: &[MoeRelayEntry], target: u32) -> Vec<MoeForward> {
    let mut out = Vec::new();
    for e in relays {
        let rows: Vec<(u32, u32)> = forwarded(e, target)
            .map(|(i, j)| (e.tokens[i], e.experts[i][j]))
            .collect();
        if !rows.is_empty() {
            out.push((e.src, e.node, rows));
        }
    }
    out
}

/// The (row, slot) pairs of an entry group whose target is `target`, in message order.
fn forwarded(e: &MoeRelayEntry, target: u32) -> impl Iterator<Item = (usize, usize)> + '_ {
    e.targets.iter().enumerate().flat_map(move |(i, ts)| {
        ts.iter()
            .enumerate()
            .filter(move |(_, q)| **q == target)
            .map(move |(j, _)| (i, j))
    })
}

/// The target side of a plan from what the relays announced: per message `(relay,
/// src, node, [(token, expert)])`. Returns the lands (sorted by `(relay, src, node)`)
/// and the origins `(expert, src, token)` of the receive buffer's rows.
pub fn moe_lands(mut incoming: Vec<MoeIncoming>) -> Result<(Vec<MoeLand>, Vec<MoeOrigin>)> {
    incoming.sort_by_key(|m| (m.0, m.1, m.2));
    let mut keys: Vec<(u32, u32, u32)> = incoming
        .iter()
        .flat_map(|(_, src, _, rows)| rows.iter().map(move |&(t, e)| (e, *src, t)))
        .collect();
    keys.sort_unstable();
    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
        return Err(CollectiveError::Internal(format!(
            "MoE dispatch: (token {} of rank {}, expert {}) announced twice",
            w[0].2, w[0].1, w[0].0
        )));
    }
    let lands = incoming
        .into_iter()
        .map(|(relay, src, node, rows)| MoeLand {
            relay,
            src,
            node,
            positions: rows
                .iter()
                .map(|&(t, e)| keys.binary_search(&(e, src, t)).expect("a key") as u32)
                .collect(),
        })
        .collect();
    Ok((lands, keys))
}

/// Every rank's plan for `routes` with rows of `row` bytes: the metadata exchange
/// done in memory. `dedup = false` plans the all-to-all-v baseline.
pub fn moe_plans(
    topology: &Topology,
    routes: &MoeRoutes,
    row: usize,
    dedup: bool,
) -> Result<Vec<MoePlan>> {
    let n = topology.size();
    if routes.experts.len() != n {
        return Err(CollectiveError::InvalidArgument(format!(
            "MoE routes for {} ranks on a topology of {n}",
            routes.experts.len()
        )));
    }
    let sends: Vec<Vec<MoeSend>> = (0..n)
        .map(|r| {
            moe_sends(
                topology,
                r,
                routes.top_k,
                &routes.experts[r],
                &routes.expert_rank,
                dedup,
            )
        })
        .collect::<Result<_>>()?;
    let k = routes.top_k;
    let mut groups: Vec<Vec<MoeGroup>> = vec![Vec::new(); n];
    for (s, list) in sends.iter().enumerate() {
        for m in list {
            let experts = m
                .tokens
                .iter()
                .zip(&m.slots)
                .map(|(&t, js)| {
                    js.iter()
                        .map(|&j| routes.experts[s][t as usize * k + j as usize])
                        .collect()
                })
                .collect();
            groups[m.relay as usize].push((s as u32, m.node, m.tokens.clone(), experts));
        }
    }
    let relays: Vec<Vec<MoeRelayEntry>> = groups
        .into_iter()
        .map(|g| moe_relay_entries(g, &routes.expert_rank))
        .collect::<Result<_>>()?;
    let mut incoming: Vec<Vec<MoeIncoming>> = vec![Vec::new(); n];
    for (relay, entries) in relays.iter().enumerate() {
        for (t, inc) in incoming.iter_mut().enumerate() {
            for (src, node, rows) in moe_forwards(entries, t as u32) {
                inc.push((relay as u32, src, node, rows));
            }
        }
    }
    let mut plans = Vec::with_capacity(n);
    for (r, ((sends, relays), inc)) in sends.into_iter().zip(relays).zip(incoming).enumerate() {
        let (lands, origins) = moe_lands(inc)?;
        plans.push(MoePlan {
            rank: r as u32,
            size: n,
            row,
            send_rows: routes.tokens(r),
            sends,
            relays,
            lands,
            recv_rows: origins.len(),
            origins,
        });
    }
    Ok(plans)
}

/// Coalesces `(from, to)` row pairs into runs `(from, to, rows)` where both advance by one.
fn runs(pairs: impl IntoIterator<Item = (usize, usize)>) -> Vec<(usize, usize, usize)> {
    let mut out: Vec<(usize, usize, usize)> = Vec::new();
    for (a, b) in pairs {
        if let Some(last) = out.last_mut()
            && last.0 + last.2 == a
            && last.1 + last.2 == b
        {
            last.2 += 1;
            continue;
        }
        out.push((a, b, 1));
    }
    out
}

/// Rows of a buffer: the region of rows `at..at + len`, with `base` bytes in front.
fn rows(buf: Buf, base: usize, row: usize, at: usize, len: usize) -> Region {
    Region::new(buf, base + at * row, len * row)
}

/// Whether `v` is `v[0], v[0] + 1, ...`.
fn contiguous(v: &[usize]) -> bool {
    v.windows(2).all(|w| w[1] == w[0] + 1)
}

/// Sends rows `idx` (in that order) of `(buf, base)` to `peer`: straight from the
/// buffer when they are contiguous, else gathered into scratch first (after `deps`).
#[allow(clippy::too_many_arguments)]
fn send_rows(
    b: &mut ScheduleBuilder,
    peer: u32,
    tag: u64,
    (buf, base): (Buf, usize),
    row: usize,
    idx: &[usize],
    deps: &[StepId],
) {
    if contiguous(idx) {
        b.send(
            peer as usize,
            tag,
            rows(buf, base, row, idx[0], idx.len()),
            deps,
        );
        return;
    }
    let stage = b.scratch(idx.len() * row);
    let copies: Vec<StepId> = runs(idx.iter().enumerate().map(|(i, &a)| (a, i)))
        .into_iter()
        .map(|(a, d, len)| {
            b.copy(
                rows(buf, base, row, a, len),
                rows(Buf::Scratch, stage.offset, row, d, len),
                deps,
            )
        })
        .collect();
    b.send(peer as usize, tag, stage, &copies);
}

/// Receives rows from `peer` into rows `idx` (in that order) of the receive buffer:
/// straight when they are contiguous, else through scratch.
fn recv_rows(b: &mut ScheduleBuilder, peer: u32, tag: u64, row: usize, idx: &[usize]) {
    if contiguous(idx) {
        b.recv(
            peer as usize,
            tag,
            rows(Buf::Recv, 0, row, idx[0], idx.len()),
            &[],
        );
        return;
    }
    let stage = b.scratch(idx.len() * row);
    let r = b.recv(peer as usize, tag, stage, &[]);
    for (a, d, len) in runs(idx.iter().copied().enumerate()) {
        b.copy(
            rows(Buf::Scratch, stage.offset, row, a, len),
            rows(Buf::Recv, 0, row, d, len),
            &[r],
        );
    }
}

impl MoePlan {
    fn check(&self) -> Result<()> {
        if self.row == 0 {
            return Err(CollectiveError::InvalidArgument(
                "MoE plan with rows of 0 bytes".into(),
            ));
        }
        for s in &self.sends {
            if s.relay == self.rank
                && !self
                    .relays
                    .iter()
                    .any(|e| e.src == self.rank && e.node == s.node)
            {
                return Err(CollectiveError::Internal(format!(
                    "MoE plan of rank {}: no relay entry for its own rows for node {}",
                    self.rank, s.node
                )));
            }
        }
        Ok(())
    }

    /// The land of this rank's own relay entry `(src, node)`.
    fn own_land(&self, src: u32, node: u32) -> Result<&MoeLand> {
        self.lands
            .iter()
            .find(|l| l.relay == self.rank && l.src == src && l.node == node)
            .ok_or_else(|| {
                CollectiveError::Internal(format!(
                    "MoE plan of rank {}: no land for its own relay entry ({src}, {node})",
                    self.rank
                ))
            })
    }

    /// Rows of the gather's receive buffer (one per (entry, token, slot)).
    pub fn gather_rows(&self) -> usize {
        self.relays
            .iter()
            .map(|e| e.targets.iter().map(Vec::len).sum::<usize>())
            .sum()
    }

    /// First gather row of each relay entry; row `(e, i, j)` is at
    /// `gather_base[e] + sum of targets[..i] lengths + j`.
    pub fn gather_offsets(&self) -> Vec<Vec<usize>> {
        let mut at = 0;
        self.relays
            .iter()
            .map(|e| {
                e.targets
                    .iter()
                    .map(|ts| {
                        let o = at;
                        at += ts.len();
                        o
                    })
                    .collect()
            })
            .collect()
    }

    /// Rows of the partial sums a relay returns (one per entry token), and the first
    /// of each entry.
    pub fn partial_offsets(&self) -> (Vec<usize>, usize) {
        let mut at = 0;
        let offs = self
            .relays
            .iter()
            .map(|e| {
                let o = at;
                at += e.tokens.len();
                o
            })
            .collect();
        (offs, at)
    }

    /// Rows of the return's receive buffer at the source (one per (token, node)), and
    /// the first of each send group.
    pub fn return_offsets(&self) -> (Vec<usize>, usize) {
        let mut at = 0;
        let offs = self
            .sends
            .iter()
            .map(|s| {
                let o = at;
                at += s.tokens.len();
                o
            })
            .collect();
        (offs, at)
    }

    /// The index of the relay entry `(src, node)`.
    fn entry_index(&self, src: u32, node: u32) -> Option<usize> {
        self.relays
            .binary_search_by_key(&(src, node), |e| (e.src, e.node))
            .ok()
    }
}

/// The dispatch schedule of `plan`'s rank: send buffer = its tokens (`send_rows` rows),
/// receive buffer = `recv_rows` rows in `(expert, source, token)` order.
pub fn build_moe_dispatch(plan: &MoePlan) -> Result<Schedule> {
    plan.check()?;
    let me = plan.rank;
    let row = plan.row;
    let mut b = ScheduleBuilder::new(me as usize, plan.size, "moe-dispatch");
    // Target side first: every receive from another relay is posted at once.
    for l in plan.lands.iter().filter(|l| l.relay != me) {
        let pos: Vec<usize> = l.positions.iter().map(|&p| p as usize).collect();
        recv_rows(&mut b, l.relay, tag3(l.src, l.node), row, &pos);
    }
    // Relay side: where each entry's rows are (buffer, byte base, row index per token).
    let mut sources: Vec<(Buf, usize, Option<StepId>)> = Vec::with_capacity(plan.relays.len());
    for e in &plan.relays {
        if e.src == me {
            sources.push((Buf::Send, 0, None));
        } else {
            let region = b.scratch(e.tokens.len() * row);
            let r = b.recv(e.src as usize, tag2(e.node), region, &[]);
            sources.push((Buf::Scratch, region.offset, Some(r)));
        }
    }
    // Phase II: one message per remote relay.
    for s in plan.sends.iter().filter(|s| s.relay != me) {
        let toks: Vec<usize> = s.tokens.iter().map(|&t| t as usize).collect();
        send_rows(
            &mut b,
            s.relay,
            tag2(s.node),
            (Buf::Send, 0),
            row,
            &toks,
            &[],
        );
    }
    // Phase III: replicate every entry's rows to its targets.
    for (e, &(buf, base, dep)) in plan.relays.iter().zip(&sources) {
        let deps: Vec<StepId> = dep.into_iter().collect();
        // Row index in `buf` of token i of the entry.
        let at = |i: usize| {
            if buf == Buf::Send {
                e.tokens[i] as usize
            } else {
                i
            }
        };
        let mut targets: Vec<u32> = e.targets.iter().flatten().copied().collect();
        targets.sort_unstable();
        targets.dedup();
        for t in targets {
            let from: Vec<usize> = forwarded(e, t).map(|(i, _)| at(i)).collect();
            if t == me {
                let land = plan.own_land(e.src, e.node)?;
                if land.positions.len() != from.len() {
                    return Err(CollectiveError::Internal(format!(
                        "MoE plan of rank {me}: own land ({}, {}) has {} rows, the entry {}",
                        e.src,
                        e.node,
                        land.positions.len(),
                        from.len()
                    )));
                }
                let pairs = from
                    .iter()
                    .zip(&land.positions)
                    .map(|(&a, &p)| (a, p as usize));
                for (a, d, len) in runs(pairs) {
                    b.copy(
                        rows(buf, base, row, a, len),
                        rows(Buf::Recv, 0, row, d, len),
                        &deps,
                    );
                }
            } else {
                send_rows(
                    &mut b,
                    t,
                    tag3(e.src, e.node),
                    (buf, base),
                    row,
                    &from,
                    &deps,
                );
            }
        }
    }
    Ok(b.finish())
}

/// The first half of the combine: every expert output back to its relay. Send buffer
/// = the outputs (`recv_rows` rows, the dispatch's receive order); receive buffer (at
/// the relay) = [`MoePlan::gather_rows`] rows, row `(entry, token, slot)` at
/// [`MoePlan::gather_offsets`].
pub fn build_moe_gather(plan: &MoePlan) -> Result<Schedule> {
    plan.check()?;
    let me = plan.rank;
    let row = plan.row;
    let offs = plan.gather_offsets();
    let mut b = ScheduleBuilder::new(me as usize, plan.size, "moe-gather");
    // Relay side: receives (and the copies of this rank's own outputs).
    for (ei, e) in plan.relays.iter().enumerate() {
        let mut targets: Vec<u32> = e.targets.iter().flatten().copied().collect();
        targets.sort_unstable();
        targets.dedup();
        for t in targets {
            let to: Vec<usize> = forwarded(e, t).map(|(i, j)| offs[ei][i] + j).collect();
            if t == me {
                let land = plan.own_land(e.src, e.node)?;
                let pairs = land
                    .positions
                    .iter()
                    .zip(&to)
                    .map(|(&p, &d)| (p as usize, d));
                for (a, d, len) in runs(pairs) {
                    b.copy(
                        rows(Buf::Send, 0, row, a, len),
                        rows(Buf::Recv, 0, row, d, len),
                        &[],
                    );
                }
            } else {
                recv_rows(&mut b, t, tag3(e.src, e.node), row, &to);
            }
        }
    }
    // Target side: the outputs for each remote relay's entry group.
    for l in plan.lands.iter().filter(|l| l.relay != me) {
        let pos: Vec<usize> = l.positions.iter().map(|&p| p as usize).collect();
        send_rows(
            &mut b,
            l.relay,
            tag3(l.src, l.node),
            (Buf::Send, 0),
            row,
            &pos,
            &[],
        );
    }
    Ok(b.finish())
}

/// The second half of the combine: one partial row per (token, node) back to its
/// source. Send buffer (at the relay) = the partials, entry by entry
/// ([`MoePlan::partial_offsets`]); receive buffer (at the source) = one row per token
/// of each send group, groups in node order ([`MoePlan::return_offsets`]).
pub fn build_moe_return(plan: &MoePlan) -> Result<Schedule> {
    plan.check()?;
    let me = plan.rank;
    let row = plan.row;
    let (poffs, _) = plan.partial_offsets();
    let (roffs, _) = plan.return_offsets();
    let mut b = ScheduleBuilder::new(me as usize, plan.size, "moe-return");
    for (si, s) in plan.sends.iter().enumerate() {
        let len = s.tokens.len();
        if s.relay == me {
            let ei = plan.entry_index(me, s.node).ok_or_else(|| {
                CollectiveError::Internal(format!(
                    "MoE plan of rank {me}: no own entry for node {}",
                    s.node
                ))
            })?;
            b.copy(
                rows(Buf::Send, 0, row, poffs[ei], len),
                rows(Buf::Recv, 0, row, roffs[si], len),
                &[],
            );
        } else {
            b.recv(
                s.relay as usize,
                tag2(s.node),
                rows(Buf::Recv, 0, row, roffs[si], len),
                &[],
            );
        }
    }
    for (ei, e) in plan.relays.iter().enumerate().filter(|(_, e)| e.src != me) {
        b.send(
            e.src as usize,
            tag2(e.node),
            rows(Buf::Send, 0, row, poffs[ei], e.tokens.len()),
            &[],
        );
    }
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_coalesce_only_where_both_sides_advance() {
        assert_eq!(
            runs([(0, 5), (1, 6), (2, 8), (3, 9)]),
            vec![(0, 5, 2), (2, 8, 2)]
        );
        assert_eq!(runs([(4, 0), (4, 1)]), vec![(4, 0, 1), (4, 1, 1)]);
    }

    #[test]
    fn dedup_sends_each_token_once_per_node_to_the_aligned_peer() {
        let topo = Topology::preset("nodes:2x2").unwrap();
        // Experts 0..4 on ranks 0..4; token 0 -> experts 2, 3 (node 1); token 1 -> 0, 3.
        let s = moe_sends(&topo, 1, 2, &[2, 3, 0, 3], &[0, 1, 2, 3], true).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].node, s[0].relay, s[0].tokens.clone()),
            (0, 1, vec![1])
        );
        assert_eq!(
            (s[1].node, s[1].relay, s[1].tokens.clone()),
            (1, 3, vec![0, 1])
        );
        assert_eq!(s[1].slots, vec![vec![0, 1], vec![1]]);
        let a = moe_sends(&topo, 1, 2, &[2, 3, 0, 3], &[0, 1, 2, 3], false).unwrap();
        assert!(a.iter().all(|s| s.relay == 1));
    }
}
