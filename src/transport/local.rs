//! The in-process transport: ranks as threads of one process.
//!
//! [`LocalCluster::new`] creates the endpoints of `N` ranks over a [`Topology`];
//! [`run`] spawns one thread per rank, each with its [`Communicator`], and collects
//! what they return. Used by the tests, the benchmarks (`halo bench` without a
//! cluster) and anyone who wants to see a collective's behaviour on one machine; with
//! [`Emulation`] on, it also shows a cluster's *shape* (latency per link class, a NIC
//! shared by a node's ranks).
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
//! type is private to the crate and only the [`Communicator`] opens sessions, always
//! dropping them before its call returns, so no `mem::forget` can defeat that.
//!
//! A rank whose endpoint is dropped (its thread returned or panicked) is marked gone;
//! peers waiting on it get [`crate::Error::RemoteError`] instead of waiting for the
//! timeout.

pub use super::emulation::Emulation;
use super::emulation::LinkModel;
use super::{Expected, mismatch, poisoned};
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crossbeam::queue::SegQueue;
use crossbeam::sync::{Parker, Unparker};
use halo_collectives::{Buf, Buffers, CollectiveError, Region, Session, TAG_BITS, Transport};
use halo_topology::Topology;
use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

type CResult<T> = std::result::Result<T, CollectiveError>;

/// Waits shorter than this yield the processor instead of sleeping.
const YIELD_BELOW: Duration = Duration::from_micros(YIELD_BELOW_US);
const YIELD_BELOW_US: u64 = 100;

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
    /// The block size of the sender's uniform call ([`Buffers::block`]).
    block: Option<usize>,
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

    /// One communicator per rank, in rank order. Move each to its own thread.
    pub fn into_communicators(self) -> Vec<Communicator> {
        let shared = self.shared;
        self.parkers
            .into_iter()
            .enumerate()
            .map(|(rank, parker)| {
                let transport = LocalTransport {
                    rank,
                    shared: Arc::clone(&shared),
                    parker,
                    unexpected: HashMap::new(),
                    pool: SessionPool::default(),
                };
                Communicator::from_local(transport, Arc::clone(&shared.topology))
            })
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
    let comms = cluster.into_communicators();
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
}

#[derive(Debug, Clone, Copy)]
struct PostedRecv {
    region: Region,
    token: u32,
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
            block: bufs.block,
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
    /// The block size of this call ([`Buffers::block`]).
    block: Option<usize>,
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

impl LocalSession<'_> {
    fn me(&self) -> usize {
        self.ep.rank
    }

    fn size(&self) -> usize {
        self.ep.shared.mailboxes.len()
    }

    fn full_tag(&self, tag: u64) -> CResult<u64> {
        if tag >> TAG_BITS != 0 {
            return Err(CollectiveError::Internal(format!(
                "tag {tag:#x} does not fit in {TAG_BITS} bits"
            )));
        }
        Ok(self.tag_base | tag)
    }

    fn check_peer(&self, peer: usize) -> CResult<()> {
        if peer >= self.size() {
            return Err(CollectiveError::Internal(format!(
                "peer {peer} out of range for {} ranks",
                self.size()
            )));
        }
        Ok(())
    }

    /// The address of `region`, bounds-checked, and whether it may be written.
    fn locate(&self, region: Region) -> CResult<(*mut u8, bool)> {
        let (base, len, writable) = match region.buf {
            Buf::Send => (self.send.0.cast_mut(), self.send.1, false),
            Buf::Recv => (self.recv.0, self.recv.1, true),
            Buf::Scratch => (self.scratch.0, self.scratch.1, true),
        };
        match region.offset.checked_add(region.len) {
            Some(end) if end <= len => {}
            _ => {
                return Err(CollectiveError::Internal(format!(
                    "region {region} is outside the {} buffer of {len} bytes",
                    region.buf
                )));
            }
        }
        // SAFETY: `offset + len <= buffer length` was checked just above, so the result
        // stays inside (or one past the end of) the caller's buffer.
        Ok((unsafe { base.add(region.offset) }, writable))
    }

    /// A region this rank is about to write: bounds, writability, and no overlap with a
    /// receive or scratch region a peer may be reading right now (a send in flight).
    fn locate_write(&self, region: Region) -> CResult<*mut u8> {
        let (ptr, writable) = self.locate(region)?;
        if !writable {
            return Err(CollectiveError::Internal(format!("{region} is read-only")));
        }
        if region.len > 0 {
            for (token, s) in &self.pool.live_sends {
                if s.buf == region.buf
                    && s.len > 0
                    && s.offset < region.end()
                    && region.offset < s.end()
                {
                    return Err(CollectiveError::Internal(format!(
                        "{region} is written while send {token} of {s} may still be read"
                    )));
                }
            }
        }
        Ok(ptr)
    }

