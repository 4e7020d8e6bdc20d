//! The receiving side of a session: posting a receive (from a message read ahead of
//! it, one whose cells are arriving, or to wait for) and reading every published cell
//! of the ring from each peer: matching it to its receive, holding a message whose
//! receive is not posted yet, reading it into memory of the transport's own
//! otherwise; and the prefetch of a cell's payload.

use super::{CResult, Dest, LINE, Partial, PostedRecv, ShmSession, Unexpected};
use crate::transport::poisoned;
use crate::transport::shm::cma::{DONE, OFFERED};
use crate::transport::shm::segment::{
    CELL_HEAD, CellHead, KIND_FIRST, KIND_MORE, KIND_POISON, KIND_RDV, published,
};
use halo_collectives::{Call, CollectiveError, Region};
use std::ptr;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl ShmSession<'_> {
    /// Reads every published cell of the ring from `p`.
    pub(super) fn drain(&mut self, p: usize) -> CResult<bool> {
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

    pub(super) fn post_recv_inner(
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
