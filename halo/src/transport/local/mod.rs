//! The in-process transport: ranks as threads of one process.
//!
//! [`LocalCluster::new`] creates the endpoints of `N` ranks over a [`Topology`]
//! ([`LocalTransport`], one per rank); `crate::local` (the thread launcher above the
//! communicator) makes them communicators and runs one thread per rank. With
//! [`Emulation`] on, the transport also shows a cluster's *shape* (latency per link
//! class, a NIC shared by a node's ranks).
//!
//! # How a message moves (zero extra copy, rendezvous)
//!
//! A send publishes a *descriptor* — the address and length of the sender's region,
//! the tag and a state word — into the receiver's mailbox (a lock-free queue) and
//! wakes the receiver. The receiver matches descriptors on (source, full tag) against
//! its pre-posted receives (unexpected ones wait in a per-endpoint table, also across
//! collectives), claims the descriptor, copies the bytes straight from the sender's
//! buffer into its own region, marks the descriptor done and acknowledges it to the
//! sender, whose send completes then. One copy per message, no intermediate buffer.
//!
//! Because a peer reads the sender's memory, a descriptor must never outlive the
//! buffers it points into. A session borrows the buffers for its lifetime, and
//! dropping it withdraws every descriptor no receiver has claimed (an atomic
//! `posted -> withdrawn` transition the receiver respects) and waits for the copies
//! already claimed, which are plain memory copies and finish promptly. The session
//! type is private to the crate and only the [`Communicator`](crate::Communicator)
//! opens sessions, always dropping them before its call returns, so no `mem::forget`
//! can defeat that.
//!
//! A descriptor also carries its call's descriptor (`halo_collectives::Call`): a
//! receiver whose call differs refuses it — on matching, and for a message of the same
//! call (its tag's sequence number) whatever its tag, as it arrives or among those kept
//! from earlier calls — and the refusal fails the sender with the same words.
//!
//! A rank whose endpoint is dropped (its thread returned or panicked) is marked gone;
//! peers waiting on it get [`crate::Error::RemoteError`] instead of waiting for the
//! timeout.

pub use super::emulation::Emulation;
use super::emulation::LinkModel;
use super::{Expected, mismatch, poisoned};
use crate::error::{Error, Result};
use crate::host::wait::{Step, WaitPolicy};
use crate::transport::CResult;
use crossbeam::queue::SegQueue;
use crossbeam::sync::{Parker, Unparker};
use halo_collectives::{Buf, Buffers, Call, CollectiveError, Region, Session, TAG_BITS, Transport};
use halo_topology::Topology;
use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod session;

/// How a session waits, measured by how long it may wait (the engine's bound or the
/// next modelled arrival): waits shorter than 100 us yield the processor instead of
/// sleeping; a longer one parks the thread for all of it.
const WAIT: WaitPolicy = WaitPolicy {
    spin: Duration::ZERO,
    yield_below: Duration::from_micros(100),
    sleep_max: Duration::MAX,
};

/// Descriptor states.
const POSTED: u8 = 0;
const CLAIMED: u8 = 1;
const DONE: u8 = 2;
const WITHDRAWN: u8 = 3;
const REJECTED: u8 = 4;

/// A send, as the receiver sees it.
#[derive(Debug)]
struct Desc {
    src: u32,
    tag: u64,
    ptr: *const u8,
    len: usize,
    /// The descriptor of the sender's call ([`Buffers::call`]; with poison, of the call
    /// the poisoner failed).
    call: Call,
    /// A poison message ([`Session::post_poison`]): no bytes (`ptr` is null), the
    /// sender failed and will not send the real one. It may outlive the sender's
    /// session (it points at nothing), so nobody waits for its claim.
    poison: bool,
    /// Modelled arrival, ns since the cluster's epoch (0 without emulation).
    arrival: u64,
    /// The sender's session and the send's token, for the acknowledgement.
    session: u64,
    token: u32,
    state: AtomicU8,
}

