//! Split: [`Communicator::split`] into sub-communicators that share this rank's
//! transport endpoint.

use super::Communicator;
use super::p2p::COMM_SHIFT;
use crate::error::{Error, Result};
use crate::transport::{Backend, MAX_COMMS};
use halo_topology::Topology;
use std::sync::Arc;

impl Communicator {
    /// Splits this communicator (`MPI_Comm_split`, `ncclCommSplit`): the ranks that pass
    /// the same `Some(color)` form a new communicator, ordered by `key`, then by their
    /// rank here. A rank that passes `None` (MPI's `MPI_UNDEFINED`, NCCL's
    /// `NCCL_SPLIT_NOCOLOR`) joins none and gets `Ok(None)`. Every rank must call it (it
    /// is a collective: an all-gather of every rank's color and key).
    ///
    /// ```
    /// use halo::local::{self, Emulation};
    /// use halo::topology::Topology;
    ///
    /// let topo = Topology::preset("nodes:2x2").unwrap();
    /// let sizes = local::run(&topo, Emulation::off(), |comm| {
    ///     // Even ranks form one communicator; rank 3 stays out.
    ///     let color = if comm.rank() == 3 { None } else { Some((comm.rank() % 2) as u32) };
    ///     let child = comm.split(color, 0)?;
    ///     Ok(child.map(|c| (c.rank(), c.size())))
    /// });
    /// let sizes: Vec<_> = sizes.into_iter().map(Result::unwrap).collect();
    /// assert_eq!(sizes, [Some((0, 2)), Some((0, 1)), Some((1, 2)), None]);
    /// ```
    ///
    /// The new communicator's topology is this one's restricted to its members. It
    /// inherits the timeout, the forced algorithms and the builder options, and has its
    /// own abort handle and sequence numbers. It shares this rank's transport endpoint:
    /// no connection is opened; its messages carry its own communicator id in the tag,
    /// so it and this communicator (and any other split from it) never match each
    /// other's messages.
    ///
    /// Communicators split from one another (parents, children, siblings) may be used
    /// one after the other from one thread, or moved between threads, but not
    /// concurrently: an operation that finds the shared endpoint busy on another thread
    /// fails with [`Error::InvalidUsage`] rather than wait. At most 32 communicators can
    /// share a rank's endpoint at once; an id is free again when its communicator is
    /// dropped.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] when a member rank already has 32 communicators;
    /// errors of [`Communicator::all_gather`].
    pub fn split(&mut self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        let (n, me) = (self.size(), self.rank());
        let used = self.core.backend.share().ids_in_use();
        // [member?, color, key, ids in use]
        let mine = [
            u32::from(color.is_some()),
            color.unwrap_or(0),
            key as u32,
            used,
        ];
        let mut all = vec![0u32; 4 * n];
        self.all_gather_as(halo_collectives::CallKind::Split, &mine, &mut all)?;
        let Some(color) = color else {
            return Ok(None);
        };
        let entry = |q: usize| {
            let e = &all[4 * q..4 * q + 4];
            ((e[0] == 1).then_some(e[1]), e[2] as i32, e[3])
        };
        let mut members: Vec<usize> = (0..n).filter(|&q| entry(q).0 == Some(color)).collect();
        members.sort_by_key(|&q| (entry(q).1, q));
        let taken = members.iter().fold(0u32, |u, &q| u | entry(q).2);
        let id = (!taken).trailing_zeros();
        if id >= MAX_COMMS {
            return Err(Error::InvalidUsage {
                peer: None,
                message: format!(
                    "split: the ranks of color {color} already use {MAX_COMMS} communicators; drop some first"
                ),
            });
        }
        let rank = members
            .iter()
            .position(|&q| q == me)
            .ok_or_else(|| Error::internal("split: this rank is not among its color's members"))?;
        let topology = sub_topology(&self.core.topology, &members, color)?;
        let Backend::Shared(shared) = &self.core.backend else {
            return Err(Error::internal("split: the transport is not shared"));
        };
        let backend = shared.child(&members, id)?;
        debug_assert_ne!(shared.id(), id);
        let mut child = Communicator::from_backend(
            Backend::Shared(backend),
            rank,
            members.len(),
            Arc::new(topology),
        );
        let (c, p) = (&mut child.core, &self.core);
        c.comm_tag = u64::from(id) << COMM_SHIFT;
        c.timeout = p.timeout;
        c.policy.inherit(&p.policy);
        c.options = p.options.clone();
        tracing::debug!(
            rank = me,
            color,
            new_rank = rank,
            size = members.len(),
            id,
            "split"
        );
        Ok(Some(child))
    }
}

/// `parent` restricted to `members` (new rank `i` = `members[i]`), built through the
/// topology's file form so that it is checked like any other.
fn sub_topology(parent: &Topology, members: &[usize], color: u32) -> Result<Topology> {
    let mut spec = parent.to_spec();
    let mut new_rank = vec![None; parent.size()];
    for (i, &m) in members.iter().enumerate() {
        new_rank[m] = Some(i as i64);
    }
    let mut ranks = Vec::with_capacity(members.len());
    for (i, &m) in members.iter().enumerate() {
        let mut r = spec
            .ranks
            .get(m)
            .filter(|r| r.rank == m as i64)
            .cloned()
            .ok_or_else(|| Error::internal(format!("split: rank {m} missing from the topology")))?;
        r.rank = i as i64;
        ranks.push(r);
    }
    spec.ranks = ranks;
    spec.nics = std::mem::take(&mut spec.nics)
        .into_iter()
        .filter_map(|mut nic| {
            let mut served: Vec<i64> = nic
                .ranks
                .iter()
                .filter_map(|&r| {
                    usize::try_from(r)
                        .ok()
                        .and_then(|r| new_rank.get(r).copied().flatten())
                })
                .collect();
            served.sort_unstable();
            nic.ranks = served;
            (!nic.ranks.is_empty()).then_some(nic)
        })
        .collect();
    spec.name = format!("{}/split({color})", parent.name());
    spec.build()
        .map_err(|e| Error::internal(format!("split: the sub-communicator's topology: {e}")))
}
