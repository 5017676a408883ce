"""The ordering token of taps and calls, owned by host_callback.

Inside a traced computation our primitive carries the ordered effect
`HostCallbackEffect`, so that JAX keeps it from being dead-code eliminated,
allows it in control flow, custom derivatives, remat and shard_map, and
threads a token for it through while, cond, scan and nested jit when lowering.

At the top of each compiled computation, though, any JAX effect would take
it off JAX's C++ dispatch fast path and add a runtime-token transfer per
execution. So, just before JAX lowers a top-level jaxpr that has our effect,
we wrap the whole jaxpr in one `host_callback_scope` equation whose effects
are the others only. The scope's lowering creates our token and lowers the
body inline with it: the executable has no effect of ours, and the order of
taps on each device is the token's order. On CPU the token starts and ends
with the marks that count the execution for barrier_wait (`executions`). Successive executions on one
device run in dispatch order, which keeps taps ordered across them.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Iterator, List, Sequence, Tuple

import jax
from jax.extend.core import Primitive, jaxprs_in_params

from .. import _jax_adapter as adapter
from . import executions
from .._jax_adapter import mlir

_EFFECT = adapter.host_callback_effect

host_callback_scope_p = Primitive("host_callback_scope")
host_callback_scope_p.multiple_results = True


def _other_effects(jaxpr: Any) -> set:
  return {e for e in jaxpr.effects if e is not _EFFECT}


def _abstract_eval(*avals: Any, jaxpr: Any):
  del avals
  return [v.aval for v in jaxpr.outvars], _other_effects(jaxpr)


host_callback_scope_p.def_effectful_abstract_eval(_abstract_eval)


# How many computations of ours over several devices were lowered: once one
# was, the barrier probes across two devices too (barrier/probes.py), and
# its idle check holds only while no more were (barrier/idle.py).
_multi_device_lowerings = 0


def multi_device_lowerings() -> int:
  """How many computations of ours over several devices were lowered."""
  return _multi_device_lowerings


def multi_device_lowerings_watch() -> Tuple[Any, str]:
  """Where `multi_device_lowerings` lives, as (object, attribute), for the
  barrier's native idle check to read."""
  return sys.modules[__name__], "_multi_device_lowerings"


def multi_device_lowered() -> bool:
  """Whether a computation of ours over several devices was lowered."""
  return _multi_device_lowerings > 0


def kept_results(ctx: Any, outs: Sequence[Any]) -> List[Tuple[Any, Any]]:
  """The (value, aval) pairs of the scope's results that its end mark takes
  as operands: the result of a computation of one device that has one.

  The entry computation's ROOT is then that result alone. XLA's CPU library
  fusion (`dot-library-rewriter`, docs/xla_root_fusion.md) fuses a
  reduction with its operand when the operand has no other user, not
  counting the ROOT's use, and then fails to remove the ROOT: a tap of a
  reduction of the result would make the program fail to compile. The end
  mark, which reads nothing, is a second user that XLA keeps."""
  if len(outs) != 1 or adapter.sharded_devices(ctx) is not None:
    return []
  aval = ctx.avals_out[0]
  if not isinstance(aval, jax.core.ShapedArray):
    return []
  return [(outs[0], aval)]


def _lower(ctx: Any, *args: Any, jaxpr: Any) -> List[Any]:
  global _multi_device_lowerings
  if adapter.device_count(ctx) > 1:
    _multi_device_lowerings += 1
  if not executions.counted(ctx):
    adapter.mark_module(ctx, root_kept=len(jaxpr.outvars) != 1)
    return adapter.lower_scope_body(ctx, jaxpr, args, _EFFECT, lambda t: t,
                                    lambda t, outs: None)

  def close(token: Any, outs: List[Any]) -> None:
    kept = kept_results(ctx, outs)
    adapter.mark_module(ctx, root_kept=len(outs) != 1 or bool(kept))
    executions.lower_mark(ctx, token, end=True, kept=kept)

  return adapter.lower_scope_body(
      ctx, jaxpr, args, _EFFECT,
      functools.partial(executions.lower_mark, ctx, end=False), close)


mlir.register_lowering(host_callback_scope_p, _lower, cacheable=False)


def needs_scope(top_jaxpr: Any) -> bool:
  """Whether `top_jaxpr` has our effect; raises when some of its taps could
  not be ordered."""
  _check_threadable(getattr(top_jaxpr, "jaxpr", top_jaxpr))
  return _EFFECT in top_jaxpr.effects


def _effect_dropping_primitives(jaxpr: Any) -> Iterator[str]:
  """Names of the higher-order primitives in `jaxpr` that hold our effect in
  a body but not on their own equation: JAX gives them no token for it, so
  their body's taps cannot be ordered (e.g. `pallas_call`)."""
  for eqn in jaxpr.eqns:
    for body in jaxprs_in_params(eqn.params):
      if _EFFECT in body.effects and _EFFECT not in eqn.effects:
        yield str(eqn.primitive)
      else:
        yield from _effect_dropping_primitives(body)


def _check_threadable(jaxpr: Any) -> None:
  dropping = sorted(set(_effect_dropping_primitives(jaxpr)))
  if dropping:
    raise NotImplementedError(
        f"host_callback: id_tap, id_print or call inside `{dropping[0]}` "
        "cannot be kept in order: JAX does not thread an effect's token "
        f"into the body of `{dropping[0]}`. Move the tap or call outside "
        f"of `{dropping[0]}`, or use jax.debug.callback there.")


def scoped(top_jaxpr: Any) -> Any:
  """The top-level jaxpr as one scope equation without our effect."""
  jaxpr = getattr(top_jaxpr, "jaxpr", top_jaxpr)
  return adapter.scope_eqn(top_jaxpr, host_callback_scope_p,
                           _other_effects(jaxpr))

