"""What taps receive and return: dtypes, pytrees, PRNG keys, empty values, result=.

Every test here runs in the outfeed and in the synchronous mode.
"""

import collections
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import host_callback as hcb
from helpers import Recorder, assert_tree_equal

pytestmark = pytest.mark.usefixtures("both_modes")

DTYPES = ["bool", "int8", "int16", "int32", "uint8", "uint16", "uint32",
          "float16", "bfloat16", "float32", "complex64"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_round_trip(dtype):
  rec = Recorder()
  x = (jnp.arange(6) % 3).reshape(2, 3).astype(dtype)
  out = jax.jit(lambda v: hcb.id_tap(rec, v))(x)
  hcb.barrier_wait()
  assert out.dtype == x.dtype
  np.testing.assert_array_equal(out, x)
  assert rec.args[0].dtype == x.dtype
  assert rec.args[0].shape == (2, 3)
  np.testing.assert_array_equal(rec.args[0], np.asarray(x))


def test_python_and_numpy_scalars():
  rec = Recorder()
  out = jax.jit(lambda: hcb.id_tap(rec, (1, 2.5, True, np.int8(-3),
                                         np.float32(0.25))))()
  hcb.barrier_wait()
  assert_tree_equal(rec.args, [(np.int32(1), np.float32(2.5), np.bool_(True),
                                np.int8(-3), np.float32(0.25))])
  assert [x.item() for x in out] == [1, 2.5, True, -3, 0.25]


def test_transposed_and_sliced_values_are_exact():
  rec = Recorder()
  x = jnp.arange(24.).reshape(2, 3, 4)
  jax.jit(lambda v: hcb.id_tap(rec, (v.transpose(2, 0, 1), v[:, 1, ::2])))(x)
  hcb.barrier_wait()
  xn = np.arange(24., dtype=np.float32).reshape(2, 3, 4)
  assert_tree_equal(rec.args, [(xn.transpose(2, 0, 1), xn[:, 1, ::2])])


def test_pytrees_keep_structure():
  rec = Recorder()
  Point = collections.namedtuple("Point", ["x", "y"])
  arg = {"b": [jnp.float32(1.), (jnp.int32(2),)], "a": Point(jnp.ones(2),
                                                              jnp.zeros(()))}
  out = jax.jit(lambda a: hcb.id_tap(rec, a))(arg)
  hcb.barrier_wait()
  assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(arg)
  tapped = rec.args[0]
  assert isinstance(tapped["a"], Point)
  assert_tree_equal(tapped, {"b": [np.float32(1.), (np.int32(2),)],
                             "a": Point(np.ones(2, np.float32),
                                        np.zeros((), np.float32))})


def test_large_array_exact():
  rec = Recorder()
  x = jnp.arange(1 << 20, dtype=jnp.int32)
  jax.jit(lambda v: hcb.id_tap(rec, v * 3))(x)
  hcb.barrier_wait()
  np.testing.assert_array_equal(rec.args[0], np.arange(1 << 20) * 3)


# --- PRNG keys -----------------------------------------------------------


@pytest.mark.parametrize("make_key", [jax.random.key, jax.random.PRNGKey],
                         ids=["key", "PRNGKey"])
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_prng_keys_tapped_and_passed_through(make_key, jit):
  rec = Recorder()
  key = make_key(42)

  def f(k):
    k2 = hcb.id_tap(rec, k)
    return k2, jax.random.uniform(k2, (3,))

  out_key, sample = (jax.jit(f) if jit else f)(key)
  hcb.barrier_wait()
  assert out_key.dtype == key.dtype
  np.testing.assert_array_equal(jax.random.key_data(out_key),
                                jax.random.key_data(key))
  np.testing.assert_array_equal(sample, jax.random.uniform(key, (3,)))
  # The host sees the key's data.
  assert_tree_equal(rec.args, [np.asarray(jax.random.key_data(key))])


def test_prng_key_array_under_vmap_and_in_pytree():
  rec = Recorder()
  keys = jax.random.split(jax.random.key(0), 3)
  out = jax.jit(jax.vmap(lambda k, x: hcb.id_tap(rec, (k, x))))(
      keys, jnp.arange(3.))
  hcb.barrier_wait()
  np.testing.assert_array_equal(jax.random.key_data(out[0]),
                                jax.random.key_data(keys))
  assert_tree_equal(rec.args, [(np.asarray(jax.random.key_data(keys)),
                                np.arange(3., dtype=np.float32))])


def test_prng_key_under_grad():
  rec = Recorder()

  def f(x, k):
    k = hcb.id_tap(rec, k)
    return jnp.sum(x * jax.random.normal(k, (2,)))

  key = jax.random.key(3)
  g = jax.grad(f)(jnp.ones(2), key)
  hcb.barrier_wait()
  np.testing.assert_array_equal(g, jax.random.normal(key, (2,)))
  assert_tree_equal(rec.args, [np.asarray(jax.random.key_data(key))])


# --- empty values ------------------------------------------------------------


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_empty_tuple_and_none(jit):
  rec = Recorder()
  tap = lambda a: hcb.id_tap(rec, a)  # noqa: E731
  wrap = (lambda f: jax.jit(f)()) if jit else (lambda f: f())
  assert wrap(lambda: tap(())) == ()
  assert wrap(lambda: tap(None)) is None
  assert wrap(lambda: tap({})) == {}
  hcb.barrier_wait()
  assert rec.args == [(), None, {}]
  assert rec.transforms == [(), (), ()]


def test_empty_arrays():
  rec = Recorder()
  out = jax.jit(lambda x: hcb.id_tap(rec, (x, jnp.zeros((0, 3)),
                                          jnp.zeros((2, 0), jnp.int32))))(1.)
  hcb.barrier_wait()
  assert out[1].shape == (0, 3) and out[2].shape == (2, 0)
  assert_tree_equal(rec.args, [(np.float32(1.), np.zeros((0, 3), np.float32),
                                np.zeros((2, 0), np.int32))])


def test_empty_array_under_vmap():
  rec = Recorder()
  jax.vmap(lambda x: hcb.id_tap(rec, x))(jnp.zeros((3, 0)))
  hcb.barrier_wait()
  assert_tree_equal(rec.args, [np.zeros((3, 0), np.float32)])


# --- result= and unused results ----------------------------------------------


def test_result_returned_and_not_sent():
  rec = Recorder()
  out = jax.jit(lambda x: hcb.id_tap(rec, x, result=(x * 3, {"k": x + 1})))(
      2.)
  hcb.barrier_wait()
  assert float(out[0]) == 6. and float(out[1]["k"]) == 3.
  assert_tree_equal(rec.args, [np.float32(2.)])


def test_result_tap_happens_before_result_is_used():
  rec = Recorder()

  def body(i, acc):
    acc = hcb.id_tap(lambda a, t: rec(("tap", a), t), i, result=acc)
    return hcb.id_tap(lambda a, t: rec(("use", a), t), acc + i)

  assert int(jax.jit(lambda: lax.fori_loop(0, 3, body, 0))()) == 3
  hcb.barrier_wait()
  assert [(tag, int(v)) for tag, v in rec.args] == [
      ("tap", 0), ("use", 0), ("tap", 1), ("use", 1), ("tap", 2), ("use", 3)]


def test_result_with_none_arg_eager():
  rec = Recorder()
  out = hcb.id_tap(rec, None, result=jnp.arange(2))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [0, 1])
  assert rec.args == [None]


