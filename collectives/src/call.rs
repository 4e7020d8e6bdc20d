//! The call descriptor: what every rank of a collective must agree on, in 64 bits that
//! travel with every message of the call.
//!
//! A [`Call`] names the collective (its [`CallKind`]), the reduction operation, the
//! element type of a reduction, the root of a rooted collective and the call's byte
//! count. The caller puts it in [`crate::Buffers::call`]; each transport carries it
//! with every message it already sends (no message of its own, no extra round) and a
//! receiver whose own call has another descriptor fails with
//! [`crate::CollectiveError::Mismatch`], in words from [`Call::mismatch`] that name both
//! ranks and both values. [`Call::NONE`] (point-to-point messages, a caller that does
//! not say) is never compared.
//!
//! ```text
//!  63  62 61            32 31           12 11      7 6    4 3    0
//! +---+--+----------------+---------------+---------+------+------+
//! | P |H | count + 1      | root          | dtype   | op   | kind |
//! +---+--+----------------+---------------+---------+------+------+
//! ```
//!
//! - **kind** (4 bits): [`CallKind`] as a number, 1..=11; 0 only in [`Call::NONE`], and 15
//!   is never used, so that no descriptor's low bits are all ones (a transport's poison
//!   marker when it carries fewer than 8 bytes).
//! - **op** (3 bits): 0 none, 1 sum, 2 prod, 3 max, 4 min, 5 avg (NCCL's `ncclRedOp_t`
//!   plus one).
//! - **dtype** (5 bits): the element type of a reduction, 0 for none (a collective that
//!   moves bytes); 1..=10 are HALO's `haloDataType` plus one ([`DTYPE_NAMES`]).
//! - **root** (20 bits): the root of broadcast, gather and scatter (HALO has at most
//!   2^20 ranks), 0 otherwise.
//! - **count** (30 bits + **H**): the call's byte count plus one (0: not carried, as for
//!   all-to-all-v whose totals differ from rank to rank), exact below 2^30 - 1; above,
//!   H is set and the 30 bits are a hash of the count (two different large counts then
//!   still differ, with odds of 2^-30 against).
//! - **P**: set only in poison ([`Call::poison`]): the descriptor of a rank that failed
//!   the call and will not send what its peer waits for, so that the peer can say what
//!   the failed rank had called.

use std::fmt;

/// A collective call's descriptor (see the module docs); compare with `==`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Call(u64);

/// Which collective a [`Call`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CallKind {
    /// Uniform all-to-all (count: bytes per peer).
    AllToAll = 1,
    /// All-to-all-v (count: the bytes of a pass every rank agrees on, or none).
    AllToAllV = 2,
    /// All-gather (count: bytes per rank).
    AllGather = 3,
    /// All-reduce (count: the vector's bytes).
    AllReduce = 4,
    /// Reduce-scatter (count: the bytes each rank keeps).
    ReduceScatter = 5,
    /// Broadcast (count: bytes).
    Broadcast = 6,
    /// Gather (count: bytes per rank).
    Gather = 7,
    /// Scatter (count: bytes per rank).
    Scatter = 8,
    /// Barrier.
    Barrier = 9,
    /// Split into sub-communicators.
    Split = 10,
    /// Point-to-point (not compared by kind: sends and receives have their own rules).
    P2p = 11,
}

impl CallKind {
    const ALL: [CallKind; 11] = [
        CallKind::AllToAll,
        CallKind::AllToAllV,
        CallKind::AllGather,
        CallKind::AllReduce,
        CallKind::ReduceScatter,
        CallKind::Broadcast,
        CallKind::Gather,
        CallKind::Scatter,
        CallKind::Barrier,
        CallKind::Split,
        CallKind::P2p,
    ];

    /// The name of the call, as the C and Rust APIs spell it.
    pub fn name(self) -> &'static str {
        match self {
            CallKind::AllToAll => "all_to_all",
            CallKind::AllToAllV => "all_to_all_v",
            CallKind::AllGather => "all_gather",
            CallKind::AllReduce => "all_reduce",
            CallKind::ReduceScatter => "reduce_scatter",
            CallKind::Broadcast => "broadcast",
            CallKind::Gather => "gather",
            CallKind::Scatter => "scatter",
            CallKind::Barrier => "barrier",
            CallKind::Split => "split",
            CallKind::P2p => "send/recv",
        }
    }

    /// What the count of this kind of call measures, after "N bytes".
    fn per(self) -> &'static str {
        match self {
            CallKind::AllToAll => " per peer",
            CallKind::AllGather | CallKind::Gather | CallKind::Scatter => " per rank",
            CallKind::ReduceScatter => " per rank kept",
            _ => "",
        }
    }

    fn rooted(self) -> bool {
        matches!(
            self,
            CallKind::Broadcast | CallKind::Gather | CallKind::Scatter
        )
    }
}

