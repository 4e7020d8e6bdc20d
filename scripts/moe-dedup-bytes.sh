#!/usr/bin/env bash
# Issue 18: inter-host bytes of MoeExchange, dedup vs a2av, on emulated hosts (root).
# For each k and mode, runs halo/examples/moe_dedup under `halo launch --hosts H` twice —
# with rows of D f32 and with D = 0 (same routing, same control traffic) — and prints
# the veth tx bytes of all hosts, their difference (the rows' bytes on the wire) and
# the routing's prediction. Fails when a difference is below the prediction or more
# than 10% (TCP/IP framing) above it.
#   cargo build [--release] -p halo --example moe_dedup && cargo build [--release] -p halo-cli
#   [PROFILE=release] scripts/moe-dedup-bytes.sh [HOSTS=4] [RANKS=8] [D=1024] [TOKENS=128] [REPS=2]
# PROFILE (debug by default) names the target/ folder the binaries are taken from.
set -euo pipefail
cd "$(dirname "$0")/.."
HOSTS=${1:-4}; RANKS=${2:-8}; D=${3:-1024}; TOKENS=${4:-128}; REPS=${5:-2}
PROFILE=${PROFILE:-debug}
HALO=target/$PROFILE/halo; EX=target/$PROFILE/examples/moe_dedup
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
run() { # mode k d -> "tx_bytes|line"
  "$HALO" launch -n "$RANKS" --hosts "$HOSTS" --stats-json "$dir/s.json" --timeout 300 -- \
    "$EX" "$1" "$2" "$3" "$TOKENS" "$REPS" > "$dir/out" 2>&1 || { cat "$dir/out" >&2; exit 1; }
  tx=$(python3 -c 'import json,sys; print(sum(h["tx_bytes"] for h in json.load(open(sys.argv[1]))["hosts"]))' "$dir/s.json")
  echo "$tx|$(grep 'moe_dedup:' "$dir/out")"
}
printf '%-2s %-6s %12s %12s %12s %14s %7s %s\n' k mode tx_bytes tx_bytes_d0 row_bytes predicted ratio seconds_per_rep
status=0
for k in 1 2 4 8; do
  for mode in a2av dedup; do
    full=$(run "$mode" "$k" "$D"); empty=$(run "$mode" "$k" 0)
    tx=${full%%|*}; tx0=${empty%%|*}; line=${full#*|}
    pred=$(sed -E 's/.*predicted_row_bytes ([0-9]+).*/\1/' <<<"$line")
    secs=$(sed -E 's/.*seconds_per_rep ([0-9.]+).*/\1/' <<<"$line")
    rows=$((tx - tx0))
    ratio=$(python3 -c "print(f'{$rows/$pred:.4f}')")
    printf '%-2s %-6s %12s %12s %12s %14s %7s %s\n' "$k" "$mode" "$tx" "$tx0" "$rows" "$pred" "$ratio" "$secs"
    python3 -c "import sys; sys.exit(0 if 1.0 <= $rows/$pred <= 1.10 else 1)" || { echo "k=$k $mode: row bytes $rows vs predicted $pred" >&2; status=1; }
  done
done
exit $status
