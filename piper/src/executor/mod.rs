//! The embedded Piper pipeline executor: one training step of an MoE transformer over a
//! PP x EP (x DP) mesh of HALO communicators, 1F1B over M micro-batches.
//!
//! - [`mesh`]: the layout and the sub-communicators ([`Mesh`]).
//! - [`compute`]: what the executor asks of a model ([`StageCompute`]) and the reference
//!   implementation ([`ReferenceModel`], over `halo-moe`).
//! - `pipeline` (private): the 1F1B schedule and the stage-to-stage exchanges.
//! - `moe_layer` (private): routing, count exchange, dispatch and combine with
//!   `all_to_all_v` (or the de-duplicating `MoeExchange`) on the stage's EP
//!   communicator, and their backward.
//!
//! # A step
//!
//! Every rank is given the same global batch (whole sequences). Sequence block
//! `(micro-batch m, replica d, EP index e)` of `B / (M * DP * EP)` sequences, blocks in
//! that order, is what rank `(stage, d, e)` processes as its micro-batch `m`. Stage 0
//! embeds it, each stage runs its blocks (contiguous, see [`MeshLayout::stage_layers`]),
//! the last stage computes the loss normalised by the global batch's token count, so that
//! the parts' losses and gradients sum to the single-rank reference's. Then the
//! replicated groups (embedding, dense, router, head) are summed over the EP group and the
//! DP group, the experts' over the DP group; each expert's gradient stays on the rank that
//! owns the expert. Who owns which expert is the [`Placement`] table: at first EP index
//! `e` owns experts `e * E/EP .. (e+1) * E/EP` of each block of its stage; expert
//! migration (`crate::migration`) changes it between steps.
//!
//! # Exactness
//!
//! An expert receives its rows ordered by (source EP rank, token), micro-batches in order,
//! which is the token order of the global batch: with DP = 1 its gradient accumulates in
//! the reference's order and is bit-for-bit the reference's. The replicated groups are sums
//! over ranks of partial sums, so they agree with the reference to rounding
//! (`piper/tests/executor.rs` measures it).
//!
//! # Blocking version
//!
//! This version uses blocking calls only; the stage-to-stage exchanges are Megatron's
//! combined `send_forward_recv_backward` / `send_backward_recv_forward` on
//! [`halo::Communicator::send_recv`], so the rendezvous transport cannot deadlock. Each
//! communication call is one function in `pipeline` or `moe_layer`, so that overlapping
//! (non-blocking) forms can replace them there.

pub mod compute;
pub mod mesh;
mod moe_layer;
mod pipeline;
pub mod placement;

use std::ops::Range;
use std::time::{Duration, Instant};

use halo::{Communicator, ReduceOp};
use halo_moe::{Adam, GroupId};

pub use compute::{Footprint, ReferenceModel, StageCompute};
pub use mesh::{Mesh, MeshLayout};
pub use placement::Placement;

use crate::error::{PiperError, Result};

/// What one training step reports.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// The global batch's mean loss (the same on every rank).
    pub loss: f64,
    /// Tokens of the global batch.
    pub tokens: usize,
    /// Where this rank's time went.
    pub times: StepTimes,
    /// This rank's peak of saved activations during the step.
    pub activations: ActivationPeak,
    /// Slots this rank's routers sent to each expert, `layer * E + expert` for every block
    /// of the model (zero for the blocks of other stages): the local part of the load
    /// that expert migration agrees on.
    pub routed: Vec<u64>,
}

/// The most bytes of saved forward state (activations kept for the backward) this rank
/// held at once in a step, measured by adding up the model's saved states
/// ([`compute::Footprint`]) as 1F1B stores and consumes them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActivationPeak {
    /// Bytes at the peak.
    pub bytes: usize,
    /// Of which the local experts' saved states.
    pub expert_bytes: usize,
    /// Micro-batches in flight at the peak.
    pub in_flight: usize,
}

