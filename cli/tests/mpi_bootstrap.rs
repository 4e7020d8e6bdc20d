//! Bootstrap through MPI: `mpirun -n 4 halo-mpi-check` joins the job with
//! `MPI_Allgatherv` and verifies every algorithm byte-exact over libfabric.
//! Built and run with `cargo test -p halo-cli --features mpi --test mpi_bootstrap`.
#![cfg(feature = "mpi")]

use std::process::Command;

#[test]
fn four_ranks_bootstrap_through_mpi() {
    let exe = env!("CARGO_BIN_EXE_halo-mpi-check");
    let out = Command::new("timeout")
        .args([
            "120",
            "mpirun",
            "-n",
            "4",
            "--oversubscribe",
            "--mca",
            "mpi_yield_when_idle",
            "1",
            exe,
        ])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("HALO_TIMEOUT_MS", "30000")
        .output()
        .expect("mpirun runs (apt-get install openmpi-bin)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mpirun failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    for r in 0..4 {
        assert!(
            stdout.contains(&format!("rank {r}/4 (MPI bootstrap):")),
            "rank {r} missing:\n{stdout}\n{stderr}"
        );
    }
}
