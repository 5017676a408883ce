"""One consumer thread per device, running host functions in the device's order."""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import TYPE_CHECKING, Deque, Dict, List, Mapping, Tuple

from .native_library import native
from .packets import POLL_SECONDS, Packet
from .transport import QueueStats, Transport

if TYPE_CHECKING:
  from .runner import HostFunctionRunner

class _ConsumerThreads(threading.local):
  """Whether the calling thread runs host functions now: a barrier called
  from one of them would wait for itself, so the barrier checks this."""
  active = False  # each thread's default


consumer_threads = _ConsumerThreads()

# One lock per (transport, device) queue, held by the thread that consumes
# it: a thread of a new receiver waits until the old receiver's thread for
# the same queue has finished its batch, so a device never has two consumers
# and its packets stay in order. `_queue_locks_lock` guards the table.
_queue_locks: Dict[Tuple[str, int], threading.Lock] = {}
_queue_locks_lock = threading.Lock()


def _queue_lock(transport_name: str, device_id: int) -> threading.Lock:
  with _queue_locks_lock:
    return _queue_locks.setdefault((transport_name, device_id),
                                   threading.Lock())


def in_consumer_thread() -> bool:
  """True when called from inside a host function run by the receiver, or
  run directly by a device thread. The native runner marks its device
  threads itself (at no cost to each run); the others, `consumer_thread`."""
  return consumer_threads.active or (
      native is not None and native.runs_host_function_here())


class consumer_thread:  # pylint: disable=invalid-name
  """Marks the calling thread as running host functions meanwhile (a
  context manager; a class, as it runs for every direct host function)."""

  __slots__ = ("_previous",)

  def __enter__(self) -> None:
    self._previous = consumer_threads.active
    consumer_threads.active = True

  def __exit__(self, *exc_info: object) -> None:
    consumer_threads.active = self._previous


class Receiver:
  """Consumes the packets of every device queue of the given transports.

  Created running (attached to the transports); `stop` drains, then stops
  and joins the threads. `detach` then hands the queues back. `_lock`
  guards `_threads`.
  """

  def __init__(self, transports: Mapping[str, Transport], max_bytes: int,
               runner: "HostFunctionRunner") -> None:
    self._stopped = threading.Event()
    self._runner = runner
    self._runs = runner.runs
    self._lock = threading.Lock()
    self._threads: Dict[Tuple[str, int], threading.Thread] = {}
    # Per queue, the packets its consumer thread took and has not begun to
    # consume; only that thread touches its deque.
    self._taken: Dict[Tuple[str, int], Deque[Packet]] = (
        collections.defaultdict(collections.deque))
    self.transports = dict(transports)
    for transport in self.transports.values():
      transport.attach(max_bytes, lambda device_id, transport=transport:
                       self._start_thread(transport, device_id))

  def is_stopped(self) -> bool:
    return self._stopped.is_set()

  def _start_thread(self, transport: Transport, device_id: int) -> None:
    with self._lock:
      if (transport.name, device_id) in self._threads or self.is_stopped():
        return
      thread = threading.Thread(
          target=self._consume_loop, args=(transport, device_id),
          name=f"host_callback_{transport.name}_receiver_{device_id}",
          daemon=True)
      self._threads[(transport.name, device_id)] = thread
    thread.start()

  def _consume_loop(self, transport: Transport, device_id: int) -> None:
    consumer_threads.active = True
    lock = _queue_lock(transport.name, device_id)
    while not lock.acquire(timeout=POLL_SECONDS):
      if self.is_stopped():
        return
    taken = self._taken[(transport.name, device_id)]
    try:
      while not self.is_stopped():
        taken.extend(transport.take_batch(device_id, POLL_SECONDS))
        self._consume_taken(transport, device_id, taken)
      transport.release(device_id)
    finally:
      lock.release()

  def _consume_taken(self, transport: Transport, device_id: int,
                     taken: Deque[Packet]) -> None:
    runs = self._runs.of(transport.name, device_id)
    while taken:
      self._runner.run_taken(taken, runs, transport.mark_finished,
                             transport.mark_count_finished, device_id)
      if not taken:
        break
      packet = taken.popleft()  # what run_taken leaves to run_queued
      self._runner.run_queued(packet, runs)
      transport.mark_finished(device_id, packet)
      del packet  # a large packet's memory returns to its pool now

  def consume_nested(self, transport: Transport, device_id: int) -> None:
    """Called on a device's consumer thread, inside one of its host
    functions, whose JAX code made a request of the same device: consumes
    what the thread took and has not consumed yet, else the next batch, so
    that the request is served in the device's order."""
    taken = self._taken[(transport.name, device_id)]
    if not taken:
      taken.extend(transport.take_batch(device_id, POLL_SECONDS))
    self._consume_taken(transport, device_id, taken)

  def consume_here(self, limit: int) -> bool:
    """Consumes on the calling thread, in each device's order, up to
    `limit` packets waiting on queues that no consumer thread is busy with
    (`Transport.take_here`): a barrier that waits for them then costs no
    hand-off to those threads. Ctrl-C that stops a host function here is
    raised, not recorded. Returns whether it consumed any."""
    consumed = 0
    for transport in self.transports.values():
      for device_id in transport.device_ids():
        consumed += self.consume_device_here(transport, device_id,
                                             limit - consumed)
    return consumed > 0

  def consume_device_here(self, transport: Transport, device_id: int,
                          limit: int = sys.maxsize) -> int:
    """`consume_here` for one device's queue: returns how many it
    consumed. Also what a request that finds taps waiting before it runs
    (`Transport.set_guest_consumer`)."""
    consumed, taken = 0, True
    while (taken and consumed < limit and not self.is_stopped() and
           transport.packets_waiting(device_id)):
      runs = self._runs.of(transport.name, device_id)
      try:
        packets = transport.take_here(device_id)
        with consumer_thread():
          for packet in packets:
            self._runner.run_queued(packet, runs, raise_interrupt=True)
      finally:
        transport.finish_here(device_id)  # also when interrupted
      taken = bool(packets)
      consumed += len(packets)
    return consumed

  def wait_processed(self) -> None:
    """Waits until every packet sent so far has been consumed."""
    for transport in self.transports.values():
      for device_id in transport.device_ids():
        transport.wait_finished(device_id, self.is_stopped)

  def queue_stats(self) -> Dict[Tuple[str, int], QueueStats]:
    """Statistics of every device queue, by (transport name, device id)."""
    return {(name, device_id): transport.stats(device_id)
            for name, transport in self.transports.items()
            for device_id in transport.device_ids()}

  def stop(self, timeout: float = 60.0, drain: bool = True) -> None:
    """Drains every queue (unless not `drain`), then stops the consumer
    threads and joins them for at most `timeout` seconds in all.

    Packets sent after the drain stay queued for the next receiver.
    """
    if drain:
      self.wait_processed()
    self._stopped.set()
    for transport in self.transports.values():
      transport.wake_all()
    with self._lock:
      threads: List[threading.Thread] = list(self._threads.values())
    deadline = time.monotonic() + timeout
    for thread in threads:
      if thread is not threading.current_thread():
        thread.join(max(0.0, deadline - time.monotonic()))

  def detach(self) -> bool:
    """Hands the queues back; True if packets are left for the next receiver."""
    pending = [transport.detach() for transport in self.transports.values()]
    return any(pending)
