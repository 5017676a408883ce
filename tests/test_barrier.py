"""barrier_wait without visiting the program's arrays: what an idle barrier
skips, and the cases a barrier that reads counters could miss (computations
whose inputs were not ready, over one or several devices, with their outputs
dropped; a long computation between two callbacks)."""

import inspect
import logging
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from host_callback.barrier import barrier, idle, probes
from host_callback.primitive import executions
from host_callback.host import host_side
from host_callback.host.device_numbers import zero_on
from helpers import (Recorder, cpu_devices, keep_busy,
                     needs_cpu_default_backend, no_barrier_probe_on)

pytestmark = pytest.mark.usefixtures("both_modes")


def _busy_input(device):
  x = jax.device_put(jnp.full((700, 700), 1e-3, jnp.float32), device)
  keep_busy(x).block_until_ready()  # compile
  return x


def _sent_and_begun():
  """Packets ever sent, per queue, and our executions ever begun."""
  sent = {(name, device_id): queues.packets_sent(device_id)
          for name, queues in host_side.runtime.transports().items()
          for device_id in queues.device_ids()}
  return sent, executions.counts()[0]


@pytest.mark.parametrize("device_index,thread", [
    (0, "main"), (3, "main"), (3, "another")])
def test_barrier_waits_for_a_step_whose_input_was_not_ready(device_index,
                                                            thread):
  """The step waits for `keep_busy`'s output; its outputs are dropped, so
  nothing the program holds refers to it. XLA's CPU client orders
  computations per device and per dispatching thread: a barrier covers what
  its own thread dispatched, on the main thread or another."""
  device = cpu_devices(4)[device_index]
  recorder = Recorder()
  step = jax.jit(lambda y: hcb.id_tap(recorder, jnp.sum(y[0, :3])))
  x = _busy_input(device)
  step(x)
  hcb.barrier_wait()
  recorder.calls.clear()
  received = []

  def dispatch_and_wait():
    for i in range(3):
      step(keep_busy(x) + i)  # output dropped at once
    hcb.barrier_wait()
    received.extend(float(a) for a in recorder.args)
  if thread == "main":
    dispatch_and_wait()
  else:
    dispatcher = threading.Thread(target=dispatch_and_wait)
    dispatcher.start()
    dispatcher.join()
  expected = [float(np.sum(keep_busy(x)[0, :3]) + 3 * i) for i in range(3)]
  np.testing.assert_allclose(received, expected, rtol=1e-5)


def test_barrier_waits_for_a_pmap_whose_input_was_not_ready():
  devices = cpu_devices(4)
  recorder = Recorder()
  step = jax.pmap(lambda v: hcb.id_tap(recorder, v, tap_with_device=True),
                  devices=devices)
  step(jnp.arange(4.0))
  hcb.barrier_wait()
  recorder.calls.clear()

  busy = jax.pmap(lambda x, i: keep_busy(x)[0, 0] * 0.0 + i, devices=devices)
  x = jnp.full((4, 700, 700), 1e-3, jnp.float32)
  busy(x, jnp.arange(4.0)).block_until_ready()  # compile
  step(busy(x, jnp.arange(4.0)))  # waits for busy; output dropped at once
  hcb.barrier_wait()
  assert recorder.by_device() == {d.id: [float(i)]
                                  for i, d in enumerate(devices)}


def test_with_a_device_that_is_not_a_cpu_the_cpu_probes_still_run(
    monkeypatch):
  """A GPU's queue open beside the CPU's (pretended: device 3 gets no
  probe, as a GPU does): the barrier still waits, by the CPU devices'
  probes, for a pmap whose input was not ready, which its markers on the
  CPU devices do not wait for."""
  with no_barrier_probe_on(monkeypatch, 3):
    test_barrier_waits_for_a_pmap_whose_input_was_not_ready()


