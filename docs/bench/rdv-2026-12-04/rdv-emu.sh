#!/bin/bash
out=$1; n=${2:-3}; mkdir -p $out
for i in $(seq 1 $n); do
 for v in base rdv; do
  /tmp/halo-$v launch --mpi -n 8 --hosts 4 --host-rate 1gbit --timeout 900 --no-prefix -- /tmp/halo-$v bench alltoallv -m 1:65536 -i 20 -x 2 --rounds 3 --sync -f --algo flat,halo,auto,mpi --experts 64 --topk 2 --skew 1.0 --compare --json-out $out/$v-$i.json > $out/$v-$i.log 2>&1 || echo "fail $v $i"
 done
done
