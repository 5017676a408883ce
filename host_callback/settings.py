"""Settings under their legacy names.

Each is a `jax.config` option, so old code sets it the old ways: the
environment variable (`JAX_HOST_CALLBACK_INLINE=1`), `jax.config.update(
"jax_host_callback_inline", True)`, or the absl flag `--jax_host_callback_inline`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import warnings
from typing import Iterator, List, Optional

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
    "CUDA), 'python' (JAX's Python callbacks), or 'auto' (native when built, "
    "on CPU; on CUDA once validated there, see CUDA_NATIVE_VALIDATED).")

# Whether the native transport's CUDA part (receiver/native/ffi_cuda.cc) has
# passed `python -m tools.gpu_check` on a real GPU. Until it has, `auto`
# keeps JAX's callbacks (the Python transport) on CUDA, and 'native' selects
# it explicitly.
CUDA_NATIVE_VALIDATED = False

outfeed = adapter.bool_setting(
    "jax_host_callback_outfeed", False,
    "On CPU, use the outfeed mode: taps do not wait for their host functions, "
    "and barrier_wait() is how a program waits. By default (False) a tap's "
    "outputs are produced after its host function returned, as with the "
    "original's CPU default. GPU and TPU always use the outfeed mode.",
    changes_lowering=True)


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


@functools.lru_cache(maxsize=None)
def _warn_native_missing() -> None:
  warnings.warn(
      "host_callback: the native transport was not built (no C++ compiler "
      "when host-callback was installed?), so the slower Python transport is "
      "used. Reinstall with a C++17 compiler to get it (pip shows the "
      "build's messages only with -v: `pip install -v host-callback` says "
      "why it was not built), or set JAX_HOST_CALLBACK_TRANSPORT=python to "
      "silence this warning.",
      RuntimeWarning, stacklevel=2)


@functools.lru_cache(maxsize=None)
def _log_choice(name: str, reason: str, platform: str = "CPU") -> None:
  logging.getLogger("host_callback").debug(
      "host_callback: the %s transport is used on %s: %s", name, platform,
      reason)


def _native_not_built() -> RuntimeError:
  return RuntimeError(
      "jax_host_callback_transport='native' was requested but the native "
      "transport is not built (no C++ compiler at install time?); use "
      "'python' or 'auto'")


def transport_for_platform(platform: str, native_available: bool,
                           cuda_validated: Optional[bool] = None) -> str:
  """The transport of a computation for `platform` ('cpu', 'cuda', ...):
  'native' or 'python'. On CPU as `transport_name`; on CUDA 'native' when
  chosen, and for 'auto' only once validated (`cuda_validated`, by default
  CUDA_NATIVE_VALIDATED); elsewhere 'python'."""
  if platform == "cpu":
    return transport_name(native_available)
  chosen = transport.value
  if platform != "cuda" or chosen == "python":
    return "python"
  if chosen == "native":
    if not native_available:
      raise _native_not_built()
    return "native"
  if cuda_validated is None:
    cuda_validated = CUDA_NATIVE_VALIDATED
  if cuda_validated and native_available:
    return "native"
  _log_choice("python", "jax_host_callback_transport is 'auto' and the "
              "native transport's CUDA part is not validated on a GPU yet "
              "(JAX_HOST_CALLBACK_TRANSPORT=native selects it)", "CUDA")
  return "python"


def transport_name(native_available: bool) -> str:
  """The transport to use on CPU: 'native' or 'python'."""
  chosen = transport.value
  if chosen == "auto":
    if not native_available:
      _warn_native_missing()
      _log_choice("python", "jax_host_callback_transport is 'auto' and the "
                  "native transport is not built")
      return "python"
    _log_choice("native", "jax_host_callback_transport is 'auto' and the "
                "native transport is built")
    return "native"
  if chosen == "native" and not native_available:
    raise _native_not_built()
  _log_choice(chosen, f"jax_host_callback_transport is {chosen!r}")
  return chosen
