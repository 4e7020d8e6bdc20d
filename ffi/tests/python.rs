//! The Python package's tests (`python/tests`: the standard library's unittest, with
//! numpy), run against the library cargo built for this test (`libhalo.so` beside the
//! test binary, through `HALO_LIBRARY`) and the `halo` launcher of the same build
//! (`HALO_BIN`):
//!
//! - `test_api.py`: the constants against ffi/include/halo.h, finding the library, the
//!   errors, the argument checks, a one-rank communicator, and (`workers/ops.py` under
//!   `halo launch`, 3 and 4 ranks) all-reduce with every op and dtype, all-gather,
//!   reduce-scatter, broadcast, gather, scatter, tagged send / recv, blocking and
//!   async, byte-exact, and mismatched counts raising `HaloError` on every rank;
//! - `test_launch.py`: `halo launch -n 4 -- python3 WORKER` (and 3 ranks): byte-exact
//!   all-to-all with uneven splits that include zeros, all-to-all of lists,
//!   all-reduce, barrier, split, the error path with the header's codes, the example
//!   `python/examples/moe_dispatch.py`, the README's program, and a negative control (a
//!   flipped byte fails the job);
//! - `test_torch.py`: `halo.torch` against torch.distributed; skipped, with the reason,
//!   when torch is not installed (it is optional);
//! - `test_install.py`: `pip install` of `python/` into a scratch directory.
//!
//! Without python3 or numpy the test is skipped with the reason printed, unless
//! `HALO_REQUIRE_ALL=1` or `HALO_REQUIRE_PYTHON_TESTS=1` (set by `scripts/test.sh`, after
//! `scripts/deps.sh test` installed numpy): then it fails.

mod common;

use common::{lib_dir, root};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The `halo` launcher of this build: `target/<profile>/halo`, built when missing
/// (`cargo test --workspace` has built it already).
fn halo_bin(lib_dir: &Path) -> PathBuf {
    let profile_dir = lib_dir.parent().unwrap();
    let bin = profile_dir.join("halo");
    if !bin.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "halo-cli", "--bin", "halo"])
            .current_dir(root());
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
        assert!(status.success(), "{cmd:?} failed");
    }
    assert!(bin.is_file(), "no halo launcher at {}", bin.display());
    bin
}

/// Why the Python tests cannot run here, if they cannot.
fn missing_python(python: &str) -> Option<String> {
    match Command::new(python)
        .args(["-c", "import numpy, torch, expecttest"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Err(e) => Some(format!("{python} cannot be started ({e})")),
        Ok(s) if !s.success() => Some(format!(
            "numpy, torch or expecttest is not installed for {python} (bash scripts/deps.sh test installs them)"
        )),
        Ok(_) => None,
    }
}

#[test]
fn python_package_tests() {
    let python = std::env::var("HALO_PYTHON").unwrap_or_else(|_| "python3".into());
    if let Some(why) = missing_python(&python) {
        assert!(
            std::env::var("HALO_REQUIRE_PYTHON_TESTS").as_deref() != Ok("1"),
            "the Python tests are required (HALO_REQUIRE_PYTHON_TESTS=1) but {why}"
        );
        halo_test_support::skip(&format!("{why}; the Python package was not tested"));
        return;
    }
    let root = root();
    let lib = lib_dir();
    let halo = halo_bin(&lib);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("python");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));

    let mut python_path = root.join("python").into_os_string();
    if let Some(p) = std::env::var_os("PYTHONPATH") {
        python_path.push(":");
        python_path.push(p);
    }
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(root.join("python/tests"))
        .current_dir(&dir)
        .env("HALO_LIBRARY", lib.join("libhalo.so"))
        .env("HALO_BIN", &halo)
        .env("HALO_REQUIRE_PYTHON_TESTS", "1")
        .env("PYTHONPATH", python_path)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    // torch's own distributed suite takes about 5 minutes of this on 2 cores.
    let (start, limit) = (Instant::now(), Duration::from_secs(1800));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the Python tests ran past {limit:?}:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(
        status.success(),
        "{cmd:?} failed ({status}):\n{stdout}{stderr}"
    );
    // unittest's verbose lines: the jobs under `halo launch` did run (not skipped).
    for test in [
        "test_collectives_on_4_ranks",
        "test_collectives_on_3_ranks",
        "test_errors_on_4_ranks",
        "test_the_moe_dispatch_example_on_4_ranks",
        "test_the_readme_example_on_3_ranks",
        "test_a_wrong_byte_fails_the_job",
        // The device path's error path (issue 17), without a GPU stack.
        "test_all_to_all_single_on_device_arrays",
        "test_the_communicator_still_works_on_host_memory",
        // The "halo" torch.distributed backend, with the real torch deps.sh installs.
        "test_importing_halo_torch_registers_the_backend",
        "test_every_operation_on_4_ranks",
        "test_every_operation_on_3_ranks",
        "test_ddp_over_halo_matches_ddp_over_gloo",
        "test_the_megatron_style_moe_example_on_4_ranks",
        "test_the_moe_example_under_halo_launch",
        "test_a_dead_rank_makes_the_others_raise",
        "test_torchs_own_cuda_runtime_is_found",
        "test_torchs_distributed_suite_over_halo",
        "test_pip_install_into_a_directory",
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("{test} (")) && l.ends_with(" ... ok")),
            "{test} did not pass:\n{stderr}"
        );
    }
    for line in stderr.lines().filter(|l| l.contains(" ... skipped ")) {
        println!("{line}");
    }
    println!(
        "{}",
        stderr.lines().rev().take(4).collect::<Vec<_>>().join(" | ")
    );
}
