"""A barrier runs the taps that wait on a queue no receiver thread is busy
with on its own thread (`Transport.take_here`), instead of waking that
thread and waiting for it: in the outfeed mode, a barrier after a step costs
no hand-off. So does a `call` that finds taps of its device waiting before
it (`Transport.set_guest_consumer`). What must hold: each device's order, nothing taken while a
receiver thread holds packets, and Ctrl-C. The queue's own rules for guests
are tested on both queues in tests/test_queue_protocol.py."""

import signal
import threading

import jax
import jax.numpy as jnp
import pytest

import host_callback as hcb
from host_callback.barrier import idle, probes
from helpers import needs_cpu_default_backend

pytestmark = pytest.mark.usefixtures("outfeed_mode")

_ATTEMPTS = 200  # a receiver thread woken at once may take a tap first
_CPU_PROBES_ONLY = ("a barrier runs waiting taps on its own thread only after "
                    "its CPU probes; elsewhere its markers go through the "
                    "receiver threads")


def test_barrier_runs_waiting_taps_on_its_own_thread():
  """Taps that wait when the barrier comes run on the barrier's thread
  (the receiver thread, woken for them, waits a moment first on the native
  transport; on the Python one it races the barrier), in order."""
  needs_cpu_default_backend(_CPU_PROBES_ONLY)
  received = []
  tap = jax.jit(lambda x: hcb.id_tap(
      lambda v, transforms: received.append((int(v), threading.get_ident())),
      x))
  tap(jnp.int32(-1))
  hcb.barrier_wait()
  received.clear()
  for i in range(_ATTEMPTS):
    tap(jnp.int32(i))
    hcb.barrier_wait()
    assert [value for value, _ in received] == list(range(i + 1))
    if received[-1][1] == threading.get_ident():
      return
  pytest.fail(f"no tap of {_ATTEMPTS} ran on the barrier's thread")


def test_after_a_finished_step_the_barrier_runs_its_taps_without_probes(
    monkeypatch):
  """A step that has finished (the output the program keeps is ready) left
  only its taps to wait for: the barrier runs them on its own thread and
  then has nothing left, so it dispatches no probe."""
  needs_cpu_default_backend(_CPU_PROBES_ONLY)
  ran_on = []
  step = jax.jit(lambda x: (hcb.id_tap(
      lambda v, transforms: ran_on.append(threading.get_ident()), x), x + 1))
  x = jnp.int32(0)
  step(x)
  hcb.barrier_wait()
  dispatched = []
  real_dispatch = probes.dispatch
  monkeypatch.setattr(probes, "dispatch",
                      lambda *a, **k: dispatched.append(a) or
                      real_dispatch(*a, **k))
  for _ in range(_ATTEMPTS):
    ran_on.clear()
    dispatched.clear()
    kept = step(x)
    hcb.barrier_wait()
    assert len(ran_on) == 1 and kept[1] == 1
    if ran_on[0] == threading.get_ident():
      assert dispatched == []
      return
  pytest.fail(f"no tap of {_ATTEMPTS} ran on the barrier's thread")


def test_after_a_step_the_native_barrier_runs_its_taps_in_its_one_call(
    transport, monkeypatch):
  """On the native transport, the barrier right after a step runs the taps
  the step left waiting without its Python frame: the native call that
  waited on the step's outputs runs them (the guest consumer of a call),
  then finds nothing left."""
  needs_cpu_default_backend(_CPU_PROBES_ONLY)
  if transport == "python":
    pytest.skip("the Python transport's barrier is Python")
  ran_on, python_barriers = [], []
  step = jax.jit(lambda x: (hcb.id_tap(
      lambda v, transforms: ran_on.append(int(v)) or ran_on.append(
          threading.get_ident()), x), x + 1))
  x = jnp.int32(0)
  step(x)
  hcb.barrier_wait()
  now = idle.now
  monkeypatch.setattr(idle, "now",
                      lambda: python_barriers.append(1) or now())
  for i in range(_ATTEMPTS):
    ran_on.clear()
    python_barriers.clear()
    _, x = step(x)
    hcb.barrier_wait()
    assert ran_on[0] == i
    if ran_on[1] == threading.get_ident():
      assert python_barriers == []
      return
  pytest.fail(f"no tap of {_ATTEMPTS} ran on the barrier's thread")


