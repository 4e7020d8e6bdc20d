//! HALO's shared-memory transport: ranks as processes on one host, messages through
//! lock-free single-producer/single-consumer rings in one shared segment per job.
//!
//! # Segment
//! One per host: the ranks of a host (all of a one-host job's; in a job across hosts
//! the others are reached by the fabric, `super::hybrid`) share a segment holding only
//! their rings, indexed by their place among them. Before the bootstrap exchange every
//! rank makes an empty file `/dev/shm/halo-shm-NS-PID-N-TAG` (`TAG`: 64 random bits;
//! mode 0600, created with `O_EXCL | O_NOFOLLOW`: no other user can open it, guess its
//! name or plant a link there, `crate::host::files::create_private`) and publishes its
//! path in its card; after it the lowest rank of each host sizes its file for the host's ranks and
//! writes the header, and the others remove theirs and map it (waiting until the
//! header is written; a maker that fails removes its file, one that ends is seen
//! ending, so nobody waits for the bootstrap timeout). The last rank to map it unlinks
//! it, so a running job has no file in `/dev/shm` at all and a job that dies in any
//! way leaves none. A job that dies during set-up leaves the files: each rank removes
//! its own when it fails, `halo launch` those of every rank it reaps (the name carries
//! the rank's pid, like the doorbells, `cli/src/launch/leftovers.rs`), and the next
//! file made in the same PID namespace removes those of processes that no longer run.
//! Layout: `segment/layout.rs`.
//!
//! # Rings
//! One ring per ordered pair of ranks (sender, receiver): `slots` cells of `cell`
//! bytes (32 x 8 KiB by default, 16 above 16 ranks, 8 above 64: the segment is
//! `N x N x slots x cell` bytes, all of it resident once an all-to-all has used every
//! ring; `HALO_SHM_SLOTS`, `HALO_SHM_CELL`).
//! The sender alone writes cells, the receiver alone the head; a cell is published by
//! the Release store of its *stamp* (its kind and its number in the ring, in its first
//! cache line, written last: the bytes past the first line first, then the first line
//! in one burst) and freed by the head's Release store. The receiver polls the stamp of
//! the cell it needs next — one cache line from the sender's core per small message,
//! where a tail counter on a line of its own cost two in a row (1-byte ping-pong: 0.31-
//! 0.33 -> 0.26-0.27 us, docs/bench/JOURNAL.md). A message is a first
//! cell (tag, length, call descriptor, the first bytes: small messages travel inline, eager)
//! and as many further cells as its length needs, pipelined: the sender fills cells as
//! the receiver frees them, so messages larger than the ring pass through it. A send
//! completes when its last byte is in the ring. The receiver drains every ring it has
//! whenever it progresses: a message whose receive is posted is copied straight into
//! the caller's buffer. One whose receive is not posted waits at the head of its ring
//! for up to 500 us while no receive from that peer is posted (so nothing this rank
//! waits for is behind it; the sender goes on while the ring has room): a receive
//! posted on reading the message before it — all-to-all-v's remainders behind its
//! counts, the next receive of a window, each a call of its own — then takes it in one
//! copy. Otherwise it goes into memory of the transport's own ("unexpected") until its
//! receive is posted — so a ring never blocks for long on a message nobody asked for
//! yet, and the schedules' deadlock freedom (proved under rendezvous) carries over.
//! (Holding: one host, 4 ranks, a2av 32-64 KiB 25 -> 19 and 55 -> 29 us; `bw` at 16 KiB
//! 2.6 -> 1.7 us per message; docs/bench/JOURNAL.md.)
//! Messages through the ring are copied twice (into the ring, out of it). Messages of
//! at least `HALO_SHM_CMA_MIN` bytes (32 KiB) are copied once where the receiver can
//! read the sender's memory: one cell offers the buffer's address, the receiver reads
//! it with `process_vm_readv` and acks, and only the ack completes the send
//! (*rendezvous*; probed per pair at set-up, `HALO_SHM_CMA=0|1`; `cma.rs`).
//!
//! # Waiting
//! When nothing completes, a rank polls without pause (not when the host has fewer
//! cores than this job has ranks: then it yields the processor between polls) until
//! `HALO_SHM_SPIN_US` (default 1000 us) have passed — `HALO_SHM_PURE_US` makes the
//! part without yielding shorter — then sleeps on its *bell*,
//! a futex word in the segment: it marks the word asleep, looks at its rings once
//! more, and waits on the futex (bounded by the engine's wait, at most 1 ms). A rank
//! that publishes cells to a peer, or frees cells of a peer's ring, wakes the peer if
//! its word says it sleeps (one shared load otherwise). Not sleeping early matters on a
//! loaded host: a woken rank waits for a processor, and sleeping after 5-50 us of
//! silence cost 75-130 us per 1-byte ping-pong (2 ranks, load 5-9 on 2
//! cores) and 77 us per 1-byte all-to-all (4 ranks) — docs/bench/JOURNAL.md.
//!
//! # Failures (as the fabric transport)
//! - A peer whose process ended is noticed while waiting for it (every 50 ms): what it
//!   published before it ended is still read, and if the collective still needs it,
//!   the collective fails with `Remote` naming it. There are no locks, so a killed peer
//!   cannot leave anything spinning.
//! - A rendezvous (see `cma.rs`) whose sender's session ends first is withdrawn: its
//!   receiver fails with `Remote` naming the sender, never with bytes the caller may
//!   have changed since; a sender that dies before the read, or a receiver that dies
//!   before the ack, is noticed as above.
//! - A receive completes only with exactly its posted length: a message of another
//!   length, or another call descriptor (`halo_collectives::Call`: collective, reduction
//!   operation, element type, root, byte count), is a `Mismatch` naming both ranks and
//!   both values; poison (`post_poison`) takes the place of messages a failed rank will
//!   not send.
//! - Call agreement beyond matching: the first cell of a message of the call in
//!   progress (its tag's sequence number and communicator) is checked as it is read from
//!   the ring, before the hold and whatever its tag, and so are messages read during
//!   earlier calls: another collective's schedule may never post a receive for it. A
//!   rank that found a mismatch queues poison of its call to every peer, and poison of
//!   a call that differs fails its receiver whatever tag it waits for, so the ranks of
//!   both calls fail naming both. Where no message flows between ranks that disagree
//!   (two ranks each naming itself a broadcast's root, both only sending eagerly), the
//!   disagreement is not seen.
//! - A collective that fails on this rank leaves the transport broken: every later one
//!   fails at once with `InvalidUsage`. After a mismatch the rank first delivers its
//!   queued sends (and poison) for up to 500 ms, so that its peers fail with the
//!   mismatch too, not at their timeout.
//!
//! # Files
//! `segment/`: the segment (all the `unsafe`): `mod.rs` the mapping and the rings' raw
//! access, `file.rs` the file's life cycle, `layout.rs` its layout, `cell.rs` a cell's
//! header and protocol, `bell.rs` the bells (on `host::futex`);
//! `session/`: one collective's operations: `mod.rs` the session's state, its end and
//! the [`Session`] impl, `send.rs` posting and pushing sends, `recv.rs` posting
//! receives and draining the rings (matching, holding), `rdv.rs` the rendezvous on both
//! sides, `agree.rs` call agreement, `wait.rs` spinning, sleeping, watching peers;
//! `cma.rs`: cross-memory attach (the probe, the read, the rendezvous states).
//!
//! [`Session`]: halo_collectives::Session

