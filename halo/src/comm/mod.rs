//! The communicator: HALO's public Rust API for collectives.
//!
//! A [`Communicator`] is one rank's handle on a group of ranks. Collectives are
//! blocking and out-of-place; element types are any [`bytemuck::Pod`] type. A call
//! validates its arguments, asks the communicator's policy once for the algorithm
//! (`src/policy.rs`: the one the caller forced, or the measured or modelled choice,
//! cached per size class), builds this rank's schedule with [`halo_collectives::build`]
//! (or takes it from the policy's cache) and runs it with [`halo_collectives::execute`]
//! on the communicator's transport.
//!
//! Every rank must make the same sequence of collective calls. Each call takes the
//! next collective sequence number(s) — also when it fails — and puts it above the
//! schedule's tags, so successive collectives never match each other's messages.
//!
//! Each call also gets a descriptor of what every rank must agree on
//! ([`halo_collectives::Call`]: the collective, the reduction operation, the element
//! type of a reduction — `dtype_code` of `E` —, the root, the byte count), which the
//! transports carry with every message of the call; ranks that disagree fail with
//! [`Error::InvalidUsage`] naming both ranks and both values (docs/ARCHITECTURE.md,
//! "Call agreement", for what is and is not detected).

mod all_gather;
mod all_reduce;
mod all_to_all;
mod all_to_all_v;
mod broadcast;
mod device;
mod gather;
mod init;
mod moe;
mod nonblocking;
mod p2p;
mod partition;
mod reduce_scatter;
mod scatter;
mod split;
mod waves;

pub use all_reduce::{ReduceOp, Reducible};
pub use all_to_all_v::SPECULATE_V;
pub use init::InitConfig;
pub use moe::{MoeDispatch, MoeExchange, MoeFloat, MoeRouting, MoeStats};
pub(crate) use nonblocking::{Inbox, Job, Queue, Slot, Task, Work, serve, with_context};
pub use nonblocking::{Request, Scope};
pub use p2p::{MAX_USER_TAG, P2pStats};
pub use partition::Partition;

use crate::error::{Error, Result};
use crate::policy::{Ask, Choice, Ctx, Policy};
use crate::transport::Backend;
use crate::transport::local::LocalTransport;
use halo_collectives::{
    AlgoOptions, Algorithm, Buffers, Call, CallKind, ExecOptions, Schedule, TAG_BITS,
};
use halo_topology::Topology;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The default per-operation timeout: 60 seconds.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

pub use crate::bootstrap::MAX_RANKS;
pub(crate) use crate::bootstrap::check_world_size;

/// Bits of the collective sequence number in a tag: the 16 bits above [`TAG_BITS`] hold,
/// from the top, the communicator id (5 bits), the point-to-point flag (1 bit) and the
/// sequence number (these 10 bits; it wraps at 1024). See `collectives` for the layout.
const SEQ_BITS: u32 = 10;

/// Collective sequence numbers wrap at `2^SEQ_BITS`.
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// Aborts a communicator's operations from any thread.
///
/// Once aborted, the operation in progress returns [`Error::Aborted`] promptly, and so
/// does every later call on that communicator (as after `ncclCommAbort`). Cheap to
/// clone; `Send` and `Sync`.
#[derive(Debug, Clone, Default)]
pub struct AbortHandle(Arc<AtomicBool>);

impl AbortHandle {
    /// Aborts the communicator.
    pub fn abort(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether the communicator was aborted.
    pub fn is_aborted(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// How an all-to-all-v's counts were exchanged (which algorithms its data pass may run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    /// All-to-all-v data pass after a metadata pass with this algorithm.
    V(Algorithm),
    /// All-to-all-v data pass after an all-gather of every rank's counts.
    VGathered,
}

/// Everything except the pooled buffers, so that a call can borrow both at once.
#[derive(Debug)]
pub(crate) struct Core {
    rank: usize,
    size: usize,
    topology: Arc<Topology>,
    pub(crate) backend: Backend,
    seq: u64,
    options: AlgoOptions,
    timeout: Duration,
    abort: AbortHandle,
    /// The algorithm choice: forced algorithms, measured and modelled choices, the
    /// schedules of the chosen algorithms (`src/policy.rs`).
    policy: Policy,
    last: Option<Algorithm>,
    /// This communicator's id in the top bits of every tag (0 for one made at init).
    comm_tag: u64,
    /// Point-to-point counters, all-gather and all-reduce state.
    ext: Ext,
}

/// Buffers reused from call to call (no allocation per call in steady state).
#[derive(Debug, Default)]
struct Pool {
    scratch: Vec<u8>,
    meta_send: Vec<u8>,
    meta_recv: Vec<u8>,
    meta_scratch: Vec<u8>,
    status_send: Vec<u8>,
    status_recv: Vec<u8>,
    status_scratch: Vec<u8>,
    send_bytes: Vec<usize>,
    send_displs: Vec<usize>,
    recv_bytes: Vec<usize>,
    recv_displs: Vec<usize>,
    order: Vec<(usize, usize, usize)>,
    barrier_send: Vec<u8>,
    barrier_recv: Vec<u8>,
    /// All-to-all-v's count exchange.
    v: all_to_all_v::VState,
}

/// One rank's handle on a group of ranks: all-to-all and all-to-all-v over
/// [`bytemuck::Pod`] elements, out-of-place.
///
/// `Send` but not `Sync`: one communicator is used by one thread at a time (NCCL's
/// rule); [`Communicator::abort_handle`] is what other threads may hold.
///
/// Create communicators with [`crate::local::LocalCluster`] or [`crate::local::run`]
/// (ranks as threads of one process).
pub struct Communicator {
    pub(crate) core: Core,
    pool: Pool,
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.core.rank)
            .field("size", &self.core.size)
            .field("topology", &self.core.topology.name())
            .field("algorithm", &self.core.policy.forced().all_to_all)
            .field("timeout", &self.core.timeout)
            .finish_non_exhaustive()
    }
}

