"""One consumer thread per device, running host functions in the device's order."""

from __future__ import annotations

import threading
from typing import Dict, List, Mapping, Tuple

from .errors import ErrorLog
from .packets import POLL_SECONDS, Packet
from .registry import ConsumerRegistry
from .transport import QueueStats, Transport, TransportFactory

# Threads that run consumers; a barrier called from one of them would wait for
# itself, so the barrier checks this.
_consumer_threads = threading.local()


def in_consumer_thread() -> bool:
  """True when called from inside a host function run by the receiver."""
  return getattr(_consumer_threads, "active", False)


class Receiver:
  """Starts a consumer thread for each (transport, device) that sends packets.

  Created running; `stop` drains and joins. `_lock` guards `_threads`.
  """

  def __init__(self, make_transports: Mapping[str, TransportFactory],
               registry: ConsumerRegistry, errors: ErrorLog) -> None:
    self._stopped = threading.Event()
    self._registry = registry
    self._errors = errors
    self._lock = threading.Lock()
    self._threads: Dict[Tuple[str, int], threading.Thread] = {}
    self.transports: Dict[str, Transport] = {}
    for name, make in make_transports.items():
      transport = self.transports[name] = make(self.is_stopped)
      transport.set_new_device_listener(
          lambda key, transport=transport: self._start_thread(transport, key))

  def is_stopped(self) -> bool:
    return self._stopped.is_set()

  def _start_thread(self, transport: Transport, device_key: int) -> None:
    with self._lock:
      if (transport.name, device_key) in self._threads or self.is_stopped():
        return
      thread = threading.Thread(
          target=self._consume_loop, args=(transport, device_key),
          name=f"host_callback_{transport.name}_receiver_{device_key}",
          daemon=True)
      self._threads[(transport.name, device_key)] = thread
    thread.start()

  def _consume_loop(self, transport: Transport, device_key: int) -> None:
    _consumer_threads.active = True
    while True:
      batch = transport.take_batch(device_key, POLL_SECONDS)
      for packet in batch:
        self._consume(packet)
        transport.mark_finished(device_key, packet)
      if not batch and self.is_stopped():
        return

  def _consume(self, packet: Packet) -> None:
    try:
      consumer = self._registry.get(packet.consumer_id)
      result = consumer(packet.arrays, packet.device_key)
    except BaseException as error:  # pylint: disable=broad-except
      self._errors.record(error)
      if packet.reply is not None:
        packet.reply.set_error(error)
      return
    if packet.reply is not None:
      packet.reply.set_result(result if result is not None else ())

  def wait_processed(self) -> None:
    """Waits until every packet sent so far has been consumed."""
    for transport in self.transports.values():
      for device_key in transport.device_keys():
        transport.wait_finished(device_key, self.is_stopped)

  def queue_stats(self) -> Dict[Tuple[str, int], QueueStats]:
    """Statistics of every device queue, by (transport name, device key)."""
    return {(name, key): transport.stats(key)
            for name, transport in self.transports.items()
            for key in transport.device_keys()}

  def stop(self, timeout: float = 60.0) -> None:
    """Drains every queue, then stops and joins the consumer threads."""
    self.wait_processed()
    self._stopped.set()
    for transport in self.transports.values():
      transport.wake_all()
    with self._lock:
      threads: List[threading.Thread] = list(self._threads.values())
    for thread in threads:
      if thread is not threading.current_thread():
        thread.join(timeout)