mod cma;
mod segment;
mod session;

pub(crate) use segment::{Reservation, Segment, is_segment_path};

use crate::error::{Error, Result};
use crate::host::proc::Proc;
use crate::host::wait::WaitPolicy;
use crate::transport::CResult;
use crate::transport::raw::RawBuffers;
use cma::{CMA_NO, CMA_OK, CmaConfig, CmaMode};
use halo_collectives::{Buffers, Call, CollectiveError, Transport};
pub(crate) use session::ShmSession;
use session::{InRing, OutRing, RdvSend, Unexpected};
use std::collections::VecDeque;
use std::time::Duration;

/// Which transport carries the messages of a job of processes (`HALO_TRANSPORT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TransportChoice {
    /// HALO's shared-memory transport between the ranks of each host (same host name
    /// and PID namespace) unless a libfabric provider is forced
    /// (`HALO_FABRIC_PROVIDER`); libfabric between hosts, and for a host whose ranks
    /// could not share a segment. The default.
    #[default]
    Auto,
    /// HALO's shared-memory transport between the ranks of each host (an error at
    /// initialisation where they cannot share a segment, or where a rank forces the
    /// fabric); the network provider between hosts. libfabric's own `shm` provider is
    /// not opened.
    Shm,
    /// libfabric for every peer (`shm` within a host, the network provider between).
    /// One rank saying so is enough for the whole job.
    Fabric,
}

