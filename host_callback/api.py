"""The public API: id_tap, id_print, call, barrier_wait, stop_outfeed_receiver."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, TextIO, Tuple

import jax
import numpy as np

from . import primitive, runtime
from .host_functions import HostFunction
from .printing import Printer
from .receiver import QueueStats


def _check_callable(value: Any, name: str, api: str) -> None:
  if not callable(value):
    raise TypeError(
        f"host_callback.{api}: {name} must be callable, got "
        f"{type(value).__name__}: {value!r}")


def _flatten_arg(arg: Any, api: str) -> tuple[list, Any]:
  """The leaves of `arg` as JAX values; rejects non-numeric leaves."""
  leaves, treedef = jax.tree_util.tree_flatten(arg)
  for i, leaf in enumerate(leaves):
    if isinstance(leaf, (str, bytes)) or not (
        hasattr(leaf, "dtype") or isinstance(leaf, (bool, int, float, complex,
                                                   np.generic))):
      raise TypeError(
          f"host_callback.{api}: every leaf of arg must be an array or a "
          f"numeric scalar; leaf {i} of arg is {type(leaf).__name__}: "
          f"{leaf!r}. Pass non-array values to the host function with a "
          "closure or functools.partial instead.")
  return leaves, treedef


def _check_device_index(device_index: int, api: str) -> None:
  count = jax.device_count()
  if not isinstance(device_index, int) or not 0 <= device_index < count:
    raise ValueError(
        f"host_callback.{api}: device_index={device_index!r} is out of range; "
        f"there are {count} device(s), so use 0 to {count - 1}")


def id_tap(tap_func: Callable[..., Any], arg: Any, *, result: Any = None,
           tap_with_device: bool = False, device_index: int = 0,
           **kwargs: Any) -> Any:
  """Host-side tap primitive: calls `tap_func(arg, transforms)` on the host.

  Behaves as the identity on `arg` (or returns `result` when given, after the
  tap). The call happens asynchronously on a receiver thread; use
  `barrier_wait()` to wait for it. With `tap_with_device=True` the function
  also receives `device=` the `jax.Device` that executed the tap.
  """
  if kwargs:
    raise TypeError(
        "Support for **kwargs in ``id_tap`` has been removed. Instead, "
        "pre-apply keyword arguments, either by using a closure or by passing "
        "``functools.partial(tap_func, **kwargs)``. Got unexpected keyword "
        f"arguments: {sorted(kwargs)}")
  _check_callable(tap_func, "tap_func", "id_tap")
  _check_device_index(device_index, "id_tap")
  arg_leaves, arg_treedef = _flatten_arg(arg, "id_tap")
  result_leaves, result_treedef = jax.tree_util.tree_flatten(result)
  function = HostFunction(tap_func, arg_treedef, with_device=tap_with_device,
                          is_call=False)
  out = primitive.bind([*arg_leaves, *result_leaves], function=function,
                       num_args=len(arg_leaves), device_index=device_index)
  if result is None:
    return jax.tree_util.tree_unflatten(arg_treedef, out[:len(arg_leaves)])
  return jax.tree_util.tree_unflatten(result_treedef, out[len(arg_leaves):])


def id_print(arg: Any, *, result: Any = None, tap_with_device: bool = False,
             device_index: int = 0, output_stream: Optional[TextIO] = None,
             threshold: Optional[int] = None, **kwargs: Any) -> Any:
  """Like `id_tap` with a printing tap function.

  Prints a line `k: v ...` for `kwargs` (and `transforms`, `device`) when
  there are any, then the value; to `output_stream` or with `print`.
  """
  printer = Printer(output_stream, threshold, kwargs)
  return id_tap(printer, arg, result=result, tap_with_device=tap_with_device,
                device_index=device_index)


def _result_avals(result_shape: Any) -> tuple[Any, tuple]:
  leaves, treedef = jax.tree_util.tree_flatten(result_shape)
  avals = []
  for leaf in leaves:
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
      shape, dtype = tuple(leaf.shape), leaf.dtype
    elif isinstance(leaf, (bool, int, float, complex, np.generic)) and not (
        isinstance(leaf, (str, bytes))):
      array = np.asarray(leaf)
      shape, dtype = array.shape, array.dtype
    else:
      raise ValueError(
          "host_callback.call: result_shape has a leaf of type "
          f"{type(leaf).__name__} ({leaf!r}). The values must be either "
          "numeric scalars, or must have 'shape' and 'dtype' attributes.")
    avals.append(jax.core.ShapedArray(
        shape, jax.dtypes.canonicalize_dtype(dtype)))
  return treedef, tuple(avals)


def call(callback_func: Callable[..., Any], arg: Any, *,
         result_shape: Any = None, call_with_device: bool = False,
         device_index: int = 0) -> Any:
  """Calls `callback_func(arg)` on the host and returns its result.

  `result_shape` is a pytree of `jax.ShapeDtypeStruct`s, arrays or numeric
  scalars describing the result (`None` for no result). The host result must
  match it in structure, shape and dtype, or the computation fails with an
  error naming the callback and the cause.
  """
  _check_callable(callback_func, "callback_func", "call")
  _check_device_index(device_index, "call")
  arg_leaves, arg_treedef = _flatten_arg(arg, "call")
  result_treedef, result_avals = _result_avals(result_shape)
  function = HostFunction(callback_func, arg_treedef,
                          with_device=call_with_device, is_call=True,
                          result_treedef=result_treedef,
                          result_avals=result_avals)
  out = primitive.bind(arg_leaves, function=function,
                       num_args=len(arg_leaves), device_index=device_index)
  return jax.tree_util.tree_unflatten(result_treedef, out)


def barrier_wait(logging_name: Optional[str] = None) -> None:
  """Blocks until every callback from computations already started is done.

  Covers every local device and computations dispatched from any Python
  thread. Then raises `CallbackException` if a callback raised since the last
  barrier.
  """
  runtime.barrier_wait(logging_name)


def stop_outfeed_receiver() -> None:
  """Waits for pending callbacks, then stops the receiver threads.

  The next use of the API starts them again.
  """
  runtime.stop_outfeed_receiver()


def queue_statistics() -> Dict[Tuple[str, jax.Device], QueueStats]:
  """Per-device receiver queue statistics, by (transport name, device).

  Each `QueueStats` has `bytes_waiting`, `packets_waiting` (sent and not yet
  consumed), `high_water_bytes` (the most bytes ever waiting) and
  `max_bytes` (the bound). An extension: the original had no such function.
  """
  return runtime.queue_statistics()
