"""The package in one process: constants against ffi/include/halo.h, finding the library,
errors, argument checks, and a one-rank communicator."""

import ctypes
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

from _support import HAVE_NUMPY, HEADER, WORKERS, child_env, header_define, header_enum, launch, need_numpy

import halo
from halo import _comm, _lib

if HAVE_NUMPY:
    import numpy as np


def camel_to_caps(name):
    """haloInvalidArgument -> INVALID_ARGUMENT, haloFloat16 -> FLOAT16."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name[len("halo"):]).upper()


class HeaderTest(unittest.TestCase):
    """The Python constants are the header's: a change in the C API fails here."""

    def test_result_codes(self):
        codes = header_enum("haloResult")
        self.assertEqual({camel_to_caps(k): v for k, v in codes.items()}, {r.name: r.value for r in halo.Result})
        for name, value in codes.items():
            self.assertEqual(halo.Result(value).c_name, name)

    def test_data_types(self):
        types = header_enum("haloDataType")
        self.assertEqual({camel_to_caps(k): v for k, v in types.items()}, {t.name: t.value for t in halo.DataType})

    def test_reduce_ops(self):
        ops = header_enum("haloRedOp")
        self.assertEqual({camel_to_caps(k): v for k, v in ops.items()}, {o.name: o.value for o in halo.ReduceOp})

    def test_moe_modes(self):
        modes = header_enum("haloMoeMode")
        self.assertEqual({camel_to_caps(k)[len("MOE_"):]: v for k, v in modes.items()}, {m.name: m.value for m in halo.MoeMode})

    def test_defines(self):
        self.assertEqual(_lib.UNIQUE_ID_BYTES, header_define("HALO_UNIQUE_ID_BYTES"))
        self.assertEqual(ctypes.sizeof(_lib.UniqueId), header_define("HALO_UNIQUE_ID_BYTES"))
        self.assertEqual(_lib.SPLIT_NOCOLOR, header_define("HALO_SPLIT_NOCOLOR"))
        self.assertEqual(_lib.MAX_TAG, header_define("HALO_MAX_TAG"))
        self.assertEqual(halo.MAX_TAG, _lib.MAX_TAG)
        self.assertEqual((_lib._API_MAJOR, _lib._API_MINOR), (header_define("HALO_MAJOR"), header_define("HALO_MINOR")))

    def test_prototypes_have_the_headers_arity(self):
        text = HEADER.read_text()
        for name, (_, argtypes) in _lib._PROTOTYPES.items():
            m = re.search(r"^(?:haloResult_t|const char \*)\s*%s\(([^)]*)\);" % name, text, re.M)
            self.assertIsNotNone(m, f"{name} is not declared in ffi/include/halo.h")
            params = [p for p in m.group(1).split(",") if p.strip() and p.strip() != "void"]
            self.assertEqual(len(params), len(argtypes), f"{name}: header {m.group(1)!r}")