impl std::str::FromStr for TransportChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<TransportChoice> {
        match s.trim() {
            "auto" | "" => Ok(TransportChoice::Auto),
            "shm" => Ok(TransportChoice::Shm),
            "fabric" => Ok(TransportChoice::Fabric),
            other => Err(Error::invalid_argument(format!(
                "HALO_TRANSPORT={other:?}: expected auto, shm or fabric"
            ))),
        }
    }
}

impl std::fmt::Display for TransportChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TransportChoice::Auto => "auto",
            TransportChoice::Shm => "shm",
            TransportChoice::Fabric => "fabric",
        })
    }
}

/// How long a rank polls (yielding) before it sleeps on its bell (`HALO_SHM_SPIN_US`).
const SPIN_DEFAULT: Duration = Duration::from_micros(1000);
/// The longest single sleep on the bell (a lost wake-up costs at most this).
const SLEEP_MAX: Duration = Duration::from_millis(1);

/// The name [`crate::Communicator::provider_to`] gives this transport.
pub(crate) const PROVIDER: &str = "halo-shm";

/// The shared-memory transport of one rank.
pub(crate) struct ShmTransport {
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) seg: Segment,
    /// The other ranks of the segment (all others in a one-host job; this host's in a
    /// job across hosts, where the rest are another transport's), ascending.
    pub(super) peers: Vec<usize>,
    /// Per peer: this rank's end of the ring to it.
    pub(super) out: Vec<OutRing>,
    /// Per peer: this rank's end of the ring from it.
    pub(super) inn: Vec<InRing>,
    /// Per peer: sends not yet wholly in the ring, in posting order.
    pub(super) sendq: Vec<VecDeque<session::SendOp>>,
    /// Receives posted and not yet matched.
    pub(super) recvs: Vec<session::PostedRecv>,
    /// Whole messages that arrived before their receive, in arrival order.
    pub(super) unexpected: Vec<Unexpected>,
    /// Same-host peers' processes, by rank.
    pub(super) procs: Vec<Option<Proc>>,
    /// Why the transport may no longer be used.
    pub(super) broken: Option<String>,
    /// How to wait, measured from when the session went idle: poll without yielding
    /// for `HALO_SHM_PURE_US` first (not at all when oversubscribed: more ranks than
    /// cores), then yielding until `HALO_SHM_SPIN_US`, then sleep on the bell.
    pub(super) wait: WaitPolicy,
    /// Cross-memory attach settings (`HALO_SHM_CMA`, `HALO_SHM_CMA_MIN`).
    pub(super) cma: CmaConfig,
    /// How long a message waits at the head of its ring for its receive
    /// ([`session::HOLD_DEFAULT`]; the tests lengthen it).
    pub(super) hold: Duration,
    /// Per peer, as sender: whether the peer reads this rank's sends of at least
    /// `cma.min` bytes by rendezvous (`None`: it has not said yet).
    pub(super) cma_to: Vec<Option<bool>>,
    /// Per peer, as receiver: the peer's pid to read its rendezvous from (0: none).
    pub(super) cma_pid: Vec<u32>,
    /// Per peer, as receiver: a pidfd of that process (checked after every read).
    pub(super) cma_pidfd: Vec<Option<std::os::fd::OwnedFd>>,
    /// Per peer: rendezvous sends published and not yet acked, in ring order.
    pub(super) rdvq: Vec<VecDeque<RdvSend>>,
    /// Rendezvous sends published so far (for the tests and the debug log).
    pub(super) rdv_sent: u64,
    /// Messages (through the ring or by rendezvous) read into the transport's own
    /// memory because their receive was not posted in time (for the tests; each is
    /// traced at `HALO_DEBUG=trace`).
    pub(super) buffered: u64,
    /// The last session's completion list, kept for the next (empty).
    pub(super) done_spare: Vec<u32>,
}

