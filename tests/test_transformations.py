"""id_tap under vmap, jvp, grad, vjp, linearize and their compositions."""

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import host_callback as hcb
from helpers import Recorder, assert_tree_equal, batch, captured_stdout

# Every test here runs in the outfeed and in the synchronous mode.
pytestmark = pytest.mark.usefixtures("both_modes")

# --- vmap ------------------------------------------------------------------


def test_vmap_taps_whole_batch_once():
  rec = Recorder()
  out = jax.vmap(lambda x: hcb.id_tap(rec, x * 2))(jnp.arange(3.))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [0., 2., 4.])
  assert len(rec.calls) == 1
  assert_tree_equal(rec.args[0], np.array([0., 2., 4.], np.float32))
  assert rec.transforms == [(batch(0),)]


def test_vmap_in_axes_1_taps_value_as_batched():
  rec = Recorder()
  x = jnp.arange(6.).reshape(2, 3)
  out = jax.jit(jax.vmap(lambda v: hcb.id_tap(rec, v), in_axes=1))(x)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, x.T)
  assert_tree_equal(rec.args, [np.arange(6., dtype=np.float32).reshape(2, 3)])
  assert rec.transforms == [(batch(1),)]


def test_nested_vmap_adds_one_entry_each_outermost_last():
  rec = Recorder()
  x = jnp.arange(6.).reshape(2, 3)
  jax.vmap(jax.vmap(lambda v: hcb.id_tap(rec, v)), in_axes=1)(x)
  hcb.barrier_wait()
  assert_tree_equal(rec.args, [np.arange(6., dtype=np.float32).reshape(2, 3)])
  assert rec.transforms == [(batch(0), batch(1))]


def test_vmap_unbatched_leaves_have_none_dims():
  rec = Recorder()
  x = jnp.arange(6.).reshape(2, 3)
  y = jnp.arange(3)

  def f(v, w, c):
    return hcb.id_tap(rec, (v, w, c))

  jax.vmap(jax.vmap(f, in_axes=(0, None, None)), in_axes=(1, 0, None))(
      x, y, 7.)
  hcb.barrier_wait()
  assert_tree_equal(rec.args, [(np.arange(6., dtype=np.float32).reshape(2, 3),
                                np.arange(3, dtype=np.int32),
                                np.float32(7.))])
  # Inner vmap: only v is batched; outer: v on axis 1, w on axis 0.
  assert rec.transforms == [(batch(0, None, None), batch(1, 0, None))]


def test_vmap_result_is_identity_per_leaf():
  rec = Recorder()
  out = jax.jit(jax.vmap(lambda v, c: hcb.id_tap(rec, {"v": v, "c": c}),
                         in_axes=(0, None)))(jnp.arange(3), 5.)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out["v"], [0, 1, 2])
  np.testing.assert_array_equal(out["c"], [5., 5., 5.])
  assert rec.transforms == [(batch(None, 0),)]  # dict leaves sorted: c, v


def test_vmap_of_scan_taps_per_step_with_batch():
  rec = Recorder()

  def f(x):
    return lax.scan(lambda c, _: (hcb.id_tap(rec, c) + 1, None), x, None,
                    length=2)[0]

  out = jax.jit(jax.vmap(f))(jnp.array([10, 20]))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [12, 22])
  assert_tree_equal(rec.args, [np.array([10, 20], np.int32),
                               np.array([11, 21], np.int32)])
  assert rec.transforms == [(batch(0),)] * 2


def test_vmap_of_while_batched_predicate_taps_in_body():
  rec = Recorder()

  def f(x):
    return lax.while_loop(lambda v: v < 2, lambda v: hcb.id_tap(rec, v + 1), x)

  out = jax.jit(jax.vmap(f))(jnp.arange(4))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [2, 2, 2, 3])
  # The body runs for the whole batch while any element continues.
  assert_tree_equal(rec.args, [np.array([1, 2, 3, 4], np.int32),
                               np.array([2, 3, 3, 4], np.int32)])


def test_vmap_of_while_batched_predicate_taps_in_predicate():
  rec = Recorder()

  def f(x):
    return lax.while_loop(lambda v: hcb.id_tap(rec, v < 2),
                          lambda v: v + 1, x)

  out = jax.jit(jax.vmap(f))(jnp.arange(4))
  hcb.barrier_wait()
  assert_tree_equal(rec.args, [np.array([True, True, False, False]),
                               np.array([True, False, False, False]),
                               np.array([False, False, False, False])])
  np.testing.assert_array_equal(out, [2, 2, 2, 3])


