#!/usr/bin/env bash
# bw before / after the batched and eager sends (issue 30, item 5):
# bash bw-batch.sh BEFORE_HALO AFTER_HALO > bw-batch.txt  (release builds, --features mpi)
B=${1:?halo binary of the before build}; A=${2:?halo binary of the after build}
T=$(mktemp); trap 'rm -f "$T"' EXIT
table() { sed -n '/^# Size.*mpi$/,/^$/p' "$T"; }
echo "# bw, 2 processes under --mpi, us per message (halo-blocking, halo, mpi), window 64, 3 alternations"
for r in 1 2 3; do for v in B A; do eval H=\$$v
  echo "## $v round $r load $(cut -d' ' -f1 /proc/loadavg)"
  $H launch --mpi -n 2 --no-prefix -- $H bench bw -m 1:8192 --rounds 3 --algo halo-blocking,halo,mpi > "$T" 2>&1 || { echo "failed: $?"; cat "$T"; }
  table
done; done
echo "# 8 B by window (messages per scope): us per message (halo, mpi), 2 alternations"
for w in 8 16 32 64 128 512; do for r in 1 2; do for v in B A; do eval H=\$$v
  echo -n "window $w $v round $r load $(cut -d' ' -f1 /proc/loadavg): "
  $H launch --mpi -n 2 --no-prefix -- $H bench bw -m 8:8 --window $w --rounds 3 --algo halo,mpi > "$T" 2>&1 || { echo "failed: $?"; cat "$T"; }
  table | sed -n 2p
done; done; done