/// This rank's time in one step, by kind; the kinds add up to `total`. Communication
/// times are those of the blocking calls, so all-to-all and all-reduce include waiting
/// for the peers; the point-to-point calls are split into transfer (`p2p`) and waiting
/// for the neighbour stage (`idle`, the pipeline bubble): see `pipeline`'s `P2pClock`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    /// The whole step.
    pub total: Duration,
    /// Everything but communication (the model's pieces, gathers and scatters).
    pub compute: Duration,
    /// Count exchanges, dispatches and combines on the EP communicator.
    pub all_to_all: Duration,
    /// Stage-to-stage sends and receives: the transfer (each call's kind at the
    /// fastest call of that kind in the step).
    pub p2p: Duration,
    /// Stage-to-stage calls beyond their transfer time: waiting for the neighbour stage,
    /// the pipeline bubble.
    pub idle: Duration,
    /// Gradient and loss all-reduces.
    pub all_reduce: Duration,
}

/// Runs `f`, adding its wall time to `acc`.
fn timed<T>(acc: &mut Duration, f: impl FnOnce() -> T) -> T {
    let t0 = Instant::now();
    let out = f();
    *acc += t0.elapsed();
    out
}

/// One rank's executor: its place in the mesh and the step's shape.
#[derive(Debug)]
pub struct Executor {
    mesh: Mesh,
    microbatches: usize,
    layers: Range<usize>,
    placement: Placement,
    hidden: usize,
    seq: usize,
    overlap: bool,
    dispatch: halo::MoeDispatch,
}

impl Executor {
    /// Builds the mesh from `world` (collective: every rank calls it with the same
    /// arguments) for `model`'s shape, running `microbatches` micro-batches per step.
    ///
    /// # Errors
    /// As [`Mesh::new`]; [`PiperError::Invalid`] when `microbatches` is 0.
    pub fn new<C: StageCompute>(
        world: &mut Communicator,
        layout: MeshLayout,
        microbatches: usize,
        model: &C,
    ) -> Result<Self> {
        if microbatches == 0 {
            return Err(PiperError::invalid(
                "layout",
                "microbatches",
                "must be at least 1",
            ));
        }
        let mesh = Mesh::new(world, layout, model.layers(), model.experts())?;
        let layers = layout.stage_layers(mesh.stage(), model.layers());
        let placement = Placement::contiguous(model.layers(), model.experts(), layout.ep)?;
        Ok(Executor {
            mesh,
            microbatches,
            layers,
            placement,
            hidden: model.hidden(),
            seq: model.seq(),
            overlap: false,
            dispatch: halo::MoeDispatch::AllToAllV,
        })
    }

    /// Overlaps communication with the experts' compute in every MoE layer (off by
    /// default): the dispatch and the combine run as one `all_to_all_v` per local expert
    /// index on the EP communicator's non-blocking [`halo::Communicator::scope`], so
    /// that while local expert `j` computes, the rows of expert `j + 1` arrive and the
    /// outputs of expert `j - 1` go back. Every expert receives exactly the rows, in
    /// the order, it receives without overlap, so the results are bit-for-bit the
    /// same (`piper/tests/executor.rs` checks it); the cost is E/EP exchanges per
    /// direction instead of one. No effect with EP = 1 or one expert per rank.
    /// Collective in effect: every rank of an EP group must set the same value.
    pub fn set_overlap(&mut self, on: bool) {
        self.overlap = on;
    }

    /// Whether MoE layers overlap communication with the experts' compute.
    pub fn overlap(&self) -> bool {
        self.overlap
    }

