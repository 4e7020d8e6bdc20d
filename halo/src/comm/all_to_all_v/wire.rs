//! The count matrix on the wire: each rank's row of [`META_BLOCK`]s (`[bytes I send
//! to q, bytes I expect from q]`, `u64` little endian, `u64::MAX` throughout for
//! invalid arguments), the checks of the gathered `n x n` matrix that every rank
//! makes alike, and the length of a count message with eager bytes (and what a rank
//! does when one has another length). Used by every count exchange; it imports
//! nothing from the other files of the module.

use crate::comm::{Communicator, sized};
use crate::error::{Error, Result};
use crate::transport::FLUSH_SENDS;
use halo_collectives::{CollectiveError, META_BLOCK, Session};

impl Communicator {
    /// Fills `meta_send` with this rank's 16 bytes per peer (`u64::MAX` twice when its
    /// arguments are invalid).
    pub(super) fn fill_meta_row(&mut self, valid: bool) {
        let n = self.size();
        let ms = sized(&mut self.pool.meta_send, n * META_BLOCK);
        for q in 0..n {
            let (s, r) = if valid {
                (
                    self.pool.send_bytes[q] as u64,
                    self.pool.recv_bytes[q] as u64,
                )
            } else {
                (u64::MAX, u64::MAX)
            };
            ms[q * META_BLOCK..q * META_BLOCK + 8].copy_from_slice(&s.to_le_bytes());
            ms[q * META_BLOCK + 8..q * META_BLOCK + 16].copy_from_slice(&r.to_le_bytes());
        }
    }
}

/// The first rank `q` (in rank order, skipping ranks with invalid arguments) with which
/// rank `r` disagrees in the gathered matrix `m` of `n` rows, and the message rank `r`
/// gives (naming both counts).
fn first_mismatch(m: &[u8], n: usize, r: usize) -> Option<(usize, String)> {
    let row = n * META_BLOCK;
    let sends = |a: usize, b: usize| read_u64(m, a * row + b * META_BLOCK);
    let expects = |a: usize, b: usize| read_u64(m, a * row + b * META_BLOCK + 8);
    for q in 0..n {
        if sends(q, 0) == u64::MAX {
            continue; // rank q's own arguments are invalid: it is named for that
        }
        let (my_send, their_expect) = (sends(r, q), expects(q, r));
        if my_send != their_expect {
            return Some((
                q,
                format!(
                    "all_to_all_v: rank {r} sends {my_send} bytes to rank {q}, but rank {q} expects {their_expect} bytes from rank {r}"
                ),
            ));
        }
        let (their_send, my_expect) = (sends(q, r), expects(r, q));
        if their_send != my_expect {
            return Some((
                q,
                format!(
                    "all_to_all_v: rank {q} sends {their_send} bytes to rank {r}, but rank {r} expects {my_expect} bytes from rank {q}"
                ),
            ));
        }
    }
    None
}

/// Checks every pair of the gathered matrix `m` (`n` rows of `n` [`META_BLOCK`]s) on
/// rank `me`, whose own arguments are valid. Returns the total bytes all ranks send and
/// the largest block, or the error every rank reaches alike from the same matrix.
pub(super) fn check_matrix(m: &[u8], n: usize, me: usize) -> Result<(u64, u64)> {
    let row = n * META_BLOCK;
    let mut bad = false;
    let (mut total, mut largest) = (0u64, 0u64);
    for a in 0..n {
        // A valid count is at most isize::MAX: u64::MAX marks invalid arguments.
        bad |= read_u64(m, a * row) == u64::MAX;
        for b in 0..n {
            let s = read_u64(m, a * row + b * META_BLOCK);
            bad |= s != read_u64(m, b * row + a * META_BLOCK + 8);
            total = total.saturating_add(s);
            largest = largest.max(s);
        }
    }
    if !bad {
        return Ok((total, largest));
    }
    if let Some((q, message)) = first_mismatch(m, n, me) {
        return Err(Error::InvalidUsage {
            peer: Some(q),
            message,
        });
    }
    for r in 0..n {
        if read_u64(m, r * row) == u64::MAX {
            return Err(Error::InvalidUsage {
                peer: Some(r),
                message: format!("all_to_all_v: rank {r} passed invalid arguments"),
            });
        }
        if let Some((q, _)) = first_mismatch(m, n, r) {
            return Err(Error::InvalidUsage {
                peer: Some(r),
                message: format!(
                    "all_to_all_v: ranks {r} and {q} disagree on the size of a block between them"
                ),
            });
        }
    }
    Err(Error::internal(
        "all_to_all_v: the count matrix is inconsistent, yet no pair disagrees",
    ))
}

pub(super) fn read_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

pub(super) fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The bytes of a block of `count` bytes (`u64::MAX`: its sender's arguments are
/// invalid, it sends none) that a count message carries with `c` eager bytes.
pub(super) fn eager_len(count: u64, c: usize) -> usize {
    if count == u64::MAX {
        0
    } else {
        usize::try_from(count).unwrap_or(usize::MAX).min(c)
    }
}

/// The error for a count message of `got` bytes from `from` where the rows it carries
/// say `want` (its sender carries another number of bytes with the counts).
pub(super) fn wrong_length(
    from: usize,
    me: usize,
    got: usize,
    want: usize,
    c: usize,
) -> CollectiveError {
    CollectiveError::Mismatch {
        peer: from,
        message: format!(
            "size mismatch: rank {from}'s all-to-all-v count message to rank {me} is {got} \
             bytes where its rows say {want} with {c} eager bytes (the ranks carry different \
             numbers of bytes with the counts: HALO_A2AV_EAGER or set_eager_v differ)"
        ),
    }
}

/// Returns `e` once this rank's `left` outstanding sends (the completions `is_send`
/// names) have completed or [`FLUSH_SENDS`] has passed: a receiver then fails at once
/// too (a message longer than it takes is a size mismatch at its transport), not at
/// its timeout. Errors meanwhile are expected and dropped.
pub(super) fn flush_sends(
    session: &mut dyn Session,
    mut left: usize,
    is_send: impl Fn(u32) -> bool,
    e: CollectiveError,
) -> CollectiveError {
    let deadline = std::time::Instant::now() + FLUSH_SENDS;
    let mut done = Vec::new();
    while left > 0 && std::time::Instant::now() < deadline {
        done.clear();
        if session.progress(&mut done).is_err() {
            break;
        }
        left -= done.iter().filter(|&&t| is_send(t)).count().min(left);
        if done.is_empty() {
            std::thread::yield_now();
        }
    }
    e
}
