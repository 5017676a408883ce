"""The receiver: barrier, stop and restart, exit, queue bound, threads, settings.

The tests of what the receiver does asynchronously (a barrier waiting for
slow taps, stop and restart, the queue bound, draining at exit) run in the
outfeed mode; the settings and the barrier's own behaviour in the default
(synchronous) mode.
"""

import io
import logging
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from helpers import (OUTFEED, Recorder, needs_cpu_default_backend, run_python,
                     wait_until)

in_outfeed_mode = pytest.mark.usefixtures("outfeed_mode")


def slow_recorder(rec, seconds=0.002):
  def tap(arg, transforms):
    time.sleep(seconds)
    rec(arg, transforms)
  return tap


# --- the receiver thread's batches ------------------------------------------


@in_outfeed_mode
def test_a_batch_of_taps_with_failures_and_calls_runs_in_order():
  """A receiver thread runs a batch's taps in C and its calls (which wait
  for a reply) in Python: every host function runs once, in the device's
  order; each failing tap is recorded and the others go on."""
  seen = []

  def tap(arg, transforms):
    del transforms
    seen.append(("tap", int(arg)))
    if int(arg) % 50 == 7:
      raise ValueError(f"tap {int(arg)} failed")

  def host(arg):
    seen.append(("call", int(arg)))
    return arg

  def body(carry, i):
    carry = hcb.id_tap(tap, carry + i)
    carry = jax.lax.cond(i % 100 == 0,
                         lambda c: hcb.call(host, c, result_shape=c),
                         lambda c: c, carry)
    return carry * 0 + i, None

  jax.jit(lambda: jax.lax.scan(body, jnp.int32(0),
                               jnp.arange(1000, dtype=jnp.int32)))()
  with pytest.raises(hcb.CallbackException, match="tap 1957 failed"):
    hcb.barrier_wait()
  expected = []
  for i in range(1000):
    expected.append(("tap", 2 * i - 1 if i else 0))
    if i % 100 == 0:
      expected.append(("call", 2 * i - 1 if i else 0))
  assert seen == expected


@in_outfeed_mode
@pytest.mark.parametrize("copy", [True, False])
def test_a_batch_of_taps_of_one_site_each_gets_its_own_values(copy):
  """A batch's run of tap packets of one site, decoded at once: each host
  function gets its own packet's arrays (shapes and dtypes as tapped, an
  int32 step as a Python int where the site says so), read-only for
  copy=False, and a kept array keeps its values."""
  from host_callback import loops
  seen = []

  def tap(args, transforms):
    del transforms
    vector, scalar, small = args
    seen.append((vector.shape, vector.dtype.name, vector.tolist(),
                 float(scalar), int(small), vector.flags.writeable))

  def body(carry, i):
    hcb.id_tap(tap, (jnp.stack([i, -i, i * 2]), i * 0.5,
                     i.astype(jnp.int16)), copy=copy)
    return carry, None

  jax.jit(lambda: jax.lax.scan(body, 0, jnp.arange(300)))()
  events = []
  watched = loops.verbose(
      lambda x: jax.lax.scan(lambda c, _: (c + 1, None), x, None,
                             length=300)[0], on_step=events.append)
  jax.jit(watched)(jnp.int32(0))
  hcb.barrier_wait()
  assert seen == [((3,), "int32", [i, -i, 2 * i], i * 0.5, i, copy)
                  for i in range(300)]
  assert [(e.step, type(e.step), e.value[0].item()) for e in events] == [
      (i, int, i + 1) for i in range(300)]


# --- barrier_wait ------------------------------------------------------------


@in_outfeed_mode
def test_barrier_waits_for_slow_taps():
  rec = Recorder()
  f = jax.jit(lambda x: hcb.id_tap(slow_recorder(rec, 0.01), x))
  for i in range(20):
    f(i)
  hcb.barrier_wait()
  assert [int(v) for v in rec.args] == list(range(20))


