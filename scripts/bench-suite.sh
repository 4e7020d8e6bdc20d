#!/usr/bin/env bash
# The benchmark configurations of docs/bench/JOURNAL.md ("OSU-style suite against MPI"),
# each HALO against Open MPI in the same run. Needs root for the emulated hosts
# (network namespaces) and Open MPI (bash scripts/deps.sh test).
#   bash scripts/bench-suite.sh [OUT_DIR] [CONFIG...]
# OUT_DIR defaults to target/bench-suite (copy what docs/BENCHMARKS.md should cite into
# docs/bench, SVG only); CONFIGs default to all of:
#   emu4x2 emu4x2-sync emu4x2-v emu4x2-v-sync emu2-p2p host4 host8 threads8
# Each CONFIG writes OUT_DIR/CONFIG/{output.txt,rows.json,*.svg,*.png}
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/bench-suite}
shift || true
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(emu4x2 emu4x2-sync emu4x2-v emu4x2-v-sync emu2-p2p host4 host8 threads8)
cargo build --release -p halo-cli --features mpi --bin halo >&2
halo=$PWD/target/release/halo

run() { # NAME LAUNCH_ARGS... -- BENCH_ARGS...
  local name=$1; shift
  local dir=$out/$name
  mkdir -p "$dir"
  local launch=() bench=()
  while [ "$1" != "--" ]; do launch+=("$1"); shift; done
  shift
  bench=("$@")
  local cmd
  if [ ${#launch[@]} -gt 0 ]; then
    cmd=("$halo" launch "${launch[@]}" --no-prefix -- "$halo" bench "${bench[@]}")
  else
    cmd=("$halo" bench "${bench[@]}")
  fi
  echo "== $name: ${cmd[*]}" >&2
  {
    echo "# command: ${cmd[*]}" | sed "s|$halo|halo|g"
    echo "# date: $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)"
    "${cmd[@]}" --compare --plot-dir "$dir" --json-out "$dir/rows.json"
  } | tee "$dir/output.txt" >&2
}

for c in "${configs[@]}"; do
  case $c in
    emu4x2)   run "$c" --mpi -n 8 --hosts 4 --host-rate 1gbit --timeout 1200 -- \
                alltoall -m 1:1048576 -i 50 -x 5 -f --algo flat,halo,halo2d,auto,mpi ;;
    emu4x2-sync) run "$c" --mpi -n 8 --hosts 4 --host-rate 1gbit --timeout 1200 -- \
                alltoall -m 1:1048576 -i 50 -x 5 -f --sync --algo flat,halo,halo2d,auto,mpi ;;
    emu4x2-v) run "$c" --mpi -n 8 --hosts 4 --host-rate 1gbit --timeout 1200 -- \
                alltoallv -m 1:262144 -i 50 -x 5 -f --algo flat,halo,auto,mpi --experts 64 --topk 2 --skew 1.0 ;;
    emu4x2-v-sync) run "$c" --mpi -n 8 --hosts 4 --host-rate 1gbit --timeout 1200 -- \
                alltoallv -m 1:262144 -i 50 -x 5 -f --sync --algo flat,halo,auto,mpi --experts 64 --topk 2 --skew 1.0 ;;
    emu2-p2p) run "$c-latency" --mpi -n 2 --hosts 2 --host-rate 1gbit --timeout 600 -- \
                latency -m 0:65536 -i 1000 -x 100 --algo auto,mpi
              run "$c-bw" --mpi -n 2 --hosts 2 --host-rate 1gbit --timeout 600 -- \
                bw -m 1:4194304 -i 10 -x 2 --algo auto,mpi ;;
    host4)    run "$c" --mpi -n 4 --timeout 1200 -- \
                alltoall -m 1:1048576 -i 200 -x 20 -f --algo flat,halo,auto,mpi,memcpy ;;
    host8)    run "$c" --mpi -n 8 --timeout 1200 -- \
                alltoall -m 1:1048576 -i 100 -x 10 -f --algo flat,halo,auto,mpi,memcpy ;;
    threads8) run "$c" -- alltoall --topology flat:8 --no-emulation -m 1:1048576 -i 100 -x 10 -f \
                --algo flat,pairwise,halo,auto,memcpy ;;
    *) echo "unknown configuration $c" >&2; exit 2 ;;
  esac
done
