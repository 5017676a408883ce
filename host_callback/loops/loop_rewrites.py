"""A `scan` or `while_loop` equation rebuilt with a step counter in its
carry and taps after each step: the carry's (if its filters let it), then
for a scan the step's outputs. The body is evaluated by the walker, so the
loops and primitives inside it are instrumented too. The user's functions
never see the counter."""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Protocol, Sequence

import jax
import jax.numpy as jnp

from . import patching
from .emission import Emitter

@dataclasses.dataclass(frozen=True)
class Loop:
  """Where equations are evaluated: the enclosing loop's step (-1 outside
  loops), its total (a scan's length) and whether there is a loop."""
  step: Any
  total: Optional[int] = None
  inside: bool = False


class Walker(Protocol):
  """What a rebuilt loop needs of the walker (`walker.Walker`)."""
  emitter: Emitter

  def eval(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any],
           path: str, loop: Loop) -> List[Any]: ...


# The parameters of a scan equation that `lax.scan` takes as arguments.
_SCAN_ARGUMENTS = ("length", "reverse", "unroll", "_split_transpose")


def _scan_groups(params: dict) -> tuple[int, int]:
  """(number of consts, number of carry leaves) of a scan equation: JAX 0.10
  names them; later versions pack them in `ft_in`."""
  if "num_consts" in params:
    return params["num_consts"], params["num_carry"]
  consts, carry, _ = params["ft_in"].unpack()
  return len(consts), len(carry)


def scan(walker: Walker, eqn: Any, values: Sequence[Any], here: str,
         taps_carry: bool) -> List[Any]:
  params = eqn.params
  body, total = params["jaxpr"], params["length"]
  n_consts, n_carry = _scan_groups(params)
  consts, init = values[:n_consts], values[n_consts:n_consts + n_carry]
  xs = list(values[n_consts + n_carry:])

  def step_fn(state: Any, x: List[Any]) -> Any:
    carry, step = state
    out = walker.eval(body.jaxpr, body.consts, [*consts, *carry, *x],
                      here + "/", Loop(step, total, True))
    carry, ys = out[:n_carry], out[n_carry:]
    if taps_carry:
      walker.emitter.carry(here, step, tuple(carry), total)
    walker.emitter.outputs(here, step, tuple(ys), total)
    return (carry, step + 1), ys

  (carry, _), ys = patching.underlying_scan()(
      step_fn, (list(init), jnp.int32(0)), xs,
      **{k: params[k] for k in _SCAN_ARGUMENTS if k in params})
  return [*carry, *ys]


def while_is_batched(eqn: Any) -> bool:
  """Whether the loop was batched in the traced function: only `vmap` gives
  a while_loop a predicate that is not a scalar."""
  outvars = eqn.params["cond_jaxpr"].jaxpr.outvars
  return bool(outvars) and outvars[0].aval.ndim > 0


def while_loop(walker: Walker, eqn: Any, values: Sequence[Any], here: str,
               taps_carry: bool) -> List[Any]:
  params = eqn.params
  cond, body = params["cond_jaxpr"], params["body_jaxpr"]
  n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
  cond_consts, body_consts = values[:n_cond], values[n_cond:n_cond + n_body]
  init = list(values[n_cond + n_body:])

  def predicate(carry: Sequence[Any]) -> Any:
    return jax.core.eval_jaxpr(cond.jaxpr, cond.consts, *cond_consts,
                               *carry)[0]

  def step_fn(state: Any) -> Any:
    carry, step = state
    before = carry
    carry = walker.eval(body.jaxpr, body.consts, [*body_consts, *carry],
                        here + "/", Loop(step, None, True))
    if taps_carry:
      # Under vmap a lane whose loop ended runs on while others have not:
      # its taps say it is not active, and the host drops them.
      walker.emitter.carry(here, step, tuple(carry), None,
                           active=lambda: predicate(before))
    return carry, step + 1

  carry, _ = patching.underlying_while()(
      lambda state: predicate(state[0]), step_fn, (init, jnp.int32(0)))
  return list(carry)