@in_outfeed_mode
def test_barrier_waits_for_eager_taps():
  rec = Recorder()
  for i in range(10):
    hcb.id_tap(slow_recorder(rec, 0.01), jnp.int32(i))
  hcb.barrier_wait("eager")
  assert [int(v) for v in rec.args] == list(range(10))


def test_barrier_without_any_tap_returns_and_logs_its_name(caplog):
  caplog.set_level(logging.DEBUG, logger="host_callback")
  hcb.barrier_wait()
  hcb.barrier_wait("named")
  messages = [r.getMessage() for r in caplog.records]
  assert messages[-2:] == ["barrier_wait[named]: start",
                           "barrier_wait[named]: done"]
  rec = Recorder()
  jax.jit(lambda x: hcb.id_tap(rec, x))(1.)
  hcb.barrier_wait()
  assert rec.args == [1.]


def test_barrier_in_a_process_that_never_tapped(transport):
  done = run_python("""
      import host_callback as hcb
      hcb.barrier_wait()
      hcb.barrier_wait("again")
      print("returned")
      """, transport=transport, timeout=60)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout == "returned\n"


# --- stop_outfeed_receiver -----------------------------------------------------


@in_outfeed_mode
def test_stop_delivers_pending_then_next_use_restarts():
  rec = Recorder()
  tap = slow_recorder(rec, 0.01)
  f = jax.jit(lambda x: hcb.id_tap(tap, x))
  for i in range(10):
    f(i)
  hcb.stop_outfeed_receiver()
  assert [int(v) for v in rec.args] == list(range(10))  # no barrier needed
  hcb.stop_outfeed_receiver()  # stopping a stopped receiver is harmless
  hcb.barrier_wait()
  # Reuse: an executable compiled before the stop, a new one, and eager use.
  f(10)
  jax.jit(lambda x: hcb.id_tap(tap, x + 1))(10)
  hcb.id_tap(tap, jnp.int32(12))
  hcb.barrier_wait()
  assert [int(v) for v in rec.args] == list(range(13))


@in_outfeed_mode
def test_stop_then_id_print():
  stream = io.StringIO()
  hcb.stop_outfeed_receiver()
  jax.jit(lambda x: hcb.id_print(x, what="after stop",
                                 output_stream=stream))(1.)
  hcb.barrier_wait()
  assert stream.getvalue() == "what: after stop\n1.\n"


@in_outfeed_mode
def test_stop_keeps_pending_exception_for_barrier():
  def raising(arg, transforms):
    raise ValueError("before stop")

  jax.jit(lambda x: hcb.id_tap(raising, x))(1.)
  hcb.stop_outfeed_receiver()
  with pytest.raises(hcb.CallbackException) as info:
    hcb.barrier_wait()
  assert str(info.value.__cause__) == "before stop"


# --- threads -------------------------------------------------------------------