class LibraryTest(unittest.TestCase):
    def test_loads_and_reports_its_version(self):
        path = halo.library_path()
        if os.environ.get("HALO_LIBRARY"):
            self.assertEqual(path, os.environ["HALO_LIBRARY"])
        major, minor, patch = halo.library_version()
        self.assertEqual(
            (major, minor, patch),
            (header_define("HALO_MAJOR"), header_define("HALO_MINOR"), header_define("HALO_PATCH")),
        )

    def test_error_strings(self):
        self.assertIn("invalid argument", halo.error_string(halo.Result.INVALID_ARGUMENT))
        self.assertNotEqual(halo.error_string(4), halo.error_string(5))
        self.assertEqual(halo.error_string(12345), "unknown result code")

    def run_python(self, code, env):
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)

    def test_a_wrong_halo_library_is_a_clear_error(self):
        env = child_env({"HALO_LIBRARY": "/nonexistent/libhalo.so"})
        p = self.run_python(
            "import halo\ntry:\n    halo.init()\nexcept halo.LibraryNotFoundError as e:\n    print(e)\n", env
        )
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("HALO_LIBRARY=/nonexistent/libhalo.so: no such file", p.stdout)

    def test_not_found_lists_where_it_looked(self):
        with tempfile.TemporaryDirectory() as tmp:
            # A copy of the package outside the repository: nothing next to it, no target/.
            shutil.copytree(os.path.join(os.path.dirname(halo.__file__)), os.path.join(tmp, "halo"))
            env = child_env()
            env["PYTHONPATH"] = tmp
            for k in ("HALO_LIBRARY", "CARGO_TARGET_DIR", "LD_LIBRARY_PATH"):
                env.pop(k, None)
            p = self.run_python(
                "import halo\ntry:\n    halo.init()\nexcept halo.LibraryNotFoundError as e:\n    print(e)\n"
                "except halo.HaloError:\n    print('FOUND', halo.library_path())\n",
                env,
            )
        self.assertEqual(p.returncode, 0, p.stderr)
        if p.stdout.startswith("FOUND "):
            self.skipTest(f"libhalo is installed for the system loader ({p.stdout.strip()[6:]})")
        for where in ("next to the package", "release build", "debug build", "the system loader", "HALO_LIBRARY"):
            self.assertIn(where, p.stdout)
        self.assertIn(os.path.join(tmp, "halo", "libhalo.so"), p.stdout)

    def test_a_crash_after_loading_keeps_its_signal(self):
        # libfabric links Intel's PSM, whose load-time handler would turn SIGSEGV into
        # a backtrace file in the working directory and exit status 1 (issue 11); the
        # package sets IPATH_NO_BACKTRACE before it loads libhalo.
        with tempfile.TemporaryDirectory() as tmp:
            env = child_env()
            env.pop("IPATH_NO_BACKTRACE", None)
            p = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import os, signal, halo\nhalo._lib.library()\nos.kill(os.getpid(), signal.SIGSEGV)\n",
                ],
                env=env,
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=60,
            )
            files = os.listdir(tmp)
        self.assertEqual(p.returncode, -11, p.stdout + p.stderr)
        self.assertEqual(files, [], "files written into the working directory")
        self.assertNotIn("Backtrace", p.stderr)

    def test_init_without_a_launcher_raises_invalid_argument(self):
        p = self.run_python(
            "import halo\ntry:\n    halo.init()\nexcept halo.HaloError as e:\n"
            "    print(int(e.code)); print(e.message)\n",
            child_env(),
        )
        self.assertEqual(p.returncode, 0, p.stderr)
        code, message = p.stdout.split("\n", 1)
        self.assertEqual(int(code), header_enum("haloResult")["haloInvalidArgument"])
        self.assertIn("haloCommInitFromEnv", message)
        self.assertIn("RANK", message)


class HaloErrorTest(unittest.TestCase):
    def test_fields_text_and_pickling(self):
        e = halo.HaloError(5, "haloAllToAllv: ranks 0 and 1 disagree")
        self.assertIs(e.code, halo.Result.INVALID_USAGE)
        self.assertEqual(e.code, 5)
        self.assertEqual(e.message, "haloAllToAllv: ranks 0 and 1 disagree")
        self.assertEqual(str(e), "haloInvalidUsage (5): haloAllToAllv: ranks 0 and 1 disagree")
        back = pickle.loads(pickle.dumps(e))
        self.assertEqual((back.code, back.message, str(back)), (e.code, e.message, str(e)))

    def test_an_unknown_code_stays_an_int(self):
        e = halo.HaloError(77, "?")
        self.assertEqual(e.code, 77)
        self.assertIn("unknown result (77)", str(e))


class SplitSizesTest(unittest.TestCase):
    """torch's rules for split sizes (rows along dim 0)."""

    def test_even_split(self):
        self.assertEqual(_comm._splits(None, 12, 4, "input"), [3, 3, 3, 3])
        self.assertEqual(_comm._splits(None, 0, 4, "input"), [0, 0, 0, 0])
        with self.assertRaisesRegex(ValueError, "do not split evenly across 4 ranks; pass input_split_sizes"):
            _comm._splits(None, 10, 4, "input")

    def test_given_sizes(self):
        self.assertEqual(_comm._splits([0, 5, 0, 2], 7, 4, "output"), [0, 5, 0, 2])
        self.assertEqual(_comm._splits((1, 1), 2, 2, "output"), [1, 1])
        with self.assertRaisesRegex(ValueError, "output_split_sizes sum to 6, but output has 7 rows"):
            _comm._splits([0, 4, 0, 2], 7, 4, "output")
        with self.assertRaisesRegex(ValueError, "has 3 entries; the communicator has 4 ranks"):
            _comm._splits([1, 2, 4], 7, 4, "output")
        with self.assertRaisesRegex(ValueError, r"input_split_sizes\[1\] is -1"):
            _comm._splits([3, -1, 3, 2], 7, 4, "input")
        with self.assertRaisesRegex(TypeError, "not an integer"):
            _comm._splits([3.0, 1, 1, 2], 7, 4, "input")
        with self.assertRaisesRegex(TypeError, "sequence of ints"):
            _comm._splits(7, 7, 4, "input")

    @need_numpy
    def test_sizes_from_an_array(self):
        self.assertEqual(_comm._splits(np.array([2, 0, 1]), 3, 3, "input"), [2, 0, 1])
        self.assertEqual(_comm._splits([np.int64(2), np.int32(1)], 3, 2, "input"), [2, 1])


