//! All-to-all-v: the counts are exchanged first, so that every pair agrees on every
//! size — zeros included — before a byte of data moves, and bad arguments or a count
//! mismatch on any rank is an error on every rank: never a hang, never wrong bytes.
//!
//! A call is one or two metadata passes, then the data pass — or, where the counts are
//! exchanged directly (small communicators) and no block is larger than 512 KiB plus
//! the eager bytes, one round of messages that carries the data too (*eager* and
//! *remainders behind the counts*, below). Three collective sequence numbers are taken either way (the data
//! pass, when there is one, runs with the third), so the sequence stays aligned
//! whichever way a call went.
//!
//! **One metadata pass (the common case).** Each rank all-gathers its whole row of
//! counts: for every rank `q`, [`META_BLOCK`] (16) bytes `[bytes I send to q, bytes I
//! expect from q]` (`u64` little endian; `u64::MAX` throughout when this rank's own
//! arguments are invalid), `16 n` bytes in all. Every rank then holds the whole `n x n`
//! matrix, checks every pair itself and reaches the same decision as every other rank
//! without an agreement pass; the forwarding algorithms (Bruck, HALO, 2D) read the
//! sizes of the blocks they route from it ([`KnownSizes::from_matrix`]), so any
//! algorithm may run the data pass. The all-gather is the direct one-round exchange
//! (the flat fan-out: `n - 1` messages of `16 n` bytes per rank, against `2 (n - 1)`
//! messages of 16 bytes for the two passes below) or, where the model finds it
//! cheaper, recursive doubling or Bruck's all-gather.
//!
//! **Eager blocks: one pass of messages.** With the direct exchange the message from
//! rank `p` to rank `q` also carries the first `min(count, C)` bytes of `p`'s block for
//! `q`: `[p's row][data]`, `16 n + min(count, C)` bytes, which `q` takes with a
//! receive of *up to* `F = 16 n + C` bytes ([`Session::post_recv_up_to`], an MPI
//! receive's semantics: every transport tells the length that arrived) and checks
//! against the count in the row — another length is a size mismatch naming both ranks
//! (the ranks carry different `C`), a longer message than `F` one at the transport. So
//! a pair of small blocks sends few bytes whatever `C` is, and across hosts `C` is at
//! least [`EAGER_V_DIRECT`] (8 KiB: a network message saved is worth more than the
//! copy out of the count message; on one host, where it is not, `C` as learned).
//! Where the count messages take another algorithm (below) they are a uniform
//! all-to-all, padded to a *fixed* `F` bytes, `[p's row][data][zeros]`. `C` is
//! [`EAGER_V`] (1 KiB) on a communicator's first call and then *learned*: every rank
//! holds the same checked matrix after each call, so every rank computes the same `C`
//! for the next one ([`learn_eager`]): the largest block plus an eighth where that is at
//! most 4 KiB (so that the next step of an MoE layer, whose counts change a little, is
//! again one pass; down to 64 bytes, so that tiny blocks do not pad to 1 KiB), kept
//! while the blocks fit, back to 1 KiB when a block is larger than 4 KiB or when padding
//! every block to `C` would send over four times the data. `HALO_A2AV_EAGER=<bytes>`
//! (the same on every rank) or [`Communicator::set_eager_v`] fix `C` instead (0 turns
//! it off, at most [`EAGER_V_MAX`]); the logarithmic all-gathers and the three passes
//! carry none. Every rank checks the gathered rows exactly as without (the same
//! errors on every rank), then copies the eager parts into place.
//! [`Communicator::eager_v`] tells a communicator's `C`.
//!
//! **Remainders behind the counts.** A block of `count > C` bytes whose remainder
//! `count - C` is at most `S` ([`SPECULATE_V`], 512 KiB) goes in a second message
//! that its sender posts right behind the count message, without waiting for
//! anything. The receiver reads each count message as it lands ([`Session::read`]):
//! the sender's row says whether a remainder follows and its exact length, so the
//! receiver posts that receive at once — into its receive buffer where its own count
//! for the pair agrees, into scratch (dropped) where not, one such at a time in `S`
//! bytes of scratch; so no transport ever sees a length it did not expect and no
//! message is left unread, whatever the counts. Then every rank checks the matrix as
//! above. Every rank knows the whole matrix, so all decide alike: if no block exceeds
//! `C + S` the call is over (one round of messages, as Open MPI's `MPI_Alltoallv`;
//! [`Communicator::last_algorithm`] says `Flat`), otherwise the data pass runs for the
//! larger blocks' remainders only (counts `c - C`, displacements `d + C` on both
//! sides, and so in the matrix the forwarding algorithms read).
//! `HALO_A2AV_SPECULATE=<bytes>` or [`Communicator::set_speculate_v`] (the same on
//! every rank) change `S` (0: every remainder takes the data pass, as before); a forced
//! algorithm other than `Flat` carries every remainder in its data pass.
//!
//! **Count messages across hosts.** In automatic mode, when the last call's blocks all
//! fitted in `C` (so none is expected to need more), the count messages go a way that
//! sends fewer messages over the network than the direct exchange (`n - 1` per rank):
//! - across hosts of the same number of ranks, in **two hops** (`count_hops`): each
//!   rank sends one message per other host, to the rank of its own local index there
//!   (its row and its first bytes for each of that host's ranks), which hands each
//!   rank of its host its part in one message per host peer (the rows and first bytes
//!   it holds for it); the same host's ranks exchange directly. All unpadded (receives
//!   of up to a bound, every length checked against the rows the message carries), so
//!   `C` is learned up to 16 KiB there ([`EAGER_V_LEARN_MAX_UNPADDED`]) with no padding
//!   rule. 4 hosts x 2: 3 messages per rank over the network instead of 6;
//! - elsewhere (hosts of different sizes), as a uniform all-to-all of `F`-byte blocks
//!   (`[p's row][p's first bytes for q][zeros]`, padded) with the algorithm the cost
//!   model prefers for `F` bytes, where that is not the direct exchange (across hosts,
//!   for small `F`, HALO's hierarchical all-to-all).
//!
//! Remainders, if any, then take the data pass, and the next call goes direct with
//! its remainders behind the counts. Every rank decides alike (the topology and the
//! model are deterministic, the last call's matrix the same everywhere), and
//! [`Communicator::last_algorithm`] names the algorithm that carried the count
//! messages of a call without a data pass (`Halo` for the two hops). On one host the
//! count messages go direct. After a size mismatch a rank sends poison in place of
//! the second hops it has not sent, so that its host's ranks fail at once too.
//!
//! **Three passes (large communicators).** The gathered matrix is `16 n^2` bytes on
//! every rank: on a network it costs more than two latency-bound passes once `n` is a
//! few dozen (simulated on Frontier: 0.5-0.6x of the two passes at 8-16 ranks, 1.08x at
//! 32, 1.2x at 64, 1.7x at 128, 2.9x at 256; `cargo run --release -p halo-collectives
//! --example v_meta_crossover`, docs/bench/JOURNAL.md "All-to-all-v in one metadata
//! pass"). So for each communicator the first call compares, with the simulator
//! ([`halo_collectives::simulate`], deterministic, so every rank agrees), the best
//! all-gather of the rows against two uniform passes of 16 bytes with the automatic
//! algorithm, and gathers only where that is no slower, never above
//! [`GATHER_MAX_RANKS`]. `HALO_A2AV_GATHER_MAX=K` (the same on every rank) overrides
//! the model: gather up to `K` ranks, three passes above (0: always three passes). The
//! three passes:
//!
//! 1. **Metadata**: a uniform all-to-all of [`META_BLOCK`] bytes per pair, the same
//!    16 bytes to rank `q` as above. It runs with the data pass's algorithm when that
//!    one forwards other ranks' blocks, so that the forwarding ranks learn the sizes
//!    they will route ([`KnownSizes::routed_from_meta`]); otherwise with the automatic
//!    choice.
//! 2. **Agreement**: every rank checks both directions of each pair against what it
//!    received, then a uniform all-to-all of 16-byte status blocks (`[code u32, peer
//!    u32, total bytes this rank sends u64]`) tells every rank about every other.
//! 3. **Data** with the agreed sizes.
//!
//! **Errors**, alike both ways: if any rank had invalid arguments or any pair
//! disagrees, *every* rank returns an error — the two ranks of a disagreeing pair
//! [`Error::InvalidUsage`] naming each other and both counts, a rank with bad arguments
//! its own [`Error::InvalidArgument`], the others [`Error::InvalidUsage`] naming the
//! first rank (in rank order) that reported a problem. Nobody hangs, and the
//! communicator stays usable. The receive buffer of a failed call holds nothing of a
//! disagreeing pair's block; blocks of pairs that agreed may have landed already
//! (remainders behind the counts arrive before every count is known), as MPI leaves
//! a failed call's receive buffer undefined.
//!
//! **Automatic mode** measures ([`crate::tune`], the same tuner as the uniform
//! all-to-all's, with its own keys): the data pass's algorithm is chosen per size class
//! of the mean block over all pairs (total bytes / `n^2`) that the data pass moves —
//! after eager bytes, the remainders' — which every rank knows alike after either count
//! exchange (the gathered matrix, or every rank's total in the status blocks), so every
//! rank is at the same point of the same class's trials. A call that fails in the count
//! exchange fails on every rank before the data pass and records no trial; a call with
//! no data pass (every block eager) records none either. [`Communicator::tuned_v`]
//! tells what was measured and chosen.

use super::all_to_all::{raw_slice, raw_slice_mut};
use super::{
    Communicator, Core, Kind, Partition, cached_schedule, class, exec_options, overlaps, sized,
};
use crate::error::{Error, Result};
use crate::transport::Program;
use crate::tune::Key;
use halo_collectives::{
    Algorithm, AllGatherAlgorithm, Buf, Buffers, BuildCtx, Call, CallKind, CollectiveError,
    ExecOptions, Idle, KnownSizes, Layout, META_BLOCK, Region, Schedule, Session, SimOptions,
    UniformSizes, build, build_all_gather, simulate,
};
use halo_topology::Level;
use std::collections::HashMap;
use std::sync::OnceLock;

/// The descriptor every message of an all-to-all-v carries (its totals differ from rank
/// to rank: the count is carried only by the passes of a size every rank agrees on).
const V_CALL: Call = Call::new(CallKind::AllToAllV);

/// Status codes of the agreement pass.
const OK: u32 = 0;
const MISMATCH: u32 = 1;
const INVALID: u32 = 2;

const STATUS_BLOCK: usize = 16;

/// The most ranks whose counts are all-gathered (one metadata pass) unless
/// `HALO_A2AV_GATHER_MAX` says otherwise; the model is not run above. From 32 ranks on
/// simulated Frontier and at 64 on every simulated topology the `16 n^2` bytes of the
/// matrix already cost more than the two passes they save (module documentation).
pub(crate) const GATHER_MAX_RANKS: usize = 64;

/// Bytes of each block that travel with the counts in the direct exchange
/// ([`MetaPlan::Direct`]) on a communicator's first call, unless `HALO_A2AV_EAGER` says
/// otherwise (module documentation). The message from one rank to another is then at
/// most `16 n + EAGER_V` bytes (exactly that where the count messages take a uniform
/// all-to-all, which pads them): 1 KiB keeps that message small (2 KiB at the 64 ranks
/// that gather at most; one cell of the shared-memory rings, whose payload is about 8
/// KiB, and latency-bound on a network), while the blocks that make a pass
/// latency-bound (MoE dispatch of a few tokens per expert, means of a few hundred
/// bytes to 2 KiB) go whole, or mostly, in the one pass. A block above it sends its
/// remainder in a second message (or the data pass).
pub(crate) const EAGER_V: usize = 1024;

/// The fewest eager bytes a communicator learns (see [`learn_eager`]).
pub(crate) const EAGER_V_LEARN_MIN: usize = 64;

/// The most eager bytes a communicator learns (see [`learn_eager`]): `16 n + 4096`
/// bytes stay within one cell of the shared-memory rings up to the 64 ranks that
/// gather the counts, and a few microseconds of a network link.
pub(crate) const EAGER_V_LEARN_MAX: usize = 4096;

/// The eager bytes for the next call, learned from this call's matrix (identical on
/// every rank, so every rank's next message has the same length): `c` now, `max_block`
/// the largest block of any pair, `total` the bytes of all blocks of the `n x n`
/// matrix.
///
/// - A block above [`EAGER_V_LEARN_MAX`]: the next call needs a data pass anyway, so
///   the default [`EAGER_V`] (the eager bytes only shorten the remainders).
/// - Otherwise the next call should be one pass: `c` is kept while every block fits
///   and `c` is less than twice what they need (so `c` does not change call to call
///   with every small change of the routing), else it becomes the largest block plus
///   an eighth (room for the next step's counts to grow), rounded up to 64 bytes,
///   at least [`EAGER_V_LEARN_MIN`].
/// - Above [`EAGER_V`], only where the padded messages (`n^2 c` bytes of blocks) are
///   at most four times the data: a skewed matrix with one large block and many small
///   ones keeps the default.
///
/// `unpadded` (the count messages are never padded: across hosts that take the two
/// hops): up to [`EAGER_V_LEARN_MAX_UNPADDED`] instead, and without the padding rule.
pub(crate) fn learn_eager(
    c: usize,
    max_block: usize,
    total: u64,
    n: usize,
    unpadded: bool,
) -> usize {
    let most = if unpadded {
        EAGER_V_LEARN_MAX_UNPADDED
    } else {
        EAGER_V_LEARN_MAX
    };
    if max_block > most {
        return EAGER_V;
    }
    let want = (max_block + max_block / 8)
        .next_multiple_of(64)
        .clamp(EAGER_V_LEARN_MIN, most);
    let next = if max_block <= c && want > c / 2 {
        c
    } else {
        want
    };
    let padded = (n as u64)
        .saturating_mul(n as u64)
        .saturating_mul(next as u64);
    if !unpadded && next > EAGER_V && padded > total.saturating_mul(4) {
        return EAGER_V;
    }
    next
}

