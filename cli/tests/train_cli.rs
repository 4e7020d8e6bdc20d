//! `halo train`, run as a program: the default run (tiny, PP 2 x EP 4, 8 micro-batches,
//! 100 steps) halves its loss; bad layouts exit with status 2 naming the numbers.

mod run_halo;

use run_halo::{halo, stderr};

#[test]
fn the_default_run_halves_its_loss() {
    let o = halo(&["train", "--json"]);
    assert!(o.status.success(), "{:?}\n{}", o.status, stderr(&o));
    let out = String::from_utf8(o.stdout).expect("UTF-8 stdout");
    let steps: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(steps.len(), 100, "one line per step of the default run");
    let losses: Vec<f64> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            assert_eq!(s["step"].as_u64(), Some(i as u64 + 1));
            assert_eq!(
                s["tokens"].as_u64(),
                Some(32 * 32),
                "32 sequences of 32 tokens"
            );
            assert!(s["tokens_per_s"].as_f64().unwrap() > 0.0);
            for k in ["compute_s", "all_to_all_s", "p2p_s", "all_reduce_s"] {
                assert!(s[k].as_f64().is_some_and(|v| v >= 0.0), "{k} in {s}");
            }
            assert!(s["all_to_all_s"].as_f64().unwrap() > 0.0, "EP 4 dispatches");
            let l = s["loss"].as_f64().expect("a loss field");
            assert!(l.is_finite());
            l
        })
        .collect();
    let first = losses[0];
    // The last three steps' mean: single batches are noisy.
    let last = losses[97..].iter().sum::<f64>() / 3.0;
    eprintln!("halo train: loss {first:.4} -> {last:.4}");
    assert!(
        first > 0.9 * 64f64.ln(),
        "first loss {first} is not near ln V"
    );
    assert!(
        last < 0.5 * first,
        "loss fell from {first} to {last}, not by half"
    );
}

#[test]
fn bad_layouts_exit_2_naming_the_numbers() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["train", "--pp", "3", "--ep", "1", "--topology", "flat:8"],
            "layout PP 3 x EP 1 x DP 1 needs 3 ranks, but the world communicator has 8",
        ),
        (
            &["train", "--pp", "2", "--ep", "3"],
            "EP 3 does not divide the 8 experts of each block",
        ),
        (
            &["train", "--pp", "8", "--ep", "1"],
            "PP 8 exceeds the model's 4 blocks",
        ),
        (
            &["train", "--batch", "6"],
            "the global batch of 6 sequences does not split into EP 4 x DP 1 x 8 micro-batches",
        ),
    ];
    for (args, want) in cases {
        let o = halo(args);
        assert_eq!(o.status.code(), Some(2), "halo {args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains(want),
            "halo {args:?}: stderr {err:?} lacks {want:?}"
        );
    }
}
