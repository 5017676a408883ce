"""A per-device packet queue bounded in bytes."""

from __future__ import annotations

import collections
import threading
from typing import Callable, Deque, List

from .packets import POLL_SECONDS, Packet


class PacketQueue:
  """FIFO of packets from one device, holding at most `max_bytes` waiting.

  A sender that finds the queue over its bound waits (backpressure); nothing is
  ever dropped. A packet larger than the bound is accepted when the queue is
  empty, so the bytes waiting never exceed the bound plus one packet.

  The queue's condition lock guards every field below it.
  """

  def __init__(self, max_bytes: int) -> None:
    self.max_bytes = max_bytes
    self._cond = threading.Condition()
    self._packets: Deque[Packet] = collections.deque()
    self._bytes = 0
    self.high_water_bytes = 0
    self._enqueued = 0   # packets ever put
    self._finished = 0   # packets whose consumer has returned

  def put(self, packet: Packet, ensure_consumer: Callable[[], None]) -> None:
    """Appends `packet`, first waiting while the queue is over its bound.

    While it waits, `ensure_consumer()` runs at every poll: it starts a
    consumer if there is none, or raises to give up.
    """
    size = packet.nbytes
    with self._cond:
      # Bytes count until consumed, so a batch being consumed still counts.
      while self._bytes and self._bytes + size > self.max_bytes:
        self._cond.wait(POLL_SECONDS)
        if self._bytes and self._bytes + size > self.max_bytes:
          self._cond.release()
          try:
            ensure_consumer()
          finally:
            self._cond.acquire()
      self._packets.append(packet)
      self._bytes += size
      self.high_water_bytes = max(self.high_water_bytes, self._bytes)
      self._enqueued += 1
      self._cond.notify_all()

  def take_all(self, timeout: float) -> List[Packet]:
    """Removes and returns every waiting packet, waiting up to `timeout`."""
    with self._cond:
      if not self._packets:
        self._cond.wait(timeout)
      batch = list(self._packets)
      self._packets.clear()
      return batch

  def mark_finished(self, packet: Packet) -> None:
    """Called by the consumer thread once a packet has been consumed."""
    with self._cond:
      self._bytes -= packet.nbytes
      self._finished += 1
      self._cond.notify_all()

  def wait_finished(self, is_stopped: Callable[[], bool]) -> None:
    """Waits until every packet put so far has been consumed."""
    with self._cond:
      target = self._enqueued
      while self._finished < target and not is_stopped():
        self._cond.wait(POLL_SECONDS)

  def restart_statistics(self, max_bytes: int) -> None:
    """A new receiver starts, with this bound."""
    with self._cond:
      self.max_bytes = max_bytes
      self.high_water_bytes = self._bytes

  @property
  def packets_sent(self) -> int:
    """Packets ever put."""
    with self._cond:
      return self._enqueued

  @property
  def packets_unread(self) -> int:
    """Packets put and not yet taken by a consumer."""
    with self._cond:
      return len(self._packets)

  @property
  def bytes_waiting(self) -> int:
    with self._cond:
      return self._bytes

  @property
  def packets_waiting(self) -> int:
    with self._cond:
      return self._enqueued - self._finished

  def wake(self) -> None:
    with self._cond:
      self._cond.notify_all()
