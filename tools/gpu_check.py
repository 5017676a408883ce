"""Validates host_callback's native CUDA transport on a GPU, in one command:

    python -m tools.gpu_check                  # writes gpu_check_report.md
    python -m tools.gpu_check --report PATH    # the report elsewhere
    python -m tools.gpu_check --skip-suite     # without the whole suite
    python -m tools.gpu_check --workers 8      # the suite in 8 processes
                                               # (needs pytest-xdist)

    python -m tools.gpu_check --hardware DIR   # tap_limit.cu, tap_signal.cu
                                               # elsewhere than ../shared/gpu

The suite's output goes to the report's path + ".suite.log". On a GPU
machine without network where JAX's CUDA plugin is installed:
`pip install --no-index --no-deps --no-build-isolation -e .`, then
`XLA_PYTHON_CLIENT_PREALLOCATE=false python -m tools.gpu_check --workers 12`
(on an H200 with 16 cores the suite takes about 3 minutes in 12
processes, the rest about 4). docs/gpu.md keeps the last run's results.

Checks, each PASS or FAIL, printed as each ends: the CUDA runtime's
functions are found (`native/cuda_api.cc`); the GPU tests (tests/test_gpu.py,
and tests/test_persistent_cache.py on the GPU) and the CUDA transport's
host-side tests (tests/test_cuda_transport.py); the whole test suite with
the GPU as the default backend; a 45-second soak of 4 threads of taps
(tools.soak); the timing rows of tools/gpu_timings.py (a scan of tiny
steps with each kind of tap, `scan_tqdm`, a ~1 ms training step with a
tap and `barrier_wait()` every step); `tools.bench`'s rows that the GPU
targets name (GPU_BENCH_ROWS); whether JAX can compile while a host
function blocks a launch, on another thread or in the host functions
themselves (tools/gpu_compile_during_call.py); the hardware's own
figures from the CUDA programs of ../shared/gpu/ (built with nvcc when it
exists); and the speed targets of docs/gpu.md, judged from those figures
(tools/gpu_targets.py).
Needs no network. Exits 0 when every check passed, 1 when one failed, and
2 with a "no GPU" message where JAX has no CUDA backend (nothing
validated). Once it passes on a GPU, `transport_policy.CUDA_NATIVE_VALIDATED` may
be set to True.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Tuple

from . import gpu_targets, gpu_timings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_GPU = os.path.join(os.path.dirname(ROOT), "shared", "gpu")
NO_GPU = 2
# Test modules that need a package of the [test] extra and test no GPU path:
# left out of the suite where it is missing (an offline GPU machine may
# lack it), with a line that says so.
NEEDS_PACKAGE = {"tests/test_conventions.py": "mypy",
                 "tests/test_docs.py": "sphinx",
                 "tests/test_migrate.py": "libcst"}

# (name, passed, detail)
Check = Tuple[str, bool, str]

# The rows of `python -m tools.bench --quick` that the GPU targets name: a
# jitted step with one tap or call from a Python loop, a tap and a call per
# step of a scan, a 256 MiB tap and call round trip.
GPU_BENCH_ROWS = (
    r"^(jitted step with one (tap|call x\+1), per call from a Python loop"
    r"|tap f32 scalar, per step of a [0-9]+-step scan \(until drained\)"
    r"|call x\+1, per step of a [0-9]+-step scan"
    r"|large tap of 256 MiB \S+, until the host function ran"
    r"|large call round trip of 256 MiB \S+, identity(, copy=False)?)$")


def find_gpu() -> Tuple[Optional[str], str]:
  """The first CUDA device's description, or None and why not."""
  try:
    import jax  # pylint: disable=import-outside-toplevel
    devices = jax.devices("cuda")
  except Exception as error:  # pylint: disable=broad-except
    return None, f"{type(error).__name__}: {error}"
  if not devices:
    return None, "JAX lists no CUDA device"
  return f"{devices[0].device_kind} ({len(devices)} device(s))", ""


