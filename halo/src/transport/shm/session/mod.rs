//! One collective's operations on the shared-memory transport: the session's state
//! (what is queued, posted, in progress), its beginning and end (the drop that breaks
//! the transport after a failure), the first error, and the [`Session`] impl that
//! routes each call to the file doing the work:
//! - `send.rs`: posting a send and writing queued sends into the rings (eager, cell by
//!   cell, or one cell offering a rendezvous);
//! - `recv.rs`: posting a receive and reading the rings (matching, holding, reading
//!   ahead into memory of the transport's own);
//! - `rdv.rs`: the rendezvous (single copy, `shm/cma.rs`) on both sides: whether a send
//!   goes by it, the receiver's read, the sender's acks and withdrawal;
//! - `agree.rs`: call agreement: whether a message may complete a receive of this call;
//! - `wait.rs`: waiting: spinning, yielding, sleeping on the bell, watching the peers
//!   waited for.
//!
//! [`Session`]: halo_collectives::Session

mod agree;
mod rdv;
mod recv;
mod send;
mod wait;

use super::cma::{OFFERED, REVOKED};
use super::{CResult, ShmTransport};
use crate::transport::raw::RawBuffers;
use crate::transport::{FLUSH_SENDS, take_len};
use halo_collectives::{Call, CollectiveError, Region, Session};
use std::ptr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The token of poison messages (never a step of a schedule, never reported).
const POISON_TOKEN: u32 = u32::MAX;
/// How long a message whose receive is not posted yet stays at the head of its ring
/// (the ring from that peer waits behind it; its sender goes on while the ring has
/// room) before the receiver reads it into memory of the transport's own, to be copied
/// again once its receive comes. A program that posts the receive on reading the
/// message before it — all-to-all-v's remainders behind its counts, the next of a
/// window of receives, each a call of its own — posts it within microseconds: then the
/// message is read once, straight into its place, and no heap memory is touched. A
/// message is held only while no receive from that peer is posted at all, so a receive
/// waiting for a message behind it is never delayed.
pub(super) const HOLD_DEFAULT: Duration = Duration::from_micros(500);
// Bytes of a cache line (a cell's first holds its header and first payload bytes).
use crate::host::CACHE_LINE as LINE;

/// This rank's end of the ring to one peer.
#[derive(Debug, Default)]
pub(crate) struct OutRing {
    /// Cells this rank has published.
    tail: u64,
    /// The peer's head as last read (cells it has freed).
    head_cache: u64,
}

/// This rank's end of the ring from one peer.
#[derive(Debug, Default)]
pub(crate) struct InRing {
    /// Cells this rank has consumed.
    head: u64,
    /// The message whose cells are arriving.
    partial: Option<Partial>,
    /// Since when the message at the head of this ring has waited for its receive to
    /// be posted (see [`HOLD_DEFAULT`]).
    held_since: Option<Instant>,
}

/// A send not yet wholly in the ring.
#[derive(Debug)]
pub(crate) struct SendOp {
    token: u32,
    tag: u64,
    /// The bytes, in a buffer of the session in progress (the queue is emptied before
    /// the session ends).
    src: *const u8,
    len: usize,
    /// Bytes already in the ring.
    sent: usize,
    /// Whether the first cell is in the ring.
    started: bool,
    call: u64,
    poison: bool,
}

/// A rendezvous send published and not yet acked.
#[derive(Debug)]
pub(crate) struct RdvSend {
    token: u32,
    /// Its cell's number in the ring (the tail before it was published).
    seq: u64,
}

/// A receive posted and not yet matched.
#[derive(Debug)]
pub(crate) struct PostedRecv {
    token: u32,
    peer: usize,
    tag: u64,
    /// Where the bytes go, in a buffer of the session in progress.
    dst: *mut u8,
    len: usize,
    /// A shorter message completes it too ([`Session::post_recv_up_to`]).
    up_to: bool,
}

