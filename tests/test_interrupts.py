"""A KeyboardInterrupt fails only the computation whose host function it
stopped, and reaches only the thread that waits on it (each case in a fresh
interpreter, so that a stray interrupt cannot hit the test run)."""

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

import pytest

from helpers import (CTRL_C_INTERRUPTED, CTRL_C_OUTCOME, OUTFEED,
                     SUBPROCESS_TIMEOUT, run_python)
from host_callback.host import transport_policy


def test_interrupt_in_a_worker_threads_tap_stays_in_that_thread(transport):
  done = run_python("""
      import threading, time, jax, host_callback as hcb
      jax.config.update("jax_host_callback_outfeed", False)

      def tap(a, t):
        raise KeyboardInterrupt

      failures = []
      def work():
        try:
          jax.jit(lambda v: hcb.id_tap(tap, v))(1.0)
        except BaseException as error:  # what the worker's caller sees
          failures.append(error)

      worker = threading.Thread(target=work)
      worker.start()
      worker.join()
      time.sleep(1)  # an interrupt sent to this thread would land here
      print("worker failed:", "KeyboardInterrupt" in repr(failures) or
            "KeyboardInterrupt" in str(failures[0]))
      print("main thread: not interrupted")
      """, transport=transport, timeout=120)
  assert "worker failed: True" in done.stdout, done.stderr
  assert "main thread: not interrupted" in done.stdout, done.stderr


def test_ctrl_c_stops_a_synchronous_scan_of_slow_taps(transport):
  """Ctrl-C sent while the main thread runs a scan of 200 taps of 50 ms
  stops it (taps stop well before the 200th), and reaches the main thread.
  Repeated, as a lost interrupt was a race."""
  done = run_python("""
      import os, signal, threading, time, jax, host_callback as hcb
      jax.config.update("jax_host_callback_outfeed", False)
      ran = []

      def slow(a, t):
        ran.append(1)
        time.sleep(0.05)

      f = jax.jit(lambda x: jax.lax.scan(
          lambda c, _: (hcb.id_tap(slow, c) + 1, None), x, None,
          length=200)[0])
      f.lower(0.0).compile()
      for attempt in range(3):
        ran.clear()
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
          try:
            f(0.0)
          finally:
            time.sleep(0.2)  # a re-armed interrupt lands by then
        except KeyboardInterrupt:
          print("interrupted after", len(ran), "taps")
        except Exception as error:  # a runtime error chaining it
          assert "KeyboardInterrupt" in str(error), error
          print("interrupted after", len(ran), "taps")
      """, env={"JAX_HOST_CALLBACK_OUTFEED": "0"}, transport=transport,
      timeout=120)
  lines = [line for line in done.stdout.splitlines()
           if line.startswith("interrupted after")]
  assert len(lines) == 3, (done.stdout, done.stderr)
  assert all(int(line.split()[2]) < 150 for line in lines), done.stdout


# For run_python code: a jitted `call` f(x) whose host function sleeps x
# seconds, compiled and run once.
_SLOW_CALL = """
import time, jax, jax.numpy as jnp, host_callback as hcb

def slow(x):
  time.sleep(float(x))
  return x + 1

f = jax.jit(lambda x: hcb.call(slow, x, result_shape=x))
f(jnp.float32(0)).block_until_ready()
"""


@pytest.mark.parametrize("mode", ["synchronous", "outfeed"])
def test_ctrl_c_stops_a_slow_call(transport, mode):
  """Ctrl-C while the main thread runs a slow `call`'s host function (a
  request on an idle queue runs there in both modes) gives the caller
  KeyboardInterrupt at once, on both transports: the Python transport hands
  it on past JAX's callback, which would turn it into its own error. Twice,
  on a warm function; then no stray interrupt comes, and calls work."""
  done = run_python(CTRL_C_OUTCOME + _SLOW_CALL + """
for attempt in range(2):
  start = time.monotonic()
  ended = outcome(lambda: f(jnp.float32(60)), after=0.3)
  print(f"{ended}|{round(time.monotonic() - start)}")
try:
  time.sleep(1)  # an interrupt re-armed twice would land here
  print("no stray interrupt")
except KeyboardInterrupt:
  print("stray interrupt")
print("after:", float(f(jnp.float32(0))))
""", env=OUTFEED if mode == "outfeed" else None, transport=transport)
  lines = done.stdout.splitlines()
  assert len(lines) == 4, (done.stdout, done.stderr)
  for line in lines[:2]:
    ended, seconds = line.split("|")
    assert ended in CTRL_C_INTERRUPTED, (done.stdout, done.stderr)
    assert int(seconds) < 30, done.stdout  # not after the host function
  assert lines[2:] == ["no stray interrupt", "after: 1.0"], done.stdout


