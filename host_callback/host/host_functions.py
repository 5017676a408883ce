"""The host functions, one frozen class of parameters per kind (the
primitive's `function` param), and the consumers that run them on packets."""

from __future__ import annotations

import dataclasses
import functools
import operator
import threading
import weakref
from typing import (Any, Callable, Dict, Hashable, List, NamedTuple, Optional,
                    Sequence, Tuple)

import jax
import numpy as np

from . import stop_listeners
from ..receiver import ctrl_c, transport_native

# A transformation entry as stored in primitive params (hashable):
# (name, ((param_name, value), ...)).
Transforms = Tuple[Tuple[str, Tuple[Tuple[str, Any], ...]], ...]


class Shard(NamedTuple):
  """Where a host function's shard lies (`tap_with_shard=True`, or
  `call_with_shard=True`), as `jax.Array.addressable_shards` says it: for
  each leaf of `arg` (a pytree like `arg`), the `index` of the shard in the
  global value (a tuple of slices), the `global_shape`, and the
  `replica_id` (0 for the first device, in the mesh's order, that holds
  that part: a replicated value gives each device a shard with the same
  index)."""
  device: Any
  index: Any
  global_shape: Any
  replica_id: Any


# One leaf's part on a device: (start, stop) of each dimension.
Part = Tuple[Tuple[Optional[int], Optional[int]], ...]


@dataclasses.dataclass(frozen=True)
class ShardTable:
  """Each device's `Shard` of a partitioned site, hashable (slices are not,
  before Python 3.12): by device number, each sent leaf's part and replica
  id; and the leaves' global shapes."""
  parts: Tuple[Tuple[int, Tuple[Part, ...], Tuple[int, ...]], ...]
  global_shapes: Tuple[Tuple[int, ...], ...]

  def shards(self, device_by_number: Callable[[int], Any],
             treedef: Any) -> Dict[int, Shard]:
    global_shape = _unflatten(treedef, self.global_shapes)
    return {number: Shard(device_by_number(number),
                          _unflatten(treedef, [
                              tuple(slice(*bounds) for bounds in part)
                              for part in parts]),
                          global_shape, _unflatten(treedef, replicas))
            for number, parts, replicas in self.parts}


def whole_value_shard(device: Any, treedef: Any,
                      arrays: Sequence[np.ndarray]) -> Shard:
  """The `Shard` of a value that is not split (one device, or the
  per-device value of `shard_map` and `pmap`): the whole of it."""
  return Shard(device,
               _unflatten(treedef, [tuple(slice(None) for _ in a.shape)
                                    for a in arrays]),
               _unflatten(treedef, [tuple(a.shape) for a in arrays]),
               _unflatten(treedef, [0] * len(arrays)))


