//! Routing an exchange ([`MoeExchange::route`], [`MoeExchange::route_checked`]): the
//! check of a rank's routing, the two metadata stages (source -> relay, relay ->
//! target; each a count exchange and an all-to-all-v of `u32`), the plan built from
//! them, the statistics, and the mode [`MoeDispatch::Auto`] resolves to.

use super::exec::rows_a2av;
use super::{MoeDispatch, MoeExchange, MoeRouting, MoeStats};
use crate::comm::{Communicator, ReduceOp};
use crate::error::{Error, Result};
use halo_collectives::{
    MoePlan, Step, build_moe_dispatch, moe_forwards, moe_lands, moe_node_of, moe_relay_entries,
    moe_sends,
};
use std::collections::BTreeMap;

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

fn check_routing(n: usize, r: &MoeRouting<'_>) -> Result<usize> {
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

/// An error in a metadata message from `q`.
fn bad_meta(q: usize) -> Error {
    Error::internal(format!("moe_dispatch: bad metadata from rank {q}"))
}

/// Reads `len` words at `*at` of `words` (ending at `end`).
fn take<'w>(
    words: &'w [u32],
    at: &mut usize,
    end: usize,
    len: usize,
    q: usize,
) -> Result<&'w [u32]> {
    if *at + len > end {
        return Err(bad_meta(q));
    }
    let out = &words[*at..*at + len];
    *at += len;
    Ok(out)
}

impl MoeExchange {
    /// Exchanges the routing of this rank's tokens (the metadata of a dispatch, no
    /// token data): every rank learns which rows it will receive, for which of its
    /// experts, from where ([`MoeExchange::expert_counts`], [`MoeExchange::origins`],
    /// [`MoeExchange::row_experts`]). The rows then move with
    /// [`MoeExchange::dispatch_rows`] and come back with [`MoeExchange::combine_sum`]
    /// (or the weighted [`MoeExchange::combine`]), as often as needed: the forward
    /// and the backward of one MoE layer use one exchange, both directions
    /// de-duplicated. Every rank of the communicator calls it, with the same expert
    /// map and mode.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming what is wrong with this rank's routing
    /// (`top_k` 0, lengths, an expert id outside the map, an expert twice in one token,
    /// a rank outside the communicator); [`Error::InvalidUsage`] on the other ranks
    /// then, and on every rank when the expert maps or modes differ; the errors of the
    /// metadata exchanges (timeout, abort, remote errors).
    pub fn route(
        comm: &mut Communicator,
        routing: &MoeRouting<'_>,
        mode: MoeDispatch,
    ) -> Result<MoeExchange> {
        MoeExchange::route_checked(comm, routing, mode, Ok(()))
    }

