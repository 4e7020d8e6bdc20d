"""Helpers of the rank programs (run under `halo launch` by test_launch.py)."""

import os
import sys

import numpy as np

# HALO_TEST_CORRUPT=1 flips one received byte on rank 1 before the first check, so the
# driver can see that a wrong result fails the rank (test_launch.py's negative test).
CORRUPT = os.environ.get("HALO_TEST_CORRUPT") == "1"
_corrupted = False


class Mismatch(AssertionError):
    pass


def pattern(seed, nbytes):
    """Random bytes (so float types get NaN, inf and subnormal bit patterns too)."""
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


def filled(shape, dtype, seed):
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return pattern(seed, n).view(dtype).reshape(shape)


def sentinel(shape, dtype):
    a = np.empty(shape, dtype=dtype)
    a.view(np.uint8)[...] = 0xA5
    return a


def check_bytes(rank, what, got, expected):
    """Byte-exact comparison; the first differing byte is named."""
    global _corrupted
    g = np.ascontiguousarray(got).view(np.uint8).reshape(-1)
    e = np.ascontiguousarray(expected).view(np.uint8).reshape(-1)
    if CORRUPT and not _corrupted and rank == 1 and g.size:
        g = g.copy()
        g[g.size // 2] ^= 0xFF
        _corrupted = True
    if g.shape != e.shape:
        raise Mismatch(f"rank {rank}: {what}: {g.size} bytes, expected {e.size}")
    diff = np.flatnonzero(g != e)
    if diff.size:
        i = int(diff[0])
        raise Mismatch(
            f"rank {rank}: {what}: {diff.size} bytes differ, first at byte {i}: "
            f"got {g[i]:#04x}, expected {e[i]:#04x}"
        )


def expect_raises(rank, what, exc_types, fn):
    try:
        fn()
    except exc_types as e:
        return e
    raise AssertionError(f"rank {rank}: {what}: no {exc_types} raised")


def done(rank, name):
    print(f"{name} ok", flush=True)
    sys.stdout.flush()
