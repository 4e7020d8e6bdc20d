//! All-to-all: [`Communicator::all_to_all`] (uniform blocks) and
//! [`Communicator::barrier`] (a one-byte all-to-all).

use super::{Communicator, barrier_algorithm, call_of, overlaps, sized};
use crate::error::{Error, Result};
use crate::policy::Ask;
use halo_collectives::{Algorithm, Call, CallKind};

impl Communicator {
    /// All-to-all: block `q` of `send` (`send.len() / size()` elements) goes to rank
    /// `q`, and the block from rank `q` lands at block `q` of `recv`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the lengths differ or are not a multiple of
    /// `size()`, or the buffers overlap (checked before any communication, on this rank);
    /// [`Error::InvalidUsage`] when ranks disagree on the block size;
    /// [`Error::Timeout`], [`Error::Aborted`], [`Error::RemoteError`] as they happen.
    pub fn all_to_all<E: bytemuck::Pod>(&mut self, send: &[E], recv: &mut [E]) -> Result<()> {
        let tag_base = self.core.next_tag_base();
        self.core.check_aborted()?;
        let n = self.size();
        if send.len() != recv.len() {
            return Err(Error::invalid_argument(format!(
                "all_to_all: send has {} elements but recv has {}",
                send.len(),
                recv.len()
            )));
        }
        if send.len().checked_rem(n) != Some(0) {
            return Err(Error::invalid_argument(format!(
                "all_to_all: {} elements is not a multiple of the {n} ranks",
                send.len()
            )));
        }
        let block = send.len() / n * std::mem::size_of::<E>();
        let send: &[u8] = bytemuck::cast_slice(send);
        let recv: &mut [u8] = bytemuck::cast_slice_mut(recv);
        self.uniform_bytes(tag_base, send, recv, block)
    }

    fn uniform_bytes(
        &mut self,
        tag_base: u64,
        send: &[u8],
        recv: &mut [u8],
        block: usize,
    ) -> Result<()> {
        if overlaps(send.as_ptr(), send.len(), recv.as_ptr(), recv.len()) {
            return Err(Error::invalid_argument(
                "all_to_all: send and receive buffers overlap (HALO is out-of-place only)",
            ));
        }
        let choice = self.core.choose(Ask::AllToAll { block })?;
        let started = std::time::Instant::now();
        let call = call_of(CallKind::AllToAll, block);
        let ran = self.core.uniform(
            choice.algorithm,
            tag_base,
            send,
            recv,
            block,
            &mut self.pool.scratch,
            call,
        )?;
        if let Some(key) = choice.key.filter(|_| choice.trial) {
            self.record_trial(key, ran, started.elapsed())?;
        }
        Ok(())
    }

    /// Records one trial of `alg` for `key`, and once the class's trials are over
    /// agrees on them with every rank (an all-reduce of the timings, so every rank
    /// picks alike): a candidate's time is the mean over the ranks of their medians.
    pub(super) fn record_trial(
        &mut self,
        key: crate::tune::Key,
        alg: Algorithm,
        took: std::time::Duration,
    ) -> Result<()> {
        if let Some(mut local) = self.core.policy.record(key, alg, took) {
            let n = self.size() as u64;
            // The sum cannot overflow (a call of centuries aside).
            for t in &mut local {
                *t = (*t).min(u64::MAX / n);
            }
            let mut agreed = vec![0u64; local.len()];
            self.all_reduce(&local, &mut agreed, crate::ReduceOp::Sum)?;
            for t in &mut agreed {
                *t /= n;
            }
            self.core.policy.agree(key, &agreed);
        }
        Ok(())
    }

    /// What the automatic mode measured and chose for all-to-alls of `block` bytes per
    /// peer (their size class), once the trials of that class are over and agreed on
    /// (see [`crate::tune`]); `None` before, or when an algorithm is forced.
    pub fn tuned(&self, block: usize) -> Option<crate::tune::Tuned> {
        self.core.policy.tuned(block)
    }

    /// Whether the next all-to-alls of `block` bytes per peer are the automatic mode's
    /// trials ([`crate::tune`]): no algorithm is forced and their size class is not
    /// decided yet. The same on every rank after the same calls, so a benchmark can
    /// run them as warm-up (`halo bench` does) the way a training job's first steps
    /// absorb them.
    pub fn tuning(&self, block: usize) -> bool {
        self.core.policy.forced().all_to_all.is_none() && self.tuned(block).is_none()
    }