@pytest.mark.usefixtures("both_modes")
def test_taps_from_two_threads_and_barrier_from_a_third():
  rec = Recorder()
  tap = slow_recorder(rec, 0.001)
  f = jax.jit(lambda tid, i: hcb.id_tap(tap, (tid, i)))
  f(0, -1)  # compile first, so that both threads really dispatch together
  hcb.barrier_wait()
  rec.calls.clear()
  n = 100
  start = threading.Barrier(2)
  failures = []

  def dispatch(tid):
    try:
      start.wait()
      for i in range(n):
        f(tid, i)
    except Exception as error:  # pylint: disable=broad-except
      failures.append(error)

  threads = [threading.Thread(target=dispatch, args=(tid,)) for tid in (1, 2)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  waiter = threading.Thread(target=hcb.barrier_wait)
  waiter.start()
  waiter.join()
  assert not failures
  received = [(int(tid), int(i)) for tid, i in rec.args]
  assert len(received) == 2 * n
  for tid in (1, 2):  # each thread's own calls stay in order
    assert [i for t, i in received if t == tid] == list(range(n))


@in_outfeed_mode
def test_taps_from_another_thread_are_covered_by_main_barrier():
  rec = Recorder()
  f = jax.jit(lambda x: hcb.id_tap(slow_recorder(rec, 0.005), x))
  thread = threading.Thread(target=lambda: [f(i) for i in range(20)])
  thread.start()
  thread.join()
  hcb.barrier_wait()
  assert [int(v) for v in rec.args] == list(range(20))


# --- settings: inline ------------------------------------------------------------


@pytest.fixture
def inline():
  jax.config.update("jax_host_callback_inline", True)
  try:
    yield
  finally:
    jax.config.update("jax_host_callback_inline", False)


def _thread_recorder(threads):
  return lambda arg, transforms: threads.append(
      (threading.current_thread(), int(arg)))


@in_outfeed_mode
def test_eager_taps_run_after_id_tap_returned_by_default():
  # Not inline: the tap function waits for what the caller does after
  # id_tap returned (inline, it would time out). It runs on a receiver
  # thread, or on the barrier's, which runs taps still waiting there.
  returned = threading.Event()
  waited = []
  hcb.id_tap(lambda arg, transforms: waited.append(returned.wait(10)),
             jnp.int32(1))
  returned.set()
  hcb.barrier_wait()
  assert waited == [True]


def test_inline_setting_runs_eager_taps_in_callers_thread(inline):
  del inline
  threads = []
  out = hcb.id_tap(_thread_recorder(threads), jnp.int32(1))
  # Already done when id_tap returns: no barrier needed.
  assert threads == [(threading.current_thread(), 1)]
  assert int(out) == 1
  stream = io.StringIO()
  hcb.id_print(jnp.arange(3), what="inline", output_stream=stream)
  assert stream.getvalue() == "what: inline\n[0 1 2]\n"
  hcb.barrier_wait()


def test_inline_setting_exception_propagates_to_caller(inline):
  del inline

  def raising(arg, transforms):
    raise KeyError("inline error")

  with pytest.raises(KeyError, match="inline error"):
    hcb.id_tap(raising, jnp.int32(1))
  hcb.barrier_wait()  # the caller got it: the barrier does not raise it again


def test_inline_call_raises_the_host_functions_own_exception(inline):
  del inline
  with pytest.raises(ZeroDivisionError) as info:
    hcb.call(lambda x: 1 // int(x) * x, 0., result_shape=0.)
  assert any("host_callback.call" in note for note in info.value.__notes__)
  with pytest.raises(RuntimeError, match="where result_shape expects"):
    hcb.call(lambda x: np.zeros(3), 0., result_shape=0.)
  hcb.barrier_wait()


def test_inline_setting_from_environment(transport):
  result = run_python("""
      import threading
      import jax.numpy as jnp
      import host_callback as hcb
      seen = []
      hcb.id_tap(lambda a, t: seen.append(
          (threading.current_thread() is threading.main_thread(), int(a))),
          jnp.int32(5))
      print("before barrier", seen)
      hcb.barrier_wait()
      """, env={"JAX_HOST_CALLBACK_INLINE": "1"}, transport=transport)
  assert result.returncode == 0, result.stderr
  assert result.stdout == "before barrier [(True, 5)]\n"


# --- settings: queue bound ---------------------------------------------------------


def test_queue_size_below_minimum_rejected():
  jax.config.update("jax_host_callback_max_queue_byte_size", 15_999_999)
  try:
    with pytest.raises(ValueError,
                       match="JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE"):
      hcb.stop_outfeed_receiver()  # the bound applies to a new receiver
      jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x * 7))(1.)
      hcb.barrier_wait()
  finally:
    jax.config.update("jax_host_callback_max_queue_byte_size", 256_000_000)
  rec = Recorder()
  jax.jit(lambda x: hcb.id_tap(rec, x * 3))(1.)
  hcb.barrier_wait()
  assert [float(v) for v in rec.args] == [3.]


