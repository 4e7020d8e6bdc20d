"""torch's own distributed test suite over the "halo" backend: its CPU tests of
all_to_all (single and list, equal and unequal splits, complex, groups, the full
group), all_reduce, reduce, all_gather, broadcast, barrier, gather, scatter and
send/recv with tags, 4 processes each, bootstrapped through the suite's file:// store
(workers/torch_suite.py says how the suite is pointed at "halo").

Every test that runs must pass; the tests the suite itself skips for this backend are
listed by name below, so a test that starts skipping is noticed too."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

from _support import WORKERS, child_env, need_torch

# The tests run: torch's CPU collective tests of the operations HALO implements.
SELECTED = [
    # all_to_all: the suite runs these on CPU only for BACKEND=mpi (see torch_suite.py).
    "test_all_to_all",
    "test_all_to_all_complex",
    "test_all_to_all_group",
    "test_all_to_all_full_group",
    "test_all_to_all_single_equal_split",
    "test_all_to_all_single_equal_split_group",
    "test_all_to_all_single_equal_split_full_group",
    "test_all_to_all_single_unequal_split",
    "test_all_to_all_single_unequal_split_complex",
    "test_all_to_all_single_unequal_split_group",
    "test_all_to_all_single_unequal_split_full_group",
    # all_reduce
    "test_all_reduce_sum",
    "test_all_reduce_sum_async",
    "test_all_reduce_sum_complex",
    "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_product",
    "test_all_reduce_max",
    "test_all_reduce_group_sum",
    "test_all_reduce_full_group_max",
    # reduce to a root
    "test_reduce_sum",
    # all_gather
    "test_all_gather",
    "test_all_gather_complex",
    "test_all_gather_group",
    "test_all_gather_full_group",
    # broadcast
    "test_broadcast",
    "test_broadcast_group",
    # barrier
    "test_barrier",
    "test_barrier_full_group",
    # gather, scatter, point-to-point
    "test_gather",
    "test_scatter",
    "test_send_recv_with_tag",
]

# Tests of SELECTED that the suite skips for this backend (with BACKEND=mpi at import:
# its own decorators), each with the suite's reason.
EXPECTED_SKIPS = {}


class TorchSuiteTest(unittest.TestCase):
    @need_torch
    def test_torchs_distributed_suite_over_halo(self):
        with tempfile.TemporaryDirectory() as tmp:
            env = child_env(
                {
                    "BACKEND": "mpi",  # decides which tests the suite enables; see torch_suite.py
                    "WORLD_SIZE": "4",
                    "TEMP_DIR": tmp,
                    "OMP_NUM_THREADS": "1",
                }
            )
            env["PYTHONPATH"] = os.pathsep.join([str(WORKERS), env["PYTHONPATH"]])
            out = os.path.join(tmp, "outcomes.json")
            p = subprocess.run(
                [sys.executable, str(WORKERS / "torch_suite.py"), "--json", out] + SELECTED,
                env=env,
                cwd=tmp,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=900,
            )
            tail = p.stderr[-6000:]
            self.assertTrue(os.path.isfile(out), f"no outcomes (exit {p.returncode}):\n{tail}")
            with open(out) as f:
                results = json.load(f)
        missing = [t for t in SELECTED if t not in results]
        self.assertEqual(missing, [], tail)
        bad = {t: r for t, r in results.items() if r.startswith(("FAIL", "ERROR"))}
        self.assertEqual(bad, {}, "\n".join(f"{t}: {r}" for t, r in bad.items()))
        skipped = {t: r for t, r in results.items() if r.startswith("skipped")}
        self.assertEqual(sorted(skipped), sorted(EXPECTED_SKIPS), skipped)
        ran = [t for t, r in results.items() if r == "ok"]
        self.assertEqual(len(ran), len(SELECTED) - len(EXPECTED_SKIPS))


if __name__ == "__main__":
    unittest.main()
