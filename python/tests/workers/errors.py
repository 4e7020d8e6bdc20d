"""One rank of test_launch.py's error job: every wrong call raises, before any byte
moves, and HaloError carries the code ffi/include/halo.h documents.

Mistakes found in Python are made by every rank at once (they are local, as in
torch.distributed: the other ranks are not told). Mistakes only libhalo can see (ranks
that disagree) are made by one rank and reported on all.
"""

import pickle
import re
import sys
from pathlib import Path

import numpy as np

import halo
from common import check_bytes, done, expect_raises, sentinel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _support import header_enum  # noqa: E402

CODES = header_enum("haloResult")
INVALID_ARGUMENT = CODES["haloInvalidArgument"]
INVALID_USAGE = CODES["haloInvalidUsage"]


def untouched(me, what, arr, shape, dtype):
    check_bytes(me, what + ": output untouched", arr, sentinel(shape, dtype))


def main():
    with halo.init() as comm:
        me, n = comm.rank, comm.size
        rows = [q + 1 for q in range(n)]  # this rank sends q + 1 rows to rank q
        inp = np.arange(sum(rows) * 2, dtype=np.float32).reshape(-1, 2) + 1000 * me
        inp_copy = inp.copy()
        recv = [me + 1] * n
        out_shape = (sum(recv), 2)
        out = sentinel(out_shape, np.float32)

        def a2a(**kw):
            args = dict(output=out, input=inp, output_split_sizes=recv, input_split_sizes=rows)
            args.update(kw)
            return lambda: comm.all_to_all_single(**args)

        local = [
            ("output sizes do not sum to dim 0", ValueError, "sum to", a2a(output_split_sizes=[me + 1] * (n - 1) + [me + 2])),
            ("input sizes do not sum to dim 0", ValueError, "sum to", a2a(input_split_sizes=[q for q in range(n)])),
            ("too few sizes", ValueError, "entries", a2a(input_split_sizes=rows[:-1])),
            ("negative size", ValueError, ">= 0", a2a(input_split_sizes=[-1] + [rows[1] + rows[0] + 1] + rows[2:])),
            ("fractional size", TypeError, "not an integer", a2a(input_split_sizes=[1.5] * n)),
            ("sizes not a sequence", TypeError, "sequence", a2a(input_split_sizes=7)),
            ("uneven dim 0 without sizes", ValueError, "evenly", a2a(input=np.zeros((n + 1, 2), np.float32), input_split_sizes=None)),
            ("dtype mismatch", TypeError, "float64", a2a(input=inp.astype(np.float64))),
            ("complex64", TypeError, "not supported", a2a(input=inp.astype(np.complex64), output=out.astype(np.complex64))),
            ("int16", TypeError, "not supported", a2a(input=inp.astype(np.int16), output=out.astype(np.int16))),
            ("object dtype", TypeError, "not supported", a2a(input=inp.astype(object), output=out.astype(object))),
            ("big-endian", TypeError, "byte order", a2a(input=inp.astype(">f4"), output=out.astype(">f4"))),
            ("non-contiguous input", ValueError, "contiguous", a2a(input=np.repeat(inp, 2, axis=1)[:, ::2])),
            ("transposed output", ValueError, "contiguous", a2a(output=np.zeros((2, out_shape[0]), np.float32).T)),
            ("read-only output", ValueError, "read-only", a2a(output=np.frombuffer(bytes(out.nbytes), np.float32).reshape(out_shape))),
            ("a list, not an array", TypeError, "numpy.ndarray", a2a(input=inp.tolist())),
            ("0-d arrays", ValueError, "dimension", a2a(input=np.ones((), np.float64), output=np.ones((), np.float64))),
            ("rows of different sizes", ValueError, "elements", a2a(output=sentinel((sum(recv), 3), np.float32))),
            ("all_to_all: one list too short", ValueError, "entries", lambda: comm.all_to_all([out] * (n - 1), [inp] * n)),
            ("all_to_all: mixed types", TypeError, "mixes", lambda: comm.all_to_all([out] * n, [inp] * (n - 1) + [inp.astype(np.float64)])),
            ("all_reduce: an op HALO lacks", ValueError, "'sum', 'prod', 'max', 'min', 'avg'", lambda: comm.all_reduce(inp.copy(), "bxor")),
        ]
        for what, exc, text, fn in local:
            e = expect_raises(me, what, exc, fn)
            if text not in str(e):
                raise AssertionError(f"rank {me}: {what}: message {str(e)!r} lacks {text!r}")
            untouched(me, what, out, out_shape, np.float32)
            check_bytes(me, what + ": input unchanged", inp, inp_copy)

        # libhalo's own checks: the documented codes.
        # A reduction number the C API does not know: haloInvalidArgument, nothing written.
        a = np.arange(5, dtype=np.int8)
        lib0, h0 = halo._lib.library(), comm._handle
        code = lib0.haloAllReduce(a.ctypes.data, a.ctypes.data, 5, halo.DataType.INT8, 99, h0, None)
        assert code == INVALID_ARGUMENT, code
        message = halo._lib.last_error(h0)
        assert "haloAllReduce" in message and "99" in message, message
        check_bytes(me, "unknown op: array unchanged", a, np.arange(5, dtype=np.int8))
        # A data type number the C API does not know.
        lib, h = halo._lib.library(), comm._handle
        e = expect_raises(
            me,
            "unknown data type",
            halo.HaloError,
            lambda: halo._lib.check(lib.haloAllToAll(inp.ctypes.data, out.ctypes.data, 1, 42, h, None), h),
        )
        assert e.code == INVALID_ARGUMENT and "datatype" in e.message, e
        untouched(me, "unknown data type", out, out_shape, np.float32)
        # In place (output is input), on both paths: haloInvalidArgument on every rank.
        sq = np.arange(n * 2, dtype=np.float32)
        for sizes in (None, [2] * n):
            e = expect_raises(
                me, "in-place", halo.HaloError, lambda: comm.all_to_all_single(sq, sq, sizes, sizes)
            )
            assert e.code == INVALID_ARGUMENT, e
        check_bytes(me, "in-place: unchanged", sq, np.arange(n * 2, dtype=np.float32))

        # Ranks that disagree: rank 0 expects one row more from rank 1 than rank 1 sends.
        # Every rank gets haloInvalidUsage; no output is touched anywhere.
        bad_recv = [r + (1 if me == 0 and q == 1 else 0) for q, r in enumerate(recv)]
        bad_shape = (sum(bad_recv), 2)
        bad_out = sentinel(bad_shape, np.float32)
        e = expect_raises(
            me,
            "count mismatch between ranks",
            halo.HaloError,
            lambda: comm.all_to_all_single(bad_out, inp, bad_recv, rows),
        )
        assert e.code == INVALID_USAGE and e.code == halo.Result.INVALID_USAGE, e
        # Ranks 0 and 1: "rank 1 sends 8 bytes to rank 0, but ..."; the others: "ranks 0
        # and 1 disagree ...".
        assert re.search(r"\branks? 0\b", e.message) and re.search(r"\b(rank|and) 1\b", e.message), e.message
        untouched(me, "count mismatch", bad_out, bad_shape, np.float32)
        # The exception: code and message, the C name in its text, picklable.
        assert isinstance(e, Exception) and e.args == (e.code, e.message)
        assert str(e).startswith(f"haloInvalidUsage ({INVALID_USAGE}): "), str(e)
        back = pickle.loads(pickle.dumps(e))
        assert (type(back), back.code, back.message) == (halo.HaloError, e.code, e.message)
        assert halo.error_string(e.code), "haloGetErrorString says something"

        # After all that the communicator still works.
        comm.all_to_all_single(out, inp, recv, rows)
        want = np.concatenate(
            [
                (np.arange(sum(q + 1 for q in range(n)) * 2, dtype=np.float32).reshape(-1, 2) + 1000 * q)[
                    sum(range(1, me + 1)) : sum(range(1, me + 1)) + me + 1
                ]
                for q in range(n)
            ]
        )
        check_bytes(me, "after the errors", out, want)

        comm.barrier()
        done(me, "errors")

    # A destroyed communicator refuses calls; destroying twice is fine.
    e = expect_raises(me, "use after destroy", ValueError, lambda: comm.barrier())
    assert "destroyed" in str(e)
    comm.destroy()


if __name__ == "__main__":
    main()
