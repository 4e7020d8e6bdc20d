#!/bin/bash
O=$1; mkdir -p $O
B=/tmp/halo-base; C=/work/wt-cma/target/release/halo
for i in 1 2 3 4 5; do
  for H in $B $C; do
    echo "== latency pair $i $(basename $H) $(uptime)" >> $O/latency.txt
    HALO_TRANSPORT=shm nice -n -10 $H launch --mpi -n 2 --timeout 300 --no-prefix -- $H bench latency -m 1:1 -i 20000 -x 2000 --algo auto,mpi >> $O/latency.txt 2>&1
  done
done
