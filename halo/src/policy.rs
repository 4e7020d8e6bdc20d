//! The one home of a communicator's algorithm choice: [`Policy`] owns the forced
//! algorithms ([`crate::Communicator::set_algorithm`] and its all-gather, all-reduce and
//! broadcast siblings), the measured tuner ([`crate::tune`]), the cost model's ranking
//! per size class ([`crate::select`]) with the model's pick, and the schedules the
//! uniform all-to-all runs. Each collective asks it once per call ([`Policy::choose`]
//! for the all-to-all family, [`Policy::all_gather`], [`Policy::all_reduce`],
//! [`Policy::broadcast`] for the others), and a forced algorithm is looked at in one
//! place only ([`Policy::forced_for`]), as NCCL picks in one place (`topoGetAlgoInfo`)
//! over the tables it built once.
//!
//! # What is cached, where
//!
//! - **Choices**, per communicator, in the policy: per size class of the block
//!   ([`crate::select::size_class`]) the model's ranking (an [`Arc`] of the process-wide
//!   ranking below, so a decided class costs no fingerprint and no lock) together with
//!   the model's pick, the first of the ranking that builds; the algorithms found not
//!   to build; and the tuner's state per (kind of call, size class) ([`crate::tune`]:
//!   trials, then the agreed choice).
//! - **Rankings**, per process, in [`crate::select`]: keyed by the topology's
//!   fingerprint, the builder options and the size class, shared by every communicator
//!   of the same shape (sub-communicators, repeated runs). They cannot live in one
//!   communicator's policy because other communicators reuse them.
//! - **Schedules** of the chosen algorithms, in the policy, one list most recently
//!   used first ([`Built`]): the uniform all-to-all's last [`CACHED_SCHEDULES`]
//!   (algorithm x block size; the model's pick builds its schedule here, and the
//!   all-to-all-v data pass reads the metadata pass's from here), the last all-gather's
//!   and the last rooted collective's. Not here: the all-to-all-v data pass's schedule
//!   (built every call, its sizes change), its count exchange's gather (kept with the
//!   count-exchange state), point-to-point's one-step schedules and the device path's
//!   wave plan (not a schedule).
//!
//! Changing the builder options ([`Policy::reset`]) forgets every choice and uniform
//! schedule of the communicator (the forced algorithms stay).

use crate::error::{Error, Result};
use crate::select::{Ranking, fingerprint, ranking_with, size_class};
use crate::tune::{Key, Tuned, Tuner};
use halo_collectives::{
    AlgoOptions, Algorithm, AllGatherAlgorithm, AllReduceAlgorithm, BroadcastAlgorithm, BuildCtx,
    CollectiveError, Layout, Schedule, UniformSizes, build,
};
use halo_topology::Topology;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Uniform schedules kept per communicator (algorithm x block size).
pub(crate) const CACHED_SCHEDULES: usize = 6;

/// Which rooted collective a cached schedule is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rooted {
    Broadcast(BroadcastAlgorithm),
    Gather,
    Scatter,
}

/// What a cached schedule is for: its kind of call and what its program depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Built {
    /// A uniform all-to-all: the algorithm and the bytes per pair ([`CACHED_SCHEDULES`]
    /// of them kept).
    Uniform(Algorithm, usize),
    /// An all-gather: the algorithm and the bytes per rank (the last one kept).
    AllGather(AllGatherAlgorithm, usize),
    /// A rooted collective (broadcast, gather, scatter): which, the root and the bytes
    /// (the last one of the three kept).
    Rooted(Rooted, usize, usize),
}

impl Built {
    /// How many schedules of this kind the cache keeps.
    fn room(self) -> usize {
        match self {
            Built::Uniform(..) => CACHED_SCHEDULES,
            Built::AllGather(..) | Built::Rooted(..) => 1,
        }
    }

    fn same_kind(self, other: Built) -> bool {
        std::mem::discriminant(&self) == std::mem::discriminant(&other)
    }
}

