"""Ctrl-C that stopped a host function, handed on to the thread that waits.

A KeyboardInterrupt raised on Python's main thread while a device waits for
the host (in a host function run there, or in the wait for a `call`'s reply)
fails that computation. Python has consumed the signal by then, so whoever
catches the failure would not see a KeyboardInterrupt: the native transport
re-arms Ctrl-C from C++ once the Python code of the callback has returned
(`native/interrupts.h:Interrupts::RearmOnMainThread`). The Python
transport's callbacks are called by JAX, which turns any exception into its own runtime error; re-arming from
Python inside the callback would fire at once, in JAX's frame, and be turned
too. So the exception that leaves the callback carries a guard that re-arms
Ctrl-C when it is freed, which happens in JAX's C++ after it has read the
exception: Python then raises KeyboardInterrupt again in the main thread's
next line of Python code, the caller's.
"""

from __future__ import annotations

import _thread
import signal
import threading
import weakref

_SIGINT = int(signal.SIGINT)


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


def stopped_main_thread(error: BaseException) -> bool:
  """Whether `error`, raised on this thread, is a KeyboardInterrupt (or a
  host function's failure caused by one) on Python's main thread, where
  Ctrl-C lands."""
  return ((isinstance(error, KeyboardInterrupt) or
           isinstance(error.__cause__, KeyboardInterrupt)) and
          threading.current_thread() is threading.main_thread())


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
