//! Adam with bias correction and optional decoupled weight decay, state per parameter group.
//!
//! # Memory per parameter
//!
//! This implementation holds, per parameter, the f32 weight (4 bytes), the f32 gradient (4),
//! and Adam's f32 first and second moments `m` and `v` (4 + 4): **16 bytes**. The resource
//! model's 16 bytes per parameter are made differently (mixed precision: fp16 weight 2 +
//! fp16 gradient 2 + fp32 master weight 4 + fp32 `m` 4 + fp32 `v` 4), but the total is the
//! same, so the model's memory figures for weights, gradients and optimizer state apply to
//! this reference as they are.

use std::collections::BTreeMap;

use crate::error::{MoeError, Result, check_len};
use crate::params::{GroupId, MoeGrads, MoeParams};

/// Adam hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamConfig {
    /// Learning rate.
    pub lr: f32,
    /// Decay of the first moment.
    pub beta1: f32,
    /// Decay of the second moment.
    pub beta2: f32,
    /// Added to `sqrt(v_hat)` in the denominator.
    pub eps: f32,
    /// Decoupled weight decay (AdamW): `w -= lr * weight_decay * w` each step; 0 for plain Adam.
    pub weight_decay: f32,
}

impl Default for AdamConfig {
    /// `lr = 1e-3`, `beta1 = 0.9`, `beta2 = 0.999`, `eps = 1e-8`, no weight decay.
    fn default() -> Self {
        AdamConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

impl AdamConfig {
    /// Checks every field; the error names the first field that is wrong.
    pub fn validate(&self) -> Result<()> {
        let bad =
            |field: &'static str, reason: String| Err(MoeError::InvalidConfig { field, reason });
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("lr", format!("is {}; must be > 0", self.lr));
        }
        if !(0.0..1.0).contains(&self.beta1) {
            return bad("beta1", format!("is {}; must be in [0, 1)", self.beta1));
        }
        if !(0.0..1.0).contains(&self.beta2) {
            return bad("beta2", format!("is {}; must be in [0, 1)", self.beta2));
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad("eps", format!("is {}; must be > 0", self.eps));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(
                "weight_decay",
                format!("is {}; must be >= 0", self.weight_decay),
            );
        }
        Ok(())
    }
}

/// Adam's state for one parameter group: it moves with the group (e.g. when an expert
/// migrates to another rank, send `m`, `v` and `step` with its weights).
#[derive(Debug, Clone, PartialEq)]
pub struct AdamState {
    /// First moment, one per element.
    pub m: Vec<f32>,
    /// Second moment, one per element.
    pub v: Vec<f32>,
    /// Updates applied so far (for the bias correction).
    pub step: u64,
}

impl AdamState {
    /// Fresh state for a group of `len` elements.
    pub fn new(len: usize) -> Self {
        AdamState {
            m: vec![0.0; len],
            v: vec![0.0; len],
            step: 0,
        }
    }
}

/// Adam over parameter groups; holds state only for the groups it has stepped (or was given),
/// so an executor rank keeps state only for the groups it owns.
#[derive(Debug, Clone)]
pub struct Adam {
    config: AdamConfig,
    states: BTreeMap<GroupId, AdamState>,
}

impl Adam {
    /// An optimizer with no state yet.
    pub fn new(config: AdamConfig) -> Result<Self> {
        config.validate()?;
        Ok(Adam {
            config,
            states: BTreeMap::new(),
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamConfig {
        &self.config
    }

    /// One update of group `id`: creates its state on first use.
    ///
    /// `m = b1 m + (1-b1) g`, `v = b2 v + (1-b2) g^2`, `w -= lr * (m / (1-b1^t)) /
    /// (sqrt(v / (1-b2^t)) + eps) + lr * weight_decay * w`.
    pub fn step_group(&mut self, id: GroupId, params: &mut [f32], grads: &[f32]) -> Result<()> {
        check_len("gradients", grads.len(), params.len())?;
        let st = self
            .states
            .entry(id)
            .or_insert_with(|| AdamState::new(params.len()));
        if st.m.len() != params.len() || st.v.len() != params.len() {
            return Err(MoeError::OptimizerState {
                group: id.to_string(),
                reason: "state length differs from the group's length",
            });
        }
        st.step += 1;
        let c = &self.config;
        let t = i32::try_from(st.step).unwrap_or(i32::MAX);
        let bc1 = (1.0 - f64::from(c.beta1).powi(t)) as f32;
        let bc2 = (1.0 - f64::from(c.beta2).powi(t)) as f32;
        for i in 0..params.len() {
            let g = grads[i];
            st.m[i] = c.beta1 * st.m[i] + (1.0 - c.beta1) * g;
            st.v[i] = c.beta2 * st.v[i] + (1.0 - c.beta2) * g * g;
            let mhat = st.m[i] / bc1;
            let vhat = st.v[i] / bc2;
            let w = params[i];
            params[i] = w - c.lr * (mhat / (vhat.sqrt() + c.eps)) - c.lr * c.weight_decay * w;
        }
        Ok(())
    }

    /// One update of every group of `params` with the matching group of `grads`.
    pub fn step(&mut self, params: &mut MoeParams, grads: &MoeGrads) -> Result<()> {
        params.check_same_shape(grads)?;
        for id in params.group_ids() {
            let g = grads.group(id)?;
            self.step_group(id, params.group_mut(id)?, g)?;
        }
        Ok(())
    }

    /// The state of a group, if any.
    pub fn state(&self, id: GroupId) -> Option<&AdamState> {
        self.states.get(&id)
    }

    /// Removes and returns a group's state (e.g. to send it with a migrating expert).
    pub fn take_state(&mut self, id: GroupId) -> Option<AdamState> {
        self.states.remove(&id)
    }

    /// Installs a group's state (e.g. one received with a migrated expert); an error if the
    /// group already has one or `m` and `v` differ in length.
    pub fn insert_state(&mut self, id: GroupId, state: AdamState) -> Result<()> {
        if state.m.len() != state.v.len() {
            return Err(MoeError::OptimizerState {
                group: id.to_string(),
                reason: "m and v differ in length",
            });
        }
        if self.states.contains_key(&id) {
            return Err(MoeError::OptimizerState {
                group: id.to_string(),
                reason: "already present",
            });
        }
        self.states.insert(id, state);
        Ok(())
    }

    /// Groups with state, in order.
    pub fn groups(&self) -> Vec<GroupId> {
        self.states.keys().copied().collect()
    }
}
