//! Shared by the executor and migration tests: a model that fails, or kills its
//! process, in the middle of a step or of a move.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};

use halo_moe::{GroupId, Routing};
use halo_piper::{PiperError, ReferenceModel, StageCompute};

/// What an armed [`Failing`] does when an expert of its `fail_layer` is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnRead {
    /// Returns an error (the rank's thread then returns: its endpoint goes away).
    Error,
    /// Kills the process with SIGKILL.
    Kill,
}

/// The reference model; once armed, reading any expert of `fail_layer` fails or kills the
/// process: a rank dying in the middle of a move.
pub(crate) struct Failing {
    pub(crate) inner: ReferenceModel,
    pub(crate) fail_layer: Option<usize>,
    pub(crate) armed: AtomicBool,
    pub(crate) on_read: OnRead,
    /// Also fail (with an error) the forward of any expert of `fail_layer` once armed:
    /// a rank failing mid-step.
    pub(crate) in_forward: bool,
}

impl Failing {
    /// The reference model for `cfg` and `seed`, failing as given once armed.
    pub(crate) fn new(
        cfg: &halo_moe::MoeConfig,
        seed: u64,
        fail_layer: Option<usize>,
        on_read: OnRead,
        in_forward: bool,
    ) -> Self {
        Failing {
            inner: ReferenceModel::new(halo_moe::MoeParams::init(cfg, seed).unwrap()).unwrap(),
            fail_layer,
            armed: AtomicBool::new(in_forward),
            on_read,
            in_forward,
        }
    }

    fn tripped(&self, layer: usize) -> bool {
        self.armed.load(Ordering::Relaxed) && self.fail_layer == Some(layer)
    }
}

impl StageCompute for Failing {
    type DenseState = <ReferenceModel as StageCompute>::DenseState;
    type RouterState = <ReferenceModel as StageCompute>::RouterState;
    type ExpertState = <ReferenceModel as StageCompute>::ExpertState;
    type CombineState = <ReferenceModel as StageCompute>::CombineState;
    type HeadState = <ReferenceModel as StageCompute>::HeadState;
    fn hidden(&self) -> usize {
        self.inner.hidden()
    }
    fn seq(&self) -> usize {
        self.inner.seq()
    }
    fn layers(&self) -> usize {
        self.inner.layers()
    }
    fn experts(&self) -> usize {
        self.inner.experts()
    }
    fn top_k(&self) -> usize {
        self.inner.top_k()
    }
    fn embed_forward(&self, tokens: &[u32]) -> Result<Vec<f32>, PiperError> {
        self.inner.embed_forward(tokens)
    }
    fn embed_backward(&mut self, tokens: &[u32], d_x: &[f32]) -> Result<(), PiperError> {
        self.inner.embed_backward(tokens, d_x)
    }
    fn dense_forward(
        &self,
        layer: usize,
        x: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>, Self::DenseState), PiperError> {
        self.inner.dense_forward(layer, x)
    }
    fn dense_backward(
        &mut self,
        layer: usize,
        state: Self::DenseState,
        d_h: &[f32],
        d_u: &[f32],
    ) -> Result<Vec<f32>, PiperError> {
        self.inner.dense_backward(layer, state, d_h, d_u)
    }
    fn router_forward(
        &self,
        layer: usize,
        u: &[f32],
    ) -> Result<(Routing, Self::RouterState), PiperError> {
        self.inner.router_forward(layer, u)
    }
    fn router_backward(
        &mut self,
        layer: usize,
        state: Self::RouterState,
        d_gates: &[f32],
    ) -> Result<Vec<f32>, PiperError> {
        self.inner.router_backward(layer, state, d_gates)
    }
    fn expert_forward(
        &self,
        layer: usize,
        expert: usize,
        x: &[f32],
    ) -> Result<(Vec<f32>, Self::ExpertState), PiperError> {
        if self.in_forward && self.tripped(layer) {
            return Err(PiperError::Compute(format!(
                "injected failure of layer {layer} expert {expert}"
            )));
        }
        self.inner.expert_forward(layer, expert, x)
    }
    fn expert_backward(
        &mut self,
        layer: usize,
        expert: usize,
        state: Self::ExpertState,
        d_y: &[f32],
    ) -> Result<Vec<f32>, PiperError> {
        self.inner.expert_backward(layer, expert, state, d_y)
    }
    fn combine_forward(
        &self,
        h: &[f32],
        gates: &[f32],
        expert_out: &[f32],
    ) -> Result<(Vec<f32>, Self::CombineState), PiperError> {
        self.inner.combine_forward(h, gates, expert_out)
    }
    fn combine_backward(
        &self,
        state: Self::CombineState,
        d_out: &[f32],
    ) -> Result<halo_moe::CombineGrads, PiperError> {
        self.inner.combine_backward(state, d_out)
    }
    fn moe_input_backward(
        &self,
        d_router: &[f32],
        d_expert_in: &[f32],
    ) -> Result<Vec<f32>, PiperError> {
        self.inner.moe_input_backward(d_router, d_expert_in)
    }
    fn head_forward(
        &self,
        x: &[f32],
        targets: &[u32],
        normaliser: f32,
    ) -> Result<(f64, Self::HeadState), PiperError> {
        self.inner.head_forward(x, targets, normaliser)
    }
    fn head_backward(&mut self, state: Self::HeadState) -> Result<Vec<f32>, PiperError> {
        self.inner.head_backward(state)
    }
    fn grads_mut(&mut self, id: GroupId) -> Result<&mut [f32], PiperError> {
        self.inner.grads_mut(id)
    }
    fn params_and_grads(&mut self, id: GroupId) -> Result<(&mut [f32], &[f32]), PiperError> {
        if let GroupId::Expert { layer, expert } = id
            && self.tripped(layer)
        {
            if self.on_read == OnRead::Kill {
                eprintln!("killing this rank (SIGKILL) while it copies out block {layer}");
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            }
            return Err(PiperError::Compute(format!(
                "injected death reading expert {expert} of block {layer}"
            )));
        }
        self.inner.params_and_grads(id)
    }
    fn zero_grads(&mut self) {
        self.inner.zero_grads();
    }
}
