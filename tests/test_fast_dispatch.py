"""Our own ordering token: no JAX effect at the top level, AOT executables,
barriers through the devices, and stop/restart races."""

import logging
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import host_callback as hcb
from host_callback.host import transport_policy
from helpers import (Recorder, cpu_devices, needs_cpu_default_backend,
                     synchronous)

# Every test here runs in the outfeed and in the synchronous mode.
pytestmark = pytest.mark.usefixtures("both_modes")


def _executable_effects(compiled):
  """The JAX effects of a compiled executable (what decides whether JAX's
  C++ fast path may dispatch it; jax._src.pjit._get_fastpath_data)."""
  unsafe_call = compiled._executable.unsafe_call  # pylint: disable=protected-access
  return list(unsafe_call.ordered_effects), unsafe_call.has_unordered_effects


def _step_with_tap_and_call(recorder):
  def step(x):
    y = hcb.id_tap(recorder, jnp.sum(x))
    return hcb.call(lambda v: v + 1, y, result_shape=y)
  return step


def test_jitted_taps_and_calls_leave_no_jax_effect_in_the_executable():
  recorder = Recorder()
  lowered = jax.jit(_step_with_tap_and_call(recorder)).lower(jnp.ones(3))
  assert "stablehlo.token" not in lowered.as_text().split("{")[1].split(")")[0], (
      "the main function must take no runtime token")
  assert _executable_effects(lowered.compile()) == ([], False)


def test_other_jax_effects_keep_theirs_and_work_alongside_ours():
  recorder, seen = Recorder(), []

  def f(x):
    x = hcb.id_tap(recorder, x)
    io_callback(lambda v: seen.append(int(v)), None, x, ordered=True)
    jax.debug.print("x={x}", x=x, ordered=True)
    return hcb.id_tap(recorder, x + 1)

  compiled = jax.jit(f).lower(jnp.int32(1)).compile()
  ordered, _ = _executable_effects(compiled)
  assert ordered and all("HostCallback" not in str(e) for e in ordered)
  assert int(compiled(jnp.int32(1))) == 2
  hcb.barrier_wait()
  assert [int(a) for a in recorder.args] == [1, 2]
  assert seen == [1]


def test_aot_executable_runs_repeatedly_and_after_a_stop():
  recorder = Recorder()
  compiled = jax.jit(_step_with_tap_and_call(recorder)).lower(
      jnp.ones(3)).compile()
  for i in range(5):
    assert float(compiled(jnp.full(3, float(i)))) == 3 * i + 1
  hcb.stop_outfeed_receiver()
  for i in range(5, 8):
    assert float(compiled(jnp.full(3, float(i)))) == 3 * i + 1
  hcb.barrier_wait()
  assert [float(a) for a in recorder.args] == [3. * i for i in range(8)]


def test_unused_tap_in_jit_still_runs():
  recorder = Recorder()

  def f(x):
    hcb.id_tap(recorder, x)  # result discarded: must not be eliminated
    return x * 2

  assert int(jax.jit(f)(jnp.int32(4))) == 8
  hcb.barrier_wait()
  assert [int(a) for a in recorder.args] == [4]


