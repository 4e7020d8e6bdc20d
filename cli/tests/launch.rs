//! `halo launch`, run as a program: real processes, and — as root, where network
//! namespaces work — real emulated hosts (namespaces, a bridge, shaped veths).
//!
//! The emulated-host tests skip with a printed reason when not root or when
//! namespaces cannot be created; the MPI tests skip when `mpicc` is missing
//! (`scripts/deps.sh` installs Open MPI). Every emulated test checks that none of
//! its launch's namespaces is left afterwards.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const HALO: &str = env!("CARGO_BIN_EXE_halo");

/// A finished launcher run.
#[derive(Debug)]
struct Run {
    pid: u32,
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl Run {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }

    #[track_caller]
    fn assert_ok(&self) {
        assert!(
            self.status.success(),
            "halo launch failed: {:?}\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
    }
}

fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("launch")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Starts `halo launch ARGS` with stdout and stderr going to files in `dir`.
fn start(dir: &Path, args: &[&str]) -> std::process::Child {
    let out = std::fs::File::create(dir.join("stdout")).unwrap();
    let err = std::fs::File::create(dir.join("stderr")).unwrap();
    Command::new(HALO)
        .arg("launch")
        .args(args)
        .env_remove("HALO_DEBUG")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("start halo launch")
}

/// Waits for a launcher started by [`start`]; past `limit` it is interrupted
/// (SIGINT, so that it still tears down), then killed, and the test fails.
fn finish(dir: &Path, mut child: std::process::Child, started: Instant, limit: Duration) -> Run {
    let pid = child.id();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > limit {
            signal(pid, "INT");
            std::thread::sleep(Duration::from_secs(10));
            let _ = child.kill();
            let st = child.wait().unwrap();
            panic!(
                "halo launch (pid {pid}) ran past {limit:?} ({st:?})\nstdout:\n{}\nstderr:\n{}",
                std::fs::read_to_string(dir.join("stdout")).unwrap_or_default(),
                std::fs::read_to_string(dir.join("stderr")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        pid,
        status,
        stdout: std::fs::read_to_string(dir.join("stdout")).unwrap(),
        stderr: std::fs::read_to_string(dir.join("stderr")).unwrap(),
        elapsed: started.elapsed(),
    }
}

fn launch(dir: &Path, args: &[&str]) -> Run {
    let started = Instant::now();
    let child = start(dir, args);
    finish(dir, child, started, Duration::from_secs(120))
}

/// Sends a signal to a process this test started, by pid.
fn signal(pid: u32, sig: &str) {
    use nix::sys::signal::Signal;
    let sig = match sig {
        "INT" => Signal::SIGINT,
        "TERM" => Signal::SIGTERM,
        other => panic!("no signal {other}"),
    };
    let pid = i32::try_from(pid).expect("pid fits i32");
    assert!(pid > 1);
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// Whether a live (not zombie) process has this pid and runs `what`.
fn running(pid: u32, what: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let live = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .is_some_and(|s| s != "Z" && s != "X");
    let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    live && cmdline.contains(what)
}

/// Pids the ranks wrote to `dir/pids/RANK`.
fn rank_pids(dir: &Path) -> Vec<u32> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir.join("pids")) {
        for e in rd.flatten() {
            if let Ok(t) = std::fs::read_to_string(e.path())
                && let Ok(p) = t.trim().parse()
            {
                v.push(p);
            }
        }
    }
    v
}

/// Lines of `[R] text` output, as (R, text).
fn labelled(stdout: &str) -> Vec<(usize, String)> {
    stdout
        .lines()
        .map(|l| {
            let rest = l
                .strip_prefix('[')
                .unwrap_or_else(|| panic!("unlabelled line {l:?}"));
            let (r, text) = rest
                .split_once("] ")
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            (r.parse().unwrap(), text.to_string())
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Local launches
// ---------------------------------------------------------------------------

#[test]
fn local_every_rank_gets_its_environment() {
    let dir = scratch("local_env");
    let run = launch(
        &dir,
        &[
            "-n",
            "4",
            "--",
            "sh",
            "-c",
            "echo $RANK/$WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $HALO_BOOTSTRAP_ADDR $MASTER_ADDR $MASTER_PORT $HALO_SECRET",
        ],
    );
    run.assert_ok();
    let mut lines = labelled(&run.stdout);
    lines.sort();
    assert_eq!(lines.len(), 4, "{}", run.stdout);
    let first: Vec<&str> = lines[0].1.split(' ').collect();
    let (ip, port) = first[4].split_once(':').unwrap();
    assert_eq!(ip, "127.0.0.1");
    let port: u16 = port.parse().unwrap();
    let secret = first[7];
    assert_eq!(secret.len(), 64);
    assert!(secret.bytes().all(|b| b.is_ascii_hexdigit()));
    for (r, (label, text)) in lines.iter().enumerate() {
        assert_eq!(*label, r);
        let f: Vec<&str> = text.split(' ').collect();
        assert_eq!(f[0], format!("{r}/4"));
        assert_eq!(f[1], r.to_string(), "LOCAL_RANK");
        assert_eq!(f[2], "4", "LOCAL_WORLD_SIZE");
        assert_eq!(f[3], "0", "GROUP_RANK");
        assert_eq!(f[4], format!("127.0.0.1:{port}"));
        assert_eq!(f[5], "127.0.0.1");
        assert_eq!(
            f[6],
            (port - 1).to_string(),
            "MASTER_PORT is the bootstrap port - 1"
        );
        assert_eq!(f[7], secret, "one secret per job");
    }
    // A second launch gets another secret.
    let again = launch(
        &dir,
        &[
            "-n",
            "1",
            "--no-prefix",
            "--",
            "sh",
            "-c",
            "echo $HALO_SECRET",
        ],
    );
    again.assert_ok();
    assert_ne!(again.stdout.trim(), secret);
}

#[test]
fn local_output_lines_stay_whole() {
    let dir = scratch("local_lines");
    let script = "i=0; while [ $i -lt 300 ]; do echo \"rank $RANK line $i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"; \
                  echo \"err $RANK $i\" >&2; i=$((i+1)); done; printf \"last $RANK\"";
    let run = launch(&dir, &["-n", "4", "--", "sh", "-c", script]);
    run.assert_ok();
    let lines = labelled(&run.stdout);
    assert_eq!(lines.len(), 4 * 301);
    for (r, text) in &lines {
        let ok = text == &format!("last {r}")
            || (text.starts_with(&format!("rank {r} line ")) && text.ends_with(&"x".repeat(48)));
        assert!(ok, "mixed line [{r}] {text:?}");
    }
    let errs = labelled(&run.stderr);
    assert_eq!(errs.len(), 4 * 300);
    assert!(
        errs.iter()
            .all(|(r, t)| t.starts_with(&format!("err {r} ")))
    );

    let plain = launch(
        &dir,
        &["-n", "2", "--no-prefix", "--", "sh", "-c", "echo r$RANK"],
    );
    plain.assert_ok();
    let mut got: Vec<&str> = plain.stdout.lines().collect();
    got.sort();
    assert_eq!(got, ["r0", "r1"]);
}

#[test]
fn local_failing_rank_sets_status_and_others_are_killed() {
    let dir = scratch("local_fail");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    let script = format!(
        "echo $$ > {}/pids/$RANK; if [ $RANK = 2 ]; then sleep 0.5; exit 7; fi; exec sleep 61",
        dir.display()
    );
    let run = launch(&dir, &["-n", "4", "--", "sh", "-c", &script]);
    assert_eq!(run.code(), Some(7), "{run:?}");
    assert!(
        run.stderr.contains("rank 2 exited with status 7"),
        "{}",
        run.stderr
    );
    assert!(run.elapsed < Duration::from_secs(20), "{:?}", run.elapsed);
    let pids = rank_pids(&dir);
    assert_eq!(pids.len(), 4);
    for p in pids {
        assert!(!running(p, "sleep"), "rank process {p} still runs");
    }
}

#[test]
fn local_rank_killed_by_signal_reports_128_plus_signal() {
    let dir = scratch("local_signal");
    let run = launch(
        &dir,
        &[
            "-n",
            "2",
            "--",
            "sh",
            "-c",
            "if [ $RANK = 1 ]; then kill -KILL $$; fi; exec sleep 62",
        ],
    );
    assert_eq!(run.code(), Some(137), "{run:?}");
}

#[test]
fn local_timeout_kills_everything_with_124() {
    let dir = scratch("local_timeout");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    // Rank 1 ignores SIGTERM: it must be SIGKILLed after the grace period.
    let script = format!(
        "echo $$ > {}/pids/$RANK; if [ $RANK = 1 ]; then trap '' TERM; fi; exec sleep 63",
        dir.display()
    );
    let run = launch(
        &dir,
        &[
            "-n",
            "3",
            "--timeout",
            "1",
            "--grace",
            "1",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    assert_eq!(run.code(), Some(124), "{run:?}");
    assert!(run.stderr.contains("timed out"), "{}", run.stderr);
    assert!(
        run.elapsed >= Duration::from_millis(900) && run.elapsed < Duration::from_secs(15),
        "{:?}",
        run.elapsed
    );
    let pids = rank_pids(&dir);
    assert_eq!(pids.len(), 3);
    for p in pids {
        assert!(!running(p, "sleep"), "rank process {p} still runs");
    }
}

#[test]
fn local_ctrl_c_terminates_the_ranks() {
    let dir = scratch("local_sigint");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    let script = format!("echo $$ > {}/pids/$RANK; exec sleep 64", dir.display());
    let started = Instant::now();
    let child = start(&dir, &["-n", "3", "--", "sh", "-c", &script]);
    while rank_pids(&dir).len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "ranks did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(child.id(), "INT");
    let run = finish(&dir, child, started, Duration::from_secs(60));
    assert_eq!(run.code(), Some(130), "{run:?}");
    for p in rank_pids(&dir) {
        assert!(!running(p, "sleep"), "rank process {p} still runs");
    }
}

#[test]
fn bad_options_exit_with_2() {
    let dir = scratch("bad_options");
    for (args, needle) in [
        (&["-n", "0", "--", "true"][..], "-n must be at least 1"),
        (
            &["-n", "2", "--host-rate", "1gbit", "--", "true"][..],
            "needs emulated hosts",
        ),
        (
            &["-n", "2", "--stats", "--", "true"][..],
            "needs emulated hosts",
        ),
        (
            &["-n", "2", "--hosts", "3", "--", "true"][..],
            "every emulated host needs at least one rank",
        ),
        (
            &["-n", "4", "--ranks-per-host", "3,2", "--", "true"][..],
            "places 5 ranks",
        ),
        (
            &[
                "-n",
                "2",
                "--hosts",
                "2",
                "--host-rate",
                "fast",
                "--",
                "true",
            ][..],
            "tc rate",
        ),
        (
            &["-n", "2", "--timeout", "0", "--", "true"][..],
            "--timeout must be positive",
        ),
    ] {
        let run = launch(&dir, args);
        assert_eq!(run.code(), Some(2), "{args:?}: {run:?}");
        assert!(run.stderr.contains(needle), "{args:?}: {}", run.stderr);
    }
    // A command that does not exist: the launcher says so (status 1).
    let run = launch(&dir, &["-n", "2", "--", "/nonexistent/program"]);
    assert_eq!(run.code(), Some(1), "{run:?}");
    assert!(run.stderr.contains("cannot start rank 0"), "{}", run.stderr);
}

#[test]
fn hosts_without_root_is_a_clear_error() {
    let out = if is_root() {
        // Drop to nobody for this one run, if setpriv is there.
        match Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                HALO,
                "launch",
            ])
            .args(["-n", "2", "--hosts", "2", "--", "true"])
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                halo_cli::testing::skip(&format!("cannot run setpriv to drop root: {e}"));
                return;
            }
        }
    } else {
        Command::new(HALO)
            .args(["launch", "-n", "2", "--hosts", "2", "--", "true"])
            .output()
            .unwrap()
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("halo launch --hosts needs root (network namespaces"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------
// Emulated hosts
// ---------------------------------------------------------------------------

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

macro_rules! need_emulation {
    () => {
        if let Some(why) = halo_cli::launch::emulation_unavailable() {
            halo_cli::testing::skip(&format!("emulated hosts unavailable: {why}"));
            return;
        }
    };
}

/// Namespaces of the launcher with this pid still listed by `ip netns list`.
fn leftover_namespaces(pid: u32) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let prefix = format!("halo-{pid}-");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

#[track_caller]
fn assert_torn_down(run: &Run) {
    let left = leftover_namespaces(run.pid);
    assert!(
        left.is_empty(),
        "namespaces left behind: {left:?}\n{}",
        run.stderr
    );
    assert!(!run.stderr.contains("teardown"), "{}", run.stderr);
}

fn stats(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn host_stat(v: &serde_json::Value, host: usize, key: &str) -> u64 {
    v["hosts"][host][key].as_u64().unwrap()
}

/// Each rank prints what it sees; rank 0 serves a TCP echo on host 0's address and
/// the last rank (on the last host) pushes `BYTES` through it and back.
const ECHO_PY: &str = r#"
import os, socket, sys, time
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
n = int(sys.argv[1])
server = os.environ["HALO_BOOTSTRAP_ADDR"].split(":")[0]
print("seen", rank, socket.gethostname(), os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"],
      os.environ["GROUP_RANK"], " ".join(sorted(os.listdir("/sys/class/net"))), flush=True)
def read_all(c, n):
    got = bytearray()
    while len(got) < n:
        b = c.recv(min(1 << 20, n - len(got)))
        if not b: break
        got += b
    return bytes(got)
if rank == 0:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((server, 5000)); s.listen(1)
    c, peer = s.accept()
    data = read_all(c, n); c.sendall(data); c.close()
    print("served", len(data), "from", peer[0], flush=True)
elif rank == size - 1:
    for _ in range(400):
        try:
            c = socket.create_connection((server, 5000)); break
        except OSError: time.sleep(0.05)
    me = c.getsockname()[0]
    payload = bytes(range(256)) * (n // 256)
    c.sendall(payload)
    back = read_all(c, len(payload))
    print("echo", "ok" if back == payload else "BAD", "from", me, flush=True)
"#;

#[test]
fn emulated_hosts_have_hostnames_placement_and_traffic_crosses_the_veths() {
    need_emulation!();
    let dir = scratch("emu_echo");
    let script = dir.join("echo.py");
    std::fs::write(&script, ECHO_PY).unwrap();
    let json = dir.join("stats.json");
    let bytes = 1 << 20;
    let run = launch(
        &dir,
        &[
            "-n",
            "4",
            "--hosts",
            "2",
            "--host-rate",
            "100mbit",
            "--stats",
            "--stats-json",
            json.to_str().unwrap(),
            "--timeout",
            "60",
            "--",
            "python3",
            script.to_str().unwrap(),
            &bytes.to_string(),
        ],
    );
    run.assert_ok();
    assert_torn_down(&run);
    let lines = labelled(&run.stdout);
    for r in 0..4 {
        let seen = lines
            .iter()
            .find(|(l, t)| *l == r && t.starts_with("seen "))
            .unwrap_or_else(|| panic!("rank {r} said nothing:\n{}", run.stdout));
        let host = r / 2;
        assert_eq!(
            seen.1,
            format!("seen {r} host{host} {} 2 {host} eth0 lo", r % 2),
            "rank {r}: hostname, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, devices"
        );
    }
    assert!(
        lines.contains(&(0, format!("served {bytes} from 10.201.0.2"))),
        "{}",
        run.stdout
    );
    assert!(
        lines.contains(&(3, "echo ok from 10.201.0.2".to_string())),
        "{}",
        run.stdout
    );
    let v = stats(&json);
    eprintln!("stats: {v}");
    assert_eq!(v["hosts"][0]["hostname"], "host0");
    assert_eq!(v["hosts"][1]["address"], "10.201.0.2");
    assert_eq!(v["hosts"][1]["ranks"], serde_json::json!([2, 3]));
    assert_eq!(v["host_rate"], "100mbit");
    for host in 0..2 {
        for key in ["tx_bytes", "rx_bytes"] {
            let b = host_stat(&v, host, key);
            assert!(
                b >= bytes,
                "host{host} {key} = {b}: the echo did not cross the veth"
            );
            assert!(b < 2 * bytes, "host{host} {key} = {b}: more than the echo");
        }
    }
    assert!(
        run.stderr.contains("host1 10.201.0.2 (ranks 2-3): tx "),
        "{}",
        run.stderr
    );
}

#[test]
fn emulated_uneven_placement() {
    need_emulation!();
    let dir = scratch("emu_uneven");
    let script =
        "echo $RANK $(hostname) $LOCAL_RANK/$LOCAL_WORLD_SIZE $GROUP_RANK $HALO_BOOTSTRAP_ADDR";
    let run = launch(&dir, &["-n", "5", "--hosts", "2", "--", "sh", "-c", script]);
    run.assert_ok();
    assert_torn_down(&run);
    let mut got: Vec<String> = labelled(&run.stdout).into_iter().map(|(_, t)| t).collect();
    got.sort();
    assert_eq!(
        got,
        [
            "0 host0 0/3 0 10.201.0.1:29501",
            "1 host0 1/3 0 10.201.0.1:29501",
            "2 host0 2/3 0 10.201.0.1:29501",
            "3 host1 0/2 1 10.201.0.1:29501",
            "4 host1 1/2 1 10.201.0.1:29501",
        ]
    );
    let run = launch(
        &dir,
        &[
            "-n",
            "3",
            "--ranks-per-host",
            "1,2",
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    run.assert_ok();
    assert_torn_down(&run);
    let mut got: Vec<String> = labelled(&run.stdout).into_iter().map(|(_, t)| t).collect();
    got.sort();
    assert_eq!(
        got,
        [
            "0 host0 0/1 0 10.201.0.1:29501",
            "1 host1 0/2 1 10.201.0.1:29501",
            "2 host1 1/2 1 10.201.0.1:29501",
        ]
    );
}

#[test]
fn emulated_failure_still_tears_down() {
    need_emulation!();
    let dir = scratch("emu_fail");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    let script = format!(
        "echo $$ > {}/pids/$RANK; if [ $RANK = 3 ]; then sleep 0.3; exit 9; fi; exec sleep 65",
        dir.display()
    );
    let run = launch(
        &dir,
        &["-n", "4", "--hosts", "2", "--", "sh", "-c", &script],
    );
    assert_eq!(run.code(), Some(9), "{run:?}");
    assert!(
        run.stderr.contains("rank 3 exited with status 9"),
        "{}",
        run.stderr
    );
    assert_torn_down(&run);
    for p in rank_pids(&dir) {
        assert!(!running(p, "sleep"), "rank process {p} still runs");
    }
}

#[test]
fn emulated_ctrl_c_tears_down() {
    need_emulation!();
    let dir = scratch("emu_sigint");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    let script = format!("echo $$ > {}/pids/$RANK; exec sleep 66", dir.display());
    let started = Instant::now();
    let child = start(
        &dir,
        &["-n", "4", "--hosts", "2", "--", "sh", "-c", &script],
    );
    while rank_pids(&dir).len() < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "ranks did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = child.id();
    assert_eq!(
        leftover_namespaces(pid).len(),
        3,
        "2 hosts + the switch while running"
    );
    signal(pid, "TERM");
    let run = finish(&dir, child, started, Duration::from_secs(60));
    assert_eq!(run.code(), Some(143), "{run:?}");
    assert_torn_down(&run);
    for p in rank_pids(&dir) {
        assert!(!running(p, "sleep"), "rank process {p} still runs");
    }
}

#[test]
fn emulated_setup_failure_names_the_command_and_cleans_up() {
    need_emulation!();
    let dir = scratch("emu_setup_fail");
    // Passes the launcher's syntax check, but tc rejects the unit.
    let run = launch(
        &dir,
        &[
            "-n",
            "2",
            "--hosts",
            "2",
            "--host-rate",
            "5furlongs",
            "--",
            "true",
        ],
    );
    assert_eq!(run.code(), Some(1), "{run:?}");
    assert!(run.stderr.contains("`tc -n halo-"), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("qdisc add dev eth0 root tbf rate 5furlongs"),
        "{}",
        run.stderr
    );
    assert_torn_down(&run);
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn root_links() -> Vec<String> {
    ip(&["-o", "link", "show"])
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap().to_string())
        .collect()
}

/// Namespaces of this test process (library-level tests below run in one test
/// function, so nothing else of this process makes them meanwhile).
fn own_namespaces() -> Vec<String> {
    let me = format!("halo-{}-", std::process::id());
    ip(&["netns", "list"])
        .lines()
        .filter(|l| l.starts_with(&me))
        .map(str::to_string)
        .collect()
}

/// The library's `EmulatedCluster`: the layout, and that it leaves nothing behind
/// when torn down, dropped, or interrupted during set-up.
#[test]
fn cluster_layout_teardown_and_interrupted_setup() {
    need_emulation!();
    use halo_cli::launch::{EmulatedCluster, LaunchError};
    assert!(own_namespaces().is_empty());
    let before = root_links();
    let never = || None;
    let mut cluster = EmulatedCluster::create(3, Some("200mbit"), Duration::from_secs(1), &never)
        .expect("create the emulated cluster");
    let prefix = format!("{}-", cluster.prefix());
    let sw = cluster.switch_namespace().to_string();
    // The switch: a bridge with one port per host, shaped.
    let ports = ip(&["-n", &sw, "-o", "link", "show", "master", "br0"]);
    for i in 0..3 {
        assert!(ports.contains(&format!(" h{i}@")), "{ports}");
        let q = Command::new("tc")
            .args(["-n", &sw, "qdisc", "show", "dev", &format!("h{i}")])
            .output()
            .unwrap();
        let q = String::from_utf8_lossy(&q.stdout);
        assert!(q.contains("tbf") && q.contains("rate 200Mbit"), "{q}");
    }
    for (i, h) in cluster.hosts().iter().enumerate() {
        assert!(h.namespace.starts_with(&prefix));
        let addr = ip(&[
            "-n",
            &h.namespace,
            "-o",
            "-4",
            "addr",
            "show",
            "dev",
            "eth0",
        ]);
        assert!(addr.contains(&format!("10.201.0.{}/24", i + 1)), "{addr}");
        let lo = ip(&["-n", &h.namespace, "-o", "link", "show", "lo"]);
        assert!(lo.contains("UP"), "{lo}");
        let q = Command::new("tc")
            .args(["-n", &h.namespace, "qdisc", "show", "dev", "eth0"])
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&q.stdout).contains("tbf"));
    }
    // Host 0 reaches host 2 through the bridge.
    let ping = Command::new("ip")
        .args(["netns", "exec", &cluster.hosts()[0].namespace, "python3", "-c"])
        .arg("import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('10.201.0.3', 9)); print(s.getsockname()[0])")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&ping.stdout).trim(), "10.201.0.1");
    // Nothing of ours appeared in this namespace.
    let after = root_links();
    let new: Vec<&String> = after.iter().filter(|l| !before.contains(l)).collect();
    assert!(
        !new.iter()
            .any(|l| l.as_str() == "br0" || l.as_str() == "eth0" || l.starts_with('h')),
        "links created in the root namespace: {new:?}"
    );
    assert!(cluster.teardown().is_empty());
    drop(cluster);
    assert!(own_namespaces().is_empty(), "{:?}", own_namespaces());

    // Interrupted after the second host: create returns the interrupt, having
    // removed what it made.
    let calls = std::cell::Cell::new(0);
    let made = std::cell::RefCell::new(Vec::new());
    let stop = || {
        calls.set(calls.get() + 1);
        if calls.get() > 2 {
            made.replace(own_namespaces());
            return Some(LaunchError::Interrupted { signal: 2 });
        }
        None
    };
    let err = EmulatedCluster::create(4, None, Duration::from_secs(1), &stop).unwrap_err();
    assert!(
        matches!(err, LaunchError::Interrupted { signal: 2 }),
        "{err}"
    );
    assert_eq!(
        made.borrow().len(),
        3,
        "switch and two hosts when interrupted"
    );
    assert!(own_namespaces().is_empty(), "{:?}", own_namespaces());

    // Dropped without teardown: the guard removes it.
    let cluster = EmulatedCluster::create(2, None, Duration::from_secs(1), &never).unwrap();
    assert_eq!(own_namespaces().len(), 3);
    drop(cluster);
    assert!(own_namespaces().is_empty(), "{:?}", own_namespaces());
}

/// Sends `BYTES` from the last rank to rank 0 and prints how long it took.
const XFER_PY: &str = r#"
import os, socket, sys, time
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
n = int(sys.argv[1])
server = os.environ["HALO_BOOTSTRAP_ADDR"].split(":")[0]
if rank == 0:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((server, 5001)); s.listen(1)
    c, _ = s.accept()
    got, t0 = 0, time.monotonic()
    while got < n:
        b = c.recv(1 << 20)
        if not b: break
        got += len(b)
    dt = time.monotonic() - t0
    c.sendall(b"k"); c.close()
    print(f"received {got} in {dt:.4f}", flush=True)
elif rank == size - 1:
    for _ in range(400):
        try:
            c = socket.create_connection((server, 5001)); break
        except OSError: time.sleep(0.05)
    c.sendall(b"x" * n); c.recv(1)
"#;

#[test]
fn emulated_link_rate_is_shaped() {
    need_emulation!();
    let dir = scratch("emu_shaping");
    let script = dir.join("xfer.py");
    std::fs::write(&script, XFER_PY).unwrap();
    let json = dir.join("stats.json");
    let bytes: u64 = 4_000_000;
    let run = launch(
        &dir,
        &[
            "-n",
            "2",
            "--hosts",
            "2",
            "--host-rate",
            "50mbit",
            "--stats-json",
            json.to_str().unwrap(),
            "--timeout",
            "60",
            "--",
            "python3",
            script.to_str().unwrap(),
            &bytes.to_string(),
        ],
    );
    run.assert_ok();
    assert_torn_down(&run);
    let line = labelled(&run.stdout)
        .into_iter()
        .find(|(r, t)| *r == 0 && t.starts_with("received "))
        .unwrap_or_else(|| panic!("{}", run.stdout))
        .1;
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!(f[1], bytes.to_string());
    let secs: f64 = f[3].parse().unwrap();
    let mbit = bytes as f64 * 8.0 / secs / 1e6;
    eprintln!("4 MB across a 50mbit link: {secs:.3} s = {mbit:.1} Mbit/s");
    // 4 MB = 32 Mbit: 0.64 s at 50 Mbit/s, less the 256 KB tbf burst.
    assert!(secs >= 0.5, "{secs} s: the link was not shaped");
    let v = stats(&json);
    assert!(host_stat(&v, 1, "tx_bytes") >= bytes);
    assert!(host_stat(&v, 0, "rx_bytes") >= bytes);
}

// ---------------------------------------------------------------------------
// MPI
// ---------------------------------------------------------------------------

const MPI_HELLO_C: &str = r#"
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank, size, sum = 0;
    char host[256];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d of %d on %s sum %d\n", rank, size, host, sum);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
"#;

/// Compiles the MPI test program with `mpicc`, or says why not.
fn mpi_program(dir: &Path) -> Option<PathBuf> {
    let src = dir.join("mpi_hello.c");
    let exe = dir.join("mpi_hello");
    std::fs::write(&src, MPI_HELLO_C).unwrap();
    match Command::new("mpicc").arg("-o").arg(&exe).arg(&src).output() {
        Ok(o) if o.status.success() => Some(exe),
        Ok(o) => panic!("mpicc failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            halo_cli::testing::skip(&format!(
                "no mpicc ({e}); scripts/deps.sh installs openmpi-bin libopenmpi-dev"
            ));
            None
        }
    }
}

fn mpi_lines(stdout: &str) -> Vec<(usize, String, usize)> {
    let mut v: Vec<(usize, String, usize)> = stdout
        .lines()
        .filter(|l| l.starts_with("rank "))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[1].parse().unwrap(),
                f[5].to_string(),
                f[7].parse().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn mpi_locally() {
    let dir = scratch("mpi_local");
    let Some(exe) = mpi_program(&dir) else { return };
    let run = launch(
        &dir,
        &[
            "-n",
            "2",
            "--mpi",
            "--timeout",
            "60",
            "--",
            exe.to_str().unwrap(),
        ],
    );
    run.assert_ok();
    let got = mpi_lines(&run.stdout);
    assert_eq!(got.len(), 2, "{}", run.stdout);
    assert!(got.iter().all(|(_, _, sum)| *sum == 1));
}

#[test]
fn mpi_on_emulated_hosts() {
    need_emulation!();
    let dir = scratch("mpi_emu");
    let Some(exe) = mpi_program(&dir) else { return };
    let json = dir.join("stats.json");
    let run = launch(
        &dir,
        &[
            "-n",
            "4",
            "--hosts",
            "2",
            "--mpi",
            "--stats-json",
            json.to_str().unwrap(),
            "--timeout",
            "90",
            "--",
            exe.to_str().unwrap(),
        ],
    );
    run.assert_ok();
    assert_torn_down(&run);
    let got = mpi_lines(&run.stdout);
    assert_eq!(
        got,
        [
            (0, "host0".to_string(), 6),
            (1, "host0".to_string(), 6),
            (2, "host1".to_string(), 6),
            (3, "host1".to_string(), 6),
        ],
        "{}",
        run.stdout
    );
    // Open MPI's daemon on host1 and the allreduce talked over the veths.
    let v = stats(&json);
    assert!(host_stat(&v, 1, "tx_bytes") > 0 && host_stat(&v, 1, "rx_bytes") > 0);
    // No Open MPI process of this launch is left.
    let agent = format!("halo-{}-", run.pid);
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
        .filter(|c| c.contains(&agent) || c.contains(exe.to_str().unwrap()))
        .collect();
    let live: Vec<&String> = left.iter().filter(|c| !c.is_empty()).collect();
    assert!(live.is_empty(), "left behind: {live:?}");
}
