"""The pure-Python transport: device threads put packets on Python queues."""

from __future__ import annotations

import threading
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from .packets import Packet, Reply
from .queues import PacketQueue
from .transport import QueueStats


class PythonTransport:
  """Packets are enqueued by a Python function that the device calls.

  `send` and `request` run on the thread that executes the device computation
  (JAX's host-callback machinery calls them); the receiver's threads consume.
  The transport lock guards `_queues` only.
  """

  name = "python"

  def __init__(self, max_bytes: int, is_stopped: Callable[[], bool]) -> None:
    self._max_bytes = max_bytes
    self._is_stopped = is_stopped
    self._lock = threading.Lock()
    self._queues: Dict[int, PacketQueue] = {}
    self._listener: Optional[Callable[[int], None]] = None

  def set_new_device_listener(self, listener: Callable[[int], None]) -> None:
    self._listener = listener

  def _queue(self, device_key: int) -> PacketQueue:
    queue = self._queues.get(device_key)
    if queue is not None:
      return queue
    with self._lock:
      queue = self._queues.get(device_key)
      if queue is None:
        queue = self._queues[device_key] = PacketQueue(self._max_bytes)
        if self._listener is not None:
          self._listener(device_key)
    return queue

  def send(self, device_key: int, consumer_id: int,
           arrays: Sequence[np.ndarray]) -> None:
    """Enqueues a tap packet; waits only while the device queue is full."""
    # The device's buffers may be reused once we return: keep our own copy.
    owned = [np.array(a, copy=True) for a in arrays]
    self._queue(device_key).put(Packet(consumer_id, device_key, owned),
                                self._is_stopped)

  def request(self, device_key: int, consumer_id: int,
              arrays: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
    """Enqueues a call packet and waits for the host's reply."""
    reply = Reply()
    owned = [np.array(a, copy=True) for a in arrays]
    self._queue(device_key).put(Packet(consumer_id, device_key, owned, reply),
                                self._is_stopped)
    return reply.wait(self._is_stopped)

  def take_batch(self, device_key: int, timeout: float) -> List[Packet]:
    return self._queue(device_key).take_all(timeout)

  def mark_finished(self, device_key: int, packet: Packet) -> None:
    self._queue(device_key).mark_finished(packet)

  def wait_finished(self, device_key: int, is_stopped: Callable[[], bool]) -> None:
    self._queue(device_key).wait_finished(is_stopped)

  def device_keys(self) -> List[int]:
    with self._lock:
      return list(self._queues)

  def stats(self, device_key: int) -> QueueStats:
    queue = self._queue(device_key)
    return QueueStats(queue.bytes_waiting, queue.packets_waiting,
                      queue.high_water_bytes, queue.max_bytes)

  def wake_all(self) -> None:
    with self._lock:
      queues = list(self._queues.values())
    for queue in queues:
      queue.wake()
