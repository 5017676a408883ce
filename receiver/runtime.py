"""The process-wide receiver: lazy start, stop, restart on next use, drain at exit."""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
from typing import (Callable, Deque, Dict, List, Mapping, Optional, Sequence,
                    Tuple)

import numpy as np

from .errors import ErrorLog
from .receiver import Receiver, consumer_thread
from .packets import DirectRunError
from .registry import ConsumerRegistry
from .transport import Transport

logger = logging.getLogger("host_callback")


class Runtime:
  """Owns the consumer registry, the error log, the transports and the
  current receiver.

  The registry, the error log and the transports (with their device queues)
  outlive receiver restarts. A device that sends while no receiver runs
  starts one. `_lock` guards `_receiver` and `_transports`; `_stop_lock`
  makes stops one at a time. Neither is held while host functions run.
  """

  def __init__(self, make_transports: Callable[[], Mapping[str, Transport]],
               max_bytes: Callable[[], int], at_exit: Callable[[], None]) -> None:
    """`at_exit` runs at interpreter exit if a receiver was ever started."""
    self.registry = ConsumerRegistry()
    self.errors = ErrorLog()
    # (consumer ids, (transport name, site) pairs) no executable uses any more.
    self._retired: Deque[Tuple[Sequence[int], Sequence[Tuple[str, int]]]] = (
        collections.deque())
    self._make_transports = make_transports
    self._max_bytes = max_bytes
    self._lock = threading.RLock()
    self._stop_lock = threading.Lock()
    self._transports: Optional[Dict[str, Transport]] = None
    self._receiver: Optional[Receiver] = None
    self._at_exit = at_exit
    self._at_exit_registered = False
    self._forked_while_running = False
    os.register_at_fork(after_in_child=self._after_fork_in_child)

  def _after_fork_in_child(self) -> None:
    """A forked child has none of the parent's receiver threads."""
    self._lock = threading.RLock()
    self._stop_lock = threading.Lock()
    if self._receiver is not None:
      self._receiver = None
      self._forked_while_running = True

  def check_usable(self) -> None:
    """Raises in a child forked while the parent's receiver was running."""
    if self._forked_while_running:
      raise RuntimeError(
          "host_callback cannot be used in a process created by os.fork() "
          "after the host_callback receiver had started in its parent: the "
          "receiver threads do not survive a fork. Start worker processes "
          "with multiprocessing's 'spawn' or 'forkserver' start method.")

  def transports(self) -> Dict[str, Transport]:
    """The transports, created once; their restart hooks start a receiver."""
    transports = self._transports
    if transports is not None:
      return transports
    with self._lock:
      if self._transports is None:
        transports = dict(self._make_transports())
        for transport in transports.values():
          transport.set_restart_hook(self.receiver)
          if hasattr(transport, "set_direct_runner"):
            transport.set_direct_runner(self.run_direct)
          if hasattr(transport, "set_nested_consumer"):
            transport.set_nested_consumer(
                lambda device_id, transport=transport:
                self.receiver().consume_nested(transport, device_id))
        self._transports = transports
      return self._transports

  def receiver(self) -> Receiver:
    """The current receiver (perhaps stopping); starts one if there is none."""
    self.check_usable()
    receiver = self._receiver
    if receiver is not None:
      return receiver
    transports = self.transports()
    with self._lock:
      if self._receiver is None:
        max_bytes = self._max_bytes()
        self._receiver = Receiver(transports, max_bytes, self.registry,
                                  self.errors)
        logger.debug("host_callback: receiver started (transports %s; at "
                      "most %d bytes waiting per device)",
                      ", ".join(transports), max_bytes)
        if not self._at_exit_registered:
          atexit.register(self._at_exit)
          self._at_exit_registered = True
      return self._receiver

  def run_direct(self, consumer_id: int, device_id: int,
                 arrays: List[np.ndarray]) -> Optional[Sequence[np.ndarray]]:
    """Runs a consumer on the calling device thread, as its receiver thread
    would: an error is recorded, then raised as `DirectRunError`."""
    with consumer_thread():
      try:
        return self.registry.get(consumer_id)(arrays, device_id)
      except BaseException as error:  # pylint: disable=broad-except
        self.errors.record(error)
        raise DirectRunError(error, self.registry.context(consumer_id)) from error

  def retire(self, consumer_ids: Sequence[int],
             sites: Sequence[Tuple[str, int]]) -> None:
    """Consumers and sites that no executable can send to any more; they are
    released by `release_retired` once their packets are consumed. Safe to
    call from a finalizer, on any thread: it only appends."""
    self._retired.append((consumer_ids, sites))

  def release_retired(self) -> None:
    """Releases the retired consumers and sites if no queue has a packet
    waiting: packets for them were all sent before they were retired."""
    transports = self._transports
    if not self._retired or transports is None:
      return
    if any(transport.stats(device_id).packets_waiting
           for transport in transports.values()
           for device_id in transport.device_ids()):
      return
    while self._retired:
      consumer_ids, sites = self._retired.popleft()
      self.registry.remove(consumer_ids)
      for name, site in sites:
        transports[name].unregister_site(site)

  def running_receiver(self) -> Optional[Receiver]:
    return self._receiver

  def stop(self) -> None:
    """Drains and stops the receiver. Packets sent meanwhile stay queued, and
    a new receiver starts at once for them, or when a device next sends."""
    with self._stop_lock:
      receiver = self._receiver
      if receiver is None:
        return
      receiver.stop()
      _log_stopped(receiver)
      with self._lock:
        self._receiver = None
        pending = receiver.detach()
      if pending:
        self.receiver()

  def shut_down(self) -> None:
    """At exit: stops for good; a device that sends from now on fails."""
    if self._transports is not None:
      for transport in self._transports.values():
        transport.clear_restart_hook()
    with self._stop_lock:
      receiver, self._receiver = self._receiver, None
      if receiver is not None:
        receiver.stop()
        _log_stopped(receiver)
        receiver.detach()


def _log_stopped(receiver: Receiver) -> None:
  """Logs a stop, with each queue's high-water mark."""
  if not logger.isEnabledFor(logging.DEBUG):
    return  # skips reading every queue's statistics
  logger.debug("host_callback: receiver stopped")
  for (name, device_id), stats in sorted(receiver.queue_stats().items()):
    logger.debug("host_callback: %s queue of device %d: high water %d of %d "
                 "bytes", name, device_id, stats.high_water_bytes,
                 stats.max_bytes)
