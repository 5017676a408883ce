"""Taps under jax.checkpoint policies, and in loops under grad.

Issue 24 items 3 and 5: a tap runs again in the backward pass exactly when
the checkpoint policy recomputes it, and a tap in a `scan` or `fori_loop`
under `grad` runs once per iteration of the forward pass, whatever uses its
output, as under `jit`.
"""

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import host_callback as hcb

_POLICIES = {
    "default": (None, 2),
    "nothing_saveable": (jax.checkpoint_policies.nothing_saveable, 2),
    "dots_saveable": (jax.checkpoint_policies.dots_saveable, 2),
    "everything_saveable": (jax.checkpoint_policies.everything_saveable, 1),
}


@pytest.mark.parametrize("jitted", [False, True])
@pytest.mark.parametrize("policy", sorted(_POLICIES))
def test_checkpoint_retaps_exactly_what_its_policy_recomputes(both_modes,
                                                              policy, jitted):
  policy, runs = _POLICIES[policy]
  seen = []
  f = lambda x: hcb.id_tap(lambda a, t: seen.append(float(a)), x) * 2.0  # noqa: E731
  grad = jax.grad(jax.checkpoint(f, policy=policy))
  assert float((jax.jit(grad) if jitted else grad)(1.0)) == 2.0
  hcb.barrier_wait()
  assert seen == [1.0] * runs


@pytest.mark.parametrize("policy", sorted(_POLICIES))
def test_checkpointed_scan_body_follows_its_policy(both_modes, policy):
  policy, runs = _POLICIES[policy]
  seen = []
  body = jax.checkpoint(
      lambda c, x: (hcb.id_tap(lambda a, t: seen.append(float(a)), c) * x,
                    None), policy=policy)
  f = lambda c: lax.scan(body, c, jnp.array([1., 2., 3.]))[0]  # noqa: E731
  assert float(jax.grad(f)(2.0)) == 6.0
  hcb.barrier_wait()
  forward = [2.0, 2.0, 4.0]
  assert sorted(seen) == sorted(forward * runs)


def _unused(c):
  hcb.id_tap(_RECORD, c)


def _operand_less(c):
  del c
  hcb.id_tap(_RECORD, None)


def _in_cond(c):
  lax.cond(c > 100., lambda: _unused(c), lambda: _unused(c))


def _in_inner_jit(c):
  jax.jit(_unused)(c)


def _of_constant(c):
  del c
  hcb.id_tap(_RECORD, jnp.float32(7.))


def _in_inner_scan(c):
  # the inner carry passes through unchanged: loop-invariant
  lax.scan(lambda cc, _: (hcb.id_tap(_RECORD, cc, result=cc), None), c,
           None, length=2)


_TAPS = {"unused output": (_unused, 1), "no operands": (_operand_less, 1),
         "in cond": (_in_cond, 1), "in inner jit": (_in_inner_jit, 1),
         "of a constant": (_of_constant, 1),
         "in inner scan": (_in_inner_scan, 2)}
_log = []
_RECORD = lambda a, t: _log.append(1)  # noqa: E731


def _scan(tap):
  def body(c, x):
    tap(c)
    return c * x, None
  return lambda c: lax.scan(body, c, jnp.array([1., 2., 3.]))[0]


def _fori(tap):
  xs = jnp.array([1., 2., 3.])

  def body(i, c):
    tap(c)
    return c * xs[i]
  return lambda c: lax.fori_loop(0, 3, body, c)


_TRANSFORMS = {
    "grad": jax.grad,
    "jit(grad)": lambda f: jax.jit(jax.grad(f)),
    "grad(jit)": lambda f: jax.grad(jax.jit(f)),
    "vjp": lambda f: lambda c: jax.vjp(f, c)[1](1.0),
    "linearize": lambda f: lambda c: jax.linearize(f, c)[1](1.0),
}


@pytest.mark.parametrize("transform", sorted(_TRANSFORMS))
@pytest.mark.parametrize("tap", sorted(_TAPS))
@pytest.mark.parametrize("loop", ["scan", "fori_loop"])
def test_tap_in_a_loop_runs_each_iteration_under_grad(both_modes, loop, tap,
                                                      transform):
  tap, per_iteration = _TAPS[tap]
  f = (_scan if loop == "scan" else _fori)(tap)
  _log.clear()
  _TRANSFORMS[transform](f)(2.0)
  hcb.barrier_wait()
  assert len(_log) == 3 * per_iteration
