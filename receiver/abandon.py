"""The end of the process after Ctrl-C at exit: no host function begins,
what is left is written to stderr, and the process ends at once.

An interpreter that finalizes while a host function runs, on a device
thread or a receiver thread, ends that thread when it next takes the GIL
(Python 3.11-3.13 call `pthread_exit`): the thread unwinds through the C++
frames below the host function, XLA's and the native module's, and the
process aborts (`FATAL: exception not rethrown`). A computation still
running, or dispatched and not begun, calls its host functions later,
during finalization. So, when anything is left, the process ends with
`os._exit`, before the interpreter finalizes; once the counts are read, no
other thread runs Python code (see `_quiet_other_threads`), so the report
is the last thing any host function sees: none prints after it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Callable, Mapping, Optional

from .run_counts import Left, QueueKey, RunCounts

# The exit status after Ctrl-C, as a shell reports a process that SIGINT
# ended (128 + 2).
EXIT_STATUS = 130
# While the process ends, a thread that waits for the GIL asks for it
# only after this long (sys.setswitchinterval).
_QUIET_SECONDS = 1.0
# How long threads that asked for the GIL before get their turn.
_SETTLE_SECONDS = 0.01


def abandon(runs: RunCounts, close_direct: Callable[[], None],
            sent: Callable[[], Mapping[QueueKey, int]],
            executions_running: Callable[[], Optional[int]],
            why: str) -> None:
  """Closes `runs`, and with `close_direct()` the transports' direct runs
  that skip `DirectRunParts.run`; when a host function runs, a packet was
  dropped or an execution ran when the exit began (`executions_running()`,
  None where not counted), writes what was left and ends the process with
  `EXIT_STATUS`. Returns only when nothing was left."""
  previous = sys.getswitchinterval()
  # Read first: once closed, a device's next synchronous tap is refused,
  # which ends its execution.
  executions = executions_running()
  runs.close()
  close_direct()  # from now on, direct runs go through `runs`, and refuse
  _quiet_other_threads()
  _flush_standard_streams()
  sent_now = sent()
  left = runs.left(sent_now)  # the GIL is not released from here on
  if executions or any(q.running or q.dropped for q in left.values()):
    _write_holding_the_gil(report(why, left, executions))
    os._exit(EXIT_STATUS)  # pylint: disable=protected-access
  sys.setswitchinterval(previous)


def report(why: str, left: Mapping[QueueKey, Left],
           executions: Optional[int]) -> str:
  """What the process writes to stderr as it ends: per device queue, the
  host functions that ran, were running and were dropped, and the
  executions still running where they are counted."""
  lines = [f"{why}; exiting now with status {EXIT_STATUS}, without running "
           "or waiting for the host functions (taps and calls) left:"]
  lines += [f"  device {device_id} ({name} transport): {q.ran} ran, "
            f"{q.running} running, {q.dropped} dropped"
            for (name, device_id), q in left.items()]
  if executions is not None:
    lines.append(f"  device executions still running: {executions}")
  return "".join(f"host_callback: {line}\n" for line in lines)


def _quiet_other_threads() -> None:
  """From now on another thread that waits for the GIL asks for it only
  after `_QUIET_SECONDS` (or when this thread blocks): first the threads
  that asked for it before get their turn."""
  sys.setswitchinterval(_QUIET_SECONDS)
  time.sleep(_SETTLE_SECONDS)


def _flush_standard_streams() -> None:
  """What was printed before the report is written before it."""
  for stream in (sys.stdout, sys.stderr):
    try:
      if stream is not None:
        stream.flush()
    except Exception:  # pylint: disable=broad-except
      pass  # a closed or broken stream: nothing to keep


def _write_holding_the_gil(text: str) -> None:
  """Writes `text` to file descriptor 2 without releasing the GIL, which
  `os.write` would (the fallback)."""
  data = text.encode("utf-8", "replace")
  write = _write_function()
  while data:
    written = write(2, data)
    if written <= 0:
      return
    data = data[written:]


def _write_function() -> Callable[[int, bytes], int]:
  """libc's `write`, called through `ctypes.PyDLL` (which keeps the GIL);
  `os.write` where it cannot be found."""
  try:
    write = ctypes.PyDLL(None).write
  except (OSError, AttributeError):
    return os.write
  write.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
  write.restype = ctypes.c_ssize_t
  return lambda fd, data: write(fd, data, len(data))
