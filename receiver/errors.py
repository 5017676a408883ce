"""Exceptions raised by host functions: kept for the barrier, logged at
once when no waiting computation fails with them, and shown with the host
function's own traceback (its frames, not the package's that called it)."""

from __future__ import annotations

import logging
import threading
import traceback
import types
from typing import Optional, Set, Tuple

from . import ctrl_c

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


def _depth(tb: Optional[types.TracebackType]) -> int:
  depth = 0
  while tb is not None:
    depth, tb = depth + 1, tb.tb_next
  return depth


def _drop_package_frames(formatted: Optional[traceback.TracebackException],
                         error: Optional[BaseException],
                         seen: Set[int]) -> None:
  """Drops the package's leading frames from `formatted` (`error`'s) and
  from the exceptions it chains, each where frames of its own remain."""
  if formatted is None or error is None or id(error) in seen:
    return
  seen.add(id(error))
  own = _host_frames(error.__traceback__)
  if own is not None:
    dropped = _depth(error.__traceback__) - _depth(own)
    formatted.stack = traceback.StackSummary.from_list(
        formatted.stack[dropped:])
  _drop_package_frames(formatted.__cause__, error.__cause__, seen)
  _drop_package_frames(formatted.__context__, error.__context__, seen)


def host_traceback(error: BaseException) -> str:
  """`error`'s traceback as Python prints it, with the exceptions it
  chains, each from the host function's own frame: without the package's
  frames that called it (kept where there are no others)."""
  formatted = traceback.TracebackException(type(error), error,
                                           error.__traceback__)
  _drop_package_frames(formatted, error, set())
  return "".join(formatted.format())


def host_function_error(error: BaseException) -> BaseException:
  """The exception the host function raised: `error`, or the cause that
  an error of ours names (a call's CallError)."""
  if names_its_cause(error) and error.__cause__ is not None:
    return error.__cause__
  return error


def with_host_traceback(line: str, error: BaseException) -> str:
  """`line` (which names the host function and `error`), then the host
  function's traceback, where it has frames of its own: what a computation
  that waited for the host function fails with, as `jax.pure_callback`'s
  does."""
  raised = host_function_error(error)
  if _host_frames(raised.__traceback__) is None:
    return line  # e.g. a call's result of the wrong shape
  return f"{line}\n{host_traceback(raised).rstrip()}"


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
    `ctrl_c`), and is no host function's failure.
    """
    if delivered and ctrl_c.stopped_by_ctrl_c(error):
      logger.debug("A host function was interrupted: %r", error)
      return
    formatted = host_traceback(error)
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

  def pending_watch(self) -> Tuple[object, str]:
    """Where `pending` reads, as (object, attribute): empty while no error
    is pending."""
    return self, "_last"

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
