"""One rank of test_api.py's jobs for the torch.distributed-shaped collectives:
all_reduce (every op and data type), all_gather, reduce_scatter, broadcast, gather,
scatter, barrier, tagged send / recv / isend / irecv, each blocking and with
async_op=True, every result byte-exact against a numpy reference that every rank can
rebuild (the inputs are functions of the rank). Prints "ops ok".

`ops.py mismatch OP`: rank 0 passes one more element than the others to OP
(all_reduce, all_gather or reduce_scatter); every rank must raise HaloError (none may
return normally). Prints "mismatch ok CODE".
`ops.py disagree CASE`: rank 0 makes another all-reduce than the others (see
`disagree`). Prints "disagree ok CODE".
"""

import sys

import numpy as np

import halo
from common import check_bytes, done, filled, sentinel

try:
    import torch
except ImportError:
    torch = None

INTS = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64]
FLOATS = [np.float16, np.float32, np.float64]
OPS = ["sum", "prod", "max", "min", "avg"]


def small(rank, n, salt, op, dtype):
    """Rank `rank`'s all-reduce input: small integers, so that every reduction is
    exact in every type (products of +-1, +-2 over a few ranks; sums of -8..8)."""
    i = np.arange(n)
    h = rank * 7 + i * 3 + salt * 5
    if op == "prod":
        v = np.array([1, -1, 2, -2, 1, 2])[h % 6]
        if np.dtype(dtype).kind == "u":
            v = np.abs(v)
    else:
        v = h % 17 - 8
        if np.dtype(dtype).kind == "u":
            v = v + 8
    return v.astype(np.int64)


def reference(inputs, op, dtype, size):
    """The reduction over ranks (rows of `inputs`, int64) in `dtype`, as libhalo
    computes it: integers wrap, 'avg' truncates integers and divides floats in their
    type (float16 through float32)."""
    dtype = np.dtype(dtype)
    if op == "sum":
        exact = inputs.sum(axis=0)
    elif op == "prod":
        exact = inputs.prod(axis=0)
    elif op == "max":
        exact = inputs.max(axis=0)
    elif op == "min":
        exact = inputs.min(axis=0)
    else:
        s = inputs.sum(axis=0)
        if dtype.kind in "iu":
            wrapped = s.astype(dtype).astype(np.int64)  # the sum wraps first
            q = np.abs(wrapped) // size * np.sign(wrapped)
            return q.astype(dtype)
        if dtype == np.float16:
            return (s.astype(np.float32) / np.float32(size)).astype(np.float16)
        return s.astype(dtype) / dtype.type(size)
    return exact.astype(dtype)  # wraps like the integer types do


def check_all_reduce(comm, me, n):
    length = 37
    for salt, dtype in enumerate(INTS + FLOATS):
        for op in OPS:
            inputs = np.stack([small(r, length, salt, op, dtype) for r in range(n)])
            a = inputs[me].astype(dtype)
            assert comm.all_reduce(a, op) is a
            check_bytes(me, f"all_reduce {op} {np.dtype(dtype).name}", a, reference(inputs, op, dtype, n))
        # async, and a ReduceOp value
        inputs = np.stack([small(r, length, salt, "max", dtype) for r in range(n)])
        a = inputs[me].astype(dtype)
        w = comm.all_reduce(a, halo.ReduceOp.MAX, async_op=True)
        assert w.wait() is True
        check_bytes(me, f"async all_reduce max {np.dtype(dtype).name}", a, inputs.max(axis=0).astype(dtype))
    # Zero elements.
    comm.all_reduce(np.zeros(0, np.float32), "avg")
    if torch is not None:
        for op in OPS:
            inputs = np.stack([small(r, length, 99, op, np.float32) for r in range(n)])
            t = torch.tensor(inputs[me], dtype=torch.float32).to(torch.bfloat16)
            comm.all_reduce(t, op)
            if op == "avg":
                want = (torch.tensor(inputs.sum(axis=0), dtype=torch.float32) / n).to(torch.bfloat16)
            else:
                want = torch.tensor(reference(inputs, op, np.float32, n)).to(torch.bfloat16)
            check_bytes(me, f"all_reduce {op} bfloat16", t.view(torch.int16).numpy(), want.view(torch.int16).numpy())


