//! The rendezvous (single copy, see `shm/cma.rs`) on both sides of a session: whether a
//! send goes by it; the receiver's read of the sender's memory into the posted receive
//! (or memory of the transport's own) and its ack; the sender's completion on the ack
//! and its withdrawal of the offers not yet acked when the session ends.

use super::{CResult, PostedRecv, ShmSession, ShmTransport, Unexpected};
use crate::transport::shm::cma::{
    self, CLAIMED, CMA_OK, CMA_UNKNOWN, CmaMode, DONE, FAILED, OFFERED, REVOKED,
};
use crate::transport::shm::segment::CellHead;
use halo_collectives::CollectiveError;
use std::sync::atomic::Ordering;

impl ShmSession<'_> {
    /// Whether sends of `len` bytes to `p` go by rendezvous (asks the ring the first
    /// time: the receiver says whether it can read this process).
    pub(super) fn rendezvous(t: &mut ShmTransport, p: usize, len: usize) -> bool {
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
    pub(super) fn acks(&mut self, p: usize) -> CResult<bool> {
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

    /// Takes a rendezvous from `p` in cell `i` of its ring: reads the message from
    /// its process into the posted receive (or memory of the transport's own) and
    /// acks it (see `cma.rs`).
    pub(super) fn take_rdv(&mut self, p: usize, h: &CellHead, i: usize) -> CResult<()> {
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
    pub(super) fn revoke_rdvs(&mut self) {
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
}
