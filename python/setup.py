"""`pip install ./python` builds libhalo with cargo and ships it inside the package.

The metadata is in pyproject.toml; this file only adds the build step. libhalo is a C
library (a cdylib with the C ABI of ffi/include/halo.h) that the package loads with ctypes,
not a Python extension module, so it is built by a small build_py hook rather than by
setuptools-rust or maturin (both name a cdylib as an extension module of one Python,
`libhalo.cpython-311-x86_64-linux-gnu.so`, which C programs cannot link by its soname).

Environment:
- HALO_SOURCE_DIR: the HALO checkout (default: the directory above this one);
- HALO_CARGO_PROFILE: `release` (default) or `debug`;
- CARGO_TARGET_DIR, CARGO: as for cargo;
- HALO_SKIP_CARGO=1: build no library (the package then finds one through
  HALO_LIBRARY, the repository's target/ or the system loader).
"""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution


class BuildWithLibhalo(build_py):
    def run(self):
        super().run()
        if os.environ.get("HALO_SKIP_CARGO") == "1":
            return
        here = Path(__file__).resolve().parent
        repo = Path(os.environ.get("HALO_SOURCE_DIR") or here.parent)
        manifest = repo / "ffi" / "Cargo.toml"
        if not manifest.is_file():
            raise SystemExit(
                f"halo-moe: no HALO checkout at {repo} (no {manifest}) to build libhalo from: "
                "install from the repository (`pip install ./python`), set HALO_SOURCE_DIR, "
                "or set HALO_SKIP_CARGO=1 and provide libhalo through HALO_LIBRARY"
            )
        profile = os.environ.get("HALO_CARGO_PROFILE", "release")
        if profile not in ("release", "debug"):
            raise SystemExit(f"halo-moe: HALO_CARGO_PROFILE is {profile!r}; use release or debug")
        cargo = os.environ.get("CARGO") or shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
        cmd = [cargo, "build", "-p", "halo-ffi", "--manifest-path", str(repo / "Cargo.toml")]
        if profile == "release":
            cmd.append("--release")
        try:
            subprocess.run(cmd, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise SystemExit(f"halo-moe: building libhalo failed ({' '.join(cmd)}): {e}") from e
        target = Path(os.environ.get("CARGO_TARGET_DIR") or repo / "target")
        lib = target / profile / "libhalo.so"
        dest = Path(self.build_lib) / "halo"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, dest / "libhalo.so")


class BinaryDistribution(Distribution):
    """A wheel that carries libhalo.so is platform-specific."""

    def has_ext_modules(self):
        return os.environ.get("HALO_SKIP_CARGO") != "1"


setup(cmdclass={"build_py": BuildWithLibhalo}, distclass=BinaryDistribution)