@pytest.mark.parametrize("mode", ["synchronous", "outfeed"])
def test_a_delivered_ctrl_c_is_not_raised_again_by_the_barrier(transport,
                                                               mode):
  """Issue 33 item 2: Ctrl-C stopped a slow `call` and reached the waiting
  main thread; a later, unrelated barrier raises nothing."""
  done = run_python(CTRL_C_OUTCOME + _SLOW_CALL + """
print(outcome(lambda: f(jnp.float32(60)).block_until_ready(), after=0.3))
try:
  time.sleep(0.5)  # a re-armed interrupt lands here at the latest
except KeyboardInterrupt:
  print("interrupted late")
print("after:", float(f(jnp.float32(0))))
try:
  hcb.barrier_wait()
  print("barrier: nothing raised")
except hcb.CallbackException as error:
  print("barrier raised:", "KeyboardInterrupt" in str(error))
""", env=OUTFEED if mode == "outfeed" else None, transport=transport)
  lines = done.stdout.splitlines()
  assert len(lines) == 3, (done.stdout, done.stderr)
  assert lines[0] in CTRL_C_INTERRUPTED, (done.stdout, done.stderr)
  assert lines[1:] == ["after: 1.0", "barrier: nothing raised"], (
      done.stdout, done.stderr)


def test_a_tap_that_raises_keyboard_interrupt_is_still_reported(transport):
  """A tap in the outfeed mode that raises KeyboardInterrupt itself: no
  thread waits on it, so the barrier reports it, as any tap's error."""
  done = run_python("""
import jax, host_callback as hcb

def tap(a, t):
  raise KeyboardInterrupt("from the tap")

jax.jit(lambda v: hcb.id_tap(tap, v))(1.0)
try:
  hcb.barrier_wait()
  print("barrier: nothing raised")
except hcb.CallbackException as error:
  print("barrier raised:", type(error.__cause__).__name__)
""", env=OUTFEED, transport=transport)
  assert done.stdout.splitlines() == ["barrier raised: KeyboardInterrupt"], (
      done.stdout, done.stderr)


# For run_python code: a computation whose host function (a tap or a call,
# `BLOCKED`) blocks for ever, on one device (DEVICES 1: jit) or on each of
# four (pmap); the program then ends, and its drain at exit waits for it.
# A tap of the outfeed mode is dispatched by the main thread, which goes
# on; otherwise by a worker thread, which the host function blocks (a pmap
# goes on in both cases: it runs on the client's threads).
_BLOCKED_AT_EXIT = """
import atexit, threading, jax, jax.numpy as jnp, host_callback as hcb

started = threading.Semaphore(0)
def block(x, *rest):
  started.release()
  threading.Event().wait()
  return x

if BLOCKED == "tap":
  op = lambda v: hcb.id_tap(block, v)
else:
  op = lambda v: hcb.call(block, v, result_shape=v)
if DEVICES == 1:
  step, x = jax.jit(op), jnp.arange(3.0)
else:
  step, x = jax.pmap(op), jnp.zeros((DEVICES, 3))
if (BLOCKED == "tap" and OUTFEED) or DEVICES > 1:
  step(x)
else:
  threading.Thread(target=step, args=(x,), daemon=True).start()
for _ in range(DEVICES):
  assert started.acquire(timeout=60)
atexit.register(print, "exiting", flush=True)  # runs right before the drain
"""


