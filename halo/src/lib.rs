//! HALO: a topology-aware hierarchical all-to-all for Mixture-of-Experts training.
//!
//! This crate is the library a training program links: the communicator over
//! [`halo_topology`] (the machine model) and [`halo_collectives`] (schedules, verifier,
//! simulator, engine), its transports, bootstrap and algorithm selection. It pulls in
//! nothing that only the `halo` command-line tool needs (that is the `halo-cli` crate:
//! launcher, benchmarks, plots); logs go through `tracing`, and whoever owns the process
//! (the tool, `libhalo`, your program) installs a subscriber (`halo-logging` reads
//! `HALO_DEBUG` the way NCCL reads `NCCL_DEBUG`).
//!
//! # Collectives
//!
//! A [`Communicator`] is one rank's handle on a group of ranks: [`Communicator::all_to_all`]
//! and [`Communicator::all_to_all_v`] over any [`bytemuck::Pod`] element type,
//! out-of-place, with the algorithm forced by the caller, or else measured on the run
//! ([`tune`]) among the candidates a cost model over the topology ranks ([`select`]);
//! one policy per communicator (`src/policy.rs`) makes that choice, once per call. Errors are one enum, [`Error`], whose variants
//! map one to one onto the C result codes ([`Error::code`]).
//!
//! Around them: point-to-point [`Communicator::send`] / [`Communicator::recv`] /
//! [`Communicator::send_recv`], [`Communicator::barrier`], [`Communicator::all_gather`],
//! [`Communicator::all_reduce`] (sum, max, min over [`Reducible`] types, [`bf16`] and
//! [`f16`](struct@f16) included, bitwise-equal on every rank) and [`Communicator::split`] into
//! sub-communicators that share their parent's transport.
//!
//! Without a cluster, [`local::run`] runs `N` ranks as threads of this process over the
//! in-process transport, optionally with link emulation ([`Emulation`]) so that one
//! machine shows a cluster's shape.
//!
//! ```
//! use halo::local::{self, Emulation};
//! use halo::topology::Topology;
//!
//! let topo = Topology::preset("nodes:2x4").unwrap();
//! let results = local::run(&topo, Emulation::off(), |comm| {
//!     let n = comm.size();
//!     let send: Vec<f32> = (0..n * 4).map(|i| (comm.rank() * 1000 + i) as f32).collect();
//!     let mut recv = vec![0f32; n * 4];
//!     comm.all_to_all(&send, &mut recv)?;
//!     Ok(recv)
//! });
//! // Rank 3 got elements 12..16 of every rank's send buffer.
//! assert_eq!(results[3].as_ref().unwrap()[4..8], [1012.0, 1013.0, 1014.0, 1015.0]);
//! ```

pub use halo_topology as topology;

pub mod bootstrap;
#[doc(hidden)]
pub mod c_abi;
mod comm;
pub mod device;
mod error;
pub mod host;
pub mod local;
mod policy;
pub mod select;
mod transport;
pub mod tune;

pub use bootstrap::UniqueId;
#[doc(hidden)]
pub use bootstrap::root_handshake_for_fuzzing;
pub use comm::{
    AbortHandle, Communicator, DEFAULT_TIMEOUT, InitConfig, MAX_RANKS, MAX_USER_TAG, MoeDispatch,
    MoeExchange, MoeFloat, MoeRouting, MoeStats, P2pStats, Partition, ReduceOp, Reducible, Request,
    SPECULATE_V, Scope,
};
pub use error::{Error, Result};
pub use half::{bf16, f16};
pub use halo_collectives as collectives;
pub use halo_collectives::{
    AlgoOptions, Algorithm, AllGatherAlgorithm, AllReduceAlgorithm, BroadcastAlgorithm,
};
pub use local::{Emulation, LocalCluster, Traffic};
#[doc(hidden)]
pub use transport::card::decode_card_for_fuzzing;
pub use transport::fabric::{FabricConfig, FabricProgress};
pub use transport::shm::TransportChoice;
