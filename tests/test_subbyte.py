"""Sub-byte dtypes (int4, uint4, int2, uint2, float4_e2m1fn) through taps and
calls, small and large, on each transport.

XLA packs them below a byte per element; host functions get them one element
per byte, as NumPy (ml_dtypes) stores them. Every test here runs in the
outfeed and in the synchronous mode.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from host_callback.primitive import lowering_python

pytestmark = pytest.mark.usefixtures("both_modes")

DTYPES = [jnp.int4, jnp.uint4, jnp.int2, jnp.uint2, jnp.float4_e2m1fn]
BITS = {jnp.int4: 4, jnp.uint4: 4, jnp.int2: 2, jnp.uint2: 2,
        jnp.float4_e2m1fn: 4}


def _values(dtype, shape, seed=0):
  """Every bit pattern of the dtype, in a mixed order."""
  size = int(np.prod(shape))
  codes = (np.arange(size, dtype=np.int64) * 7 + seed) % (1 << BITS[dtype])
  return codes.astype(np.uint8).view(np.dtype(dtype)).reshape(shape)


def _assert_same(actual, expected):
  """Same dtype, shape and values (signed zeros included)."""
  actual = np.asarray(actual)
  assert actual.dtype == expected.dtype and actual.shape == expected.shape
  as_float = actual.astype(np.float32)
  np.testing.assert_array_equal(as_float, expected.astype(np.float32))
  np.testing.assert_array_equal(np.signbit(as_float),
                                np.signbit(expected.astype(np.float32)))


@pytest.mark.parametrize("shape", [(7,), (3, 5), ()])
@pytest.mark.parametrize("dtype", DTYPES)
def test_small_tap_and_call(transport, dtype, shape):
  x = _values(dtype, shape, seed=3)
  taps, args = [], []

  @jax.jit
  def f(v):
    v = hcb.id_tap(lambda a, tr: taps.append(a), v)
    return hcb.call(lambda a: args.append(a) or _values(dtype, shape, seed=5),
                    v, result_shape=v)

  out = f(x)
  hcb.barrier_wait()
  assert len(taps) == 1 and len(args) == 1
  _assert_same(taps[0], x)
  _assert_same(args[0], x)
  _assert_same(out, _values(dtype, shape, seed=5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_several_packets_of_one_site(transport, dtype):
  """Consecutive packets of one site, decoded as one batch."""
  taps = []

  @jax.jit
  def f(v):
    def body(c, _):
      hcb.id_tap(lambda a, tr: taps.append(a), c)
      return c[::-1], None
    return jax.lax.scan(body, v, None, length=20)[0]

  x = _values(dtype, (9,), seed=1)
  f(x)
  hcb.barrier_wait()
  assert len(taps) == 20
  for i, tap in enumerate(taps):
    _assert_same(tap, x if i % 2 == 0 else x[::-1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_tap(transport, dtype):
  x = _values(dtype, (16 << 20,), seed=2)
  taps = []
  jax.jit(lambda v: hcb.id_tap(lambda a, tr: taps.append(a), v))(x)
  hcb.barrier_wait()
  _assert_same(taps[0], x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_call(transport, dtype):
  x = _values(dtype, (4 << 20,), seed=4)
  expected = _values(dtype, (4 << 20,), seed=6)
  args = []
  out = jax.jit(lambda v: hcb.call(lambda a: args.append(a) or expected, v,
                                   result_shape=v))(x)
  hcb.barrier_wait()
  _assert_same(args[0], x)
  _assert_same(out, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_widened_across_the_callbacks_of_other_platforms(transport, dtype,
                                                         monkeypatch):
  """Off CPU, JAX's callbacks drop a packed array's last partial byte, so
  the Python transport widens sub-byte arrays to a byte on their way to the
  host and back. Forced here on CPU: the values are unchanged, and the
  callback's operands and results are a byte wide."""
  if transport != "python":
    pytest.skip("the Python transport's lowering")
  monkeypatch.setattr(lowering_python, "widens_subbyte", lambda _: True)
  x = _values(dtype, (7,), seed=3)
  taps, args = [], []

  def f(v):
    v = hcb.id_tap(lambda a, tr: taps.append(a), v)
    return hcb.call(lambda a: args.append(a) or _values(dtype, (7,), seed=5),
                    v, result_shape=v)

  wide = "ui8" if dtype in (jnp.uint4, jnp.uint2) else (
      "f16" if dtype == jnp.float4_e2m1fn else "i8")
  lowered = jax.jit(f).lower(x).as_text()
  assert f"tensor<7x{wide}>" in lowered
  # Widened: the tap's operand, the call's operand, the call's result.
  assert lowered.count("stablehlo.convert") == 3
  out = jax.jit(f)(x)
  hcb.barrier_wait()
  _assert_same(taps[0], x)
  _assert_same(args[0], x)
  _assert_same(out, _values(dtype, (7,), seed=5))
