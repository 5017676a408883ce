"""The public API: id_tap, id_print, call, barrier_wait, stop_outfeed_receiver."""

from __future__ import annotations

import enum
import functools
import inspect
import operator
import types
import warnings
from typing import (Any, Callable, Dict, Optional, Sequence, TextIO,
                    Tuple)

import jax
import numpy as np

from .barrier import barrier
from .host import host_side
from .primitive import primitive
from .host.device_numbers import most_devices
from .host.host_functions import (BuffersCallParams, CallParams,
                                  ConsumerTapParams, TapParams, interned)
from .host.printing import Printer
from .receiver import QueueStats


def _check_callable(value: Any, name: str, api: str) -> None:
  if not callable(value):
    raise TypeError(
        f"host_callback.{api}: {name} must be callable, got "
        f"{type(value).__name__}: {value!r}")


def _signature_key(func: Any) -> Optional[Tuple[Any, ...]]:
  """What decides whether `func` binds `(arg, transforms[, device=])`, for
  the callables whose signature that alone decides (functions, partials and
  bound methods of them, instances of classes with a `__call__` function),
  or None. A fresh closure per tap then costs no new `inspect.signature`,
  which takes 25-80 us."""
  kind = type(func)
  if kind is types.FunctionType:
    if "__wrapped__" in func.__dict__ or "__signature__" in func.__dict__:
      return None
    return (func.__code__, len(func.__defaults__ or ()),
            tuple(sorted(func.__kwdefaults__ or ())))
  if kind is functools.partial:
    inner = _signature_key(func.func)
    return inner and ("partial", inner, len(func.args),
                      tuple(sorted(func.keywords)))
  if kind is types.MethodType:
    inner = _signature_key(func.__func__)
    return inner and ("method", inner)
  call = getattr(kind, "__call__", None)
  if type(call) is types.FunctionType and not hasattr(func, "__signature__"):
    inner = _signature_key(call)
    return inner and ("instance", kind, inner)
  return None


_BINDABLE_MAX = 4096
_bindable: set = set()  # (_signature_key, keywords) that bind


def _check_tap_signature(tap_func: Callable[..., Any],
                         keywords: Tuple[str, ...]) -> None:
  """Raises TypeError at trace time when `tap_func` cannot be called as
  `tap_func(arg, transforms)` with the `keywords` (`device`, `shard`),
  where its signature can tell."""
  key = _signature_key(tap_func)
  if key is not None and (key, keywords) in _bindable:
    return
  _check_signature(tap_func, keywords)
  if key is not None:
    if len(_bindable) >= _BINDABLE_MAX:
      _bindable.clear()
    _bindable.add((key, keywords))


def _check_signature(tap_func: Callable[..., Any],
                     keywords: Tuple[str, ...]) -> None:
  try:
    signature = inspect.signature(tap_func)
  except (TypeError, ValueError):
    return  # e.g. some builtins: the receiver reports a mismatch
  try:
    signature.bind(None, None, **dict.fromkeys(keywords))
  except TypeError as error:
    expected = (f"tap_func(arg, transforms, *, {', '.join(keywords)})"
                if keywords else "tap_func(arg, transforms)")
    name = getattr(tap_func, "__qualname__", repr(tap_func))
    raise TypeError(
        f"host_callback.id_tap: tap_func {name}{signature} cannot be called "
        f"as {expected} ({error}). Give it a `transforms` parameter, e.g. "
        "`lambda arg, transforms: ...`, or wrap it: "
        "`lambda arg, _: f(arg)`.") from None


