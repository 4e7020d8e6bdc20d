//! MoE dispatch and combine with token de-duplication per destination node
//! ([`MoeExchange`], issue 18).
//!
//! With top-k routing a token often goes to several experts that live on the same
//! remote node. A plain all-to-all-v ([`MoeDispatch::AllToAllV`]) sends one copy per
//! (token, expert) pair; [`MoeDispatch::Dedup`] sends each token **once per destination
//! node** and replicates it inside the node.
//!
//! # How (an implementation over the existing collectives, not one new schedule)
//!
//! `Dedup` is two levels of [`Communicator::all_to_all_v`] on the same communicator:
//!
//! 1. **Inter-node (stage A)**: a source rank `s` groups its routing by destination
//!    node `n` (the `Node`-level domain of the expert's rank) and sends each *unique*
//!    (token, node) row once to its rank-aligned peer in `n`
//!    ([`Topology::aligned_peer`]), with a replication list (the experts on `n` that
//!    the token selected, and their gate weights) in a metadata all-to-all-v of `u32`.
//!    Rows for the source's own node go to itself (a local copy).
//! 2. **Intra-node (stage B)**: each such relay rank replicates every row it received
//!    to the ranks of the experts in its list — all in its own node.
//!
//! `AllToAllV` skips stage A: the source is its own relay, and stage B sends one row
//! per (token, expert) straight to the expert's rank, wherever it is.
//!
//! The combine mirrors the dispatch: the expert ranks send their outputs back over
//! stage B's links, the relay forms for each (token, node) the **partial sum**
//! `sum_j gate_j * y_j` over that node's experts (in top-k slot order, starting from
//! `0.0`), and stage A carries one partial row per (token, node) back; the source adds
//! the partials in ascending node order, starting from `0.0`. `AllToAllV` computes the
//! same partials at the source, so both modes give **bitwise identical** results, and
//! a reference written with that summation order (see `tests/moe_dispatch.rs`) matches
//! bitwise.
//!
//! Each stage costs a count exchange (an all-to-all of 4 `u64` per pair: rows, metadata
//! words, status, a hash of the expert map) and two all-to-all-v (metadata, rows), each
//! with its own count and agreement pass: control traffic that does not grow with the
//! row size `d`.
//!
//! # Output order
//!
//! The rows a rank receives are ordered **by expert** (its local experts in ascending
//! expert id), **then by source rank, then by token index** at the source.
//! [`MoeExchange::local_experts`], [`MoeExchange::expert_counts`] and
//! [`MoeExchange::origins`] describe them.

use super::{Communicator, Partition};
use crate::error::{Error, Result};
use halo_topology::{Level, Topology};
use std::collections::BTreeMap;

/// How [`MoeExchange::dispatch`] moves the tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MoeDispatch {
    /// One copy of a token per destination node, replicated inside the node.
    #[default]
    Dedup,
    /// One copy per (token, expert) pair: plain all-to-all-v (the baseline).
    AllToAllV,
}

impl std::str::FromStr for MoeDispatch {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "dedup" => Ok(MoeDispatch::Dedup),
            "a2av" => Ok(MoeDispatch::AllToAllV),
            other => Err(Error::invalid_argument(format!(
                "unknown MoE dispatch {other:?}: expected dedup or a2av"
            ))),
        }
    }
}

/// One rank's routing of its tokens.
#[derive(Debug, Clone, Copy)]
pub struct MoeRouting<'a> {
    /// Experts per token (`k` of top-k), at least 1.
    pub top_k: usize,
    /// `tokens x top_k` expert ids, token-major; a token may not name an expert twice.
    pub experts: &'a [u32],
    /// `tokens x top_k` gate weights, as `experts`; used by the combine.
    pub gates: &'a [f32],
    /// The expert -> rank map (the same on every rank).
    pub expert_rank: &'a [u32],
}

/// `(expert, gate)` pairs in top-k slot order.
type Slots = [(u32, f32)];

/// A relay entry: one (source, token, node) with its experts on that node.
#[derive(Debug, Clone)]
struct Entry {
    token: u32,
    /// Row of the relay's stage-A receive buffer (or, for `AllToAllV`, the token).
    row: usize,
    /// `(expert, gate)` in top-k slot order.
    slots: Vec<(u32, f32)>,
}

