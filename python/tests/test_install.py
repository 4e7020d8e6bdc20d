"""`pip install ./python` works: it builds libhalo with cargo and ships it in the
package; installed into a scratch directory, the package imports from there and loads
its own libhalo."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from _support import PYTHON_DIR, REPO, child_env


def _have(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


class InstallTest(unittest.TestCase):
    def test_pip_install_into_a_directory(self):
        if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode:
            self.skipTest("pip is not available for this python")
        with tempfile.TemporaryDirectory() as tmp:
            target = os.path.join(tmp, "site")
            cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", target, "--quiet"]
            # Offline when the build backend is already here (setuptools >= 61 with wheel);
            # otherwise pip fetches it into an isolated build environment.
            offline = _have("wheel") and _have("setuptools")
            if offline:
                cmd += ["--no-build-isolation", "--no-index"]
            # The build runs cargo on this checkout (HALO_SOURCE_DIR, as the copy is
            # elsewhere), in the profile of the library under test, so it is a no-op
            # when that library is built already.
            lib = os.environ.get("HALO_LIBRARY", "")
            profile = "debug" if os.sep + "debug" + os.sep in lib else "release"
            env = child_env(
                {
                    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                    "PIP_ROOT_USER_ACTION": "ignore",
                    "HALO_SOURCE_DIR": str(REPO),
                    "HALO_CARGO_PROFILE": profile,
                }
            )
            # From a copy, so that setuptools' build/ and *.egg-info stay out of the checkout.
            source = os.path.join(tmp, "python")
            shutil.copytree(
                PYTHON_DIR, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
            )
            p = subprocess.run(cmd + [source], env=env, capture_output=True, text=True, timeout=300)
            if p.returncode and not offline and (
                "No matching distribution" in p.stderr or "NewConnectionError" in p.stderr
            ):
                self.skipTest("the build backend (setuptools) cannot be fetched from PyPI here")
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertTrue(os.path.isfile(os.path.join(target, "halo", "torch.py")))
            shipped = os.path.join(target, "halo", "libhalo.so")
            self.assertTrue(os.path.isfile(shipped), os.listdir(os.path.join(target, "halo")))

            # No HALO_LIBRARY: the package finds the library it ships.
            env = child_env()
            env.pop("HALO_LIBRARY", None)
            env["PYTHONPATH"] = target
            p = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import halo; print(halo.__file__); print(halo.library_path()); print(halo.error_string(4))",
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            self.assertEqual(p.returncode, 0, p.stderr)
            where, path, text = p.stdout.splitlines()[:3]
            self.assertTrue(where.startswith(target), where)
            self.assertEqual(os.path.realpath(path), os.path.realpath(shipped))
            self.assertIn("invalid argument", text)


if __name__ == "__main__":
    unittest.main()
