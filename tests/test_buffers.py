"""`call(..., buffers=True)`: arguments as buffers that export DLPack, results
taken as returned (DLPack) or filled in place through `out=`; no copy where
the host function runs directly on the native transport, at most one copy
each way elsewhere."""

import re
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from helpers import (cpu_devices, needs_cpu_default_backend, on_a_cpu_device,
                     synchronous)


@pytest.fixture(autouse=True)
def _on_a_cpu():
  """These tests are about host buffers: their computations run on a CPU
  device whatever the default backend is (a GPU's buffers are
  test_gpu_buffers.py's)."""
  with on_a_cpu_device():
    yield


def _buffers_call(host, x, result_shape=None):
  return hcb.call(host, x, result_shape=x if result_shape is None
                  else result_shape, buffers=True)


def test_arguments_export_dlpack_and_results_are_taken_as_returned(
    both_modes):
  received = []

  def host(arg):
    a, b = arg["a"], arg["b"]
    received.append((a.flags.writeable, np.from_dlpack(a).tolist()))
    return np.asarray(a) + b  # float32: exactly result_shape's dtype

  f = jax.jit(lambda a, b: hcb.call(host, {"a": a, "b": b}, result_shape=a,
                                    buffers=True))
  out = f(jnp.arange(4.0), jnp.ones(4))
  np.testing.assert_array_equal(out, [1.0, 2.0, 3.0, 4.0])
  assert received == [(False, [0.0, 1.0, 2.0, 3.0])]


def test_out_is_filled_in_place(both_modes):
  """A pytree of writable output buffers shaped like `result_shape`."""
  seen = []

  def host(x, out):
    seen.append((type(out), out["sum"].shape, out["twice"].flags.writeable))
    out["sum"][...] = x.sum()
    np.multiply(x, 2, out=out["twice"])

  result_shape = {"sum": jax.ShapeDtypeStruct((), jnp.float32),
                  "twice": jax.ShapeDtypeStruct((3,), jnp.float32)}
  out = jax.jit(lambda v: _buffers_call(host, v * 1, result_shape))(
      jnp.arange(3.0))
  assert float(out["sum"]) == 3.0
  np.testing.assert_array_equal(out["twice"], [0.0, 2.0, 4.0])
  assert seen == [(dict, (), True)]


def test_out_may_be_returned_as_numpy_out_functions_do(both_modes):
  f = jax.jit(lambda v: _buffers_call(
      lambda a, out: np.add(a, 1, out=out), v))
  np.testing.assert_array_equal(f(jnp.arange(3)), [1, 2, 3])


def test_a_jax_array_is_taken_through_dlpack(both_modes):
  def host(a):
    return jnp.asarray(np.array(a)) * 10  # a jax.Array on the CPU

  f = jax.jit(lambda v: _buffers_call(host, v + 1))
  np.testing.assert_array_equal(f(jnp.arange(3.0)), [10.0, 20.0, 30.0])


def test_a_bfloat16_jax_array_is_taken_without_numpy_dlpack(both_modes):
  """NumPy's DLPack lacks bfloat16: taken through `__array__` instead."""
  f = jax.jit(lambda v: _buffers_call(lambda a: jnp.asarray(a) + 1, v))
  out = f(jnp.arange(3, dtype=jnp.bfloat16))
  assert out.dtype == jnp.bfloat16
  np.testing.assert_array_equal(out.astype(np.float32), [1.0, 2.0, 3.0])


def test_synchronous_native_call_neither_copies_arguments_nor_results(
    transport):
  """The host function's argument is the jitted function's parameter
  buffer, and its out= buffer the result array's own memory (on the native
  transport); the Python transport copies each once."""
  needs_cpu_default_backend("the synchronous mode exists on CPU only")
  pointers = []

  def host(a, out):
    pointers.append((a.ctypes.data, out.ctypes.data))
    out[...] = a

  x = jnp.arange(1 << 20, dtype=jnp.float32)  # 4 MiB
  out = jax.jit(lambda v: _buffers_call(host, v))(x)
  np.testing.assert_array_equal(out, x)
  (argument, output), = pointers
  native = transport == "native"
  assert (argument == x.unsafe_buffer_pointer()) == native
  assert (output == out.unsafe_buffer_pointer()) == native