/// Names of the reduction operations by code (0: none).
pub const OP_NAMES: [&str; 6] = ["none", "sum", "prod", "max", "min", "avg"];

/// Names of the element types by code (0: none; then `haloDataType` + 1).
pub const DTYPE_NAMES: [&str; 11] = [
    "none", "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
    "bfloat16",
];

const KIND_BITS: u32 = 4;
const OP_SHIFT: u32 = 4;
const OP_MASK: u64 = 0x7;
const DTYPE_SHIFT: u32 = 7;
const DTYPE_MASK: u64 = 0x1f;
const ROOT_SHIFT: u32 = 12;
const ROOT_MASK: u64 = (1 << 20) - 1;
const COUNT_SHIFT: u32 = 32;
const COUNT_MASK: u64 = (1 << 30) - 1;
const HASHED: u64 = 1 << 62;
const POISON: u64 = 1 << 63;

/// The 30 bits carried for a count too large to carry exactly (a 64-bit mix).
fn count_hash(count: usize) -> u64 {
    let mut x = count as u64;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x & COUNT_MASK
}

/// The count field for `count`: exact (plus one) or hashed with H.
fn count_bits(count: usize) -> u64 {
    match (count as u64).checked_add(1) {
        Some(c) if c <= COUNT_MASK => c << COUNT_SHIFT,
        _ => HASHED | count_hash(count) << COUNT_SHIFT,
    }
}

impl Call {
    /// No descriptor: never compared.
    pub const NONE: Call = Call(0);

    /// A call of `kind` with nothing else to agree on yet.
    pub const fn new(kind: CallKind) -> Call {
        Call(kind as u64)
    }

    /// With the byte count `count` (what it measures depends on the kind).
    #[must_use]
    pub fn count(self, count: usize) -> Call {
        Call(self.0 & !(HASHED | COUNT_MASK << COUNT_SHIFT) | count_bits(count))
    }

    /// With the reduction operation `code` (see [`OP_NAMES`]; 0..=7).
    #[must_use]
    pub fn op(self, code: u8) -> Call {
        Call(self.0 & !(OP_MASK << OP_SHIFT) | (u64::from(code) & OP_MASK) << OP_SHIFT)
    }

    /// With the element type `code` (see [`DTYPE_NAMES`]; 0..=31).
    #[must_use]
    pub fn dtype(self, code: u8) -> Call {
        Call(self.0 & !(DTYPE_MASK << DTYPE_SHIFT) | (u64::from(code) & DTYPE_MASK) << DTYPE_SHIFT)
    }

    /// With the root `root` (its low 20 bits).
    #[must_use]
    pub fn root(self, root: usize) -> Call {
        Call(self.0 & !(ROOT_MASK << ROOT_SHIFT) | (root as u64 & ROOT_MASK) << ROOT_SHIFT)
    }

    /// The descriptor as it travels.
    pub const fn to_raw(self) -> u64 {
        self.0
    }

    /// A descriptor as it arrived (any 64 bits: decoding never fails, unknown codes are
    /// named by number).
    pub const fn from_raw(raw: u64) -> Call {
        Call(raw)
    }

    /// Whether this is [`Call::NONE`].
    pub const fn is_none(self) -> bool {
        self.0 == 0
    }

    /// The poison of a rank whose call was this one: the descriptor with P set.
    pub const fn poison(self) -> Call {
        Call(self.0 | POISON)
    }

    /// Whether P is set (the descriptor came with poison).
    pub const fn is_poison(self) -> bool {
        self.0 & POISON != 0
    }

    /// The descriptor without P.
    pub const fn unpoisoned(self) -> Call {
        Call(self.0 & !POISON)
    }

    /// Whether a message carrying `theirs` may meet a receive of this call: either is
    /// [`Call::NONE`] (nothing to compare), or they are equal (P aside).
    pub fn agrees(self, theirs: Call) -> bool {
        let (a, b) = (self.unpoisoned(), theirs.unpoisoned());
        a.is_none() || b.is_none() || a == b
    }

    /// Whether these 64 bits are a descriptor that some call makes (P aside):
    /// [`Call::NONE`], or a known kind with a known operation and element type code.
    /// A transport that keys descriptors with the sender tells by it whether it
    /// removed the right key.
    pub fn is_well_formed(self) -> bool {
        let c = self.unpoisoned();
        c.is_none()
            || (c.kind().is_some()
                && c.op_code() < OP_NAMES.len()
                && c.dtype_code() < DTYPE_NAMES.len())
    }

    /// The kind, if its code is one.
    pub fn kind(self) -> Option<CallKind> {
        let k = (self.0 & ((1 << KIND_BITS) - 1)) as u8;
        CallKind::ALL.into_iter().find(|c| *c as u8 == k)
    }

