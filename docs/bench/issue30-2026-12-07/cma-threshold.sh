H=/work/main/target/release/halo
M=16384:1048576
for n in 4 8; do for r in 1 2 3; do
  for cma in auto 0; do
  echo "== n=$n round $r cma=$cma load $(cut -d' ' -f1 /proc/loadavg)"
  HALO_SHM_CMA=$cma $H launch --mpi -n $n --no-prefix -- $H bench alltoall -m $M -i 40 -x 5 --rounds 3 --algo auto,mpi 2>&1 | sed -n '/Speed-up over MPI/,$p' | grep -E "^[0-9]" | awk '{printf "%s:%s ", $1, $2} END {print ""}'
  done
done; done
