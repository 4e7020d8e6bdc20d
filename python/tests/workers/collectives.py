"""One rank of test_launch.py's collectives job: every result checked byte-exact.

Each rank can rebuild any rank's input (the data is a function of the sender, the
case and the data type), so it knows exactly which bytes must arrive.
"""

import os
import time

import numpy as np

import halo
from common import check_bytes, done, filled, sentinel

try:
    import ml_dtypes  # bfloat16 for numpy, when installed

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BF16 = None

DTYPES = [
    np.int8,
    np.uint8,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.bool_,
] + ([BF16] if BF16 is not None else [])


def make_input(case, src, splits_from_src, row_shape, dtype):
    """Rank src's input of a case: sum(splits) rows of row_shape, random bytes."""
    shape = (sum(splits_from_src),) + tuple(row_shape)
    seed = case * 100003 + src * 101 + DTYPES.index(dtype)
    a = filled(shape, dtype if dtype is not np.bool_ else np.uint8, seed)
    if dtype is np.bool_:
        a = (a & 1).astype(np.bool_)
    return a


def expected_output(case, me, n, split, row_shape, dtype):
    """What rank me must hold after the all-to-all: from each q in order, the rows q
    addressed to me."""
    parts = []
    for q in range(n):
        splits_q = [split(q, d) for d in range(n)]
        inp = make_input(case, q, splits_q, row_shape, dtype)
        start = sum(splits_q[:me])
        parts.append(inp[start : start + splits_q[me]])
    return np.concatenate(parts, axis=0)


def run_v(comm, case, split, row_shape, dtype, give_in=True, give_out=True):
    """all_to_all_single with the rows split(src, dst); checks output and input."""
    me, n = comm.rank, comm.size
    send_splits = [split(me, d) for d in range(n)]
    recv_splits = [split(q, me) for q in range(n)]
    inp = make_input(case, me, send_splits, row_shape, dtype)
    before = inp.copy()
    out = sentinel((sum(recv_splits),) + tuple(row_shape), dtype)
    ret = comm.all_to_all_single(
        out,
        inp,
        output_split_sizes=recv_splits if give_out else None,
        input_split_sizes=send_splits if give_in else None,
    )
    assert ret is out, "all_to_all_single returns output"
    what = f"case {case} {np.dtype(dtype).name} rows {row_shape}"
    check_bytes(me, what, out, expected_output(case, me, n, split, row_shape, dtype))
    check_bytes(me, what + " (input unchanged)", inp, before)


def uneven(case):
    # 0..3 rows, zeros included, different for every (src, dst) pair.
    return lambda q, d: (q * 3 + d * 5 + case) % 4