// SAFETY: the raw pointers inside (queued sends, posted receives) point into the
// buffers of the session in progress, which borrows the transport mutably and empties
// them before it ends, and into the segment's mapping, owned by the transport; the
// transport is used by one thread at a time (the communicator is Send, not Sync).
unsafe impl Send for ShmTransport {}

impl std::fmt::Debug for ShmTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmTransport")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("segment", &self.seg)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl ShmTransport {
    /// The transport of `rank` of `size` over the mapped segment `seg`, which holds
    /// every rank (every rank calls [`Segment::attach`] through this); `procs[r]`:
    /// rank r's process, watched while waiting for it; every rank attached within the
    /// bootstrap timeout's default (120 s).
    #[cfg(test)]
    pub(crate) fn new(
        rank: usize,
        size: usize,
        seg: Segment,
        procs: Vec<Option<Proc>>,
    ) -> Result<ShmTransport> {
        let attach_timeout = Duration::from_secs(120);
        Self::new_group(
            rank,
            size,
            &(0..size).collect::<Vec<_>>(),
            seg,
            procs,
            attach_timeout,
        )
    }

    /// The transport of `rank` of `size` over the mapped segment `seg` of the ranks
    /// `group` (ascending, `rank` among them; the ranks of this host): messages to
    /// the ranks of `group` only. Every rank of the group calls it, and waits up to
    /// `attach_timeout` (the bootstrap timeout) for the others to map the segment.
    pub(crate) fn new_group(
        rank: usize,
        size: usize,
        group: &[usize],
        mut seg: Segment,
        procs: Vec<Option<Proc>>,
        attach_timeout: Duration,
    ) -> Result<ShmTransport> {
        if procs.len() != size
            || rank >= size
            || !group.contains(&rank)
            || !group.is_sorted()
            || group.len() != seg.ranks()
        {
            return Err(Error::internal(
                "shm transport: one process per rank and a segment slot per group member \
                 expected",
            ));
        }
        seg.set_ranks(group, size)?;
        let cma = CmaConfig::from_env()?;
        publish_probe(&seg, rank, cma.mode);
        seg.attach();
        wait_attached(&seg, rank, group, &procs, attach_timeout)?;
        let peers: Vec<usize> = group.iter().copied().filter(|&p| p != rank).collect();
        let (cma_pid, cma_pidfd) = probe_peers(&seg, rank, size, &peers, cma)?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let yield_spin = size > cores;
        let spin = halo_params::SHM_SPIN_US
            .number()
            .map_err(|e| Error::invalid_argument(e.to_string()))?
            .map_or(SPIN_DEFAULT, Duration::from_micros);
        let pure = halo_params::SHM_PURE_US
            .number_or_warn()
            .map_or(spin, Duration::from_micros);
        tracing::info!(
            rank,
            size,
            ?peers,
            segment = seg.path(),
            slots = seg.slots(),
            payload = seg.payload(),
            ?spin,
            yield_spin,
            "shared-memory transport ready"
        );
        Ok(ShmTransport {
            rank,
            size,
            seg,
            peers,
            out: (0..size).map(|_| OutRing::default()).collect(),
            inn: (0..size).map(|_| InRing::default()).collect(),
            sendq: (0..size).map(|_| VecDeque::new()).collect(),
            recvs: Vec::new(),
            unexpected: Vec::new(),
            procs,
            broken: None,
            wait: WaitPolicy {
                spin: if yield_spin { Duration::ZERO } else { pure },
                yield_below: spin,
                sleep_max: SLEEP_MAX,
            },
            cma,
            hold: session::HOLD_DEFAULT,
            cma_to: vec![None; size],
            cma_pid,
            cma_pidfd,
            rdvq: (0..size).map(|_| VecDeque::new()).collect(),
            rdv_sent: 0,
            buffered: 0,
            done_spare: Vec::with_capacity(64),
        })
    }
}

