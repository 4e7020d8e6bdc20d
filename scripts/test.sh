#!/usr/bin/env bash
# Installs what the tests need, then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh test
cargo test --workspace --all-targets "$@"
cargo test --workspace --doc
# The MPI bootstrap (cargo feature `mpi`): mpirun -n 4 over Open MPI.
cargo test --features mpi --test mpi_bootstrap
