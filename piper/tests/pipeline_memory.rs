//! The executor's measured activation memory against the resource model's M(i).
//!
//! For several PP x EP layouts and micro-batch counts, one step of `halo-moe`'s `tiny`
//! model on threads; every rank reports its peak of saved forward state
//! ([`halo_piper::ActivationPeak`]). Checked exactly: the micro-batches in flight at the
//! peak are 1F1B's `min(PP - i, M)` on every stage `i`, the count M(i) assumes. Printed
//! (`cargo test -p halo-piper --release --test pipeline_memory -- --nocapture`, the table
//! of docs/PIPELINE.md): the measured bytes per stage against M(i)'s activation term,
//! read literally (attention of the whole micro-batch on every GPU of the stage) and per
//! GPU (attention of the GPU's own sequences), both in f32 (the model's equations count
//! 2-byte values; the reference model keeps f32). Checked loosely: the per-GPU reading is
//! within a factor 2 of the measurement on every stage.

use halo::local::{self, Emulation};
use halo::topology::Topology;
use halo_moe::{MoeConfig, MoeParams, Task, TaskConfig};
use halo_piper::resource::{self, MemoryOptions};
use halo_piper::{ActivationPeak, Executor, MeshLayout, ModelConfig, ReferenceModel};

const SEQUENCES: usize = 32;

/// Stage and peak of every rank after one step.
fn measure(layout: MeshLayout, m: usize) -> Vec<(usize, ActivationPeak)> {
    let cfg = MoeConfig::tiny();
    let task = Task::new(&cfg, TaskConfig::default()).unwrap();
    let batch = task.batch(0, SEQUENCES);
    let topo = Topology::preset(&format!("flat:{}", layout.ranks())).unwrap();
    local::run(&topo, Emulation::off(), |world| {
        let mut model = ReferenceModel::new(MoeParams::init(&cfg, 1).unwrap()).unwrap();
        let mut exec = Executor::new(world, layout, m, &model).unwrap();
        let r = exec
            .step(&mut model, &batch.tokens, &batch.targets)
            .unwrap();
        Ok((exec.mesh().stage(), r.activations))
    })
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

#[test]
fn activation_peaks_follow_1f1b_and_the_resource_model() {
    let cfg = MoeConfig::tiny();
    let model = ModelConfig::from(&cfg);
    let opt = MemoryOptions {
        flash_attention: false,
        checkpointing: false,
    };
    let s = cfg.seq as f64;
    println!(
        "| PP x EP | M | stage | in flight (measured / 1F1B) | measured KiB | M(i) literal KiB | \
         M(i) per GPU KiB | measured / per GPU |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (pp, ep, m) in [
        (2, 1, 4),
        (2, 1, 8),
        (4, 1, 8),
        (2, 4, 8),
        (4, 2, 4),
        (2, 2, 1),
    ] {
        let layout = MeshLayout { pp, ep, dp: 1 };
        let peaks = measure(layout, m);
        let mb = (SEQUENCES / m) as f64; // sequences per micro-batch of the EP group
        for stage in 0..pp {
            let on_stage: Vec<&ActivationPeak> = peaks
                .iter()
                .filter(|(st, _)| *st == stage)
                .map(|(_, p)| p)
                .collect();
            let expected = (pp - stage).min(m);
            for p in &on_stage {
                assert_eq!(
                    p.in_flight, expected,
                    "PP {pp} x EP {ep}, M {m}: stage {stage} held {} micro-batches at its peak",
                    p.in_flight
                );
            }
            let measured =
                on_stage.iter().map(|p| p.bytes as f64).sum::<f64>() / on_stage.len() as f64;
            let layers = resource::stage_layers(model.layers, pp as u64, stage as u64) as f64;
            let held = expected as f64;
            // f32: twice the equations' 2-byte values.
            let literal = 2.0
                * layers
                * held
                * resource::stored_activation_bytes(&model, mb, s, ep as u64, opt);
            let per_gpu = 2.0
                * layers
                * held
                * (resource::attention_activation_bytes(&model, mb / ep as f64, s, opt)
                    + resource::expert_activation_bytes(&model, mb, s, ep as u64));
            let ratio = measured / per_gpu;
            println!(
                "| {pp} x {ep} | {m} | {stage} | {expected} / {expected} | {:.1} | {:.1} | {:.1} | {ratio:.2} |",
                measured / 1024.0,
                literal / 1024.0,
                per_gpu / 1024.0
            );
            assert!(
                (0.5..=2.0).contains(&ratio),
                "PP {pp} x EP {ep}, M {m}, stage {stage}: measured {measured} B vs {per_gpu} B"
            );
        }
    }
}
