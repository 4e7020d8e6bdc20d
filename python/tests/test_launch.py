"""Real processes: `halo launch -n N -- python3 WORKER` and the job must exit 0 with
every rank reporting success. The workers (workers/) check every byte they receive."""

import unittest

from _support import WORKERS, PYTHON_DIR, launch, need_numpy


@need_numpy
class LaunchTest(unittest.TestCase):
    def assert_job_ok(self, job, n, ok_line):
        self.assertEqual(job.code, 0, job.describe())
        for r in range(n):
            self.assertIn(ok_line, job.rank_lines(r), f"rank {r} did not report {ok_line!r}\n{job.describe()}")

    def test_collectives_on_4_ranks(self):
        job = launch(self, 4, [WORKERS / "collectives.py"])
        self.assert_job_ok(job, 4, "collectives ok")

    def test_collectives_on_3_ranks(self):
        job = launch(self, 3, [WORKERS / "collectives.py"])
        self.assert_job_ok(job, 3, "collectives ok")

    def test_errors_on_4_ranks(self):
        job = launch(self, 4, [WORKERS / "errors.py"])
        self.assert_job_ok(job, 4, "errors ok")

    def test_the_moe_dispatch_example_on_4_ranks(self):
        job = launch(self, 4, [PYTHON_DIR / "examples" / "moe_dispatch.py"])
        self.assertEqual(job.code, 0, job.describe())
        for r in range(4):
            lines = [l for l in job.rank_lines(r) if l.startswith(f"rank {r}: ") and l.endswith("combine correct")]
            self.assertEqual(len(lines), 1, job.describe())

    def test_the_readme_example_on_3_ranks(self):
        # The README's program (section "From Python"), with a check of what arrived.
        readme = (PYTHON_DIR.parent / "README.md").read_text()
        code = readme.split("## From Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
        code += (
            "\nassert all((recv[q * (me + 1):(q + 1) * (me + 1)] == q).all() for q in range(n))"
            "\nprint('readme ok')\n"
        )
        job = launch(self, 3, ["-c", code])
        self.assert_job_ok(job, 3, "readme ok")

    def test_a_wrong_byte_fails_the_job(self):
        # The negative control: rank 1 flips one received byte before checking it.
        job = launch(self, 3, [WORKERS / "collectives.py"], {"HALO_TEST_CORRUPT": "1"})
        self.assertNotEqual(job.code, 0, job.describe())
        self.assertIn("bytes differ", job.stdout + job.stderr, job.describe())
        self.assertNotIn("collectives ok", job.rank_lines(1), job.describe())

    def test_a_type_mismatch_fails_every_rank_with_every_algorithm(self):
        # float32 on rank 0, float64 on the others, same shape: an error on every rank
        # (issue 11), rank 0 and at least one other haloInvalidUsage.
        for alg in ("flat", "pairwise", "bruck", "halo", "halo2d"):
            env = {"HALO_ALGO": alg, "HALO_TOPOLOGY": "nodes:2x2", "HALO_TIMEOUT_MS": "3000"}
            job = launch(self, 4, [WORKERS / "mismatch.py"], env, timeout=90)
            self.assertEqual(job.code, 0, f"{alg}: {job.describe()}")
            codes = []
            for r in range(4):
                lines = [l for l in job.rank_lines(r) if l.startswith("mismatch ok ")]
                self.assertEqual(len(lines), 1, f"{alg}: rank {r}\n{job.describe()}")
                codes.append(int(lines[0].split()[2]))
            self.assertEqual(codes[0], 5, f"{alg}: {codes}\n{job.describe()}")
            self.assertIn(5, codes[1:], f"{alg}: {codes}\n{job.describe()}")

    def test_a_failing_rank_fails_the_job(self):
        job = launch(self, 2, ["-c", "import os, sys; sys.exit(3 if os.environ['RANK'] == '1' else 0)"])
        self.assertEqual(job.code, 3, job.describe())


if __name__ == "__main__":
    unittest.main()
