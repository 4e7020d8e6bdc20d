//! One block on one micro-batch: dense part, routing, count exchange, dispatch of the
//! token rows to the experts' ranks with `all_to_all_v`, the local experts, the reverse
//! `all_to_all_v` (combine), and the backward of all of it in reverse.
//!
//! Send order: experts by owner, then by id ([`Placement::send_order`]; with the
//! contiguous table that is id order), each expert's slots in token order. Receive order:
//! source ranks in order, each source's rows by local expert (ascending id). A local
//! expert runs on its rows gathered by (source rank, token): the token order of the
//! micro-batch, whichever rank holds the expert.
//!
//! [`Placement::send_order`]: super::Placement::send_order

use std::time::{Duration, Instant};

use halo::{Communicator, MoeDispatch, MoeExchange, MoeRouting, Partition};
use halo_moe::{Routing, gather_slots, gather_tokens, scatter_slots};

use super::compute::StageCompute;
use super::pipeline::Stage;
use super::{StepTimes, timed};
use crate::error::{PiperError, Result};

/// Who sends what to whom in one block's dispatch (the same for its backward).
#[derive(Debug)]
struct Dispatch {
    /// Slot indices (`token * top_k + j`) in send order.
    send_slots: Vec<usize>,
    /// Elements sent to each EP rank.
    send_counts: Vec<usize>,
    /// Elements received from each EP rank.
    recv_counts: Vec<usize>,
    /// Per local expert: its rows in the receive buffer, by (source rank, token).
    expert_rows: Vec<Vec<usize>>,
    /// Rows received in all.
    recv_rows: usize,
    /// Rows sent to (EP rank q, its j-th local expert), at `q * per + j`: send order.
    to_expert: Vec<usize>,
    /// Rows received from (EP rank src, my j-th local expert), at `src * per + j`.
    from_source: Vec<usize>,
}

/// The two sides of one round of the overlapped exchange (local expert index `j` of
/// every rank), in elements: the token side addresses the send-order buffer
/// (non-contiguous: a slice per destination), the expert side is packed by source.
struct Round {
    token_counts: Vec<usize>,
    token_displs: Vec<usize>,
    expert_counts: Vec<usize>,
    expert_len: usize,
}

impl Dispatch {
    /// The rounds of [`exchange_overlapped`], one per local expert index.
    fn rounds(&self, per: usize, d: usize) -> Vec<Round> {
        // Where (q, j)'s rows start in the send-order buffer, in rows.
        let mut offset = vec![0usize; self.to_expert.len() + 1];
        for (i, &n) in self.to_expert.iter().enumerate() {
            offset[i + 1] = offset[i] + n;
        }
        (0..per).map(|j| self.round(j, per, d, &offset)).collect()
    }

    /// Round `j`, with the send-order `offset` of every (rank, local expert).
    fn round(&self, j: usize, per: usize, d: usize, offset: &[usize]) -> Round {
        let p = self.to_expert.len() / per;
        let token_counts = (0..p).map(|q| self.to_expert[q * per + j] * d).collect();
        let token_displs = (0..p).map(|q| offset[q * per + j] * d).collect();
        let expert_counts: Vec<usize> = (0..p)
            .map(|src| self.from_source[src * per + j] * d)
            .collect();
        let expert_len = expert_counts.iter().sum();
        Round {
            token_counts,
            token_displs,
            expert_counts,
            expert_len,
        }
    }
}

