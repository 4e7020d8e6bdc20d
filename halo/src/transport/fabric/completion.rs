//! Completions: reading the completion queues, cancelling what is outstanding,
//! breaking the transport down after a failure, and blocking on the queues' file
//! descriptors (`block`).

use super::endpoint::{FabricEndpoint, sender_check};
use super::transport::{FabricTransport, OpCtx};
use super::watchdog::{
    CALL_CANCEL, CALL_CLOSE, CALL_CQ_READ, CALL_CQ_READERR, CALL_TRYWAIT, watched,
};
use super::{CResult, EAGAIN, EAVAIL, LOCAL, NET, WAIT};
use halo_collectives::{Call, CollectiveError};
use halo_fabric_sys as fi;
use std::ptr;
use std::time::{Duration, Instant};

impl FabricTransport {
    /// Reads every endpoint's completion queue once; completed tokens go to `done`.
    ///
    /// A queue with nothing posted on it and no refused post waiting for it is read
    /// only every 64th call: reading the `tcp;ofi_rxm` queue is an `epoll_wait`
    /// system call, which all-local collectives would otherwise pay on every poll.
    /// Reading it now and then keeps the provider's own progress going (connection
    /// requests from peers that are ahead of this rank).
    ///
    /// A peer's failure (an error completion) is returned after the rest of the queues
    /// was read, and a size mismatch found there is returned instead: a peer that
    /// failed on a mismatch with this rank may have closed its endpoint just after its
    /// last message, which this rank then reports as what it is.
    pub(super) fn poll(&mut self, done: &mut Vec<u32>) -> CResult<()> {
        self.polls = self.polls.wrapping_add(1);
        let sweep = self.polls.is_multiple_of(64);
        let mut failed: Option<CollectiveError> = None;
        for slot in [LOCAL, NET] {
            if !sweep
                && self.posted[slot] == 0
                && !self
                    .backlog
                    .iter()
                    .any(|d| self.routes[d.peer].ep as usize == slot)
            {
                continue;
            }
            while let Some(cq) = self.eps[slot].as_ref().map(|e| e.cq) {
                let mut entries = [fi::fi_cq_tagged_entry {
                    op_context: ptr::null_mut(),
                    flags: 0,
                    len: 0,
                    buf: ptr::null_mut(),
                    data: 0,
                    tag: 0,
                }; 32];
                // SAFETY: the CQ is open with FI_CQ_FORMAT_TAGGED, so each entry is an
                // fi_cq_tagged_entry; the array has room for the count passed.
                let ret = watched(&self.watched, CALL_CQ_READ, None, || unsafe {
                    fi::fi_cq_read(cq, entries.as_mut_ptr().cast(), entries.len())
                });
                if ret > 0 {
                    // Every entry is completed (and its context released) before the
                    // first error is returned.
                    let mut first = Ok(());
                    for en in &entries[..ret as usize] {
                        let r = self.complete(en, slot, done);
                        if first.is_ok() {
                            first = r;
                        }
                    }
                    first?;
                    if (ret as usize) < entries.len() {
                        break;
                    }
                } else if ret == EAGAIN {
                    break;
                } else if ret == EAVAIL {
                    let mut err = fi::fi_cq_err_entry::default();
                    // SAFETY: the CQ is open; `err` is a zeroed entry the provider fills.
                    let r = watched(&self.watched, CALL_CQ_READERR, None, || unsafe {
                        fi::fi_cq_readerr(cq, &mut err, 0)
                    });
                    if r == EAGAIN {
                        break;
                    }
                    let provider = self.provider_name(slot as u8);
                    if r < 0 {
                        return Err(CollectiveError::System(format!(
                            "fi_cq_readerr on {provider}: {}",
                            fi::strerror(r as i64)
                        )));
                    }
                    let ctx = err.op_context.cast::<OpCtx>();
                    if ctx.is_null() {
                        return Err(CollectiveError::System(format!(
                            "{provider} completion error without context: {}",
                            fi::strerror(i64::from(err.err))
                        )));
                    }
                    // SAFETY: every operation is posted with a context from `self.ctxs`,
                    // boxed and alive until released below.
                    let (peer, is_send, token, posted, tag) = unsafe {
                        let c = &*ctx;
                        (c.peer, c.is_send, c.token, c.len, c.tag)
                    };
                    // shm reports the error number negated.
                    if err.err.unsigned_abs() == fi::FI_ETRUNC as u32 && !is_send {
                        // A longer message than the receive: the sender's size is what
                        // arrived plus what did not fit, where the provider says
                        // (`shm`; `tcp;ofi_rxm` reports neither).
                        self.release(ctx);
                        let sent = Some(err.len.saturating_add(err.olen)).filter(|&n| n > posted);
                        // (`shm` sets the flag with data 0 here: a stamped message
                        // never carries 0.)
                        let theirs = if err.flags & fi::FI_REMOTE_CQ_DATA != 0 && err.data != 0 {
                            let ep = self.eps[slot].as_ref();
                            Call::from_raw(
                                ep.map_or(err.data, |e| e.stamp(err.data, peer as usize)),
                            )
                        } else {
                            Call::NONE
                        };
                        return Err(crate::transport::mismatch(
                            peer as usize,
                            self.rank,
                            tag,
                            (sent, theirs),
                            crate::transport::Expected {
                                len: posted,
                                call: self.call,
                            },
                            self.rank,
                        ));
                    }
                    let msg = format!(
                        "{} rank {peer} failed on {provider}: {} (step {token})",
                        if is_send { "send to" } else { "receive from" },
                        fi::strerror(i64::from(err.err))
                    );
                    self.release(ctx);
                    if err.err == fi::FI_ECANCELED {
                        continue;
                    }
                    failed.get_or_insert(CollectiveError::Remote {
                        peer: peer as usize,
                        message: msg,
                    });
                } else {
                    return Err(CollectiveError::System(format!(
                        "fi_cq_read on {}: {}",
                        self.provider_name(slot as u8),
                        fi::strerror(ret as i64)
                    )));
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Completes one operation. A receive that completed with another length than
    /// it was posted with (a shorter message; only a receive posted with
    /// `Session::post_recv_up_to` takes one, and notes its length), or from a peer
    /// whose call has another descriptor (remote CQ data, `FabricEndpoint::call_data`),
    /// is an error naming the peer and both sizes or calls. Poison with a descriptor
    /// names the poisoner's call. A message no posted receive matches stays in the
    /// provider, unseen: a disagreement between collectives whose schedules use other
    /// tags is a timeout on this transport.
    fn complete(
        &mut self,
        en: &fi::fi_cq_tagged_entry,
        slot: usize,
        done: &mut Vec<u32>,
    ) -> CResult<()> {
        let ctx = en.op_context.cast::<OpCtx>();
        if ctx.is_null() {
            return Ok(());
        }
        // SAFETY: the context is one of ours (see `poll`).
        let (token, peer, is_send, posted, tag, up_to) = unsafe {
            let c = &*ctx;
            (c.token, c.peer, c.is_send, c.len, c.tag, c.up_to)
        };
        self.release(ctx);
        if !is_send {
            // The sender may be waiting for its send to complete.
            self.ring(peer as usize);
            // Every message a stamping sender sends carries data other than 0.
            let carried = en.flags & fi::FI_REMOTE_CQ_DATA != 0 && en.data != 0;
            let data = if carried { en.data } else { 0 };
            tracing::trace!(
                rank = self.rank,
                peer,
                tag = format_args!("{tag:#x}"),
                len = en.len,
                posted,
                data = format_args!("{data:#x}"),
                "receive completed"
            );
            let ep = self.eps[slot].as_ref();
            if carried && let Some(e) = ep {
                self.check_sender(e, data, peer as usize, tag, en.len)?;
            }
            // The descriptor as the sender made it (its stamp removed).
            let data = match ep {
                Some(e) if carried => e.stamp(data, peer as usize),
                _ => data,
            };
            if data != 0
                && let Some(theirs) = ep.and_then(|e| e.poison_of(data))
            {
                return Err(crate::transport::poisoned(
                    peer as usize,
                    self.rank,
                    tag,
                    theirs,
                    ep.map_or(Call::NONE, |e| Call::from_raw(e.call_data(self.call))),
                ));
            }
            // Compared as carried (cut to what the provider carries).
            let ours = ep.map_or(0, |e| e.call_data(self.call));
            let calls_differ = data != 0 && ours != 0 && data != ours;
            let fits = if up_to {
                en.len <= posted
            } else {
                en.len == posted
            };
            if !fits || calls_differ {
                return Err(crate::transport::mismatch(
                    peer as usize,
                    self.rank,
                    tag,
                    (Some(en.len), Call::from_raw(data)),
                    crate::transport::Expected {
                        len: posted,
                        call: Call::from_raw(ours),
                    },
                    self.rank,
                ));
            }
            if up_to {
                self.lens.push((token, en.len));
            }
        }
        done.push(token);
        Ok(())
    }

    /// Checks that a receive posted for rank `peer` completed with a message `peer`
    /// sent, where the provider carries the sender's stamp
    /// ([`FabricEndpoint::stamp`]): `data`, the completion data as it arrived, must
    /// give this rank's own descriptor or a well-formed one (a call that differs, which
    /// the caller reports as a mismatch) once `peer`'s stamp is removed. A message that
    /// gives this rank's descriptor with another rank's stamp, or no descriptor at all,
    /// fails the call naming both ranks: the provider delivered a message to the wrong
    /// receive, and its bytes are not `peer`'s.
    fn check_sender(
        &self,
        e: &FabricEndpoint,
        data: u64,
        peer: usize,
        tag: u64,
        len: usize,
    ) -> CResult<()> {
        if !e.stamps() {
            return Ok(());
        }
        let Err(from) = sender_check(data, peer, self.routes.len(), e.call_data(self.call)) else {
            return Ok(());
        };
        let who = match from {
            Some(q) => format!("from rank {q}, not rank {peer}"),
            None => format!("that rank {peer} did not send (it carries no rank's stamp)"),
        };
        Err(CollectiveError::Remote {
            peer,
            message: format!(
                "rank {}'s receive from rank {peer} (tag {tag:#x}) completed with a message of \
                 {len} bytes {who}: the {} provider delivered it to the wrong receive (as \
                 libfabric's shm was seen doing after a peer closed its endpoint); the call \
                 fails rather than return another rank's bytes",
                self.rank, e.provider
            ),
        })
    }

    /// Asks the provider to cancel operation `i` of the pool (it then completes with
    /// `FI_ECANCELED`, or normally if it was already done).
    pub(super) fn cancel_ctx(&mut self, i: usize) {
        let c = &mut self.ctxs[i];
        if !c.in_use {
            return;
        }
        if let Some(e) = self.eps[c.ep as usize].as_ref() {
            // SAFETY: the endpoint is open and the context was posted on it; cancel
            // only asks the provider to complete it with FI_ECANCELED.
            let ret = watched(
                &self.watched,
                CALL_CANCEL,
                Some(c.peer as usize),
                || unsafe { fi::fi_cancel(&mut (*e.ep).fid, (&mut **c as *mut OpCtx).cast()) },
            );
            if ret != 0 && ret != -(fi::FI_ENOENT as isize) {
                tracing::debug!(
                    rank = self.rank,
                    peer = c.peer,
                    "fi_cancel: {}",
                    fi::strerror(ret as i64)
                );
            }
        }
    }

    /// Cancels everything outstanding and reads completions until it is all back or
    /// `limit` has passed; returns how many operations are still with the provider.
    pub(super) fn cancel_all(&mut self, limit: Duration) -> usize {
        self.backlog.clear();
        for i in 0..self.ctxs.len() {
            self.cancel_ctx(i);
        }
        let deadline = Instant::now() + limit;
        let mut sink = Vec::new();
        while self.in_flight() > 0 && Instant::now() < deadline {
            // Errors other than cancellations (a peer that failed) are expected here.
            let _ = self.poll(&mut sink);
            sink.clear();
            std::thread::yield_now();
        }
        self.in_flight()
    }

    /// Closes the endpoints and refuses every later collective with `why`.
    pub(super) fn break_down(&mut self, why: String) {
        self.backlog.clear();
        for e in self.eps.iter_mut().flatten() {
            e.abandoned = true;
        }
        let eps = std::mem::take(&mut self.eps);
        watched(&self.watched, CALL_CLOSE, None, || drop(eps));
        for c in &mut self.ctxs {
            c.in_use = false;
        }
        self.posted = [0; 2];
        self.free = (0..self.ctxs.len() as u32).collect();
        self.broken = Some(why);
    }

    /// Waits up to `max` on the completion queues' file descriptors (`block`).
    pub(super) fn block_fd(&mut self, max: Duration) {
        let mut fds = [
            libc::pollfd {
                fd: -1,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: -1,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let mut n = 0;
        let mut every = true;
        for e in self.eps.iter().flatten() {
            let Some(fd) = e.wait_fd else {
                every = false;
                continue;
            };
            let mut fid: *mut fi::fid = e.cq.cast();
            // SAFETY: the fabric and the CQ are open; `fid` is one fid of that fabric.
            let ret = watched(&self.watched, CALL_TRYWAIT, None, || unsafe {
                fi::fi_trywait(e.fabric, &mut fid, 1)
            });
            if ret as isize == EAGAIN {
                // Completions are ready (or progress is needed): poll again now.
                return;
            }
            if ret != 0 {
                every = false;
                continue;
            }
            fds[n].fd = fd;
            n += 1;
        }
        // Completions of an endpoint without a descriptor (shm) or of a deferred post
        // are only seen by polling: bound the block as `sleep` does then.
        let bound = if every && self.backlog.is_empty() {
            max
        } else {
            max.min(WAIT.sleep_max)
        };
        if n == 0 {
            std::thread::sleep(bound);
            return;
        }
        let ts = libc::timespec {
            tv_sec: bound.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(bound.subsec_nanos() as i32),
        };
        // SAFETY: `fds` holds `n` initialised pollfds; `ts` is a valid timespec; no
        // signal mask is changed (NULL).
        unsafe { libc::ppoll(fds.as_mut_ptr(), n as libc::nfds_t, &ts, ptr::null()) };
    }
}