/// How the engine runs one pass of this communicator: its timeout and abort flag.
pub(crate) fn exec_options(timeout: Duration, abort: &AbortHandle) -> ExecOptions<'_> {
    ExecOptions {
        timeout,
        abort: Some(&abort.0),
        spin: spin_polls(),
    }
}

/// Most ranks for which a barrier inside one host is the flat fan-out
/// ([`barrier_algorithm`]).
pub(crate) const FLAT_BARRIER_MAX_RANKS: usize = 8;

/// The barrier's all-to-all algorithm: `HALO_BARRIER_ALGO` (an unknown name is logged
/// and ignored), else by the topology: the flat fan-out when every rank is on one host
/// and there are at most [`FLAT_BARRIER_MAX_RANKS`], Bruck's rounds otherwise.
///
/// Measured on one host (docs/bench/JOURNAL.md, "Issue 30", item 2): with 4 and 8
/// processes on 2 cores a flat barrier plus a small all-to-all took 8.5 and 30 us
/// against 9.5 and 38 us with Bruck's, and a 1-256 B all-to-all timed after the barrier
/// ran 13% and 34% faster (medians), because the flat barrier releases every rank at
/// the last arrival's message, where Bruck's release travels its `log2 n` rounds. Across hosts
/// Bruck's `log2 n` messages per rank beat the flat `n - 1` on the network (the
/// emulated 4 x 2 cluster: 274-315 us against 413-475 us).
fn barrier_algorithm(topology: &Topology) -> Algorithm {
    static ALGO: std::sync::OnceLock<Option<Algorithm>> = std::sync::OnceLock::new();
    let forced = *ALGO.get_or_init(|| {
        forced_barrier()
            .inspect_err(|e| tracing::warn!("HALO_BARRIER_ALGO ignored: {e}"))
            .ok()
            .flatten()
    });
    forced.unwrap_or_else(|| default_barrier(topology))
}

/// The barrier's algorithm forced by `HALO_BARRIER_ALGO` (`None`: unset, empty or
/// `auto`); an unknown name is the parse error (init refuses it, the barrier ignores it).
pub(crate) fn forced_barrier()
-> std::result::Result<Option<Algorithm>, halo_collectives::CollectiveError> {
    match halo_params::BARRIER_ALGO.raw() {
        None => Ok(None),
        Some(a) => match a.trim() {
            "" | "auto" => Ok(None),
            name => name.parse().map(Some),
        },
    }
}

/// The barrier's algorithm when none is forced (see [`barrier_algorithm`]).
pub(crate) fn default_barrier(topology: &Topology) -> Algorithm {
    let node = halo_topology::Level::Node;
    // A topology without a node level (`flat:N`) has no hosts to tell apart.
    let one_host = !topology.has_level(node) || topology.num_domains(node) <= 1;
    if one_host && topology.size() <= FLAT_BARRIER_MAX_RANKS {
        Algorithm::Flat
    } else {
        Algorithm::Bruck
    }
}

/// Polls before the engine starts to back off: `HALO_SPIN`, else the engine's
/// default ([`ExecOptions::spin`]).
fn spin_polls() -> u32 {
    static SPIN: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        halo_params::SPIN
            .number_or_warn()
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(ExecOptions::default().spin)
    })
}

/// Ensures `buf` holds at least `len` bytes and returns the first `len`.
fn sized(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buf.len() < len {
        buf.resize(len, 0);
    }
    &mut buf[..len]
}