/// Dispatch, per-expert compute and combine with communication overlapped: one round
/// per local expert index `j`; round `j` moves every rank's rows for its `j`-th local
/// expert (packed by source: the expert's rows in (source rank, token) order, exactly
/// the rows and order of the blocking path). While expert `k` computes, round `k + 1`'s
/// dispatch and round `k - 1`'s combine run on the EP communicator's worker.
///
/// `compute(k, rows)` returns expert `k`'s output rows (same shape as `rows`). Returns
/// the combined rows in send order and the time spent waiting for communication.
fn exchange_overlapped(
    ep: &mut Communicator,
    dp: &Dispatch,
    send: &[f32],
    d: usize,
    per: usize,
    mut compute: impl FnMut(usize, &[f32]) -> Result<Vec<f32>>,
) -> Result<(Vec<f32>, Duration)> {
    let rounds = dp.rounds(per, d);
    fn token(r: &Round) -> Partition<'_> {
        Partition::new(&r.token_counts, &r.token_displs)
    }
    let mut recvs: Vec<Vec<f32>> = rounds.iter().map(|r| vec![0.0; r.expert_len]).collect();
    let mut outs: Vec<Vec<f32>> = vec![Vec::new(); per];
    let mut back = vec![0.0f32; dp.send_slots.len() * d];
    let mut waited = Duration::ZERO;
    let t0 = Instant::now();
    ep.all_to_all_v(
        send,
        &token(&rounds[0]),
        &mut recvs[0],
        &Partition::packed(&rounds[0].expert_counts),
    )?;
    waited += t0.elapsed();
    for k in 0..per {
        let (arrived, coming) = recvs.split_at_mut(k + 1);
        let (computed, current) = outs.split_at_mut(k);
        let rows: &[f32] = &arrived[k];
        let next = coming.first_mut().map(|r| (r, &rounds[k + 1]));
        let prev = computed.last().map(|o| (o.as_slice(), &rounds[k - 1]));
        let back_ref = &mut back;
        let out_k = &mut current[0];
        let t = Instant::now();
        let mut busy = Duration::ZERO;
        let done = ep.scope(|s| {
            let r_next = next.map(|(buf, r)| {
                s.all_to_all_v(send, &token(r), buf, &Partition::packed(&r.expert_counts))
            });
            let r_prev = prev.map(|(out, r)| {
                s.all_to_all_v(
                    out,
                    &Partition::packed(&r.expert_counts),
                    back_ref,
                    &token(r),
                )
            });
            let c0 = Instant::now();
            let computed = compute(k, rows);
            busy = c0.elapsed();
            if let Some(r) = r_next {
                r.wait()?;
            }
            if let Some(r) = r_prev {
                r.wait()?;
            }
            Ok(computed)
        })?;
        waited += t.elapsed().saturating_sub(busy);
        *out_k = done?;
    }
    let last = &rounds[per - 1];
    let t = Instant::now();
    ep.all_to_all_v(
        &outs[per - 1],
        &Partition::packed(&last.expert_counts),
        &mut back,
        &token(last),
    )?;
    waited += t.elapsed();
    Ok((back, waited))
}

/// Saved state of one block's forward on one micro-batch.
pub(super) struct LayerTape<C: StageCompute> {
    dense: C::DenseState,
    router: C::RouterState,
    /// The model's combine state (all-to-all-v), or, with the de-duplicated combine,
    /// each local expert's outputs (its rows in receive order) and the routing's gates:
    /// the gate gradients are computed where the outputs are.
    combine: CombineTape<C>,
    dispatch: Dispatch,
    /// Per local expert: its saved state (`None` when it got no rows).
    experts: Vec<Option<C::ExpertState>>,
}

/// How a block's combine was done, for its backward.
enum CombineTape<C: StageCompute> {
    /// The model's combine at the source, on every (token, slot) output.
    Model(C::CombineState),
    /// [`MoeExchange::combine_residual`]: the exchange (the backward runs on it too),
    /// per local expert its outputs, and the gates.
    Dedup {
        exchange: Box<MoeExchange>,
        expert_y: Vec<Vec<f32>>,
        gates: Vec<f32>,
    },
}

impl<C: StageCompute> CombineTape<C> {
    fn bytes(&self) -> usize {
        use super::compute::Footprint;
        match self {
            CombineTape::Model(s) => s.bytes(),
            CombineTape::Dedup {
                expert_y, gates, ..
            } => 4 * (expert_y.iter().map(Vec::len).sum::<usize>() + gates.len()),
        }
    }
}

impl<C: StageCompute> LayerTape<C> {
    /// Bytes this tape keeps: (experts' saved states, everything else).
    pub(super) fn bytes(&self) -> (usize, usize) {
        use super::compute::Footprint;
        let experts = self.experts.iter().flatten().map(Footprint::bytes).sum();
        let rest = self.dense.bytes() + self.router.bytes() + self.combine.bytes();
        (experts, rest)
    }
}

