"""The native transport: ordering, backpressure, stop, volume, sharded jit.

conftest.py runs every test once per available transport; the tests that
exercise the native queues themselves skip on the Python transport (and
where the default backend is not CPU), the others (sharded jit, errors,
dtypes) check that both transports agree. The tests of the queues, of volume
and of stop run in the outfeed mode, the tests of order, errors and values in
both modes.
"""

import importlib.machinery
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import host_callback as hcb
from host_callback.host import host_side, transport_policy
from host_callback.receiver import native_library
from helpers import (barrier_report, cpu_devices, needs_cpu_default_backend,
                     wait_until)


@pytest.fixture
def native_only(transport):
  if transport != "native":
    pytest.skip("exercises the native transport's queues")
  needs_cpu_default_backend("exercises the native CPU transport's queues")


def _native_transport():
  return host_side.transport("native")


def _run_in_thread(computation):
  """Runs `computation()` to completion in a thread (dispatch may be inline).

  Returns a function that joins it and returns the exception it raised.
  """
  outcome = []

  def run():
    try:
      jax.block_until_ready(computation())
      outcome.append(None)
    except Exception as error:  # pylint: disable=broad-except
      outcome.append(error)

  thread = threading.Thread(target=run, daemon=True)
  thread.start()

  def join():
    thread.join(30)
    assert outcome, "the computation hung"
    return outcome[0]
  return join


def test_native_is_built_and_chosen_on_cpu(transport):
  needs_cpu_default_backend("checks the transport chosen on CPU")
  if transport == "python":
    assert transport_policy.for_platform("cpu") == "python"
    return
  assert native_library.available()
  jax.config.update("jax_host_callback_transport", "auto")
  assert transport_policy.for_platform("cpu") == "native"


def test_native_is_a_python_extension_module():
  """The native side is a CPython extension module (no ctypes binding):
  its FFI handlers come as capsules, and it checks its ABI."""
  if not native_library.available():
    pytest.skip("the native transport is not built")
  module = native_library.native
  assert isinstance(module.__loader__, importlib.machinery.ExtensionFileLoader)
  assert module.ABI_VERSION == native_library.ABI_VERSION
  handlers = native_library.ffi_handlers()
  assert sorted(handlers) == sorted([
      native_library.OUTFEED_TARGET, native_library.CALL_TARGET,
      native_library.TAP_SYNC_TARGET, native_library.BEGIN_TARGET,
      native_library.END_TARGET])
  assert all(type(h).__name__ == "PyCapsule" for h in handlers.values())


def test_pmap_each_device_in_order(transport, both_modes):
  steps = 500
  seen = {}

  def tap(x, transforms, device):
    seen.setdefault(device.id, []).append((int(x[0]), int(x[1])))

  def per_device(d):
    def body(i, _):
      hcb.id_tap(tap, jnp.stack([d, i]), tap_with_device=True)
      return i + 1, None
    return jax.lax.scan(body, jnp.int32(0), None, length=steps)[0]

  devices = cpu_devices(4)
  x = jnp.arange(4, dtype=jnp.int32)
  jax.pmap(per_device, devices=devices)(x)  # outputs dropped
  jax.pmap(per_device, devices=devices)(x)
  hcb.barrier_wait()
  assert sorted(seen) == [d.id for d in devices]
  for position, device in enumerate(devices):
    assert seen[device.id] == [(position, i) for i in range(steps)] * 2


def test_hundred_thousand_taps_delivered(transport, outfeed_mode):
  steps = 100_000
  received = []

  @jax.jit
  def loop(x):
    def body(i, _):
      hcb.id_tap(lambda v, tr: received.append(v), (i, x * i))
      return i + 1, None
    return jax.lax.scan(body, jnp.int32(0), None, length=steps)[0]

  assert int(loop(jnp.int32(3))) == steps
  hcb.barrier_wait()
  assert len(received) == steps
  indices = np.array([int(i) for i, _ in received])
  payloads = np.array([int(v) for _, v in received], np.int64)
  np.testing.assert_array_equal(indices, np.arange(steps))
  assert payloads.sum() == 3 * steps * (steps - 1) // 2


