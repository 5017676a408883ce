"""What a Ctrl-C means, at each point where host_callback meets one.

Ctrl-C is a SIGINT, which Python raises as KeyboardInterrupt on the main
thread. This module is the one place that decides what it means:

- In a host function (`stopped_by_ctrl_c`): a KeyboardInterrupt raised by
  Ctrl-C on the main thread is no host function's error; one that a host
  function raises itself (a `raise` statement), or any on another thread,
  is that function's error, as any exception.
- While a device waits for the host on the main thread (a `call` or a
  synchronous tap: a host function run there, the wait for its reply, the
  wait for room in a full queue): Ctrl-C cancels that computation. It fails
  with a message that begins with `CANCELLED` (native:
  `native/interrupts.h:Interrupts::Cancel`; Python: `rearming_interrupt`),
  and Ctrl-C is re-armed, so that Python raises KeyboardInterrupt at the
  caller's next line. Python has consumed the signal by then: the native
  transport re-arms it from C++ once the callback's Python code has
  returned; the Python transport's callbacks are called by JAX, which
  turns any exception into its own error, so the exception that leaves the
  callback carries a guard that re-arms Ctrl-C when JAX frees it.
- In `barrier_wait` (`cancelled_by_ctrl_c`): a marker computation that such
  a Ctrl-C cancelled is raised as KeyboardInterrupt.
- Printed at the end of the program (`install_excepthook`): a computation
  cancelled by Ctrl-C that nothing caught is reported as the
  KeyboardInterrupt it was, without the computation's error before it and
  with the program's frames only; where JAX raised that
  error straight from its C++ dispatch, with no Python code between it and
  the end of the program, the re-armed Ctrl-C is taken back before Python
  prints (which it would interrupt half-way), and the process ends as
  Ctrl-C ends one (`end_as_ctrl_c_would`). A re-armed Ctrl-C that trips
  where Python drops exceptions (an audit hook, a garbage collection
  callback) is re-armed again (`_install_unraisable_rearm`).
- At exit (`program_ended_by_ctrl_c`): the exit after Ctrl-C runs no host
  function and waits for none (receiver/abandon.py).
"""

from __future__ import annotations

import _thread
import dis
import functools
import os
import signal
import sys
import threading
import types
import weakref
from typing import Any, Callable, Optional, Sequence, Tuple

from .native_library import native

_SIGINT = int(signal.SIGINT)
_RAISE_VARARGS = dis.opmap["RAISE_VARARGS"]

# How the message of a computation that Ctrl-C cancelled begins, on every
# path (the native module's CTRL_C_CANCELLED, native/interrupts.h).
CANCELLED = "host_callback: Ctrl-C cancelled this computation"


class _State:
  """Computations cancelled on the Python transport; whether the program's
  end was such a cancellation, reported as Ctrl-C."""
  python_cancellations = 0
  ended_by_cancellation = False


class _RearmWhenFreed(weakref.ref):
  """A weak reference whose callback, `_thread.interrupt_main(reference)`,
  re-arms Ctrl-C: the callback gets the reference itself, which reads as
  SIGINT through `__index__` (which runs before the trip). The callback is
  C code: after the trip no Python code runs on the way out of the
  deallocation, so the interrupt waits for the next Python code that the
  main thread runs."""

  def __index__(self) -> int:
    return _SIGINT


class _InterruptGuard:
  """Re-arms Ctrl-C for the main thread when freed (see _RearmWhenFreed)."""

  __slots__ = ("_rearm", "__weakref__")

  def __init__(self) -> None:
    # Freed after the weak reference's callback has run (a dying object's
    # weak references are cleared before its slots).
    self._rearm = _RearmWhenFreed(self, _thread.interrupt_main)


def _raised_by_a_statement(error: BaseException) -> bool:
  """Whether `error` was raised by a `raise` statement. Python raises the
  KeyboardInterrupt of a SIGINT at whatever instruction of the main thread
  next checks for signals (a call, a loop's jump; or in C, with no
  traceback), never at a `raise`; a re-raised one keeps its first place."""
  traceback = error.__traceback__
  if traceback is None:
    return False
  while traceback.tb_next is not None:
    traceback = traceback.tb_next
  code = traceback.tb_frame.f_code.co_code
  return code[traceback.tb_lasti] == _RAISE_VARARGS


def stopped_by_ctrl_c(error: BaseException) -> bool:
  """Whether `error`, raised on this thread, is (or is a host function's
  failure caused by) a KeyboardInterrupt of Ctrl-C: a SIGINT, which lands
  on Python's main thread. A KeyboardInterrupt that a host function raises
  itself is its error, as any exception."""
  interrupt = (error if isinstance(error, KeyboardInterrupt)
               else error.__cause__)
  return (isinstance(interrupt, KeyboardInterrupt) and
          threading.current_thread() is threading.main_thread() and
          not _raised_by_a_statement(interrupt))


def rearming_interrupt(error: BaseException) -> KeyboardInterrupt:
  """A KeyboardInterrupt that cancels the computation (its message begins
  with `CANCELLED`), chained to `error`, and re-arms Ctrl-C when freed:
  what a callback of JAX's that Ctrl-C stopped raises.

  Raise it and keep no reference to it (not even a local variable of the
  raising frame, which its traceback keeps): whoever catches it must free it
  as soon as they have read it.
  """
  _State.python_cancellations += 1
  raised = KeyboardInterrupt(
      f"{CANCELLED} while a host function ran on the main thread")
  raised.__cause__ = error
  raised.rearm_guard = _InterruptGuard()  # type: ignore[attr-defined]
  return raised


