//! The libfabric transport across real processes: `halo launch` + `halo check`
//! (every algorithm, all-to-all and all-to-all-v with zero counts, byte-exact) over
//! `shm`, over `tcp;ofi_rxm` and on emulated hosts (shm inside a host, tcp between,
//! with the veths' byte counters checked against what the check must move between
//! hosts); faults (a rank SIGKILLed in the middle of an all-to-all loop, abort from
//! another thread, the communicator after a failure); the progress strategies.
//!
//! The emulated-host tests and the tests that give ranks their own host names skip
//! with a printed reason when not root or when namespaces cannot be created.
//!
//! Over 800 lines: every test drives the same launch-and-check helpers and the
//! emulated-host set-up (namespaces, veths, byte counters); one binary builds them once.

use halo::host::files::{Kind, Name};
use halo::{Communicator, Error, InitConfig, TransportChoice, UniqueId};
use halo_cli::check::{CheckOptions, pair_bytes};
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const HALO: &str = env!("CARGO_BIN_EXE_halo");

/// Every algorithm (and automatic selection), uniform counts with a zero, -v rounds
/// with zero counts: small, because the tests run the debug build.
const CHECK: &[&str] = &[
    "check",
    "--algo",
    "all",
    "--counts",
    "0,1,7,1500",
    "--v-max",
    "24",
    "--v-rounds",
    "2",
];

/// [`CHECK`] as options (for the bytes it moves and the collectives it runs).
fn check_options() -> CheckOptions {
    CheckOptions {
        counts: vec![0, 1, 7, 1500],
        v_max: 24,
        v_rounds: 2,
        ..CheckOptions::default()
    }
}

fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("fabric")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A finished `halo launch`.
#[derive(Debug)]
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// Runs `halo launch ARGS -- halo CHECK...` with `env`; the launcher's own `--timeout`
/// kills a hung job, and a guard here interrupts the launcher if even that fails.
fn launch(dir: &Path, args: &[&str], check: &[&str], env: &[(&str, &str)]) -> Run {
    let out = std::fs::File::create(dir.join("stdout")).unwrap();
    let err = std::fs::File::create(dir.join("stderr")).unwrap();
    let started = Instant::now();
    let mut child = Command::new(HALO)
        .arg("launch")
        .args(["--timeout", "150"])
        .args(args)
        .arg("--")
        .arg(HALO)
        .args(check)
        // The libfabric transport (HALO's own shared memory would carry same-host
        // peers by default; its tests are in shm.rs).
        .env("HALO_TRANSPORT", "fabric")
        .envs(env.iter().copied())
        .env_remove("HALO_DEBUG")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("start halo launch");
    let status = wait_for(&mut child, started + Duration::from_secs(180)).unwrap_or_else(|| {
        // SIGINT: the launcher tears its namespaces down.
        signal(child.id(), nix::sys::signal::Signal::SIGINT);
        let st = wait_for(&mut child, Instant::now() + Duration::from_secs(15));
        if st.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("halo launch {args:?} ran past 180 s");
    });
    Run {
        status,
        stdout: std::fs::read_to_string(dir.join("stdout")).unwrap(),
        stderr: std::fs::read_to_string(dir.join("stderr")).unwrap(),
        elapsed: started.elapsed(),
    }
}

