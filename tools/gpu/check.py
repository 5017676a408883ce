"""Validates host_callback's native CUDA transport on a GPU, in one command:

    python -m tools.gpu.check --workers 12     # writes gpu_check_report.md
    python -m tools.gpu.check --dry-run        # prints the plan; no GPU needed
    python -m tools.gpu.check --only gpu-tests,suite --suite-seconds 300
    python -m tools.gpu.check --skip suite --report PATH
    python -m tools.gpu.check --hardware DIR   # tap_limit.cu, tap_signal.cu
                                               # from DIR (tools/gpu/hardware)

On a GPU machine without network where JAX's CUDA plugin is installed:
`pip install --no-index --no-deps --no-build-isolation -e .`, then
`XLA_PYTHON_CLIENT_PREALLOCATE=false python -m tools.gpu.check --workers 12`
(`--workers` needs pytest-xdist). The whole run ends within
`--budget-seconds` (BUDGET_SECONDS of tools/gpu/plan.py), report included.

The steps (tools/gpu/plan.py, `--dry-run` prints them with their
timeouts): the CUDA runtime's functions are found; then, each on a quiet
machine (checked: its CPUs and GPU idle) and in a fresh process, the
hardware's own figures (tools/gpu/hardware, built with nvcc), each case of
tools/gpu/timings.py, `tools.bench`'s GPU rows; then whether JAX can
compile while a host function blocks a launch
(tools/gpu/compile_during_call.py); the GPU tests; the rest of the suite
with the GPU as the default backend, cut where its time ends; a short soak
of 4 threads of taps last. Tests that need a package of the [test] extra
that is missing here are left out, with a line that names it
(tools/gpu/suite.py). Finally the speed targets of docs/gpu.md are judged
from the figures (tools/gpu/targets.py).

Each check is printed as it ends, and the report (rewritten after each
step, so that a run cut short leaves what it found) says PASS, FAIL or CUT
(the budget ended it) for each; the tests' output goes to the report's path
+ ".suite.log". Needs no network. Exits 0 when every check passed, 1 when
one failed, 3 when none failed but the budget cut some, and 2 with a "no
GPU" message where JAX has no CUDA backend (nothing validated). Its run
on an H200 of 2026-11-30 set `transport_policy.CUDA_NATIVE_VALIDATED` to
True (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from . import hardware, plan, suite, targets, timings

ROOT = suite.ROOT
NO_GPU, INCOMPLETE = 2, 3
GRACE_SECONDS = 5.0        # from Ctrl-C to a kill, within a step's timeout
QUIET_WAIT_SECONDS = 20.0  # the most a measuring step waits for quiet
QUIET_CPU, QUIET_GPU = 0.10, 10.0  # busy fraction of all CPUs; GPU %

Check = targets.Check  # (name, passed, detail)


@dataclasses.dataclass
class Outcome:
  """How a step's command ended."""
  returncode: Optional[int]   # None: it ran past its timeout
  stdout: str
  stderr: str
  seconds: float


@dataclasses.dataclass
class Findings:
  """What the run found so far: the report's contents."""
  gpu: str
  budget: float
  checks: List[Check] = dataclasses.field(default_factory=list)
  cut: Set[str] = dataclasses.field(default_factory=set)  # checks' names
  rows: List[timings.Row] = dataclasses.field(default_factory=list)
  bench: str = ""
  blocked: str = ""
  refusals: str = ""
  hardware: List[str] = dataclasses.field(default_factory=list)
  hardware_note: str = "not run"
  tests: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
  left_out: List[str] = dataclasses.field(default_factory=list)
  noisy: List[str] = dataclasses.field(default_factory=list)
  quiet_seen: List[str] = dataclasses.field(default_factory=list)


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


# --- Running a step ----------------------------------------------------------

def run_command(command: Sequence[str], timeout: float) -> Outcome:
  """Runs `command` in the repository root, in a process group of its own;
  past `timeout` seconds the whole group gets a Ctrl-C, then, GRACE_SECONDS
  later, a kill (so no child of it stays behind on the GPU)."""
  start = time.monotonic()
  process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
  try:
    out, err = process.communicate(timeout=max(1.0, timeout - GRACE_SECONDS))
    return Outcome(process.returncode, out, err, time.monotonic() - start)
  except subprocess.TimeoutExpired:
    pass
  out, err = "", ""
  for sent in (signal.SIGINT, signal.SIGKILL):
    try:
      os.killpg(process.pid, sent)
      out, err = process.communicate(timeout=GRACE_SECONDS)
      break
    except ProcessLookupError:  # the group ended meanwhile
      out, err = process.communicate(timeout=GRACE_SECONDS)
      break
    except subprocess.TimeoutExpired:
      continue
  return Outcome(None, out or "", err or "", time.monotonic() - start)