def test_queue_bound_honoured(native_only, outfeed_mode, smallest_queue):
  bound = smallest_queue
  packet = 4 * 250_000  # one f32[250000] per tap
  worst = []

  def slow_tap(x, transforms):
    stats = _native_transport().stats(0)
    worst.append(stats.bytes_waiting)
    time.sleep(0.002)

  @jax.jit
  def loop(x):
    def body(c, _):
      hcb.id_tap(slow_tap, c)
      return c + 1, None
    return jax.lax.scan(body, x, None, length=60)[0]

  loop(jnp.zeros(250_000, jnp.float32))
  hcb.barrier_wait()
  stats = _native_transport().stats(0)
  assert stats.max_bytes == bound
  assert len(worst) == 60
  one_packet = packet + 64  # the packet header
  assert max(worst) <= bound + one_packet
  assert bound - one_packet <= stats.high_water_bytes <= bound + one_packet
  assert stats.bytes_waiting == 0 and stats.packets_waiting == 0


def test_stop_while_device_waits_for_room_loses_nothing(native_only,
                                                       outfeed_mode,
                                                       smallest_queue):
  """Stop drains what was sent; the device, which waits for room meanwhile,
  goes on when the next receiver (started at once) consumes the rest."""
  release = threading.Event()
  received = []

  def blocked_tap(x, transforms):
    release.wait(30)
    received.append(int(x[0]))

  @jax.jit
  def loop(x):
    def body(c, _):
      hcb.id_tap(blocked_tap, c)
      return c + 1, None
    return jax.lax.scan(body, x, None, length=40)[0]

  join = _run_in_thread(lambda: loop(jnp.zeros(1_000_000, jnp.float32)))
  transport = _native_transport()  # 4 MB per packet:
  assert wait_until(
      lambda: transport.stats(0).bytes_waiting >= smallest_queue - 4e6)
  threading.Timer(0.3, release.set).start()
  hcb.stop_outfeed_receiver()
  assert join() is None
  hcb.barrier_wait()
  assert received == list(range(40))


def test_stop_while_device_waits_for_call_result_loses_nothing(native_only,
                                                              outfeed_mode):
  release = threading.Event()
  called = threading.Event()

  def blocked(x):
    called.set()
    release.wait(30)
    return x + 1

  results = []
  join = _run_in_thread(lambda: results.append(
      jax.jit(lambda x: hcb.call(blocked, x, result_shape=x))(1.0)))
  assert called.wait(30)
  threading.Timer(0.3, release.set).start()
  hcb.stop_outfeed_receiver()
  assert join() is None
  assert [float(r) for r in results] == [2.0]
  assert float(jax.jit(lambda x: hcb.call(lambda v: v + 1, x,
                                          result_shape=x))(1.0)) == 2.0


def test_compiled_computation_after_stop(transport, outfeed_mode):
  """A cached executable run after stop_outfeed_receiver restarts it."""
  taps = []
  tap = jax.jit(lambda x: hcb.id_tap(lambda v, tr: taps.append(float(v)), x))
  call = jax.jit(lambda x: hcb.call(lambda v: v * 2, x, result_shape=x))
  tap(1.0)
  assert float(call(1.0)) == 2.0
  hcb.stop_outfeed_receiver()
  tap(2.0)  # no lowering this time: the executables are cached
  assert float(call(3.0)) == 6.0
  hcb.barrier_wait()
  assert taps == [1.0, 2.0]


def test_dispatch_returns_after_an_expensive_computation_ran(transport,
                                                             both_modes):
  """As with JAX's own callbacks on CPU, a computation with callbacks has
  run when its dispatch returns (when its inputs are ready), however
  expensive, so that barrier_wait's markers come after it."""
  ran = []

  @jax.jit
  def work(x):
    y = x @ x @ x @ x
    return hcb.call(lambda v: (ran.append(1), v)[1], y[0, 0],
                    result_shape=y[0, 0])

  x = jnp.ones((1000, 1000), jnp.float32) / 1000
  jax.block_until_ready(work(x))  # compile
  ran.clear()
  work(x)
  assert ran == [1]


def test_call_error_fails_computation_then_next_runs(transport, both_modes):
  def bad(x):
    raise ValueError("boom")

  with pytest.raises(Exception, match="bad raised ValueError: boom"):
    jax.jit(lambda x: hcb.call(bad, x, result_shape=x) + 1)(1.0
                                                          ).block_until_ready()
  report = barrier_report()  # the outfeed mode raises it again
  assert report is None or "ValueError: boom" in str(report)
  assert float(jax.jit(lambda x: hcb.call(lambda v: v * 2, x,
                                          result_shape=x))(3.0)) == 6.0


