//! The libfabric transport: ranks as processes, tagged messages over RDM endpoints.
//!
//! Each rank opens up to two endpoints: `shm` for the ranks on its own host and a
//! network provider (`tcp;ofi_rxm` here, `cxi` on Slingshot) for the others; the
//! choice is made per peer from the host names exchanged at bootstrap, and
//! `HALO_FABRIC_PROVIDER` forces one provider for every peer. Shared memory reaches
//! across network namespaces, so per-peer choice is what keeps emulated hosts honest:
//! ranks on different hosts always talk over the network provider.
//!
//! Endpoints are `FI_EP_RDM` with `FI_TAGGED` and `FI_DIRECTED_RECV`, an `FI_AV_TABLE`
//! address vector (peers inserted in rank order) and manual progress: completion queues
//! are read whenever the engine progresses or waits. Buffers are registered per
//! collective only where the provider's `mr_mode` asks for it (`FI_MR_LOCAL`). Each
//! posted operation carries an `fi_context2` from a pool owned by the transport, so
//! steady-state calls allocate nothing per message.
//!
//! # Posting never blocks
//! A post refused with `-FI_EAGAIN` (RxM connects lazily, and with both providers the
//! first send to a peer is refused until that peer reads its completion queue) is kept
//! in a backlog and retried, in order per peer, every time the engine progresses. So a
//! post never waits: the engine's timeout and [`crate::AbortHandle`] apply to refused
//! posts as to everything else, and the receives of a step are posted while its sends
//! wait for their connections.
//!
//! # Waiting (`HALO_PROGRESS`)
//! When nothing completes the engine spins briefly, then calls [`Session::wait`] with a
//! growing bound (1 us up to 1 ms). What the wait does is [`FabricProgress`]: `block`
//! (the default: yield below 50 us, then sleep until there is something to do — on the
//! network completion queue's file descriptor where the provider has one, which
//! `tcp;ofi_rxm` does, and on a futex doorbell in shared memory that same-host peers
//! ring, because `shm` in libfabric 1.17 has no wait object), `sleep` (yield below
//! 50 us, else sleep up to 200 us), `yield` (always `sched_yield`) or `spin` (return at
//! once). Measured in docs/bench/JOURNAL.md, "Progress under oversubscription (fabric
//! transport)".
//!
//! # Failures
//! - A peer on the same host (same host name and PID namespace) whose process has
//!   ended is noticed while waiting for it: the collective fails with
//!   [`CollectiveError::Remote`] naming it within about 50 ms, instead of at the
//!   timeout. Peers on other hosts are noticed through the provider's error
//!   completions or, failing that, at the timeout ([`CollectiveError::Timeout`]).
//! - A collective that fails on this rank (an error, the timeout, an abort: anything
//!   that leaves operations outstanding) leaves the transport *broken*: what was
//!   posted is cancelled, the endpoints are closed (so the provider can no longer
//!   touch the caller's buffers, and network peers see the connections go), and every
//!   later collective fails at once with [`CollectiveError::InvalidUsage`] saying why.
//!   As after an NCCL error, the communicator must be dropped and a new one created.
//! - `shm` keeps its queues under spin locks in shared memory. A peer killed while it
//!   holds one leaves the next call that needs the lock spinning inside libfabric,
//!   beyond the reach of timeouts and `abort()` (seen in about 1 of 100 kills during
//!   the first collective). A watchdog thread ends such a process: a libfabric call
//!   that has not returned for `HALO_WATCHDOG_MS` (default 3000; 0 turns it off) makes
//!   it print what is stuck and which same-host peers have ended, and exit with status
//!   1, as NCCL's watchdog does in PyTorch.
//! - A killed rank leaves its `shm` region `/dev/shm/PID:N:M` behind, and a later
//!   process that gets the same id could not create its own (`fi_enable`: `EBUSY`):
//!   before its first `shm` endpoint a process removes such files of its own id that
//!   are older than itself. Doorbell files of dead processes are removed likewise.
//!
//! When the provider is `cxi`, HPE's recommended settings for collective libraries are
//! applied unless the user set them (docs/REFERENCE.md §2): `FI_MR_CACHE_MONITOR=userfaultfd`,
//! `FI_CXI_DEFAULT_CQ_SIZE=131072`, `FI_CXI_DEFAULT_TX_SIZE=2048`,
//! `FI_CXI_RDZV_PROTO=alt_read`, `FI_CXI_RX_MATCH_MODE=hybrid`.
//!
//! # Files
//! - `transport.rs`: [`FabricTransport`] — opening, connecting, the operation pool and
//!   its [`Transport`](halo_collectives::Transport) impl; `completion.rs`: reading the
//!   completion queues, cancelling, breaking down after a failure, blocking on the
//!   queues' descriptors.
//! - `session.rs`: [`FabricSession`](session::FabricSession) — posting, the backlog of
//!   refused posts, waiting.
//! - `endpoint.rs`: `fi_getinfo` and one provider's endpoint (open, address checks and
//!   insertion, memory registration, close).
//! - `bell.rs`: the doorbell's file and mapping (the futex word and its protocol are
//!   `host::futex`, its name `host::files`); `watchdog.rs`: the watchdog; `stale.rs`:
//!   stale `/dev/shm` regions (same-host peers' processes in `/proc` are `host::proc`,
//!   shared with the rings); `signals.rs`: PSM's crash signal handlers.
//!
//! The bootstrap card and the exchange that brings a transport up live in
//! `crate::bootstrap` (`card.rs`, `job.rs`).
//!
//! [`Session::wait`]: halo_collectives::Session::wait
//! [`CollectiveError::Remote`]: halo_collectives::CollectiveError::Remote
//! [`CollectiveError::Timeout`]: halo_collectives::CollectiveError::Timeout
//! [`CollectiveError::InvalidUsage`]: halo_collectives::CollectiveError::InvalidUsage

