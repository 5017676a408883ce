"""How many host functions each device queue has run and runs now, and
the end of running them: once closed (the process ends after Ctrl-C at
exit), no host function begins."""

from __future__ import annotations

import array
import dataclasses
import threading
from typing import Callable, Dict, Mapping, Tuple

# (transport name, device id)
QueueKey = Tuple[str, int]


@dataclasses.dataclass(frozen=True)
class Left:
  """A queue's host functions at the end: finished, still running, and
  sent but never begun."""
  ran: int
  running: int
  dropped: int


# The slots of a queue's counts (`QueueRuns.slots`, int64 each): how many
# host functions ran, run now, were queued packets that began, and were
# refused once closed. The native runner (`native/python_runner.cc:
# CallConsumer`) counts the runs it makes in the same slots of the native
# transport's queues (the layout `native/python_runner.h:RunSlot`;
# `tests/test_run_counts.py` checks that both say the same).
RAN, RUNNING, BEGUN_QUEUED, REFUSED = range(4)
SLOTS = 4


class QueueRuns:
  """The counts of one device queue: one store for every route that runs
  its host functions. They run one at a time (the queue's claim: its
  consumer, a guest, or a direct run), or nested on one thread, so the
  counts take no lock: the GIL keeps each update whole. A Python route
  counts a run with `begin` (a queued packet's) or `begin_direct` (a
  request run on the device's thread, `HostFunctionRunner.direct_parts`), then
  `end`; the native runner updates `slots` itself
  (`DirectRunParts.run_slots`)."""

  __slots__ = ("_counts", "slots")

  def __init__(self, counts: "RunCounts") -> None:
    self._counts = counts
    self.slots = array.array("q", bytes(8 * SLOTS))

  def begin(self) -> bool:
    """Counts a queued packet's host function that begins, unless closed:
    then it must not run, and False is returned."""
    if self._counts.closed:
      return False
    slots = self.slots
    slots[RUNNING] += 1
    slots[BEGUN_QUEUED] += 1
    return True

  def begin_direct(self) -> bool:
    """Counts a direct run's host function that begins, unless closed:
    then it is refused (and counted so), and False is returned."""
    if self._counts.closed:
      self.slots[REFUSED] += 1
      return False
    self.slots[RUNNING] += 1
    return True

  def end(self) -> None:
    """The host function that `begin` allowed has returned (or raised)."""
    slots = self.slots
    slots[RUNNING] -= 1
    slots[RAN] += 1

  def left(self, sent: int) -> Left:
    """The counts at the end, for a queue that was `sent` packets."""
    slots = self.slots
    return Left(slots[RAN], slots[RUNNING],
                sent - slots[BEGUN_QUEUED] + slots[REFUSED])


class RunCounts:
  """The `QueueRuns` of every queue, created at first use; `_lock` guards
  the table."""

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._queues: Dict[QueueKey, QueueRuns] = {}
    self.closed = False

  def of(self, name: str, device_id: int) -> QueueRuns:
    """The counts of the queue of transport `name` for a device."""
    key = (name, device_id)
    runs = self._queues.get(key)
    if runs is None:
      with self._lock:
        runs = self._queues.setdefault(key, QueueRuns(self))
    return runs

  def close(self) -> None:
    """From now on no host function begins."""
    self.closed = True

  def slots_of(self, name: str) -> Callable[[int], "array.array[int]"]:
    """`slots_of(name)(device_id)`: the slots of that queue, which a
    transport's native runner updates itself."""
    return lambda device_id: self.of(name, device_id).slots

  def left(self, sent: Mapping[QueueKey, int]) -> Dict[QueueKey, Left]:
    """Each queue's counts, given how many packets each was `sent`; only
    the queues where something ran, runs or was dropped."""
    with self._lock:
      queues = dict(self._queues)
    left = {}
    for key in sorted(set(queues) | set(sent)):
      runs = queues.get(key) or QueueRuns(self)
      counts = runs.left(sent.get(key, 0))
      if counts.ran or counts.running or counts.dropped:
        left[key] = counts
    return left
