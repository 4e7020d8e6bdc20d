//! The sending side of a session: posting a send (eager: into the ring at once if
//! there is room) and writing queued sends into the ring to each peer while it has
//! room — cell by cell, the bytes past the first cache line first, or one cell
//! offering a rendezvous (`rdv.rs` decides and completes it).

use super::{CResult, LINE, RdvSend, SendOp, ShmSession};
use crate::transport::shm::ShmTransport;
use crate::transport::shm::cma::OFFERED;
use crate::transport::shm::segment::{
    CELL_HEAD, CellHead, KIND_FIRST, KIND_MORE, KIND_POISON, KIND_RDV, publish, stamp, write_head,
};
use halo_collectives::{Call, CollectiveError, Region};
use std::ptr;
use std::sync::atomic::Ordering;

impl ShmSession<'_> {
    /// Writes queued sends to `peer` into its ring while there is room.
    pub(super) fn push(&mut self, p: usize) -> CResult<bool> {
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
            // its stamp's Release store publishes it); `op.src + sent .. + n` lies
            // in the send region bounds-checked when the send was posted, in a buffer
            // the session borrows (the queue is emptied before the session ends);
            // `n <= payload` fits the cell after its header.
            unsafe { fill_cell(cell, &head, op.src.add(op.sent), n) };
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

    pub(super) fn post_send_inner(
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
}

/// Writes a cell and publishes it: the bytes past the first cache line first, then the
/// first line (header and 32 bytes) and at once the stamp — the receiver polls the
/// first line, so it is written in one short burst.
///
/// # Safety
/// `cell` is a free cell of a ring this rank writes (the receiver does not read it
/// until the stamp's Release store), `n` fits its payload, and `src .. src + n` is
/// readable.
unsafe fn fill_cell(cell: *mut u8, head: &CellHead, src: *const u8, n: usize) {
    let first = n.min(LINE - CELL_HEAD);
    // SAFETY: the caller's: `n` bytes after the header fit the cell, `src` has them.
    unsafe {
        if n > first {
            ptr::copy_nonoverlapping(src.add(first), cell.add(LINE), n - first);
        }
        if first > 0 {
            ptr::copy_nonoverlapping(src, cell.add(CELL_HEAD), first);
        }
        write_head(cell, head);
        publish(cell, head.stamp);
    }
}

impl ShmTransport {
    /// Writes a whole message of one cell to `peer` now, outside any session, if it can
    /// be done without waiting (MPI's eager path for a non-blocking send that finds
    /// nothing ahead of it): the transport usable, nothing queued or unacknowledged to
    /// `peer`, a free cell in the ring, and `bytes` small enough for one cell and not
    /// for the single copy. `tag` is the message's whole tag, as a session makes it.
    /// Returns whether it did; when not, nothing changed.
    pub(crate) fn try_send_now(&mut self, peer: usize, tag: u64, bytes: &[u8]) -> bool {
        if self.broken.is_some()
            || !self.reaches(peer)
            || !self.sendq[peer].is_empty()
            || !self.rdvq[peer].is_empty()
            || bytes.len() > self.seg.payload()
            || ShmSession::rendezvous(self, peer, bytes.len())
        {
            return false;
        }
        let slots = self.seg.slots() as u64;
        let me = self.rank;
        let out = &mut self.out[peer];
        if out.tail - out.head_cache >= slots {
            out.head_cache = self.seg.ring(me, peer).head.load(Ordering::Acquire);
            if out.tail - out.head_cache >= slots {
                return false;
            }
        }
        let head = CellHead {
            tag,
            len: bytes.len() as u64,
            call: Call::NONE.to_raw(),
            stamp: stamp(KIND_FIRST, out.tail),
            chunk: bytes.len() as u32,
        };
        let cell = self.seg.cell(me, peer, (out.tail % slots) as usize);
        // SAFETY: the cell is free (tail - head < slots, the receiver freed it) and
        // inside the mapping; `bytes` fits its payload (checked above) and is borrowed
        // for the call.
        unsafe { fill_cell(cell, &head, bytes.as_ptr(), bytes.len()) };
        out.tail += 1;
        self.seg.ring_bell(peer);
        true
    }
}