def test_barrier_waits_for_a_long_op_between_two_callbacks(monkeypatch):
  """A computation waiting for inputs, then inside a foreign op for longer
  than the barrier's stall time: the barrier still waits for its last tap,
  since the device has not finished it."""
  monkeypatch.setattr(barrier, "_STALLED_SECONDS", 0.05)
  seen = []

  def sleep_then_identity(value):
    threading.Event().wait(0.5)
    return value

  @jax.jit
  def step(y):
    v = hcb.call(lambda a: (seen.append("call"), a)[1], y[0, 0],
                 result_shape=y[0, 0])
    v = jax.pure_callback(sleep_then_identity,
                          jax.ShapeDtypeStruct(v.shape, v.dtype), v)
    return hcb.id_tap(lambda a, t: seen.append("tap"), v)

  x = _busy_input(cpu_devices(1)[0])
  step(x)
  hcb.barrier_wait()
  seen.clear()
  step(keep_busy(x))  # output dropped at once
  hcb.barrier_wait()
  assert seen == ["call", "tap"]


@pytest.mark.parametrize("devices", [1, 4])
def test_an_idle_barrier_dispatches_nothing(devices):
  recorder = Recorder()
  for device in cpu_devices(devices):
    jax.jit(lambda v: hcb.id_tap(recorder, v, tap_with_device=True))(
        jax.device_put(jnp.float32(device.id), device))
  hcb.barrier_wait()
  assert sorted(float(a) for a in recorder.args) == [
      float(d.id) for d in cpu_devices(devices)]
  before = _sent_and_begun()
  for _ in range(3):
    hcb.barrier_wait()
  assert _sent_and_begun() == before


def _probes_dispatched(monkeypatch):
  """The probe dispatches that barriers make from now on, one entry each."""
  dispatched = []
  real_dispatch = probes.dispatch
  monkeypatch.setattr(probes, "dispatch",
                      lambda *a, **k: dispatched.append(a) or
                      real_dispatch(*a, **k))
  return dispatched


@pytest.mark.parametrize("outputs", ["kept", "first dropped",
                                     "last dropped", "eight steps"])
def test_a_barrier_after_finished_steps_dispatches_nothing(
    both_modes, monkeypatch, outputs):
  """A barrier after a few steps that have finished, whose outputs the
  program still holds in part (a training loop drops the loss, or keeps
  it and drops the state), needs no probe: their outputs are ready. In the
  synchronous mode their taps ran in them, so it waits for nothing, and
  the one after it is idle too."""
  recorder = Recorder()
  step = jax.jit(lambda x: (jnp.sum(x), hcb.id_tap(recorder, x) + 1))
  x = jnp.zeros(3, jnp.float32)
  step(x)
  hcb.barrier_wait()
  recorder.calls.clear()
  dispatched = _probes_dispatched(monkeypatch)
  before = _sent_and_begun()
  steps = 8 if outputs == "eight steps" else 1
  kept = []
  for _ in range(steps):
    loss, x = step(x)
    kept.append(x if outputs == "first dropped" else
                loss if outputs == "last dropped" else (loss, x))
  hcb.barrier_wait()
  assert [a.tolist() for a in recorder.args] == [
      [float(i)] * 3 for i in range(steps)]
  if both_modes == "synchronous":
    assert dispatched == []
    hcb.barrier_wait()
    assert dispatched == [] and _sent_and_begun()[1] == before[1] + steps


@pytest.mark.parametrize("steps", [1, 4, 5])
def test_barrier_waits_for_kept_steps_whose_input_was_not_ready(steps):
  """Each step waits for `keep_busy`'s output, and the program holds every
  output: those arrays are not ready, so the barrier waits for the steps
  (on those arrays, or on its probes after more dispatches, 10, than it
  follows)."""
  recorder = Recorder()
  step = jax.jit(lambda y: (hcb.id_tap(recorder, jnp.sum(y[0, :3])), y))
  x = _busy_input(cpu_devices(1)[0])
  inputs = [jax.block_until_ready(x + i) for i in range(steps)]
  step(x)
  hcb.barrier_wait()
  recorder.calls.clear()
  kept = []
  for y in inputs:
    busy = keep_busy(y)
    kept.append((busy, step(busy)))
  hcb.barrier_wait()
  received = [float(a) for a in recorder.args]
  del kept
  expected = [float(np.sum(keep_busy(y)[0, :3])) for y in inputs]
  np.testing.assert_allclose(received, expected, rtol=1e-5)


def _running_step(recorder, x):
  """A step with a tap, then one that was dispatched behind `keep_busy` (it
  still runs) with its input and outputs held: a training step that a
  barrier follows."""
  step = jax.jit(lambda y: (hcb.id_tap(recorder, jnp.sum(y[0, :3])), y))
  step(x)
  hcb.barrier_wait()
  recorder.calls.clear()
  busy = keep_busy(x)
  return busy, step(busy)


