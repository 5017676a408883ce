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
import threading
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

ABI_VERSION = 31


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


# Tests only: `native._testing_cuda_standin(path)` installs the CUDA
# stand-in of tests/cuda_standin/ (refused unless
# HOST_CALLBACK_ALLOW_CUDA_STANDIN=1), and `_testing_cuda_tap` and
# `_testing_cuda_call` make a tap or call as the CUDA handlers do, with host
# memory for device memory; see tests/test_cuda_transport.py.
# `_testing_floor_handlers(function)` gives the FFI handlers of the floors
# that tools/bench/floors.py times (one does nothing, the other calls
# `function` with the GIL), for it to register.


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


# --- Dispatches and the idle check (native/dispatches.h, idle_check.cc) ---

def dispatch_hook() -> Callable[..., None]:
  """The builtin that counts one dispatch on the calling thread and notes
  a weak reference to an array it output, the fourth argument: what JAX
  calls after each dispatch (a Python function would cost every dispatch
  more)."""
  assert native is not None, "the native transport is not built"
  return native.note_dispatch


def configure_idle_check(
    given_up: Tuple[Any, str], lowerings: Tuple[Any, str],
    empty: Sequence[Tuple[Any, str]], same: Sequence[Tuple[Any, str, Any]],
    drained: Sequence[Tuple[Any, str, str, str]], array_type: type,
    consumed_here: int) -> None:
  """What the idle check reads besides the native counts, each as (object,
  attribute name): the executions in flight that barriers gave up on, the
  computations over several devices lowered, attributes that must be
  empty, attributes that must be the given object, and (object,
  attribute, enqueued, finished): a dict of queues, each of which must
  have its attributes `enqueued` and `finished` equal. `array_type`: the
  type of the arrays a dispatch outputs, whose `is_ready()` tells whether
  the dispatch has finished. `consumed_here`: the most taps waiting on a
  queue that a barrier runs on its own thread once the dispatches it waits
  for have finished. Forgets the barriers that waited."""
  assert native is not None, "the native transport is not built"
  native.idle_check_configure(_from_namespace(given_up),
                              _from_namespace(lowerings),
                              tuple(map(_from_namespace, empty)),
                              tuple(map(_from_namespace, same)),
                              tuple(map(_from_namespace, drained)),
                              array_type, consumed_here)


def _from_namespace(watch: Sequence[Any]) -> Tuple[Any, ...]:
  """`watch` = (object, attribute, ...) as the idle check reads it fastest:
  (the object's namespace dict, attribute, ...) where the attribute lives
  there (a dict lookup instead of getattr's walk over the type; the object
  keeps that dict for life), else unchanged (a thread-local object's
  attributes differ by thread, a property runs code)."""
  owner, attribute, *rest = watch
  if isinstance(owner, threading.local):
    return tuple(watch)
  try:
    namespace = vars(owner)
  except TypeError:  # no __dict__ (slots, a builtin object)
    return tuple(watch)
  if attribute not in namespace:
    return tuple(watch)
  return (namespace, attribute, *rest)


def idle_check_begin() -> None:
  """A barrier on this thread begins to wait on the probes of every
  device: notes the counts it begins with."""
  assert native is not None, "the native transport is not built"
  native.idle_check_begin()


def idle_check_waited(covered: bool) -> None:
  """The barrier that began waited; `covered`: its probes covered every
  device, so that the next barrier on this thread may be idle."""
  assert native is not None, "the native transport is not built"
  native.idle_check_waited(covered)


def idle_check() -> Callable[[], bool]:
  """`idle_now()`: whether a barrier on this thread would find nothing to
  wait for, release or raise (native/idle_check.cc). The module's builtin,
  which the barrier calls with no Python frame between."""
  assert native is not None, "the native transport is not built"
  return native.idle_now


def idle_check_forget() -> None:
  """No barrier is idle until one waits after the next
  `configure_idle_check`."""
  assert native is not None, "the native transport is not built"
  native.idle_check_forget()


def idle_barrier(wait: Callable[[Optional[str]], None],
                 logs: Callable[[], bool], doc: str,
                 module: str) -> Callable[..., None]:
  """`barrier_wait(logging_name=None)` in C: returns at once where the
  idle check holds and `logs()` is false, else calls `wait(logging_name)`;
  its docstring `doc` (after a line with its signature), from `module`."""
  assert native is not None, "the native transport is not built"
  return native.idle_barrier(wait, logs, doc, module)


def plain_tap(func: Callable[[Any, Any], Any], transforms: Any,
              failed: Callable[[int], None]
              ) -> Optional[Callable[[Sequence[Any], int], Any]]:
  """A tap's consumer in C, `consumer(arrays, device_id)`: calls
  `func(arrays[0], transforms)`, and on an exception `failed(device_id)`
  before it goes on (native/python_plain_tap.h), which the native runners
  call with no Python frame between; None where the module is not
  built."""
  return None if native is None else native.plain_tap(func, transforms,
                                                       failed)


def taken_runner() -> Optional[Callable[..., None]]:
  """`run_taken(taken, popleft, consumers, counts, slots, failed,
  mark_finished, mark_count_finished, device_id)`: a receiver thread's
  taken packets run in C (native/python_consume.cc); None where the native
  module is not built."""
  return None if native is None else native.run_taken


def pool_stats() -> Dict[str, int]:
  """The native block pool: free bytes and blocks, blocks out of the pool
  (queued or viewed by arrays) and bytes mapped in all."""
  assert native is not None, "the native transport is not built"
  return dict(zip(("free_bytes", "free_blocks", "blocks_out", "mapped_bytes"),
                  native.pool_stats()))
