"""What `tools.gpu.check` runs, in which order, and how long each step may
take within the run's budget. Pure data and arithmetic: nothing here runs.

The order puts what measures first, on a quiet machine, each timing case in
a fresh process (after a soak, a scan step on an H200 measured several
times slower, also in a fresh process started right after it): the CUDA
runtime, the hardware's figures, the timing rows, `tools.bench`'s GPU rows;
then the compile cases, the GPU tests, the suite (cut where the budget
ends) and a short soak last.

Each step has a cap. Its timeout is that cap, or less where the budget left,
less what the reserved steps after it keep and the report's time, is less;
a step left under MIN_STEP_SECONDS is cut. Reserved steps (the compile
cases and the soak) are thus always reached, whatever ran before them.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Dict, List, Optional, Sequence, Tuple

from . import suite
from .hardware import HERE as HARDWARE

BUDGET_SECONDS = 340.0   # the whole run, report included
SUITE_SECONDS = 90.0     # the suite's cap (it gets less where the budget ends)
REPORT_SECONDS = 10.0    # kept for the targets and the report
MIN_STEP_SECONDS = 5.0   # a step given less is cut
SOAK_SECONDS = 20
# The compile cases: each waits this long (--wait), all 32 at once (one
# batch, which ends within the wait and its slack).
COMPILE_WAIT_SECONDS = 12
COMPILE_AT_A_TIME = 32
# Where the hung compile cases' whole native stacks go (the report has
# them grouped).
COMPILE_STACKS = "gpu_compile_stacks"
# Where XLA's per-pass dumps of a refused compile go.
REFUSAL_DUMPS = "gpu_refusal_dumps"

# tools.bench's scenarios (by id) that the GPU targets name: a jitted step
# with one tap or call from a Python loop, a tap and a call per step of a
# scan, a 256 MiB tap and call round trip.
GPU_BENCH_ROWS = (r"^(step-(tap|call)|scan-(tap-drained|call)"
                  r"|large-tap-256mib|large-call-256mib(-nocopy)?)$")


@dataclasses.dataclass(frozen=True)
class Step:
  """One step: a command run in the repository root, and its check."""
  group: str               # what --only and --skip name
  name: str                # its check's name in the report
  command: Tuple[str, ...]
  cap: float               # the most seconds it may take
  estimate: float          # seconds it takes on an H200, 16 cores, 12
                           # workers (a guess where not measured yet)
  reserved: bool = False   # earlier steps leave it its cap
  measures: bool = False   # it times something: run on a quiet machine


@dataclasses.dataclass(frozen=True)
class Options:
  """What the command line chose."""
  python: str
  workers: int = 1
  suite_seconds: float = SUITE_SECONDS
  hardware: str = HARDWARE
  missing: frozenset = frozenset()   # packages of NEEDS not installed
  timing_cases: Tuple[str, ...] = ()


def _module(python: str, name: str, *args: str) -> Tuple[str, ...]:
  return (python, "-m", name, *args)


def _measuring_steps(options: Options) -> List[Step]:
  """The steps that time something, in their order."""
  python = options.python
  steps = [Step("hardware", "hardware figures (tools.gpu.hardware)",
                _module(python, "tools.gpu.hardware", "--programs",
                        options.hardware), 90, 12, measures=True)]
  steps += [Step("timings", f"timing case {case} (fresh process)",
                 _module(python, "tools.gpu.timings", "--case", case), 40, 8,
                 measures=True) for case in options.timing_cases]
  steps.append(Step("bench", "tools.bench GPU rows",
                    _module(python, "tools.bench", "--quick", "--only",
                            GPU_BENCH_ROWS), 120, 50, measures=True))
  return steps


def _test_steps(options: Options) -> List[Step]:
  """The GPU tests and the suite without them."""
  python, missing = options.python, set(options.missing)
  gpu_tests = suite.pytest_command(python, suite.GPU_TESTS,
                                   options.workers, missing)
  rest = suite.pytest_command(
      python, suite.suite_paths(missing), options.workers, missing,
      ignore=suite.GPU_TESTS)
  return [Step("gpu-tests", f"GPU tests ({', '.join(suite.GPU_TESTS)})",
               tuple(gpu_tests), 150, 25),
          # All of it took 219 s in 12 processes on an H200.
          Step("suite", "suite, GPU default backend", tuple(rest),
               options.suite_seconds, 220)]


def plan(options: Options) -> List[Step]:
  """Every step, in the order they run."""
  python = options.python
  runtime = Step("runtime", "CUDA runtime found", (
      python, "-c", "from host_callback.receiver import native_library as n; "
      "n.load_cuda_runtime()"), 60, 5)
  compile_cases = Step(
      "compile", "compiling during a call (tools.gpu.compile_during_call)",
      _module(python, "tools.gpu.compile_during_call", "--wait",
              str(COMPILE_WAIT_SECONDS), "--at-a-time",
              str(COMPILE_AT_A_TIME), "--stacks", COMPILE_STACKS), 75, 25,
      reserved=True)
  soak = Step("soak", f"soak: 4 threads of taps for {SOAK_SECONDS} s, "
              "nothing lost or reordered",
              _module(python, "tools.soak", "--seconds", str(SOAK_SECONDS),
                      "--threads", "4", "--transport", "native"), 40, 25,
              reserved=True)
  refusals = Step(
      "refusals", "a tap of a reduction of the returned product compiles "
      "(tools.gpu.compile_refusals)",
      _module(python, "tools.gpu.compile_refusals", "--dump",
              REFUSAL_DUMPS), 60, 20)
  return ([runtime] + _measuring_steps(options) + [compile_cases, refusals]
          + _test_steps(options) + [soak])


# Each group of steps, in their order, and what it runs.
GROUPS: Dict[str, str] = {
    "runtime": "the CUDA runtime's functions are found",
    "hardware": "the CUDA programs of tools/gpu/hardware",
    "timings": "tools.gpu.timings, each case in a fresh process",
    "bench": "tools.bench's rows that the targets name",
    "compile": "tools.gpu.compile_during_call",
    "refusals": "tools.gpu.compile_refusals",
    "gpu-tests": ", ".join(suite.GPU_TESTS),
    "suite": "the rest of the suite, cut at its cap",
    "soak": "tools.soak, 4 threads on the native transport"}


def select(steps: Sequence[Step], only: Optional[Sequence[str]] = None,
           skip: Sequence[str] = ()) -> List[Step]:
  """The steps of the groups `only` names (all if None), less `skip`'s."""
  return [step for step in steps
          if (only is None or step.group in only) and step.group not in skip]


