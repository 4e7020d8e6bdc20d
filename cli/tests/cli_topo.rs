//! `halo topo`, run as a program.

use halo_topology::Topology;
mod run_halo;

use run_halo::{fails_with, ok, stderr, stdout};
use std::path::PathBuf;
use std::process::Command;

fn fails_with_2(args: &[&str]) -> String {
    fails_with(2, args)
}

fn scratch(test: &str) -> PathBuf {
    run_halo::scratch("cli_topo", test)
}

#[test]
fn preset_prints_tree_and_summary() {
    let out = ok(&["topo", "--preset", "frontier:16"]);
    let t = Topology::preset("frontier:16").unwrap();
    assert!(
        out.starts_with("Topology frontier:16 (128 ranks)\n"),
        "{out}"
    );
    assert!(out.contains("\nLevels (outermost first):\n"), "{out}");
    for line in t.summary().lines() {
        assert!(
            out.contains(line),
            "missing summary line {line:?} in\n{out}"
        );
    }
    assert!(out.contains("taper 1.75:1"), "{out}");
    // Default: 4 children per domain.
    assert!(out.contains(&t.render_tree(4)), "{out}");
}

#[test]
fn max_children_limits_the_tree() {
    let out = ok(&["topo", "--preset", "frontier:16", "--max-children", "1"]);
    assert!(out.contains("... 3 more switches"), "{out}");
    assert!(
        out.contains(&Topology::preset("frontier:16").unwrap().render_tree(1)),
        "{out}"
    );
}

#[test]
fn preset_json_loads_back() {
    let out = ok(&["topo", "--preset", "frontier:16", "--json"]);
    let path = scratch("json").join("frontier16.json");
    std::fs::write(&path, &out).unwrap();
    assert_eq!(
        Topology::load(&path).unwrap(),
        Topology::preset("frontier:16").unwrap()
    );
}

#[test]
fn preset_toml_loads_back() {
    let out = ok(&["topo", "--preset", "nodes:3x5,ranks=13", "--toml"]);
    let path = scratch("toml").join("nodes.toml");
    std::fs::write(&path, &out).unwrap();
    assert_eq!(
        Topology::load(&path).unwrap(),
        Topology::preset("nodes:3x5,ranks=13").unwrap()
    );
}

#[test]
fn file_is_printed_and_converted() {
    let dir = scratch("file");
    let path = dir.join("dgx.toml");
    let t = Topology::preset("dgx-h100:2").unwrap();
    std::fs::write(&path, t.to_spec().to_toml_string()).unwrap();
    let out = ok(&["topo", "--file", path.to_str().unwrap()]);
    assert!(out.starts_with("Topology dgx-h100:2 (16 ranks)\n"), "{out}");
    for line in t.summary().lines() {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    let json = ok(&["topo", "--file", path.to_str().unwrap(), "--json"]);
    let back = dir.join("dgx.json");
    std::fs::write(&back, json).unwrap();
    assert_eq!(Topology::load(&back).unwrap(), t);
}

#[test]
fn bad_preset_exits_2_with_the_message() {
    let err = fails_with_2(&["topo", "--preset", "nodes:4"]);
    assert!(err.starts_with("error: bad preset 'nodes:4': "), "{err}");
    assert!(err.contains("HxR"), "{err}");
    let err = fails_with_2(&["topo", "--preset", "warp:9"]);
    assert!(err.contains("unknown preset 'warp'"), "{err}");
    let err = fails_with_2(&["topo", "--preset", "nodes:16777216x16777216"]);
    assert!(err.contains("more than 16,777,216 ranks"), "{err}");
}

#[test]
fn malformed_file_exits_2_naming_the_field() {
    let dir = scratch("malformed");
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        "[links]\ndevice = { bandwidth = 1.0e10, latency = 0.0 }\n\
         system = { bandwidth = -1.0, latency = 0.0 }\n\n[[ranks]]\nrank = 0\n",
    )
    .unwrap();
    let err = fails_with_2(&["topo", "--file", path.to_str().unwrap()]);
    assert!(
        err.starts_with("error: invalid topology: links.system.bandwidth: "),
        "{err}"
    );

    let gap = dir.join("gap.toml");
    std::fs::write(
        &gap,
        "[links]\ndevice = { bandwidth = 1.0e10, latency = 0.0 }\n\
         system = { bandwidth = 1.0e9, latency = 0.0 }\n\n\
         [[ranks]]\nrank = 0\n\n[[ranks]]\nrank = 1\n\n[[ranks]]\nrank = 3\n",
    )
    .unwrap();
    let err = fails_with_2(&["topo", "--file", gap.to_str().unwrap()]);
    assert!(
        err.contains("invalid topology: ranks: rank 2 missing"),
        "{err}"
    );

    let syntax = dir.join("syntax.toml");
    std::fs::write(&syntax, "[links\n").unwrap();
    let err = fails_with_2(&["topo", "--file", syntax.to_str().unwrap()]);
    assert!(
        err.contains("cannot parse topology") && err.contains("syntax.toml"),
        "{err}"
    );
    assert!(err.contains("line 1"), "{err}");
}

