"""Property-based tests: random pytrees round-trip; bad input gives clear errors.

The round trips run in the outfeed and in the synchronous mode.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import host_callback as hcb

from helpers import barrier_report, run_python

DTYPES = ["bool", "int8", "int32", "uint8", "uint32", "float16", "bfloat16",
          "float32", "complex64"]
SETTINGS = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def arrays(draw):
  dtype = jnp.dtype(draw(st.sampled_from(DTYPES)))
  shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
  values = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
  return jnp.asarray((values % 7 + draw(st.integers(0, 5))).astype(dtype))


pytrees = st.recursive(
    arrays() | st.none(),
    lambda children: (st.lists(children, max_size=3).map(tuple)
                      | st.lists(children, max_size=3)
                      | st.dictionaries(st.sampled_from("abcd"), children,
                                        max_size=3)),
    max_leaves=6)


def _assert_same_tree(actual, expected):
  assert (jax.tree_util.tree_structure(actual)
          == jax.tree_util.tree_structure(expected))
  for a, e in zip(jax.tree_util.tree_leaves(actual),
                  jax.tree_util.tree_leaves(expected)):
    assert np.asarray(a).dtype == np.asarray(e).dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


@pytest.mark.usefixtures("both_modes")
@SETTINGS
@given(tree=pytrees)
def test_random_pytrees_round_trip_through_id_tap(tree):
  received = []
  out = jax.jit(lambda t: hcb.id_tap(lambda a, _: received.append(a), t))(tree)
  hcb.barrier_wait()
  _assert_same_tree(out, tree)
  _assert_same_tree(received[0], tree)


@pytest.mark.usefixtures("both_modes")
@SETTINGS
@given(tree=pytrees)
def test_random_pytrees_round_trip_through_call(tree):
  out = jax.jit(lambda t: hcb.call(lambda a: a, t, result_shape=t))(tree)
  _assert_same_tree(out, tree)


@SETTINGS
@given(bad=st.sampled_from(["text", b"bytes", object(), {1, 2}]))
def test_non_numeric_leaves_are_rejected_at_trace_time(bad):
  for api in (lambda a: hcb.id_tap(lambda *_: None, a),
              lambda a: hcb.call(lambda x: x, a)):
    with pytest.raises(TypeError, match=r"leaf 1 of arg is"):
      api((1.0, bad))


@SETTINGS
@given(func=st.sampled_from([None, 3, "f", [print]]))
def test_non_callable_functions_are_rejected(func):
  with pytest.raises(TypeError, match="tap_func must be callable"):
    hcb.id_tap(func, 1.0)
  with pytest.raises(TypeError, match="callback_func must be callable"):
    hcb.call(func, 1.0)


@SETTINGS
@given(index=st.sampled_from([-1, 4, 1000, np.int64(4)]))
def test_device_index_out_of_range_is_rejected(index):
  with pytest.raises(ValueError, match="device_index=.* is out of range"):
    hcb.id_tap(lambda *_: None, 1.0, device_index=index)


@SETTINGS
@given(index=st.sampled_from([2.5, 1.0, "0", None]))
def test_device_index_that_is_not_an_int_is_a_type_error(index):
  with pytest.raises(TypeError, match="device_index must be an int, got"):
    hcb.id_tap(lambda *_: None, 1.0, device_index=index)
  with pytest.raises(TypeError, match="device_index must be an int, got"):
    hcb.call(lambda a: a, 1.0, result_shape=1.0, device_index=index)


@SETTINGS
@given(shape=st.sampled_from([(2,), (3, 1), ()]),
       dtype=st.sampled_from(["int32", "float16", "bool"]))
def test_wrong_result_is_a_clear_runtime_error(shape, dtype):
  expected = jax.ShapeDtypeStruct((3,), jnp.float32)

  def host(_):
    return np.zeros(shape, dtype)

  with pytest.raises(Exception, match="where result_shape expects float32"):
    jax.block_until_ready(jax.jit(
        lambda x: hcb.call(host, x, result_shape=expected))(1.0))
  barrier_report()  # the outfeed mode raises it again


@pytest.mark.parametrize("value", ["-5", "1000", "1e30", "lots", "inf", "nan",
                                   "1.5"])
def test_bad_queue_size_settings_give_clear_errors_at_first_use(value, transport):
  """Never at import: the ValueError names the variable when a tap first
  needs the bound."""
  done = run_python(
      "import jax, host_callback as hcb\n"
      "print('imported')\n"
      "try:\n"
      "  jax.jit(lambda x: hcb.id_tap(lambda *a: None, x))(1.)\n"
      "  hcb.barrier_wait()\n"
      "except ValueError as error:\n"
      "  print('ValueError:', error)\n",
      env={"JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE": value},
      transport=transport, timeout=60)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.startswith(
      "imported\nValueError: JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE"), done.stdout