/// What a choice is for: the call and its size. The same on every rank for the same
/// call, so every rank chooses alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// A uniform all-to-all of `block` bytes per pair: forced, else measured per size
    /// class, else (nothing to measure) the model's pick.
    AllToAll {
        /// Bytes per pair.
        block: usize,
    },
    /// An all-to-all-v data pass whose mean block is `mean` bytes: forced, else
    /// measured per size class of the mean block. `meta` is the algorithm of the
    /// uniform metadata pass the counts went through (only it may forward), `None`
    /// after an all-gather of the counts.
    AllToAllV {
        /// The mean block over all pairs, in bytes.
        mean: usize,
        /// The metadata pass's algorithm, if the counts went through one.
        meta: Option<Algorithm>,
    },
    /// The uniform metadata and agreement passes of all-to-all-v's three passes: the
    /// forced algorithm if it forwards (the data pass may then use it), else the
    /// model's pick for [`halo_collectives::META_BLOCK`].
    Meta,
    /// How all-to-all-v's count messages of `bytes` per block go when no remainder is
    /// expected: forced, the caller's direct exchange; else the two hops (as
    /// [`Algorithm::Halo`], nothing built) where `hops` says they apply, else the
    /// model's pick for `bytes`.
    CountRoute {
        /// Bytes of each count message.
        bytes: usize,
        /// Whether the two hops apply on this topology.
        hops: bool,
    },
    /// The device path's wave plan of `block` bytes per pair (the mean block for
    /// all-to-all-v): forced, else the model's pick.
    Waves {
        /// Bytes per pair.
        block: usize,
    },
}

/// What [`Policy::choose`] decided for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Choice {
    /// The algorithm to run.
    pub(crate) algorithm: Algorithm,
    /// The caller forced it.
    pub(crate) forced: bool,
    /// The tuner's key when measured (for [`Policy::unusable`]).
    pub(crate) key: Option<Key>,
    /// This call is one of the key's trials: time it and pass the time to
    /// [`Policy::record`].
    pub(crate) trial: bool,
}

impl Choice {
    fn forced(algorithm: Algorithm) -> Self {
        Choice {
            algorithm,
            forced: true,
            key: None,
            trial: false,
        }
    }

    fn model(algorithm: Algorithm) -> Self {
        Choice {
            algorithm,
            forced: false,
            key: None,
            trial: false,
        }
    }
}

/// What the builders need of the communicator.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'a> {
    /// The communicator's topology.
    pub(crate) topology: &'a Topology,
    /// The builder options.
    pub(crate) options: &'a AlgoOptions,
    /// This rank.
    pub(crate) rank: usize,
}

/// The algorithms the caller forced, per collective (`None`: automatic). Read by the
/// policy's decisions below; elsewhere only to report or pass them on.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Forced {
    /// The all-to-all family's ([`crate::Communicator::set_algorithm`]).
    pub(crate) all_to_all: Option<Algorithm>,
    /// All-gather's ([`crate::Communicator::set_all_gather_algorithm`]).
    pub(crate) all_gather: Option<AllGatherAlgorithm>,
    /// All-reduce's ([`crate::Communicator::set_all_reduce_algorithm`]).
    pub(crate) all_reduce: Option<AllReduceAlgorithm>,
    /// Broadcast's ([`crate::Communicator::set_broadcast_algorithm`]).
    pub(crate) broadcast: Option<BroadcastAlgorithm>,
}

/// One size class's model state: the ranking and the model's pick, once made.
#[derive(Debug)]
struct Class {
    ranking: Arc<Ranking>,
    pick: Option<Algorithm>,
}

/// The model's side of the choice: the topology's fingerprint, per size class the
/// ranking and pick, and the algorithms found not to build.
#[derive(Debug, Default)]
struct Model {
    fingerprint: Option<Arc<[u64]>>,
    classes: HashMap<u32, Class>,
    unavailable: Vec<Algorithm>,
}

impl Model {
    /// The class entry of `block`, its ranking fetched from the process-wide cache
    /// ([`crate::select::ranking`]) the first time.
    fn class(&mut self, ctx: &Ctx<'_>, block: usize) -> &mut Class {
        let fp = self
            .fingerprint
            .get_or_insert_with(|| fingerprint(ctx.topology))
            .clone();
        self.classes
            .entry(size_class(block))
            .or_insert_with(|| Class {
                ranking: ranking_with(fp, ctx.topology, block, ctx.options),
                pick: None,
            })
    }

    /// Algorithms to try for `block` bytes per pair, cheapest first, skipping those
    /// known not to build. The same on every rank.
    fn ranked(&mut self, ctx: &Ctx<'_>, block: usize) -> Vec<Algorithm> {
        let ranking = Arc::clone(&self.class(ctx, block).ranking);
        ranking
            .order()
            .filter(|a| !self.unavailable.contains(a))
            .collect()
    }

    /// Records that `algorithm` does not build (an internal error from its builder).
    fn mark_unavailable(&mut self, algorithm: Algorithm, why: &CollectiveError) {
        if !self.unavailable.contains(&algorithm) {
            tracing::info!(%algorithm, %why, "algorithm does not build; automatic selection skips it");
            self.unavailable.push(algorithm);
        }
    }
}

