"""torch's own distributed test suite (``torch.testing._internal.distributed.
distributed_test``, shipped in the torch wheel: the suite torch runs for gloo, NCCL,
MPI and UCC) over the "halo" backend. test_torch_suite.py runs its CPU collective
tests from here, in a child with ``BACKEND=mpi`` and ``WORLD_SIZE``, ``TEMP_DIR`` set.

The suite decides at import, from ``BACKEND``, which tests run: it enables its CPU
all-to-all tests only for "mpi", so it is imported with that value, and its module's
``BACKEND`` is then set to "halo", which every process it spawns initialises with
(this module is imported again in each of them, so the switch is made there too).
"""

import os

os.environ.setdefault("BACKEND", "mpi")
os.environ.setdefault("WORLD_SIZE", "4")

import torch.testing._internal.distributed.distributed_test as suite  # noqa: E402
from torch.testing._internal.common_utils import run_tests  # noqa: E402

import halo.torch  # noqa: E402,F401  registers "halo"

assert suite.BACKEND == "mpi", suite.BACKEND
suite.BACKEND = "halo"


class TestHaloBackend(suite.TestDistBackend, suite.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


def _run_to_json(path, names):
    """Runs ``names`` (methods of TestHaloBackend) and writes {name: outcome} to
    ``path``: "ok", "skipped: REASON", "FAIL: ..." or "ERROR: ..."."""
    import json
    import unittest

    outcomes = {}

    class Result(unittest.TextTestResult):
        def addSuccess(self, test):
            super().addSuccess(test)
            outcomes[test._testMethodName] = "ok"

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            outcomes[test._testMethodName] = f"skipped: {reason}"

        def addFailure(self, test, err):
            super().addFailure(test, err)
            outcomes[test._testMethodName] = "FAIL: " + self._exc_info_to_string(err, test)[-3000:]

        def addError(self, test, err):
            super().addError(test, err)
            outcomes[test._testMethodName] = "ERROR: " + self._exc_info_to_string(err, test)[-3000:]

    suite_ = unittest.TestSuite(TestHaloBackend(n) for n in names)
    unittest.TextTestRunner(resultclass=Result, verbosity=2).run(suite_)
    with open(path, "w") as f:
        json.dump(outcomes, f, indent=1)


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 2 and sys.argv[1] == "--json":
        _run_to_json(sys.argv[2], sys.argv[3:])
    else:
        run_tests()
