//! Collective algorithms as data.
//!
//! An algorithm does not move bytes: it *builds a schedule* — for one rank, a program
//! of [`Step`]s (`Send`, `Recv`, `Copy` over [`Region`]s of the send, receive and
//! scratch buffers), each with the steps it depends on. The same schedules are
//! [`verify`]-ed symbolically for all ranks, simulated against a topology, and
//! [`execute`]-d by one executor over any [`Transport`].
//!
//! ```
//! use halo_collectives::{build, verify_all_to_all, AlgoOptions, Algorithm, BuildCtx, Layout, UniformSizes};
//! use halo_topology::Topology;
//!
//! let topo = Topology::preset("nodes:2x2").unwrap();
//! let options = AlgoOptions::default();
//! let sizes = UniformSizes(8);
//! let schedules: Vec<_> = (0..topo.size())
//!     .map(|rank| {
//!         let ctx = BuildCtx { topology: &topo, rank, layout: Layout::Uniform { block: 8 }, sizes: &sizes, options: &options };
//!         build(Algorithm::Flat, &ctx).unwrap()
//!     })
//!     .collect();
//! verify_all_to_all(&schedules, &topo, &sizes).unwrap();
//! ```

mod algo;
mod broadcast;
mod call;
mod error;
mod execute;
mod gather;
mod layout;
mod reduce;
mod reduce_scatter;
mod rooted;
mod schedule;
mod simulate;
mod verify;
mod waves;

pub use algo::moe::{
    MoeForward, MoeGroup, MoeIncoming, MoeLand, MoeOrigin, MoePlan, MoeRelayEntry, MoeRoutes,
    MoeSend, build_moe_dispatch, build_moe_gather, build_moe_return, moe_forwards, moe_lands,
    moe_node_of, moe_plans, moe_relay_entries, moe_sends,
};
pub use algo::{AlgoOptions, Algorithm, BuildCtx, DEFAULT_NODE_RELAY_BYTES, build};
pub use broadcast::{
    BROADCAST_CHUNK, BROADCAST_SMALL, BroadcastAlgorithm, ROOT_AGREEMENT_TAG, build_broadcast,
};
pub use call::{Call, CallKind, DTYPE_NAMES, OP_NAMES};
pub use error::{CollectiveError, Result, VerifyError};
pub use execute::{Buffers, ExecOptions, Idle, Session, Transport, execute};
pub use gather::{ALL_GATHER_SMALL, AllGatherAlgorithm, build_all_gather};
pub use layout::{BlockSizes, KnownSizes, Layout, META_BLOCK, MatrixSizes, UniformSizes};
pub use reduce::{
    ALL_REDUCE_SMALL, AllReduceAlgorithm, Landing, ReduceReport, ReduceRound, Transfer,
    all_reduce_plan, exchange, verify_all_reduce,
};
pub use reduce_scatter::{reduce_scatter_plan, verify_reduce_scatter};
pub use rooted::{build_gather, build_scatter};
pub use schedule::{
    Buf, Region, RoutedBlock, Schedule, ScheduleBuilder, ScheduleStats, Step, StepId, TAG_BITS,
};
pub use simulate::{
    DEFAULT_NIC_GAP, Egress, LevelTraffic, MoeSizes, ResourceClass, ResourceLoad, Sharing,
    SimOptions, SimReport, Traffic, simulate, simulate_all_to_all,
};
pub use verify::{
    Expectation, MoeVerifyReport, VerifyReport, WaveReport, verify, verify_all_gather,
    verify_all_to_all, verify_broadcast, verify_gather, verify_moe, verify_scatter, verify_waves,
};
pub use waves::{SessionWaves, Wave, WaveBackend, Waves, execute_waves, group_waves};
