#!/usr/bin/env bash
# The outside harness (osu_alltoall.c): HALO's C API under `halo launch` (no MPI) and
# Open MPI's MPI_Alltoall under mpirun, each in its own launch, alternated ROUNDS times.
#   bash scripts/outside/run.sh [RANKS] [MIN] [MAX] [ITERS] [SKIP] [ROUNDS]
# Needs Open MPI (bash scripts/deps.sh test) and a C compiler.
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-4} min=${2:-1} max=${3:-1048576} iters=${4:-100} skip=${5:-10} rounds=${6:-3}
cargo build --release -q -p halo-ffi --lib
cargo build --release -q -p halo-cli --bin halo
out=target/outside
mkdir -p "$out"
cc -O2 -Wall -Iffi/include scripts/outside/osu_alltoall.c -Ltarget/release -lhalo \
  -Wl,-rpath,"$PWD/target/release" -o "$out/osu_halo"
mpicc -O2 -Wall -DUSE_MPI scripts/outside/osu_alltoall.c -o "$out/osu_mpi"
root=()
[ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
for r in $(seq "$rounds"); do
  echo "## round $r: MPI_Alltoall under mpirun (load $(cut -d' ' -f1 /proc/loadavg))"
  mpirun "${root[@]}" --oversubscribe -n "$n" "$out/osu_mpi" "$min" "$max" "$iters" "$skip"
  echo "## round $r: haloAllToAll under halo launch (load $(cut -d' ' -f1 /proc/loadavg))"
  target/release/halo launch -n "$n" --no-prefix -- "$out/osu_halo" "$min" "$max" "$iters" "$skip"
done