/// Statistics of one dispatch at this rank, in rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoeStats {
    /// Rows this rank sent to ranks on other nodes (both stages).
    pub rows_sent_off_node: usize,
    /// Rows this rank sent in all (both stages, copies to itself included).
    pub rows_sent: usize,
}

/// One MoE dispatch's plan, kept for its combine.
///
/// ```
/// use halo::local::{self, Emulation};
/// use halo::topology::Topology;
/// use halo::{MoeDispatch, MoeExchange, MoeRouting};
///
/// let topo = Topology::preset("nodes:2x2").unwrap();
/// let out = local::run(&topo, Emulation::off(), |comm| {
///     // One expert per rank; each rank's 2 tokens (rows of 3) go to experts 2 and 3.
///     let me = comm.rank() as f32;
///     let tokens = [me, me, me, me + 0.5, me + 0.5, me + 0.5];
///     let routing = MoeRouting {
///         top_k: 2,
///         experts: &[2, 3, 3, 2],
///         gates: &[0.5, 0.25, 1.0, 2.0],
///         expert_rank: &[0, 1, 2, 3],
///     };
///     let (ex, rows) = MoeExchange::dispatch(comm, &tokens, 3, &routing, MoeDispatch::Dedup)?;
///     // The experts are the identity: the combine gives sum_j gate_j * token.
///     let back = ex.combine(comm, &rows)?;
///     Ok((ex.expert_counts().to_vec(), back))
/// });
/// let (counts, back) = out[3].as_ref().unwrap();
/// assert_eq!(counts, &vec![8]); // 4 ranks x 2 tokens reach expert 3
/// assert_eq!(back[..3], [3.0 * 0.75; 3]);
/// ```
#[derive(Debug, Clone)]
pub struct MoeExchange {
    mode: MoeDispatch,
    d: usize,
    num_tokens: usize,
    /// Source side (Dedup): for each row sent in stage A, in send order, its
    /// (node, token); and the per-peer row counts of stage A both ways.
    a_sent: Vec<(usize, u32)>,
    a_send_rows: Vec<usize>,
    a_recv_rows: Vec<usize>,
    /// Relay side: the entries (stage-A receive order; for `AllToAllV` by node, then token).
    entries: Vec<Entry>,
    /// Stage B: for each row sent, in send order, its (entry, slot).
    b_sent: Vec<(usize, usize)>,
    b_send_rows: Vec<usize>,
    b_recv_rows: Vec<usize>,
    /// Expert side: output row i is row `perm[i]` of stage B's receive buffer.
    perm: Vec<usize>,
    local_experts: Vec<u32>,
    expert_counts: Vec<usize>,
    origins: Vec<(u32, u32)>,
    stats: MoeStats,
}

/// The node of `rank` (its `Node` domain; itself where the topology has no node level).
fn node_of(topo: &Topology, rank: usize) -> usize {
    if topo.has_level(Level::Node) {
        topo.domain(rank, Level::Node)
    } else {
        rank
    }
}

/// The rank in `node` aligned with `rank`.
fn relay_for(topo: &Topology, rank: usize, node: usize) -> usize {
    if topo.has_level(Level::Node) {
        topo.aligned_peer(rank, Level::Node, node)
    } else {
        node
    }
}

