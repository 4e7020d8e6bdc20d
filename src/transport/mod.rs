//! Transports: the ways ranks move bytes. One folder entry per backend; the
//! collectives never know which one they run on.
//!
//! - [`local`]: ranks as threads of one process, with optional link emulation.
//! - [`fabric`]: ranks as processes over libfabric (`shm` within a host, `tcp;ofi_rxm`
//!   or `cxi` between hosts).
//! - [`shm`]: ranks as processes on one host, over HALO's own shared-memory rings
//!   (chosen automatically when every rank is on one host; `HALO_TRANSPORT`).
//! - `shared`: either of them shared by a communicator and its sub-communicators.
//! - `sys`: safe wrappers over the system calls the library needs elsewhere
//!   (the host's network interfaces, for the bootstrap).

mod emulation;
pub(crate) mod fabric;
pub mod local;
mod raw;
mod shared;
pub(crate) mod shm;
pub(crate) mod sys;

pub(crate) use shared::{MAX_COMMS, SharedBackend};

use halo_collectives::{Buffers, CollectiveError, ExecOptions, Schedule, Transport, execute};

/// The transport a communicator runs on.
// One per communicator and never moved in a hot path: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Backend {
    /// Ranks as threads of this process.
    Local(local::LocalTransport),
    /// Ranks as processes, over libfabric.
    Fabric(Box<fabric::FabricTransport>),
    /// Ranks as processes on one host, over shared-memory rings.
    Shm(Box<shm::ShmTransport>),
    /// One of the above, shared by the communicators of a split tree (see `shared`).
    Shared(SharedBackend),
}

impl Backend {
    /// Runs one rank's schedule over `bufs` with `tag_base` above every step's tag.
    pub(crate) fn run(
        &mut self,
        schedule: &Schedule,
        tag_base: u64,
        bufs: Buffers<'_>,
        opts: &ExecOptions<'_>,
    ) -> halo_collectives::Result<()> {
        match self {
            Backend::Local(t) => run_on(t, schedule, tag_base, bufs, opts),
            Backend::Fabric(t) => run_on(&mut **t, schedule, tag_base, bufs, opts),
            Backend::Shm(t) => run_on(&mut **t, schedule, tag_base, bufs, opts),
            Backend::Shared(s) => s.run(schedule, tag_base, bufs, opts),
        }
    }
}

fn run_on<T: Transport>(
    transport: &mut T,
    schedule: &Schedule,
    tag_base: u64,
    bufs: Buffers<'_>,
    opts: &ExecOptions<'_>,
) -> halo_collectives::Result<()> {
    let mut session = transport.begin(tag_base, bufs)?;
    // The session is dropped before returning, on every path: that cancels what is
    // still outstanding before the caller's buffers are released.
    let out = execute(schedule, &mut session, opts);
    drop(session);
    out
}

/// What a receiver expected of a message it refused.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expected {
    /// The length of its receive.
    pub(crate) len: usize,
    /// The block size of its uniform call.
    pub(crate) block: Option<usize>,
}

/// The error both ends of a message report when their views of it differ: the same
/// words on the sender and the receiver, naming both ranks and both sizes. `sent` is
/// the message's length (`None`: longer than expected, by how much the provider did
/// not say) and the block size of the sender's uniform call.
pub(crate) fn mismatch(
    sender: usize,
    receiver: usize,
    tag: u64,
    sent: (Option<usize>, Option<usize>),
    expected: Expected,
    me: usize,
) -> CollectiveError {
    let len = match sent.0 {
        Some(n) => format!("{n} bytes"),
        None => format!("more than {} bytes", expected.len),
    };
    let message = match (sent.1, expected.block) {
        (Some(a), Some(b)) if a != b => format!(
            "size mismatch: rank {sender} called the all-to-all with blocks of {a} bytes per \
             rank but rank {receiver} with {b} bytes (the ranks passed different counts or \
             element types; a message of {len} where {} were expected, tag {tag:#x})",
            expected.len
        ),
        _ => format!(
            "size mismatch: rank {sender} sent {len} (tag {tag:#x}) but rank {receiver} \
             expected {} bytes from it (the ranks passed different counts or element types)",
            expected.len
        ),
    };
    CollectiveError::Mismatch {
        peer: if me == sender { receiver } else { sender },
        message,
    }
}

/// The error of a rank that receives poison ([`halo_collectives::Session::post_poison`])
/// from `sender` in place of the message `tag`.
pub(crate) fn poisoned(sender: usize, me: usize, tag: u64) -> CollectiveError {
    CollectiveError::Mismatch {
        peer: sender,
        message: format!(
            "size mismatch: rank {sender} failed this collective because the ranks passed \
             different counts or element types, and will not send the message (tag {tag:#x}) \
             rank {me} waits for"
        ),
    }
}