/// The most eager bytes a communicator learns where its count messages are never
/// padded (across hosts that take the two hops, [`super::count_hops`]): up to 16 KiB
/// the hops carried MoE blocks of 4-8 KiB mean at 1.03-1.17x of Open MPI's
/// `MPI_Alltoallv` on 4 emulated hosts; 32 KiB was 0.94-1.05x there
/// (docs/bench/JOURNAL.md).
pub(crate) const EAGER_V_LEARN_MAX_UNPADDED: usize = 16384;

/// The largest `HALO_A2AV_EAGER` taken (larger values are cut to it): every message of
/// the count exchange carries that many bytes.
pub(crate) const EAGER_V_MAX: usize = 1 << 20;

/// The largest remainder (the bytes of a block beyond the eager part) that a rank
/// sends right behind its count message in the direct exchange, unless
/// `HALO_A2AV_SPECULATE` or [`Communicator::set_speculate_v`] say otherwise; larger
/// blocks take the data pass. Every rank keeps this much scratch for a message it must
/// take but not keep (its pair disagrees on the count), so it is bounded: 512 KiB
/// covers the blocks of MoE steps up to a mean of 64 KiB per pair with a skew of
/// several times the mean.
pub const SPECULATE_V: usize = 512 * 1024;

/// The largest `HALO_A2AV_SPECULATE` taken.
pub(crate) const SPECULATE_V_MAX: usize = 16 << 20;

// The bounds of `HALO_A2AV_EAGER` and `HALO_A2AV_SPECULATE` in the parameter table are
// these.
const _: () = assert!(
    matches!(halo_params::A2AV_EAGER.kind, halo_params::Kind::Number { max, .. } if max == EAGER_V_MAX as u64)
        && matches!(halo_params::A2AV_SPECULATE.kind, halo_params::Kind::Number { max, .. } if max == SPECULATE_V_MAX as u64),
    "the bounds in halo-params differ from EAGER_V_MAX / SPECULATE_V_MAX"
);

/// The least bytes of each block that the direct exchange's count messages carry on
/// a communicator that spans hosts, where the eager bytes are learned (neither
/// `HALO_A2AV_EAGER` nor [`Communicator::set_eager_v`] fix them). Those messages are
/// not padded (each is the sender's row and the first `min(count, C)` bytes of its
/// block, taken by a receive of any length up to `16 n + C`), so a larger `C` costs
/// only the pairs whose blocks are larger, and a network message saved is worth far
/// more than a copy: blocks of 2-8 KiB mean are one message per pair instead of two
/// (4 emulated hosts: 1.0-1.1x of Open MPI's `MPI_Alltoallv` at 8 KiB against
/// 0.7-0.75x, docs/bench/JOURNAL.md). Not on one host, where the bytes in the count
/// message cost two more copies than a remainder, which goes straight into the
/// receive buffer (8 KiB there: no gain, and 32-64 KiB mean slower in two sets of
/// alternating launches).
pub(crate) const EAGER_V_DIRECT: usize = 8192;

/// How one call's count messages go ([`Communicator::count_route`]).
#[derive(Debug, Clone, Copy)]
struct CountRoute {
    /// The uniform all-to-all that carries them, padded to `16 n + c` bytes, where
    /// not the direct exchange (remainders then take the data pass).
    routed: Option<Algorithm>,
    /// Routed in two hops, unpadded ([`super::count_hops`]), not by the uniform
    /// all-to-all.
    hops: bool,
    /// The bytes of each block they carry.
    c: usize,
    /// The largest remainder sent right behind them (0 when routed).
    s: usize,
}

/// Tags of the direct exchange's messages within their collective.
const TAG_COUNTS: u64 = 0;
const TAG_REST: u64 = 1;

/// How a communicator exchanges all-to-all-v counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetaPlan {
    /// Metadata and agreement passes (three passes in all).
    Agreed,
    /// One all-gather of the rows, direct: every rank sends its row to every rank.
    Direct,
    /// One all-gather of the rows with a logarithmic algorithm.
    Gather(AllGatherAlgorithm),
}

/// Per-communicator state of the all-to-all-v count exchange.
#[derive(Debug, Default)]
pub(crate) struct VState {
    /// The plan, once chosen (the first call).
    plan: Option<MetaPlan>,
    /// Forced by a test (kept across [`VState::reset`]).
    forced: Option<MetaPlan>,
    /// The all-gather schedule of the plan (for `16 n`-byte rows).
    gather: Option<(MetaPlan, Schedule)>,
    /// The send matrix in bytes (row = source), for forwarding algorithms.
    matrix: Vec<usize>,
    /// Calls that took each way: (one metadata pass, three passes).
    pub(crate) calls: (u64, u64),
    /// Calls whose data all went with the counts (no data pass).
    pub(crate) eager_only: u64,
    /// Eager bytes per block fixed by [`Communicator::set_eager_v`] (kept across
    /// [`VState::reset`]).
    eager_forced: Option<usize>,
    /// Eager bytes per block learned from the last successful call ([`learn_eager`]).
    eager_learned: Option<usize>,
    /// The largest speculative remainder fixed by [`Communicator::set_speculate_v`]
    /// (kept across [`VState::reset`]).
    spec_forced: Option<usize>,
    /// The direct exchange's scratch: the `n` count messages out, the `n` in, then
    /// room for one speculative remainder to take and drop.
    stage: Vec<u8>,
    /// The largest block of the last successful call with eager bytes (the same on
    /// every rank).
    last_largest: Option<u64>,
    /// The driven direct exchange's bookkeeping, reused from call to call.
    drive: DriveState,
    /// The two-hop exchange's, likewise.
    hops: super::count_hops::HopState,
}

impl VState {
    /// Forgets the plan and its schedule (the builder options changed).
    pub(crate) fn reset(&mut self) {
        self.plan = None;
        self.gather = None;
    }
}

/// The parameter `p` as a count, if set, cut to its upper bound. An unparsable value
/// is logged and ignored.
fn env_count(p: &halo_params::Param) -> Option<usize> {
    let (name, max) = match p.kind {
        halo_params::Kind::Number { max, .. } => {
            (p.name, usize::try_from(max).unwrap_or(usize::MAX))
        }
        _ => (p.name, usize::MAX),
    };
    let v = p.raw()?;
    match v.trim().parse::<usize>() {
        Ok(c) if c > max => {
            tracing::warn!("{name}={v:?} is above {max}: {max} taken");
            Some(max)
        }
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!("{name}={v:?} ignored: {e}");
            None
        }
    }
}

/// `HALO_A2AV_EAGER`, if set: the bytes of each block carried with the counts (0: none,
/// the count exchange then the data pass as before), at most [`EAGER_V_MAX`].
fn eager_env() -> Option<usize> {
    static EAGER: OnceLock<Option<usize>> = OnceLock::new();
    *EAGER.get_or_init(|| env_count(&halo_params::A2AV_EAGER))
}

/// `HALO_A2AV_GATHER_MAX`, if set: the most ranks that all-gather the counts.
fn gather_max_env() -> Option<usize> {
    static MAX: OnceLock<Option<usize>> = OnceLock::new();
    *MAX.get_or_init(|| env_count(&halo_params::A2AV_GATHER_MAX))
}

/// `HALO_A2AV_SPECULATE`, if set: the largest remainder sent right behind the count
/// message (0: none), at most [`SPECULATE_V_MAX`].
fn speculate_env() -> Option<usize> {
    static SPEC: OnceLock<Option<usize>> = OnceLock::new();
    *SPEC.get_or_init(|| env_count(&halo_params::A2AV_SPECULATE))
}