// SAFETY: `ptr` is only dereferenced by a receiver after it moved `state` from POSTED
// to CLAIMED; the sender keeps the memory alive (its session borrows the buffer) until
// the descriptor is DONE, REJECTED or WITHDRAWN, and its session's drop waits for a
// CLAIMED descriptor to leave that state. The remaining fields are plain data and
// atomics, so sharing the descriptor between threads is sound.
unsafe impl Send for Desc {}
// SAFETY: as for `Send`: all access to the memory behind `ptr` is ordered by `state`.
unsafe impl Sync for Desc {}

/// A receiver's answer to a send.
#[derive(Debug, Clone, Copy)]
struct Ack {
    session: u64,
    token: u32,
    /// `None`: received; `Some(view)`: rejected, the receiver expected another message.
    rejected: Option<Expected>,
}

/// What other ranks see of one endpoint.
#[derive(Debug)]
struct Mailbox {
    incoming: SegQueue<Arc<Desc>>,
    acks: SegQueue<Ack>,
    unparker: Unparker,
    alive: AtomicBool,
}

/// What every endpoint of a cluster shares.
#[derive(Debug)]
struct Shared {
    topology: Arc<Topology>,
    mailboxes: Box<[Mailbox]>,
    model: Option<LinkModel>,
    emulation: Emulation,
    epoch: Instant,
    sessions: AtomicU64,
    traffic: Traffic,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Ranks of one process, connected by the in-process transport.
///
/// ```
/// use halo::local::{Emulation, LocalCluster};
/// use halo::topology::Topology;
///
/// let cluster = LocalCluster::new(Topology::preset("nodes:2x2").unwrap(), Emulation::off()).unwrap();
/// let comms = cluster.into_communicators();
/// assert_eq!(comms.len(), 4);
/// ```
#[derive(Debug)]
pub struct LocalCluster {
    shared: Arc<Shared>,
    parkers: Vec<Parker>,
}

impl LocalCluster {
    /// One endpoint per rank of `topology`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the emulation's figures are not finite and non-negative.
    pub fn new(topology: Topology, emulation: Emulation) -> Result<Self> {
        emulation.check().map_err(Error::invalid_argument)?;
        let n = topology.size();
        let parkers: Vec<Parker> = (0..n).map(|_| Parker::new()).collect();
        let mailboxes = parkers
            .iter()
            .map(|p| Mailbox {
                incoming: SegQueue::new(),
                acks: SegQueue::new(),
                unparker: p.unparker().clone(),
                alive: AtomicBool::new(true),
            })
            .collect();
        let model = emulation
            .enabled
            .then(|| LinkModel::new(&topology, &emulation));
        Ok(LocalCluster {
            shared: Arc::new(Shared {
                topology: Arc::new(topology),
                mailboxes,
                model,
                emulation,
                epoch: Instant::now(),
                sessions: AtomicU64::new(1),
                traffic: Traffic::new(n),
            }),
            parkers,
        })
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.parkers.len()
    }

    /// The topology the ranks are placed in.
    pub fn topology(&self) -> &Topology {
        &self.shared.topology
    }

    /// The link emulation.
    pub fn emulation(&self) -> Emulation {
        self.shared.emulation
    }

    /// The modelled time of one message of `bytes` from `src` to `dst` on an idle
    /// network (zero without emulation).
    ///
    /// # Panics
    /// If `src` or `dst` is not a rank of the cluster.
    pub fn modelled_time(&self, src: usize, dst: usize, bytes: usize) -> Duration {
        match &self.shared.model {
            Some(m) => m.idle_time(&self.shared.topology, src, dst, bytes),
            None => Duration::ZERO,
        }
    }

    /// The cluster's traffic counters (bytes and messages sent, by the level at which
    /// sender and receiver meet). The handle stays valid after
    /// [`LocalCluster::into_communicators`] and after the ranks are gone.
    pub fn traffic(&self) -> Traffic {
        self.shared.traffic.clone()
    }

