//! The in-process transport's session: posting, matching and copying one collective's
//! messages, its progress and waiting, and the withdrawal of unclaimed descriptors when
//! it ends (see the parent module for how a message moves).

use super::*;

impl LocalSession<'_> {
    fn me(&self) -> usize {
        self.ep.rank
    }

    fn size(&self) -> usize {
        self.ep.shared.mailboxes.len()
    }

    fn full_tag(&self, tag: u64) -> CResult<u64> {
        crate::transport::full_tag(self.tag_base, tag)
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
                    (Some(d.len), d.call),
                    expected,
                    me,
                ));
            }
            self.pool.ready.push(ack.token);
        }
        if !self.scanned {
            // Messages of this call that arrived during an earlier one.
            self.scanned = true;
            let seq = self.tag_base >> TAG_BITS;
            let stray = self.ep.unexpected.values().find_map(|q| {
                q.iter()
                    .find(|d| !d.poison && d.tag >> TAG_BITS == seq && !self.call.agrees(d.call))
                    .cloned()
            });
            if let Some(d) = stray {
                self.refuse_call(&d)?;
            }
        }
        while let Some(d) = mine.incoming.pop() {
            // A message of this call (its sequence number) from a rank that made another
            // call fails it at once, whatever its tag (the two calls' schedules may never
            // post a receive for it), withdrawn or not (a sender that found the mismatch
            // first withdraws its sends).
            if !d.poison
                && d.tag >> TAG_BITS == self.tag_base >> TAG_BITS
                && !self.call.agrees(d.call)
            {
                self.refuse_call(&d)?;
            }
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

    /// Refuses `desc`, a message of this call from a rank whose call has another
    /// descriptor: the sender is told (its send fails with the same words) and this
    /// session fails naming both calls (also when its sender withdrew it: that sender
    /// failed already, and nobody is told).
    fn refuse_call(&mut self, desc: &Desc) -> CResult<()> {
        let expected = Expected {
            len: desc.len,
            call: self.call,
        };
        if desc
            .state
            .compare_exchange(POSTED, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            desc.state.store(REJECTED, Ordering::Release);
            let sender = &self.ep.shared.mailboxes[desc.src as usize];
            sender.acks.push(Ack {
                session: desc.session,
                token: desc.token,
                rejected: Some(expected),
            });
            sender.unparker.unpark();
        }
        self.mismatch = true;
        let me = self.me();
        Err(mismatch(
            desc.src as usize,
            me,
            desc.tag,
            (Some(desc.len), desc.call),
            expected,
            me,
        ))
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
            return Err(poisoned(
                desc.src as usize,
                self.me(),
                desc.tag,
                desc.call,
                self.call,
            ));
        }
        let expected = Expected {
            len: recv.region.len,
            call: self.call,
        };
        let blocks_differ = !self.call.agrees(desc.call);
        let fits = if recv.up_to {
            desc.len <= recv.region.len
        } else {
            desc.len == recv.region.len
        };
        if !fits || blocks_differ {
            // Rejected, not copied: both ends fail, with the same words.
            finish(REJECTED, Some(expected));
            self.mismatch = true;
            let me = self.me();
            return Err(mismatch(
                desc.src as usize,
                me,
                desc.tag,
                (Some(desc.len), desc.call),
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
        if recv.up_to {
            self.pool.lens.push((recv.token, desc.len));
        }
        self.pool.ready.push(recv.token);
        Ok(())
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
        self.locate_write(region)?;
        let key = (peer as u32, tag);
        let recv = PostedRecv {
            region,
            token,
            up_to,
        };
        if self.pool.posted.insert(key, recv).is_some() {
            return Err(CollectiveError::Internal(format!(
                "two receives posted from rank {peer} with tag {tag:#x}"
            )));
        }
        self.try_match(key)
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
            call: self.call,
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
        shared
            .traffic
            .record(&shared.topology, self.ep.rank, peer, region.len);
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
            call: self.call,
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
        self.post_recv_inner(peer, tag, region, token, false)
    }

    fn post_recv_up_to(
        &mut self,
        peer: usize,
        tag: u64,
        region: Region,
        token: u32,
    ) -> CResult<()> {
        self.post_recv_inner(peer, tag, region, token, true)
    }

    fn received_len(&mut self, token: u32) -> Option<usize> {
        crate::transport::take_len(&mut self.pool.lens, token)
    }

    fn read(&mut self, region: Region, out: &mut [u8]) -> CResult<()> {
        if out.len() != region.len {
            return Err(CollectiveError::Internal(format!(
                "read {region} into {} bytes: lengths differ",
                out.len()
            )));
        }
        let (from, _) = self.locate(region)?;
        if region.len > 0 {
            // SAFETY: the region was bounds-checked against the session's buffers, which
            // the session borrows; receives are copied in by this rank's own calls only
            // (a peer reads this rank's sends, never writes its buffers), so nothing
            // writes the region during the copy; `out` is a distinct exclusive slice.
            unsafe {
                std::ptr::copy_nonoverlapping(from.cast_const(), out.as_mut_ptr(), region.len)
            };
        }
        Ok(())
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
        match WAIT.step(wait, wait) {
            Step::Sleep(wait) => self.ep.parker.park_timeout(wait),
            Step::Spin | Step::Yield => std::thread::yield_now(),
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
        pool.lens.clear();
        pool.live_sends.clear();
        self.ep.pool = pool;
    }
}
