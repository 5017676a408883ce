"""The number of a `record` block's lens, for JAX's jit key: blocks whose
lenses trace alike share a number, so that a function compiled under one
lens is compiled again under another, and only then.

Two lenses trace alike when their options are equal, functions compared by
what they compute: the same code with the same defaults and captured
values (compared by value where they can be, else by identity). A
`select=lambda leaves: leaves[0]` written in a loop of blocks is one lens.
"""

from __future__ import annotations

import dataclasses
import threading
import types
from typing import Any, Dict, Hashable

_numbers: Dict[Hashable, int] = {}
_lock = threading.Lock()


def _key(value: Any) -> Hashable:
  """A hashable stand-in for `value`, equal for values that trace alike."""
  if isinstance(value, types.FunctionType):
    cells = tuple(_key(cell.cell_contents) for cell in value.__closure__ or ())
    return ("function", value.__code__, _key(value.__defaults__), cells)
  if isinstance(value, (tuple, list, frozenset)):
    return (type(value).__name__, tuple(_key(v) for v in value))
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return (type(value), tuple(_key(getattr(value, f.name))
                               for f in dataclasses.fields(value)))
  try:
    hash(value)
  except TypeError:
    return ("object", id(value))
  return ("value", type(value), value)


def lens_number(options: Dict[str, Any]) -> int:
  """The number of the lens that `options` (a block's tracing options)
  make: 1 and up, the same for lenses that trace alike."""
  key = tuple(sorted((name, _key(value)) for name, value in options.items()))
  with _lock:
    return _numbers.setdefault(key, len(_numbers) + 1)
