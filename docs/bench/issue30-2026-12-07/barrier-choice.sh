H=/work/main/target/release/halo
for n in 4 8; do for r in 1 2 3; do for b in bruck auto; do
  echo -n "n=$n r=$r barrier=$b load=$(cut -d' ' -f1 /proc/loadavg): "
  HALO_BARRIER_ALGO=$b $H launch --mpi -n $n --no-prefix -- $H bench alltoall -m 1:1048576 --rounds 3 --own-barrier --algo auto,mpi 2>&1 | sed -n '/Speed-up over MPI/,$p' | grep -E "^[0-9]" | awk '{printf "%s ", $2} END {print ""}'
done; done; done
