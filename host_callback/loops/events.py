"""What reaches the host: `TapEvent`, one observation of a loop step or a
primitive's outputs."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional


@dataclasses.dataclass(frozen=True)
class TapEvent:
  """One observation, delivered to `on_step` (carry and primitive taps) or
  `on_ys` (scan outputs).

  Attributes:
    path: the stable address of the loop or primitive, e.g.
      `"scan[0]/while[1]"` or `"scan[0]/cholesky[0]"`.
    step: the enclosing loop's step, from 0; -1 for a primitive outside any
      loop.
    value: what `select` returned, as NumPy values in its own structure; by
      default the tuple of the carry's (or the outputs') leaves.
    total: the enclosing scan's length; None for a `while_loop` and outside
      loops.
    kind: `"carry"` (carry and primitive taps) or `"output"` (scan outputs).
  """
  path: str
  step: int
  value: Any
  total: Optional[int] = None
  kind: str = "carry"
