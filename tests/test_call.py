"""hcb.call: results sent back to the device, errors, transformations.

Every test here runs in the outfeed and in the synchronous mode.
"""

import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from helpers import OUTFEED, cpu_devices, run_python, synchronous

pytestmark = pytest.mark.usefixtures("both_modes")

ALL_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
              "uint32", "uint64", "float16", "bfloat16", "float32", "float64",
              "complex64", "complex128"]


def test_round_trip_value():
  f = jax.jit(lambda x: hcb.call(lambda a: a * 10 + 1, x, result_shape=x))
  np.testing.assert_array_equal(f(jnp.arange(4.)), [1., 11., 21., 31.])


def test_pytree_args_and_results():
  def host(arg):
    a, (b, c) = arg["a"], arg["bc"]
    return {"sum": a + b.sum(), "pair": (c * 2, np.int32(7))}

  shape = {"sum": jax.ShapeDtypeStruct((), jnp.float32),
           "pair": (jax.ShapeDtypeStruct((2,), jnp.int32), 1)}
  out = jax.jit(lambda x: hcb.call(
      host, {"a": x, "bc": (jnp.ones(3), jnp.array([1, 2], jnp.int32))},
      result_shape=shape))(jnp.float32(1.5))
  assert float(out["sum"]) == 4.5
  np.testing.assert_array_equal(out["pair"][0], [2, 4])
  assert out["pair"][1].dtype == jnp.int32 and int(out["pair"][1]) == 7


@pytest.mark.parametrize("result,shape", [
    (3, 0), (2.5, 0.), (np.float32(1.25), np.float32(0)),
    (np.int32(4), jax.ShapeDtypeStruct((), jnp.int32))])
def test_scalar_results(result, shape):
  out = jax.jit(lambda x: hcb.call(lambda _: result, x,
                                   result_shape=shape))(1.)
  assert out.item() == result


def test_empty_arrays_and_no_result():
  seen = []
  empty = jnp.zeros((0, 3), jnp.float32)
  out = jax.jit(lambda x: hcb.call(
      lambda a: (seen.append(a.shape), np.zeros((2, 0), np.int32))[1], x,
      result_shape=jax.ShapeDtypeStruct((2, 0), jnp.int32)))(empty)
  assert out.shape == (2, 0) and out.dtype == jnp.int32
  assert jax.jit(lambda x: hcb.call(seen.append, x))(1.) is None
  assert jax.jit(lambda x: hcb.call(lambda _: (), x, result_shape=()))(2.) == ()
  assert seen[0] == (0, 3) and float(seen[1]) == 1.


def test_all_dtypes_round_trip_x32():
  for name in ALL_DTYPES:
    dtype = jax.dtypes.canonicalize_dtype(jnp.dtype(name))
    x = jnp.ones((2,), dtype)
    taps = []
    out = jax.jit(lambda v: hcb.call(
        lambda a: a, hcb.id_tap(lambda a, _: taps.append(a), v),
        result_shape=v))(x)
    hcb.barrier_wait()
    assert out.dtype == dtype, name
    assert taps[0].dtype == dtype, name
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


def test_all_dtypes_round_trip_x64(transport, both_modes):
  code = textwrap.dedent(f"""
      import jax, jax.numpy as jnp, numpy as np
      jax.config.update("jax_enable_x64", True)
      import host_callback as hcb
      for name in {ALL_DTYPES!r}:
        x = (jnp.arange(3) + 1).astype(name)
        taps = []
        out = jax.jit(lambda v: hcb.call(
            lambda a: a, hcb.id_tap(lambda a, _: taps.append(a), v),
            result_shape=v))(x)
        hcb.barrier_wait()
        assert out.dtype == jnp.dtype(name), (name, out.dtype)
        assert taps[0].dtype == jnp.dtype(name), name
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
      print("ok", len({ALL_DTYPES!r}))
      """)
  done = run_python(code, env=OUTFEED if both_modes == "outfeed" else None,
                    transport=transport)
  assert done.stdout.strip() == f"ok {len(ALL_DTYPES)}", done.stderr


def test_float64_result_is_canonicalised_without_x64():
  out = jax.jit(lambda x: hcb.call(lambda a: np.sin(a.astype(np.float64)), x,
                                   result_shape=x))(jnp.arange(3.))
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, np.sin(np.arange(3.)), rtol=1e-6)


def _failing_call(host, result_shape):
  return jax.jit(lambda x: hcb.call(host, x, result_shape=result_shape))


