//! The C programs of `ffi/tests/c/`, compiled with gcc (`-std=c11 -Wall -Wextra -Werror
//! -Wpedantic`) against `ffi/include/halo.h` and the library cargo built for this test
//! (`libhalo.so` beside the test binary), run as several processes:
//!
//! - `alltoall.c`: all-to-all over every data type and all-to-all-v with random counts
//!   (zeros, gaps, reversed receive blocks), byte-exact; from the environment on 4
//!   ranks, and from a unique id with a `haloConfig_t` (HALO algorithm) on 3;
//! - `errors.c`: every invalid call returns its documented code and message, writes
//!   nothing, and leaves the communicator usable;
//! - `collectives.c`: send / receive (tagged too), all-gather, all-reduce, reduce-scatter,
//!   broadcast, gather, scatter, split, and their errors;
//! - `abort.c`: `haloCommAbort` from a watchdog thread stops a blocked collective;
//! - `nonblocking.c`: request handles (`haloI*`, `haloWait`, `haloTest`, `haloWaitAll`)
//!   byte-exact, a blocking call after outstanding requests, stale requests, a failed
//!   request and the one queued after it, destroy with a request outstanding;
//! - `mismatch.c`: `haloAllToAll` with count 4 on rank 0 and 8 on the others fails on
//!   every rank, with every algorithm (issue 11: ranks used to return success with
//!   part of the receive buffer unwritten);
//! - `disagree.c`: ranks that disagree on the call (operation, element type,
//!   collective, barrier against all-to-all, root) fail with `haloInvalidUsage` naming
//!   both ranks and both values.
//!
//! The ranks are started the way `halo launch` starts them: `RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `HALO_BOOTSTRAP_ADDR` and `HALO_SECRET` in the
//! environment; each rank's output goes to its own files so that the assertions can
//! name the rank. The memcheck test runs the programs under valgrind (skipped, with
//! the reason printed, when valgrind is not installed: `bash scripts/deps.sh test`
//! installs it). The last test installs the library with `scripts/install-c.sh` to a
//! temporary prefix and builds the README's example through pkg-config, as a new user
//! would, then runs it on 4 ranks with the launcher behind `halo launch` (and once more
//! linked statically).
//!
//! Over 800 lines: one runner per C program, all sharing the compile-and-launch
//! helpers (gcc flags, the library path, the launcher); they stay one test binary so the
//! library is built and linked once.

mod common;

use common::{lib_dir, root};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A fresh scratch directory for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("c_programs")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Warnings are errors; the language is strict C11.
const CFLAGS: &[&str] = &[
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wpedantic",
    "-g",
];

