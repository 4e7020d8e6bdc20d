#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages HALO needs.
#   bash scripts/deps.sh        # to build and run (the main job)
#   bash scripts/deps.sh test   # to run the tests as well (adds numpy, torch and expecttest
#                               # for the python3 on PATH)
# As root it runs apt-get (and pip); otherwise it prints the exact command to run.
set -euo pipefail

PACKAGES=(
  pkg-config     # finds hwloc and libfabric
  fonts-dejavu-core # the font of the plots (`halo bench --compare`, `halo simulate --plot`)
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
    valgrind       # memcheck over the C API's test programs (ffi/tests/c_programs.rs)
    g++            # compiles ffi/include/halo.h as C++ in the same tests (gcc itself comes with Rust's linker)
    python3        # the Python package's tests (python/tests, run by ffi/tests/python.rs)
    python3-pip    # pip, to install numpy for them (below)
  )
fi

# For the python3 on PATH (a pyenv or venv python, or Debian's own, which needs
# --break-system-packages), the Python tests need numpy, PyTorch (the "halo"
# torch.distributed backend's tests, about 2 minutes and 5.4 GB from the registry: its
# CUDA wheels come with it; it runs on CPU) and expecttest (torch's own distributed
# test suite, which ships in the torch wheel, imports it).
TORCH_VERSION="${HALO_TORCH_VERSION:-2.15.0}"
python_deps() {
  [ "${1:-}" = "test" ] || return 0
  local want=()
  python3 -c 'import numpy' 2>/dev/null || want+=(numpy)
  python3 -c 'import torch' 2>/dev/null || want+=("torch==$TORCH_VERSION")
  python3 -c 'import expecttest' 2>/dev/null || want+=(expecttest)
  [ ${#want[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] && [ -z "${VIRTUAL_ENV:-}" ]; then
    echo "The Python tests need ${want[*]} for $(command -v python3)." >&2
    echo "Run: python3 -m pip install ${want[*]}" >&2
    exit 1
  fi
  echo "installing ${want[*]} for $(command -v python3)" >&2
  export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
  python3 -m pip install -q "${want[@]}" 2>/dev/null \
    || python3 -m pip install -q --break-system-packages "${want[@]}"
  python3 -c 'import numpy, torch, expecttest' \
    || { echo "numpy, torch or expecttest did not install for python3" >&2; exit 1; }
}

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  python_deps "${1:-}"
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
python_deps "${1:-}"