def _assert_fails_then_recovers(f, x, *fragments):
  with pytest.raises(Exception) as info:
    jax.block_until_ready(f(x))
  for fragment in fragments:
    assert fragment in str(info.value)
  # The next computation runs normally.
  ok = jax.jit(lambda v: hcb.call(lambda a: a + 1, v, result_shape=v))(x)
  np.testing.assert_array_equal(ok, np.asarray(x) + 1)
  if not synchronous():  # the synchronous mode raises it once
    with pytest.raises(hcb.CallbackException) as barrier:
      hcb.barrier_wait()
    for fragment in fragments:
      assert fragment in str(barrier.value)
  hcb.barrier_wait()  # reported once


def test_host_function_raises():
  def my_func(x):
    raise ValueError("Some user message")

  _assert_fails_then_recovers(
      _failing_call(my_func, jax.ShapeDtypeStruct((3,), jnp.float32)),
      jnp.arange(3.),
      "host_callback.call: my_func raised ValueError: Some user message")


def test_barrier_exception_chains_the_original_error():
  def my_func(x):
    raise KeyError("k")

  jax.config.update("jax_host_callback_outfeed", True)  # raised at barriers
  with pytest.raises(Exception):
    jax.block_until_ready(_failing_call(my_func, 0.)(1.))
  with pytest.raises(hcb.CallbackException) as info:
    hcb.barrier_wait()
  assert isinstance(info.value.__cause__.__cause__, KeyError)
  assert "Traceback (most recent call last)" in str(info.value)


def test_wrong_dtype():
  _assert_fails_then_recovers(
      _failing_call(lambda a: a.astype(np.float32),
                    jax.ShapeDtypeStruct((3,), jnp.int32)),
      jnp.arange(3.), "returned float32[3] where result_shape expects int32[3]")


def test_wrong_shape():
  _assert_fails_then_recovers(
      _failing_call(lambda a: np.zeros((4,), np.float32),
                    jax.ShapeDtypeStruct((3,), jnp.float32)),
      jnp.arange(3.), "returned float32[4] where result_shape expects float32[3]")


def test_wrong_structure():
  _assert_fails_then_recovers(
      _failing_call(lambda a: (a, a), jax.ShapeDtypeStruct((3,), jnp.float32)),
      jnp.arange(3.), "returned a pytree of 2 array(s) (float32[3], "
      "float32[3]) structured as PyTreeDef((*, *)), but result_shape "
      "describes one array float32[3]. Describe the result with "
      "result_shape=jax.ShapeDtypeStruct(shape, dtype)")


def test_result_left_out_says_result_shape_defaults_to_no_result():
  # The jitted function returns x + 1 besides the call, which has no result:
  # off CPU a computation fails after its dispatch returned, and only its
  # outputs say so.
  _assert_fails_then_recovers(
      jax.jit(lambda x: (hcb.call(lambda a: a, x), x + 1)[1]), jnp.arange(3.),
      "returned one array float32[3], but result_shape describes None (no "
      "result)", "(result_shape=None, its default, means no result)")


def test_numpy_style_shape_as_result_shape_is_explained():
  with pytest.warns(UserWarning, match=r"result_shape=\(3,\) is a tuple of "
                    r"integers.*jax.ShapeDtypeStruct\(\(3,\), dtype\)"):
    f = _failing_call(lambda a: a, (3,))
    _assert_fails_then_recovers(
        f, jnp.arange(3.), "returned one array float32[3], but result_shape "
        "describes a pytree of 1 array(s) (int32[])",
        "a tuple of ints such as (3,) describes integer scalars, not a shape")


@pytest.mark.parametrize("bad", ["foo", object(), [None, "x"], np.str_("a"),
                                 np.array(["a", "b"])])
def test_bad_result_shape_at_trace_time(bad):
  with pytest.raises(ValueError, match="The values must be either numeric "
                     "scalars, or must have 'shape' and 'dtype' attributes"):
    jax.jit(lambda x: hcb.call(lambda a: a, x, result_shape=bad))(1.)


def test_bad_inputs_name_the_argument():
  with pytest.raises(TypeError, match="callback_func must be callable"):
    hcb.call(42, 1.)
  with pytest.raises(TypeError, match="leaf 1 of arg is str"):
    hcb.call(lambda a: a, (1., "text"))
  with pytest.raises(TypeError, match="leaf 0 of arg is ndarray"):
    hcb.call(lambda a: a, (np.array(["text"]),))
  with pytest.raises(ValueError, match="device_index=99 is out of range"):
    jax.jit(lambda x: hcb.call(lambda a: a, x, result_shape=x,
                               device_index=99))(1.)


def test_numpy_integer_device_index_is_accepted():
  out = jax.jit(lambda x: hcb.call(lambda a: a + 1, x, result_shape=x,
                                   device_index=np.int64(0)))(1.)
  assert float(out) == 2.


