"""`record`: events of unmodified code into a `FlightRecorder`, around a
block (`with record(...) as rec:`) or a function (`g, rec = record(f)`).

In a block, the outermost `lax.scan`/`lax.while_loop` calls are
instrumented as `verbose` would (see `patching`); the numbers of the
block's top-level loops go on from one call to the next (`scan[0]`,
`while[1]`, ...). Where a compiled function's taps report is decided when
they run: to the open block (with several open, the innermost one of the
thread the event comes from, else the block that traced it); after the
blocks close, nowhere.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import weakref
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from .. import api, settings
from . import patching
from .collectors import FlightRecorder
from .delivery import Observer, Observers, guarding
from .events import TapEvent
from .lens_keys import lens_number
from .options import DEFAULTS, LensOptions
from .primitive_taps import PrimitiveTap
from .verbose import instrumented

# The open blocks, innermost last: replaced whole (under `_open_lock`), never
# changed in place, so that a host function reads it without the lock.
_open: Tuple["weakref.ref[_Block]", ...] = ()
_open_lock = threading.Lock()


def _both(first: Observer, second: Optional[Observer]) -> Observer:
  if second is None:
    return first

  guarded_first, guarded_second = guarding(first), guarding(second)

  def both(event: TapEvent) -> None:
    guarded_first(event)
    guarded_second(event)
  return both


def _recording(options: LensOptions, recorder: FlightRecorder) -> Observers:
  """The observers of `options` with `recorder` hearing every event as
  well (the scan outputs where `options.wants_ys`)."""
  return dataclasses.replace(
      options, on_step=_both(recorder, options.on_step),
      on_ys=_both(recorder, options.on_ys) if options.wants_ys else None,
  ).observers()


class _Block:
  """A `with record(...)` block: its options, its recorder, its
  observers."""

  def __init__(self, options: LensOptions,
               max_events: Optional[int]) -> None:
    self._options = options
    self._max_events = max_events
    self.observers: Optional[Observers] = None
    self.max_depth: Optional[int] = options.max_depth
    self.owner: Optional[int] = None
    self._numbers = itertools.count()
    self._entered = False
    # This thread's lens while the block is open: part of JAX's jit key.
    self._lens = settings.record_lens(lens_number(options.traced()))

  def __enter__(self) -> FlightRecorder:
    if self._entered:
      raise RuntimeError(
          "host_callback.loops.record: a block is not re-entrant: this one "
          "is already open; make a new record() for each with statement")
    self._entered = True
    recorder = FlightRecorder(self._max_events)
    self.observers = _recording(self._options, recorder)
    self.owner = threading.get_ident()
    global _open
    with _open_lock:
      _open = (*_open, weakref.ref(self, _forget))
      patching.install(_intercept)
    self._lens.__enter__()
    return recorder

  def __exit__(self, *exc_info: Any) -> None:
    if not self._entered:
      return  # never entered, or already closed
    self._entered = False
    try:
      if exc_info[0] is None:
        api.barrier_wait()  # the outfeed mode: deliver what ran in the block
    finally:
      self._lens.__exit__(None, None, None)
      _close(lambda block: block is self)

  def wants(self, kind: str) -> bool:
    return kind != "output" or self._options.wants_ys

  def instrument(self, run: Callable[..., Any]) -> Callable[..., Any]:
    return instrumented(run, _Router(self), self._options,
                        first_index=next(self._numbers))


def _close(closes: Callable[[_Block], bool]) -> None:
  """The blocks that `closes` accepts (and those dropped) are no longer
  open; lax is put back once none is."""
  global _open
  with _open_lock:
    _open = tuple(r for r in _open
                  if (block := r()) is not None and not closes(block))
    if not _open:
      patching.uninstall()


def _forget(ref: "weakref.ref[_Block]") -> None:
  """A block dropped without closing: no longer open."""
  _close(lambda block: False)


def _blocks() -> List[_Block]:
  return [b for b in (r() for r in _open) if b is not None]


def _receiver(traced_by: _Block) -> Optional[_Block]:
  """The open block an event goes to, when it is delivered."""
  opened = _open
  if len(opened) == 1:
    return opened[0]()
  blocks = _blocks()
  if len(blocks) <= 1:
    return blocks[0] if blocks else None
  here = threading.get_ident()
  owned = [b for b in blocks if b.owner == here]
  if owned:
    return owned[-1]
  return traced_by if traced_by in blocks else None


class _Router:
  """The sink of a block's taps: each event goes to the block open when it
  is delivered (see `_receiver`)."""

  def __init__(self, traced_by: _Block):
    self._traced_by = traced_by

  def observer(self, kind: str) -> Optional[Observer]:
    return self.deliver if self._traced_by.wants(kind) else None

  def _observers(self, event: TapEvent) -> Optional[Observers]:
    block = _receiver(self._traced_by)
    if block is None or block.observers is None:
      return None
    if (block.max_depth is not None
        and event.path.count("/") > block.max_depth
        and event.path.rsplit("/", 1)[-1].startswith(("scan[", "while["))):
      return None
    return block.observers

  def deliver(self, event: TapEvent) -> None:
    observers = self._observers(event)
    if observers is not None:
      observers.deliver(event)

  def deliver_primitive(self, event: TapEvent, spec: PrimitiveTap) -> None:
    observers = self._observers(event)
    if observers is not None:
      observers.deliver_primitive(event, spec)


def _intercept(run: Callable[..., Any], *operands: Any) -> Any:
  """A loop called in a block: instrumented for the block of this thread
  (the only one open, or this thread's innermost)."""
  blocks = _blocks()
  here = threading.get_ident()
  owned = [b for b in blocks if b.owner == here]
  block = owned[-1] if owned else (blocks[0] if len(blocks) == 1 else None)
  if block is None:
    return run(*operands)
  return block.instrument(run)(*operands)


def record(f: Optional[Callable[..., Any]] = None, *,
           select: Optional[Callable[..., Any]] = DEFAULTS.select,
           on_ys: Optional[Observer] = DEFAULTS.on_ys,
           select_ys: Optional[Callable[..., Any]] = DEFAULTS.select_ys,
           alert_ys: Optional[Callable[[TapEvent], Any]] = DEFAULTS.alert_ys,
           alert_ys_once: bool = DEFAULTS.alert_ys_once,
           ops: Sequence[str] = DEFAULTS.ops,
           sample_every: int = DEFAULTS.sample_every,
           where: Optional[Callable[[str], bool]] = DEFAULTS.where,
           max_depth: Optional[int] = DEFAULTS.max_depth,
           taps: Sequence[PrimitiveTap] = DEFAULTS.taps,
           on_step: Optional[Observer] = DEFAULTS.on_step,
           alert: Optional[Callable[[TapEvent], Any]] = DEFAULTS.alert,
           alert_once: bool = DEFAULTS.alert_once,
           max_events: Optional[int] = None,
           partitioned: bool = DEFAULTS.partitioned
           ) -> Union[Tuple[Callable[..., Any], FlightRecorder], _Block]:
  """Records the events of unmodified code in a `FlightRecorder`::

      with record(select=lambda leaves: leaves[0]) as rec:
        result = run(x)        # any code; its loops report
      rec.events               # [TapEvent(path='scan[0]', step=0, ...), ...]

      g, rec = record(f)       # or: around a function, as `verbose`

  The options are `verbose`'s; `on_step` (and `on_ys`) hear every event as
  well as the recorder. `max_events=N` keeps the last N events only
  (`rec.dropped` counts the others), for long runs. `partitioned=True`:
  under a sharded `jit`, each device reports its own shard (see
  `verbose`). A jitted function called in a block is traced for the
  block's lens, once per lens: a function compiled before the block, or
  in a block whose lens (`select`, `taps`, ...) differs, is compiled
  again; blocks whose options are equal (functions of the same code and
  captured values) share the compilation. The block waits for the taps of
  what ran in it (`barrier_wait`) when it closes.
  """
  options = LensOptions.of(locals())  # the arguments but f and max_events
  options.check()
  if f is None:
    return _Block(options, max_events)
  recorder = FlightRecorder(max_events)
  return (instrumented(f, _recording(options, recorder), options),
          recorder)


def emergency_restore() -> None:
  """Closes every `record` block and puts `jax.lax.scan` and
  `jax.lax.while_loop` back, e.g. after an interrupted session left a block
  open."""
  _close(lambda block: True)
