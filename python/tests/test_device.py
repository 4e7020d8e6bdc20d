"""The device path from Python without a GPU stack (issue 17).

Objects with ``__cuda_array_interface__`` (what CuPy, Numba and torch's CUDA tensors
expose) are device arrays to ``halo``: their pointer and stream go to libhalo, which
looks the memory up with the CUDA / HIP runtime. These machines have no GPU, and either
no runtime (then the all-to-all calls must raise ``HaloError`` with
``UNHANDLED_DEVICE_ERROR`` naming every place libhalo looked) or torch's wheel's (then
the same error carries the runtime's own reason); either way they write nothing and
leave the communicator usable; the calls
without a device path refuse device arrays before reaching libhalo. The host memory
behind the stand-in arrays is never touched by a device (there is none).

torch is not needed: ``halo.torch`` passes a CUDA tensor's ``data_ptr()`` and
``torch.cuda.current_stream().cuda_stream`` the same way (tests/test_torch.py covers
it where torch and a GPU are installed).
"""

import ctypes
import unittest

from _support import REQUIRED, need_numpy

import halo
from halo._buffers import STREAM_LEGACY, as_buffer

try:
    import numpy as np
except ImportError:  # need_numpy fails or skips the tests
    np = None


class FakeDeviceArray:
    """Host memory presented as a device array (``__cuda_array_interface__`` v3)."""

    def __init__(self, nbytes, typestr="|u1", shape=None, stream=None, fill=0):
        self.mem = (ctypes.c_ubyte * nbytes)(*([fill] * nbytes))
        self.__cuda_array_interface__ = {
            "data": (ctypes.addressof(self.mem), False),
            "shape": shape if shape is not None else (nbytes,),
            "typestr": typestr,
            "strides": None,
            "version": 3,
            "stream": stream,
        }

    def bytes(self):
        return bytes(self.mem)


def wheel_runtime():
    """The CUDA runtime of a torch wheel in this interpreter's environment
    (``nvidia/cu13/lib`` for CUDA 13, ``nvidia/cuda_runtime/lib`` for CUDA 12), if any:
    libhalo must find it (the package passes ``sys.path`` as ``HALO_PYTHON_SITE``)."""
    import glob
    import os
    import sys

    for d in sys.path:
        for pattern in ("nvidia/cu13/lib/libcudart.so.1*", "nvidia/cuda_runtime/lib/libcudart.so.1*"):
            hits = glob.glob(os.path.join(d, pattern))
            if hits:
                return sorted(hits)[-1]
    return None


def device_available():
    """Whether this machine has a CUDA / HIP runtime (then the tests expect the
    host-memory refusal instead of the missing-library error)."""
    import os

    return os.environ.get("HALO_TEST_DEVICE_RUNTIME") == "1"


class BufferTest(unittest.TestCase):
    def test_interface_arrays_are_device_buffers_with_a_non_null_stream(self):
        a = FakeDeviceArray(16, typestr="<f4", shape=(2, 2))
        b = as_buffer(a, "x", device_ok=True)
        self.assertEqual((b.ptr, b.shape, b.dtype, b.itemsize), (ctypes.addressof(a.mem), (2, 2), halo.DataType.FLOAT32, 4))
        # The default stream (None or 0) is passed as cudaStreamLegacy, never NULL.
        self.assertEqual(b.stream, STREAM_LEGACY)
        self.assertEqual(as_buffer(FakeDeviceArray(4, stream=0), "x", device_ok=True).stream, 1)
        self.assertEqual(as_buffer(FakeDeviceArray(4, stream=0xABC0), "x", device_ok=True).stream, 0xABC0)

    def test_calls_without_a_device_path_refuse_device_arrays(self):
        with self.assertRaisesRegex(ValueError, "only all_to_all_single and all_to_all take device arrays"):
            as_buffer(FakeDeviceArray(4), "array")

    def test_bad_interfaces_are_type_errors(self):
        with self.assertRaisesRegex(TypeError, "not supported by HALO"):
            as_buffer(FakeDeviceArray(4, typestr="<c8"), "x", device_ok=True)
        with self.assertRaisesRegex(TypeError, "malformed"):
            bad = FakeDeviceArray(4)
            del bad.__cuda_array_interface__["data"]
            as_buffer(bad, "x", device_ok=True)


