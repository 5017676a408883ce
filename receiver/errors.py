"""Exceptions raised by host functions: logged at once, kept for the barrier."""

from __future__ import annotations

import logging
import threading
import traceback
from typing import Optional, Tuple

logger = logging.getLogger("host_callback")


class CallbackException(Exception):
  """Raised by `barrier_wait` when a host function raised since the last barrier."""


class ErrorLog:
  """Remembers the last exception raised by a host function.

  The lock guards `_last`; any thread may record, the barrier takes.
  """

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._last: Optional[Tuple[BaseException, str]] = None

  def record(self, error: BaseException) -> None:
    """Logs `error` with its traceback and keeps it for the next barrier."""
    formatted = "".join(traceback.format_exception(error))
    logger.error("Postponing exception raised in callback function: %s",
                 formatted)
    with self._lock:
      self._last = (error, formatted)

  def raise_if_any(self) -> None:
    """Raises `CallbackException` for the last recorded error, and forgets it."""
    with self._lock:
      last, self._last = self._last, None
    if last is not None:
      error, formatted = last
      # The message has the traceback: the chained cause goes without, so
      # that an uncaught CallbackException prints it once.
      raise CallbackException(
          "There were exceptions during callback processing. "
          f"Last one was: {formatted}") from error.with_traceback(None)
