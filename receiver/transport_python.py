"""The pure-Python transport: device threads put packets on Python queues."""

from __future__ import annotations

import threading
from typing import (Any, Callable, Dict, List, NamedTuple, Optional, Sequence,
                    Tuple)

import numpy as np

from .consumer_threads import consumer_thread
from .packets import (DirectRun, DirectRunError, DirectRunParts, Packet,
                      ReceiverStopped, Reply, device_error)
from .queues import PacketQueue
from .sites import SiteTable, site_key
from .transport import QueueStats, int_flags


class _Site(NamedTuple):
  consumer_id: int
  read_only: bool  # its host function asked for copy=False
  ints: Tuple[bool, ...]  # for each array, whether it comes as an int


def _owned(arrays: Sequence[np.ndarray], site: _Site) -> List[Any]:
  """Copies of the device's arrays, whose buffers may be reused once the
  callback returns; read-only for a host function that asked for
  copy=False; Python ints where the site says so."""
  copies = [int(a) if as_int else np.array(a, copy=True)
            for a, as_int in zip(arrays, site.ints)]
  if site.read_only:
    for copy in copies:
      if isinstance(copy, np.ndarray):
        copy.flags.writeable = False
  return copies


class PythonTransport:
  """Packets are enqueued by a Python function that the device calls.

  One exists per process, and its queues outlive receiver restarts. `send`
  and `request` run on the thread that executes the device computation
  (JAX's host-callback machinery calls them); the receiver's threads consume.
  As on the native transport, a request whose device queue allows it
  (`PacketQueue.claim_if_idle`) runs its host function on that thread
  instead: so a host function can run JAX code that calls the host again.
  The transport lock guards `_queues` and `_listener`.
  """

  name = "python"
  mark_count_finished = None  # a packet's bytes count in its queue's bound

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._queues: Dict[int, PacketQueue] = {}
    self.sites: SiteTable[_Site] = SiteTable()
    self._listener: Optional[Callable[[int], None]] = None
    self._max_bytes = 0
    self._attached = False
    self._restart: Optional[Callable[[], None]] = None
    self._direct: Optional[DirectRun] = None
    self._nested: Optional[Callable[[int], None]] = None
    self._guest: Optional[Callable[[int], None]] = None

  # --- Producer: what the lowering and the device use ---

  def open_device(self, device_id: int) -> None:
    self._queue(device_id)

  def register_site(self, consumer_id: int, dtypes: Sequence[np.dtype],
                    shapes: Sequence[Tuple[int, ...]], *, name: str = "",
                    copy: bool = True, packed_results: bool = False,
                    buffers: bool = False,
                    int_columns: Sequence[int] = ()) -> int:
    # The arrays arrive with theirs; JAX's callbacks copy a GPU's buffers.
    del name, packed_results, buffers
    key = site_key(consumer_id, dtypes, shapes)
    site = _Site(consumer_id, not copy,
                 int_flags(int_columns, key.dtypes, key.shapes))
    return self.sites.register(key, lambda site_id: site)

  def unregister_sites_of(self, consumer_ids: Sequence[int]) -> None:
    self.sites.unregister_consumers(consumer_ids)

  def _site(self, site: int) -> _Site:
    entry = self.sites.get(site)
    assert entry is not None, "a device sent for an unregistered site"
    return entry

  def send(self, device_id: int, site: int,
           arrays: Sequence[np.ndarray]) -> None:
    """Enqueues a tap packet; waits only while the device queue is full."""
    self._put(device_id, site, arrays, None)

  def request(self, device_id: int, site: int,
              arrays: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
    """Runs the host function here when the device's queue allows it, else
    enqueues a call packet and waits for the host's reply."""
    queue = self._queue(device_id)
    run = self._direct
    if run is not None and self._guest is not None and queue.packets_waiting:
      self._guest(device_id)  # then the request may run here
    if run is not None and queue.claim_if_idle():
      try:
        return self._run_direct(run, device_id, site, arrays)
      finally:
        queue.end_claim()
    reply = Reply()
    consume_nested = self._nested
    if consume_nested is not None and queue.consuming_on_this_thread():
      # A host function of this device runs JAX code: its consumer (this
      # thread) runs the queue up to the request, as it would have, first
      # what it took and has not run yet.
      self._put(device_id, site, arrays, reply)
      while not reply.done:
        consume_nested(device_id)
      return reply.wait(self._ensure_receiver)
    suspended = queue.suspend_claim()  # the consumer may answer
    try:
      self._put(device_id, site, arrays, reply)
      return reply.wait(self._ensure_receiver)
    finally:
      if suspended:
        queue.resume_claim()

  def _run_direct(self, run: DirectRun, device_id: int, site: int,
                  arrays: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
    """Runs a request's host function on this thread; raises what a device
    answered by the receiver would."""
    try:
      entry = self._site(site)
      with consumer_thread():
        result = run(entry.consumer_id, device_id, _owned(arrays, entry))
    except DirectRunError as failure:
      # Chained as a reply's error is (device_error sets any __cause__).
      raise device_error(failure.cause, failure.context)  # pylint: disable=raise-missing-from
    return result if result is not None else ()

  def _put(self, device_id: int, site: int, arrays: Sequence[np.ndarray],
           reply: Optional[Reply]) -> None:
    self._ensure_receiver()
    entry = self._site(site)
    packet = Packet(entry.consumer_id, device_id, _owned(arrays, entry),
                    reply)
    self._queue(device_id).put(packet, self._ensure_receiver)
    # A receiver that detached while we put may have missed this packet.
    self._ensure_receiver()

  def _ensure_receiver(self) -> None:
    """Starts a receiver if none is attached; raises if none can start."""
    if self._attached:
      return
    if self._restart is None:
      raise ReceiverStopped(
          "the host_callback receiver is stopped and cannot start again "
          "(the interpreter is exiting?)")
    self._restart()

  def _queue(self, device_id: int) -> PacketQueue:
    queue = self._queues.get(device_id)
    if queue is not None:
      return queue
    with self._lock:
      queue = self._queues.get(device_id)
      if queue is None:
        queue = self._queues[device_id] = PacketQueue(self._max_bytes)
        listener = self._listener
      else:
        listener = None
    if listener is not None:
      listener(device_id)
    return queue

  # --- Receiver lifecycle ---

  def set_restart_hook(self, restart: Callable[[], None]) -> None:
    self._restart = restart

  def clear_restart_hook(self) -> None:
    self._restart = None
    self._direct = None  # requests need a receiver, and fail without one
    self._nested = None
    self._guest = None
    self.wake_all()  # waiting senders give up

  def set_direct_runner(self, runner: DirectRunParts) -> None:
    self._direct = runner.run

  def close_direct_runs(self) -> None:
    pass  # its direct runs all go through `run`

  def set_nested_consumer(self, consume: Callable[[int], None]) -> None:
    self._nested = consume

  def set_guest_consumer(self, consume: Callable[[int], None]) -> None:
    self._guest = consume

  def attach(self, max_bytes: int, listener: Callable[[int], None]) -> None:
    with self._lock:
      self._max_bytes = max_bytes
      self._listener = listener
      queues = dict(self._queues)
    for device_id, queue in queues.items():
      queue.restart_statistics(max_bytes)
      listener(device_id)
    self._attached = True

  def detach(self) -> bool:
    self._attached = False
    with self._lock:
      self._listener = None
      queues = list(self._queues.values())
    return any(queue.packets_unread for queue in queues)

  def wake_all(self) -> None:
    with self._lock:
      queues = list(self._queues.values())
    for queue in queues:
      queue.wake()

  # --- Consumer: what the receiver's threads use ---

  def take_batch(self, device_id: int, timeout: float) -> List[Packet]:
    return self._queue(device_id).take_all(timeout)

  def mark_finished(self, device_id: int, packet: Packet) -> None:
    self._queue(device_id).mark_finished(packet)

  def release(self, device_id: int) -> None:
    del device_id  # mark_finished released each packet already

  def wait_finished(self, device_id: int, is_stopped: Callable[[], bool]) -> None:
    self._queue(device_id).wait_finished(is_stopped)

  def take_here(self, device_id: int) -> List[Packet]:
    packet = self._queue(device_id).take_as_guest()
    return [] if packet is None else [packet]

  def finish_here(self, device_id: int) -> None:
    self._queue(device_id).end_guest()

  def packets_sent(self, device_id: int) -> int:
    return self._queue(device_id).packets_sent

  def packets_waiting(self, device_id: int) -> int:
    return self._queue(device_id).packets_waiting

  def drained(self) -> bool:
    # Without the lock (an idle barrier's cost): the tuple is made at once.
    for queue in tuple(self._queues.values()):
      if not queue.drained():
        return False
    return True

  def drained_watch(self) -> Tuple[object, str, str, str]:
    """What `drained` reads, for barrier_wait's native idle check: (self,
    the queues' dict, each queue's enqueued and finished counts)."""
    return self, "_queues", "_enqueued", "_finished"

  def device_ids(self) -> List[int]:
    with self._lock:
      return list(self._queues)

  def stats(self, device_id: int) -> QueueStats:
    queue = self._queue(device_id)
    return QueueStats(queue.bytes_waiting, queue.packets_waiting,
                      queue.high_water_bytes, queue.max_bytes)
