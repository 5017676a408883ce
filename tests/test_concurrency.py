"""Several Python threads dispatching to different (CPU) devices at once.

Every test here runs in the outfeed and in the synchronous mode.
"""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb

from helpers import Recorder, cpu_devices

pytestmark = pytest.mark.usefixtures("both_modes")

CALLS_PER_THREAD = 20
STEPS = 25


def test_threads_on_different_devices_lose_nothing_and_keep_order():
  tap = Recorder()

  @jax.jit
  def run(start):
    def body(carry, _):
      hcb.id_tap(tap, carry, tap_with_device=True)
      return carry + 1, None
    return jax.lax.scan(body, start, None, length=STEPS)[0]

  devices = cpu_devices(4)
  def dispatch(device):
    outputs = [run(jax.device_put(np.int32(call * STEPS), device))
               for call in range(CALLS_PER_THREAD)]
    # A barrier covers the computations that other threads dispatched once
    # they have begun (docs/architecture.md, "What the barrier cannot see").
    jax.block_until_ready(outputs)

  threads = [threading.Thread(target=dispatch, args=(d,)) for d in devices]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  # A barrier from this (another) thread covers every thread's taps, also
  # those still queued in the outfeed mode.
  hcb.barrier_wait()
  expected = list(range(CALLS_PER_THREAD * STEPS))
  assert tap.by_device() == {d.id: expected for d in devices}


def test_barrier_from_another_thread_while_dispatching():
  received = []
  f = jax.jit(lambda x: hcb.id_tap(lambda a, _: received.append(int(a)), x))
  results = []

  def dispatch():
    for i in range(50):
      f(jnp.int32(i))
    waiter = threading.Thread(target=lambda: results.append(
        (hcb.barrier_wait(), len(received))))
    waiter.start()
    waiter.join()

  thread = threading.Thread(target=dispatch)
  thread.start()
  thread.join()
  assert results == [(None, 50)]
  assert received == list(range(50))
  np.testing.assert_array_equal(f(jnp.int32(7)), 7)
