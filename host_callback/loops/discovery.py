"""`primitives`: which primitive names a function's trace holds, for
`on`, `watch_nan` and `print`."""

from __future__ import annotations

import collections
from typing import Any, Callable, Dict

import jax
from jax.extend import core as jex_core


def _count(jaxpr: Any, counts: collections.Counter) -> None:
  for eqn in jaxpr.eqns:
    counts[eqn.primitive.name] += 1
    for inner in jex_core.jaxprs_in_params(eqn.params):
      _count(inner, counts)


def primitives(f: Callable[..., Any], *args: Any) -> Dict[str, int]:
  """`{name: count}` of the primitives in `f(*args)`'s trace, inner
  functions (loop bodies, branches, jit, checkpoint) included. Nothing
  runs."""
  counts: collections.Counter = collections.Counter()
  _count(jax.make_jaxpr(f)(*args).jaxpr, counts)
  return dict(counts)