    /// The topology, shared, and one endpoint per rank, in rank order
    /// (`crate::local` makes each a communicator).
    pub(crate) fn into_transports(self) -> (Arc<Topology>, Vec<LocalTransport>) {
        let shared = self.shared;
        let transports = self
            .parkers
            .into_iter()
            .enumerate()
            .map(|(rank, parker)| LocalTransport {
                rank,
                shared: Arc::clone(&shared),
                parker,
                unexpected: HashMap::new(),
                pool: SessionPool::default(),
            })
            .collect();
        (Arc::clone(&shared.topology), transports)
    }
}

/// Bytes and messages the ranks of a [`LocalCluster`] sent, by the level of the
/// topology at which sender and receiver meet (a rank's sends to itself meet at
/// `Device`). Every posted send counts once, with its full length, when it is posted;
/// control traffic (the count and agreement passes of `all_to_all_v`) included.
///
/// ```
/// use halo::local::{Emulation, LocalCluster};
/// use halo::topology::{Level, Topology};
///
/// let cluster = LocalCluster::new(Topology::preset("nodes:2x2").unwrap(), Emulation::off()).unwrap();
/// let traffic = cluster.traffic();
/// let out = cluster.run(|comm| {
///     let send = vec![comm.rank() as u8; 8 * comm.size()];
///     let mut recv = vec![0u8; 8 * comm.size()];
///     comm.set_algorithm(Some(halo::Algorithm::Pairwise));
///     comm.all_to_all(&send, &mut recv)
/// });
/// assert!(out.iter().all(|r| r.is_ok()));
/// // 4 ranks x 2 ranks on the other node x 8 bytes.
/// assert_eq!(traffic.bytes_crossing(Level::Node), 64);
/// ```
#[derive(Debug, Clone)]
pub struct Traffic(Arc<TrafficCounts>);

#[derive(Debug)]
struct TrafficCounts {
    /// `[sender][level]`, levels as in [`halo_topology::Level::ALL`].
    bytes: Box<[[AtomicU64; LEVELS]]>,
    messages: Box<[[AtomicU64; LEVELS]]>,
}

const LEVELS: usize = halo_topology::Level::ALL.len();

impl Traffic {
    fn new(ranks: usize) -> Self {
        let zero = || -> [AtomicU64; LEVELS] { std::array::from_fn(|_| AtomicU64::new(0)) };
        Traffic(Arc::new(TrafficCounts {
            bytes: (0..ranks).map(|_| zero()).collect(),
            messages: (0..ranks).map(|_| zero()).collect(),
        }))
    }

    fn record(&self, topology: &Topology, src: usize, dst: usize, bytes: usize) {
        let level = topology.meet(src, dst) as usize;
        self.0.bytes[src][level].fetch_add(bytes as u64, Ordering::Relaxed);
        self.0.messages[src][level].fetch_add(1, Ordering::Relaxed);
    }