def _check_flag(value: Any, name: str, api: str) -> bool:
  """A keyword such as `copy` as a bool; anything but a bool is a mistake
  worth naming."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(
        f"host_callback.{api}: {name} must be True or False, got "
        f"{type(value).__name__}: {value!r}")
  return bool(value)


def _is_numeric(dtype: Any) -> bool:
  """Numbers and bools (bfloat16 included); PRNG keys and float0 tangents
  pass through too."""
  return dtype == jax.dtypes.float0 or any(
      jax.dtypes.issubdtype(dtype, kind)
      for kind in (np.number, np.bool_, jax.dtypes.prng_key))


def _flatten_arg(arg: Any, api: str) -> tuple[list, Any]:
  """The leaves of `arg` as JAX values; rejects non-numeric leaves."""
  leaves, treedef = jax.tree_util.tree_flatten(arg)
  for i, leaf in enumerate(leaves):
    if isinstance(leaf, (str, bytes)) or not (
        _is_numeric(leaf.dtype) if hasattr(leaf, "dtype") else
        isinstance(leaf, (bool, int, float, complex, np.generic))):
      raise TypeError(
          f"host_callback.{api}: every leaf of arg must be an array or a "
          f"numeric scalar; leaf {i} of arg is {type(leaf).__name__}: "
          f"{leaf!r}. Pass non-array values to the host function with a "
          "closure or functools.partial instead.")
  return leaves, treedef


def _device_index(device_index: Any, api: str) -> int:
  """`device_index` as an int (NumPy integers too), checked against the
  most devices of one platform here (the default backend's, or the CPU's);
  the computation's own are checked when it is lowered."""
  try:
    index = operator.index(device_index)
  except TypeError:
    raise TypeError(
        f"host_callback.{api}: device_index must be an int, got "
        f"{type(device_index).__name__}: {device_index!r}") from None
  count = most_devices()
  if not 0 <= index < count:
    raise ValueError(
        f"host_callback.{api}: device_index={index} is out of range; "
        f"a computation here has at most {count} device(s), so use 0 to "
        f"{count - 1}")
  return index


class CallbackFlavor(enum.Enum):
  """The original's choice of JAX callback for its non-legacy mode (JAX
  0.4.26-0.4.34), kept so that code passing `callback_flavor=` runs.

  host_callback has one implementation, its own transport, so every flavor
  behaves the same: ordered, never removed as dead code, and, for `call`,
  returning the host function's result (what IO_CALLBACK gave). Passing one
  warns once per process.
  """
  IO_CALLBACK = 1  # the original used jax.experimental.io_callback
  PURE = 2         # the original used jax.pure_callback
  DEBUG = 3        # the original used jax.debug.callback (taps only)


_warned_of_callback_flavor = False


def _ignore_callback_flavor(kwargs: dict, api: str) -> None:
  """Accepts the original's `callback_flavor=` and ignores it, warning once
  per process."""
  global _warned_of_callback_flavor
  flavor = kwargs.pop("callback_flavor", None)
  if flavor is None or _warned_of_callback_flavor:
    return
  _warned_of_callback_flavor = True
  warnings.warn(
      f"host_callback.{api}: callback_flavor={flavor} is accepted and has no "
      "effect: every flavor uses host_callback's own ordered transport. You "
      "can remove it.", stacklevel=3)


