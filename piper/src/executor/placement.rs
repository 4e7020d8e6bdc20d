//! The expert -> rank table: which EP index of its stage holds each expert of each block.
//!
//! The executor starts from the contiguous table (EP index `q` holds experts
//! `q * E/EP .. (q+1) * E/EP` of every block); expert migration (`crate::migration`)
//! replaces it, on every rank of the mesh at the same step boundary. Every rank holds the
//! table of every block (also of the other stages' blocks), so every rank can check and
//! report a migration of the whole model.
//!
//! Every EP index holds the same number of experts of each block (migration swaps
//! experts), so the count exchange of a dispatch stays a uniform all-to-all and every GPU
//! keeps the memory the resource model sized it for.

use crate::error::{PiperError, Result};

/// Owner (EP index) of every expert of every block.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Placement {
    ep: usize,
    experts: usize,
    /// `owner[layer][expert]`: the EP index that holds it.
    owner: Vec<Vec<usize>>,
}

impl Placement {
    /// The contiguous table: EP index `q` holds experts `q * E/EP .. (q+1) * E/EP` of every
    /// block.
    ///
    /// # Errors
    /// [`PiperError::EpNotDividingExperts`] when `ep` is 0 or does not divide `experts`.
    pub fn contiguous(layers: usize, experts: usize, ep: usize) -> Result<Self> {
        if ep == 0 || experts == 0 || !experts.is_multiple_of(ep) {
            return Err(PiperError::EpNotDividingExperts { ep, experts });
        }
        let per = experts / ep;
        let row: Vec<usize> = (0..experts).map(|e| e / per).collect();
        Ok(Placement {
            ep,
            experts,
            owner: vec![row; layers],
        })
    }

    /// A table from explicit owners, `owner[layer][expert]`.
    ///
    /// # Errors
    /// [`PiperError::Invalid`] (what `placement`) naming the block whose row is not `E`
    /// owners below `ep`, each holding `E / ep` experts.
    pub fn from_owners(ep: usize, owner: Vec<Vec<usize>>) -> Result<Self> {
        let experts = owner.first().map_or(0, Vec::len);
        if ep == 0 || experts == 0 || !experts.is_multiple_of(ep) {
            return Err(PiperError::EpNotDividingExperts { ep, experts });
        }
        let per = experts / ep;
        for (layer, row) in owner.iter().enumerate() {
            let mut held = vec![0usize; ep];
            for &q in row {
                if q >= ep {
                    return Err(PiperError::invalid(
                        "placement",
                        format!("layer {layer}"),
                        format!("owner {q} is not an EP index below {ep}"),
                    ));
                }
                held[q] += 1;
            }
            if row.len() != experts || held.iter().any(|&n| n != per) {
                return Err(PiperError::invalid(
                    "placement",
                    format!("layer {layer}"),
                    format!(
                        "{} experts held {held:?}; every EP index must hold {per} of {experts}",
                        row.len()
                    ),
                ));
            }
        }
        Ok(Placement { ep, experts, owner })
    }

    /// Blocks.
    pub fn layers(&self) -> usize {
        self.owner.len()
    }
    /// Experts per block.
    pub fn experts(&self) -> usize {
        self.experts
    }
    /// EP group size.
    pub fn ep(&self) -> usize {
        self.ep
    }
    /// Experts each EP index holds of each block.
    pub fn per_rank(&self) -> usize {
        self.experts / self.ep
    }
    /// The EP index that holds `expert` of block `layer`.
    pub fn owner(&self, layer: usize, expert: usize) -> usize {
        self.owner[layer][expert]
    }
    /// The owners of block `layer`'s experts, by expert id.
    pub fn owners(&self, layer: usize) -> &[usize] {
        &self.owner[layer]
    }
    /// The experts of block `layer` that EP index `rank` holds, ascending: the order of
    /// its local experts in a dispatch.
    pub fn local(&self, layer: usize, rank: usize) -> Vec<usize> {
        (0..self.experts)
            .filter(|&e| self.owner[layer][e] == rank)
            .collect()
    }
    /// Block `layer`'s experts in dispatch send order: by owner, then by id.
    pub fn send_order(&self, layer: usize) -> Vec<usize> {
        (0..self.ep).flat_map(|q| self.local(layer, q)).collect()
    }
    /// Swaps the owners of experts `a` and `b` of block `layer`.
    pub fn swap(&mut self, layer: usize, a: usize, b: usize) {
        self.owner[layer].swap(a, b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_matches_the_fixed_mapping() {
        let p = Placement::contiguous(2, 8, 4).unwrap();
        assert_eq!(p.local(1, 2), [4, 5]);
        assert_eq!(p.send_order(0), (0..8).collect::<Vec<_>>());
        let mut q = p.clone();
        q.swap(0, 0, 7);
        assert_eq!(q.local(0, 0), [1, 7]);
        assert_eq!(q.local(0, 3), [0, 6]);
        assert_eq!(q.send_order(0), [1, 7, 2, 3, 4, 5, 0, 6]);
        assert_eq!(
            Placement::from_owners(4, vec![q.owners(0).to_vec(), q.owners(1).to_vec()]).unwrap(),
            q
        );
    }

    #[test]
    fn unequal_tables_are_refused_naming_the_layer() {
        let e = Placement::from_owners(2, vec![vec![0, 0, 1, 1], vec![0, 0, 0, 1]]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid placement: layer 1: 4 experts held [3, 1]; every EP index must hold 2 of 4"
        );
        let e = Placement::from_owners(2, vec![vec![0, 2, 1, 1]]).unwrap_err();
        assert!(e.to_string().contains("owner 2 is not an EP index below 2"));
    }
}
