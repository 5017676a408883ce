"""Taps keep the device's execution order in every control-flow construct."""

import jax
import pytest
import jax.numpy as jnp
import numpy as np
from jax import lax

import host_callback as hcb
from helpers import Recorder

# Every test here runs in the outfeed and in the synchronous mode.
pytestmark = pytest.mark.usefixtures("both_modes")


def tagged(recorder, tag, arg, **kwargs):
  """Taps `(arg)` so that the recorder sees `(tag, value)`."""
  return hcb.id_tap(lambda a, t: recorder((tag, a), t), arg, **kwargs)


def events(recorder):
  """The recorded `(tag, python value)` pairs (scalars only)."""
  return [(tag, np.asarray(value).item()) for tag, value in recorder.args]


def test_while_predicate_and_body_order():
  rec = Recorder()

  def func(x):
    x = tagged(rec, "before", x)
    x = lax.while_loop(lambda v: tagged(rec, "pred", v < 3),
                       lambda v: tagged(rec, "body", v + 1), x)
    return tagged(rec, "after", x)

  assert int(jax.jit(func)(1)) == 3
  hcb.barrier_wait()
  assert events(rec) == [("before", 1), ("pred", True), ("body", 2),
                         ("pred", True), ("body", 3), ("pred", False),
                         ("after", 3)]


def test_while_zero_iterations_taps_predicate_once():
  rec = Recorder()
  out = jax.jit(lambda x: lax.while_loop(
      lambda v: tagged(rec, "pred", v < 0),
      lambda v: tagged(rec, "body", v + 1), x))(5)
  hcb.barrier_wait()
  assert int(out) == 5
  assert events(rec) == [("pred", False)]


def test_cond_taps_only_the_taken_branch():
  rec = Recorder()

  def func(x):
    return lax.cond(x > 0,
                    lambda v: tagged(rec, "true", v * 10),
                    lambda v: tagged(rec, "false", v - 10), x)

  f = jax.jit(func)
  assert int(f(1)) == 10
  assert int(f(-1)) == -11
  assert int(f(2)) == 20
  hcb.barrier_wait()
  assert events(rec) == [("true", 10), ("false", -11), ("true", 20)]


def test_switch_taps_the_selected_branch():
  rec = Recorder()
  branches = [lambda v, i=i: tagged(rec, f"b{i}", v + i) for i in range(3)]
  f = jax.jit(lambda i, x: lax.switch(i, branches, x))
  assert [int(f(i, 10)) for i in (2, 0, 1)] == [12, 10, 11]
  hcb.barrier_wait()
  assert events(rec) == [("b2", 12), ("b0", 10), ("b1", 11)]


def test_scan_with_cond_both_branches():
  rec = Recorder()

  def body(carry, x):
    x1 = tagged(rec, "s_1", x)
    x2 = lax.cond(x1 % 2 == 0,
                  lambda v: tagged(rec, "s_t", v),
                  lambda v: tagged(rec, "s_f", -1, result=v), x1)
    return carry + x2, tagged(rec, "s_2", x2 + 1)

  carry, ys = jax.jit(lambda xs: lax.scan(body, 0, xs))(jnp.array([1, 2, 3]))
  hcb.barrier_wait()
  assert int(carry) == 6
  np.testing.assert_array_equal(ys, [2, 3, 4])
  assert events(rec) == [("s_1", 1), ("s_f", -1), ("s_2", 2),
                         ("s_1", 2), ("s_t", 2), ("s_2", 3),
                         ("s_1", 3), ("s_f", -1), ("s_2", 4)]


def test_scan_reverse_order():
  rec = Recorder()
  jax.jit(lambda xs: lax.scan(lambda c, x: (c, tagged(rec, "x", x)), 0, xs,
                              reverse=True))(jnp.arange(4))
  hcb.barrier_wait()
  assert events(rec) == [("x", 3), ("x", 2), ("x", 1), ("x", 0)]


def test_fori_loop_order():
  rec = Recorder()

  def body(i, acc):
    i = tagged(rec, "i", i)
    return tagged(rec, "acc", acc + i)

  assert int(jax.jit(lambda n: lax.fori_loop(0, n, body, 0))(4)) == 6
  # A static trip count (lowered as a scan) keeps the same order.
  assert int(jax.jit(lambda: lax.fori_loop(0, 2, body, 100))()) == 101
  hcb.barrier_wait()
  assert events(rec) == [("i", 0), ("acc", 0), ("i", 1), ("acc", 1),
                         ("i", 2), ("acc", 3), ("i", 3), ("acc", 6),
                         ("i", 0), ("acc", 100), ("i", 1), ("acc", 101)]


def test_nested_loops_order():
  rec = Recorder()

  def outer(i, acc):
    def inner(j, acc):
      return tagged(rec, "in", acc + 10 * i + j)
    return tagged(rec, "out", lax.fori_loop(0, 2, inner, acc))

  jax.jit(lambda n: lax.fori_loop(0, n, outer, 0))(2)
  hcb.barrier_wait()
  assert events(rec) == [("in", 0), ("in", 1), ("out", 1),
                         ("in", 11), ("in", 22), ("out", 22)]