def test_jvp_is_not_implemented():
  with pytest.raises(NotImplementedError,
                     match="differentiation rules are implemented only for "
                     "id_tap.*jax.custom_vjp"):
    jax.grad(lambda x: hcb.call(lambda a: a, x, result_shape=x))(1.)


def test_custom_vjp_with_jax_on_another_device_on_the_host():
  other = cpu_devices(2)[1]

  def host_sin(x):
    return np.asarray(jnp.sin(jax.device_put(x, other)))

  def host_cos(x):
    return np.asarray(jnp.cos(jax.device_put(x, other)))

  @jax.custom_vjp
  def f(x):
    return hcb.call(host_sin, x, result_shape=x)

  f.defvjp(lambda x: (f(x), x),
           lambda x, ct: (ct * hcb.call(host_cos, x, result_shape=x),))
  x = jnp.arange(3.)
  np.testing.assert_allclose(jax.jit(f)(x), np.sin(np.arange(3.)), rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.grad(lambda v: f(v).sum()))(x),
                             np.cos(np.arange(3.)), rtol=1e-6)


def test_custom_jvp_around_call():
  @jax.custom_jvp
  def f(x):
    return hcb.call(np.exp, x, result_shape=x)

  f.defjvp(lambda primals, tangents: (f(primals[0]), f(primals[0]) * tangents[0]))
  np.testing.assert_allclose(jax.grad(f)(1.), np.e, rtol=1e-6)


def test_vmap_calls_once_per_element_in_order():
  seen = []
  out = jax.jit(jax.vmap(lambda x, y: hcb.call(
      lambda a: (seen.append((float(a[0]), float(a[1]))), a[0] * a[1])[1],
      (x, y), result_shape=x), in_axes=(0, None)))(jnp.arange(3.), 10.)
  np.testing.assert_array_equal(out, [0., 10., 20.])
  assert seen == [(0., 10.), (1., 10.), (2., 10.)]


def test_call_with_device():
  devices = []
  out = jax.jit(lambda x: hcb.call(
      lambda a, device: (devices.append(device), a)[1], x, result_shape=x,
      call_with_device=True))(jnp.ones(2))
  np.testing.assert_array_equal(out, [1., 1.])
  assert devices == [jax.devices()[0]]


def _log_host(log, name):
  def host(x):
    log.append((name, np.asarray(x).tolist()))
    return x
  return host


def test_control_flow_order_with_taps():
  log = []

  def tap(name):
    return lambda x, _: log.append((name, np.asarray(x).tolist()))

  def call(name, x):
    return hcb.call(_log_host(log, name), x, result_shape=x)

  def body(i, x):
    x = hcb.id_tap(tap("fori_tap"), x)
    return call("fori_call", x + 1)

  def while_cond(x):
    return call("while_pred", x) < 7

  def while_body(x):
    return call("while_body", hcb.id_tap(tap("while_tap"), x) + 2)

  @jax.jit
  def f(x):
    x = jax.lax.cond(x > 0, lambda v: call("cond_true", v),
                     lambda v: call("cond_false", v), x)
    x, _ = jax.lax.scan(lambda c, _: (call("scan", hcb.id_tap(tap("scan_tap"), c)) + 1, None),
                        x, None, length=2)
    x = jax.lax.fori_loop(0, 2, body, x)
    x = jax.lax.while_loop(while_cond, while_body, x)
    return jax.jit(lambda v: call("nested_jit", v))(x)

  out = f(1)
  hcb.barrier_wait()
  assert int(out) == 7
  assert log == [
      ("cond_true", 1), ("scan_tap", 1), ("scan", 1), ("scan_tap", 2),
      ("scan", 2), ("fori_tap", 3), ("fori_call", 4), ("fori_tap", 4),
      ("fori_call", 5), ("while_pred", 5), ("while_tap", 5),
      ("while_body", 7), ("while_pred", 7), ("nested_jit", 7)]


def test_calls_follow_taps_on_the_same_device():
  log = []
  slow = lambda x, _: (time.sleep(0.05), log.append("tap"))  # noqa: E731
  jax.jit(lambda x: hcb.call(lambda a: (log.append("call"), a)[1],
                             hcb.id_tap(slow, x), result_shape=x))(1.)
  hcb.barrier_wait()
  assert log == ["tap", "call"]


def test_same_jitted_function_compiles_once():
  traces = []

  @jax.jit
  def f(x):
    traces.append(1)
    return hcb.call(lambda a: a * 2, x, result_shape=x)

  for i in range(3):
    assert float(f(jnp.float32(i))) == 2. * i
  assert len(traces) == 1
  assert f._cache_size() == 1


def test_eager_call():
  np.testing.assert_array_equal(
      hcb.call(lambda a: a + 1, jnp.arange(2), result_shape=jnp.arange(2)),
      [1, 2])