def _unflatten(treedef: Any, leaves: Sequence[Any]) -> Any:
  """The pytree `treedef` with one entry per sent leaf."""
  return jax.tree_util.tree_unflatten(treedef, list(leaves))


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class HostFunction:
  """A host function and how to call it: the primitive's `function` param,
  one frozen class per kind, as JAX's callback primitives carry theirs.
  Hashed by identity, so make equal ones one object with `interned`.

  `copy` False: the function gets read-only arrays that may view the
  device's buffers (`copy=False`). `partitioned`: in automatically sharded
  code, each device sends its own shard (see `partitioned.py`).
  """
  func: Callable[..., Any]
  copy: bool = True
  partitioned: bool = False

  @property
  def name(self) -> str:
    return getattr(self.func, "__name__", repr(self.func))

  def _signature(self) -> Tuple[Hashable, ...]:
    """The kind and every field but `func`, which equal host functions
    share too."""
    return (type(self), *(getattr(self, field.name)
                          for field in dataclasses.fields(self)
                          if field.name != "func"))


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class CallKind(HostFunction):
  """The kinds that are calls: the op returns `result_avals`, the host
  function's results, where a tap's returns its operands."""
  result_avals: Tuple[jax.core.ShapedArray, ...]


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class UserKind(HostFunction):
  """The kinds whose `func` is the user's, called with `arg` as the tree
  `arg_treedef`. `with_device`: it gets `device=`; `with_shard`: it gets
  `shard=`, from `shard_table` where the value is split."""
  arg_treedef: Any
  with_device: bool = False
  with_shard: bool = False
  shard_table: Optional[ShardTable] = None


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class ConsumerKind(HostFunction):
  """The kinds whose `func` is a consumer already, which names the context
  of its errors itself (`context`): called as `func(arrays, device_id)`,
  with `transforms=` (as a tap function gets them) where there are any."""
  context: Callable[[], str]


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class TapParams(UserKind):
  """`id_tap`'s: `func(arg, transforms[, device=][, shard=])`."""


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class CallParams(UserKind, CallKind):
  """`call`'s: `func(arg[, device=][, shard=])` returns a pytree
  `result_treedef` of arrays as `result_avals` say."""
  result_treedef: Any


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class BuffersCallParams(CallParams):
  """A `buffers=True` call's (`copy` False): the results are taken as the
  function returns them (arrays that export DLPack, exactly as
  `result_avals` says), or, with `fills_out`, the function fills `out=` in
  place; `with_stream`: it gets `stream=`, the GPU's stream where it runs
  on a GPU's buffers, else None."""
  fills_out: bool = False
  with_stream: bool = False


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class ConsumerTapParams(ConsumerKind):
  """A tap of `api.consumer_tap` (the loop lens's), or the eager tap ops'
  dispatcher (eager.py). `int_operands` (set by `api.consumer_tap` alone):
  the operands that it gets as Python ints where they are int32 scalars
  (the site's `int_columns`; batched by `vmap`, an array)."""
  int_operands: Tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class ConsumerCallParams(ConsumerKind, CallKind):
  """The eager call ops' dispatcher (eager.py)."""


# Every kind that is made, each held weakly by JAX's caches (primitive.py).
KINDS = (TapParams, CallParams, BuffersCallParams, ConsumerTapParams,
         ConsumerCallParams)


def result_avals(function: HostFunction) -> Tuple[jax.core.ShapedArray, ...]:
  """What the host function returns to the device: a call's results,
  nothing for a tap."""
  return function.result_avals if isinstance(function, CallKind) else ()


def int_operands(function: HostFunction) -> Tuple[int, ...]:
  """The operands that the host function gets as Python ints where they
  are int32 scalars: a consumer tap's `int_operands`, else none."""
  return (function.int_operands if isinstance(function, ConsumerTapParams)
          else ())


def _hash_of(func: Callable[..., Any]) -> int:
  try:
    return hash(func)
  except TypeError:
    return id(func)