/// The schedule in the one-entry cache `slot` under `key`; built with `build` (and kept)
/// when the slot holds another key or none.
fn cached_schedule<K: PartialEq>(
    slot: &mut Option<(K, Schedule)>,
    key: K,
    build: impl FnOnce() -> halo_collectives::Result<Schedule>,
) -> Result<&Schedule> {
    if !matches!(slot, Some((k, _)) if *k == key) {
        *slot = Some((key, build()?));
    }
    match slot {
        Some((_, s)) => Ok(s),
        None => Err(Error::internal("a schedule left its cache")),
    }
}

/// Whether two byte ranges share a byte.
fn overlaps(a: *const u8, a_len: usize, b: *const u8, b_len: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

impl Core {
    /// The tag base of the next collective pass.
    fn next_tag_base(&mut self) -> u64 {
        let t = self.comm_tag | (self.seq & SEQ_MASK) << TAG_BITS;
        self.seq = self.seq.wrapping_add(1);
        t
    }

    fn check_aborted(&self) -> Result<()> {
        if self.abort.is_aborted() {
            return Err(Error::Aborted {
                message: format!("communicator of rank {} was aborted", self.rank),
            });
        }
        Ok(())
    }

    /// Asks the policy for the algorithm of `ask` (once per call).
    fn choose(&mut self, ask: Ask) -> Result<Choice> {
        let ctx = Ctx {
            topology: &self.topology,
            options: &self.options,
            rank: self.rank,
        };
        self.policy.choose(&ctx, ask)
    }

    /// Runs a uniform all-to-all of `block` bytes per pair over byte buffers, its
    /// messages carrying `call` (the descriptor of the call it is part of).
    #[allow(clippy::too_many_arguments)]
    fn uniform(
        &mut self,
        algorithm: Algorithm,
        tag_base: u64,
        send: &[u8],
        recv: &mut [u8],
        block: usize,
        scratch: &mut Vec<u8>,
        call: Call,
    ) -> Result<Algorithm> {
        let ctx = Ctx {
            topology: &self.topology,
            options: &self.options,
            rank: self.rank,
        };
        let schedule = self.policy.schedule(&ctx, algorithm, block)?;
        let scratch = sized(scratch, schedule.scratch_len());
        let opts = exec_options(self.timeout, &self.abort);
        self.backend.run(
            schedule,
            tag_base,
            Buffers {
                send,
                recv,
                scratch,
                call,
            },
            &opts,
        )?;
        self.last = Some(algorithm);
        Ok(algorithm)
    }
}

/// The element type code of a call's descriptor for `E` ([`halo_collectives::DTYPE_NAMES`]:
/// `haloDataType` + 1 for the types a reduction takes, 0 for any other).
pub(crate) fn dtype_code<E: 'static>() -> u8 {
    use std::any::TypeId;
    let t = TypeId::of::<E>();
    let codes: [(TypeId, u8); 10] = [
        (TypeId::of::<i8>(), 1),
        (TypeId::of::<u8>(), 2),
        (TypeId::of::<i32>(), 3),
        (TypeId::of::<u32>(), 4),
        (TypeId::of::<i64>(), 5),
        (TypeId::of::<u64>(), 6),
        (TypeId::of::<half::f16>(), 7),
        (TypeId::of::<f32>(), 8),
        (TypeId::of::<f64>(), 9),
        (TypeId::of::<half::bf16>(), 10),
    ];
    codes.iter().find(|(id, _)| *id == t).map_or(0, |&(_, c)| c)
}

/// The descriptor of a call of `kind` moving `bytes` (see [`halo_collectives::Call`]).
pub(crate) fn call_of(kind: CallKind, bytes: usize) -> Call {
    Call::new(kind).count(bytes)
}

impl Communicator {
    pub(crate) fn from_local(transport: LocalTransport, topology: Arc<Topology>) -> Self {
        use halo_collectives::Transport as _;
        let (rank, size) = (transport.rank(), transport.size());
        Self::from_backend(Backend::Local(transport), rank, size, topology)
    }

    pub(crate) fn from_backend(
        backend: Backend,
        rank: usize,
        size: usize,
        topology: Arc<Topology>,
    ) -> Self {
        Communicator {
            core: Core {
                rank,
                size,
                topology,
                backend,
                seq: 0,
                options: AlgoOptions::default(),
                timeout: DEFAULT_TIMEOUT,
                abort: AbortHandle::default(),
                policy: Policy::default(),
                last: None,
                comm_tag: 0,
                ext: Ext::default(),
            },
            pool: Pool::default(),
        }
    }

    /// This rank, `0..size()`.
    pub fn rank(&self) -> usize {
        self.core.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.core.size
    }

    /// The machine model the ranks are placed in.
    pub fn topology(&self) -> &Topology {
        &self.core.topology
    }