def test_a_barrier_after_a_running_step_waits_on_its_outputs(
    both_modes, monkeypatch):
  """A barrier right after a step that still runs, whose outputs the
  program holds, waits on them for the step, as `block_until_ready`
  would: in the synchronous mode that is all it waits for, and it
  dispatches no probe."""
  recorder = Recorder()
  x = _busy_input(cpu_devices(1)[0])
  dispatched = _probes_dispatched(monkeypatch)
  busy, (loss, y) = _running_step(recorder, x)
  dispatched.clear()
  assert not loss.is_ready() and not y.is_ready()
  hcb.barrier_wait()
  np.testing.assert_allclose([float(a) for a in recorder.args],
                             [float(np.sum(busy[0, :3]))], rtol=1e-5)
  if both_modes == "synchronous":
    assert dispatched == []


def test_a_barrier_after_a_running_step_that_fails_reports_as_before(
    both_modes):
  """A step whose call raises, still running when the barrier begins:
  waiting on its outputs meets the step's error. As after a step that has
  finished, the barrier raises the host function's error in the outfeed
  mode; in the synchronous mode the failed step is its only report."""
  def fail(value):
    raise ValueError("no value")

  step = jax.jit(lambda y: (hcb.call(fail, y[0, 0], result_shape=y[0, 0]),
                            y))
  x = _busy_input(cpu_devices(1)[0])
  hcb.barrier_wait()
  outputs = step(keep_busy(x))
  if both_modes == "synchronous":
    hcb.barrier_wait()
  else:
    with pytest.raises(hcb.CallbackException, match="no value"):
      hcb.barrier_wait()
  with pytest.raises(Exception, match="no value"):
    jax.block_until_ready(outputs)


def test_barrier_waits_after_a_step_whose_outputs_were_deleted(monkeypatch):
  """Deleted outputs cannot say whether their step has finished: the
  barrier waits on its probes."""
  recorder = Recorder()
  step = jax.jit(lambda y: hcb.id_tap(recorder, y) * 2)
  step(jnp.float32(1))
  hcb.barrier_wait()
  recorder.calls.clear()
  dispatched = _probes_dispatched(monkeypatch)
  output = step(jnp.float32(2))
  output.delete()
  hcb.barrier_wait()
  assert [float(a) for a in recorder.args] == [2.0]
  assert len(dispatched) == 1


class _HeldTap:
  """A tap function that says when it has started, and goes on once
  released."""

  def __init__(self):
    self.started, self.release = threading.Event(), threading.Event()
    self.done = []

  def __call__(self, arg, transforms):
    del transforms
    self.started.set()
    self.release.wait(10)
    self.done.append(arg.tolist())


def test_barrier_waits_for_a_host_function_still_running():
  """The idle check must not hide work: a tap's host function still runs
  (on another thread's computation, or on the receiver in the outfeed
  mode) when the barrier starts."""
  slow = _HeldTap()
  step = jax.jit(lambda v: hcb.id_tap(slow, v))
  slow.release.set()
  step(jnp.float32(0))
  hcb.barrier_wait()
  slow.done.clear()
  slow.started.clear()
  slow.release.clear()
  thread = threading.Thread(target=step, args=(jnp.float32(1),))
  thread.start()
  assert slow.started.wait(10)
  threading.Timer(0.3, slow.release.set).start()
  hcb.barrier_wait()
  assert slow.done == [1.0]
  thread.join()


def _forget_compiled_probes_and_markers():
  """The next barrier compiles its probes and markers anew."""
  # pylint: disable=protected-access
  for cached in (probes._probes, probes._probe_on,
                 probes._probe_across_two_cpus, barrier._marker_computation,
                 barrier._compiled_marker, zero_on):
    cached.cache_clear()