/// Runs a command to completion; panics with its output when it fails.
#[track_caller]
fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Compiles `ffi/tests/c/<name>.c` against the header and the shared library (found at run
/// time through an rpath), once per test process.
fn program(name: &'static str) -> PathBuf {
    static BUILT: OnceLock<std::sync::Mutex<Vec<(&'static str, PathBuf)>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built.lock().unwrap();
    if let Some((_, p)) = built.iter().find(|(n, _)| *n == name) {
        return p.clone();
    }
    let (root, lib) = (root(), lib_dir());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("c_programs/bin");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(name);
    run_ok(
        Command::new("gcc")
            .args(CFLAGS)
            .arg("-I")
            .arg(root.join("ffi/include"))
            .arg("-I")
            .arg(root.join("ffi/tests/c"))
            .arg(root.join(format!("ffi/tests/c/{name}.c")))
            .arg("-o")
            .arg(&out)
            .arg("-pthread")
            .arg("-L")
            .arg(&lib)
            .arg("-lhalo")
            // DT_RPATH, not DT_RUNPATH: cargo test puts `target/<profile>` first in
            // LD_LIBRARY_PATH, whose libhalo.so is whatever `cargo build` left there
            // last, and a RUNPATH would lose to it (the programs then tested a stale
            // library).
            .arg("-Wl,--disable-new-dtags")
            .arg(format!("-Wl,-rpath,{}", lib.display())),
    );
    built.push((name, out.clone()));
    out
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// How one rank ended.
#[derive(Debug)]
struct Rank {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// A job: `n` ranks of `cmd` (a wrapper such as valgrind first, if any).
struct Job {
    n: usize,
    cmd: Vec<String>,
    env: Vec<(String, String)>,
    limit: Duration,
}

impl Job {
    fn new(n: usize, program: &Path) -> Job {
        Job {
            n,
            cmd: vec![program.display().to_string()],
            env: Vec::new(),
            limit: Duration::from_secs(90),
        }
    }

    fn args(mut self, args: &[&str]) -> Job {
        self.cmd.extend(args.iter().map(|s| s.to_string()));
        self
    }

    fn env(mut self, k: &str, v: &str) -> Job {
        self.env.push((k.into(), v.into()));
        self
    }

    fn wrapped(mut self, wrapper: Vec<String>) -> Job {
        self.cmd.splice(0..0, wrapper);
        self
    }

    fn limit(mut self, limit: Duration) -> Job {
        self.limit = limit;
        self
    }

    /// Starts every rank, waits for all (killing them past the limit) and returns how
    /// each ended. A port that `free_port` found free can be taken by another test
    /// before rank 0 binds it: then the job starts again on another port (up to 5 times).
    fn run(self, dir: &Path) -> Vec<Rank> {
        for _ in 0..5 {
            if let Some(ranks) = self.run_once(dir) {
                return ranks;
            }
        }
        panic!(
            "{:?}: the bootstrap port was taken 5 times in a row",
            self.cmd
        );
    }

    /// One attempt of [`Job::run`]; `None` when rank 0 could not bind its port.
    fn run_once(&self, dir: &Path) -> Option<Vec<Rank>> {
        let addr = format!("127.0.0.1:{}", free_port());
        let secret: String = (0..32)
            .map(|i| format!("{:02x}", (std::process::id() as usize * 31 + i * 7) % 256))
            .collect();
        let mut children: Vec<Child> = (0..self.n)
            .map(|r| {
                let out = std::fs::File::create(dir.join(format!("rank{r}.out"))).unwrap();
                let err = std::fs::File::create(dir.join(format!("rank{r}.err"))).unwrap();
                Command::new(&self.cmd[0])
                    .args(&self.cmd[1..])
                    .current_dir(dir)
                    .env("RANK", r.to_string())
                    .env("WORLD_SIZE", self.n.to_string())
                    .env("LOCAL_RANK", r.to_string())
                    .env("LOCAL_WORLD_SIZE", self.n.to_string())
                    .env("HALO_BOOTSTRAP_ADDR", &addr)
                    .env("HALO_SECRET", &secret)
                    .envs(self.env.iter().map(|(k, v)| (k, v)))
                    .stdin(Stdio::null())
                    .stdout(out)
                    .stderr(err)
                    .spawn()
                    .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", self.cmd))
            })
            .collect();
        let start = Instant::now();
        let mut codes: Vec<Option<Option<i32>>> = vec![None; self.n];
        while codes.iter().any(Option::is_none) {
            for (r, c) in children.iter_mut().enumerate() {
                if codes[r].is_none()
                    && let Some(st) = c.try_wait().unwrap()
                {
                    codes[r] = Some(st.code());
                }
            }
            if codes[0].is_some() {
                let err0 = std::fs::read_to_string(dir.join("rank0.err")).unwrap_or_default();
                if err0.contains("bootstrap root cannot bind")
                    && err0.contains("Address already in use")
                {
                    for (r, c) in children.iter_mut().enumerate() {
                        if codes[r].is_none() {
                            let _ = c.kill();
                            let _ = c.wait();
                        }
                    }
                    eprintln!("{:?}: port {addr} was taken; starting again", self.cmd);
                    return None;
                }
            }
            if start.elapsed() > self.limit {
                for (r, c) in children.iter_mut().enumerate() {
                    if codes[r].is_none() {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                }
                let ranks = collect(dir, &codes);
                panic!(
                    "{:?} with {} ranks ran past {:?}; ranks: {ranks:#?}",
                    self.cmd, self.n, self.limit
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(collect(dir, &codes))
    }
}

fn collect(dir: &Path, codes: &[Option<Option<i32>>]) -> Vec<Rank> {
    codes
        .iter()
        .enumerate()
        .map(|(r, c)| Rank {
            code: c.flatten(),
            stdout: std::fs::read_to_string(dir.join(format!("rank{r}.out"))).unwrap_or_default(),
            stderr: std::fs::read_to_string(dir.join(format!("rank{r}.err"))).unwrap_or_default(),
        })
        .collect()
}

/// Every rank exited 0 and printed `ok_line`.
#[track_caller]
fn assert_all_ok(ranks: &[Rank], ok_line: &str) {
    for (r, rank) in ranks.iter().enumerate() {
        assert!(
            rank.code == Some(0) && rank.stdout.contains(ok_line),
            "rank {r} failed (exit {:?}); all ranks: {ranks:#?}",
            rank.code
        );
    }
}

#[test]
fn header_compiles_as_c99_c11_and_cpp() {
    let dir = scratch("header");
    let src = dir.join("include_only.c");
    std::fs::write(
        &src,
        "#include <halo.h>\n\
         int main(void) {\n\
             haloConfig_t config = HALO_CONFIG_INITIALIZER;\n\
             haloUniqueId id;\n\
             (void)id;\n\
             return config.magic == HALO_CONFIG_MAGIC && sizeof(id) == HALO_UNIQUE_ID_BYTES ? 0 : 1;\n\
         }\n",
    )
    .unwrap();
    let include = root().join("ffi/include");
    for std in ["-std=c99", "-std=c11", "-std=c17"] {
        run_ok(
            Command::new("gcc")
                .args([
                    std,
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                    "-Wpedantic",
                    "-fsyntax-only",
                    "-I",
                ])
                .arg(&include)
                .arg(&src),
        );
    }
    if Command::new("g++").arg("--version").output().is_ok() {
        run_ok(
            Command::new("g++")
                .args([
                    "-x",
                    "c++",
                    "-std=c++11",
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                    "-fsyntax-only",
                ])
                .arg("-I")
                .arg(&include)
                .arg(&src),
        );
    } else {
        println!("g++ not installed: the header was not compiled as C++");
    }
}

#[test]
fn all_to_all_and_v_are_byte_exact_on_4_ranks() {
    let dir = scratch("alltoall4");
    let ranks = Job::new(4, &program("alltoall")).run(&dir);
    assert_all_ok(&ranks, "alltoall ok");
}

#[test]
fn unique_id_and_config_on_3_ranks_with_the_halo_algorithm() {
    // haloGetUniqueId on rank 0, passed through a file; haloCommInitRankConfig with
    // the HALO algorithm over a preset topology of two nodes (2 + 1 ranks).
    let dir = scratch("uniqueid3");
    let id = dir.join("id");
    let ranks = Job::new(3, &program("alltoall"))
        .args(&[id.to_str().unwrap(), "4", "nodes:2x2,ranks=3"])
        .run(&dir);
    assert_all_ok(&ranks, "alltoall ok");
}

#[test]
fn send_recv_all_gather_all_reduce_and_split_on_3_ranks() {
    let dir = scratch("collectives3");
    let ranks = Job::new(3, &program("collectives"))
        .env("HALO_TIMEOUT_MS", "20000")
        .run(&dir);
    assert_all_ok(&ranks, "collectives ok");
}

#[test]
fn non_blocking_requests_are_byte_exact_on_2_3_4_ranks() {
    for n in [2, 3, 4] {
        let dir = scratch(&format!("nonblocking{n}"));
        let ranks = Job::new(n, &program("nonblocking"))
            .env("HALO_TIMEOUT_MS", "20000")
            .run(&dir);
        assert_all_ok(&ranks, "nonblocking ok");
        // Stale and double-waited requests, NULL and bad arguments: 8 per round, 3
        // rounds, and 3 for the newer collectives.
        assert!(
            ranks[0].stdout.contains("27 invalid calls checked"),
            "{ranks:#?}"
        );
    }
}

#[test]
fn a_failed_request_fails_the_queued_ones_with_its_code() {
    let dir = scratch("nonblocking-failure");
    let ranks = Job::new(2, &program("nonblocking"))
        .args(&["failure"])
        .env("HALO_TIMEOUT_MS", "5000")
        .run(&dir);
    assert_all_ok(&ranks, "nonblocking ok");
    assert!(
        ranks[0].stdout.contains("failed receive code 5"),
        "{ranks:#?}"
    );
}

#[test]
fn abort_stops_a_waited_request_and_the_queued_ones() {
    let dir = scratch("nonblocking-abort");
    let ranks = Job::new(2, &program("nonblocking"))
        .args(&["abort"])
        .env("HALO_TIMEOUT_MS", "60000")
        .run(&dir);
    assert_all_ok(&ranks, "nonblocking ok");
    assert!(ranks[0].stdout.contains("haloAborted after"), "{ranks:#?}");
}

#[test]
fn invalid_calls_return_their_documented_codes() {
    let dir = scratch("errors4");
    // A rank that fails early leaves the others waiting: keep that short.
    let ranks = Job::new(4, &program("errors"))
        .env("HALO_TIMEOUT_MS", "20000")
        .run(&dir);
    assert_all_ok(&ranks, "errors ok");
}

/// The device path without a GPU stack (issue 17): `haloAllToAll` / `haloAllToAllv`
/// with a stream return `haloUnhandledDeviceError` naming every place tried, on every
/// rank, and the host path keeps working (ffi/tests/c/device.c).
#[test]
fn device_calls_without_a_gpu_stack_name_the_places_tried() {
    let dir = scratch("device3");
    let ranks = Job::new(3, &program("device"))
        .env("HALO_TIMEOUT_MS", "20000")
        .run(&dir);
    assert_all_ok(&ranks, "device ok");
}

/// The MoE calls (issue 29, ffi/tests/c/moe.c) on 4 ranks over two nodes: layout,
/// dispatch, combine and the pairs byte-exact against the reference every rank
/// computes, in every mode; the non-blocking forms (`haloIMoe*`) bitwise equal to the
/// blocking ones; bad input refused on every rank with its code. The timeout
/// is short: a rank that failed alone would leave the others waiting for it, which the
/// test must not survive.
#[test]
fn moe_handles_dispatch_and_combine_on_4_ranks() {
    let dir = scratch("moe4");
    let ranks = Job::new(4, &program("moe"))
        .env("HALO_TOPOLOGY", "nodes:2x2")
        .env("HALO_TIMEOUT_MS", "5000")
        .limit(Duration::from_secs(60))
        .run(&dir);
    assert_all_ok(&ranks, "moe ok");
    assert!(
        ranks[0].stdout.contains("12 invalid calls checked"),
        "{ranks:#?}"
    );
}

/// A uniform all-to-all with count 4 on rank 0 and 8 on the others: every rank fails
/// (never `haloSuccess`), rank 0 and at least one other with `haloInvalidUsage`
/// saying "size mismatch", the others as soon as they notice, with every algorithm.
#[test]
fn count_mismatch_fails_on_every_rank_with_every_algorithm() {
    for alg in ["flat", "pairwise", "bruck", "halo", "halo2d"] {
        let dir = scratch(&format!("mismatch-{alg}"));
        let start = Instant::now();
        let ranks = Job::new(4, &program("mismatch"))
            .env("HALO_ALGO", alg)
            .env("HALO_TOPOLOGY", "nodes:2x2")
            .env("HALO_TIMEOUT_MS", "3000")
            .limit(Duration::from_secs(30))
            .run(&dir);
        assert_all_ok(&ranks, "mismatch ok");
        let codes: Vec<&str> = ranks
            .iter()
            .map(|r| {
                r.stdout
                    .split_once(": ")
                    .and_then(|(_, rest)| rest.split(' ').next())
                    .unwrap_or("?")
            })
            .collect();
        eprintln!("{alg}: codes {codes:?} in {:?}", start.elapsed());
        assert_eq!(codes[0], "5", "{alg}: rank 0: {ranks:#?}");
        assert!(
            codes[1..].contains(&"5"),
            "{alg}: no other rank saw the mismatch: {ranks:#?}"
        );
    }
}

/// One rank's result of `disagree.c`: its code and message.
fn disagreement(rank: &Rank) -> (i32, String) {
    let line = rank
        .stdout
        .lines()
        .find(|l| l.starts_with("disagree ok"))
        .unwrap_or_else(|| panic!("no result line: {rank:#?}"));
    let rest = line.split_once(": ").map_or("", |x| x.1);
    let code = rest
        .split(' ')
        .next()
        .and_then(|c| c.parse().ok())
        .unwrap_or(-1);
    let message = rest.split_once(": ").map_or("", |x| x.1).to_string();
    (code, message)
}

/// `disagree.c CASE` on `n` ranks: every rank ends within the time (no rank waits for
/// its timeout of 20 s); the codes and messages by rank.
fn disagree(case: &str, n: usize) -> Vec<(i32, String)> {
    disagree_over(case, n, "auto")
}

/// [`disagree`] with `HALO_TRANSPORT=transport`.
fn disagree_over(case: &str, n: usize, transport: &str) -> Vec<(i32, String)> {
    let dir = scratch(&format!("disagree-{case}-{n}-{transport}"));
    let start = Instant::now();
    let ranks = Job::new(n, &program("disagree"))
        .args(&[case])
        .env("HALO_TRANSPORT", transport)
        .env("HALO_TIMEOUT_MS", "20000")
        .limit(Duration::from_secs(60))
        .run(&dir);
    assert_all_ok(&ranks, "disagree ok");
    let out: Vec<(i32, String)> = ranks.iter().map(disagreement).collect();
    eprintln!("{case} on {n} ranks, {:?}: {out:#?}", start.elapsed());
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{case} on {n} ranks took {:?} (a rank waited for its timeout): {out:#?}",
        start.elapsed()
    );
    out
}

/// Every rank of `out` failed with haloInvalidUsage (5); the ranks of `naming` say
/// `words`, the others `words` or that a peer failed the call.
#[track_caller]
fn all_usage(out: &[(i32, String)], naming: &[(usize, String)], words: &str) {
    for (r, (code, message)) in out.iter().enumerate() {
        assert_eq!(*code, 5, "rank {r}: {message}; all: {out:#?}");
        match naming.iter().find(|(q, _)| *q == r) {
            Some((_, want)) => assert!(message.contains(want.as_str()), "rank {r}: {message}"),
            None => assert!(
                message.contains(words) || message.contains("failed this collective"),
                "rank {r}: {message}"
            ),
        }
    }
}

/// Another reduction operation, another element type of the same size, another
/// collective of the same bytes, a barrier against a 1-byte all-to-all: on 2 and 4
/// ranks every rank returns haloInvalidUsage, the ranks that exchanged with the one
/// that differs naming both ranks and both values, the others that a peer failed.
#[test]
fn disagreeing_calls_fail_every_rank_naming_both_values() {
    for n in [2usize, 4] {
        // With 4 ranks, rank 0 meets whichever rank's message of the call comes first:
        // rank 1's, or rank 2's from the next round (ranks 2 and 3 agree in the first).
        let naming = |prefix: &str, full: String| -> Vec<(usize, String)> {
            if n == 2 {
                vec![(0, full.clone()), (1, full)]
            } else {
                vec![(0, prefix.to_string()), (1, full)]
            }
        };
        let sum = "rank 0 called all_reduce with sum, rank ";
        all_usage(
            &disagree("op", n),
            &naming(sum, format!("{sum}1 with max")),
            sum,
        );
        let ty = "rank 0 reduces float32, rank ";
        all_usage(
            &disagree("dtype", n),
            &naming(ty, format!("{ty}1 int32")),
            ty,
        );

        let a2a = "rank 0 called all_to_all (4096 bytes per peer), rank ";
        let naming: Vec<(usize, String)> = if n == 2 {
            vec![
                (0, format!("{a2a}1 all_gather (4096 bytes per rank)")),
                (1, format!("{a2a}1 all_gather (4096 bytes per rank)")),
            ]
        } else {
            vec![(0, a2a.to_string())]
        };
        all_usage(&disagree("kind", n), &naming, a2a);

        let out = disagree("barrier", n);
        if n == 2 {
            let words = "rank 0 called all_to_all (1 byte per peer), rank 1 barrier";
            all_usage(&out, &[(0, words.into()), (1, words.into())], words);
        } else {
            all_usage(&out, &[], "barrier");
        }
    }
}

/// The same disagreements over libfabric (`HALO_TRANSPORT=fabric`), which has no
/// poison: on 2 ranks both name both values; on 4, rank 0 names its call and a rank of
/// another call, and every other rank fails within the time: naming both values, or
/// told by the poison of a later pass that a rank failed the call over a mismatch, or
/// (where it waited only for ranks that agree with it) naming the rank that left once
/// that rank's failure ended it (`haloRemoteError`).
#[test]
fn disagreeing_calls_over_libfabric_fail_every_rank() {
    let cases = [
        (
            "op",
            "rank 0 called all_reduce with sum, rank ",
            "1 with max",
        ),
        ("dtype", "rank 0 reduces float32, rank ", "1 int32"),
        (
            "kind",
            "rank 0 called all_to_all (4096 bytes per peer), rank ",
            "1 all_gather (4096 bytes per rank)",
        ),
    ];
    for n in [2usize, 4] {
        for (case, words, rest) in cases {
            let out = disagree_over(case, n, "fabric");
            for (r, (code, message)) in out.iter().enumerate() {
                if n == 2 {
                    assert_eq!(*code, 5, "{case}, rank {r}: {out:#?}");
                    assert!(
                        message.contains(&format!("{words}{rest}")),
                        "rank {r}: {message}"
                    );
                } else if r == 0 {
                    assert_eq!(*code, 5, "{case}, rank {r}: {out:#?}");
                    assert!(message.contains(words), "rank {r}: {message}");
                } else {
                    let named = *code == 5
                        && (message.contains(words) || message.contains("failed this collective"));
                    let left = *code == 6 && message.contains("remote error from rank");
                    assert!(named || left, "{case} on 4, rank {r}: {out:#?}");
                }
            }
        }
    }
}

/// A scatter whose last rank names root 1 and the others root 0, on 4 ranks: the last
/// rank and rank 0 (its neighbour on the agreement ring, which also sends it its
/// block) fail naming both roots; ranks 1 and 2 agree with their root and with their
/// ring neighbours, and succeed, or fail naming both roots where a failing rank's
/// poison reaches them first.
#[test]
fn a_scatter_with_another_root_fails_the_rank_that_differs() {
    let out = disagree("root", 4);
    for r in [0, 3] {
        let (code, message) = &out[r];
        assert_eq!(*code, 5, "rank {r}: {message}");
        assert!(
            message.contains("called scatter with root 0, rank 3 with root 1"),
            "rank {r}: {message}"
        );
    }
    for r in 1..3 {
        let (code, message) = &out[r];
        assert!(
            *code == 0 || *code == 5 && message.contains("with root 0, rank 3 with root 1"),
            "rank {r}: {out:#?}"
        );
    }
}

/// Rooted calls where no data flows between ranks that disagree: every rank names
/// itself a broadcast's root (each only sends), or every rank names the next one a
/// gather's root (each sends, and the root it names never waits for it). On 2 and 4
/// ranks, over HALO's shared memory and over libfabric, every rank fails with haloInvalidUsage naming two ranks and their two roots,
/// within the time (none waits for its timeout): the 1-byte agreement message each
/// rank receives from the previous rank carries a root it does not name.
#[test]
fn ranks_that_disagree_on_the_root_fail_even_where_no_data_flows_between_them() {
    for (n, transport) in [(2usize, "shm"), (4, "shm"), (2, "fabric"), (4, "fabric")] {
        for (case, call) in [("bcastself", "broadcast"), ("gathercross", "gather")] {
            let out = disagree_over(case, n, transport);
            for (r, (code, message)) in out.iter().enumerate() {
                assert_eq!(
                    *code, 5,
                    "{case} on {n} over {transport}, rank {r}: {out:#?}"
                );
                let named = message
                    .split_once(&format!("called {call} with root "))
                    .and_then(|(_, rest)| rest.split_once(" with root "));
                assert!(named.is_some(), "{case} on {n}, rank {r}: {message}");
            }
            if n == 2 {
                let words = format!("rank 0 called {call} with root");
                for (r, (_, message)) in out.iter().enumerate() {
                    assert!(message.contains(&words), "{case}, rank {r}: {message}");
                }
            }
        }
    }
}

#[test]
fn abort_from_a_watchdog_thread_stops_a_blocked_collective() {
    let dir = scratch("abort2");
    let ranks = Job::new(2, &program("abort"))
        .env("HALO_TIMEOUT_MS", "60000")
        .run(&dir);
    assert_all_ok(&ranks, "abort ok");
}

/// valgrind's memcheck command line, or `None` (with the reason printed) when valgrind
/// is not installed.
fn valgrind() -> Option<Vec<String>> {
    if Command::new("valgrind").arg("--version").output().is_err() {
        halo_test_support::skip(
            "valgrind is not installed (bash scripts/deps.sh test installs it); \
             the C programs ran without memcheck",
        );
        return None;
    }
    let supp = root().join("ffi/tests/c/valgrind.supp");
    Some(
        [
            "valgrind",
            "--tool=memcheck",
            "--error-exitcode=99",
            "--leak-check=full",
            "--show-leak-kinds=definite",
            "--errors-for-leak-kinds=definite",
            "--num-callers=30",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("--suppressions={}", supp.display())])
        .collect(),
    )
}

#[test]
fn memcheck_is_clean() {
    let Some(vg) = valgrind() else { return };
    for (name, ok) in [
        ("alltoall", "alltoall ok"),
        ("errors", "errors ok"),
        ("collectives", "collectives ok"),
        ("abort", "abort ok"),
        ("nonblocking", "nonblocking ok"),
        ("device", "device ok"),
    ] {
        let dir = scratch(&format!("memcheck_{name}"));
        let ranks = Job::new(2, &program(name))
            .wrapped(vg.clone())
            .env("HALO_TIMEOUT_MS", "120000")
            .limit(Duration::from_secs(300))
            .run(&dir);
        assert_all_ok(&ranks, ok);
        for (r, rank) in ranks.iter().enumerate() {
            assert!(
                !rank.stderr.contains("ERROR SUMMARY: ")
                    || rank.stderr.contains("ERROR SUMMARY: 0 errors"),
                "valgrind found errors in {name} rank {r}:\n{}",
                rank.stderr
            );
        }
    }
}

/// The C program of the README's section "Using HALO from C".
fn readme_example() -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split_once("## Using HALO from C")
        .expect("README.md has a section \"Using HALO from C\"")
        .1;
    let code = section
        .split_once("```c\n")
        .expect("the section shows a C program")
        .1;
    code.split_once("```").unwrap().0.to_string()
}

/// `pkg-config ARGS` with `PKG_CONFIG_PATH` at `prefix`, split into arguments.
fn pkg_config(prefix: &Path, args: &[&str]) -> Vec<String> {
    let out = run_ok(
        Command::new("pkg-config")
            .args(args)
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")),
    );
    out.split_whitespace().map(str::to_string).collect()
}

#[test]
fn a_new_user_installs_builds_with_pkg_config_and_runs_4_ranks() {
    // As the README tells a new user: install with scripts/install-c.sh (here from what
    // cargo built, instead of a release build), compile the README's program through
    // pkg-config, run it on 4 ranks with `halo launch`.
    let started = Instant::now();
    let dir = scratch("new_user");
    let prefix = dir.join("prefix");
    run_ok(
        Command::new("bash")
            .arg(root().join("scripts/install-c.sh"))
            .arg("--from")
            .arg(lib_dir())
            .arg(&prefix),
    );
    for f in [
        "lib/libhalo.so",
        "lib/libhalo.a",
        "include/halo.h",
        "lib/pkgconfig/halo.pc",
        "lib/pkgconfig/halo-static.pc",
    ] {
        assert!(prefix.join(f).is_file(), "install-c.sh did not install {f}");
    }
    let version = pkg_config(&prefix, &["--modversion", "halo"]);
    assert_eq!(version, [env!("CARGO_PKG_VERSION")]);

    let src = dir.join("alltoallv.c");
    std::fs::write(&src, readme_example()).unwrap();
    let dynamic = dir.join("alltoallv");
    run_ok(
        Command::new("gcc")
            .args(CFLAGS)
            .arg(&src)
            .args(pkg_config(&prefix, &["--cflags", "--libs", "halo"]))
            .arg("-o")
            .arg(&dynamic),
    );
    // `halo launch -n 4 -- ./alltoallv`, through the library behind the command.
    let spec = halo_cli::launch::LaunchSpec::new(
        4,
        vec![
            "env".into(),
            format!("LD_LIBRARY_PATH={}", prefix.join("lib").display()),
            dynamic.display().to_string(),
        ],
    );
    let report = halo_cli::launch::launch(&spec, &halo_cli::launch::Interrupt::new())
        .expect("halo launch starts the ranks");
    assert_eq!(
        report.outcome,
        halo_cli::launch::Outcome::Success,
        "the README's all-to-all-v failed under halo launch"
    );

    // The same program linked statically (halo-static.pc): no libhalo.so needed.
    let fixed = dir.join("alltoallv-static");
    run_ok(
        Command::new("gcc")
            .args(CFLAGS)
            .arg(&src)
            .args(pkg_config(&prefix, &["--cflags", "--libs", "halo-static"]))
            .arg("-o")
            .arg(&fixed),
    );
    let ranks = Job::new(4, &fixed).run(&dir);
    assert_all_ok(&ranks, "all correct");
    println!("installed, built and ran in {:?}", started.elapsed());
}
