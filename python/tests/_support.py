"""What the tests share: where things are, and running a job under `halo launch`.

Environment (ffi/tests/python.rs sets all of it; by hand, the defaults find a
`cargo build` of the repository):
- HALO_LIBRARY: libhalo to test (default: the package's own search);
- HALO_BIN: the `halo` launcher (default: target/debug/halo, target/release/halo,
  then `halo` on PATH);
- HALO_REQUIRE_PYTHON_TESTS=1: a missing numpy or launcher fails instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import unittest
from pathlib import Path

TESTS = Path(__file__).resolve().parent
WORKERS = TESTS / "workers"
PYTHON_DIR = TESTS.parent
REPO = PYTHON_DIR.parent
HEADER = REPO / "ffi" / "include" / "halo.h"

REQUIRED = os.environ.get("HALO_REQUIRE_PYTHON_TESTS") == "1"

try:
    import numpy  # noqa: F401

    HAVE_NUMPY = True
except ImportError:
    HAVE_NUMPY = False

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

TORCH_REASON = "torch is not installed (bash scripts/deps.sh test installs it)"


def need_torch(test):
    """Skips without torch, unless the tests are required (then they fail: CI installs
    torch, so a torch test never passes as skipped there)."""
    if HAVE_TORCH or REQUIRED:
        return test
    return unittest.skip(TORCH_REASON)(test)


def torchrun(testcase, n, args, extra_env=None, timeout=300):
    """Runs ``torchrun --standalone --nproc-per-node N ARGS...`` (torch's own launcher,
    as users start jobs) and returns the Job; every rank's output is on stdout."""
    if not HAVE_TORCH:
        testcase.fail(f"the tests are required but {TORCH_REASON}")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(n),
        "--max-restarts",
        "0",
    ] + [str(a) for a in args]
    env = child_env(extra_env)
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        proc = subprocess.run(
            cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        testcase.fail(f"{' '.join(cmd)} ran past {timeout} s:\n{e.stdout}\n{e.stderr}")
    return Job(cmd, proc)


def need_numpy(test):
    """Skips without numpy, unless the tests are required (then they fail)."""
    if HAVE_NUMPY or REQUIRED:
        return test
    return unittest.skip("numpy is not installed (bash scripts/deps.sh test installs it)")(test)


def halo_bin():
    """The `halo` launcher, or None."""
    env = os.environ.get("HALO_BIN")
    if env:
        return env
    for profile in ("debug", "release"):
        p = REPO / "target" / profile / "halo"
        if p.is_file():
            return str(p)
    return shutil.which("halo")


def child_env(extra=None):
    """The environment of a child: the package importable, no rank variables of an
    enclosing job."""
    env = dict(os.environ)
    rank_vars = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
    prefixes = ("OMPI_COMM_WORLD", "PMI_", "SLURM_", "HALO_BOOTSTRAP", "MASTER_")
    for k in list(env):
        if k in rank_vars or k.startswith(prefixes):
            del env[k]
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PYTHON_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("HALO_TIMEOUT_MS", "20000")
    if extra:
        env.update(extra)
    return env


class Job:
    """How a `halo launch` job ended: exit code and the ranks' labelled output."""

    def __init__(self, cmd, proc):
        self.cmd = cmd
        self.code = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr

    def rank_lines(self, rank):
        prefix = f"[{rank}] "
        return [l[len(prefix):] for l in self.stdout.splitlines() if l.startswith(prefix)]

    def describe(self):
        return (
            f"{' '.join(self.cmd)}\nexit code {self.code}\n--- stdout ---\n{self.stdout}"
            f"--- stderr ---\n{self.stderr}"
        )


def launch(testcase, n, args, extra_env=None, timeout=150):
    """Runs `halo launch -n N -- python3 ARGS...` and returns the Job."""
    exe = halo_bin()
    if exe is None:
        msg = "the halo launcher is not built (cargo build --bin halo) and HALO_BIN is unset"
        if REQUIRED:
            testcase.fail(msg)
        testcase.skipTest(msg)
    cmd = [exe, "launch", "-n", str(n), "--timeout", str(timeout - 30), "--", sys.executable] + [
        str(a) for a in args
    ]
    proc = subprocess.run(
        cmd,
        env=child_env(extra_env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Job(cmd, proc)


def header_enum(name):
    """{C name: value} of `typedef enum NAME { ... }` in ffi/include/halo.h."""
    import re

    text = HEADER.read_text()
    body = re.search(r"typedef enum %s \{(.*?)\}" % re.escape(name), text, re.S)
    assert body, f"ffi/include/halo.h has no enum {name}"
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"(\w+) = (-?\d+),", body.group(1))}


def header_define(name):
    import re

    m = re.search(r"#define %s (\S+)" % re.escape(name), HEADER.read_text())
    assert m, f"ffi/include/halo.h has no #define {name}"
    return int(m.group(1))
