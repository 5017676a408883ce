"""What reaches the host: `TapEvent`, one observation of a loop step or a
primitive's outputs."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

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


# TapEvent's slots, not frozen: an event is made as one of these (calling
# the class costs less than `object.__new__`), filled by plain attribute
# stores (the frozen `__init__`, or the slots' own setters, cost about
# twice as much), then becomes a TapEvent, which Python allows because the
# two lay out their instances alike. Every field is set: the slots have no
# defaults. `site_events` makes events so; the consumer of the usual select
# does it inline (`emission.host_side`), which saves a call per event.
Unfrozen = type("_UnfrozenTapEvent", (), {"__slots__": TapEvent.__slots__})


def site_events(path: str, total: Optional[int], kind: str
                ) -> Callable[[int, Any, Any], TapEvent]:
  """`make(step, value, device)`: the events of a tap site whose path,
  total and kind are these, what its host function makes for every step."""
  def make(step: int, value: Any, device: Any) -> TapEvent:
    event = Unfrozen()
    event.path = path
    event.step = step
    event.value = value
    event.total = total
    event.kind = kind
    event.device = device
    event.__class__ = TapEvent
    return event
  return make
