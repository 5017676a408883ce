"""A watchdog for compiles that a host function starts on a GPU.

While a computation on a GPU runs one of our host functions, the launching
thread holds XLA's shared lock on that GPU (`RunGpuAsync`). A compile that
autotunes profiles its candidates with the GPU to itself, so it waits for
that computation, which waits for the host function that is compiling: a
deadlock, silent (docs/gpu.md, "Compiling in a host function"). The
package cannot give the lock back while a `call` waits for its result; it
can compile such a function without autotuning, which then takes no
exclusive lock (`NO_AUTOTUNE`), and say what is happening if a compile
still runs long.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any, Iterator, Tuple

from .compile_retry import GPU_PLATFORMS
from ..receiver.consumer_threads import in_consumer_thread

# The platforms whose compiles can wait for a running computation.
WATCHED_PLATFORMS = GPU_PLATFORMS
# How long a compile started in a host function runs before the warning;
# longer than a small function's autotuning takes.
WARN_AFTER_SECONDS = 10.0

# The compile options that leave the autotuner, and so the GPU's exclusive
# lock, out of a compile; added to those a compile started in one of our
# host functions on a GPU does not set itself, where NO_AUTOTUNE_VALIDATED:
# on an H200 (jax 0.11.2, 2026-11-30) a call whose host function compiled
# hung without them and finished with them, on both transports
# (tools.gpu.compile_during_call's "own" and "own_auto_no_autotune" cases).
NO_AUTOTUNE: Tuple[Tuple[str, Any], ...] = (("xla_gpu_autotune_level", 0),)
NO_AUTOTUNE_VALIDATED = True

MESSAGE = (
    "host_callback: a host function has been compiling a JAX function for "
    "the {platform} for {seconds:.0f} s while the computation that runs it "
    "waits for it. If it autotunes, this is likely a deadlock: XLA's "
    "autotuner needs the GPU to itself and waits for that computation, "
    "which waits for this host function. Compile the function before the "
    "computation runs (call it once, or jax.jit(f).lower(...).compile()). "
    "host_callback leaves autotuning out of such a compile, as "
    "jax.jit(f, compiler_options={{'xla_gpu_autotune_level': 0}}) does, "
    "unless its compiler_options or XLA_FLAGS set a level.")


def _flags_set_autotune_level() -> bool:
  """Whether XLA_FLAGS sets the autotune level (then it stands)."""
  return "--xla_gpu_autotune_level" in os.environ.get("XLA_FLAGS", "")


@contextlib.contextmanager
def watching(platform: str) -> Iterator[Tuple[Tuple[str, Any], ...]]:
  """Warns once if the compile in the block, started by one of our host
  functions for `platform` (a GPU), runs longer than WARN_AFTER_SECONDS.
  Yields the compile options to add where the compile sets none of that
  name: NO_AUTOTUNE for such a compile where NO_AUTOTUNE_VALIDATED and
  XLA_FLAGS sets no level, else none."""
  if platform not in WATCHED_PLATFORMS or not in_consumer_thread():
    yield ()
    return
  seconds = WARN_AFTER_SECONDS
  timer = threading.Timer(seconds, _warn, args=(platform, seconds))
  timer.daemon = True
  timer.start()
  try:
    yield (NO_AUTOTUNE if NO_AUTOTUNE_VALIDATED and
           not _flags_set_autotune_level() else ())
  finally:
    timer.cancel()


def _warn(platform: str, seconds: float) -> None:
  logging.getLogger("host_callback").warning(
      MESSAGE.format(platform=platform, seconds=seconds))
