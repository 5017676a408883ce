"""host_callback.tqdm: jax-tqdm's interface, and the bars beyond it, as a
recording tqdm class sees them (it replaces `tqdm.auto.tqdm`, where the
module takes its bars from), in both modes."""

from __future__ import annotations

import io
import re
import threading
from typing import Any, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tqdm.auto
import tqdm.notebook
import tqdm.std

import host_callback as hcb
from host_callback.primitive import lowering, lowering_native
from host_callback.host import native_handlers, transport_policy
from host_callback.receiver import transport_native
from host_callback.tqdm import PBar, loop_tqdm, scan_tqdm, while_tqdm
from helpers import (OUTFEED, barrier_report, cpu_devices,
                     fails_when_synchronous, run_in_terminal, run_python,
                     synchronous)

pytestmark = pytest.mark.usefixtures("both_modes")

DESC = "Running for {:,} iterations"


class Log:
  """The bars made, and every event of theirs (and of the test's own taps)
  in order: (bar number, event) with events ("update", k), ("reset",
  total), ("close",); the test's own are (None, what)."""

  def __init__(self) -> None:
    self.lock = threading.Lock()
    self.bars: List[Any] = []
    self.events: List[Tuple[Any, Any]] = []

  def add(self, bar: Any, event: Any) -> None:
    with self.lock:
      number = None if bar is None else next(  # tqdm's == compares rows
          i for i, made in enumerate(self.bars) if made is bar)
      self.events.append((number, event))

  def of(self, number: int) -> List[Any]:
    """The events of bar `number`."""
    return [event for bar, event in self.events if bar == number]

  def made(self) -> List[Tuple[str, Any, int]]:
    """(desc, total, position) of each bar made, in order."""
    return [(bar.desc, bar.total, bar.position) for bar in self.bars]


@pytest.fixture
def log(monkeypatch):
  record = Log()

  class RecordingTqdm(tqdm.std.tqdm):
    def __init__(self, *args, position=None, **kwargs):
      kwargs.setdefault("file", io.StringIO())
      with record.lock:
        record.bars.append(self)
      self.position = position
      super().__init__(*args, position=position, **kwargs)

    def update(self, n=1):
      record.add(self, ("update", n))
      return super().update(n)

    def reset(self, total=None):
      record.add(self, ("reset", total))
      return super().reset(total)

    def close(self):
      if not self.disable:
        record.add(self, ("close",))
      return super().close()

  monkeypatch.setattr(tqdm.auto, "tqdm", RecordingTqdm)
  monkeypatch.setattr(tqdm.std, "tqdm", RecordingTqdm)
  return record