    /// All-to-all over raw memory, for the C ABI: `count` elements of `elem_size` bytes
    /// per peer.
    ///
    /// The ranges are checked for overlap before any reference to them is made.
    ///
    /// # Safety
    /// `send` must be valid for reads and `recv` for writes of `count * elem_size *
    /// size()` bytes (either may be null when that is zero), and no other thread may
    /// write `send` or access `recv` during the call.
    ///
    /// # Errors
    /// As [`Communicator::all_to_all`]; also [`Error::InvalidArgument`] for a null
    /// pointer with a non-zero length, and when the byte count overflows.
    pub(crate) unsafe fn all_to_all_raw(
        &mut self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        elem_size: usize,
    ) -> Result<()> {
        let tag_base = self.core.next_tag_base();
        self.core.check_aborted()?;
        let n = self.size();
        let block = count.checked_mul(elem_size).ok_or_else(|| {
            Error::invalid_argument(format!("all_to_all: {count} x {elem_size} bytes overflows"))
        })?;
        let total = block
            .checked_mul(n)
            .filter(|&t| t <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::invalid_argument(format!("all_to_all: {block} bytes x {n} ranks overflows"))
            })?;
        if overlaps(send, total, recv, total) {
            return Err(Error::invalid_argument(
                "all_to_all: send and receive buffers overlap (HALO is out-of-place only)",
            ));
        }
        // SAFETY: the caller guarantees `send` is valid for reads of `total` bytes and not
        // written during the call; null or zero length gives an empty slice instead.
        let send = unsafe { raw_slice(send, total, "send")? };
        // SAFETY: the caller guarantees `recv` is valid for writes of `total` bytes and
        // not accessed by anyone else; it does not overlap `send` (checked above).
        let recv = unsafe { raw_slice_mut(recv, total, "recv")? };
        self.uniform_bytes(tag_base, send, recv, block)
    }

    /// Waits until every rank has called `barrier`: a one-byte all-to-all. On one host
    /// with up to 8 ranks it is the flat fan-out (every rank leaves at the last
    /// arrival's message), elsewhere Bruck's algorithm (`ceil(log2 n)` rounds of one
    /// message); `HALO_BARRIER_ALGO` picks another all-to-all algorithm. Measured in
    /// docs/bench/JOURNAL.md ("Issue 30", item 2).
    ///
    /// # Errors
    /// [`Error::Timeout`], [`Error::Aborted`], [`Error::RemoteError`] as they happen.
    pub fn barrier(&mut self) -> Result<()> {
        let tag_base = self.core.next_tag_base();
        self.core.check_aborted()?;
        let n = self.size();
        let send = sized(&mut self.pool.barrier_send, n);
        let recv = sized(&mut self.pool.barrier_recv, n);
        let last = self.core.last;
        self.core.uniform(
            barrier_algorithm(&self.core.topology),
            tag_base,
            send,
            recv,
            1,
            &mut self.pool.scratch,
            Call::new(CallKind::Barrier),
        )?;
        self.core.last = last;
        Ok(())
    }
}

/// A slice over raw memory; null is allowed only for zero bytes.
///
/// # Safety
/// `ptr` valid for reads of `len` bytes for the returned lifetime, and not written.
pub(super) unsafe fn raw_slice<'a>(ptr: *const u8, len: usize, what: &str) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!(
            "{what} buffer is NULL with {len} bytes"
        )));
    }
    // SAFETY: non-null, `u8` needs no alignment, and the caller guarantees validity.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// A mutable slice over raw memory; null is allowed only for zero bytes.
///
/// # Safety
/// `ptr` valid for writes of `len` bytes for the returned lifetime, and not accessed
/// by anyone else.
pub(super) unsafe fn raw_slice_mut<'a>(
    ptr: *mut u8,
    len: usize,
    what: &str,
) -> Result<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!(
            "{what} buffer is NULL with {len} bytes"
        )));
    }
    // SAFETY: non-null, `u8` needs no alignment, and the caller guarantees exclusivity.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}
