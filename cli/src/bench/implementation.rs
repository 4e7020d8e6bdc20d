//! What a benchmark measures: the [`Implementation`] trait over bytes, and its
//! implementations by HALO's [`Communicator`] and the `memcpy` reference (MPI's is in
//! `mpi.rs`).

use halo::{Communicator, Error, Partition, Result};

/// The calls a benchmark makes, over bytes: HALO's communicator or MPI.
pub trait Implementation {
    /// This rank.
    fn rank(&self) -> usize;
    /// Ranks in the job.
    fn size(&self) -> usize;
    /// A barrier (outside the timer).
    ///
    /// # Errors
    /// The implementation's error.
    fn barrier(&mut self) -> Result<()>;
    /// A uniform all-to-all, `send.len() / size()` bytes per destination.
    ///
    /// # Errors
    /// The implementation's error.
    fn all_to_all(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()>;
    /// An all-to-all-v in bytes.
    ///
    /// # Errors
    /// The implementation's error.
    fn all_to_all_v(
        &mut self,
        send: &[u8],
        send_part: &Partition<'_>,
        recv: &mut [u8],
        recv_part: &Partition<'_>,
    ) -> Result<()>;
    /// A blocking send to `peer`.
    ///
    /// # Errors
    /// The implementation's error.
    fn send(&mut self, buf: &[u8], peer: usize) -> Result<()>;
    /// A blocking receive of exactly `buf.len()` bytes from `peer`.
    ///
    /// # Errors
    /// The implementation's error.
    fn recv(&mut self, buf: &mut [u8], peer: usize) -> Result<()>;
    /// Whether the next all-to-alls of `block` bytes per peer are the implementation's
    /// own trials (HALO's automatic mode measuring its candidates), which the harness
    /// runs untimed unless told otherwise; the default: never.
    fn tuning(&self, block: usize) -> bool {
        let _ = block;
        false
    }
    /// `window` sends of `buf` to `peer`, complete on return (OSU's `bw` window);
    /// one blocking send after the other unless the engine can keep several in flight.
    ///
    /// # Errors
    /// The implementation's error.
    fn send_window(&mut self, buf: &[u8], peer: usize, window: usize) -> Result<()> {
        for _ in 0..window {
            self.send(buf, peer)?;
        }
        Ok(())
    }
    /// Receives one message of `size` bytes from `peer` into each `size`-byte block of
    /// `bufs` (OSU's window of receives); one blocking receive after the other unless
    /// the engine can keep several in flight.
    ///
    /// # Errors
    /// The implementation's error.
    fn recv_window(
        &mut self,
        bufs: &mut [u8],
        size: usize,
        peer: usize,
        window: usize,
    ) -> Result<()> {
        blocking_recv_window(self, bufs, size, peer, window)
    }
}

/// [`Implementation::recv_window`] as blocking receives, one after the other.
///
/// # Errors
/// The implementation's error.
pub(super) fn blocking_recv_window<I: Implementation + ?Sized>(
    e: &mut I,
    bufs: &mut [u8],
    size: usize,
    peer: usize,
    window: usize,
) -> Result<()> {
    for k in 0..window {
        e.recv(&mut bufs[k * size..(k + 1) * size], peer)?;
    }
    Ok(())
}

/// HALO's communicator with its blocking sends and receives only (`halo bench bw
/// --blocking`): the window is one blocking call after the other.
pub(super) struct Blocking<'a>(pub(super) &'a mut Communicator);

impl Implementation for Blocking<'_> {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn barrier(&mut self) -> Result<()> {
        self.0.barrier()
    }
    fn all_to_all(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        self.0.all_to_all(send, recv)
    }
    fn all_to_all_v(
        &mut self,
        send: &[u8],
        send_part: &Partition<'_>,
        recv: &mut [u8],
        recv_part: &Partition<'_>,
    ) -> Result<()> {
        self.0.all_to_all_v(send, send_part, recv, recv_part)
    }
    fn send(&mut self, buf: &[u8], peer: usize) -> Result<()> {
        self.0.send(buf, peer)
    }
    fn recv(&mut self, buf: &mut [u8], peer: usize) -> Result<()> {
        self.0.recv(buf, peer)
    }
}