/// Routing -> send order and counts; exchanges the per-expert counts with a uniform
/// all-to-all so each rank knows what it receives.
fn plan(
    ep: &mut Communicator,
    st: &Stage,
    layer: usize,
    experts: usize,
    routing: &Routing,
) -> Result<Dispatch> {
    let p = ep.size();
    let per = st.placement.per_rank();
    let d = st.hidden;
    let counts = routing.counts(experts);
    st.record(layer, &counts);
    let order = st.placement.send_order(layer);
    let mut send_slots = Vec::with_capacity(routing.experts.len());
    for &e in &order {
        send_slots.extend(routing.slots_of(e));
    }
    let send_counts: Vec<usize> = (0..p)
        .map(|q| {
            order[q * per..(q + 1) * per]
                .iter()
                .map(|&e| counts[e])
                .sum::<usize>()
                * d
        })
        .collect();
    let mine: Vec<u64> = order.iter().map(|&e| counts[e] as u64).collect();
    let to_expert: Vec<usize> = order.iter().map(|&e| counts[e]).collect();
    let mut theirs = vec![0u64; experts];
    ep.all_to_all(&mine, &mut theirs)?;
    // theirs[src * per + j]: rows from `src` for local expert j.
    let mut expert_rows = vec![Vec::new(); per];
    let mut at = 0usize;
    let mut recv_counts = Vec::with_capacity(p);
    for src in 0..p {
        let start = at;
        for (j, rows) in expert_rows.iter_mut().enumerate() {
            let n = usize::try_from(theirs[src * per + j]).map_err(|_| {
                PiperError::Compute(format!(
                    "rank {src} announced {} rows",
                    theirs[src * per + j]
                ))
            })?;
            rows.extend(at..at + n);
            at += n;
        }
        recv_counts.push((at - start) * d);
    }
    let from_source = theirs.iter().map(|&n| n as usize).collect();
    Ok(Dispatch {
        send_slots,
        send_counts,
        recv_counts,
        expert_rows,
        recv_rows: at,
        to_expert,
        from_source,
    })
}

/// Sends rows in send order to the experts' ranks; returns the receive buffer.
fn dispatch(ep: &mut Communicator, dp: &Dispatch, send: &[f32], d: usize) -> Result<Vec<f32>> {
    let mut recv = vec![0.0f32; dp.recv_rows * d];
    ep.all_to_all_v(
        send,
        &Partition::packed(&dp.send_counts),
        &mut recv,
        &Partition::packed(&dp.recv_counts),
    )?;
    Ok(recv)
}

/// The reverse of [`dispatch`]: rows in receive order go back to their sources.
fn combine(ep: &mut Communicator, dp: &Dispatch, back: &[f32], d: usize) -> Result<Vec<f32>> {
    let mut out = vec![0.0f32; dp.send_slots.len() * d];
    ep.all_to_all_v(
        back,
        &Partition::packed(&dp.recv_counts),
        &mut out,
        &Partition::packed(&dp.send_counts),
    )?;
    Ok(out)
}

/// Whether this block's exchange runs overlapped: asked for, and more than one rank and
/// more than one local expert.
fn overlapped(st: &Stage, ep: &Communicator) -> bool {
    st.overlap
        && st.dispatch == MoeDispatch::AllToAllV
        && ep.size() > 1
        && st.placement.per_rank() > 1
}

/// `y += s * x` (the reference model's order of operations: the same bits).
fn axpy(s: f32, x: &[f32], y: &mut [f32]) {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += s * xv;
    }
}

/// `sum x_i * y_i` from 0.0 in index order (the reference model's).
fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        s += a * b;
    }
    s
}

