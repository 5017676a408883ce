"""The floors of a tap in a scan step (issue 63): two FFI custom calls of
the native module's test helpers (`receiver/native/module_testing.cc`),
which the bench registers with XLA's CPU (and `tools.gpu.timings` with
CUDA: they use no stream) when it first asks, never at import. "dispatch"
does nothing with its scalar operand: XLA's dispatch of a custom call.
"python" takes the GIL and calls a Python function that does nothing:
what any tap whose host function runs costs at least. Both are
side-effecting, so that XLA neither hoists nor removes them."""

from __future__ import annotations

import functools
from typing import Callable, Dict, Optional

import jax

from host_callback.receiver import native_library

KINDS = ("dispatch", "python")


def _nothing() -> None:
  return None


@functools.lru_cache(maxsize=None)
def _targets(platform: str) -> Optional[Dict[str, str]]:
  """{kind: target name} of the floors, registered once for XLA's
  `platform` ("cpu" or "CUDA"); None where the native module is not
  built."""
  if not native_library.available():
    return None
  handlers = native_library.native._testing_floor_handlers(_nothing)  # pylint: disable=protected-access
  for name, handler in handlers:
    jax.ffi.register_ffi_target(name, handler, platform=platform)
  return {kind: name for kind, (name, _) in zip(KINDS, handlers)}


def step_op(kind: str, platform: str = "cpu") -> Optional[Callable]:
  """A scan step's op that makes the floor `kind`'s custom call on its
  operand and returns the operand, for XLA's `platform`; None where the
  native module is not built."""
  targets = _targets(platform)
  if targets is None:
    return None
  call = jax.ffi.ffi_call(targets[kind], (), has_side_effect=True)

  def op(x):
    call(x)
    return x
  return op