impl Implementation for Communicator {
    fn rank(&self) -> usize {
        Communicator::rank(self)
    }
    fn size(&self) -> usize {
        Communicator::size(self)
    }
    fn barrier(&mut self) -> Result<()> {
        Communicator::barrier(self)
    }
    fn all_to_all(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        Communicator::all_to_all(self, send, recv)
    }
    fn all_to_all_v(
        &mut self,
        send: &[u8],
        send_part: &Partition<'_>,
        recv: &mut [u8],
        recv_part: &Partition<'_>,
    ) -> Result<()> {
        Communicator::all_to_all_v(self, send, send_part, recv, recv_part)
    }
    fn send(&mut self, buf: &[u8], peer: usize) -> Result<()> {
        Communicator::send(self, buf, peer)
    }
    fn recv(&mut self, buf: &mut [u8], peer: usize) -> Result<()> {
        Communicator::recv(self, buf, peer)
    }
    fn tuning(&self, block: usize) -> bool {
        Communicator::tuning(self, block)
    }
    /// `window` non-blocking sends in one scope, then wait for all (OSU's
    /// `MPI_Isend` x window + `MPI_Waitall`).
    fn send_window(&mut self, buf: &[u8], peer: usize, window: usize) -> Result<()> {
        self.scope(|s| {
            let reqs: Vec<_> = (0..window).map(|_| s.send(buf, peer)).collect();
            wait_last_first(reqs)
        })
    }
    /// `window` non-blocking receives in one scope, then wait for all.
    fn recv_window(
        &mut self,
        bufs: &mut [u8],
        size: usize,
        peer: usize,
        window: usize,
    ) -> Result<()> {
        if size == 0 {
            return blocking_recv_window(self, bufs, size, peer, window);
        }
        self.scope(|s| {
            let reqs: Vec<_> = bufs[..size * window]
                .chunks_mut(size)
                .map(|b| s.recv(b, peer))
                .collect();
            wait_last_first(reqs)
        })
    }
}

/// Waits for a window of requests, the last first: they run in order, so once the
/// last is done the others are too, and the waiting thread wakes once instead of once
/// per message (which on a busy machine costs a context switch each).
fn wait_last_first(mut reqs: Vec<halo::Request<'_>>) -> Result<()> {
    let last = reqs.pop().map(|r| r.wait());
    reqs.into_iter().try_for_each(|r| r.wait())?;
    last.unwrap_or(Ok(()))
}

/// [`BenchAlgo::Memcpy`]: a local copy between the communicator's barriers.
pub(super) struct MemcpyReference<'a>(pub(super) &'a mut Communicator);

impl Implementation for MemcpyReference<'_> {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn barrier(&mut self) -> Result<()> {
        self.0.barrier()
    }
    /// The copy, then a barrier: a rank's time must end when the last rank's copy has,
    /// as an all-to-all's does. Without it, ranks that share a core would each time
    /// only their own copy (a rank scheduled late also leaves the first barrier late),
    /// and on 8 threads over 2 cores the reference would look 3-4x faster than the
    /// machine can move the bytes of all ranks.
    fn all_to_all(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        recv.copy_from_slice(send);
        self.0.barrier()
    }
    fn all_to_all_v(
        &mut self,
        _: &[u8],
        _: &Partition<'_>,
        _: &mut [u8],
        _: &Partition<'_>,
    ) -> Result<()> {
        Err(Error::invalid_argument(
            "memcpy is the reference of alltoall only",
        ))
    }
    fn send(&mut self, _: &[u8], _: usize) -> Result<()> {
        Err(Error::invalid_argument(
            "memcpy is the reference of alltoall only",
        ))
    }
    fn recv(&mut self, _: &mut [u8], _: usize) -> Result<()> {
        Err(Error::invalid_argument(
            "memcpy is the reference of alltoall only",
        ))
    }
}
