//! One collective's operations on the shared-memory transport: posting, matching,
//! moving cells through the rings, waiting, and the [`Session`] impl.

use super::cma::{self, CLAIMED, CMA_OK, CMA_UNKNOWN, CmaMode, DONE, FAILED, OFFERED, REVOKED};
use super::segment::{
    CELL_HEAD, CellHead, KIND_FIRST, KIND_MORE, KIND_POISON, KIND_RDV, publish, published, stamp,
    write_head,
};
use super::{CResult, ShmTransport};
use crate::transport::liveness::has_ended;
use crate::transport::raw::RawBuffers;
use crate::transport::{Expected, mismatch, poisoned, take_len};
use halo_collectives::{Call, CollectiveError, Region, Session, TAG_BITS};
use std::ptr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The token of poison messages (never a step of a schedule, never reported).
const POISON_TOKEN: u32 = u32::MAX;
/// How long a rank that found a size mismatch keeps delivering its queued sends
/// before the transport breaks (as the fabric transport).
const FLUSH_SENDS: Duration = Duration::from_millis(500);
/// How often, while waiting, the processes of the peers waited for are looked at.
const WATCH_EVERY: Duration = Duration::from_millis(50);
/// The longest single sleep on the bell (a lost wake-up costs at most this).
const SLEEP_MAX: Duration = Duration::from_millis(1);
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
/// Bytes of a cache line (a cell's first holds its header and first payload bytes).
const LINE: usize = 64;

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
        if tag >> TAG_BITS != 0 {
            return Err(CollectiveError::Internal(format!(
                "tag {tag:#x} wider than {TAG_BITS} bits"
            )));
        }
        Ok(self.tag_base | tag)
    }

    fn check_peer(&self, peer: usize) -> CResult<()> {
        if !self.t.reaches(peer) {
            return Err(CollectiveError::Internal(format!(
                "no route to rank {peer} over shared memory"
            )));
        }
        Ok(())
    }

    /// The error when a message of `len` bytes carrying the descriptor `call` from
    /// `peer` meets a receive of `want` bytes (`up_to`: at most `want`); `None` when they
    /// agree.
    fn refuse(
        &self,
        peer: usize,
        tag: u64,
        (len, call): (usize, u64),
        want: usize,
        up_to: bool,
    ) -> Option<CollectiveError> {
        let (theirs, ours) = (Call::from_raw(call), Call::from_raw(self.call));
        let fits = if up_to { len <= want } else { len == want };
        let differ = !fits || !ours.agrees(theirs);
        differ.then(|| {
            let me = self.t.rank;
            mismatch(
                peer,
                me,
                tag,
                (Some(len), theirs),
                Expected {
                    len: want,
                    call: ours,
                },
                me,
            )
        })
    }

    /// Whether the message starting with `h` belongs to this call (its sequence number
    /// and communicator) but carries another call's descriptor.
    fn stray(&self, h: &CellHead) -> bool {
        matches!(h.kind(), KIND_FIRST | KIND_RDV | KIND_POISON)
            && (h.tag ^ self.tag_base) >> TAG_BITS == 0
            && !Call::from_raw(self.call).agrees(Call::from_raw(h.call))
    }

    /// The error of [`Self::stray`]'s message from `p`.
    fn stray_error(&self, p: usize, h: &CellHead) -> CollectiveError {
        let me = self.t.rank;
        if h.kind() == KIND_POISON {
            return poisoned(
                p,
                me,
                h.tag,
                Call::from_raw(h.call),
                Call::from_raw(self.call),
            );
        }
        let len = usize::try_from(h.len).unwrap_or(usize::MAX);
        mismatch(
            p,
            me,
            h.tag,
            (Some(len), Call::from_raw(h.call)),
            Expected {
                len,
                call: Call::from_raw(self.call),
            },
            me,
        )
    }

    /// Messages of this call read during an earlier one (into memory of the transport's
    /// own) from a rank that made another call: the first fails this call.
    fn scan_unexpected(&mut self) -> CResult<()> {
        self.scanned = true;
        let ours = Call::from_raw(self.call);
        let seq = self.tag_base >> TAG_BITS;
        let Some(i) = self
            .t
            .unexpected
            .iter()
            .position(|u| u.tag >> TAG_BITS == seq && !ours.agrees(Call::from_raw(u.call)))
        else {
            return Ok(());
        };
        let u = self.t.unexpected.remove(i);
        let me = self.t.rank;
        if u.poison {
            return Err(poisoned(u.peer, me, u.tag, Call::from_raw(u.call), ours));
        }
        Err(mismatch(
            u.peer,
            me,
            u.tag,
            (Some(u.data.len()), Call::from_raw(u.call)),
            Expected {
                len: u.data.len(),
                call: ours,
            },
            me,
        ))
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

    /// Whether sends of `len` bytes to `p` go by rendezvous (asks the ring the first
    /// time: the receiver says whether it can read this process).
    fn rendezvous(t: &mut ShmTransport, p: usize, len: usize) -> bool {
        if len < t.cma.min || t.cma.mode == CmaMode::Off {
            return false;
        }
        match t.cma_to[p] {
            Some(b) => b,
            None => match t.seg.ring(t.rank, p).cma.load(Ordering::Acquire) {
                CMA_UNKNOWN => false,
                w => {
                    t.cma_to[p] = Some(w == CMA_OK);
                    w == CMA_OK
                }
            },
        }
    }

    /// Completes the rendezvous sends to `p` the receiver has acked, in ring order;
    /// fails on one whose read failed.
    fn acks(&mut self, p: usize) -> CResult<bool> {
        let me = self.t.rank;
        let slots = self.t.seg.slots() as u64;
        let mut moved = false;
        while let Some(r) = self.t.rdvq[p].front() {
            let st = self
                .t
                .seg
                .rdv(me, p, (r.seq % slots) as usize)
                .state
                .load(Ordering::Acquire);
            match st {
                DONE => {
                    self.done.push(r.token);
                    self.t.rdvq[p].pop_front();
                    moved = true;
                }
                FAILED => {
                    self.t.rdvq[p].pop_front();
                    return Err(CollectiveError::Remote {
                        peer: p,
                        message: format!(
                            "rank {p} could not read rank {me}'s message from its memory \
                            (process_vm_readv failed there; HALO_SHM_CMA=0 turns cross-memory \
                            attach off)"
                        ),
                    });
                }
                _ => break,
            }
        }
        Ok(moved)
    }

    /// Writes queued sends to `peer` into its ring while there is room.
    fn push(&mut self, p: usize) -> CResult<bool> {
        if self.t.sendq[p].is_empty() {
            return Ok(false);
        }
        let slots = self.t.seg.slots() as u64;
        let mut moved = false;
        loop {
            let t = &mut *self.t;
            let me = t.rank;
            let Some(op) = t.sendq[p].front() else { break };
            let rdv = !op.started && !op.poison && Self::rendezvous(t, p, op.len);
            let out = &mut t.out[p];
            let ring = t.seg.ring(me, p);
            if out.tail - out.head_cache >= slots {
                out.head_cache = ring.head.load(Ordering::Acquire);
                if out.tail - out.head_cache >= slots {
                    break;
                }
            }
            // A rendezvous in the cell about to be reused is over (the receiver sets
            // its state before it frees the cell): complete it first.
            if t.rdvq[p]
                .front()
                .is_some_and(|r| r.seq + slots <= t.out[p].tail)
            {
                self.acks(p)?;
                if self.t.rdvq[p]
                    .front()
                    .is_some_and(|r| r.seq + slots <= self.t.out[p].tail)
                {
                    return Err(CollectiveError::Internal(format!(
                        "shm ring to rank {p}: a rendezvous cell was freed before its ack"
                    )));
                }
                continue;
            }
            if rdv {
                let seq = t.out[p].tail;
                let i = (seq % slots) as usize;
                let op = t.sendq[p].pop_front().expect("checked");
                let head = CellHead {
                    tag: op.tag,
                    len: op.len as u64,
                    call: op.call,
                    stamp: stamp(KIND_RDV, seq),
                    chunk: 0,
                };
                let cell = t.seg.cell(me, p, i);
                // SAFETY: the cell is free (tail - head < slots) and ours to write
                // until its stamp's Release store below publishes it.
                unsafe { write_head(cell, &head) };
                let r = t.seg.rdv(me, p, i);
                r.addr.store(op.src as u64, Ordering::Relaxed);
                r.state.store(OFFERED, Ordering::Relaxed);
                // SAFETY: as above; header and offer are written.
                unsafe { publish(cell, head.stamp) };
                t.out[p].tail += 1;
                t.rdvq[p].push_back(RdvSend {
                    token: op.token,
                    seq,
                });
                t.rdv_sent += 1;
                moved = true;
                continue;
            }
            let payload = t.seg.payload();
            let op = t.sendq[p].front_mut().expect("checked");
            let out = &mut t.out[p];
            let seg = &t.seg;
            let cell = seg.cell(me, p, (out.tail % slots) as usize);
            let n = (op.len - op.sent).min(payload);
            let head = CellHead {
                tag: op.tag,
                len: op.len as u64,
                call: op.call,
                stamp: stamp(
                    if op.poison {
                        KIND_POISON
                    } else if op.started {
                        KIND_MORE
                    } else {
                        KIND_FIRST
                    },
                    out.tail,
                ),
                chunk: n as u32,
            };
            // SAFETY: the cell is `cell` bytes inside the mapping, 64-aligned, and free
            // (tail - head < slots: the receiver consumed it and will not read it until
            // its stamp's Release store below publishes it); `op.src + sent .. + n` lies
            // in the send region bounds-checked when the send was posted, in a buffer
            // the session borrows (the queue is emptied before the session ends);
            // `n <= payload` fits the cell after its header.
            unsafe {
                // The bytes past the first cache line first, then the first line
                // (header and 32 bytes) and at once the stamp: the receiver polls the
                // first line, so it is written in one short burst.
                let first = n.min(LINE - CELL_HEAD);
                if n > first {
                    ptr::copy_nonoverlapping(
                        op.src.add(op.sent + first),
                        cell.add(LINE),
                        n - first,
                    );
                }
                if first > 0 {
                    ptr::copy_nonoverlapping(op.src.add(op.sent), cell.add(CELL_HEAD), first);
                }
                write_head(cell, &head);
                publish(cell, head.stamp);
            }
            op.sent += n;
            op.started = true;
            out.tail += 1;
            moved = true;
            if op.sent == op.len {
                let (token, poison) = (op.token, op.poison);
                t.sendq[p].pop_front();
                if !poison {
                    self.done.push(token);
                }
            }
        }
        if moved {
            self.t.seg.ring_bell(p);
        }
        Ok(moved)
    }

    /// Reads every published cell of the ring from `p`.
    fn drain(&mut self, p: usize) -> CResult<bool> {
        let me = self.t.rank;
        let slots = self.t.seg.slots() as u64;
        let payload = self.t.seg.payload();
        let mut out = Ok(());
        let mut moved = false;
        loop {
            let seq = self.t.inn[p].head;
            let cell = self.t.seg.cell(p, me, (seq % slots) as usize);
            // SAFETY: the cell where number `seq` of the ring from `p` goes.
            if !unsafe { published(cell, seq) } {
                break;
            }
            prefetch_payload(cell);
            // SAFETY: the cell is inside the mapping, 64-aligned, and published (its
            // stamp read with Acquire); the sender does not touch it again until the
            // head's Release store frees it.
            let head: CellHead = unsafe { ptr::read(cell.cast::<CellHead>()) };
            let first = self.t.inn[p].partial.is_none();
            if first && head.call != self.call && self.stray(&head) {
                // A message of this call from a rank that made another call: refused
                // whatever its tag (the two calls' schedules may never post a receive
                // for it), read and dropped, and this call fails naming both.
                out = Err(self.stray_error(p, &head));
                if head.kind() == KIND_RDV {
                    let rdv = self.t.seg.rdv(p, me, (seq % slots) as usize);
                    let _ = rdv.state.compare_exchange(
                        OFFERED,
                        DONE,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                } else {
                    let len = usize::try_from(head.len).unwrap_or(usize::MAX);
                    let got = (head.chunk as usize).min(payload).min(len);
                    if got < len {
                        self.t.inn[p].partial = Some(Partial {
                            tag: head.tag,
                            len,
                            call: head.call,
                            got,
                            dest: Dest::Discard,
                        });
                    }
                }
                let inn = &mut self.t.inn[p];
                inn.head += 1;
                inn.held_since = None;
                moved = true;
                self.t
                    .seg
                    .ring(p, me)
                    .head
                    .store(inn.head, Ordering::Release);
                break;
            }
            if first && !self.t.recvs.iter().any(|r| r.peer == p) {
                // A message no receive is posted for, and none from `p` at all: nothing
                // this rank waits for can be stuck behind it. Its receive may come in
                // a moment: leave it at the head for a while.
                let now = Instant::now();
                let since = *self.t.inn[p].held_since.get_or_insert(now);
                if now.saturating_duration_since(since) < self.t.hold {
                    break;
                }
            }
            self.t.inn[p].held_since = None;
            if head.kind() == KIND_RDV && first {
                out = self.take_rdv(p, &head, (seq % slots) as usize);
            } else {
                let chunk = (head.chunk as usize).min(payload);
                // SAFETY: as above; the payload follows the header inside the cell.
                let data = unsafe { cell.add(CELL_HEAD) };
                out = self.accept(p, &head, data, chunk);
            }
            let inn = &mut self.t.inn[p];
            inn.head += 1;
            moved = true;
            self.t
                .seg
                .ring(p, me)
                .head
                .store(inn.head, Ordering::Release);
            if out.is_err() {
                break;
            }
        }
        if moved {
            self.t.seg.ring_bell(p);
        }
        out.map(|()| moved)
    }

    /// Takes one cell from `p`.
    fn accept(&mut self, p: usize, h: &CellHead, data: *const u8, chunk: usize) -> CResult<()> {
        let me = self.t.rank;
        let part = match self.t.inn[p].partial.take() {
            Some(part) => {
                if h.kind() != KIND_MORE || h.tag != part.tag {
                    return Err(CollectiveError::Internal(format!(
                        "shm ring from rank {p}: cell of kind {} (tag {:#x}) inside message \
                         {:#x}",
                        h.kind(),
                        h.tag,
                        part.tag
                    )));
                }
                part
            }
            None => match h.kind() {
                KIND_POISON => {
                    if let Some(i) = self.find_recv(p, h.tag) {
                        self.t.recvs.remove(i);
                        return Err(poisoned(
                            p,
                            me,
                            h.tag,
                            Call::from_raw(h.call),
                            Call::from_raw(self.call),
                        ));
                    }
                    self.t.unexpected.push(Unexpected {
                        peer: p,
                        tag: h.tag,
                        call: h.call,
                        poison: true,
                        data: Vec::new(),
                    });
                    return Ok(());
                }
                KIND_FIRST => {
                    let len = usize::try_from(h.len).unwrap_or(usize::MAX);
                    let mut part = Partial {
                        tag: h.tag,
                        len,
                        call: h.call,
                        got: 0,
                        dest: Dest::Discard,
                    };
                    match self.find_recv(p, h.tag) {
                        Some(i) => {
                            let r = self.t.recvs.remove(i);
                            if let Some(e) = self.refuse(p, h.tag, (len, h.call), r.len, r.up_to) {
                                // The rest of it is read and dropped.
                                part.got = chunk.min(len);
                                if part.got < len {
                                    self.t.inn[p].partial = Some(part);
                                }
                                return Err(e);
                            }
                            part.dest = Dest::Recv {
                                token: r.token,
                                dst: r.dst,
                                up_to: r.up_to,
                            };
                        }
                        None => {
                            self.t.buffered += 1;
                            tracing::trace!(peer = p, len, "message read ahead of its receive");
                            part.dest = Dest::Heap(Vec::with_capacity(len.min(1 << 20)));
                        }
                    }
                    part
                }
                k => {
                    return Err(CollectiveError::Internal(format!(
                        "shm ring from rank {p}: a message starts with a cell of kind {k}"
                    )));
                }
            },
        };
        let mut part = part;
        let n = chunk.min(part.len - part.got);
        match &mut part.dest {
            Dest::Recv { dst, .. } => {
                // SAFETY: `dst .. + len` is the posted receive region, bounds-checked at
                // post time in a buffer the session borrows mutably (receives are
                // withdrawn before the session ends); `got + n <= len`; the source is
                // `n <= payload` published bytes of the cell.
                unsafe { ptr::copy_nonoverlapping(data, dst.add(part.got), n) };
            }
            Dest::Heap(v) => {
                // SAFETY: `n` published payload bytes of the cell (see `drain`).
                v.extend_from_slice(unsafe { std::slice::from_raw_parts(data, n) });
            }
            Dest::Discard => {}
        }
        part.got += n;
        if part.got < part.len {
            self.t.inn[p].partial = Some(part);
            return Ok(());
        }
        match part.dest {
            Dest::Recv { token, up_to, .. } => {
                if up_to {
                    self.lens.push((token, part.len));
                }
                self.done.push(token);
            }
            Dest::Heap(data) => self.t.unexpected.push(Unexpected {
                peer: p,
                tag: part.tag,
                call: part.call,
                poison: false,
                data,
            }),
            Dest::Discard => {}
        }
        Ok(())
    }

    /// Takes a rendezvous from `p` in cell `i` of its ring: reads the message from
    /// its process into the posted receive (or memory of the transport's own) and
    /// acks it (see `cma.rs`).
    fn take_rdv(&mut self, p: usize, h: &CellHead, i: usize) -> CResult<()> {
        let me = self.t.rank;
        let len = usize::try_from(h.len).unwrap_or(usize::MAX);
        let pid = self.t.cma_pid[p];
        let posted = self.find_recv(p, h.tag).map(|k| self.t.recvs.remove(k));
        let rdv = self.t.seg.rdv(p, me, i);
        let addr = rdv.addr.load(Ordering::Relaxed);
        let withdrawn = || CollectiveError::Remote {
            peer: p,
            message: format!(
                "rank {p} withdrew its message {:#x} before rank {me} had read it (its \
                 collective failed, timed out or was aborted)",
                h.tag
            ),
        };
        if let Some(r) = &posted
            && let Some(e) = self.refuse(p, h.tag, (len, h.call), r.len, r.up_to)
        {
            // Not read: the sender's send completes, as on the ring path.
            let _ = rdv
                .state
                .compare_exchange(OFFERED, DONE, Ordering::AcqRel, Ordering::Acquire);
            return Err(e);
        }
        if pid == 0 {
            rdv.state.store(FAILED, Ordering::Release);
            return Err(CollectiveError::Internal(format!(
                "shm ring from rank {p}: a rendezvous, but rank {me} did not offer to read \
                 rank {p}'s memory"
            )));
        }
        if rdv
            .state
            .compare_exchange(OFFERED, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return self.abandoned(p, h, posted, withdrawn());
        }
        let mut heap = Vec::new();
        let dst = match &posted {
            Some(r) => r.dst,
            None => {
                if let Err(e) = heap.try_reserve_exact(len) {
                    rdv.state.store(FAILED, Ordering::Release);
                    return Err(CollectiveError::System(format!(
                        "rank {me}: no memory for a message of {len} bytes from rank {p}: {e}"
                    )));
                }
                heap.as_mut_ptr()
            }
        };
        // SAFETY: `dst .. + len` is inside the posted receive's region (bounds-checked
        // at post time, `len` at most its length: `refuse` above), in a buffer the session
        // borrows mutably, or `heap`'s reserved capacity of `len` bytes; nothing else
        // touches either during the call.
        let read = unsafe { cma::read_from(pid, dst, addr, len) };
        if let Err(e) = read {
            rdv.state.store(FAILED, Ordering::Release);
            if e.raw_os_error() == Some(libc::ESRCH) {
                return Err(CollectiveError::Remote {
                    peer: p,
                    message: format!(
                        "rank {p} (process {pid}) ended before rank {me} had read its message"
                    ),
                });
            }
            return Err(CollectiveError::System(format!(
                "rank {me}: process_vm_readv of {len} bytes from rank {p} (process {pid}) \
                 failed: {e} (HALO_SHM_CMA=0 turns cross-memory attach off)"
            )));
        }
        if self.t.cma_pidfd[p].as_ref().is_some_and(cma::exited) {
            // The process may have ended before or during the read, and its pid may
            // name another process now: the bytes are not trusted.
            rdv.state.store(FAILED, Ordering::Release);
            return Err(CollectiveError::Remote {
                peer: p,
                message: format!(
                    "rank {p} (process {pid}) ended before rank {me} had read its message"
                ),
            });
        }
        if rdv
            .state
            .compare_exchange(CLAIMED, DONE, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // Withdrawn while it was read: the bytes may be anything.
            return self.abandoned(p, h, posted, withdrawn());
        }
        match posted {
            Some(r) => {
                if r.up_to {
                    self.lens.push((r.token, len));
                }
                self.done.push(r.token);
            }
            None => {
                self.t.buffered += 1;
                tracing::trace!(peer = p, len, "rendezvous read ahead of its receive");
                // SAFETY: the read filled all `len` reserved bytes.
                unsafe { heap.set_len(len) };
                self.t.unexpected.push(Unexpected {
                    peer: p,
                    tag: h.tag,
                    call: h.call,
                    poison: false,
                    data: heap,
                });
            }
        }
        Ok(())
    }

    /// A rendezvous the sender withdrew: fails the posted receive, or leaves poison
    /// for the one to come.
    fn abandoned(
        &mut self,
        p: usize,
        h: &CellHead,
        posted: Option<PostedRecv>,
        e: CollectiveError,
    ) -> CResult<()> {
        if posted.is_some() {
            return Err(e);
        }
        self.t.unexpected.push(Unexpected {
            peer: p,
            tag: h.tag,
            call: h.call,
            poison: true,
            data: Vec::new(),
        });
        Ok(())
    }

    /// Withdraws every rendezvous send not yet acked (the session ends without them:
    /// their buffers go back to the caller). A receiver that reads one now drops it.
    fn revoke_rdvs(&mut self) {
        let me = self.t.rank;
        let slots = self.t.seg.slots() as u64;
        for p in 0..self.t.size {
            for r in std::mem::take(&mut self.t.rdvq[p]) {
                let st = &self.t.seg.rdv(me, p, (r.seq % slots) as usize).state;
                let mut cur = st.load(Ordering::Acquire);
                while cur == OFFERED || cur == CLAIMED {
                    match st.compare_exchange(cur, REVOKED, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => break,
                        Err(c) => cur = c,
                    }
                }
            }
        }
    }

    fn find_recv(&self, peer: usize, tag: u64) -> Option<usize> {
        self.t
            .recvs
            .iter()
            .position(|r| r.peer == peer && r.tag == tag)
    }

    fn post_recv_inner(
        &mut self,
        peer: usize,
        tag: u64,
        region: Region,
        token: u32,
        up_to: bool,
    ) -> CResult<()> {
        self.check_peer(peer)?;
        let tag = self.full_tag(tag)?;
        let dst = self.bufs.locate_write(region)?;
        let want = region.len;
        let me = self.t.rank;
        if let Some(i) = self
            .t
            .unexpected
            .iter()
            .position(|u| u.peer == peer && u.tag == tag)
        {
            let u = self.t.unexpected.remove(i);
            if u.poison {
                return Err(poisoned(
                    peer,
                    me,
                    tag,
                    Call::from_raw(u.call),
                    Call::from_raw(self.call),
                ));
            }
            let len = u.data.len();
            if let Some(e) = self.refuse(peer, tag, (len, u.call), want, up_to) {
                return Err(e);
            }
            // SAFETY: `dst .. + want` was bounds-checked just above in a buffer the
            // session borrows mutably; `u.data` holds `len <= want` bytes (checked).
            unsafe { ptr::copy_nonoverlapping(u.data.as_ptr(), dst, len) };
            if up_to {
                self.lens.push((token, len));
            }
            self.done.push(token);
            return Ok(());
        }
        let in_progress = matches!(
            &self.t.inn[peer].partial,
            Some(Partial { tag: t, dest: Dest::Heap(_), .. }) if *t == tag
        );
        if in_progress {
            let (len, call) = {
                let part = self.t.inn[peer].partial.as_ref().expect("checked");
                (part.len, part.call)
            };
            let refused = self.refuse(peer, tag, (len, call), want, up_to);
            let part = self.t.inn[peer].partial.as_mut().expect("checked");
            let dest = std::mem::replace(&mut part.dest, Dest::Discard);
            if let Some(e) = refused {
                return Err(e);
            }
            if let Dest::Heap(v) = dest {
                // SAFETY: `v` holds the `got <= want` bytes that arrived so far; the
                // destination was bounds-checked for `want` bytes above.
                unsafe { ptr::copy_nonoverlapping(v.as_ptr(), dst, v.len()) };
            }
            part.dest = Dest::Recv { token, dst, up_to };
            return Ok(());
        }
        self.t.recvs.push(PostedRecv {
            token,
            peer,
            tag,
            dst,
            len: want,
            up_to,
        });
        Ok(())
    }

    fn post_send_inner(
        &mut self,
        peer: usize,
        tag: u64,
        region: Region,
        token: u32,
        poison: bool,
    ) -> CResult<()> {
        self.check_peer(peer)?;
        let tag = self.full_tag(tag)?;
        let src = self.bufs.locate(region)?;
        self.t.sendq[peer].push_back(SendOp {
            token,
            tag,
            src,
            len: region.len,
            sent: 0,
            started: false,
            call: self.call,
            poison,
        });
        // Eager: into the ring now, if there is room.
        self.push(peer)?;
        Ok(())
    }

    /// The peers an outstanding operation of this rank needs.
    fn waited_for(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.t.recvs.iter().map(|r| r.peer).collect();
        for p in 0..self.t.size {
            let partial_recv = matches!(
                self.t.inn[p].partial,
                Some(Partial {
                    dest: Dest::Recv { .. },
                    ..
                })
            );
            if partial_recv || !self.t.sendq[p].is_empty() || !self.t.rdvq[p].is_empty() {
                v.push(p);
            }
        }
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Every `WATCH_EVERY` while waiting: fails with `Remote` when the process of a
    /// peer an outstanding operation needs has ended (after reading what it published).
    fn watch_peers(&mut self, now: Instant) -> CResult<()> {
        let last = *self.last_watch.get_or_insert(now);
        if now.saturating_duration_since(last) < WATCH_EVERY
            || self.t.procs.iter().all(Option::is_none)
        {
            return Ok(());
        }
        self.last_watch = Some(now);
        let ended = self
            .waited_for()
            .into_iter()
            .find_map(|p| self.t.procs[p].filter(|&w| has_ended(w)).map(|w| (p, w)));
        let Some((peer, proc_)) = ended else {
            return Ok(());
        };
        // What it published before it ended is still in the ring.
        self.poll()?;
        if !self.waited_for().contains(&peer) {
            self.t.procs[peer] = None;
            return Ok(());
        }
        Err(CollectiveError::Remote {
            peer,
            message: format!(
                "rank {peer} (process {} on this host) ended while rank {} was waiting for it",
                proc_.pid, self.t.rank
            ),
        })
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
        if !self.done.is_empty() {
            return Ok(());
        }
        // One look at the clock per wait.
        let now = Instant::now();
        let r = self.watch_peers(now);
        self.note(r)?;
        let idle = now.saturating_duration_since(*self.idle_since.get_or_insert(now));
        if idle < self.t.pure && !self.t.yield_spin {
            // A few pauses only: the next poll comes sooner (a 1-byte ping-pong
            // notices the message up to ~16 pauses earlier than with 16).
            for _ in 0..2 {
                std::hint::spin_loop();
            }
            return Ok(());
        }
        if idle < self.t.spin {
            std::thread::yield_now();
            return Ok(());
        }
        let timeout = max.clamp(Duration::from_micros(1), SLEEP_MAX);
        let me = self.t.rank;
        self.t.seg.mark_asleep(me);
        // Look once more after marking: a peer that published before the mark did not
        // see it (see `Segment::ring_bell`).
        let r = self.poll();
        if matches!(r, Ok(false)) && self.done.is_empty() {
            self.t.seg.futex_wait(me, timeout);
        }
        self.t.seg.mark_awake(me);
        if matches!(r, Ok(true)) {
            self.idle_since = None;
        }
        self.note(r).map(|_| ())
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

/// Asks for the cache lines after a cell's first as soon as the cell is seen published:
/// they come from the sender's core while the header is read and the receive matched,
/// instead of after (the copy's length comes from the header). 128-byte ping-pong, 2
/// processes: 0.33-0.35 us with it, 0.40-0.41 us without (docs/bench/JOURNAL.md). Lines
/// the sender did not write cost a read of the shared segment and nothing else: a
/// prefetch never faults and changes nothing.
#[inline(always)]
fn prefetch_payload(cell: *const u8) {
    #[cfg(target_arch = "x86_64")]
    for line in 1..PREFETCH_LINES {
        // SAFETY: a prefetch is a hint: it neither faults nor writes, whatever the address
        // (`wrapping_add` keeps the pointer arithmetic defined).
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                cell.wrapping_add(line * LINE).cast::<i8>(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = cell;
}

/// How many cache lines of a cell [`prefetch_payload`] covers (the first included).
const PREFETCH_LINES: usize = 5;
