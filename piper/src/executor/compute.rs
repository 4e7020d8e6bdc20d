//! What the executor asks of a model: [`StageCompute`], and [`ReferenceModel`], its
//! implementation over `halo-moe`'s reference pieces.
//!
//! The executor owns placement, scheduling and communication; the model owns the
//! arithmetic, the parameters and the gradient accumulators. Every backward call consumes
//! the saved state its forward returned and accumulates into the model's gradients, so a
//! training program that brings its own model implements this trait and nothing else.

use halo_moe::{
    CombineGrads, CombineSaved, DenseSaved, ExpertSaved, GroupId, HeadSaved, MoeConfig, MoeGrads,
    MoeParams, RouterSaved, Routing,
};

use crate::error::{PiperError, Result};

/// Bytes a saved forward state holds: what the executor adds up to measure a stage's
/// activation memory (the peak is reported per step, [`super::ActivationPeak`]).
pub trait Footprint {
    /// Bytes of activations kept for the backward.
    fn bytes(&self) -> usize;
}

macro_rules! footprint_of_saved {
    ($($t:ty),*) => {$(
        impl Footprint for $t {
            fn bytes(&self) -> usize {
                <$t>::bytes(self)
            }
        }
    )*};
}
footprint_of_saved!(
    DenseSaved,
    RouterSaved,
    ExpertSaved,
    CombineSaved,
    HeadSaved
);

/// The compute of one MoE transformer, in the pieces the executor places.
///
/// Buffers are row-major `f32`, `rows x hidden` (see the `halo-moe` crate docs for the
/// slot-indexed `rows x top_k x hidden` layout). `layer` is the global block index;
/// `expert` the expert's id within its block.
pub trait StageCompute {
    /// Saved state of a block's dense (attention) part.
    type DenseState: Footprint;
    /// Saved state of a router.
    type RouterState: Footprint;
    /// Saved state of one expert on one batch of rows.
    type ExpertState: Footprint;
    /// Saved state of a combine.
    type CombineState: Footprint;
    /// Saved state of the head and loss.
    type HeadState: Footprint;

    /// Hidden size (elements per activation row).
    fn hidden(&self) -> usize;
    /// Tokens per sequence.
    fn seq(&self) -> usize;
    /// Blocks.
    fn layers(&self) -> usize;
    /// Experts per block.
    fn experts(&self) -> usize;
    /// Experts per token.
    fn top_k(&self) -> usize;

    /// Embeds whole sequences of `tokens` (first stage).
    fn embed_forward(&self, tokens: &[u32]) -> Result<Vec<f32>>;
    /// Accumulates the embedding's gradients from `d_x`.
    fn embed_backward(&mut self, tokens: &[u32], d_x: &[f32]) -> Result<()>;
    /// Block `layer`'s dense part: returns the residual `h`, the MoE input `u`, and state.
    fn dense_forward(
        &self,
        layer: usize,
        x: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>, Self::DenseState)>;
    /// Backward of the dense part from the gradients of `h` and `u`; returns `d_x`.
    fn dense_backward(
        &mut self,
        layer: usize,
        state: Self::DenseState,
        d_h: &[f32],
        d_u: &[f32],
    ) -> Result<Vec<f32>>;
    /// Block `layer`'s router on `u`.
    fn router_forward(&self, layer: usize, u: &[f32]) -> Result<(Routing, Self::RouterState)>;
    /// Backward of the router from the gate gradients; returns its part of `d_u`.
    fn router_backward(
        &mut self,
        layer: usize,
        state: Self::RouterState,
        d_gates: &[f32],
    ) -> Result<Vec<f32>>;
    /// Expert `expert` of block `layer` on rows `x` (any count, in the given order).
    fn expert_forward(
        &self,
        layer: usize,
        expert: usize,
        x: &[f32],
    ) -> Result<(Vec<f32>, Self::ExpertState)>;
    /// Backward of an expert: accumulates its gradients row by row; returns `d_x`.
    fn expert_backward(
        &mut self,
        layer: usize,
        expert: usize,
        state: Self::ExpertState,
        d_y: &[f32],
    ) -> Result<Vec<f32>>;
    /// Weighted sum of the slot-indexed expert outputs plus the residual `h`.
    fn combine_forward(
        &self,
        h: &[f32],
        gates: &[f32],
        expert_out: &[f32],
    ) -> Result<(Vec<f32>, Self::CombineState)>;
    /// Backward of the combine.
    fn combine_backward(&self, state: Self::CombineState, d_out: &[f32]) -> Result<CombineGrads>;
    /// Gradient of the MoE input from the router's part and the slot-indexed experts' parts.
    fn moe_input_backward(&self, d_router: &[f32], d_expert_in: &[f32]) -> Result<Vec<f32>>;
    /// Head and loss (last stage): the loss of these rows, summed and divided by
    /// `normaliser` (the global batch's token count).
    fn head_forward(
        &self,
        x: &[f32],
        targets: &[u32],
        normaliser: f32,
    ) -> Result<(f64, Self::HeadState)>;
    /// Backward of the head: accumulates its gradients; returns `d_x`.
    fn head_backward(&mut self, state: Self::HeadState) -> Result<Vec<f32>>;