def test_order_through_every_construct():
  """One computation mixing while, cond, scan, fori, nested jit, custom_jvp,
  custom_vjp and checkpoint keeps program order, run after run."""
  log = []

  def tap(tag):
    return lambda v: hcb.id_tap(lambda a, _: log.append((tag, int(a))), v)

  @jax.custom_jvp
  def cj(x):
    return tap("custom_jvp")(x)
  cj.defjvp(lambda p, t: (cj(p[0]), t[0]))

  @jax.custom_vjp
  def cv(x):
    return tap("custom_vjp")(x)
  cv.defvjp(lambda x: (cv(x), None), lambda _, g: (g,))

  @jax.jit
  def inner(x):
    return tap("nested_jit")(x)

  @jax.jit
  def f(x):
    x = jax.lax.while_loop(lambda v: tap("pred")(v) < 2,
                           lambda v: tap("body")(v) + 1, x)
    x = jax.lax.cond(x > 0, tap("cond_true"), tap("cond_false"), x)
    x, _ = jax.lax.scan(lambda c, _: (tap("scan")(c) + 1, None), x, None,
                        length=2)
    x = jax.lax.fori_loop(0, 2, lambda i, v: tap("fori")(v) + 1, x)
    x = inner(x)
    x = cv(cj(x))
    return jax.checkpoint(tap("checkpoint"))(x)

  expected = [("pred", 0), ("body", 0), ("pred", 1), ("body", 1), ("pred", 2),
              ("cond_true", 2), ("scan", 2), ("scan", 3), ("fori", 4),
              ("fori", 5), ("nested_jit", 6), ("custom_jvp", 6),
              ("custom_vjp", 6), ("checkpoint", 6)]
  for _ in range(5):
    log.clear()
    assert int(f(jnp.int32(0))) == 6
    hcb.barrier_wait()
    assert log == expected


def test_a_primitive_that_cannot_thread_the_token_is_named_in_the_error():
  """pallas_call gives its body no effect tokens: a tap there is refused at
  compile time with the primitive's name, before anything runs."""
  from jax.experimental import pallas as pl  # pylint: disable=import-outside-toplevel
  recorder = Recorder()

  def kernel(x_ref, o_ref):
    o_ref[...] = hcb.id_tap(recorder, x_ref[...]) + 1

  def f(x):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=True)(x)

  with pytest.raises(NotImplementedError,
                     match=r"inside `pallas_call` cannot be kept in order.*"
                           r"Move the tap or call outside of `pallas_call`"):
    jax.jit(f)(jnp.arange(4.))
  hcb.barrier_wait()
  assert recorder.args == []


def test_barrier_covers_computations_dispatched_by_another_thread():
  recorder = Recorder()
  step = jax.jit(lambda x: hcb.call(lambda v: v + 1, hcb.id_tap(
      lambda a, t: (recorder(a, t), threading.Event().wait(0.001)), x),
      result_shape=x))
  step(jnp.int32(-1))  # compile
  hcb.barrier_wait()
  recorder.calls.clear()

  def dispatch():
    for i in range(300):
      step(jnp.int32(i))  # never waits for its results

  thread = threading.Thread(target=dispatch)
  thread.start()
  thread.join()
  hcb.barrier_wait()
  assert [int(a) for a in recorder.args] == list(range(300))


def _sleep_then_identity(value):
  threading.Event().wait(0.3)
  return value