    /// How every MoE layer moves the tokens (default [`halo::MoeDispatch::AllToAllV`]).
    ///
    /// With [`halo::MoeDispatch::Dedup`] the forward is one
    /// [`halo::MoeExchange::dispatch`] — each token once per destination node of its EP
    /// group, replicated inside the node — and one
    /// [`halo::MoeExchange::combine_residual`]: the gate-weighted outputs of a token's
    /// experts on one node are summed inside that node, and one row per (token, node)
    /// goes back. The experts keep their outputs; the backward sends each (token,
    /// slot) its `d_out` row and its gate (rows of `hidden + 1`, all-to-all-v), the
    /// expert computes `d_y = gate * d_out` and the gate's gradient `<y, d_out>` where
    /// `y` is, and returns `d_x` with the gate gradient. So the backward stays
    /// per-(token, expert) traffic (one element more per row); only the forward is
    /// de-duplicated.
    ///
    /// Both modes sum `h + sum_j gate_j * y_j` in the dedup combine's order (the
    /// token's own node's slots added to `h` in slot order, then each other node's
    /// partial sum in ascending node order), so losses and gradients are **bitwise**
    /// the same in both modes (`piper/tests/executor.rs` checks it); with one node per
    /// EP group that order is the model's own slot order. Dedup runs without overlap.
    /// Collective in effect: every rank of an EP group must set the same value.
    pub fn set_dispatch(&mut self, dispatch: halo::MoeDispatch) {
        self.dispatch = dispatch;
    }

    /// How MoE layers move the tokens.
    pub fn dispatch(&self) -> halo::MoeDispatch {
        self.dispatch
    }

    /// The mesh (this rank's coordinates and communicators).
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// Blocks of this rank's stage.
    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// The mesh, mutable (for collectives of expert migration).
    pub(crate) fn mesh_mut(&mut self) -> &mut Mesh {
        &mut self.mesh
    }

    /// Experts of block `layer` this rank owns, ascending.
    pub fn local_experts(&self, layer: usize) -> Vec<usize> {
        self.placement.local(layer, self.mesh.ep_index())
    }

    /// The expert -> rank table in force (the same on every rank of the mesh).
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Switches the table (expert migration, after the experts have moved).
    pub(crate) fn set_placement(&mut self, placement: Placement) {
        self.placement = placement;
    }

    /// The parameter groups whose parameters and gradients this rank holds: its stage's
    /// replicated groups (embedding on the first stage, dense and router of its blocks,
    /// head on the last) and its experts of its blocks, in [`GroupId`] order.
    pub fn owned_groups(&self) -> Vec<GroupId> {
        let mut ids = self.replicated_groups();
        for layer in self.layers.clone() {
            for expert in self.local_experts(layer) {
                ids.push(GroupId::Expert { layer, expert });
            }
        }
        ids.sort();
        ids
    }

    fn replicated_groups(&self) -> Vec<GroupId> {
        let mut ids = Vec::new();
        if self.mesh.is_first() {
            ids.push(GroupId::Embed);
        }
        for l in self.layers.clone() {
            ids.push(GroupId::Dense(l));
            ids.push(GroupId::Router(l));
        }
        if self.mesh.is_last() {
            ids.push(GroupId::Head);
        }
        ids
    }

    /// Sequences of the global batch this rank processes as micro-batch `m`.
    fn part(&self, m: usize, per: usize) -> Range<usize> {
        let l = self.mesh.layout();
        let block = (m * l.dp + self.mesh.dp_index()) * l.ep + self.mesh.ep_index();
        block * per..(block + 1) * per
    }

