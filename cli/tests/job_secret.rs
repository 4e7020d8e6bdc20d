//! The job secret in every way `halo` processes start, for real (processes, loopback):
//!
//! - `halo launch`: an outsider that knows everything public about the job (the
//!   bootstrap address and port the ranks are given, the size, the environment but the
//!   secret) computes the secret HALO used to derive from those facts and tries to join
//!   as each rank: the launcher's root refuses it and the job completes.
//! - torchrun/srun style (rank variables set directly, no `HALO_SECRET`, no key file):
//!   every rank refuses to start with an error saying how to provide a secret; with the
//!   key file `halo secret init` wrote, the job runs; with `HALO_SECRET=insecure-derived`
//!   it runs and every rank warns.

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const HALO: &str = env!("CARGO_BIN_EXE_halo");

fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("job_secret")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A command with no job variables or secret of an enclosing job, `HOME` at `home`.
fn clean(program: &str, home: &Path) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().to_string();
        if k.starts_with("HALO_")
            || k.starts_with("OMPI_")
            || k.starts_with("PMI_")
            || k.starts_with("SLURM_")
            || k.starts_with("MASTER_")
            || [
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "LOCAL_WORLD_SIZE",
                "GROUP_RANK",
            ]
            .contains(&k.as_str())
        {
            cmd.env_remove(&k);
        }
    }
    cmd.env("HOME", home)
        .env("HALO_TIMEOUT_MS", "20000")
        .env("HALO_BOOTSTRAP_TIMEOUT_MS", "20000")
        .stdin(Stdio::null());
    cmd
}

const CHECK: [&str; 7] = [
    "check",
    "--algo",
    "flat",
    "--counts",
    "1",
    "--v-rounds",
    "0",
];

#[test]
fn an_outsider_with_the_derived_secret_cannot_join_a_halo_launch_job() {
    let home = scratch("launch");
    let script = format!(
        "echo \"addr $HALO_BOOTSTRAP_ADDR\"; sleep 3; exec {HALO} {}",
        CHECK.join(" ")
    );
    let mut launch = clean(HALO, &home)
        .args([
            "launch",
            "-n",
            "2",
            "--timeout",
            "90",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(launch.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let addr: SocketAddr = loop {
        let line = lines
            .next()
            .expect("the ranks print their address")
            .unwrap();
        seen.push(line.clone());
        if let Some(a) = line.split("addr ").nth(1) {
            break a.trim().parse().unwrap();
        }
    };
    // Everything public: the address, the port, the size; torch's MASTER_* follow.
    let mut public = std::collections::BTreeMap::new();
    for (k, v) in [
        ("WORLD_SIZE", "2".to_string()),
        ("HALO_BOOTSTRAP_ADDR", addr.to_string()),
        ("MASTER_ADDR", addr.ip().to_string()),
        ("MASTER_PORT", (addr.port() - 1).to_string()),
    ] {
        public.insert(k.to_string(), v);
    }
    let derived = halo::bootstrap::insecure_derived_secret(&public, addr, 2);
    for rank in 0..2 {
        let t = Instant::now();
        let r =
            halo::bootstrap::exchange(addr, &derived, rank, 2, b"OUTSIDER", Duration::from_secs(5));
        let e = r.expect_err("the outsider must not join a halo launch job");
        assert!(
            e.to_string()
                .contains("did not prove that it knows the job's secret"),
            "outsider as rank {rank}: {e}"
        );
        assert!(t.elapsed() < Duration::from_secs(3));
    }
    seen.extend(lines.map_while(Result::ok));
    let status = launch.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut launch.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        status.success(),
        "the job must complete: {status}\n{}\n{stderr}",
        seen.join("\n")
    );
}

fn run_ranks(home: &Path, n: usize, port: u16, extra: &[(&str, String)]) -> Vec<Output> {
    let ranks: Vec<_> = (0..n)
        .map(|r| {
            let mut cmd = clean(HALO, home);
            cmd.args(CHECK)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", (port - 1).to_string())
                .envs(extra.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect();
    ranks
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

fn free_port() -> u16 {
    loop {
        let p = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if p > 1025 && std::net::TcpListener::bind(("127.0.0.1", p - 1)).is_ok() {
            return p;
        }
    }
}

#[test]
fn torchrun_style_ranks_need_a_secret_and_take_the_key_file() {
    let home = scratch("env");
    // No secret anywhere: every rank refuses, quickly, saying how to provide one.
    let t = Instant::now();
    let outs = run_ranks(&home, 2, free_port(), &[]);
    for (r, o) in outs.iter().enumerate() {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "rank {r} started without a secret");
        for want in [
            "no job secret",
            "halo secret init",
            "HALO_SECRET",
            "insecure-derived",
        ] {
            assert!(err.contains(want), "rank {r}: {want:?} not in {err}");
        }
    }
    assert!(t.elapsed() < Duration::from_secs(15));

    // `halo secret init` writes the key file (0600); the ranks then run.
    let out = clean(HALO, &home)
        .args(["secret", "init"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = home.join(".config/halo/secret");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let again = clean(HALO, &home)
        .args(["secret", "init"])
        .output()
        .unwrap();
    assert!(!again.status.success(), "an existing key file is kept");
    for (r, o) in run_ranks(&home, 2, free_port(), &[]).iter().enumerate() {
        assert!(
            o.status.success(),
            "rank {r} with the key file: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // A key file others can read is refused, naming it and its mode.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    for o in run_ranks(&home, 2, free_port(), &[]) {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert!(
            err.contains(&key.display().to_string()) && err.contains("mode 0644"),
            "{err}"
        );
    }
    std::fs::remove_file(&key).unwrap();

    // The insecure opt-in runs, and every rank warns.
    let insecure = [("HALO_SECRET", "insecure-derived".to_string())];
    for (r, o) in run_ranks(&home, 2, free_port(), &insecure)
        .iter()
        .enumerate()
    {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "rank {r}: {err}");
        assert!(
            err.contains("WARN") && err.contains("not authenticated"),
            "rank {r} must warn: {err}"
        );
    }
}
