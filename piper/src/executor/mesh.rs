//! The PP x EP (x DP) mesh: which rank is which stage, replica and expert-parallel index,
//! and the sub-communicators split from the world communicator.
//!
//! Rank order: `rank = (stage * dp + dp_index) * ep + ep_index`. A stage's EP group is
//! `ep` consecutive ranks, so on a topology whose nodes (or switch domains) hold
//! consecutive ranks it lands inside one of them, as Piper places it; the DP replicas of a
//! stage follow each other, and the stages come last.

use std::ops::Range;

use halo::Communicator;

use crate::error::{PiperError, Result};

/// The shape of the mesh: pipeline stages x expert-parallel group size x data-parallel
/// replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshLayout {
    /// Pipeline stages.
    pub pp: usize,
    /// Ranks per expert-parallel group (each holds `experts / ep` experts of every block
    /// of its stage; which ones is the executor's [`super::Placement`]).
    pub ep: usize,
    /// Data-parallel replicas of the whole PP x EP pipeline.
    pub dp: usize,
}

impl MeshLayout {
    /// `pp x ep` with one replica.
    pub fn new(pp: usize, ep: usize) -> Self {
        MeshLayout { pp, ep, dp: 1 }
    }

    /// Ranks the layout needs.
    pub fn ranks(&self) -> usize {
        self.pp * self.ep * self.dp
    }

    /// Checks the layout against a world of `world` ranks and a model of `layers` blocks of
    /// `experts` experts. Needs no communication, so every rank reaches the same verdict.
    ///
    /// # Errors
    /// [`PiperError::Invalid`] for a zero size, [`PiperError::MeshSize`],
    /// [`PiperError::EpNotDividingExperts`], [`PiperError::PpExceedsLayers`].
    pub fn validate(&self, world: usize, layers: usize, experts: usize) -> Result<()> {
        for (field, v) in [("pp", self.pp), ("ep", self.ep), ("dp", self.dp)] {
            if v == 0 {
                return Err(PiperError::invalid("layout", field, "must be at least 1"));
            }
        }
        if self.ranks() != world {
            return Err(PiperError::MeshSize {
                pp: self.pp,
                ep: self.ep,
                dp: self.dp,
                needed: self.ranks(),
                world,
            });
        }
        if !experts.is_multiple_of(self.ep) {
            return Err(PiperError::EpNotDividingExperts {
                ep: self.ep,
                experts,
            });
        }
        if self.pp > layers {
            return Err(PiperError::PpExceedsLayers {
                pp: self.pp,
                layers,
            });
        }
        Ok(())
    }

    /// World rank of (stage, data-parallel index, expert-parallel index).
    pub fn rank_of(&self, stage: usize, dp_index: usize, ep_index: usize) -> usize {
        (stage * self.dp + dp_index) * self.ep + ep_index
    }

    /// (stage, data-parallel index, expert-parallel index) of a world rank.
    pub fn coords(&self, rank: usize) -> (usize, usize, usize) {
        let ep_index = rank % self.ep;
        let rest = rank / self.ep;
        (rest / self.dp, rest % self.dp, ep_index)
    }

    /// Blocks of stage `stage` for a model of `layers` blocks: contiguous, as even as
    /// possible (the first `layers % pp` stages get one more).
    pub fn stage_layers(&self, stage: usize, layers: usize) -> Range<usize> {
        let (q, r) = (layers / self.pp, layers % self.pp);
        let start = stage * q + stage.min(r);
        start..start + q + usize::from(stage < r)
    }
}

/// This rank's place in the mesh and its communicators.
#[derive(Debug)]
pub struct Mesh {
    layout: MeshLayout,
    stage: usize,
    dp_index: usize,
    ep_index: usize,
    /// The stage's expert-parallel group (rank = EP index).
    pub ep: Communicator,
    /// The pipeline of this (DP index, EP index) (rank = stage).
    pub pp: Communicator,
    /// The replicas of this (stage, EP index) (rank = DP index); `None` when DP is 1.
    pub dp: Option<Communicator>,
}