def updates(rate: int, n: int) -> List[Any]:
  """jax-tqdm's events of a bar of `n` steps moved every `rate` steps."""
  moves = [("update", rate)] * ((n - 1) // rate)
  return moves + [("update", n - rate * len(moves)), ("close",)]


def scan(step, n, carry=0):
  return jax.jit(lambda c: jax.lax.scan(step, c, jnp.arange(n)))(carry)


def test_scan_moves_the_bar_as_jax_tqdm_does(log):
  @scan_tqdm(100, print_rate=10)
  def step(carry, i):
    return carry + i, 2 * i

  total, ys = scan(step, 100)
  hcb.barrier_wait()
  assert int(total) == 4950 and ys.tolist() == list(range(0, 200, 2))
  assert log.made() == [(DESC.format(100), 100, 0)]
  assert log.of(0) == updates(10, 100)
  assert log.bars[0].n == 100


@pytest.mark.parametrize("n, rate", [(100, None), (7, 3), (20, 1), (1, None)])
def test_print_rate_as_jax_tqdm(log, n, rate):
  @scan_tqdm(n, print_rate=rate)
  def step(carry, x):
    i, data = x  # a tuple whose first element is the iteration number
    return carry + data, None

  total, _ = jax.jit(lambda: jax.lax.scan(
      step, 0.0, (jnp.arange(n), jnp.ones(n))))()
  hcb.barrier_wait()
  assert float(total) == n
  expected_rate = {None: max(n // 20, 1)}.get(rate, rate)
  assert log.of(0) == updates(expected_rate, n)


def test_fori_loop_with_tqdm_arguments(log):
  @loop_tqdm(30, print_rate=7, tqdm_type="std", desc="fitting", position=2,
             leave=False, total=5, miniters=3)
  def body(i, val):
    return val + i

  assert int(jax.jit(lambda: jax.lax.fori_loop(0, 30, body, 0))()) == 435
  hcb.barrier_wait()
  assert log.made() == [("fitting", 30, 2)]
  assert log.bars[0].leave is False
  assert log.of(0) == updates(7, 30)


def test_arguments_are_checked_as_jax_tqdm_does():
  with pytest.raises(ValueError, match='tqdm_type should be one of "auto", '
                     '"std", or "notebook" but got "rich"'):
    scan_tqdm(10, tqdm_type="rich")
  with pytest.raises(ValueError, match="Print rate should be > 0 got 0"):
    loop_tqdm(10, print_rate=0)
  with pytest.raises(ValueError, match="Print rate should be less than the "
                     "number of steps 10, got 11"):
    scan_tqdm(10, print_rate=11)


def test_notebook_bar_without_ipywidgets_fails_when_decorating():
  if tqdm.notebook.IProgress is not None:
    pytest.skip("ipywidgets is installed: the notebook bar works")
  with pytest.raises(ImportError, match=r'tqdm_type="notebook" needs '
                     r"ipywidgets \(IProgress not found"):
    scan_tqdm(10, tqdm_type="notebook")


def test_bar_moves_while_the_loop_runs(log):
  @scan_tqdm(6, print_rate=2)
  def step(carry, i):
    hcb.id_tap(lambda i, _: log.add(None, int(i)), i)
    return carry, None

  scan(step, 6)
  hcb.barrier_wait()
  # The bar counts the steps completed: after step 1 it has moved to 2
  # (every 2 steps); it closes after the last step.
  assert log.events == [
      (None, 0), (None, 1), (0, ("update", 2)), (None, 2), (None, 3),
      (0, ("update", 2)), (None, 4), (None, 5), (0, ("update", 2)),
      (0, ("close",))]


def test_every_step_in_the_synchronous_mode_moves_the_bar(log):
  seen = []

  @scan_tqdm(50, print_rate=1)
  def step(carry, i):
    hcb.id_tap(lambda i, _: seen.append(log.bars[0].n if log.bars else None),
               i)
    return carry, None

  scan(step, 50)
  hcb.barrier_wait()
  assert seen == [None, *range(1, 50)]  # it opens after step 0, at 1
  assert log.of(0) == updates(1, 50)


def test_a_loop_run_twice_gets_a_fresh_bar_each_time(log):
  @scan_tqdm(10, print_rate=5)
  def step(carry, i):
    return carry + 1, None

  scan(step, 10)
  scan(step, 10)
  hcb.barrier_wait()
  assert len(log.bars) == 2
  assert log.of(0) == log.of(1) == updates(5, 10)
  assert [bar for bar, event in log.events if event == ("close",)] == [0, 1]


def test_a_failed_loop_closes_its_bar_and_a_rerun_opens_a_fresh_one(log):
  fail = [True]

  def fails_at_step_5(i, transforms):
    if i == 5 and fail[0]:
      raise ValueError("step 5 failed")

  @scan_tqdm(10, print_rate=1)
  def step(carry, i):
    hcb.id_tap(fails_at_step_5, i)
    return carry, None

  with fails_when_synchronous("step 5 failed"):
    jax.block_until_ready(scan(step, 10))
  error = barrier_report()
  assert error is None or "step 5 failed" in str(error)
  # Synchronous: the computation stopped in step 5, and the bar shows the
  # 5 steps before it. The outfeed mode does not wait for taps: the loop
  # ran on.
  if synchronous():
    assert log.of(0) == [("update", 1)] * 5 + [("close",)]
  else:
    assert log.of(0) == updates(1, 10)
  fail[0] = False
  scan(step, 10)
  hcb.barrier_wait()
  assert len(log.bars) == 2 and log.of(1) == updates(1, 10)


def test_a_failed_call_closes_the_bar_in_both_modes(log):
  def host(i):
    if i == 3:
      raise ValueError("no host result at step 3")
    return i

  @scan_tqdm(8, print_rate=1)
  def step(carry, i):
    return carry + hcb.call(host, i, result_shape=i), None

  with pytest.raises(jax.errors.JaxRuntimeError, match="no host result"):
    jax.block_until_ready(scan(step, 8))
  if synchronous():
    hcb.barrier_wait()
  else:  # the outfeed mode raises a call's error at the barrier too
    with pytest.raises(hcb.CallbackException, match="no host result"):
      hcb.barrier_wait()
  assert log.of(0) == [("update", 1)] * 3 + [("close",)]  # steps 0 to 2


def _device_descs(n: int, total: int) -> List[Tuple[str, int, int]]:
  return [(f"cpu:{k}: {DESC.format(total)}", total, k) for k in range(n)]


def test_pmap_draws_a_bar_per_device_on_its_own_row(log):
  cpu_devices(4)

  @scan_tqdm(12, print_rate=4)
  def step(carry, i):
    return carry + i, None

  out = jax.pmap(lambda c: jax.lax.scan(step, c, jnp.arange(12))[0],
                 devices=cpu_devices(4))(jnp.arange(4))
  hcb.barrier_wait()
  assert out.tolist() == [66, 67, 68, 69]
  # Made in device order, whichever device began first: the first makes
  # them all (a notebook shows its widgets in the order they were made).
  assert log.made() == _device_descs(4, 12)
  for number in range(4):
    assert log.of(number) == updates(4, 12)


def test_pmap_with_one_bar_for_all_devices(log):
  @scan_tqdm(12, print_rate=4, per_device=False)
  def step(carry, i):
    return carry + i, None

  jax.pmap(lambda c: jax.lax.scan(step, c, jnp.arange(12))[0],
           devices=cpu_devices(4))(jnp.arange(4))
  hcb.barrier_wait()
  assert log.made() == [(DESC.format(12), 12, 0)]
  # The bar shows the slowest device's steps, and closes after the last.
  assert log.of(0)[-2:] == [("update", 4), ("close",)]
  assert log.bars[0].n == 12


def test_shard_map_per_device_and_sharded_jit_one_bar(log):
  from jax.sharding import NamedSharding, PartitionSpec as P
  mesh = jax.sharding.Mesh(np.array(cpu_devices(4)), ("x",))
  x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("x")))

  @scan_tqdm(6, print_rate=3)
  def step(carry, i):
    return carry + 1.0, None

  def run(block):
    return jax.lax.scan(step, block, jnp.arange(6))[0]

  out = jax.jit(jax.shard_map(run, mesh=mesh, in_specs=P("x"),
                              out_specs=P("x")))(x)
  hcb.barrier_wait()
  assert out.tolist() == [float(v) + 6 for v in range(8)]
  assert log.made()[:4] == _device_descs(4, 6)
  assert [log.of(k) for k in range(4)] == [updates(3, 6)] * 4
  jax.jit(run)(x)  # sharded jit: one program, one bar
  hcb.barrier_wait()
  assert log.made()[4:] == [(DESC.format(6), 6, 0)]
  assert log.of(4) == updates(3, 6)


def test_vmap_draws_one_bar_for_the_batch(log):
  @scan_tqdm(10, print_rate=5)
  def step(carry, i):
    return carry + i, None

  out = jax.jit(jax.vmap(lambda c: jax.lax.scan(step, c, jnp.arange(10))[0]))(
      jnp.arange(3))
  hcb.barrier_wait()
  assert out.tolist() == [45, 46, 47]
  assert log.made() == [(DESC.format(10), 10, 0)]
  assert log.of(0) == updates(5, 10)


def test_vmap_with_pbar_ids_as_jax_tqdm(log):
  @scan_tqdm(10, print_rate=5)
  def step(carry, i):
    return carry + i, None

  def run(bar_id):
    return jax.lax.scan(step, PBar(id=bar_id, carry=0), jnp.arange(10))[0]

  out = jax.jit(jax.vmap(run))(jnp.arange(3))
  hcb.barrier_wait()
  assert isinstance(out, PBar) and out.id.tolist() == [0, 1, 2]
  assert out.carry.tolist() == [45, 45, 45]
  assert log.made() == [(DESC.format(10), 10, k) for k in range(3)]
  assert [log.of(k) for k in range(3)] == [updates(5, 10)] * 3


def test_a_pbar_over_float_steps_counts_in_ints(log):
  """jax-tqdm's `1000/1000`, not `1000.0/1000`, for float steps."""
  @scan_tqdm(1000, print_rate=500)
  def step(carry, x):
    return carry + x, None

  out = jax.jit(lambda: jax.lax.scan(
      step, PBar(id=0, carry=0.0), jnp.arange(1000, dtype=jnp.float32))[0])()
  hcb.barrier_wait()
  assert float(out.carry) == 499500.0
  steps = [event[1] for event in log.of(0) if event[0] == "update"]
  assert steps == [500, 500] and all(type(n) is int for n in steps)
  assert "1000/1000" in str(log.bars[0])


def test_while_loop_counts_its_iterations(log):
  with_total = while_tqdm(total=40, print_rate=8, desc="solve")
  without_total = while_tqdm()
  assert int(jax.jit(lambda: with_total(
      lambda c: c < 37, lambda c: c + 1, 0))()) == 37
  assert int(jax.jit(lambda: without_total(
      lambda c: c < 5, lambda c: c + 1, 0))()) == 5
  hcb.barrier_wait()
  assert log.made() == [("solve", 40, 0), ("Running", None, 0)]
  assert log.of(0) == [("update", 8)] * 4 + [("update", 5), ("close",)]
  assert log.of(1) == [("update", 1)] * 5 + [("close",)]
  assert log.bars[0].n == 37 and log.bars[1].n == 5


def test_while_loop_under_vmap_shows_the_longest(log):
  loop = while_tqdm(total=10)
  out = jax.jit(jax.vmap(lambda limit: loop(
      lambda c: c < limit, lambda c: c + 1, 0)))(jnp.array([3, 7, 5]))
  hcb.barrier_wait()
  assert out.tolist() == [3, 7, 5]
  assert log.made() == [(DESC.format(10), 10, 0)]
  assert log.of(0) == [("update", 1)] * 7 + [("close",)]


def test_nested_loops_reuse_the_inner_bar(log):
  @scan_tqdm(4, print_rate=2)
  def inner(carry, j):
    return carry + 1, None

  @scan_tqdm(3, print_rate=1, desc="epochs")
  def outer(carry, i):
    return jax.lax.scan(inner, carry, jnp.arange(4))[0], None

  assert int(scan(outer, 3)[0]) == 12
  hcb.barrier_wait()
  # The inner bar is one row below the outer, made once (before the outer,
  # which opens after its step 0) and reset for each outer step; it closes
  # with the outer bar.
  assert log.made() == [(DESC.format(4), 4, 1), ("epochs", 3, 0)]
  inner_run = [("update", 2), ("update", 2)]
  outer_step = [("update", 1), ("reset", 4)]
  assert [event for _, event in log.events] == (
      inner_run + outer_step + inner_run + outer_step + inner_run +
      [("update", 1), ("close",), ("close",)])
  assert [bar for bar, _ in log.events[-2:]] == [1, 0]
  assert log.of(1) == updates(1, 3)


JAX_TQDM_PROGRAM = """
import jax, jax.numpy as jnp
{import_line}

n = 1000

@scan_tqdm(n)
def step(carry, x):
  return carry + 1, carry + 1

@loop_tqdm(n, print_rate=100, desc="fori")
def body(i, val):
  return val + 1

last_number, all_numbers = jax.lax.scan(step, 0, jnp.arange(n))
total = jax.lax.fori_loop(0, n, body, 0)
print(int(last_number), int(all_numbers.sum()), int(total))
"""


def test_a_jax_tqdm_program_with_only_the_import_changed(both_modes):
  env = {"JAX_HOST_CALLBACK_OUTFEED": "1" if both_modes == "outfeed" else "0"}
  done = run_python(JAX_TQDM_PROGRAM.format(
      import_line="from host_callback.tqdm import loop_tqdm, scan_tqdm"),
      env=env)
  assert done.returncode == 0, done.stderr
  assert done.stdout == "1000 500500 1000\n"
  lines = done.stderr.replace("\r", "\n").splitlines()
  finals = [line for line in lines if "100%" in line]
  assert [line.split(":")[0] for line in finals] == [
      "Running for 1,000 iterations", "fori"], done.stderr
  assert all(" 1000/1000 " in line for line in finals), finals


def test_the_demo_shows_a_bar_for_its_training_loop(both_modes):
  env = {"JAX_HOST_CALLBACK_OUTFEED": "1" if both_modes == "outfeed" else "0"}
  done = run_python("import runpy; runpy.run_module('host_callback', "
                    "run_name='__main__')", env=env)
  assert done.returncode == 0, done.stderr
  assert done.stdout.splitlines()[-2] == (
      "received 200 losses from the device: first 3.3452, last 0.000000")
  final = done.stderr.replace("\r", "\n").strip().splitlines()[-1]
  assert re.match(r"training: 100%.* 200/200 ", final), done.stderr


def test_jax_tqdm_prints_the_same_program_alike(both_modes):
  """Where jax-tqdm is installed: the same results and final bars."""
  pytest.importorskip("jax_tqdm")
  env = {"JAX_HOST_CALLBACK_OUTFEED": "1" if both_modes == "outfeed" else "0"}
  outputs = []
  for import_line in ("from jax_tqdm import loop_tqdm, scan_tqdm",
                      "from host_callback.tqdm import loop_tqdm, scan_tqdm"):
    done = run_python(JAX_TQDM_PROGRAM.format(import_line=import_line),
                      env=env)
    assert done.returncode == 0, done.stderr
    finals = [re.sub(r"\[.*", "", line) for line in
              done.stderr.replace("\r", "\n").splitlines() if "100%" in line]
    outputs.append((done.stdout, finals))
  assert outputs[0] == outputs[1]


PMAP_PROGRAM = """
import jax, jax.numpy as jnp
import host_callback as hcb
from host_callback.tqdm import scan_tqdm

@scan_tqdm(20_000, print_rate=10)
def step(carry, i):
  return carry + 1.0, None

out = jax.pmap(lambda c: jax.lax.scan(step, c, jnp.arange(20_000))[0])(
    jnp.zeros((4, 64, 64)))
hcb.barrier_wait()
print("RESULT", out.shape)
"""
PMAP_FINAL_ROW = (r"cpu:{k}: Running for 20,000 iterations: 100%\|█+\| "
                  r"20000/20000 \[[^]]*it/s\]")


def _mode_env(mode: str, transport: str) -> dict:
  return {**(OUTFEED if mode == "outfeed" else {}),
          "JAX_HOST_CALLBACK_TRANSPORT": transport}


def test_pmap_bars_end_as_one_row_per_device_in_order(both_modes, transport):
  """What a person sees in a terminal when the program has ended: one
  final row per device, in device order, then the program's output."""
  shown = run_in_terminal(PMAP_PROGRAM, _mode_env(both_modes, transport))
  assert len(shown) == 5, shown
  for k, line in enumerate(shown[:4]):
    assert re.fullmatch(PMAP_FINAL_ROW.format(k=k), line), shown
  assert shown[4] == "RESULT (4, 64, 64)"


def test_pmap_bars_write_only_final_rows_to_a_log(both_modes, transport):
  done = run_python(PMAP_PROGRAM, env=_mode_env(both_modes, transport))
  assert done.returncode == 0, done.stderr
  assert done.stdout == "RESULT (4, 64, 64)\n"
  assert "\r" not in done.stderr
  rows = done.stderr.splitlines()
  assert len(rows) == 4, done.stderr
  for k, row in enumerate(rows):
    assert re.fullmatch(PMAP_FINAL_ROW.format(k=k), row), done.stderr


PRINT_AFTER_PMAP = """
import threading
import jax, jax.numpy as jnp
import host_callback as hcb
from host_callback.tqdm import scan_tqdm

printed = threading.Event()

def hold(i, transforms):
  # The outfeed mode: the bars draw on until the program has printed. The
  # synchronous mode: the program writes "pmap result" while they draw.
  printed.wait(timeout=0.5)

@scan_tqdm(20_000, print_rate=1000)
def step(carry, i):
  jax.lax.cond(i == 1, lambda: hcb.id_tap(hold, i), lambda: i)
  return carry + 1.0, None

out = jax.pmap(lambda c: jax.lax.scan(step, c, jnp.arange(20_000))[0])(
    jnp.zeros(4))
print("pmap result", out)
printed.set()
"""


def test_a_print_after_pmap_stays_intact_beside_drawing_bars(both_modes,
                                                             transport):
  """No barrier before the print: `pmap` returns while the bars draw. In
  the synchronous mode the print waits for the result, and so for the
  bars: the line comes below their final rows; in the outfeed mode it
  comes while they draw, and they end below it."""
  shown = run_in_terminal(PRINT_AFTER_PMAP, _mode_env(both_modes, transport))
  result = "pmap result [20000. 20000. 20000. 20000.]"
  rows = shown[:4] if both_modes == "synchronous" else shown[1:]
  assert shown[4 if both_modes == "synchronous" else 0] == result, shown
  assert len(shown) == 5 and len(rows) == 4, shown
  for k, line in enumerate(rows):
    assert re.fullmatch(PMAP_FINAL_ROW.format(k=k), line), shown


BARS_AT_EXIT = """
import threading, time
import jax, jax.numpy as jnp
import host_callback as hcb
from host_callback.tqdm import scan_tqdm

monitors = []

def look(i, transforms):  # while the bar is open
  monitors.extend(type(t).__name__ for t in threading.enumerate()
                  if type(t).__name__ == "TMonitor")

@scan_tqdm(100, print_rate=10)
def step(carry, i):
  jax.lax.cond(i == 50, lambda: hcb.id_tap(look, i), lambda: i)
  return carry + 1.0, None

def slow(x, transforms):
  time.sleep(0.3)

@jax.jit
def run(c):
  hcb.id_tap(slow, c)
  return jax.lax.scan(step, c, jnp.arange(100))[0]

print(run(0.0))
hcb.barrier_wait()
print("monitors", monitors)
print(run(1.0))  # the outfeed mode: its bar opens as the program exits
"""


def test_bars_start_no_tqdm_monitor_and_open_cleanly_at_exit(both_modes,
                                                             transport):
  """Taps redraw the bars: tqdm's monitor thread is not started, and a bar
  that opens while the interpreter exits (Python 3.12 refuses new threads
  then) draws without tqdm's warning."""
  done = run_python(BARS_AT_EXIT, env=_mode_env(both_modes, transport))
  assert done.returncode == 0, done.stderr
  assert done.stdout == "100.0\nmonitors []\n101.0\n"
  rows = done.stderr.splitlines()
  assert len(rows) == 2, done.stderr
  assert all(re.fullmatch(r"Running for 100 iterations: 100%.*", row)
             for row in rows), done.stderr


PRINT_BESIDE_ID_PRINT = """
import threading
import jax, jax.numpy as jnp
import host_callback as hcb
from host_callback.tqdm import scan_tqdm

go, printed = threading.Event(), threading.Event()

def hold(i, transforms):  # until the program has written "result "
  go.wait(timeout=30)

def done(i, transforms):
  printed.set()

@scan_tqdm(20_000, print_rate=1000)
def step(carry, i):
  def observe():
    hcb.id_tap(hold, i)
    hcb.id_print(i, what="c")
    hcb.id_tap(done, i)
    return i
  jax.lax.cond(i == 1, observe, lambda: i)
  return carry + 1.0, None

out = jax.pmap(lambda c: jax.lax.scan(step, c, jnp.arange(20_000))[0])(
    jnp.zeros(4))

class Result:  # print() writes "result ", then asks for this text
  def __str__(self):
    go.set()
    printed.wait(timeout=30)  # an id_print has written meanwhile
    return str(out)

print("result", Result())
hcb.barrier_wait()
"""


def test_a_print_and_id_print_beside_bars_keep_their_own_lines(both_modes,
                                                               transport):
  """A line the program is writing while the bars draw and an `id_print`
  from another thread each keep their own rows."""
  shown = run_in_terminal(PRINT_BESIDE_ID_PRINT,
                          _mode_env(both_modes, transport))
  assert [line for line in shown if "result" in line] == [
      "result [20000. 20000. 20000. 20000.]"], shown
  assert sorted(line for line in shown if not line.startswith("result")
                and "Running for" not in line) == ["1"] * 4 + ["what: c"] * 4, (
                    shown)


def test_id_print_writes_above_an_open_bar(both_modes, transport):
  shown = run_in_terminal("""
      import jax, jax.numpy as jnp
      import host_callback as hcb
      from host_callback.tqdm import scan_tqdm

      @scan_tqdm(30, print_rate=1, desc="loop")
      def step(carry, i):
        jax.lax.cond(i % 10 == 5, lambda: hcb.id_print(i, what="step"),
                     lambda: i)
        return carry, None

      jax.jit(lambda: jax.lax.scan(step, 0, jnp.arange(30)))()
      hcb.barrier_wait()
      print("done")
      """, _mode_env(both_modes, transport))
  assert shown[:6] == ["what: step", "5", "what: step", "15", "what: step",
                       "25"], shown
  assert re.fullmatch(r"loop: 100%\|█+\| 30/30 \[.*\]", shown[6]), shown
  assert shown[7:] == ["done"], shown


def test_the_demo_reads_cleanly_in_a_terminal(both_modes, transport):
  shown = run_in_terminal("import runpy; runpy.run_module('host_callback', "
                          "run_name='__main__')",
                          _mode_env(both_modes, transport))
  assert shown[0].startswith("host_callback demo on cpu:0 ("), shown
  assert shown[1:9] == [
      "what: step, loss", "( 0 3.345239 )", "what: step, loss",
      "( 50 0.00248758 )", "what: step, loss", "( 100 1.9993786e-06 )",
      "what: step, loss", "( 150 1.6214651e-09 )"], shown
  assert re.fullmatch(r"training: 100%\|█+\| 200/200 \[.*\]", shown[9])
  assert shown[10].startswith("received 200 losses") and len(shown) == 12


def test_a_loop_shorter_than_its_total_closes_at_the_barrier(log):
  @scan_tqdm(1000, print_rate=10)
  def step(carry, i):
    return carry + 1, None

  assert int(scan(step, 500)[0]) == 500
  hcb.barrier_wait()
  assert log.of(0) == [("update", 10)] * 50 + [("close",)]
  assert log.bars[0].n == 500 and "ended early" in str(log.bars[0])


def test_a_loop_that_ends_early_shows_the_steps_it_ran(log):
  """500 of a declared 2,000 steps, at the default print rate (100): the
  bar ends at 500, not at the last multiple of the rate it began (400)."""
  @scan_tqdm(2000)
  def step(carry, i):
    return carry + 1, None

  assert int(scan(step, 500)[0]) == 500
  hcb.barrier_wait()
  assert re.fullmatch(
      r"Running for 2,000 iterations:  25%\|██▌       \| 500/2000 "
      r"\[[\d:]+<[\d:]+, [\d.]+it/s, ended early\]", str(log.bars[0])), (
          str(log.bars[0]))


def test_a_while_loop_that_ends_before_its_total_says_so(log):
  loop = while_tqdm(total=200)
  assert int(jax.jit(lambda: loop(lambda c: c < 150, lambda c: c + 1, 0))()
             ) == 150
  hcb.barrier_wait()
  assert log.of(0)[-1] == ("close",) and log.bars[0].n == 150
  assert "150/200" in str(log.bars[0])
  assert "ended early" in str(log.bars[0])


def test_bars_that_overrun_their_total_count_on(log):
  loop = while_tqdm(total=100)
  assert int(jax.jit(lambda: loop(lambda c: c < 150, lambda c: c + 1, 0))()
             ) == 150

  @scan_tqdm(50, print_rate=10)
  def step(carry, i):
    return carry + 1, None

  assert int(scan(step, 80)[0]) == 80
  hcb.barrier_wait()
  assert log.bars[0].n == 150
  assert re.search(r"150it .*past its total of 100", str(log.bars[0]))
  # The scan's bar closes at its total; the steps past it, on a bar of
  # their own, closed at the barrier.
  assert log.made()[1:] == [(DESC.format(50), 50, 0),
                            (DESC.format(50), None, 0)]
  assert log.of(1) == updates(10, 50)
  assert log.bars[2].n == 80 and log.of(2)[-1] == ("close",)
  assert "past its total of 50" in str(log.bars[2])


def test_per_device_bars_of_failed_runs_end_in_device_order(both_modes,
                                                             transport):
  """Each device's loop fails at step 3 (a call that raises; the bars
  show the 3 steps before it): each run's rows are written in device order, whichever
  device ended first."""
  done = run_python("""
      import jax, jax.numpy as jnp
      import host_callback as hcb
      from host_callback.tqdm import scan_tqdm

      def fails_at_3(i):
        if i == 3:
          raise ValueError("step 3")
        return i

      @scan_tqdm(10, print_rate=1)
      def step(carry, i):
        return carry + hcb.call(fails_at_3, i, result_shape=i), None

      run = jax.pmap(lambda c: jax.lax.scan(step, c, jnp.arange(10))[0])
      for _ in range(2):
        try:
          jax.block_until_ready(run(jnp.arange(4)))
        except jax.errors.JaxRuntimeError:
          pass
      try:
        hcb.barrier_wait()
      except hcb.CallbackException:
        pass
      """, env=_mode_env(both_modes, transport))
  assert done.returncode == 0, done.stderr
  rows = [line for line in done.stderr.splitlines() if "iterations" in line]
  assert [row.split(":")[:2] for row in rows] == [
      ["cpu", str(k)] for k in range(4)] * 2, done.stderr
  assert all(re.search(r"\| 3/10 \[.*ended early\]$", row) for row in rows), (
      done.stderr)


def _lowered_scan(platform: str) -> str:
  """The StableHLO of a jitted scan with a bar, lowered for `platform`."""
  @scan_tqdm(100, print_rate=10)
  def step(carry, i):
    return carry + 1, None

  traced = jax.jit(lambda c: jax.lax.scan(step, c, jnp.arange(100))[0]
                   ).trace(0)
  return traced.lower(lowering_platforms=(platform,)).as_text()


def _runtime_conditionals(stablehlo: str) -> int:
  """The conditionals of `stablehlo` that choose at run time. Those of
  `lax.platform_dependent` do not: lowered for one platform, it is a case
  on a constant and a case on that one's result, which XLA folds away."""
  count = 0
  for function in stablehlo.split("func.func")[1:]:
    known = set(re.findall(r"(%\S+) = stablehlo\.constant", function))
    for result, index in re.findall(
        r'(%\S+) = "stablehlo\.case"\((%[^)]+)\)', function):
      if index in known:
        known.add(result)
      else:
        count += 1
  return count


@pytest.mark.parametrize("chosen, validated, every_step", [
    ("native", False, True), ("python", True, False), ("auto", False, False),
    ("auto", True, True)])
def test_gpu_bars_on_the_native_transport_tap_every_step(
    monkeypatch, chosen, validated, every_step):
  """Lowered for CUDA, a bar skips no step on the device where the op
  lowers on the native transport (its tap costs less than XLA's GPU
  conditional), and skips them in a `lax.cond` on the Python transport;
  lowered for CPU, it keeps the `lax.cond`."""
  if not transport_native.available():
    pytest.skip("the native transport is not built")
  jax.config.update("jax_host_callback_transport", chosen)
  monkeypatch.setattr(transport_policy, "CUDA_NATIVE_VALIDATED", validated)
  # Nothing runs: the CUDA handlers need not be registered (that needs
  # libcudart), and the op of JAX's own callbacks, which lowers only for a
  # backend of this process, may be the native one's.
  monkeypatch.setattr(native_handlers, "accepted", lambda platform: True)
  monkeypatch.setitem(lowering._EMITTERS, "python", lowering_native.emit)
  assert _runtime_conditionals(_lowered_scan("cuda")) == (not every_step)
  assert _runtime_conditionals(_lowered_scan("cpu")) == 1


EDGES_PROGRAM = """
import jax, jax.numpy as jnp
import host_callback as hcb
import host_callback.bars.decorators as bars
{every_step}

def scan(n, steps):
  @bars.scan_tqdm(n, print_rate=3, desc=f"scan {{steps}} of {{n}}")
  def step(carry, i):
    return carry + 1, None
  return jax.jit(lambda: jax.lax.scan(step, 0, jnp.arange(steps)))

def while_loop(total, steps):
  loop = bars.while_tqdm(total=total, print_rate=3,
                         desc=f"while {{steps}} of {{total}}")
  return jax.jit(lambda: loop(lambda c: c < steps, lambda c: c + 1, 0))

print("conditionals:", scan(10, 10).lower().compile().as_text().count(
    "conditional("))
for n, steps in ((10, 10), (10, 8), (10, 11), (10, 14)):
  scan(n, steps)()
  hcb.barrier_wait()
for total, steps in ((10, 10), (10, 8), (10, 11)):
  while_loop(total, steps)()
  hcb.barrier_wait()
"""
EVERY_STEP = "bars._taps_every_step = lambda platform: True"
# What varies between runs: tqdm's times and rates, and so the bars' widths.
VARYING = r"\d\d:\d\d(<[\d:?]+)?, [\d.?]+(it/s|s/it)|\|[^|]*\|"


def test_bars_draw_alike_from_every_step(both_modes, transport):
  """Where a bar taps every step, its host side draws what the `lax.cond`
  path draws: the last step, a loop that ends early, steps past the
  total (shown at the print rate only)."""
  env = _mode_env(both_modes, transport)
  screens, logs = [], []
  for every_step in ("", EVERY_STEP):
    program = EDGES_PROGRAM.format(every_step=every_step)
    screens.append([re.sub(VARYING, "~", row)
                    for row in run_in_terminal(program, env)])
    done = run_python(program, env=env)
    assert done.returncode == 0, done.stderr
    logs.append(re.sub(VARYING, "~", done.stdout + done.stderr))
  assert screens[0][0] == "conditionals: 1", screens[0]
  assert screens[1][0] == "conditionals: 0", screens[1]
  assert screens[0][1:] == screens[1][1:]
  assert "ended early" in logs[0] and "past its total" in logs[0], logs[0]
  assert logs[0].replace("conditionals: 1", "conditionals: 0") == logs[1]
