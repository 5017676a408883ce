"""A KeyboardInterrupt fails only the computation whose host function it
stopped, and reaches only the thread that waits on it (each case in a fresh
interpreter, so that a stray interrupt cannot hit the test run)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import CTRL_C_INTERRUPTED, CTRL_C_OUTCOME, OUTFEED, run_python
from host_callback import host_side, transport_policy


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


@pytest.mark.parametrize("blocked", ["tap", "call"])
@pytest.mark.parametrize("devices", [1, 4])
@pytest.mark.parametrize("mode", ["synchronous", "outfeed"])
def test_ctrl_c_ends_the_drain_at_exit(transport, mode, devices, blocked):
  """Issue 42 item 1: a host function blocked for ever at exit; one Ctrl-C
  during the drain ends it, says what it left, and the process exits (it
  ignored Ctrl-C: the stop after the interrupted barrier waited again, and
  the barrier's probe over several devices waited in C++)."""
  code = (f"BLOCKED, DEVICES, OUTFEED = {blocked!r}, {devices}, "
          f"{mode == 'outfeed'}\n" + _BLOCKED_AT_EXIT)
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             JAX_HOST_CALLBACK_TRANSPORT=transport,
             JAX_HOST_CALLBACK_OUTFEED="1" if mode == "outfeed" else "0",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  child = subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  try:
    assert child.stdout.readline() == "exiting\n"
    time.sleep(0.5)  # in the drain
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=10)
  finally:
    child.kill()
  assert child.returncode == 0, stderr
  if mode == "outfeed" and blocked == "tap":  # a receiver thread runs them
    queued = ", ".join(f"1 tap or call on device {d} ({transport} transport)"
                       for d in range(devices))
    running = 0
  else:  # the devices run them
    queued, running = "nothing queued", devices
  if not transport_policy.native_on_cpu():
    running = 0  # counted with the native library only
  assert stderr.splitlines()[-1] == (
      f"host_callback: Ctrl-C ended the drain at exit; left undelivered: "
      f"{queued}; device executions still running: {running}"), stderr
  assert stdout == ""


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