impl Mesh {
    /// Validates the layout (see [`MeshLayout::validate`]) and splits `world` into the
    /// EP, PP and (when DP > 1) DP communicators. Collective over `world`: every rank
    /// calls it with the same arguments. Validation comes before any communication, so a
    /// bad layout is the same error on every rank, at once.
    ///
    /// # Errors
    /// As [`MeshLayout::validate`]; [`PiperError::Comm`] when a split fails.
    pub fn new(
        world: &mut Communicator,
        layout: MeshLayout,
        layers: usize,
        experts: usize,
    ) -> Result<Self> {
        layout.validate(world.size(), layers, experts)?;
        let (stage, dp_index, ep_index) = layout.coords(world.rank());
        let color = |v: usize| Some(u32::try_from(v).unwrap_or(u32::MAX));
        let key = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
        let missing = || halo::Error::internal("split returned no communicator for a member");
        let ep = world
            .split(color(stage * layout.dp + dp_index), key(ep_index))?
            .ok_or_else(missing)?;
        let pp = world
            .split(color(dp_index * layout.ep + ep_index), key(stage))?
            .ok_or_else(missing)?;
        let dp = if layout.dp > 1 {
            Some(
                world
                    .split(color(stage * layout.ep + ep_index), key(dp_index))?
                    .ok_or_else(missing)?,
            )
        } else {
            None
        };
        Ok(Mesh {
            layout,
            stage,
            dp_index,
            ep_index,
            ep,
            pp,
            dp,
        })
    }

    /// The layout.
    pub fn layout(&self) -> MeshLayout {
        self.layout
    }
    /// This rank's pipeline stage.
    pub fn stage(&self) -> usize {
        self.stage
    }
    /// This rank's data-parallel index.
    pub fn dp_index(&self) -> usize {
        self.dp_index
    }
    /// This rank's index in its stage's expert-parallel group.
    pub fn ep_index(&self) -> usize {
        self.ep_index
    }
    /// Whether this rank runs the first stage (embedding).
    pub fn is_first(&self) -> bool {
        self.stage == 0
    }
    /// Whether this rank runs the last stage (head and loss).
    pub fn is_last(&self) -> bool {
        self.stage + 1 == self.layout.pp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coords_round_trip_and_ep_groups_are_contiguous() {
        let l = MeshLayout {
            pp: 2,
            ep: 4,
            dp: 2,
        };
        for r in 0..l.ranks() {
            let (s, d, e) = l.coords(r);
            assert_eq!(l.rank_of(s, d, e), r);
        }
        // Stage 0, replica 1: ranks 4..8.
        assert_eq!(
            (0..4).map(|e| l.rank_of(0, 1, e)).collect::<Vec<_>>(),
            [4, 5, 6, 7]
        );
    }

    #[test]
    fn stage_layers_cover_in_order() {
        let l = MeshLayout::new(3, 1);
        let r: Vec<_> = (0..3).map(|s| l.stage_layers(s, 7)).collect();
        assert_eq!(r, [0..3, 3..5, 5..7]);
    }

    #[test]
    fn validate_names_the_numbers() {
        let e = MeshLayout::new(3, 1).validate(8, 4, 8).unwrap_err();
        assert!(
            matches!(
                e,
                PiperError::MeshSize {
                    needed: 3,
                    world: 8,
                    ..
                }
            ),
            "{e}"
        );
        let e = MeshLayout::new(2, 3).validate(6, 4, 8).unwrap_err();
        assert!(matches!(
            e,
            PiperError::EpNotDividingExperts { ep: 3, experts: 8 }
        ));
        let e = MeshLayout::new(8, 1).validate(8, 4, 8).unwrap_err();
        assert!(matches!(
            e,
            PiperError::PpExceedsLayers { pp: 8, layers: 4 }
        ));
        assert_eq!(
            e.to_string(),
            "PP 8 exceeds the model's 4 blocks (every stage needs at least one)"
        );
    }
}