/// The forward dispatch by [`MoeExchange`] ([`MoeDispatch::Dedup`]): the exchange (for
/// the combine) and the rows each local expert gets, by local expert index `j` of
/// `local`, in the order of [`dispatch`] (source rank, then slot), which is
/// `MoeExchange`'s order (expert, source, token).
fn dispatch_dedup(
    ep: &mut Communicator,
    st: &Stage,
    layer: usize,
    routing: &Routing,
    u: &[f32],
    local: &[usize],
) -> Result<(MoeExchange, Vec<Vec<f32>>)> {
    let d = st.hidden;
    let expert_rank: Vec<u32> = st
        .placement
        .owners(layer)
        .iter()
        .map(|&q| q as u32)
        .collect();
    let moe = MoeRouting {
        top_k: routing.top_k,
        experts: &routing.experts,
        gates: &routing.gates,
        expert_rank: &expert_rank,
    };
    let (ex, rows) = MoeExchange::dispatch(ep, u, d, &moe, MoeDispatch::Dedup)?;
    let mut at = Vec::with_capacity(ex.local_experts().len());
    let mut start = 0usize;
    for &c in ex.expert_counts() {
        at.push((start, c));
        start += c;
    }
    if ex
        .local_experts()
        .iter()
        .map(|&e| e as usize)
        .ne(local.iter().copied())
    {
        return Err(PiperError::Compute(format!(
            "the dedup dispatch's local experts {:?} are not the placement's {local:?}",
            ex.local_experts()
        )));
    }
    let by = at
        .iter()
        .map(|&(s, c)| rows[s * d..(s + c) * d].to_vec())
        .collect();
    Ok((ex, by))
}

/// Forward of block `layer` on `x`; returns its output and saved state.
pub(super) fn forward<C: StageCompute>(
    ep: &mut Communicator,
    st: &Stage,
    model: &C,
    layer: usize,
    x: &[f32],
    times: &mut StepTimes,
) -> Result<(Vec<f32>, LayerTape<C>)> {
    let (d, k) = (st.hidden, model.top_k());
    let (h, u, dense) = model.dense_forward(layer, x)?;
    let (routing, router) = model.router_forward(layer, &u)?;
    let rows = u.len() / d;
    let plan = timed(&mut times.all_to_all, || {
        plan(ep, st, layer, model.experts(), &routing)
    })?;
    let local = st.local(layer);
    let send = gather_tokens(&u, d, k, &plan.send_slots)?;
    let mut experts = Vec::with_capacity(plan.expert_rows.len());
    let back = if overlapped(st, ep) {
        let (back, waited) = exchange_overlapped(ep, &plan, &send, d, local.len(), |j, xin| {
            if xin.is_empty() {
                experts.push(None);
                return Ok(Vec::new());
            }
            let (y, es) = model.expert_forward(layer, local[j], xin)?;
            experts.push(Some(es));
            Ok(y)
        })?;
        times.all_to_all += waited;
        back
    } else {
        if st.dispatch == MoeDispatch::Dedup {
            return forward_dedup(
                ep,
                st,
                model,
                layer,
                &routing,
                (h, u, dense, router),
                plan,
                times,
            );
        }
        let (recv, by_expert): (Option<Vec<f32>>, Option<Vec<Vec<f32>>>) = {
            let recv = timed(&mut times.all_to_all, || dispatch(ep, &plan, &send, d))?;
            (Some(recv), None)
        };
        let mut out_recv = vec![0.0f32; plan.recv_rows * d];
        for (j, rows_j) in plan.expert_rows.iter().enumerate() {
            if rows_j.is_empty() {
                experts.push(None);
                continue;
            }
            let xin = match (&recv, &by_expert) {
                (Some(recv), _) => gather_slots(recv, d, rows_j)?,
                (None, Some(by)) => {
                    if by[j].len() != rows_j.len() * d {
                        return Err(PiperError::Compute(format!(
                            "dedup dispatch gave local expert {j} {} rows, the counts say {}",
                            by[j].len() / d.max(1),
                            rows_j.len()
                        )));
                    }
                    by[j].clone()
                }
                (None, None) => {
                    return Err(PiperError::Compute("no dispatch ran".into()));
                }
            };
            let (y, es) = model.expert_forward(layer, local[j], &xin)?;
            scatter_slots(&y, d, rows_j, &mut out_recv)?;
            experts.push(Some(es));
        }
        timed(&mut times.all_to_all, || combine(ep, &plan, &out_recv, d))?
    };
    let mut expert_out = vec![0.0f32; rows * k * d];
    scatter_slots(&back, d, &plan.send_slots, &mut expert_out)?;
    // The model's combine, in the model's order (slot order per token): the sum does not
    // depend on where the experts live, so migration and the layout keep the bits.
    let (out, combine) = model.combine_forward(&h, &routing.gates, &expert_out)?;
    Ok((
        out,
        LayerTape {
            dense,
            router,
            combine: CombineTape::Model(combine),
            dispatch: plan,
            experts,
        },
    ))
}