def _same_callable(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
  """`a == b` (bound methods of one object are equal, not identical), or
  identity when equality fails."""
  if a is b:
    return True
  try:
    return bool(a == b)
  except Exception:  # pylint: disable=broad-except
    return False


class _Interner:
  """The live host functions, held weakly, by hash of (callable, rest)."""

  def __init__(self) -> None:
    # Reentrant: `_forget` runs from a weakref callback, so maybe on a thread
    # that holds the lock in `intern` (which allocates, so may collect).
    self._lock = threading.RLock()
    self._buckets: Dict[Hashable, List[weakref.ref]] = {}

  def intern(self, function: HostFunction) -> HostFunction:
    key = (_hash_of(function.func), function._signature())
    with self._lock:
      bucket = self._buckets.setdefault(key, [])
      for ref in list(bucket):  # the key holds the signature: compare callables
        live = ref()
        if live is not None and _same_callable(live.func, function.func):
          return live
      bucket.append(weakref.ref(function, lambda r: self._forget(key, r)))
      return function

  def _forget(self, key: Hashable, ref: weakref.ref) -> None:
    with self._lock:
      bucket = self._buckets.get(key, [])
      if ref in bucket:
        bucket.remove(ref)
      if not bucket:
        self._buckets.pop(key, None)


_interner = _Interner()


def interned(function: HostFunction) -> HostFunction:
  """The live host function equal to `function` (same callable, by `==`,
  same kind, trees and flags), or `function` itself. Equal host functions thus
  share traces, compilations and consumers, as in the original, whose
  registry was keyed by the callable."""
  return _interner.intern(function)


class CallError(jax.errors.JaxRuntimeError):
  """A `call`'s host function raised, or returned a value of the wrong kind.

  A `jax.errors.JaxRuntimeError`: JAX's GPU callbacks (the Python transport
  there) raise it to the caller as it is, where JAX's CPU callbacks raise a
  `JaxRuntimeError` that names it."""


def unpack_transforms(transforms: Transforms) -> Tuple[Tuple[Any, ...], ...]:
  """The `transforms` argument a tap function receives, as the original's:
  `(name, params)` entries, params a dict, empty for "transpose"."""
  return tuple((name, dict(params)) for name, params in transforms)


def _describe(dtype: Any, shape: Sequence[int]) -> str:
  return f"{jax.numpy.dtype(dtype).name}{list(shape)}"


_ONE_ARRAY = jax.tree_util.tree_structure(0)
_NOTHING = jax.tree_util.tree_structure(None)


def _describe_tree(treedef: Any, shapes: Sequence[str]) -> str:
  """A result's structure in words, e.g. 'one array float32[3]'."""
  if treedef == _NOTHING:
    return "None (no result)"
  if treedef == _ONE_ARRAY:
    return f"one array {shapes[0]}"
  return (f"a pytree of {treedef.num_leaves} array(s) ({', '.join(shapes)}) "
          f"structured as {treedef}")


def _structure_error(function: CallParams, leaves: Sequence[Any],
                     treedef: Any) -> CallError:
  returned = [_describe(np.asarray(x).dtype, np.shape(x)) for x in leaves]
  expected = [_describe(a.dtype, a.shape) for a in function.result_avals]
  message = (f"host_callback.call: {function.name} returned "
             f"{_describe_tree(treedef, returned)}, but result_shape "
             f"describes {_describe_tree(function.result_treedef, expected)}. "
             "Describe the result with result_shape=jax.ShapeDtypeStruct("
             "shape, dtype), or a pytree of them")
  if function.result_treedef == _NOTHING:
    message += " (result_shape=None, its default, means no result)"
  elif expected and all(a.shape == () and jax.numpy.issubdtype(
      a.dtype, np.integer) for a in function.result_avals):
    message += ("; a tuple of ints such as (3,) describes integer scalars, "
                "not a shape: for an array of shape (3,) write "
                "jax.ShapeDtypeStruct((3,), dtype)")
  return CallError(message + ".")


def _check_results(function: CallParams, result: Any) -> Sequence[np.ndarray]:
  """The flat results as arrays, or CallError when they do not match."""
  if (function.result_treedef == _ONE_ARRAY and type(result) is np.ndarray  # pylint: disable=unidiomatic-typecheck
      and result.dtype == function.result_avals[0].dtype
      and result.shape == function.result_avals[0].shape):
    return [result]  # the usual result, exact already
  leaves, treedef = jax.tree_util.tree_flatten(result)
  if treedef != function.result_treedef:
    raise _structure_error(function, leaves, treedef)
  arrays = []
  for leaf, aval in zip(leaves, function.result_avals):
    array = np.asarray(leaf)
    if not array.dtype.isnative:  # e.g. big-endian '>f4' read from a file
      array = array.astype(array.dtype.newbyteorder("="))
    # An exact match needs no canonicalisation (which depends on the x64
    # setting of this thread, not of the one that traced the call).
    dtype = (array.dtype if array.dtype == aval.dtype
             else jax.dtypes.canonicalize_dtype(array.dtype))
    if array.shape != aval.shape or dtype != aval.dtype:
      raise CallError(
          f"host_callback.call: {function.name} returned "
          f"{_describe(array.dtype, array.shape)} where result_shape expects "
          f"{_describe(aval.dtype, aval.shape)}")
    cast = array.astype(dtype, copy=False)
    if cast is not array:
      _check_integers_fit(function, array, cast)
    arrays.append(cast)
  return arrays


def _check_integers_fit(function: CallParams, array: np.ndarray,
                        cast: np.ndarray) -> None:
  """Canonicalisation narrows integers (int64 to int32 without x64): a value
  that does not fit would wrap, so it is an error, as NumPy 2's
  `np.asarray(2**40 + 5, np.int32)` is."""
  if not (np.issubdtype(array.dtype, np.integer) and
          np.issubdtype(cast.dtype, np.integer)):
    return
  wrapped = cast != array
  if np.any(wrapped):
    value = array[wrapped].flat[0] if array.ndim else array.item()
    raise CallError(
        f"host_callback.call: {function.name} returned the integer {value}, "
        f"which does not fit the {cast.dtype.name} that result_shape "
        f"expects ({np.iinfo(cast.dtype).min} to {np.iinfo(cast.dtype).max}); "
        "return a value in range, or enable jax_enable_x64 for a 64-bit "
        "result_shape")


def _argument_builder(treedef: Any) -> Callable[[Sequence[np.ndarray]], Any]:
  """How a consumer turns its arrays into the host function's `arg`: the
  array itself for a single array (no tree to unflatten), else the tree."""
  if treedef == _ONE_ARRAY:
    return operator.itemgetter(0)
  return functools.partial(jax.tree_util.tree_unflatten, treedef)


_Consumer = Callable[..., Optional[Sequence[Any]]]


@functools.singledispatch
def make_consumer(function: HostFunction, transforms: Transforms,
                  device_by_number: Callable[[int], Any]) -> _Consumer:
  """The receiver-side consumer for one (host function, transforms) pair,
  made by the function of its kind, registered below.

  What does not change between packets (the tree, the transforms, the
  device objects) is prepared once, here.
  """
  raise TypeError(f"host_callback: no consumer for {type(function).__name__}")


@make_consumer.register
def _consumer_already(function: ConsumerKind, transforms: Transforms,
                      device_by_number: Callable[[int], Any]) -> _Consumer:
  """`func` itself, given `transforms=` where there are any."""
  del device_by_number
  if transforms:
    return functools.partial(function.func,
                             transforms=unpack_transforms(transforms))
  return function.func


def _device_kwargs(function: UserKind, device_by_number: Callable[[int], Any]
                   ) -> Callable[[int, Sequence[np.ndarray]], Dict[str, Any]]:
  """`device=` and `shard=` by device, as the function asked; prepared once
  per device, except the shard of a value that is not split."""
  devices: Dict[int, Dict[str, Any]] = {}
  shards = (function.shard_table.shards(device_by_number,
                                        function.arg_treedef)
            if function.shard_table is not None else None)

  def device_kwargs(device_id: int,
                    arrays: Sequence[np.ndarray]) -> Dict[str, Any]:
    kwargs = devices.get(device_id)
    if kwargs is None:
      device = device_by_number(device_id)
      kwargs = {"device": device} if function.with_device else {}
      if shards is not None:
        kwargs["shard"] = shards[device_id]
      devices[device_id] = kwargs
    if function.with_shard and shards is None:
      # Not split (each site's own shapes): the whole value.
      return {**kwargs, "shard": whole_value_shard(
          device_by_number(device_id), function.arg_treedef, arrays)}
    return kwargs

  return device_kwargs


def _tap_failed(device_id: int) -> None:
  """What a tap's consumer does when its host function raised."""
  stop_listeners.notify(device_id, is_call=False)


@make_consumer.register
def _tap_consumer(function: TapParams, transforms: Transforms,
                  device_by_number: Callable[[int], Any]) -> _Consumer:
  func = function.func
  argument = _argument_builder(function.arg_treedef)
  unpacked = unpack_transforms(transforms)
  if not (function.with_device or function.with_shard):
    # One array: the native runners call `func` itself, with no frame of
    # ours between (where the native module is built).
    in_c = (transport_native.plain_tap(func, unpacked, _tap_failed)
            if function.arg_treedef == _ONE_ARRAY else None)
    if in_c is not None:
      return in_c

    def tap(arrays: Sequence[np.ndarray], device_id: int) -> None:
      try:
        func(argument(arrays), unpacked)
      except BaseException:
        _tap_failed(device_id)
        raise
    return tap

  device_kwargs = _device_kwargs(function, device_by_number)

  def tap_with_device(arrays: Sequence[np.ndarray], device_id: int) -> None:
    try:
      func(argument(arrays), unpacked, **device_kwargs(device_id, arrays))
    except BaseException:
      _tap_failed(device_id)
      raise
  return tap_with_device


@make_consumer.register
def _call_consumer(function: CallParams, transforms: Transforms,
                   device_by_number: Callable[[int], Any]) -> _Consumer:
  del transforms  # a call has none: vmap maps it, jvp and transpose refuse
  func = function.func
  argument = _argument_builder(function.arg_treedef)
  device_kwargs = _device_kwargs(function, device_by_number)

  def call(arrays: Sequence[np.ndarray], device_id: int,
           outputs: Optional[Sequence[np.ndarray]] = None
           ) -> Sequence[np.ndarray]:
    del outputs  # lent by a direct run; only a buffers=True call fills them
    result = _run_call(function, device_id, func, argument(arrays),
                       device_kwargs(device_id, arrays))
    return _check_results(function, result)

  return call


def _run_call(function: CallParams, device_id: int,
              func: Callable[..., Any], arg: Any,
              kwargs: Dict[str, Any]) -> Any:
  """`func(arg, **kwargs)`, a call's host function: what it raises is a
  CallError naming it, chained to the error (Ctrl-C is raised as it is),
  and the device's stop listeners hear of it."""
  try:
    return func(arg, **kwargs)
  except BaseException as error:
    stop_listeners.notify(device_id, is_call=True)
    # A KeyboardInterrupt of its own is its error too; Ctrl-C is not.
    if (not isinstance(error, (Exception, KeyboardInterrupt)) or
        ctrl_c.stopped_by_ctrl_c(error)):
      raise
    raise CallError(
        f"host_callback.call: {function.name} raised "
        f"{type(error).__name__}: {error}") from error


# --- buffers=True: results taken as they are, or filled in place ------------

_DLPACK_CPU = 1  # DLPack's kDLCPU


@make_consumer.register
def _buffers_consumer(function: BuffersCallParams, transforms: Transforms,
                      device_by_number: Callable[[int], Any]) -> _Consumer:
  """The consumer of a `buffers=True` call. With `out=`, the function fills
  the `outputs` that a direct run lends (writable bytes of the device's
  result buffers, typed here as `result_avals`), which are then its results
  and are not copied; else new arrays, which the transport copies once into
  the device's buffers. On a GPU (`stream` given) its arrays and outputs
  are the GPU's buffers (`device_buffers.CudaBuffer`), and returned arrays
  are copied into the outputs on the stream."""
  del transforms  # as a call's
  func = function.func
  argument = _argument_builder(function.arg_treedef)
  device_kwargs = _device_kwargs(function, device_by_number)

  def call(arrays: Sequence[Any], device_id: int,
           outputs: Optional[Sequence[Any]] = None,
           stream: Optional[int] = None) -> Optional[Sequence[Any]]:
    kwargs = device_kwargs(device_id, arrays)  # shared: not to be changed
    if function.with_stream:
      kwargs = {**kwargs, "stream": stream}
    if not function.fills_out:
      result = _run_call(function, device_id, func, argument(arrays), kwargs)
      if stream is not None:
        return _copied_on_device(function, result, outputs)
      return _exported_results(function, result)
    outs = _out_buffers(function.result_avals, outputs)
    out = jax.tree_util.tree_unflatten(function.result_treedef, outs)
    result = _run_call(function, device_id, func, argument(arrays),
                       {**kwargs, "out": out})
    _check_filled(function, result, out)
    return outs

  return call


def _out_buffers(avals: Sequence[jax.core.ShapedArray],
                 outputs: Optional[Sequence[Any]]) -> List[Any]:
  """`out=`'s leaves: the lent result buffers (host bytes, or a GPU's
  buffers) typed as `avals`, or new arrays where none were lent."""
  if outputs is None:
    return [np.empty(a.shape, a.dtype) for a in avals]
  return [raw.view(a.dtype).reshape(a.shape) if isinstance(raw, np.ndarray)
          else raw.typed(a.dtype, a.shape)
          for raw, a in zip(outputs, avals)]


def _copied_on_device(function: BuffersCallParams, result: Any,
                      outputs: Sequence[Any]) -> List[Any]:
  """The results of a `buffers=True` call on a GPU, copied into the lent
  result buffers on the GPU's stream, or CallError when one is not an
  array on that GPU exactly as `result_shape` says."""
  leaves, treedef = jax.tree_util.tree_flatten(result)
  if treedef != function.result_treedef:
    raise _structure_error(function, leaves, treedef)
  buffers = _out_buffers(function.result_avals, outputs)
  for leaf, aval, buffer in zip(leaves, function.result_avals, buffers):
    try:
      buffer.copy_from(leaf)
    except (TypeError, ValueError) as error:
      raise CallError(
          f"host_callback.call: {function.name} returned {error} where "
          f"result_shape expects {_describe(aval.dtype, aval.shape)} on GPU "
          f"{buffer.gpu}; with buffers=True on a GPU, return arrays on that "
          "GPU that export __cuda_array_interface__ (CuPy, PyTorch, Numba), "
          "with that shape and dtype, or fill out=") from error
  return buffers


def _check_filled(function: BuffersCallParams, result: Any, out: Any) -> None:
  """A function given `out=` returns None (or `out` itself, as NumPy's
  `out=` functions do)."""
  if result is None or result is out:
    return
  raise CallError(
      f"host_callback.call: {function.name} takes out=, so it fills the "
      "result buffers that result_shape describes in place and returns "
      f"None; it returned {type(result).__name__}. Write into out (e.g. "
      "out[...] = value) and return None, or drop its out parameter to "
      "return the result")


def _exported_results(function: BuffersCallParams,
                      result: Any) -> Sequence[np.ndarray]:
  """The flat results of a `buffers=True` call as NumPy arrays over the
  returned arrays' memory (DLPack; no copy), or CallError when one is not
  an array on the CPU exactly as `result_shape` says (no conversion)."""
  leaves, treedef = jax.tree_util.tree_flatten(result)
  if treedef != function.result_treedef:
    raise _structure_error(function, leaves, treedef)
  return [_exported(function, leaf, aval)
          for leaf, aval in zip(leaves, function.result_avals)]


def _exported(function: BuffersCallParams, leaf: Any,
              aval: jax.core.ShapedArray) -> np.ndarray:
  expected = _describe(aval.dtype, aval.shape)
  if isinstance(leaf, np.ndarray):
    array = leaf
  elif hasattr(leaf, "__dlpack__"):
    device = leaf.__dlpack_device__()
    if int(device[0]) != _DLPACK_CPU:
      raise CallError(
          f"host_callback.call: {function.name} returned an array on DLPack "
          f"device {tuple(int(d) for d in device)} where result_shape "
          f"expects {expected} on the CPU; return host memory (e.g. "
          "np.asarray(result) or result.cpu())")
    try:
      array = np.from_dlpack(leaf)
    except (BufferError, RuntimeError, TypeError):
      array = np.asarray(leaf)  # a dtype NumPy's DLPack lacks (bfloat16)
  else:
    raise CallError(
        f"host_callback.call: {function.name} returned "
        f"{type(leaf).__name__} where result_shape expects {expected}; with "
        "buffers=True return arrays that export __dlpack__ (NumPy, JAX, "
        "PyTorch), or fill out=")
  if array.dtype != aval.dtype or array.shape != aval.shape:
    raise CallError(
        f"host_callback.call: {function.name} returned "
        f"{_describe(array.dtype, array.shape)} where result_shape expects "
        f"{expected}; with buffers=True results are taken as they are, "
        "without conversion: return that shape and dtype")
  return array