    /// Forces an algorithm (`None`: choose automatically by the cost model, the default).
    /// Every rank must make the same choice.
    pub fn set_algorithm(&mut self, algorithm: Option<Algorithm>) {
        self.core.policy.forced_mut().all_to_all = algorithm;
    }

    /// The forced algorithm, if any.
    pub fn algorithm(&self) -> Option<Algorithm> {
        self.core.policy.forced().all_to_all
    }

    /// The algorithm the last collective's data pass ran with ([`Algorithm::Flat`] for
    /// an all-to-all-v whose blocks all went with the counts, see
    /// [`Communicator::eager_v`]).
    pub fn last_algorithm(&self) -> Option<Algorithm> {
        self.core.last
    }

    /// Sets the builders' knobs (chunk size, HALO's levels). Every rank must set the same.
    pub fn set_algo_options(&mut self, options: AlgoOptions) {
        self.core.options = options;
        self.core.policy.reset();
        self.core.ext.waves = None;
        self.pool.v.reset();
    }

    /// The builders' knobs.
    pub fn algo_options(&self) -> &AlgoOptions {
        &self.core.options
    }

    /// Sets the time one collective pass may take before it fails with [`Error::Timeout`].
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.core.timeout = timeout;
    }

    /// The per-operation timeout ([`DEFAULT_TIMEOUT`] unless set).
    pub fn timeout(&self) -> Duration {
        self.core.timeout
    }

    /// A handle that aborts this communicator from any thread.
    pub fn abort_handle(&self) -> AbortHandle {
        self.core.abort.clone()
    }

    /// Aborts this communicator: every later call returns [`Error::Aborted`].
    pub fn abort(&self) {
        self.core.abort.abort();
    }

    /// Whether the communicator was aborted.
    pub fn is_aborted(&self) -> bool {
        self.core.abort.is_aborted()
    }

    /// The in-process transport's link emulation, if this communicator runs on it.
    pub fn emulation(&self) -> Option<crate::transport::emulation::Emulation> {
        match &self.core.backend {
            Backend::Local(t) => Some(t.emulation()),
            Backend::Fabric(_) | Backend::Shm(_) | Backend::Hybrid(_) => None,
            Backend::Shared(s) => s.emulation(),
        }
    }
}

/// State of the point-to-point, all-gather and all-reduce calls, per communicator.
#[derive(Debug, Default)]
pub(crate) struct Ext {
    /// Messages sent to / received from each rank (point-to-point).
    pub(super) sent: Vec<u64>,
    pub(super) received: Vec<u64>,
    /// Point-to-point counts of tags other than 0: (sent, peer, tag) -> messages.
    pub(super) tagged: HashMap<(bool, usize, u32), u64>,
    /// Point-to-point messages this rank sent itself, in order, with their tags.
    pub(super) to_self: VecDeque<(u32, Vec<u8>)>,
    /// One-step schedules of lone sends and receives: (is send, peer, bytes).
    pub(super) p2p: Vec<((bool, usize, usize), Schedule)>,
    /// All-reduce receive buffer (`u64` words: aligned for every element type).
    pub(super) tmp: Vec<u64>,
    /// Reduce-scatter accumulator (a copy of the send buffer, `u64` words).
    pub(super) reduce_scatter_acc: Vec<u64>,
    pub(super) gather_scratch: Vec<u8>,
    /// The staged bytes of a batch of sends and of receives (`p2p_batch`), kept.
    pub(super) batch_send: Vec<u8>,
    pub(super) batch_recv: Vec<u8>,
    pub(super) p2p_stats: p2p::P2pStats,
    /// The worker thread of [`Communicator::scope`], once one ran.
    pub(super) pool: Option<Arc<rayon_core::ThreadPool>>,
    /// The device path's last uniform plan (algorithm, block bytes) and its state.
    pub(super) waves: Option<(Algorithm, usize, Arc<waves::WavePlan>)>,
    pub(super) device: Option<Box<crate::transport::device::DeviceState>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The barrier's default by topology: flat on one host up to the bound, Bruck's
    /// with more ranks there or across hosts.
    #[test]
    fn the_barrier_is_flat_on_one_small_host_and_bruck_elsewhere() {
        let on = |spec: &str| default_barrier(&Topology::preset(spec).unwrap());
        assert_eq!(on("flat:2"), Algorithm::Flat);
        assert_eq!(
            on(&format!("flat:{FLAT_BARRIER_MAX_RANKS}")),
            Algorithm::Flat
        );
        assert_eq!(
            on(&format!("flat:{}", FLAT_BARRIER_MAX_RANKS + 1)),
            Algorithm::Bruck
        );
        assert_eq!(on("nodes:2x2"), Algorithm::Bruck);
        assert_eq!(on("nodes:4x4"), Algorithm::Bruck);
    }
}