#[test]
fn missing_file_exits_2() {
    let path = scratch("missing").join("absent.toml");
    let err = fails_with_2(&["topo", "--file", path.to_str().unwrap()]);
    assert!(
        err.starts_with("error: cannot read topology file "),
        "{err}"
    );
    assert!(err.contains("absent.toml"), "{err}");
}

/// `--file /dev/zero`, a FIFO without a writer and a huge (sparse) regular file fail at
/// once with an error naming the file and, for the huge one, the limit: nothing is read
/// until memory runs out, nothing waits for a writer.
#[test]
fn unbounded_files_fail_fast() {
    let dir = scratch("unbounded");
    let started = std::time::Instant::now();
    let err = fails_with_2(&["topo", "--file", "/dev/zero"]);
    assert!(
        err.contains("topology file /dev/zero is not a regular file: it is a character device"),
        "{err}"
    );
    let fifo = dir.join("fifo.toml");
    let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    let err = fails_with_2(&["topo", "--file", fifo.to_str().unwrap()]);
    assert!(
        err.contains("fifo.toml is not a regular file: it is a FIFO"),
        "{err}"
    );
    let huge = dir.join("huge.toml");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let err = fails_with_2(&["topo", "--file", huge.to_str().unwrap()]);
    assert!(
        err.contains("huge.toml is larger than the limit of 67108864 bytes (64 MiB)"),
        "{err}"
    );
    // Just over the limit is too large; the limit itself is read (and fails to parse:
    // it is all zero bytes).
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(halo_topology::MAX_FILE_BYTES + 1)
        .unwrap();
    let err = fails_with_2(&["topo", "--file", huge.to_str().unwrap()]);
    assert!(err.contains("larger than the limit"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn usage_errors_exit_2() {
    fails_with_2(&["topo", "--preset", "flat:2", "--file", "x.toml"]);
    fails_with_2(&["topo", "--preset", "flat:2", "--json", "--toml"]);
    fails_with_2(&["topo", "--toml"]);
    fails_with_2(&["topo", "--preset", "flat:2", "--max-children", "many"]);
    fails_with_2(&["nonsense"]);
}

#[test]
fn discovery_prints_the_machine() {
    let out = ok(&["topo"]);
    assert!(out.starts_with("Machine "), "{out}");
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("Package")),
        "{out}"
    );
}

#[test]
fn discovery_json() {
    let out = ok(&["topo", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert!(v["hostname"].is_string(), "{out}");
    assert!(v["packages"].is_array(), "{out}");
}

#[test]
fn halo_debug_logs_to_stderr() {
    let run = |value: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_halo"));
        c.args(["topo", "--preset", "flat:3", "--json"]);
        match value {
            Some(v) => c.env("HALO_DEBUG", v),
            None => c.env_remove("HALO_DEBUG"),
        };
        c.output().unwrap()
    };
    let quiet = run(None);
    assert!(quiet.status.success());
    assert_eq!(stderr(&quiet), "");
    let loud = run(Some("info"));
    assert!(loud.status.success());
    assert!(
        stderr(&loud).contains("built topology"),
        "{}",
        stderr(&loud)
    );
    // Logs never mix with the output.
    assert_eq!(stdout(&loud), stdout(&quiet));
    let bad = run(Some("verbose"));
    assert!(bad.status.success());
    assert!(
        stderr(&bad).contains("HALO_DEBUG='verbose' is not understood"),
        "{}",
        stderr(&bad)
    );
}

/// `halo simulate --algos flat,halo,auto`: the automatic column is the simulated time of
/// the algorithm `halo::select` picks, named in the last column.
#[test]
fn simulate_auto_column_is_the_model_pick() {
    let out = ok(&[
        "simulate",
        "--topology",
        "frontier:2",
        "--sizes",
        "1K:64K",
        "--algos",
        "flat,halo,auto",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[1].contains("auto time") && lines[1].ends_with("auto picks"),
        "{out}"
    );
    let topo = Topology::preset("frontier:2").unwrap();
    let options = halo::AlgoOptions::default();
    let rows: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !l.starts_with('#'))
        .collect();
    // The ladder steps by 4x: 1, 4, 16 and 64 KiB.
    assert_eq!(rows.len(), 4, "{out}");
    for (row, block) in rows.iter().zip([1usize << 10, 4 << 10, 16 << 10, 64 << 10]) {
        let pick = halo::select::choose(&topo, block, &options);
        assert_eq!(row.split_whitespace().last(), Some(pick.name()), "{row}");
        // The auto column repeats the time of its pick when that one is a column too.
        let f: Vec<&str> = row.split_whitespace().collect();
        // Size (2 fields: "1", "KiB"), then time (2 fields) + algbw per column.
        let time = |col: usize| format!("{} {}", f[2 + col * 3], f[3 + col * 3]);
        match pick.name() {
            "flat" => assert_eq!(time(2), time(0), "{row}"),
            "halo" => assert_eq!(time(2), time(1), "{row}"),
            _ => {}
        }
    }
    fails_with_2(&["simulate", "--algos", "flat,automatic"]);
}
