//! Parameters (and gradients, which have the same shape) grouped by what an executor owns.
//!
//! Each group is one contiguous `Vec<f32>`; [`ParamGroup::as_slice`] and
//! [`ParamGroup::as_mut_slice`] are its flat view for all-reduce or point-to-point, and the
//! named accessors (`wq()`, `w1()`, ...) are sub-slices of it in the documented order.

use std::fmt;

use crate::config::MoeConfig;
use crate::error::{MoeError, Result, check_len};
use crate::rng::SplitMix64;

/// Names one parameter group of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupId {
    /// Token and position embeddings (pipeline stage 0).
    Embed,
    /// Block `l`'s attention part: norm1, Wq, Wk, Wv, Wo, norm2 (replicated across an EP group).
    Dense(usize),
    /// Block `l`'s router matrix (replicated across an EP group).
    Router(usize),
    /// Expert `expert` of block `layer` (owned by one EP rank).
    Expert {
        /// Block index.
        layer: usize,
        /// Expert index within the block.
        expert: usize,
    },
    /// Final norm and output matrix (last pipeline stage).
    Head,
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupId::Embed => write!(f, "embed"),
            GroupId::Dense(l) => write!(f, "layer {l} dense"),
            GroupId::Router(l) => write!(f, "layer {l} router"),
            GroupId::Expert { layer, expert } => write!(f, "layer {layer} expert {expert}"),
            GroupId::Head => write!(f, "head"),
        }
    }
}

/// Flat access shared by every parameter group.
pub trait ParamGroup {
    /// The group's elements in its documented order.
    fn as_slice(&self) -> &[f32];
    /// Mutable flat view (the length cannot change).
    fn as_mut_slice(&mut self) -> &mut [f32];
    /// Number of elements.
    fn len(&self) -> usize {
        self.as_slice().len()
    }
    /// Whether the group has no elements (never true for a valid configuration).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Sets every element to zero (e.g. to clear gradients between steps).
    fn zero(&mut self) {
        self.as_mut_slice().fill(0.0);
    }
}

macro_rules! group_common {
    ($t:ty) => {
        impl ParamGroup for $t {
            fn as_slice(&self) -> &[f32] {
                &self.data
            }
            fn as_mut_slice(&mut self) -> &mut [f32] {
                &mut self.data
            }
        }
        impl $t {
            /// The group's flat data, consuming it (e.g. to send it when an expert migrates).
            pub fn into_vec(self) -> Vec<f32> {
                self.data
            }
        }
    };
}

/// Fills `out` uniformly with standard deviation `std` (uniform on `[-std*sqrt(3), std*sqrt(3))`).
fn fill_uniform(rng: &mut SplitMix64, out: &mut [f32], std: f32) {
    let a = std * 3f32.sqrt();
    for x in out {
        *x = rng.symmetric(a);
    }
}

/// The error for a group built for another configuration.
fn wrong_group(what: &'static str, cfg: &MoeConfig) -> MoeError {
    MoeError::Mismatch(format!(
        "`{what}` was built for another configuration than {cfg:?}"
    ))
}

/// Seed stream of a group: independent of every other group, so an executor that owns only
/// some groups initialises them to the same values as the single-rank reference.
fn group_rng(seed: u64, id: GroupId) -> SplitMix64 {
    let parts = match id {
        GroupId::Embed => [0, 0, 0],
        GroupId::Dense(l) => [1, l as u64, 0],
        GroupId::Router(l) => [2, l as u64, 0],
        GroupId::Expert { layer, expert } => [3, layer as u64, expert as u64],
        GroupId::Head => [4, 0, 0],
    };
    SplitMix64::derive(seed, &parts)
}

/// Embedding group: token table `vocab x hidden` (row = token id), then learned positions
/// `seq x hidden` (row = position in the sequence).
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedParams {
    vocab: usize,
    hidden: usize,
    data: Vec<f32>,
}
group_common!(EmbedParams);

