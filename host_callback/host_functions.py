"""The user's host functions, and the consumers that run them on packets."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence, Tuple

import jax
import numpy as np

# A transformation entry as stored in primitive params (hashable):
# (name, ((param_name, value), ...)).
Transforms = Tuple[Tuple[str, Tuple[Tuple[str, Any], ...]], ...]


@dataclasses.dataclass(frozen=True, eq=False)
class HostFunction:
  """A host function and how to call it; hashed by identity.

  `result_treedef`/`result_avals` are set for `call` only.
  """
  func: Callable[..., Any]
  arg_treedef: Any
  with_device: bool
  is_call: bool
  result_treedef: Any = None
  result_avals: Tuple[jax.core.ShapedArray, ...] = ()

  @property
  def name(self) -> str:
    return getattr(self.func, "__name__", repr(self.func))


class CallError(RuntimeError):
  """A `call`'s host function raised, or returned a value of the wrong kind."""


def unpack_transforms(transforms: Transforms) -> Tuple[Tuple[Any, ...], ...]:
  """The `transforms` argument a tap function receives, as the original's:
  `(name, params)`, or `(name,)` for an entry without params."""
  return tuple((name, dict(params)) if params else (name,)
               for name, params in transforms)


def _describe(dtype: Any, shape: Sequence[int]) -> str:
  return f"{jax.numpy.dtype(dtype).name}{list(shape)}"


def _check_results(function: HostFunction, result: Any) -> Sequence[np.ndarray]:
  """The flat results as arrays, or CallError when they do not match."""
  leaves, treedef = jax.tree_util.tree_flatten(result)
  if treedef != function.result_treedef:
    raise CallError(
        f"host_callback.call: {function.name} returned a value with structure "
        f"{treedef} where result_shape expects {function.result_treedef}")
  arrays = []
  for leaf, aval in zip(leaves, function.result_avals):
    array = np.asarray(leaf)
    # An exact match needs no canonicalisation (which depends on the x64
    # setting of this thread, not of the one that traced the call).
    dtype = (array.dtype if array.dtype == aval.dtype
             else jax.dtypes.canonicalize_dtype(array.dtype))
    if array.shape != aval.shape or dtype != aval.dtype:
      raise CallError(
          f"host_callback.call: {function.name} returned "
          f"{_describe(array.dtype, array.shape)} where result_shape expects "
          f"{_describe(aval.dtype, aval.shape)}")
    arrays.append(array.astype(dtype, copy=False))
  return arrays


def make_consumer(function: HostFunction, transforms: Transforms,
                  device_by_id: Callable[[int], Any]
                  ) -> Callable[[Sequence[np.ndarray], int],
                                Optional[Sequence[np.ndarray]]]:
  """The receiver-side consumer for one (host function, transforms) pair."""
  unpacked = unpack_transforms(transforms)

  def consume(arrays: Sequence[np.ndarray], device_id: int
              ) -> Optional[Sequence[np.ndarray]]:
    arg = jax.tree_util.tree_unflatten(function.arg_treedef, list(arrays))
    kwargs = {"device": device_by_id(device_id)} if function.with_device else {}
    if not function.is_call:
      function.func(arg, unpacked, **kwargs)
      return None
    try:
      result = function.func(arg, **kwargs)
    except Exception as error:
      raise CallError(
          f"host_callback.call: {function.name} raised "
          f"{type(error).__name__}: {error}") from error
    return _check_results(function, result)

  return consume
