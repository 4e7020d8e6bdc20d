//! MoE dispatch and combine with token de-duplication per destination node
//! ([`MoeExchange`], issue 18).
//!
//! With top-k routing a token often goes to several experts that live on the same
//! remote node. A plain all-to-all-v ([`MoeDispatch::AllToAllV`]) sends one copy per
//! (token, expert) pair; [`MoeDispatch::Dedup`] sends each token **once per destination
//! node** and replicates it inside the node.
//!
//! # How: one schedule per direction, verified and simulated like the others
//!
//! The data moves as schedules of `halo_collectives::algo::moe` (see its
//! documentation), run by the same engine and transports as every other collective:
//!
//! - **dispatch** ([`halo_collectives::build_moe_dispatch`]): Phase II sends a source's
//!   unique tokens for node `n` once, in one message, to its rank-aligned peer in `n`
//!   ([`Topology::aligned_peer`](halo_topology::Topology::aligned_peer), the *relay*);
//!   Phase III replicates each row from the relay to its experts' ranks inside `n` (one
//!   message per (relay, target, source), so replication of one source's rows starts
//!   when they arrived). Rows for the source's own node are replicated from its send
//!   buffer directly. `AllToAllV` plans the source as its own relay everywhere: no
//!   Phase II, one row per (token, expert) straight to the expert's rank.
//! - **combine**: the gather ([`halo_collectives::build_moe_gather`], Phase III
//!   reversed) brings every output to its relay; the relay forms for each (token, node)
//!   the **partial sum** `sum_j gate_j * y_j` over that node's experts (in top-k slot
//!   order, from `0.0`); the return ([`halo_collectives::build_moe_return`], Phase II
//!   reversed) carries one partial row per (token, node) back; the source adds the
//!   partials in ascending node order, from `0.0`. `AllToAllV` forms the same partials
//!   at the source, so both modes give **bitwise identical** results, and a reference
//!   written with that summation order (see `tests/moe_dispatch.rs`) matches bitwise.
//!   [`MoeExchange::combine_residual`] starts the token's own node's partial from a
//!   residual instead (a transformer block's `h + sum_j gate_j * y_j`).
//!
//! `halo_collectives::verify_moe` proves the three schedules for a routing (every
//! (token, expert) pair delivered exactly once at its place; every token's sum made of
//! exactly its k contributions, in the order above).
//!
//! # Metadata and errors
//!
//! Before the data, two metadata stages, each a count exchange (an all-to-all of 4
//! `u64` per pair: groups, words, status, a hash of the expert map and `d`) and an
//! all-to-all-v of `u32`: source -> relay, per destination node the unique tokens and
//! their replication lists (expert, gate); relay -> target, per source the (token,
//! expert) pairs it will forward, from which the target knows where each row lands.
//! Bad arguments on one rank, or maps that differ, are an error on every rank there,
//! before any row moves. The combine starts with a status all-to-all (one `u64` per
//! pair), so a wrong `expert_out` on one rank is an error on every rank, not a timeout.
//! Control traffic does not grow with the row size `d`.
//!
//! # Output order
//!
//! The rows a rank receives are ordered **by expert** (its local experts in ascending
//! expert id), **then by source rank, then by token index** at the source.
//! [`MoeExchange::local_experts`], [`MoeExchange::expert_counts`] and
//! [`MoeExchange::origins`] describe them.

mod agree;
mod exec;
mod route;

use super::Communicator;
use crate::error::{Error, Result};
use agree::{DataCall, agree_on};
use exec::{rows_a2av, run_schedule, with_row};
use halo_collectives::{
    MoePlan, MoeRelayEntry, build_moe_dispatch, build_moe_gather, build_moe_return, moe_node_of,
};

/// How [`MoeExchange::dispatch`] moves the tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MoeDispatch {
    /// One copy of a token per destination node, replicated inside the node.
    #[default]
    Dedup,
    /// One copy per (token, expert) pair: plain all-to-all-v (the baseline).
    AllToAllV,
    /// [`MoeDispatch::Dedup`] when the routing has something to de-duplicate (some
    /// token, on some rank, has two experts on one other node), else
    /// [`MoeDispatch::AllToAllV`] (k = 1, one node, every token's experts on distinct
    /// nodes): one 8-byte all-reduce decides, the same way on every rank.
    Auto,
}

