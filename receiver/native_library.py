"""The Python face of the native extension module, `_native` (C++ in
`receiver/native/`): whether it is built, what it hands to XLA, and the
functions of it that other modules use.

The module (`native/module.cc` makes it of its parts, `native/module_*.cc`
and `native/python_hooks.cc`) wraps the hub of device queues, block
pool and replies (`native/hub.h`), the count of executions in flight
(`native/executions.h`), the direct runner that calls host functions from
the device thread (`native/python_runner.h`) and `Memory`, the owner of
memory lent to host functions. Its functions raise `MemoryError` or `RuntimeError` when the C++
side fails, and release the GIL while they wait or copy much.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Tuple

ABI_VERSION = 20


def _load() -> Optional[ModuleType]:
  try:
    from . import _native  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None  # not built: the Python transport serves alone
  if getattr(_native, "ABI_VERSION", None) != ABI_VERSION:
    raise ImportError(
        f"host_callback: the native module {_native.__file__} is stale (ABI "
        f"{getattr(_native, 'ABI_VERSION', '?')}, expected {ABI_VERSION}); "
        "reinstall host-callback to rebuild it")
  return _native


native: Any = _load()  # the extension module, or None

# The FFI targets' names, as the module hands XLA its handlers
# (native/ffi_targets.h); empty where it is not built, as nothing lowers to
# them then.
OUTFEED_TARGET, CALL_TARGET, TAP_SYNC_TARGET, BEGIN_TARGET, END_TARGET = (
    getattr(native, name, "") for name in (
        "OUTFEED_TARGET", "CALL_TARGET", "TAP_SYNC_TARGET", "BEGIN_TARGET",
        "END_TARGET"))


def available() -> bool:
  """Whether the native module was built and loads."""
  return native is not None


def ffi_handlers() -> Dict[str, Any]:
  """The FFI handlers by target name, as PyCapsules for
  `jax.ffi.register_ffi_target`."""
  assert native is not None, "the native transport is not built"
  return native.ffi_handlers()


def cuda_ffi_handlers() -> Dict[str, Any]:
  """The CUDA platform's FFI handlers (the tap and the call) by target name
  (`native/ffi_cuda.cc`), built without CUDA: register them only where JAX
  has a CUDA backend, after `load_cuda_runtime`."""
  assert native is not None, "the native transport is not built"
  return native.cuda_ffi_handlers()


def load_cuda_runtime() -> None:
  """Finds the CUDA runtime functions the CUDA handlers use
  (`native/cuda_api.h`): the libcudart that JAX's CUDA plugin loaded, else
  the `nvidia-cuda-runtime` wheel's, else libcudart by name. Raises
  RuntimeError naming what is missing."""
  assert native is not None, "the native transport is not built"
  native.cuda_load(_wheel_cudart())


def _wheel_cudart() -> Optional[str]:
  """libcudart of NVIDIA's CUDA runtime wheels, if installed, under the
  `nvidia` namespace in `cuda_runtime/lib` (CUDA 12) or `cu13/lib`: the
  newest CUDA version's where there are several."""
  import glob  # pylint: disable=import-outside-toplevel
  import importlib.util  # pylint: disable=import-outside-toplevel
  import re  # pylint: disable=import-outside-toplevel
  spec = importlib.util.find_spec("nvidia")
  found = [path for location in
           ((spec.submodule_search_locations or []) if spec else [])
           for path in glob.glob(os.path.join(location, "*", "lib",
                                              "libcudart.so*"))]

  def version(path: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+",
                                                  path.rsplit(".so", 1)[1]))
  return max(found, key=version, default=None)


def cuda_stats(ordinal: int) -> Dict[str, Any]:
  """The CUDA transport on GPU `ordinal` (`native/cuda_copies.h`): copies
  issued and landed, entries in flight, events made, and the failure that
  stopped it ('' if none)."""
  assert native is not None, "the native transport is not built"
  return dict(zip(("issued", "landed", "in_flight", "events", "failure"),
                  native.cuda_stats(ordinal)))


def _fill_slots(cls: type, *values: Any) -> Any:
  """`new_instance` where the native module is not built."""
  instance = object.__new__(cls)
  for name, value in zip(cls.__slots__, values, strict=True):
    object.__setattr__(instance, name, value)
  return instance


# `new_instance(cls, *values)`: a new instance of `cls`, a class whose
# instances hold only `__slots__`, its slots set to `values` in the order of
# `cls.__slots__`, without running `__init__` or `__setattr__`: how a frozen
# dataclass with slots is made at about the cost of a tuple
# (`native/python_instances.cc`); its own `__init__` costs several times
# more. Pure Python where the module is not built.
new_instance: Callable[..., Any] = (
    native.new_instance if native is not None else _fill_slots)


def _python_feed(cls: type, head: tuple, tail: tuple, devices: dict,
                 callback: Callable[[Any], Any],
                 failed: Callable[[Any, Exception], Any],
                 fallback: Callable[..., Any]) -> Callable[..., Any]:
  """`instance_feed` where the native module is not built: `fallback`."""
  del cls, head, tail, devices, callback, failed
  return fallback


# `instance_feed(cls, head, tail, devices, callback, failed, fallback)`: a
# consumer `feed(arrays, device_id)` that calls `callback(new_instance(cls,
# *head, step, value, *tail, devices[device_id]))` for `arrays` of a step
# (an int >= 0) and a value, in C, and `fallback`, the same consumer in
# Python, for any other call (`native/python_instances.cc`); an Exception
# from `callback` goes to `failed(callback, error)`. Where the module is not
# built, `fallback` itself.
instance_feed: Callable[..., Callable[..., Any]] = (
    native.instance_feed if native is not None else _python_feed)


# Tests only: `native._testing_cuda_standin(path)` installs the CUDA
# stand-in of tests/cuda_standin/ (refused unless
# HOST_CALLBACK_ALLOW_CUDA_STANDIN=1), and `_testing_cuda_tap` and
# `_testing_cuda_call` make a tap or call as the CUDA handlers do, with host
# memory for device memory; see tests/test_cuda_transport.py.


# --- Executions in flight (see native/executions.h) ----------------------

def executions() -> Tuple[int, int, int]:
  """Executions of our computations begun ever, in flight now, and the
  fewest in flight right after one ended since the last
  `reset_executions_low_water` (a huge number when none ended)."""
  assert native is not None, "the native transport is not built"
  return native.executions()


def reset_executions_low_water() -> None:
  assert native is not None, "the native transport is not built"
  native.reset_executions_low_water()


def execution_failed() -> None:
  """An execution stopped at one of our Python callbacks, which raised."""
  assert native is not None, "the native transport is not built"
  native.execution_failed()


def pool_stats() -> Dict[str, int]:
  """The native block pool: free bytes and blocks, blocks out of the pool
  (queued or viewed by arrays) and bytes mapped in all."""
  assert native is not None, "the native transport is not built"
  return dict(zip(("free_bytes", "free_blocks", "blocks_out", "mapped_bytes"),
                  native.pool_stats()))
