"""Every route that runs a host function counts it in one store: the
queue's `QueueRuns`, whose slots the native runner updates in place."""

import jax
import jax.numpy as jnp
import pytest

import host_callback as hcb
from host_callback.host import host_side
from host_callback.receiver import native_library, run_counts

pytestmark = pytest.mark.usefixtures("both_modes")


def test_the_native_runner_uses_the_slots_of_the_counts():
  native = native_library.native
  if native is None:
    pytest.skip("the native module is not built")
  assert native.RUN_SLOTS == (run_counts.RAN, run_counts.RUNNING,
                              run_counts.BEGUN_QUEUED, run_counts.REFUSED,
                              run_counts.SLOTS)


def test_every_run_of_a_tap_is_counted_once(transport):
  """Direct runs (the synchronous mode), receiver threads and guests (the
  outfeed mode) all count in the same queue's counts: after the barrier,
  each tap ran once and nothing runs or was dropped."""
  seen = []
  step = jax.jit(lambda x: hcb.id_tap(lambda v, _: seen.append(int(v)), x) + 1)
  device = jax.devices()[0]
  hcb.barrier_wait()
  runs = host_side.runtime.runs
  key = (transport, device.id)
  before = runs.left({}).get(key, run_counts.Left(0, 0, 0)).ran
  x = jax.device_put(jnp.int32(0), device)
  for _ in range(7):
    x = step(x)
  hcb.barrier_wait()
  assert seen == list(range(7))
  left = runs.left({})[key]
  assert (left.ran - before, left.running) == (7, 0)