    fn sum(table: &[[AtomicU64; LEVELS]], above: halo_topology::Level) -> u64 {
        table
            .iter()
            .flat_map(|row| row[above as usize + 1..].iter())
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Bytes sent between ranks that are in different domains at `level` (for
    /// `Level::Node`: the bytes that crossed a node boundary).
    pub fn bytes_crossing(&self, level: halo_topology::Level) -> u64 {
        Self::sum(&self.0.bytes, level)
    }

    /// Messages sent between ranks that are in different domains at `level`.
    pub fn messages_crossing(&self, level: halo_topology::Level) -> u64 {
        Self::sum(&self.0.messages, level)
    }

    /// Bytes sent by rank `src` (to itself included).
    ///
    /// # Panics
    /// If `src` is not a rank of the cluster.
    pub fn bytes_sent_by(&self, src: usize) -> u64 {
        self.0.bytes[src]
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

/// Collections a session needs, kept between sessions so that steady state does not
/// allocate them again.
#[derive(Debug, Default)]
struct SessionPool {
    posted: HashMap<(u32, u64), PostedRecv>,
    sends: HashMap<u32, OutSend>,
    arriving: Vec<(u64, (u32, u64))>,
    ready: Vec<u32>,
    live_sends: Vec<(u32, Region)>,
    gone: Vec<bool>,
    /// The lengths of messages that completed receives posted with
    /// `Session::post_recv_up_to`, by token, until asked.
    lens: Vec<(u32, usize)>,
}

#[derive(Debug, Clone, Copy)]
struct PostedRecv {
    region: Region,
    token: u32,
    /// A shorter message completes it too (`Session::post_recv_up_to`).
    up_to: bool,
}

#[derive(Debug)]
struct OutSend {
    desc: Arc<Desc>,
    peer: u32,
}

/// One rank's endpoint of a [`LocalCluster`]: implements the collectives' transport.
#[derive(Debug)]
pub(crate) struct LocalTransport {
    rank: usize,
    shared: Arc<Shared>,
    parker: Parker,
    /// Descriptors that arrived before their receive was posted, by (source, full tag).
    unexpected: HashMap<(u32, u64), VecDeque<Arc<Desc>>>,
    pool: SessionPool,
}

impl LocalTransport {
    pub(crate) fn emulation(&self) -> Emulation {
        self.shared.emulation
    }
}

impl Drop for LocalTransport {
    fn drop(&mut self) {
        let me = &self.shared.mailboxes[self.rank];
        me.alive.store(false, Ordering::Release);
        for (q, m) in self.shared.mailboxes.iter().enumerate() {
            if q != self.rank {
                m.unparker.unpark();
            }
        }
    }
}

impl Transport for LocalTransport {
    type Session<'a> = LocalSession<'a>;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.mailboxes.len()
    }

    fn begin<'a>(&'a mut self, tag_base: u64, bufs: Buffers<'a>) -> CResult<LocalSession<'a>> {
        // Forget descriptors their senders withdrew (a failed earlier collective), and
        // poison of other collectives (the tag's sequence number wraps).
        self.unexpected.retain(|_, q| {
            q.retain(|d| {
                d.state.load(Ordering::Acquire) != WITHDRAWN
                    && !(d.poison && d.tag >> TAG_BITS != tag_base >> TAG_BITS)
            });
            !q.is_empty()
        });
        let pool = std::mem::take(&mut self.pool);
        let id = self.shared.sessions.fetch_add(1, Ordering::Relaxed);
        Ok(LocalSession {
            id,
            tag_base,
            call: bufs.call,
            scanned: false,
            mismatch: false,
            send: (bufs.send.as_ptr(), bufs.send.len()),
            recv: (bufs.recv.as_mut_ptr(), bufs.recv.len()),
            scratch: (bufs.scratch.as_mut_ptr(), bufs.scratch.len()),
            ep: self,
            pool,
            _bufs: PhantomData,
        })
    }
}

/// One collective's use of the caller's buffers on a [`LocalTransport`].
///
/// The buffers are held as raw pointers taken once at [`Transport::begin`]: peers read
/// send regions through descriptors while this rank writes other regions, so no
/// reference to a whole buffer may be created again while the session lives.
#[derive(Debug)]
pub(crate) struct LocalSession<'a> {
    id: u64,
    tag_base: u64,
    /// The descriptor of this call ([`Buffers::call`]).
    call: Call,
    /// Whether the descriptors kept from earlier calls were looked at for messages of
    /// this one made by a rank whose call differs.
    scanned: bool,
    /// Whether this session failed on a size mismatch: its drop then sends poison in
    /// place of the sends it withdraws ([`Session::post_poison`]).
    mismatch: bool,
    send: (*const u8, usize),
    recv: (*mut u8, usize),
    scratch: (*mut u8, usize),
    ep: &'a mut LocalTransport,
    pool: SessionPool,
    /// The session borrows the caller's buffers for `'a`.
    _bufs: PhantomData<(&'a [u8], &'a mut [u8], &'a mut [u8])>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::testing::{a_longer_message_is_a_mismatch, receives_up_to};

    /// The transports of a two-rank cluster, one per thread, running `f`.
    fn on_two(f: impl Fn(&mut LocalTransport) + Sync) {
        let topo = Topology::preset("nodes:1x2").unwrap();
        let (_, transports) = LocalCluster::new(topo, Emulation::off())
            .unwrap()
            .into_transports();
        std::thread::scope(|s| {
            for mut t in transports {
                let f = &f;
                s.spawn(move || f(&mut t));
            }
        });
    }

    #[test]
    fn receives_up_to_a_length_take_shorter_messages_and_tell_their_length() {
        for late in [false, true] {
            on_two(|t| receives_up_to(t, late));
        }
        on_two(a_longer_message_is_a_mismatch);
    }
}
