"""The native transport on a CUDA GPU (receiver/native/ffi_cuda.cc): skipped
without one. `python -m tools.gpu_check` runs these first on a GPU machine,
then the whole suite with the GPU as the default backend. The host side of
the CUDA part runs on CPU in tests/test_cuda_transport.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb


@pytest.fixture(autouse=True)
def native_on_gpu(transport):
  if jax.default_backend() != "gpu":
    pytest.skip("needs a CUDA GPU as the default backend")
  if transport != "native":
    pytest.skip("exercises the native transport on CUDA")
  jax.config.update("jax_host_callback_transport", "native")
  yield
  hcb.barrier_wait("gpu test teardown")


def test_taps_in_a_scan_arrive_in_order_with_their_values():
  got = []

  def step(carry, i):
    hcb.id_tap(lambda a, _: got.append((int(a[0]), float(a[1]))),
               (i, carry))
    return carry * 0.5 + 1.0, None

  jax.jit(lambda: jax.lax.scan(step, jnp.float32(0), jnp.arange(1000))[0])()
  hcb.barrier_wait()
  assert [i for i, _ in got] == list(range(1000))
  carry = np.float32(0)
  for _, value in got:
    assert value == pytest.approx(float(carry))
    carry = carry * np.float32(0.5) + np.float32(1.0)


def test_large_tap_and_call_round_trip():
  x = jnp.arange(4 << 20, dtype=jnp.float32)  # 16 MiB
  seen = []
  hcb.id_tap(lambda a, _: seen.append(float(np.asarray(a).sum())), x)
  y = jax.jit(lambda v: hcb.call(lambda a: a * 2, v,
                                 result_shape=v))(x)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(x) * 2)
  hcb.barrier_wait()
  assert seen == [float(np.asarray(x).sum())]


def test_host_error_is_raised_at_the_barrier():
  def fail(*_):
    raise ValueError("from the host")

  jax.jit(lambda v: hcb.id_tap(fail, v))(jnp.ones(3))
  with pytest.raises(hcb.CallbackException):
    hcb.barrier_wait()
