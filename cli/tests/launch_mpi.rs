//! `halo launch --mpi`: an MPI program through Open MPI's mpirun, locally and on
//! emulated hosts.

#[macro_use]
mod launch_common;

use launch_common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

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
            halo_test_support::skip(&format!(
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