/// FNV-1a over the expert map: ranks compare it to catch maps that differ.
fn map_hash(map: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in (map.len() as u64)
        .to_le_bytes()
        .into_iter()
        .chain(map.iter().flat_map(|v| v.to_le_bytes()))
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn check_routing(n: usize, tokens_len: usize, d: usize, r: &MoeRouting<'_>) -> Result<usize> {
    let bad = |m: String| Err(Error::invalid_argument(format!("moe_dispatch: {m}")));
    if r.top_k == 0 {
        return bad("top_k is 0: every token needs at least one expert".into());
    }
    if !r.experts.len().is_multiple_of(r.top_k) {
        return bad(format!(
            "{} expert ids are not a multiple of top_k = {}",
            r.experts.len(),
            r.top_k
        ));
    }
    let t = r.experts.len() / r.top_k;
    if u32::try_from(t).is_err() {
        return bad(format!("{t} tokens: at most 2^32 - 1 per rank"));
    }
    if r.gates.len() != r.experts.len() {
        return bad(format!(
            "{} gate weights for {} expert ids",
            r.gates.len(),
            r.experts.len()
        ));
    }
    if t.checked_mul(d) != Some(tokens_len) {
        return bad(format!(
            "tokens has {tokens_len} elements, not {t} tokens x d = {d}"
        ));
    }
    if let Some((e, q)) = r
        .expert_rank
        .iter()
        .enumerate()
        .find(|(_, q)| **q as usize >= n)
    {
        return bad(format!(
            "expert {e} is mapped to rank {q}, but the communicator has {n} ranks"
        ));
    }
    for (tok, ids) in r.experts.chunks(r.top_k).enumerate() {
        for (j, &e) in ids.iter().enumerate() {
            if e as usize >= r.expert_rank.len() {
                return bad(format!(
                    "token {tok} slot {j}: expert {e} is not in the expert map ({} experts)",
                    r.expert_rank.len()
                ));
            }
            if ids[..j].contains(&e) {
                return bad(format!("token {tok} names expert {e} twice"));
            }
        }
    }
    Ok(t)
}

/// Exchanges `[rows, words, status, hash]` per pair; returns (rows, words) per peer
/// received, or the error every rank agrees on.
fn exchange_counts(
    comm: &mut Communicator,
    rows: &[usize],
    words: &[usize],
    mine: &Result<()>,
    hash: u64,
) -> Result<(Vec<usize>, Vec<usize>)> {
    let n = comm.size();
    let status = u64::from(mine.is_err());
    let mut send = Vec::with_capacity(4 * n);
    for q in 0..n {
        send.extend_from_slice(&[rows[q] as u64, words[q] as u64, status, hash]);
    }
    let mut recv = vec![0u64; 4 * n];
    comm.all_to_all(&send, &mut recv)?;
    mine.clone()?;
    let mut r = Vec::with_capacity(n);
    let mut w = Vec::with_capacity(n);
    for q in 0..n {
        let b = &recv[4 * q..4 * q + 4];
        if b[2] != 0 {
            return Err(Error::InvalidUsage {
                peer: Some(q),
                message: format!("moe_dispatch: rank {q} reported invalid arguments"),
            });
        }
        if b[3] != hash {
            return Err(Error::InvalidUsage {
                peer: Some(q),
                message: format!("moe_dispatch: rank {q} has a different expert -> rank map"),
            });
        }
        let to_usize = |v: u64| {
            usize::try_from(v).map_err(|_| Error::internal(format!("count {v} from rank {q}")))
        };
        r.push(to_usize(b[0])?);
        w.push(to_usize(b[1])?);
    }
    Ok((r, w))
}

fn displs(counts: &[usize], unit: usize) -> Vec<usize> {
    let mut at = 0;
    counts
        .iter()
        .map(|c| {
            let d = at;
            at += c * unit;
            d
        })
        .collect()
}

fn scaled(counts: &[usize], unit: usize) -> Vec<usize> {
    counts.iter().map(|c| c * unit).collect()
}

/// All-to-all-v of rows of `d` elements with per-peer row counts.
fn rows_a2av<E: bytemuck::Pod>(
    comm: &mut Communicator,
    send: &[E],
    send_rows: &[usize],
    recv_rows: &[usize],
    d: usize,
) -> Result<Vec<E>> {
    let total: usize = recv_rows.iter().sum();
    let mut recv = vec![E::zeroed(); total * d];
    let (sc, sd) = (scaled(send_rows, d), displs(send_rows, d));
    let (rc, rd) = (scaled(recv_rows, d), displs(recv_rows, d));
    comm.all_to_all_v(
        send,
        &Partition::new(&sc, &sd),
        &mut recv,
        &Partition::new(&rc, &rd),
    )?;
    Ok(recv)
}

impl MoeExchange {
    /// Dispatches this rank's `tokens` (rows of `d` elements, one per token of
    /// `routing`) to the ranks of their experts; returns the plan (for
    /// [`MoeExchange::combine`]) and the rows this rank's experts must process, in the
    /// order of the module documentation (by expert, then source rank, then token).
    /// Every rank of the communicator must call it, with the same `d`, expert map and
    /// mode.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming what is wrong with this rank's arguments
    /// (lengths, `top_k` 0, an expert id outside the map, an expert twice in one
    /// token, a rank outside the communicator); [`Error::InvalidUsage`] on the other
    /// ranks then, and on every rank when the expert maps differ; the errors of
    /// [`Communicator::all_to_all_v`].
    pub fn dispatch<E: bytemuck::Pod>(
        comm: &mut Communicator,
        tokens: &[E],
        d: usize,
        routing: &MoeRouting<'_>,
        mode: MoeDispatch,
    ) -> Result<(MoeExchange, Vec<E>)> {
        let n = comm.size();
        let me = comm.rank();
        let topo = comm.topology().clone();
        let checked = check_routing(n, tokens.len(), d, routing);
        let num_tokens = *checked.as_ref().unwrap_or(&0);
        let mine = checked.map(|_| ());
        let hash = map_hash(routing.expert_rank);
        let k = routing.top_k.max(1);
        let my_node = node_of(&topo, me);

        // Group this rank's routing by (node, token); slots in top-k order.
        let mut by_node: BTreeMap<(usize, u32), Vec<(u32, f32)>> = BTreeMap::new();
        if mine.is_ok() {
            for t in 0..num_tokens {
                for j in 0..k {
                    let e = routing.experts[t * k + j];
                    let node = node_of(&topo, routing.expert_rank[e as usize] as usize);
                    by_node
                        .entry((node, t as u32))
                        .or_default()
                        .push((e, routing.gates[t * k + j]));
                }
            }
        }

        let mut stats = MoeStats::default();
        let mut ex = MoeExchange {
            mode,
            d,
            num_tokens,
            a_sent: Vec::new(),
            a_send_rows: vec![0; n],
            a_recv_rows: vec![0; n],
            entries: Vec::new(),
            b_sent: Vec::new(),
            b_send_rows: vec![0; n],
            b_recv_rows: vec![0; n],
            perm: Vec::new(),
            local_experts: Vec::new(),
            expert_counts: Vec::new(),
            origins: Vec::new(),
            stats,
        };
        // The relay's entries, their sources, and the buffer their rows are in.
        let mut entry_src: Vec<u32> = Vec::new();
        let a_rows: Vec<E>;
        let relay_rows: &[E] = match mode {
            MoeDispatch::AllToAllV => {
                // The source is its own relay; the count exchange still runs, so that
                // invalid arguments and differing maps are errors on every rank.
                exchange_counts(comm, &vec![0; n], &vec![0; n], &mine, hash)?;
                for ((_, t), slots) in by_node {
                    ex.entries.push(Entry {
                        token: t,
                        row: t as usize,
                        slots,
                    });
                    entry_src.push(me as u32);
                }
                tokens
            }
            MoeDispatch::Dedup => {
                // Stage A: one row per (token, node) to the aligned peer in that node.
                let mut per_peer: BTreeMap<usize, Vec<(usize, u32, &Slots)>> = BTreeMap::new();
                for ((node, t), slots) in &by_node {
                    per_peer
                        .entry(relay_for(&topo, me, *node))
                        .or_default()
                        .push((*node, *t, slots));
                }
                let mut words = vec![0usize; n];
                let mut meta: Vec<u32> = Vec::new();
                let mut send: Vec<E> = Vec::with_capacity(by_node.len() * d);
                for (&peer, list) in &per_peer {
                    ex.a_send_rows[peer] = list.len();
                    let before = meta.len();
                    for &(node, t, slots) in list {
                        meta.push(t);
                        meta.push(slots.len() as u32);
                        for &(e, g) in slots {
                            meta.push(e);
                            meta.push(g.to_bits());
                        }
                        send.extend_from_slice(&tokens[t as usize * d..(t as usize + 1) * d]);
                        ex.a_sent.push((node, t));
                        if node_of(&topo, peer) != my_node {
                            stats.rows_sent_off_node += 1;
                        }
                        stats.rows_sent += 1;
                    }
                    words[peer] = meta.len() - before;
                }
                let (recv_rows, recv_words) =
                    exchange_counts(comm, &ex.a_send_rows, &words, &mine, hash)?;
                ex.a_recv_rows = recv_rows;
                let recv_meta = rows_a2av(comm, &meta, &words, &recv_words, 1)?;
                a_rows = rows_a2av(comm, &send, &ex.a_send_rows, &ex.a_recv_rows, d)?;
                // Parse the replication lists, in receive order.
                let mut at = 0usize;
                let mut row = 0usize;
                for (q, &words) in recv_words.iter().enumerate() {
                    let end = at + words;
                    for _ in 0..ex.a_recv_rows[q] {
                        let bad =
                            || Error::internal(format!("moe_dispatch: bad metadata from rank {q}"));
                        if at + 2 > end {
                            return Err(bad());
                        }
                        let (t, m) = (recv_meta[at], recv_meta[at + 1] as usize);
                        at += 2;
                        if at + 2 * m > end {
                            return Err(bad());
                        }
                        let slots = (0..m)
                            .map(|i| {
                                (
                                    recv_meta[at + 2 * i],
                                    f32::from_bits(recv_meta[at + 2 * i + 1]),
                                )
                            })
                            .collect();
                        at += 2 * m;
                        ex.entries.push(Entry {
                            token: t,
                            row,
                            slots,
                        });
                        entry_src.push(q as u32);
                        row += 1;
                    }
                    if at != end {
                        return Err(Error::internal(format!(
                            "moe_dispatch: metadata from rank {q} has {} extra words",
                            end - at
                        )));
                    }
                }
                &a_rows
            }
        };

        // Stage B: replicate every entry's row to its experts' ranks.
        let mut per_peer: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
        for (i, entry) in ex.entries.iter().enumerate() {
            for (j, &(e, _)) in entry.slots.iter().enumerate() {
                let q = *routing.expert_rank.get(e as usize).ok_or_else(|| {
                    Error::internal(format!("moe_dispatch: expert {e} outside the map"))
                })? as usize;
                per_peer.entry(q).or_default().push((i, j));
            }
        }
        let mut meta: Vec<u32> = Vec::new();
        let mut send: Vec<E> = Vec::with_capacity(ex.entries.len() * d);
        for (&q, list) in &per_peer {
            ex.b_send_rows[q] = list.len();
            for &(i, j) in list {
                let entry = &ex.entries[i];
                meta.extend_from_slice(&[entry_src[i], entry.token, entry.slots[j].0]);
                send.extend_from_slice(&relay_rows[entry.row * d..(entry.row + 1) * d]);
                ex.b_sent.push((i, j));
                if node_of(&topo, q) != my_node {
                    stats.rows_sent_off_node += 1;
                }
                stats.rows_sent += 1;
            }
        }
        let words = scaled(&ex.b_send_rows, 3);
        let (recv_rows, _) = exchange_counts(comm, &ex.b_send_rows, &words, &Ok(()), hash)?;
        ex.b_recv_rows = recv_rows;
        let recv_meta = rows_a2av(comm, &meta, &words, &scaled(&ex.b_recv_rows, 3), 1)?;
        let b_rows = rows_a2av(comm, &send, &ex.b_send_rows, &ex.b_recv_rows, d)?;

        // Order by (expert, source, token).
        let total: usize = ex.b_recv_rows.iter().sum();
        let key = |i: usize| (recv_meta[3 * i + 2], recv_meta[3 * i], recv_meta[3 * i + 1]);
        let mut perm: Vec<usize> = (0..total).collect();
        perm.sort_unstable_by_key(|&i| key(i));
        ex.local_experts = routing
            .expert_rank
            .iter()
            .enumerate()
            .filter(|(_, q)| **q as usize == me)
            .map(|(e, _)| e as u32)
            .collect();
        ex.expert_counts = vec![0; ex.local_experts.len()];
        let mut out = Vec::with_capacity(total * d);
        for &i in &perm {
            let (e, s, t) = key(i);
            let slot = ex.local_experts.binary_search(&e).map_err(|_| {
                Error::internal(format!(
                    "moe_dispatch: received a row for expert {e}, not local"
                ))
            })?;
            ex.expert_counts[slot] += 1;
            ex.origins.push((s, t));
            out.extend_from_slice(&b_rows[i * d..(i + 1) * d]);
        }
        ex.perm = perm;
        ex.stats = stats;
        Ok((ex, out))
    }

    /// Sends the experts' outputs (`expert_out`: one row of `d` per dispatched row, in
    /// the dispatch's output order) back and returns, for each of this rank's tokens,
    /// `sum_j gate_j * y_j` over its top-k experts (`tokens x d`), summed as the module
    /// documentation says (per node in slot order, then across nodes in ascending node
    /// order), bitwise the same in both modes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `expert_out` does not have `rows x d` elements
    /// (this rank then exchanges no rows, so every rank that expected rows from it, or
    /// was to send it rows, gets [`Error::InvalidUsage`] from the count agreement); the
    /// errors of [`Communicator::all_to_all_v`].
    pub fn combine(&self, comm: &mut Communicator, expert_out: &[f32]) -> Result<Vec<f32>> {
        let d = self.d;
        if expert_out.len() != self.perm.len() * d {
            // Take part in this call's exchanges with no rows, so that every peer that
            // expected rows from this rank fails in the count agreement instead of
            // waiting for its timeout.
            // (When stage B agreed — this rank had no rows in it — its peers go on to
            // stage A, and so does this rank.)
            let zeros = vec![0usize; self.b_send_rows.len()];
            let b = rows_a2av::<f32>(comm, &[], &zeros, &zeros, d);
            if b.is_ok() && self.mode == MoeDispatch::Dedup {
                let _ = rows_a2av::<f32>(comm, &[], &zeros, &zeros, d);
            }
            return Err(Error::invalid_argument(format!(
                "moe_combine: expert_out has {} elements, not {} rows x d = {d}",
                expert_out.len(),
                self.perm.len()
            )));
        }
        // Back to stage B's receive order.
        let mut y = vec![0f32; expert_out.len()];
        for (o, &i) in self.perm.iter().enumerate() {
            y[i * d..(i + 1) * d].copy_from_slice(&expert_out[o * d..(o + 1) * d]);
        }
        let back = rows_a2av(comm, &y, &self.b_recv_rows, &self.b_send_rows, d)?;
        // Where each (entry, slot)'s output landed.
        let mut pos: Vec<Vec<usize>> = self
            .entries
            .iter()
            .map(|e| vec![usize::MAX; e.slots.len()])
            .collect();
        for (r, &(i, j)) in self.b_sent.iter().enumerate() {
            pos[i][j] = r;
        }
        // Partial sums per entry, in slot order.
        let mut partial = vec![0f32; self.entries.len() * d];
        for (i, entry) in self.entries.iter().enumerate() {
            let acc = &mut partial[i * d..(i + 1) * d];
            for (j, &(_, g)) in entry.slots.iter().enumerate() {
                let r = pos[i][j];
                for (a, v) in acc.iter_mut().zip(&back[r * d..(r + 1) * d]) {
                    *a += g * v;
                }
            }
        }
        let mut out = vec![0f32; self.num_tokens * d];
        match self.mode {
            MoeDispatch::AllToAllV => {
                // Entries are in (node, token) order already.
                for (i, entry) in self.entries.iter().enumerate() {
                    let t = entry.token as usize;
                    for (o, p) in out[t * d..(t + 1) * d]
                        .iter_mut()
                        .zip(&partial[i * d..(i + 1) * d])
                    {
                        *o += p;
                    }
                }
            }
            MoeDispatch::Dedup => {
                let home = rows_a2av(comm, &partial, &self.a_recv_rows, &self.a_send_rows, d)?;
                let mut order: Vec<usize> = (0..self.a_sent.len()).collect();
                order.sort_by_key(|&r| self.a_sent[r]);
                for r in order {
                    let t = self.a_sent[r].1 as usize;
                    for (o, p) in out[t * d..(t + 1) * d]
                        .iter_mut()
                        .zip(&home[r * d..(r + 1) * d])
                    {
                        *o += p;
                    }
                }
            }
        }
        Ok(out)
    }

    /// The mode this exchange was dispatched with.
    pub fn mode(&self) -> MoeDispatch {
        self.mode
    }

    /// Elements per row.
    pub fn row_len(&self) -> usize {
        self.d
    }

    /// This rank's experts, ascending: the order of the dispatched rows.
    pub fn local_experts(&self) -> &[u32] {
        &self.local_experts
    }

    /// Rows dispatched to each of [`MoeExchange::local_experts`].
    pub fn expert_counts(&self) -> &[usize] {
        &self.expert_counts
    }

    /// `(source rank, token index at the source)` of each dispatched row.
    pub fn origins(&self) -> &[(u32, u32)] {
        &self.origins
    }

    /// Rows this rank sent in the dispatch (the combine sends as many back).
    pub fn stats(&self) -> MoeStats {
        self.stats
    }
}
