//! The device path's collectives over raw device pointers (for the C ABI and Python):
//! the same plans as the CPU twin (`comm::waves`), run by `transport::device` on the
//! caller's stream.

use super::all_to_all_v::Args;
use super::{Communicator, Partition, overlaps};
use crate::error::{Error, Result};
use crate::transport::device::{DeviceState, device_error, nccl, runtime};
use halo_rccl_sys::{NCCL_UNIQUE_ID_BYTES, NcclUniqueId, Stream};
use std::ffi::c_void;

impl Communicator {
    /// Makes this communicator's NCCL communicator on `device` if it has none
    /// (collective: every rank calls it in the same device call).
    fn ensure_device(&mut self, device: i32) -> Result<()> {
        if let Some(d) = &self.core.ext.device {
            if d.device() != device {
                return Err(Error::invalid_argument(format!(
                    "the buffers are on device {device} but this communicator's device path lives on device {}",
                    d.device()
                )));
            }
            return Ok(());
        }
        let me = self.rank();
        let local = (|| {
            let rt = runtime()?;
            let nccl = nccl()?;
            rt.set_device(device).map_err(device_error)?;
            let id = if me == 0 {
                nccl.unique_id().map_err(device_error)?
            } else {
                NcclUniqueId::default()
            };
            Ok::<_, Error>((rt, nccl, id))
        })();
        // Every rank's status and rank 0's id, over the host transport: a rank that
        // cannot start the device path makes every rank fail, not wait.
        let mut mine = [0u8; 4 + NCCL_UNIQUE_ID_BYTES];
        match &local {
            Ok((_, _, id)) => mine[4..].copy_from_slice(&id.to_bytes()),
            Err(_) => mine[0] = 1,
        }
        let n = self.size();
        let mut all = vec![0u8; n * mine.len()];
        self.all_gather(&mine, &mut all)?;
        let (rt, nccl, _) = local?;
        if let Some(bad) = (0..n).find(|&r| all[r * mine.len()] != 0) {
            return Err(Error::UnhandledDeviceError {
                message: format!(
                    "{}: rank {bad} could not start it (it reports why)",
                    crate::device::UNAVAILABLE
                ),
            });
        }
        let id_bytes: [u8; NCCL_UNIQUE_ID_BYTES] = all[4..mine.len()]
            .try_into()
            .map_err(|_| Error::internal("the unique id has the wrong length"))?;
        let state = DeviceState::new(
            nccl,
            rt,
            device,
            n,
            me,
            &NcclUniqueId::from_bytes(&id_bytes),
        )?;
        self.core.ext.device = Some(Box::new(state));
        Ok(())
    }

    /// `haloAllToAll` on device buffers: enqueued on `stream`.
    ///
    /// # Safety
    /// `send` / `recv` are device memory of `device` covering `count * elem_size *
    /// size()` bytes, valid until the stream has run the call; `stream` is a live stream
    /// of that device (or NULL).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for overflow or overlapping buffers;
    /// [`Error::UnhandledDeviceError`] without the libraries; NCCL's errors.
    pub(crate) unsafe fn device_all_to_all_raw(
        &mut self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        elem_size: usize,
        stream: Stream,
        device: i32,
    ) -> Result<()> {
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
        if overlaps(send.cast(), total, recv.cast_const().cast(), total) {
            return Err(Error::invalid_argument(
                "all_to_all: send and receive buffers overlap (HALO is out-of-place only)",
            ));
        }
        self.ensure_device(device)?;
        let plan = self.core.wave_plan_uniform(block)?;
        let state = self
            .core
            .ext
            .device
            .as_mut()
            .ok_or_else(|| Error::internal("device state missing after set-up"))?;
        // SAFETY: the caller's contract covers the buffers and the stream; the plan's
        // regions lie within `total` bytes of each buffer.
        unsafe { state.run(&plan.schedule, &plan.waves, send, recv, stream) }
    }

    /// `haloAllToAllv` on device buffers: the counts (host arrays) are exchanged and
    /// checked on the host transport, then the data moves on `stream`.
    ///
    /// # Safety
    /// As [`Communicator::device_all_to_all_raw`], over the extents the counts and
    /// displacements reach.
    ///
    /// # Errors
    /// As `all_to_all_v` (every rank fails alike on bad or disagreeing counts), and the
    /// device errors.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn device_all_to_all_v_raw(
        &mut self,
        send: *const c_void,
        send_part: &Partition<'_>,
        recv: *mut c_void,
        recv_part: &Partition<'_>,
        elem_size: usize,
        stream: Stream,
        device: i32,
    ) -> Result<()> {
        self.core.check_aborted()?;
        let extent = |p: &Partition<'_>| {
            p.counts()
                .iter()
                .zip(p.displs())
                .filter(|(c, _)| **c > 0)
                .map(|(c, d)| d.saturating_add(*c))
                .max()
                .unwrap_or(0)
        };
        let (se, re) = (extent(send_part), extent(recv_part));
        let bytes = |e: usize| {
            e.checked_mul(elem_size)
                .filter(|&b| b <= isize::MAX as usize)
        };
        let pre = match (bytes(se), bytes(re)) {
            (Some(sb), Some(rb)) => {
                if (send.is_null() && sb > 0) || (recv.is_null() && rb > 0) {
                    Err(Error::invalid_argument(
                        "all_to_all_v: a NULL buffer with a non-zero count",
                    ))
                } else if overlaps(send.cast(), sb, recv.cast_const().cast(), rb) {
                    Err(Error::invalid_argument(
                        "all_to_all_v: send and receive buffers overlap (HALO is out-of-place only)",
                    ))
                } else {
                    Ok(())
                }
            }
            _ => Err(Error::invalid_argument(
                "all_to_all_v: an extent in bytes overflows",
            )),
        };
        let args = Args {
            send_len: se,
            recv_len: re,
            send_counts: send_part.counts(),
            send_displs: send_part.displs(),
            recv_counts: recv_part.counts(),
            recv_displs: recv_part.displs(),
            elem: elem_size,
        };
        let (m, table) = self.exchange_counts(&args, pre)?;
        self.ensure_device(device)?;
        let plan = self.wave_plan_v(&m, &table)?;
        let state = self
            .core
            .ext
            .device
            .as_mut()
            .ok_or_else(|| Error::internal("device state missing after set-up"))?;
        // SAFETY: the caller's contract covers the buffers and the stream; the plan's
        // regions lie within the extents the (checked) counts reach.
        unsafe { state.run(&plan.schedule, &plan.waves, send, recv, stream) }
    }
}
