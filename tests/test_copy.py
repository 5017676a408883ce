"""`copy=False`: read-only arguments, views of the device's buffers in the
synchronous mode on the native transport, views of the one copy otherwise."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb

from helpers import captured_stdout, needs_cpu_default_backend


def _received(received):
  """A tap function that records a copy of its array, whether the array was
  writeable, and where its data was."""
  def tap(arg, transforms):
    received.append((np.array(arg), arg.flags.writeable, arg.ctypes.data))
  return tap


@pytest.mark.parametrize("copy", [False, True])
def test_tap_arguments_are_read_only_only_without_a_copy(both_modes, copy):
  received = []
  x = jnp.arange(6.0).reshape(2, 3)
  jax.jit(lambda v: hcb.id_tap(_received(received), v * 2, copy=copy))(x)
  hcb.barrier_wait()
  (arg, writeable, _), = received
  np.testing.assert_array_equal(arg, np.arange(6.0).reshape(2, 3) * 2)
  assert writeable == copy


def test_synchronous_native_tap_views_the_device_buffer(transport):
  """No copy at all: the host function's array is the jitted function's
  parameter buffer (on CPU, the input array's own memory). The function
  returns one element: returning the parameter would make XLA copy it into
  an output buffer, which the tap might then read."""
  needs_cpu_default_backend("the synchronous mode exists on CPU only")
  jax.config.update("jax_host_callback_outfeed", False)
  received = []
  tap = _received(received)
  for copy in (False, True):
    x = jnp.arange(1 << 20, dtype=jnp.float32)  # 4 MiB
    jax.jit(lambda v, copy=copy: hcb.id_tap(tap, v, copy=copy)[0])(x)
    viewed = received[-1][2] == x.unsafe_buffer_pointer()
    assert viewed == (not copy and transport == "native")


def test_call_arguments_without_a_copy(both_modes):
  def host(arg):
    assert not arg["a"].flags.writeable and not arg["b"].flags.writeable
    return arg["a"] + arg["b"]

  f = jax.jit(lambda a, b: hcb.call(host, {"a": a, "b": b}, result_shape=a,
                                    copy=False))
  result = f(jnp.arange(4.0), jnp.ones(4))
  np.testing.assert_array_equal(result, [1.0, 2.0, 3.0, 4.0])


def test_call_that_returns_its_view_without_a_copy(both_modes):
  """The result is copied into the device's buffer before the view goes."""
  f = jax.jit(lambda x: hcb.call(lambda a: a, x * 3, result_shape=x,
                                 copy=False))
  np.testing.assert_array_equal(f(jnp.arange(5.0)), np.arange(5.0) * 3)


def test_id_print_without_a_copy(both_modes):
  with captured_stdout() as out:
    jax.jit(lambda x: hcb.id_print(x, what="x", copy=False))(jnp.arange(3))
    hcb.barrier_wait()
  assert out.getvalue() == "what: x\n[0 1 2]\n"


def test_keeping_a_synchronous_view_fails_the_computation(transport):
  """The documented mistake: on native the computation fails with an error
  naming the host function, copy=False and the fix; the kept array keeps
  the values it showed, whatever the device does next."""
  needs_cpu_default_backend("the synchronous mode exists on CPU only")
  jax.config.update("jax_host_callback_outfeed", False)
  kept = []

  def keeper(arg, transforms):
    kept.append(arg)

  f = jax.jit(lambda x: hcb.id_tap(keeper, x + 1, copy=False) * 2)
  if transport == "native":
    with pytest.raises(Exception, match=r"keeper kept an argument it got "
                       r"with copy=False.*np\.array\(a\)"):
      jax.block_until_ready(f(jnp.arange(3.0)))
  else:  # the Python transport gives read-only copies, which may be kept
    jax.block_until_ready(f(jnp.arange(3.0)))
  for i in range(20):  # reuse the device's buffers
    jax.block_until_ready(jax.jit(lambda x: x * 0 + 7)(jnp.arange(3.0) + i))
  np.testing.assert_array_equal(kept[0], [1.0, 2.0, 3.0])
  assert not kept[0].flags.writeable
  # Nothing is left for the barrier: the error reached the caller.
  received = []
  jax.jit(lambda x: hcb.id_tap(_received(received), x, copy=False))(1.0)
  assert float(received[0][0]) == 1.0


def test_keeping_a_view_of_the_outfeed_copy_is_allowed():
  """In the outfeed mode the arrays view the one copy the device made, which
  lives as long as the host function keeps it."""
  jax.config.update("jax_host_callback_outfeed", True)
  kept = []
  f = jax.jit(lambda x: hcb.id_tap(lambda a, _: kept.append(a), x,
                                   copy=False))
  for i in range(3):
    f(jnp.full((4,), float(i)))
  hcb.barrier_wait()
  assert [a.tolist() for a in kept] == [[float(i)] * 4 for i in range(3)]
  assert not any(a.flags.writeable for a in kept)


@pytest.mark.parametrize("api", ["id_tap", "id_print", "call"])
def test_copy_must_be_a_bool(api):
  functions = {
      "id_tap": lambda x: hcb.id_tap(lambda a, t: None, x, copy="no"),
      "id_print": lambda x: hcb.id_print(x, copy=0),
      "call": lambda x: hcb.call(lambda a: a, x, result_shape=x, copy=None),
  }
  with pytest.raises(TypeError, match=rf"host_callback\.{api}: copy must be "
                     "True or False"):
    jax.jit(functions[api])(1.0)
