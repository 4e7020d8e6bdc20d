#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages HALO needs.
#   bash scripts/deps.sh        # to build and run (the main job)
#   bash scripts/deps.sh test   # to run the tests as well
# As root it runs apt-get; otherwise it prints the exact command to run.
set -euo pipefail

PACKAGES=(
  pkg-config     # finds hwloc and libfabric
  libhwloc-dev   # hwloc 2.x: local topology discovery (halo-topology, feature "hwloc")
  libudev-dev    # hwloc's static link needs libudev
  libfabric-dev  # libfabric >= 1.14 headers + lib (halo-fabric-sys); shm and tcp;ofi_rxm providers
)
if [ "${1:-}" = "test" ]; then
  PACKAGES+=(
    iproute2       # ip, tc: `halo launch --hosts` builds emulated hosts (netns, bridge, veth, tbf)
    openmpi-bin    # mpirun: `halo launch --mpi` and its tests (MPI baselines on emulated hosts)
    libopenmpi-dev # mpicc: compiles the MPI program of the launch tests; the `mpi` feature
    libclang-dev   # bindgen in the mpi crate's build (feature `mpi`, MPI bootstrap test)
    clang          # idem
    valgrind       # memcheck over the C API's test programs (ffi/halo-c/tests/c_programs.rs)
    g++            # compiles include/halo.h as C++ in the same tests (gcc itself comes with Rust's linker)
  )
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "HALO needs these packages: ${missing[*]}" >&2
  echo "Run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
