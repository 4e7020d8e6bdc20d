//! HALO's shared-memory transport across real processes under `halo launch`:
//! `halo check` (every algorithm and automatic selection, all-to-all with a zero
//! count, all-to-all-v with zero counts, byte-exact) on 2, 3, 4 and 8 processes; its
//! automatic choice and `HALO_TRANSPORT`; and nothing left in `/dev/shm` by a job
//! killed with SIGKILL — in the middle of its collectives, or during set-up while the
//! segment file still exists (the launcher removes it).
//!
//! Cross-memory attach (`HALO_SHM_CMA=1`, a low `HALO_SHM_CMA_MIN`) under the same
//! check, and forced off.
//!
//! Elsewhere: the ring stress test and the refusals in `src/transport/shm/tests.rs`;
//! a SIGKILLed rank's survivors (`fabric.rs`, `sigkilled_rank_survivors_fail_fast_halo_shm`);
//! abort and the communicator after a timeout (`fabric.rs`, the `(None, true)` cases);
//! size mismatches (`short_receive.rs`, `halo_shm_processes_every_algorithm_every_rank_fails`).

use halo::host::files::{Kind, Name};
use halo_cli::check::CheckOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const HALO: &str = env!("CARGO_BIN_EXE_halo");

/// Every algorithm (and automatic selection), uniform counts with a zero, -v rounds
/// with zero counts (as `fabric.rs`), plus a count whose blocks are larger than a ring
/// (32 cells of 8 KiB: 70,000 x 4 bytes per peer).
const CHECK: &[&str] = &[
    "check",
    "--algo",
    "all",
    "--counts",
    "0,1,7,1500,70000",
    "--v-max",
    "24",
    "--v-rounds",
    "2",
];

fn collectives_per_rank() -> usize {
    let o = CheckOptions {
        counts: vec![0, 1, 7, 1500, 70000],
        v_max: 24,
        v_rounds: 2,
        ..CheckOptions::default()
    };
    o.algorithms.len() * (o.counts.len() + o.v_rounds)
}

fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("shm")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Starts `halo launch --timeout 150 ARGS` with `env`, output to files in `dir`.
fn start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Child {
    Command::new(HALO)
        .arg("launch")
        .args(["--timeout", "150"])
        .args(args)
        .env_remove("HALO_DEBUG")
        .env_remove("HALO_FABRIC_PROVIDER")
        .env_remove("HALO_TRANSPORT")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .expect("start halo launch")
}

