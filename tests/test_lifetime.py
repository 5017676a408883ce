"""Host functions are compiled once and released when no longer used.

As in the original, whose registry was keyed by the callable: equal host
functions (same callable, same trees, same flags) share one compilation,
and a host function that no computation can call any more stops pinning
memory, after its queued packets have been delivered.
"""

import functools
import gc
import inspect
import io
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax._src import dispatch

import host_callback as hcb
from host_callback.host import host_side
from helpers import (Recorder, cpu_devices, needs_cpu_default_backend,
                     wait_until)


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


# --- Issue 23 item 1: a host function and its closure are freed once no
# jaxpr, executable or pending packet uses it. ------------------------------

def _closure_over_payload(op):
  """Runs `op` with a host function whose closure alone holds a payload;
  returns a weak reference to the payload."""
  payload = _Payload()
  ref = weakref.ref(payload)
  x = jnp.arange(3.)
  tap = lambda a, t: payload  # noqa: E731
  host = lambda a: (payload, a)[1]  # noqa: E731
  stream = io.StringIO()
  if op == "jit_tap":
    f = jax.jit(lambda v: hcb.id_tap(tap, v))
  elif op == "jit_print":
    f = jax.jit(lambda v: hcb.id_print(v, what=payload, output_stream=stream))
  elif op == "jit_call":
    f = jax.jit(lambda v: hcb.call(host, v, result_shape=v))
  elif op == "eager_tap":
    f = lambda v: hcb.id_tap(tap, v)  # noqa: E731
  elif op == "eager_print":
    f = lambda v: hcb.id_print(v, what=payload, output_stream=stream)  # noqa: E731
  else:
    f = lambda v: hcb.call(host, v, result_shape=v)  # noqa: E731
  jax.block_until_ready(f(x))
  return ref


_OPS = ["jit_tap", "jit_print", "jit_call", "eager_tap", "eager_print",
        "eager_call"]


@pytest.mark.parametrize("op", _OPS)
def test_closure_is_freed_after_barrier_clear_caches_and_collect(both_modes,
                                                                 op):
  """The issue's order: the barrier runs before the host function dies (in
  jax.clear_caches or gc.collect), and nothing of ours runs after it."""
  ref = _closure_over_payload(op)
  hcb.barrier_wait()
  jax.clear_caches()
  gc.collect()
  assert ref() is None


def _holders(obj, depth: int = 8, most: int = 12) -> str:
  """What keeps `obj` alive: chains of its referrers, `depth` deep (for a
  failing assertion's message: on a GPU the closure stays, and why is
  not known yet, docs/gpu.md)."""
  chains, ours = [], set()

  def describe(o):
    name = getattr(o, "__qualname__", None)
    if isinstance(o, dict):
      return f"dict{sorted(map(str, o))[:4]}"
    return type(o).__name__ + (f" {name}" if isinstance(name, str) else "")

  def walk(o, chain):
    referrers = [r for r in gc.get_referrers(o)
                 if not inspect.isframe(r) and id(r) not in ours]
    ours.add(id(referrers))
    if len(chain) == depth or not referrers:
      chains.append(" <- ".join(chain))
      return
    for index in range(min(3, len(referrers))):  # no list or iterator
      if len(chains) < most:
        walk(referrers[index], chain + [describe(referrers[index])])

  walk(obj, [describe(obj)])
  return "\n".join(chains)


@pytest.mark.parametrize("op", _OPS)
def test_closure_is_freed_with_its_jitted_function(both_modes, op):
  """As with jax.debug.callback: no jax.clear_caches() needed."""
  ref = _closure_over_payload(op)
  gc.collect()
  hcb.barrier_wait()
  gc.collect()
  if jax.default_backend() != "cpu":
    # On CPU the computation ran to completion at its dispatch. Elsewhere
    # the client holds the executable's host callbacks (one of which holds
    # the host function) until the execution's status is ready, and lets
    # go of them on its own thread, maybe after the last tap has run; the
    # barrier lets JAX drop the execution's runtime token (tested below).
    if (not wait_until(lambda: _collected(ref), timeout=10) and
        not _debug_callback_closure_freed()):
      pytest.skip(f"on {jax.default_backend()}, JAX keeps a jitted "
                  "function's jax.debug.callback closure too")
  assert ref() is None, _holders(ref())