def test_barrier_waits_for_a_running_computation_between_its_callbacks():
  """The computation, dispatched by another thread, is inside a foreign op
  (no packet of ours in flight) when the barrier starts: the barrier still
  waits for its last tap."""
  needs_cpu_default_backend(
      "the barrier sees another thread's computation in flight by counting "
      "executions, which only computations on CPU do")
  seen = []

  @jax.jit
  def step(x):
    x = hcb.call(lambda v: (seen.append("call"), v)[1], x, result_shape=x)
    x = jax.pure_callback(_sleep_then_identity,
                          jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return hcb.id_tap(lambda v, t: seen.append("tap"), x)

  step(1.0)
  hcb.barrier_wait()
  seen.clear()
  thread = threading.Thread(target=step, args=(2.0,))
  thread.start()
  while not seen:
    threading.Event().wait(0.001)
  hcb.barrier_wait()
  assert seen == ["call", "tap"]
  thread.join()


@pytest.mark.parametrize("other_thread", [False, True])
def test_barrier_gives_up_on_a_computation_that_a_foreign_op_stopped(
    caplog, other_thread):
  """A raising jax.pure_callback stops the execution before our last op.
  Alone, the barrier sees at once that it failed (its probes show that
  every computation this thread dispatched has finished) and says so at
  INFO level; while another thread lives, which may be running one of its
  own computations, it waits 2 s for progress, warns once and returns.
  Later barriers do not wait."""
  needs_cpu_default_backend(
      "only computations on CPU count their executions, so elsewhere the "
      "barrier has none in flight to give up on")
  caplog.set_level(logging.INFO, logger="host_callback")
  def fail(value):
    raise ValueError("the host failed")

  @jax.jit
  def step(x):
    x = hcb.call(lambda v: v, x, result_shape=x)
    return jax.pure_callback(fail, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

  done = threading.Event()
  other = threading.Thread(target=done.wait, name="a user thread")
  if other_thread:
    other.start()
  try:
    with pytest.raises(Exception, match="pure_callback"):
      step(1.0).block_until_ready()
    started = time.monotonic()
    hcb.barrier_wait()
    hcb.barrier_wait()
    seconds = time.monotonic() - started
  finally:
    done.set()
  warnings = _stall_warnings(caplog)
  noticed = [r.getMessage() for r in caplog.records
             if "(their outputs hold the error)" in r.getMessage()]
  if "native" not in transport_policy.available_on_cpu():
    return  # executions are not counted
  if other_thread:
    other.join()
    assert len(warnings) == 1 and not noticed and seconds >= 2.0
    assert "1 computation(s) with taps or calls began" in warnings[0]
  else:
    assert not warnings and len(noticed) == 1 and seconds < 1.0
    assert noticed[0].startswith("host_callback.barrier_wait: 1 computation")


@pytest.mark.leaves_callback_error
def test_a_failing_host_function_ends_its_execution_for_the_barrier(caplog):
  """Our own op that fails stops the execution and counts it as ended: the
  barrier neither waits for it nor warns."""
  def fail(value):
    raise ValueError("the host failed")

  step = jax.jit(lambda x: hcb.call(fail, x, result_shape=x))
  with pytest.raises(Exception):
    step(1.0).block_until_ready()
  if not synchronous():  # the synchronous mode raises it once
    with pytest.raises(hcb.CallbackException):
      hcb.barrier_wait()
  hcb.barrier_wait()
  assert _stall_warnings(caplog) == []


def _stall_warnings(caplog) -> list:
  return [r.getMessage() for r in caplog.records
          if "made no progress" in r.getMessage()]


def test_stop_races_keep_order_and_one_consumer_per_device():
  seen, overlaps = [], []
  active = [0]
  lock = threading.Lock()

  def consume(arg, transforms):
    del transforms
    with lock:
      active[0] += 1
      if active[0] > 1:
        overlaps.append(int(arg))
    seen.append(int(arg))
    with lock:
      active[0] -= 1

  step = jax.jit(lambda x: hcb.id_tap(consume, x))
  step(jnp.int32(-1))
  hcb.barrier_wait()
  seen.clear()
  done = threading.Event()

  def dispatch():
    for i in range(1000):
      step(jnp.int32(i))
    done.set()

  thread = threading.Thread(target=dispatch)
  thread.start()
  stops = 0
  while not done.is_set() or stops < 3:
    hcb.stop_outfeed_receiver()
    stops += 1
  thread.join()
  hcb.barrier_wait()
  assert overlaps == []
  assert seen == list(range(1000))


@pytest.mark.parametrize("devices", [1, 4])
def test_idle_barrier_visits_the_open_device_queues(devices):
  recorder = Recorder()
  pmap_devices = cpu_devices(devices)
  out = jax.pmap(lambda x: hcb.id_tap(recorder, x, tap_with_device=True),
                 devices=pmap_devices)(jnp.arange(devices))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(devices))
  assert sorted(d.id for d in recorder.devices) == [
      d.id for d in pmap_devices]
  for _ in range(3):
    hcb.barrier_wait()  # nothing pending: returns, having sent markers
  stats = hcb.queue_statistics()
  assert all(s.packets_waiting == 0 for s in stats.values())
  assert np.all([s.bytes_waiting == 0 for s in stats.values()])
