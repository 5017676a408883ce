"""Exceptions raised by host functions: kept for the barrier, and logged at
once when no waiting computation fails with them."""

from __future__ import annotations

import logging
import threading
import traceback
import types
from typing import Optional, Tuple

from . import interrupts

logger = logging.getLogger("host_callback")

# The package whose modules' frames call host functions: `host_callback`
# (this module is `host_callback.receiver.errors`).
_PACKAGE = __name__.partition(".")[0]


def names_its_cause(error: BaseException) -> bool:
  """Whether `error` is one of the package's own, whose message names the
  host function and what went wrong ("host_callback.call: f raised ...");
  the exception the host function raised, if any, is its `__cause__`."""
  try:
    return str(error).startswith("host_callback")
  except Exception:  # pylint: disable=broad-except  (a broken __str__)
    return False


def _is_the_package(frame: types.TracebackType) -> bool:
  module = frame.tb_frame.f_globals.get("__name__", "")
  return module == _PACKAGE or module.startswith(_PACKAGE + ".")


def _host_frames(tb: Optional[types.TracebackType]
                 ) -> Optional[types.TracebackType]:
  """`tb` from its first frame that is not the package's: the host
  function's own frames, below the package's that called it; None when
  every frame is the package's."""
  while tb is not None and _is_the_package(tb):
    tb = tb.tb_next
  return tb


def host_traceback(error: BaseException) -> str:
  """`error`'s traceback as Python prints it (with the exceptions it
  chains), from the host function's own frame: without the package's
  frames that called it. Empty when it has no frame of its own (the
  package raised it, e.g. for a call's result of the wrong shape)."""
  frames = _host_frames(error.__traceback__)
  if frames is None:
    return ""
  return "".join(traceback.TracebackException(
      type(error), error, frames).format()).rstrip("\n")


def with_host_traceback(message: str, error: BaseException) -> str:
  """`message` (a line that names the host function and `error`), then
  `error`'s traceback from the host function's own frame, where it has
  one: what a computation that waited for the host function fails with,
  as `jax.pure_callback`'s does."""
  formatted = host_traceback(error)
  return f"{message}\n{formatted}" if formatted else message


def _barrier_traceback(error: BaseException) -> str:
  """The traceback that the barrier's message and the log show: that of
  the exception the host function raised (the cause an error of ours
  names), from its own frame; the whole of `error`'s when it has none."""
  raised = (error.__cause__ if names_its_cause(error) and
            error.__cause__ is not None else error)
  formatted = host_traceback(raised)
  return (f"{formatted}\n" if formatted else
          "".join(traceback.format_exception(error)))


class CallbackException(Exception):
  """Raised by `barrier_wait` when a host function raised since the last barrier."""


class ErrorLog:
  """Remembers the last exception raised by a host function.

  An error is *delivered* when it also failed a device computation that
  waited for the host function (a `call`, or a tap in the synchronous mode):
  its caller got it already. `raise_if_any` leaves delivered errors out when
  asked to, so that in the synchronous mode an error is raised once.

  The lock guards `_last`, `_last_undelivered`, `_any_delivered` and
  `_ever_delivered`; any thread may record, the barrier takes.
  """

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._last: Optional[Tuple[BaseException, str]] = None
    self._last_undelivered: Optional[Tuple[BaseException, str]] = None
    self._any_delivered = False
    self._ever_delivered = False

  def record(self, error: BaseException, *, delivered: bool = False) -> None:
    """Keeps `error` for the next barrier, and logs it with its traceback,
    at ERROR level when the barrier is its only report (else at DEBUG).

    `delivered`: the error also fails the device computation that waits for
    the host function (a request answered with it, or a direct run that
    raised it to the device). A delivered Ctrl-C on the main thread is not
    kept: it reaches that thread, which waits, as a KeyboardInterrupt (see
    `interrupts`), and is no host function's failure.
    """
    if delivered and interrupts.ctrl_c(error):
      logger.debug("A host function was interrupted: %r", error)
      return
    formatted = _barrier_traceback(error)
    if delivered:  # the computation that waits fails with it
      logger.debug("A host function raised: %s", formatted)
    else:
      logger.error("Postponing exception raised in callback function: %s",
                   formatted)
    with self._lock:
      self._last = (error, formatted)
      if delivered:
        self._any_delivered = self._ever_delivered = True
      else:
        self._last_undelivered = self._last

  def pending(self) -> bool:
    """Whether an error was recorded since the last `raise_if_any` (read
    without the lock: one reference)."""
    return self._last is not None

  def delivered_pending(self) -> bool:
    """Whether an error recorded since the last `raise_if_any` failed a
    device computation."""
    with self._lock:
      return self._any_delivered

  def ever_delivered(self) -> bool:
    """Whether an error recorded since the process started failed a device
    computation."""
    with self._lock:
      return self._ever_delivered

  def raise_if_any(self, *, include_delivered: bool = True) -> None:
    """Raises `CallbackException` for the last recorded error (the last one
    not delivered, unless `include_delivered`), and forgets them all."""
    with self._lock:
      last = self._last if include_delivered else self._last_undelivered
      self._last = self._last_undelivered = None
      self._any_delivered = False
    if last is not None:
      error, formatted = last
      # The message has the traceback: the chained cause goes without, so
      # that an uncaught CallbackException prints it once.
      raise CallbackException(
          "There were exceptions during callback processing. "
          f"Last one was: {formatted}") from error.with_traceback(None)
