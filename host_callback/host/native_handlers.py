"""The native transport's XLA FFI handlers, registered with XLA once per
platform, and whether XLA accepted them.

XLA accepts a handler built with XLA FFI headers of its own API version or
an older one (the native module is built with API 0.3's, JAX 0.10's: see
`receiver/native/third_party/xla/README.md`), and refuses the registration
otherwise: a jaxlib too new or too old for this build, or a broken build.
A refusal is not a failed program: the package warns once, naming the
cause, and the Python transport serves that platform.
"""

from __future__ import annotations

import functools
import warnings
from typing import Optional

import jax

from ..receiver import transport_native

_FIX = ("install a host-callback release that supports the installed jaxlib "
        "(the README lists the supported JAX versions), or set "
        "JAX_HOST_CALLBACK_TRANSPORT=python to silence this warning")


def accepted(platform: str = "cpu") -> bool:
  """Whether the native module is built and XLA took its handlers for
  `platform` ('cpu', or 'cuda'); registers them at the first call, and
  warns once when XLA refuses them."""
  return transport_native.available() and _refusal(platform) is None


@functools.lru_cache(maxsize=None)
def _refusal(platform: str) -> Optional[str]:
  """Registers the handlers for `platform`, once per process; None when
  XLA accepted them, else why not (warned once)."""
  try:
    if platform == "cuda":
      transport_native.load_cuda_runtime()
      handlers = transport_native.cuda_ffi_handlers()
    else:
      handlers = transport_native.ffi_handlers()
    for name, handler in handlers.items():
      jax.ffi.register_ffi_target(
          name, handler, platform="CUDA" if platform == "cuda" else platform)
  except Exception as error:  # pylint: disable=broad-except
    # JaxRuntimeError from XLA (e.g. "the handler's API version (0.5) is
    # incompatible with the framework's API version (0.3)"), or
    # RuntimeError from load_cuda_runtime.
    reason = f"{type(error).__name__}: {error}"
    warnings.warn(
        f"host_callback: XLA refused the native transport's handlers on "
        f"{platform.upper()} ({reason}), so the slower Python transport is "
        f"used there; {_FIX}.", RuntimeWarning, stacklevel=2)
    return reason
  return None