impl EmbedParams {
    /// Checks that this group was built for `cfg` (named `what` in the error).
    pub fn check(&self, cfg: &MoeConfig, what: &'static str) -> Result<()> {
        if self.vocab == cfg.vocab
            && self.hidden == cfg.hidden
            && self.data.len() == cfg.embed_len()
        {
            Ok(())
        } else {
            Err(wrong_group(what, cfg))
        }
    }
    /// All zeros (a gradient buffer).
    pub fn zeros(cfg: &MoeConfig) -> Self {
        EmbedParams {
            vocab: cfg.vocab,
            hidden: cfg.hidden,
            data: vec![0.0; cfg.embed_len()],
        }
    }
    /// Initial values: token rows with standard deviation 1, positions 0.1.
    pub fn init(cfg: &MoeConfig, seed: u64) -> Self {
        let mut p = Self::zeros(cfg);
        let mut rng = group_rng(seed, GroupId::Embed);
        let split = p.vocab * p.hidden;
        let (tok, pos) = p.data.split_at_mut(split);
        fill_uniform(&mut rng, tok, 1.0);
        fill_uniform(&mut rng, pos, 0.1);
        p
    }
    /// From a flat vector of [`MoeConfig::embed_len`] elements.
    pub fn from_vec(cfg: &MoeConfig, data: Vec<f32>) -> Result<Self> {
        check_len("embed parameters", data.len(), cfg.embed_len())?;
        Ok(EmbedParams {
            vocab: cfg.vocab,
            hidden: cfg.hidden,
            data,
        })
    }
    /// Token table, `vocab x hidden`.
    pub fn tokens(&self) -> &[f32] {
        &self.data[..self.vocab * self.hidden]
    }
    /// Position table, `seq x hidden`.
    pub fn positions(&self) -> &[f32] {
        &self.data[self.vocab * self.hidden..]
    }
    pub(crate) fn split_mut(&mut self) -> (&mut [f32], &mut [f32]) {
        self.data.split_at_mut(self.vocab * self.hidden)
    }
}

/// One block's dense (attention) group: `norm1 (d)`, `Wq`, `Wk`, `Wv`, `Wo` (each `d x d`,
/// row-major, applied as `x * W`), `norm2 (d)`.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseParams {
    hidden: usize,
    data: Vec<f32>,
}
group_common!(DenseParams);