@need_numpy
class BufferTest(unittest.TestCase):
    def test_numpy_types(self):
        from halo._buffers import as_buffer

        for dtype, code in [
            (np.int8, halo.DataType.INT8),
            (np.uint8, halo.DataType.UINT8),
            (np.bool_, halo.DataType.UINT8),
            (np.int32, halo.DataType.INT32),
            (np.uint32, halo.DataType.UINT32),
            (np.int64, halo.DataType.INT64),
            (np.uint64, halo.DataType.UINT64),
            (np.float16, halo.DataType.FLOAT16),
            (np.float32, halo.DataType.FLOAT32),
            (np.float64, halo.DataType.FLOAT64),
        ]:
            a = np.zeros((3, 2), dtype=dtype)
            b = as_buffer(a, "a")
            self.assertEqual((b.dtype, b.ptr, b.shape, b.numel, b.row_elements), (code, a.ctypes.data, (3, 2), 6, 2))
        for bad in (np.int16, np.complex64, np.float128 if hasattr(np, "float128") else np.complex128, object):
            with self.assertRaisesRegex(TypeError, "not supported by HALO"):
                as_buffer(np.zeros(2, dtype=bad), "a")
        with self.assertRaisesRegex(TypeError, "numpy.ndarray or a torch.Tensor"):
            as_buffer([1, 2], "a")
        with self.assertRaisesRegex(ValueError, "not C-contiguous"):
            as_buffer(np.zeros((4, 4))[:, 1], "a")
        with self.assertRaisesRegex(ValueError, "read-only"):
            a = np.zeros(3)
            a.flags.writeable = False
            as_buffer(a, "a", writable=True)