    /// Moves descriptors from the mailbox into the matching table and acknowledgements
    /// into completions.
    fn drain(&mut self) -> CResult<()> {
        let shared = Arc::clone(&self.ep.shared);
        let mine = &shared.mailboxes[self.me()];
        while let Some(ack) = mine.acks.pop() {
            if ack.session != self.id {
                continue; // a send of an earlier session that was claimed while it was dropped
            }
            let Some(out) = self.pool.sends.remove(&ack.token) else {
                continue;
            };
            self.pool.live_sends.retain(|(t, _)| *t != ack.token);
            if let Some(expected) = ack.rejected {
                self.mismatch = true;
                let me = self.me();
                let d = &out.desc;
                return Err(mismatch(
                    me,
                    out.peer as usize,
                    d.tag,
                    (Some(d.len), d.block),
                    expected,
                    me,
                ));
            }
            self.pool.ready.push(ack.token);
        }
        while let Some(d) = mine.incoming.pop() {
            if d.state.load(Ordering::Acquire) == WITHDRAWN {
                continue;
            }
            let key = (d.src, d.tag);
            self.ep.unexpected.entry(key).or_default().push_back(d);
            if self.pool.posted.contains_key(&key) {
                self.try_match(key)?;
            }
        }
        Ok(())
    }

    /// Completes the posted receive `key` if its descriptor is there and has arrived.
    fn try_match(&mut self, key: (u32, u64)) -> CResult<()> {
        loop {
            let Some(recv) = self.pool.posted.get(&key).copied() else {
                return Ok(());
            };
            let Some(queue) = self.ep.unexpected.get_mut(&key) else {
                return Ok(());
            };
            let Some(front) = queue.front() else {
                self.ep.unexpected.remove(&key);
                return Ok(());
            };
            if front.arrival > 0 && front.arrival > self.ep.shared.now_ns() {
                let at = front.arrival;
                if !self.pool.arriving.iter().any(|(_, k)| *k == key) {
                    self.pool.arriving.push((at, key));
                }
                return Ok(());
            }
            let desc = queue.pop_front().expect("front exists");
            if queue.is_empty() {
                self.ep.unexpected.remove(&key);
            }
            if desc
                .state
                .compare_exchange(POSTED, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue; // withdrawn by its sender: look at the next one
            }
            self.pool.posted.remove(&key);
            return self.complete(recv, &desc);
        }
    }

    /// Copies a claimed descriptor into the posted receive and acknowledges it.
    fn complete(&mut self, recv: PostedRecv, desc: &Desc) -> CResult<()> {
        let shared = Arc::clone(&self.ep.shared);
        let sender = &shared.mailboxes[desc.src as usize];
        let finish = |state: u8, rejected: Option<Expected>| {
            desc.state.store(state, Ordering::Release);
            sender.acks.push(Ack {
                session: desc.session,
                token: desc.token,
                rejected,
            });
            sender.unparker.unpark();
        };
        if desc.poison {
            finish(DONE, None);
            self.mismatch = true;
            return Err(poisoned(desc.src as usize, self.me(), desc.tag));
        }
        let expected = Expected {
            len: recv.region.len,
            block: self.block,
        };
        let blocks_differ = matches!((desc.block, self.block), (Some(a), Some(b)) if a != b);
        if desc.len != recv.region.len || blocks_differ {
            // Rejected, not copied: both ends fail, with the same words.
            finish(REJECTED, Some(expected));
            self.mismatch = true;
            let me = self.me();
            return Err(mismatch(
                desc.src as usize,
                me,
                desc.tag,
                (Some(desc.len), desc.block),
                expected,
                me,
            ));
        }
        let dst = match self.locate_write(recv.region) {
            Ok(p) => p,
            Err(e) => {
                finish(REJECTED, Some(expected));
                return Err(e);
            }
        };
        if desc.src as usize == self.me() {
            // A message to itself reads this rank's own buffers: they must not overlap.
            let (s, d) = (desc.ptr as usize, dst as usize);
            if desc.len > 0 && s < d + desc.len && d < s + desc.len {
                finish(REJECTED, Some(expected));
                return Err(CollectiveError::Internal(format!(
                    "message to self overlaps its destination {}",
                    recv.region
                )));
            }
        }
        if desc.len > 0 {
            // SAFETY: the descriptor is CLAIMED by this thread, so its sender keeps
            // `desc.ptr .. + len` alive and unwritten until we store DONE (its session
            // borrows that buffer and its drop waits for claimed descriptors). `dst` was
            // bounds-checked against this rank's receive or scratch buffer, which only
            // this thread writes and no peer reads at that place (checked against this
            // rank's sends in flight). The ranges do not overlap: they lie in different
            // ranks' buffers (a `&[u8]` of one rank cannot alias the `&mut [u8]` of
            // another; the raw-pointer entry points make their callers promise the same),
            // or, for a message to itself, were checked above.
            unsafe { std::ptr::copy_nonoverlapping(desc.ptr, dst, desc.len) };
        }
        finish(DONE, None);
        self.pool.ready.push(recv.token);
        Ok(())
    }

