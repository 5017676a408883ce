"""Runs a batch of cases, each a command in a process of its own, and
prints each case's line as it ends. A case hangs when Python's
faulthandler dumps its stacks (`faulthandler.dump_traceback_later`, which
lets it run on): its threads' native stacks are then taken
(`tools/gpu/native_stacks.py`) before it is killed, and its line shows them
beside its Python stacks. Used by `tools/gpu/compile_during_call.py`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
import time
from typing import Dict, Iterator, List, Optional, Sequence

from . import native_stacks

# What a batch gives its hung cases' debuggers after its own limit.
DUMP_SECONDS = 20.0
_POLL_SECONDS = 0.2


class _Case:
  """One case's process, its output in files (read while it runs, each
  opened to append, so that reading moves no write position), and, once it
  hung, its native stacks."""

  def __init__(self, name: str, command: Sequence[str],
               env: Dict[str, str], folder: str) -> None:
    self.name = name
    self.out = open(os.path.join(folder, name + ".out"), "a+")
    self.err = open(os.path.join(folder, name + ".err"), "a+")
    self.stacks: Optional[str] = None
    self.dumping: Optional[threading.Thread] = None
    self.killed_at_limit = False
    self.process = subprocess.Popen(list(command), env=env, stdout=self.out,
                                    stderr=self.err, text=True)

  def hung(self) -> bool:
    """Whether faulthandler wrote its dump (the case runs on)."""
    self.err.seek(0)
    return "Timeout (" in self.err.read()

  def dump_then_kill(self) -> None:
    """Takes the native stacks on a thread of their own, then ends the
    case, whatever the debugger did."""
    def dump() -> None:
      try:
        self.stacks = native_stacks.dump(self.process.pid, DUMP_SECONDS)
      finally:
        self.kill()
    self.dumping = threading.Thread(target=dump, daemon=True)
    self.dumping.start()

  def kill(self) -> None:
    if self.process.poll() is None:
      self.process.kill()
    self.process.wait()

  def done(self) -> bool:
    """Whether the case's line can be written."""
    if self.dumping is not None:
      return not self.dumping.is_alive()
    return self.process.poll() is not None

  def line(self, stacks_folder: Optional[str]) -> str:
    """What the case printed, or why it has no answer."""
    self.out.seek(0)
    self.err.seek(0)
    out, err = self.out.read().strip(), self.err.read().strip()
    name = self.name.replace("_", " ")
    if out:
      return out
    if self.dumping is None:
      if self.killed_at_limit:
        return f"{name}: still running at the batch's limit; killed"
      tail = " | ".join(err.splitlines()[-2:])
      return (f"{name}: the case failed (exit {self.process.returncode}): "
              f"{tail}")
    stacks = self.stacks or "no native stacks: the debugger raised"
    if stacks_folder:
      with open(os.path.join(stacks_folder, self.name + ".txt"), "w",
                encoding="utf-8") as whole:
        whole.write(stacks)
    return (f"{name}: HUNG; its threads' native stacks:\n"
            f"{native_stacks.summary(stacks)}\n"
            f"and their Python stacks:\n{err}")

  def close(self) -> None:
    self.kill()
    self.out.close()
    self.err.close()


@contextlib.contextmanager
def _started(commands: Dict[str, Sequence[str]], env: Dict[str, str]
             ) -> Iterator[List[_Case]]:
  """The cases, started; each killed and closed on the way out."""
  with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as stack:
    cases = []
    for name, command in commands.items():
      case = _Case(name, command, env, folder)
      stack.callback(case.close)
      cases.append(case)
    yield cases


def run_batch(commands: Dict[str, Sequence[str]], seconds: float,
              env: Dict[str, str], stacks_folder: Optional[str]) -> None:
  """Runs `commands` (by case name) at once, and prints each case's line
  as it ends: its output; for a case that hung, its native stacks and its
  Python stacks; for one still running after `seconds`, that it was
  killed."""
  deadline = time.monotonic() + seconds
  with _started(commands, env) as cases:
    waiting = list(cases)
    while waiting:
      past_limit = time.monotonic() >= deadline
      for case in list(waiting):
        if case.dumping is None and case.process.poll() is None:
          if case.hung():
            case.dump_then_kill()
          elif past_limit:
            case.killed_at_limit = True
            case.kill()
        if case.done():
          waiting.remove(case)
          print(case.line(stacks_folder), flush=True)
      time.sleep(_POLL_SECONDS if waiting else 0)