@pytest.mark.parametrize("busy", [False, True])
def test_barrier_inside_a_mesh_set_by_the_program(busy):
  """Inside `jax.set_mesh`, whose devices would conflict with those of the
  barrier's own computations: the first barrier, which compiles the
  probes, waits for a step over the mesh; one that sends markers, because
  another thread's single-device step is still in its tap (in the
  synchronous mode), waits for that tap."""
  devices = cpu_devices(4)
  mesh = jax.sharding.Mesh(np.array(devices), ("x",))
  tap = _HeldTap()
  step = jax.jit(lambda v: hcb.id_tap(tap, v))
  _forget_compiled_probes_and_markers()
  with jax.set_mesh(mesh):
    if busy:
      thread = threading.Thread(  # outside the mesh, which is per thread
          target=step, args=(jax.device_put(jnp.float32(1), devices[1]),))
      thread.start()
      assert tap.started.wait(10)
      threading.Timer(0.3, tap.release.set).start()
      hcb.barrier_wait()
      thread.join()
      assert tap.done == [1.0]
    else:
      tap.release.set()
      step(jnp.arange(4.0))
      hcb.barrier_wait()
      assert tap.done == [[0.0, 1.0, 2.0, 3.0]]


@pytest.mark.parametrize("while_tracing", [False, True])
def test_probes_compiled_inside_a_mesh_run_on_their_own_devices(while_tracing):
  """A step on device 3 whose input was not ready; a barrier inside a mesh
  the program set, which compiles its probes there (also from code being
  traced, where `jax.set_mesh` cannot be left), then waits for it, or the
  next barrier, which reuses them, does (a probe placed on the mesh's
  devices would not follow it)."""
  devices = cpu_devices(4)
  recorder = Recorder()
  step = jax.jit(lambda y: hcb.id_tap(recorder, jnp.sum(y[0, :3])))
  x = _busy_input(devices[3])
  step(x)
  hcb.barrier_wait()
  recorder.calls.clear()
  _forget_compiled_probes_and_markers()

  def traced(v):
    hcb.barrier_wait()  # compiles the probes while `traced` is traced
    return v + 1

  mesh = jax.sharding.Mesh(np.array(devices), ("x",))
  if while_tracing:
    with jax.set_mesh(mesh):
      jax.jit(traced)(jnp.float32(1))
    step(keep_busy(x))  # output dropped at once
    hcb.barrier_wait()
  else:
    step(keep_busy(x))
    with jax.set_mesh(mesh):
      hcb.barrier_wait()
  np.testing.assert_allclose([float(a) for a in recorder.args],
                             [float(np.sum(keep_busy(x)[0, :3]))], rtol=1e-5)


def test_a_barrier_called_while_jax_traces():
  """A barrier in code being traced runs then, as the original's did, and
  compiles its probes there if it is the first: outside the program's
  mesh, which `jax.set_mesh` refuses to leave while JAX traces."""
  recorder = Recorder()
  jax.jit(lambda v: hcb.id_tap(recorder, v))(jnp.float32(1))
  _forget_compiled_probes_and_markers()

  def traced(v):
    hcb.barrier_wait()  # runs while `traced` is traced
    assert [float(a) for a in recorder.args] == [1.0]
    return v + 1

  assert float(jax.jit(traced)(jnp.float32(1))) == 2.0


def test_a_barrier_called_while_jax_traces_runs_its_markers():
  """Another thread's step is in its tap (in the synchronous mode), so the
  barrier sends markers, from code being traced: they run compiled (a
  jitted call there would be staged into the traced code and never run,
  and the barrier waited for it for ever), and their zeros are concrete."""
  tap = _HeldTap()
  step = jax.jit(lambda v: hcb.id_tap(tap, v))
  _forget_compiled_probes_and_markers()
  thread = threading.Thread(target=step, args=(jnp.float32(1),))
  thread.start()
  assert tap.started.wait(10)
  threading.Timer(0.3, tap.release.set).start()

  def traced(v):
    hcb.barrier_wait()  # runs while `traced` is traced
    assert tap.done == [1.0]
    return v + 1

  assert float(jax.jit(traced)(jnp.float32(1))) == 2.0
  thread.join()