def run(name: str, command: List[str], timeout: float,
        env: Optional[dict] = None) -> Tuple[Check, str]:
  """Runs `command` in the repository root; passes when it exits 0. Also
  returns its standard output."""
  start = time.monotonic()
  try:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))
  except subprocess.TimeoutExpired as expired:  # its output is bytes
    return ((name, False, f"timed out after {timeout:.0f} s"),
            (expired.stdout or b"").decode(errors="replace"))
  tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
  detail = f"{time.monotonic() - start:.0f} s; " + " | ".join(tail)
  return (name, done.returncode == 0, detail), done.stdout


def show(check: Check) -> Check:
  """Prints `check`'s line as soon as it ended; returns it."""
  name, ok, detail = check
  print(f"{'PASS' if ok else 'FAIL'}  {name}  ({detail})", flush=True)
  return check


def suite_command(python: str, workers: int) -> List[str]:
  """pytest over the whole suite, in `workers` processes where pytest-xdist
  is installed (one otherwise), without the NEEDS_PACKAGE modules whose
  package is missing here."""
  command = [python, "-m", "pytest", "-v", "-rf", "--timeout", "120",
             "tests"]
  for path, package in NEEDS_PACKAGE.items():
    if importlib.util.find_spec(package) is None:
      print(f"gpu_check: {path} left out of the suite: {package} is not "
            "installed", flush=True)
      command.append(f"--ignore={path}")
  if workers > 1 and importlib.util.find_spec("xdist") is not None:
    command += ["-n", str(workers)]
  return command


def hardware_rows(programs: str) -> Tuple[List[str], str]:
  """The figures of `programs`/*.cu (../shared/gpu), built with nvcc; or
  why none."""
  nvcc = shutil.which("nvcc")
  if nvcc is None or not os.path.isdir(programs):
    return [], ("nvcc not found" if nvcc is None
                else f"{programs} not found")
  lines = []
  with tempfile.TemporaryDirectory() as build:
    for program, extra in (("tap_limit", []), ("tap_signal", ["-lcuda"])):
      binary = os.path.join(build, program)
      subprocess.run([nvcc, "-O2", "-o", binary,
                      os.path.join(programs, program + ".cu"), *extra],
                     check=True, capture_output=True, timeout=300)
      out = subprocess.run([binary], capture_output=True, text=True,
                           timeout=300).stdout
      lines += [line for line in out.splitlines() if line.strip()]
  return lines, ""


