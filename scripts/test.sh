#!/usr/bin/env bash
# Installs what the tests need, then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh test
# With the `mpi` feature, so the MPI bootstrap (mpirun -n 4 over Open MPI) is tested too.
cargo test --workspace --all-targets --features halo/mpi "$@"
cargo test --workspace --doc --features halo/mpi
