"""Settings under their legacy names.

Each is a `jax.config` option, so old code sets it the old ways: the
environment variable (`JAX_HOST_CALLBACK_INLINE=1`), `jax.config.update(
"jax_host_callback_inline", True)`, or the absl flag `--jax_host_callback_inline`.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Iterator, List

from . import _jax_adapter as adapter

MIN_QUEUE_BYTES = 16_000_000
DEFAULT_QUEUE_BYTES = 256_000_000
TRANSPORTS = ("auto", "native", "python")

inline = adapter.bool_setting(
    "jax_host_callback_inline", False,
    "Run eager (un-jitted) taps and calls in the caller's thread.")

_QUEUE_ENV = "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE"


@contextlib.contextmanager
def _legacy_queue_env() -> Iterator[List[str]]:
  """While JAX reads the environment variable: accepts the legacy '256e6'
  notation, and hides an invalid value (JAX would fail at import), whose
  error it yields for `queue_bytes` to raise at first use."""
  errors: List[str] = []
  raw = os.environ.get(_QUEUE_ENV)
  try:
    value = float(raw) if raw is not None else 0.
  except ValueError:
    value = math.nan
  if value.is_integer():
    if raw is not None:
      os.environ[_QUEUE_ENV] = str(int(value))
    yield errors
    return
  errors.append(f"{_QUEUE_ENV}={raw!r} is not a whole number of bytes; set "
                f"it to e.g. {DEFAULT_QUEUE_BYTES} or 256e6")
  del os.environ[_QUEUE_ENV]
  try:
    yield errors
  finally:
    os.environ[_QUEUE_ENV] = raw


with _legacy_queue_env() as _queue_env_errors:
  max_queue_byte_size = adapter.int_setting(
      "jax_host_callback_max_queue_byte_size", DEFAULT_QUEUE_BYTES,
      "Bytes of tapped data that may wait per device before the device pauses "
      f"at its next send (minimum {MIN_QUEUE_BYTES}).")

transport = adapter.enum_setting(
    "jax_host_callback_transport", TRANSPORTS, "auto",
    "How packets leave the device: 'native' (C++ XLA FFI handlers, CPU and "
    "CUDA), 'python' (JAX's Python callbacks), or 'auto' (native where it "
    "is built and XLA takes its handlers, on CPU and CUDA).")

outfeed = adapter.bool_setting(
    "jax_host_callback_outfeed", False,
    "On CPU, use the outfeed mode: taps do not wait for their host functions, "
    "and barrier_wait() is how a program waits. By default (False) a tap's "
    "outputs are produced after its host function returned, as with the "
    "original's CPU default. GPU and TPU always use the outfeed mode.",
    changes_lowering=True)


# Internal, set by loops.record() blocks on their thread: which lens is open
# (0: none). Part of JAX's jit and trace keys, so that a function compiled
# under one lens is traced again under another.
record_lens = adapter.int_setting(
    "jax_host_callback_record_lens", 0,
    "Internal (set by host_callback.loops.record blocks): the lens of the "
    "open block, 0 for none.", changes_lowering=True)


def outfeed_mode(platform: str) -> bool:
  """Whether taps on `platform` are asynchronous (as in the original:
  always on GPU and TPU, and on CPU with jax_host_callback_outfeed)."""
  return platform != "cpu" or outfeed.value


def queue_bytes() -> int:
  """The validated per-device queue bound."""
  value = max_queue_byte_size.value
  if _queue_env_errors and value == DEFAULT_QUEUE_BYTES:  # not set otherwise
    raise ValueError(_queue_env_errors[0])
  if not MIN_QUEUE_BYTES <= value <= 2**62:
    raise ValueError(
        "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE (jax_host_callback_max_queue_"
        f"byte_size) must be between {MIN_QUEUE_BYTES} and 2**62 bytes; got "
        f"{value}")
  return value