def test_nested_vmap_of_while_tapping_predicate_matches_untapped_loop():
  rec = Recorder()

  def make(tap):
    def f(x, limit):
      return lax.while_loop(lambda s: tap(s[0] < limit),
                            lambda s: (s[0] + 1, s[1] * 2.),
                            (x, jnp.float32(1.)))
    return jax.jit(jax.vmap(jax.vmap(f, in_axes=(0, None)), in_axes=(None, 0)))

  args = (jnp.arange(3), jnp.array([1, 3]))
  out = make(lambda p: hcb.id_tap(rec, p))(*args)
  hcb.barrier_wait()
  expected = make(lambda p: p)(*args)
  np.testing.assert_array_equal(expected[0], [[1, 1, 2], [3, 3, 3]])
  np.testing.assert_array_equal(out[0], expected[0])
  np.testing.assert_array_equal(out[1], expected[1])
  assert len(rec.calls) == 4  # the predicate, once per iteration and once more
  assert rec.transforms[0] == (batch(0), batch(0))


def test_vmap_of_cond_with_batched_predicate_taps_both_branches():
  rec = Recorder()
  out = jax.jit(jax.vmap(lambda x: lax.cond(
      x > 1, lambda v: hcb.id_tap(rec, v * 10),
      lambda v: hcb.id_tap(rec, -v), x)))(jnp.arange(3))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [0, -1, 20])
  # Both branches run on the whole batch, and a select picks the results.
  assert sorted(map(tuple, rec.args)) == [(0, -1, -2), (0, 10, 20)]
  assert rec.transforms == [(batch(0),)] * 2


def test_vmap_with_device():
  rec = Recorder()
  jax.jit(jax.vmap(lambda v: hcb.id_tap(rec, v, tap_with_device=True)))(
      jnp.arange(2.))
  hcb.barrier_wait()
  assert rec.devices == [jax.devices()[0]]
  assert rec.transforms == [(batch(0),)]


# --- differentiation --------------------------------------------------------


def test_jvp_taps_primal_only_once():
  rec = Recorder()
  out, out_dot = jax.jvp(lambda x: hcb.id_tap(rec, x * 2) ** 2, (3.,), (0.5,))
  hcb.barrier_wait()
  assert (float(out), float(out_dot)) == (36., 12.)
  assert_tree_equal(rec.args, [np.float32(6.)])
  assert rec.transforms == [()]


def test_grad_taps_primal_once_and_gradient_is_identity():
  rec = Recorder()
  g = jax.grad(lambda x: hcb.id_tap(rec, (x * 2, x))[0] ** 2)(3.)
  hcb.barrier_wait()
  assert float(g) == 24.
  assert_tree_equal(rec.args, [(np.float32(6.), np.float32(3.))])
  assert rec.transforms == [()]


def test_grad_under_jit_taps_once():
  rec = Recorder()
  g = jax.jit(jax.grad(lambda x: jnp.sum(hcb.id_tap(rec, x) ** 3)))(
      jnp.arange(3.))
  hcb.barrier_wait()
  np.testing.assert_array_equal(g, [0., 3., 12.])
  assert_tree_equal(rec.args, [np.arange(3., dtype=np.float32)])


def test_grad_of_grad_taps_primal_once():
  rec = Recorder()
  f = lambda x: hcb.id_tap(rec, x ** 3)  # noqa: E731
  gg = jax.grad(jax.grad(f))(2.)
  hcb.barrier_wait()
  assert float(gg) == 12.
  assert_tree_equal(rec.args, [np.float32(8.)])
  assert rec.transforms == [()]


def test_jvp_of_jvp_taps_primal_once():
  rec = Recorder()
  f = lambda x: hcb.id_tap(rec, x * 2) ** 2  # noqa: E731
  df = lambda x: jax.jvp(f, (x,), (1.,))[1]  # noqa: E731
  _, ddf = jax.jvp(df, (3.,), (1.,))
  hcb.barrier_wait()
  assert float(ddf) == 8.
  assert_tree_equal(rec.args, [np.float32(6.)])