def id_tap(tap_func: Callable[..., Any], arg: Any, *, result: Any = None,
           tap_with_device: bool = False, device_index: int = 0,
           copy: bool = True, partitioned: bool = False,
           tap_with_shard: bool = False, **kwargs: Any) -> Any:
  """Host-side tap: calls `tap_func(arg, transforms)` on the host.

  Behaves as the identity on `arg`, or returns `result` when one is given
  (the tap still happens before `result` is used). Tap functions of one
  device run one at a time, in the order the device executed the taps. In
  the synchronous mode (the CPU default) the device waits for each: a
  jitted call on one device returns after its taps ran, while `pmap` and a
  sharded `jit` return at once and their taps run as they execute. In the
  outfeed mode (`jax_host_callback_outfeed`, always on GPU and TPU) they run
  later, on a receiver thread. Either way, `barrier_wait()` returns once
  every tap dispatched before it has run.

  Args:
    tap_func: called as `tap_func(arg, transforms)` with `arg` as NumPy
      values and `transforms` a tuple of `(name, params)` entries (e.g.
      `("batch", {"batch_dims": (0,)})` under `jax.vmap`).
    arg: a pytree of arrays and numeric scalars to send to the host.
    result: returned instead of `arg` when given; not sent to the host. Its
      leaves that are not JAX values (Python scalars, NumPy arrays) come
      back as given.
    tap_with_device: also pass `device=`, the `jax.Device` that executed the
      tap.
    device_index: under a sharded `jit`, the position in the computation's
      device assignment of the device that taps the whole value.
    copy: False to skip copying the tapped arrays where possible: the
      function gets read-only arrays, views of the device's buffers in the
      synchronous mode on CPU, valid only until it returns (keeping one fails
      the computation; keep `np.array(a)` instead). An extension: the
      original had no such keyword.
    partitioned: under a sharded `jit`, each device calls `tap_func` with
      its own shard of `arg`, and nothing is gathered; `device_index` is
      then unused. Each leaf is sent as sharded: on a mesh with explicit
      axes, as its type says; on one with automatic axes, as the jit fixes
      it (an input's sharding, or `jax.lax.with_sharding_constraint`'s), a
      `ValueError` at trace time naming the fix where the partitioner
      would choose it. Elsewhere the whole value, as without it. An extension, the
      keyword of `jax.debug.callback`.
    tap_with_shard: also pass `shard=`, a `host_callback.Shard` saying
      where the shard lies in the global value (the whole value where it is
      not split). An extension.

  Returns:
    `arg`, or `result` when given.
  """
  _ignore_callback_flavor(kwargs, "id_tap")
  if kwargs:
    raise TypeError(
        "Support for **kwargs in ``id_tap`` has been removed. Instead, "
        "pre-apply keyword arguments, either by using a closure or by passing "
        "``functools.partial(tap_func, **kwargs)``. Got unexpected keyword "
        f"arguments: {sorted(kwargs)}")
  _check_callable(tap_func, "tap_func", "id_tap")
  with_shard = _check_flag(tap_with_shard, "tap_with_shard", "id_tap")
  _check_tap_signature(tap_func, ("device",) * bool(tap_with_device) +
                       ("shard",) * with_shard)
  device_index = _device_index(device_index, "id_tap")
  arg_leaves, arg_treedef = _flatten_arg(arg, "id_tap")
  result_leaves, result_treedef = jax.tree_util.tree_flatten(result)
  # As the original: leaves of `result` that are not JAX values (Python
  # scalars, NumPy arrays) come back as given; JAX values pass through the
  # tap, so that it happens before they are used.
  tied = [i for i, leaf in enumerate(result_leaves)
          if isinstance(leaf, (jax.Array, jax.core.Tracer))]
  function = interned(TapParams(
      func=tap_func, arg_treedef=arg_treedef, with_device=tap_with_device,
      copy=_check_flag(copy, "copy", "id_tap"),
      partitioned=_check_flag(partitioned, "partitioned", "id_tap"),
      with_shard=with_shard))
  out = primitive.bind([*arg_leaves, *(result_leaves[i] for i in tied)],
                       function=function, num_args=len(arg_leaves),
                       device_index=device_index)
  if result is None:
    return jax.tree_util.tree_unflatten(arg_treedef, out[:len(arg_leaves)])
  for i, value in zip(tied, out[len(arg_leaves):]):
    result_leaves[i] = value
  return jax.tree_util.tree_unflatten(result_treedef, result_leaves)


