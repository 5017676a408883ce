"""`LensOptions`: the fourteen options of a lens, the ones `verbose` and
`record` share (a `record` block's too), as one frozen value with the
defaults in one place. The public functions keep their keyword arguments,
whose defaults they read from `DEFAULTS`, build one `LensOptions` of them,
check it and pass it down."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from .delivery import Alert, Observer, Observers
from .events import TapEvent
from .primitive_taps import PrimitiveTap
from .walker import Filters

# The `ops` names a user may give, and the loop primitive each means.
_OPS = {"scan": "scan", "while_loop": "while", "while": "while"}

# The metadata of the options that change what is traced (the rest only
# change who hears the events on the host).
_TRACED = {"traced": True}


def _traced(default: Any) -> Any:
  return dataclasses.field(default=default, metadata=_TRACED)


@dataclasses.dataclass(frozen=True)
class LensOptions:
  """What a lens reports and to whom, as `verbose`'s docstring describes
  each option. `taps` is kept as a tuple; `ops` as given."""
  # Who hears the events, on the host.
  on_step: Optional[Observer] = None
  alert: Optional[Callable[[TapEvent], Any]] = None
  alert_once: bool = False
  on_ys: Optional[Observer] = None
  alert_ys: Optional[Callable[[TapEvent], Any]] = None
  alert_ys_once: bool = False
  # What is traced: which loops and primitives send, and what.
  select: Optional[Callable[..., Any]] = _traced(None)
  select_ys: Optional[Callable[..., Any]] = _traced(None)
  ops: Sequence[str] = _traced(("scan", "while_loop"))
  sample_every: int = _traced(1)
  where: Optional[Callable[[str], bool]] = _traced(None)
  max_depth: Optional[int] = _traced(None)
  taps: Sequence[PrimitiveTap] = _traced(())
  partitioned: bool = _traced(False)

  def __post_init__(self) -> None:
    object.__setattr__(self, "taps", tuple(self.taps))

  @classmethod
  def of(cls, arguments: Mapping[str, Any]) -> "LensOptions":
    """The options among a public function's `arguments`, by name."""
    return cls(**{field.name: arguments[field.name]
                  for field in dataclasses.fields(cls)})

  def check(self) -> None:
    """Rejects a `sample_every` below 1; warns of a `select_ys` that cannot
    apply (pointing at the caller of the public function that calls
    this)."""
    if self.sample_every < 1:
      raise ValueError(f"sample_every must be >= 1, got {self.sample_every}")
    if self.select_ys is not None and "scan" not in self.ops:
      warnings.warn(
          'host_callback.loops: select_ys has no effect when ops does not '
          'include "scan" (a while_loop has no per-step outputs). Remove '
          'select_ys or add "scan" to ops.', UserWarning, stacklevel=3)

  @property
  def wants_ys(self) -> bool:
    """Whether a recorder keeps scan outputs: something asked for them."""
    return bool(self.on_ys or self.alert_ys or self.select_ys)

  def filters(self) -> Filters:
    """The loops whose carry reports."""
    return Filters(frozenset(_OPS[op] for op in self.ops if op in _OPS),
                   self.where, self.max_depth)

  def observers(self) -> Observers:
    """Who hears the events: the alerts first, then the callbacks."""
    return Observers(
        self.on_step,
        Alert(self.alert, self.alert_once) if self.alert else None,
        self.on_ys,
        Alert(self.alert_ys, self.alert_ys_once) if self.alert_ys else None)

  def traced(self) -> Dict[str, Any]:
    """What decides a `record` block's trace (`lens_keys.lens_number`): the
    traced options, and whether scan outputs are recorded."""
    return {**{field.name: getattr(self, field.name)
               for field in dataclasses.fields(self)
               if field.metadata.get("traced")},
            "wants_ys": self.wants_ys}


DEFAULTS = LensOptions()