def test_vjp_taps_once_however_often_pulled_back():
  rec = Recorder()
  y, pullback = jax.vjp(lambda x: hcb.id_tap(rec, x * 2) ** 2, 3.)
  assert [float(pullback(c)[0]) for c in (1., 2.)] == [24., 48.]
  hcb.barrier_wait()
  assert float(y) == 36.
  assert_tree_equal(rec.args, [np.float32(6.)])


def test_linearize_taps_once_however_often_applied():
  rec = Recorder()
  y, f_lin = jax.linearize(lambda x: hcb.id_tap(rec, x * 2) ** 2, 3.)
  assert [float(f_lin(t)) for t in (1., 2.)] == [24., 48.]
  hcb.barrier_wait()
  assert float(y) == 36.
  assert_tree_equal(rec.args, [np.float32(6.)])


def test_grad_with_result_taps_arg_and_differentiates_result():
  rec = Recorder()
  g = jax.grad(lambda x: hcb.id_tap(rec, x + 1, result=x * x))(3.)
  hcb.barrier_wait()
  assert float(g) == 6.
  assert_tree_equal(rec.args, [np.float32(4.)])


def test_vmap_of_grad_and_grad_of_vmap():
  rec = Recorder()
  f = lambda x: hcb.id_tap(rec, x * 2) ** 2  # noqa: E731
  xs = jnp.arange(3.)
  np.testing.assert_array_equal(jax.vmap(jax.grad(f))(xs), [0., 8., 16.])
  hcb.barrier_wait()
  np.testing.assert_array_equal(
      jax.grad(lambda v: jnp.sum(jax.vmap(f)(v)))(xs), [0., 8., 16.])
  hcb.barrier_wait()
  assert_tree_equal(rec.args, [np.array([0., 2., 4.], np.float32)] * 2)
  assert rec.transforms == [(batch(0),)] * 2


# --- float0: integer inputs under differentiation ----------------------------


def test_grad_with_integer_leaf_in_tap():
  rec = Recorder()

  def f(x, n):
    y, m = hcb.id_tap(rec, (x * 2, n))
    return y * m

  g = jax.jit(jax.grad(f))(3., 4)
  hcb.barrier_wait()
  assert float(g) == 8.
  assert_tree_equal(rec.args, [(np.float32(6.), np.int32(4))])


def test_grad_allow_int_of_integer_tap():
  rec = Recorder()
  g = jax.grad(lambda n: hcb.id_tap(rec, n * 3).astype(jnp.float32),
               allow_int=True)(jnp.int32(4))
  hcb.barrier_wait()
  assert g.dtype == jax.dtypes.float0
  assert_tree_equal(rec.args, [np.int32(12)])


def test_jvp_with_float0_tangent():
  rec = Recorder()
  zero = np.zeros((), jax.dtypes.float0)
  (y, m), (y_dot, m_dot) = jax.jvp(
      lambda x, n: hcb.id_tap(rec, (x, n)), (3., 4), (1., zero))
  hcb.barrier_wait()
  assert (float(y), int(m), float(y_dot)) == (3., 4, 1.)
  assert m_dot.dtype == jax.dtypes.float0
  assert_tree_equal(rec.args, [(np.float32(3.), np.int32(4))])


def test_grad_with_integer_input_prints_primal_pair():
  stream = io.StringIO()

  def func(x, yint):
    x, yint = hcb.id_print((x, yint), what="pair", output_stream=stream)
    return x * yint

  g = jax.grad(func)(jnp.float32(5), jnp.uint32(2))
  hcb.barrier_wait()
  assert float(g) == 2.
  assert stream.getvalue() == "what: pair\n( 5. 2 )\n"


def _ones_cotangent(value):
  value = np.asarray(value)
  if value.dtype == jax.dtypes.float0:
    return value
  if not jnp.issubdtype(value.dtype, jnp.inexact):
    return np.zeros(value.shape, jax.dtypes.float0)
  return np.ones(value.shape, value.dtype)


