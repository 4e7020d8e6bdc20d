"""halo.torch with real torch tensors. Skipped, with the reason, when torch is absent
(it is optional: installing it in CI is not required)."""

import inspect
import unittest

from _support import HAVE_TORCH, TORCH_REASON, WORKERS, launch

import halo
import halo.torch

if HAVE_TORCH:
    import torch
    import torch.distributed as dist

    from halo._buffers import as_buffer


def params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


class ImportTest(unittest.TestCase):
    def test_importing_halo_torch_does_not_import_torch(self):
        import subprocess
        import sys

        from _support import child_env

        p = subprocess.run(
            [sys.executable, "-c", "import sys, halo.torch; print('torch' in sys.modules)"],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual((p.returncode, p.stdout.strip()), (0, "False"), p.stderr)

    def test_the_megatron_switch_is_documented_in_the_module(self):
        doc = halo.torch.__doc__
        self.assertIn("import halo.torch", doc)
        self.assertIn("halo.torch.all_to_all_single(", doc)
        self.assertIn("was: torch.distributed.all_to_all_single(", doc)


@unittest.skipUnless(HAVE_TORCH, TORCH_REASON)
class TorchTest(unittest.TestCase):
    def test_signatures_match_torch_distributed(self):
        self.assertEqual(params(halo.torch.all_to_all_single), params(dist.all_to_all_single))
        self.assertEqual(params(halo.torch.all_to_all), params(dist.all_to_all))
        for name in ("all_reduce", "barrier"):
            ours = [n for n, _ in params(getattr(halo.torch, name))]
            theirs = [n for n, _ in params(getattr(dist, name))]
            self.assertEqual(ours, theirs, name)

    def test_tensor_buffers(self):
        for dtype, code in [
            (torch.bfloat16, halo.DataType.BFLOAT16),
            (torch.float16, halo.DataType.FLOAT16),
            (torch.float32, halo.DataType.FLOAT32),
            (torch.float64, halo.DataType.FLOAT64),
            (torch.int64, halo.DataType.INT64),
            (torch.int32, halo.DataType.INT32),
            (torch.int8, halo.DataType.INT8),
            (torch.uint8, halo.DataType.UINT8),
            (torch.bool, halo.DataType.UINT8),
        ]:
            t = torch.zeros((4, 3), dtype=dtype)[1:]
            b = as_buffer(t, "t")
            self.assertEqual((b.dtype, b.ptr, b.shape, b.itemsize), (code, t.data_ptr(), (3, 3), t.element_size()))
        with self.assertRaisesRegex(TypeError, "not supported by HALO"):
            as_buffer(torch.zeros(2, dtype=torch.complex64), "t")
        with self.assertRaisesRegex(TypeError, "not supported by HALO"):
            as_buffer(torch.zeros(2, dtype=torch.int16), "t")
        with self.assertRaisesRegex(ValueError, "not contiguous"):
            as_buffer(torch.zeros(4, 4).t(), "t")
        with self.assertRaisesRegex(ValueError, "on device meta"):
            as_buffer(torch.empty(4, device="meta"), "t")
        with self.assertRaisesRegex(ValueError, "requires grad"):
            as_buffer(torch.zeros(4, requires_grad=True), "t", writable=True)
        if torch.cuda.is_available():
            with self.assertRaisesRegex(ValueError, "host memory"):
                as_buffer(torch.zeros(4, device="cuda"), "t")
            # The device path: data_ptr() and the current stream (0 -> cudaStreamLegacy).
            t = torch.zeros(4, device="cuda")
            b = as_buffer(t, "t", device_ok=True)
            self.assertEqual(b.ptr, t.data_ptr())
            self.assertEqual(b.stream, torch.cuda.current_stream().cuda_stream or 1)

    def test_against_torch_distributed_on_4_ranks(self):
        job = launch(self, 4, [WORKERS / "torch_worker.py"])
        self.assertEqual(job.code, 0, job.describe())
        for r in range(4):
            self.assertIn("torch ok", job.rank_lines(r), job.describe())


if __name__ == "__main__":
    unittest.main()
