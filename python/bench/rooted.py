"""Time HALO's rooted collectives (broadcast, gather, scatter) through the Python API.

    halo launch -n 4 -- python3 python/bench/rooted.py [--iters 2000] [--max-bytes 65536]

Every rank runs each operation and size for ``--iters`` calls after a warm-up, the
ranks lined up by a barrier before each size; rank 0 prints one JSON line per
(operation, size) with the mean time per call in microseconds, the slowest rank's
(``avg_us``). ``HALO_LIBRARY`` picks the libhalo to measure, so two builds can be
compared by alternating launches (docs/BENCHMARKS.md, "Issue 31: before and after").
"""

import argparse
import json
import time

import numpy as np

import halo


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--min-bytes", type=int, default=8)
    ap.add_argument("--max-bytes", type=int, default=65536)
    args = ap.parse_args()
    comm = halo.init()
    n, me = comm.size, comm.rank
    size = args.min_bytes
    while size <= args.max_bytes:
        buf = np.zeros(size, dtype=np.uint8)
        whole = np.zeros(size * n, dtype=np.uint8)
        ops = {
            "broadcast": lambda: comm.broadcast(buf, 0),
            "gather": lambda: comm.gather(whole, buf, 0),
            "scatter": lambda: comm.scatter(buf, whole, 0),
        }
        for name, op in ops.items():
            for _ in range(args.warmup):
                op()
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                op()
            worst = np.array([(time.perf_counter() - t0) / args.iters * 1e6])
            comm.all_reduce(worst, "max")
            if me == 0:
                print(json.dumps({"op": name, "size": size, "avg_us": float(worst[0])}), flush=True)
        size *= 2
    comm.destroy()


if __name__ == "__main__":
    main()