def test_higher_order_vjp_with_float0_cotangents_and_result():
  """Tapping (float, int) with result= under vjp of vjp of vjp."""
  stream = io.StringIO()
  x = (np.array([.7, .8], np.float32), np.array([11, 12, 13], np.int32))

  def f(x):
    x = hcb.id_print(x, result=x, output_stream=stream)
    return jnp.sin(x[0]), x[1]

  def wrap_vjp(fun, args, out):
    cts = jax.tree_util.tree_map(_ones_cotangent, out)

    def fun_vjp(args, cts):
      return jax.vjp(fun, *args)[1](cts)

    return fun_vjp, (args, cts)

  out = f(x)
  f1, args1 = wrap_vjp(f, (x,), out)
  out1 = f1(*args1)
  np.testing.assert_allclose(out1[0][0], np.cos(x[0]), rtol=1e-6)
  assert out1[0][1].dtype == jax.dtypes.float0
  f2, args2 = wrap_vjp(f1, args1, out1)
  out2 = f2(*args2)
  f3, args3 = wrap_vjp(f2, args2, out2)
  f3(*args3)
  hcb.barrier_wait()
  # One print per evaluation of f's primal: f, and once in each order.
  assert stream.getvalue() == "( [0.7 0.8] [11 12 13] )\n" * 4


def test_tap_of_float0_leaves():
  """A float0 value (e.g. a tangent of an integer in a custom_jvp rule)
  reaches the host as bool zeros, as XLA (and the original) carry it."""
  rec = Recorder()
  zeros = np.zeros((100,), jax.dtypes.float0)
  jax.jit(lambda x: hcb.id_tap(rec, (zeros, x)))(jnp.arange(4.))
  hcb.barrier_wait()
  assert_tree_equal(rec.args, [(np.zeros((100,), bool),
                                np.arange(4., dtype=np.float32))])


def test_custom_jvp_tapping_float0_tangent_of_integer():
  rec = Recorder()

  @jax.custom_jvp
  def tap_tangents(arg):
    return arg

  @tap_tangents.defjvp
  def tap_tangents_jvp(primals, tangents):
    return primals[0], hcb.id_tap(rec, tangents[0])

  zero = np.zeros((), jax.dtypes.float0)
  (y, n), (y_dot, n_dot) = jax.jit(lambda: jax.jvp(
      lambda x, n: tap_tangents((x, n)), (3., 4), (0.5, zero)))()
  hcb.barrier_wait()
  assert (float(y), int(n), float(y_dot)) == (3., 4, .5)
  assert n_dot.dtype == jax.dtypes.float0
  assert_tree_equal(rec.args, [(np.float32(.5), np.zeros((), bool))])


def _x_times_x_with_tapped_tangent(tap_tangent):
  """f(x) = x * x whose custom_jvp rule taps its tangent (linear in x_dot)."""
  @jax.custom_jvp
  def f(x):
    return x * hcb.id_print(x, what="x")

  @f.defjvp
  def f_jvp(primals, tangents):
    (x,), (x_dot,) = primals, tangents
    return f(x), 3. * x * tap_tangent(x_dot)

  return f


@pytest.mark.parametrize("jit", [False, True])
def test_grad_transposes_a_tap_of_tangents(jit):
  """The spec's example: under grad, the tap of x_dot in the custom_jvp rule
  prints the cotangent, with ('transpose', {}) in transforms, printed as
  ['transpose'], once per step."""
  f = _x_times_x_with_tapped_tangent(
      lambda t: hcb.id_print(t, what="x_dot"))

  def loss(xs):
    return lax.scan(lambda c, x: (c + f(x), None), 0., xs)[0]

  grad = jax.jit(jax.grad(loss)) if jit else jax.grad(loss)
  with captured_stdout() as out:
    g = grad(jnp.array([0.7, 0.7]))
  np.testing.assert_allclose(g, [2.1, 2.1], rtol=1e-6)
  assert out.getvalue() == ("what: x\n0.7\n" * 2 +
                            "transforms: ['transpose'] what: x_dot\n2.1\n" * 2)


def test_transposed_tap_receives_cotangents_and_passes_them_through():
  rec = Recorder()
  f = _x_times_x_with_tapped_tangent(lambda t: hcb.id_tap(rec, t))
  _, pullback = jax.vjp(f, 2.)
  (x_bar,) = pullback(5.)
  hcb.barrier_wait()
  assert float(x_bar) == 3. * 2. * 5.
  assert rec.args == [np.float32(5. * 3. * 2.)]
  # As the original: every entry unpacks as (name, params).
  assert rec.transforms == [(("transpose", {}),)]
