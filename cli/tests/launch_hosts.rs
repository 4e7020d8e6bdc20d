//! `halo launch --hosts`: real emulated hosts (network namespaces, a bridge, shaped
//! veths), as root; every test checks that none of its launch's namespaces is left.

#[macro_use]
mod launch_common;

use launch_common::*;
use std::process::Command;
use std::time::{Duration, Instant};

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

/// Issue 11, defect 4: a launcher with emulated hosts killed with SIGKILL cannot tear
/// down; its ranks end by their parent-death signal (through `ip netns exec`), and the
/// next launch removes its namespaces (and with the switch namespace the bridge and
/// veths). Only the namespaces named with this test's launcher's pid are looked at.
#[test]
fn emulated_sigkilled_launcher_is_cleaned_up_by_the_next_launch() {
    need_emulation!();
    let dir = scratch("emu_sigkill");
    std::fs::create_dir_all(dir.join("pids")).unwrap();
    let script = format!("echo $$ > {}/pids/$RANK; exec sleep 67", dir.display());
    let started = Instant::now();
    let mut child = start(
        &dir,
        &["-n", "2", "--hosts", "2", "--", "sh", "-c", &script],
    );
    let pid = child.id();
    while rank_pids(&dir).len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "ranks did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let namespaces = leftover_namespaces(pid);
    signal(pid, "KILL");
    child.wait().unwrap();
    let killed = Instant::now();
    let ranks = rank_pids(&dir);
    while ranks.iter().any(|&p| running(p, "sleep")) {
        if killed.elapsed() > Duration::from_secs(2) {
            // Ours to end (by pid) before failing, or they would run on.
            kill_all(&ranks);
            panic!(
                "ranks {ranks:?} still ran {:?} after their launcher was killed",
                killed.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(namespaces.len(), 3, "2 hosts + the switch: {namespaces:?}");
    // The names carry the launcher's pid and start time: halo-PID-START-N-{h0,h1,sw}.
    for ns in &namespaces {
        let parts: Vec<&str> = ns.split('-').collect();
        assert_eq!(parts.len(), 5, "{ns}");
        assert!(parts[2].parse::<u64>().is_ok(), "{ns}");
    }
    let next = launch(
        &scratch("emu_sigkill_next"),
        &["-n", "2", "--hosts", "2", "--", "true"],
    );
    next.assert_ok();
    assert_torn_down(&next);
    let left = leftover_namespaces(pid);
    assert!(
        left.is_empty(),
        "the next launch left the dead launcher's namespaces: {left:?}"
    );
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
