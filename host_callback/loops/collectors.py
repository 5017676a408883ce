"""Sinks for events: `FlightRecorder` keeps them (and makes a pandas
table), `JSONLWriter` writes one JSON line each, `read_jsonl` reads them
back. Each is a callable taking a `TapEvent`, so it can be an `on_step`."""

from __future__ import annotations

import collections
import json
import pathlib
from typing import Any, Deque, Dict, List, Optional, Tuple, Union

import numpy as np

from .events import TapEvent

__all__ = ["FlightRecorder", "JSONLWriter", "read_jsonl"]


def _plain(leaf: Any) -> Any:
  """A leaf as a Python scalar or nested list."""
  array = np.asarray(leaf)
  return array.item() if array.ndim == 0 else array.tolist()


def _columns(value: Any) -> Dict[str, Any]:
  """A value as table columns: a dict by its keys, a sequence as `value_i`
  (one element: `value`), anything else as `value`."""
  if isinstance(value, dict):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    if len(value) == 1:
      return {"value": _plain(value[0])}
    return {f"value_{i}": _plain(v) for i, v in enumerate(value)}
  return {"value": _plain(value)}


class FlightRecorder:
  """Keeps the events it is called with: all of them, or with `max_events`
  the last `max_events` (a ring), counting the ones it let go in
  `dropped`."""

  def __init__(self, max_events: Optional[int] = None) -> None:
    if max_events is not None and max_events < 1:
      raise ValueError(f"max_events must be None or >= 1, got {max_events}")
    self._kept: Union[List[TapEvent], Deque[TapEvent]] = (
        [] if max_events is None else collections.deque(maxlen=max_events))
    self._seen = 0
    self.max_events = max_events

  def __call__(self, event: TapEvent) -> None:
    self._seen += 1
    self._kept.append(event)

  @property
  def events(self) -> List[TapEvent]:
    """The events kept, oldest first: without `max_events`, the list the
    recorder appends to; with it, a copy of the ring."""
    kept = self._kept
    return kept if isinstance(kept, list) else list(kept)

  @events.setter
  def events(self, events: List[TapEvent]) -> None:
    """Replaces the events kept (`rec.events = []` clears, as in jax-tap)."""
    self._kept = (events if self.max_events is None else
                  collections.deque(events, maxlen=self.max_events))
    self._seen = len(self._kept)

  @property
  def dropped(self) -> int:
    """How many events `max_events` let go (the oldest); 0 without it."""
    return 0 if self.max_events is None else self._seen - len(self._kept)

  def df(self) -> Any:
    """The events as a pandas DataFrame: `path`, `step`, then the value's
    columns (a dict's keys; `value_0`, `value_1`, ... for a sequence;
    `value` for one value). Needs pandas (the `loops` extra)."""
    try:
      import pandas as pd  # pylint: disable=import-outside-toplevel
    except ImportError as error:
      raise ImportError(
          "FlightRecorder.df() needs pandas: pip install "
          "'host-callback[loops]' (or pip install pandas)") from error
    return pd.DataFrame([{"path": e.path, "step": int(e.step),
                          **_columns(e.value)} for e in self.events])


def _to_json(value: Any) -> Tuple[Any, str]:
  if isinstance(value, dict):
    return {str(k): _plain(v) for k, v in value.items()}, "dict"
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value], "tuple"
  return _plain(value), "scalar"


def _from_json(raw: Any, value_kind: str) -> Any:
  def leaf(v: Any) -> Any:
    array = np.asarray(v)
    return array.item() if array.ndim == 0 else array
  if value_kind == "tuple":
    return tuple(leaf(v) for v in raw)
  if value_kind == "dict":
    return {k: leaf(v) for k, v in raw.items()}
  return leaf(raw)


class JSONLWriter:
  """Writes each event as a JSON line `{"path", "step", "value_kind",
  "value", "kind"}` to `path` (truncated first); a context manager that
  closes the file."""

  def __init__(self, path: Union[str, pathlib.Path]) -> None:
    self._file = pathlib.Path(path).open("w", encoding="utf-8")

  def __call__(self, event: TapEvent) -> None:
    value, value_kind = _to_json(event.value)
    self._file.write(json.dumps(
        {"path": event.path, "step": int(event.step),
         "value_kind": value_kind, "value": value, "kind": event.kind}) + "\n")
    self._file.flush()

  def close(self) -> None:
    self._file.close()

  def __enter__(self) -> "JSONLWriter":
    return self

  def __exit__(self, *_: Any) -> None:
    self.close()


def read_jsonl(path: Union[str, pathlib.Path]) -> List[TapEvent]:
  """The events a `JSONLWriter` wrote, values as NumPy scalars and arrays
  in their tuple or dict (`total` is not kept)."""
  events = []
  with pathlib.Path(path).open(encoding="utf-8") as lines:
    for line in lines:
      if line.strip():
        record = json.loads(line)
        events.append(TapEvent(
            record["path"], record["step"],
            _from_json(record["value"], record.get("value_kind", "tuple")),
            kind=record.get("kind", "carry")))
  return events
