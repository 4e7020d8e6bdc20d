#!/bin/bash
# usage: bench.sh OUTDIR
set -u
O=$1; mkdir -p $O
B=/tmp/halo-base; C=/work/wt-cma/target/release/halo
L="nice -n -10"
echo "== start $(date -u +%T) $(uptime)" | tee -a $O/log
for i in 1 2 3; do
  for H in $B $C; do
    echo "== latency pair $i $(basename $H) $(uptime)" >> $O/latency.txt
    HALO_TRANSPORT=shm $L $H launch --mpi -n 2 --timeout 300 --no-prefix -- $H bench latency -m 1:1 -i 20000 -x 2000 --algo auto,mpi >> $O/latency.txt 2>&1
  done
done
echo "== latency done $(date -u +%T) $(uptime)" | tee -a $O/log
for i in 1 2; do
  for cma in 0 1; do
    echo "== bw run $i HALO_SHM_CMA=$cma $(uptime)" >> $O/bw.txt
    HALO_SHM_CMA=$cma HALO_TRANSPORT=shm $L $C launch --mpi -n 2 --timeout 300 --no-prefix -- $C bench bw -m 4096:4194304 --algo halo,mpi >> $O/bw.txt 2>&1
  done
done
echo "== bw done $(date -u +%T) $(uptime)" | tee -a $O/log
for n in 4 8; do
  for i in 1 2; do
    for cma in 0 1; do
      echo "== alltoall n=$n run $i HALO_SHM_CMA=$cma $(uptime)" >> $O/alltoall.txt
      HALO_SHM_CMA=$cma HALO_TRANSPORT=shm $L $C launch --mpi -n $n --timeout 600 --no-prefix -- $C bench alltoall -m 262144:1048576 -i 40 -x 5 -f --algo flat,auto,mpi >> $O/alltoall.txt 2>&1
    done
  done
done
echo "== end $(date -u +%T) $(uptime)" | tee -a $O/log
