//! Configuration validation and bad input: every error names what was wrong.

mod common;

use common::micro;
use halo_moe::*;

fn field_of(err: MoeError) -> &'static str {
    match err {
        MoeError::InvalidConfig { field, .. } => field,
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[test]
fn presets_are_valid_and_sized_as_documented() {
    let tiny = MoeConfig::preset("tiny").unwrap();
    tiny.validate().unwrap();
    assert_eq!(
        (
            tiny.hidden,
            tiny.layers,
            tiny.experts,
            tiny.top_k,
            tiny.heads
        ),
        (64, 4, 8, 2, 4)
    );
    assert_eq!(
        (tiny.ffn, tiny.seq, tiny.vocab, tiny.expert_matrices),
        (128, 32, 64, 3)
    );
    assert_eq!(tiny.expert_kind(), ExpertKind::SwiGlu);
    let small = MoeConfig::preset("small").unwrap();
    small.validate().unwrap();
    assert_eq!(tiny.param_count(), 864_832);
    for cfg in [tiny, small, micro()] {
        let p = MoeParams::init(&cfg, 0).unwrap();
        assert_eq!(p.len(), cfg.param_count());
        assert_eq!(p.group_ids().len(), 2 + cfg.layers * (2 + cfg.experts));
    }
    assert_eq!(
        MoeConfig::preset("huge").unwrap_err(),
        MoeError::UnknownPreset("huge".into())
    );
}

#[test]
fn each_invalid_field_is_named() {
    type Edit = fn(&mut MoeConfig);
    let cases: [(&str, Edit); 12] = [
        ("vocab", |c| c.vocab = 0),
        ("seq", |c| c.seq = 0),
        ("hidden", |c| c.hidden = 0),
        ("heads", |c| c.heads = 0),
        ("heads", |c| c.heads = 3),
        ("layers", |c| c.layers = 0),
        ("experts", |c| c.experts = 0),
        ("top_k", |c| c.top_k = 0),
        ("top_k", |c| c.top_k = 9),
        ("ffn", |c| c.ffn = 0),
        ("expert_matrices", |c| c.expert_matrices = 4),
        ("norm_eps", |c| c.norm_eps = 0.0),
    ];
    for (field, edit) in cases {
        let mut c = MoeConfig::tiny();
        edit(&mut c);
        assert_eq!(field_of(c.validate().unwrap_err()), field);
        // Constructors and pieces refuse it too.
        assert_eq!(field_of(MoeParams::init(&c, 0).unwrap_err()), field);
    }
    let msg = {
        let mut c = MoeConfig::tiny();
        c.heads = 3;
        c.validate().unwrap_err().to_string()
    };
    assert!(msg.contains("`heads`") && msg.contains("64"), "{msg}");
}

#[test]
fn bad_buffers_name_the_argument() {
    let cfg = micro();
    let p = MoeParams::init(&cfg, 0).unwrap();
    let d = cfg.hidden;
    let rows = cfg.seq;

    // Tokens: not whole sequences, out of range.
    let err = embed_forward(&cfg, &p.embed, &[0; 5]).unwrap_err();
    assert!(
        matches!(
            err,
            MoeError::NotWholeSequences {
                what: "tokens",
                rows: 5,
                ..
            }
        ),
        "{err:?}"
    );
    let mut toks = vec![0u32; rows];
    toks[3] = cfg.vocab as u32;
    let err = embed_forward(&cfg, &p.embed, &toks).unwrap_err();
    assert_eq!(
        err,
        MoeError::TokenOutOfRange {
            what: "tokens",
            index: 3,
            token: cfg.vocab as u32,
            vocab: cfg.vocab
        }
    );

    // Dense: wrong width, partial sequence; backward with wrong gradient length.
    let err = dense_forward(&cfg, &p.layers[0].dense, &vec![0.0; rows * d + 1]).unwrap_err();
    assert!(matches!(err, MoeError::Shape { what: "x", .. }), "{err:?}");
    let err = dense_forward(&cfg, &p.layers[0].dense, &vec![0.0; (rows - 1) * d]).unwrap_err();
    assert!(
        matches!(err, MoeError::NotWholeSequences { what: "x", .. }),
        "{err:?}"
    );
    let x = common::rand_vec(1, rows * d, 1.0);
    let (_, saved) = dense_forward(&cfg, &p.layers[0].dense, &x).unwrap();
    let mut g = DenseParams::zeros(&cfg);
    let err = dense_backward(&cfg, &p.layers[0].dense, &saved, &x, &x[d..], &mut g).unwrap_err();
    assert_eq!(
        err,
        MoeError::Shape {
            what: "d_u",
            expected: rows * d,
            got: (rows - 1) * d
        }
    );

    // A group built for another shape.
    let other = MoeConfig::tiny();
    let err = expert_forward(&cfg, &ExpertParams::zeros(&other), &x).unwrap_err();
    assert!(
        matches!(err, MoeError::Mismatch(ref m) if m.contains("expert parameters")),
        "{err:?}"
    );
    let err = ExpertParams::from_vec(&cfg, vec![0.0; 3]).unwrap_err();
    assert!(matches!(
        err,
        MoeError::Shape {
            what: "expert parameters",
            got: 3,
            ..
        }
    ));

    // Combine and dispatch helpers.
    let err = combine_forward(&cfg, &x, &[0.0; 3], &[]).unwrap_err();
    assert!(
        matches!(err, MoeError::Shape { what: "gates", .. }),
        "{err:?}"
    );
    let err = gather_tokens(&x, d, cfg.top_k, &[rows * cfg.top_k]).unwrap_err();
    assert!(
        matches!(
            err,
            MoeError::Shape {
                what: "slots (token rows)",
                ..
            }
        ),
        "{err:?}"
    );
    let mut dst = vec![0.0; 2 * d];
    let err = scatter_slots(&x[..d], d, &[2], &mut dst).unwrap_err();
    assert!(
        matches!(err, MoeError::Shape { what: "slots", .. }),
        "{err:?}"
    );

    // Routing checks.
    let (mut ro, _) = router_forward(&cfg, &p.layers[0].router, &x).unwrap();
    check_routing(&cfg, &ro, rows).unwrap();
    ro.experts[5] = cfg.experts as u32;
    assert_eq!(
        check_routing(&cfg, &ro, rows).unwrap_err(),
        MoeError::ExpertOutOfRange {
            index: 5,
            expert: cfg.experts as u32,
            experts: cfg.experts
        }
    );

    // Head: normaliser and targets.
    let t = vec![0u32; rows];
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let err = head_loss_forward(&cfg, &p.head, &x, &t, bad).unwrap_err();
        assert!(matches!(err, MoeError::BadNormaliser(_)), "{err:?}");
    }
    let err = head_loss_forward(&cfg, &p.head, &x, &t[1..], 1.0).unwrap_err();
    assert!(
        matches!(
            err,
            MoeError::Shape {
                what: "targets",
                ..
            }
        ),
        "{err:?}"
    );

    // Whole model: mismatched targets, gradients of another shape, broken structure.
    let err = forward_backward(&p, &t, &t[1..], 1.0).unwrap_err();
    assert!(
        matches!(
            err,
            MoeError::Shape {
                what: "targets",
                ..
            }
        ),
        "{err:?}"
    );
    let mut wrong = MoeParams::zeros(&MoeConfig::tiny()).unwrap();
    let err = forward_backward_into(&p, &t, &t, 1.0, &mut wrong).unwrap_err();
    assert!(matches!(err, MoeError::Mismatch(_)), "{err:?}");
    let mut broken = p.clone();
    broken.layers[1].experts.pop();
    let err = forward_loss(&broken, &t, &t, 1.0).unwrap_err();
    assert!(
        matches!(err, MoeError::Mismatch(ref m) if m.contains("layer 1 has 3 experts")),
        "{err:?}"
    );
    assert_eq!(
        p.group(GroupId::Dense(7)).unwrap_err(),
        MoeError::NoSuchGroup("layer 7 dense".into())
    );
}
