//! Trains a preset on the synthetic task on one rank and prints the loss curve.
//!
//! `cargo run --release -p halo-moe --example train -- [tiny|small] [steps] [batch] [lr] [skew]`

use std::time::Instant;

use halo_moe::{Adam, AdamConfig, MoeConfig, MoeParams, Task, TaskConfig, forward_backward};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let preset = args.first().map_or("tiny", String::as_str);
    let steps: u64 = args.get(1).map_or(Ok(100), |s| s.parse())?;
    let batch: usize = args.get(2).map_or(Ok(4), |s| s.parse())?;
    let lr: f32 = args.get(3).map_or(Ok(3e-3), |s| s.parse())?;
    let skew: f64 = args.get(4).map_or(Ok(0.0), |s| s.parse())?;

    let cfg = MoeConfig::preset(preset)?;
    let mut params = MoeParams::init(&cfg, 1)?;
    let task = Task::new(
        &cfg,
        TaskConfig {
            skew,
            ..TaskConfig::default()
        },
    )?;
    let mut adam = Adam::new(AdamConfig {
        lr,
        ..AdamConfig::default()
    })?;
    println!(
        "{preset}: {} parameters, batch {batch} x {} tokens, lr {lr}",
        cfg.param_count(),
        cfg.seq
    );
    let start = Instant::now();
    for step in 0..=steps {
        let b = task.batch(step, batch);
        let n = b.tokens.len() as f32;
        let (loss, grads) = forward_backward(&params, &b.tokens, &b.targets, n)?;
        if step % 10 == 0 {
            println!(
                "step {step:4}  loss {loss:.4}  {:.2} s",
                start.elapsed().as_secs_f64()
            );
        }
        if step < steps {
            adam.step(&mut params, &grads)?;
        }
    }
    Ok(())
}
