"""The test suite as `tools.gpu.check` runs it on a GPU machine: which tests
it leaves out where a package of the [test] extra is missing, the pytest
commands, and what a (maybe cut) run's output says.
"""

from __future__ import annotations

import importlib
import os
import re
from typing import Callable, Dict, Iterable, List, Sequence, Set, Tuple

# The repository root, two folders above this file.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
TESTS = "tests"

# The tests that need a package of the [test] extra (its import name) and
# test no GPU path: left out where it is missing (an offline GPU machine
# may lack it), with a line that names it. A key is a module, or a test's
# node id, which pytest's --deselect takes as a prefix (of its
# parametrized ids too; tests/test_gpu_check.py checks that it names no
# other test).
NEEDS: Dict[str, Tuple[str, ...]] = {
    "tests/test_conventions.py::test_type_checkers_see_the_public_signatures":
        ("mypy",),
    "tests/test_docs.py::test_sphinx_build": ("sphinx", "myst_parser"),
    "tests/test_docs.py::test_codemod_example": ("libcst",),
    # The docs name host_callback.migrate, which imports libcst.
    "tests/test_docs.py::test_every_documented_import_path_resolves":
        ("libcst",),
    "tests/test_examples.py::test_progress_bar": ("tqdm",),
    "tests/test_examples.py::test_pmap_progress": ("tqdm",),
    "tests/test_examples.py::test_scipy_call": ("scipy",),
    "tests/test_migrate.py": ("libcst",),
    "tests/test_progress.py": ("tqdm",),
    # Through helpers.run_in_terminal, which plays a terminal with pyte.
    "tests/test_progress.py::test_pmap_bars_end_as_one_row_per_device_in_order":
        ("pyte",),
    "tests/test_progress.py::test_id_print_writes_above_an_open_bar":
        ("pyte",),
    "tests/test_progress.py::test_the_demo_reads_cleanly_in_a_terminal":
        ("pyte",),
    "tests/test_progress.py::test_bars_draw_alike_from_every_step": ("pyte",),
    "tests/test_progress.py::"
    "test_a_print_after_pmap_stays_intact_beside_drawing_bars": ("pyte",),
    "tests/test_progress.py::"
    "test_a_print_and_id_print_beside_bars_keep_their_own_lines": ("pyte",),
    "tests/test_properties.py": ("hypothesis",),
}

# The GPU tests, run as a step of their own before the suite: the native
# transport on the GPU, a persistent cache on it, and the CUDA part's host
# side on its stand-in.
GPU_TESTS = ("tests/test_gpu.py", "tests/test_gpu_buffers.py",
             "tests/test_persistent_cache.py", "tests/test_cuda_transport.py")
# The modules that failed on the last GPU run (docs/gpu.md): first in the
# suite, so that a run cut by its budget has run them.
FIRST = ("tests/test_never_breaks.py", "tests/test_compile_fuzz.py",
         "tests/test_lifetime.py", "tests/test_host_functions_one_at_a_time.py",
         "tests/test_compile_watch.py")
# A test's limit: the suite's own (setup.cfg); at 120 s the million taps
# ran past it on the H200 with 12 processes sharing the GPU.
PER_TEST_SECONDS = 300


def importable(package: str) -> bool:
  """Whether `package` imports here (found and not broken)."""
  try:
    importlib.import_module(package)
  except Exception:  # pylint: disable=broad-except  (any failure: missing)
    return False
  return True


def missing_packages(is_importable: Callable[[str], bool] = importable
                     ) -> Set[str]:
  """The packages NEEDS names that do not import here."""
  return {package for packages in NEEDS.values() for package in packages
          if not is_importable(package)}


def left_out(missing: Set[str]) -> List[Tuple[str, str]]:
  """(module or test, the missing packages it needs) of the tests that
  need one of `missing`."""
  return [(key, ", ".join(sorted(set(packages) & missing)))
          for key, packages in NEEDS.items() if set(packages) & missing]