impl DenseParams {
    /// Checks that this group was built for `cfg` (named `what` in the error).
    pub fn check(&self, cfg: &MoeConfig, what: &'static str) -> Result<()> {
        if self.hidden == cfg.hidden && self.data.len() == cfg.dense_len() {
            Ok(())
        } else {
            Err(wrong_group(what, cfg))
        }
    }
    /// All zeros (a gradient buffer).
    pub fn zeros(cfg: &MoeConfig) -> Self {
        DenseParams {
            hidden: cfg.hidden,
            data: vec![0.0; cfg.dense_len()],
        }
    }
    /// Initial values of block `layer`: norm gains 1; Wq, Wk, Wv with standard deviation
    /// `1/sqrt(d)`; Wo with `1/sqrt(2 L d)` (residual branches scaled down with depth).
    pub fn init(cfg: &MoeConfig, seed: u64, layer: usize) -> Self {
        let mut p = Self::zeros(cfg);
        let mut rng = group_rng(seed, GroupId::Dense(layer));
        let d = cfg.hidden;
        let s = 1.0 / (d as f32).sqrt();
        let so = s / ((2 * cfg.layers) as f32).sqrt();
        let (n1, rest) = p.data.split_at_mut(d);
        n1.fill(1.0);
        let (qkv, rest) = rest.split_at_mut(3 * d * d);
        fill_uniform(&mut rng, qkv, s);
        let (wo, n2) = rest.split_at_mut(d * d);
        fill_uniform(&mut rng, wo, so);
        n2.fill(1.0);
        p
    }
    /// From a flat vector of [`MoeConfig::dense_len`] elements.
    pub fn from_vec(cfg: &MoeConfig, data: Vec<f32>) -> Result<Self> {
        check_len("dense parameters", data.len(), cfg.dense_len())?;
        Ok(DenseParams {
            hidden: cfg.hidden,
            data,
        })
    }
    fn range(&self, i: usize) -> std::ops::Range<usize> {
        // Offsets: norm1, wq, wk, wv, wo, norm2.
        let d = self.hidden;
        let dd = d * d;
        match i {
            0 => 0..d,
            1..=4 => d + (i - 1) * dd..d + i * dd,
            _ => d + 4 * dd..2 * d + 4 * dd,
        }
    }
    /// Gain of the pre-attention RMSNorm, `d`.
    pub fn norm1(&self) -> &[f32] {
        &self.data[self.range(0)]
    }
    /// Query projection, `d x d`.
    pub fn wq(&self) -> &[f32] {
        &self.data[self.range(1)]
    }
    /// Key projection, `d x d`.
    pub fn wk(&self) -> &[f32] {
        &self.data[self.range(2)]
    }
    /// Value projection, `d x d`.
    pub fn wv(&self) -> &[f32] {
        &self.data[self.range(3)]
    }
    /// Output projection, `d x d`.
    pub fn wo(&self) -> &[f32] {
        &self.data[self.range(4)]
    }
    /// Gain of the pre-MoE RMSNorm, `d`.
    pub fn norm2(&self) -> &[f32] {
        &self.data[self.range(5)]
    }
    /// Mutable views of (norm1, wq, wk, wv, wo, norm2).
    #[allow(clippy::type_complexity)]
    pub(crate) fn parts_mut(
        &mut self,
    ) -> (
        &mut [f32],
        &mut [f32],
        &mut [f32],
        &mut [f32],
        &mut [f32],
        &mut [f32],
    ) {
        let d = self.hidden;
        let dd = d * d;
        let (n1, r) = self.data.split_at_mut(d);
        let (wq, r) = r.split_at_mut(dd);
        let (wk, r) = r.split_at_mut(dd);
        let (wv, r) = r.split_at_mut(dd);
        let (wo, n2) = r.split_at_mut(dd);
        (n1, wq, wk, wv, wo, n2)
    }
}

/// One block's router: `d x E` (logits = `u * W`), no bias.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterParams {
    hidden: usize,
    experts: usize,
    data: Vec<f32>,
}
group_common!(RouterParams);

impl RouterParams {
    /// Checks that this group was built for `cfg` (named `what` in the error).
    pub fn check(&self, cfg: &MoeConfig, what: &'static str) -> Result<()> {
        if self.hidden == cfg.hidden
            && self.experts == cfg.experts
            && self.data.len() == cfg.router_len()
        {
            Ok(())
        } else {
            Err(wrong_group(what, cfg))
        }
    }
    /// All zeros (a gradient buffer).
    pub fn zeros(cfg: &MoeConfig) -> Self {
        RouterParams {
            hidden: cfg.hidden,
            experts: cfg.experts,
            data: vec![0.0; cfg.router_len()],
        }
    }
    /// Initial values of block `layer`: standard deviation `1/sqrt(d)`.
    pub fn init(cfg: &MoeConfig, seed: u64, layer: usize) -> Self {
        let mut p = Self::zeros(cfg);
        let mut rng = group_rng(seed, GroupId::Router(layer));
        fill_uniform(&mut rng, &mut p.data, 1.0 / (cfg.hidden as f32).sqrt());
        p
    }
    /// From a flat vector of [`MoeConfig::router_len`] elements.
    pub fn from_vec(cfg: &MoeConfig, data: Vec<f32>) -> Result<Self> {
        check_len("router parameters", data.len(), cfg.router_len())?;
        Ok(RouterParams {
            hidden: cfg.hidden,
            experts: cfg.experts,
            data,
        })
    }
    /// The router matrix, `d x E`.
    pub fn w(&self) -> &[f32] {
        &self.data
    }
}

/// One expert: `W1 (d x f)`, then for SwiGLU `W3 (d x f)`, then `W2 (f x d)`.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertParams {
    hidden: usize,
    ffn: usize,
    matrices: usize,
    data: Vec<f32>,
}
group_common!(ExpertParams);

