"""A `scan` or `while_loop` equation rebuilt with a step counter in its
carry and taps after each step: the carry's (if its filters let it), then
for a scan the step's outputs. The body is evaluated by the walker, so the
loops and primitives inside it are instrumented too. The user's functions
never see the counter."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional, Protocol, Sequence

import jax
import jax.numpy as jnp

from . import patching
from .emission import Emitter

@dataclasses.dataclass(frozen=True)
class Loop:
  """Where equations are evaluated: the enclosing loop's step (-1 outside
  loops), its total (a scan's length), whether there is a loop, and
  whether `sample_every` samples the step, where that is known when
  tracing (None: a `lax.cond` on the step decides)."""
  step: Any
  total: Optional[int] = None
  inside: bool = False
  sampled: Optional[bool] = None


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

  def step(carry: Sequence[Any], x: Sequence[Any], at: Any,
           sampled: Optional[bool]) -> tuple:
    """One step, at step number `at`, with its taps: (carry, ys)."""
    out = walker.eval(body.jaxpr, body.consts, [*consts, *carry, *x],
                      here + "/", Loop(at, total, True, sampled))
    carry, ys = out[:n_carry], out[n_carry:]
    if taps_carry:
      walker.emitter.carry(here, at, tuple(carry), total, sampled=sampled)
    walker.emitter.outputs(here, at, tuple(ys), total, sampled=sampled)
    return carry, ys

  every = walker.emitter.sample_every
  if every > 1 and total > 0 and _plain_scan(params):
    return _in_chunks(step, list(init), xs, total, every)

  def step_fn(state: Any, x: List[Any]) -> Any:
    carry, at = state
    carry, ys = step(carry, x, at, None)
    return (carry, at + 1), ys

  (carry, _), ys = patching.underlying_scan()(
      step_fn, (list(init), jnp.int32(0)), xs,
      **{k: params[k] for k in _SCAN_ARGUMENTS if k in params})
  return [*carry, *ys]


def _plain_scan(params: dict) -> bool:
  """Whether a scan runs its steps in order, one at a time: a reversed or
  unrolled one keeps the `lax.cond` of `sample_every`."""
  return (not params.get("reverse", False) and params.get("unroll", 1) == 1
          and not params.get("_split_transpose", False))


def _in_chunks(step: Callable[..., tuple], init: List[Any], xs: List[Any],
               total: int, every: int) -> List[Any]:
  """A scan's `total` steps, with `sample_every=every`, in chunks of
  `every` steps (then a shorter tail): a chunk's first step is sampled and
  taps as it is; the others run in an inner scan without this loop's taps,
  so they cost what the user's step costs, with no compare and no cond.
  The steps are the same, in the same order, on the same operands."""
  scan_ = patching.underlying_scan()

  def unsampled(state: Any, x: List[Any]) -> Any:
    carry, at = state
    carry, ys = step(carry, x, at, False)
    return (carry, at + 1), ys

  def chunk(carry: List[Any], first: Any, xs_chunk: List[Any],
            size: int) -> tuple:
    """`size` steps from step `first`, which is sampled."""
    carry, ys = step(carry, [x[0] for x in xs_chunk], first, True)
    ys = [y[None] for y in ys]
    if size > 1:
      (carry, _), rest = scan_(unsampled, (carry, first + 1),
                               [x[1:] for x in xs_chunk], length=size - 1)
      ys = [jnp.concatenate([y, r]) for y, r in zip(ys, rest)]
    return carry, ys

  chunks, tail = divmod(total, every)
  carry, ys = init, None
  if chunks:
    def outer(state: Any, xs_chunk: List[Any]) -> Any:
      carry, first = state
      carry, ys = chunk(carry, first, xs_chunk, every)
      return (carry, first + every), ys
    whole = [x[:chunks * every].reshape(chunks, every, *x.shape[1:])
             for x in xs]
    (carry, _), ys = scan_(outer, (carry, jnp.int32(0)), whole, length=chunks)
    ys = [y.reshape(chunks * every, *y.shape[2:]) for y in ys]
  if tail:
    carry, tail_ys = chunk(carry, jnp.int32(chunks * every),
                           [x[chunks * every:] for x in xs], tail)
    ys = tail_ys if ys is None else [jnp.concatenate([y, t])
                                     for y, t in zip(ys, tail_ys)]
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