def test_queue_size_below_minimum_rejected_from_environment(transport):
  result = run_python("""
      import jax, host_callback as hcb
      try:
        jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x))(1.)
        hcb.barrier_wait()
      except ValueError as error:
        print("ValueError:", error)
      """, env={"JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE": "1e6"},
                      transport=transport)
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith("ValueError: ")
  assert "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE" in result.stdout
  assert "16000000" in result.stdout


def test_queue_bound_respected_with_slow_consumer(transport):
  """4 MB taps into a 16 MB queue: the device waits, nothing is dropped."""
  result = run_python("""
      import time
      import jax, jax.numpy as jnp
      import host_callback as hcb

      N, SIZE = 12, 1_000_000  # float32: 4 MB per tap
      sent, consumed, ahead = [], [], []

      def slow(arg, transforms):
        ahead.append(len(sent) - len(consumed))
        time.sleep(0.05)
        consumed.append((int(arg[0]), int(arg[-1]), arg.shape))

      def body(i, acc):
        x = hcb.id_tap(slow, jnp.full((SIZE,), i, jnp.float32))
        # Runs on the device after the tap's send has returned.
        jax.debug.callback(lambda v: sent.append(int(v)), x[0])
        return acc + x[-1]

      total = jax.jit(lambda: jax.lax.fori_loop(0, N, body, 0.))()
      hcb.barrier_wait()
      stats = [s for (name, _), s in hcb.queue_statistics().items()
               if s.high_water_bytes]
      print("total", float(total))
      print("consumed", consumed == [(i, i, (SIZE,)) for i in range(N)])
      print("sent", sent == list(range(N)))
      print("max ahead", max(ahead))
      print("bound", [s.max_bytes for s in stats])
      print("high water ok", all(s.high_water_bytes <= s.max_bytes + 4_000_000
                                 for s in stats))
      """, env={**OUTFEED, "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE": "16000000"},
                      transport=transport)
  assert result.returncode == 0, result.stderr
  lines = dict(line.split(" ", 1) if " " in line else (line, "")
               for line in result.stdout.replace("max ahead", "max_ahead")
               .replace("high water ok", "high_water_ok").splitlines())
  assert lines["total"] == str(float(sum(range(12))))
  assert lines["consumed"] == "True"
  assert lines["sent"] == "True"
  # While the consumer works on tap k, at most 16 MB (4 taps) are queued,
  # so the device has sent at most tap k+4 (one more may be on its way).
  assert int(lines["max_ahead"]) <= 5, result.stdout
  assert lines["bound"] == "[16000000]"
  assert lines["high_water_ok"] == "True"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("value", [(), np.zeros((0,), np.float32),
                                   np.float32(1.5)],
                         ids=["empty_tuple", "zero_size", "scalar"])
def test_tiny_taps_fill_the_bound_and_the_device_waits(transport, value,
                                                       outfeed_mode,
                                                       smallest_queue):
  """Each packet counts its overhead, not just its data: taps that carry
  (almost) no data fill the bound, and the device waits for room."""
  needs_cpu_default_backend("reads the CPU transport's queue of device 0")
  steps = smallest_queue // 64 + 10_000  # more than fit at 64 bytes each
  release = threading.Event()
  received = []

  def blocked(arg, transforms):
    release.wait(60)
    received.append(arg)

  @jax.jit
  def loop(x):
    def body(count, _):
      hcb.id_tap(blocked, x)
      return count + 1, None
    return jax.lax.scan(body, 0, None, length=steps)[0]

  done = []
  sender = threading.Thread(target=lambda: done.append(int(loop(value))),
                            daemon=True)
  key = (transport, jax.devices()[0])

  def full():
    stats = hcb.queue_statistics().get(key)
    if stats is None or not stats.packets_waiting:
      return False
    one_packet = stats.bytes_waiting // stats.packets_waiting
    return stats.bytes_waiting + one_packet > stats.max_bytes

  try:
    sender.start()
    wait_until(lambda: full() or not sender.is_alive())
    stats = hcb.queue_statistics()[key]
    one_packet = stats.bytes_waiting // stats.packets_waiting
    assert sender.is_alive() and not done, "the device did not wait for room"
    assert stats.max_bytes == smallest_queue
    assert 64 <= one_packet <= 1024, stats
    assert stats.packets_waiting < steps
    assert stats.high_water_bytes <= smallest_queue + one_packet
  finally:
    release.set()
  sender.join(60)
  assert done == [steps]
  hcb.barrier_wait()
  assert len(received) == steps
  stats = hcb.queue_statistics()[key]
  assert stats.high_water_bytes <= smallest_queue + one_packet
  assert stats.bytes_waiting == 0 and stats.packets_waiting == 0


