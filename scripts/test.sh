#!/usr/bin/env bash
# Installs what the tests need, then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh test
# deps.sh installed numpy: the Python package's tests (ffi/halo-c/tests/python.rs) must
# run, not skip.
export HALO_REQUIRE_PYTHON_TESTS=1
# With the `mpi` feature, so the MPI bootstrap (mpirun -n 4 over Open MPI) is tested too.
cargo test --workspace --all-targets --features halo/mpi "$@"
cargo test --workspace --doc --features halo/mpi