/// What [`probe_peers`] found: per peer, its pid to read from (0: none) and a pidfd.
type Probed = (Vec<u32>, Vec<Option<std::os::fd::OwnedFd>>);

/// Writes what peers need to probe cross-memory attach to this rank into its bell
/// (before it attaches: peers read it once every rank has).
fn publish_probe(seg: &Segment, rank: usize, mode: CmaMode) {
    use std::sync::atomic::Ordering::Relaxed;
    let b = seg.bell(rank);
    b.pid.store(std::process::id(), Relaxed);
    b.pid_ns.store(cma::pid_ns_ino(), Relaxed);
    let (addr, val) = if mode == CmaMode::Off {
        (0, 0)
    } else {
        cma::probe_word()
    };
    b.probe_addr.store(addr, Relaxed);
    b.probe_val.store(val, Relaxed);
}

/// Probes, as receiver, whether this process can read each peer's memory
/// (`process_vm_readv` of the peer's probe word); tells each peer through the ring
/// from it; returns the peers' pids to read from (0: the ring path) and pidfds of
/// them. With `HALO_SHM_CMA=1` a peer that cannot be read is an error.
fn probe_peers(
    seg: &Segment,
    rank: usize,
    size: usize,
    peers: &[usize],
    cma: CmaConfig,
) -> Result<Probed> {
    let mode = cma.mode;
    use std::sync::atomic::Ordering::{Relaxed, Release};
    let mut pids = vec![0u32; size];
    let mut fds: Vec<Option<std::os::fd::OwnedFd>> = (0..size).map(|_| None).collect();
    let mut off: Vec<(usize, String)> = Vec::new();
    let my_ns = cma::pid_ns_ino();
    for &p in peers {
        let verdict = if mode == CmaMode::Off {
            Err("HALO_SHM_CMA=0".to_string())
        } else {
            let b = seg.bell(p);
            let (pid, ns) = (b.pid.load(Relaxed), b.pid_ns.load(Relaxed));
            if ns != my_ns || my_ns == 0 {
                Err(format!("rank {p} is in another PID namespace"))
            } else {
                // The pidfd first: if the probe then finds the peer's word and the
                // process has not exited since, the pidfd is the peer's.
                let fd = cma::pidfd(pid);
                cma::probe(pid, b.probe_addr.load(Relaxed), b.probe_val.load(Relaxed))
                    .and_then(|()| match &fd {
                        Some(f) if cma::exited(f) => Err(format!("process {pid} ended")),
                        _ => Ok(()),
                    })
                    .map(|()| {
                        fds[p] = fd;
                        pid
                    })
            }
        };
        match verdict {
            Ok(pid) => {
                pids[p] = pid;
                seg.ring(p, rank).cma.store(CMA_OK, Release);
            }
            Err(why) => {
                seg.ring(p, rank).cma.store(CMA_NO, Release);
                off.push((p, why));
            }
        }
    }
    if mode == CmaMode::Required
        && let Some((p, why)) = off.first()
    {
        return Err(Error::SystemError {
            message: format!(
                "HALO_SHM_CMA=1: rank {rank} cannot read rank {p}'s memory with \
                process_vm_readv ({why}; ptrace_scope {:?}); unset HALO_SHM_CMA to fall back \
                 to the rings",
                cma::ptrace_scope()
            ),
        });
    }
    if !peers.is_empty() {
        match off.first() {
            None => tracing::info!(
                rank,
                min = cma.min,
                "shared-memory transport: large messages copied once (process_vm_readv) from \
                 every peer"
            ),
            Some((p, why)) => tracing::info!(
                rank,
                ptrace_scope = ?cma::ptrace_scope(),
                "shared-memory transport: cross-memory attach off from {} of {} peers (rank \
                 {p}: {why}); their large messages pass through the rings",
                off.len(),
                peers.len()
            ),
        }
    }
    Ok((pids, fds))
}

