"""The two modes of `jax_host_callback_outfeed`: synchronous (the CPU
default, as the original's CustomCall mode) and outfeed (asynchronous)."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from helpers import (Recorder, cpu_devices, keep_busy,
                     needs_cpu_default_backend, run_python)


@pytest.fixture(autouse=True)
def _cpu_default_backend():
  # The tests jit on the default backend, and set the mode themselves.
  needs_cpu_default_backend("the synchronous mode exists on CPU only")


def _slow_append(log):
  def tap(arg, transforms):
    del transforms
    time.sleep(0.2)
    log.append(int(arg))
  return tap


def test_the_cpu_default_is_synchronous(transport):
  done = run_python("""
      import time, jax, jax.numpy as jnp
      import host_callback as hcb
      from host_callback import settings
      log = []
      tap = lambda a, t: (time.sleep(.3), log.append(int(a)))
      jax.jit(lambda x: hcb.id_tap(tap, x, result=x + 1))(jnp.int32(1))
      print(log, settings.outfeed_mode("cpu"), settings.outfeed_mode("gpu"),
            settings.outfeed_mode("tpu"))
      """, env={"JAX_HOST_CALLBACK_OUTFEED": None}, transport=transport)
  assert done.stdout.splitlines() == ["[1] False True True"], done.stderr


@pytest.mark.parametrize("outfeed", [False, True])
def test_jitted_and_eager_taps_have_run_when_the_call_returns(outfeed):
  jax.config.update("jax_host_callback_outfeed", outfeed)
  log = []
  f = jax.jit(lambda x: hcb.id_tap(_slow_append(log), x, result=x + 1))
  assert int(f(jnp.int32(1)).block_until_ready()) == 2
  hcb.id_tap(_slow_append(log), jnp.int32(2))
  if outfeed:
    assert log != [1, 2]  # still running on the receiver thread
  else:
    assert log == [1, 2]
  hcb.barrier_wait()
  assert log == [1, 2]


@pytest.mark.parametrize("outfeed", [False, True])
def test_where_a_tap_runs_and_whether_the_device_waits(outfeed, transport):
  """What the user guide says of each mode: synchronous, the device waits
  and the tap runs on the thread that runs the computation (the caller's,
  for a jitted call on one device); outfeed, the jitted call returns while
  the tap function still runs, on the device's receiver thread."""
  jax.config.update("jax_host_callback_outfeed", outfeed)
  started, release, ran_on = threading.Event(), threading.Event(), []

  def tap(arg, transforms):
    ran_on.append(threading.current_thread().name)
    started.set()
    if outfeed:
      release.wait(60)

  step = jax.jit(lambda x: hcb.id_tap(tap, x * 2))
  ran_when_returned = []

  def call():
    step(jnp.int32(1)).block_until_ready()
    ran_when_returned.append(list(ran_on))

  caller = threading.Thread(target=call, name="caller")
  caller.start()
  caller.join(60)  # in the outfeed mode the tap function is held meanwhile
  assert not caller.is_alive()
  if outfeed:
    assert started.wait(60)
    assert ran_on == [f"host_callback_{transport}_receiver_0"]
    release.set()
  else:
    assert ran_when_returned == [["caller"]]
  hcb.barrier_wait()


def test_synchronous_taps_on_an_xla_thread_keep_its_thread_state(transport):
  """A scan dispatched behind a running computation runs on one of XLA's
  threads, which Python did not start. Its host functions all run in that
  thread's one Python thread state, as on Python's own threads: what a
  tap function keeps per thread (a `threading.local`) lasts from one tap to
  the next. (A state made and freed for each tap also cost several times
  the tap.)"""
  if transport == "python":
    pytest.skip("the Python transport's synchronous taps are JAX's own "
                "callbacks, which take the GIL themselves")
  jax.config.update("jax_host_callback_outfeed", False)
  kept, seen = threading.local(), []

  def tap(arg, transforms):
    del transforms
    seen.append((threading.get_ident(), getattr(kept, "step", None)))
    kept.step = int(arg)

  scan = jax.jit(lambda x: jax.lax.scan(
      lambda c, _: (hcb.id_tap(tap, c) + 1, None), x, None, length=20)[0])
  y = jnp.full((700, 700), 1e-3, jnp.float32)

  def not_ready_zero():
    return (keep_busy(y)[0, 0] * 0).astype(jnp.int32)
  jax.block_until_ready(scan(not_ready_zero()))  # compile
  kept = threading.local()  # the compiling run may have used the same thread
  seen.clear()
  scan(not_ready_zero()).block_until_ready()
  threads = {ident for ident, _ in seen}
  assert len(threads) == 1 and threading.get_ident() not in threads
  assert [step for _, step in seen] == [None, *range(19)]


def test_synchronous_taps_keep_program_order_in_control_flow():
  jax.config.update("jax_host_callback_outfeed", False)
  log = []

  def tap(tag):
    return lambda v: hcb.id_tap(lambda a, _: log.append((tag, int(a))), v)

  @jax.jit
  def f(x):
    x = jax.lax.while_loop(lambda v: tap("pred")(v) < 2,
                           lambda v: tap("body")(v) + 1, x)
    x = jax.lax.cond(x > 0, tap("cond_true"), tap("cond_false"), x)
    return jax.lax.scan(lambda c, _: (tap("scan")(c) + 1, None), x, None,
                        length=2)[0]

  assert int(f(jnp.int32(0))) == 4
  assert log == [("pred", 0), ("body", 0), ("pred", 1), ("body", 1),
                 ("pred", 2), ("cond_true", 2), ("scan", 2), ("scan", 3)]


