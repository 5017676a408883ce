"""Host functions are compiled once and released when no longer used.

As in the original, whose registry was keyed by the callable: equal host
functions (same callable, same trees, same flags) share one compilation,
and a host function that no computation can call any more stops pinning
memory, after its queued packets have been delivered.
"""

import gc
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from helpers import Recorder


@pytest.fixture
def compiles():
  """Counts XLA compilations (jax.monitoring's backend compile events)."""
  events = []

  def listener(event, duration, **_):
    del duration
    if event == "/jax/core/compile/backend_compile_duration":
      events.append(event)

  jax.monitoring.register_event_duration_secs_listener(listener)
  yield events
  jax.monitoring.unregister_event_duration_listener(listener)


def test_eager_taps_and_calls_of_one_function_compile_once(compiles,
                                                           both_modes):
  rec = Recorder()
  x = jnp.float32(1.)
  host = lambda v: v + 1  # noqa: E731
  hcb.id_tap(rec, x)
  hcb.call(host, x, result_shape=x)
  hcb.id_print(x, what="eager")
  hcb.barrier_wait()  # compiles its markers once
  before = len(compiles)
  for _ in range(3):
    hcb.id_tap(rec, x)
    assert float(hcb.call(host, x, result_shape=x)) == 2.
    hcb.id_print(x, what="eager")
  hcb.barrier_wait()
  assert len(compiles) == before
  assert len(rec.args) == 4


class _Logger:
  def __init__(self) -> None:
    self.seen = []

  def tap(self, arg, transforms) -> None:
    del transforms
    self.seen.append(int(arg))


def test_bound_methods_of_one_object_are_one_host_function(compiles,
                                                            both_modes):
  logger = _Logger()
  hcb.id_tap(logger.tap, 0)
  hcb.barrier_wait()
  before = len(compiles)
  for i in range(1, 4):
    hcb.id_tap(logger.tap, i)  # a new bound method object each time
  hcb.barrier_wait()
  assert len(compiles) == before
  assert logger.seen == [0, 1, 2, 3]


def _collect_and_barrier() -> None:
  jax.clear_caches()
  gc.collect()
  hcb.barrier_wait()


class _Payload:
  """A large object that a host function's closure keeps."""

  def __init__(self) -> None:
    self.data = np.zeros(1 << 20, np.uint8)


@pytest.mark.parametrize("op", ["eager_tap", "jit_tap", "jit_call"])
def test_dropped_host_functions_release_their_closures(op, both_modes):
  payloads = [_Payload() for _ in range(5)]
  refs = [weakref.ref(p) for p in payloads]
  for payload in payloads:
    def host(arg, *_, payload=payload):
      del payload
      return arg
    if op == "eager_tap":
      hcb.id_tap(host, jnp.float32(1.))
    elif op == "jit_tap":
      jax.jit(lambda v: hcb.id_tap(host, v))(jnp.float32(1.))
    else:
      jax.jit(lambda v: hcb.call(host, v, result_shape=v))(jnp.float32(1.))
  del payloads, payload, host
  _collect_and_barrier()
  _collect_and_barrier()  # released at the barrier after they were retired
  assert [r() for r in refs] == [None] * 5


def test_taps_queued_before_their_function_is_dropped_are_delivered(
    outfeed_mode):
  """Dropping a jitted function (and JAX's caches) while its taps wait in
  the queue loses nothing."""
  started, release = threading.Event(), threading.Event()
  seen = []

  def slow(arg, _):
    started.set()
    release.wait(30)
    seen.append(int(arg))

  f = jax.jit(lambda v: hcb.id_tap(slow, v))
  for i in range(5):  # the outfeed mode: the taps wait in the queue
    f(jnp.int32(i))
  started.wait(30)
  ref = weakref.ref(slow)
  del f, slow
  jax.clear_caches()
  gc.collect()
  jnp.sin(jnp.float32(1.)).block_until_ready()
  jax.jit(lambda v: hcb.id_tap(lambda *_: None, v))(1.)  # registers: may release
  release.set()
  hcb.barrier_wait()
  assert seen == [0, 1, 2, 3, 4]
  _collect_and_barrier()
  assert ref() is None
