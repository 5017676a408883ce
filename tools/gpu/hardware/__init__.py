"""The hardware's own figures for a GPU tap: the CUDA programs of this
folder (README.md), built with nvcc and run. `python -m tools.gpu.hardware`
prints their lines; `tools.gpu.check` runs it as one of its steps.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
# Each program and the libraries it links beyond the CUDA runtime.
PROGRAMS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("tap_limit", ()), ("tap_signal", ("-lcuda",)))


def find_nvcc() -> Optional[str]:
  """nvcc on PATH, in /usr/local/cuda, or from the nvidia-cuda-nvcc wheel
  that JAX's CUDA plugin may have installed; None if none."""
  wheels = [os.path.join(path, "nvidia", "cuda_nvcc", "bin", "nvcc")
            for path in sys.path if path]
  candidates = ([shutil.which("nvcc") or ""]
                + sorted(glob.glob("/usr/local/cuda*/bin/nvcc")) + wheels)
  return next((path for path in candidates
               if path and os.access(path, os.X_OK)), None)


def build_and_run(nvcc: str, programs: str, timeout: float) -> List[str]:
  """Builds and runs each of PROGRAMS from the folder `programs`, all
  within `timeout` seconds; returns their output's lines. Raises
  subprocess.CalledProcessError (a build or run failed) or
  subprocess.TimeoutExpired."""
  deadline = time.monotonic() + timeout
  lines: List[str] = []
  with tempfile.TemporaryDirectory() as build:
    for program, libraries in PROGRAMS:
      binary = os.path.join(build, program)
      _output([nvcc, "-O2", "-o", binary,
               os.path.join(programs, program + ".cu"), *libraries], deadline)
      lines += [line for line in _output([binary], deadline).splitlines()
                if line.strip()]
  return lines


def _output(command: List[str], deadline: float) -> str:
  """`command`'s standard output; it must exit 0 before `deadline`."""
  return subprocess.run(command, capture_output=True, text=True, check=True,
                        timeout=max(1.0, deadline - time.monotonic())).stdout


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Prints the programs' lines; exits 2 where there is no nvcc, 1 where
  a program failed to build or run."""
  import argparse  # pylint: disable=import-outside-toplevel
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--programs", default=HERE,
                      help="the folder of tap_limit.cu and tap_signal.cu")
  parser.add_argument("--timeout", type=float, default=300,
                      help="seconds for building and running them all")
  args = parser.parse_args(argv)
  nvcc = find_nvcc()
  if nvcc is None:
    print("gpu_hardware: nvcc not found (PATH, /usr/local/cuda*, the "
          "nvidia-cuda-nvcc wheel)", file=sys.stderr)
    return 2
  try:
    lines = build_and_run(nvcc, args.programs, args.timeout)
  except subprocess.CalledProcessError as error:
    print(f"gpu_hardware: {' '.join(error.cmd)} failed: "
          f"{(error.stderr or '').strip()}", file=sys.stderr)
    return 1
  except subprocess.TimeoutExpired as error:
    print(f"gpu_hardware: {' '.join(error.cmd)} ran past the "
          f"{args.timeout:.0f} s given", file=sys.stderr)
    return 1
  print("\n".join(lines), flush=True)
  return 0