    /// One forward and backward pass of the global batch `tokens` / `targets` (whole
    /// sequences, the same on every rank): zeroes the model's gradients, runs 1F1B over the
    /// micro-batches, and reduces the replicated gradients. Collective over the mesh.
    ///
    /// # Errors
    /// [`PiperError::BatchSplit`] when the batch does not split into EP x DP x M parts of
    /// whole sequences (on every rank, before any communication);
    /// [`PiperError::Model`] / [`PiperError::Compute`] from the model;
    /// [`PiperError::Comm`] from the library (its timeouts apply, so a failed peer is an
    /// error here, not a hang).
    pub fn step<C: StageCompute>(
        &mut self,
        model: &mut C,
        tokens: &[u32],
        targets: &[u32],
    ) -> Result<StepReport> {
        let l = self.mesh.layout();
        let seq = self.seq;
        if targets.len() != tokens.len() {
            return Err(PiperError::invalid(
                "batch",
                "targets",
                format!("{} targets for {} tokens", targets.len(), tokens.len()),
            ));
        }
        let sequences = tokens.len() / seq;
        let parts = l.ep * l.dp * self.microbatches;
        if !tokens.len().is_multiple_of(seq) || sequences == 0 || !sequences.is_multiple_of(parts) {
            return Err(PiperError::BatchSplit {
                sequences,
                ep: l.ep,
                dp: l.dp,
                microbatches: self.microbatches,
            });
        }
        let per = sequences / parts;
        let normaliser = tokens.len() as f32;
        let micro: Vec<pipeline::MicroBatch<'_>> = (0..self.microbatches)
            .map(|m| {
                let r = self.part(m, per);
                let t = r.start * seq..r.end * seq;
                pipeline::MicroBatch {
                    tokens: &tokens[t.clone()],
                    targets: &targets[t],
                }
            })
            .collect();
        let t0 = Instant::now();
        let mut times = StepTimes::default();
        model.zero_grads();
        let ctx = pipeline::Stage {
            layers: self.layers.clone(),
            placement: self.placement.clone(),
            ep_index: self.mesh.ep_index(),
            hidden: self.hidden,
            rows: per * seq,
            normaliser,
            routed: std::cell::RefCell::new(vec![
                0;
                self.placement.layers() * self.placement.experts()
            ]),
            overlap: self.overlap,
            dispatch: self.dispatch,
        };
        let (local_loss, activations) =
            pipeline::one_f_one_b(&mut self.mesh, &ctx, model, &micro, &mut times)?;
        let mut ar = Duration::ZERO;
        timed(&mut ar, || self.reduce_gradients(model))?;
        let loss = timed(&mut ar, || self.reduce_loss(local_loss))?;
        times.all_reduce = ar;
        times.total = t0.elapsed();
        times.compute = times
            .total
            .saturating_sub(times.all_to_all + times.p2p + times.idle + times.all_reduce);
        Ok(StepReport {
            loss,
            tokens: tokens.len(),
            times,
            activations,
            routed: ctx.routed.into_inner(),
        })
    }

    /// Sums the replicated groups over the EP and DP groups and the experts over the DP
    /// group.
    fn reduce_gradients<C: StageCompute>(&mut self, model: &mut C) -> Result<()> {
        for id in self.replicated_groups() {
            let g = model.grads_mut(id)?;
            if self.mesh.ep.size() > 1 {
                self.mesh.ep.all_reduce_in_place(g, ReduceOp::Sum)?;
            }
            if let Some(dp) = self.mesh.dp.as_mut() {
                dp.all_reduce_in_place(g, ReduceOp::Sum)?;
            }
        }
        let me = self.mesh.ep_index();
        if let Some(dp) = self.mesh.dp.as_mut() {
            for layer in self.layers.clone() {
                for expert in self.placement.local(layer, me) {
                    let g = model.grads_mut(GroupId::Expert { layer, expert })?;
                    dp.all_reduce_in_place(g, ReduceOp::Sum)?;
                }
            }
        }
        Ok(())
    }

    /// The last stage's loss summed over its EP and DP ranks, then given to every stage.
    fn reduce_loss(&mut self, local: f64) -> Result<f64> {
        let mut v = [local];
        if self.mesh.ep.size() > 1 {
            self.mesh.ep.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
        }
        if let Some(dp) = self.mesh.dp.as_mut() {
            dp.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
        }
        if self.mesh.pp.size() > 1 {
            self.mesh.pp.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
        }
        Ok(v[0])
    }

    /// Applies `adam` to every group this rank owns ([`Executor::owned_groups`]), with the
    /// gradients of the last [`Executor::step`]. Needs no communication: replicas hold
    /// equal gradients after the step's all-reduces, so they stay equal.
    ///
    /// # Errors
    /// [`PiperError::Model`] from the optimizer; errors of the model's
    /// [`StageCompute::params_and_grads`].
    pub fn adam_step<C: StageCompute>(&self, model: &mut C, adam: &mut Adam) -> Result<()> {
        for id in self.owned_groups() {
            let (p, g) = model.params_and_grads(id)?;
            adam.step_group(id, p, g)?;
        }
        Ok(())
    }
}
