//! Which way a communicator exchanges its all-to-all-v counts ([`MetaPlan`]: chosen
//! once, by the cost model unless forced), and how one call's count messages go
//! ([`CountRoute`]: direct, in two hops across hosts, or as a uniform all-to-all).

use super::MetaPlan;
use super::gathered::gather_schedule;
use super::knobs::{GATHER_MAX_RANKS, gather_max_env};
use crate::comm::{Communicator, Core};
use crate::error::Result;
use crate::policy::Ask;
use halo_collectives::{Algorithm, AllGatherAlgorithm, META_BLOCK, SimOptions, simulate};

/// The model's plan for `core`'s communicator: the cheapest all-gather of the rows
/// when it is no slower than two uniform passes of [`META_BLOCK`] bytes with the
/// automatic algorithm (both simulated), otherwise [`MetaPlan::Agreed`]; with
/// `max_ranks` (the environment's override) the size alone decides.
pub(super) fn model_plan(core: &Core, max_ranks: Option<usize>) -> MetaPlan {
    let n = core.size;
    if n > max_ranks.unwrap_or(GATHER_MAX_RANKS) {
        return MetaPlan::Agreed;
    }
    if n <= 2 {
        return MetaPlan::Direct; // one message each way, whichever algorithm
    }
    let row = n * META_BLOCK;
    let sim = SimOptions {
        algo: core.options.clone(),
        ..SimOptions::default()
    };
    let time = |plan: MetaPlan| -> Option<f64> {
        let all = (0..n)
            .map(|r| gather_schedule(core, plan, r, row))
            .collect::<halo_collectives::Result<Vec<_>>>()
            .ok()?;
        simulate(&core.topology, &all, &sim).ok().map(|r| r.time)
    };
    let mut plans = vec![
        MetaPlan::Direct,
        MetaPlan::Gather(AllGatherAlgorithm::Bruck),
    ];
    if n.is_power_of_two() {
        plans.push(MetaPlan::Gather(AllGatherAlgorithm::RecursiveDoubling));
    }
    // Ties go to the earlier plan: the direct exchange first.
    let best = plans
        .into_iter()
        .filter_map(|p| time(p).map(|t| (p, t)))
        .fold(None::<(MetaPlan, f64)>, |b, (p, t)| match b {
            Some((_, bt)) if bt <= t => b,
            _ => Some((p, t)),
        });
    let Some((plan, gather)) = best else {
        return MetaPlan::Agreed;
    };
    if max_ranks.is_some() {
        return plan;
    }
    let passes = crate::select::ranking(&core.topology, META_BLOCK, &core.options)
        .times
        .first()
        .map_or(f64::INFINITY, |&(_, t)| 2.0 * t);
    tracing::debug!(
        ranks = n,
        ?plan,
        gather_seconds = gather,
        two_passes_seconds = passes,
        "all-to-all-v count exchange"
    );
    if gather <= passes {
        plan
    } else {
        MetaPlan::Agreed
    }
}

/// How one call's count messages go ([`Communicator::count_route`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct CountRoute {
    /// The uniform all-to-all that carries them, padded to `16 n + c` bytes, where
    /// not the direct exchange (remainders then take the data pass).
    pub(super) routed: Option<Algorithm>,
    /// Routed in two hops, unpadded ([`super::hops`]), not by the uniform
    /// all-to-all.
    pub(super) hops: bool,
    /// The bytes of each block they carry.
    pub(super) c: usize,
    /// The largest remainder sent right behind them (0 when routed).
    pub(super) s: usize,
}

impl Communicator {
    /// How the next call's count messages go when `c` bytes of each block are learned
    /// or fixed to go with the counts and remainders up to `s` are sent behind them
    /// (see [`CountRoute`]); the same on every rank.
    pub(super) fn count_route(&mut self, c: usize, s: usize) -> Result<CountRoute> {
        let f = self.size() * META_BLOCK + c;
        // In automatic mode, when the last call's blocks all fitted in the eager bytes
        // (no remainders expected), the count messages go another way than the direct
        // exchange where one sends fewer messages over the network: across hosts of
        // the same number of ranks, the two hops ([`super::hops`], unpadded: one
        // message per other host instead of one per rank there), elsewhere a uniform
        // all-to-all of `f`-byte blocks (padded) where the cost model prefers another
        // algorithm than the direct exchange for that size. Remainders then take the
        // data pass. Every rank decides alike: the topology and the model are the
        // same everywhere, and so is the last call's matrix. (The tuner's measured
        // choice was tried for the uniform way and lost on one host: its trials of
        // other algorithms cost more than they found; docs/bench/JOURNAL.md.)
        let expect_rest = self.pool.v.last_largest.is_some_and(|l| l > c as u64);
        // The policy (`src/policy.rs`) says which: forced, the direct exchange.
        if !(s > 0 && expect_rest) {
            let hops = super::hops::applies(&self.core.topology);
            let choice = self.core.choose(Ask::CountRoute { bytes: f, hops })?;
            if !choice.forced && (hops || choice.algorithm != Algorithm::Flat) {
                return Ok(CountRoute {
                    routed: Some(choice.algorithm),
                    hops,
                    c,
                    s: 0,
                });
            }
        }
        // The direct exchange's messages are not padded (their receivers take any
        // length up to `16 n + c`): more of each block goes with the counts at no cost
        // to the pairs whose blocks are small.
        let c = if self.eager_learns() {
            c.max(self.direct_eager_floor())
        } else {
            c
        };
        Ok(CountRoute {
            routed: None,
            hops: false,
            c,
            s,
        })
    }

    /// This communicator's count-exchange plan (chosen on first use).
    pub(super) fn meta_plan(&mut self) -> MetaPlan {
        if let Some(p) = self.pool.v.forced {
            return p;
        }
        if let Some(p) = self.pool.v.plan {
            return p;
        }
        let started = std::time::Instant::now();
        let p = model_plan(&self.core, gather_max_env());
        tracing::debug!(
            rank = self.core.rank,
            plan = ?p,
            seconds = started.elapsed().as_secs_f64(),
            "all-to-all-v count exchange chosen"
        );
        self.pool.v.plan = Some(p);
        p
    }
}
