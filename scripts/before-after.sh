#!/usr/bin/env bash
# Two builds of `halo`, measured in one run with their launches alternated, so that load
# drifting over the run hits both alike (docs/BENCHMARKS.md cites what it printed).
#
#   bash scripts/before-after.sh BEFORE_HALO AFTER_HALO [ROUNDS] [OUT_DIR]
#   CONFIGS="host4 lat2" bash scripts/before-after.sh ...   # some configurations only
#
# Each round runs, for BEFORE then AFTER (the order swapped every other round):
#   one host, 4 processes:  halo bench alltoall -m 1:65536 (auto)
#   one host, 2 processes:  halo bench latency -m 1:1024 (auto)
#   one host, 2 processes over libfabric (HALO_TRANSPORT=fabric, shm): the same latency
#     (config fablat2; only when named in CONFIGS)
#   4 emulated hosts x 2 at 1 Gbit/s (as root): halo bench alltoall -m 1:65536 (auto)
# and writes each launch's JSON to OUT_DIR/<config>-<build>-<round>.json. At the end it
# prints, per configuration and size, the median over rounds of each build's average
# time and the ratio before / after (> 1: the after build is faster).
set -euo pipefail
before=${1:?usage: before-after.sh BEFORE_HALO AFTER_HALO [ROUNDS] [OUT_DIR]}
after=${2:?usage: before-after.sh BEFORE_HALO AFTER_HALO [ROUNDS] [OUT_DIR]}
rounds=${3:-5}
out=${4:-$(mktemp -d /tmp/halo-before-after.XXXXXX)}
mkdir -p "$out"

# CONFIGS="host4 lat2" picks some; by default all (emu4x2 only as root).
if [ -n "${CONFIGS:-}" ]; then
  read -r -a configs <<<"$CONFIGS"
else
  configs=(host4 lat2)
  if [ "$(id -u)" -eq 0 ]; then configs+=(emu4x2); fi
fi

run() { # config build binary round
  local c=$1 b=$2 h=$3 r=$4 f="$out/$1-$2-$4.json"
  case $c in
    host4) "$h" launch -n 4 --timeout 600 --no-prefix -- \
             "$h" bench alltoall -m 1:65536 -i 200 -x 20 --algo auto --format json >"$f" ;;
    lat2) "$h" launch -n 2 --timeout 600 --no-prefix -- \
             "$h" bench latency -m 1:1024 -i 5000 -x 500 --algo auto --format json >"$f" ;;
    fablat2) HALO_TRANSPORT=fabric "$h" launch -n 2 --timeout 600 --no-prefix -- \
             "$h" bench latency -m 1:1024 -i 5000 -x 500 --algo auto --format json >"$f" ;;
    emu4x2) "$h" launch -n 8 --hosts 4 --host-rate 1gbit --timeout 600 --no-prefix -- \
             "$h" bench alltoall -m 1:65536 -i 50 -x 5 --algo auto --format json >"$f" ;;
  esac
}

for r in $(seq 1 "$rounds"); do
  for c in "${configs[@]}"; do
    if [ $((r % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
    for b in $order; do
      if [ "$b" = before ]; then h=$before; else h=$after; fi
      echo "round $r: $c $b" >&2
      run "$c" "$b" "$h" "$r"
    done
  done
done

python3 - "$out" "$rounds" "${configs[@]}" <<'EOF'
import json, statistics, sys
out, rounds, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"# {rounds} rounds, launches alternated; JSON in {out}")
for c in configs:
    times = {}
    for b in ("before", "after"):
        for r in range(1, rounds + 1):
            text = open(f"{out}/{c}-{b}-{r}.json").read()
            doc = json.loads(text[text.index("{"):])
            for row in doc["rows"]:
                times.setdefault((row["size"], b), []).append(row["avg_us"])
    print(f"\n## {c}\n| bytes | before (us) | after (us) | before / after |\n|---|---|---|---|")
    ratios = []
    for size in sorted({s for s, _ in times}):
        tb = statistics.median(times[(size, "before")])
        ta = statistics.median(times[(size, "after")])
        ratios.append(tb / ta)
        print(f"| {size} | {tb:.2f} | {ta:.2f} | {tb / ta:.2f}x |")
    geo = statistics.geometric_mean(ratios)
    print(f"geometric mean over {len(ratios)} sizes: {geo:.3f}x (range {min(ratios):.2f}-{max(ratios):.2f}x)")
EOF