@need_numpy
class OneRankTest(unittest.TestCase):
    """A communicator of one rank (haloGetUniqueId + haloCommInitRank, no launcher)."""

    @classmethod
    def setUpClass(cls):
        uid = halo.get_unique_id()
        assert isinstance(uid, bytes) and len(uid) == header_define("HALO_UNIQUE_ID_BYTES")
        cls.comm = halo.init_rank(1, uid, 0)

    @classmethod
    def tearDownClass(cls):
        cls.comm.destroy()

    def test_rank_size_topology(self):
        self.assertEqual((self.comm.rank, self.comm.size), (0, 1))
        self.assertEqual([r["rank"] for r in self.comm.topology["ranks"]], [0])

    def test_all_to_all_single_copies(self):
        a = np.arange(12, dtype=np.float32).reshape(4, 3)
        b = np.zeros_like(a)
        self.assertIs(self.comm.all_to_all_single(b, a), b)
        np.testing.assert_array_equal(a, b)
        b[:] = 0
        self.comm.all_to_all_single(b, a, [4], [4])
        np.testing.assert_array_equal(a, b)

    def test_all_to_all_lists_staged(self):
        a = [np.arange(5, dtype=np.int64)]
        b = [np.zeros(5, dtype=np.int64)]
        self.comm.all_to_all(b, a)
        np.testing.assert_array_equal(a[0], b[0])

    def test_all_reduce_barrier_split(self):
        a = np.array([1.5, -2.0])
        self.comm.all_reduce(a, "max")
        np.testing.assert_array_equal(a, [1.5, -2.0])
        self.comm.barrier()
        with self.comm.split(7) as sub:
            self.assertEqual((sub.rank, sub.size), (0, 1))
        self.assertIsNone(self.comm.split(None))

    def test_the_new_collectives_on_one_rank(self):
        c = self.comm
        a = np.array([3, -4, 7], dtype=np.int8)
        for op in ("sum", "prod", "max", "min", "avg", halo.ReduceOp.AVG):
            np.testing.assert_array_equal(c.all_reduce(a.copy(), op), a)
        out = np.zeros((1, 3), np.int8)
        self.assertIs(c.all_gather(out, a), out)
        np.testing.assert_array_equal(out[0], a)
        out = np.zeros(3, np.int8)
        self.assertIs(c.reduce_scatter(out, a, "min"), out)
        np.testing.assert_array_equal(out, a)
        b = a.copy()
        self.assertIs(c.broadcast(b, 0), b)
        out = np.zeros(3, np.int8)
        c.gather(out, a, 0)
        np.testing.assert_array_equal(out, a)
        out = np.zeros(3, np.int8)
        c.scatter(out, a, 0, async_op=True).wait()
        np.testing.assert_array_equal(out, a)
        c.barrier(async_op=True).wait()
        c.send(a, 0, tag=4)
        c.send(a[:1], 0, tag=5)
        got = np.zeros(1, np.int8)
        c.recv(got, 0, tag=5)
        self.assertEqual(got[0], 3)
        got = np.zeros(3, np.int8)
        c.irecv(got, 0, tag=4).wait()
        np.testing.assert_array_equal(got, a)
        with self.assertRaisesRegex(ValueError, "root 1 is out of range for 1 ranks"):
            c.broadcast(b, 1)
        with self.assertRaisesRegex(ValueError, "tag 16777216 is out of range"):
            c.isend(a, 0, tag=halo.MAX_TAG + 1)
        with self.assertRaisesRegex(TypeError, "dst must be an int, not float"):
            c.send(a, 0.0)
        with self.assertRaisesRegex(ValueError, "'xor' is not a reduction"):
            c.all_reduce(a, "xor")

    def test_split_names_a_wrong_color_or_key(self):
        with self.assertRaisesRegex(TypeError, "split: color must be an int or None, not object"):
            self.comm.split(object())
        with self.assertRaisesRegex(TypeError, "split: color must be an int or None, not float"):
            self.comm.split(1.5)
        with self.assertRaisesRegex(TypeError, "split: key must be an int or None, not str"):
            self.comm.split(0, "first")
        with self.comm.split(np.int64(3), key=np.int32(0)) as sub:
            self.assertEqual((sub.rank, sub.size), (0, 1))

    def test_bad_unique_id(self):
        with self.assertRaisesRegex(ValueError, "128 bytes"):
            halo.init_rank(1, b"short", 0)


@need_numpy
class OpsTest(unittest.TestCase):
    """The torch.distributed-shaped collectives on real processes (`halo launch`),
    byte-exact against numpy references (workers/ops.py), on a power of two and not."""

    def assert_job_ok(self, job, n, ok_line):
        self.assertEqual(job.code, 0, job.describe())
        for r in range(n):
            lines = job.rank_lines(r)
            self.assertTrue(
                any(l.startswith(ok_line) for l in lines),
                f"rank {r} did not report {ok_line!r}\n{job.describe()}",
            )

    def test_ops_on_3_ranks(self):
        self.assert_job_ok(launch(self, 3, [WORKERS / "ops.py"]), 3, "ops ok")

    def test_ops_on_4_ranks(self):
        self.assert_job_ok(launch(self, 4, [WORKERS / "ops.py"]), 4, "ops ok")

    def test_mismatched_counts_raise_on_every_rank(self):
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            with self.subTest(op=op):
                job = launch(self, 3, [WORKERS / "ops.py", "mismatch", op], {"HALO_TIMEOUT_MS": "5000"}, timeout=90)
                self.assert_job_ok(job, 3, "mismatch ok")

    def test_disagreeing_calls_raise_invalid_usage_naming_both(self):
        for case in ("op", "dtype"):
            for n in (2, 4):
                with self.subTest(case=case, n=n):
                    job = launch(self, n, [WORKERS / "ops.py", "disagree", case], {"HALO_TIMEOUT_MS": "20000"}, timeout=90)
                    self.assert_job_ok(job, n, "disagree ok 5")


if __name__ == "__main__":
    unittest.main()