mod bell;
mod completion;
mod endpoint;
mod session;
mod signals;
mod stale;
mod transport;
mod watchdog;

pub(crate) use endpoint::MAX_NAME;
pub(crate) use session::FabricSession;
pub(crate) use transport::FabricTransport;

use crate::error::{Error, Result};
use crate::host::wait::WaitPolicy;
use crate::transport::CResult;
use halo_fabric_sys as fi;
use std::ffi::{CStr, c_char};
use std::time::Duration;
use watchdog::WATCHDOG_DEFAULT;

/// `-FI_EAGAIN`: try again (a post refused for now, or an empty queue).
const EAGAIN: isize = -(fi::FI_EAGAIN as isize);
/// `-FI_EAVAIL`: an error completion is waiting.
const EAVAIL: isize = -(fi::FI_EAVAIL as isize);

/// A libfabric error code as [`Error::SystemError`], naming the call.
fn fi_err(what: &str, ret: isize) -> Error {
    Error::SystemError {
        message: format!("{what}: {} ({ret})", fi::strerror(ret as i64)),
    }
}

/// `Err` for a negative libfabric return code.
fn check(ret: isize, what: &str) -> Result<()> {
    if ret < 0 {
        Err(fi_err(what, ret))
    } else {
        Ok(())
    }
}

/// A libfabric (or loader) string, empty for NULL.
fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libfabric's string fields are NUL-terminated and live as long as their info.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Endpoint slot for peers on this host.
pub(crate) const LOCAL: usize = 0;
/// Endpoint slot for peers on other hosts.
pub(crate) const NET: usize = 1;

/// How `sleep` and `block` wait, measured by the bound the engine gives the wait: below
/// 50 us they only yield (a sleep costs a system call and its granularity is tens of
/// microseconds: timer slack); the longest single sleep of `sleep` (and of `block`
/// where an endpoint has no file descriptor to block on) is 200 us.
const WAIT: WaitPolicy = WaitPolicy {
    spin: Duration::ZERO,
    yield_below: Duration::from_micros(50),
    sleep_max: Duration::from_micros(200),
};

