H=/work/main/target/release/halo
M=262144:1048576
one() { env "$@" | grep -E "^[0-9]" ; }
for r in 1 2 3 4 5; do
  echo "== round $r load $(cut -d' ' -f1 /proc/loadavg)"
  echo "-- nompi auto (cma)"; $H launch -n 4 --no-prefix -- $H bench alltoall -m $M -i 60 -x 5 --rounds 3 --algo auto 2>&1 | grep -E "^[0-9]"
  echo "-- mpi own-barrier auto,mpi (cma)"; $H launch --mpi -n 4 --no-prefix -- $H bench alltoall -m $M -i 60 -x 5 --rounds 3 --own-barrier --algo auto,mpi 2>&1 | sed -n '/^# Size/,$p' | grep -E "^[0-9]" | head -3
  echo "-- nompi auto (HALO_SHM_CMA=0)"; HALO_SHM_CMA=0 $H launch -n 4 --no-prefix -- $H bench alltoall -m $M -i 60 -x 5 --rounds 3 --algo auto 2>&1 | grep -E "^[0-9]"
done