/// A message that arrived whole before its receive was posted.
#[derive(Debug)]
pub(crate) struct Unexpected {
    peer: usize,
    tag: u64,
    call: u64,
    poison: bool,
    data: Vec<u8>,
}

/// Where the cells of the message in progress go.
#[derive(Debug)]
enum Dest {
    /// Into a posted receive (`up_to`: one that notes the message's length).
    Recv {
        token: u32,
        dst: *mut u8,
        up_to: bool,
    },
    /// Into memory of the transport's own, until its receive is posted.
    Heap(Vec<u8>),
    /// Nowhere (a refused message, or after a failure).
    Discard,
}

/// The message whose cells are arriving on one ring.
#[derive(Debug)]
pub(crate) struct Partial {
    tag: u64,
    len: usize,
    call: u64,
    got: usize,
    dest: Dest,
}

/// One collective's operations on the shared-memory transport.
pub(crate) struct ShmSession<'a> {
    t: &'a mut ShmTransport,
    bufs: RawBuffers<'a>,
    tag_base: u64,
    /// This call's descriptor ([`Call`]), as carried in cells.
    call: u64,
    /// Whether the messages read during earlier calls were looked at for one of this
    /// call from a rank whose call differs ([`Self::scan_unexpected`]).
    scanned: bool,
    /// Tokens completed and not yet reported.
    done: Vec<u32>,
    /// The first error this session returned (why the transport breaks on drop).
    error: Option<String>,
    /// Whether that error is a size mismatch.
    mismatch: bool,
    /// Since when nothing has moved (`None`: something just did).
    idle_since: Option<Instant>,
    /// The lengths of the messages that completed receives posted with
    /// [`Session::post_recv_up_to`], by token, until asked.
    lens: Vec<(u32, usize)>,
    /// When the peers' processes were last looked at (`None`: not yet in this call;
    /// the clock is read only once the call has to wait).
    last_watch: Option<Instant>,
}

impl std::fmt::Debug for ShmSession<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmSession")
            .field("rank", &self.t.rank)
            .field("recvs", &self.t.recvs.len())
            .finish_non_exhaustive()
    }
}

impl<'a> ShmSession<'a> {
    pub(super) fn new(
        t: &'a mut ShmTransport,
        bufs: RawBuffers<'a>,
        tag_base: u64,
        call: Call,
    ) -> ShmSession<'a> {
        ShmSession {
            bufs,
            tag_base,
            call: call.to_raw(),
            scanned: false,
            // The previous session's (emptied) vector: no allocation per message.
            done: std::mem::take(&mut t.done_spare),
            error: None,
            mismatch: false,
            idle_since: None,
            lens: Vec::new(),
            last_watch: None,
            t,
        }
    }
}