impl ExpertParams {
    /// Checks that this group was built for `cfg` (named `what` in the error).
    pub fn check(&self, cfg: &MoeConfig, what: &'static str) -> Result<()> {
        if self.hidden == cfg.hidden
            && self.ffn == cfg.ffn
            && self.matrices == cfg.expert_matrices
            && self.data.len() == cfg.expert_len()
        {
            Ok(())
        } else {
            Err(wrong_group(what, cfg))
        }
    }
    /// All zeros (a gradient buffer).
    pub fn zeros(cfg: &MoeConfig) -> Self {
        ExpertParams {
            hidden: cfg.hidden,
            ffn: cfg.ffn,
            matrices: cfg.expert_matrices,
            data: vec![0.0; cfg.expert_len()],
        }
    }
    /// Initial values of expert `expert` of block `layer`: W1 (and W3) with standard deviation
    /// `1/sqrt(d)`, W2 with `1/sqrt(2 L f)`.
    pub fn init(cfg: &MoeConfig, seed: u64, layer: usize, expert: usize) -> Self {
        let mut p = Self::zeros(cfg);
        let mut rng = group_rng(seed, GroupId::Expert { layer, expert });
        let n_in = (p.matrices - 1) * p.hidden * p.ffn;
        let (win, w2) = p.data.split_at_mut(n_in);
        fill_uniform(&mut rng, win, 1.0 / (cfg.hidden as f32).sqrt());
        fill_uniform(
            &mut rng,
            w2,
            1.0 / ((2 * cfg.layers * cfg.ffn) as f32).sqrt(),
        );
        p
    }
    /// From a flat vector of [`MoeConfig::expert_len`] elements (e.g. a migrated expert).
    pub fn from_vec(cfg: &MoeConfig, data: Vec<f32>) -> Result<Self> {
        check_len("expert parameters", data.len(), cfg.expert_len())?;
        Ok(ExpertParams {
            hidden: cfg.hidden,
            ffn: cfg.ffn,
            matrices: cfg.expert_matrices,
            data,
        })
    }
    /// Input matrix W1, `d x f` (the gated branch for SwiGLU).
    pub fn w1(&self) -> &[f32] {
        &self.data[..self.hidden * self.ffn]
    }
    /// SwiGLU's linear branch W3, `d x f`; `None` for a 2-matrix expert.
    pub fn w3(&self) -> Option<&[f32]> {
        let df = self.hidden * self.ffn;
        (self.matrices == 3).then(|| &self.data[df..2 * df])
    }
    /// Output matrix W2, `f x d`.
    pub fn w2(&self) -> &[f32] {
        &self.data[(self.matrices - 1) * self.hidden * self.ffn..]
    }
    /// Mutable (W1, W3 or empty, W2).
    pub(crate) fn parts_mut(&mut self) -> (&mut [f32], &mut [f32], &mut [f32]) {
        let df = self.hidden * self.ffn;
        let (w1, r) = self.data.split_at_mut(df);
        let (w3, w2) = r.split_at_mut(if self.matrices == 3 { df } else { 0 });
        (w1, w3, w2)
    }
}

/// Head group: final RMSNorm gain `d`, then output matrix `d x V`.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadParams {
    hidden: usize,
    data: Vec<f32>,
}
group_common!(HeadParams);