def cancellations() -> int:
  """How many computations Ctrl-C cancelled, on both transports."""
  native_count = native.ctrl_c_cancellations() if native is not None else 0
  return native_count + _State.python_cancellations


def cancelled_by_ctrl_c(error: Optional[BaseException]) -> bool:
  """Whether `error`, or an error it chains, is the failure of a
  computation that Ctrl-C cancelled."""
  if not cancellations():
    return False
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if CANCELLED in str(error):
      return True
    error = error.__cause__ or error.__context__
  return False


def install_excepthook(internal: Sequence[str],
                       stopped_elsewhere: Callable[[BaseException], bool]
                       ) -> None:
  """From now on, `sys.excepthook` reports a computation cancelled by
  Ctrl-C that nothing caught as its KeyboardInterrupt, with the frames of
  the program only: down to its call into a file under the folders
  `internal` (the packages that ran the computation). So too an error for
  which `stopped_elsewhere` holds: one that a Ctrl-C caused where no code
  of ours ran (in JAX's own frames of a Python callback). Other
  exceptions go to the hook it replaces, as before. Once per process."""
  previous = sys.excepthook
  if getattr(previous, "host_callback_ctrl_c", False):
    return
  folders = tuple(os.path.join(os.path.abspath(f), "") for f in internal)

  def present(ctrl_c_was_pending: bool, kind: type, value: BaseException,
              traceback: Optional[types.TracebackType]) -> Any:
    if isinstance(value, KeyboardInterrupt) and cancelled_by_ctrl_c(
        value.__context__):
      value.__suppress_context__ = True
      value.__traceback__ = _program_part(folders, traceback)
      return previous(kind, value, value.__traceback__)
    if ((ctrl_c_was_pending and cancelled_by_ctrl_c(value)) or
        stopped_elsewhere(value)):
      interrupt = KeyboardInterrupt()
      interrupt.__traceback__ = _program_part(folders, traceback)
      sys.last_type, sys.last_value = KeyboardInterrupt, interrupt
      sys.last_traceback = interrupt.__traceback__
      if hasattr(sys, "last_exc"):
        sys.last_exc = interrupt  # pylint: disable=attribute-defined-outside-init
      _State.ended_by_cancellation = True
      return previous(KeyboardInterrupt, interrupt, interrupt.__traceback__)
    if ctrl_c_was_pending:
      _thread.interrupt_main()  # not ours: as it was
    return previous(kind, value, traceback)

  # C callables first (functools.partial is one), so that a pending Ctrl-C
  # interrupts no Python code before `present` runs; without the native
  # module, it may.
  hook = (functools.partial(native.call_clearing_ctrl_c, present)
          if native is not None else functools.partial(present, False))
  hook.host_callback_ctrl_c = True  # type: ignore[attr-defined]
  sys.excepthook = hook
  _install_unraisable_rearm()


def _install_unraisable_rearm() -> None:
  """From now on, once Ctrl-C has cancelled a computation, a
  KeyboardInterrupt that Python would drop because it tripped in code whose
  exceptions it ignores (an audit hook, such as filelock's, run for the
  `sys.excepthook` event just before the hook above; a garbage collection
  callback) is re-armed instead of printed as "Exception ignored": raised
  at the main thread's next line, or read as pending by the hook above."""
  previous = sys.unraisablehook

  def rearm_dropped_ctrl_c(unraisable: Any) -> Any:
    if not (isinstance(unraisable.exc_type, type) and
            issubclass(unraisable.exc_type, KeyboardInterrupt) and
            threading.current_thread() is threading.main_thread() and
            not sys.is_finalizing() and cancellations()):
      return previous(unraisable)
    # Freed with this frame, after its last line: the re-armed Ctrl-C trips
    # in the next Python code, never in this hook (where it would be lost).
    rearm = _InterruptGuard()  # noqa: F841 pylint: disable=unused-variable
    return None

  sys.unraisablehook = rearm_dropped_ctrl_c


def _program_part(folders: Tuple[str, ...],
                  traceback: Optional[types.TracebackType]
                  ) -> Optional[types.TracebackType]:
  """`traceback`'s frames down to the call into a file under `folders`
  (what ran the computation), without that one and those below it."""
  kept = []
  while (traceback is not None and not
         traceback.tb_frame.f_code.co_filename.startswith(folders)):
    kept.append(traceback)
    traceback = traceback.tb_next
  rebuilt = None
  for entry in reversed(kept):
    rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti,
                                  entry.tb_lineno)
  return rebuilt


def program_ended_by_ctrl_c() -> bool:
  """Whether the program ended with a KeyboardInterrupt that nothing caught
  (Python printed it, and keeps it as `sys.last_value`; it then exits as
  SIGINT ends a process), or with a computation that Ctrl-C cancelled,
  printed as one. Not in the interactive interpreter, whose printed
  exceptions end nothing. For exit handlers."""
  return (isinstance(getattr(sys, "last_value", None), KeyboardInterrupt) and
          not hasattr(sys, "ps1"))


def end_as_ctrl_c_would() -> None:
  """Where the program ended with a computation that Ctrl-C cancelled
  (reported as its KeyboardInterrupt), ends the process as SIGINT does,
  which Python does itself only after a KeyboardInterrupt; else returns."""
  if not _State.ended_by_cancellation:
    return
  for stream in (sys.stdout, sys.stderr):
    try:
      if stream is not None:
        stream.flush()
    except Exception:  # pylint: disable=broad-except
      pass
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  os.kill(os.getpid(), signal.SIGINT)
