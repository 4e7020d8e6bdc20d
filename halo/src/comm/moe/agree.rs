//! The agreement at the start of every data call on a [`MoeExchange`]: every rank
//! tells every other which call it makes (the call, the exchange, `d`, the element
//! type) and whether its arguments are good, so that bad arguments on one rank, or
//! calls that differ, are an error on every rank before any row moves.

use super::MoeExchange;
use crate::comm::Communicator;
use crate::error::{Error, Result};

/// The agreement at the start of every data call: `ours` (`[status, call, exchange,
/// d, element size, element type]`) to every rank; this rank's error first, then the
/// first rank that reported one, then the first rank whose call differs.
pub(super) fn agree_on(
    comm: &mut Communicator,
    ours: [u64; AGREE_WORDS],
    mine: Result<()>,
) -> Result<()> {
    let n = comm.size();
    let me = comm.rank();
    let send: Vec<u64> = (0..n).flat_map(|_| ours).collect();
    let mut all = vec![0u64; AGREE_WORDS * n];
    comm.all_to_all(&send, &mut all)?;
    mine?;
    let name = DataCall::name(ours[1]);
    for q in 0..n {
        let theirs = &all[AGREE_WORDS * q..AGREE_WORDS * (q + 1)];
        if theirs[0] != 0 {
            return Err(Error::InvalidUsage {
                peer: Some(q),
                message: format!("{name}: rank {q} passed invalid arguments"),
            });
        }
        if theirs[1..] != ours[1..] {
            return Err(Error::InvalidUsage {
                peer: Some(q),
                message: format!(
                    "MoE calls differ: rank {me} called {}, rank {q} {}",
                    describe_call(&ours),
                    describe_call(theirs)
                ),
            });
        }
    }
    Ok(())
}

/// The data calls on one [`MoeExchange`], as the agreement names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DataCall {
    Dispatch = 1,
    Combine = 2,
    DispatchPairs = 3,
    CombinePairs = 4,
    /// The gate-weighted combine ([`MoeExchange::combine`], `combine_residual`).
    CombineWeighted = 5,
}

impl DataCall {
    fn name(code: u64) -> &'static str {
        match code {
            1 => "moe_dispatch",
            2 => "moe_combine",
            3 => "moe_dispatch_pairs",
            4 => "moe_combine_pairs",
            5 => "moe_combine (gate-weighted)",
            _ => "an unknown MoE call",
        }
    }
}

/// Element types by name, for the agreement's messages.
const TYPE_NAMES: [&str; 12] = [
    "f32",
    "f64",
    "u8",
    "i8",
    "u16",
    "i16",
    "u32",
    "i32",
    "u64",
    "i64",
    "half::binary16::f16",
    "half::bfloat::bf16",
];

fn type_hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn type_name_of(hash: u64, size: u64) -> String {
    TYPE_NAMES
        .iter()
        .find(|n| type_hash(n) == hash)
        .map(|n| n.rsplit("::").next().unwrap_or(n).to_string())
        .unwrap_or_else(|| format!("a {size}-byte type"))
}

/// How a data call is described to the other ranks: `[status, call, exchange, d,
/// element size, element type]`.
const AGREE_WORDS: usize = 6;

fn describe_call(w: &[u64]) -> String {
    format!(
        "{} on the exchange routed at call {} with rows of {} x {}",
        DataCall::name(w[1]),
        w[2],
        w[3],
        type_name_of(w[5], w[4])
    )
}

impl MoeExchange {
    /// Every rank tells every other what it calls (`[status, call, exchange, d, element
    /// size, element type]`): a rank with bad arguments, or ranks whose calls differ,
    /// are an error on every rank before any row moves.
    pub(super) fn agree<E>(
        &self,
        comm: &mut Communicator,
        call: DataCall,
        d: usize,
        mine: Result<()>,
    ) -> Result<()> {
        let ours = [
            u64::from(mine.is_err()),
            call as u64,
            self.id,
            d as u64,
            std::mem::size_of::<E>() as u64,
            type_hash(std::any::type_name::<E>()),
        ];
        agree_on(comm, ours, mine)
    }
}
