"""How many host functions each device queue has run and runs now, and
the end of running them: once closed (the process ends after Ctrl-C at
exit), no host function begins."""

from __future__ import annotations

import dataclasses
import threading
from typing import Dict, Mapping, Tuple

# (transport name, device id)
QueueKey = Tuple[str, int]


@dataclasses.dataclass(frozen=True)
class Left:
  """A queue's host functions at the end: finished, still running, and
  sent but never begun."""
  ran: int
  running: int
  dropped: int


class QueueRuns:
  """The counts of one device queue. Its host functions run one at a time
  (the queue's claim: its consumer, a guest, or a direct run), or nested
  on one thread, so the counts take no lock: the GIL keeps each update
  whole. Every run that Python makes counts itself here, with `begin` (a
  queued packet's) or `begin_direct` (a request run on the device's
  thread, `Runtime.direct_runner`), then `end`; the native runner's own
  runs are counted in C++ (`Transport.own_direct_runs`) and added in
  `RunCounts.left`."""

  __slots__ = ("_counts", "ran", "running", "begun_queued", "refused")

  def __init__(self, counts: "RunCounts") -> None:
    self._counts = counts
    self.ran = 0
    self.running = 0
    self.begun_queued = 0  # of the queue's packets (direct runs are none)
    self.refused = 0  # direct runs that came once closed

  def begin(self) -> bool:
    """Counts a queued packet's host function that begins, unless closed:
    then it must not run, and False is returned."""
    if self._counts.closed:
      return False
    self.running += 1
    self.begun_queued += 1
    return True

  def begin_direct(self) -> bool:
    """Counts a direct run's host function that begins, unless closed:
    then it is refused (and counted so), and False is returned."""
    if self._counts.closed:
      self.refused += 1
      return False
    self.running += 1
    return True

  def end(self) -> None:
    """The host function that `begin` allowed has returned (or raised)."""
    self.running -= 1
    self.ran += 1


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

  def left(self, sent: Mapping[QueueKey, int],
           own: Mapping[QueueKey, Tuple[int, int, int]]
           ) -> Dict[QueueKey, Left]:
    """Each queue's counts, given how many packets each was `sent` and the
    (ran, running, queued) of the direct runs its transport counted
    itself (`Transport.own_direct_runs`); only the queues where something
    ran, runs or was dropped."""
    with self._lock:
      queues = dict(self._queues)
    left = {}
    for key in sorted(set(queues) | set(sent) | set(own)):
      runs = queues.get(key) or QueueRuns(self)
      own_ran, own_running, own_queued = own.get(key, (0, 0, 0))
      begun_queued = runs.begun_queued + own_queued
      counts = Left(runs.ran + own_ran, runs.running + own_running,
                    sent.get(key, 0) - begun_queued + runs.refused)
      if counts.ran or counts.running or counts.dropped:
        left[key] = counts
    return left