@need_numpy
class OneRankDeviceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.comm = halo.init_rank(1, halo.get_unique_id(), 0)

    @classmethod
    def tearDownClass(cls):
        cls.comm.destroy()

    def expect_device_error(self, call):
        with self.assertRaises(halo.HaloError) as cm:
            call()
        e = cm.exception
        if device_available():
            self.assertEqual(e.code, halo.Result.INVALID_ARGUMENT, str(e))
            self.assertIn("host memory", str(e))
            return
        self.assertEqual(e.code, halo.Result.UNHANDLED_DEVICE_ERROR, str(e))
        if wheel_runtime():
            # torch's wheel brought a CUDA runtime: libhalo loads it, and the runtime
            # itself says why there is no device (no driver or no GPU here).
            self.assertNotIn("could be loaded", str(e))
            self.assertRegex(str(e), r"cuda\w+ failed: .*\(error \d+\)")
            return
        for place in (
            "no CUDA/HIP runtime library could be loaded",
            "HALO_CUDART_LIBRARY (not set)",
            "libamdhip64.so.6",
            "libcudart.so.12",
            "/usr/local/cuda/lib64/libcudart.so",
        ):
            self.assertIn(place, str(e))

    def test_torchs_own_cuda_runtime_is_found(self):
        # torch 2.15's CUDA 13 wheels keep libcudart at nvidia/cu13/lib; the search
        # used to look in nvidia/cuda_runtime/lib only and reported no runtime at all.
        path = wheel_runtime()
        if path is None:
            why = "no torch CUDA wheel in this environment (deps.sh test installs torch)"
            if REQUIRED:
                self.fail(why)
            self.skipTest(why)
        with self.assertRaises(halo.HaloError) as cm:
            self.comm.all_to_all_single(FakeDeviceArray(4), FakeDeviceArray(4))
        if not device_available():
            self.assertNotIn("no CUDA/HIP runtime library could be loaded", str(cm.exception))

    def test_all_to_all_single_on_device_arrays(self):
        out = FakeDeviceArray(8, fill=0xEE)
        inp = FakeDeviceArray(8, fill=7)
        self.expect_device_error(lambda: self.comm.all_to_all_single(out, inp))
        self.expect_device_error(lambda: self.comm.all_to_all_single(out, inp, [8], [8]))
        self.assertEqual(out.bytes(), b"\xee" * 8, "a failed device call wrote the output")

    def test_all_to_all_lists_on_device_arrays(self):
        out = FakeDeviceArray(8, fill=0xEE)
        inp = FakeDeviceArray(8, fill=7)
        self.expect_device_error(lambda: self.comm.all_to_all([out], [inp]))
        self.assertEqual(out.bytes(), b"\xee" * 8)

    def test_one_host_and_one_device_buffer(self):
        out = np.zeros(8, dtype=np.uint8)
        inp = FakeDeviceArray(8, fill=7)
        # Refused before libhalo (which would refuse the mix by pointer attributes).
        with self.assertRaisesRegex(TypeError, "input is cuda.u1 but output is numpy.uint8"):
            self.comm.all_to_all_single(out, inp)

    def test_the_communicator_still_works_on_host_memory(self):
        self.expect_device_error(
            lambda: self.comm.all_to_all_single(FakeDeviceArray(4), FakeDeviceArray(4))
        )
        a = np.arange(6, dtype=np.int32)
        b = np.zeros_like(a)
        self.comm.all_to_all_single(b, a)
        np.testing.assert_array_equal(a, b)
        with self.assertRaisesRegex(ValueError, "device"):
            self.comm.all_reduce(FakeDeviceArray(4))


if __name__ == "__main__":
    unittest.main()
