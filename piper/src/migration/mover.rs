//! Moving experts: each expert whose owner changes travels from its old rank to its new
//! one with its weights, gradients and Adam state (`m`, `v` and the step count), one
//! `all_to_all_v` per block on the stage's EP group carrying every expert of that block
//! that moves; then every rank of the mesh votes, and only when every rank has received
//! what it expects does any rank switch: install what it received, drop the optimizer
//! state of what it sent, and take the new table, all at the same step boundary.
//!
//! # All or nothing
//!
//! Nothing a rank holds changes before the vote: outgoing experts are copied, incoming
//! ones wait in staging buffers. A failure before or during the transfers (a model that
//! cannot give an expert, a peer that dies, a timeout, a count that does not match) is an
//! error on that rank, which leaves without voting; its peers then fail in a transfer or
//! in the vote (at once when the peer is gone, else within the communicator's timeout),
//! so every rank keeps the old table and the old weights. The vote is an all-reduce
//! (min) over the EP, DP and PP groups: a rank switches only when it learns that every
//! rank voted yes. (The one window this cannot close, as no commit protocol over
//! unreliable peers can, is a rank dying inside the vote's last exchange after voting
//! yes: survivors that completed the vote switch, others error; each still holds whole
//! experts, and the job is lost anyway.)
//!
//! # Overlap
//!
//! The calls are blocking. With non-blocking ones, block `l + 1`'s copy-out can overlap
//! block `l`'s transfer, and the transfers can overlap the next step's forward up to the
//! first block that moves, since the table switches only at the step boundary.

use halo::{Partition, ReduceOp};
use halo_moe::{Adam, AdamState, GroupId};

use crate::error::{PiperError, Result};
use crate::executor::{Executor, Placement, StageCompute};

/// What a move did on this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoveStats {
    /// Experts this rank sent.
    pub sent: usize,
    /// Experts this rank received.
    pub received: usize,
    /// Bytes this rank sent.
    pub sent_bytes: u64,
}

/// 32-bit words that carry one expert of `n` parameters: weights, gradients, `m`, `v`
/// (`n` each) and the Adam step count (2).
pub fn record_words(n: usize) -> usize {
    4 * n + 2
}

/// Bytes that move with one expert of `n` parameters: 16 per parameter (the resource
/// model's `expert_bytes`) and 8 for Adam's step count.
pub fn expert_move_bytes(n: usize) -> u64 {
    4 * record_words(n) as u64
}

/// A 64-bit hash of a table (FNV-1a over the owners), for the agreement check.
fn table_hash(p: &Placement) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        for b in x.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(p.ep() as u64);
    eat(p.experts() as u64);
    for l in 0..p.layers() {
        for &q in p.owners(l) {
            eat(q as u64);
        }
    }
    h
}

/// All-reduce over the EP, DP and PP groups (the whole mesh).
fn mesh_all_reduce(exec: &mut Executor, v: &mut [u64], op: ReduceOp) -> Result<()> {
    let mesh = exec.mesh_mut();
    if mesh.ep.size() > 1 {
        mesh.ep.all_reduce_in_place(v, op)?;
    }
    if let Some(dp) = mesh.dp.as_mut() {
        dp.all_reduce_in_place(v, op)?;
    }
    if mesh.pp.size() > 1 {
        mesh.pp.all_reduce_in_place(v, op)?;
    }
    Ok(())
}

fn failed(phase: impl Into<String>) -> impl FnOnce(PiperError) -> PiperError {
    let phase = phase.into();
    move |e| PiperError::Migration {
        phase,
        source: Box::new(e),
    }
}

/// An expert received, waiting for the vote.
struct Staged {
    id: GroupId,
    words: Vec<u32>,
}

/// Copies expert `id`'s weights, gradients and Adam state into `out`.
fn pack<C: StageCompute>(
    model: &mut C,
    adam: &Adam,
    id: GroupId,
    out: &mut Vec<u32>,
) -> Result<()> {
    let (p, g) = model.params_and_grads(id)?;
    let n = p.len();
    out.extend(p.iter().map(|x| x.to_bits()));
    out.extend(g.iter().map(|x| x.to_bits()));
    match adam.state(id) {
        Some(s) if s.m.len() == n && s.v.len() == n => {
            out.extend(s.m.iter().map(|x| x.to_bits()));
            out.extend(s.v.iter().map(|x| x.to_bits()));
            out.push(s.step as u32);
            out.push((s.step >> 32) as u32);
        }
        Some(_) => {
            return Err(PiperError::Compute(format!(
                "Adam state of {id} does not have the group's {n} elements"
            )));
        }
        // Not stepped yet: the state Adam would create.
        None => out.extend(std::iter::repeat_n(0u32, 2 * n + 2)),
    }
    Ok(())
}