fn wait_for(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Signals a process this test started, by its id.
fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

/// What rank `r` of `n` printed: collectives verified, bytes, and the provider to
/// each peer.
#[derive(Debug)]
struct RankLine {
    collectives: usize,
    providers: Vec<(usize, String)>,
}

fn rank_lines(run: &Run, n: usize) -> Vec<RankLine> {
    (0..n)
        .map(|r| {
            let prefix = format!("[{r}] rank {r}/{n}: ");
            let line = run
                .stdout
                .lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .unwrap_or_else(|| {
                    panic!(
                        "rank {r} printed no result\nstdout:\n{}\nstderr:\n{}",
                        run.stdout, run.stderr
                    )
                });
            let collectives = line
                .split(' ')
                .next()
                .and_then(|c| c.parse().ok())
                .unwrap_or_else(|| panic!("{line}"));
            let peers = line
                .split_once("(peers ")
                .and_then(|(_, p)| p.split_once(')'))
                .map(|(p, _)| p)
                .unwrap_or_else(|| panic!("{line}"));
            let providers = peers
                .split(' ')
                .filter(|s| !s.is_empty())
                .map(|s| {
                    let (p, prov) = s.split_once(':').unwrap_or_else(|| panic!("{line}"));
                    (p.parse().unwrap(), prov.to_string())
                })
                .collect();
            RankLine {
                collectives,
                providers,
            }
        })
        .collect()
}

/// Collectives one rank runs in [`CHECK`].
fn collectives_per_rank() -> usize {
    let o = check_options();
    o.algorithms.len() * (o.counts.len() + o.v_rounds)
}

/// Runs [`CHECK`] on `n` ranks and checks that every rank verified everything, with
/// `provider(rank, peer)` to each peer. Returns the run.
#[track_caller]
fn check_job(
    dir: &Path,
    n: usize,
    launch_args: &[&str],
    env: &[(&str, &str)],
    provider: impl Fn(usize, usize) -> &'static str,
) -> Run {
    let nn = n.to_string();
    let mut args = vec!["-n", nn.as_str()];
    args.extend_from_slice(launch_args);
    let run = launch(dir, &args, CHECK, env);
    assert!(
        run.status.success(),
        "halo check on {n} ranks {launch_args:?} {env:?} failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        run.status,
        run.stdout,
        run.stderr
    );
    for (r, line) in rank_lines(&run, n).into_iter().enumerate() {
        assert_eq!(line.collectives, collectives_per_rank(), "rank {r}");
        let want: Vec<(usize, String)> = (0..n)
            .filter(|&p| p != r)
            .map(|p| (p, provider(r, p).to_string()))
            .collect();
        assert_eq!(line.providers, want, "rank {r}: provider per peer");
    }
    eprintln!(
        "{n} ranks {launch_args:?} {env:?}: {:.1} s",
        run.elapsed.as_secs_f64()
    );
    run
}

#[test]
fn shm_every_algorithm_byte_exact_on_2_3_4_8_processes() {
    let dir = scratch("shm");
    for n in [2, 3, 4, 8] {
        check_job(&dir, n, &[], &[], |_, _| "shm");
    }
}

#[test]
fn tcp_rxm_every_algorithm_byte_exact_on_2_3_4_8_processes() {
    let dir = scratch("tcp");
    for n in [2, 3, 4, 8] {
        check_job(
            &dir,
            n,
            &[],
            &[("HALO_FABRIC_PROVIDER", "tcp;ofi_rxm")],
            |_, _| "tcp;ofi_rxm",
        );
    }
}

#[test]
fn every_progress_strategy_is_byte_exact() {
    let dir = scratch("progress");
    for progress in ["spin", "yield", "sleep", "block"] {
        for (provider, name) in [("shm", "shm"), ("tcp;ofi_rxm", "tcp;ofi_rxm")] {
            check_job(
                &dir,
                3,
                &[],
                &[
                    ("HALO_PROGRESS", progress),
                    ("HALO_FABRIC_PROVIDER", provider),
                ],
                |_, _| name,
            );
        }
    }
    // A wrong value is refused at init, naming the variable.
    let run = launch(&dir, &["-n", "2"], &["check"], &[("HALO_PROGRESS", "busy")]);
    assert!(!run.status.success(), "{}", run.stdout);
    assert!(
        run.stderr.contains("HALO_PROGRESS=\"busy\""),
        "{}",
        run.stderr
    );
}

// ---------------------------------------------------------------------------
// Emulated hosts
// ---------------------------------------------------------------------------

macro_rules! need_namespaces {
    () => {
        if let Some(why) = halo_cli::launch::emulation_unavailable() {
            halo_test_support::skip(&format!("namespaces unavailable: {why}"));
            return;
        }
    };
}

/// Runs [`CHECK`] on `n` ranks on `hosts` emulated hosts and checks the providers (shm
/// inside a host, tcp between) and that each host's veth carried at least the check's
/// payload between its ranks and the others, both ways.
fn emulated_check(n: usize, hosts: usize) {
    let dir = scratch(&format!("emulated_{n}_on_{hosts}"));
    let json = dir.join("stats.json");
    let per = n / hosts;
    let h = hosts.to_string();
    let run = check_job(
        &dir,
        n,
        &["--hosts", &h, "--stats-json", json.to_str().unwrap()],
        &[],
        |r, p| {
            if r / per == p / per {
                "shm"
            } else {
                "tcp;ofi_rxm"
            }
        },
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let opts = check_options();
    let stat = |h: usize, key: &str| v["hosts"][h][key].as_u64().unwrap();
    for host in 0..hosts {
        let ranks: Vec<usize> = v["hosts"][host]["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(ranks, (host * per..(host + 1) * per).collect::<Vec<_>>());
        let inside = |r: usize| ranks.contains(&r);
        // Payload only: headers, the -v metadata passes and forwarding come on top.
        let out: u64 = (0..n)
            .filter(|&s| inside(s))
            .flat_map(|s| (0..n).filter(|&d| !inside(d)).map(move |d| (s, d)))
            .map(|(s, d)| pair_bytes(&opts, s, d))
            .sum();
        let into: u64 = (0..n)
            .filter(|&s| !inside(s))
            .flat_map(|s| (0..n).filter(|&d| inside(d)).map(move |d| (s, d)))
            .map(|(s, d)| pair_bytes(&opts, s, d))
            .sum();
        // Large enough that a bypass shows: without the collectives' traffic a veth
        // carries only the bootstrap exchange and connection set-up (a few KB).
        assert!(out > 100_000 && into > 100_000, "{out} {into}");
        let (tx, rx) = (stat(host, "tx_bytes"), stat(host, "rx_bytes"));
        eprintln!("host{host}: tx {tx} B (payload out {out} B), rx {rx} B (payload in {into} B)");
        assert!(
            tx >= out,
            "host{host} sent {tx} B over its veth, less than the {out} B of payload its ranks \
             send to other hosts: inter-host traffic bypassed the network\n{}",
            run.stderr
        );
        assert!(
            rx >= into,
            "host{host} received {rx} B over its veth, less than the {into} B of payload sent \
             to its ranks from other hosts\n{}",
            run.stderr
        );
    }
}

#[test]
fn emulated_2_hosts_shm_inside_tcp_between_crosses_the_veths() {
    need_namespaces!();
    emulated_check(4, 2);
}

#[test]
fn emulated_4_hosts_shm_inside_tcp_between_crosses_the_veths() {
    need_namespaces!();
    emulated_check(8, 4);
}

// ---------------------------------------------------------------------------
// Faults: a rank SIGKILLed in the middle of an all-to-all loop
// ---------------------------------------------------------------------------

/// The collectives' timeout in the fault tests.
const FAULT_TIMEOUT: Duration = Duration::from_millis(2000);

/// Time on top of [`FAULT_TIMEOUT`] a survivor may take to report and exit (debug
/// build, two shared cores).
const FAULT_SLACK: Duration = Duration::from_secs(4);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One trial: `n` ranks started here (not through `halo launch`, which would
/// terminate the survivors itself) loop over all-to-alls until rank `die` SIGKILLs
/// itself during collective `after`. Every survivor must exit with an error that is a
/// remote error or a timeout, within the timeout (plus slack) of the death. With
/// `own_hosts` each rank gets its own host name (a UTS namespace), so every peer is
/// remote: tcp, and no watching of processes on the same host.
fn kill_trial(
    dir: &Path,
    n: usize,
    die: usize,
    after: usize,
    env: &[(&str, &str)],
    own_hosts: bool,
) {
    let port = free_port();
    let timeout_ms = FAULT_TIMEOUT.as_millis().to_string();
    let (nn, dd, aa) = (n.to_string(), die.to_string(), after.to_string());
    let check = [
        "check",
        "--algo",
        "all",
        "--counts",
        "16,300",
        "--v-max",
        "40",
        "--v-rounds",
        "1",
        "--loop",
        "1000000",
        "--die-rank",
        &dd,
        "--die-after",
        &aa,
    ];
    let mut ranks: Vec<Child> = (0..n)
        .map(|r| {
            let mut cmd = if own_hosts {
                let mut c = Command::new("unshare");
                c.args(["--uts", "sh", "-c", "hostname \"$0\" && exec \"$@\""])
                    .arg(format!("faulthost{r}"))
                    .arg(HALO);
                c
            } else {
                Command::new(HALO)
            };
            cmd.args(check)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", &nn)
                .env("HALO_BOOTSTRAP_ADDR", format!("127.0.0.1:{port}"))
                .env("HALO_SECRET", "5a".repeat(32))
                .env("HALO_TIMEOUT_MS", &timeout_ms)
                .env("HALO_BOOTSTRAP_TIMEOUT_MS", "60000")
                .env("HALO_TRANSPORT", "fabric")
                .envs(env.iter().copied())
                .env_remove("HALO_DEBUG")
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(dir.join(format!("out.{r}"))).unwrap())
                .stderr(std::fs::File::create(dir.join(format!("err.{r}"))).unwrap())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let kill_all = |ranks: &mut Vec<Child>| {
        for c in ranks.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    };
    // The victim dies by its own hand once every rank is in the loop.
    let start = Instant::now();
    let mut ended: Vec<Option<(ExitStatus, Instant)>> = vec![None; n];
    while ended[die].is_none() {
        for r in 0..n {
            if ended[r].is_none()
                && let Some(st) = ranks[r].try_wait().unwrap()
            {
                ended[r] = Some((st, Instant::now()));
            }
        }
        if start.elapsed() > Duration::from_secs(90) {
            kill_all(&mut ranks);
            panic!("trial n={n} die={die} after={after}: rank {die} did not die within 90 s");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let (st, death) = ended[die].unwrap();
    let err = |r: usize| std::fs::read_to_string(dir.join(format!("err.{r}"))).unwrap_or_default();
    assert_eq!(
        st.signal(),
        Some(9),
        "rank {die} should have been SIGKILLed during collective {after}: {st:?}\n{}",
        err(die)
    );
    let hang_limit = death + Duration::from_secs(60);
    while ended.iter().any(Option::is_none) && Instant::now() < hang_limit {
        for r in 0..n {
            if ended[r].is_none()
                && let Some(st) = ranks[r].try_wait().unwrap()
            {
                ended[r] = Some((st, Instant::now()));
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let hung: Vec<usize> = (0..n).filter(|&r| ended[r].is_none()).collect();
    kill_all(&mut ranks);
    assert!(
        hung.is_empty(),
        "trial n={n} die={die} after={after}: ranks {hung:?} still ran 60 s after rank {die} died"
    );
    let mut report = Vec::new();
    let mut by_watchdog = Vec::new();
    for r in (0..n).filter(|&r| r != die) {
        let (st, at) = ended[r].unwrap();
        let took = at.saturating_duration_since(death);
        let text = err(r);
        assert_eq!(
            st.code(),
            Some(1),
            "survivor {r} should exit with status 1 (an error): {st:?}\n{text}"
        );
        // The error `halo check` prints, or — when the victim died holding one of shm's
        // locks and this rank's provider call spins on it — the watchdog's report.
        let what = text
            .lines()
            .rev()
            .find(|l| l.starts_with("error:") || l.starts_with("halo watchdog:"))
            .unwrap_or_else(|| panic!("survivor {r} printed no error:\n{text}"));
        let watchdog = what.starts_with("halo watchdog:");
        assert!(
            what.contains("remote error from rank")
                || what.contains("timeout after")
                || (watchdog && what.contains("has not returned")),
            "survivor {r}: expected a remote error, a timeout or the watchdog, got: {what}"
        );
        if watchdog {
            // `_exit` skips destructors: its doorbell file stays for the next
            // process's clean-up.
            by_watchdog.push(ranks[r].id());
        }
        assert!(
            took <= FAULT_TIMEOUT + FAULT_SLACK,
            "survivor {r} took {took:?} after the death to fail (timeout {FAULT_TIMEOUT:?}): {what}"
        );
        report.push(format!(
            "{r}: {:.2} s {}",
            took.as_secs_f64(),
            if watchdog {
                "watchdog"
            } else if what.contains("remote error") {
                "remote"
            } else {
                "timeout"
            }
        ));
    }
    // Survivors removed their doorbell files (`block`) on their way out.
    let pids: Vec<u32> = (0..n)
        .filter(|&r| r != die)
        .map(|r| ranks[r].id())
        .filter(|p| !by_watchdog.contains(p))
        .collect();
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|f| {
                    Name::parse(f).is_some_and(|b| b.kind == Kind::Bell && pids.contains(&b.pid))
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "doorbell files left by survivors: {left:?}"
    );
    // What the ranks that could not clean up (the victim; any the watchdog ended) left
    // in /dev/shm: the shm provider's region and the doorbell.
    remove_leftovers(ranks[die].id());
    for p in by_watchdog {
        remove_leftovers(p);
    }
    eprintln!(
        "trial n={n} die={die} after={after} {env:?}: {}",
        report.join(", ")
    );
}

/// Removes the /dev/shm files of a process of this test that died without removing
/// them: the shm provider's regions (`PID:N:M`) and HALO's doorbells.
fn remove_leftovers(pid: u32) {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for e in dir.flatten() {
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        let region = name
            .strip_prefix(&format!("{pid}:"))
            .is_some_and(|r| r.chars().all(|c| c.is_ascii_digit() || c == ':'));
        let bell = Name::parse(&name).is_some_and(|b| b.kind == Kind::Bell && b.pid == pid);
        if region || bell {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[test]
fn sigkilled_rank_survivors_fail_fast_shm() {
    let dir = scratch("kill_shm");
    for (die, after) in [(2, 0), (1, 7), (3, 19), (0, 42)] {
        kill_trial(&dir, 4, die, after, &[], false);
    }
    kill_trial(&dir, 8, 5, 11, &[], false);
}

/// The same over HALO's shared-memory transport (`HALO_TRANSPORT=shm`).
#[test]
fn sigkilled_rank_survivors_fail_fast_halo_shm() {
    let dir = scratch("kill_halo_shm");
    let env = [("HALO_TRANSPORT", "shm")];
    for (die, after) in [(2, 0), (1, 7), (3, 19), (0, 42)] {
        kill_trial(&dir, 4, die, after, &env, false);
    }
    kill_trial(&dir, 8, 5, 11, &env, false);
}

#[test]
fn sigkilled_rank_survivors_fail_fast_tcp() {
    let dir = scratch("kill_tcp");
    for (die, after) in [(1, 3), (2, 17)] {
        kill_trial(
            &dir,
            4,
            die,
            after,
            &[("HALO_FABRIC_PROVIDER", "tcp;ofi_rxm")],
            false,
        );
    }
}

#[test]
fn sigkilled_rank_on_another_host_survivors_time_out() {
    need_namespaces!();
    let dir = scratch("kill_hosts");
    for (die, after) in [(3, 5), (0, 14)] {
        kill_trial(&dir, 4, die, after, &[], true);
    }
}

#[test]
fn sigkilled_rank_under_the_launcher_is_reported() {
    let dir = scratch("kill_launcher");
    let run = launch(
        &dir,
        &["-n", "4"],
        &[
            "check",
            "--counts",
            "16",
            "--v-rounds",
            "1",
            "--loop",
            "1000000",
            "--die-rank",
            "2",
            "--die-after",
            "9",
        ],
        &[("HALO_TIMEOUT_MS", "2000")],
    );
    // The launcher reports the first failure it sees: rank 2's SIGKILL (137), or —
    // when a survivor noticed the death and exited within the launcher's polling
    // interval — that survivor's error (1).
    let ok = match run.status.code() {
        Some(137) => run
            .stderr
            .contains("rank 2 was killed by signal 9 (SIGKILL) (status 137)"),
        Some(1) => (0..4).any(|r| {
            r != 2
                && run
                    .stderr
                    .contains(&format!("rank {r} exited with status 1;"))
        }),
        _ => false,
    };
    assert!(
        ok,
        "{:?}\nstdout:\n{}\nstderr:\n{}",
        run.status, run.stdout, run.stderr
    );
    assert!(run.elapsed < Duration::from_secs(60), "{:?}", run.elapsed);
}

#[test]
fn stale_shm_region_of_an_earlier_process_with_the_same_pid_is_replaced() {
    // A rank killed earlier leaves /dev/shm/PID:0:0; a later process that gets the same
    // id could not create its shm region (fi_enable: EBUSY). Each rank plants such a
    // file for its own id, dated before it started, then becomes `halo check`.
    let plant = format!(
        "truncate -s 1M /dev/shm/$$:0:0 && touch -d @1000000000 /dev/shm/$$:0:0 && exec {HALO} \"$@\""
    );
    let out = Command::new(HALO)
        .args([
            "launch",
            "--timeout",
            "60",
            "-n",
            "2",
            "--",
            "sh",
            "-c",
            &plant,
            "sh",
        ])
        .args([
            "check",
            "--algo",
            "flat",
            "--counts",
            "1",
            "--v-rounds",
            "0",
        ])
        .env_remove("HALO_DEBUG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..2 {
        assert!(
            stdout.contains(&format!("rank {r}/2: 1 collectives verified")),
            "{stdout}"
        );
    }
}

// ---------------------------------------------------------------------------
// In one process: two ranks as threads over the fabric transport
// ---------------------------------------------------------------------------

/// Two communicators of one job in this process; rank 1 joins and then does nothing
/// but wait until `release` fires (it never enters a collective).
fn pair(config: &InitConfig) -> (Communicator, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let root: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let id = UniqueId::new_on(root).unwrap();
    let (release, wait) = mpsc::channel::<()>();
    let (c1, id1) = (config.clone(), id);
    let idle = std::thread::spawn(move || {
        let comm = Communicator::init_rank_with(&id1, 2, 1, &c1).expect("rank 1 init");
        let _ = wait.recv();
        drop(comm);
    });
    let comm = Communicator::init_rank_with(&id, 2, 0, config).expect("rank 0 init");
    (comm, release, idle)
}

fn config(provider: Option<&str>, timeout: Duration) -> InitConfig {
    let mut c = InitConfig {
        transport: TransportChoice::Fabric,
        ..InitConfig::default()
    };
    if let Some(p) = provider {
        c.fabric.force(p);
    }
    c.timeout = timeout;
    c.bootstrap_timeout = Duration::from_secs(30);
    c
}

#[test]
fn abort_from_another_thread_returns_within_a_second() {
    for (provider, shm) in [(None, false), (Some("tcp;ofi_rxm"), false), (None, true)] {
        let mut c = config(provider, Duration::from_secs(60));
        if shm {
            c.transport = TransportChoice::Shm;
        }
        let (mut comm, release, idle) = pair(&c);
        let provider = (provider, comm.provider_to(1).map(str::to_string));
        let handle = comm.abort_handle();
        let (tx, rx) = mpsc::channel();
        let aborter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            tx.send(Instant::now()).unwrap();
            handle.abort();
        });
        let send = vec![7u64; 2 * 512];
        let mut recv = vec![0u64; 2 * 512];
        let r = comm.all_to_all(&send, &mut recv);
        let returned = Instant::now();
        let aborted_at = rx.recv().unwrap();
        aborter.join().unwrap();
        let took = returned.saturating_duration_since(aborted_at);
        assert!(
            matches!(r, Err(Error::Aborted { .. })),
            "{provider:?}: expected Aborted, got {r:?}"
        );
        assert!(
            took < Duration::from_secs(1),
            "{provider:?}: returned {took:?} after the abort"
        );
        eprintln!("{provider:?}: all_to_all returned {took:?} after abort()");
        // Every later call says so at once.
        let r = comm.all_to_all(&send, &mut recv);
        assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
        release.send(()).unwrap();
        idle.join().unwrap();
    }
}

#[test]
fn communicator_is_unusable_after_a_failure() {
    for (provider, shm) in [(None, false), (Some("tcp;ofi_rxm"), false), (None, true)] {
        let timeout = Duration::from_millis(400);
        let mut c = config(provider, timeout);
        if shm {
            c.transport = TransportChoice::Shm;
        }
        let (mut comm, release, idle) = pair(&c);
        let provider = (provider, comm.provider_to(1).map(str::to_string));
        let send = vec![1u32; 2 * 64];
        let mut recv = vec![0u32; 2 * 64];
        let t = Instant::now();
        let r = comm.all_to_all(&send, &mut recv);
        let took = t.elapsed();
        match &r {
            Err(e @ Error::Timeout { peer, .. }) => {
                assert_eq!(*peer, Some(1), "{e}");
            }
            other => panic!("{provider:?}: expected a timeout naming rank 1, got {other:?}"),
        }
        assert!(
            took < timeout + Duration::from_secs(2),
            "{provider:?}: took {took:?}"
        );
        // Rank 1 is still there, but this communicator's collective state is gone:
        // later calls fail at once, saying why.
        for _ in 0..2 {
            let t = Instant::now();
            let r = comm.all_to_all(&send, &mut recv);
            assert!(
                t.elapsed() < Duration::from_millis(200),
                "{:?}",
                t.elapsed()
            );
            match r {
                Err(Error::InvalidUsage { message, .. }) => {
                    assert!(
                        message.contains("can no longer be used")
                            && message.contains("did not complete")
                            && message.contains("[1]"),
                        "{message}"
                    );
                }
                other => panic!("{provider:?}: expected InvalidUsage, got {other:?}"),
            }
        }
        let r = comm.barrier();
        assert!(matches!(r, Err(Error::InvalidUsage { .. })), "{r:?}");
        release.send(()).unwrap();
        idle.join().unwrap();
    }
}