def test_result_leaves_that_are_not_jax_values_come_back_as_given(both_modes):
  """As the original: Python scalars and NumPy arrays in `result` are returned
  unchanged (type and dtype), under jit too; JAX values still follow the tap."""
  del both_modes
  rec = Recorder()
  r = hcb.id_tap(rec, 1.0, result=np.arange(3.0))
  assert type(r) is np.ndarray and r.dtype == np.float64

  f = lambda x: x + 1.0 if hcb.id_tap(rec, x, result=True) else x
  assert float(jax.jit(f)(1.0)) == 2.0

  def g(x):
    out = hcb.id_tap(rec, x, result=(x * 2, 3, np.int8(4), None))
    assert type(out[1]) is int and type(out[2]) is np.int8
    assert isinstance(out[0], jax.core.Tracer)
    return out[0]

  assert float(jax.jit(g)(1.0)) == 2.0
  hcb.barrier_wait()
  assert [float(a) for a in rec.args] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_unused_result_still_taps(jit):
  rec = Recorder()

  stream = io.StringIO()

  def f(x):
    hcb.id_tap(rec, x + 1)
    hcb.id_print(x + 2, output_stream=stream)
    return x * 2

  out = (jax.jit(f) if jit else f)(1.)
  hcb.barrier_wait()
  assert float(out) == 2.
  assert_tree_equal(rec.args, [np.float32(2.)])
  assert stream.getvalue() == "3.\n"


def test_unused_tap_in_loop_still_taps_every_iteration():
  rec = Recorder()

  def body(i, acc):
    hcb.id_tap(rec, i)
    return acc + 1

  assert int(jax.jit(lambda n: lax.fori_loop(0, n, body, 0))(3)) == 3
  hcb.barrier_wait()
  assert [int(v) for v in rec.args] == [0, 1, 2]


def test_tap_once_per_execution():
  rec = Recorder()
  f = jax.jit(lambda x: hcb.id_tap(rec, x))
  for i in range(3):
    f(jnp.float32(i))
  hcb.barrier_wait()
  assert [float(v) for v in rec.args] == [0., 1., 2.]



def test_id_print_with_result_prints_arg_and_returns_result():
  stream = io.StringIO()
  out = jax.jit(lambda x: hcb.id_print(x, result=x * 10, what="r",
                                       output_stream=stream))(2.)
  hcb.barrier_wait()
  assert float(out) == 20.
  assert stream.getvalue() == "what: r\n2.\n"


def test_call_basic_round_trip():
  seen = []

  def host(arg):
    seen.append(arg)
    return arg * 2 + 1

  out = jax.jit(lambda x: hcb.call(host, x, result_shape=x))(jnp.arange(3))
  np.testing.assert_array_equal(out, [1, 3, 5])
  hcb.barrier_wait()
  assert_tree_equal(seen, [np.arange(3, dtype=np.int32)])