def test_nested_jit_order():
  rec = Recorder()

  @jax.jit
  def inner(x):
    return tagged(rec, "inner", x * 2)

  @jax.jit
  def outer(x):
    x = tagged(rec, "outer_1", x)
    y = inner(x) + inner(x + 1)
    return tagged(rec, "outer_2", y)

  assert float(outer(1.)) == 6.
  hcb.barrier_wait()
  assert events(rec) == [("outer_1", 1.), ("inner", 2.), ("inner", 4.),
                         ("outer_2", 6.)]


def _tap_tangents(rec):
  """The documented way to tap tangents: a custom_jvp identity."""

  @jax.custom_jvp
  def tap_tangents(arg):
    return arg

  @tap_tangents.defjvp
  def tap_tangents_jvp(primals, tangents):
    arg, = primals
    arg_dot, = tangents
    return arg, tagged(rec, "tangents", arg_dot)

  return tap_tangents


def test_custom_jvp_taps_tangents_under_jvp():
  rec = Recorder()
  tap_tangents = _tap_tangents(rec)

  def power3(x):
    y = tagged(rec, "x,x^2", (x, x * x))[1]
    x, y = tap_tangents((x, y))
    return y * x

  out, out_dot = jax.jit(lambda x, t: jax.jvp(power3, (x,), (t,)))(3., 0.1)
  hcb.barrier_wait()
  assert float(out) == 27.
  np.testing.assert_allclose(out_dot, 2.7, rtol=1e-6)
  assert [tag for tag, _ in rec.args] == ["x,x^2", "tangents"]
  np.testing.assert_array_equal(rec.args[0][1], (3., 9.))
  np.testing.assert_allclose(rec.args[1][1], (0.1, 0.6), rtol=1e-6)


def test_custom_jvp_rule_taps_in_order_under_grad():
  rec = Recorder()

  @jax.custom_jvp
  def f(x):
    return tagged(rec, "primal", jnp.sin(x))

  @f.defjvp
  def f_jvp(primals, tangents):
    x, = primals
    t, = tangents
    x = tagged(rec, "rule_x", x)
    y = tagged(rec, "rule_y", jnp.sin(x))
    return y, jnp.cos(x) * t

  x = 0.5
  g = jax.jit(jax.grad(lambda x: f(tagged(rec, "x", x)) * 2))(x)
  hcb.barrier_wait()
  np.testing.assert_allclose(g, 2 * np.cos(x), rtol=1e-6)
  assert [tag for tag, _ in rec.args] == ["x", "rule_x", "rule_y"]
  np.testing.assert_allclose([v for _, v in rec.args],
                             [x, x, np.sin(x)], rtol=1e-6)


def test_custom_vjp_taps_fwd_and_bwd_under_grad():
  rec = Recorder()

  @jax.custom_vjp
  def f(x):
    return tagged(rec, "primal", x * x)

  def fwd(x):
    return tagged(rec, "fwd", x * x), x

  def bwd(x, ct):
    return (tagged(rec, "bwd", 2 * x * ct),)

  f.defvjp(fwd, bwd)
  g = jax.jit(jax.grad(lambda x: f(x) * 3))(2.)
  hcb.barrier_wait()
  assert float(g) == 12.
  assert events(rec) == [("fwd", 4.), ("bwd", 12.)]


def test_checkpoint_under_grad_retaps_rematerialised_primal():
  rec = Recorder()
  inner = jax.checkpoint(lambda x: tagged(rec, "inner", jnp.sin(x)) * 2)

  def f(x):
    return tagged(rec, "outer", inner(x)) ** 2

  x = 0.5
  assert float(jax.jit(f)(x)) > 0  # no grad: each tap once
  hcb.barrier_wait()
  assert [tag for tag, _ in rec.args] == ["inner", "outer"]
  rec.calls.clear()
  g = jax.jit(jax.grad(f))(x)
  hcb.barrier_wait()
  np.testing.assert_allclose(g, 8 * np.sin(x) * np.cos(x), rtol=1e-6)
  # Forward pass: inner then outer; backward pass recomputes inner.
  assert [tag for tag, _ in rec.args] == ["inner", "outer", "inner"]
  for _, value in rec.args[::2]:
    np.testing.assert_allclose(value, np.sin(x), rtol=1e-6)


def test_successive_jitted_calls_keep_order():
  rec = Recorder()
  f = jax.jit(lambda x: tagged(rec, "f", x))
  g = jax.jit(lambda x: tagged(rec, "g", tagged(rec, "g0", x) + 1000))
  for i in range(20):
    f(i)
    g(i)
  hcb.barrier_wait()
  expected = []
  for i in range(20):
    expected += [("f", i), ("g0", i), ("g", i + 1000)]
  assert events(rec) == expected


def test_eager_taps_keep_order_with_jitted_ones():
  rec = Recorder()
  f = jax.jit(lambda x: tagged(rec, "jit", x))
  for i in range(5):
    tagged(rec, "eager", jnp.int32(i))
    f(i)
  hcb.barrier_wait()
  assert events(rec) == [e for i in range(5)
                         for e in (("eager", i), ("jit", i))]
