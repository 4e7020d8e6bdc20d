//! Transports: the ways ranks move bytes. One folder entry per backend; the
//! collectives never know which one they run on.
//!
//! - [`local`]: ranks as threads of one process, with optional link emulation (the
//!   thread launcher that makes them communicators is `crate::local`, above).
//! - [`fabric`]: ranks as processes over libfabric (`shm` within a host, `tcp;ofi_rxm`
//!   or `cxi` between hosts).
//! - [`shm`]: ranks as processes on one host, over HALO's own shared-memory rings in
//!   one segment per host.
//! - [`hybrid`]: a job across hosts — the rings between the ranks of each host, the
//!   fabric transport between hosts, routed per peer in one session.
//! - `shared`: any of them shared by a communicator and its sub-communicators.
//! - `connect`: a job's transport set up from every rank's `card` (exchanged by the
//!   bootstrap as bytes): the choice of backend per pair, one ordered table, and
//!   connecting them.
//! - `sys`: safe wrappers over the system calls the library needs elsewhere
//!   (the host's network interfaces, for the bootstrap).
//!
//! What they need of the host below them — the doorbell, the shared files in
//! `/dev/shm`, `/proc`, the wait policy — is [`crate::host`].
//! - `text`: bytes in hexadecimal (fabric addresses on bootstrap cards).
//!
//! # Which transport carries a pair (`HALO_TRANSPORT`)
//! Decided at bootstrap from every rank's card, so every rank decides alike
//! (`connect`: the first backend of its table that can connect the pair). The ranks of one host (same host name and PID
//! namespace — under `halo launch --hosts`, the emulated host's UTS namespace) share
//! a segment of rings; pairs on different hosts go over the fabric:
//!
//! | `HALO_TRANSPORT` | same-host pairs | pairs across hosts |
//! |---|---|---|
//! | `auto` (default) | HALO's rings (libfabric `shm` where a rank could not make its segment file, or where `HALO_FABRIC_PROVIDER` forces a provider) | the network provider |
//! | `shm` | HALO's rings, an error at initialisation where they cannot be (libfabric's `shm` provider is not opened) | the network provider |
//! | `fabric` (on any rank) | libfabric `shm` (for the whole job) | the network provider |
//!
//! A job on one host gets [`shm::ShmTransport`] alone (the fabric endpoints opened
//! for the bootstrap are closed), a job whose ranks are each alone on their host (or
//! with the fabric forced) [`fabric::FabricTransport`], any other job
//! [`hybrid::HybridTransport`] on the ranks that share a host with another
//! (the others are on the fabric alone). `Communicator::provider_to` names the
//! carrier of each peer (`halo-shm` for the rings).

pub(crate) mod card;
pub(crate) mod connect;
pub(crate) mod device;
pub(crate) mod emulation;
pub(crate) mod fabric;
pub(crate) mod hybrid;
pub(crate) mod local;
mod raw;
mod shared;
pub(crate) mod shm;
pub(crate) mod sys;
pub(crate) mod text;

pub(crate) use shared::{MAX_COMMS, SharedBackend, SharedTickets, Ticket};

use halo_collectives::{
    Buffers, Call, CollectiveError, ExecOptions, Schedule, Session, SessionWaves, Transport, Waves,
    execute, execute_waves,
};

/// What the transports' operations return.
pub(crate) type CResult<T> = std::result::Result<T, CollectiveError>;

/// A session's tag for one operation: the session's `base` (its communicator and call
/// sequence, above [`TAG_BITS`](halo_collectives::TAG_BITS)) with the schedule's `tag`,
/// which must fit below it.
pub(crate) fn full_tag(base: u64, tag: u64) -> CResult<u64> {
    use halo_collectives::TAG_BITS;
    if tag >> TAG_BITS != 0 {
        return Err(CollectiveError::Internal(format!(
            "tag {tag:#x} wider than {TAG_BITS} bits"
        )));
    }
    Ok(base | tag)
}

/// How long a rank that found a size mismatch keeps delivering its outstanding sends
/// before it fails (the fabric session closes its endpoints, the shared-memory one
/// breaks its transport; all-to-all-v's count exchange after a count message of the
/// wrong length): the peers that called with another size then see the mismatch
/// themselves (both ends name both sizes) instead of waiting for these messages until
/// their timeout.
pub(crate) const FLUSH_SENDS: std::time::Duration = std::time::Duration::from_millis(500);

