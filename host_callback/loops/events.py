"""What reaches the host: `TapEvent`, one observation of a loop step or a
primitive's outputs."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from ..receiver.instances import new_instance


@dataclasses.dataclass(frozen=True, slots=True)
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


def site_events(path: str, total: Optional[int], kind: str
                ) -> Callable[[int, Any, Any], TapEvent]:
  """`make(step, value, device)`: the events of a tap site whose path,
  total and kind are these, what its host function makes for every step
  (with `receiver/instances.py`'s `new_instance`, which costs less than
  TapEvent's own `__init__`; the usual select's are made in C, by
  `instance_feed` (`emission.host_side`), as this makes them)."""
  def make(step: int, value: Any, device: Any) -> TapEvent:
    return new_instance(TapEvent, path, step, value, total, kind, device)
  return make
