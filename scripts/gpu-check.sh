#!/usr/bin/env bash
# The device path's one prepared check (issue 17), for a machine with an NVIDIA GPU,
# the CUDA runtime and NCCL but no Rust toolchain and no libfabric.
#
# NOT RUN ON A GPU YET: no GPU was at hand when this was written; it has only taken its
# "skipped" branch (status 77) on machines without one.
#
# Two halves:
#
#   bash scripts/gpu-check.sh --bundle DIR     # here, with Rust: build and pack
#   bash DIR/gpu-check.sh [OUT.json]           # there, on the GPU machine
#
# --bundle builds libhalo.so and the check program (ffi/examples/gpu_check.rs)
# in release mode (GPU_CHECK_PROFILE=debug for a quicker build), and copies into DIR:
# bin/halo-gpu-check, lib/ (libhalo.so and every shared library the two need that is
# not the C library itself: libfabric and what it links), python/halo (the package),
# and this script. It then runs the bundle here: on a machine without a GPU that run
# prints why and exits 77, which --bundle reports and returns (CI runs exactly that:
# .ci/run). Copy DIR to the GPU machine (scp -r DIR gpu:), run DIR/gpu-check.sh there.
# Build on a system whose glibc is not newer than the GPU machine's (the bundle says
# so when the loader refuses it).
#
# On the GPU machine (under 5 minutes), it:
#   0. records what HALO's discovery reads (NVML's NVLink links on NVIDIA: issue 33);
#   1. finds NCCL and the CUDA runtime: HALO_NCCL_LIBRARY / HALO_CUDART_LIBRARY if set,
#      else the wheels of python3 (torch's: HALO_PYTHON_SITE from its sys.path), else
#      the library search of sys/rccl; reports the versions;
#   2. runs a one-rank communicator's haloAllToAll and haloAllToAllv on device buffers
#      with a stream through the C ABI (1 B, 4 KiB, 1 MiB per peer) and checks the bytes
#      against the host reference and against NCCL's ncclAlltoAll (NCCL >= 2.28);
#   3. runs N ranks (HALO_GPU_CHECK_RANKS, default 8) on the one GPU with HALO's wave
#      plans for every algorithm (device-to-device copies on one stream; NCCL refuses
#      two ranks on one GPU), checks every byte, and times them with events against one
#      device-to-device copy of the same bytes, printing the ratio;
#   4. runs the Python package on CUDA tensors under torch (halo.Communicator's
#      all_to_all_single / all_to_all on a one-rank communicator), checking the bytes.
# It writes one JSON (OUT.json, default ./gpu-check.json) and exits 0 when every check
# passed, 1 when one failed, 77 ("skipped") when there is no GPU, no CUDA runtime or no
# NCCL — printing which.
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"

if [ "${1:-}" = "--bundle" ]; then
    dir="${2:?usage: gpu-check.sh --bundle DIR}"
    root="$(cd "$here/.." && pwd)"
    profile="${GPU_CHECK_PROFILE:-release}"
    flag=(--release)
    [ "$profile" = debug ] && flag=()
    echo "== gpu-check: building libhalo and the check program ($profile)"
    (cd "$root" && CARGO_INCREMENTAL=0 cargo build -q "${flag[@]}" -p halo-ffi --lib --example gpu_check) || exit 1
    rm -rf "$dir"
    mkdir -p "$dir/bin" "$dir/lib" "$dir/python"
    cp "$root/target/$profile/examples/gpu_check" "$dir/bin/halo-gpu-check"
    cp "$root/target/$profile/libhalo.so" "$dir/lib/"
    cp -r "$root/python/halo" "$dir/python/"
    find "$dir/python" -name __pycache__ -prune -exec rm -rf {} +
    cp "$root/scripts/gpu-check.sh" "$dir/gpu-check.sh"
    # The shared libraries the two need, except glibc's own and libgcc_s (every system
    # has them). Built on Debian 12, the bundle needs glibc >= 2.34 (Ubuntu 22.04, RHEL 9).
    ldd "$dir/bin/halo-gpu-check" "$dir/lib/libhalo.so" | awk '/=> \// {print $3}' | sort -u |
        grep -Ev '/(libc|libm|libdl|libpthread|librt|libutil|libgcc_s|ld-linux[^/]*)\.so' |
        while read -r lib; do cp -L "$lib" "$dir/lib/"; done
    echo "== gpu-check: bundle in $dir ($(du -sh "$dir" | cut -f1)): $(ls "$dir/lib" | tr '\n' ' ')"
    echo "== gpu-check: running the bundle here"
    rc=0
    bash "$dir/gpu-check.sh" "$dir/gpu-check.json" || rc=$?
    case $rc in
        0) echo "== gpu-check: passed (a GPU is here)";;
        77) echo "== gpu-check: skipped here (status 77): no GPU, CUDA runtime or NCCL on this machine";;
        *) echo "== gpu-check: FAILED (status $rc)";;
    esac
    exit $rc
fi

