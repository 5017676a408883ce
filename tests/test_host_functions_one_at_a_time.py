"""A device's host functions run one at a time, also across a suspended
claim ("The queue protocol" in docs/architecture.md): a `call` run directly
on the device's thread whose JAX code makes a request of its own device
lets the consumer run the queued host functions meanwhile, and goes on
only once the consumer has finished what it took.

Each test runs on both transports and in both modes.
"""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from helpers import cpu_devices, on_a_cpu_device

# A hang would be inside a host callback, where the default (signal) method
# cannot interrupt it: the thread method ends the run instead.
pytestmark = pytest.mark.timeout(60, method="thread")

_WAIT_SECONDS = 10.0


@pytest.fixture(autouse=True)
def _on_a_cpu():
  """The programs run on one CPU device whatever the default backend is,
  the arrays that host functions pass them too (set globally): on the GPU
  machine a host function's `ask(x)` of a NumPy array ran on the GPU, not
  behind the tap queued on the CPU device."""
  with on_a_cpu_device():
    yield


def _waiting(device) -> int:
  """Packets sent to `device` and not yet consumed, on any transport."""
  return sum(stats.packets_waiting
             for (_, on), stats in hcb.queue_statistics().items()
             if on == device)


def _wait_until(condition) -> None:
  deadline = time.monotonic() + _WAIT_SECONDS
  while not condition():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.001)


def test_a_resumed_call_waits_for_the_host_functions_run_meanwhile(
    transport, both_modes):
  """`outer`, a call's host function run directly, taps nothing itself
  but calls its device again (`answer`) after another thread's tap
  (`tap`) was queued: the consumer runs the tap, which calls the device in
  turn, and `answer` meanwhile. `outer` goes on only once the tap
  function has returned, though `answer` returned before it."""
  del transport, both_modes  # set first
  device = cpu_devices(1)[0]
  spans = {}  # name -> [start, end]: when each host function ran
  threads = {}  # name -> the thread that ran it
  now = time.perf_counter
  armed = threading.Event()  # not while the programs warm up

  def on_device(value):
    return jax.device_put(jnp.float32(value), device)

  def tap(x, transforms):
    if not armed.is_set():
      return
    spans["tap"] = [now(), None]
    threads["tap"] = threading.current_thread()
    _wait_until(lambda: _waiting(device) >= 2)  # this tap and `answer`
    # Served by this thread: the first after `answer`, which lets `outer`
    # resume, whichever batch each is in; the second after that.
    assert float(plus_one(x)) == 2.
    time.sleep(0.05)  # long enough for a resumed `outer` to show
    assert float(plus_one(x)) == 2.
    spans["tap"][1] = now()

  def answer(x):
    if not armed.is_set():
      return x
    spans["answer"] = [now(), now()]
    return x * 10

  tapper = jax.jit(lambda v: hcb.id_tap(tap, v))
  plus_one = jax.jit(lambda v: hcb.call(lambda a: a + 1, v, result_shape=v))
  ask = jax.jit(lambda v: hcb.call(answer, v, result_shape=v))

  # Its tap waits in the synchronous mode: joined once `outer` returned.
  tapping = threading.Thread(
      target=lambda: jax.block_until_ready(tapper(on_device(1.))))

  def outer(x):
    spans["outer"] = [now(), None]
    threads["outer"] = threading.current_thread()
    tapping.start()
    _wait_until(lambda: _waiting(device) >= 1)  # the tap is queued
    spans["outer"][1] = now()
    got = float(ask(x))  # suspends the claim until answered
    spans["outer resumed"] = [now(), None]
    time.sleep(0.05)  # long enough for a host function beside it to show
    spans["outer resumed"][1] = now()
    return np.float32(got)

  # Compiled first: each program then runs as soon as it is called.
  for program in (tapper, plus_one, ask):
    jax.block_until_ready(program(on_device(0.)))
  hcb.barrier_wait()
  armed.set()
  out = jax.jit(lambda v: hcb.call(outer, v, result_shape=v))(on_device(3.))
  tapping.join(_WAIT_SECONDS)
  hcb.barrier_wait()
  assert float(out) == 30.
  assert None not in sum(spans.values(), [])
  assert threads["outer"] is not threads["tap"]  # `outer` ran directly
  # `outer` ran before the tap; the tap function ran `answer` inside it.
  assert spans["outer"][1] <= spans["tap"][0]
  assert spans["tap"][0] <= spans["answer"][0] <= spans["tap"][1]
  # The resumed `outer` ran after the tap function, never beside it.
  assert spans["tap"][1] <= spans["outer resumed"][0], spans