    fn kind_code(self) -> u64 {
        self.0 & ((1 << KIND_BITS) - 1)
    }

    fn op_code(self) -> usize {
        ((self.0 >> OP_SHIFT) & OP_MASK) as usize
    }

    fn dtype_code(self) -> usize {
        ((self.0 >> DTYPE_SHIFT) & DTYPE_MASK) as usize
    }

    fn root_value(self) -> u64 {
        (self.0 >> ROOT_SHIFT) & ROOT_MASK
    }

    fn count_field(self) -> u64 {
        self.0 & (HASHED | COUNT_MASK << COUNT_SHIFT)
    }

    /// The byte count, where it is carried exactly.
    pub fn byte_count(self) -> Option<usize> {
        if self.0 & HASHED != 0 {
            return None;
        }
        ((self.0 >> COUNT_SHIFT) & COUNT_MASK)
            .checked_sub(1)
            .map(|c| c as usize)
    }

    fn kind_name(self) -> String {
        match self.kind() {
            Some(k) => k.name().to_string(),
            None => format!("collective {}", self.kind_code()),
        }
    }

    fn op_name(self) -> String {
        name_of(&OP_NAMES, self.op_code(), "op")
    }

    fn dtype_name(self) -> String {
        name_of(&DTYPE_NAMES, self.dtype_code(), "type")
    }

    fn count_words(self) -> String {
        let per = self.kind().map_or("", CallKind::per);
        if self.0 & HASHED != 0 {
            format!("2^30 bytes or more{per}")
        } else {
            match self.byte_count() {
                Some(1) => format!("1 byte{per}"),
                Some(c) => format!("{c} bytes{per}"),
                None => "its own count".to_string(),
            }
        }
    }

    /// The call in a few words: `all_reduce (sum, float32, 4096 bytes)`.
    pub fn describe(self) -> String {
        let call = self.unpoisoned();
        if call.is_none() {
            return "no collective".to_string();
        }
        let mut parts = Vec::new();
        if call.op_code() != 0 {
            parts.push(call.op_name());
        }
        if call.dtype_code() != 0 {
            parts.push(call.dtype_name());
        }
        if call.kind().is_some_and(CallKind::rooted) || call.root_value() != 0 {
            parts.push(format!("root {}", call.root_value()));
        }
        if call.count_field() != 0 {
            parts.push(call.count_words());
        }
        if parts.is_empty() {
            call.kind_name()
        } else {
            format!("{} ({})", call.kind_name(), parts.join(", "))
        }
    }

    /// The words both ranks of a disagreeing pair report, the lower rank first: `rank
    /// a` called `call_a`, `rank b` called `call_b` (`None` when they agree). The first
    /// field that differs is named — kind, operation, element type, root, count — with
    /// both values; a count difference starts with "size mismatch", the others with
    /// "call mismatch".
    pub fn mismatch(a: (usize, Call), b: (usize, Call)) -> Option<String> {
        let ((ra, ca), (rb, cb)) = if a.0 <= b.0 { (a, b) } else { (b, a) };
        let (ca, cb) = (ca.unpoisoned(), cb.unpoisoned());
        if ca.agrees(cb) {
            return None;
        }
        let hint = "(every rank must make the same collective calls in the same order)";
        Some(if ca.kind_code() != cb.kind_code() {
            format!(
                "call mismatch: rank {ra} called {}, rank {rb} {} {hint}",
                ca.describe(),
                cb.describe()
            )
        } else if ca.op_code() != cb.op_code() {
            format!(
                "call mismatch: rank {ra} called {} with {}, rank {rb} with {} {hint}",
                ca.kind_name(),
                ca.op_name(),
                cb.op_name()
            )
        } else if ca.dtype_code() != cb.dtype_code() {
            format!(
                "call mismatch: in {}, rank {ra} reduces {}, rank {rb} {} (mismatched \
                 element types between ranks)",
                ca.kind_name(),
                ca.dtype_name(),
                cb.dtype_name()
            )
        } else if ca.root_value() != cb.root_value() {
            format!(
                "call mismatch: rank {ra} called {} with root {}, rank {rb} with root {} \
                 {hint}",
                ca.kind_name(),
                ca.root_value(),
                cb.root_value()
            )
        } else if ca.kind() == Some(CallKind::AllToAll) {
            format!(
                "size mismatch: rank {ra} called the all-to-all with blocks of {} per \
                 rank but rank {rb} with {} (the ranks passed different counts or element \
                 types)",
                ca.count_words().trim_end_matches(" per peer"),
                cb.count_words().trim_end_matches(" per peer")
            )
        } else {
            format!(
                "size mismatch: rank {ra} called {} with {}, rank {rb} with {} (the ranks \
                 passed different counts or element types)",
                ca.kind_name(),
                ca.count_words(),
                cb.count_words()
            )
        })
    }
}