@pytest.fixture
def runtime_tokens():
  """This thread's JAX runtime tokens by device, empty before and after."""
  tokens = dispatch.runtime_tokens.output_runtime_tokens
  tokens.clear()
  yield tokens
  tokens.clear()


@pytest.mark.parametrize("op", ["jit_tap", "jit_call"])
def test_barrier_lets_jax_drop_the_runtime_tokens_of_finished_runs(
    both_modes, op, runtime_tokens):
  """JAX keeps, per device, the runtime token of the last computation with
  host callbacks that took its Python dispatch (a jitted function's first
  call does); on a GPU it may keep the computation's host functions alive.
  The barrier drops the tokens of the devices it waited for, as
  jax.effects_barrier() drops all."""
  _closure_over_payload(op)
  device = jax.devices()[0]
  assert device in runtime_tokens
  hcb.barrier_wait()
  assert device not in runtime_tokens


class _FailedRun:
  """Stands for the runtime token of a computation that failed: JAX raises
  its error again at jax.effects_barrier()."""

  def block_until_ready(self) -> None:
    raise RuntimeError("a computation failed")


def test_barrier_keeps_the_tokens_of_failed_runs(both_modes, runtime_tokens):
  """Only JAX raises a foreign failure again: its token stays."""
  finished, failing = cpu_devices(2)
  for device in (finished, failing):
    jax.block_until_ready(jax.jit(lambda v: hcb.id_tap(Recorder(), v))(
        jax.device_put(jnp.arange(3.), device)))
  failed = runtime_tokens[failing] = _FailedRun()
  assert finished in runtime_tokens
  hcb.barrier_wait()
  assert runtime_tokens == {failing: failed}


class _NeverWaitedFor:
  """Stands for a device no queue of ours is open on, and its token (of a
  finished computation), which the barrier must neither wait for nor drop."""
  platform, id = "cpu", 10_000
  waited = False

  def block_until_ready(self) -> None:
    self.waited = True


def test_barrier_keeps_the_tokens_of_devices_it_did_not_wait_for(
    both_modes, runtime_tokens):
  jax.block_until_ready(jax.jit(lambda v: hcb.id_tap(Recorder(), v))(
      jnp.arange(3.)))
  other = _NeverWaitedFor()
  runtime_tokens[other] = other
  hcb.barrier_wait()
  assert runtime_tokens == {other: other} and not other.waited


def _debug_callback_closure_freed() -> bool:
  """Whether JAX frees a jitted jax.debug.callback's closure with the
  function (within 10 s), as the test above asks of ours."""
  payload = _Payload()
  ref = weakref.ref(payload)
  f = jax.jit(lambda v: jax.debug.callback(lambda a: (payload, a)[1], v))
  jax.block_until_ready(f(jnp.arange(3.)))
  jax.effects_barrier()
  del f, payload
  return wait_until(lambda: _collected(ref), timeout=10)


def _collected(ref) -> bool:
  """Whether `ref`'s object is gone after a collection."""
  gc.collect()
  return ref() is None


# --- Issue 23 item 2: eager taps, prints and calls compile nothing per host
# function. ------------------------------------------------------------------

def _eager_round(i, seen, stream):
  x = jnp.arange(3.)
  hcb.id_tap(functools.partial(_note, seen, i), x)
  hcb.id_print(x, what=i, output_stream=stream)
  y = hcb.call(functools.partial(_plus, i), x, result_shape=x)
  np.testing.assert_array_equal(y, np.arange(3.) + i)


def _note(seen, i, arg, transforms):
  del arg, transforms
  seen.append(i)


def _plus(i, arg):
  return arg + i