/// A program that drives the session itself: it posts what it decides from what it
/// has received ([`Session::read`]) and waits as the engine does
/// ([`halo_collectives::Idle`]). All-to-all-v's count exchange with speculative
/// remainders is one.
pub(crate) type Driver<'p> =
    &'p mut dyn FnMut(&mut dyn Session, &ExecOptions<'_>) -> halo_collectives::Result<()>;

/// What one pass runs: a schedule step by step (the engine, [`execute`]), as waves
/// (the CPU twin of the device path, [`execute_waves`] over [`SessionWaves`]), or a
/// program of its own ([`Driver`]).
pub(crate) enum Program<'p> {
    /// Ready steps posted as they become ready.
    Steps(&'p Schedule),
    /// Wave by wave, each wave's messages posted together and waited for together.
    Waves(&'p Schedule, &'p Waves),
    /// A program that posts what it decides as messages arrive.
    Driven(Driver<'p>),
}

impl std::fmt::Debug for Program<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Program::Steps(s) => f.debug_tuple("Steps").field(&s.algorithm()).finish(),
            Program::Waves(s, _) => f.debug_tuple("Waves").field(&s.algorithm()).finish(),
            Program::Driven(_) => f.write_str("Driven"),
        }
    }
}

impl Program<'_> {
    /// Runs the program on an open session.
    pub(crate) fn run_on_session<S: Session>(
        self,
        session: &mut S,
        opts: &ExecOptions<'_>,
    ) -> halo_collectives::Result<()> {
        match self {
            Program::Steps(schedule) => execute(schedule, session, opts),
            Program::Waves(schedule, waves) => {
                let mut twin = SessionWaves::new(&mut *session, *opts, schedule.algorithm());
                execute_waves(schedule, waves, &mut twin)
            }
            Program::Driven(driver) => driver(session, opts),
        }
    }
}

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
    /// Ranks as processes on several hosts: shared-memory rings between the ranks of
    /// this host, libfabric to the others.
    Hybrid(Box<hybrid::HybridTransport>),
    /// One of the above, shared by the communicators of a split tree (see `shared`).
    Shared(SharedBackend),
}

impl Backend {
    /// A place in the order of the shared endpoint's operations, for a communicator
    /// of a split tree (`None`: the communicator has its transport to itself).
    pub(crate) fn shared_endpoint(&self) -> Option<SharedTickets> {
        match self {
            Backend::Shared(s) => Some(s.tickets()),
            _ => None,
        }
    }

    /// Runs one rank's schedule over `bufs` with `tag_base` above every step's tag.
    pub(crate) fn run(
        &mut self,
        schedule: &Schedule,
        tag_base: u64,
        bufs: Buffers<'_>,
        opts: &ExecOptions<'_>,
    ) -> halo_collectives::Result<()> {
        self.run_program(Program::Steps(schedule), tag_base, bufs, opts)
    }

    /// After this rank's part of a collective failed with `e`, a mismatch: sends poison
    /// ([`Session::post_poison`]) with the descriptor `call` for each of `sends` (peer,
    /// tag under `tag_base`), the messages of later passes of the same call that will now
    /// never be sent (an all-reduce's later rounds), so that the ranks waiting for them
    /// fail now instead of at their timeout. Best effort, on the in-process and
    /// shared-memory transports (a broken one included: poison is all it still sends);
    /// the others' waiting ranks time out.
    pub(crate) fn poison_after_mismatch(
        &mut self,
        tag_base: u64,
        call: Call,
        sends: &[(usize, u64)],
        e: &CollectiveError,
    ) {
        let bufs = || Buffers {
            send: &[],
            recv: &mut [],
            scratch: &mut [],
            call,
        };
        match self {
            Backend::Local(t) => {
                if let Ok(mut s) = t.begin(tag_base, bufs()) {
                    for &(peer, tag) in sends {
                        let _ = s.post_poison(peer, tag);
                    }
                }
            }
            Backend::Shm(t) => t.poison_after_mismatch(tag_base, call, sends, e),
            _ => {}
        }
    }

    /// Writes a one-cell message with the whole tag `tag` to `peer` now if the
    /// transport can without waiting and without a session (HALO's rings, a free
    /// cell, nothing queued to `peer`; see `ShmTransport::try_send_now`). Whether it
    /// did; when not, nothing changed and the message goes the usual way.
    pub(crate) fn try_send_now(&mut self, peer: usize, tag: u64, bytes: &[u8]) -> bool {
        match self {
            Backend::Shm(t) => t.try_send_now(peer, tag, bytes),
            Backend::Hybrid(t) => t.try_send_now(peer, tag, bytes),
            // A shared endpoint's operations take turns (tickets): never out of turn.
            Backend::Local(_) | Backend::Fabric(_) | Backend::Shared(_) => false,
        }
    }

