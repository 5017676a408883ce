"""Code that expects a tap function's error at `barrier_wait()`, as the
original's outfeed mode gave it: a `try` whose body calls `barrier_wait`
and whose handler catches `CallbackException` (or `TapFunctionException`).

Standard library only (`ast`): the codemod and `host_callback.install()`
both look for it.
"""

from __future__ import annotations

import ast
from typing import List, Optional, Set, Tuple

_EXCEPTIONS = ("CallbackException", "TapFunctionException")
OUTFEED_HINT = (
    "this code expects tap errors at barrier_wait(), as in the original's "
    "outfeed mode; on CPU host_callback runs in the synchronous mode by "
    "default (as the original's last release, in JAX 0.4.34, did), where a "
    "tap function's error fails its jitted call instead. For the outfeed "
    "mode set "
    "JAX_HOST_CALLBACK_OUTFEED=1 (or jax.config.update("
    "'jax_host_callback_outfeed', True)); see \"Which mode does my code "
    "expect?\" in the migration guide")


def _last_name(node: Optional[ast.expr]) -> str:
  """`c` for `c` or `a.b.c`, else ''."""
  if isinstance(node, ast.Name):
    return node.id
  if isinstance(node, ast.Attribute):
    return node.attr
  return ""


def _caught(handler: ast.ExceptHandler) -> Optional[str]:
  """The exception of ours that `handler` catches, if any."""
  types = (handler.type.elts if isinstance(handler.type, ast.Tuple)
           else [handler.type])
  return next((name for name in map(_last_name, types)
               if name in _EXCEPTIONS), None)


def barrier_catches(source: str) -> List[Tuple[int, str]]:
  """(line, exception) for each `barrier_wait(...)` call in the body of a
  `try` that catches one of ours; none in source that does not parse."""
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return []
  found: Set[Tuple[int, str]] = set()
  for node in ast.walk(tree):
    if not isinstance(node, (ast.Try, ast.TryStar)):
      continue
    caught = next(filter(None, map(_caught, node.handlers)), None)
    if caught is None:
      continue
    for statement in node.body:
      found.update((call.lineno, caught) for call in ast.walk(statement)
                   if isinstance(call, ast.Call) and
                   _last_name(call.func) == "barrier_wait")
  return sorted(found)


def message(caught: str) -> str:
  """What to tell about a `barrier_wait()` in a `try` that catches
  `caught`."""
  return f"barrier_wait() in a try that catches {caught}: {OUTFEED_HINT}"