/// Moves the experts whose owner differs between the executor's table and `new`, then
/// switches every rank to `new`. Collective over the whole mesh: every rank calls it with
/// the same `new`, between steps (after [`Executor::step`], before or after
/// [`Executor::adam_step`]: gradients move too).
///
/// # Errors
/// [`PiperError::Invalid`] when `new` has another shape than the executor's table, or
/// ranks were given different tables (on every rank); [`PiperError::Migration`] naming
/// the phase for any failure of the move (the model, the library, a peer). On any error
/// this rank keeps its old table, weights, gradients and optimizer state.
pub fn move_experts<C: StageCompute>(
    exec: &mut Executor,
    model: &mut C,
    adam: &mut Adam,
    new: &Placement,
) -> Result<MoveStats> {
    let old = exec.placement().clone();
    if (new.layers(), new.experts(), new.ep()) != (old.layers(), old.experts(), old.ep()) {
        return Err(PiperError::invalid(
            "placement",
            "shape",
            format!(
                "{} blocks x {} experts on EP {}, the executor has {} x {} on EP {}",
                new.layers(),
                new.experts(),
                new.ep(),
                old.layers(),
                old.experts(),
                old.ep()
            ),
        ));
    }
    let h = table_hash(new);
    let mut agree = [h, !h];
    mesh_all_reduce(exec, &mut agree, ReduceOp::Max).map_err(failed("agreeing on the table"))?;
    if agree[0] != h || !agree[1] != h {
        return Err(PiperError::invalid(
            "placement",
            "table",
            "the ranks of the mesh were given different tables",
        ));
    }
    let me = exec.mesh().ep_index();
    let ep = old.ep();
    let mut stats = MoveStats::default();
    let mut staged: Vec<Staged> = Vec::new();
    let mut outgoing: Vec<GroupId> = Vec::new();
    for layer in exec.layers() {
        let moving: Vec<usize> = (0..old.experts())
            .filter(|&e| old.owner(layer, e) != new.owner(layer, e))
            .collect();
        if moving.is_empty() {
            continue;
        }
        let id = |expert| GroupId::Expert { layer, expert };
        // The expert size, from one this rank holds (every rank holds E / EP of them).
        let mine = old.local(layer, me);
        let first = mine.first().copied().unwrap_or(moving[0]);
        let n = model
            .params_and_grads(id(first))
            .map_err(failed(format!("reading block {layer}")))?
            .0
            .len();
        let words = record_words(n);
        let mut send = Vec::new();
        let mut send_counts = vec![0usize; ep];
        let mut recv_counts = vec![0usize; ep];
        let mut incoming = Vec::new();
        // Send order: destinations ascending, each destination's experts by id; receive
        // order: sources ascending, each source's experts by id.
        for (q, count) in send_counts.iter_mut().enumerate() {
            for &e in &moving {
                if old.owner(layer, e) == me && new.owner(layer, e) == q {
                    pack(model, adam, id(e), &mut send)
                        .map_err(failed(format!("copying out expert {e} of block {layer}")))?;
                    *count += words;
                    outgoing.push(id(e));
                }
            }
        }
        for (q, count) in recv_counts.iter_mut().enumerate() {
            for &e in &moving {
                if old.owner(layer, e) == q && new.owner(layer, e) == me {
                    *count += words;
                    incoming.push(id(e));
                }
            }
        }
        if send.len() != send_counts.iter().sum::<usize>() {
            return Err(failed(format!("copying out block {layer}"))(
                PiperError::Compute("an expert's record has the wrong length".into()),
            ));
        }
        let mut recv = vec![0u32; recv_counts.iter().sum()];
        exec.mesh_mut()
            .ep
            .all_to_all_v(
                &send,
                &Partition::packed(&send_counts),
                &mut recv,
                &Partition::packed(&recv_counts),
            )
            .map_err(|e| failed(format!("transferring block {layer}"))(e.into()))?;
        stats.sent += send.len() / words;
        stats.sent_bytes += 4 * send.len() as u64;
        for (i, gid) in incoming.into_iter().enumerate() {
            // The model must take the expert at commit time: check it can now.
            let have = model
                .params_and_grads(gid)
                .map_err(failed(format!("checking block {layer}")))?
                .0
                .len();
            if have != n {
                return Err(failed(format!("checking block {layer}"))(
                    PiperError::Compute(format!("{gid} has {have} parameters, expected {n}")),
                ));
            }
            staged.push(Staged {
                id: gid,
                words: recv[i * words..(i + 1) * words].to_vec(),
            });
        }
    }
    // The vote: every rank got what it expects.
    let mut yes = [1u64];
    mesh_all_reduce(exec, &mut yes, ReduceOp::Min).map_err(failed("voting"))?;
    if yes[0] != 1 {
        return Err(failed("voting")(PiperError::Compute(
            "a rank voted against switching".into(),
        )));
    }
    // Commit.
    stats.received = staged.len();
    for s in staged {
        install(model, adam, s)?;
    }
    for id in outgoing {
        adam.take_state(id);
    }
    exec.set_placement(new.clone());
    Ok(stats)
}

/// Writes a received expert into the model and the optimizer.
fn install<C: StageCompute>(model: &mut C, adam: &mut Adam, s: Staged) -> Result<()> {
    let n = (s.words.len() - 2) / 4;
    let f = |r: &[u32]| r.iter().map(|&b| f32::from_bits(b)).collect::<Vec<f32>>();
    let w = &s.words;
    let (p, _) = model.params_and_grads(s.id).map_err(failed("installing"))?;
    for (d, &b) in p.iter_mut().zip(&w[..n]) {
        *d = f32::from_bits(b);
    }
    let g = model.grads_mut(s.id).map_err(failed("installing"))?;
    for (d, &b) in g.iter_mut().zip(&w[n..2 * n]) {
        *d = f32::from_bits(b);
    }
    let step = u64::from(w[4 * n]) | (u64::from(w[4 * n + 1]) << 32);
    adam.take_state(s.id);
    adam.insert_state(
        s.id,
        AdamState {
            m: f(&w[2 * n..3 * n]),
            v: f(&w[3 * n..4 * n]),
            step,
        },
    )
    .map_err(|e| failed("installing")(e.into()))?;
    Ok(())
}
