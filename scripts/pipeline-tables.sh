#!/usr/bin/env bash
# The measured tables of docs/PIPELINE.md: `halo train` (threads) against the resource
# model and the planner. Run by hand (about 10 minutes on 2 cores):
#
#   bash scripts/pipeline-tables.sh [STEPS]
#
# 1. Activation memory: `cargo test -p halo-piper --release --test pipeline_memory`
#    prints measured peaks per stage against M(i).
# 2. Bubble: PP 2 and 4, EP 1, M 1..16, 16 sequences per step; the mean idle share of
#    the ranks (time in point-to-point calls beyond their transfer) against 1F1B's
#    (PP-1)/(M+PP-1).
# 3. Planner ranking: every valid layout of `halo plan layout` for reference:tiny on
#    nodes:2x4 (8 ranks, 2 emulated hosts) with this machine's measured CPU profile
#    (the cpu_profile example), each run as `halo train --emulate` with the planner's M
#    and 64 sequences per step; predicted vs measured step time and rank.
# 4. Overlap: PP 2 x EP 4 on 2 emulated hosts, blocking vs --overlap, emulation x1 and x50.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-12}
cargo build --release -q -p halo-cli -p halo-piper --examples --bins
halo=target/release/halo
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "## 1. Activation memory"
cargo test -q --release -p halo-piper --test pipeline_memory -- --nocapture 2>/dev/null | grep '^|'

echo
echo "## 2. Bubble (threads, EP 1, 16 sequences, $steps steps)"
echo "| PP | M | measured idle share | (PP-1)/(M+PP-1) |"
echo "|---|---|---|---|"
for pp in 2 4; do
  for m in 1 2 4 8 16; do
    line=$($halo train --pp "$pp" --ep 1 --microbatches "$m" --batch 16 --steps "$steps" \
      | grep '^idle share')
    mean=$(sed -E 's/.*mean ([0-9.]+).*/\1/' <<<"$line")
    ideal=$(sed -E 's/.*ideal ([0-9.]+).*/\1/' <<<"$line")
    echo "| $pp | $m | $mean | $ideal |"
  done
done

echo
echo "## 3. Planner ranking vs measured (nodes:2x4, link emulation, 64 sequences, $steps steps)"
target/release/examples/cpu_profile 8 "$(nproc)" >"$tmp/cpu.toml"
$halo plan layout --model reference:tiny --profile "$tmp/cpu.toml" --topology nodes:2x4 \
  --batch 64 --seq 32 --json >"$tmp/plan.json"
python3 - "$tmp/plan.json" >"$tmp/layouts" <<'EOF'
import json, sys
# The planner splits a micro-batch's tokens over the EP group; the executor gives each
# EP rank whole sequences, so EP x DP x M must divide the batch: the planner's M, else
# the largest M below it that does (and still >= PP).
for l in json.load(open(sys.argv[1]))["layouts"]:
    m = l["microbatches"]
    while m > l["pp"] and 64 % (l["ep"] * l["dp"] * m):
        m -= 1
    print(l["pp"], l["ep"], l["dp"], m, l["step_seconds"], l["microbatches"])
EOF
rank=0
while read -r pp ep dp m predicted planned_m; do
  rank=$((rank + 1))
  $halo train --topology nodes:2x4 --emulate --pp "$pp" --ep "$ep" --dp "$dp" \
    --microbatches "$m" --batch 64 --steps "$steps" --json >"$tmp/run.json"
  measured=$(python3 - "$tmp/run.json" <<'EOF'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
print(statistics.median(r["seconds"] for r in rows[2:]))
EOF
)
  echo "$rank $pp $ep $dp $m $predicted $measured $planned_m" >>"$tmp/ranking"
done <"$tmp/layouts"
python3 - "$tmp/ranking" <<'EOF'
import sys
rows = [l.split() for l in open(sys.argv[1])]
by_measured = sorted(rows, key=lambda r: float(r[6]))
mrank = {tuple(r[1:5]): i + 1 for i, r in enumerate(by_measured)}
print("| predicted rank | PP x EP x DP | M run (planned) | predicted s/step | measured s/step | measured rank |")
print("|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]} x {r[2]} x {r[3]} | {r[4]} ({r[7]}) | {float(r[5]):.3f} | {float(r[6]):.3f} | {mrank[tuple(r[1:5])]} |")
n = len(rows)
d2 = sum((int(r[0]) - mrank[tuple(r[1:5])]) ** 2 for r in rows)
print(f"\nSpearman rank correlation: {1 - 6 * d2 / (n * (n * n - 1)):.2f} over {n} layouts")
EOF

echo
echo "## 4. Overlap (threads, PP 2 x EP 4 on nodes:2x4 with link emulation, $steps steps)"
echo "| emulation scale | blocking s/step | --overlap s/step | ratio | same losses |"
echo "|---|---|---|---|---|"
for scale in 1 50; do
  $halo train --hosts 2 --emulate "$scale" --steps "$steps" --json >"$tmp/plain.json"
  $halo train --hosts 2 --emulate "$scale" --steps "$steps" --json --overlap >"$tmp/over.json"
  python3 - "$tmp/plain.json" "$tmp/over.json" "$scale" <<'PY'
import json, sys, statistics
def load(p):
    return [json.loads(l) for l in open(p) if '"loss"' in l]
a, b = load(sys.argv[1]), load(sys.argv[2])
ma = statistics.median(r["seconds"] for r in a[2:])
mb = statistics.median(r["seconds"] for r in b[2:])
same = all(x["loss"] == y["loss"] for x, y in zip(a, b)) and len(a) == len(b)
print(f"| {sys.argv[3]} | {ma:.4f} | {mb:.4f} | {ma / mb:.2f}x | {'bitwise' if same else 'NO'} |")
PY
done
