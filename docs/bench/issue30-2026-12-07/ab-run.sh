#!/usr/bin/env bash
# A/B of issue 30's changes: bash ab-run.sh BEFORE_HALO AFTER_HALO [OUT_DIR]
# (the run here: BEFORE = the release halo of 02b407a, AFTER = of 25c3a0e; --features mpi).
# Writes bw.txt, own-barrier.txt, launch.txt, mainjob.txt into OUT_DIR (default: .).
B=${1:?halo binary of the before build}; A=${2:?halo binary of the after build}
mkdir -p "${3:-.}" && cd "${3:-.}"
ratio() { sed -n '/Speed-up over MPI/,$p' | grep -E "^[0-9]"; }
{
echo "# bw, 2 processes under --mpi, us per message (halo-blocking, halo, mpi), 3 alternations"
for r in 1 2 3; do for v in B A; do eval H=\$$v
  echo "## $v round $r load $(cut -d' ' -f1 /proc/loadavg)"
  $H launch --mpi -n 2 --no-prefix -- $H bench bw -m 1:1024 --rounds 3 --algo halo-blocking,halo,mpi 2>&1 | sed -n '/^# Size.*mpi$/,/^$/p' | head -12
done; done
} > bw.txt 2>&1
{
echo "# alltoall --own-barrier, speed-up of auto over MPI (mpi time / auto time), 1 B-1 MiB"
for n in 4 8; do for r in 1 2; do for v in B A; do eval H=\$$v
  echo "## n=$n $v round $r load $(cut -d' ' -f1 /proc/loadavg)"
  $H launch --mpi -n $n --no-prefix -- $H bench alltoall -m 1:1048576 --rounds 3 --own-barrier --algo auto,mpi 2>&1 | ratio | awk '{printf "%s:%s ", $1, $2} END {print ""}'
done; done; done
} > own-barrier.txt 2>&1
{
echo "# without MPI against --mpi --own-barrier, auto, 256 KiB-1 MiB, us (after only)"
for r in 1 2 3; do
  echo "## round $r load $(cut -d' ' -f1 /proc/loadavg)"
  echo -n "nompi: "; $A launch -n 4 --no-prefix -- $A bench alltoall -m 262144:1048576 -i 60 -x 5 --rounds 3 --algo auto 2>&1 | grep -E "^[0-9]" | awk '{printf "%s:%s ", $1, $2} END {print ""}'
  echo -n "mpi-own: "; $A launch --mpi -n 4 --no-prefix -- $A bench alltoall -m 262144:1048576 -i 60 -x 5 --rounds 3 --own-barrier --algo auto 2>&1 | grep -E "^[0-9]" | awk '{printf "%s:%s ", $1, $2} END {print ""}'
done
} > launch.txt 2>&1
{
echo "# the main job: B = bench -i 50 -x 5 (x20, trials timed); A = bench -i 50 -x 5 --scale 100 (the new quickstart)"
for r in 1 2 3; do
  echo "## B round $r load $(cut -d' ' -f1 /proc/loadavg)"; $B bench -i 50 -x 5 2>&1 | sed -n '/Speed-up over the flat/,$p'
  echo "## A round $r load $(cut -d' ' -f1 /proc/loadavg)"; $A bench -i 50 -x 5 --scale 100 2>&1 | sed -n '/Speed-up over the flat/,$p'
done
} > mainjob.txt 2>&1
