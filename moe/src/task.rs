//! Synthetic task: class-conditioned random successor chains.
//!
//! A task seed fixes `classes` random successor tables `T[c]: token -> token`. A sequence
//! starts at a random token `x0`; its class is `c = x0 mod classes`, and every next token is
//! `x[t+1] = T[c][x[t]]`. Inputs are `x[0..seq]`, targets `x[1..=seq]`.
//!
//! Every target is determined by the input so far, so the loss can fall to zero. Learning
//! it has two layers: the bigram part (which successors a token can have: a lookup that
//! embedding, experts and head learn quickly, taking the loss from `ln V` to at most
//! `ln classes`) and the class part (which of those successors: attention must look back at
//! the sequence's first token). With the uniform default (`skew = 0`) the tables are
//! permutations and every token is equally frequent, so routing starts balanced; with
//! `skew > 0` the first tokens and the table entries are drawn from a Zipf distribution
//! with that exponent, so a few tokens (and the experts they route to) get most of the
//! traffic, for expert-migration experiments.
//!
//! Sequence `i` of step `n` is drawn from a stream derived from `(seed, n, i)` only, so a
//! step's batch depends on the seed, the step and the global batch size and never on how the
//! batch is split across ranks or micro-batches ([`Task::batch_part`] makes any slice of it).

use std::ops::Range;

use crate::config::MoeConfig;
use crate::error::{MoeError, Result};
use crate::rng::SplitMix64;

/// Task parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskConfig {
    /// Seed of the tables and of every batch.
    pub seed: u64,
    /// Number of successor tables (classes), at least 1.
    pub classes: usize,
    /// Zipf exponent of the token distribution; 0 = uniform (tables are permutations).
    pub skew: f64,
}

impl Default for TaskConfig {
    /// Seed 0, 4 classes, no skew.
    fn default() -> Self {
        TaskConfig {
            seed: 0,
            classes: 4,
            skew: 0.0,
        }
    }
}

/// Inputs and next-token targets of a batch of whole sequences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Number of sequences.
    pub sequences: usize,
    /// Input token ids, `sequences x seq`.
    pub tokens: Vec<u32>,
    /// Target token ids, `sequences x seq` (target `t` is input `t+1` of the same chain).
    pub targets: Vec<u32>,
}

/// A synthetic task instance for one model shape.
#[derive(Debug, Clone)]
pub struct Task {
    config: TaskConfig,
    vocab: usize,
    seq: usize,
    /// `classes x vocab` successor tables.
    tables: Vec<u32>,
    /// Cumulative distribution of the start token (empty when uniform).
    start_cdf: Vec<f64>,
}

/// Zipf weights over a random permutation of the tokens, as a cumulative distribution.
fn zipf_cdf(rng: &mut SplitMix64, vocab: usize, exponent: f64) -> Vec<f64> {
    let perm = permutation(rng, vocab);
    let mut w = vec![0.0; vocab];
    for (rank, &tok) in perm.iter().enumerate() {
        w[tok as usize] = 1.0 / ((rank + 1) as f64).powf(exponent);
    }
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    w.iter()
        .map(|x| {
            acc += x / total;
            acc
        })
        .collect()
}

fn sample_cdf(rng: &mut SplitMix64, cdf: &[f64]) -> u32 {
    let u = rng.next_f64();
    cdf.iter().position(|&c| u < c).unwrap_or(cdf.len() - 1) as u32
}

/// Fisher-Yates permutation of `0..n`.
fn permutation(rng: &mut SplitMix64, n: usize) -> Vec<u32> {
    let mut p: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u32 + 1) as usize;
        p.swap(i, j);
    }
    p
}

impl Task {
    /// Builds the tables for `model`'s vocabulary and sequence length.
    pub fn new(model: &MoeConfig, config: TaskConfig) -> Result<Self> {
        model.validate()?;
        if config.classes == 0 {
            return Err(MoeError::InvalidConfig {
                field: "classes",
                reason: "must be at least 1".into(),
            });
        }
        if !(config.skew.is_finite() && config.skew >= 0.0) {
            return Err(MoeError::InvalidConfig {
                field: "skew",
                reason: format!("is {}; must be >= 0", config.skew),
            });
        }
        let v = model.vocab;
        let mut rng = SplitMix64::derive(config.seed, &[u64::MAX]);
        let (tables, start_cdf) = if config.skew == 0.0 {
            let mut t = Vec::with_capacity(config.classes * v);
            for _ in 0..config.classes {
                t.extend(permutation(&mut rng, v));
            }
            (t, Vec::new())
        } else {
            let cdf = zipf_cdf(&mut rng, v, config.skew);
            let t = (0..config.classes * v)
                .map(|_| sample_cdf(&mut rng, &cdf))
                .collect();
            (t, cdf)
        };
        Ok(Task {
            config,
            vocab: v,
            seq: model.seq,
            tables,
            start_cdf,
        })
    }

    /// The task parameters.
    pub fn config(&self) -> &TaskConfig {
        &self.config
    }

    /// The whole batch of `step`: `global_batch` sequences.
    pub fn batch(&self, step: u64, global_batch: usize) -> Batch {
        self.batch_part(step, 0..global_batch)
    }

    /// Sequences `range` of step `step`'s batch (identical to that slice of
    /// [`Task::batch`] for any global batch that contains them).
    pub fn batch_part(&self, step: u64, range: Range<usize>) -> Batch {
        let n = range.len();
        let mut tokens = Vec::with_capacity(n * self.seq);
        let mut targets = Vec::with_capacity(n * self.seq);
        for i in range {
            let mut rng = SplitMix64::derive(self.config.seed, &[step, i as u64]);
            let mut x = if self.start_cdf.is_empty() {
                rng.below(self.vocab as u32)
            } else {
                sample_cdf(&mut rng, &self.start_cdf)
            };
            let class = x as usize % self.config.classes;
            let table = &self.tables[class * self.vocab..(class + 1) * self.vocab];
            for _ in 0..self.seq {
                tokens.push(x);
                x = table[x as usize];
                targets.push(x);
            }
        }
        Batch {
            sequences: n,
            tokens,
            targets,
        }
    }
}