# --- interpreter exit ---------------------------------------------------------------


def test_pending_taps_delivered_at_exit(transport):
  result = run_python("""
      import sys, time
      import jax, jax.numpy as jnp
      import host_callback as hcb

      def tap(arg, transforms):
        time.sleep(0.0005)
        sys.stdout.write(f"{int(arg)}\\n")

      scan = jax.jit(lambda xs: jax.lax.scan(
          lambda c, x: (c, hcb.id_tap(tap, x)), 0, xs)[1])
      scan(jnp.arange(900))
      single = jax.jit(lambda x: hcb.id_tap(tap, x))
      for i in range(900, 1000):
        single(i)
      sys.stdout.write("dispatched\\n")
      # No barrier_wait: exit must drain.
      """, env=OUTFEED, transport=transport)
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert "dispatched" in lines
  numbers = [int(line) for line in lines if line != "dispatched"]
  assert numbers == list(range(1000))


@pytest.mark.parametrize("placed_by", ["mesh", "sharding"])
def test_the_last_step_still_running_at_exit_runs_its_tap(transport,
                                                          placed_by):
  """One step over several devices, still running when the program ends
  (outfeed mode): its receiver thread started when it was lowered, since
  Python 3.12 starts no thread once the program has ended (the tap was
  lost). Placed by `jax.set_mesh` as a global setter, which is still in
  force when the drain at exit runs the barrier (whose probes it placed on
  the mesh's devices: the process aborted), or by its input's sharding."""
  result = run_python(f"""
      import jax, jax.numpy as jnp, numpy as np
      import host_callback as hcb

      mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
      x = jnp.arange(4.0)
      if "{placed_by}" == "mesh":
        jax.set_mesh(mesh)
      else:
        x = jax.device_put(x, jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec("d")))
      jax.jit(lambda x: hcb.id_print(x * 2))(x)
      # No barrier_wait: exit must drain.
      """, env=OUTFEED, transport=transport)
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == ["[0. 2. 4. 6.]"]


@pytest.mark.parametrize("mode", ["synchronous", "outfeed"])
def test_computations_in_flight_at_exit_run_their_taps(transport, mode):
  """A program whose taps all ran on device threads starts no receiver;
  sharded computations still run on the client's threads when it ends, and
  JAX does not wait for them (they carry no JAX effect). The drain at exit
  waits for them: every tap runs, and the process ends cleanly (it
  aborted, "exception not rethrown", when their host functions took the
  GIL of a finalizing interpreter)."""
  result = run_python("""
      import sys
      import jax, jax.numpy as jnp, numpy as np
      import host_callback as hcb

      mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
      sharding = jax.sharding.NamedSharding(
          mesh, jax.sharding.PartitionSpec("d"))
      step = jax.jit(lambda x: hcb.id_tap(
          lambda v, transforms: sys.stdout.write(f"{int(v[1])}\\n"), x * 2))
      xs = [jax.device_put(jnp.arange(8.) + i, sharding) for i in range(3)]
      jax.block_until_ready(xs)
      for x in xs:
        step(x)
      sys.stdout.write("dispatched\\n")
      # No barrier_wait: exit must drain.
      """, env=OUTFEED if mode == "outfeed" else None, transport=transport)
  assert result.returncode == 0, result.stderr
  numbers = [line for line in result.stdout.splitlines() if line != "dispatched"]
  assert numbers == ["2", "4", "6"]