/// A communicator's algorithm policy (see the [module documentation](self)).
#[derive(Debug, Default)]
pub(crate) struct Policy {
    forced: Forced,
    model: Model,
    /// Measured selection, per kind of call and size class.
    tuner: Tuner,
    /// The schedules of the chosen algorithms, most recently used first.
    schedules: Vec<(Built, Schedule)>,
}

impl Policy {
    /// The algorithms the caller forced.
    pub(crate) fn forced(&self) -> &Forced {
        &self.forced
    }

    /// The algorithms the caller forced, to force one (`None`: automatic).
    pub(crate) fn forced_mut(&mut self) -> &mut Forced {
        &mut self.forced
    }

    /// What a communicator split from this one starts with: the forced all-to-all,
    /// all-gather and all-reduce algorithms (not the broadcast's, as before), no
    /// choices and no schedules.
    pub(crate) fn inherit(&mut self, parent: &Policy) {
        // Every collective's, broadcast's included (a split child used to lose it).
        self.forced = parent.forced;
    }

    /// The all-gather algorithm for `block` bytes per rank on `n` ranks: the forced one
    /// where it supports `n`, else [`AllGatherAlgorithm::auto`].
    pub(crate) fn all_gather(&self, n: usize, block: usize) -> AllGatherAlgorithm {
        match self.forced.all_gather {
            Some(a) if a.supports(n) => a,
            _ => AllGatherAlgorithm::auto(n, block),
        }
    }

    /// The all-reduce algorithm for `len` elements of `bytes` in all on `n` ranks: the
    /// forced one, else [`AllReduceAlgorithm::auto`].
    pub(crate) fn all_reduce(&self, n: usize, len: usize, bytes: usize) -> AllReduceAlgorithm {
        self.forced
            .all_reduce
            .unwrap_or_else(|| AllReduceAlgorithm::auto(n, len, bytes))
    }

    /// The broadcast algorithm for `len` bytes on `n` ranks: the forced one, else
    /// [`BroadcastAlgorithm::auto`].
    pub(crate) fn broadcast(&self, n: usize, len: usize) -> BroadcastAlgorithm {
        self.forced
            .broadcast
            .unwrap_or_else(|| BroadcastAlgorithm::auto(n, len))
    }

    /// The forced all-to-all algorithm where it applies to `ask`: every ask but the
    /// metadata pass takes it as it is; the metadata pass only one that forwards.
    fn forced_for(&self, ask: Ask) -> Option<Algorithm> {
        let forced = self.forced.all_to_all?;
        match ask {
            Ask::Meta => forced.forwards().then_some(forced),
            Ask::AllToAll { .. }
            | Ask::AllToAllV { .. }
            | Ask::CountRoute { .. }
            | Ask::Waves { .. } => Some(forced),
        }
    }

    /// The one decision of the all-to-all family (see [`Ask`] for what each asks).
    /// Only the model's pick builds (its uniform schedule, kept in the cache); a
    /// forced or measured algorithm is built by the caller.
    ///
    /// # Errors
    /// [`Error::InternalError`] when nothing builds on the topology.
    pub(crate) fn choose(&mut self, ctx: &Ctx<'_>, ask: Ask) -> Result<Choice> {
        if let Some(a) = self.forced_for(ask) {
            return Ok(Choice::forced(a));
        }
        match ask {
            Ask::AllToAll { block } => {
                let key = Key::Uniform(size_class(block));
                match self.measured(ctx, key, block, |_| true) {
                    Some(c) => Ok(c),
                    None => self.model_pick(ctx, block).map(Choice::model),
                }
            }
            Ask::AllToAllV { mean, meta } => {
                let key = Key::V {
                    class: size_class(mean),
                    meta,
                };
                // After a uniform metadata pass only its algorithm knows the sizes of
                // the blocks it forwards.
                let keep = |alg: Algorithm| match meta {
                    Some(meta_alg) => !alg.forwards() || alg == meta_alg,
                    None => true,
                };
                self.measured(ctx, key, mean, keep).ok_or_else(|| {
                    Error::internal("no all-to-all-v algorithm builds on this topology")
                })
            }
            Ask::Meta => self
                .model_pick(ctx, halo_collectives::META_BLOCK)
                .map(Choice::model),
            Ask::CountRoute { hops: true, .. } => Ok(Choice::model(Algorithm::Halo)),
            Ask::CountRoute { bytes, hops: false } => {
                self.model_pick(ctx, bytes).map(Choice::model)
            }
            Ask::Waves { block } => self.model_pick(ctx, block).map(Choice::model),
        }
    }