def consumer_tap(consume: Callable[..., None], operands: Sequence[Any], *,
                 context: Callable[[], str], int_operands: Tuple[int, ...] = (),
                 partitioned: bool = False) -> None:
  """Internal, not part of the public API: a tap of `operands` whose host
  function is `consume`, a consumer, for the package's own instruments
  (`host_callback.loops` taps every loop step through it alone).

  It is `id_tap` without the user-facing layer: no signature check, no
  tree to rebuild on the host. It guarantees what `id_tap` does of order
  and delivery (the same primitive, so the same ordering token, modes,
  transports and transformations), and that on the host:

  - `consume(arrays, device_id)` runs for every tap that executed, with
    `transforms=` (the entries `id_tap`'s function gets) only where there
    are any: `arrays` are the operands in order, the device comes as its
    number (`device_numbers.device_by_number`);
  - each operand at a position in `int_operands` that is an int32 scalar
    when lowered comes as a Python int, on every transport and path; the
    others, and a named one that is not an int32 scalar (e.g. batched by
    `vmap`), are NumPy arrays;
  - an exception of `consume` is reported as a tap function's is, named by
    `context()`.

  Each call makes a host function of its own (compared by identity, not
  interned): give one `consume` per site. `partitioned` is `id_tap`'s.
  The arguments are not checked as `id_tap`'s are.
  """
  operands = list(operands)
  function = ConsumerTapParams(func=consume, context=context,
                               int_operands=int_operands,
                               partitioned=partitioned)
  primitive.bind(operands, function=function, num_args=len(operands),
                 device_index=0)


def _warn_of_traced_kwargs(kwargs: Dict[str, Any]) -> None:
  """Keyword arguments are printed as they are at trace time: a traced one
  prints as a tracer, as in the original; say how to print its value."""
  for name, value in kwargs.items():
    if isinstance(value, jax.core.Tracer):
      warnings.warn(
          f"host_callback.id_print: keyword argument {name}= is a traced "
          f"value, so it prints as a tracer ({value}), not as its value. To "
          f"print the value, pass it in arg, e.g. id_print(({name}, x)) or "
          f"id_print({{'{name}': {name}, 'x': x}}).", stacklevel=3)


def id_print(arg: Any, *, result: Any = None, tap_with_device: bool = False,
             device_index: int = 0, output_stream: Optional[TextIO] = None,
             threshold: Optional[int] = None, copy: bool = True,
             partitioned: bool = False, **kwargs: Any) -> Any:
  """Like `id_tap`, with a tap function that prints `arg` on the host.

  Each print is a line `k1: v1 k2: v2 ...` (keys sorted) for `kwargs`,
  `transforms` and `device` when there are any, then the value: arrays by
  `numpy.array2string`, tuples as `( a b )`, lists as `[ a b ]`, dicts as
  `{ k=a }`, wrapped at 80 columns.

  Args:
    arg: the pytree to print; returned unchanged.
    result: returned instead of `arg` when given; not printed.
    tap_with_device: also print `device: ...`.
    device_index: see `id_tap`.
    output_stream: a text stream to write each line to, with its newline;
      `print` when None.
    threshold: passed to `numpy.array2string` (NumPy's default when None).
    copy: see `id_tap` (the printer keeps nothing).
    partitioned: see `id_tap`: each device prints its own shard.
    kwargs: printed in the header line.

  Returns:
    `arg`, or `result` when given.
  """
  _ignore_callback_flavor(kwargs, "id_print")
  _warn_of_traced_kwargs(kwargs)
  printer = Printer(output_stream, threshold, kwargs)
  _check_flag(copy, "copy", "id_print")
  _check_flag(partitioned, "partitioned", "id_print")
  return id_tap(printer, arg, result=result, tap_with_device=tap_with_device,
                device_index=device_index, copy=copy, partitioned=partitioned)


def _warn_if_shape_like(result_shape: Any) -> None:
  """`result_shape=(3,)`, NumPy-style, is almost surely meant as a shape."""
  if (isinstance(result_shape, (tuple, list)) and result_shape and
      all(type(v) is int for v in result_shape)):  # pylint: disable=unidiomatic-typecheck
    warnings.warn(
        f"host_callback.call: result_shape={result_shape!r} is a tuple of "
        "integers, so it describes a result that is a tuple of integer "
        "scalars. For an array of that shape, write result_shape="
        f"jax.ShapeDtypeStruct({tuple(result_shape)!r}, dtype).", stacklevel=4)


