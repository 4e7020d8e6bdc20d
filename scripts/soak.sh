#!/usr/bin/env bash
# Soak: thousands of random all-to-all-v calls on 8 ranks (processes under `halo
# launch`, libfabric shm), every element checked, resident memory read from /proc.
#
#   bash scripts/soak.sh            # 180 s (SOAK_SECONDS), 8 ranks (SOAK_RANKS)
#   SOAK_SECONDS=600 bash scripts/soak.sh
#
# The worker is halo/examples/soak.rs: random counts (zeros included) and gapped layouts
# drawn alike on every rank, a random algorithm per call (auto, flat, pairwise, bruck,
# halo, halo2d), every received element and every gap compared. Each rank reports its
# calls, wrong bytes and VmRSS (after 100 warm-up calls, at the end, and the maximum);
# this script also samples every rank's VmRSS from /proc every 5 s. Fails when a byte is
# wrong, a rank fails, the job runs past its bound, or a rank's RSS at the end exceeds
# its post-warm-up RSS by more than SOAK_RSS_GROWTH_KB (default 65536: 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${SOAK_SECONDS:-180}"
ranks="${SOAK_RANKS:-8}"
growth_limit="${SOAK_RSS_GROWTH_KB:-65536}"
export CARGO_INCREMENTAL=0
echo "== building halo and the soak worker (release)"
cargo build --release -q -p halo-cli --bin halo
cargo build --release -q -p halo --example soak
halo=target/release/halo
worker=target/release/examples/soak

out=$(mktemp)
samples=$(mktemp)
trap 'rm -f "$out" "$samples"' EXIT
echo "== soak: $ranks ranks, ${seconds}s"
# --timeout bounds the job (a hang ends with 124); the launcher's own output prefix
# marks each rank's line.
"$halo" launch -n "$ranks" --timeout $((seconds + 120)) -- "$worker" "$seconds" >"$out" 2>&1 &
launcher=$!
# Sample the ranks' RSS from outside, too: the launcher's children.
while kill -0 "$launcher" 2>/dev/null; do
  for p in $(pgrep -P "$launcher" 2>/dev/null || true); do
    kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || true)
    [ -n "$kb" ] && echo "$(date +%s) $p $kb" >>"$samples"
  done
  sleep 5
done
status=0
wait "$launcher" || status=$?
cat "$out" | grep -v '^\s*$' | tail -n 20

lines=$(grep -c 'soak: rank' "$out" || true)
calls=$(grep -o 'calls [0-9]*' "$out" | awk '{print $2}' | sort -n | head -1)
wrong=$(grep -o 'wrong_bytes [0-9]*' "$out" | awk '{s += $2} END {print s + 0}')
read -r start_max end_max max_max growth_max < <(
  grep -o 'rss_kb start [0-9]* end [0-9]* max [0-9]*' "$out" |
    awk '{ if ($3 > s) s = $3; if ($5 > e) e = $5; if ($7 > m) m = $7; g = $5 - $3; if (g > gm) gm = g }
         END { print s + 0, e + 0, m + 0, gm + 0 }')
outside_max=$(awk '{ if ($3 > m) m = $3 } END { print m + 0 }' "$samples")
nsamples=$(wc -l <"$samples")

echo "== soak summary"
echo "   ranks reporting: $lines of $ranks; launcher exit status $status"
echo "   calls per rank: ${calls:-0}; all-to-all-v calls in all: $(( ${calls:-0} * ranks ))"
echo "   wrong bytes: $wrong"
echo "   RSS per rank (KiB, largest over ranks): after warm-up $start_max, end $end_max, max $max_max; largest growth $growth_max"
echo "   RSS sampled from /proc every 5 s: $nsamples samples, max $outside_max KiB"
fail=0
[ "$status" -eq 0 ] || { echo "FAIL: halo launch exited $status"; fail=1; }
[ "$lines" -eq "$ranks" ] || { echo "FAIL: $lines of $ranks ranks reported"; fail=1; }
[ "$wrong" -eq 0 ] || { echo "FAIL: $wrong wrong bytes"; fail=1; }
[ "$growth_max" -le "$growth_limit" ] || { echo "FAIL: RSS grew by $growth_max KiB (> $growth_limit)"; fail=1; }
if [ "$fail" -eq 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
exit "$fail"