/// Forward of block `layer` with the de-duplicated dispatch and combine: every token
/// once per destination node both ways; the experts' outputs are reduced inside the
/// node ([`MoeExchange::combine_residual`]) and kept at the experts for the backward.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn forward_dedup<C: StageCompute>(
    ep: &mut Communicator,
    st: &Stage,
    model: &C,
    layer: usize,
    routing: &Routing,
    (h, u, dense, router): (Vec<f32>, Vec<f32>, C::DenseState, C::RouterState),
    plan: Dispatch,
    times: &mut StepTimes,
) -> Result<(Vec<f32>, LayerTape<C>)> {
    let d = st.hidden;
    let local = st.local(layer);
    let (ex, by) = timed(&mut times.all_to_all, || {
        dispatch_dedup(ep, st, layer, routing, &u, &local)
    })?;
    let mut experts = Vec::with_capacity(local.len());
    let mut expert_y = Vec::with_capacity(local.len());
    let mut y_all = Vec::with_capacity(by.iter().map(Vec::len).sum());
    for (j, xin) in by.iter().enumerate() {
        if plan.expert_rows[j].len() * d != xin.len() {
            return Err(PiperError::Compute(format!(
                "dedup dispatch gave local expert {j} {} rows, the counts say {}",
                xin.len() / d.max(1),
                plan.expert_rows[j].len()
            )));
        }
        if xin.is_empty() {
            experts.push(None);
            expert_y.push(Vec::new());
            continue;
        }
        let (y, es) = model.expert_forward(layer, local[j], xin)?;
        y_all.extend_from_slice(&y);
        experts.push(Some(es));
        expert_y.push(y);
    }
    let out = timed(&mut times.all_to_all, || {
        ex.combine_residual(ep, &y_all, &h)
            .map_err(PiperError::from)
    })?;
    Ok((
        out,
        LayerTape {
            dense,
            router,
            combine: CombineTape::Dedup {
                exchange: Box::new(ex),
                expert_y,
                gates: routing.gates.clone(),
            },
            dispatch: plan,
            experts,
        },
    ))
}