out="${1:-$PWD/gpu-check.json}"
bin="$here/bin/halo-gpu-check"
if [ ! -x "$bin" ]; then
    echo "gpu-check: $bin not found: make a bundle first (bash scripts/gpu-check.sh --bundle DIR)" >&2
    exit 1
fi
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# libfabric's PSM provider would install its own crash handlers (docs/ARCHITECTURE.md).
export IPATH_NO_BACKTRACE=1

# The loader must accept the bundle (a newer glibc where it was built says so here).
if ! loader=$("$bin" --loader-check 2>&1); then
    echo "gpu-check: FAILED: the bundle does not run on this machine: $loader" >&2
    printf '{"tool": "halo-gpu-check", "status": "failed", "failed": "the bundle does not load"}\n' >"$out"
    exit 1
fi

# 1. A GPU? (Said here; the check program decides: it skips with the libraries' or the
# driver's own reason.)
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L >&2 || true
elif [ ! -e /dev/nvidia0 ] && [ ! -e /dev/kfd ]; then
    echo "gpu-check: no GPU device here (no nvidia-smi, no /dev/nvidia0, no /dev/kfd)" >&2
fi
# NCCL and the runtime of python3's wheels (torch's): the library's own search looks
# through the interpreter's sys.path (HALO_PYTHON_SITE, as the Python package sets it):
# nvidia/cu13/lib (CUDA 13), nvidia/cuda_runtime/lib (CUDA 12), nvidia/nccl/lib, torch/lib.
if [ -z "${HALO_PYTHON_SITE:-}" ] && command -v python3 >/dev/null 2>&1; then
    HALO_PYTHON_SITE="$(python3 -c 'import os, sys; print(os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)))' 2>/dev/null || true)"
    export HALO_PYTHON_SITE
fi
echo "gpu-check: NCCL ${HALO_NCCL_LIBRARY:-(search)}, CUDA runtime ${HALO_CUDART_LIBRARY:-(search)}" >&2

# 2-3. The check program (it exits 77 itself without a runtime, NCCL or device).
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
rc=0
timeout 240 "$bin" "$tmp/check.json" >"$tmp/check.out" || rc=$?
cat "$tmp/check.out"
if [ $rc -eq 124 ]; then
    echo "gpu-check: FAILED: the check program ran past 240 s" >&2
    rc=1
fi
if [ $rc -ne 0 ]; then
    cp "$tmp/check.json" "$out" 2>/dev/null ||
        printf '{"tool": "halo-gpu-check", "status": "failed", "failed": "status %s"}\n' "$rc" >"$out"
    exit $rc
fi

# 4. Python on CUDA tensors under torch.
py_rc=0
PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}" HALO_LIBRARY="$here/lib/libhalo.so" \
    timeout 120 python3 - "$tmp/python.json" <<'PY' || py_rc=$?
import json, sys
result = {}
try:
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    import halo
    comm = halo.init_rank(1, halo.get_unique_id(), 0)
    for n in (1, 4096, 1 << 20):
        inp = torch.arange(n, dtype=torch.float32, device="cuda")
        out = torch.full_like(inp, -1.0)
        comm.all_to_all_single(out, inp)                       # even split: haloAllToAll
        torch.cuda.current_stream().synchronize()
        assert torch.equal(out, inp), f"all_to_all_single, {n} elements"
        out.fill_(-1.0)
        comm.all_to_all_single(out, inp, [n], [n])             # haloAllToAllv
        torch.cuda.current_stream().synchronize()
        assert torch.equal(out, inp), f"all_to_all_single with sizes, {n} elements"
        outs = [torch.full_like(inp, -1.0)]
        comm.all_to_all(outs, [inp])
        torch.cuda.current_stream().synchronize()
        assert torch.equal(outs[0], inp), f"all_to_all, {n} elements"
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        inp = torch.arange(1000, dtype=torch.bfloat16, device="cuda")
        out = torch.zeros_like(inp)
        comm.all_to_all_single(out, inp)
    s.synchronize()
    assert torch.equal(out, inp), "all_to_all_single on a side stream"
    comm.destroy()
    result = {"status": "passed", "torch": torch.__version__, "checks": "all_to_all_single, all_to_all on CUDA tensors (1, 4096, 1M elements; a side stream)"}
except Exception as e:  # reported, and the script fails
    result = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
json.dump(result, open(sys.argv[1], "w"))
print("python:", json.dumps(result))
sys.exit(0 if result["status"] == "passed" else 1)
PY
python3 - "$tmp/check.json" "$tmp/python.json" "$out" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
try:
    report["python_torch"] = json.load(open(sys.argv[2]))
except Exception as e:
    report["python_torch"] = {"status": "failed", "error": f"no result: {e}"}
if report["python_torch"].get("status") != "passed":
    report["status"] = "failed"
json.dump(report, open(sys.argv[3], "w"), indent=2)
PY
echo "gpu-check: results in $out" >&2
[ $py_rc -eq 0 ] || exit 1
exit 0
