"""Runs each script in examples/ in a subprocess and checks what it prints."""

import os
import pathlib
import re
import subprocess
import sys


EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
TIMEOUT_SECONDS = 120  # each example takes a few seconds; this is a hang guard


def run_example(name, transport, *args, devices=1):
  """Runs examples/`name` with `transport`; returns (stdout, stderr)."""
  env = dict(os.environ)
  env["JAX_HOST_CALLBACK_TRANSPORT"] = transport
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env.setdefault("JAX_PLATFORMS", "cpu")
  process = subprocess.run(
      [sys.executable, str(EXAMPLES / name), *args], env=env,
      capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
  assert process.returncode == 0, (
      f"{name} exited with {process.returncode}\n--- stdout:\n"
      f"{process.stdout}\n--- stderr:\n{process.stderr}")
  return process.stdout, process.stderr


def test_every_example_is_tested():
  tested = {"progress_bar.py", "pmap_progress.py", "csv_metrics.py",
            "scipy_call.py", "sharded_checkpoint.py", "nan_hunt.py"}
  assert {p.name for p in EXAMPLES.glob("*.py")} == tested


def test_examples_are_short():
  for path in EXAMPLES.glob("*.py"):
    assert len(path.read_text().splitlines()) < 60, path.name


def test_progress_bar(transport):
  stdout, stderr = run_example("progress_bar.py", transport)
  match = re.fullmatch(r"w=3\.000 b=0\.500 final loss=(\S+)\n", stdout)
  assert match and float(match.group(1)) < 1e-8, stdout
  # tqdm writes to stderr; the taps alone moved the bar to the end, and the
  # last tap (the last step's) set the loss shown.
  final = stderr.replace("\r", "\n").strip().splitlines()[-1]
  assert re.match(r"training: 100%.* 2000/2000 ", final), final
  assert final.endswith(f"loss={match.group(1)}]"), final


def test_pmap_progress(transport):
  stdout, stderr = run_example("pmap_progress.py", transport, devices=4)
  lines = stdout.strip().splitlines()
  assert [line.split(" loss=")[0] for line in lines] == [
      "cpu:0: w=1.000", "cpu:1: w=2.000", "cpu:2: w=3.000", "cpu:3: w=4.000"]
  for line in lines:  # each device reported its own, converged, final loss
    assert float(line.split(" loss=")[1]) < 1e-10, line
  bars = stderr.replace("\r", "\n")
  for device in range(4):
    assert re.search(rf"cpu:{device}: 100%.* 500/500 ", bars), device


def test_csv_metrics(transport, tmp_path):
  path = tmp_path / "metrics.csv"
  stdout, _ = run_example("csv_metrics.py", transport, str(path))
  assert stdout.splitlines()[0] == f"wrote 300 rows to {path}"
  assert stdout.splitlines()[-1] == "w = [ 1.  -2.   0.5]"
  rows = path.read_text().splitlines()
  assert rows[0] == "step,loss,grad_norm,w"
  assert rows[1] == "0,4.03648,3.52631,0"
  # One row per step, in the order the device ran them.
  assert [int(row.split(",")[0]) for row in rows[1:]] == list(range(300))
  losses = [float(row.split(",")[1]) for row in rows[1:]]
  assert losses == sorted(losses, reverse=True)


def test_scipy_call(transport):
  stdout, _ = run_example("scipy_call.py", transport)
  lines = stdout.strip().splitlines()
  difference = float(lines[0].removeprefix("max |grad - finite difference| = "))
  assert difference < 1e-7, lines[0]
  assert lines[1] == "first zero of Ai: -2.33810741 (tabulated: -2.33810741)"


def test_sharded_checkpoint(transport, tmp_path):
  stdout, _ = run_example("sharded_checkpoint.py", transport, str(tmp_path),
                          devices=4)
  assert stdout.splitlines() == [
      "step 2: 4 shard files, one per device",
      "reassembled w equals the device array: True"]
  assert sorted(p.name for p in tmp_path.glob("w_step0_*")) == [
      f"w_step0_rows{2 * i}-{2 * i + 2}.npy" for i in range(4)]


def test_nan_hunt(transport):
  stdout, stderr = run_example("nan_hunt.py", transport)
  assert stdout.splitlines() == [
      "result: w = nan",
      "first non-finite carry: scan[0], step 5 of 20",
      "  step 2: w = -329.478",
      "  step 3: w = 8.584e+07",
      "  step 4: w = -1.51803e+24",
      "  step 5: w = inf"]
  # The alert fired once, at the first non-finite step.
  assert stderr.count("[tap] FAIL") == 1
  assert "[tap] FAIL scan[0] 5/20: w = inf" in stderr