    /// The gradient accumulator of one parameter group (for the all-reduces).
    fn grads_mut(&mut self, id: GroupId) -> Result<&mut [f32]>;
    /// A group's parameters and gradients together (for the optimizer).
    fn params_and_grads(&mut self, id: GroupId) -> Result<(&mut [f32], &[f32])>;
    /// Sets every gradient to zero (before a step).
    fn zero_grads(&mut self);
}

/// `halo-moe`'s reference model as a [`StageCompute`]: every rank holds the whole
/// [`MoeParams`] (initialised from the same seed) and a gradient accumulator of the same
/// shape, and touches only the groups the executor places on it.
#[derive(Debug, Clone)]
pub struct ReferenceModel {
    params: MoeParams,
    grads: MoeGrads,
}

impl ReferenceModel {
    /// Wraps `params` with zero gradients.
    ///
    /// # Errors
    /// [`PiperError::Model`] when the configuration is invalid.
    pub fn new(params: MoeParams) -> Result<Self> {
        let grads = MoeParams::zeros(params.config())?;
        Ok(ReferenceModel { params, grads })
    }
    /// The model's shape.
    pub fn config(&self) -> &MoeConfig {
        self.params.config()
    }
    /// The parameters.
    pub fn params(&self) -> &MoeParams {
        &self.params
    }
    /// The gradients accumulated so far (only the groups placed on this rank are
    /// meaningful).
    pub fn grads(&self) -> &MoeGrads {
        &self.grads
    }
}

fn layer_of<T>(v: &[T], layer: usize) -> Result<&T> {
    v.get(layer)
        .ok_or_else(|| PiperError::Compute(format!("no block {layer}")))
}

impl StageCompute for ReferenceModel {
    type DenseState = DenseSaved;
    type RouterState = RouterSaved;
    type ExpertState = ExpertSaved;
    type CombineState = CombineSaved;
    type HeadState = HeadSaved;

    fn hidden(&self) -> usize {
        self.config().hidden
    }
    fn seq(&self) -> usize {
        self.config().seq
    }
    fn layers(&self) -> usize {
        self.config().layers
    }
    fn experts(&self) -> usize {
        self.config().experts
    }
    fn top_k(&self) -> usize {
        self.config().top_k
    }

