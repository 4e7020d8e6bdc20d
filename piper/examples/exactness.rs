//! One training step of the Piper executor as the processes of a job, checked against the
//! single-rank reference on every rank.
//!
//! ```text
//! halo launch -n 8 -- target/debug/examples/exactness PP EP DP M
//! ```
//!
//! Every rank bootstraps from the launcher's environment, runs one step of `halo-moe`'s
//! `tiny` model (sequences of 16 tokens, 16 sequences, seed 7) over the PP x EP x DP mesh
//! with M micro-batches, then computes the whole step alone
//! (`halo_moe::forward_backward`) and compares: the loss and every gradient group it owns,
//! relative error max|a - b| / max|b| at most 1e-5. It prints one line per rank
//! (`bitwise` where the bits agree) and exits with status 1 on a mismatch, 2 on bad
//! arguments, 3 on an error of the step.

use halo::Communicator;
use halo_moe::{GroupId, MoeConfig, MoeParams, Task, TaskConfig};
use halo_piper::{Executor, MeshLayout, PiperError, ReferenceModel};
use std::process::ExitCode;

const SEED: u64 = 7;
const SEQUENCES: usize = 16;
const TOLERANCE: f64 = 1e-5;

/// max|a - b| / max|b| (0 when equal).
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from((x - y).abs()))
        .fold(0.0, f64::max);
    let scale = b.iter().map(|y| f64::from(y.abs())).fold(0.0, f64::max);
    if diff == 0.0 { 0.0 } else { diff / scale }
}

/// Each owned parameter group's gradients.
type Grads = Vec<(GroupId, Vec<f32>)>;

/// The step on this rank; returns the loss and its groups' gradients.
fn step(
    world: &mut Communicator,
    cfg: &MoeConfig,
    layout: MeshLayout,
    m: usize,
) -> Result<(f64, Grads), PiperError> {
    let task = Task::new(cfg, TaskConfig::default())?;
    let batch = task.batch(0, SEQUENCES);
    let mut model = ReferenceModel::new(MoeParams::init(cfg, SEED)?)?;
    let mut exec = Executor::new(world, layout, m, &model)?;
    let report = exec.step(&mut model, &batch.tokens, &batch.targets)?;
    let grads = exec
        .owned_groups()
        .into_iter()
        .map(|id| Ok((id, model.grads().group(id)?.to_vec())))
        .collect::<Result<Vec<_>, PiperError>>()?;
    Ok((report.loss, grads))
}

fn main() -> ExitCode {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let [pp, ep, dp, m] = args[..] else {
        eprintln!("usage: exactness PP EP DP M (four positive integers)");
        return ExitCode::from(2);
    };
    let layout = MeshLayout { pp, ep, dp };
    let cfg = MoeConfig {
        seq: 16,
        ..MoeConfig::tiny()
    };
    let mut world = match Communicator::init_from_env() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("exactness: {e}");
            return ExitCode::from(3);
        }
    };
    let rank = world.rank();
    let (loss, grads) = match step(&mut world, &cfg, layout, m) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("exactness: rank {rank}: {e}");
            return ExitCode::from(3);
        }
    };
    // The single-rank reference of the same step.
    let task = Task::new(&cfg, TaskConfig::default()).expect("the tiny task");
    let batch = task.batch(0, SEQUENCES);
    let params = MoeParams::init(&cfg, SEED).expect("tiny parameters");
    let n = batch.tokens.len() as f32;
    let (ref_loss, ref_grads) =
        halo_moe::forward_backward(&params, &batch.tokens, &batch.targets, n)
            .expect("the reference step");
    let loss_err = (loss - ref_loss).abs() / ref_loss.abs();
    let mut worst = 0.0f64;
    let mut bitwise = loss == ref_loss;
    for (id, g) in &grads {
        let r = ref_grads.group(*id).expect("a group of the model");
        worst = worst.max(rel_err(g, r));
        bitwise &= g.as_slice() == r;
    }
    let ok = loss_err <= TOLERANCE && worst <= TOLERANCE;
    println!(
        "exactness: rank {rank} of PP {pp} x EP {ep} x DP {dp}, M {m}: loss {loss:.6} vs {ref_loss:.6} \
         ({loss_err:.1e}), {} gradient groups, max relative error {worst:.1e}{}: {}",
        grads.len(),
        if bitwise { " (bitwise)" } else { "" },
        if ok { "ok" } else { "MISMATCH" }
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
