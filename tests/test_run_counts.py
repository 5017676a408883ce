"""Every route that runs a host function counts it in one store: the
queue's `QueueRuns`, whose slots the native runner updates in place."""

import jax
import jax.numpy as jnp
import pytest

import host_callback as hcb
from host_callback.barrier import barrier
from host_callback.host import host_side
from host_callback.host.device_numbers import device_number
from host_callback.receiver import native_library, run_counts
from helpers import no_barrier_probe_on

pytestmark = pytest.mark.usefixtures("both_modes")


def test_the_native_runner_uses_the_slots_of_the_counts():
  native = native_library.native
  if native is None:
    pytest.skip("the native module is not built")
  assert native.RUN_SLOTS == (run_counts.RAN, run_counts.RUNNING,
                              run_counts.BEGUN_QUEUED, run_counts.REFUSED,
                              run_counts.SLOTS)


@pytest.fixture(params=["probes", "markers"])
def barrier_route(request, monkeypatch):
  """How the barriers wait for the default device: on a CPU by its probe,
  or ("markers") with a marker tap through each open queue, as for a
  device that is not a CPU (pretended on a CPU: it gets no probe, as a
  GPU gets none). A marker's tap runs on the device's queue, and counts
  there."""
  if request.param == "markers" and jax.default_backend() == "cpu":
    with no_barrier_probe_on(monkeypatch, device_number(jax.devices()[0])):
      yield request.param
  else:
    yield request.param


def _markers_sent(key: run_counts.QueueKey) -> int:
  """The barriers' marker taps dispatched so far to the queue `key`."""
  # pylint: disable=protected-access
  return barrier._markers._dispatched.get(key, 0)


@pytest.mark.usefixtures("barrier_route")
def test_every_run_of_a_tap_is_counted_once(transport):
  """Direct runs (the synchronous mode), receiver threads and guests (the
  outfeed mode) all count in the same queue's counts: after the barrier,
  each tap ran once, beside the barrier's own markers, and nothing runs or
  was dropped. A queue's counts are under its device's number (a GPU's is
  not its id: device_numbers.py)."""
  seen = []
  step = jax.jit(lambda x: hcb.id_tap(lambda v, _: seen.append(int(v)), x) + 1)
  device = jax.devices()[0]
  hcb.barrier_wait()
  runs = host_side.runtime.runs
  key = (transport, device_number(device))
  before = runs.left({}).get(key, run_counts.Left(0, 0, 0)).ran
  markers_before = _markers_sent(key)
  x = jax.device_put(jnp.int32(0), device)
  for _ in range(7):
    x = step(x)
  hcb.barrier_wait()
  assert seen == list(range(7))
  left = runs.left({})[key]
  markers = _markers_sent(key) - markers_before
  assert (left.ran - before - markers, left.running) == (7, 0)
