"""The host side of the progress bars: tqdm bars that taps open, move and
close.

A `Loop` is one decorated loop body. Its taps come with the device that
sent them and a number: a *step* tap after step `i` (0 opens the bar; it
shows the `i + 1` steps completed when they are a multiple of the print
rate, so that a loop that ends early shows the steps it ran up to its last
update; the last step of a loop of known length, `ends_at_total`, ends the
loop; the device may send the steps in between too, which are dropped), and a
*final* tap after a loop of unknown length, with the steps done, which ends
it. Each bar has a key, `(bar id, device number)`; the device part is None
when the devices share one bar, whose value is then the slowest device's.

A loop whose body was traced inside another decorated body is nested in it
(`Tap.parent`): when it ends its bar stays on screen, to be reset by its next
run instead of opening a new row, and closes when a bar of the outer loop on
that device closes. A bar also closes when a host function's error stops its
device (`stop_listeners`), and a step 0 for a bar that is still running (a run
that stopped unseen) closes it and opens a fresh one. After a barrier every
loop it waited for has ended: the bars still open close then (a loop shorter
than its `n`, or stopped by an op that is not ours). A bar that closes before
its total says "ended early"; steps past the total of a loop of known length
open a bar that counts on, without a total ("past its total of n").

A bar draws into a row of `screen` (except notebook bars, which are
widgets). The first device to begin a run of a per-device loop on every
local device makes every device's bar, in device order, so that the rows
(or widgets) stand in that order; a screen row stays until the rows above
it have closed.

One lock (`_lock`) guards every bar; receiver threads of different devices
take it around each tap.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
from typing import Any, Dict, List, Optional, Set, Tuple

import jax
import numpy as np

from ..barrier import barrier
from ..host import screen
from ..host import stop_listeners
from ..host.device_numbers import device_number

Key = Tuple[Optional[int], Optional[int]]  # (bar id, device number)


@dataclasses.dataclass(eq=False)
class _Bar:
  """One tqdm bar, and the steps each device running its loop has done."""
  pbar: Any
  loop: Loop
  row: Optional[screen.Row]  # None for a notebook bar
  steps: Dict[int, int] = dataclasses.field(default_factory=dict)
  running: Set[int] = dataclasses.field(default_factory=set)
  closed: bool = False


_lock = threading.RLock()
_open: Set[_Bar] = set()  # the bars not closed yet
Made = Tuple[Any, Optional[screen.Row]]  # a tqdm bar, and its row if any
# The bars that the first device of a per-device loop's run made for the
# other devices, by (loop, position), until they begin: so that the bars
# (screen rows, or notebook widgets) stand in device order even when a
# device ends its loop before another began it.
_reserved: Dict[Tuple[Loop, int], Made] = {}


def _close(bar: _Bar) -> None:
  """Closes `bar`, then the bars nested in it on its devices."""
  if bar.closed:
    return
  bar.closed = True
  _open.discard(bar)
  if bar.pbar.total is not None and bar.pbar.n < bar.pbar.total:
    bar.pbar.set_postfix_str("ended early", refresh=False)
  bar.pbar.close()
  if bar.row is not None:
    bar.row.close()
  for number in bar.steps:
    for child in bar.loop.nested.pop(number, []):
      _close(child)


def _close_device(number: int) -> None:
  """What a failure on device `number` does: closes its bars."""
  with _lock:
    for bar in [bar for bar in _open if number in bar.steps]:
      _close(bar)


def _close_unfinished() -> None:
  """After a barrier: closes the bars still open, and removes those made
  for devices that never began."""
  with _lock:
    for bar in list(_open):
      _close(bar)
    for pbar, row in _reserved.values():
      pbar.leave = False  # nothing of it stays
      pbar.close()
      if row is not None:
        row.close()
    _reserved.clear()


stop_listeners.add_listener(_close_device)
barrier.after_each_wait(_close_unfinished,
                        idle_when_empty=((sys.modules[__name__], "_open"),
                                         (sys.modules[__name__], "_reserved")))


@dataclasses.dataclass(frozen=True)
class Tap:
  """The tap function of one `kind` of tap ("step" or "final") of a `Loop`,
  as traced: `devices` run the loop at once, each with its own taps (more
  than 1 under `pmap` or `shard_map`: each device's bar is on its own row,
  named by the device, unless they share one); `parent` is the loop whose
  body it was traced in, if any, `depth` how many loops are around it."""
  loop: Loop
  kind: str
  devices: int
  parent: Optional[Loop]
  depth: int

  def __call__(self, arg: Any, transforms: Any, *, device: Any) -> None:
    del transforms  # a batch is told apart by its arrays' shapes
    steps, ids = arg if isinstance(arg, tuple) else (arg, None)
    self.loop.on_tap(self, _steps_by_id(steps, ids), device)


def _steps_by_id(steps: np.ndarray, ids: Optional[np.ndarray]
                 ) -> Dict[Optional[int], int]:
  """The steps done, by bar id (None without ids): the most of a batch, as
  an int whatever the steps' dtype (a scan over float steps counts as
  jax-tqdm's does)."""
  if ids is None:
    return {None: int(steps.max()) if steps.ndim else int(steps)}
  result: Dict[Optional[int], int] = {}
  for step, bar_id in zip(*(a.ravel().tolist()
                            for a in np.broadcast_arrays(steps, ids))):
    result[bar_id] = max(int(step), result.get(bar_id, 0))
  return result


