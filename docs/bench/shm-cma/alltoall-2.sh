#!/bin/bash
O=$1; mkdir -p $O
C=/work/wt-cma/target/release/halo
for n in 8 4; do
  for i in 1 2; do
    for cma in 0 1; do
      echo "== alltoall n=$n run $i HALO_SHM_CMA=$cma $(uptime)" >> $O/alltoall-2.txt
      HALO_SHM_CMA=$cma HALO_TRANSPORT=shm nice -n -10 $C launch --mpi -n $n --timeout 600 --no-prefix -- $C bench alltoall -m 262144:1048576 -i 100 -x 10 -f --algo flat,mpi >> $O/alltoall-2.txt 2>&1
    done
  done
done