    /// The tuner's pick for `key` (`None`: no candidate), its candidates the model's
    /// ranking for `block` that `keep` accepts ([`crate::tune::candidates`]).
    fn measured(
        &mut self,
        ctx: &Ctx<'_>,
        key: Key,
        block: usize,
        keep: impl Fn(Algorithm) -> bool,
    ) -> Option<Choice> {
        let model = &mut self.model;
        let (algorithm, trial) = self.tuner.pick(key, || {
            let ranked = model.ranked(ctx, block);
            crate::tune::candidates(ranked, ctx.topology, ctx.options, block, keep, |a, e| {
                model.mark_unavailable(a, e)
            })
        })?;
        Some(Choice {
            algorithm,
            forced: false,
            key: Some(key),
            trial,
        })
    }

    /// The model's pick for a uniform all-to-all of `block` bytes: the first algorithm
    /// of the class's ranking that builds, remembered per size class; its schedule is
    /// then at the front of the cache.
    fn model_pick(&mut self, ctx: &Ctx<'_>, block: usize) -> Result<Algorithm> {
        if let Some(a) = self.model.class(ctx, block).pick {
            self.cached(ctx, a, block)?;
            return Ok(a);
        }
        for a in self.model.ranked(ctx, block) {
            match self.cached(ctx, a, block) {
                Ok(()) => {
                    tracing::debug!(rank = ctx.rank, block, algorithm = %a, "selected for all-to-all");
                    self.model.class(ctx, block).pick = Some(a);
                    return Ok(a);
                }
                Err(e) => self.model.mark_unavailable(a, &e),
            }
        }
        Err(Error::internal(
            "no all-to-all algorithm builds on this topology",
        ))
    }

    /// Records that a trial call with `algorithm` took `elapsed` on this rank; this
    /// rank's times per candidate once the key's trials are complete, to be
    /// all-reduced (maximum) and passed to [`Policy::agree`] ([`crate::tune`]).
    pub(crate) fn record(
        &mut self,
        key: Key,
        algorithm: Algorithm,
        elapsed: Duration,
    ) -> Option<Vec<u64>> {
        self.tuner.record(key, algorithm, elapsed)
    }

    /// Decides `key` from the times all-reduced after its trials.
    pub(crate) fn agree(&mut self, key: Key, times: &[u64]) -> Option<Algorithm> {
        self.tuner.agree(key, times)
    }

    /// A chosen algorithm did not build for the call's actual sizes: it is skipped
    /// from now on, and the measured key (if any) chooses again from fresh candidates.
    pub(crate) fn unusable(&mut self, choice: &Choice, why: &CollectiveError) {
        self.model.mark_unavailable(choice.algorithm, why);
        if let Some(key) = choice.key {
            self.tuner.forget(key);
        }
    }

    /// What was measured and decided for uniform all-to-alls of `block` bytes.
    pub(crate) fn tuned(&self, block: usize) -> Option<Tuned> {
        self.tuner.tuned(Key::Uniform(size_class(block)))
    }

    /// What was measured and decided for all-to-all-v data passes of mean block
    /// `mean` bytes, whatever the count exchange.
    pub(crate) fn tuned_v(&self, mean: usize) -> Option<Tuned> {
        self.tuner.tuned_v(size_class(mean))
    }

    /// The uniform schedule of `algorithm` for `block` bytes, built if not cached, and
    /// now the most recently used.
    pub(crate) fn schedule(
        &mut self,
        ctx: &Ctx<'_>,
        algorithm: Algorithm,
        block: usize,
    ) -> halo_collectives::Result<&Schedule> {
        self.cached(ctx, algorithm, block)?;
        Ok(&self.schedules[0].1)
    }