impl ShmSession<'_> {
    /// Takes `e`, the failure of the hybrid transport's other half in this
    /// collective, as this session's own (its drop breaks the transport and, after a
    /// size mismatch, first delivers the queued sends and poison).
    pub(crate) fn share_failure(&mut self, e: &CollectiveError) {
        if self.error.is_none() {
            self.error = Some(e.to_string());
            self.mismatch = matches!(e, CollectiveError::Mismatch { .. });
        }
    }

    /// Keeps the first error (for the reason the transport breaks) and returns it.
    fn note<T>(&mut self, r: CResult<T>) -> CResult<T> {
        if let Err(e) = &r
            && self.error.is_none()
        {
            self.error = Some(e.to_string());
            self.mismatch = matches!(e, CollectiveError::Mismatch { .. });
            if self.mismatch {
                for peer in 0..self.t.size {
                    self.poison_back(peer);
                }
            }
        }
        r
    }

    /// After a mismatch: queues poison for `peer` carrying this call, with this call's
    /// tag base (the drop delivers it). A peer may wait for a message this rank's
    /// schedule never sends it (another collective's schedule): poison of this call
    /// fails it, whatever the tag it waits for, where its own call differs (the
    /// others ignore it unless they wait for that very tag; this rank's transport is
    /// broken from now on, so none waits for it again). Failure path only.
    fn poison_back(&mut self, peer: usize) {
        if peer == self.t.rank || peer >= self.t.sendq.len() || !self.t.reaches(peer) {
            return;
        }
        self.t.sendq[peer].push_back(SendOp {
            token: POISON_TOKEN,
            tag: self.tag_base,
            src: ptr::NonNull::<u8>::dangling().as_ptr(),
            len: 0,
            sent: 0,
            started: false,
            call: self.call,
            poison: true,
        });
    }

    fn full_tag(&self, tag: u64) -> CResult<u64> {
        crate::transport::full_tag(self.tag_base, tag)
    }

    fn check_peer(&self, peer: usize) -> CResult<()> {
        if !self.t.reaches(peer) {
            return Err(CollectiveError::Internal(format!(
                "no route to rank {peer} over shared memory"
            )));
        }
        Ok(())
    }

    /// Moves cells both ways with every peer; whether anything moved.
    fn poll(&mut self) -> CResult<bool> {
        if !self.scanned && !self.t.unexpected.is_empty() {
            self.scan_unexpected()?;
        }
        let mut moved = false;
        for i in 0..self.t.peers.len() {
            let p = self.t.peers[i];
            moved |= self.push(p)?;
            moved |= self.drain(p)?;
            if !self.t.rdvq[p].is_empty() {
                moved |= self.acks(p)?;
            }
        }
        Ok(moved)
    }

    fn find_recv(&self, peer: usize, tag: u64) -> Option<usize> {
        self.t
            .recvs
            .iter()
            .position(|r| r.peer == peer && r.tag == tag)
    }

    fn outstanding(&self) -> bool {
        !self.t.recvs.is_empty()
            || self.t.sendq.iter().any(|q| !q.is_empty())
            || self.t.rdvq.iter().any(|q| !q.is_empty())
            || self.t.inn.iter().any(|i| {
                matches!(
                    i.partial,
                    Some(Partial {
                        dest: Dest::Recv { .. },
                        ..
                    })
                )
            })
    }

    /// Withdraws every receive (what arrives for them from now on is kept or dropped
    /// by the transport, never written to this session's buffers).
    fn withdraw_recvs(&mut self) {
        self.t.recvs.clear();
        for i in &mut self.t.inn {
            if let Some(part) = &mut i.partial
                && matches!(part.dest, Dest::Recv { .. })
            {
                part.dest = Dest::Discard;
            }
        }
    }
}