@functools.lru_cache(maxsize=None)
def _without_monitor(tqdm_class: Any) -> Any:
  """`tqdm_class` whose bars start no monitor thread. Taps redraw our bars;
  tqdm's monitor adds nothing, and it cannot start while the interpreter
  exits, when the outfeed mode's last taps may open bars: tqdm then prints a
  `TqdmMonitorWarning` over them. Callables that are not tqdm classes are
  kept as they are."""
  if not (isinstance(tqdm_class, type) and
          getattr(tqdm_class, "monitor_interval", 0)):
    return tqdm_class
  return type(tqdm_class.__name__, (tqdm_class,),
              {"monitor_interval": 0, "monitor": None,
               "__module__": tqdm_class.__module__,
               "__qualname__": tqdm_class.__qualname__})


class Loop:
  """The bars of one decorated loop: how to make them, and the open ones.

  Args:
    total: the loop's steps, or None when unknown (a `while_loop`).
    ends_at_total: whether the step tap of step `total - 1` ends the loop
      (else a final tap does).
    print_rate: the bar shows the steps that are its multiples.
    tqdm_class: called as `tqdm_class(total=, position=, desc=, **kwargs)`.
    on_screen: whether its bars draw into rows of `screen` (not widgets).
    desc: the bars' description (per-device bars add the device).
    position: the row of the first bar; bar ids, devices and nesting add.
    per_device: one bar per device under `pmap` and `shard_map`, or one for
      all.
    kwargs: more keyword arguments for `tqdm_class`.
  """

  def __init__(self, total: Optional[int], ends_at_total: bool,
               print_rate: int, tqdm_class: Any, on_screen: bool, desc: str,
               position: int, per_device: bool, kwargs: Dict[str, Any]):
    self.total = total
    self.ends_at_total = ends_at_total
    self.print_rate = print_rate
    self.tqdm_class = _without_monitor(tqdm_class)
    self.on_screen = on_screen
    self.desc = desc
    self.position = position
    self.per_device = per_device
    self.kwargs = kwargs
    self._bars: Dict[Key, _Bar] = {}
    if on_screen:
      screen.watch_stdout()
    # Device number -> ended bars of loops nested in this one, kept open.
    self.nested: Dict[int, List[_Bar]] = {}

  def shows(self, steps: Any) -> Any:
    """Whether the bar shows step `steps` (an int, or a traced integer):
    the first (the bar opens), one that completes a multiple of the print
    rate, or the last step of a loop of known length. The device skips the
    other steps where that is cheaper (`tqdm._Taps.step`); the host drops
    those that come."""
    shown = (steps == 0) | ((steps + 1) % self.print_rate == 0)
    if self.ends_at_total and self.total % self.print_rate:
      shown = shown | (steps == self.total - 1)
    return shown

  def on_tap(self, tap: Tap, steps_by_id: Dict[Optional[int], int],
             device: Any) -> None:
    """Opens, moves or closes the bars of a tap from `device`."""
    number = device_number(device)
    shared = 1 if self.per_device else tap.devices
    final = tap.kind == "final"
    with _lock:
      for bar_id, steps in steps_by_id.items():
        if not final and not self.shows(steps):
          continue  # as if skipped on the device: the same bars either way
        done = steps if final else steps + 1  # the steps completed
        key = (bar_id, None if shared > 1 else number)
        bar = self._bars.get(key)
        begins = steps == 0 and not final
        if bar is not None and number in bar.running and begins:
          _close(bar)  # its last run stopped unseen: a fresh bar
        if bar is None or bar.closed or number not in bar.running:
          past = self.total is not None and done > self.total
          if not begins and not final and not past:
            continue  # its step 0 went to a bar that has closed since
          bar = self._start(tap, key, bar, bar_id, device, shared, past)
        ends = final or (self.ends_at_total and done == self.total)
        if ends or done % self.print_rate == 0:
          self._advance(bar, number, done)
        if ends:
          self._end(tap, bar, number, shared)

  def _start(self, tap: Tap, key: Key, bar: Optional[_Bar],
             bar_id: Optional[int], device: Any, shared: int,
             past: bool) -> _Bar:
    """The bar of a loop that begins on `device`, or that runs `past` its
    total there: one that `shared` devices share, joined; a nested one,
    reset; or a fresh one."""
    number = device_number(device)
    if bar is not None and not bar.closed:
      if len(bar.steps) < shared:
        bar.steps[number] = 0
      elif tap.parent is not None:
        bar.pbar.reset(total=self.total)
        bar.steps = {number: 0}
      else:
        _close(bar)
    if bar is None or bar.closed:
      rows = tap.devices if self.per_device else 1
      pbar, row = self._new_tqdm(bar_id, device, tap.depth, rows, past)
      bar = _Bar(pbar, self, row, {number: 0})
      self._bars[key] = bar
      _open.add(bar)
    bar.running.add(number)
    return bar

  def _new_tqdm(self, bar_id: Optional[int], device: Any, depth: int,
                rows: int, past: bool) -> Made:
    """A tqdm bar and the screen row it draws into (None for a widget), on
    the device's row when `rows` devices have one each; `past`: one that
    counts the steps past the loop's total. The first device of a run on
    every local device makes the others' bars too, in device order."""
    local = (jax.local_devices(backend=device.platform) if rows > 1
             else [device])
    index = local.index(device)
    first = self.position + (bar_id or 0) + depth * len(local)
    if (rows == len(local) > 1 and not past
        and (self, first + index) not in _reserved):
      for k, other in enumerate(local):
        if (self, first + k) not in _reserved:
          _reserved[(self, first + k)] = self._make(other, first + k, True,
                                                    False)
    made = _reserved.pop((self, first + index), None)
    return made or self._make(device, first + index, rows > 1, past)

  def _make(self, device: Any, position: int, named: bool,
            past: bool) -> Made:
    """A bar at `position`, its description `named` by `device` or not."""
    desc = f"{device}: {self.desc}" if named else self.desc
    kwargs = dict(self.kwargs)
    if past:
      kwargs["postfix"] = f"past its total of {self.total}"
    row = None
    if self.on_screen:
      row = screen.add_row(kwargs.pop("file", None) or sys.stderr, position,
                           self)
      kwargs["file"] = row
      if "ncols" not in kwargs and not kwargs.get("dynamic_ncols"):
        kwargs["ncols"] = row.width()
    try:
      pbar = self.tqdm_class(total=None if past else self.total,
                             position=position, desc=desc, **kwargs)
    except BaseException:
      if row is not None:
        row.close()
      raise
    return pbar, row

  def _advance(self, bar: _Bar, number: int, steps: int) -> None:
    bar.steps[number] = steps
    shown = min(bar.steps.values())
    total = bar.pbar.total
    if total is not None and shown > total >= bar.pbar.n:
      bar.pbar.set_postfix_str(f"past its total of {total}", refresh=False)
    if shown > bar.pbar.n:
      bar.pbar.update(shown - bar.pbar.n)

  def _end(self, tap: Tap, bar: _Bar, number: int, shared: int) -> None:
    """Device `number` ended `bar`'s loop: when the last of the `shared`
    devices has, the bar closes, or, nested, waits for its outer loop."""
    bar.running.discard(number)
    if bar.running or len(bar.steps) < shared:
      return
    if tap.parent is None:
      _close(bar)
    elif bar not in tap.parent.nested.setdefault(number, []):
      tap.parent.nested[number].append(bar)