def cpu_busy(sample: float = 0.5) -> Optional[float]:
  """The fraction of all CPUs' time spent busy over `sample` seconds
  (/proc/stat); None where that cannot be read."""
  def times() -> Tuple[int, int]:
    with open("/proc/stat", encoding="ascii") as stat:
      fields = [int(word) for word in stat.readline().split()[1:]]
    return sum(fields), fields[3] + fields[4]  # all; idle and iowait
  try:
    total, idle = times()
    time.sleep(sample)
    total2, idle2 = times()
  except (OSError, ValueError, IndexError):
    return None
  return 1 - (idle2 - idle) / max(1, total2 - total)


def gpu_busy() -> Optional[float]:
  """The first GPU's utilization in percent (nvidia-smi); None where it
  cannot be read."""
  smi = shutil.which("nvidia-smi")
  if smi is None:
    return None
  try:
    out = subprocess.run([smi, "--query-gpu=utilization.gpu",
                          "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=10).stdout
    return float(out.split()[0])
  except (subprocess.SubprocessError, OSError, ValueError, IndexError):
    return None


def wait_until_quiet(limit: float) -> Tuple[bool, str]:
  """Waits up to `limit` seconds for the CPUs and the GPU to be idle;
  returns whether they were, and the figures last read."""
  deadline = time.monotonic() + limit
  while True:
    cpu, gpu = cpu_busy(), gpu_busy()
    quiet = ((cpu is None or cpu <= QUIET_CPU)
             and (gpu is None or gpu <= QUIET_GPU))
    figures = (f"CPUs {'?' if cpu is None else f'{100 * cpu:.0f}%'} busy, "
               f"GPU {'?' if gpu is None else f'{gpu:.0f}%'}")
    if quiet or time.monotonic() >= deadline:
      return quiet, figures
    time.sleep(1)


# --- What each step's outcome means ------------------------------------------

def _detail(outcome: Outcome, timeout: float) -> str:
  """A check's detail: how long, how it ended, its output's last lines."""
  if outcome.returncode is None:
    head = f"ran past its {timeout:.0f} s"
  else:
    head = f"{outcome.seconds:.0f} s, exit {outcome.returncode}"
  tail = (outcome.stdout + outcome.stderr).strip().splitlines()[-3:]
  return "; ".join([head] + ([" | ".join(tail)] if tail else []))


def _record_hardware(findings: Findings, outcome: Outcome) -> bool:
  findings.hardware = [line for line in outcome.stdout.splitlines()
                       if line.strip()]
  findings.hardware_note = (outcome.stderr.strip().splitlines() or
                            ["no output"])[-1]
  return outcome.returncode == 0


def _record_timings(findings: Findings, outcome: Outcome) -> bool:
  rows = [row for row in map(timings.parse_row,
                         outcome.stdout.splitlines()) if row]
  findings.rows += rows
  return outcome.returncode == 0 and bool(rows)


def _record_bench(findings: Findings, outcome: Outcome) -> bool:
  findings.bench = outcome.stdout
  return outcome.returncode == 0


def _record_compile(findings: Findings, outcome: Outcome) -> bool:
  findings.blocked = outcome.stdout
  return outcome.returncode == 0


def _record_refusals(findings: Findings, outcome: Outcome) -> bool:
  """Passes where every tap of ours compiled as users' do (the lines "no
  retry" are XLA's own answer, with the package's compile retry off)."""
  findings.refusals = outcome.stdout
  return outcome.returncode == 0 and not any(
      ", tap " in line and "refused" in line
      for line in outcome.stdout.splitlines()
      if ", with {" not in line and "no retry" not in line)


# What each measuring step's or the compile cases' output means: their
# check passed or not, and what they found.
RECORDERS: Dict[str, Callable[[Findings, Outcome], bool]] = {
    "hardware": _record_hardware, "timings": _record_timings,
    "bench": _record_bench, "compile": _record_compile,
    "refusals": _record_refusals}
TEST_GROUPS = ("gpu-tests", "suite")


def _all_quiet(seen: List[str]) -> str:
  return (f"all {len(seen)} started on a quiet machine"
          + (f" (the last: {seen[-1]})" if seen else ""))


class Runner:
  """Runs the plan's steps within the budget, recording each step's check
  and findings, and rewriting the report after each."""

  def __init__(self, findings: Findings, report_path: str,
               missing: Set[str], deadline: float) -> None:
    """`missing`: the packages whose tests the plan left out; `deadline`:
    time.monotonic()'s when the budget ends."""
    self.findings = findings
    self.report_path = report_path
    self.missing = missing
    self.deadline = deadline

  def run(self, steps: Sequence[plan.Step]) -> None:
    """Runs `steps` in order, each with the timeout the budget gives it."""
    for index, step in enumerate(steps):
      left = self.deadline - time.monotonic()
      timeout = plan.timeout_for(steps, index, left)
      if not timeout:
        self.add((step.name, False, f"cut by the budget: {left:.0f} s "
                   "left, kept for the reserved steps and the report"),
                  cut=True)
        continue
      if step.measures:
        timeout -= self._wait_until_quiet(step, timeout)
      self._record(step, run_command(step.command, timeout), timeout)
    if any(step.measures for step in steps):
      self.add(("machine quiet before each measurement",
                 not self.findings.noisy,
                 "; ".join(self.findings.noisy) or _all_quiet(
                     self.findings.quiet_seen)))

  def _wait_until_quiet(self, step: plan.Step, timeout: float) -> float:
    """Waits for a quiet machine before `step`; returns the seconds
    waited."""
    start = time.monotonic()
    quiet, figures = wait_until_quiet(min(QUIET_WAIT_SECONDS, timeout / 3))
    waited = time.monotonic() - start
    if quiet:
      self.findings.quiet_seen.append(figures)
    else:
      self.findings.noisy.append(f"{step.name}: {figures} after {waited:.0f} s")
    return waited

  def _record(self, step: plan.Step, outcome: Outcome,
              timeout: float) -> None:
    if step.group in TEST_GROUPS:
      passed = self._record_tests(step, outcome)
    else:
      recorder = RECORDERS.get(step.group)
      passed = (recorder(self.findings, outcome) if recorder
                else outcome.returncode == 0)
    # Past a timeout under its cap, or past the suite's cap (a budget, not
    # a hang limit), a step was cut; past its own cap, it failed.
    cut = outcome.returncode is None and (
        timeout < step.cap or step.group == "suite")
    failures = any(line.startswith(("FAILED", "ERROR"))
                   for line in self.findings.tests.get(step.name, []))
    self.add((step.name, passed, _detail(outcome, timeout)),
              cut=cut and not failures)

  def _record_tests(self, step: plan.Step, outcome: Outcome) -> bool:
    with open(self.report_path + ".suite.log", "a", encoding="utf-8") as log:
      log.write(f"$ {' '.join(step.command)}\n{outcome.stdout}\n"
                f"{outcome.stderr}\n")
    modules = (list(suite.GPU_TESTS) if step.group == "gpu-tests"
               else suite.suite_modules(self.missing))
    self.findings.tests[step.name] = suite.summary(
        outcome.stdout, modules, cut=outcome.returncode is None)
    return outcome.returncode == 0

  def add(self, check: Check, cut: bool = False) -> None:
    """Records `check` (`cut`: the budget ended it), prints its line and
    rewrites the report."""
    if cut:
      self.findings.cut.add(check[0])
    self.findings.checks.append(check)
    print(f"{status(self.findings, check)}  {check[0]}  ({check[2]})",
          flush=True)
    write_report(self.findings, self.report_path)


# --- The report --------------------------------------------------------------

def status(findings: Findings, check: Check) -> str:
  """PASS, FAIL or CUT."""
  name, ok, _ = check
  return "PASS" if ok else "CUT" if name in findings.cut else "FAIL"


def report(findings: Findings) -> str:
  """The report, in markdown."""
  lines = ["# host_callback GPU check", "",
           f"- GPU: {findings.gpu}", f"- host: {platform.node()} "
           f"({platform.machine()}, {os.cpu_count()} cores), Python "
           f"{platform.python_version()}",
           f"- budget: {findings.budget:.0f} s; cut by it: "
           + (", ".join(sorted(findings.cut)) or "nothing"), "",
           "| check | result | detail |", "| --- | --- | --- |"]
  lines += [f"| {check[0]} | {status(findings, check)} | "
            f"{check[2].replace('|', '/')} |" for check in findings.checks]
  lines += ["", "Left out of the tests (a package is missing):", ""]
  lines += [f"- {line}" for line in findings.left_out] or ["- nothing"]
  for name, summary in findings.tests.items():
    lines += ["", f"{name}:", ""] + [f"- {line}" for line in summary]
  lines += ["", "Timings (`python -m tools.gpu.timings`, each case in a "
            "fresh process):", "", "| row | value |", "| --- | --- |"]
  lines += [f"| {name} | {value:.3f} {unit} |"
            for name, value, unit in findings.rows]
  lines += ["", "`python -m tools.bench --quick` (GPU_BENCH_ROWS):", "",
            findings.bench.strip() or "(not run)"]
  lines += ["", "Another thread's JAX work while a host function blocks a "
            "launch (`python -m tools.gpu.compile_during_call`):", ""]
  lines += ([f"    {line}" for line in findings.blocked.splitlines()]
            or ["    (not run)"])
  lines += ["", "A tap of a reduction of the returned product "
            "(`python -m tools.gpu.compile_refusals`):", ""]
  lines += ([f"    {line}" for line in findings.refusals.splitlines()]
            or ["    (not run)"])
  lines += ["", "Hardware (tools/gpu/hardware, CUDA C++, same machine):", ""]
  lines += ([f"    {line}" for line in findings.hardware]
            or [f"    ({findings.hardware_note})"])
  return "\n".join(lines) + "\n"


def write_report(findings: Findings, path: str) -> None:
  with open(path, "w", encoding="utf-8") as out:
    out.write(report(findings))


# --- The command line --------------------------------------------------------

def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      epilog="groups: " + "; ".join(f"{group}: {what}" for group, what
                                    in plan.GROUPS.items()))
  parser.add_argument("--report", default="gpu_check_report.md")
  parser.add_argument("--workers", type=int, default=1,
                      help="run the tests in this many processes")
  parser.add_argument("--budget-seconds", type=float,
                      default=plan.BUDGET_SECONDS,
                      help="the whole run's time, report included")
  parser.add_argument("--suite-seconds", type=float,
                      default=plan.SUITE_SECONDS,
                      help="the most the suite may take (less where the "
                           "budget ends first)")
  parser.add_argument("--hardware", default=hardware.HERE,
                      help="the folder of the CUDA programs tap_limit.cu "
                           "and tap_signal.cu")
  parser.add_argument("--only", type=_groups,
                      help="only these groups, comma-separated")
  parser.add_argument("--skip", type=_groups, default=[],
                      help="not these groups, comma-separated")
  parser.add_argument("--dry-run", action="store_true",
                      help="print the plan and exit; needs no GPU")
  return parser.parse_args(argv)


def _groups(text: str) -> List[str]:
  groups = [group for group in text.split(",") if group]
  unknown = set(groups) - set(plan.GROUPS)
  if unknown:
    raise argparse.ArgumentTypeError(
        f"unknown group(s) {', '.join(sorted(unknown))}; the groups are "
        f"{', '.join(plan.GROUPS)}")
  return groups


def steps_of(args: argparse.Namespace, missing: Set[str]
             ) -> List[plan.Step]:
  """The plan's steps that `args` selects."""
  options = plan.Options(
      python=sys.executable, workers=args.workers,
      suite_seconds=args.suite_seconds, hardware=args.hardware,
      missing=frozenset(missing), timing_cases=tuple(timings.CASES))
  return plan.select(plan.plan(options), args.only, args.skip)


def no_gpu(why: str, report_path: str) -> int:
  """Says that nothing was validated; returns NO_GPU."""
  message = ("gpu_check: no GPU: JAX has no CUDA backend here "
             f"({why}). Nothing was validated; run `python -m "
             "tools.gpu.check` on a machine with an NVIDIA GPU and "
             "jax[cuda12] (or cuda13) installed.")
  print(message)
  with open(report_path, "w", encoding="utf-8") as out:
    out.write(f"# host_callback GPU check\n\nNO GPU: {message}\n")
  return NO_GPU


def main(argv: Optional[Sequence[str]] = None) -> int:
  started = time.monotonic()
  args = parse_args(argv)
  missing = suite.missing_packages()
  left_out = suite.leave_out_lines(missing)
  steps = steps_of(args, missing)
  for line in left_out:
    print(f"gpu_check: {line}", flush=True)
  if args.dry_run:
    print("\n".join(plan.describe(steps, args.budget_seconds)))
    return 0
  # This process and the checks' share the GPU: none takes most of its
  # memory up front (JAX's default).
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  gpu, why = find_gpu()
  if gpu is None:
    return no_gpu(why, args.report)
  if os.path.exists(args.report + ".suite.log"):
    os.remove(args.report + ".suite.log")
  findings = Findings(gpu=gpu, budget=args.budget_seconds,
                      left_out=left_out)
  runner = Runner(findings, args.report, missing,
                  started + args.budget_seconds)
  runner.run(steps)
  if any(step.measures for step in steps):
    for target in targets.target_checks(findings.rows, findings.bench,
                                        findings.hardware):
      runner.add(target)
  print(report(findings))
  print(f"gpu_check: report written to {args.report}")
  return verdict(findings)


def verdict(findings: Findings) -> int:
  """The exit status: 0 all passed, 1 one failed, INCOMPLETE none failed
  but some were cut."""
  statuses = [status(findings, check) for check in findings.checks]
  failed, cut = statuses.count("FAIL"), statuses.count("CUT")
  if failed:
    print(f"gpu_check: FAIL ({failed} of {len(statuses)} checks; {cut} cut)")
    return 1
  if cut:
    print(f"gpu_check: INCOMPLETE ({cut} of {len(statuses)} checks cut by "
          "the budget, none failed)")
    return INCOMPLETE
  print(f"gpu_check: PASS ({len(statuses)} checks)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