/// What a rank does while it waits for completions (`HALO_PROGRESS`).
///
/// The engine first polls without pause (`ExecOptions::spin` times, 4 by default),
/// then calls the transport's wait with a bound that grows from 1 us to 1 ms; this is
/// what that wait does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FabricProgress {
    /// Return at once: poll without pause. Lowest latency with a core per rank;
    /// oversubscribed, a spinning rank takes the processor from the peer it waits for.
    Spin,
    /// `sched_yield` between polls.
    Yield,
    /// Yield while the bound is below 50 us, then sleep up to 200 us at a time.
    Sleep,
    /// The default. As `sleep`, but the sleep ends as soon as there is something to
    /// do: on the network completion queue's file descriptor (`FI_WAIT_FD`,
    /// `fi_trywait`, `ppoll`) where the provider has one (`tcp;ofi_rxm`), and for
    /// same-host peers (`shm` has no wait object in libfabric 1.17) on a futex
    /// "doorbell" in shared memory that peers ring when they hand this rank a message.
    /// Waits only for the network sleep until woken (up to the engine's 1 ms bound).
    #[default]
    Block,
}

impl std::str::FromStr for FabricProgress {
    type Err = Error;

    fn from_str(s: &str) -> Result<FabricProgress> {
        match s.trim() {
            "spin" => Ok(FabricProgress::Spin),
            "yield" => Ok(FabricProgress::Yield),
            "sleep" => Ok(FabricProgress::Sleep),
            "block" => Ok(FabricProgress::Block),
            other => Err(Error::invalid_argument(format!(
                "HALO_PROGRESS={other:?}: expected spin, yield, sleep or block"
            ))),
        }
    }
}

impl std::fmt::Display for FabricProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FabricProgress::Spin => "spin",
            FabricProgress::Yield => "yield",
            FabricProgress::Sleep => "sleep",
            FabricProgress::Block => "block",
        })
    }
}

/// Provider choice for a job.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FabricConfig {
    /// Provider for peers on the same host (`shm`); `None` sends everything over the network provider.
    pub local_provider: Option<String>,
    /// Provider for peers on other hosts (`tcp;ofi_rxm`; `cxi` on Slingshot).
    pub net_provider: String,
    /// Local IP the network provider binds (default: the address that routes to the bootstrap root).
    pub addr: Option<std::net::IpAddr>,
    /// How long one post may keep being refused with -FI_EAGAIN before the collective
    /// fails (the collective's own timeout applies as well).
    pub post_timeout: Duration,
    /// What a rank does while it waits (`HALO_PROGRESS`).
    pub progress: FabricProgress,
    /// How long one libfabric call may run before the watchdog ends the process
    /// (`HALO_WATCHDOG_MS`, default 3 s; zero: no watchdog). See the module notes.
    pub watchdog: Duration,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            local_provider: Some("shm".into()),
            net_provider: "tcp;ofi_rxm".into(),
            addr: None,
            post_timeout: Duration::from_secs(60),
            progress: FabricProgress::default(),
            watchdog: WATCHDOG_DEFAULT,
        }
    }
}

impl FabricConfig {
    /// The default, changed by `HALO_FABRIC_PROVIDER` (one provider for every peer,
    /// e.g. `tcp;ofi_rxm` or `shm`), `HALO_FABRIC_NET_PROVIDER` (the network provider
    /// only), `HALO_FABRIC_ADDR` (the IP the network provider binds), `HALO_PROGRESS`
    /// (`spin`, `yield`, `sleep` or `block`; see [`FabricProgress`]) and
    /// `HALO_WATCHDOG_MS`.
    pub fn from_env() -> Result<Self> {
        let mut c = FabricConfig::default();
        if let Some(p) = halo_params::FABRIC_PROVIDER.raw() {
            c.force(&p);
        }
        if let Some(p) = halo_params::FABRIC_NET_PROVIDER.raw() {
            c.net_provider = p;
        }
        if let Some(a) = halo_params::FABRIC_ADDR.raw() {
            c.addr = Some(a.parse().map_err(|_| {
                Error::invalid_argument(format!("HALO_FABRIC_ADDR={a:?} is not an IP address"))
            })?);
        }
        if let Some(p) = halo_params::PROGRESS.raw() {
            c.progress = p.parse()?;
        }
        if let Some(ms) = halo_params::WATCHDOG_MS
            .number()
            .map_err(|e| Error::invalid_argument(e.to_string()))?
        {
            c.watchdog = Duration::from_millis(ms);
        }
        Ok(c)
    }

    /// Uses one provider for every peer.
    pub fn force(&mut self, provider: &str) {
        self.local_provider = None;
        self.net_provider = provider.to_string();
    }
}
