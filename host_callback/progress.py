"""The host side of the progress bars: tqdm bars that taps open, move and
close.

A `Loop` is one decorated loop body. Its taps say how many steps the loop
has done: a *step* tap when a step begins (0 opens the bar) and a *final*
tap when the loop ends, both with the device that sent them. Each bar has a
key, `(bar id, device number)`; the device part is None when the devices
share one bar, whose value is then the slowest device's.

Taps of one device arrive in the device's order, so each device keeps a
stack of its running bars: a bar that opens while another runs is nested in
it, and when it ends it stays on screen, to be reset by the outer loop's
next iteration instead of opening a new row; it closes with the outer bar.
A bar also closes when a host function's error stops its device
(`failures`), and a step 0 for a bar that is still running (a run that
stopped unseen) closes it and opens a fresh one.

One lock (`_lock`) guards every bar and stack; receiver threads of
different devices take it around each tap.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Dict, List, Optional, Tuple

import jax
import numpy as np

from . import failures
from .devices import device_number

Key = Tuple[Optional[int], Optional[int]]  # (bar id, device number)


@dataclasses.dataclass(eq=False)
class _Bar:
  """One tqdm bar, and the steps each device running its loop has done."""
  pbar: Any
  loop: Loop
  parent: Optional[_Bar]
  steps: Dict[int, int] = dataclasses.field(default_factory=dict)
  running: set = dataclasses.field(default_factory=set)  # device numbers
  children: List[_Bar] = dataclasses.field(default_factory=list)
  closed: bool = False


_lock = threading.RLock()
_stacks: Dict[int, List[_Bar]] = {}  # device number -> running bars, outer first


def _close(bar: _Bar) -> None:
  """Closes `bar` and the bars nested in it; forgets them as running."""
  if bar.closed:
    return
  for child in bar.children:
    _close(child)
  bar.closed = True
  bar.pbar.close()
  for device in bar.running:
    stack = _stacks.get(device, [])
    if bar in stack:
      stack.remove(bar)


def _close_device(number: int) -> None:
  """What a failure on device `number` does: closes its running bars."""
  with _lock:
    for bar in reversed(list(_stacks.get(number, []))):
      _close(bar)


failures.add_listener(_close_device)


@dataclasses.dataclass(frozen=True)
class Tap:
  """The tap function of one kind of tap of a `Loop`: `final` taps end the
  loop. `devices`: how many devices run the loop at once, each with its own
  taps (more than 1 under `pmap` or `shard_map`): each device's bar is on
  its own row, named by the device, unless they share one."""
  loop: Loop
  final: bool
  devices: int

  def __call__(self, arg: Any, transforms: Any, *, device: Any) -> None:
    del transforms  # a batch is told apart by its arrays' shapes
    steps, ids = arg if isinstance(arg, tuple) else (arg, None)
    self.loop.on_tap(_steps_by_id(steps, ids), device, final=self.final,
                     devices=self.devices)


def _steps_by_id(steps: np.ndarray, ids: Optional[np.ndarray]
                 ) -> Dict[Optional[int], int]:
  """The steps done, by bar id (None without ids): the most of a batch."""
  if ids is None:
    return {None: int(steps.max()) if steps.ndim else int(steps)}
  result: Dict[Optional[int], int] = {}
  for step, bar_id in zip(*(a.ravel().tolist()
                            for a in np.broadcast_arrays(steps, ids))):
    result[bar_id] = max(step, result.get(bar_id, 0))
  return result


class Loop:
  """The bars of one decorated loop: how to make them, and the running ones.

  Args:
    total: the loop's steps, or None when unknown (a `while_loop`).
    tqdm_class: called as `tqdm_class(total=, position=, desc=, **kwargs)`.
    desc: the bars' description (per-device bars add the device).
    position: the row of the first bar; bar ids, devices and nesting add.
    per_device: one bar per device under `pmap` and `shard_map`, or one for
      all.
    kwargs: more keyword arguments for `tqdm_class`.
  """

  def __init__(self, total: Optional[int], tqdm_class: Any, desc: str,
               position: int, per_device: bool, kwargs: Dict[str, Any]):
    self.total = total
    self.tqdm_class = tqdm_class
    self.desc = desc
    self.position = position
    self.per_device = per_device
    self.kwargs = kwargs
    self._bars: Dict[Key, _Bar] = {}

  def tap(self, *, final: bool, devices: int) -> Tap:
    return Tap(self, final, devices)

  def on_tap(self, steps_by_id: Dict[Optional[int], int], device: Any, *,
             final: bool, devices: int) -> None:
    """Opens, moves or closes the bars of a tap from `device`."""
    number = device_number(device)
    shared = devices if not self.per_device else 1
    with _lock:
      stack = _stacks.setdefault(number, [])
      for bar_id, steps in steps_by_id.items():
        key = (bar_id, None if shared > 1 else number)
        bar = self._bars.get(key)
        begins = steps == 0 and not final
        if bar is not None and number in bar.running and begins:
          _close(bar)  # its last run stopped unseen: a fresh bar
        if bar is None or bar.closed or number not in bar.running:
          if not begins and not final:
            continue  # its step 0 went to a bar that has closed since
          bar = self._start(key, bar, bar_id, device, stack,
                            rows=self.per_device and devices > 1,
                            shared=shared)
        self._advance(bar, number, steps)
        if final:
          self._finish(bar, number, stack, shared)

  def _start(self, key: Key, bar: Optional[_Bar], bar_id: Optional[int],
             device: Any, stack: List[_Bar], *, rows: bool,
             shared: int) -> _Bar:
    """The bar of a loop that begins on device `device`: a fresh one, or a
    nested one reset, or one that `shared` devices share, joined."""
    number = device_number(device)
    if bar is not None and not bar.closed:
      if len(bar.steps) < shared:  # join the devices that run it
        bar.steps[number] = 0
      elif bar.parent is not None and not bar.parent.closed:
        bar.pbar.reset(total=self.total)  # a nested loop's next run
        bar.steps = {number: 0}
      else:
        _close(bar)
    if bar is None or bar.closed or number not in bar.steps:
      outer = [other for other in stack if other.loop is not self]
      pbar = self._new_tqdm(bar_id, device, len(outer), rows)
      bar = _Bar(pbar, self, outer[-1] if outer else None, {number: 0})
      if bar.parent is not None:
        bar.parent.children.append(bar)
      self._bars[key] = bar
    bar.running.add(number)
    stack.append(bar)
    return bar

  def _new_tqdm(self, bar_id: Optional[int], device: Any, depth: int,
                rows: bool) -> Any:
    row, stride, desc = 0, 1, self.desc
    if rows:
      local = jax.local_devices(backend=device.platform)
      row, stride, desc = local.index(device), len(local), f"{device}: {desc}"
    position = self.position + (bar_id or 0) + row + depth * stride
    return self.tqdm_class(total=self.total, position=position, desc=desc,
                           **self.kwargs)

  def _advance(self, bar: _Bar, number: int, steps: int) -> None:
    bar.steps[number] = steps
    shown = min(bar.steps.values())
    if shown > bar.pbar.n:
      bar.pbar.update(shown - bar.pbar.n)

  def _finish(self, bar: _Bar, number: int, stack: List[_Bar],
              shared: int) -> None:
    """Device `number` ended `bar`'s loop: the last of the `shared` devices
    to end it closes it, unless it is nested in a bar still running."""
    bar.running.discard(number)
    if bar in stack:
      stack.remove(bar)
    if (not bar.running and len(bar.steps) >= shared and
        (bar.parent is None or bar.parent.closed)):
      _close(bar)