@pytest.mark.parametrize("while_tracing", [False, True])
def test_markers_run_jitted_except_while_jax_traces(while_tracing):
  """A marker round dispatches its markers through a jitted function
  (JAX's C++ dispatch; a compiled executable with host callbacks takes
  JAX's Python path, about 0.5 ms a marker on a GPU), and through one
  compiled for the device only from code that JAX traces, where a jitted
  call would be staged into that code. Either way each marker arrives."""
  tap = _HeldTap()
  tap.release.set()
  jax.jit(lambda v: hcb.id_tap(tap, v))(jnp.float32(1))  # opens a queue
  hcb.barrier_wait()
  _forget_compiled_probes_and_markers()
  quiet = []
  if while_tracing:
    jax.jit(lambda v: (quiet.append(barrier._marker_round()), v)[1])(1.0)  # pylint: disable=protected-access
  else:
    quiet.append(barrier._marker_round())  # pylint: disable=protected-access
  assert quiet == [True]
  compiled = barrier._compiled_marker.cache_info().currsize  # pylint: disable=protected-access
  assert (compiled > 0) == while_tracing


@pytest.mark.parametrize("debug_nans", [True, False])
def test_barrier_waits_when_jax_debug_nans_took_the_dispatch_hook(
    debug_nans):
  """jax_debug_nans sets (and unsets) the hook through which the idle
  barrier counts dispatches: a step whose input was not ready, dispatched
  while it is set or after it was unset, is still waited for."""
  recorder = Recorder()
  step = jax.jit(lambda y: hcb.id_tap(recorder, jnp.sum(y[0, :3])))
  x = _busy_input(cpu_devices(1)[0])
  step(x)
  hcb.barrier_wait()
  hcb.barrier_wait()  # idle
  recorder.calls.clear()
  jax.config.update("jax_debug_nans", True)
  try:
    jax.config.update("jax_debug_nans", debug_nans)
    step(keep_busy(x))  # output dropped at once
    hcb.barrier_wait()
  finally:
    jax.config.update("jax_debug_nans", False)
  assert len(recorder.args) == 1


def test_barrier_waits_for_a_new_pmap_first_called_on_another_thread():
  """The first call of a pmap goes through JAX's Python path, which reports
  no dispatch: made on another thread after an idle barrier, behind a busy
  computation also called first, its taps are still waited for."""
  devices = cpu_devices(4)
  x = jnp.full((4, 700, 700), 1e-3, jnp.float32)
  hcb.barrier_wait()
  hcb.barrier_wait()  # idle
  recorder = Recorder()

  def first_calls():
    busy = jax.pmap(lambda x, i: keep_busy(x)[0, 0] * 0.0 + i, devices=devices)
    step = jax.pmap(lambda v: hcb.id_tap(recorder, v, tap_with_device=True),
                    devices=devices)
    step(busy(x, jnp.arange(4.0)))  # waits for busy; output dropped at once

  thread = threading.Thread(target=first_calls)
  thread.start()
  thread.join()
  hcb.barrier_wait()
  assert recorder.by_device() == {d.id: [float(i)]
                                  for i, d in enumerate(devices)}


# The tests that need an idle barrier skip where the default backend is not
# the CPU: the suite's taps there open that backend's queues, which stay
# open for the process, so tapping on a CPU device would not make it idle.
_IDLE_ON_CPU_ONLY = ("a barrier is idle only while every open queue is a "
                     "CPU device's (probes.cover)")


def _idle_after_a_tap():
  """Taps once and waits: the next barrier on this thread is idle."""
  jax.jit(lambda v: hcb.id_tap(lambda arg, transforms: None, v))(
      jnp.float32(0))
  hcb.barrier_wait()
  hcb.barrier_wait()


class _Pending:
  """What a barrier listener acts on: the listener has work while `work`
  is not empty."""

  def __init__(self):
    self.work = []
    self.calls = []

  def listener(self):
    self.calls.append(list(self.work))
    self.work.clear()


def test_an_idle_barrier_still_logs_and_runs_the_listeners(caplog):
  """An idle barrier returns after one native check, unless it has work
  beside waiting: it still logs its name and calls a listener that has
  work (the progress bars close the bars still open), and skips one that
  has none."""
  needs_cpu_default_backend(_IDLE_ON_CPU_ONLY)
  pending = _Pending()
  barrier.after_each_wait(pending.listener,
                          idle_when_empty=((pending, "work"),))
  try:
    _idle_after_a_tap()
    before = _sent_and_begun()
    pending.calls.clear()
    hcb.barrier_wait()  # idle, and the listener has nothing to do
    assert pending.calls == []
    pending.work.append("a bar still open")
    hcb.barrier_wait()
    assert pending.calls == [["a bar still open"]]
    caplog.set_level(logging.DEBUG, logger="host_callback")
    hcb.barrier_wait("idle")
  finally:
    # pylint: disable=protected-access
    barrier._after_wait.remove(pending.listener)
    del barrier._after_wait_idle_when_empty[-1]
    idle.reconfigure()
  assert [r.getMessage() for r in caplog.records][-2:] == [
      "barrier_wait[idle]: start", "barrier_wait[idle]: done"]
  assert _sent_and_begun() == before  # it was idle