impl std::str::FromStr for MoeDispatch {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "dedup" => Ok(MoeDispatch::Dedup),
            "a2av" => Ok(MoeDispatch::AllToAllV),
            "auto" => Ok(MoeDispatch::Auto),
            other => Err(Error::invalid_argument(format!(
                "unknown MoE dispatch {other:?}: expected dedup, a2av or auto"
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

/// Statistics of one dispatch at this rank, in rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoeStats {
    /// Rows this rank sent to ranks on other nodes (both phases).
    pub rows_sent_off_node: usize,
    /// Rows this rank sent to other ranks in all (both phases; local copies not counted).
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
    /// The communicator's collective sequence number when the routing was exchanged:
    /// the same on every rank, so the data calls can check they name one exchange.
    id: u64,
    d: usize,
    num_tokens: usize,
    top_k: usize,
    /// This rank's part of the schedules (rows of `d` elements of the dispatch's type).
    plan: MoePlan,
    /// Per relay entry (the plan's order), per token, the gate of each slot.
    gates: Vec<Vec<Vec<f32>>>,
    local_experts: Vec<u32>,
    expert_counts: Vec<usize>,
    origins: Vec<(u32, u32)>,
    stats: MoeStats,
    /// The per-(token, expert) channel ([`MoeExchange::dispatch_pairs`]): at the
    /// source, the slots `t * k + j` in send order (by destination rank, then token,
    /// then expert id) and how many go to each rank.
    pair_slots: Vec<usize>,
    pair_slot_counts: Vec<usize>,
    /// At the experts' rank, the received rows in the same order (by source rank, then
    /// token, then expert id) and how many come from each rank.
    pair_rows: Vec<usize>,
    pair_row_counts: Vec<usize>,
}

/// Element types the combine adds up: `f32`, `f64`, [`f16`](crate::f16) and
/// [`bf16`](crate::bf16) (added in the type itself, as a model in that type does).
pub trait MoeFloat: bytemuck::Pod + std::ops::AddAssign + std::ops::Mul<Output = Self> {
    /// A gate weight in this type.
    fn from_gate(g: f32) -> Self;
}

impl MoeFloat for f32 {
    fn from_gate(g: f32) -> f32 {
        g
    }
}

impl MoeFloat for f64 {
    fn from_gate(g: f32) -> f64 {
        f64::from(g)
    }
}

impl MoeFloat for half::f16 {
    fn from_gate(g: f32) -> half::f16 {
        half::f16::from_f32(g)
    }
}

impl MoeFloat for half::bf16 {
    fn from_gate(g: f32) -> half::bf16 {
        half::bf16::from_f32(g)
    }
}

impl MoeExchange {
    /// Dispatches this rank's `tokens` (rows of `d` elements, one per token of
    /// `routing`) to the ranks of their experts; returns the plan (for
    /// [`MoeExchange::combine`]) and the rows this rank's experts must process, in the
    /// order of the module documentation (by expert, then source rank, then token):
    /// [`MoeExchange::route`], then [`MoeExchange::dispatch_rows`].
    /// Every rank of the communicator must call it, with the same `d`, expert map and
    /// mode.
    ///
    /// # Errors
    /// Those of [`MoeExchange::route`] and [`MoeExchange::dispatch_rows`].
    pub fn dispatch<E: bytemuck::Pod>(
        comm: &mut Communicator,
        tokens: &[E],
        d: usize,
        routing: &MoeRouting<'_>,
        mode: MoeDispatch,
    ) -> Result<(MoeExchange, Vec<E>)> {
        let mut ex = MoeExchange::route(comm, routing, mode)?;
        let out = ex.dispatch_rows(comm, tokens, d)?;
        ex.d = d;
        Ok((ex, out))
    }

    /// Moves `tokens` (this rank's tokens, rows of `d` elements, in token order) along
    /// the routing: returns the rows for this rank's experts in the order of the module
    /// documentation, each token once per destination node off this node
    /// ([`MoeDispatch::Dedup`]). The forward of a dispatch, and the backward of
    /// [`MoeExchange::combine_sum`] (the gradient of each token goes to each of its
    /// experts). Every rank calls it with the same `d` and element type.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `tokens` does not have `tokens x d` elements;
    /// [`Error::InvalidUsage`] on every other rank then, and on every rank when the
    /// ranks' calls differ (another call, another exchange, another `d` or element
    /// type), naming both ranks and both calls; the errors of the schedule's run.
    pub fn dispatch_rows<E: bytemuck::Pod>(
        &self,
        comm: &mut Communicator,
        tokens: &[E],
        d: usize,
    ) -> Result<Vec<E>> {
        let t = self.num_tokens;
        let mine = if t.checked_mul(d) != Some(tokens.len()) {
            Err(Error::invalid_argument(format!(
                "moe_dispatch: tokens has {} elements, not {t} tokens x d = {d}",
                tokens.len()
            )))
        } else {
            Ok(())
        };
        self.agree::<E>(comm, DataCall::Dispatch, d, mine)?;
        let row = d * std::mem::size_of::<E>();
        let mut out = vec![E::zeroed(); self.plan.recv_rows * d];
        if row > 0 {
            let schedule = build_moe_dispatch(&with_row(&self.plan, row))?;
            run_schedule(
                comm,
                &schedule,
                bytemuck::cast_slice(tokens),
                bytemuck::cast_slice_mut(&mut out),
            )?;
        }
        Ok(out)
    }

    /// Sends the experts' outputs (`expert_out`: one row of `d` per dispatched row, in
    /// the dispatch's output order) back and returns, for each of this rank's tokens,
    /// `sum_j gate_j * y_j` over its top-k experts (`tokens x d`), summed as the module
    /// documentation says (per node in slot order, at the relay; then across nodes in
    /// ascending node order, at the source), bitwise the same in both modes.
    ///
    /// Three passes: an agreement all-to-all (so that a rank with a wrong `expert_out`
    /// is an error on every rank, not a timeout), the gather schedule (outputs to the
    /// relays over the intra-node links), the return schedule (one partial row per
    /// (token, node) to the source).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `expert_out` does not have `rows x d` elements,
    /// and [`Error::InvalidUsage`] naming that rank on every other rank; the errors of
    /// the schedules' runs.
    pub fn combine(&self, comm: &mut Communicator, expert_out: &[f32]) -> Result<Vec<f32>> {
        self.combine_inner(comm, expert_out, self.d, None, true)
    }

    /// The unweighted combine (DeepEP's): for each of this rank's tokens the sum of the
    /// rows (`rows`: one of `d` elements per dispatched row) of its experts, reduced
    /// inside each node before one row per (token, node) goes back, then over the nodes
    /// in ascending order at the source (the order of [`MoeExchange::combine`], gates
    /// left out). The forward of a combine, and the backward of
    /// [`MoeExchange::dispatch_rows`] (a token's gradient is the sum of its rows'
    /// gradients). The caller applies the gate weights (on the experts' side, to the
    /// rows, as Megatron's dispatchers do).
    ///
    /// # Errors
    /// As [`MoeExchange::combine`].
    pub fn combine_sum<E: MoeFloat>(
        &self,
        comm: &mut Communicator,
        rows: &[E],
        d: usize,
    ) -> Result<Vec<E>> {
        self.combine_inner(comm, rows, d, None, false)
    }

    /// [`MoeExchange::combine_sum`] added to a residual (`tokens x d`), in the order of
    /// [`MoeExchange::combine_residual`] (the token's own node first, from `residual`,
    /// then the other nodes' partial sums in ascending node order). The backward of a
    /// dispatch whose input also feeds another path: `d_u = d_other + sum_j d_x_j`
    /// (the pipeline executor's de-duplicated MoE layer, with the router's gradient as
    /// `residual`); with every expert on the token's own node this is exactly
    /// `((r + d_0) + d_1) + ...`.
    ///
    /// # Errors
    /// As [`MoeExchange::combine_residual`].
    pub fn combine_sum_residual<E: MoeFloat>(
        &self,
        comm: &mut Communicator,
        rows: &[E],
        d: usize,
        residual: &[E],
    ) -> Result<Vec<E>> {
        self.combine_inner(comm, rows, d, Some(residual), false)
    }

    /// [`MoeExchange::combine`] added to a residual (`tokens x d`), in the order a
    /// transformer block's combine `h + sum_j gate_j * y_j` takes when reduced inside
    /// the nodes: the token's **own node first, starting from `residual`** (its slots
    /// in top-k order), then the partial sum of every other node (each from 0.0, in slot
    /// order) in ascending node order. When all of a token's experts are on its own
    /// node this is exactly `((h + g_0 y_0) + g_1 y_1) + ...`. Both modes give the same
    /// bits; `halo-piper`'s executor computes the same order for its all-to-all-v path.
    ///
    /// # Errors
    /// As [`MoeExchange::combine`], and [`Error::InvalidArgument`] when `residual` does
    /// not have `tokens x d` elements.
    pub fn combine_residual(
        &self,
        comm: &mut Communicator,
        expert_out: &[f32],
        residual: &[f32],
    ) -> Result<Vec<f32>> {
        self.combine_inner(comm, expert_out, self.d, Some(residual), true)
    }

    /// Sends one value per (token, expert) pair of this rank's routing (`values`:
    /// `tokens x top_k`, token-major, in the routing's slot order) to the rank of that
    /// expert; returns one value per dispatched row, in the rows' order. DeepEP's
    /// `recv_topk_weights`: the gate of each row, where the expert runs. One small
    /// all-to-all-v, no de-duplication (every value is another pair's).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `values` does not have `tokens x top_k`
    /// elements, [`Error::InvalidUsage`] on the other ranks then and when the ranks'
    /// calls differ; the errors of the all-to-all-v.
    pub fn dispatch_pairs<E: bytemuck::Pod>(
        &self,
        comm: &mut Communicator,
        values: &[E],
    ) -> Result<Vec<E>> {
        let want = self.num_tokens * self.top_k;
        let mine = if values.len() != want {
            Err(Error::invalid_argument(format!(
                "moe_dispatch_pairs: {} values, not {} tokens x top_k = {}",
                values.len(),
                self.num_tokens,
                self.top_k
            )))
        } else {
            Ok(())
        };
        self.agree::<E>(comm, DataCall::DispatchPairs, 1, mine)?;
        let send: Vec<E> = self.pair_slots.iter().map(|&i| values[i]).collect();
        let recv = rows_a2av(
            comm,
            &send,
            &self.pair_slot_counts,
            &self.pair_row_counts,
            1,
        )?;
        let mut out = vec![E::zeroed(); self.plan.recv_rows];
        for (&r, v) in self.pair_rows.iter().zip(recv) {
            out[r] = v;
        }
        Ok(out)
    }

    /// The reverse of [`MoeExchange::dispatch_pairs`]: one value per dispatched row
    /// (`values`, in the rows' order) back to its (token, expert) pair at the source;
    /// returns `tokens x top_k` values in the routing's slot order. The backward of
    /// `dispatch_pairs` (the gradient of each gate weight).
    ///
    /// # Errors
    /// As [`MoeExchange::dispatch_pairs`], with one value per dispatched row.
    pub fn combine_pairs<E: bytemuck::Pod>(
        &self,
        comm: &mut Communicator,
        values: &[E],
    ) -> Result<Vec<E>> {
        let want = self.plan.recv_rows;
        let mine = if values.len() != want {
            Err(Error::invalid_argument(format!(
                "moe_combine_pairs: {} values, not one per dispatched row ({want})",
                values.len()
            )))
        } else {
            Ok(())
        };
        self.agree::<E>(comm, DataCall::CombinePairs, 1, mine)?;
        let send: Vec<E> = self.pair_rows.iter().map(|&r| values[r]).collect();
        let recv = rows_a2av(
            comm,
            &send,
            &self.pair_row_counts,
            &self.pair_slot_counts,
            1,
        )?;
        let mut out = vec![E::zeroed(); self.num_tokens * self.top_k];
        for (&i, v) in self.pair_slots.iter().zip(recv) {
            out[i] = v;
        }
        Ok(out)
    }

    /// Takes part in a data call's agreement for a caller that found its own
    /// arguments wrong before it could make the call (the C ABI: a handle not live, a
    /// NULL buffer): the other ranks' call then fails with [`Error::InvalidUsage`]
    /// naming this rank instead of waiting for it. Returns `error`.
    pub fn refuse(comm: &mut Communicator, error: Error) -> Error {
        // This rank's own error is the one it reports, whatever the exchange gave.
        let _ = agree_on(comm, [1, 0, 0, 0, 0, 0], Err(error.clone()));
        error
    }

    fn combine_inner<E: MoeFloat>(
        &self,
        comm: &mut Communicator,
        expert_out: &[E],
        d: usize,
        residual: Option<&[E]>,
        weighted: bool,
    ) -> Result<Vec<E>> {
        let rows = self.plan.recv_rows;
        let mine = if rows.checked_mul(d) != Some(expert_out.len()) {
            Err(Error::invalid_argument(format!(
                "moe_combine: expert_out has {} elements, not {rows} rows x d = {d}",
                expert_out.len()
            )))
        } else if let Some(r) = residual.filter(|r| Some(r.len()) != self.num_tokens.checked_mul(d))
        {
            Err(Error::invalid_argument(format!(
                "moe_combine: residual has {} elements, not {} tokens x d = {d}",
                r.len(),
                self.num_tokens
            )))
        } else {
            Ok(())
        };
        let call = if weighted {
            DataCall::CombineWeighted
        } else {
            DataCall::Combine
        };
        self.agree::<E>(comm, call, d, mine)?;
        let mut out = match residual {
            Some(r) => r.to_vec(),
            None => vec![E::zeroed(); self.num_tokens * d],
        };
        if d == 0 {
            return Ok(out);
        }
        let plan = with_row(&self.plan, d * std::mem::size_of::<E>());
        let me = comm.rank() as u32;
        let my_node = moe_node_of(comm.topology(), comm.rank());
        // With a residual, the own node's partial starts from it.
        let own = |e: &MoeRelayEntry| residual.is_some() && e.src == me && e.node == my_node;
        // Gather: every output to the relay of its (token, node).
        let mut gathered = vec![E::zeroed(); plan.gather_rows() * d];
        let schedule = build_moe_gather(&plan)?;
        run_schedule(
            comm,
            &schedule,
            bytemuck::cast_slice(expert_out),
            bytemuck::cast_slice_mut(&mut gathered),
        )?;
        // The partial sums at the relay: gate-weighted, in slot order, from 0.0.
        let offs = plan.gather_offsets();
        let (poffs, prows) = plan.partial_offsets();
        let mut partial = vec![E::zeroed(); prows * d];
        for (ei, e) in plan.relays.iter().enumerate() {
            let rows = e.tokens.iter().zip(&self.gates[ei]).zip(&offs[ei]);
            for (i, ((&t, gates), &first)) in rows.enumerate() {
                let p = poffs[ei] + i;
                let acc = &mut partial[p * d..(p + 1) * d];
                if own(e) {
                    let t = t as usize;
                    acc.copy_from_slice(&out[t * d..(t + 1) * d]);
                }
                for (j, &g) in gates.iter().enumerate() {
                    let r = first + j;
                    let src = &gathered[r * d..(r + 1) * d];
                    if weighted {
                        let g = E::from_gate(g);
                        for (a, &v) in acc.iter_mut().zip(src) {
                            *a += g * v;
                        }
                    } else {
                        for (a, &v) in acc.iter_mut().zip(src) {
                            *a += v;
                        }
                    }
                }
            }
        }
        // Return: one partial per (token, node) to the source.
        let (roffs, rrows) = plan.return_offsets();
        let mut home = vec![E::zeroed(); rrows * d];
        let schedule = build_moe_return(&plan)?;
        run_schedule(
            comm,
            &schedule,
            bytemuck::cast_slice(&partial),
            bytemuck::cast_slice_mut(&mut home),
        )?;
        // The source adds the partials in ascending node order (the send groups'
        // order); with a residual, the own node's partial (which started from the
        // residual) replaces the row first, and the others are added after it.
        let own_first = residual.is_some();
        let first = plan
            .sends
            .iter()
            .enumerate()
            .filter(|(_, s)| own_first && s.node == my_node);
        let rest = plan
            .sends
            .iter()
            .enumerate()
            .filter(|(_, s)| !(own_first && s.node == my_node));
        for (si, s) in first.chain(rest) {
            let replace = own_first && s.node == my_node;
            for (i, &t) in s.tokens.iter().enumerate() {
                let (t, r) = (t as usize, roffs[si] + i);
                let dst = &mut out[t * d..(t + 1) * d];
                if replace {
                    dst.copy_from_slice(&home[r * d..(r + 1) * d]);
                } else {
                    for (o, &p) in dst.iter_mut().zip(&home[r * d..(r + 1) * d]) {
                        *o += p;
                    }
                }
            }
        }
        Ok(out)
    }

    /// The mode this exchange was dispatched with ([`MoeDispatch::Auto`] resolved).
    pub fn mode(&self) -> MoeDispatch {
        self.mode
    }

    /// Elements per row of [`MoeExchange::dispatch`] (0 after [`MoeExchange::route`]
    /// alone: the data calls take `d`).
    pub fn row_len(&self) -> usize {
        self.d
    }

    /// This rank's tokens in the routing.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Experts per token.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Rows this rank's experts receive.
    pub fn num_rows(&self) -> usize {
        self.plan.recv_rows
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

    /// The expert (its global id) of each dispatched row.
    pub fn row_experts(&self) -> Vec<u32> {
        self.plan.origins.iter().map(|&(e, _, _)| e).collect()
    }

    /// Rows this rank sent in the dispatch (the combine sends as many back).
    pub fn stats(&self) -> MoeStats {
        self.stats
    }
}