def test_synchronous_tap_outputs_are_its_operands():
  """As in the original (whose custom call returned its operands untouched),
  a synchronous tap's outputs are its operands: computation on them need not
  wait for the tap function, and the jitted call still returns only after
  every tap function ran."""
  jax.config.update("jax_host_callback_outfeed", False)
  state = []

  @jax.jit
  def f(x):
    y = hcb.id_tap(_slow_append(state), x)
    z = hcb.id_tap(_slow_append(state), x, result=x * 2)
    return y + z

  assert int(f(jnp.int32(7))) == 21
  assert state == [7, 7]  # no barrier_wait: the call waited for them
  text = f.lower(jnp.int32(7)).as_text()
  assert "output_operand_alias" not in text


def test_synchronous_tap_function_that_raises_fails_the_computation():
  jax.config.update("jax_host_callback_outfeed", False)

  def broken_tap(arg, transforms):
    raise ValueError("boom")

  with pytest.raises(Exception, match="broken_tap") as info:
    jax.jit(lambda x: hcb.id_tap(broken_tap, x) + 1)(1).block_until_ready()
  assert "ValueError: boom" in str(info.value)
  hcb.barrier_wait()  # raised once, as in the original (tests/test_errors.py)
  assert int(jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x) + 1)(1)) == 2


def test_mode_switch_takes_effect_at_the_next_compilation():
  log = []
  f = jax.jit(lambda x: hcb.id_tap(_slow_append(log), x))
  jax.config.update("jax_host_callback_outfeed", True)
  f(jnp.int32(1)).block_until_ready()
  assert log == []
  hcb.barrier_wait()
  jax.config.update("jax_host_callback_outfeed", False)
  f(jnp.int32(2)).block_until_ready()
  assert log == [1, 2]


def test_synchronous_mode_keeps_device_index_and_pmap_devices():
  jax.config.update("jax_host_callback_outfeed", False)
  recorder = Recorder()
  devices = cpu_devices(4)
  out = jax.pmap(lambda x: hcb.id_tap(recorder, x * 2, tap_with_device=True),
                 devices=devices)(jnp.arange(4))
  assert [int(v) for v in out] == [0, 2, 4, 6]
  assert sorted((d.id, int(a)) for a, _, d in recorder.calls) == [
      (d.id, 2 * i) for i, d in enumerate(devices)]


def test_pmap_returns_before_its_taps_and_the_barrier_waits_for_them(
    both_modes):
  """As the mode table says: a computation over several devices returns
  before its taps ran, in either mode, and barrier_wait() waits for all."""
  log = []
  pmapped = jax.pmap(
      lambda x: hcb.id_tap(_slow_append(log), x[0], result=x),
      devices=cpu_devices(4))
  pmapped(jnp.arange(4).reshape(4, 1))
  assert len(log) < 4  # each tap function sleeps 0.2 s
  hcb.barrier_wait()
  assert sorted(log) == [0, 1, 2, 3]


def test_queue_statistics_is_empty_until_the_outfeed_mode_is_used(
    transport):
  """As its docstring says: in the synchronous mode nothing is queued."""
  done = run_python("""
      import jax, jax.numpy as jnp
      import host_callback as hcb
      tap = jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x))
      tap(jnp.int32(1))
      print(hcb.queue_statistics())
      jax.config.update("jax_host_callback_outfeed", True)
      tap(jnp.int32(1))
      hcb.barrier_wait()
      print(sorted(name for name, _ in hcb.queue_statistics()))
      """, env={"JAX_HOST_CALLBACK_OUTFEED": None}, transport=transport)
  assert done.stdout.splitlines() == ["{}", f"['{transport}']"], done.stderr


@pytest.mark.parametrize("outfeed", [False, True])
def test_a_call_never_overtakes_the_taps_before_it(outfeed):
  """A request may run its host function on the device thread, but only once
  the taps queued before it on the device have run."""
  jax.config.update("jax_host_callback_outfeed", outfeed)
  seen = []

  def slow(arg, transforms):
    del transforms
    time.sleep(0.001)
    seen.append(int(arg))

  @jax.jit
  def f(x):
    x = jax.lax.fori_loop(0, 50, lambda i, v: hcb.id_tap(slow, v + 1), x)
    return hcb.call(lambda _: np.int32(len(seen)), x, result_shape=x)

  assert int(f(jnp.int32(0))) == 50
  assert seen == list(range(1, 51))


@pytest.mark.parametrize("outfeed", [False, True])
def test_host_function_running_jax_with_calls_on_its_device(outfeed,
                                                            transport):
  if transport != "native":
    pytest.skip("the python transport hands every request to the receiver "
                "thread, which is busy running the outer host function")
  jax.config.update("jax_host_callback_outfeed", outfeed)
  inner = jax.jit(lambda x: hcb.call(lambda a: a * 10, x, result_shape=x))

  def host(a):
    return np.float32(inner(jnp.float32(a)).item() + 1)

  assert float(jax.jit(lambda x: hcb.call(host, x, result_shape=x))(
      jnp.float32(2))) == 21.0