fn name_of(names: &[&str], code: usize, what: &str) -> String {
    match names.get(code) {
        Some(n) => (*n).to_string(),
        None => format!("{what} {code}"),
    }
}

impl fmt::Debug for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Call({:#x}: {})", self.0, self.describe())
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_describe() {
        let c = Call::new(CallKind::AllReduce).op(1).dtype(8).count(4096);
        assert_eq!(c.kind(), Some(CallKind::AllReduce));
        assert_eq!(c.byte_count(), Some(4096));
        assert_eq!(c.describe(), "all_reduce (sum, float32, 4096 bytes)");
        let b = Call::new(CallKind::Broadcast).root(3).count(0);
        assert_eq!(b.describe(), "broadcast (root 3, 0 bytes)");
        assert_eq!(Call::new(CallKind::Barrier).describe(), "barrier");
        assert!(!Call::from_raw(c.to_raw()).is_poison());
        assert!(c.poison().is_poison() && c.poison().unpoisoned() == c);
        // No descriptor's low byte is all ones (a short poison marker).
        assert_ne!(c.to_raw() & 0xf, 0xf);
    }

    #[test]
    fn large_counts_hash_and_still_differ() {
        let a = Call::new(CallKind::AllGather).count(1 << 31);
        let b = Call::new(CallKind::AllGather).count((1 << 31) + 4);
        assert_eq!(a.byte_count(), None);
        assert!(!a.agrees(b));
        assert!(a.describe().contains("2^30 bytes or more"));
        assert_eq!(
            Call::new(CallKind::AllGather)
                .count(COUNT_MASK as usize - 1)
                .byte_count(),
            Some(COUNT_MASK as usize - 1)
        );
    }

    #[test]
    fn mismatch_words_name_both_ranks_and_values() {
        let sum = Call::new(CallKind::AllReduce).op(1).dtype(8).count(16);
        let max = sum.op(3);
        assert_eq!(
            Call::mismatch((1, max), (0, sum)).unwrap(),
            Call::mismatch((0, sum), (1, max)).unwrap()
        );
        let m = Call::mismatch((0, sum), (1, max)).unwrap();
        assert!(
            m.contains("rank 0 called all_reduce with sum, rank 1 with max"),
            "{m}"
        );
        let m = Call::mismatch((0, sum), (1, sum.dtype(3))).unwrap();
        assert!(m.contains("rank 0 reduces float32, rank 1 int32"), "{m}");
        let a2a = Call::new(CallKind::AllToAll).count(4096);
        let m = Call::mismatch((0, a2a), (1, Call::new(CallKind::AllGather).count(4096))).unwrap();
        assert!(
            m.contains("rank 0 called all_to_all (4096 bytes per peer), rank 1 all_gather"),
            "{m}"
        );
        let m = Call::mismatch((0, a2a.count(4)), (1, a2a.count(2))).unwrap();
        assert!(
            m.contains("blocks of 4 bytes") && m.contains("with 2 bytes"),
            "{m}"
        );
        let r = Call::new(CallKind::Gather).root(0).count(8);
        let m = Call::mismatch((2, r.root(1)), (0, r)).unwrap();
        assert!(
            m.contains("rank 0 called gather with root 0, rank 2 with root 1"),
            "{m}"
        );
        assert!(Call::mismatch((0, sum), (1, Call::NONE)).is_none());
        assert!(Call::mismatch((0, sum), (1, sum.poison())).is_none());
    }

    /// The fuzz target's properties (fuzz/fuzz_targets/call.rs) over a fixed stream.
    #[test]
    fn random_pairs_agree_symmetrically_and_name_both_ranks() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            x ^ x >> 29
        };
        for i in 0..20_000u64 {
            let a = next();
            // Often close to `a`: one field changed.
            let b = if i % 2 == 0 {
                a ^ (1 << (next() % 64))
            } else {
                next()
            };
            let (ca, cb) = (Call::from_raw(a), Call::from_raw(b));
            assert_eq!(ca.agrees(cb), cb.agrees(ca));
            assert!(ca.agrees(ca.poison()));
            let _ = ca.describe();
            match Call::mismatch((3, ca), (7, cb)) {
                None => assert!(ca.agrees(cb)),
                Some(w) => {
                    assert!(w.contains("rank 3") && w.contains("rank 7"), "{w}");
                    assert_eq!(Some(w), Call::mismatch((7, cb), (3, ca)));
                }
            }
        }
    }

    #[test]
    fn any_bits_decode() {
        for raw in [u64::MAX, 0xf, 0x7fff_ffff_ffff_fff0, 1 << 62, 0xffe] {
            let c = Call::from_raw(raw);
            let _ = c.describe();
            let _ = Call::mismatch((0, c), (1, Call::new(CallKind::Barrier)));
        }
    }
}