/// Waits until every rank of `group` has mapped the segment (so that none is left
/// unable to open it because the file is gone: the last rank to attach unlinks it,
/// and its maker removes it when it ends before that). Fails when a rank's process
/// ended first, or after `limit` (the caller's bootstrap timeout,
/// `HALO_BOOTSTRAP_TIMEOUT_MS`).
fn wait_attached(
    seg: &Segment,
    rank: usize,
    group: &[usize],
    procs: &[Option<Proc>],
    limit: Duration,
) -> Result<()> {
    let start = std::time::Instant::now();
    let mut pause = Duration::from_micros(10);
    let mut looked = start;
    while seg.attached() < group.len() {
        if looked.elapsed() >= Duration::from_millis(50) {
            looked = std::time::Instant::now();
            if let Some(&p) = group
                .iter()
                .find(|&&p| procs[p].is_some_and(crate::host::proc::has_ended))
            {
                return Err(Error::RemoteError {
                    peer: p,
                    message: format!(
                        "rank {p} ended before it mapped the shared-memory segment (rank {rank} \
                         waited for it)"
                    ),
                });
            }
        }
        if start.elapsed() >= limit {
            return Err(Error::SystemError {
                message: format!(
                    "rank {rank}: only {} of {} ranks mapped the shared-memory segment {} within \
                     {limit:?} (HALO_BOOTSTRAP_TIMEOUT_MS)",
                    seg.attached(),
                    group.len(),
                    seg.path()
                ),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
    Ok(())
}

impl Transport for ShmTransport {
    type Session<'a> = ShmSession<'a>;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn begin<'a>(&'a mut self, tag_base: u64, bufs: Buffers<'a>) -> CResult<ShmSession<'a>> {
        let call = bufs.call;
        self.begin_raw(tag_base, RawBuffers::new(bufs), call)
    }
}

impl ShmTransport {
    /// [`super::Backend::poison_after_mismatch`] on this transport, broken or not (a
    /// failed collective breaks it; poison is all it still sends).
    pub(crate) fn poison_after_mismatch(
        &mut self,
        tag_base: u64,
        call: Call,
        sends: &[(usize, u64)],
        e: &CollectiveError,
    ) {
        let bufs = Buffers {
            send: &[],
            recv: &mut [],
            scratch: &mut [],
            call,
        };
        let mut s = ShmSession::new(self, RawBuffers::new(bufs), tag_base, call);
        // Its drop delivers what is queued, as a failed session's does.
        s.share_failure(e);
        for &(peer, tag) in sends {
            let _ = halo_collectives::Session::post_poison(&mut s, peer, tag);
        }
    }

    /// [`Transport::begin`] over buffers already taken as raw pointers (the hybrid
    /// transport's, whose other half uses the same buffers for other peers).
    pub(crate) fn begin_raw<'a>(
        &'a mut self,
        tag_base: u64,
        bufs: RawBuffers<'a>,
        call: Call,
    ) -> CResult<ShmSession<'a>> {
        if let Some(why) = &self.broken {
            return Err(CollectiveError::InvalidUsage(format!(
                "rank {}: this communicator can no longer be used: {why}; drop it and create \
                 a new one (HALO_TIMEOUT_MS sets the timeout)",
                self.rank
            )));
        }
        Ok(ShmSession::new(self, bufs, tag_base, call))
    }

    /// Whether `peer` is reached through this transport (a rank of its segment).
    pub(crate) fn reaches(&self, peer: usize) -> bool {
        peer != self.rank && self.seg.holds(peer)
    }
}

#[cfg(test)]
mod tests;