/// The remainder of a block of `count` bytes (`u64::MAX`: its sender's arguments are
/// invalid) that its sender sends right behind the count message when `c` bytes go
/// with the counts and remainders up to `s` bytes are sent so; `None` when the block
/// fits in the eager bytes, is larger, or its sender had invalid arguments. Sender and
/// receiver decide with the same `count` (the sender's own, which the receiver reads
/// from the sender's count message), so both agree on every message.
fn speculated(count: u64, c: usize, s: usize) -> Option<usize> {
    if count == u64::MAX {
        return None;
    }
    let rest = usize::try_from(count).ok()?.checked_sub(c)?;
    (rest > 0 && rest <= s).then_some(rest)
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

/// How long a rank that found a count message of the wrong length keeps delivering
/// its own sends before it fails (as the transports do after a size mismatch).
const FLUSH_SENDS: std::time::Duration = std::time::Duration::from_millis(500);

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

/// The bytes of a block of `count` bytes (`u64::MAX`: its sender's arguments are
/// invalid, it sends none) that a count message carries with `c` eager bytes.
pub(super) fn eager_len(count: u64, c: usize) -> usize {
    if count == u64::MAX {
        0
    } else {
        usize::try_from(count).unwrap_or(usize::MAX).min(c)
    }
}

/// Every rank's schedule of the direct all-gather of `row`-byte rows: the flat fan-out
/// with rank `q`'s block at `q * row` of the receive buffer and the same `row` bytes of
/// the send buffer to everyone.
fn direct_gather(core: &Core, rank: usize, row: usize) -> halo_collectives::Result<Schedule> {
    let n = core.size;
    let counts = vec![row; n];
    let send_displs = vec![0; n];
    let recv_displs: Vec<usize> = (0..n).map(|q| q * row).collect();
    build(
        Algorithm::Flat,
        &BuildCtx {
            topology: &core.topology,
            rank,
            layout: Layout::V {
                send_counts: &counts,
                send_displs: &send_displs,
                recv_counts: &counts,
                recv_displs: &recv_displs,
            },
            sizes: &UniformSizes(row),
            options: &core.options,
        },
    )
}

/// The schedule of one all-gather plan for rank `rank`.
fn gather_schedule(
    core: &Core,
    plan: MetaPlan,
    rank: usize,
    row: usize,
) -> halo_collectives::Result<Schedule> {
    match plan {
        MetaPlan::Gather(a) => build_all_gather(a, rank, core.size, row),
        _ => direct_gather(core, rank, row),
    }
}

/// The model's plan for `core`'s communicator: the cheapest all-gather of the rows
/// when it is no slower than two uniform passes of [`META_BLOCK`] bytes with the
/// automatic algorithm (both simulated), otherwise [`MetaPlan::Agreed`]; with
/// `max_ranks` (the environment's override) the size alone decides.
fn model_plan(core: &Core, max_ranks: Option<usize>) -> MetaPlan {
    let n = core.size;
    if n > max_ranks.unwrap_or(GATHER_MAX_RANKS) {
        return MetaPlan::Agreed;
    }
    if n <= 2 {
        return MetaPlan::Direct; // one message each way, whichever algorithm
    }
    let row = n * META_BLOCK;
    let sim = SimOptions {
        algo: core.options.clone(),
        ..SimOptions::default()
    };
    let time = |plan: MetaPlan| -> Option<f64> {
        let all = (0..n)
            .map(|r| gather_schedule(core, plan, r, row))
            .collect::<halo_collectives::Result<Vec<_>>>()
            .ok()?;
        simulate(&core.topology, &all, &sim).ok().map(|r| r.time)
    };
    let mut plans = vec![
        MetaPlan::Direct,
        MetaPlan::Gather(AllGatherAlgorithm::Bruck),
    ];
    if n.is_power_of_two() {
        plans.push(MetaPlan::Gather(AllGatherAlgorithm::RecursiveDoubling));
    }
    // Ties go to the earlier plan: the direct exchange first.
    let best = plans
        .into_iter()
        .filter_map(|p| time(p).map(|t| (p, t)))
        .fold(None::<(MetaPlan, f64)>, |b, (p, t)| match b {
            Some((_, bt)) if bt <= t => b,
            _ => Some((p, t)),
        });
    let Some((plan, gather)) = best else {
        return MetaPlan::Agreed;
    };
    if max_ranks.is_some() {
        return plan;
    }
    let passes = crate::select::ranking(&core.topology, META_BLOCK, &core.options)
        .times
        .first()
        .map_or(f64::INFINITY, |&(_, t)| 2.0 * t);
    tracing::debug!(
        ranks = n,
        ?plan,
        gather_seconds = gather,
        two_passes_seconds = passes,
        "all-to-all-v count exchange"
    );
    if gather <= passes {
        plan
    } else {
        MetaPlan::Agreed
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
fn check_matrix(m: &[u8], n: usize, me: usize) -> Result<(u64, u64)> {
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

fn read_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The arguments of one call, in elements.
pub(super) struct Args<'a> {
    pub(super) send_len: usize,
    pub(super) recv_len: usize,
    pub(super) send_counts: &'a [usize],
    pub(super) send_displs: &'a [usize],
    pub(super) recv_counts: &'a [usize],
    pub(super) recv_displs: &'a [usize],
    pub(super) elem: usize,
}

impl Communicator {
    /// All-to-all-v: rank `q`'s block of `send` (as `send_part` cuts it) goes to rank
    /// `q`; the block from rank `q` lands where `recv_part` puts rank `q`'s block of
    /// `recv`. Counts and displacements are in elements; any count may be zero.
    ///
    /// ```
    /// use halo::Partition;
    /// use halo::local::{self, Emulation};
    /// use halo::topology::Topology;
    ///
    /// let topo = Topology::preset("flat:3").unwrap();
    /// let out = local::run(&topo, Emulation::off(), |comm| {
    ///     let (me, n) = (comm.rank(), comm.size());
    ///     // Rank `me` sends q + 1 copies of its rank to rank q.
    ///     let send_counts: Vec<usize> = (0..n).map(|q| q + 1).collect();
    ///     let send: Vec<u32> = vec![me as u32; send_counts.iter().sum()];
    ///     let recv_counts = vec![me + 1; n];
    ///     let mut recv = vec![0u32; (me + 1) * n];
    ///     comm.all_to_all_v(
    ///         &send,
    ///         &Partition::packed(&send_counts),
    ///         &mut recv,
    ///         &Partition::packed(&recv_counts),
    ///     )?;
    ///     Ok(recv)
    /// });
    /// assert_eq!(out[1].as_ref().unwrap(), &[0, 0, 1, 1, 2, 2]);
    /// ```
    ///
    /// The counts are exchanged first (see the module documentation of `comm::all_to_all_v`), so a
    /// pair of ranks that disagree is an error on every rank, not a hang.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the peer when a count or displacement is out of
    /// its buffer or overflows, when the counts or displacements do not have `size()`
    /// entries, when receive blocks overlap, or when the buffers overlap;
    /// [`Error::InvalidUsage`] when a pair disagrees on a count (on both ranks, naming
    /// the peer and both counts) or another rank reported a problem;
    /// [`Error::Timeout`], [`Error::Aborted`], [`Error::RemoteError`] as they happen.
    pub fn all_to_all_v<E: bytemuck::Pod>(
        &mut self,
        send: &[E],
        send_part: &Partition<'_>,
        recv: &mut [E],
        recv_part: &Partition<'_>,
    ) -> Result<()> {
        let args = Args {
            send_len: send.len(),
            recv_len: recv.len(),
            send_counts: send_part.counts(),
            send_displs: send_part.displs(),
            recv_counts: recv_part.counts(),
            recv_displs: recv_part.displs(),
            elem: std::mem::size_of::<E>(),
        };
        let send: &[u8] = bytemuck::cast_slice(send);
        let recv: &mut [u8] = bytemuck::cast_slice_mut(recv);
        self.v_bytes(send, recv, &args, Ok(()))
    }

    /// All-to-all-v over raw memory, for the C ABI. Counts and displacements are in
    /// elements of `elem_size` bytes; the buffers' extents are what the counts and
    /// displacements reach.
    ///
    /// Invalid counts still take part in the count exchange (so the other ranks fail
    /// too instead of waiting), and overlap is checked before any reference to the
    /// memory is made.
    ///
    /// # Safety
    /// `send` must be valid for reads and `recv` for writes of the bytes the counts and
    /// displacements reach (either may be null when that is zero), and no other thread
    /// may write `send` or access `recv` during the call.
    ///
    /// # Errors
    /// As [`Communicator::all_to_all_v`]; also [`Error::InvalidArgument`] for a null
    /// pointer with a non-zero extent.
    pub(crate) unsafe fn all_to_all_v_raw(
        &mut self,
        send: *const u8,
        send_part: &Partition<'_>,
        recv: *mut u8,
        recv_part: &Partition<'_>,
        elem_size: usize,
    ) -> Result<()> {
        let (send_counts, send_displs) = (send_part.counts(), send_part.displs());
        let (recv_counts, recv_displs) = (recv_part.counts(), recv_part.displs());
        let n = self.size();
        let extent = |counts: &[usize], displs: &[usize], what: &str| -> Result<usize> {
            if counts.len() != n || displs.len() != n {
                return Err(Error::invalid_argument(format!(
                    "all_to_all_v: {what} counts and displacements need {n} entries, not {} and {}",
                    counts.len(),
                    displs.len()
                )));
            }
            let mut end = 0usize;
            for q in 0..n {
                if counts[q] == 0 {
                    continue;
                }
                let e = displs[q]
                    .checked_add(counts[q])
                    .filter(|e| e.checked_mul(elem_size).is_some_and(|b| b <= isize::MAX as usize))
                    .ok_or_else(|| {
                        Error::invalid_argument_peer(
                            q,
                            format!(
                                "all_to_all_v: {what} block of rank {q} ({} + {} elements of {elem_size} bytes) overflows",
                                displs[q], counts[q]
                            ),
                        )
                    })?;
                end = end.max(e);
            }
            Ok(end)
        };
        let extents = extent(send_counts, send_displs, "send")
            .and_then(|s| extent(recv_counts, recv_displs, "recv").map(|r| (s, r)));
        let (send_len, recv_len, pre) = match extents {
            Ok((s, r)) => (s, r, Ok(())),
            Err(e) => (0, 0, Err(e)),
        };
        let (sb, rb) = (send_len * elem_size, recv_len * elem_size);
        let pre = pre.and_then(|()| {
            if overlaps(send, sb, recv, rb) {
                Err(Error::invalid_argument(
                    "all_to_all_v: send and receive buffers overlap (HALO is out-of-place only)",
                ))
            } else {
                Ok(())
            }
        });
        let (send_s, recv_s, pre) = match pre {
            // SAFETY: the caller guarantees `send` valid for reads of the bytes the counts
            // reach (`sb`), unwritten during the call.
            Ok(()) => match unsafe { raw_slice(send, sb, "send") } {
                // SAFETY: likewise `recv` for writes of `rb` bytes, exclusive; it does not
                // overlap `send` (checked above).
                Ok(s) => match unsafe { raw_slice_mut(recv, rb, "recv") } {
                    Ok(r) => (s, r, Ok(())),
                    Err(e) => (&[][..], &mut [][..], Err(e)),
                },
                Err(e) => (&[][..], &mut [][..], Err(e)),
            },
            Err(e) => (&[][..], &mut [][..], Err(e)),
        };
        let args = Args {
            send_len: if pre.is_ok() { send_len } else { 0 },
            recv_len: if pre.is_ok() { recv_len } else { 0 },
            send_counts,
            send_displs,
            recv_counts,
            recv_displs,
            elem: elem_size,
        };
        self.v_bytes(send_s, recv_s, &args, pre)
    }

    /// Checks this rank's arguments and fills the pooled byte counts and displacements.
    pub(super) fn validate_v(&mut self, send: &[u8], recv: &[u8], a: &Args<'_>) -> Result<()> {
        let n = self.size();
        for (name, v) in [
            ("send_counts", a.send_counts),
            ("send_displs", a.send_displs),
            ("recv_counts", a.recv_counts),
            ("recv_displs", a.recv_displs),
        ] {
            if v.len() != n {
                return Err(Error::invalid_argument(format!(
                    "all_to_all_v: {name} has {} entries for {n} ranks",
                    v.len()
                )));
            }
        }
        let pool = &mut self.pool;
        let sides = [
            (
                "send",
                a.send_counts,
                a.send_displs,
                a.send_len,
                &mut pool.send_bytes,
                &mut pool.send_displs,
            ),
            (
                "recv",
                a.recv_counts,
                a.recv_displs,
                a.recv_len,
                &mut pool.recv_bytes,
                &mut pool.recv_displs,
            ),
        ];
        for (what, counts, displs, len, out_bytes, out_displs) in sides {
            out_bytes.clear();
            out_displs.clear();
            for q in 0..n {
                let (c, d) = (counts[q], displs[q]);
                let end = d.checked_add(c).ok_or_else(|| {
                    Error::invalid_argument_peer(
                        q,
                        format!("all_to_all_v: {what}_displs[{q}] + {what}_counts[{q}] = {d} + {c} overflows"),
                    )
                })?;
                if c > 0 && end > len {
                    return Err(Error::invalid_argument_peer(
                        q,
                        format!(
                            "all_to_all_v: the {what} block of rank {q} (elements {d}..{end}) is outside the {what} buffer of {len} elements"
                        ),
                    ));
                }
                // Inside a slice, so these products fit.
                let (cb, db) = (c.checked_mul(a.elem), d.checked_mul(a.elem));
                match (cb, db) {
                    (Some(cb), Some(db)) => {
                        out_bytes.push(cb);
                        out_displs.push(if c == 0 { 0 } else { db });
                    }
                    _ => {
                        return Err(Error::invalid_argument_peer(
                            q,
                            format!(
                                "all_to_all_v: the {what} block of rank {q} in bytes overflows"
                            ),
                        ));
                    }
                }
            }
        }
        // Receive blocks must not overlap: each byte is written once.
        pool.order.clear();
        pool.order.extend(
            (0..n)
                .filter(|&q| pool.recv_bytes[q] > 0)
                .map(|q| (pool.recv_displs[q], pool.recv_bytes[q], q)),
        );
        pool.order.sort_unstable();
        for w in pool.order.windows(2) {
            let ((d0, c0, q0), (d1, _, q1)) = (w[0], w[1]);
            if d0 + c0 > d1 {
                return Err(Error::invalid_argument_peer(
                    q1,
                    format!("all_to_all_v: the receive blocks from ranks {q0} and {q1} overlap"),
                ));
            }
        }
        if overlaps(send.as_ptr(), send.len(), recv.as_ptr(), recv.len()) {
            return Err(Error::invalid_argument(
                "all_to_all_v: send and receive buffers overlap (HALO is out-of-place only)",
            ));
        }
        Ok(())
    }

    /// What the automatic mode measured and chose for all-to-all-v data passes whose
    /// mean block over all pairs (total bytes the data pass moves for all ranks /
    /// `size()^2`: what is left of the blocks beyond the first
    /// [`Communicator::eager_v`] bytes of each, which go with the counts) is in the size
    /// class of `mean_block`, once the trials of that class are over and agreed on (see
    /// [`crate::tune`]); `None` before, when an algorithm is forced, or while every
    /// call's blocks all fit in the eager bytes (no data pass to measure). Kept apart
    /// from the uniform all-to-all's classes ([`Communicator::tuned`]).
    pub fn tuned_v(&self, mean_block: usize) -> Option<crate::tune::Tuned> {
        self.core.tuner.tuned_v(class(mean_block))
    }

    /// Forces the way the counts are exchanged (`None`: the model's choice), for tests.
    #[cfg(test)]
    pub(crate) fn force_meta_plan(&mut self, plan: Option<MetaPlan>) {
        self.pool.v.forced = plan;
        self.pool.v.reset();
    }

    /// Calls of all-to-all-v so far that exchanged the counts in one pass and in two.
    #[cfg(test)]
    pub(crate) fn v_calls(&self) -> (u64, u64) {
        self.pool.v.calls
    }

    /// Fixes how many bytes of each block all-to-all-v carries with the counts on this
    /// communicator (`Some(0)`: none, the count exchange and then the data pass; at most
    /// 1 MiB), or with `None` returns to the default: `HALO_A2AV_EAGER` if set, else
    /// learned from call to call (see [`Communicator::eager_v`]). Like every argument
    /// of a collective, the same on every rank: the count messages' length depends on
    /// it. Only the direct count exchange of small communicators carries any.
    ///
    /// ```
    /// # use halo::local::{Emulation, LocalCluster};
    /// # use halo::topology::Topology;
    /// # let cluster = LocalCluster::new(Topology::preset("nodes:1x2").unwrap(), Emulation::off()).unwrap();
    /// # cluster.run(|comm| {
    /// comm.set_eager_v(Some(0)); // always the count exchange, then the data pass
    /// assert_eq!(comm.eager_v(), 0);
    /// # Ok(()) }).into_iter().collect::<halo::Result<Vec<()>>>().unwrap();
    /// ```
    pub fn set_eager_v(&mut self, bytes: Option<usize>) {
        self.pool.v.eager_forced = bytes;
        self.pool.v.reset();
    }

    /// Calls of all-to-all-v so far whose data all went with the counts (one pass).
    #[cfg(test)]
    pub(crate) fn v_eager_only(&self) -> u64 {
        self.pool.v.eager_only
    }

    /// How many bytes of each block all-to-all-v carries with the counts on this
    /// communicator: the first `min(count, eager_v())` bytes of every block travel in
    /// the count exchange, and a call whose blocks all fit is one pass of messages; the
    /// rest of larger blocks follows right behind the counts (up to
    /// [`Communicator::speculate_v`] bytes, in the same round) or in the data pass
    /// (whose automatic choice is measured by the mean of those remainders, see
    /// [`Communicator::tuned_v`]). 0 where
    /// the counts are gathered with a logarithmic algorithm or exchanged in three passes
    /// (large communicators), or with `HALO_A2AV_EAGER=0`; otherwise what
    /// [`Communicator::set_eager_v`] or `HALO_A2AV_EAGER` fixed (at most 1 MiB), or else
    /// what the next call will carry as learned from the last successful one (module
    /// documentation of all-to-all-v: 64 bytes to 4 KiB), 1024 bytes before any — and
    /// at least 8 KiB on a communicator across hosts whose next count messages go
    /// direct (unpadded). Chooses the communicator's way of exchanging the counts if no
    /// call has yet (deterministic: the same on every rank).
    pub fn eager_v(&mut self) -> usize {
        let plan = self.meta_plan();
        let eager = self.eager_for(plan);
        if eager == 0 {
            return 0;
        }
        let spec = self.speculate_v();
        match self.count_route(eager, spec) {
            Ok(r) => r.c,
            Err(_) => eager,
        }
    }

    /// How the next call's count messages go when `c` bytes of each block are learned
    /// or fixed to go with the counts and remainders up to `s` are sent behind them
    /// (see [`CountRoute`]); the same on every rank.
    fn count_route(&mut self, c: usize, s: usize) -> Result<CountRoute> {
        let f = self.size() * META_BLOCK + c;
        // In automatic mode, when the last call's blocks all fitted in the eager bytes
        // (no remainders expected), the count messages go another way than the direct
        // exchange where one sends fewer messages over the network: across hosts of
        // the same number of ranks, the two hops ([`super::count_hops`], unpadded: one
        // message per other host instead of one per rank there), elsewhere a uniform
        // all-to-all of `f`-byte blocks (padded) where the cost model prefers another
        // algorithm than the direct exchange for that size. Remainders then take the
        // data pass. Every rank decides alike: the topology and the model are the
        // same everywhere, and so is the last call's matrix. (The tuner's measured
        // choice was tried for the uniform way and lost on one host: its trials of
        // other algorithms cost more than they found; docs/bench/JOURNAL.md.)
        let expect_rest = self.pool.v.last_largest.is_some_and(|l| l > c as u64);
        if self.core.forced.is_none() && !(s > 0 && expect_rest) {
            if super::count_hops::applies(&self.core.topology) {
                return Ok(CountRoute {
                    routed: Some(Algorithm::Halo),
                    hops: true,
                    c,
                    s: 0,
                });
            }
            let a = self.core.prepare_uniform(None, f)?;
            if a != Algorithm::Flat {
                return Ok(CountRoute {
                    routed: Some(a),
                    hops: false,
                    c,
                    s: 0,
                });
            }
        }
        // The direct exchange's messages are not padded (their receivers take any
        // length up to `16 n + c`): more of each block goes with the counts at no cost
        // to the pairs whose blocks are small.
        let c = if self.eager_learns() {
            c.max(self.direct_eager_floor())
        } else {
            c
        };
        Ok(CountRoute {
            routed: None,
            hops: false,
            c,
            s,
        })
    }

    /// The least eager bytes of the direct exchange where they are learned:
    /// [`EAGER_V_DIRECT`] on a communicator whose ranks span hosts, else none.
    fn direct_eager_floor(&self) -> usize {
        let t = &self.core.topology;
        if t.has_level(Level::Node) && t.num_domains(Level::Node) > 1 {
            EAGER_V_DIRECT
        } else {
            0
        }
    }

    /// The eager bytes per block with the count-exchange plan `plan`.
    fn eager_for(&self, plan: MetaPlan) -> usize {
        if plan != MetaPlan::Direct {
            return 0;
        }
        let v = &self.pool.v;
        v.eager_forced
            .or_else(eager_env)
            .or(v.eager_learned)
            .unwrap_or(EAGER_V)
            .min(EAGER_V_MAX)
    }

    /// Fixes the largest remainder of a block (its bytes beyond [`Communicator::eager_v`])
    /// that all-to-all-v sends right behind the count message, in the same round
    /// (`Some(0)`: none, every remainder takes the data pass; at most 16 MiB), or with
    /// `None` returns to the default: `HALO_A2AV_SPECULATE` if set, else
    /// [`SPECULATE_V`] (512 KiB). The same on every rank, like every argument of a
    /// collective: a receiver expects a remainder where its sender's count says one
    /// follows. Only the direct count exchange of small communicators sends any.
    ///
    /// ```
    /// # use halo::local::{Emulation, LocalCluster};
    /// # use halo::topology::Topology;
    /// # let cluster = LocalCluster::new(Topology::preset("nodes:1x2").unwrap(), Emulation::off()).unwrap();
    /// # cluster.run(|comm| {
    /// assert_eq!(comm.speculate_v(), halo::SPECULATE_V);
    /// comm.set_speculate_v(Some(0)); // every remainder in the data pass
    /// assert_eq!(comm.speculate_v(), 0);
    /// # Ok(()) }).into_iter().collect::<halo::Result<Vec<()>>>().unwrap();
    /// ```
    pub fn set_speculate_v(&mut self, bytes: Option<usize>) {
        self.pool.v.spec_forced = bytes.map(|b| b.min(SPECULATE_V_MAX));
    }

    /// The largest remainder of a block that all-to-all-v sends right behind the
    /// count message on this communicator (see the module documentation of
    /// all-to-all-v): blocks of up to `eager_v() + speculate_v()` bytes take one round
    /// of messages. 0 where an algorithm other than [`Algorithm::Flat`] is forced (its
    /// data pass then carries every remainder) or with `HALO_A2AV_SPECULATE=0`.
    pub fn speculate_v(&self) -> usize {
        if self.core.forced.is_some_and(|a| a != Algorithm::Flat) {
            return 0;
        }
        self.pool
            .v
            .spec_forced
            .or_else(speculate_env)
            .unwrap_or(SPECULATE_V)
    }

    /// Whether this communicator learns its eager bytes (neither
    /// [`Communicator::set_eager_v`] nor `HALO_A2AV_EAGER` fixed them).
    fn eager_learns(&self) -> bool {
        self.pool.v.eager_forced.is_none() && eager_env().is_none()
    }

    /// This communicator's count-exchange plan (chosen on first use).
    fn meta_plan(&mut self) -> MetaPlan {
        if let Some(p) = self.pool.v.forced {
            return p;
        }
        if let Some(p) = self.pool.v.plan {
            return p;
        }
        let started = std::time::Instant::now();
        let p = model_plan(&self.core, gather_max_env());
        tracing::debug!(
            rank = self.core.rank,
            plan = ?p,
            seconds = started.elapsed().as_secs_f64(),
            "all-to-all-v count exchange chosen"
        );
        self.pool.v.plan = Some(p);
        p
    }

    fn v_bytes(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        a: &Args<'_>,
        pre: Result<()>,
    ) -> Result<()> {
        let bases = [
            self.core.next_tag_base(),
            self.core.next_tag_base(),
            self.core.next_tag_base(),
        ];
        self.core.check_aborted()?;
        let local = pre.and_then(|()| self.validate_v(send, recv, a));
        let plan = self.meta_plan();
        let eager = self.eager_for(plan);
        let (kind, all) = if plan == MetaPlan::Agreed {
            self.pool.v.calls.1 += 1;
            let (meta_alg, all) = self.meta_agreed(bases[0], bases[1], local)?;
            (Kind::V(meta_alg), all)
        } else if eager > 0 {
            self.pool.v.calls.0 += 1;
            let spec = self.speculate_v();
            let rest = self.meta_eager(bases[0], local, (eager, spec), send, recv)?;
            if rest == 0 {
                // Every block went whole with the counts: one pass of messages.
                self.pool.v.eager_only += 1;
                return Ok(());
            }
            (Kind::VGathered, rest)
        } else {
            self.pool.v.calls.0 += 1;
            let all = self.meta_gathered(plan, bases[0], local)?;
            (Kind::VGathered, all)
        };
        self.data_pass(bases[2], send, recv, kind, all)
    }

    /// Fills `meta_send` with this rank's 16 bytes per peer (`u64::MAX` twice when its
    /// arguments are invalid).
    fn fill_meta_row(&mut self, valid: bool) {
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

    /// The one-pass count exchange: all-gathers the rows into `meta_recv` and checks
    /// every pair. Returns the total bytes all ranks send.
    fn meta_gathered(&mut self, plan: MetaPlan, base: u64, local: Result<()>) -> Result<u64> {
        let (n, me) = (self.size(), self.rank());
        let row = n * META_BLOCK;
        self.fill_meta_row(local.is_ok());
        let core = &mut self.core;
        let pool = &mut self.pool;
        let schedule = cached_schedule(&mut pool.v.gather, plan, || {
            gather_schedule(core, plan, me, row)
        })?;
        let mr = sized(&mut pool.meta_recv, n * row);
        let scratch = sized(&mut pool.meta_scratch, schedule.scratch_len());
        let opts = exec_options(core.timeout, &core.abort);
        core.backend.run(
            schedule,
            base,
            Buffers {
                send: &pool.meta_send[..row],
                recv: mr,
                scratch,
                call: V_CALL,
            },
            &opts,
        )?;
        local?;
        check_matrix(mr, n, me).map(|(total, _)| total)
    }

    /// The one-pass count exchange with the first `c` bytes of every block, and the
    /// remainders of up to `s` bytes right behind: one message of `F = 16 n + c` bytes
    /// per ordered pair (this rank's whole row of counts, then the first `min(count,
    /// c)` bytes of its block for the receiver, then zeros: a fixed size, so that no
    /// transport ever sees a length it did not expect, whatever the counts), and, for a
    /// block of `count > c` bytes with `count - c <= s`, a second message with the rest
    /// posted at once behind it ([`speculated`]). A receiver reads each count message as
    /// it lands: the sender's count for it says whether a remainder follows and its
    /// exact length, and the receiver takes it into its receive buffer where its own
    /// count agrees, into scratch (dropped) where not — so no message is left unread and
    /// no length is unexpected, whatever the counts. Every rank then checks the gathered
    /// matrix as [`Communicator::meta_gathered`] does (the same errors), copies the
    /// eager parts into `recv` and leaves the blocks not yet sent for the data pass: the
    /// pooled byte counts and displacements and the matrix in `meta_recv` then describe
    /// what is left per pair. Returns the total left over all pairs (0: nothing, on
    /// every rank alike).
    fn meta_eager(
        &mut self,
        base: u64,
        local: Result<()>,
        (c, s): (usize, usize),
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<u64> {
        let (n, me) = (self.size(), self.rank());
        let row = n * META_BLOCK;
        let valid = local.is_ok();
        let learns = self.eager_learns();
        let hops_here = super::count_hops::applies(&self.core.topology);
        let c_learned = c;
        let CountRoute { routed, hops, c, s } = self.count_route(c, s)?;
        let f = row + c;
        self.fill_meta_row(valid);
        let core = &mut self.core;
        let pool = &mut self.pool;
        // Scratch: the count messages out at 0, in at `n f`, the dropped remainder at
        // `2 n f`.
        let stage = sized(&mut pool.v.stage, 2 * n * f + s);
        for (q, b) in stage[..n * f].chunks_exact_mut(f).enumerate() {
            b[..row].copy_from_slice(&pool.meta_send[..row]);
            // A rank with invalid arguments sends no data (its counts say so).
            let k = if valid { pool.send_bytes[q].min(c) } else { 0 };
            if k > 0 {
                let d = pool.send_displs[q];
                b[row..row + k].copy_from_slice(&send[d..d + k]);
            }
            if routed.is_some() && !hops {
                // A uniform all-to-all's blocks: padded, with zeros.
                b[row + k..].fill(0);
            }
        }
        if hops {
            self.meta_hops(base, c, valid, send, &mut *recv)?;
        } else if let Some(a) = routed {
            let (out, inn) = pool.v.stage[..2 * n * f].split_at_mut(n * f);
            core.uniform(
                Some(a),
                base,
                out,
                inn,
                f,
                &mut pool.meta_scratch,
                V_CALL.count(f),
            )?;
        } else {
            self.meta_direct(base, (c, s), valid, send, &mut *recv)?;
        }
        let pool = &mut self.pool;
        let sr = &pool.v.stage[n * f..2 * n * f];
        let mr = sized(&mut pool.meta_recv, n * row);
        for (p, m) in mr.chunks_exact_mut(row).enumerate() {
            m.copy_from_slice(&sr[p * f..p * f + row]);
        }
        local?;
        let (total, largest) = check_matrix(mr, n, me)?;
        pool.v.last_largest = Some(largest);
        if learns {
            let max_block = usize::try_from(largest).unwrap_or(usize::MAX);
            let next = learn_eager(c_learned, max_block, total, n, hops_here);
            if next != c_learned {
                tracing::debug!(
                    rank = me,
                    eager = next,
                    max_block,
                    "all-to-all-v eager bytes learned"
                );
            }
            pool.v.eager_learned = Some(next);
        }
        // Every pair agrees: rank p sent min(recv_bytes[p], c) bytes of its block.
        for p in 0..n {
            let k = pool.recv_bytes[p].min(c);
            if k > 0 {
                let d = pool.recv_displs[p];
                recv[d..d + k].copy_from_slice(&sr[p * f + row..p * f + row + k]);
            }
        }
        // What is left for the data pass, alike on every rank from the same matrix: the
        // remainders that did not go right behind the counts.
        let left = |v: u64| -> u64 {
            if speculated(v, c, s).is_some() {
                0
            } else {
                v - v.min(c as u64)
            }
        };
        let mut rest: u64 = 0;
        for i in 0..n * n {
            let at = (i / n) * row + (i % n) * META_BLOCK;
            for at in [at, at + 8] {
                let v = left(read_u64(mr, at));
                mr[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            rest = rest.saturating_add(read_u64(mr, at));
        }
        for (bytes, displs) in [
            (&mut pool.send_bytes, &mut pool.send_displs),
            (&mut pool.recv_bytes, &mut pool.recv_displs),
        ] {
            for (b, d) in bytes.iter_mut().zip(displs.iter_mut()) {
                let l = left(*b as u64) as usize;
                *d = if l == 0 { 0 } else { *d + (*b - l) };
                *b = l;
            }
        }
        Ok(rest)
    }

    /// The direct exchange of the count messages staged in `pool.v.stage` (out at 0, in
    /// at `n f`), with the remainders of up to `s` bytes right behind them
    /// ([`direct_exchange_driven`]); the dropped remainders land at `2 n f`.
    fn meta_direct(
        &mut self,
        base: u64,
        (c, s): (usize, usize),
        valid: bool,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<()> {
        let (n, me) = (self.size(), self.rank());
        let f = n * META_BLOCK + c;
        let core = &mut self.core;
        let pool = &mut self.pool;
        let (send_bytes, send_displs) = (&pool.send_bytes, &pool.send_displs);
        let (recv_bytes, recv_displs) = (&pool.recv_bytes, &pool.recv_displs);
        let drive = &mut pool.v.drive;
        let mut driver = |session: &mut dyn Session, opts: &ExecOptions<'_>| {
            direct_exchange_driven(
                session,
                opts,
                &DirectExchange {
                    n,
                    me,
                    c,
                    s,
                    valid,
                    send: (send_bytes, send_displs),
                    recv: (recv_bytes, recv_displs),
                },
                drive,
            )
        };
        let opts = exec_options(core.timeout, &core.abort);
        core.backend.run_program(
            Program::Driven(&mut driver),
            base,
            Buffers {
                send,
                recv,
                scratch: &mut pool.v.stage[..2 * n * f + s],
                call: V_CALL,
            },
            &opts,
        )?;
        core.last = Some(Algorithm::Flat);
        Ok(())
    }

    /// The count messages in two hops across hosts ([`super::count_hops`]), staged and
    /// landing where [`Communicator::meta_direct`] has them.
    fn meta_hops(
        &mut self,
        base: u64,
        c: usize,
        valid: bool,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<()> {
        use super::count_hops::{HopExchange, Layout, hop_exchange_driven};
        let (n, me) = (self.size(), self.rank());
        let f = n * META_BLOCK + c;
        let core = &mut self.core;
        let pool = &mut self.pool;
        let layout = Layout::new(&core.topology, c, 2 * n * f);
        let stage = sized(&mut pool.v.stage, 2 * n * f + layout.len());
        let x = HopExchange {
            topo: &core.topology,
            me,
            c,
            send: &pool.send_bytes,
            valid,
            layout,
        };
        let state = &mut pool.v.hops;
        let mut driver = |session: &mut dyn Session, opts: &ExecOptions<'_>| {
            hop_exchange_driven(session, opts, &x, state)
        };
        let opts = exec_options(core.timeout, &core.abort);
        core.backend.run_program(
            Program::Driven(&mut driver),
            base,
            Buffers {
                send,
                recv,
                scratch: stage,
                call: V_CALL,
            },
            &opts,
        )?;
        core.last = Some(Algorithm::Halo);
        Ok(())
    }

    /// The metadata and agreement passes. Returns the metadata pass's algorithm and the
    /// total bytes all ranks send.
    fn meta_agreed(
        &mut self,
        meta_base: u64,
        status_base: u64,
        local: Result<()>,
    ) -> Result<(Algorithm, u64)> {
        let (n, me) = (self.size(), self.rank());
        // 1. Metadata pass.
        let forced = self.core.forced;
        let meta_alg = match forced {
            Some(alg) if alg.forwards() => alg,
            _ => self.core.prepare_uniform(None, META_BLOCK)?,
        };
        self.fill_meta_row(local.is_ok());
        let ms = &self.pool.meta_send[..n * META_BLOCK];
        let mr = sized(&mut self.pool.meta_recv, n * META_BLOCK);
        self.core.uniform(
            Some(meta_alg),
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
            Some(meta_alg),
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

    /// The data pass with the agreed sizes; `kind` says how the counts were exchanged
    /// (which algorithms may run: after a uniform metadata pass only that pass's
    /// algorithm may forward), `all` is the total bytes all ranks send.
    fn data_pass(
        &mut self,
        base: u64,
        send: &[u8],
        recv: &mut [u8],
        kind: Kind,
        all: u64,
    ) -> Result<()> {
        let (n, me) = (self.size(), self.rank());
        let mean = usize::try_from(all / (n as u64 * n as u64)).unwrap_or(usize::MAX);
        let forced = self.core.forced;
        // Automatic: measured per size class of the mean block (crate::tune), which
        // every rank knows alike (`all` comes from the gathered matrix or from every
        // rank's status block), so every rank picks from the same trial state.
        let key = Key::V {
            class: class(mean),
            meta: match kind {
                Kind::V(meta_alg) => Some(meta_alg),
                _ => None,
            },
        };
        // Whether this call is one of the class's trials (timed and recorded).
        let mut trial = false;
        let candidates: Vec<Algorithm> = match forced {
            Some(alg) => vec![alg],
            None => {
                let core = &mut self.core;
                let picked = core.tuner.pick(key, || {
                    crate::tune::candidates(
                        &mut core.selector,
                        &core.topology,
                        &core.options,
                        mean,
                        // After a uniform metadata pass only its algorithm knows the
                        // sizes of the blocks it forwards.
                        |alg| match kind {
                            Kind::V(meta_alg) => !alg.forwards() || alg == meta_alg,
                            _ => true,
                        },
                    )
                });
                match picked {
                    Some((alg, t)) => {
                        trial = t;
                        vec![alg]
                    }
                    None => {
                        return Err(Error::internal(
                            "no all-to-all-v algorithm builds on this topology",
                        ));
                    }
                }
            }
        };
        let core = &mut self.core;
        let pool = &mut self.pool;
        if kind == Kind::VGathered && candidates.iter().any(|a| a.forwards()) {
            // The whole send matrix, for the sizes of routed blocks.
            let row = n * META_BLOCK;
            let m = &pool.meta_recv[..n * row];
            pool.v.matrix.clear();
            pool.v.matrix.extend(
                (0..n * n).map(|i| read_u64(m, (i / n) * row + (i % n) * META_BLOCK) as usize),
            );
        }
        let layout = Layout::V {
            send_counts: &pool.send_bytes,
            send_displs: &pool.send_displs,
            recv_counts: &pool.recv_bytes,
            recv_displs: &pool.recv_displs,
        };
        let mut last_err = None;
        for alg in candidates {
            let started = std::time::Instant::now();
            let sizes = match kind {
                Kind::VGathered if alg.forwards() => {
                    KnownSizes::from_matrix(me, &pool.send_bytes, &pool.recv_bytes, &pool.v.matrix)
                }
                Kind::V(meta_alg) if alg.forwards() => {
                    let meta_schedule = &core
                        .cache
                        .iter()
                        .find(|(a, b, _)| *a == meta_alg && *b == META_BLOCK)
                        .ok_or_else(|| Error::internal("the metadata schedule left the cache"))?
                        .2;
                    let routed = KnownSizes::routed_from_meta(meta_schedule, &pool.meta_scratch)?;
                    KnownSizes::new(me, &pool.send_bytes, &pool.recv_bytes, routed)
                }
                _ => KnownSizes::new(me, &pool.send_bytes, &pool.recv_bytes, HashMap::new()),
            };
            let ctx = BuildCtx {
                topology: &core.topology,
                rank: me,
                layout,
                sizes: &sizes,
                options: &core.options,
            };
            let schedule = match build(alg, &ctx) {
                Ok(s) => s,
                Err(e) if forced.is_none() => {
                    // Built with uniform blocks on the first and last rank, it does not
                    // build with these sizes: the next call chooses without it.
                    core.selector.mark_unavailable(alg, &e);
                    core.tuner.forget(key);
                    last_err = Some(e);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let scratch = sized(&mut pool.scratch, schedule.scratch_len());
            let opts = exec_options(core.timeout, &core.abort);
            core.backend.run(
                &schedule,
                base,
                Buffers {
                    send,
                    recv,
                    scratch,
                    call: V_CALL,
                },
                &opts,
            )?;
            core.last = Some(alg);
            if trial {
                self.record_trial(key, alg, started.elapsed())?;
            }
            return Ok(());
        }
        Err(match last_err {
            Some(e) => e.into(),
            None => Error::internal("no all-to-all-v algorithm builds on this topology"),
        })
    }
}

/// One rank's part of the direct count exchange with speculative remainders
/// ([`Communicator::meta_eager`]). The scratch holds the `n` count messages of `16 n + c`
/// bytes out at 0, the `n` in at `n f`, and the dropped remainder at `2 n f`.
struct DirectExchange<'a> {
    n: usize,
    me: usize,
    /// Eager bytes per block.
    c: usize,
    /// The largest remainder sent right behind the counts.
    s: usize,
    /// Whether this rank's arguments are valid (else it sends no data and keeps none).
    valid: bool,
    /// This rank's byte counts and displacements per peer, sending and receiving.
    send: (&'a [usize], &'a [usize]),
    recv: (&'a [usize], &'a [usize]),
}

/// The bookkeeping of [`direct_exchange_driven`], kept between calls (no allocation per
/// call in steady state).
#[derive(Debug, Default)]
struct DriveState {
    /// Whether the count message from each peer has landed.
    got: Vec<bool>,
    /// Remainders to take and drop: (peer, bytes).
    to_drop: Vec<(usize, usize)>,
    /// Completions not yet processed.
    completed: Vec<u32>,
}

/// Runs [`DirectExchange`] on `session`: posts every count receive and send and every
/// speculative send at once, then for each count message that lands reads the sender's
/// count for this rank and posts the receive of its remainder (into the receive
/// buffer where this rank's count agrees, else one at a time into scratch), until
/// everything has completed. Tokens: `kind * n + peer`.
fn direct_exchange_driven(
    session: &mut dyn Session,
    opts: &ExecOptions<'_>,
    x: &DirectExchange<'_>,
    st: &mut DriveState,
) -> halo_collectives::Result<()> {
    const COUNTS_IN: usize = 0;
    const COUNTS_OUT: usize = 1;
    const REST_OUT: usize = 2;
    const REST_IN: usize = 3;
    const DROPPED: usize = 4;
    let (n, me, c, s) = (x.n, x.me, x.c, x.s);
    let f = n * META_BLOCK + c;
    let (out_at, in_at, drop_at) = (0, n * f, 2 * n * f);
    let row = n * META_BLOCK;
    let mine = |q: usize| -> Option<usize> {
        if x.valid {
            speculated(x.send.0[q] as u64, c, s)
        } else {
            None
        }
    };
    // The length of the count message to `q`: the row, then the first bytes of the
    // block (none where this rank's arguments are invalid: its counts say so).
    let out_len = |q: usize| row + if x.valid { x.send.0[q].min(c) } else { 0 };
    // Operations posted and not yet complete, and the sends among them.
    let pending = std::cell::Cell::new(0usize);
    let sends = std::cell::Cell::new(0usize);
    // Posts one operation of `kind` with `peer`.
    let post = |session: &mut dyn Session, kind: usize, peer: usize, region: Region| {
        let (tag, token) = (
            if kind == COUNTS_IN || kind == COUNTS_OUT {
                TAG_COUNTS
            } else {
                TAG_REST
            },
            (kind * n + peer) as u32,
        );
        pending.set(pending.get() + 1);
        match kind {
            COUNTS_OUT | REST_OUT => {
                sends.set(sends.get() + 1);
                session.post_send(peer, tag, region, token)
            }
            COUNTS_IN => session.post_recv_up_to(peer, tag, region, token),
            _ => session.post_recv(peer, tag, region, token),
        }
    };
    // The counts from every peer, then to every peer (starting after this rank, as
    // the flat fan-out does), then the remainders right behind.
    for k in 1..n {
        let p = (me + n - k) % n;
        post(
            session,
            COUNTS_IN,
            p,
            Region::new(Buf::Scratch, in_at + p * f, f),
        )?;
    }
    for k in 1..n {
        let q = (me + k) % n;
        post(
            session,
            COUNTS_OUT,
            q,
            Region::new(Buf::Scratch, out_at + q * f, out_len(q)),
        )?;
    }
    for k in 1..n {
        let q = (me + k) % n;
        if let Some(len) = mine(q) {
            let region = Region::new(Buf::Send, x.send.1[q] + c, len);
            post(session, REST_OUT, q, region)?;
        }
    }
    // This rank's own block: copied, where its two counts agree.
    session.copy(
        Region::new(Buf::Scratch, out_at + me * f, out_len(me)),
        Region::new(Buf::Scratch, in_at + me * f, out_len(me)),
    )?;
    if let Some(len) = mine(me)
        && x.recv.0[me] == x.send.0[me]
    {
        session.copy(
            Region::new(Buf::Send, x.send.1[me] + c, len),
            Region::new(Buf::Recv, x.recv.1[me] + c, len),
        )?;
    }
    st.got.clear();
    st.got.resize(n, false);
    st.got[me] = true;
    st.to_drop.clear();
    st.completed.clear();
    let mut dropping = false;
    let mut idle = Idle::default();
    let mut count = [0u8; 8];
    loop {
        if !dropping && let Some((p, len)) = st.to_drop.pop() {
            post(session, DROPPED, p, Region::new(Buf::Scratch, drop_at, len))?;
            dropping = true;
        }
        if pending.get() == 0 {
            return Ok(());
        }
        session.progress(&mut st.completed)?;
        if st.completed.is_empty() {
            idle.wait(
                session,
                opts,
                || {
                    let pending = pending.get();
                    format!("all-to-all-v count exchange aborted with {pending} operations pending")
                },
                |waited| {
                    let peer = (0..n).find(|&p| !st.got[p]);
                    CollectiveError::Timeout {
                        algorithm: "all-to-all-v counts",
                        step: 0,
                        peer,
                        what: match peer {
                            Some(p) => format!("the count message from rank {p}"),
                            None => format!("{} remainders of blocks", pending.get()),
                        },
                        waited,
                    }
                },
            )?;
            continue;
        }
        idle.reset();
        for t in st.completed.drain(..) {
            pending.set(pending.get() - 1);
            let (kind, p) = (t as usize / n, t as usize % n);
            match kind {
                COUNTS_IN => {
                    st.got[p] = true;
                    // The sender's count for this rank, from its row.
                    session.read(
                        Region::new(Buf::Scratch, in_at + p * f + me * META_BLOCK, 8),
                        &mut count,
                    )?;
                    let theirs = u64::from_le_bytes(count);
                    // The message is the sender's row and the first `min(count, c)`
                    // bytes of its block: any other length means that the sender
                    // carries another number of bytes with its counts.
                    let eager = eager_len(theirs, c);
                    let got = session.received_len(t).ok_or_else(|| {
                        CollectiveError::Internal(format!(
                            "the count message from rank {p} completed without a length"
                        ))
                    })?;
                    if got != row + eager {
                        let e = wrong_length(p, me, got, row + eager, c);
                        return Err(flush_sends(
                            session,
                            sends.get(),
                            |t| matches!(t as usize / n, COUNTS_OUT | REST_OUT),
                            e,
                        ));
                    }
                    if let Some(len) = speculated(theirs, c, s) {
                        if x.valid && x.recv.0[p] as u64 == theirs {
                            let region = Region::new(Buf::Recv, x.recv.1[p] + c, len);
                            post(session, REST_IN, p, region)?;
                        } else {
                            st.to_drop.push((p, len));
                        }
                    }
                }
                DROPPED => dropping = false,
                COUNTS_OUT | REST_OUT => sends.set(sends.get() - 1),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The ways of exchanging the counts, forced per communicator: the bytes, the
    //! errors and the message counts of each.

    use super::{MetaPlan, model_plan};
    use crate::local::{Emulation, LocalCluster};
    use crate::topology::{Level, Topology};
    use crate::{Algorithm, AllGatherAlgorithm, Error, Partition};
    use std::time::Duration;

    fn packed(counts: &[usize]) -> Vec<usize> {
        counts
            .iter()
            .scan(0, |at, &c| {
                let d = *at;
                *at += c;
                Some(d)
            })
            .collect()
    }

    /// Elements rank `s` sends to rank `d` (zeros included).
    fn count(s: usize, d: usize) -> usize {
        (s * 7 + d * 3) % 5
    }

    fn plans(n: usize) -> Vec<MetaPlan> {
        let mut p = vec![
            MetaPlan::Agreed,
            MetaPlan::Direct,
            MetaPlan::Gather(AllGatherAlgorithm::Bruck),
            MetaPlan::Gather(AllGatherAlgorithm::Ring),
        ];
        if n.is_power_of_two() {
            p.push(MetaPlan::Gather(AllGatherAlgorithm::RecursiveDoubling));
        }
        p
    }

    /// The plans with the eager bytes each is tried with: the direct exchange with the
    /// default (every block of `count` fits), none (the old two passes), and 5 bytes
    /// (blocks of 0-4 `u32`s: some whole, some split inside an element, the rest in the
    /// data pass); the others carry none whatever is forced.
    fn plans_eager(n: usize) -> Vec<(MetaPlan, Option<usize>)> {
        plans(n)
            .into_iter()
            .flat_map(|p| {
                if p == MetaPlan::Direct {
                    vec![(p, None), (p, Some(0)), (p, Some(5))]
                } else {
                    vec![(p, Some(5))]
                }
            })
            .collect()
    }

    /// Every plan x every algorithm (and automatic): every byte lands where it should,
    /// on a topology where the forwarding algorithms really forward — with the eager
    /// bytes of the direct exchange, also when the forwarding algorithms route the
    /// remainders only.
    #[test]
    fn every_plan_moves_the_right_bytes_with_every_algorithm() {
        for spec in ["nodes:1x4", "nodes:2x2", "nodes:2x3"] {
            let topo = Topology::preset(spec).unwrap();
            let n = topo.size();
            for (plan, eager) in plans_eager(n) {
                let mut algs: Vec<Option<Algorithm>> =
                    Algorithm::ALL.iter().copied().map(Some).collect();
                algs.push(None);
                for alg in algs {
                    let cluster = LocalCluster::new(topo.clone(), Emulation::off()).unwrap();
                    let out = cluster.run(|comm| {
                        comm.set_timeout(Duration::from_secs(20));
                        comm.force_meta_plan(Some(plan));
                        comm.set_eager_v(eager);
                        comm.set_algorithm(alg);
                        let me = comm.rank();
                        let sc: Vec<usize> = (0..n).map(|d| count(me, d)).collect();
                        let rc: Vec<usize> = (0..n).map(|s| count(s, me)).collect();
                        let send: Vec<u32> = (0..n)
                            .flat_map(|d| {
                                (0..sc[d]).map(move |i| (me * 10_000 + d * 100 + i) as u32)
                            })
                            .collect();
                        let mut recv = vec![u32::MAX; rc.iter().sum()];
                        let routes = plan == MetaPlan::Direct && routes_counts(comm);
                        comm.all_to_all_v(
                            &send,
                            &Partition::new(&sc, &packed(&sc)),
                            &mut recv,
                            &Partition::new(&rc, &packed(&rc)),
                        )?;
                        let expect: Vec<u32> = (0..n)
                            .flat_map(|s| {
                                (0..rc[s]).map(move |i| (s * 10_000 + me * 100 + i) as u32)
                            })
                            .collect();
                        assert_eq!(recv, expect, "{spec} {plan:?} {eager:?} {alg:?} rank {me}");
                        Ok((
                            routes,
                            comm.v_calls(),
                            comm.v_eager_only(),
                            (
                                comm.eager_v(),
                                routes_counts(comm),
                                comm.direct_eager_floor(),
                            ),
                            comm.last_algorithm(),
                        ))
                    });
                    let what = format!("{spec} {plan:?} eager {eager:?} {alg:?}");
                    for (r, x) in out.into_iter().enumerate() {
                        let (routes, calls, eager_only, (c, routes_next, floor), last) =
                            x.unwrap_or_else(|e| panic!("{what} rank {r}: {e}"));
                        let want = if plan == MetaPlan::Agreed {
                            (0, 1)
                        } else {
                            (1, 0)
                        };
                        assert_eq!(calls, want, "{what} rank {r}");
                        // Blocks of at most 16 bytes: all eager with the default,
                        // which learns the fewest eager bytes for the next call (padded
                        // where the model routes the count messages, else unpadded and,
                        // across hosts, at least `EAGER_V_DIRECT`); with 5
                        // eager bytes the remainders go right behind the counts unless
                        // a forced algorithm other than Flat carries them, or the model
                        // routes the count messages (then the data pass does).
                        let behind = u64::from(alg.is_none_or(|a| a == Algorithm::Flat) && !routes);
                        let (want_c, want_eager) = match (plan, eager) {
                            (MetaPlan::Direct, None) if routes_next => {
                                (super::EAGER_V_LEARN_MIN, 1)
                            }
                            (MetaPlan::Direct, None) => (super::EAGER_V_LEARN_MIN.max(floor), 1),
                            (MetaPlan::Direct, Some(5)) => (5, behind),
                            _ => (0, 0),
                        };
                        assert_eq!((c, eager_only), (want_c, want_eager), "{what} rank {r}");
                        if want_eager == 1 && !routes {
                            assert_eq!(last, Some(Algorithm::Flat), "{what} rank {r}");
                        } else if alg.is_some() {
                            assert_eq!(last, alg, "{what} rank {r}");
                        }
                    }
                }
            }
        }
    }

    /// Whether the model routes the count messages of `comm`'s next call (automatic
    /// mode, the direct plan, eager bytes, no remainders expected) with an algorithm
    /// other than the direct exchange (across hosts, for small messages: HALO's).
    fn routes_counts(comm: &mut crate::Communicator) -> bool {
        let plan = comm.meta_plan();
        let eager = comm.eager_for(plan);
        let spec = comm.speculate_v();
        eager > 0 && comm.count_route(eager, spec).unwrap().routed.is_some()
    }

    /// One rank's call of a bad case: `Ok` per rank, or the error.
    fn bad_call(plan: MetaPlan, eager: Option<usize>, case: u8) -> Vec<Result<(), Error>> {
        let topo = Topology::preset("nodes:2x3").unwrap();
        let n = topo.size();
        let cluster = LocalCluster::new(topo, Emulation::off()).unwrap();
        cluster
            .run(|comm| {
                comm.set_timeout(Duration::from_secs(10));
                comm.force_meta_plan(Some(plan));
                comm.set_eager_v(eager);
                let me = comm.rank();
                let mut sc = vec![1usize; n];
                let rc = vec![1usize; n];
                let mut sd = packed(&sc);
                match case {
                    // Rank 1 sends two elements to rank 4, which expects one.
                    0 if me == 1 => sc[4] = 2,
                    // Rank 2 passes an overflowing displacement, and rank 0 sends two
                    // elements to rank 5 (the invalid rank is named to the others,
                    // the disagreeing pair each other).
                    1 if me == 2 => sd[3] = usize::MAX,
                    1 if me == 0 => sc[5] = 2,
                    // Rank 3 expects nothing from itself but sends one element.
                    2 if me == 3 => sc[3] = 1,
                    _ => {}
                }
                let mut rc = rc;
                if case == 2 && me == 3 {
                    rc[3] = 0;
                }
                let send = vec![me as u16; sc.iter().sum::<usize>() + 1];
                let mut recv = vec![0u16; rc.iter().sum()];
                let r = comm.all_to_all_v(
                    &send,
                    &Partition::new(&sc, &sd),
                    &mut recv,
                    &Partition::new(&rc, &packed(&rc)),
                );
                // The communicator stays usable.
                let ok = vec![1usize; n];
                let mut recv = vec![0u16; n];
                comm.all_to_all_v(
                    &vec![me as u16; n],
                    &Partition::new(&ok, &packed(&ok)),
                    &mut recv,
                    &Partition::new(&ok, &packed(&ok)),
                )?;
                assert_eq!(recv, (0..n as u16).collect::<Vec<_>>());
                Ok(r)
            })
            .into_iter()
            .map(|r| r.expect("the call after the bad one succeeds"))
            .collect()
    }

    /// Bad counts fail every rank, the same way whichever plan exchanged the counts:
    /// the same error kind, peer and message on every rank as the three passes give.
    #[test]
    fn every_plan_fails_every_rank_exactly_as_the_three_passes_do() {
        for case in 0..3 {
            let agreed = bad_call(MetaPlan::Agreed, None, case);
            for (r, e) in agreed.iter().enumerate() {
                let e = e.as_ref().expect_err("every rank fails");
                println!("case {case} rank {r}: {e}");
            }
            match case {
                0 => {
                    for (r, e) in agreed.iter().enumerate() {
                        let e = e.as_ref().unwrap_err();
                        assert!(matches!(e, Error::InvalidUsage { .. }), "rank {r}: {e:?}");
                        let want = match r {
                            1 => 4,
                            4 => 1,
                            _ => 1,
                        };
                        assert_eq!(e.peer(), Some(want), "rank {r}: {e}");
                        if r == 1 || r == 4 {
                            let m = e.to_string();
                            assert!(m.contains("4 bytes") && m.contains("2 bytes"), "{m}");
                        }
                    }
                }
                1 => {
                    for (r, e) in agreed.iter().enumerate() {
                        let e = e.as_ref().unwrap_err();
                        match r {
                            2 => assert!(
                                matches!(e, Error::InvalidArgument { peer: Some(3), .. }),
                                "{e:?}"
                            ),
                            0 => assert_eq!(e.peer(), Some(5), "{e}"),
                            5 => assert_eq!(e.peer(), Some(0), "{e}"),
                            _ => assert!(
                                matches!(e, Error::InvalidUsage { peer: Some(0), .. }),
                                "rank {r}: {e:?}"
                            ),
                        }
                    }
                }
                _ => {
                    for (r, e) in agreed.iter().enumerate() {
                        let e = e.as_ref().unwrap_err();
                        assert!(
                            matches!(e, Error::InvalidUsage { peer: Some(3), .. }),
                            "rank {r}: {e:?}"
                        );
                    }
                }
            }
            // The direct exchange with its default eager bytes (the blocks of 2 bytes
            // all go with the counts), none, and 1 (half of each block, the rest in the
            // data pass of the call after the bad one).
            for (plan, eager) in plans_eager(6)
                .into_iter()
                .skip(1)
                .chain([(MetaPlan::Direct, Some(1))])
            {
                assert_eq!(
                    bad_call(plan, eager, case),
                    agreed,
                    "case {case}, {plan:?}, eager {eager:?}"
                );
            }
        }
    }

    /// Messages per call: the one-pass plan sends `n - 1` messages of counts per rank,
    /// carrying blocks of up to `eager_v()` bytes, and the remainders of larger blocks
    /// right behind them (no data pass), or with that turned off in the data pass;
    /// without eager bytes always the data pass; the three passes send more. Every byte
    /// checked.
    #[test]
    fn one_metadata_pass_is_one_round_of_messages() {
        let topo = Topology::preset("nodes:2x2").unwrap();
        let n = topo.size() as u64;
        let round = n * (n - 1);
        let direct = Some(MetaPlan::Direct);
        // With flat forced the count messages go direct: at least `EAGER_V_DIRECT`
        // bytes of each block with them.
        let (e1, s1) = (super::EAGER_V_DIRECT + 1, super::SPECULATE_V);
        // (plan, eager bytes, speculated bytes, block bytes, messages, calls without a
        // data pass).
        let cases = [
            // The model picks the direct exchange for 4 ranks: one round.
            (None, None, None, 3, round, 1),
            (direct, None, None, 3, round, 1),
            (direct, None, None, super::EAGER_V_DIRECT, round, 1),
            // One byte more than the eager part: the remainder right behind the counts
            // (two messages per pair, no data pass), up to the largest speculated.
            (direct, None, None, e1, 2 * round, 1),
            (direct, None, None, super::EAGER_V_DIRECT + s1, 2 * round, 1),
            (direct, Some(2), None, 3, 2 * round, 1),
            // Beyond it, or with speculation off: counts, then the data pass.
            (
                direct,
                None,
                None,
                super::EAGER_V_DIRECT + s1 + 1,
                2 * round,
                0,
            ),
            (direct, None, Some(0), e1, 2 * round, 0),
            (direct, Some(2), Some(0), 3, 2 * round, 0),
            // HALO_A2AV_EAGER=0: the count exchange, then the data pass, as before.
            (direct, Some(0), None, 3, 2 * round, 0),
            // Two uniform passes of counts (n - 1 messages each with the flat fan-out,
            // fewer with Bruck's) on top of the data.
            (Some(MetaPlan::Agreed), None, None, 3, 0, 0),
        ];
        let mut direct_no_eager = 0;
        for (plan, eager, spec, block, want, eager_calls) in cases {
            let cluster = LocalCluster::new(topo.clone(), Emulation::off()).unwrap();
            let traffic = cluster.traffic();
            let out = cluster.run(|comm| {
                comm.force_meta_plan(plan);
                comm.set_eager_v(eager);
                comm.set_speculate_v(spec);
                comm.set_algorithm(Some(Algorithm::Flat));
                let (me, n) = (comm.rank(), comm.size());
                let c = vec![block; n];
                let send: Vec<u8> = (0..n * block)
                    .map(|k| (me * 31 + k * 7 + k / block) as u8)
                    .collect();
                let mut recv = vec![0u8; n * block];
                comm.all_to_all_v(
                    &send,
                    &Partition::new(&c, &packed(&c)),
                    &mut recv,
                    &Partition::new(&c, &packed(&c)),
                )?;
                for (k, &b) in recv.iter().enumerate() {
                    let (s, i) = (k / block, k % block);
                    let sent = me * block + i; // index of the byte in rank s's send
                    assert_eq!(
                        b,
                        (s * 31 + sent * 7 + sent / block) as u8,
                        "rank {me} byte {k}"
                    );
                }
                Ok((comm.v_calls(), comm.v_eager_only()))
            });
            let calls: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
            let messages = traffic.messages_crossing(Level::Device);
            let what = format!("{plan:?} eager {eager:?} speculated {spec:?} block {block}");
            println!("{what}: {calls:?}, {messages} messages");
            if plan == Some(MetaPlan::Agreed) {
                assert!(calls.iter().all(|&c| c == ((0, 1), 0)), "{what}: {calls:?}");
                assert!(messages > direct_no_eager, "{what}: {messages}");
            } else {
                assert!(
                    calls.iter().all(|&c| c == ((1, 0), eager_calls)),
                    "{what}: {calls:?}"
                );
                assert_eq!(messages, want, "{what}");
                if eager == Some(0) {
                    direct_no_eager = messages;
                }
            }
        }
    }

    /// Across hosts of the same number of ranks the count messages take the two hops
    /// in automatic mode (`count_hops`): on 4 nodes of 2 ranks 3 messages between
    /// nodes per rank and call instead of 6, every byte right and no data pass. Blocks
    /// larger than the eager bytes learned take a data pass once (the two hops carry
    /// no remainders), then go whole with the counts (learned up to 16 KiB); beyond
    /// that the call after goes direct with the remainders right behind the counts.
    #[test]
    fn count_messages_take_two_hops_across_hosts() {
        let topo = Topology::preset("nodes:4x2").unwrap();
        let n = topo.size();
        let run = |alg: Option<Algorithm>, blocks: &[usize]| {
            let cluster = LocalCluster::new(topo.clone(), Emulation::off()).unwrap();
            let traffic = cluster.traffic();
            let out = cluster.run(|comm| {
                comm.set_algorithm(alg);
                let me = comm.rank();
                let mut lasts = Vec::new();
                for (call, &block) in blocks.iter().enumerate() {
                    let c = vec![block; n];
                    let byte = |s: usize, d: usize, i: usize| (s * 31 + d * 7 + i + call) as u8;
                    let send: Vec<u8> = (0..n)
                        .flat_map(|d| (0..block).map(move |i| byte(me, d, i)))
                        .collect();
                    let mut recv = vec![0u8; n * block];
                    let routes = routes_counts(comm);
                    comm.all_to_all_v(
                        &send,
                        &Partition::new(&c, &packed(&c)),
                        &mut recv,
                        &Partition::new(&c, &packed(&c)),
                    )?;
                    let want: Vec<u8> = (0..n)
                        .flat_map(|s| (0..block).map(move |i| byte(s, me, i)))
                        .collect();
                    assert_eq!(recv, want, "{alg:?} block {block} rank {me} call {call}");
                    lasts.push((comm.last_algorithm(), routes, comm.v_eager_only()));
                }
                Ok((comm.v_eager_only(), lasts))
            });
            let out: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
            (out, traffic.messages_crossing(Level::Node))
        };
        let (flat, halo) = (Some(Algorithm::Flat), Some(Algorithm::Halo));
        let (routed, routed_msgs) = run(None, &[3, 3]);
        let (direct, direct_msgs) = run(flat, &[3, 3]);
        println!("messages between nodes: two hops {routed_msgs}, direct {direct_msgs}");
        for r in 0..n {
            assert_eq!(
                routed[r],
                (2, vec![(halo, true, 1), (halo, true, 2)]),
                "rank {r}"
            );
            assert_eq!(
                direct[r],
                (2, vec![(flat, false, 1), (flat, false, 2)]),
                "rank {r}"
            );
        }
        // Per rank and call: 6 messages off-node direct, 3 (one per other node) in
        // two hops.
        assert_eq!(direct_msgs, 2 * 8 * 6);
        assert_eq!(routed_msgs, 2 * 8 * 3);
        // 2 KiB blocks: the first call after 3-byte ones carries 64 bytes of each and
        // takes a data pass, the next carries them whole; 20,000-byte blocks (above
        // 16 KiB): a data pass, then direct with the remainders behind the counts.
        let (mixed, _) = run(None, &[3, 3, 2048, 2048, 20_000, 20_000]);
        for (r, (_, calls)) in mixed.into_iter().enumerate() {
            // (routed, calls without a data pass so far); the data passes' algorithm
            // is the tuner's.
            let got: Vec<_> = calls.iter().map(|&(_, routes, e)| (routes, e)).collect();
            assert_eq!(
                got[2..],
                [(true, 2), (true, 3), (true, 3), (false, 4)],
                "rank {r}: {calls:?}"
            );
            assert_eq!(
                (calls[3].0, calls[5].0),
                (halo, flat),
                "rank {r}: {calls:?}"
            );
        }
    }

    /// Ranks that carry different numbers of bytes with the counts (`set_eager_v`
    /// differs, a misuse) send count messages of other lengths than their receivers
    /// expect: every rank fails with a size mismatch, none hangs, none takes wrong
    /// bytes, and the communicator works again once they agree — direct (one host,
    /// flat forced) and in two hops (two hosts, automatic).
    #[test]
    fn count_messages_of_another_length_fail_every_rank() {
        for (spec, alg) in [("nodes:1x4", Some(Algorithm::Flat)), ("nodes:2x2", None)] {
            count_messages_of_another_length(spec, alg);
        }
    }

    fn count_messages_of_another_length(spec: &str, alg: Option<Algorithm>) {
        let topo = Topology::preset(spec).unwrap();
        let n = topo.size();
        let timeout = Duration::from_secs(5);
        let out = LocalCluster::new(topo, Emulation::off())
            .unwrap()
            .run(|comm| {
                comm.set_timeout(timeout);
                comm.set_algorithm(alg);
                let hops = routes_counts(comm);
                let me = comm.rank();
                // Blocks of 150 bytes: rank 1 carries 100 of them with the counts,
                // the others all 150 (its messages are shorter, theirs to it longer).
                comm.set_eager_v(Some(if me == 1 { 100 } else { 1024 }));
                let c = vec![150usize; n];
                let send = vec![me as u8 + 1; n * 150];
                let mut recv = vec![0u8; n * 150];
                let d = packed(&c);
                let p = Partition::new(&c, &d);
                let start = std::time::Instant::now();
                let bad = comm.all_to_all_v(&send, &p, &mut recv, &p);
                let took = start.elapsed();
                comm.set_eager_v(None);
                let mut again = vec![0u8; n * 150];
                let good = comm.all_to_all_v(&send, &p, &mut again, &p);
                Ok((hops, bad, took, good.map(|()| again)))
            });
        let out: Vec<_> = out.into_iter().map(|x| x.unwrap()).collect();
        for (r, (_, bad, took, good)) in out.iter().enumerate() {
            println!(
                "{spec} rank {r}: {took:?} {bad:?}; after: {:?}",
                good.as_ref().err()
            );
        }
        for (r, (hops, bad, took, good)) in out.into_iter().enumerate() {
            assert_eq!(hops, alg.is_none(), "{spec} rank {r}");
            let e = bad.unwrap_err();
            println!("{spec} rank {r} after {took:?}: {e}");
            assert!(took < timeout / 2, "rank {r} took {took:?}");
            assert!(
                matches!(e, Error::InvalidUsage { .. }) && e.to_string().contains("mismatch"),
                "rank {r}: {e:?}"
            );
            let again = good.unwrap_or_else(|e| panic!("rank {r}, the call after: {e}"));
            let want: Vec<u8> = (0..n).flat_map(|s| vec![s as u8 + 1; 150]).collect();
            assert_eq!(again, want, "rank {r}");
        }
    }

    /// The driven direct exchange waits as the engine does: a rank that never calls
    /// makes the others time out naming it (the count message they wait for), and an
    /// abort from another thread ends the wait at once.
    #[test]
    fn the_driven_exchange_times_out_and_aborts() {
        let topo = Topology::preset("nodes:1x4").unwrap();
        let n = topo.size();
        let timeout = Duration::from_millis(300);
        let out = LocalCluster::new(topo, Emulation::off())
            .unwrap()
            .run(|comm| {
                comm.set_timeout(timeout);
                let me = comm.rank();
                if me == 1 {
                    std::thread::sleep(timeout * 4);
                    return Ok(None);
                }
                // Blocks of 9000 bytes: remainders behind the counts.
                let c = vec![9000usize; n];
                let send = vec![me as u8; n * 9000];
                let mut recv = vec![0u8; n * 9000];
                let handle = comm.abort_handle();
                let aborter = (me == 3).then(|| {
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(50));
                        handle.abort();
                    })
                });
                let start = std::time::Instant::now();
                let e = comm
                    .all_to_all_v(
                        &send,
                        &Partition::new(&c, &packed(&c)),
                        &mut recv,
                        &Partition::new(&c, &packed(&c)),
                    )
                    .unwrap_err();
                if let Some(a) = aborter {
                    a.join().unwrap();
                }
                Ok(Some((e, start.elapsed())))
            });
        for (r, x) in out.into_iter().enumerate() {
            let Some((e, took)) = x.unwrap() else {
                continue;
            };
            println!("rank {r} after {took:?}: {e}");
            if r == 3 {
                assert!(matches!(e, Error::Aborted { .. }), "rank {r}: {e:?}");
                assert!(took < timeout, "rank {r} took {took:?}");
            } else {
                assert!(
                    matches!(e, Error::Timeout { peer: Some(1), .. }),
                    "rank {r}: {e:?}"
                );
                assert!(e.to_string().contains("count message from rank 1"), "{e}");
                assert!(
                    took >= timeout && took < timeout * 3,
                    "rank {r} took {took:?}"
                );
            }
        }
    }

    /// Blocks around the eager size (0, 1, `C - 1`, `C`, `C + 1`, `3 C` bytes) between
    /// gaps in both buffers, the remainders right behind the counts, or in the data
    /// pass of every algorithm (and automatic), or some each way (at most `C` bytes
    /// behind the counts: the blocks of `C + 1`), twice per communicator (the staging
    /// reused): every byte right, the gaps untouched.
    #[test]
    fn eager_parts_and_remainders_land_byte_exact() {
        let topo = Topology::preset("nodes:2x3").unwrap();
        let n = topo.size();
        for c in [super::EAGER_V, 100] {
            let sizes = [0, 1, c - 1, c, c + 1, 3 * c];
            let count = |s: usize, d: usize| sizes[(s * 5 + d * 2 + s * d) % sizes.len()];
            let byte = |s: usize, d: usize, i: usize, call: usize| {
                (s * 31 + d * 7 + i * 13 + i / 251 + call * 5) as u8
            };
            let mut algs: Vec<Option<Algorithm>> =
                Algorithm::ALL.iter().copied().map(Some).collect();
            algs.push(None);
            let runs = algs.into_iter().flat_map(|alg| {
                let specs = if alg.is_none_or(|a| a == Algorithm::Flat) {
                    vec![None, Some(0), Some(c)]
                } else {
                    vec![None]
                };
                specs.into_iter().map(move |spec| (alg, spec))
            });
            for (alg, spec) in runs {
                let cluster = LocalCluster::new(topo.clone(), Emulation::off()).unwrap();
                let out = cluster.run(|comm| {
                    comm.set_timeout(Duration::from_secs(20));
                    comm.force_meta_plan(Some(MetaPlan::Direct));
                    // Fixed: learning would carry the blocks of 3 C whole.
                    comm.set_eager_v(Some(c));
                    comm.set_speculate_v(spec);
                    comm.set_algorithm(alg);
                    assert_eq!(comm.eager_v(), c);
                    // Where the model routes the count messages of the first call, its
                    // remainders take the data pass (no remainders were expected).
                    let routes = routes_counts(comm);
                    let me = comm.rank();
                    let sc: Vec<usize> = (0..n).map(|d| count(me, d)).collect();
                    let rc: Vec<usize> = (0..n).map(|s| count(s, me)).collect();
                    let gapped = |counts: &[usize], gap: usize| {
                        let mut at = 0;
                        counts
                            .iter()
                            .map(|&k| {
                                at += gap;
                                let d = at;
                                at += k;
                                d
                            })
                            .collect::<Vec<_>>()
                    };
                    let (sd, rd) = (gapped(&sc, 2), gapped(&rc, 3));
                    for call in 0..2 {
                        let mut send = vec![0x5au8; sd[n - 1] + sc[n - 1]];
                        for d in 0..n {
                            for i in 0..sc[d] {
                                send[sd[d] + i] = byte(me, d, i, call);
                            }
                        }
                        let mut recv = vec![0xa5u8; rd[n - 1] + rc[n - 1] + 3];
                        comm.all_to_all_v(
                            &send,
                            &Partition::new(&sc, &sd),
                            &mut recv,
                            &Partition::new(&rc, &rd),
                        )?;
                        let mut want = vec![0xa5u8; recv.len()];
                        for s in 0..n {
                            for i in 0..rc[s] {
                                want[rd[s] + i] = byte(s, me, i, call);
                            }
                        }
                        let what = format!("C {c} {alg:?} speculated {spec:?} rank {me}");
                        assert_eq!(recv, want, "{what} call {call}");
                    }
                    Ok((routes, comm.v_eager_only(), comm.last_algorithm()))
                });
                for (r, x) in out.into_iter().enumerate() {
                    let what = format!("C {c} {alg:?} speculated {spec:?} rank {r}");
                    let (routes, eager_only, last) = x.unwrap_or_else(|e| panic!("{what}: {e}"));
                    // Blocks of 3 C on every call: a data pass, unless their remainders
                    // all went behind the counts (the second call's always: the first
                    // one's matrix says remainders follow).
                    let behind = spec.is_none() && alg.is_none_or(|a| a == Algorithm::Flat);
                    let want = match (behind, routes) {
                        (false, _) => 0,
                        (true, true) => 1,
                        (true, false) => 2,
                    };
                    assert_eq!(eager_only, want, "{what} routes {routes}");
                    if behind {
                        assert_eq!(last, Some(Algorithm::Flat), "{what}");
                    } else if alg.is_some() {
                        assert_eq!(last, alg, "{what}");
                    }
                }
            }
        }
    }

    /// The learned eager bytes: the largest block plus an eighth, rounded up to 64
    /// bytes, 64 to 4096; kept while the blocks fit and need more than half; the
    /// default above 4096 or where padding every block would send over four times the
    /// data.
    #[test]
    fn learn_eager_follows_the_largest_block() {
        use super::{EAGER_V, learn_eager};
        let uniform = |n: usize, b: usize| (n * n * b) as u64;
        // Tiny blocks: 64 bytes, the least (not the default 1 KiB).
        assert_eq!(learn_eager(EAGER_V, 10, uniform(4, 5), 4, false), 64);
        assert_eq!(learn_eager(EAGER_V, 0, 0, 4, false), 64);
        // Larger blocks: the largest plus an eighth, rounded up to 64.
        assert_eq!(learn_eager(EAGER_V, 2080, uniform(4, 2000), 4, false), 2368);
        assert_eq!(learn_eager(64, 1000, uniform(8, 900), 8, false), 1152);
        // Kept while every block fits and needs more than half of it.
        assert_eq!(learn_eager(2048, 2048, uniform(4, 2000), 4, false), 2048);
        assert_eq!(learn_eager(2048, 1000, uniform(4, 900), 4, false), 2048);
        assert_eq!(learn_eager(2048, 900, uniform(4, 900), 4, false), 1024);
        assert_eq!(learn_eager(64, 64, uniform(4, 64), 4, false), 64);
        // One byte over: grows.
        assert_eq!(learn_eager(64, 65, uniform(4, 65), 4, false), 128);
        // At most 4 KiB; a block above it: the default.
        assert_eq!(learn_eager(EAGER_V, 4000, uniform(4, 4000), 4, false), 4096);
        assert_eq!(learn_eager(EAGER_V, 4096, uniform(4, 4096), 4, false), 4096);
        assert_eq!(learn_eager(4096, 4097, uniform(4, 4097), 4, false), EAGER_V);
        assert_eq!(learn_eager(64, usize::MAX, u64::MAX, 64, false), EAGER_V);
        // One 4000-byte block among 63 empty ones (8 ranks): padding 64 blocks to 4 KiB
        // is 65x the data: the default. Up to 1 KiB padding is always taken.
        assert_eq!(learn_eager(EAGER_V, 4000, 4000, 8, false), EAGER_V);
        assert_eq!(learn_eager(EAGER_V, 900, 900, 8, false), EAGER_V);
        assert_eq!(learn_eager(64, 500, 500, 8, false), 576);
        // Padding to four times the data is still taken (2 x 2 blocks of 2304 B for
        // 2304 B of data), a byte more is not.
        assert_eq!(learn_eager(EAGER_V, 2000, 2304, 2, false), 2304);
        assert_eq!(learn_eager(EAGER_V, 2000, 2303, 2, false), EAGER_V);
        // Unpadded (the two hops across hosts): up to 16 KiB, whatever the padding
        // would have been.
        assert_eq!(learn_eager(EAGER_V, 4000, 4000, 8, true), 4544);
        assert_eq!(learn_eager(EAGER_V, 14000, 14000, 8, true), 15808);
        assert_eq!(learn_eager(EAGER_V, 16384, 16384, 8, true), 16384);
        assert_eq!(learn_eager(16384, 16385, 16385, 8, true), EAGER_V);
    }

    /// Only the direct exchange carries eager bytes: the logarithmic all-gathers and
    /// the three passes carry none, whatever is forced.
    #[test]
    fn only_the_direct_exchange_is_eager() {
        let topo = Topology::preset("nodes:2x2").unwrap();
        let mut comms = LocalCluster::new(topo, Emulation::off())
            .unwrap()
            .into_communicators();
        let comm = &mut comms[0];
        comm.set_algorithm(Some(Algorithm::Flat));
        for (plan, want) in [
            // Learned (the 1 KiB default before any call), at least `EAGER_V_DIRECT`
            // where the count messages go direct (forced flat here).
            (MetaPlan::Direct, super::EAGER_V_DIRECT),
            (MetaPlan::Gather(AllGatherAlgorithm::Bruck), 0),
            (MetaPlan::Gather(AllGatherAlgorithm::RecursiveDoubling), 0),
            (MetaPlan::Agreed, 0),
        ] {
            comm.force_meta_plan(Some(plan));
            comm.set_eager_v(None);
            assert_eq!(comm.eager_v(), want, "{plan:?}");
            comm.set_eager_v(Some(77));
            assert_eq!(comm.eager_v(), if want > 0 { 77 } else { 0 }, "{plan:?}");
            comm.set_eager_v(Some(usize::MAX));
            assert_eq!(
                comm.eager_v(),
                if want > 0 { super::EAGER_V_MAX } else { 0 },
                "{plan:?}"
            );
        }
    }

    /// The model gathers where the simulated all-gather is no slower than two passes:
    /// small communicators, never above `GATHER_MAX_RANKS`.
    #[test]
    fn the_model_gathers_small_communicators_only() {
        for (spec, gathers) in [
            ("nodes:1x4", true),
            ("nodes:4x2", true),
            ("frontier:2", true),
            ("frontier:8", false),
            ("frontier:16", false),
        ] {
            let topo = Topology::preset(spec).unwrap();
            let comms = LocalCluster::new(topo, Emulation::off())
                .unwrap()
                .into_communicators();
            let plan = model_plan(&comms[0].core, None);
            println!("{spec}: {plan:?}");
            assert_eq!(plan != MetaPlan::Agreed, gathers, "{spec}: {plan:?}");
            // The environment's override decides by size alone.
            assert_eq!(model_plan(&comms[0].core, Some(0)), MetaPlan::Agreed);
            assert_ne!(model_plan(&comms[0].core, Some(4096)), MetaPlan::Agreed);
        }
    }

    /// Automatic mode measures on both count exchanges (and on the remainders beyond
    /// the eager bytes): every rank tries the same
    /// candidates in the same order and decides alike, after three passes (where only
    /// the metadata pass's algorithm may forward) as after the gathered counts, every
    /// byte right on every call.
    #[test]
    fn both_count_exchanges_measure_alike_on_every_rank() {
        use crate::comm::class;
        use crate::tune::{MAX_CANDIDATES, trials};
        let topo = Topology::preset("nodes:2x3").unwrap();
        let n = topo.size();
        // The tuner's class is the mean of what the data pass moves: with `c` eager
        // bytes per block, the remainders' (the blocks, of at most 16 bytes, would all
        // go with the counts with the default, and no data pass would ever be measured;
        // so would the remainders, right behind the counts, unless turned off).
        let mean_beyond = |c: usize| {
            let total: usize = (0..n)
                .flat_map(|s| (0..n).map(move |d| (count(s, d) * 4).saturating_sub(c)))
                .sum();
            total / (n * n)
        };
        for (plan, eager) in [
            (MetaPlan::Agreed, None),
            (MetaPlan::Direct, Some(0)),
            (MetaPlan::Direct, Some(5)),
        ] {
            let mean = mean_beyond(eager.unwrap_or(0));
            let cluster = LocalCluster::new(topo.clone(), Emulation::off()).unwrap();
            let out = cluster.run(|comm| {
                comm.set_timeout(Duration::from_secs(20));
                comm.force_meta_plan(Some(plan));
                comm.set_eager_v(eager);
                comm.set_speculate_v(Some(0));
                let me = comm.rank();
                let sc: Vec<usize> = (0..n).map(|d| count(me, d)).collect();
                let rc: Vec<usize> = (0..n).map(|s| count(s, me)).collect();
                let mut ran = Vec::new();
                let mut call = 0u32;
                while comm.tuned_v(mean).is_none() {
                    assert!(
                        (call as usize) < trials(class(mean)) * MAX_CANDIDATES,
                        "no decision"
                    );
                    let send: Vec<u32> = (0..n)
                        .flat_map(|d| {
                            (0..sc[d]).map(move |i| (me * 10_000 + d * 100 + i) as u32 ^ call)
                        })
                        .collect();
                    let mut recv = vec![u32::MAX; rc.iter().sum()];
                    comm.all_to_all_v(
                        &send,
                        &Partition::new(&sc, &packed(&sc)),
                        &mut recv,
                        &Partition::new(&rc, &packed(&rc)),
                    )?;
                    let expect: Vec<u32> = (0..n)
                        .flat_map(|s| {
                            (0..rc[s]).map(move |i| (s * 10_000 + me * 100 + i) as u32 ^ call)
                        })
                        .collect();
                    assert_eq!(recv, expect, "{plan:?} rank {me} call {call}");
                    ran.push(comm.last_algorithm().unwrap());
                    call += 1;
                }
                let calls = comm.v_calls();
                Ok((ran, comm.tuned_v(mean).unwrap(), calls))
            });
            let out: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
            let (ran, tuned, calls) = &out[0];
            for (r, o) in out.iter().enumerate() {
                assert_eq!((&o.0, &o.1), (ran, tuned), "{plan:?}: rank {r}");
            }
            let k = ran.len() as u64;
            assert_eq!(
                *calls,
                if plan == MetaPlan::Agreed {
                    (0, k)
                } else {
                    (k, 0)
                },
                "{plan:?}"
            );
            let cands: Vec<Algorithm> = tuned.times.iter().map(|t| t.0).collect();
            println!("{plan:?}: tried {ran:?}, chose {tuned:?}");
            assert!(cands.len() >= 2, "{plan:?}: {cands:?}");
            assert_eq!(ran.len(), trials(class(mean)) * cands.len());
            for (i, a) in ran.iter().enumerate() {
                assert_eq!(*a, cands[i % cands.len()], "{plan:?}");
            }
            if plan == MetaPlan::Agreed {
                let forwarding: Vec<_> = cands.iter().filter(|a| a.forwards()).collect();
                assert!(forwarding.len() <= 1, "{forwarding:?}");
            }
        }
    }
}
