"""Calls that block in C++, run where Ctrl-C can end the wait for them.

Python raises KeyboardInterrupt on the main thread only between two
bytecodes: a call that blocks in C++ (a JAX token's `block_until_ready`, a
dispatch that waits for another computation's launch) holds Ctrl-C back
until it returns, which may be never. `BlockingCalls.run` makes such a call
on a thread of its own and waits for it on a lock, which Ctrl-C interrupts.
The thread is started ahead, since Python 3.12 starts none at exit, where
the drain needs it.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, List, Optional, Tuple, TypeVar

T = TypeVar("T")

# A call, the event set when it returned, and the box for its outcome:
# [("value", v)] or [("error", e)].
_Request = Tuple[Callable[[], Any], threading.Event, List[Tuple[str, Any]]]


class BlockingCalls:
  """One daemon thread that makes the calls given to `run`, in order.

  A call that never returns keeps the thread; an interrupted caller leaves
  it there (used at exit, where nothing follows). `_lock` guards `_thread`.
  """

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._requests: "queue.SimpleQueue[_Request]" = queue.SimpleQueue()
    self._thread: Optional[threading.Thread] = None

  def start(self) -> None:
    """Starts the thread if it is not running (also in a forked child)."""
    with self._lock:
      if self._thread is not None and self._thread.is_alive():
        return
      self._requests = queue.SimpleQueue()  # a fork's child starts afresh
      self._thread = threading.Thread(target=self._serve, args=(self._requests,),
                                      name="host_callback_blocking_calls",
                                      daemon=True)
      self._thread.start()

  def run(self, call: Callable[[], T]) -> T:
    """`call()`, made on the thread while this one waits where Ctrl-C
    raises KeyboardInterrupt; made here when the thread cannot run
    (never started, or no thread can start)."""
    try:
      self.start()
    except RuntimeError:  # "can't create new thread at interpreter shutdown"
      pass
    with self._lock:
      alive = self._thread is not None and self._thread.is_alive()
      requests = self._requests
    if not alive:
      return call()
    done, outcome = threading.Event(), []  # type: ignore[var-annotated]
    requests.put((call, done, outcome))
    done.wait()
    kind, value = outcome[0]
    if kind == "error":
      raise value
    return value

  @staticmethod
  def _serve(requests: "queue.SimpleQueue[_Request]") -> None:
    while True:
      call, done, outcome = requests.get()
      try:
        outcome.append(("value", call()))
      except BaseException as error:  # pylint: disable=broad-except
        outcome.append(("error", error))
      done.set()
      del call, done, outcome
