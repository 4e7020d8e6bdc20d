//! `halo plan`, run as a program: JSON fields, values, and exit status 2 on bad input.

mod run_halo;

use run_halo::{halo, ok, stderr, stdout};
use std::path::PathBuf;

fn scratch(test: &str) -> PathBuf {
    run_halo::scratch("plan_cli", test)
}

#[track_caller]
fn json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(args)).expect("JSON output")
}

/// Runs `halo` expecting exit status `code`; returns stderr.
#[track_caller]
fn fails_with(code: i32, args: &[&str]) -> String {
    let o = halo(args);
    let err = stderr(&o);
    assert_eq!(
        o.status.code(),
        Some(code),
        "halo {args:?}\nstdout: {}\nstderr: {err}",
        stdout(&o)
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(stdout(&o).is_empty(), "nothing on stdout on failure");
    err
}

#[test]
fn params_of_the_weak_scaling_family() {
    for (e, total) in [
        ("16", 110_732_247_040u64),
        ("128", 862_369_873_920),
        ("256", 1_721_384_304_640),
    ] {
        let v = json(&[
            "plan",
            "params",
            "--model",
            &format!("piper-ws:{e}"),
            "--json",
        ]);
        assert_eq!(v["total"].as_u64(), Some(total), "{v}");
        assert_eq!(v["attention"].as_u64(), Some(3_355_443_200));
        let experts: u64 = e.parse::<u64>().unwrap() * 32 * 2 * 5120 * 20480;
        assert_eq!(v["experts"].as_u64(), Some(experts));
        assert_eq!(
            v["active"].as_u64(),
            Some(total - experts + 32 * 2 * 2 * 5120 * 20480)
        );
        assert_eq!(v["model"]["expert_matrices"].as_u64(), Some(2));
    }
    let text = ok(&["plan", "params", "--model", "mixtral-8x7b"]);
    assert!(
        text.contains("total") && text.contains("47,245,688,832") && text.contains("47.2B"),
        "{text}"
    );
}

#[test]
fn memory_per_stage() {
    let args = [
        "plan",
        "memory",
        "--model",
        "mixtral-8x7b",
        "--pp",
        "8",
        "--ep",
        "8",
        "--microbatches",
        "256",
        "--batch",
        "512",
        "--seq",
        "4096",
    ];
    let mut with_json = args.to_vec();
    with_json.push("--json");
    let v = json(&with_json);
    let stages = v["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 8);
    assert_eq!(stages[0]["stage"].as_u64(), Some(0));
    assert_eq!(stages[0]["bytes"].as_u64(), Some(34_663_825_408));
    assert_eq!(stages[7]["stage"].as_u64(), Some(7));
    let (m0, m7) = (
        stages[0]["bytes"].as_u64().unwrap(),
        stages[7]["bytes"].as_u64().unwrap(),
    );
    assert_eq!(v["skew"].as_u64(), Some(m0 - m7));
    assert!(v["m_u"].as_u64().unwrap() > v["m_edp"].as_u64().unwrap());
    assert!(v["m_edp"].as_u64().unwrap() > m0);
    assert_eq!(v["flash_attention"].as_bool(), Some(true));
    let text = ok(&args);
    assert!(
        text.contains("32.28") && text.contains("M_u") && text.contains("M_edp"),
        "{text}"
    );
    // Without FlashAttention stage 0 holds the s^2 score matrices.
    let mut plain = with_json.clone();
    plain.push("--no-flash-attention");
    let p = json(&plain);
    assert!(p["stages"][0]["bytes"].as_u64().unwrap() > 100 * (1u64 << 30));
}

#[test]
fn migration_cost() {
    let v = json(&[
        "plan",
        "migration",
        "--model",
        "mixtral-8x7b",
        "--group",
        "4",
        "--bandwidth",
        "25e9",
        "--json",
    ]);
    assert_eq!(v["expert_bytes"].as_u64(), Some(48 * 4096 * 14336));
    assert_eq!(v["per_gpu_bytes"].as_u64(), Some(48 * 8 * 4096 * 14336 / 4));
    let seconds = v["seconds"].as_f64().unwrap();
    assert!(
        (seconds - (48.0 * 8.0 * 4096.0 * 14336.0 / 4.0) / 25e9).abs() < 1e-12,
        "{seconds}"
    );
    let text = ok(&[
        "plan",
        "migration",
        "--model",
        "piper-ws:16",
        "--group",
        "16",
        "--bandwidth",
        "1e9",
    ]);
    assert!(
        text.contains("16 bytes x 2 x d x d_ffn") && text.contains("3,355,443,200"),
        "{text}"
    );
}

#[test]
fn layout_of_mixtral_on_8_frontier_nodes() {
    let v = json(&[
        "plan",
        "layout",
        "--model",
        "mixtral-8x7b",
        "--topology",
        "frontier:8",
        "--batch",
        "512",
        "--seq",
        "4096",
        "--top",
        "100",
        "--json",
    ]);
    let layouts = v["layouts"].as_array().unwrap();
    assert!(!layouts.is_empty());
    let mut last = f64::INFINITY;
    for l in layouts {
        let f = |k: &str| l[k].as_u64().unwrap_or_else(|| panic!("{k} in {l}"));
        let (pp, ep, dp, mbs) = (f("pp"), f("ep"), f("dp"), f("microbatches"));
        assert_eq!(pp * ep * dp, 64);
        assert_eq!(8 % ep, 0);
        assert!(mbs >= pp && (512 / dp) % mbs == 0);
        assert!(f("stage0_bytes") <= 64 << 30);
        let mfu = l["mfu"].as_f64().unwrap();
        assert!(mfu > 0.0 && mfu <= last, "ranked by MFU");
        last = mfu;
    }
    let rejected = v["rejected"].as_array().unwrap();
    assert_eq!(layouts.len() + rejected.len(), 28);
    assert!(rejected.iter().any(|r| r["constraint"] == "EP divides E"));
    assert!(
        rejected
            .iter()
            .any(|r| r["constraint"] == "M(i) <= GPU memory")
    );
    // --top limits the rows.
    let top = json(&[
        "plan",
        "layout",
        "--model",
        "mixtral-8x7b",
        "--topology",
        "frontier:8",
        "--batch",
        "512",
        "--seq",
        "4096",
        "--top",
        "3",
        "--json",
    ]);
    assert_eq!(top["layouts"].as_array().unwrap().len(), 3);
    assert_eq!(top["layouts"][0], layouts[0]);
    let text = ok(&[
        "plan",
        "layout",
        "--model",
        "mixtral-8x7b",
        "--topology",
        "frontier:8",
        "--batch",
        "512",
        "--seq",
        "4096",
    ]);
    assert!(
        text.contains("MFU") && text.contains("Rejected families"),
        "{text}"
    );
}

#[test]
fn glam_on_one_node_does_not_fit() {
    let err = fails_with(
        1,
        &[
            "plan",
            "layout",
            "--model",
            "glam",
            "--topology",
            "frontier:1",
            "--batch",
            "512",
            "--seq",
            "4096",
        ],
    );
    assert!(
        err.contains("error: glam does not fit on frontier:1"),
        "{err}"
    );
    assert!(
        err.contains("the smallest machine of this kind that fits is frontier:220"),
        "{err}"
    );
}

#[test]
fn bad_input_exits_2_naming_the_field() {
    let dir = scratch("bad_input");
    let malformed = dir.join("broken.toml");
    std::fs::write(&malformed, "layers = [\n").unwrap();
    let negative = dir.join("negative.json");
    std::fs::write(
        &negative,
        r#"{"layers": 4, "hidden": -64, "heads": 4, "experts": 4, "top_k": 2, "expert_ffn": 128}"#,
    )
    .unwrap();
    let (malformed, negative) = (malformed.to_str().unwrap(), negative.to_str().unwrap());
    let mem = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut v = vec![
            "plan",
            "memory",
            "--model",
            "mixtral-8x7b",
            "--pp",
            "8",
            "--ep",
            "8",
            "--microbatches",
            "256",
            "--batch",
            "512",
            "--seq",
            "4096",
        ];
        for pair in extra.chunks(2) {
            let i = v.iter().position(|a| *a == pair[0]).unwrap();
            v[i + 1] = pair[1];
        }
        v
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["plan", "params", "--model", "mixtral-9x9b"],
            "unknown model preset 'mixtral-9x9b'",
        ),
        (vec!["plan", "params", "--model", "piper-ws:0"], "experts"),
        (
            vec!["plan", "params", "--model", malformed],
            "cannot parse model file",
        ),
        (
            vec!["plan", "params", "--model", negative],
            "hidden: must be a positive integer, got -64",
        ),
        (
            vec!["plan", "params", "--model", "/nonexistent/m.toml"],
            "cannot read model file",
        ),
        (mem(&["--pp", "0"]), "--pp"),
        (mem(&["--pp", "-3"]), "got -3"),
        (
            mem(&["--ep", "3"]),
            "ep: EP 3 does not divide the 8 experts",
        ),
        (
            mem(&["--pp", "64"]),
            "pp: 64 stages is more than the model's 32 layers",
        ),
        (mem(&["--batch", "0"]), "--batch"),
        (mem(&["--seq", "abc"]), "--seq"),
        (mem(&["--microbatches", "3"]), "microbatches"),
        (
            vec![
                "plan",
                "migration",
                "--model",
                "mixtral-8x7b",
                "--group",
                "3",
                "--bandwidth",
                "25e9",
            ],
            "group: a group of 3 GPUs does not divide the 8 experts",
        ),
        (
            vec![
                "plan",
                "migration",
                "--model",
                "mixtral-8x7b",
                "--group",
                "8",
                "--bandwidth",
                "-1",
            ],
            "--bandwidth",
        ),
        (
            vec![
                "plan",
                "layout",
                "--model",
                "mixtral-8x7b",
                "--topology",
                "frontier:0",
                "--batch",
                "8",
                "--seq",
                "8",
            ],
            "frontier:0",
        ),
        (
            vec![
                "plan",
                "layout",
                "--model",
                "mixtral-8x7b",
                "--topology",
                "frontier:1",
                "--batch",
                "8",
                "--seq",
                "8",
                "--profile",
                "a100",
            ],
            "unknown profile preset 'a100'",
        ),
        (
            vec![
                "plan",
                "layout",
                "--model",
                "mixtral-8x7b",
                "--topology",
                "frontier:1",
                "--batch",
                "-8",
                "--seq",
                "8",
            ],
            "--batch",
        ),
        (
            vec![
                "plan",
                "layout",
                "--model",
                "mixtral-8x7b",
                "--topology",
                "frontier:1",
                "--batch",
                "8",
            ],
            "--seq",
        ),
    ];
    for (args, needle) in cases {
        let err = fails_with(2, &args);
        assert!(
            err.contains(needle),
            "halo {args:?}: expected '{needle}' in\n{err}"
        );
    }
}