def test_eager_taps_prints_and_calls_of_new_functions_compile_nothing(
    both_modes, compiles):
  seen, stream = [], io.StringIO()
  _eager_round(0, seen, stream)
  hcb.barrier_wait()  # compiles its markers once
  before = len(compiles)
  with jax.log_compiles(True):
    for i in range(1, 4):
      _eager_round(i, seen, stream)
    hcb.barrier_wait()
  assert len(compiles) == before
  assert seen == [0, 1, 2, 3]
  assert stream.getvalue() == "".join(
      f"what: {i}\n[0. 1. 2.]\n" for i in range(4))


def test_eager_taps_keep_their_place_among_jitted_ones(both_modes):
  log = []
  f = jax.jit(lambda v: hcb.id_tap(lambda a, t: log.append(int(a)), v))
  for i in range(0, 8, 2):
    f(jnp.int32(i))
    hcb.id_tap(lambda a, t, i=i: log.append(("eager", i + 1)), jnp.int32(i))
  hcb.barrier_wait()
  assert log == [v for i in range(0, 8, 2) for v in (i, ("eager", i + 1))]


def test_synchronous_eager_tap_waits_behind_taps_queued_on_its_device(
    outfeed_mode):
  """The device is busy: the eager tap is queued after what it sent."""
  needs_cpu_default_backend("the synchronous mode exists on CPU only")
  release, log = threading.Event(), []

  def slow(arg, transforms):
    del transforms
    release.wait(30)
    log.append(int(arg))

  f = jax.jit(lambda v: hcb.id_tap(slow, v))
  for i in range(3):  # the outfeed mode: queued
    f(jnp.int32(i))
  jax.config.update("jax_host_callback_outfeed", False)
  threading.Timer(0.2, release.set).start()
  hcb.id_tap(lambda a, t: log.append("eager"), jnp.int32(9))
  assert log == [0, 1, 2, "eager"]


def test_synchronous_eager_tap_that_raises_fails_once():
  """The caller gets the error; barrier_wait does not raise it again (as in
  the original's synchronous mode)."""
  needs_cpu_default_backend("the synchronous mode exists on CPU only")
  jax.config.update("jax_host_callback_outfeed", False)

  def broken_tap(arg, transforms):
    raise ValueError("boom")

  with pytest.raises(Exception, match="broken_tap") as info:
    hcb.id_tap(broken_tap, jnp.int32(1))
  assert "ValueError: boom" in str(info.value)
  hcb.barrier_wait()  # does not raise: the error reached the caller


def test_eager_taps_and_calls_under_disable_jit(both_modes):
  seen = []
  with jax.disable_jit():
    hcb.id_tap(lambda a, t: seen.append(int(a)), jnp.int32(3))
    assert int(hcb.call(lambda a: a + 1, jnp.int32(3),
                        result_shape=jnp.int32(0))) == 4
  hcb.barrier_wait()
  assert seen == [3]


def test_synchronous_eager_call_that_raises_names_it_and_chains_the_cause():
  needs_cpu_default_backend("the synchronous mode exists on CPU only")
  jax.config.update("jax_host_callback_outfeed", False)

  def my_func(x):
    raise KeyError("k")

  with pytest.raises(Exception, match="my_func raised KeyError") as info:
    hcb.call(my_func, jnp.float32(1.), result_shape=jnp.float32(1.))
  assert isinstance(info.value.__cause__, KeyError)
  hcb.barrier_wait()  # does not raise: the error reached the caller


def test_a_dropped_host_function_s_sites_are_freed(both_modes, transport):
  """Its transport forgets the sites of its compiled operations with it:
  the table of sites does not grow with every function compiled."""
  sites = host_side.transport(transport).sites
  hcb.barrier_wait()
  gc.collect()
  hcb.barrier_wait()
  before = set(sites)
  step = jax.jit(lambda x: hcb.id_tap(lambda v, _: None, x * 2))
  step(jnp.float32(1.))
  hcb.barrier_wait()
  assert set(sites) > before
  del step
  jax.clear_caches()
  gc.collect()
  hcb.barrier_wait()  # frees what was retired
  assert set(sites) <= before