    /// The cached uniform schedule of `algorithm` for `block` bytes, if any; never
    /// builds.
    pub(crate) fn cached_schedule(&self, algorithm: Algorithm, block: usize) -> Option<&Schedule> {
        let key = Built::Uniform(algorithm, block);
        self.schedules
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, s)| s)
    }

    /// The schedule for `key`, built with `build` if not cached (then kept, in place of
    /// the least recently used one of its kind when the kind has no room left), and now
    /// the most recently used.
    pub(crate) fn built(
        &mut self,
        key: Built,
        build: impl FnOnce() -> halo_collectives::Result<Schedule>,
    ) -> halo_collectives::Result<&Schedule> {
        if let Some(i) = self.schedules.iter().position(|(k, _)| *k == key) {
            let entry = self.schedules.remove(i);
            self.schedules.insert(0, entry);
        } else {
            let s = build()?;
            let kind: Vec<usize> = (0..self.schedules.len())
                .filter(|&i| self.schedules[i].0.same_kind(key))
                .collect();
            if kind.len() >= key.room() {
                self.schedules.remove(kind[key.room() - 1]);
            }
            self.schedules.insert(0, (key, s));
        }
        Ok(&self.schedules[0].1)
    }

    /// Puts the uniform schedule of `algorithm` for `block` at the front of the cache.
    fn cached(
        &mut self,
        ctx: &Ctx<'_>,
        algorithm: Algorithm,
        block: usize,
    ) -> halo_collectives::Result<()> {
        self.built(Built::Uniform(algorithm, block), || {
            let sizes = UniformSizes(block);
            build(
                algorithm,
                &BuildCtx {
                    topology: ctx.topology,
                    rank: ctx.rank,
                    layout: Layout::Uniform { block },
                    sizes: &sizes,
                    options: ctx.options,
                },
            )
        })?;
        Ok(())
    }

    /// Forgets every choice and every schedule the builder options shape (they
    /// changed): the uniform ones; the forced algorithms stay, and so do the
    /// all-gather's and rooted schedules (their builders take no options).
    pub(crate) fn reset(&mut self) {
        self.model.classes.clear();
        self.model.unavailable.clear();
        self.tuner.reset();
        self.schedules
            .retain(|(k, _)| !matches!(k, Built::Uniform(..)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any_schedule() -> halo_collectives::Result<Schedule> {
        halo_collectives::build_all_gather(AllGatherAlgorithm::Ring, 0, 2, 8)
    }

    fn kinds(p: &Policy) -> (usize, usize, usize) {
        let count = |f: fn(&Built) -> bool| p.schedules.iter().filter(|(k, _)| f(k)).count();
        (
            count(|k| matches!(k, Built::Uniform(..))),
            count(|k| matches!(k, Built::AllGather(..))),
            count(|k| matches!(k, Built::Rooted(..))),
        )
    }

    #[test]
    fn each_kind_of_schedule_keeps_its_room_and_options_forget_the_uniform_ones() {
        let mut p = Policy::default();
        for block in 0..=CACHED_SCHEDULES {
            p.built(Built::Uniform(Algorithm::Flat, block), any_schedule)
                .unwrap();
        }
        p.built(Built::AllGather(AllGatherAlgorithm::Ring, 8), any_schedule)
            .unwrap();
        p.built(Built::Rooted(Rooted::Gather, 0, 8), any_schedule)
            .unwrap();
        assert_eq!(kinds(&p), (CACHED_SCHEDULES, 1, 1));
        // The least recently used uniform schedule (block 0) went; block 1 is kept.
        assert!(p.cached_schedule(Algorithm::Flat, 0).is_none());
        assert!(p.cached_schedule(Algorithm::Flat, 1).is_some());
        // A hit builds nothing and moves to the front.
        p.built(Built::Uniform(Algorithm::Flat, 1), || unreachable!())
            .unwrap();
        assert_eq!(p.schedules[0].0, Built::Uniform(Algorithm::Flat, 1));
        p.built(Built::AllGather(AllGatherAlgorithm::Bruck, 8), any_schedule)
            .unwrap();
        p.built(Built::Rooted(Rooted::Scatter, 1, 8), any_schedule)
            .unwrap();
        assert_eq!(kinds(&p), (CACHED_SCHEDULES, 1, 1));
        p.reset();
        assert_eq!(kinds(&p), (0, 1, 1));
    }

    #[test]
    fn forced_is_looked_at_in_one_place() {
        let mut p = Policy::default();
        p.forced_mut().all_to_all = Some(Algorithm::Bruck);
        assert_eq!(
            p.forced_for(Ask::AllToAll { block: 8 }),
            Some(Algorithm::Bruck)
        );
        assert_eq!(p.forced_for(Ask::Meta), Some(Algorithm::Bruck));
        // The metadata pass takes a forced algorithm only where it forwards.
        p.forced_mut().all_to_all = Some(Algorithm::Pairwise);
        assert_eq!(p.forced_for(Ask::Meta), None);
        assert_eq!(
            p.forced_for(Ask::CountRoute {
                bytes: 8,
                hops: true
            }),
            Some(Algorithm::Pairwise)
        );
        p.forced_mut().all_to_all = Some(Algorithm::Halo);
        let mut child = Policy::default();
        p.forced_mut().broadcast = Some(BroadcastAlgorithm::auto(4, 8));
        child.inherit(&p);
        assert_eq!(child.forced().all_to_all, Some(Algorithm::Halo));
        // Every collective's forced algorithm, broadcast's included.
        assert_eq!(
            child.forced().broadcast,
            Some(BroadcastAlgorithm::auto(4, 8))
        );
    }
}