def test_barrier_takes_nothing_while_a_receiver_thread_holds_packets():
  """The receiver thread runs a slow tap; the taps queued behind it must
  not start before it has finished, on whichever thread they run."""
  release = threading.Event()
  events = []

  def tap(value, transforms):
    value = int(value)
    events.append(("start", value))
    if value == 0:
      release.wait(10)
    events.append(("end", value))

  step = jax.jit(lambda x: hcb.id_tap(tap, x))
  step(jnp.int32(5))  # compile
  hcb.barrier_wait()
  events.clear()
  step(jnp.int32(0))
  while ("start", 0) not in events:  # the receiver thread runs it
    threading.Event().wait(0.001)
  step(jnp.int32(1))
  step(jnp.int32(2))
  timer = threading.Timer(0.3, release.set)
  timer.start()
  hcb.barrier_wait()
  timer.join()
  assert events == [("start", 0), ("end", 0), ("start", 1), ("end", 1),
                    ("start", 2), ("end", 2)]


def test_ctrl_c_in_a_tap_the_barrier_runs_reaches_the_barriers_caller():
  """A tap that the barrier runs on the main thread and that Ctrl-C stops
  raises KeyboardInterrupt from barrier_wait; it is not recorded as the
  tap's error, and the runtime goes on."""
  needs_cpu_default_backend(_CPU_PROBES_ONLY)
  interrupted_here = []

  def tap(value, transforms):
    if threading.current_thread() is threading.main_thread():
      # Ctrl-C: Python raises it in the tap, as raise_signal returns. (A
      # `raise KeyboardInterrupt` would be the tap's own error.)
      signal.raise_signal(signal.SIGINT)

  step = jax.jit(lambda x: hcb.id_tap(tap, x))
  for i in range(_ATTEMPTS):
    step(jnp.int32(i))
    try:
      hcb.barrier_wait()
    except KeyboardInterrupt:
      interrupted_here.append(i)
      break
  assert interrupted_here, f"no tap of {_ATTEMPTS} ran on the barrier's thread"
  received = []
  jax.jit(lambda x: hcb.id_tap(lambda v, t: received.append(int(v)), x))(
      jnp.int32(7))
  hcb.barrier_wait()  # raises no CallbackException for the interrupt
  assert received == [7]


def test_a_call_runs_the_taps_waiting_before_it_on_its_own_thread():
  """Issue 61, defect 4: a jitted step with a tap then a call cost 13 times
  the two apart in the outfeed mode, as the call waited for the receiver
  thread to run the tap. The call now runs the waiting tap itself, on the
  thread that runs the step, in order (the receiver thread, woken for the
  call, may take a tap first)."""
  needs_cpu_default_backend("a CPU computation runs on its caller's thread")
  received = []

  def tap(value, transforms):
    received.append(("tap", int(value), threading.get_ident()))

  def host(value):
    received.append(("call", int(value), threading.get_ident()))
    return value

  step = jax.jit(lambda x: hcb.call(host, hcb.id_tap(tap, x),
                                    result_shape=x))
  step(jnp.int32(-1))
  hcb.barrier_wait()
  received.clear()
  for i in range(_ATTEMPTS):
    step(jnp.int32(i)).block_until_ready()
    assert [(kind, value) for kind, value, _ in received[-2:]] == [
        ("tap", i), ("call", i)]
    if received[-2][2] == threading.get_ident():
      return
  pytest.fail(f"no tap of {_ATTEMPTS} ran on the calling thread")
