#!/usr/bin/env bash
# Installs what the tests need, then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh test
# deps.sh installed numpy: the Python package's tests (ffi/tests/python.rs) must
# run, not skip.
export HALO_REQUIRE_PYTHON_TESTS=1
# As root (CI is), every test can run here: emulated hosts, MPI, valgrind, setpriv. Then a
# test that would skip fails instead, naming what is missing (halo_test_support::skip).
if [ "$(id -u)" -eq 0 ]; then
  export HALO_REQUIRE_ALL="${HALO_REQUIRE_ALL:-1}"
fi
# With the `mpi` feature, so the MPI bootstrap (mpirun -n 4 over Open MPI) is tested too.
cargo test --workspace --all-targets --features halo-cli/mpi "$@"
cargo test --workspace --doc --features halo-cli/mpi
