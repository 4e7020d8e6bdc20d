//! The hybrid transport across real processes (root): HALO's shared-memory rings
//! between the ranks of each host, libfabric `tcp;ofi_rxm` between hosts.
//!
//! - `halo launch --hosts` (emulated hosts: network and UTS namespaces, veths) with
//!   `halo check` (every algorithm and automatic selection, all-to-all with a zero
//!   count and blocks larger than a ring, all-to-all-v with zero counts, byte-exact)
//!   on 2 hosts x 2 and 4 hosts x 2, by default (`auto`) and with
//!   `HALO_TRANSPORT=shm`: the provider to every peer, the messages each half carried
//!   (the transport's debug log: both halves carry some on every rank), and each
//!   host's veth counters against the payload that must cross it;
//! - a SIGKILLed job on emulated hosts leaves nothing in `/dev/shm` — killed in its
//!   loop, and a host's first rank killed during set-up while its segment file exists;
//! - a rank SIGKILLed in an all-to-all loop (ranks given host names with `unshare
//!   --uts`, on loopback): on the victim's host and on another host, every survivor
//!   fails with a remote error or a timeout, within the timeout.
//!
//! Abort, the timeout and size mismatches in one process: `tests/hybrid.rs` of `halo`.

use halo::host::files::{Kind, Name};
use halo_cli::check::{CheckOptions, pair_bytes};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const HALO: &str = env!("CARGO_BIN_EXE_halo");

const COUNTS: &[usize] = &[0, 1, 7, 1500, 70_000];

fn check_options() -> CheckOptions {
    CheckOptions {
        counts: COUNTS.to_vec(),
        v_max: 24,
        v_rounds: 2,
        ..CheckOptions::default()
    }
}

