"""The process-wide receiver: lazy start, stop, restart on next use, drain at exit."""

from __future__ import annotations

import atexit
import os
import threading
from typing import Callable, Mapping, Optional

from .errors import ErrorLog
from .receiver import Receiver
from .registry import ConsumerRegistry
from .transport import TransportFactory


class Runtime:
  """Owns the consumer registry, the error log and the current receiver.

  The registry and the error log outlive receiver restarts. `_lock` guards
  `_receiver`.
  """

  def __init__(self, at_exit: Callable[[], None]) -> None:
    """`at_exit` runs at interpreter exit if a receiver was ever started."""
    self.registry = ConsumerRegistry()
    self.errors = ErrorLog()
    self._lock = threading.Lock()
    self._receiver: Optional[Receiver] = None
    self._at_exit = at_exit
    self._at_exit_registered = False
    self._forked_while_running = False
    os.register_at_fork(after_in_child=self._after_fork_in_child)

  def _after_fork_in_child(self) -> None:
    """A forked child has none of the parent's receiver threads."""
    self._lock = threading.Lock()
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

  def receiver(self, make_transports: Callable[[], Mapping[str, TransportFactory]]
               ) -> Receiver:
    """The running receiver; if there is none, starts one with new transports."""
    self.check_usable()
    receiver = self._receiver
    if receiver is not None:
      return receiver
    with self._lock:
      if self._receiver is None:
        self._receiver = Receiver(make_transports(), self.registry,
                                  self.errors)
        if not self._at_exit_registered:
          atexit.register(self._at_exit)
          self._at_exit_registered = True
      return self._receiver

  def running_receiver(self) -> Optional[Receiver]:
    return self._receiver

  def stop(self) -> None:
    """Drains and stops the receiver; the next `receiver()` starts a new one."""
    with self._lock:
      receiver, self._receiver = self._receiver, None
    if receiver is not None:
      receiver.stop()