fn wait_for(child: &mut Child, limit: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > limit {
            signal(child.id(), nix::sys::signal::Signal::SIGINT);
            let _ = child.wait();
            panic!("halo launch ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Signals a process this test started (directly or as a rank of its launcher).
fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

fn output(dir: &Path) -> (String, String) {
    (
        std::fs::read_to_string(dir.join("stdout")).unwrap_or_default(),
        std::fs::read_to_string(dir.join("stderr")).unwrap_or_default(),
    )
}

/// Runs [`CHECK`] on `n` ranks with `env`; asserts success, every collective verified
/// on every rank and `provider` to every peer.
fn check_job(dir: &Path, n: usize, env: &[(&str, &str)], provider: &str) {
    let nn = n.to_string();
    let mut args = vec!["-n", nn.as_str(), "--", HALO];
    args.extend_from_slice(CHECK);
    let started = Instant::now();
    let mut child = start(dir, &args, env);
    let st = wait_for(&mut child, Duration::from_secs(180));
    let (stdout, stderr) = output(dir);
    assert!(
        st.success(),
        "{n} ranks {env:?}: {st:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for r in 0..n {
        let prefix = format!("rank {r}/{n}: ");
        let line = stdout
            .lines()
            .find_map(|l| l.split_once(&prefix).map(|(_, rest)| rest))
            .unwrap_or_else(|| panic!("rank {r} printed no result:\n{stdout}\n{stderr}"));
        let verified: usize = line
            .split(' ')
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        assert_eq!(verified, collectives_per_rank(), "rank {r}: {line}");
        let peers: String = (0..n)
            .filter(|&p| p != r)
            .map(|p| format!("{p}:{provider}"))
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            line.contains(&format!("(peers {peers})")),
            "rank {r}: expected peers {peers}: {line}"
        );
    }
    eprintln!(
        "{n} ranks {env:?}: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn every_algorithm_byte_exact_on_2_3_4_8_processes() {
    let dir = scratch("check");
    for n in [2, 3, 4, 8] {
        check_job(&dir, n, &[("HALO_TRANSPORT", "shm")], "halo-shm");
    }
    // Small rings: every block of the larger counts passes through them in pieces.
    check_job(
        &dir,
        4,
        &[
            ("HALO_TRANSPORT", "shm"),
            ("HALO_SHM_SLOTS", "2"),
            ("HALO_SHM_CELL", "128"),
        ],
        "halo-shm",
    );
}

#[test]
fn cross_memory_attach_every_algorithm_byte_exact_and_forced_off() {
    let dir = scratch("cma");
    // Blocks of 1,500 x 4 and 70,000 x 4 bytes go by rendezvous (process_vm_readv),
    // smaller ones through the rings; with tiny rings the rendezvous cells wrap too.
    for (n, extra) in [
        (4, &[][..]),
        (3, &[("HALO_SHM_SLOTS", "2"), ("HALO_SHM_CELL", "128")][..]),
    ] {
        let mut env = vec![
            ("HALO_TRANSPORT", "shm"),
            ("HALO_SHM_CMA", "1"),
            ("HALO_SHM_CMA_MIN", "4096"),
            ("HALO_DEBUG", "info"),
        ];
        env.extend_from_slice(extra);
        check_job(&dir, n, &env, "halo-shm");
        let (_, stderr) = output(&dir);
        assert_eq!(
            stderr
                .matches("copied once (process_vm_readv) from every peer")
                .count(),
            n,
            "{stderr}"
        );
    }
    // Forced off: the rings carry everything, and each rank says so.
    check_job(
        &dir,
        3,
        &[
            ("HALO_TRANSPORT", "shm"),
            ("HALO_SHM_CMA", "0"),
            ("HALO_SHM_CMA_MIN", "4096"),
            ("HALO_DEBUG", "info"),
        ],
        "halo-shm",
    );
    let (_, stderr) = output(&dir);
    assert_eq!(
        stderr
            .matches("cross-memory attach off from 2 of 2 peers")
            .count(),
        3,
        "{stderr}"
    );
    // A bad value is an error naming the variable.
    let mut child = start(
        &dir,
        &[
            "-n",
            "2",
            "--",
            HALO,
            "check",
            "--counts",
            "1",
            "--v-rounds",
            "0",
        ],
        &[("HALO_TRANSPORT", "shm"), ("HALO_SHM_CMA", "yes")],
    );
    let st = wait_for(&mut child, Duration::from_secs(60));
    let (_, stderr) = output(&dir);
    assert!(!st.success());
    assert!(stderr.contains("HALO_SHM_CMA=\"yes\""), "{stderr}");
}

#[test]
fn chosen_for_one_host_and_forced_either_way() {
    let dir = scratch("choice");
    check_job(&dir, 3, &[], "halo-shm");
    check_job(&dir, 3, &[("HALO_TRANSPORT", "auto")], "halo-shm");
    check_job(&dir, 3, &[("HALO_TRANSPORT", "fabric")], "shm");
    check_job(
        &dir,
        2,
        &[("HALO_FABRIC_PROVIDER", "tcp;ofi_rxm")],
        "tcp;ofi_rxm",
    );
    // A bad value is an error naming the variable.
    let mut child = start(
        &dir,
        &["-n", "2", "--", HALO, "check"],
        &[("HALO_TRANSPORT", "ring")],
    );
    let st = wait_for(&mut child, Duration::from_secs(60));
    let (_, stderr) = output(&dir);
    assert!(!st.success());
    assert!(stderr.contains("HALO_TRANSPORT=\"ring\""), "{stderr}");
    // Ranks that disagree: one forces shm, the others the fabric.
    let script = format!(
        "if [ \"$RANK\" = 1 ]; then export HALO_TRANSPORT=fabric; fi; exec {HALO} check --counts 1 --v-rounds 0"
    );
    let mut child = start(
        &dir,
        &["-n", "2", "--", "sh", "-c", &script],
        &[("HALO_TRANSPORT", "shm")],
    );
    let st = wait_for(&mut child, Duration::from_secs(60));
    let (_, stderr) = output(&dir);
    assert!(!st.success());
    assert!(
        stderr.contains("asked for HALO_TRANSPORT=shm")
            && stderr.contains("rank 1 uses the fabric"),
        "{stderr}"
    );
}

/// Whether `/dev/shm` file `name` is a segment of HALO's shared-memory transport.
fn is_segment(name: &str) -> bool {
    Name::parse(name).is_some_and(|n| n.kind == Kind::Segment)
}

/// `/dev/shm` files named with one of `pids`: HALO's segments and bells
/// (`halo-{shm,bell}-NS-PID-N-TAG`) and libfabric's regions (`PID:N:M`).
fn shm_files_of(pids: &[u32]) -> Vec<String> {
    let mut left = Vec::new();
    for e in std::fs::read_dir("/dev/shm").unwrap().flatten() {
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        let halo = Name::parse(&name).map(|n| n.pid);
        let fabric = name.split(':').next().and_then(|p| p.parse::<u32>().ok());
        if halo.or(fabric).is_some_and(|p| pids.contains(&p)) {
            left.push(name);
        }
    }
    left
}

/// The rank pids a rank script wrote to `dir/pids/RANK` (the shell `exec`s the rank).
fn rank_pids(dir: &Path, n: usize, limit: Duration) -> Vec<u32> {
    let start = Instant::now();
    loop {
        let pids: Vec<u32> = (0..n)
            .filter_map(|r| {
                std::fs::read_to_string(dir.join("pids").join(r.to_string()))
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
            })
            .collect();
        if pids.len() == n {
            return pids;
        }
        assert!(start.elapsed() < limit, "the ranks did not start: {pids:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A rank script: writes its pid, then (rank `slow` after `delay` seconds) becomes
/// `halo check ARGS`.
fn rank_script(dir: &Path, slow: Option<(usize, u32)>, args: &str) -> String {
    let pause = slow
        .map(|(r, s)| format!("if [ \"$RANK\" = {r} ]; then sleep {s}; fi; "))
        .unwrap_or_default();
    format!(
        "echo $$ > {}/pids/$RANK; {pause}exec {HALO} check {args}",
        dir.display()
    )
}

#[test]
fn sigkilled_job_leaves_no_shared_memory() {
    // 1. A rank kills itself (SIGKILL) in the middle of the all-to-all loop.
    let dir = scratch("kill_rank");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    let script = rank_script(
        &dir,
        None,
        "--algo all --counts 16,5000 --v-rounds 1 --loop 1000000 --die-rank 1 --die-after 25",
    );
    let mut child = start(
        &dir,
        &["-n", "4", "--", "sh", "-c", &script],
        &[("HALO_TRANSPORT", "shm"), ("HALO_TIMEOUT_MS", "3000")],
    );
    let st = wait_for(&mut child, Duration::from_secs(120));
    let (stdout, stderr) = output(&dir);
    assert!(
        matches!(st.code(), Some(137) | Some(1)),
        "{st:?}\n{stdout}\n{stderr}"
    );
    let pids = rank_pids(&dir, 4, Duration::ZERO);
    let left = shm_files_of(&pids);
    assert!(left.is_empty(), "left in /dev/shm: {left:?}\n{stderr}");

    // 2. Every rank SIGKILLed by this test while the loop runs.
    let dir = scratch("kill_all");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    let script = rank_script(&dir, None, "--counts 64 --v-rounds 0 --loop 100000000");
    let mut child = start(
        &dir,
        &["-n", "4", "--", "sh", "-c", &script],
        &[("HALO_TRANSPORT", "shm")],
    );
    let pids = rank_pids(&dir, 4, Duration::from_secs(60));
    // In the loop once the segment was mapped by all (its file is gone by then).
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the job ended early:\n{:?}",
        output(&dir)
    );
    for &p in &pids {
        signal(p, nix::sys::signal::Signal::SIGKILL);
    }
    let st = wait_for(&mut child, Duration::from_secs(60));
    assert_eq!(st.code(), Some(137), "{st:?} {:?}", output(&dir));
    let left = shm_files_of(&pids);
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");

    // 3. Rank 0 SIGKILLed during set-up, while the segment file exists: rank 0 made it
    //    and waits at the bootstrap for rank 1, which starts 20 s late. The launcher
    //    removes it when it reaps rank 0.
    let dir = scratch("kill_setup");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    let script = rank_script(&dir, Some((1, 20)), "--counts 1 --v-rounds 0");
    let mut child = start(
        &dir,
        &["-n", "2", "--", "sh", "-c", &script],
        &[("HALO_TRANSPORT", "shm")],
    );
    let pids = rank_pids(&dir, 2, Duration::from_secs(60));
    let start_wait = Instant::now();
    let segment = loop {
        let files: Vec<String> = shm_files_of(&pids[..1])
            .into_iter()
            .filter(|f| is_segment(f))
            .collect();
        if let Some(f) = files.into_iter().next() {
            break f;
        }
        assert!(
            start_wait.elapsed() < Duration::from_secs(15),
            "rank 0 made no segment: {:?}",
            output(&dir)
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    signal(pids[0], nix::sys::signal::Signal::SIGKILL);
    let st = wait_for(&mut child, Duration::from_secs(60));
    assert_eq!(st.code(), Some(137), "{st:?} {:?}", output(&dir));
    assert!(
        !Path::new("/dev/shm").join(&segment).exists(),
        "{segment} left in /dev/shm"
    );
    let left = shm_files_of(&pids);
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}
