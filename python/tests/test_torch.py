"""The "halo" torch.distributed backend with real torch, under torch's own launcher
(torchrun) and under `halo launch`: every operation byte-exact, bad input, DDP against
gloo, a Megatron-style MoE layer against a single-process reference, a dead rank.

torch is required where the tests are (HALO_REQUIRE_PYTHON_TESTS=1, as in CI): there a
missing torch fails these tests instead of skipping them."""

import subprocess
import sys
import unittest

from _support import PYTHON_DIR, WORKERS, child_env, launch, need_torch, torchrun

BACKEND = WORKERS / "torch_backend.py"
DISPATCHER = WORKERS / "torch_moe_dispatcher.py"
EXAMPLE = PYTHON_DIR / "examples" / "torch_moe.py"


def ok_lines(job, needle):
    """The ranks' reports containing ``needle``. torchrun passes every rank's output
    through one pipe, where two ranks' lines can run together: counted by occurrence."""
    return [needle] * job.stdout.count(needle)


class ImportTest(unittest.TestCase):
    def test_importing_halo_does_not_import_torch(self):
        p = subprocess.run(
            [sys.executable, "-c", "import sys, halo; print('torch' in sys.modules)"],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual((p.returncode, p.stdout.strip()), (0, "False"), p.stderr)

    @need_torch
    def test_importing_halo_torch_registers_the_backend(self):
        code = (
            "import torch.distributed as dist, halo.torch\n"
            "print('halo' in dist.Backend.backend_list, dist.Backend.HALO)\n"
            "import importlib; importlib.reload(halo.torch)\n"  # a second import is harmless
            "print(dist.Backend.backend_list.count('halo'))\n"
        )
        p = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.split(), ["True", "halo", "1"])


class BackendTest(unittest.TestCase):
    def run_job(self, n, args, needle, launcher=torchrun, **kw):
        job = launcher(self, n, args, **kw)
        self.assertEqual(job.code, 0, job.describe())
        self.assertEqual(len(ok_lines(job, needle)), n, job.describe())
        return job

    @need_torch
    def test_every_operation_on_4_ranks(self):
        self.run_job(4, [BACKEND, "ops"], "torch backend ops ok")

    @need_torch
    def test_every_operation_on_3_ranks(self):
        self.run_job(3, [BACKEND, "ops"], "torch backend ops ok")

    @need_torch
    def test_ddp_over_halo_matches_ddp_over_gloo(self):
        self.run_job(4, [BACKEND, "ddp"], "ddp ok")

    @need_torch
    def test_the_megatron_style_moe_example_on_4_ranks(self):
        self.run_job(4, [EXAMPLE], "matches the single-process reference: ok")

    @need_torch
    def test_the_moe_example_on_the_dispatcher_for_k_1_2_8(self):
        for k in (1, 2, 8):
            self.run_job(4, [EXAMPLE, "--dispatcher", "--topk", str(k)], f"(MoeDispatcher, k={k}, EP 4) matches the single-process reference: ok")

    @need_torch
    def test_the_dispatcher_layer_equals_the_all_to_all_layer(self):
        # Two emulated nodes (HALO_TOPOLOGY), so that the dedup path replicates inside
        # the node and reduces there; 84 cases (k, routings, modes, dtypes, tables),
        # then the layout, async_finish, then bad input on every rank.
        for topology in ("nodes:2x2", ""):
            self.run_job(4, [DISPATCHER], "moe dispatcher ok (84 cases)", extra_env={"HALO_TOPOLOGY": topology, "HALO_TIMEOUT_MS": "20000"})

    @need_torch
    def test_the_moe_example_under_halo_launch(self):
        # `halo launch` sets torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR,
        # MASTER_PORT): the example runs unchanged, no HALO-specific environment.
        self.run_job(2, [EXAMPLE], "matches the single-process reference: ok", launcher=launch, timeout=240)

    @need_torch
    def test_a_dead_rank_makes_the_others_raise(self):
        # Plain processes with torchrun's variables, as a batch system starts them
        # (torchrun itself would end the survivors as soon as one rank exits).
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for rank in range(4):
            env = child_env(
                {
                    "RANK": str(rank),
                    "WORLD_SIZE": "4",
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "HALO_TEST_TIMEOUT_S": "20",
                    "OMP_NUM_THREADS": "1",
                }
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKERS / "torch_dead_rank.py")],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        outs = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            outs.append((p.returncode, out, err))
        report = "\n".join(f"rank {r}: exit {c}\n{o}{e[-3000:]}" for r, (c, o, e) in enumerate(outs))
        self.assertEqual([c for c, _, _ in outs], [0, 0, 3, 0], report)
        for rank in (0, 1, 3):
            line = next((l for l in outs[rank][1].splitlines() if "raised DistBackendError" in l), None)
            self.assertIsNotNone(line, report)
            seconds = float(line.split(" after ", 1)[1].split()[0])
            # Well inside torch's 20 s timeout: HALO sees the death itself.
            self.assertLess(seconds, 20.0, line)


if __name__ == "__main__":
    unittest.main()
