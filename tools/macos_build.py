"""Compiles and links the native module for macOS (arm64 and x86-64) on
this machine with zig's cross compiler, so that a change that would break
the build from the sdist on a Mac fails here.

    python -m tools.macos_build [--cache DIR]

Each `receiver/native/*.cc` is compiled as setup.py compiles it, against
NumPy's headers from NumPy's macOS wheel (downloaded once into the cache)
and this interpreter's own Python headers, and the objects are linked
into an extension module against macOS's system library, leaving Python's
symbols to the interpreter as macOS builds do; nothing runs. On macOS the
native core takes the portable branches of its Linux-only calls
(`receiver/native/portability.h`): CI runs the native tests on a Linux
build of those branches (`HOST_CALLBACK_PORTABLE=1`).

Needs ziglang (`pip install ziglang`) and PyPI, or the cache. Exits
non-zero when a file fails to compile or the module fails to link.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from typing import List

ROOT = pathlib.Path(__file__).resolve().parent.parent
NATIVE = ROOT / "receiver" / "native"
TARGETS = ("aarch64-macos", "x86_64-macos")
# setup.py's flags (Py_LIMITED_API: CPython 3.11's stable ABI).
FLAGS = ("-std=c++17", "-O2", "-fvisibility=hidden",
         "-DPy_LIMITED_API=0x030B0000")
NUMPY_WHEEL_PLATFORM = "macosx_14_0_arm64"


def numpy_headers(cache: pathlib.Path) -> pathlib.Path:
  """NumPy's C headers from its macOS wheel, unpacked into `cache` once."""
  include = cache / "numpy-macos" / "numpy" / "_core" / "include"
  if include.is_dir():
    return include
  with tempfile.TemporaryDirectory() as scratch:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
         "--only-binary=:all:", "--platform", NUMPY_WHEEL_PLATFORM,
         "--python-version", "3.11", "--dest", scratch, "numpy>=2"],
        check=True)
    wheel = next(pathlib.Path(scratch).glob("numpy-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
      archive.extractall(cache / "numpy-macos", [
          name for name in archive.namelist()
          if name.startswith("numpy/_core/include/")])
  return include


def _zig(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "ziglang", "c++", *args],
                        capture_output=True, text=True, check=False)


def build(target: str, numpy_include: pathlib.Path,
          out: pathlib.Path) -> List[str]:
  """Compiles every source for `target` into `out` and links them; returns
  the failures' messages (none: it built)."""
  includes = ["-isystem", str(NATIVE / "third_party"),
              "-isystem", str(numpy_include),
              "-isystem", sysconfig.get_paths()["include"]]

  def compile_one(source: pathlib.Path) -> str:
    done = _zig("-target", target, *FLAGS, *includes, "-c", str(source),
                "-o", str(out / f"{source.stem}.o"))
    return "" if done.returncode == 0 else f"{source.name}:\n{done.stderr}"

  with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
    failures = [message for message in pool.map(
        compile_one, sorted(NATIVE.glob("*.cc"))) if message]
  if failures:
    return failures
  linked = _zig("-target", target, "-shared", "-undefined", "dynamic_lookup",
                "-o", str(out / "_native.abi3.so"),
                *sorted(str(path) for path in out.glob("*.o")))
  return [] if linked.returncode == 0 else [f"link:\n{linked.stderr}"]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
      "--cache", type=pathlib.Path,
      default=pathlib.Path.home() / ".cache" / "host-callback-ci",
      help="where NumPy's macOS headers are kept between runs")
  args = parser.parse_args()
  numpy_include = numpy_headers(args.cache)
  failed = False
  for target in TARGETS:
    with tempfile.TemporaryDirectory() as out:
      failures = build(target, numpy_include, pathlib.Path(out))
    print(f"macos_build: {target}: "
          f"{'FAILED' if failures else 'compiled and linked'}", flush=True)
    for message in failures:
      print(message, file=sys.stderr)
    failed = failed or bool(failures)
  if failed:
    raise SystemExit(1)


if __name__ == "__main__":
  main()