def _result_shape_of(leaf: Any) -> tuple[int, ...]:
  """The `shape` of a `result_shape` leaf, checked: a sequence of
  non-negative integers."""
  try:
    shape = tuple(operator.index(d) for d in leaf.shape)
  except TypeError:
    shape = None
  if shape is None or any(d < 0 for d in shape):
    raise ValueError(
        f"host_callback.call: result_shape has a leaf {leaf!r} whose shape "
        f"{leaf.shape!r} is not a sequence of non-negative integers. The "
        "values must be either numeric scalars, or must have 'shape' and "
        "'dtype' attributes: use e.g. jax.ShapeDtypeStruct((3,), "
        "jnp.float32).")
  return shape


def _result_avals(result_shape: Any) -> tuple[Any, tuple]:
  _warn_if_shape_like(result_shape)
  leaves, treedef = jax.tree_util.tree_flatten(result_shape)
  avals = []
  for leaf in leaves:
    if isinstance(leaf, type):  # e.g. np.float32, which has shape and dtype
      raise ValueError(
          f"host_callback.call: result_shape has a leaf {leaf.__name__}, a "
          "type. The values must be either numeric scalars, or must have "
          "'shape' and 'dtype' attributes: use e.g. "
          f"jax.ShapeDtypeStruct((), {leaf.__module__}.{leaf.__name__}).")
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
      shape, dtype = _result_shape_of(leaf), leaf.dtype
    elif isinstance(leaf, (bool, int, float, complex, np.generic)):
      array = np.asarray(leaf)
      shape, dtype = array.shape, array.dtype
    else:
      shape, dtype = None, None
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
      raise ValueError(
          f"host_callback.call: result_shape has a PRNG key leaf ({dtype}); "
          "a host function cannot return keys. Return the key data instead "
          "(result_shape=jax.random.key_data(key)) and turn it into keys "
          "with jax.random.wrap_key_data.")
    if dtype is not None and dtype == jax.dtypes.float0:
      raise ValueError(
          f"host_callback.call: result_shape has a float0 leaf ({leaf!r}). "
          "float0 is the dtype of tangents of integer values and holds no "
          "data, so a host function cannot return one; describe a result "
          "with data, e.g. jax.ShapeDtypeStruct(shape, jnp.float32), or "
          "make the zero tangent outside the call.")
    if dtype is None or not _is_numeric(dtype):
      raise ValueError(
          "host_callback.call: result_shape has a leaf of type "
          f"{type(leaf).__name__} ({leaf!r}). The values must be either "
          "numeric scalars, or must have 'shape' and 'dtype' attributes.")
    avals.append(jax.core.ShapedArray(
        shape, jax.dtypes.canonicalize_dtype(dtype)))
  return treedef, tuple(avals)


def _accepts(func: Callable[..., Any], keyword: str) -> bool:
  """Whether `func` has a parameter `keyword` that a keyword can give (a
  `buffers=True` call's `out`, which it fills in place, and `stream`)."""
  try:
    parameter = inspect.signature(func).parameters.get(keyword)
  except (TypeError, ValueError):
    return False
  return parameter is not None and parameter.kind in (
      inspect.Parameter.POSITIONAL_OR_KEYWORD,
      inspect.Parameter.KEYWORD_ONLY)