impl HeadParams {
    /// Checks that this group was built for `cfg` (named `what` in the error).
    pub fn check(&self, cfg: &MoeConfig, what: &'static str) -> Result<()> {
        if self.hidden == cfg.hidden && self.data.len() == cfg.head_len() {
            Ok(())
        } else {
            Err(wrong_group(what, cfg))
        }
    }
    /// All zeros (a gradient buffer).
    pub fn zeros(cfg: &MoeConfig) -> Self {
        HeadParams {
            hidden: cfg.hidden,
            data: vec![0.0; cfg.head_len()],
        }
    }
    /// Initial values: norm gain 1, output matrix with standard deviation `0.5/sqrt(d)` (so
    /// the first loss is close to `ln V`).
    pub fn init(cfg: &MoeConfig, seed: u64) -> Self {
        let mut p = Self::zeros(cfg);
        let mut rng = group_rng(seed, GroupId::Head);
        let (n, w) = p.data.split_at_mut(cfg.hidden);
        n.fill(1.0);
        fill_uniform(&mut rng, w, 0.5 / (cfg.hidden as f32).sqrt());
        p
    }
    /// From a flat vector of [`MoeConfig::head_len`] elements.
    pub fn from_vec(cfg: &MoeConfig, data: Vec<f32>) -> Result<Self> {
        check_len("head parameters", data.len(), cfg.head_len())?;
        Ok(HeadParams {
            hidden: cfg.hidden,
            data,
        })
    }
    /// Final RMSNorm gain, `d`.
    pub fn norm(&self) -> &[f32] {
        &self.data[..self.hidden]
    }
    /// Output matrix, `d x V` (logits = `z * W`).
    pub fn w(&self) -> &[f32] {
        &self.data[self.hidden..]
    }
    pub(crate) fn split_mut(&mut self) -> (&mut [f32], &mut [f32]) {
        self.data.split_at_mut(self.hidden)
    }
}

/// The parameters of one block.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerParams {
    /// Attention part and both norms.
    pub dense: DenseParams,
    /// Router.
    pub router: RouterParams,
    /// The block's experts, indexed by expert id.
    pub experts: Vec<ExpertParams>,
}

/// All parameters of a model (or all gradients: the same type, see [`MoeGrads`]).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeParams {
    config: MoeConfig,
    /// Embedding.
    pub embed: EmbedParams,
    /// Blocks, in order.
    pub layers: Vec<LayerParams>,
    /// Final norm and output head.
    pub head: HeadParams,
}

/// Gradients have exactly the parameters' grouping and layout.
pub type MoeGrads = MoeParams;

impl MoeParams {
    /// Parameters initialised from `seed` (validates `cfg`). Each group draws from its own
    /// stream, so `EmbedParams::init(cfg, seed)` etc. reproduce any one group alone.
    pub fn init(cfg: &MoeConfig, seed: u64) -> Result<Self> {
        cfg.validate()?;
        Ok(MoeParams {
            config: cfg.clone(),
            embed: EmbedParams::init(cfg, seed),
            layers: (0..cfg.layers)
                .map(|l| LayerParams {
                    dense: DenseParams::init(cfg, seed, l),
                    router: RouterParams::init(cfg, seed, l),
                    experts: (0..cfg.experts)
                        .map(|e| ExpertParams::init(cfg, seed, l, e))
                        .collect(),
                })
                .collect(),
            head: HeadParams::init(cfg, seed),
        })
    }

    /// All zeros (a gradient accumulator; validates `cfg`).
    pub fn zeros(cfg: &MoeConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(MoeParams {
            config: cfg.clone(),
            embed: EmbedParams::zeros(cfg),
            layers: (0..cfg.layers)
                .map(|_| LayerParams {
                    dense: DenseParams::zeros(cfg),
                    router: RouterParams::zeros(cfg),
                    experts: (0..cfg.experts).map(|_| ExpertParams::zeros(cfg)).collect(),
                })
                .collect(),
            head: HeadParams::zeros(cfg),
        })
    }

    /// The configuration these parameters were built for.
    pub fn config(&self) -> &MoeConfig {
        &self.config
    }

    /// Every group id in a fixed order: embed, then per layer dense, router, experts 0..E,
    /// then head.
    pub fn group_ids(&self) -> Vec<GroupId> {
        let mut ids = vec![GroupId::Embed];
        for l in 0..self.layers.len() {
            ids.push(GroupId::Dense(l));
            ids.push(GroupId::Router(l));
            for e in 0..self.layers[l].experts.len() {
                ids.push(GroupId::Expert {
                    layer: l,
                    expert: e,
                });
            }
        }
        ids.push(GroupId::Head);
        ids
    }

