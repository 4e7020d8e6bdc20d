//! The three passes' count exchange (large communicators): a uniform all-to-all of
//! every pair's [`META_BLOCK`], each rank's check of both directions, and the
//! agreement pass of status blocks that tells every rank about every other.

use super::V_CALL;
use super::wire::{read_u32, read_u64};
use crate::comm::{Communicator, sized};
use crate::error::{Error, Result};
use crate::policy::Ask;
use halo_collectives::{Algorithm, META_BLOCK};

/// Status codes of the agreement pass.
const OK: u32 = 0;
const MISMATCH: u32 = 1;
const INVALID: u32 = 2;

const STATUS_BLOCK: usize = 16;

impl Communicator {
    /// The metadata and agreement passes. Returns the metadata pass's algorithm and the
    /// total bytes all ranks send.
    pub(super) fn meta_agreed(
        &mut self,
        meta_base: u64,
        status_base: u64,
        local: Result<()>,
    ) -> Result<(Algorithm, u64)> {
        let (n, me) = (self.size(), self.rank());
        // 1. Metadata pass.
        let meta_alg = self.core.choose(Ask::Meta)?.algorithm;
        self.fill_meta_row(local.is_ok());
        let ms = &self.pool.meta_send[..n * META_BLOCK];
        let mr = sized(&mut self.pool.meta_recv, n * META_BLOCK);
        self.core.uniform(
            meta_alg,
            meta_base,
            ms,
            mr,
            META_BLOCK,
            &mut self.pool.meta_scratch,
            V_CALL.count(META_BLOCK),
        )?;

        // 2. Check both directions of every pair, then agree.
        let mut mismatch: Option<(usize, String)> = None;
        let mut total: u64 = 0;
        if local.is_ok() {
            for q in 0..n {
                let (their_send, their_expect) = (
                    read_u64(mr, q * META_BLOCK),
                    read_u64(mr, q * META_BLOCK + 8),
                );
                if their_send == u64::MAX && their_expect == u64::MAX {
                    continue; // rank q's own arguments are invalid: the status pass says so
                }
                let (my_send, my_expect) = (
                    self.pool.send_bytes[q] as u64,
                    self.pool.recv_bytes[q] as u64,
                );
                total = total.saturating_add(my_send);
                if mismatch.is_some() {
                    continue;
                }
                if my_send != their_expect {
                    mismatch = Some((
                        q,
                        format!(
                            "all_to_all_v: rank {me} sends {my_send} bytes to rank {q}, but rank {q} expects {their_expect} bytes from rank {me}"
                        ),
                    ));
                } else if their_send != my_expect {
                    mismatch = Some((
                        q,
                        format!(
                            "all_to_all_v: rank {q} sends {their_send} bytes to rank {me}, but rank {me} expects {my_expect} bytes from rank {q}"
                        ),
                    ));
                }
            }
        }
        let (code, peer) = match (&local, &mismatch) {
            (Err(_), _) => (INVALID, u32::MAX),
            (Ok(()), Some((q, _))) => (MISMATCH, *q as u32),
            (Ok(()), None) => (OK, u32::MAX),
        };
        {
            let ss = sized(&mut self.pool.status_send, n * STATUS_BLOCK);
            for q in 0..n {
                let b = &mut ss[q * STATUS_BLOCK..(q + 1) * STATUS_BLOCK];
                b[0..4].copy_from_slice(&code.to_le_bytes());
                b[4..8].copy_from_slice(&peer.to_le_bytes());
                b[8..16].copy_from_slice(&total.to_le_bytes());
            }
        }
        let ss = &self.pool.status_send[..n * STATUS_BLOCK];
        let sr = sized(&mut self.pool.status_recv, n * STATUS_BLOCK);
        self.core.uniform(
            meta_alg,
            status_base,
            ss,
            sr,
            STATUS_BLOCK,
            &mut self.pool.status_scratch,
            V_CALL.count(STATUS_BLOCK),
        )?;
        local?;
        if let Some((q, message)) = mismatch {
            return Err(Error::InvalidUsage {
                peer: Some(q),
                message,
            });
        }
        let mut all: u64 = 0;
        for r in 0..n {
            let b = &sr[r * STATUS_BLOCK..(r + 1) * STATUS_BLOCK];
            let (code, peer) = (read_u32(b, 0), read_u32(b, 4));
            match code {
                OK => all = all.saturating_add(read_u64(b, 8)),
                MISMATCH => {
                    return Err(Error::InvalidUsage {
                        peer: Some(r),
                        message: format!(
                            "all_to_all_v: ranks {r} and {peer} disagree on the size of a block between them"
                        ),
                    });
                }
                _ => {
                    return Err(Error::InvalidUsage {
                        peer: Some(r),
                        message: format!("all_to_all_v: rank {r} passed invalid arguments"),
                    });
                }
            }
        }
        Ok((meta_alg, all))
    }
}