def _interrupted_child(code: str, transport: str, mode: str, devices: int,
                       ready: Callable[[List[str]], bool],
                       delay: float = 0.5, again_after: Optional[float] = None
                       ) -> Tuple[int, List[str], float]:
  """Runs `code` in a child on CPU, with its stdout and stderr in one
  stream; once `ready(lines so far)`, waits `delay` seconds and sends
  SIGINT, and again every `again_after` seconds while it runs, if given.
  Returns its exit status, its lines, and the seconds from the first
  SIGINT to its end (it is killed after 60)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             JAX_HOST_CALLBACK_TRANSPORT=transport,
             JAX_HOST_CALLBACK_OUTFEED="1" if mode == "outfeed" else "0",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  child = subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  lines: List[str] = []
  reader = threading.Thread(
      target=lambda: lines.extend(line.rstrip("\n") for line in child.stdout))
  reader.start()
  try:
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT
    while not ready(list(lines)):
      assert time.monotonic() < deadline and child.poll() is None, _text(lines)
      time.sleep(0.05)
    time.sleep(delay)
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    try:
      while again_after is not None and time.monotonic() < sent + 60:
        try:
          child.wait(timeout=again_after)
          break
        except subprocess.TimeoutExpired:
          child.send_signal(signal.SIGINT)
      child.wait(timeout=max(0.0, sent + 60 - time.monotonic()))
    finally:
      seconds = time.monotonic() - sent
  finally:
    child.kill()
    reader.join()
  return child.returncode, lines, seconds


def _text(lines: List[str]) -> str:
  """The child's lines, as an assertion's message."""
  return "\n".join(["child's output:", *lines])


_REPORT = re.compile(r"host_callback:   device (\d+) \((\w+) transport\): "
                     r"(\d+) ran, (\d+) running, (\d+) dropped$")
_EXECUTIONS = re.compile(r"host_callback:   device executions still running: "
                         r"(\d+)$")


def _report(why: str, lines: List[str]
            ) -> Tuple[List[str], Dict[int, Tuple[int, int, int]],
                       Optional[int]]:
  """Splits the child's lines at its report, which must come last: the
  lines before it, each device's (ran, running, dropped), and the
  executions still running (None where not counted)."""
  first = (f"host_callback: {why}; exiting now with status 130, without "
           "running or waiting for the host functions (taps and calls) left:")
  assert first in lines, _text(lines)
  start = lines.index(first)
  queues, executions = {}, None
  for line in lines[start + 1:]:  # nothing but the report after it
    match, counted = _REPORT.match(line), _EXECUTIONS.match(line)
    assert match or (counted and executions is None), _text(lines)
    if match:
      queues[int(match[1])] = (int(match[3]), int(match[4]), int(match[5]))
    else:
      executions = int(counted[1])
  assert (executions is None) != transport_policy.native_on_cpu(), _text(lines)
  return lines[:start], queues, executions


@pytest.mark.parametrize("blocked", ["tap", "call"])
@pytest.mark.parametrize("devices", [1, 4])
@pytest.mark.parametrize("mode", ["synchronous", "outfeed"])
def test_ctrl_c_ends_the_drain_at_exit(transport, mode, devices, blocked):
  """Issue 42 item 1: a host function blocked for ever at exit; one Ctrl-C
  during the drain ends it, says what it left, and the process exits (it
  ignored Ctrl-C: the stop after the interrupted barrier waited again, and
  the barrier's probe over several devices waited in C++). Issue 50: at
  once, with status 130, the host function counted as running."""
  code = (f"BLOCKED, DEVICES, OUTFEED = {blocked!r}, {devices}, "
          f"{mode == 'outfeed'}\n" + _BLOCKED_AT_EXIT)
  status, lines, _ = _interrupted_child(
      code, transport, mode, devices, lambda lines: "exiting" in lines)
  assert status == 130, _text(lines)
  before, queues, executions = _report("Ctrl-C ended the drain at exit",
                                       lines)
  assert before == ["exiting"], _text(lines)
  assert queues == {d: (0, 1, 0) for d in range(devices)}, _text(lines)
  if executions is not None:
    # A receiver thread runs the outfeed mode's taps; the devices the rest.
    blocked_on_device = not (mode == "outfeed" and blocked == "tap")
    assert executions == (devices if blocked_on_device else 0), _text(lines)


# For _interrupted_child code: a pmap over DEVICES of a `call` whose host
# function says when it begins and sleeps a second, in a loop that a
# worker runs while the main thread sleeps (where Ctrl-C lands at once:
# one in the loop may land between two steps, with nothing left to run).
_PMAP_OF_SLOW_CALLS = """
import os, threading, time, jax, jax.numpy as jnp, host_callback as hcb

def slow(x, device):
  os.write(1, f"begins on {device.id}\\n".encode())  # a whole line
  time.sleep(1)
  return x + 1

step = jax.pmap(lambda v: hcb.call(slow, v, result_shape=v,
                                   call_with_device=True))

def steps():
  x = jnp.zeros((DEVICES, 3))
  while True:
    x = step(x)

threading.Thread(target=steps, daemon=True).start()
time.sleep(600)
"""


def test_ctrl_c_ends_a_pmap_of_slow_calls(transport):
  """Issue 50 item 4: Ctrl-C during a pmap over 4 devices whose `call`
  sleeps a second ends the program within seconds (it waited for every
  step dispatched, silently, then aborted on a second Ctrl-C): status 130,
  a report of what ran and runs on each device, and nothing after it."""
  devices = 4
  status, lines, seconds = _interrupted_child(
      f"DEVICES = {devices}\n" + _PMAP_OF_SLOW_CALLS, transport,
      "synchronous", devices,
      lambda lines: sum(line.startswith("begins") for line in lines) > devices)
  assert status == 130, _text(lines)
  assert seconds < 30, lines  # about one on an idle machine
  before, queues, executions = _report("Ctrl-C ended the program", lines)
  # A line may end another one that the child was writing.
  begun = collections.Counter(
      int(match[1]) for match in map(re.compile(r"begins on (\d+)$").search,
                                     before) if match)
  assert set(queues) == set(range(devices)), _text(lines)
  for device, (ran, running, dropped) in queues.items():
    # A call that began ran, or runs (nothing begins after the report);
    # one that came after the end began was dropped.
    assert ran + running == begun[device], _text(lines)
    assert ran >= 1 and running + dropped <= 1, _text(lines)
  if executions is not None:
    assert sum(q[1] for q in queues.values()) <= executions <= devices, _text(lines)


# For _interrupted_child code: in the outfeed mode, TAPS taps of one
# computation, whose function says when it begins and sleeps a second.
_QUEUED_SLOW_TAPS = """
import os, time, jax, host_callback as hcb

def slow(i, transforms):
  os.write(1, f"tap {int(i)} begins\\n".encode())
  time.sleep(1)

jax.jit(lambda x: jax.lax.fori_loop(
    0, TAPS, lambda i, c: hcb.id_tap(slow, i, result=c), x))(0.0
    ).block_until_ready()
time.sleep(600)
"""


def test_ctrl_c_drops_queued_slow_taps(transport):
  """Issue 50 item 4: Ctrl-C while 1,000 one-second taps of the outfeed
  mode wait ends the program at once (it waited for them all, about 1,000
  s, and then reported them all as left, and a tap ran after the report):
  status 130, the taps that ran, runs and were dropped, and no tap after
  the report."""
  taps = 1000
  status, lines, seconds = _interrupted_child(
      f"TAPS = {taps}\n" + _QUEUED_SLOW_TAPS, transport, "outfeed", 1,
      lambda lines: "tap 1 begins" in lines)
  assert status == 130, _text(lines)
  assert seconds < 30, lines  # a few milliseconds on an idle machine
  before, queues, executions = _report("Ctrl-C ended the program", lines)
  begun = sum(bool(re.search(r"tap \d+ begins$", line)) for line in before)
  ((ran, running, dropped),) = queues.values()
  assert set(queues) == {0} and ran >= 1 and running in (0, 1), _text(lines)
  assert (ran + running, dropped) == (begun, taps - begun), _text(lines)
  assert executions in (None, 0), lines  # the computation had finished


# For run_python code: 50 rounds, on one device (DEVICES 1: jit) or four
# (pmap), from the main thread or a worker (IN_THREAD), of a `call` whose
# host function raises KeyboardInterrupt, then a barrier, then a fori_loop
# of 4 taps whose function raises it at step 1, then a barrier; prints how
# many times each outcome happened.
_OWN_KEYBOARD_INTERRUPTS = """
import collections, threading, time, jax, jax.numpy as jnp, host_callback as hcb

def raising(x):
  raise KeyboardInterrupt("from the call")

seen = []
def tap(i, transforms, device):
  if int(i) == 1:
    raise KeyboardInterrupt("from the tap")
  seen.append((device.id, int(i)))

call = lambda v: hcb.call(raising, v, result_shape=v)
loop = lambda v: jax.lax.fori_loop(
    0, 4, lambda i, c: hcb.id_tap(tap, i, result=c, tap_with_device=True), v)
if DEVICES == 1:
  call, loop, x = jax.jit(call), jax.jit(loop), jnp.float32(0)
else:
  call, loop, x = jax.pmap(call), jax.pmap(loop), jnp.zeros(DEVICES)
outcomes = collections.Counter()

def chain(error):
  names = []
  while error is not None:
    names.append(type(error).__name__)
    error = error.__cause__
  return " <- ".join(names)

def run(name, step):
  try:
    step(x).block_until_ready()
    outcomes[f"{name} returned"] += 1
  except Exception as error:
    outcomes[f"{name} failed: {type(error).__name__} naming "
             f"{'KeyboardInterrupt' in str(error)}"] += 1
  try:
    hcb.barrier_wait()
    outcomes[f"{name} barrier: nothing"] += 1
  except hcb.CallbackException as error:
    outcomes[f"{name} barrier: {chain(error)}"] += 1

def rounds():
  for _ in range(50):
    try:
      run("call", call)
      seen.clear()
      run("loop", loop)
      outcomes[f"taps {sorted(seen)}"] += 1
    except BaseException as error:
      outcomes[f"escaped: {type(error).__name__}"] += 1

try:
  if IN_THREAD:
    worker = threading.Thread(target=rounds)
    worker.start()
    worker.join()
  else:
    rounds()
  time.sleep(0.5)  # a re-armed interrupt would land here
except KeyboardInterrupt:
  outcomes["stray KeyboardInterrupt"] += 1
for outcome, count in sorted(outcomes.items()):
  print(f"{count}|{outcome}")
"""


@pytest.mark.parametrize("in_thread", [False, True])
@pytest.mark.parametrize("devices", [1, 4])
@pytest.mark.parametrize("mode", ["synchronous", "outfeed"])
def test_a_host_functions_keyboard_interrupt_is_its_error(transport, mode,
                                                          devices, in_thread):
  """Issue 42 item 2: a KeyboardInterrupt that a host function raises
  itself is its error, as any exception, whichever thread runs it: the
  computation waiting for it fails with an error naming it (no bare
  KeyboardInterrupt, none re-armed), the outfeed mode's barrier reports it
  once, and the taps after it are delivered. Before, it depended on the
  thread: a call run on the main thread raised KeyboardInterrupt and the
  barrier nothing; a tap run by the barrier's thread escaped from it, and
  the taps after it were lost."""
  done = run_python(
      f"DEVICES, IN_THREAD = {devices}, {in_thread}\n" +
      _OWN_KEYBOARD_INTERRUPTS,
      env={**(OUTFEED if mode == "outfeed" else {}),
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"},
      transport=transport)
  outfeed = mode == "outfeed"
  steps = [0, 2, 3] if outfeed else [0]  # a failed computation stops
  taps = sorted((d, i) for d in range(devices) for i in steps)
  expected = {
      "call failed: JaxRuntimeError naming True": 50,
      # In the synchronous mode, the failed computation is the only report.
      ("call barrier: CallbackException <- CallError <- KeyboardInterrupt"
       if outfeed else "call barrier: nothing"): 50,
      ("loop returned" if outfeed else
       "loop failed: JaxRuntimeError naming True"): 50,
      ("loop barrier: CallbackException <- KeyboardInterrupt"
       if outfeed else "loop barrier: nothing"): 50,
      f"taps {taps}": 50,
  }
  outcomes = dict(line.split("|")[::-1] for line in done.stdout.splitlines())
  assert {k: int(v) for k, v in outcomes.items()} == expected, (
      done.stdout, done.stderr[-3000:])


# --- What a person sees after Ctrl-C (issue 61, defects 1 to 3) -------------

# For _interrupted_child code, each says "start" once it runs what the
# SIGINT is to stop. SCENARIO "loop": the first call of a jitted loop whose
# tap sleeps 10 ms (JAX's Python dispatch). "steps": a loop at the top of the
# program over a warm jitted step with one tap (JAX's C++ dispatch, with no
# Python code between its error and the end of the program). Each compiles
# before it says "start"; the tests send SIGINT again every 10 s, as a person
# would press Ctrl-C again: Python loses one that lands in a garbage
# collection callback (JAX's `_xla_gc_callback`: "Exception ignored").
# "tap, call":
# the same with a tap that sleeps 10 ms then a call, whose host functions
# the step's own thread runs in both modes. "pmap": a
# pmap over DEVICES of a 20M-step scan with a tap per step.
_INTERRUPTED_PROGRAMS = {
    "loop": """
import time, jax, host_callback as hcb
def tick(v, t):
  time.sleep(0.01)
f = jax.jit(lambda x: jax.lax.fori_loop(
    0, 100_000, lambda i, x: hcb.id_tap(tick, i, result=x + 1), x))
f.lower(0).compile()  # the first call below compiles nothing
print("start", flush=True)
f(0).block_until_ready()
""",
    "steps": """
import jax, jax.numpy as jnp, host_callback as hcb
step = jax.jit(lambda x: hcb.id_tap(lambda v, t: None, x) + 1)
x = step(jnp.float32(0))
print("start", flush=True)
for i in range(10**9):
  x = step(x)
""",
    "tap, call": """
import time, jax, jax.numpy as jnp, host_callback as hcb
def tick(v, t):
  time.sleep(0.01)
step = jax.jit(lambda x: hcb.call(lambda v: v, hcb.id_tap(tick, x),
                                  result_shape=x) + 1)
x = step(jnp.float32(0))
print("start", flush=True)
for i in range(10**9):
  x = step(x)
""",
    "pmap": """
import jax, jax.numpy as jnp, host_callback as hcb
def tick(v, t):
  pass
f = jax.pmap(lambda x: jax.lax.scan(
    lambda c, _: (hcb.id_tap(tick, c) + 1, None), x, None,
    length=20_000_000)[0])
f.lower(jnp.zeros(DEVICES)).compile()
print("start", flush=True)
f(jnp.zeros(DEVICES)).block_until_ready()
""",
}


def _without_lost_ctrl_c(lines: List[str]) -> List[str]:
  """`lines` without what Python prints of a Ctrl-C it lost in a garbage
  collection callback: "Exception ignored in: ..." down to its
  `KeyboardInterrupt` line."""
  kept, lost = [], False
  for line in lines:
    if line.startswith("Exception ignored in: <function _xla_gc_callback"):
      lost = True
    elif not lost:
      kept.append(line)
    elif line.startswith("KeyboardInterrupt"):
      lost = False
  return kept


def _keyboard_interrupt_as_python_prints_it(lines: List[str]) -> None:
  """`lines` end as a program that Ctrl-C ended does, where Python prints
  the KeyboardInterrupt of a SIGINT: its traceback, the program's frames
  only, then `KeyboardInterrupt`; none of the error of the computation it
  cancelled, nor a host function blamed for it, nor a half-printed report."""
  text = _text(lines)
  for wrong in ("During handling", "lost sys.stderr", "raised Keyboard",
                "JaxRuntimeError", "Error in sys.excepthook", "ValueError"):
    assert wrong not in text, text
  assert lines[-1] == "KeyboardInterrupt", text
  traceback = lines[lines.index("Traceback (most recent call last):") + 1:-1]
  frames = [line for line in traceback if line.startswith("  File ")]
  assert frames and all(f.startswith('  File "<string>"') for f in frames), text


@pytest.mark.parametrize("scenario", ["loop", "steps", "tap, call"])
@pytest.mark.parametrize("mode", ["synchronous", "outfeed"])
def test_ctrl_c_is_a_keyboard_interrupt_on_one_device(transport, mode,
                                                      scenario):
  """Issue 61, defects 1 and 2: in the synchronous mode, Ctrl-C during a
  jitted loop whose tap sleeps ended with the computation's runtime error
  blaming the tap ("the tap function tick raised KeyboardInterrupt") and 25
  lines of JAX's frames before the KeyboardInterrupt; in a loop of jitted
  steps at the top of the program, the process exited with status 1 after
  printing the error's repr and `lost sys.stderr`. Now both end as Python
  ends on Ctrl-C: the KeyboardInterrupt, at the program's line, and the
  status of SIGINT. In the outfeed mode, queued taps left make it the
  exit's report and status 130 instead; the loop's computation may have
  ended (its taps wait in the queue) and the Ctrl-C end the drain at exit,
  with nothing before the report."""
  status, lines, seconds = _interrupted_child(
      _INTERRUPTED_PROGRAMS[scenario], transport, mode, 1,
      lambda lines: "start" in lines, delay=1.0, again_after=10)
  lines = _without_lost_ctrl_c(lines)
  assert seconds < 30, _text(lines)
  if status == -signal.SIGINT:
    _keyboard_interrupt_as_python_prints_it(lines)
    return
  assert status == 130 and mode == "outfeed", _text(lines)
  why = ("Ctrl-C ended the drain at exit" if "ended the drain" in _text(lines)
         else "Ctrl-C ended the program")
  before, queues, _ = _report(why, lines)
  assert sum(dropped for _, _, dropped in queues.values()) > 0, _text(lines)
  if why == "Ctrl-C ended the program":
    _keyboard_interrupt_as_python_prints_it(before)
  else:
    assert before == ["start"], _text(lines)


def test_ctrl_c_stays_a_keyboard_interrupt_beside_an_audit_hook(transport):
  """Seen on a GPU machine, where filelock installs an audit hook: the
  re-armed Ctrl-C tripped in that hook while Python reported the cancelled
  computation's error (the `sys.excepthook` event), where Python drops it
  ("Exception ignored in audit hook"), and the program ended with the
  error, `CANCELLED ...`, and status 1. It ends as Ctrl-C ends one."""
  for _ in range(3):  # the trip lands in the hook most times, not always
    status, lines, _ = _interrupted_child(
        "import sys\nsys.addaudithook(lambda event, args: None)\n" +
        _INTERRUPTED_PROGRAMS["steps"], transport, "synchronous", 1,
        lambda lines: "start" in lines, delay=1.0, again_after=10)
    assert status == -signal.SIGINT, _text(lines)
    _keyboard_interrupt_as_python_prints_it(lines)


@pytest.mark.parametrize("mode", ["synchronous", "outfeed"])
def test_the_exit_report_counts_executions_still_running(transport, mode):
  """Issue 61, defect 3: Ctrl-C during a pmap over 4 devices of a long scan
  with a tap per step: the report said `device executions still running:
  0` in the synchronous mode (the refused taps ended them before it was
  read) and 4 in the outfeed mode. It counts what ran when the exit began:
  4 in both."""
  devices = 4
  status, lines, _ = _interrupted_child(
      f"DEVICES = {devices}\n" + _INTERRUPTED_PROGRAMS["pmap"], transport,
      mode, devices, lambda lines: "start" in lines, delay=2.0, again_after=10)
  lines = _without_lost_ctrl_c(lines)
  assert status == 130, _text(lines)
  before, queues, executions = _report("Ctrl-C ended the program", lines)
  _keyboard_interrupt_as_python_prints_it(before)
  assert set(queues) == set(range(devices)), _text(lines)
  assert all(ran > 0 for ran, _, _ in queues.values()), _text(lines)
  if executions is not None:
    assert executions == devices, _text(lines)


def test_both_transports_cancel_with_one_message():
  """A computation that Ctrl-C cancelled fails with a message that begins
  the same on both transports: the barrier and the exit recognise it."""
  from host_callback.receiver import ctrl_c, native_library  # pylint: disable=import-outside-toplevel
  if native_library.native is None:
    pytest.skip("the native module is not built")
  assert native_library.native.CTRL_C_CANCELLED == ctrl_c.CANCELLED
