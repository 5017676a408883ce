"""What reaches the host: `TapEvent`, one observation of a loop step or a
primitive's outputs."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

_new = object.__new__


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
    device: the `jax.Device` that ran the step (under `pmap`, each device
      reports its own steps); None where unknown (an event read back by
      `read_jsonl`, or made by hand). jax-tap's events have no such field.
  """
  path: str
  step: int
  value: Any
  total: Optional[int] = None
  kind: str = "carry"
  device: Any = None

  @classmethod
  def _of_site(cls, site: Dict[str, Any], step: int, value: Any,
               device: Any) -> "TapEvent":
    """The event of a tap site whose `path`, `total` and `kind` are in
    `site`: what a tap's host function makes for every step, without the
    frozen `__init__`'s per-field checks (the fields are the same)."""
    event = _new(cls)
    fields = event.__dict__
    fields.update(site)
    fields["step"], fields["value"], fields["device"] = step, value, device
    return event