def test_a_queued_call_fills_a_host_buffer_copied_once(transport):
  """In the outfeed mode a call behind a tap that the receiver thread is
  still running is queued: out= is a host array, which the transport
  copies into the device's buffer."""
  jax.config.update("jax_host_callback_outfeed", True)
  pointers = []
  started = threading.Event()

  def host(a, out):
    pointers.append(out.ctypes.data)
    out[...] = a + 1

  def slow(arg, transforms):
    started.set()
    time.sleep(0.2)

  jax.jit(lambda v: hcb.id_tap(slow, v))(jnp.arange(4.0))
  assert started.wait(60)  # the receiver thread runs it
  out = jax.jit(lambda v: _buffers_call(host, v))(jnp.arange(4.0))
  np.testing.assert_array_equal(out, [1.0, 2.0, 3.0, 4.0])
  assert pointers != [out.unsafe_buffer_pointer()]


def test_ordered_with_taps_in_a_scan(both_modes):
  events = []

  def host(a, out):
    events.append(("call", int(a)))
    out[...] = a * 2

  def body(carry, _):
    carry = hcb.id_tap(lambda v, transforms: events.append(("tap", int(v))),
                       carry)
    return _buffers_call(host, carry) + 1, None

  out = jax.jit(lambda c: jax.lax.scan(body, c, None, length=3)[0])(1)
  hcb.barrier_wait()
  assert int(out) == ((1 * 2 + 1) * 2 + 1) * 2 + 1
  assert events == [("tap", 1), ("call", 1), ("tap", 3), ("call", 3),
                    ("tap", 7), ("call", 7)]


def test_in_cond_while_and_nested_jit(both_modes):
  host = lambda a, out: np.add(a, 10, out=out)  # noqa: E731
  inner = jax.jit(lambda v: _buffers_call(host, v))

  def f(x):
    x = jax.lax.cond(x[0] > 0, inner, lambda v: v, x)
    return jax.lax.while_loop(lambda v: v[0] < 25, inner, x)

  np.testing.assert_array_equal(jax.jit(f)(jnp.array([1, 2])), [31, 32])
  np.testing.assert_array_equal(jax.jit(f)(jnp.array([0, 2])), [30, 32])


def test_vmap_calls_once_per_element(both_modes):
  shapes = []

  def host(a, out):
    shapes.append(a.shape)
    out[...] = a[::-1]

  out = jax.jit(jax.vmap(lambda v: _buffers_call(host, v)))(
      jnp.arange(6).reshape(3, 2))
  np.testing.assert_array_equal(out, [[1, 0], [3, 2], [5, 4]])
  assert shapes == [(2,)] * 3


def test_pmap_over_four_devices(both_modes):
  devices = cpu_devices(4)

  def host(a, out, device):
    out[...] = a * 10 + device.id

  out = jax.pmap(lambda x: hcb.call(host, x, result_shape=x, buffers=True,
                                    call_with_device=True),
                 devices=devices)(jnp.arange(8).reshape(4, 2))
  hcb.barrier_wait()
  np.testing.assert_array_equal(
      out, [[i * 20 + d.id, i * 20 + 10 + d.id]
            for i, d in enumerate(devices)])