def test_an_idle_barrier_raises_an_error_from_another_thread(both_modes):
  """A tap fails in a computation that another thread dispatched: a
  barrier on this thread, idle by its own counts, still raises it in the
  outfeed mode (in the synchronous mode, that thread's computation did)."""
  def fails_on_one(arg, transforms):
    if arg == 1:
      raise ValueError("tap 1.0 failed")

  step = jax.jit(lambda v: hcb.id_tap(fails_on_one, v))
  step(jnp.float32(0))
  hcb.barrier_wait()
  hcb.barrier_wait()  # idle
  raised = []

  def on_another_thread():
    try:
      jax.block_until_ready(step(jnp.float32(1)))
    except Exception as error:  # pylint: disable=broad-except
      raised.append(error)

  thread = threading.Thread(target=on_another_thread)
  thread.start()
  thread.join()
  if both_modes == "synchronous":
    assert "tap 1.0 failed" in str(raised[0])
    hcb.barrier_wait()
    return
  assert not raised
  deadline = time.monotonic() + 10
  while not host_side.runtime.errors.pending():  # consumed: the queue drained
    assert time.monotonic() < deadline
    time.sleep(0.01)
  with pytest.raises(hcb.CallbackException, match="tap 1.0 failed"):
    hcb.barrier_wait()
  hcb.barrier_wait()  # raised once


def test_a_barrier_is_idle_again_after_jax_hid_the_dispatch_hook(monkeypatch):
  """jnp.var (like lax.sort and jaxpr_as_fun) enters jax.debug_nans(False),
  whose end leaves the thread's own post-dispatch hook set to None, which
  hides ours: one barrier that waits restores it, and the next is idle
  (it dispatches no probe)."""
  needs_cpu_default_backend(_IDLE_ON_CPU_ONLY)
  _idle_after_a_tap()
  jnp.var(jnp.ones(3))
  hcb.barrier_wait()  # waits: the hook did not count since
  dispatched = _probes_dispatched(monkeypatch)
  hcb.barrier_wait()
  assert dispatched == []


def test_jax_debug_nans_still_checks_after_a_barrier():
  """The barrier's hook never takes the place of jax_debug_nans's check."""
  _idle_after_a_tap()
  jnp.var(jnp.ones(3))
  hcb.barrier_wait()
  nan = jax.jit(lambda x: jnp.log(x) * 0 + x / x)
  nan(jnp.float32(1.0))
  jax.config.update("jax_debug_nans", True)
  try:
    with pytest.raises(FloatingPointError):
      nan(jnp.float32(0.0))
    hcb.barrier_wait()
    with pytest.raises(FloatingPointError):
      nan(jnp.float32(0.0))
  finally:
    jax.config.update("jax_debug_nans", False)


def test_the_barrier_takes_what_the_original_took():
  """`barrier_wait(logging_name=None)`, idle or not: its name, signature
  and docstring, a name given by position or keyword, and a TypeError
  naming it for anything else."""
  assert hcb.barrier_wait.__name__ == "barrier_wait"
  assert str(inspect.signature(hcb.barrier_wait)) == "(logging_name=None)"
  assert hcb.barrier_wait.__doc__.startswith(
      "Blocks until every callback from computations already started")
  _idle_after_a_tap()
  hcb.barrier_wait("by position")
  hcb.barrier_wait(logging_name="by keyword")
  with pytest.raises(TypeError, match=r"barrier_wait\(\) got an unexpected "
                     r"keyword argument 'name'"):
    hcb.barrier_wait(name="x")
  with pytest.raises(TypeError, match=r"barrier_wait\(\) takes from 0 to 1 "
                     r"positional arguments but 2 were given"):
    hcb.barrier_wait("a", "b")