def call(callback_func: Callable[..., Any], arg: Any, *,
         result_shape: Any = None, call_with_device: bool = False,
         device_index: int = 0, copy: bool = True, partitioned: bool = False,
         call_with_shard: bool = False, buffers: bool = False,
         **kwargs: Any) -> Any:
  """Calls `callback_func(arg)` on the host and returns its result.

  The device waits for the result. Calls run after the taps that precede them
  on the same device. Under `jax.vmap` the host function is called once per
  batch element, in order. `call` is not differentiable: wrap it in
  `jax.custom_vjp` or `jax.custom_jvp`.

  Args:
    callback_func: called as `callback_func(arg)` with NumPy values.
    arg: a pytree of arrays and numeric scalars to send to the host.
    result_shape: a pytree whose leaves are `jax.ShapeDtypeStruct` objects,
      arrays or numeric scalars, describing the result; None or `()` for no
      result. The host result must match it in structure, shape and dtype
      (after JAX's dtype canonicalisation), or the computation fails with an
      error naming the callback and the cause.
    call_with_device: also pass `device=`, the `jax.Device` that issued the
      call.
    device_index: under a sharded `jit`, the position in the computation's
      device assignment of the device that makes the call with the whole
      value.
    copy: False to get `arg` as read-only arrays that may view the device's
      buffers, valid only until `callback_func` returns; see `id_tap`.
    partitioned: under a sharded `jit`, each device calls `callback_func`
      with its own shard of `arg` and gets back its shard of the result:
      `result_shape` describes the global result, which is split like the
      first leaf of `arg` (a `ValueError` at trace time where it cannot
      be). See `id_tap`.
    call_with_shard: also pass `shard=`; see `id_tap`'s `tap_with_shard`.
    buffers: True to hand buffers over without copies where the transport
      can (implies `copy=False`): `callback_func` gets `arg` as read-only
      NumPy arrays (they export `__dlpack__`), views of the device's
      buffers when it runs directly on the native transport, valid only
      until it returns; and either returns arrays that export DLPack
      (NumPy, JAX, PyTorch), with exactly `result_shape`'s shapes and
      dtypes and on the CPU, taken without a conversion; or, when it has
      an `out` parameter, fills `out` (a pytree like `result_shape` of
      writable arrays, views of the device's result buffers where it runs
      directly) in place and returns None. On a GPU with the native
      transport, where it runs directly, `arg` and `out` are the GPU's
      buffers (they export DLPack and `__cuda_array_interface__`) and
      returned arrays must be on that GPU. With a `stream` parameter it
      gets `stream=`, the computation's `cudaStream_t` as an int there
      (else None), on which to enqueue its GPU work. An extension; see
      "Buffers without a copy" in the user guide for which paths copy.

  Returns:
    The host result, as JAX arrays shaped like `result_shape`.
  """
  _ignore_callback_flavor(kwargs, "call")
  if kwargs:
    raise TypeError(
        f"host_callback.call got unexpected keyword arguments: {sorted(kwargs)}")
  _check_callable(callback_func, "callback_func", "call")
  device_index = _device_index(device_index, "call")
  arg_leaves, arg_treedef = _flatten_arg(arg, "call")
  result_treedef, result_avals = _result_avals(result_shape)
  buffers = _check_flag(buffers, "buffers", "call")
  fields: Dict[str, Any] = dict(
      func=callback_func, arg_treedef=arg_treedef,
      with_device=call_with_device, result_treedef=result_treedef,
      result_avals=result_avals,
      copy=_check_flag(copy, "copy", "call") and not buffers,
      partitioned=_check_flag(partitioned, "partitioned", "call"),
      with_shard=_check_flag(call_with_shard, "call_with_shard", "call"))
  function = interned(
      BuffersCallParams(**fields, fills_out=_accepts(callback_func, "out"),
                        with_stream=_accepts(callback_func, "stream"))
      if buffers else CallParams(**fields))
  out = primitive.bind(arg_leaves, function=function,
                       num_args=len(arg_leaves), device_index=device_index)
  return jax.tree_util.tree_unflatten(result_treedef, out)


# `barrier.barrier_wait` itself, with no frame between: an idle barrier
# costs only a few more than one.
barrier_wait = barrier.barrier_wait


def stop_outfeed_receiver() -> None:
  """Waits for pending callbacks, then stops the receiver threads.

  The next use of the API starts them again.
  """
  barrier.stop_outfeed_receiver()


def queue_statistics() -> Dict[Tuple[str, jax.Device], QueueStats]:
  """Per-device receiver queue statistics, by (transport name, device).

  Each `QueueStats` has `bytes_waiting`, `packets_waiting` (sent and not yet
  consumed), `high_water_bytes` (the most bytes ever waiting) and
  `max_bytes` (the bound). Only the outfeed mode queues packets: with no
  receiver running (the synchronous mode, or before the first tap) it
  returns `{}`. An extension: the original had no such function.
  """
  return host_side.queue_statistics()