    /// [`MoeExchange::route`] for a caller that checked its own arguments first (the C
    /// ABI, Python): with `precheck` an error, this rank still takes part in the
    /// exchange (with an empty `routing`), so that the other ranks fail with
    /// [`Error::InvalidUsage`] naming it instead of waiting, and returns `precheck`'s
    /// error.
    ///
    /// # Errors
    /// `precheck`'s, then those of [`MoeExchange::route`].
    pub fn route_checked(
        comm: &mut Communicator,
        routing: &MoeRouting<'_>,
        mode: MoeDispatch,
        precheck: Result<()>,
    ) -> Result<MoeExchange> {
        let n = comm.size();
        let me = comm.rank();
        let id = comm.core.seq;
        let topo = comm.topology().clone();
        let checked = precheck.and_then(|_| check_routing(n, routing));
        let num_tokens = *checked.as_ref().unwrap_or(&0);
        let k = routing.top_k.max(1);
        let mode = match mode {
            MoeDispatch::Auto => {
                // Rows de-duplication would save: per token, its experts on other
                // nodes minus those nodes. Summed over the ranks: 0 means nothing to
                // save anywhere.
                let saved = if checked.is_ok() {
                    saved_rows(&topo, me, k, routing)
                } else {
                    0
                };
                let mut total = [0u64];
                comm.all_reduce(&[saved], &mut total, ReduceOp::Sum)?;
                if total[0] == 0 {
                    MoeDispatch::AllToAllV
                } else {
                    MoeDispatch::Dedup
                }
            }
            m => m,
        };
        let dedup = mode == MoeDispatch::Dedup;
        tracing::debug!(
            rank = me,
            tokens = num_tokens,
            top_k = k,
            ?mode,
            "moe route"
        );
        let sends = checked.and_then(|_| {
            moe_sends(&topo, me, k, routing.experts, routing.expert_rank, dedup)
                .map_err(|e| Error::invalid_argument(format!("moe_dispatch: {e}")))
        });
        let mine = sends.as_ref().map(|_| ()).map_err(Clone::clone);
        let sends = sends.unwrap_or_default();
        let hash = map_hash(routing.expert_rank) ^ u64::from(dedup).rotate_left(63);

        // Metadata A, source -> relay: per send group [node, tokens, then per token
        // (token, m, m x (expert, gate bits))]: the replication lists.
        let mut groups = vec![0usize; n];
        let mut words = vec![0usize; n];
        let mut per_peer: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for s in &sends {
            let w = per_peer.entry(s.relay).or_default();
            w.extend_from_slice(&[s.node, s.tokens.len() as u32]);
            for (&t, slots) in s.tokens.iter().zip(&s.slots) {
                w.extend_from_slice(&[t, slots.len() as u32]);
                for &j in slots {
                    let at = t as usize * k + j as usize;
                    w.extend_from_slice(&[routing.experts[at], routing.gates[at].to_bits()]);
                }
            }
            groups[s.relay as usize] += 1;
        }
        let mut meta = Vec::new();
        for (&q, w) in &per_peer {
            words[q as usize] = w.len();
            meta.extend_from_slice(w);
        }
        let (recv_groups, recv_words) = exchange_counts(comm, &groups, &words, &mine, hash)?;
        let recv_meta = rows_a2av(comm, &meta, &words, &recv_words, 1)?;
        let mut entries = Vec::new();
        let mut gate_of: BTreeMap<(u32, u32), Vec<Vec<f32>>> = BTreeMap::new();
        let mut at = 0usize;
        for q in 0..n {
            let end = at + recv_words[q];
            for _ in 0..recv_groups[q] {
                let h = take(&recv_meta, &mut at, end, 2, q)?;
                let (node, count) = (h[0], h[1] as usize);
                let (mut toks, mut experts, mut gates) = (Vec::new(), Vec::new(), Vec::new());
                for _ in 0..count {
                    let h = take(&recv_meta, &mut at, end, 2, q)?;
                    let (t, m) = (h[0], h[1] as usize);
                    let pairs = take(&recv_meta, &mut at, end, 2 * m, q)?;
                    toks.push(t);
                    experts.push(pairs.chunks(2).map(|p| p[0]).collect::<Vec<u32>>());
                    gates.push(pairs.chunks(2).map(|p| f32::from_bits(p[1])).collect());
                }
                gate_of.insert((q as u32, node), gates);
                entries.push((q as u32, node, toks, experts));
            }
            if at != end {
                return Err(bad_meta(q));
            }
        }
        let relays = moe_relay_entries(entries, routing.expert_rank)?;
        let gates: Vec<Vec<Vec<f32>>> = relays
            .iter()
            .map(|e| gate_of.remove(&(e.src, e.node)).unwrap_or_default())
            .collect();

        // Metadata B, relay -> target: per entry group [src, node, rows, rows x
        // (token, expert)]: where the target puts what it will receive.
        let mut groups = vec![0usize; n];
        let mut words = vec![0usize; n];
        let mut meta = Vec::new();
        for (q, (g, w)) in groups.iter_mut().zip(words.iter_mut()).enumerate() {
            let before = meta.len();
            for (src, node, rows) in moe_forwards(&relays, q as u32) {
                meta.extend_from_slice(&[src, node, rows.len() as u32]);
                meta.extend(rows.iter().flat_map(|&(t, e)| [t, e]));
                *g += 1;
            }
            *w = meta.len() - before;
        }
        let (recv_groups, recv_words) = exchange_counts(comm, &groups, &words, &Ok(()), hash)?;
        let recv_meta = rows_a2av(comm, &meta, &words, &recv_words, 1)?;
        let mut incoming = Vec::new();
        let mut at = 0usize;
        for q in 0..n {
            let end = at + recv_words[q];
            for _ in 0..recv_groups[q] {
                let h = take(&recv_meta, &mut at, end, 3, q)?;
                let (src, node, count) = (h[0], h[1], h[2] as usize);
                let pairs = take(&recv_meta, &mut at, end, 2 * count, q)?;
                incoming.push((
                    q as u32,
                    src,
                    node,
                    pairs.chunks(2).map(|p| (p[0], p[1])).collect(),
                ));
            }
            if at != end {
                return Err(bad_meta(q));
            }
        }
        let (lands, origins) = moe_lands(incoming)?;
        let plan = MoePlan {
            rank: me as u32,
            size: n,
            row: 1,
            send_rows: num_tokens,
            sends,
            relays,
            lands,
            recv_rows: origins.len(),
            origins,
        };

        // Rows sent, from the dispatch schedule with rows of one byte.
        let schedule = build_moe_dispatch(&plan)?;
        let mut stats = MoeStats::default();
        let my_node = moe_node_of(&topo, me);
        for step in schedule.steps() {
            if let Step::Send { peer, region, .. } = step {
                stats.rows_sent += region.len;
                if moe_node_of(&topo, *peer as usize) != my_node {
                    stats.rows_sent_off_node += region.len;
                }
            }
        }
        let local_experts: Vec<u32> = routing
            .expert_rank
            .iter()
            .enumerate()
            .filter(|(_, q)| **q as usize == me)
            .map(|(e, _)| e as u32)
            .collect();
        let mut expert_counts = vec![0; local_experts.len()];
        for &(e, _, _) in &plan.origins {
            let slot = local_experts.binary_search(&e).map_err(|_| {
                Error::internal(format!(
                    "moe_dispatch: received a row for expert {e}, not local"
                ))
            })?;
            expert_counts[slot] += 1;
        }
        let origins = plan.origins.iter().map(|&(_, s, t)| (s, t)).collect();

        // The per-(token, expert) channel: both sides order the pairs between two ranks
        // by (token, expert id).
        let mut slots: Vec<(u32, u32, u32, usize)> = routing
            .experts
            .iter()
            .enumerate()
            .map(|(i, &e)| (routing.expert_rank[e as usize], (i / k) as u32, e, i))
            .collect();
        slots.sort_unstable();
        let mut pair_slot_counts = vec![0usize; n];
        for s in &slots {
            pair_slot_counts[s.0 as usize] += 1;
        }
        let mut rows: Vec<(u32, u32, u32, usize)> = plan
            .origins
            .iter()
            .enumerate()
            .map(|(r, &(e, s, t))| (s, t, e, r))
            .collect();
        rows.sort_unstable();
        let mut pair_row_counts = vec![0usize; n];
        for r in &rows {
            pair_row_counts[r.0 as usize] += 1;
        }
        Ok(MoeExchange {
            mode,
            id,
            d: 0,
            num_tokens,
            top_k: k,
            plan,
            gates,
            local_experts,
            expert_counts,
            origins,
            stats,
            pair_slots: slots.into_iter().map(|s| s.3).collect(),
            pair_slot_counts,
            pair_rows: rows.into_iter().map(|r| r.3).collect(),
            pair_row_counts,
        })
    }
}

/// Rows de-duplication saves for this rank's routing: per token, its experts on other
/// nodes minus the number of those nodes.
fn saved_rows(
    topo: &halo_topology::Topology,
    me: usize,
    k: usize,
    routing: &MoeRouting<'_>,
) -> u64 {
    let mine = moe_node_of(topo, me);
    let mut saved = 0u64;
    let mut nodes = Vec::with_capacity(k);
    for ids in routing.experts.chunks(k) {
        nodes.clear();
        nodes.extend(
            ids.iter()
                .map(|&e| moe_node_of(topo, routing.expert_rank[e as usize] as usize))
                .filter(|&n| n != mine),
        );
        let off = nodes.len();
        nodes.sort_unstable();
        nodes.dedup();
        saved += (off - nodes.len()) as u64;
    }
    saved
}
