"""One rank of test_launch.py's mismatch job (issue 11): all_to_all_single with float32
on rank 0 and float64 on the others, same shape. No rank may return normally (before
the fix, ranks did, with part of the output never written): a rank that received a
message of the other size raises HaloError haloInvalidUsage ("size mismatch"), a rank
that only waited for what a failed rank would have forwarded haloRemoteError or
haloTimeout. Prints "mismatch ok CODE" and exits 0 when that holds."""

import numpy as np

import halo
from common import sentinel


def main():
    with halo.init() as comm:
        me, n = comm.rank, comm.size
        dtype = np.float32 if me == 0 else np.float64
        inp = (np.arange(n * 8) + 1000 * me).astype(dtype)
        out = sentinel((n * 8,), dtype)
        try:
            comm.all_to_all_single(out, inp)
        except halo.HaloError as e:
            allowed = (halo.Result.INVALID_USAGE, halo.Result.REMOTE_ERROR, halo.Result.TIMEOUT)
            assert e.code in allowed, f"rank {me}: {e}"
            if e.code == halo.Result.INVALID_USAGE:
                assert "size mismatch" in e.message, f"rank {me}: {e.message}"
            print(f"mismatch ok {int(e.code)} {e.message}", flush=True)
            return
        unwritten = int((out.view(np.uint8).reshape(-1, out.itemsize) == 0xA5).all(axis=1).sum())
        raise AssertionError(
            f"rank {me}: all_to_all_single returned normally although rank 0 passed float32 and "
            f"the others float64 ({unwritten} output elements never written)"
        )


if __name__ == "__main__":
    main()
