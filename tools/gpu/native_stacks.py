"""Every thread's native stack of a running process, for a case that hung:
the call or lock each thread waits in, where Python's faulthandler shows
only Python frames. Taken by gdb, or by the CUDA toolkit's cuda-gdb (the
GPU machines have it in place of gdb):

    python -m tools.gpu.native_stacks PID

prints the threads grouped by their top frames (`summary`); `dump` gives
gdb's whole output.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
from typing import Dict, List, Optional, Tuple

DEBUGGERS = ("gdb", "cuda-gdb")
# The frames of each thread that gdb prints, and that a summary shows.
DUMP_FRAMES = 40
SUMMARY_FRAMES = 14

_THREAD = re.compile(r'^Thread (\d+) \(.*?(?:"(.*)")?\):\s*$')
# A frame: its number, its address, then the function and its arguments,
# then where it is ("at FILE:LINE" or "from LIBRARY").
_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(.*?)(?: (?:at|from) \S+)?$")
# The interpreter's own functions: a summary stops at the first (below
# it, faulthandler's Python stack says more).
_INTERPRETER = re.compile(r"^(_?Py|cfunction_|method_vectorcall)")


def debugger() -> Optional[str]:
  """The path of the first debugger of DEBUGGERS on the PATH, if any."""
  for name in DEBUGGERS:
    path = shutil.which(name)
    if path:
      return path
  return None


def dump(pid: int, timeout: float = 20.0) -> str:
  """gdb's backtrace of every thread of process `pid` (attached, then
  detached), or one line saying why there is none."""
  path = debugger()
  if path is None:
    return f"no native stacks: none of {', '.join(DEBUGGERS)} is installed"
  command = [path, "-batch", "-nx", "-p", str(pid),
             "-ex", "set pagination off",
             "-ex", "set print frame-arguments none",
             "-ex", f"thread apply all bt {DUMP_FRAMES}"]
  try:
    done = subprocess.run(command, capture_output=True, text=True,
                          errors="replace", timeout=timeout, check=False)
  except subprocess.TimeoutExpired:
    return f"no native stacks: {path} did not finish within {timeout:.0f} s"
  if "Thread " not in done.stdout:
    tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
    return f"no native stacks: {path} exited {done.returncode}: {tail}"
  return done.stdout


def _function(call: str) -> str:
  """A frame's function: `call` without its last, outermost argument list
  ("std::function<void ()>::operator() (...)" gives
  "std::function<void ()>::operator()"); "<signal handler called>" as it
  is."""
  if not call.endswith(")"):
    return call
  depth = 0
  for index in range(len(call) - 1, -1, -1):
    depth += {")": 1, "(": -1}.get(call[index], 0)
    if depth == 0:
      return call[:index].rstrip() or call
  return call


def threads(text: str) -> List[Tuple[int, str, List[str]]]:
  """(gdb's thread number, the thread's name, its functions from the top)
  for each thread of a `dump`."""
  found: List[Tuple[int, str, List[str]]] = []
  for line in text.splitlines():
    thread = _THREAD.match(line)
    if thread:
      found.append((int(thread.group(1)), thread.group(2) or "", []))
      continue
    frame = _FRAME.match(line)
    if frame and found:
      found[-1][2].append(_function(frame.group(1)))
  return found


def _native_top(functions: List[str], frames: int) -> Tuple[str, ...]:
  """The first `frames` functions, up to the interpreter's first."""
  top = []
  for function in functions[:frames]:
    if _INTERPRETER.match(function):
      break
    top.append(function)
  return tuple(top)


def summary(text: str, frames: int = SUMMARY_FRAMES) -> str:
  """The threads of a `dump` grouped by their top `frames` functions above
  the interpreter's, one group a line ("3 threads [names]: top < caller <
  ..."), the process's first thread (Python's main thread) first; `text`
  itself if it holds no thread."""
  groups: Dict[Tuple[str, ...], List[Tuple[int, str]]] = (
      collections.defaultdict(list))
  for number, name, functions in threads(text):
    groups[_native_top(functions, frames)].append((number, name))
  if not groups:
    return text.strip()
  lines = []
  for stack, members in sorted(groups.items(),
                               key=lambda item: min(item[1])[0]):
    names = sorted({name for _, name in members if name})
    count = f"{len(members)} thread{'s' if len(members) > 1 else ''}"
    first = " (the first)" if min(members)[0] == 1 else ""
    named = f" [{', '.join(names)}]" if names else ""
    frames = " < ".join(stack) or "(in the interpreter)"
    lines.append(f"{count}{first}{named}: {frames}")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("pid", type=int)
  parser.add_argument("--whole", action="store_true",
                      help="gdb's whole output, not the summary")
  args = parser.parse_args()
  text = dump(args.pid)
  print(text if args.whole else summary(text))


if __name__ == "__main__":
  main()
