"""A per-device packet queue bounded in bytes, and the claim that lets a
device thread, or a thread that waits for the queue to drain, run the
device's host functions itself."""

from __future__ import annotations

import collections
import threading
from typing import Callable, Deque, List, Optional

from .packets import POLL_SECONDS, Packet

# How long a consumer woken for taps on an empty queue waits before it takes
# them, as the native one does (device_queue.cc:kGuestGrace).
GUEST_GRACE_SECONDS = 200e-6


class PacketQueue:
  """FIFO of packets from one device, holding at most `max_bytes` waiting.

  A sender that finds the queue over its bound waits (backpressure); nothing is
  ever dropped. A packet larger than the bound is accepted when the queue is
  empty, so the bytes waiting never exceed the bound plus one packet (unless
  the consumer itself sends: it cannot wait for itself).

  As the native hub does, a device thread may run a request's host function
  itself instead of queuing it (`claim_if_idle`) when every packet put has
  been consumed. Meanwhile the consumer takes nothing, so the device's host
  functions still run one at a time and in order; a direct run that waits
  for the consumer (a nested request that had to queue) lets it take
  meanwhile (`suspend_claim`). A host function that the consumer runs may
  make the consumer take again (nested, `take_all`). A thread that waits
  for the queue to drain (a barrier) may likewise take the next packet and
  consume it itself (`take_as_guest`) when no consumer holds packets.
  These claims follow one protocol on both transports, written down once:
  "The queue protocol" in docs/architecture.md.

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
    self._taken = 0      # packets taken and not yet finished
    self._consumer: Optional[int] = None  # the thread that took them
    # The claim (a direct run's or a guest's) nests `_claim_depth` deep in
    # the thread `_claim_owner`; the consumer takes nothing while
    # `_claim_active` (false while the owner suspends it).
    self._claim_depth = 0
    self._claim_owner: Optional[int] = None
    self._claim_active = False
    # A guest's (take_as_guest) packet, not yet finished: it holds the claim.
    self._guest_packet: Optional[Packet] = None

  def put(self, packet: Packet, ensure_consumer: Callable[[], None]) -> None:
    """Appends `packet`, first waiting while the queue is over its bound.

    While it waits, `ensure_consumer()` runs at every poll: it starts a
    consumer if there is none, or raises to give up. A direct run that
    waits lets the consumer take meanwhile.
    """
    size = packet.nbytes
    me = threading.get_ident()
    with self._cond:
      if not self._is_full(size) or self._consuming_in(me):
        self._append(packet, size)
        return
      suspended = self._suspend(me)
      try:
        self._wait_for_room(size, ensure_consumer)
        self._append(packet, size)
      finally:
        if suspended:
          self._resume()

  def _is_full(self, size: int) -> bool:
    return bool(self._bytes) and self._bytes + size > self.max_bytes

  def _wait_for_room(self, size: int, ensure_consumer: Callable[[], None]
                     ) -> None:
    while self._is_full(size):
      self._cond.wait(POLL_SECONDS)
      if self._is_full(size):
        self._cond.release()
        try:
          ensure_consumer()
        finally:
          self._cond.acquire()

  def _append(self, packet: Packet, size: int) -> None:
    self._packets.append(packet)
    self._bytes += size
    self.high_water_bytes = max(self.high_water_bytes, self._bytes)
    self._enqueued += 1
    self._cond.notify_all()

  def take_all(self, timeout: float) -> List[Packet]:
    """Removes and returns every waiting packet, waiting up to `timeout`.

    The caller is the queue's consumer until it has finished them all.
    """
    me = threading.get_ident()
    with self._cond:
      if not self._takeable(me):
        self._cond.wait(timeout)
        if self._takeable(me) and all(p.reply is None for p in self._packets):
          # Woken for taps: a barrier that waits for them may run them on
          # its own thread (take_as_guest) sooner than this one could.
          self._cond.wait(GUEST_GRACE_SECONDS)
      if not self._takeable(me):
        return []
      batch = list(self._packets)
      self._packets.clear()
      self._taken += len(batch)
      self._consumer = me
      return batch

  def _takeable(self, thread: int) -> bool:
    # A direct run that resumes waits until the consumer, which may take
    # again inside a host function, has finished what it took.
    return bool(self._packets) and (not self._claim_active or
                                    self._consuming_in(thread))

  def mark_finished(self, packet: Packet) -> None:
    """Called by the consumer thread once a packet has been consumed."""
    with self._cond:
      self._bytes -= packet.nbytes
      self._finished += 1
      self._taken -= 1
      self._cond.notify_all()

  def consuming_on_this_thread(self) -> bool:
    """Whether the calling thread is the consumer, inside a host function
    of this device: it alone can consume what it requests."""
    with self._cond:
      return self._consuming_in(threading.get_ident())

  def _consuming_in(self, thread: int) -> bool:
    return bool(self._taken) and self._consumer == thread

  # --- Claims: direct runs, suspensions and guests ---
  # The protocol, its states and its names are the native queue's too: see
  # "The queue protocol" in docs/architecture.md.

  def claim_if_idle(self) -> bool:
    """Whether the calling thread may run a request's host function now
    (a direct run), claiming the queue, or deepening its own claim.

    It may when every packet put has been consumed and no other thread
    holds the claim; then the consumer takes nothing until `end_claim`.
    """
    me = threading.get_ident()
    with self._cond:
      if self._claim_depth and self._claim_owner != me:
        return False
      if self._enqueued != self._finished:
        return False  # queued packets come first
      self._claim()
      return True

  def end_claim(self) -> None:
    """Ends one level of the calling thread's claim; the last one releases
    the queue. Does nothing on a thread that holds no claim."""
    with self._cond:
      if not self._holds_claim(threading.get_ident()):
        return
      self._claim_depth -= 1
      if not self._claim_depth:
        self._release_claim()

  def suspend_claim(self) -> bool:
    """Lets the consumer take while the calling thread, which holds the
    claim, waits for it; returns whether to `resume_claim`."""
    with self._cond:
      return self._suspend(threading.get_ident())

  def resume_claim(self) -> None:
    """Claims the queue back once the consumer finished what it took."""
    with self._cond:
      self._resume()

  def take_as_guest(self) -> Optional[Packet]:
    """The next waiting packet, for the calling thread (one that waits for
    the queue to drain) to consume, when no consumer holds packets and no
    thread holds the claim; the queue is then claimed as by
    `claim_if_idle` until `end_guest`."""
    with self._cond:
      if self._claim_depth or self._taken or not self._packets:
        return None
      self._claim()
      self._guest_packet = self._packets.popleft()
      return self._guest_packet

  def end_guest(self) -> None:
    """The guest's packet is finished (consumed, or given up when
    interrupted): releases it, and the claim. Does nothing on a thread
    that holds no guest's claim."""
    with self._cond:
      packet = self._guest_packet
      if packet is None or not self._holds_claim(threading.get_ident()):
        return
      self._guest_packet = None
      self._bytes -= packet.nbytes
      self._finished += 1
      self._release_claim()

  def _holds_claim(self, thread: int) -> bool:
    return bool(self._claim_depth) and self._claim_owner == thread

  def _claim(self) -> None:
    """The calling thread claims the queue, or deepens its claim."""
    if not self._claim_depth:
      self._claim_owner = threading.get_ident()
    self._claim_depth += 1
    self._claim_active = True

  def _release_claim(self) -> None:
    """The last level of the claim ends: the consumer takes again."""
    self._claim_depth = 0
    self._claim_owner = None
    self._claim_active = False
    self._cond.notify_all()

  def _suspend(self, thread: int) -> bool:
    if not self._claim_active or not self._holds_claim(thread):
      return False
    self._claim_active = False
    self._cond.notify_all()
    return True

  def _resume(self) -> None:
    self._claim_active = True  # the consumer takes nothing new
    # A thread never waits for packets it took itself.
    while self._taken and not self._consuming_in(threading.get_ident()):
      self._cond.wait(POLL_SECONDS)

  # --- Statistics and waits ---

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

  def drained(self) -> bool:
    """Whether every packet enqueued has finished, read without the lock
    (an idle barrier's cost): the count finished first, so that a packet
    enqueued meanwhile counts as waiting."""
    finished = self._finished
    return self._enqueued == finished

  def wake(self) -> None:
    with self._cond:
      self._cond.notify_all()
