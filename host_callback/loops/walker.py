"""The interpreter that instruments a traced function: it evaluates the
function's jaxpr equation by equation, rebuilds every `scan` and
`while_loop` with a step counter and a tap after each step
(`loop_rewrites`), descends into `jit`, `cond`/`switch` and `checkpoint`,
and taps the primitives that `PrimitiveTap`s name.

Addresses: at each level one counter numbers the boundary equations (`scan`,
`while`, `cond`, `jit`, `checkpoint`), whatever filters apply, so that an
address does not change when the filters do: `scan[0]/while[1]`,
`jit[0]/scan[0]`, `cond[2]/b1/scan[0]`, `remat[0]/scan[0]`. A primitive tap
adds `name[j]`, `j` counting that primitive's equations at its level.
`custom_jvp`/`custom_vjp` functions are run as they are, not descended into,
so that their derivative rules stay theirs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core

from . import loop_rewrites, patching
from .emission import Emitter
from .loop_rewrites import Loop
from .primitive_taps import PrimitiveTap

_JITS = ("jit", "pjit", "closed_call")
_OPAQUE = ("custom_jvp_call", "custom_vjp_call")


@dataclasses.dataclass(frozen=True)
class Filters:
  """Which loops tap their carry: `ops` names the loop primitives (`scan`,
  `while`), `where` tests a loop's path, and `max_depth` bounds its depth
  (the number of `/` in its path). Loops that do not tap are still
  descended into, for the primitive taps and loops inside them."""
  ops: frozenset = frozenset({"scan", "while"})
  where: Optional[Callable[[str], bool]] = None
  max_depth: Optional[int] = None

  def taps(self, primitive: str, path: str) -> bool:
    return (primitive in self.ops
            and (self.where is None or bool(self.where(path)))
            and (self.max_depth is None or path.count("/") <= self.max_depth))


def _bind(eqn: Any, values: Sequence[Any]) -> List[Any]:
  """Evaluates one equation as it is, as `jax.core.eval_jaxpr` does."""
  out = eqn.primitive.bind(*values, **eqn.primitive.get_bind_params(eqn.params))
  return list(out) if eqn.primitive.multiple_results else [out]


def _as_list(result: Any) -> List[Any]:
  return list(result) if isinstance(result, (list, tuple)) else [result]


@dataclasses.dataclass(frozen=True)
class Walker:
  """Evaluates jaxprs with the taps of one `verbose` call."""
  emitter: Emitter
  filters: Filters = Filters()
  primitive_taps: Sequence[PrimitiveTap] = ()

  def run(self, f: Callable[..., Any], args: tuple,
          first_index: int = 0) -> Any:
    """`f(*args)`, instrumented; the first boundary at the top level is
    numbered `first_index`."""
    with patching.unintercepted():
      closed, shapes = jax.make_jaxpr(f, return_shape=True)(*args)
      out = self.eval(closed.jaxpr, closed.consts,
                      jax.tree_util.tree_leaves(args), "",
                      Loop(jnp.int32(-1)), first_index)
    return jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(shapes), out)

  def eval(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any],
           path: str, loop: Loop, first_index: int = 0) -> List[Any]:
    env: Dict[Any, Any] = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))

    def read(v: Any) -> Any:
      return v.val if isinstance(v, jex_core.Literal) else env[v]

    boundaries = first_index
    seen: Dict[str, int] = {}
    for eqn in jaxpr.eqns:
      values = [read(v) for v in eqn.invars]
      name = eqn.primitive.name
      rule = _BOUNDARIES.get(name)
      if rule is not None:
        out = rule(self, eqn, values, path, boundaries, loop)
        boundaries += 1
      else:
        out = _bind(eqn, values)
        if tapped_here(eqn):
          seen[name] = self._tap_primitive(eqn, out, path, seen.get(name, 0),
                                           loop)
      env.update(zip(eqn.outvars, out))
    return [read(v) for v in jaxpr.outvars]

  def _tap_primitive(self, eqn: Any, out: List[Any], path: str, count: int,
                     loop: Loop) -> int:
    """Taps `out` for each spec naming this primitive; the primitive's new
    count at this level."""
    specs = [s for s in self.primitive_taps if s.prim_name == eqn.primitive.name]
    if not specs:
      return count
    here = f"{path}{eqn.primitive.name}[{count}]"
    for spec in specs:
      self.emitter.primitive(here, loop.step, tuple(out), loop.total, spec,
                             loop.inside)
    return count + 1

  # --- boundaries: each rule evaluates its equation, descending into it --

  def _scan(self, eqn, values, path, index, loop):
    here = f"{path}scan[{index}]"
    return loop_rewrites.scan(self, eqn, values, here,
                              self.filters.taps("scan", here))

  def _while(self, eqn, values, path, index, loop):
    here = f"{path}while[{index}]"
    if loop_rewrites.while_is_batched(eqn):
      # A while_loop batched inside `f` (vmap in f): its masking is added
      # when it is lowered, so it cannot be rebuilt; it runs as it is.
      return _bind(eqn, values)
    return loop_rewrites.while_loop(self, eqn, values, here,
                                    self.filters.taps("while", here))

  def _cond(self, eqn, values, path, index, loop):
    def branch(closed: Any, j: int) -> Callable[..., Any]:
      inner = f"{path}cond[{index}]/b{j}/"
      return lambda *operands: tuple(
          self.eval(closed.jaxpr, closed.consts, operands, inner, loop))
    branches = [branch(b, j) for j, b in enumerate(eqn.params["branches"])]
    return _as_list(jax.lax.switch(values[0], branches, *values[1:]))

  def _remat(self, eqn, values, path, index, loop):
    inner = f"{path}remat[{index}]/"
    body = lambda *operands: tuple(  # noqa: E731
        self.eval(eqn.params["jaxpr"], (), operands, inner, loop))
    return _as_list(jax.checkpoint(
        body, prevent_cse=eqn.params["prevent_cse"],
        policy=eqn.params["policy"])(*values))

  def _jit(self, eqn, values, path, index, loop):
    inner, closed = f"{path}jit[{index}]/", eqn.params["jaxpr"]

    def body(step: Any, *operands: Any) -> List[Any]:
      # The step is an argument: the jit traces in a context of its own.
      return self.eval(closed.jaxpr, closed.consts, operands, inner,
                       dataclasses.replace(loop, step=step))
    return _as_list(jax.jit(body)(loop.step, *values))


_BOUNDARIES: Dict[str, Callable[..., List[Any]]] = {
    "scan": Walker._scan, "while": Walker._while, "cond": Walker._cond,
    "remat2": Walker._remat, **{name: Walker._jit for name in _JITS},
}


def tapped_here(eqn: Any) -> bool:
  """Whether a primitive tap can tap `eqn` itself: not a boundary (which
  is descended into) nor a custom derivative's call (which runs as is)."""
  name = eqn.primitive.name
  return name not in _BOUNDARIES and name not in _OPAQUE


def descended_jaxprs(eqn: Any) -> List[Any]:
  """The jaxprs of `eqn` that the walker evaluates with its taps, as the
  rules above do: a scan's body, a while loop's body (not its predicate;
  nothing of a loop batched inside the function), each branch of a cond,
  the body of a checkpoint or a jit. Nothing else: not the functions of a
  `custom_linear_solve`, a `custom_jvp`/`custom_vjp` or a `shard_map`."""
  name, params = eqn.primitive.name, eqn.params
  if name == "scan":
    return [params["jaxpr"].jaxpr]
  if name == "while":
    return ([] if loop_rewrites.while_is_batched(eqn)
            else [params["body_jaxpr"].jaxpr])
  if name == "cond":
    return [branch.jaxpr for branch in params["branches"]]
  if name == "remat2":
    return [params["jaxpr"]]
  if name in _JITS:
    return [params["jaxpr"].jaxpr]
  return []