impl Session for ShmSession<'_> {
    fn post_send(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        let r = self.post_send_inner(peer, tag, region, token, false);
        self.note(r)
    }

    fn post_recv(&mut self, peer: usize, tag: u64, region: Region, token: u32) -> CResult<()> {
        let r = self.post_recv_inner(peer, tag, region, token, false);
        self.note(r)
    }

    fn post_recv_up_to(
        &mut self,
        peer: usize,
        tag: u64,
        region: Region,
        token: u32,
    ) -> CResult<()> {
        let r = self.post_recv_inner(peer, tag, region, token, true);
        self.note(r)
    }

    fn received_len(&mut self, token: u32) -> Option<usize> {
        take_len(&mut self.lens, token)
    }

    fn post_poison(&mut self, peer: usize, tag: u64) -> CResult<()> {
        if !self.t.reaches(peer) {
            return Ok(());
        }
        let empty = Region::new(halo_collectives::Buf::Send, 0, 0);
        self.post_send_inner(peer, tag, empty, POISON_TOKEN, true)
    }

    fn copy(&mut self, src: Region, dst: Region) -> CResult<()> {
        self.bufs.copy(src, dst)
    }

    fn read(&mut self, region: Region, out: &mut [u8]) -> CResult<()> {
        // This transport writes receive buffers only inside its own calls (ring copies
        // and `process_vm_readv` into this process), never behind the caller's back.
        self.bufs.read(region, out)
    }

    fn progress(&mut self, completed: &mut Vec<u32>) -> CResult<()> {
        let r = self.poll();
        let moved = self.note(r)?;
        if moved || !self.done.is_empty() {
            self.idle_since = None;
        }
        completed.append(&mut self.done);
        Ok(())
    }

    fn test(&mut self, token: u32) -> CResult<bool> {
        let r = self.poll();
        self.note(r)?;
        if let Some(i) = self.done.iter().position(|&t| t == token) {
            self.done.swap_remove(i);
            return Ok(true);
        }
        let pending = self.t.recvs.iter().any(|r| r.token == token)
            || self.t.sendq.iter().flatten().any(|s| s.token == token)
            || self.t.rdvq.iter().flatten().any(|s| s.token == token)
            || self.t.inn.iter().any(|i| {
                matches!(i.partial, Some(Partial { dest: Dest::Recv { token: t, .. }, .. }) if t == token)
            });
        Ok(!pending)
    }

    fn cancel(&mut self, token: u32) -> CResult<()> {
        self.t.recvs.retain(|r| r.token != token);
        for i in &mut self.t.inn {
            if let Some(part) = &mut i.partial
                && matches!(part.dest, Dest::Recv { token: t, .. } if t == token)
            {
                part.dest = Dest::Discard;
            }
        }
        // A rendezvous not yet read is withdrawn (its receiver fails with an error
        // naming this rank); one read already completes as usual.
        let me = self.t.rank;
        let slots = self.t.seg.slots() as u64;
        for p in 0..self.t.size {
            let seg = &self.t.seg;
            self.t.rdvq[p].retain(|r| {
                r.token != token
                    || seg
                        .rdv(me, p, (r.seq % slots) as usize)
                        .state
                        .compare_exchange(OFFERED, REVOKED, Ordering::AcqRel, Ordering::Acquire)
                        .is_err()
            });
        }
        let mut torn = false;
        for q in &mut self.t.sendq {
            torn |= q.iter().any(|s| s.token == token && s.started);
            q.retain(|s| s.token != token || s.started);
        }
        if torn {
            // Part of the message is in the ring: the rest must follow or the ring is
            // out of step. It stays queued; the session breaks the transport on drop.
            let r: CResult<()> = Err(CollectiveError::Internal(format!(
                "operation {token} cancelled halfway through its message"
            )));
            return self.note(r);
        }
        Ok(())
    }

    fn wait(&mut self, max: Duration) -> CResult<()> {
        self.wait_inner(max)
    }
}

impl Drop for ShmSession<'_> {
    fn drop(&mut self) {
        self.done.clear();
        self.t.done_spare = std::mem::take(&mut self.done);
        // Operations still outstanding mean the collective did not complete (the
        // engine returns success only when every step has): the transport breaks.
        let failed = self.outstanding() || self.error.is_some();
        if !failed {
            return;
        }
        let peers = self.waited_for();
        let why = match &self.error {
            Some(e) => format!("a collective failed on this rank ({e})"),
            None => format!(
                "a collective did not complete on this rank (timed out or aborted while \
                 waiting for ranks {peers:?})"
            ),
        };
        self.withdraw_recvs();
        if self.mismatch {
            // Let this rank's queued sends and poison reach their receivers, so that
            // they fail with the mismatch too; keep draining meanwhile so that peers
            // blocked on a full ring to this rank move on.
            let deadline = Instant::now() + FLUSH_SENDS;
            while Instant::now() < deadline
                && (self.t.sendq.iter().any(|q| !q.is_empty())
                    || self.t.rdvq.iter().any(|q| !q.is_empty()))
            {
                // Errors (more mismatches, poison) are expected here.
                let _ = self.poll();
                self.withdraw_recvs();
                std::thread::yield_now();
            }
        }
        for q in &mut self.t.sendq {
            q.clear();
        }
        self.revoke_rdvs();
        self.done.clear();
        tracing::warn!(
            rank = self.t.rank,
            "{why}; the shared-memory transport is now unusable"
        );
        self.t.broken = Some(why);
    }
}