def test_sharded_jit_whole_value_and_partitioned(both_modes):
  mesh = jax.sharding.Mesh(np.array(cpu_devices(2)), ("d",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
  x = jax.device_put(jnp.arange(8.0).reshape(4, 2), sharding)
  shapes = []

  def host(a, out):
    shapes.append(a.shape)
    np.multiply(a, 2, out=out)

  whole = jax.jit(lambda v: _buffers_call(host, v))(x)
  per_shard = jax.jit(lambda v: hcb.call(host, v, result_shape=v,
                                         buffers=True, partitioned=True))(x)
  hcb.barrier_wait()
  np.testing.assert_array_equal(whole, np.arange(8.0).reshape(4, 2) * 2)
  np.testing.assert_array_equal(per_shard, whole)
  assert shapes == [(4, 2), (2, 2), (2, 2)]


def _fails(f, x, message):
  """`f(x)` fails with `message`; the next call runs."""
  with pytest.raises(Exception, match=re.escape(message)):
    jax.block_until_ready(f(x))
  if not synchronous():  # the outfeed mode reports it again at the barrier
    with pytest.raises(hcb.CallbackException, match=re.escape(message)):
      hcb.barrier_wait()
  ok = jax.jit(lambda v: _buffers_call(lambda a: np.array(a), v))(x)
  np.testing.assert_array_equal(ok, x)


def test_wrong_dtype_is_not_converted(both_modes):
  _fails(jax.jit(lambda v: _buffers_call(lambda a: a.astype(np.float64), v)),
         jnp.arange(3.0),
         "host_callback.call: <lambda> returned float64[3] where "
         "result_shape expects float32[3]; with buffers=True results are "
         "taken as they are, without conversion: return that shape and dtype")


def test_wrong_shape(both_modes):
  _fails(jax.jit(lambda v: _buffers_call(lambda a: np.zeros(4, a.dtype), v)),
         jnp.arange(3.0),
         "host_callback.call: <lambda> returned float32[4] where "
         "result_shape expects float32[3]; with buffers=True results are "
         "taken as they are, without conversion: return that shape and dtype")


class _OnAGpu:
  """An array that DLPack places on a CUDA device."""

  def __dlpack__(self, **kwargs):
    raise AssertionError("not to be taken")

  def __dlpack_device__(self):
    return (2, 0)  # kDLCUDA, device 0


def test_an_array_on_another_device_is_refused(both_modes):
  _fails(jax.jit(lambda v: _buffers_call(lambda a: _OnAGpu(), v)),
         jnp.arange(3.0),
         "host_callback.call: <lambda> returned an array on DLPack device "
         "(2, 0) where result_shape expects float32[3] on the CPU")


def test_a_result_without_dlpack_is_refused(both_modes):
  _fails(jax.jit(lambda v: _buffers_call(lambda a: memoryview(np.array(a)),
                                         v)),
         jnp.arange(3.0),
         "host_callback.call: <lambda> returned memoryview where result_shape "
         "expects float32[3]; with buffers=True return arrays that export "
         "__dlpack__")


def test_out_filled_and_something_else_returned_is_refused(both_modes):
  _fails(jax.jit(lambda v: _buffers_call(lambda a, out: a + 1, v)),
         jnp.arange(3.0),
         "host_callback.call: <lambda> takes out=, so it fills the result "
         "buffers that result_shape describes in place and returns None; "
         "it returned ndarray")


def test_a_raising_host_function_fails_with_its_traceback(both_modes):
  def fill_badly(a, out):
    raise ValueError("no room")

  f = jax.jit(lambda v: _buffers_call(fill_badly, v))
  with pytest.raises(Exception) as info:
    jax.block_until_ready(f(jnp.arange(3.0)))
  message = str(info.value)
  assert "host_callback.call: fill_badly raised ValueError: no room" in message
  assert 'raise ValueError("no room")' in message
  if not synchronous():
    with pytest.raises(hcb.CallbackException):
      hcb.barrier_wait()


def test_keeping_an_out_buffer_fails_the_computation(transport):
  """A direct run's out= views the device's result buffer, which the host
  function may not keep (native transport)."""
  needs_cpu_default_backend("the synchronous mode exists on CPU only")
  kept = []

  def keep(a, out):
    out[...] = a
    kept.append(out)

  f = jax.jit(lambda v: _buffers_call(keep, v))
  if transport != "native":
    np.testing.assert_array_equal(f(jnp.arange(3.0)), [0.0, 1.0, 2.0])
    return
  with pytest.raises(Exception, match=re.escape(
      "host_callback: the host function keep kept a buffer of out= it got "
      "with buffers=True (a view of the device's result buffer, valid only "
      "until the function returns), so its computation fails")):
    jax.block_until_ready(f(jnp.arange(3.0)))
  np.testing.assert_array_equal(kept[0], [0.0, 1.0, 2.0])


def test_buffers_must_be_a_bool():
  with pytest.raises(TypeError, match="buffers must be True or False"):
    hcb.call(lambda a: a, 1.0, result_shape=1.0, buffers="yes")


def test_eager_use_outside_jit(both_modes):
  out = hcb.call(lambda a, out: np.multiply(a, 3, out=out), jnp.arange(3),
                 result_shape=jnp.arange(3), buffers=True)
  np.testing.assert_array_equal(out, [0, 3, 6])
  out = hcb.call(lambda a: np.array(a) + 1, jnp.arange(3.0),
                 result_shape=jnp.arange(3.0), buffers=True)
  np.testing.assert_array_equal(out, [1.0, 2.0, 3.0])


def test_stream_is_none_where_the_buffers_are_host_memory(both_modes):
  """A host function with a `stream` parameter gets stream=None off a GPU's
  own buffers (the CUDA stand-in's scenario covers a GPU's)."""
  streams = []

  def fill(x, *, out, stream):
    streams.append(stream)
    out[...] = x

  x = jnp.arange(3.0)
  y = jax.jit(lambda v: hcb.call(fill, v, result_shape=v, buffers=True))(x)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
  assert streams == [None]