fn check_args() -> Vec<String> {
    let counts: Vec<String> = COUNTS.iter().map(usize::to_string).collect();
    [
        "check",
        "--algo",
        "all",
        "--counts",
        &counts.join(","),
        "--v-max",
        "24",
        "--v-rounds",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

macro_rules! need_namespaces {
    () => {
        if let Some(why) = halo_cli::launch::emulation_unavailable() {
            halo_test_support::skip(&format!("namespaces unavailable: {why}"));
            return;
        }
    };
}

fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hybrid")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[derive(Debug)]
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

fn start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Child {
    Command::new(HALO)
        .arg("launch")
        .args(["--timeout", "150"])
        .args(args)
        .env_remove("HALO_TRANSPORT")
        .env_remove("HALO_FABRIC_PROVIDER")
        .env_remove("HALO_DEBUG")
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
            // SIGINT: the launcher tears its namespaces down.
            signal(child.id(), nix::sys::signal::Signal::SIGINT);
            std::thread::sleep(Duration::from_secs(10));
            let _ = child.kill();
            let _ = child.wait();
            panic!("halo launch ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

fn finish(dir: &Path, mut child: Child, limit: Duration) -> Run {
    let status = wait_for(&mut child, limit);
    Run {
        status,
        stdout: std::fs::read_to_string(dir.join("stdout")).unwrap_or_default(),
        stderr: std::fs::read_to_string(dir.join("stderr")).unwrap_or_default(),
    }
}

/// The number after `key=` in `line`.
fn field(line: &str, key: &str) -> Option<u64> {
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// `halo check` on `n` ranks on `hosts` emulated hosts (`per` ranks each) with `env`.
fn emulated_check(n: usize, hosts: usize, env: &[(&str, &str)]) {
    let dir = scratch(&format!("check_{n}_on_{hosts}"));
    let json = dir.join("stats.json");
    let per = n / hosts;
    let (nn, h) = (n.to_string(), hosts.to_string());
    let mut args: Vec<&str> = vec![
        "-n",
        &nn,
        "--hosts",
        &h,
        "--stats-json",
        json.to_str().unwrap(),
        "--",
        HALO,
    ];
    let check = check_args();
    args.extend(check.iter().map(String::as_str));
    let mut env = env.to_vec();
    env.push(("HALO_DEBUG", "warn,halo::transport::hybrid=debug"));
    let started = Instant::now();
    let run = finish(&dir, start(&dir, &args, &env), Duration::from_secs(240));
    assert!(
        run.status.success(),
        "{n} ranks on {hosts} hosts {env:?}: {:?}\nstdout:\n{}\nstderr:\n{}",
        run.status,
        run.stdout,
        run.stderr
    );
    let opts = check_options();
    let per_rank = opts.algorithms.len() * (opts.counts.len() + opts.v_rounds);
    for r in 0..n {
        let prefix = format!("[{r}] rank {r}/{n}: ");
        let line = run
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("rank {r} printed no result:\n{}", run.stdout));
        let verified: usize = line.split(' ').next().unwrap().parse().unwrap();
        assert_eq!(verified, per_rank, "rank {r}: {line}");
        let peers: String = (0..n)
            .filter(|&p| p != r)
            .map(|p| {
                let prov = if p / per == r / per {
                    "halo-shm"
                } else {
                    "tcp;ofi_rxm"
                };
                format!("{p}:{prov}")
            })
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            line.contains(&format!("(peers {peers})")),
            "rank {r}: expected peers {peers}: {line}"
        );
        // What each half carried, from the transport's own count.
        let counted = run
            .stderr
            .lines()
            .find(|l| l.starts_with(&format!("[{r}]")) && l.contains("messages posted per half"))
            .unwrap_or_else(|| panic!("rank {r} logged no message counts:\n{}", run.stderr));
        let (shm, fabric) = (
            field(counted, "shm_messages").unwrap(),
            field(counted, "fabric_messages").unwrap(),
        );
        eprintln!("rank {r}: {shm} messages over the rings, {fabric} over the fabric");
        assert!(shm > 0 && fabric > 0, "rank {r}: {counted}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let stat = |h: usize, key: &str| v["hosts"][h][key].as_u64().unwrap();
    for host in 0..hosts {
        let inside = |r: usize| r / per == host;
        let out: u64 = (0..n)
            .filter(|&s| inside(s))
            .flat_map(|s| (0..n).filter(|&d| !inside(d)).map(move |d| (s, d)))
            .map(|(s, d)| pair_bytes(&opts, s, d))
            .sum();
        let (tx, rx) = (stat(host, "tx_bytes"), stat(host, "rx_bytes"));
        eprintln!("host{host}: tx {tx} B, rx {rx} B (payload out {out} B)");
        assert!(tx >= out && rx >= out, "host{host}: {tx} {rx} < {out}");
    }
    eprintln!(
        "{n} ranks on {hosts} hosts {env:?}: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn emulated_2_hosts_x_2_every_algorithm_byte_exact() {
    need_namespaces!();
    emulated_check(4, 2, &[]);
    // `shm` forced on a job across hosts: the rings inside each host, as `auto`.
    emulated_check(4, 2, &[("HALO_TRANSPORT", "shm")]);
}

#[test]
fn emulated_4_hosts_x_2_every_algorithm_byte_exact() {
    need_namespaces!();
    emulated_check(8, 4, &[]);
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
fn emulated_sigkilled_job_leaves_no_shared_memory() {
    need_namespaces!();
    // 1. Every rank SIGKILLed by this test while the loop runs.
    let dir = scratch("kill_all");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    let script = rank_script(&dir, None, "--counts 64 --v-rounds 0 --loop 100000000");
    let mut child = start(
        &dir,
        &["-n", "4", "--hosts", "2", "--", "sh", "-c", &script],
        &[],
    );
    let pids = rank_pids(&dir, 4, Duration::from_secs(60));
    // Wait until every rank is in the loop (the segments mapped, their files gone).
    let t = Instant::now();
    while shm_files_of(&pids).iter().any(|f| is_segment(f)) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{:?}",
            shm_files_of(&pids)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1000));
    assert!(child.try_wait().unwrap().is_none(), "the job ended early");
    for &p in &pids {
        signal(p, nix::sys::signal::Signal::SIGKILL);
    }
    let st = wait_for(&mut child, Duration::from_secs(60));
    assert_eq!(st.code(), Some(137), "{st:?}");
    let left = shm_files_of(&pids);
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");

    // 2. Host 1's first rank (2) SIGKILLed during set-up, while its segment file
    //    exists: it waits at the bootstrap for rank 3, which starts 20 s late.
    let dir = scratch("kill_setup");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    let script = rank_script(&dir, Some((3, 20)), "--counts 1 --v-rounds 0");
    let mut child = start(
        &dir,
        &["-n", "4", "--hosts", "2", "--", "sh", "-c", &script],
        &[],
    );
    let pids = rank_pids(&dir, 4, Duration::from_secs(60));
    let t = Instant::now();
    let segment = loop {
        if let Some(f) = shm_files_of(&pids[2..3])
            .into_iter()
            .find(|f| is_segment(f))
        {
            break f;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "rank 2 made no segment file"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    signal(pids[2], nix::sys::signal::Signal::SIGKILL);
    let st = wait_for(&mut child, Duration::from_secs(60));
    assert_eq!(st.code(), Some(137), "{st:?}");
    assert!(
        !Path::new("/dev/shm").join(&segment).exists(),
        "{segment} left in /dev/shm"
    );
    let left = shm_files_of(&pids);
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

/// The collectives' timeout in the fault trials, and what a survivor may take on top.
const FAULT_TIMEOUT: Duration = Duration::from_millis(2000);
const FAULT_SLACK: Duration = Duration::from_secs(4);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `n` ranks on hosts of `per` ranks (host names from `unshare --uts`, loopback)
/// loop over all-to-alls until rank `die` SIGKILLs itself during collective
/// `after`; every survivor must fail with a remote error or a timeout, within the
/// timeout (plus slack) of the death. Returns what each survivor reported.
fn kill_trial(
    dir: &Path,
    n: usize,
    per: usize,
    algo: &str,
    die: usize,
    after: usize,
) -> Vec<String> {
    let port = free_port();
    let timeout_ms = FAULT_TIMEOUT.as_millis().to_string();
    let (nn, dd, aa) = (n.to_string(), die.to_string(), after.to_string());
    let check = [
        "check",
        "--algo",
        algo,
        "--counts",
        "16,300,20000",
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
            Command::new("unshare")
                .args(["--uts", "sh", "-c", "hostname \"$0\" && exec \"$@\""])
                .arg(format!("hyhost{}", r / per))
                .arg(HALO)
                .args(check)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", &nn)
                .env("HALO_BOOTSTRAP_ADDR", format!("127.0.0.1:{port}"))
                .env("HALO_SECRET", "5b".repeat(32))
                .env("HALO_TIMEOUT_MS", &timeout_ms)
                .env("HALO_BOOTSTRAP_TIMEOUT_MS", "60000")
                .env("HALO_DEBUG", "warn,halo::transport::hybrid=info")
                .env_remove("HALO_TRANSPORT")
                .env_remove("HALO_FABRIC_PROVIDER")
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
    let start = Instant::now();
    let mut ended: Vec<Option<(ExitStatus, Instant)>> = vec![None; n];
    let poll = |ended: &mut Vec<Option<(ExitStatus, Instant)>>, ranks: &mut Vec<Child>| {
        for r in 0..n {
            if ended[r].is_none()
                && let Some(st) = ranks[r].try_wait().unwrap()
            {
                ended[r] = Some((st, Instant::now()));
            }
        }
    };
    while ended[die].is_none() {
        poll(&mut ended, &mut ranks);
        if start.elapsed() > Duration::from_secs(90) {
            kill_all(&mut ranks);
            panic!("rank {die} did not die within 90 s");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let (st, death) = ended[die].unwrap();
    let err = |r: usize| std::fs::read_to_string(dir.join(format!("err.{r}"))).unwrap_or_default();
    assert_eq!(st.signal(), Some(9), "rank {die}: {st:?}\n{}", err(die));
    while ended.iter().any(Option::is_none) && death.elapsed() < Duration::from_secs(60) {
        poll(&mut ended, &mut ranks);
        std::thread::sleep(Duration::from_millis(2));
    }
    let hung: Vec<usize> = (0..n).filter(|&r| ended[r].is_none()).collect();
    kill_all(&mut ranks);
    assert!(
        hung.is_empty(),
        "ranks {hung:?} still ran 60 s after rank {die} died"
    );
    let mut report = Vec::new();
    for r in (0..n).filter(|&r| r != die) {
        let (st, at) = ended[r].unwrap();
        let text = err(r);
        // Every rank was on the hybrid transport.
        assert!(
            text.contains("hybrid transport ready"),
            "rank {r} not on the hybrid transport:\n{text}"
        );
        assert_eq!(st.code(), Some(1), "survivor {r}: {st:?}\n{text}");
        let what = text
            .lines()
            .rev()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_else(|| panic!("survivor {r} printed no error:\n{text}"));
        assert!(
            what.contains("remote error from rank") || what.contains("timeout after"),
            "survivor {r}: {what}"
        );
        let took = at.saturating_duration_since(death);
        assert!(
            took <= FAULT_TIMEOUT + FAULT_SLACK,
            "survivor {r} took {took:?}: {what}"
        );
        report.push(format!(
            "{r}{}: {:.2} s {}",
            if r / per == die / per {
                " (same host)"
            } else {
                ""
            },
            took.as_secs_f64(),
            if what.contains("remote error") {
                "remote"
            } else {
                "timeout"
            }
        ));
    }
    // The victim's files (its doorbell, libfabric's region) are for the next process
    // with its pid to remove; nothing of the rings' segments stays (unlinked once
    // mapped).
    let pids: Vec<u32> = ranks.iter().map(Child::id).collect();
    let segments: Vec<String> = shm_files_of(&pids)
        .into_iter()
        .filter(|f| is_segment(f))
        .collect();
    assert!(segments.is_empty(), "segments left: {segments:?}");
    eprintln!(
        "trial n={n} per={per} {algo} die={die} after={after}: {}",
        report.join(", ")
    );
    report
}

#[test]
fn sigkilled_rank_on_the_same_host_and_on_another_host() {
    need_namespaces!();
    let dir = scratch("kill_trials");
    // 2 hosts x 2, flat (every receive posted at once, so the victim's host mate
    // waits for it on the rings unless the victim's message to it got into the ring
    // before the signal landed — a race the signal's delay of 0-500 us, stretched by
    // a loaded machine, cannot rule out; then the mate waits for the other host's
    // ranks, which failed, and may time out): rank 1 dies (rank 0 is on its host),
    // then rank 2 (host 1's first), then rank 0.
    let mut seen = Vec::new();
    for (die, after) in [(1, 5), (2, 13), (0, 0)] {
        let report = kill_trial(&dir, 4, 2, "flat", die, after);
        // The same-host survivor sees the death itself (the rings watch the process).
        let mate = die ^ 1;
        let remote = report
            .iter()
            .any(|l| l.starts_with(&format!("{mate} (same host)")) && l.ends_with("remote"));
        seen.push((die, remote, report));
    }
    assert!(
        seen.iter().filter(|(_, remote, _)| *remote).count() >= 2,
        "the victim's host mate should report a remote error in at least two of three \
         trials: {seen:?}"
    );
    // 4 hosts x 2, every algorithm in turn.
    kill_trial(&dir, 8, 2, "all", 5, 9);
    kill_trial(&dir, 8, 2, "all", 2, 17);
}