    fn embed_forward(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        Ok(halo_moe::embed_forward(
            self.config(),
            &self.params.embed,
            tokens,
        )?)
    }
    fn embed_backward(&mut self, tokens: &[u32], d_x: &[f32]) -> Result<()> {
        let cfg = self.params.config();
        Ok(halo_moe::embed_backward(
            cfg,
            tokens,
            d_x,
            &mut self.grads.embed,
        )?)
    }
    fn dense_forward(&self, layer: usize, x: &[f32]) -> Result<(Vec<f32>, Vec<f32>, DenseSaved)> {
        let p = &layer_of(&self.params.layers, layer)?.dense;
        let (out, saved) = halo_moe::dense_forward(self.config(), p, x)?;
        Ok((out.h, out.u, saved))
    }
    fn dense_backward(
        &mut self,
        layer: usize,
        state: DenseSaved,
        d_h: &[f32],
        d_u: &[f32],
    ) -> Result<Vec<f32>> {
        let cfg = self.params.config();
        let p = &layer_of(&self.params.layers, layer)?.dense;
        let g = &mut self.grads.layers[layer].dense;
        Ok(halo_moe::dense_backward(cfg, p, &state, d_h, d_u, g)?)
    }
    fn router_forward(&self, layer: usize, u: &[f32]) -> Result<(Routing, RouterSaved)> {
        let p = &layer_of(&self.params.layers, layer)?.router;
        Ok(halo_moe::router_forward(self.config(), p, u)?)
    }
    fn router_backward(
        &mut self,
        layer: usize,
        state: RouterSaved,
        d_gates: &[f32],
    ) -> Result<Vec<f32>> {
        let cfg = self.params.config();
        let p = &layer_of(&self.params.layers, layer)?.router;
        let g = &mut self.grads.layers[layer].router;
        Ok(halo_moe::router_backward(cfg, p, &state, d_gates, g)?)
    }
    fn expert_forward(
        &self,
        layer: usize,
        expert: usize,
        x: &[f32],
    ) -> Result<(Vec<f32>, ExpertSaved)> {
        let p = layer_of(&layer_of(&self.params.layers, layer)?.experts, expert)?;
        Ok(halo_moe::expert_forward(self.config(), p, x)?)
    }
    fn expert_backward(
        &mut self,
        layer: usize,
        expert: usize,
        state: ExpertSaved,
        d_y: &[f32],
    ) -> Result<Vec<f32>> {
        let cfg = self.params.config();
        let p = layer_of(&layer_of(&self.params.layers, layer)?.experts, expert)?;
        let g = &mut self.grads.layers[layer].experts[expert];
        Ok(halo_moe::expert_backward(cfg, p, &state, d_y, g)?)
    }
    fn combine_forward(
        &self,
        h: &[f32],
        gates: &[f32],
        expert_out: &[f32],
    ) -> Result<(Vec<f32>, CombineSaved)> {
        Ok(halo_moe::combine_forward(
            self.config(),
            h,
            gates,
            expert_out,
        )?)
    }
    fn combine_backward(&self, state: CombineSaved, d_out: &[f32]) -> Result<CombineGrads> {
        Ok(halo_moe::combine_backward(self.config(), &state, d_out)?)
    }
    fn moe_input_backward(&self, d_router: &[f32], d_expert_in: &[f32]) -> Result<Vec<f32>> {
        Ok(halo_moe::moe_input_backward(
            self.config(),
            d_router,
            d_expert_in,
        )?)
    }
    fn head_forward(
        &self,
        x: &[f32],
        targets: &[u32],
        normaliser: f32,
    ) -> Result<(f64, HeadSaved)> {
        Ok(halo_moe::head_loss_forward(
            self.config(),
            &self.params.head,
            x,
            targets,
            normaliser,
        )?)
    }
    fn head_backward(&mut self, state: HeadSaved) -> Result<Vec<f32>> {
        let cfg = self.params.config();
        Ok(halo_moe::head_loss_backward(
            cfg,
            &self.params.head,
            &state,
            &mut self.grads.head,
        )?)
    }

    fn grads_mut(&mut self, id: GroupId) -> Result<&mut [f32]> {
        Ok(self.grads.group_mut(id)?)
    }
    fn params_and_grads(&mut self, id: GroupId) -> Result<(&mut [f32], &[f32])> {
        Ok((self.params.group_mut(id)?, self.grads.group(id)?))
    }
    fn zero_grads(&mut self) {
        self.grads.zero();
    }
}