    /// Runs one rank's program (steps or waves) over `bufs`.
    pub(crate) fn run_program(
        &mut self,
        program: Program<'_>,
        tag_base: u64,
        bufs: Buffers<'_>,
        opts: &ExecOptions<'_>,
    ) -> halo_collectives::Result<()> {
        match self {
            Backend::Local(t) => run_on(t, program, tag_base, bufs, opts),
            Backend::Fabric(t) => run_on(&mut **t, program, tag_base, bufs, opts),
            Backend::Shm(t) => run_on(&mut **t, program, tag_base, bufs, opts),
            Backend::Hybrid(t) => run_on(&mut **t, program, tag_base, bufs, opts),
            Backend::Shared(s) => s.run(program, tag_base, bufs, opts),
        }
    }
}

fn run_on<T: Transport>(
    transport: &mut T,
    program: Program<'_>,
    tag_base: u64,
    bufs: Buffers<'_>,
    opts: &ExecOptions<'_>,
) -> halo_collectives::Result<()> {
    let mut session = transport.begin(tag_base, bufs)?;
    // The session is dropped before returning, on every path: that cancels what is
    // still outstanding before the caller's buffers are released.
    let out = program.run_on_session(&mut session, opts);
    drop(session);
    out
}

/// Takes the length noted for the receive `token` (posted with
/// [`Session::post_recv_up_to`]) from a transport's list: told once.
pub(crate) fn take_len(lens: &mut Vec<(u32, usize)>, token: u32) -> Option<usize> {
    let i = lens.iter().position(|&(t, _)| t == token)?;
    Some(lens.swap_remove(i).1)
}

/// What a receiver expected of a message it refused.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expected {
    /// The length of its receive.
    pub(crate) len: usize,
    /// Its call's descriptor.
    pub(crate) call: Call,
}