def leave_out_lines(missing: Set[str]) -> List[str]:
  """One line per test left out, naming the package it lacks."""
  return [f"{key} left out: {packages} not installed"
          for key, packages in left_out(missing)]


def _leave_out_args(missing: Set[str]) -> List[str]:
  """pytest's arguments that leave out what `left_out` lists."""
  return [("--deselect=" if "::" in key else "--ignore=") + key
          for key, _ in left_out(missing)]


def pytest_command(python: str, paths: Sequence[str], workers: int,
                   missing: Set[str], ignore: Iterable[str] = (),
                   plugins: Callable[[str], bool] = importable) -> List[str]:
  """pytest over `paths`, each result on a line of its own, in `workers`
  processes where pytest-xdist is installed, a limit per test where
  pytest-timeout is, without the tests that need a `missing` package nor
  the modules `ignore` names."""
  command = [python, "-m", "pytest", "-v", "-rfE", "-p", "no:cacheprovider"]
  if plugins("pytest_timeout"):
    command += ["--timeout", str(PER_TEST_SECONDS)]
  if workers > 1 and plugins("xdist"):
    command += ["-n", str(workers)]
  return (command + _leave_out_args(missing)
          + [f"--ignore={path}" for path in ignore] + list(paths))


def _modules_left_out(missing: Set[str]) -> Set[str]:
  return {key for key, _ in left_out(missing) if "::" not in key}


def suite_paths(missing: Set[str]) -> List[str]:
  """The suite's paths: FIRST's modules (those not left out), then the
  rest (pytest collects each test once)."""
  return [path for path in FIRST
          if path not in _modules_left_out(missing)] + [TESTS]


def test_modules() -> List[str]:
  """Every test module of the suite, as a path from the root."""
  return sorted(f"{TESTS}/{name}" for name in os.listdir(
      os.path.join(ROOT, TESTS)) if re.fullmatch(r"test_\w+\.py", name))


def suite_modules(missing: Set[str]) -> List[str]:
  """The modules the suite runs: all but the GPU tests and those left
  out."""
  out = _modules_left_out(missing) | set(GPU_TESTS)
  return [module for module in test_modules() if module not in out]


# --- What a run's output says ------------------------------------------------

_NODE = re.compile(r"(tests/\w+\.py::\S+)")
_STATUS = re.compile(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_BAD = ("FAILED", "ERROR")


def results(output: str) -> Dict[str, str]:
  """Each test's outcome in pytest's -v output (with or without xdist):
  node id -> PASSED, FAILED, ERROR, SKIPPED, XFAIL or XPASS; a failure
  wins over a pass (a test whose teardown failed)."""
  found: Dict[str, str] = {}
  for line in output.splitlines():
    node, status = _NODE.search(line), _STATUS.search(line)
    if node and status and found.get(node.group(1)) not in _BAD:
      found[node.group(1)] = status.group(1)
  return found


def collected(output: str) -> int:
  """How many tests the run selected (0 if it did not say)."""
  for pattern in (r"/ (\d+) selected", r"workers? \[(\d+) items?\]",
                  r"collected (\d+) items?"):
    found = re.search(pattern, output)
    if found:
      return int(found.group(1))
  return 0


def summary(output: str, modules: Sequence[str], cut: bool) -> List[str]:
  """Lines that say what a run of `modules` did: counts, failures, and
  where it was `cut` by its budget, what it did not reach."""
  found = results(output)
  statuses = list(found.values())
  counts = ", ".join(f"{statuses.count(status)} {label}" for status, label in (
      ("PASSED", "passed"), ("SKIPPED", "skipped"), ("FAILED", "failed"),
      ("ERROR", "errors")))
  lines = [f"{len(found)} of {collected(output) or '?'} tests ran: {counts}"]
  lines += [f"{status}: {node}" for node, status in found.items()
            if status in _BAD]
  if cut:
    reached = {node.split("::")[0] for node in found}
    lines.append("cut by the budget; modules not reached: "
                 + (", ".join(m for m in modules if m not in reached)
                    or "none"))
  return lines