def timeout_for(steps: Sequence[Step], index: int, left: float) -> float:
  """Seconds step `index` may take with `left` seconds of the budget left:
  its cap, less what the reserved steps after it and the report keep; 0
  where that is under MIN_STEP_SECONDS (the step is cut)."""
  kept = REPORT_SECONDS + sum(step.cap for step in steps[index + 1:]
                              if step.reserved)
  timeout = min(steps[index].cap, left - kept)
  return timeout if timeout >= MIN_STEP_SECONDS else 0.0


def timeline(steps: Sequence[Step], budget: float
             ) -> List[Tuple[float, float]]:
  """Each step's (start, timeout) where each takes its estimate, or its
  timeout where that is less."""
  out: List[Tuple[float, float]] = []
  start = 0.0
  for index, step in enumerate(steps):
    timeout = timeout_for(steps, index, budget - start)
    out.append((start, timeout))
    start += min(step.estimate, timeout)
  return out


def describe(steps: Sequence[Step], budget: float) -> List[str]:
  """The plan as lines: each step's cap, estimate, and its start and
  timeout where every step takes its estimate."""
  lines = [f"budget {budget:.0f} s, {REPORT_SECONDS:.0f} s of it kept for "
           "the report. A step's timeout is its cap, or less where the "
           "budget left (less the caps of the reserved steps after it) is "
           "less; a step left under "
           f"{MIN_STEP_SECONDS:.0f} s is cut. Estimates: an H200, 16 cores, "
           "--workers 12.",
           f"{'#':>2}  {'cap':>4}  {'est.':>4}  {'start':>5}  "
           f"{'timeout':>7}  step"]
  for number, (step, (start, timeout)) in enumerate(
      zip(steps, timeline(steps, budget)), 1):
    flags = (" [reserved]" if step.reserved else "") + (
        " [measures: waits for a quiet machine]" if step.measures else "")
    given = f"{timeout:.0f}" if timeout else "CUT"
    lines.append(f"{number:>2}  {step.cap:>4.0f}  {step.estimate:>4.0f}  "
                 f"{start:>5.0f}  {given:>7}  {step.name}{flags}")
    lines.append(f"{'':>30}$ {_shown(step.command)}")
  return lines


def _shown(command: Sequence[str]) -> str:
  """`command` as a shell line, with the interpreter's path shortened."""
  words = [os.path.basename(command[0]), *command[1:]]
  return " ".join(shlex.quote(word) for word in words)