    /// Flat view of one group.
    pub fn group(&self, id: GroupId) -> Result<&[f32]> {
        let none = || MoeError::NoSuchGroup(id.to_string());
        Ok(match id {
            GroupId::Embed => self.embed.as_slice(),
            GroupId::Head => self.head.as_slice(),
            GroupId::Dense(l) => self.layers.get(l).ok_or_else(none)?.dense.as_slice(),
            GroupId::Router(l) => self.layers.get(l).ok_or_else(none)?.router.as_slice(),
            GroupId::Expert { layer, expert } => self
                .layers
                .get(layer)
                .and_then(|lp| lp.experts.get(expert))
                .ok_or_else(none)?
                .as_slice(),
        })
    }

    /// Mutable flat view of one group.
    pub fn group_mut(&mut self, id: GroupId) -> Result<&mut [f32]> {
        let none = || MoeError::NoSuchGroup(id.to_string());
        Ok(match id {
            GroupId::Embed => self.embed.as_mut_slice(),
            GroupId::Head => self.head.as_mut_slice(),
            GroupId::Dense(l) => self
                .layers
                .get_mut(l)
                .ok_or_else(none)?
                .dense
                .as_mut_slice(),
            GroupId::Router(l) => self
                .layers
                .get_mut(l)
                .ok_or_else(none)?
                .router
                .as_mut_slice(),
            GroupId::Expert { layer, expert } => self
                .layers
                .get_mut(layer)
                .and_then(|lp| lp.experts.get_mut(expert))
                .ok_or_else(none)?
                .as_mut_slice(),
        })
    }

    /// Total number of elements.
    pub fn len(&self) -> usize {
        self.group_ids()
            .into_iter()
            .map(|id| self.group(id).map_or(0, <[f32]>::len))
            .sum()
    }

    /// Whether there are no elements (never true for a valid configuration).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sets every element to zero.
    pub fn zero(&mut self) {
        for id in self.group_ids() {
            if let Ok(g) = self.group_mut(id) {
                g.fill(0.0);
            }
        }
    }

    /// Adds `other` element-wise (e.g. summing gradients of parts of a batch).
    pub fn add_assign(&mut self, other: &MoeParams) -> Result<()> {
        self.check_same_shape(other)?;
        for id in self.group_ids() {
            let src = other.group(id)?;
            for (a, b) in self.group_mut(id)?.iter_mut().zip(src) {
                *a += b;
            }
        }
        Ok(())
    }

    /// Checks that every group has the length its configuration implies and that `other`
    /// has the same configuration.
    pub fn check_same_shape(&self, other: &MoeParams) -> Result<()> {
        self.check_shape()?;
        other.check_shape()?;
        if self.config != other.config {
            return Err(MoeError::Mismatch(format!(
                "configurations differ: {:?} vs {:?}",
                self.config, other.config
            )));
        }
        Ok(())
    }

    /// Checks that the structure (layer and expert counts, group lengths) matches the
    /// configuration; public fields can be replaced, so the whole-model functions call this.
    pub fn check_shape(&self) -> Result<()> {
        let c = &self.config;
        let mismatch = |what: String| Err(MoeError::Mismatch(what));
        if self.layers.len() != c.layers {
            return mismatch(format!(
                "{} layers, configuration has {}",
                self.layers.len(),
                c.layers
            ));
        }
        for (l, lp) in self.layers.iter().enumerate() {
            if lp.experts.len() != c.experts {
                return mismatch(format!(
                    "layer {l} has {} experts, configuration has {}",
                    lp.experts.len(),
                    c.experts
                ));
            }
        }
        for id in self.group_ids() {
            let want = match id {
                GroupId::Embed => c.embed_len(),
                GroupId::Dense(_) => c.dense_len(),
                GroupId::Router(_) => c.router_len(),
                GroupId::Expert { .. } => c.expert_len(),
                GroupId::Head => c.head_len(),
            };
            let got = self.group(id)?.len();
            if got != want {
                return mismatch(format!("group {id} has {got} elements, expected {want}"));
            }
        }
        Ok(())
    }
}