    /// Matches receives whose descriptors have reached their modelled arrival time.
    fn check_arrivals(&mut self) -> CResult<()> {
        if self.pool.arriving.is_empty() {
            return Ok(());
        }
        let now = self.ep.shared.now_ns();
        let mut i = 0;
        while i < self.pool.arriving.len() {
            let (at, key) = self.pool.arriving[i];
            if at <= now {
                self.pool.arriving.swap_remove(i);
                self.try_match(key)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Sends poison with the full tag `tag` to `peer` (see [`Desc::poison`]).
    fn poison(&self, peer: usize, tag: u64) {
        let mailbox = &self.ep.shared.mailboxes[peer];
        mailbox.incoming.push(Arc::new(Desc {
            src: self.ep.rank as u32,
            tag,
            ptr: std::ptr::null(),
            len: 0,
            block: None,
            poison: true,
            arrival: 0,
            session: self.id,
            token: u32::MAX,
            state: AtomicU8::new(POSTED),
        }));
        mailbox.unparker.unpark();
    }

    /// The first peer this session still waits on that has left, if any.
    /// Checks the peers of pending operations against `snapshot` (who had left when it
    /// was taken) or, without one, against who has left now.
    fn gone_peer(&self, snapshot: Option<&[bool]>) -> Option<usize> {
        let mailboxes = &self.ep.shared.mailboxes;
        let gone = |p: u32| match snapshot {
            Some(s) => s[p as usize],
            None => !mailboxes[p as usize].alive.load(Ordering::Acquire),
        };
        self.pool
            .sends
            .values()
            .map(|s| s.peer)
            .chain(self.pool.posted.keys().map(|k| k.0))
            .find(|&p| gone(p))
            .map(|p| p as usize)
    }
}

impl Session for LocalSession<'_> {
    fn post_send(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        self.check_peer(peer)?;
        let tag = self.full_tag(tag)?;
        let (ptr, _) = self.locate(region)?;
        let shared = &self.ep.shared;
        let arrival = match &shared.model {
            Some(m) => m
                .arrival(
                    &shared.topology,
                    self.ep.rank,
                    peer,
                    region.len,
                    shared.now_ns(),
                )
                .max(1),
            None => 0,
        };
        let desc = Arc::new(Desc {
            src: self.ep.rank as u32,
            tag,
            ptr: ptr.cast_const(),
            len: region.len,
            block: self.block,
            poison: false,
            arrival,
            session: self.id,
            token,
            state: AtomicU8::new(POSTED),
        });
        if region.buf != Buf::Send {
            self.pool.live_sends.push((token, region));
        }
        self.pool.sends.insert(
            token,
            OutSend {
                desc: Arc::clone(&desc),
                peer: peer as u32,
            },
        );
        let mailbox = &shared.mailboxes[peer];
        mailbox.incoming.push(desc);
        mailbox.unparker.unpark();
        Ok(())
    }

    fn post_poison(&mut self, peer: usize, tag: u64) -> CResult<()> {
        self.check_peer(peer)?;
        let tag = self.full_tag(tag)?;
        self.poison(peer, tag);
        Ok(())
    }

    fn post_recv(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        self.check_peer(peer)?;
        let tag = self.full_tag(tag)?;
        self.locate_write(region)?;
        let key = (peer as u32, tag);
        if self
            .pool
            .posted
            .insert(key, PostedRecv { region, token })
            .is_some()
        {
            return Err(CollectiveError::Internal(format!(
                "two receives posted from rank {peer} with tag {tag:#x}"
            )));
        }
        self.try_match(key)
    }

    fn copy(&mut self, src: Region, dst: Region) -> CResult<()> {
        if src.len != dst.len {
            return Err(CollectiveError::Internal(format!(
                "copy {src} -> {dst}: lengths differ"
            )));
        }
        let (from, _) = self.locate(src)?;
        let to = self.locate_write(dst)?;
        if src.buf == dst.buf && src.len > 0 && src.offset < dst.end() && dst.offset < src.end() {
            return Err(CollectiveError::Internal(format!(
                "copy {src} -> {dst}: regions overlap"
            )));
        }
        if src.len > 0 {
            // SAFETY: both regions were bounds-checked against the session's buffers,
            // which the session borrows; `dst` is writable and not being read by a peer
            // (checked by `locate_write`); the regions are in different buffers or were
            // checked not to overlap just above.
            unsafe { std::ptr::copy_nonoverlapping(from.cast_const(), to, src.len) };
        }
        Ok(())
    }

    fn progress(&mut self, completed: &mut Vec<u32>) -> CResult<()> {
        self.drain()?;
        self.check_arrivals()?;
        completed.append(&mut self.pool.ready);
        Ok(())
    }

    fn test(&mut self, token: u32) -> CResult<bool> {
        self.drain()?;
        self.check_arrivals()?;
        if let Some(i) = self.pool.ready.iter().position(|&t| t == token) {
            self.pool.ready.swap_remove(i);
            return Ok(true);
        }
        let pending = self.pool.sends.contains_key(&token)
            || self.pool.posted.values().any(|r| r.token == token);
        Ok(!pending)
    }

    fn cancel(&mut self, token: u32) -> CResult<()> {
        if let Some(out) = self.pool.sends.remove(&token) {
            self.pool.live_sends.retain(|(t, _)| *t != token);
            if out
                .desc
                .state
                .compare_exchange(POSTED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                wait_unclaimed(&out.desc);
            }
        }
        self.pool.posted.retain(|_, r| r.token != token);
        self.pool.ready.retain(|&t| t != token);
        Ok(())
    }

    fn wait(&mut self, max: Duration) -> CResult<()> {
        if !self.pool.ready.is_empty() {
            return Ok(());
        }
        let mut wait = max;
        if let Some(next) = self.pool.arriving.iter().map(|(t, _)| *t).min() {
            let now = self.ep.shared.now_ns();
            wait = wait.min(Duration::from_nanos(next.saturating_sub(now)));
        }
        // Sleeping costs a system call and a wake-up, and its granularity is tens of
        // microseconds (timer slack): short waits — the engine's first back-offs, or a
        // modelled arrival that is near — only yield the processor, which on a machine
        // with fewer cores than ranks hands it to the peers being waited for.
        if wait < YIELD_BELOW {
            std::thread::yield_now();
        } else if !wait.is_zero() {
            self.ep.parker.park_timeout(wait);
        }
        if self.gone_peer(None).is_some() {
            // A peer that left may have answered everything before it did: note who has
            // left, take in what is in the mailbox, then look again at those peers only
            // (one that leaves after the snapshot is looked at next time).
            let mut gone = std::mem::take(&mut self.pool.gone);
            gone.clear();
            gone.extend(
                self.ep
                    .shared
                    .mailboxes
                    .iter()
                    .map(|m| !m.alive.load(Ordering::Acquire)),
            );
            let drained = self.drain();
            let peer = self.gone_peer(Some(&gone));
            self.pool.gone = gone;
            drained?;
            if let Some(peer) = peer {
                return Err(CollectiveError::Remote {
                    peer,
                    message: format!(
                        "rank {peer} left (its endpoint was dropped) while rank {} still waits for it",
                        self.me()
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Waits until a receiver that claimed `desc` has finished copying from it.
///
/// A claimed descriptor is in the middle of one `copy_nonoverlapping` on the receiving
/// thread, with nothing that can block or fail between the claim and the store of the
/// final state, so this wait is short; it yields rather than spins, for machines with
/// fewer cores than ranks.
fn wait_unclaimed(desc: &Desc) {
    let mut spins = 0u32;
    while desc.state.load(Ordering::Acquire) == CLAIMED {
        if spins < 64 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
}

impl Drop for LocalSession<'_> {
    fn drop(&mut self) {
        // No descriptor may outlive the buffers: withdraw what no receiver has claimed,
        // wait for the copies already claimed. After a size mismatch the receivers of
        // the withdrawn sends get poison instead, so that they fail now too.
        let sends: Vec<OutSend> = self.pool.sends.drain().map(|(_, o)| o).collect();
        for out in sends {
            if out
                .desc
                .state
                .compare_exchange(POSTED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                wait_unclaimed(&out.desc);
            } else if self.mismatch {
                self.poison(out.peer as usize, out.desc.tag);
            }
        }
        let mut pool = std::mem::take(&mut self.pool);
        pool.posted.clear();
        pool.arriving.clear();
        pool.ready.clear();
        pool.live_sends.clear();
        self.ep.pool = pool;
    }
}
