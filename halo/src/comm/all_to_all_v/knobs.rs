//! The tuning constants of all-to-all-v, its three environment variables (read
//! through `halo_params`: `HALO_A2AV_EAGER`, `HALO_A2AV_GATHER_MAX`,
//! `HALO_A2AV_SPECULATE`), the setters of the eager bytes `C` and the largest
//! remainder behind the counts `S`, and the values in effect on a communicator.

use super::MetaPlan;
use crate::comm::Communicator;
use halo_collectives::Algorithm;
use halo_topology::Level;
use std::sync::OnceLock;

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
/// padded (across hosts that take the two hops, [`super::hops`]): up to 16 KiB
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
pub(super) fn gather_max_env() -> Option<usize> {
    static MAX: OnceLock<Option<usize>> = OnceLock::new();
    *MAX.get_or_init(|| env_count(&halo_params::A2AV_GATHER_MAX))
}

/// `HALO_A2AV_SPECULATE`, if set: the largest remainder sent right behind the count
/// message (0: none), at most [`SPECULATE_V_MAX`].
fn speculate_env() -> Option<usize> {
    static SPEC: OnceLock<Option<usize>> = OnceLock::new();
    *SPEC.get_or_init(|| env_count(&halo_params::A2AV_SPECULATE))
}

impl Communicator {
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

    /// The least eager bytes of the direct exchange where they are learned:
    /// [`EAGER_V_DIRECT`] on a communicator whose ranks span hosts, else none.
    pub(super) fn direct_eager_floor(&self) -> usize {
        let t = &self.core.topology;
        if t.has_level(Level::Node) && t.num_domains(Level::Node) > 1 {
            EAGER_V_DIRECT
        } else {
            0
        }
    }

    /// The eager bytes per block with the count-exchange plan `plan`.
    pub(super) fn eager_for(&self, plan: MetaPlan) -> usize {
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
        if self
            .core
            .policy
            .forced()
            .all_to_all
            .is_some_and(|a| a != Algorithm::Flat)
        {
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
    pub(super) fn eager_learns(&self) -> bool {
        self.pool.v.eager_forced.is_none() && eager_env().is_none()
    }
}