def test_failed_async_computation_does_not_fail_the_next(transport,
                                                         both_modes):
  """After a computation fails once dispatched, the next ones run normally.

  JAX hands each computation with ordered effects the previous one's output
  token; a failed computation's token must not fail all later ones.
  """
  def bad(x):
    raise ValueError("boom")

  @jax.jit
  def work(x):  # large enough to be dispatched asynchronously
    y = jnp.tanh(x @ x.T / x.shape[0])
    y = hcb.call(bad, y, result_shape=y)
    return jnp.tanh(y @ y.T / y.shape[0])

  with pytest.raises(Exception, match="bad raised ValueError: boom"):
    work(jnp.ones((256, 256), jnp.float32)).block_until_ready()
  report = barrier_report()  # the outfeed mode raises it again
  assert report is None or "ValueError: boom" in str(report)
  for _ in range(2):
    assert float(jax.jit(lambda x: hcb.call(lambda v: v * 2, x,
                                            result_shape=x))(3.0)) == 6.0


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint16, np.int64,
                                   np.float16, jnp.bfloat16, np.float64,
                                   np.complex64])
def test_dtypes_round_trip(transport, both_modes, dtype):
  x = (np.arange(6) % 3).astype(dtype).reshape(2, 3)
  taps = []
  # Globally: the receiver's threads canonicalize dtypes too.
  jax.config.update("jax_enable_x64", True)
  try:
    result = jax.jit(lambda v: hcb.call(
        lambda a: taps.append(a) or a,
        hcb.id_tap(lambda a, tr: taps.append(a), v), result_shape=v))(x)
    hcb.barrier_wait()
  finally:
    jax.config.update("jax_enable_x64", False)
  np.testing.assert_array_equal(np.asarray(result), x)
  assert [t.dtype for t in taps] == [x.dtype, x.dtype]
  for tap in taps:
    np.testing.assert_array_equal(tap, x)


def test_empty_and_missing_values(transport, both_modes):
  taps = []
  f = jax.jit(lambda x: (hcb.id_tap(lambda a, tr: taps.append(a), None),
                         hcb.call(lambda a: np.zeros((0, 2), np.float32), x,
                                  result_shape=jax.ShapeDtypeStruct(
                                      (0, 2), jnp.float32))))
  _, out = f(jnp.zeros((3, 0)))
  hcb.barrier_wait()
  assert taps == [None] and out.shape == (0, 2)


def test_prng_keys_tapped_as_key_data(transport, both_modes):
  taps = []
  key = jax.random.key(3)
  jax.jit(lambda k: hcb.id_tap(lambda a, tr: taps.append(a), k))(key)
  hcb.barrier_wait()
  np.testing.assert_array_equal(taps[0], jax.random.key_data(key))


@pytest.mark.parametrize("shardy", [True, False])
def test_sharded_jit(transport, both_modes, shardy):
  previous = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", shardy)
  try:
    mesh = jax.make_mesh((2, 2), ("a", "b"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=cpu_devices(4))
    x = jax.device_put(jnp.arange(16.0).reshape(4, 4),
                       NamedSharding(mesh, P("a", "b")))
    taps = []

    @jax.jit
    def f(x):
      y = hcb.id_tap(lambda v, tr, device: taps.append((v, device)), x * 2,
                     tap_with_device=True, device_index=1)
      z = hcb.call(lambda v, device: v + device.id, y, result_shape=y,
                   call_with_device=True, device_index=2)
      return jax.lax.with_sharding_constraint(z + 1, NamedSharding(mesh, P("a")))

    out = f(x)
    hcb.barrier_wait()
  finally:
    jax.config.update("jax_use_shardy_partitioner", previous)
  devices = list(mesh.devices.flat)
  np.testing.assert_array_equal(out, np.arange(16.0).reshape(4, 4) * 2 + 1 +
                                devices[2].id)
  assert len(taps) == 1
  np.testing.assert_array_equal(taps[0][0], np.arange(16.0).reshape(4, 4) * 2)
  assert taps[0][1] == devices[1]


def test_sharded_jit_taps_in_scan_keep_order(transport, both_modes):
  mesh = jax.make_mesh((4,), ("x",), devices=cpu_devices(4))
  x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("x")))
  seen = []

  @jax.jit
  def f(x):
    def body(c, i):
      hcb.id_tap(lambda v, tr: seen.append(int(v)), i)
      return c + i, None
    return jax.lax.scan(body, x, jnp.arange(50))[0]

  f(x)
  hcb.barrier_wait()
  assert seen == list(range(50))
