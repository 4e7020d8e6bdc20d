//! Adam (update rule, per-group state that can move) and the synthetic task.

mod common;

use common::micro;
use halo_moe::*;

#[test]
fn adam_matches_the_formula_for_two_steps() {
    let c = AdamConfig {
        lr: 0.1,
        beta1: 0.8,
        beta2: 0.9,
        eps: 1e-3,
        weight_decay: 0.5,
    };
    let mut adam = Adam::new(c.clone()).unwrap();
    let id = GroupId::Router(0);
    let mut w = vec![1.0f32, -2.0];
    let grads = [[0.5f32, -1.0], [0.25, 3.0]];
    // Reference in f64.
    let mut rw = [1.0f64, -2.0];
    let (mut m, mut v) = ([0.0f64; 2], [0.0f64; 2]);
    for (t, g) in grads.iter().enumerate() {
        adam.step_group(id, &mut w, g).unwrap();
        let t = (t + 1) as i32;
        for i in 0..2 {
            let gi = f64::from(g[i]);
            m[i] = 0.8 * m[i] + 0.2 * gi;
            v[i] = 0.9 * v[i] + 0.1 * gi * gi;
            let mh = m[i] / (1.0 - 0.8f64.powi(t));
            let vh = v[i] / (1.0 - 0.9f64.powi(t));
            rw[i] -= 0.1 * (mh / (vh.sqrt() + 1e-3)) + 0.1 * 0.5 * rw[i];
        }
        for i in 0..2 {
            assert!(
                (f64::from(w[i]) - rw[i]).abs() < 1e-6,
                "step {t} element {i}: {} vs {}",
                w[i],
                rw[i]
            );
        }
    }
    assert_eq!(adam.state(id).unwrap().step, 2);
    // First step of plain Adam moves each weight by lr against the gradient's sign.
    let mut a2 = Adam::new(AdamConfig::default()).unwrap();
    let mut w2 = vec![0.0f32; 3];
    a2.step_group(GroupId::Head, &mut w2, &[2.0, -0.5, 0.0])
        .unwrap();
    assert!((w2[0] + 1e-3).abs() < 1e-9 && (w2[1] - 1e-3).abs() < 1e-9 && w2[2] == 0.0);
}

#[test]
fn adam_rejects_bad_settings_and_lengths() {
    let field = |c: AdamConfig| match Adam::new(c).unwrap_err() {
        MoeError::InvalidConfig { field, .. } => field,
        e => panic!("{e:?}"),
    };
    let d = AdamConfig::default;
    assert_eq!(field(AdamConfig { lr: 0.0, ..d() }), "lr");
    assert_eq!(field(AdamConfig { beta1: 1.0, ..d() }), "beta1");
    assert_eq!(field(AdamConfig { beta2: -0.1, ..d() }), "beta2");
    assert_eq!(field(AdamConfig { eps: 0.0, ..d() }), "eps");
    assert_eq!(
        field(AdamConfig {
            weight_decay: -1.0,
            ..d()
        }),
        "weight_decay"
    );
    let mut adam = Adam::new(d()).unwrap();
    let err = adam
        .step_group(GroupId::Embed, &mut [0.0; 3], &[0.0; 2])
        .unwrap_err();
    assert!(matches!(
        err,
        MoeError::Shape {
            what: "gradients",
            ..
        }
    ));
    adam.step_group(GroupId::Embed, &mut [0.0; 3], &[1.0; 3])
        .unwrap();
    let err = adam
        .step_group(GroupId::Embed, &mut [0.0; 4], &[1.0; 4])
        .unwrap_err();
    assert!(matches!(err, MoeError::OptimizerState { .. }), "{err:?}");
}

/// Moving an expert (weights + Adam state) to another optimizer instance continues exactly
/// as if it had stayed.
#[test]
fn expert_state_migrates_with_the_expert() {
    let cfg = micro();
    let id = GroupId::Expert {
        layer: 1,
        expert: 2,
    };
    let params = MoeParams::init(&cfg, 3).unwrap();
    let g1 = common::rand_vec(1, cfg.expert_len(), 0.1);
    let g2 = common::rand_vec(2, cfg.expert_len(), 0.1);
    let c = AdamConfig {
        lr: 1e-2,
        ..AdamConfig::default()
    };

    let mut stay = Adam::new(c.clone()).unwrap();
    let mut w = params.group(id).unwrap().to_vec();
    stay.step_group(id, &mut w, &g1).unwrap();
    stay.step_group(id, &mut w, &g2).unwrap();

    let mut a = Adam::new(c.clone()).unwrap();
    let mut b = Adam::new(c).unwrap();
    let mut w_mig = params.group(id).unwrap().to_vec();
    a.step_group(id, &mut w_mig, &g1).unwrap();
    let state = a.take_state(id).unwrap();
    assert!(a.state(id).is_none() && a.groups().is_empty());
    let moved = ExpertParams::from_vec(&cfg, w_mig).unwrap();
    b.insert_state(id, state.clone()).unwrap();
    assert!(matches!(
        b.insert_state(id, state),
        Err(MoeError::OptimizerState { .. })
    ));
    let mut w_mig = moved.into_vec();
    b.step_group(id, &mut w_mig, &g2).unwrap();
    assert_eq!(w, w_mig);
    assert_eq!(b.state(id), stay.state(id));
}

