#!/bin/bash
# Alternating launches of /tmp/halo-stampB (base, 12f9aec) and /tmp/halo-hold (every message held).
out=$1; mkdir -p $out
for i in 1 2 3; do
 for v in stampB hold; do
  /tmp/halo-$v launch --mpi -n 2 --timeout 300 --no-prefix -- /tmp/halo-$v bench latency -m 1:4096 --rounds 5 -f --algo halo,mpi --compare --json-out $out/lat-$v-$i.json > $out/lat-$v-$i.log 2>&1 || echo fail
  /tmp/halo-$v launch --mpi -n 2 --timeout 300 --no-prefix -- /tmp/halo-$v bench bw -m 1:1048576 --rounds 3 -f --algo halo,mpi --compare --json-out $out/bw-$v-$i.json > $out/bw-$v-$i.log 2>&1 || echo fail
  /tmp/halo-$v launch --mpi -n 4 --timeout 900 --no-prefix -- /tmp/halo-$v bench alltoallv -m 1:65536 -i 100 -x 10 --rounds 5 -f --algo flat,halo,auto,mpi --experts 64 --topk 2 --skew 1.0 --compare --json-out $out/a2av-$v-$i.json > $out/a2av-$v-$i.log 2>&1 || echo fail
  for n in 4 8; do
   /tmp/halo-$v launch --mpi -n $n --timeout 900 --no-prefix -- /tmp/halo-$v bench alltoall -m 1:1048576 -i 100 -x 10 --rounds 3 -f --algo flat,halo,auto,mpi --compare --json-out $out/a2a$n-$v-$i.json > $out/a2a$n-$v-$i.log 2>&1 || echo fail
  done
  /tmp/halo-$v launch --mpi -n 8 --hosts 4 --host-rate 1gbit --timeout 900 --no-prefix -- /tmp/halo-$v bench alltoallv -m 1:65536 -i 20 -x 2 --rounds 3 --sync -f --algo flat,halo,auto,mpi --experts 64 --topk 2 --skew 1.0 --compare --json-out $out/emu-$v-$i.json > $out/emu-$v-$i.log 2>&1 || echo fail
 done
done