def test_pmap_call_each_device_gets_its_own_slice():
  devices = cpu_devices(4)
  out = jax.pmap(lambda x: hcb.call(
      lambda a, device: a * 10 + device.id, x, result_shape=x,
      call_with_device=True), devices=devices)(jnp.arange(4))
  np.testing.assert_array_equal(out, [i * 10 + device.id
                                      for i, device in enumerate(devices)])


@pytest.mark.parametrize("shardy", [True, False])
def test_sharded_jit_call_gets_whole_array(shardy):
  jax.config.update("jax_use_shardy_partitioner", shardy)
  try:
    _check_sharded_jit_call()
  finally:
    jax.config.update("jax_use_shardy_partitioner", True)


def _check_sharded_jit_call():
  mesh = jax.sharding.Mesh(np.array(cpu_devices(2)), ("d",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
  seen = []
  f = jax.jit(lambda x: hcb.call(
      lambda a, device: (seen.append((a.shape, device)), a * 2)[1],
      x, result_shape=x, call_with_device=True, device_index=1),
      in_shardings=sharding)
  out = f(jnp.arange(8.).reshape(4, 2))
  np.testing.assert_array_equal(out, np.arange(8.).reshape(4, 2) * 2)
  assert seen == [((4, 2), cpu_devices(2)[1])]


def test_dtype_class_as_result_shape_is_rejected_naming_result_shape():
  with pytest.raises(ValueError, match=r"result_shape has a leaf float32, a "
                     r"type.*jax.ShapeDtypeStruct\(\(\), numpy.float32\)"):
    jax.jit(lambda x: hcb.call(lambda a: a, x, result_shape=np.float32))(1.)


def test_prng_key_in_result_shape_is_rejected_clearly():
  key = jax.random.key(0)
  with pytest.raises(ValueError, match="result_shape has a PRNG key leaf.*"
                     "jax.random.wrap_key_data"):
    jax.jit(lambda k: hcb.call(lambda a: a, k, result_shape=k))(key)


def test_big_endian_result_is_accepted_in_native_byte_order():
  big_endian = np.arange(6, dtype=">f4").reshape(2, 3)
  out = jax.jit(lambda x: hcb.call(lambda _: big_endian, x,
                                   result_shape=jax.ShapeDtypeStruct(
                                       (2, 3), np.float32)))(1.)
  np.testing.assert_array_equal(out, np.arange(6, dtype=np.float32).reshape(2, 3))


def test_integer_result_that_does_not_fit_fails_naming_function_value_dtype(
    both_modes):
  """Canonicalising a Python int (int64) to int32 would wrap 2**40 + 5 to 5:
  an error instead, as NumPy 2 gives for np.asarray(2**40 + 5, np.int32)."""
  del both_modes

  def too_big(x):
    return 2**40 + 5

  f = jax.jit(lambda x: hcb.call(too_big, x, result_shape=jnp.int32(0)))
  with pytest.raises(Exception) as info:
    jax.block_until_ready(f(1))
  for fragment in ("too_big", str(2**40 + 5), "int32"):
    assert fragment in str(info.value)
  # Values that fit still narrow silently, arrays too.
  fits = jax.jit(lambda x: hcb.call(
      lambda a: np.array([1, -2, 2**31 - 1], np.int64), x,
      result_shape=jax.ShapeDtypeStruct((3,), jnp.int32)))(1)
  np.testing.assert_array_equal(fits, [1, -2, 2**31 - 1])
  with pytest.raises(Exception, match="returned the integer -2147483649"):
    jax.block_until_ready(jax.jit(lambda x: hcb.call(
        lambda a: np.array([1, -2**31 - 1], np.int64), x,
        result_shape=jax.ShapeDtypeStruct((2,), jnp.int32)))(1))
  try:
    hcb.barrier_wait()
  except hcb.CallbackException:
    pass  # reported here too in the outfeed mode


class _BadShape:
  shape = ("a", "b", "c")
  dtype = np.dtype(np.float32)

  def __repr__(self):
    return "_BadShape()"


def test_result_shape_with_non_integer_shape_is_rejected_at_trace_time():
  with pytest.raises(ValueError, match=r"result_shape has a leaf _BadShape\(\) "
                     r"whose shape \('a', 'b', 'c'\) is not a sequence of "
                     "non-negative integers"):
    jax.jit(lambda x: hcb.call(lambda a: a, x,
                               result_shape=(x, _BadShape())))(1.)


def test_float0_result_shape_is_rejected_at_trace_time():
  with pytest.raises(ValueError, match="result_shape has a float0 leaf.*"
                     "holds no data"):
    jax.jit(lambda x: hcb.call(
        lambda a: a, x,
        result_shape=jax.ShapeDtypeStruct((3,), jax.dtypes.float0)))(1.)