def check_all_gather(comm, me, n):
    for case, (shape, dtype) in enumerate([((5,), np.float64), ((2, 3), np.int8), ((0,), np.int32), ((4, 1), np.float16)]):
        inp = filled(shape, dtype, 10 * case + me)
        want = np.concatenate([filled(shape, dtype, 10 * case + q).reshape(-1) for q in range(n)])
        out = sentinel((n,) + shape, dtype)  # any shape with size * input.size elements
        assert comm.all_gather(out, inp) is out
        check_bytes(me, f"all_gather case {case}", out, want)
        out = sentinel(want.shape, dtype)
        comm.all_gather(out, inp, async_op=True).wait()
        check_bytes(me, f"async all_gather case {case}", out, want)


def check_reduce_scatter(comm, me, n):
    count = 11
    for salt, dtype in enumerate([np.int8, np.uint32, np.float32, np.float16, np.float64]):
        for op in OPS:
            inputs = np.stack([small(r, n * count, salt, op, dtype) for r in range(n)])
            out = sentinel((count,), dtype)
            assert comm.reduce_scatter(out, inputs[me].astype(dtype), op) is out
            want = reference(inputs, op, dtype, n)[me * count : (me + 1) * count]
            check_bytes(me, f"reduce_scatter {op} {np.dtype(dtype).name}", out, want)
    inputs = np.stack([small(r, n * count, 7, "sum", np.int64) for r in range(n)])
    out = sentinel((count,), np.int64)
    comm.reduce_scatter(out, inputs[me].astype(np.int64), async_op=True).wait()
    check_bytes(me, "async reduce_scatter", out, inputs.sum(axis=0)[me * count : (me + 1) * count])
    comm.reduce_scatter(np.zeros(0, np.int32), np.zeros(0, np.int32))


def check_rooted(comm, me, n):
    for root in range(n):
        for k, (shape, dtype) in enumerate([((6,), np.uint8), ((3, 40000), np.float32), ((0,), np.float64)]):
            want = filled(shape, dtype, 1000 + 10 * root + k)
            a = want.copy() if me == root else sentinel(shape, dtype)
            assert comm.broadcast(a, root) is a
            check_bytes(me, f"broadcast root {root} case {k}", a, want)
            a = want.copy() if me == root else sentinel(shape, dtype)
            comm.broadcast(a, root, async_op=True).wait()
            check_bytes(me, f"async broadcast root {root} case {k}", a, want)
        # gather: output only at the root (None elsewhere)
        inp = filled((3, 2), np.int64, 2000 + me)
        out = sentinel((n * 6,), np.int64) if me == root else None
        assert comm.gather(out, inp, root) is out
        if me == root:
            want = np.concatenate([filled((3, 2), np.int64, 2000 + q).reshape(-1) for q in range(n)])
            check_bytes(me, f"gather root {root}", out, want)
        out = sentinel((n, 6), np.int64) if me == root else None
        comm.gather(out, inp, root, async_op=True).wait()
        if me == root:
            check_bytes(me, f"async gather root {root}", out, want)
        # scatter: input only at the root
        src = filled((n, 5), np.float16, 3000 + root)
        out = sentinel((5,), np.float16)
        assert comm.scatter(out, src if me == root else None, root) is out
        check_bytes(me, f"scatter root {root}", out, src[me])
        out = sentinel((5,), np.float16)
        comm.scatter(out, src.reshape(-1) if me == root else None, root, async_op=True).wait()
        check_bytes(me, f"async scatter root {root}", out, src[me])


def check_p2p(comm, me, n):
    nxt, prv = (me + 1) % n, (me - 1) % n
    # Interleaved tags around the ring, blocking; even ranks send first.
    for k, tag in enumerate([0, 9, 9, halo.MAX_TAG, 0]):
        out = filled((k + 1,), np.int32, 4000 + 10 * me + k)
        got = sentinel((k + 1,), np.int32)
        if me % 2 == 0:
            comm.send(out, nxt, tag=tag)
            assert comm.recv(got, prv, tag=tag) is got
        else:
            comm.recv(got, prv, tag=tag)
            comm.send(out, nxt, tag)
        check_bytes(me, f"tagged message {k}", got, filled((k + 1,), np.int32, 4000 + 10 * prv + k))
    # Non-blocking (a communicator's operations run in call order: even ranks send
    # first, as with blocking calls).
    out = filled((7,), np.float32, 5000 + me)
    got = sentinel((7,), np.float32)
    if me % 2 == 0:
        works = [comm.isend(out, nxt, tag=3), comm.irecv(got, prv, tag=3)]
    else:
        works = [comm.irecv(got, prv, tag=3), comm.isend(out, nxt, tag=3)]
    for w in works:
        w.wait()
    check_bytes(me, "isend / irecv", got, filled((7,), np.float32, 5000 + prv))


