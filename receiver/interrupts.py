"""Ctrl-C that stopped a host function, handed on to the thread that waits.

Ctrl-C (a SIGINT, raised as KeyboardInterrupt on Python's main thread) that
lands while a device waits for the host (in a host function run there, or
in the wait for a `call`'s reply) fails that computation. A
KeyboardInterrupt that a host function raises itself is its error, as any
exception (`ctrl_c` tells them apart).

Python has consumed the signal by then, so whoever catches the failure
would not see a KeyboardInterrupt: the native transport re-arms Ctrl-C from
C++ once the Python code of the callback has returned
(`native/interrupts.h:Interrupts::RearmOnMainThread`). The Python
transport's callbacks are called by JAX, which turns any exception into its
own runtime error; re-arming from Python inside the callback would fire at
once, in JAX's frame, and be turned too. So the exception that leaves the
callback carries a guard that re-arms Ctrl-C when it is freed, which
happens in JAX's C++ after it has read the exception: Python then raises
KeyboardInterrupt again in the main thread's next line of Python code, the
caller's.
"""

from __future__ import annotations

import _thread
import dis
import signal
import sys
import threading
import weakref

_SIGINT = int(signal.SIGINT)
_RAISE_VARARGS = dis.opmap["RAISE_VARARGS"]


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


def ctrl_c(error: BaseException) -> bool:
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
  """A KeyboardInterrupt with `error`'s message, chained to it, that re-arms
  Ctrl-C when freed: what a callback of JAX's that `error` stopped raises.

  Raise it and keep no reference to it (not even a local variable of the
  raising frame, which its traceback keeps): whoever catches it must free it
  as soon as they have read it.
  """
  raised = KeyboardInterrupt(*error.args)
  raised.__cause__ = error
  raised.rearm_guard = _InterruptGuard()  # type: ignore[attr-defined]
  return raised


def program_ended_by_ctrl_c() -> bool:
  """Whether the program ended with a KeyboardInterrupt that nothing caught
  (Python printed it, and keeps it as `sys.last_value`; it then exits as
  SIGINT ends a process). Not in the interactive interpreter, whose
  printed exceptions end nothing. For exit handlers."""
  return (isinstance(getattr(sys, "last_value", None), KeyboardInterrupt) and
          not hasattr(sys, "ps1"))