def main():
    with halo.init() as comm:
        me, n = comm.rank, comm.size
        assert (me, n) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])), (me, n)
        assert n >= 3, "run with at least 3 ranks"
        assert repr(comm) == f"<halo.Communicator rank={me} size={n}>"

        topo = comm.topology
        assert [r["rank"] for r in topo["ranks"]] == list(range(n)), topo
        assert comm.topology is topo  # cached

        # all_to_all_single, uneven splits with zeros, every data type, rows of 3.
        for dtype in DTYPES:
            run_v(comm, 1, uneven(1), (3,), dtype)
        # Scalar rows and 2x2 rows.
        run_v(comm, 2, uneven(2), (), np.float32)
        run_v(comm, 2, uneven(2), (), np.int64)
        run_v(comm, 3, uneven(3), (2, 2), np.float16)
        # Rank 0 sends nothing at all, the last rank receives nothing at all.
        run_v(comm, 4, lambda q, d: 0 if q == 0 or d == n - 1 else (q + d) % 3 + 1, (5,), np.float32)
        # Nothing anywhere: empty arrays.
        run_v(comm, 5, lambda q, d: 0, (4,), np.float64)
        # Even split, no sizes given (haloAllToAll): 3 rows each, and 0 rows each.
        run_v(comm, 6, lambda q, d: 3, (4,), np.float64, give_in=False, give_out=False)
        run_v(comm, 7, lambda q, d: 0, (4,), np.float64, give_in=False, give_out=False)
        # Input sizes given, output even (every rank sends d % 3 rows to rank d), and
        # the other way round (rank q sends (q + 1) % 3 rows to every rank).
        run_v(comm, 8, lambda q, d: d % 3, (2,), np.int32, give_out=False)
        run_v(comm, 9, lambda q, d: (q + 1) % 3, (2,), np.int32, give_in=False)
        # About 1 MiB per peer.
        run_v(comm, 10, lambda q, d: 32768 + 7 * q - 3 * d, (8,), np.float32)

        # Split sizes as a tuple and as a numpy array.
        send = [uneven(11)(me, d) for d in range(n)]
        recv = [uneven(11)(q, me) for q in range(n)]
        inp = make_input(11, me, send, (3,), np.float32)
        out = sentinel((sum(recv), 3), np.float32)
        comm.all_to_all_single(out, inp, tuple(recv), np.array(send, dtype=np.int64))
        check_bytes(me, "split sizes as tuple / ndarray", out, expected_output(11, me, n, uneven(11), (3,), np.float32))

        # all_to_all with lists: separate arrays of uneven sizes (zeros included).
        size = lambda q, d: (q * 7 + d * 2) % 5  # noqa: E731
        ins = [filled((size(me, d),), np.float32, 1000 + me * 10 + d) for d in range(n)]
        outs = [sentinel((size(q, me),), np.float32) for q in range(n)]
        assert comm.all_to_all(outs, ins) is outs
        for q in range(n):
            check_bytes(me, f"all_to_all from {q}", outs[q], filled((size(q, me),), np.float32, 1000 + q * 10 + me))
        # ... and the pieces of one array (used in place), 2-D.
        whole_in = np.concatenate([filled((size(me, d), 2), np.int64, 2000 + me * 10 + d) for d in range(n)])
        ins = np.split(whole_in, np.cumsum([size(me, d) for d in range(n)])[:-1])
        whole_out = sentinel((sum(size(q, me) for q in range(n)), 2), np.int64)
        outs = np.split(whole_out, np.cumsum([size(q, me) for q in range(n)])[:-1])
        comm.all_to_all(outs, ins)
        for q in range(n):
            check_bytes(me, f"all_to_all (one array) from {q}", outs[q], filled((size(q, me), 2), np.int64, 2000 + q * 10 + me))

        # all_reduce: sums exact in every type, wrap-around, max and min.
        a = (np.arange(1000, dtype=np.float32) * (me + 1))
        assert comm.all_reduce(a) is a
        check_bytes(me, "all_reduce f32 sum", a, np.arange(1000, dtype=np.float32) * (n * (n + 1) // 2))
        a = np.arange(-50, 50, dtype=np.int32) * (me + 1)
        comm.all_reduce(a, "sum")
        check_bytes(me, "all_reduce i32 sum", a, np.arange(-50, 50, dtype=np.int32) * (n * (n + 1) // 2))
        a = np.full(7, 2**63 + me, dtype=np.uint64)
        comm.all_reduce(a)
        check_bytes(me, "all_reduce u64 wraps", a, np.full(7, (n * 2**63 + n * (n - 1) // 2) % 2**64, dtype=np.uint64))
        a = np.array([me, -me, 0.5 * me], dtype=np.float16)
        comm.all_reduce(a, halo.ReduceOp.SUM)
        s = n * (n - 1) // 2
        check_bytes(me, "all_reduce f16 sum", a, np.array([s, -s, 0.5 * s], dtype=np.float16))
        a = np.array([me, -me, 3.25], dtype=np.float64)
        comm.all_reduce(a, "max")
        check_bytes(me, "all_reduce f64 max", a, np.array([n - 1, 0, 3.25]))
        a = np.array([[me, -me], [7, 7]], dtype=np.int64)
        comm.all_reduce(a, op="min")
        check_bytes(me, "all_reduce i64 min", a, np.array([[0, -(n - 1)], [7, 7]], dtype=np.int64))
        if BF16 is not None:
            a = np.array([me, 1.0], dtype=BF16)
            comm.all_reduce(a)
            check_bytes(me, "all_reduce bf16 sum", a, np.array([s, n], dtype=BF16))

        # Non-blocking: isend/irecv round the ring, all_to_all_single (even and uneven)
        # and all_reduce with async_op=True, all started before any wait; a blocking
        # call in between runs after them.
        nxt, prv = (me + 1) % n, (me - 1) % n
        ring_out = filled((1000,), np.float64, 3000 + me)
        ring_in = sentinel((1000,), np.float64)
        works = []
        if me % 2 == 0:
            works += [comm.isend(ring_out, nxt), comm.irecv(ring_in, prv)]
        else:
            works += [comm.irecv(ring_in, prv), comm.isend(ring_out, nxt)]
        send = [uneven(13)(me, d) for d in range(n)]
        recv = [uneven(13)(q, me) for q in range(n)]
        inp_v = make_input(13, me, send, (3,), np.int32)
        out_v = sentinel((sum(recv), 3), np.int32)
        works.append(comm.all_to_all_single(out_v, inp_v, recv, send, async_op=True))
        inp_e = make_input(14, me, [2] * n, (), np.uint8)
        out_e = sentinel((2 * n,), np.uint8)
        works.append(comm.all_to_all_single(out_e, inp_e, async_op=True))
        acc = np.arange(10, dtype=np.int64) * (me + 1)
        works.append(comm.all_reduce(acc, async_op=True))
        blocking = np.ones(3, dtype=np.int32)
        comm.all_reduce(blocking)  # runs after the five started above
        check_bytes(me, "blocking all_reduce after async ones", blocking, np.full(3, n, dtype=np.int32))
        assert all(isinstance(w, halo.Work) for w in works)
        while not works[-1].is_completed():
            time.sleep(0.001)
        for w in works:
            assert w.wait() is True
            assert w.wait() is True  # a second wait returns at once
        check_bytes(me, "irecv", ring_in, filled((1000,), np.float64, 3000 + prv))
        check_bytes(me, "all_to_all_single async (uneven)", out_v, expected_output(13, me, n, uneven(13), (3,), np.int32))
        check_bytes(me, "all_to_all_single async (even)", out_e, expected_output(14, me, n, lambda q, d: 2, (), np.uint8))
        check_bytes(me, "all_reduce async", acc, np.arange(10, dtype=np.int64) * (n * (n + 1) // 2))
        # A bad peer is refused at the call, before anything starts.
        try:
            comm.isend(ring_out, n)
            raise AssertionError("isend to rank n did not fail")
        except ValueError as e:
            assert "dst" in str(e) and "out of range" in str(e), e

        # barrier: rank 0 arrives half a second late; nobody leaves before it.
        comm.barrier()
        t0 = time.monotonic()
        if me == 0:
            time.sleep(0.5)
        comm.barrier()
        waited = time.monotonic() - t0
        if me != 0 and waited < 0.4:
            raise AssertionError(f"rank {me}: left the barrier after {waited:.3f} s, before rank 0 arrived")

        # split: even and odd ranks, the last rank in none; key reverses the order.
        color = None if me == n - 1 else me % 2
        sub = comm.split(color, key=-me)
        if color is None:
            assert sub is None
        else:
            members = [r for r in range(n - 1) if r % 2 == color]
            with sub:
                assert sub.size == len(members), (sub.size, members)
                assert sub.rank == sorted(members, reverse=True).index(me)
                send = np.full((sub.size, 2), 10 * me, dtype=np.int32) + np.arange(sub.size)[:, None].astype(np.int32)
                got = sentinel((sub.size, 2), np.int32)
                sub.all_to_all_single(got, send)
                order = sorted(members, reverse=True)
                want = np.array([[10 * order[q] + sub.rank] * 2 for q in range(sub.size)], dtype=np.int32)
                check_bytes(me, "all_to_all_single on a split communicator", got, want)
            assert "destroyed" in repr(sub)

        # torch's keywords and async_op with numpy arrays (no torch needed).
        send = [uneven(12)(me, d) for d in range(n)]
        recv = [uneven(12)(q, me) for q in range(n)]
        inp = make_input(12, me, send, (3,), np.float32)
        out = sentinel((sum(recv), 3), np.float32)
        comm.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)
        check_bytes(me, "all_to_all_single with torch's keywords", out, expected_output(12, me, n, uneven(12), (3,), np.float32))
        out2 = sentinel((sum(recv), 3), np.float32)
        work = comm.all_to_all_single(out2, inp, recv, send, async_op=True)
        assert work.wait() is True and work.is_completed()
        check_bytes(me, "all_to_all_single async_op", out2, out)
        outs = [sentinel((recv[q], 3), np.float32) for q in range(n)]
        ins = np.split(inp, np.cumsum(send)[:-1])
        ins = [x.copy() for x in ins]  # separate arrays: staged through one buffer
        work = comm.all_to_all(outs, ins, async_op=True)
        assert work.wait() is True
        check_bytes(me, "all_to_all async_op (staged)", np.concatenate(outs), out)
        a = np.ones(4, dtype=np.float64)
        comm.all_reduce(a, async_op=True).wait()
        check_bytes(me, "all_reduce async_op", a, np.full(4, float(n)))

        done(me, "collectives")


if __name__ == "__main__":
    main()