/// The error both ends of a message report when their views of it differ: the same
/// words on the sender and the receiver, naming both ranks and both sizes or calls
/// ([`Call::mismatch`]). `sent` is the message's length (`None`: longer than expected,
/// by how much the provider did not say) and the descriptor of the sender's call.
pub(crate) fn mismatch(
    sender: usize,
    receiver: usize,
    tag: u64,
    sent: (Option<usize>, Call),
    expected: Expected,
    me: usize,
) -> CollectiveError {
    let len = match sent.0 {
        Some(n) => format!("{n} bytes"),
        None => format!("more than {} bytes", expected.len),
    };
    let message = match Call::mismatch((sender, sent.1), (receiver, expected.call)) {
        Some(words) => format!("{words} (a message of {len}, tag {tag:#x})"),
        None => format!(
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
/// from `sender` in place of the message `tag`. `theirs` is the descriptor of the
/// sender's call where the poison carries one: when it differs from `ours`, the error
/// names both calls, as the rank that found the mismatch did.
pub(crate) fn poisoned(
    sender: usize,
    me: usize,
    tag: u64,
    theirs: Call,
    ours: Call,
) -> CollectiveError {
    if let Some(words) = Call::mismatch((sender, theirs), (me, ours)) {
        return CollectiveError::Mismatch {
            peer: sender,
            message: format!(
                "{words}; rank {sender} failed this collective and will not send the \
                 message (tag {tag:#x}) rank {me} waits for"
            ),
        };
    }
    CollectiveError::Mismatch {
        peer: sender,
        message: format!(
            "call or size mismatch: rank {sender} failed this collective because the ranks \
             made different calls (collectives, operations, element types, roots or \
             counts), and will not send the message (tag {tag:#x}) rank {me} waits for"
        ),
    }
}

/// Checks shared by the transports' tests.
#[cfg(test)]
pub(crate) mod testing {
    use halo_collectives::{Buf, Buffers, Call, CollectiveError, Region, Session, Transport};
    use std::time::{Duration, Instant};

    /// Lengths around the shared-memory rings' cells and beyond a small ring.
    const LENS: &[usize] = &[0, 1, 31, 32, 33, 100, 1000, 5000, 20_000];
    /// Room beyond each message in its receive.
    const ROOM: usize = 40;

    fn pattern(rank: usize, i: usize, len: usize) -> Vec<u8> {
        (0..len)
            .map(|k| (rank * 131 + i * 7 + k * 13 + k / 256) as u8)
            .collect()
    }

    /// Drives `s` until `want` operations completed, each once (fails after 20 s).
    pub(crate) fn complete(s: &mut impl Session, want: usize) -> Result<(), CollectiveError> {
        let mut done = Vec::new();
        let start = Instant::now();
        while done.len() < want {
            s.progress(&mut done)?;
            if done.len() < want {
                assert!(start.elapsed() < Duration::from_secs(20), "stuck: {done:?}");
                s.wait(Duration::from_micros(200))?;
            }
        }
        done.sort_unstable();
        done.dedup();
        assert_eq!(done.len(), want, "a token completed twice");
        Ok(())
    }

    /// One rank of two: sends a message of each of [`LENS`] bytes to the other and
    /// takes the other's with [`Session::post_recv_up_to`] receives `ROOM` bytes
    /// longer, posted before the messages come or (`late`) after they have arrived
    /// (whole or in part). Every message lands byte-exact at the start of its
    /// receive, the rest of the receive is untouched, and its length is told once.
    pub(crate) fn receives_up_to<T: Transport>(t: &mut T, late: bool) {
        let me = t.rank();
        let peer = 1 - me;
        let send: Vec<u8> = LENS
            .iter()
            .enumerate()
            .flat_map(|(i, &l)| pattern(me, i, l))
            .collect();
        let at = |i: usize| LENS[..i].iter().map(|l| l + ROOM).sum::<usize>();
        let from = |i: usize| LENS[..i].iter().sum::<usize>();
        let mut recv = vec![0xeeu8; at(LENS.len())];
        {
            let bufs = Buffers {
                send: &send,
                recv: &mut recv,
                scratch: &mut [],
                call: Call::NONE,
            };
            let mut s = t.begin(7 << 48, bufs).unwrap();
            let post_recvs = |s: &mut T::Session<'_>| {
                for (i, &l) in LENS.iter().enumerate() {
                    let region = Region::new(Buf::Recv, at(i), l + ROOM);
                    s.post_recv_up_to(peer, i as u64, region, 100 + i as u32)
                        .unwrap();
                }
            };
            if !late {
                post_recvs(&mut s);
            }
            for (i, &l) in LENS.iter().enumerate() {
                let region = Region::new(Buf::Send, from(i), l);
                s.post_send(peer, i as u64, region, i as u32).unwrap();
            }
            let mut done = Vec::new();
            if late {
                // Let the messages arrive before their receives are posted.
                let start = Instant::now();
                while start.elapsed() < Duration::from_millis(50) {
                    s.progress(&mut done).unwrap();
                    std::thread::yield_now();
                }
                post_recvs(&mut s);
            }
            complete(&mut s, 2 * LENS.len() - done.len()).unwrap();
            for (i, &l) in LENS.iter().enumerate() {
                let token = 100 + i as u32;
                assert_eq!(s.received_len(token), Some(l), "rank {me} message {i}");
                assert_eq!(s.received_len(token), None, "rank {me} message {i}, again");
                // A send and an exact receive tell no length.
                assert_eq!(s.received_len(i as u32), None, "rank {me} send {i}");
            }
        }
        for (i, &l) in LENS.iter().enumerate() {
            let got = &recv[at(i)..at(i) + l + ROOM];
            assert_eq!(&got[..l], &pattern(peer, i, l)[..], "rank {me} message {i}");
            assert!(
                got[l..].iter().all(|&b| b == 0xee),
                "rank {me} message {i}: bytes written beyond the message"
            );
        }
    }

    /// One rank of two: rank 0 sends 100 bytes, rank 1 takes them with a receive of
    /// up to 60: the receiver fails with a size mismatch naming both sizes.
    pub(crate) fn a_longer_message_is_a_mismatch<T: Transport>(t: &mut T) {
        let me = t.rank();
        let send = vec![5u8; 100];
        let mut recv = vec![0u8; 60];
        let bufs = Buffers {
            send: &send,
            recv: &mut recv,
            scratch: &mut [],
            call: Call::NONE,
        };
        let mut s = t.begin(9 << 48, bufs).unwrap();
        if me == 0 {
            s.post_send(1, 3, Region::new(Buf::Send, 0, 100), 0)
                .unwrap();
            // The sender may see the mismatch too (the in-process transport's
            // receiver rejects the message); it never completes wrongly.
            let _ = complete(&mut s, 1);
        } else {
            s.post_recv_up_to(0, 3, Region::new(Buf::Recv, 0, 60), 0)
                .unwrap();
            match complete(&mut s, 1) {
                Err(CollectiveError::Mismatch { peer, message }) => {
                    assert_eq!(peer, 0);
                    assert!(
                        message.contains("100 bytes") && message.contains("60 bytes"),
                        "{message}"
                    );
                }
                other => panic!("expected a mismatch, got {other:?}"),
            }
            assert_eq!(s.received_len(0), None);
        }
    }
}
