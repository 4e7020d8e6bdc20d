//! A session's view of the caller's buffers as raw pointers, for transports that hand
//! addresses to something outside Rust's borrow checker (a peer thread, libfabric).
//!
//! Every region is bounds-checked before a pointer to it is made.

use halo_collectives::{Buf, Buffers, CollectiveError, Region};
use std::marker::PhantomData;

/// The three buffers of one collective call, borrowed for `'a`.
#[derive(Debug)]
pub(crate) struct RawBuffers<'a> {
    send: (*const u8, usize),
    recv: (*mut u8, usize),
    scratch: (*mut u8, usize),
    _borrow: PhantomData<Buffers<'a>>,
}

impl<'a> RawBuffers<'a> {
    /// Takes the buffers for the session's lifetime.
    pub(crate) fn new(bufs: Buffers<'a>) -> Self {
        RawBuffers {
            send: (bufs.send.as_ptr(), bufs.send.len()),
            recv: (bufs.recv.as_mut_ptr(), bufs.recv.len()),
            scratch: (bufs.scratch.as_mut_ptr(), bufs.scratch.len()),
            _borrow: PhantomData,
        }
    }

    /// A second view of the same buffers for the same borrow, for a transport of two
    /// halves that serve different peers (the hybrid transport): each half writes only
    /// the regions of its own receives, and the receives of one collective never
    /// overlap (the verifier's placement pass), so the two never write the same bytes.
    pub(crate) fn alias(&self) -> RawBuffers<'a> {
        RawBuffers {
            send: self.send,
            recv: self.recv,
            scratch: self.scratch,
            _borrow: PhantomData,
        }
    }

    /// Base pointer and length of a buffer.
    pub(crate) fn base(&self, buf: Buf) -> (*mut u8, usize) {
        match buf {
            Buf::Send => (self.send.0.cast_mut(), self.send.1),
            Buf::Recv => self.recv,
            Buf::Scratch => self.scratch,
        }
    }

    /// A pointer to the start of `region`, after checking it lies inside its buffer.
    pub(crate) fn locate(&self, region: Region) -> Result<*const u8, CollectiveError> {
        let (base, len) = self.base(region.buf);
        match region.offset.checked_add(region.len) {
            Some(end) if end <= len => {}
            _ => {
                return Err(CollectiveError::Internal(format!(
                    "region {region} is outside the {} buffer of {len} bytes",
                    region.buf
                )));
            }
        }
        // SAFETY: offset + len <= buffer length was checked just above, so the result
        // stays inside (or one past the end of) the buffer's allocation.
        Ok(unsafe { base.add(region.offset) }.cast_const())
    }

    /// A writable pointer to the start of `region` (never the send buffer).
    pub(crate) fn locate_write(&self, region: Region) -> Result<*mut u8, CollectiveError> {
        if region.buf == Buf::Send {
            return Err(CollectiveError::Internal(format!(
                "{region}: the send buffer is read-only"
            )));
        }
        self.locate(region).map(|p| p.cast_mut())
    }

    /// Copies `region` into `out` (the same length). The caller makes sure nothing
    /// writes the region meanwhile (no receive into it is outstanding, or the
    /// transport writes receives only inside its own calls).
    pub(crate) fn read(&self, region: Region, out: &mut [u8]) -> Result<(), CollectiveError> {
        if out.len() != region.len {
            return Err(CollectiveError::Internal(format!(
                "read {region} into {} bytes: lengths differ",
                out.len()
            )));
        }
        let from = self.locate(region)?;
        if region.len > 0 {
            // SAFETY: the region was bounds-checked against a buffer this view borrows
            // for 'a; `out` is a distinct exclusive slice; the caller guarantees that
            // nothing writes the region during the copy.
            unsafe { std::ptr::copy_nonoverlapping(from, out.as_mut_ptr(), region.len) };
        }
        Ok(())
    }

    /// Copies `src` to `dst` (same length, not overlapping).
    pub(crate) fn copy(&self, src: Region, dst: Region) -> Result<(), CollectiveError> {
        if src.len != dst.len {
            return Err(CollectiveError::Internal(format!(
                "copy {src} -> {dst}: lengths differ"
            )));
        }
        if src.buf == dst.buf && src.len > 0 && src.offset < dst.end() && dst.offset < src.end() {
            return Err(CollectiveError::Internal(format!(
                "copy {src} -> {dst}: regions overlap"
            )));
        }
        let from = self.locate(src)?;
        let to = self.locate_write(dst)?;
        if src.len > 0 {
            // SAFETY: both regions were bounds-checked against buffers this view borrows
            // for 'a; `dst` is in the receive or scratch buffer (mutably borrowed); the
            // regions are in different buffers or were checked not to overlap.
            unsafe { std::ptr::copy_nonoverlapping(from, to, src.len) };
        }
        Ok(())
    }
}