/// Backward of the expert part with the de-duplicated exchange, on the forward's
/// [`MoeExchange`]: `d_out` goes to the experts as the forward's tokens did (once per
/// destination node, replicated inside it), each row's gate with it
/// ([`MoeExchange::dispatch_pairs`]); the expert computes `d_y = gate * d_out` and the
/// gate's gradient `<y, d_out>` where `y` is; the gate gradients go back per (token,
/// slot) ([`MoeExchange::combine_pairs`]), then the router's backward, and the experts'
/// `d_x` rows come back summed inside each node onto the router's gradient
/// ([`MoeExchange::combine_sum_residual`]): one row per (token, node) each way, as in
/// the forward. Returns `d_u` (the gradient of the MoE input: router path plus every
/// slot's `d_x`, which is what `moe_input_backward` computes on the other path).
#[allow(clippy::too_many_arguments)]
fn backward_dedup<C: StageCompute>(
    ep: &mut Communicator,
    st: &Stage,
    model: &mut C,
    layer: usize,
    plan: &Dispatch,
    (exchange, expert_y, gates): (MoeExchange, Vec<Vec<f32>>, Vec<f32>),
    (states, router): (Vec<Option<C::ExpertState>>, C::RouterState),
    d_out: &[f32],
    times: &mut StepTimes,
) -> Result<Vec<f32>> {
    let d = st.hidden;
    let local = st.local(layer);
    let (rows, row_gates) = timed(&mut times.all_to_all, || {
        let rows = exchange.dispatch_rows(ep, d_out, d)?;
        let g = exchange.dispatch_pairs(ep, &gates)?;
        Ok::<_, halo::Error>((rows, g))
    })?;
    let mut dx_rows = vec![0.0f32; rows.len()];
    let mut dg_rows = vec![0.0f32; row_gates.len()];
    let mut start = 0usize;
    for (j, (rows_j, es)) in plan.expert_rows.iter().zip(states).enumerate() {
        let (first, c) = (start, rows_j.len());
        start += c;
        let Some(es) = es else { continue };
        let y = &expert_y[j];
        let mut dy = vec![0.0f32; c * d];
        for i in 0..c {
            let r = first + i;
            let dr = &rows[r * d..(r + 1) * d];
            axpy(row_gates[r], dr, &mut dy[i * d..(i + 1) * d]);
            dg_rows[r] = dot(&y[i * d..(i + 1) * d], dr);
        }
        let dxe = model.expert_backward(layer, local[j], es, &dy)?;
        dx_rows[first * d..(first + c) * d].copy_from_slice(&dxe);
    }
    let d_gates = timed(&mut times.all_to_all, || {
        exchange.combine_pairs(ep, &dg_rows)
    })?;
    let d_router = model.router_backward(layer, router, &d_gates)?;
    Ok(timed(&mut times.all_to_all, || {
        exchange.combine_sum_residual(ep, &dx_rows, d, &d_router)
    })?)
}

/// Backward of block `layer` from `d_out`; returns `d_x`.
pub(super) fn backward<C: StageCompute>(
    ep: &mut Communicator,
    st: &Stage,
    model: &mut C,
    layer: usize,
    tape: LayerTape<C>,
    d_out: &[f32],
    times: &mut StepTimes,
) -> Result<Vec<f32>> {
    let d = st.hidden;
    let plan = &tape.dispatch;
    let local = st.local(layer);
    let cg = match tape.combine {
        CombineTape::Model(state) => model.combine_backward(state, d_out)?,
        CombineTape::Dedup {
            exchange,
            expert_y,
            gates,
        } => {
            let du = backward_dedup(
                ep,
                st,
                model,
                layer,
                plan,
                (*exchange, expert_y, gates),
                (tape.experts, tape.router),
                d_out,
                times,
            )?;
            return model.dense_backward(layer, tape.dense, d_out, &du);
        }
    };
    let send = gather_slots(&cg.d_expert_out, d, &plan.send_slots)?;
    let back = if overlapped(st, ep) {
        let mut states: Vec<Option<C::ExpertState>> = tape.experts;
        let (back, waited) = exchange_overlapped(ep, plan, &send, d, local.len(), |j, dy| {
            match states.get_mut(j).and_then(Option::take) {
                Some(es) => model.expert_backward(layer, local[j], es, dy),
                None => Ok(Vec::new()),
            }
        })?;
        times.all_to_all += waited;
        back
    } else {
        let recv = timed(&mut times.all_to_all, || dispatch(ep, plan, &send, d))?;
        let mut din_recv = vec![0.0f32; recv.len()];
        for (j, (rows_j, es)) in plan.expert_rows.iter().zip(tape.experts).enumerate() {
            let Some(es) = es else { continue };
            let dy = gather_slots(&recv, d, rows_j)?;
            let dxe = model.expert_backward(layer, local[j], es, &dy)?;
            scatter_slots(&dxe, d, rows_j, &mut din_recv)?;
        }
        timed(&mut times.all_to_all, || combine(ep, plan, &din_recv, d))?
    };
    let mut d_expert_in = vec![0.0f32; cg.d_expert_out.len()];
    scatter_slots(&back, d, &plan.send_slots, &mut d_expert_in)?;
    let d_router = model.router_backward(layer, tape.router, &cg.d_gates)?;
    let du = model.moe_input_backward(&d_router, &d_expert_in)?;
    model.dense_backward(layer, tape.dense, &cg.d_h, &du)
}