#[test]
fn task_batches_depend_on_seed_step_and_index_only() {
    let cfg = MoeConfig::tiny();
    let task = Task::new(&cfg, TaskConfig::default()).unwrap();
    let full = task.batch(7, 6);
    assert_eq!(full.sequences, 6);
    assert_eq!(full.tokens.len(), 6 * cfg.seq);
    // Any slice, generated alone, is the same slice of the whole batch.
    let part = task.batch_part(7, 2..5);
    assert_eq!(part.tokens, full.tokens[2 * cfg.seq..5 * cfg.seq]);
    assert_eq!(part.targets, full.targets[2 * cfg.seq..5 * cfg.seq]);
    // A larger global batch extends it; another step or seed changes it.
    assert_eq!(task.batch(7, 8).tokens[..6 * cfg.seq], full.tokens[..]);
    assert_ne!(task.batch(8, 6).tokens, full.tokens);
    let other = Task::new(
        &cfg,
        TaskConfig {
            seed: 1,
            ..TaskConfig::default()
        },
    )
    .unwrap();
    assert_ne!(other.batch(7, 6).tokens, full.tokens);
    // Targets are the chain's next tokens, and a chain is a function of its first token.
    for s in 0..6 {
        let tk = &full.tokens[s * cfg.seq..(s + 1) * cfg.seq];
        let tg = &full.targets[s * cfg.seq..(s + 1) * cfg.seq];
        assert_eq!(tk[1..], tg[..cfg.seq - 1]);
        assert!(tk.iter().chain(tg).all(|&t| (t as usize) < cfg.vocab));
    }
    let mut first: std::collections::HashMap<u32, Vec<u32>> = Default::default();
    for step in 0..50 {
        let b = task.batch(step, 4);
        for s in 0..4 {
            let tk = b.tokens[s * cfg.seq..(s + 1) * cfg.seq].to_vec();
            let prev = first.entry(tk[0]).or_insert_with(|| tk.clone());
            assert_eq!(*prev, tk, "two chains from the same first token differ");
        }
    }
}

#[test]
fn skew_concentrates_tokens_and_bad_task_settings_are_named() {
    let cfg = MoeConfig::tiny();
    let top_share = |skew: f64| {
        let task = Task::new(
            &cfg,
            TaskConfig {
                skew,
                ..TaskConfig::default()
            },
        )
        .unwrap();
        let mut count = vec![0usize; cfg.vocab];
        let b = task.batch(0, 64);
        for &t in &b.tokens {
            count[t as usize] += 1;
        }
        *count.iter().max().unwrap() as f64 / b.tokens.len() as f64
    };
    let uniform = top_share(0.0);
    let skewed = top_share(1.5);
    assert!(
        uniform < 0.05,
        "uniform task: top token has share {uniform}"
    );
    assert!(skewed > 0.2, "skewed task: top token has share {skewed}");
    let field = |c: TaskConfig| match Task::new(&cfg, c).unwrap_err() {
        MoeError::InvalidConfig { field, .. } => field,
        e => panic!("{e:?}"),
    };
    assert_eq!(
        field(TaskConfig {
            classes: 0,
            ..TaskConfig::default()
        }),
        "classes"
    );
    assert_eq!(
        field(TaskConfig {
            skew: -1.0,
            ..TaskConfig::default()
        }),
        "skew"
    );
    assert_eq!(
        field(TaskConfig {
            skew: f64::NAN,
            ..TaskConfig::default()
        }),
        "skew"
    );
}

#[test]
fn skewed_task_skews_expert_load() {
    // Not a property the model guarantees, but what the skew option is for: with skewed
    // tokens the most loaded expert of an untrained tiny model gets clearly more than 1/E.
    let cfg = MoeConfig::tiny();
    let params = MoeParams::init(&cfg, 1).unwrap();
    let task = Task::new(
        &cfg,
        TaskConfig {
            skew: 1.5,
            ..TaskConfig::default()
        },
    )
    .unwrap();
    let b = task.batch(0, 8);
    let (_, routings) = forward_loss_routed(&params, &b.tokens, &b.targets, 1.0).unwrap();
    let counts = routings[0].counts(cfg.experts);
    let total: usize = counts.iter().sum();
    assert_eq!(total, b.tokens.len() * cfg.top_k);
    let max = *counts.iter().max().unwrap() as f64 / total as f64;
    assert!(max > 1.5 / cfg.experts as f64, "expert loads {counts:?}");
}
