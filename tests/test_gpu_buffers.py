"""`call(..., buffers=True)` on a CUDA GPU's own buffers (the native
transport's direct run, receiver/device_buffers.py) with CuPy: skipped
without a GPU or without CuPy. `python -m tools.gpu.check` runs it with the
GPU tests; its host side runs on CPU against the CUDA stand-in
(tests/test_cuda_transport.py, the "buffers" scenario).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb


@pytest.fixture(autouse=True)
def native_on_gpu_with_cupy(transport):
  if jax.default_backend() != "gpu":
    pytest.skip("needs a CUDA GPU as the default backend")
  if transport != "native":
    pytest.skip("exercises the native transport on CUDA")
  pytest.importorskip("cupy")
  jax.config.update("jax_host_callback_transport", "native")
  yield
  hcb.barrier_wait("gpu buffers test teardown")


def _double_on_stream(x, *, out, stream):
  """A CuPy kernel on the computation's stream, filling out= in place."""
  import cupy  # pylint: disable=import-outside-toplevel
  with cupy.cuda.ExternalStream(stream):
    cupy.multiply(cupy.from_dlpack(x), 2, out=cupy.from_dlpack(out))


def test_a_cupy_kernel_in_a_scan_keeps_values_and_order_with_taps():
  events = []

  def step(carry, i):
    hcb.id_tap(lambda a, _: events.append(("tap", int(a))), i)
    carry = hcb.call(_double_on_stream, carry, result_shape=carry,
                     buffers=True)
    hcb.id_tap(lambda a, _: events.append(("after", int(a))), i)
    return carry, None

  x = jnp.ones(1024, jnp.float32)
  y = jax.jit(lambda v: jax.lax.scan(step, v, jnp.arange(10))[0])(x)
  np.testing.assert_array_equal(np.asarray(y), np.full(1024, 2.0 ** 10))
  hcb.barrier_wait()
  assert events == [(name, i) for i in range(10)
                    for name in ("tap", "after")]


def test_the_host_function_gets_the_gpu_s_buffers_and_stream():
  import cupy  # pylint: disable=import-outside-toplevel
  seen = []

  def look(x, stream):
    seen.append((x.__dlpack_device__(), stream,
                 x.__cuda_array_interface__["stream"]))
    with cupy.cuda.ExternalStream(stream):
      return cupy.from_dlpack(x) + 1

  x = jnp.arange(8, dtype=jnp.float32)
  y = jax.jit(lambda v: hcb.call(look, v, result_shape=v, buffers=True))(x)
  np.testing.assert_array_equal(np.asarray(y), np.arange(8) + 1)
  (device, stream, interface_stream), = seen
  assert device == (2, x.devices().pop().local_hardware_id)
  assert isinstance(stream, int) and stream == interface_stream


def test_a_host_array_returned_is_refused_naming_result_shape():
  x = jnp.ones(4, jnp.float32)
  with pytest.raises(Exception, match="result_shape"):
    jax.jit(lambda v: hcb.call(lambda a: np.ones(4, np.float32), v,
                               result_shape=v, buffers=True))(
                                   x).block_until_ready()
  # The outfeed mode (a GPU's only one) reports it again at the barrier,
  # as tests/test_buffers.py's `_fails` checks on CPU.
  with pytest.raises(hcb.CallbackException, match="result_shape"):
    hcb.barrier_wait()


def test_a_raising_host_function_fails_with_its_traceback():
  def broken(x, *, out):
    raise ValueError("from the GPU's buffers")

  x = jnp.ones(4, jnp.float32)
  with pytest.raises(Exception, match="from the GPU's buffers") as raised:
    jax.jit(lambda v: hcb.call(broken, v, result_shape=v, buffers=True))(
        x).block_until_ready()
  assert "in broken" in str(raised.value)
  with pytest.raises(hcb.CallbackException, match="from the GPU's buffers"):
    hcb.barrier_wait()  # reported again in the outfeed mode, as on CPU
