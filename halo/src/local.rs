//! Ranks as threads of one process: the thread launcher over the in-process transport.
//!
//! [`LocalCluster::new`] creates the endpoints of `N` ranks over a [`Topology`] (the
//! transport itself lives in `transport::local`); [`run`] spawns one thread per rank,
//! each with its [`Communicator`], and collects what they return. Used by the tests,
//! the benchmarks (`halo bench` without a cluster) and anyone who wants to see a
//! collective's behaviour on one machine; with [`Emulation`] on, it also shows a
//! cluster's *shape* (latency per link class, a NIC shared by a node's ranks).
//!
//! This module sits above the communicator: it is what turns the transport's endpoints
//! into [`Communicator`]s ([`LocalCluster::into_communicators`]) and runs them
//! ([`LocalCluster::run`], [`run`]), so that the transport never names the layer above it.

pub use crate::transport::local::{Emulation, LocalCluster, Traffic};

use crate::comm::Communicator;
use crate::error::{Error, Result};
use halo_topology::Topology;
use std::sync::Arc;

impl LocalCluster {
    /// Runs `f` on every rank of this cluster, one thread per rank, as [`run`] does.
    pub fn run<R, F>(self, f: F) -> Vec<Result<R>>
    where
        R: Send,
        F: Fn(&mut Communicator) -> Result<R> + Sync,
    {
        run_comms(self.into_communicators(), f)
    }

    /// One communicator per rank, in rank order. Move each to its own thread.
    pub fn into_communicators(self) -> Vec<Communicator> {
        let (topology, transports) = self.into_transports();
        transports
            .into_iter()
            .map(|transport| Communicator::from_local(transport, Arc::clone(&topology)))
            .collect()
    }
}

/// Runs `f` on every rank of `topology`, one thread per rank, each with its own
/// [`Communicator`], and returns what each rank returned, in rank order.
///
/// A rank that panics yields [`Error::InternalError`] naming the rank and the panic;
/// its peers see it gone ([`Error::RemoteError`]) instead of waiting for it.
///
/// ```
/// use halo::local::{self, Emulation};
/// use halo::topology::Topology;
///
/// let topo = Topology::preset("nodes:2x2").unwrap();
/// let out = local::run(&topo, Emulation::off(), |comm| {
///     let me = comm.rank() as u32;
///     let send: Vec<u32> = (0..comm.size() as u32).map(|q| me * 10 + q).collect();
///     let mut recv = vec![0u32; comm.size()];
///     comm.all_to_all(&send, &mut recv)?;
///     Ok(recv)
/// });
/// assert_eq!(out[1].as_ref().unwrap(), &vec![1, 11, 21, 31]);
/// ```
pub fn run<R, F>(topology: &Topology, emulation: Emulation, f: F) -> Vec<Result<R>>
where
    R: Send,
    F: Fn(&mut Communicator) -> Result<R> + Sync,
{
    let cluster = match LocalCluster::new(topology.clone(), emulation) {
        Ok(c) => c,
        Err(e) => return (0..topology.size()).map(|_| Err(e.clone())).collect(),
    };
    cluster.run(f)
}

fn run_comms<R, F>(comms: Vec<Communicator>, f: F) -> Vec<Result<R>>
where
    R: Send,
    F: Fn(&mut Communicator) -> Result<R> + Sync,
{
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, mut comm)| {
                std::thread::Builder::new()
                    .name(format!("halo-rank-{rank}"))
                    .spawn_scoped(s, move || f(&mut comm))
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| match h {
                Ok(h) => h.join().unwrap_or_else(|p| {
                    let what = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a non-string payload".into());
                    Err(Error::internal(format!("rank {rank} panicked: {what}")))
                }),
                Err(e) => Err(Error::SystemError {
                    message: format!("cannot start the thread of rank {rank}: {e}"),
                }),
            })
            .collect()
    })
}
