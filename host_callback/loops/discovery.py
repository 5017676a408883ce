"""`primitives`: which primitive names a function's trace holds, for
`on`, `watch_nan` and `print`."""

from __future__ import annotations

import collections
from typing import Any, Callable, Dict

import jax

from .walker import descended_jaxprs, tapped_here


def _count(jaxpr: Any, counts: collections.Counter) -> None:
  for eqn in jaxpr.eqns:
    inners = descended_jaxprs(eqn)
    if inners or tapped_here(eqn):
      counts[eqn.primitive.name] += 1
    for inner in inners:
      _count(inner, counts)


def primitives(f: Callable[..., Any], *args: Any) -> Dict[str, int]:
  """`{name: count}` of the equations in `f(*args)`'s trace that the lens
  reaches: the loops, branches, jits and checkpoints it descends into, and
  the primitives that `on`, `watch_nan` and `print` tap, each counted once
  per place in the program. It counts what the lens counts: nothing inside
  a `custom_linear_solve`, a `custom_jvp`/`custom_vjp` function, a
  `shard_map` or a while loop's predicate, which run as they are. Nothing
  runs."""
  counts: collections.Counter = collections.Counter()
  _count(jax.make_jaxpr(f)(*args).jaxpr, counts)
  return dict(counts)
