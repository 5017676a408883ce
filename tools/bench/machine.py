"""The machine the benchmarks run on: its description, and confining the
process to one core (Linux)."""

from __future__ import annotations

import contextlib
import os
import platform
from typing import Iterator, List

import jax


def describe() -> str:
  return (f"{platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, jax {jax.__version__}, "
          f"{jax.devices()[0].platform}")


def can_confine() -> bool:
  """Whether `on_one_core` can confine this process's threads (Linux)."""
  return hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")


def _thread_ids() -> List[int]:
  return [int(tid) for tid in os.listdir("/proc/self/task")]


@contextlib.contextmanager
def on_one_core() -> Iterator[None]:
  """Every thread of the process (XLA's pool and ours) on one core, the
  first this process may use, until the block ends; then each thread
  back on the cores it had (one started meanwhile: the process's). XLA
  splits a 64x64 matmul between the pool's threads; on a small VM whose
  cores differ in speed, how that split lands moves a scan's time by more
  than the 5% a lens may cost, from process to process."""
  allowed = os.sched_getaffinity(0)
  before = {}
  for tid in _thread_ids():
    with contextlib.suppress(OSError):  # a thread that ended meanwhile
      before[tid] = os.sched_getaffinity(tid)
      os.sched_setaffinity(tid, {min(allowed)})
  try:
    yield
  finally:
    for tid in _thread_ids():
      with contextlib.suppress(OSError):
        os.sched_setaffinity(tid, before.get(tid, allowed))
