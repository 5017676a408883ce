"""The process-wide receiver: lazy start, stop, restart on next use, drain at exit."""

from __future__ import annotations

import atexit
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

  def receiver(self, make_transports: Callable[[], Mapping[str, TransportFactory]]
               ) -> Receiver:
    """The running receiver; if there is none, starts one with new transports."""
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