def report(gpu: str, checks: List[Check], rows: List[gpu_timings.Row],
           bench: str, blocked: str, hardware: List[str],
           hardware_note: str) -> str:
  lines = ["# host_callback GPU check", "",
           f"- GPU: {gpu}", f"- host: {platform.node()} "
           f"({platform.machine()}), Python {platform.python_version()}", "",
           "| check | result | detail |", "| --- | --- | --- |"]
  lines += [f"| {name} | {'PASS' if ok else 'FAIL'} | "
            f"{detail.replace('|', '/')} |" for name, ok, detail in checks]
  lines += ["", "Timings (`python -m tools.gpu_timings`):", "",
            "| row | value |", "| --- | --- |"]
  lines += [f"| {name} | {value:.3f} {unit} |" for name, value, unit in rows]
  lines += ["", "`python -m tools.bench --quick` (GPU_BENCH_ROWS):", "",
            bench.strip() or "(not run)"]
  lines += ["", "Another thread's JAX work while a host function blocks a "
            "launch (`python -m tools.gpu_compile_during_call`):", ""]
  lines += [f"    {line}" for line in blocked.splitlines()] or ["    (not run)"]
  lines += ["", "Hardware (../shared/gpu, CUDA C++, same machine):", ""]
  lines += [f"    {line}" for line in hardware] or [f"    ({hardware_note})"]
  return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--report", default="gpu_check_report.md")
  parser.add_argument("--skip-suite", action="store_true")
  parser.add_argument("--workers", type=int, default=1,
                      help="run the suite in this many processes")
  parser.add_argument("--suite-timeout", type=float, default=3600,
                      help="seconds the suite may take")
  parser.add_argument("--hardware", default=SHARED_GPU,
                      help="the folder of the CUDA programs tap_limit.cu and "
                           "tap_signal.cu")
  args = parser.parse_args(argv)
  # This process and the checks' share the GPU: none takes most of its
  # memory up front (JAX's default).
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  gpu, why = find_gpu()
  if gpu is None:
    message = ("gpu_check: no GPU: JAX has no CUDA backend here "
               f"({why}). Nothing was validated; run `python -m "
               "tools.gpu_check` on a machine with an NVIDIA GPU and "
               "jax[cuda12] (or cuda13) installed.")
    print(message)
    with open(args.report, "w", encoding="utf-8") as out:
      out.write(f"# host_callback GPU check\n\nNO GPU: {message}\n")
    return NO_GPU
  python = sys.executable
  checks: List[Check] = []

  rows: List[gpu_timings.Row] = []
  bench, blocked, hardware, note = "", "", [], "not run yet"

  def write_report() -> str:
    """The report so far (rewritten after each check, so that a run cut
    short leaves what it found)."""
    text = report(gpu, checks, rows, bench, blocked, hardware, note)
    with open(args.report, "w", encoding="utf-8") as out:
      out.write(text)
    return text

  def check(name, command, timeout, env=None) -> str:
    result, stdout = run(name, command, timeout, env)
    checks.append(show(result))
    write_report()
    return stdout

  check("CUDA runtime found", [python, "-c",
        "from host_callback.receiver import native_library as n; "
        "n.load_cuda_runtime()"], 120)
  check("GPU tests (tests/test_gpu.py, tests/test_persistent_cache.py)",
        [python, "-m", "pytest", "-q", "-rf", "--timeout", "120",
         "tests/test_gpu.py", "tests/test_persistent_cache.py"], 600)
  check("CUDA host side on the stand-in (tests/test_cuda_transport.py)",
        [python, "-m", "pytest", "-q", "tests/test_cuda_transport.py"],
        600, {"JAX_PLATFORMS": "cpu"})
  if not args.skip_suite:
    log = check("whole suite, GPU default backend",
                suite_command(python, args.workers), args.suite_timeout)
    with open(args.report + ".suite.log", "w", encoding="utf-8") as out:
      out.write(log)
  check("soak: 4 threads of taps for 45 s, nothing lost or reordered",
        [python, "-m", "tools.soak", "--seconds", "45", "--threads", "4",
         "--transport", "native"], 300)
  try:
    rows = [row for timings in (gpu_timings.scan_rows, gpu_timings.bar_rows,
                                gpu_timings.training_rows)
            for row in timings()]
    checks.append(show(("timing rows", True, f"{len(rows)} rows")))
  except Exception as error:  # pylint: disable=broad-except
    checks.append(show(("timing rows", False,
                        f"{type(error).__name__}: {error}")))
  bench = check("tools.bench GPU rows", [
      python, "-m", "tools.bench", "--quick", "--only", GPU_BENCH_ROWS], 900)
  blocked = check("compiling during a call (tools.gpu_compile_during_call)",
                  [python, "-m", "tools.gpu_compile_during_call", "--wait",
                   "20", "--at-a-time", "20"], 300)
  try:
    hardware, note = hardware_rows(args.hardware)
  except (subprocess.SubprocessError, OSError) as error:
    hardware, note = [], f"the CUDA programs failed: {error}"
    checks.append(show(("hardware rows (../shared/gpu)", False, note)))
  checks.extend(show(target)
                for target in gpu_targets.target_checks(rows, bench, hardware))
  print(write_report())
  print(f"gpu_check: report written to {args.report}")
  failed = [name for name, ok, _ in checks if not ok]
  if failed:
    print(f"gpu_check: FAIL ({len(failed)} of {len(checks)} checks)")
    return 1
  print(f"gpu_check: PASS ({len(checks)} checks)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
