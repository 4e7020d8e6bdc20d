#!/bin/bash
# alternating base/new one-host a2av launches
out=$1; n=${2:-3}; mkdir -p $out
for i in $(seq 1 $n); do
 for v in base rdv; do
  /tmp/halo-$v launch --mpi -n 4 --timeout 900 --no-prefix -- /tmp/halo-$v bench alltoallv -m 1:65536 -i 100 -x 10 --rounds 5 -f --algo flat,halo,auto,mpi --experts 64 --topk 2 --skew 1.0 --compare --json-out $out/$v-$i.json > $out/$v-$i.log 2>&1 || echo "fail $v $i"
 done
done
