"""The host side of a tap: an event goes to the observers (`on_step`,
`on_ys`, alerts) without ever raising into the program. A callback that
raises warns once and is skipped for that event."""

from __future__ import annotations

import dataclasses
import sys
import warnings
from typing import Any, Callable, Optional, Set

import numpy as np

from .events import TapEvent
from .primitive_taps import PrimitiveTap

Observer = Callable[[TapEvent], Any]

# ids of the callbacks (on_step, on_ys) and alert predicates that raised and
# warned: each warns once per process.
_warned: Set[int] = set()
_alert_warned: Set[int] = set()


def _warn_once(seen: Set[int], function: Any, what: str,
               error: Exception) -> None:
  if id(function) in seen:
    return
  seen.add(id(function))
  message = str(error).rstrip(".")
  try:  # under `python -W error` the warning itself raises
    warnings.warn(
        f"host_callback.loops: {what} raised {type(error).__name__}: "
        f"{message}. The program goes on unchanged; this callback's further "
        "errors are not reported.", UserWarning, stacklevel=2)
  except Exception:  # noqa: BLE001
    pass


def callback_failed(callback: Observer, error: Exception) -> None:
  """What a callback that raised gets: a warning, once per callback."""
  _warn_once(_warned, callback, "on_step callback", error)


def guarding(callback: Observer) -> Observer:
  """`callback`, guarded: an exception warns once per callback. The guard
  names what it guards as `__wrapped__`, so that the hottest path (see
  `emission.host_side`) may guard it itself, with `callback_failed`."""
  def guarded_callback(event: TapEvent) -> None:
    try:
      callback(event)
    except Exception as error:  # noqa: BLE001
      callback_failed(callback, error)
  guarded_callback.__wrapped__ = callback  # type: ignore[attr-defined]
  return guarded_callback


def _write(line: str) -> None:
  try:
    sys.stderr.write(line + "\n")
  except Exception:  # noqa: BLE001
    pass


def _total(event: TapEvent) -> str:
  return "?" if event.total is None else str(event.total)


def format_value(value: Any) -> str:
  """A value on one line, arrays shortened as NumPy prints them."""
  try:
    with np.printoptions(precision=4, threshold=8, edgeitems=2):
      text = repr(np.asarray(value))
  except Exception:  # noqa: BLE001
    text = repr(value)
  return " ".join(text.split())


def _alerting(predicate: Callable[[Any], Any], argument: Any,
              what: str) -> Any:
  """`predicate(argument)`, or False (after warning once) if it raised."""
  try:
    return predicate(argument)
  except Exception as error:  # noqa: BLE001
    _warn_once(_alert_warned, predicate, what, error)
    return False


@dataclasses.dataclass
class Alert:
  """A carry or output alert: `predicate(event)`; a str result is the
  message. With `once`, a path alerts at most once (per `verbose` call or
  `record` block)."""
  predicate: Callable[[TapEvent], Any]
  once: bool = False
  fired: Set[str] = dataclasses.field(default_factory=set)

  def __call__(self, event: TapEvent) -> None:
    result = _alerting(self.predicate, event, "alert")
    if not result:
      return
    if self.once:
      if event.path in self.fired:
        return
      self.fired.add(event.path)
    message = result if isinstance(result, str) else "alert"
    _write(f"[tap] FAIL {event.path} {event.step}/{_total(event)}: "
           f"{message}")


def fire_spec(spec: PrimitiveTap, event: TapEvent, fired: Set[int]) -> None:
  """A primitive tap's alert (or print) line for `event`; `fired` holds the
  ids of the `once` specs that already wrote theirs."""
  if spec.alert is None or not _alerting(spec.alert, event.value,
                                         "alert predicate"):
    return
  if spec.once:
    if id(spec) in fired:
      return
    fired.add(id(spec))
  where = f"{event.path} {event.step}/{_total(event)}"
  if spec._printer:  # pylint: disable=protected-access
    _write(f"[tap] {where}: {format_value(event.value)}")
  else:
    _write(f"[tap] FAIL {where}: {spec.label or spec.prim_name}")


def _chain(alert: Optional[Alert], callback: Optional[Observer]
           ) -> Optional[Observer]:
  """One observer: the alert first, then the callback (guarded)."""
  if callback is None:
    return alert
  if alert is None:
    return guarding(callback)

  guarded_callback = guarding(callback)

  def both(event: TapEvent) -> None:
    alert(event)
    guarded_callback(event)
  return both


@dataclasses.dataclass
class Observers:
  """Who hears a `verbose` call's (or a `record` block's) events: alerts
  first, then the callbacks, each guarded (`LensOptions.observers`)."""
  on_step: Optional[Observer] = None
  alert: Optional[Alert] = None
  on_ys: Optional[Observer] = None
  alert_ys: Optional[Alert] = None
  fired_specs: Set[int] = dataclasses.field(default_factory=set)

  def __post_init__(self) -> None:
    self._by_kind = {"carry": _chain(self.alert, self.on_step),
                     "output": _chain(self.alert_ys, self.on_ys)}
    self._on_primitive = (None if self.on_step is None
                          else guarding(self.on_step))

  def observer(self, kind: str) -> Optional[Observer]:
    """Who hears the events of `kind` (None: no one, and no tap is made)."""
    return self._by_kind[kind]

  def deliver(self, event: TapEvent) -> None:
    observer = self._by_kind[event.kind]
    if observer is not None:
      observer(event)

  def deliver_primitive(self, event: TapEvent, spec: PrimitiveTap) -> None:
    if self._on_primitive is not None:
      self._on_primitive(event)
    fire_spec(spec, event, self.fired_specs)