def check_argument_errors(comm, me, n):
    def raises(exc, needle, fn):
        try:
            fn()
        except exc as e:
            assert needle in str(e), f"rank {me}: {exc.__name__} {e!r} does not name {needle!r}"
            return
        raise AssertionError(f"rank {me}: no {exc.__name__} naming {needle!r}")

    a = np.zeros(4, np.float32)
    raises(ValueError, "op", lambda: comm.all_reduce(a, "xor"))
    raises(ValueError, "output", lambda: comm.all_gather(np.zeros(4 * n + 1, np.float32), a))
    raises(TypeError, "input", lambda: comm.all_gather(np.zeros(4 * n, np.float64), a))
    raises(ValueError, "input", lambda: comm.reduce_scatter(a, np.zeros(4 * n - 1, np.float32)))
    raises(ValueError, "root", lambda: comm.broadcast(a, n))
    raises(TypeError, "root", lambda: comm.gather(None if me else np.zeros(4 * n, np.float32), a, "0"))
    if me == 0:
        raises(ValueError, "output", lambda: comm.gather(None, a, 0))
        raises(ValueError, "input", lambda: comm.scatter(a, None, 0))
    raises(ValueError, "tag", lambda: comm.send(a, (me + 1) % n, tag=-1))
    raises(ValueError, "tag", lambda: comm.irecv(a, (me + 1) % n, tag=halo.MAX_TAG + 1))
    raises(TypeError, "dst", lambda: comm.isend(a, "1"))
    raises(ValueError, "src", lambda: comm.recv(a, -1))


def mismatch(comm, me, n, op):
    extra = 1 if me == 0 else 0
    try:
        if op == "all_reduce":
            comm.all_reduce(np.ones(5 + extra, np.int32))
        elif op == "all_gather":
            comm.all_gather(np.zeros(n * (5 + extra), np.int32), np.ones(5 + extra, np.int32))
        else:
            comm.reduce_scatter(np.zeros(5 + extra, np.float32), np.ones(n * (5 + extra), np.float32))
    except halo.HaloError as e:
        allowed = (halo.Result.INVALID_USAGE, halo.Result.REMOTE_ERROR, halo.Result.TIMEOUT)
        assert e.code in allowed, f"rank {me}: {e}"
        print(f"mismatch ok {int(e.code)}", flush=True)
        return
    raise AssertionError(f"rank {me}: {op} returned normally although rank 0 passed one more element")


def disagree(comm, me, n, case):
    """Rank 0 makes another call than the others (`case`: "op", sum against max; "dtype",
    float32 against int32 of the same bytes): every rank raises HaloError INVALID_USAGE
    naming rank 0's value (or, a rank whose peers agreed with it, that one failed)."""
    want = "rank 0 called all_reduce with sum, rank " if case == "op" else "rank 0 reduces float32, rank "
    try:
        if case == "op":
            comm.all_reduce(np.ones(8, np.float32), op="sum" if me == 0 else "max")
        else:
            comm.all_reduce(np.ones(16, np.float32 if me == 0 else np.int32))
    except halo.HaloError as e:
        assert e.code == halo.Result.INVALID_USAGE, f"rank {me}: {e}"
        assert want in str(e) or (me > 1 and "failed this collective" in str(e)), f"rank {me}: {e}"
        print(f"disagree ok {int(e.code)}", flush=True)
        return
    raise AssertionError(f"rank {me}: {case} returned normally although rank 0 made another call")


def main():
    with halo.init() as comm:
        me, n = comm.rank, comm.size
        if len(sys.argv) > 2 and sys.argv[1] == "disagree":
            disagree(comm, me, n, sys.argv[2])
            return
        if len(sys.argv) > 2 and sys.argv[1] == "mismatch":
            mismatch(comm, me, n, sys.argv[2])
            return
        check_all_reduce(comm, me, n)
        check_all_gather(comm, me, n)
        check_reduce_scatter(comm, me, n)
        check_rooted(comm, me, n)
        check_p2p(comm, me, n)
        check_argument_errors(comm, me, n)
        comm.barrier()
        comm.barrier(async_op=True).wait()
        done(me, "ops")


if __name__ == "__main__":
    main()
