//! A rank *process* killed (SIGKILL) in the middle of an expert migration, over the fabric
//! transport (libfabric, shm between processes of this host): every survivor returns
//! `PiperError::Migration` within the communicator's timeout, holding exactly its old
//! table, parameters, gradients and Adam states.
//!
//! The rank program is this test binary (`migration_kill_rank`, ignored when run on its
//! own), started four times as a torchrun-style job (`RANK`, `WORLD_SIZE`,
//! `HALO_BOOTSTRAP_ADDR`, `HALO_SECRET`): PP 2 x EP 2, two training steps, a third step's
//! backward, then a move of every expert; rank 1 kills itself when it copies out block 1,
//! after block 0's transfer.

mod common;

use std::io::Read as _;
use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{Failing, OnRead};
use halo_moe::{Adam, AdamConfig, MoeConfig, Task, TaskConfig};
use halo_piper::migration::move_experts;
use halo_piper::{Executor, MeshLayout, Placement};

const RANKS: usize = 4;
const VICTIM: usize = 1;
/// The communicators' timeout in the rank processes.
const TIMEOUT: Duration = Duration::from_secs(10);

#[test]
#[ignore = "the rank program of the test below, started by it"]
fn migration_kill_rank() {
    let mut world = halo::Communicator::init_from_env().expect("init");
    world.set_timeout(TIMEOUT);
    let rank = world.rank();
    let cfg = MoeConfig {
        seq: 16,
        ..MoeConfig::tiny()
    };
    let task = Task::new(
        &cfg,
        TaskConfig {
            skew: 1.2,
            ..TaskConfig::default()
        },
    )
    .unwrap();
    let mut model = Failing::new(&cfg, 7, (rank == VICTIM).then_some(1), OnRead::Kill, false);
    let mut exec = Executor::new(&mut world, MeshLayout::new(2, 2), 2, &model).unwrap();
    let mut adam = Adam::new(AdamConfig::default()).unwrap();
    for step in 0..2 {
        let b = task.batch(step, 8);
        exec.step(&mut model, &b.tokens, &b.targets).unwrap();
        exec.adam_step(&mut model, &mut adam).unwrap();
    }
    let b = task.batch(2, 8);
    exec.step(&mut model, &b.tokens, &b.targets).unwrap();
    let table = exec.placement().clone();
    let params = model.inner.params().clone();
    let grads = model.inner.grads().clone();
    let states = |a: &Adam| {
        a.groups()
            .into_iter()
            .map(|id| (id, a.state(id).cloned()))
            .collect::<Vec<_>>()
    };
    let before = states(&adam);
    // Every expert to the other EP index.
    let owners = (0..table.layers())
        .map(|l| table.owners(l).iter().map(|&q| 1 - q).collect())
        .collect();
    let next = Placement::from_owners(2, owners).unwrap();
    model.armed.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    let result = move_experts(&mut exec, &mut model, &mut adam, &next);
    let secs = t0.elapsed().as_secs_f64();
    let unchanged = exec.placement() == &table
        && model.inner.params() == &params
        && model.inner.grads() == &grads
        && states(&adam) == before;
    let err = match result {
        Ok(_) => "none".to_string(),
        Err(e @ halo_piper::PiperError::Migration { .. }) => format!("migration: {e}"),
        Err(e) => format!("other: {e}"),
    };
    println!("RESULT rank={rank} unchanged={unchanged} secs={secs:.3} err={err}");
}

#[test]
fn a_killed_rank_process_mid_move_leaves_every_survivor_as_it_was() {
    let exe = std::env::current_exe().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let secret = format!(
        "{:064x}",
        u128::from(std::process::id()) << 64 | u128::from(port)
    );
    let mut children: Vec<_> = (0..RANKS)
        .map(|r| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "migration_kill_rank",
                    "--ignored",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", RANKS.to_string())
                .env("HALO_BOOTSTRAP_ADDR", format!("127.0.0.1:{port}"))
                .env("HALO_SECRET", &secret)
                .env_remove("HALO_DEBUG")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    // Every blocking wait of the ranks has a 10 s timeout; allow start-up and two steps.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut statuses = vec![None; RANKS];
    while statuses.iter().any(Option::is_none) {
        for (r, c) in children.iter_mut().enumerate() {
            if statuses[r].is_none() {
                statuses[r] = c.try_wait().unwrap();
            }
        }
        if Instant::now() > deadline {
            for c in &mut children {
                let _ = c.kill();
            }
            panic!("the ranks did not finish within 120 s: {statuses:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for (r, c) in children.iter_mut().enumerate() {
        let mut out = String::new();
        let mut err = String::new();
        c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let status = statuses[r].unwrap();
        if r == VICTIM {
            assert_eq!(
                status.signal(),
                Some(9),
                "rank {r} should die by SIGKILL: {status:?}\n{out}\n{err}"
            );
            assert!(!out.contains("RESULT"), "{out}");
            continue;
        }
        assert!(status.success(), "rank {r}: {status:?}\n{out}\n{err}");
        // The harness prints "test migration_kill_rank ... " before it.
        let line = out
            .lines()
            .find_map(|l| l.find("RESULT").map(|i| &l[i..]))
            .unwrap_or_else(|| panic!("rank {r} printed no result:\n{out}\n{err}"));
        eprintln!("{line}");
        assert!(line.contains("unchanged=true"), "rank {r}: {line}");
        assert!(line.contains("err=migration: "), "rank {r}: {line}");
        let secs: f64 = line
            .split("secs=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap();
        assert!(
            secs < TIMEOUT.as_secs_f64() + 1.0,
            "rank {r} took {secs} s to fail"
        );
    }
}
