"""Which transport serves a platform, and why: the one place that decides.

Everyone asks here: the lowering (`lowering.transport_for`), the runtime
(which transports exist), the progress bars (whether a bar taps every step)
and the demo. The decision weighs, in this order:

1. the setting `jax_host_callback_transport` ('auto', 'native', 'python');
2. whether the native module was built (`transport_native.available`);
3. on CUDA, for 'auto', whether its native part has passed
   `python -m tools.gpu.check` on a real GPU (`CUDA_NATIVE_VALIDATED`);
4. whether XLA took the native handlers for the platform
   (`native_handlers.accepted`, which registers them and warns once where
   XLA refuses them).

`decide` is the rule itself, a pure function of those facts; `for_platform`
gathers the facts, and logs the choice (once per choice) and warns (once)
where the native module is missing.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import warnings
from typing import List

from . import native_handlers
from .. import settings
from ..receiver import transport_native

# Whether the native transport's CUDA part (receiver/native/ffi_cuda.cc) has
# passed `python -m tools.gpu.check` on a real GPU: it has, on an H200 (jax
# 0.11.2, 2026-11-30; docs/gpu.md): its GPU tests, the soak, and every row
# faster than the Python transport's and JAX's callbacks. `auto` picks it
# on CUDA; without it, `auto` would keep JAX's callbacks there.
CUDA_NATIVE_VALIDATED = True

# The platforms the native module has handlers for.
NATIVE_PLATFORMS = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class Choice:
  """A transport ('native' or 'python') and why it serves a platform."""
  transport: str
  reason: str


class NativeNotBuiltError(RuntimeError):
  """'native' was requested where the native module is not built."""

  def __init__(self) -> None:
    super().__init__(
        "jax_host_callback_transport='native' was requested but the native "
        "transport is not built (no C++ compiler at install time?); use "
        "'python' or 'auto'")


def decide(platform: str, *, setting: str, built: bool, cuda_validated: bool,
           accepted: bool) -> Choice:
  """The rule: the transport of a computation for `platform` ('cpu',
  'cuda', ...), given the setting, whether the native module is built,
  whether its CUDA part is validated, and whether XLA took its handlers
  for `platform`. Raises NativeNotBuiltError for 'native' without the
  module."""
  if setting == "python":
    return Choice("python", "jax_host_callback_transport is 'python'")
  if platform not in NATIVE_PLATFORMS:
    return Choice("python", f"the native transport has no {platform} "
                  "handlers")
  if not built:
    if setting == "native":
      raise NativeNotBuiltError()
    return Choice("python", "jax_host_callback_transport is 'auto' and the "
                  "native transport is not built")
  if platform == "cuda" and setting == "auto" and not cuda_validated:
    return Choice("python", "jax_host_callback_transport is 'auto' and the "
                  "native transport's CUDA part is not validated on a GPU "
                  "yet (JAX_HOST_CALLBACK_TRANSPORT=native selects it)")
  if not accepted:
    return Choice("python", "XLA refused the native transport's handlers")
  return Choice("native", f"jax_host_callback_transport is {setting!r} and "
                "the native transport is built")


def for_platform(platform: str, *, register: bool = True) -> str:
  """The transport of a computation for `platform`: 'native' or 'python'.

  With `register` (the lowering's case) it registers the native handlers
  with XLA at the first ask, and takes XLA's answer; without it (tracing,
  where nothing may be registered yet) it assumes XLA will take them."""
  built = transport_native.available()
  choice = decide(
      platform, setting=settings.transport.value, built=built,
      cuda_validated=CUDA_NATIVE_VALIDATED,
      accepted=built and (not register or native_handlers.accepted(platform)))
  if not built and settings.transport.value == "auto":
    _warn_native_missing()
  _log_choice(platform, choice)
  return choice.transport


def native_on_cpu() -> bool:
  """Whether the native transport is built, loads, and XLA took its CPU
  handlers: whether it can serve CPU computations, whatever the setting."""
  return native_handlers.accepted("cpu")


def available_on_cpu() -> List[str]:
  """The transports this installation can use on CPU."""
  return ["python", "native"] if native_on_cpu() else ["python"]


@functools.lru_cache(maxsize=None)
def _warn_native_missing() -> None:
  warnings.warn(
      "host_callback: the native transport was not built (no C++ compiler "
      "when host-callback was installed?), so the slower Python transport is "
      "used. Reinstall with a C++17 compiler to get it (pip shows the "
      "build's messages only with -v: `pip install -v host-callback` says "
      "why it was not built), or set JAX_HOST_CALLBACK_TRANSPORT=python to "
      "silence this warning.",
      RuntimeWarning, stacklevel=3)


@functools.lru_cache(maxsize=None)
def _log_choice(platform: str, choice: Choice) -> None:
  logging.getLogger("host_callback").debug(
      "host_callback: the %s transport is used on %s: %s", choice.transport,
      platform.upper(), choice.reason)
