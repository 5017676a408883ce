"""Lowering of the `host_callback` primitive to the native transport's FFI ops.

A tap becomes the custom call `host_callback_outfeed(token, *args) -> token`,
a `call` becomes `host_callback_call(token, *args) -> (token, *results)`; the
token is our ordered effect's, so XLA keeps them in program order on each
device and across executions. The handlers read the executing device from
the FFI device ordinal, which on CPU is the `jax.Device.id` of the device.
"""

from __future__ import annotations

import functools
from typing import Any, List, Sequence

import jax
import numpy as np

from . import _jax_adapter as adapter
from . import lowering, primitive, runtime
from ._jax_adapter import mlir
from .host_functions import HostFunction, Transforms
from .receiver import transport_native

# The mesh axis of the shard_map that runs the op in sharded jit.
_AXIS = "host_callback_devices"


@functools.lru_cache(maxsize=None)
def _register_targets() -> None:
  """Registers the FFI handlers with XLA for CPU, once per process."""
  for name, handler in transport_native.ffi_handlers().items():
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler),
                                platform="cpu")


def _open_devices(devices: Sequence[Any]) -> None:
  """Starts the receiver and the queues of the local devices that may send."""
  transport = runtime.receiver().transports["native"]
  process = jax.process_index()
  for device in devices:
    if device.process_index == process:
      transport.open_device(device.id, device.id)


def lower(ctx: Any, *operands: Any, function: HostFunction, num_args: int,
          device_index: int, transforms: Transforms) -> List[Any]:
  """Lowers a tap or a call to the native transport's custom call."""
  _register_targets()
  devices = adapter.sharded_devices(ctx)
  if devices is not None:
    results = _lower_gathered(ctx, *operands[:num_args], devices=devices,
                              function=function, device_index=device_index,
                              transforms=transforms)
  else:
    results = _lower_op(ctx, *operands[:num_args], function=function,
                        device_index=device_index, transforms=transforms)
  return results if function.is_call else list(operands)


def _wire_dtype(dtype: Any) -> np.dtype:
  """How XLA stores the dtype: float0 as bool (one byte each)."""
  return np.dtype(np.bool_) if dtype == jax.dtypes.float0 else np.dtype(dtype)


def _lower_op(ctx: Any, *args: Any, function: HostFunction, device_index: int,
              transforms: Transforms) -> List[Any]:
  """The custom call, on a fixed device or on each device of a shard_map."""
  place = adapter.execution_place(ctx, device_index)
  _open_devices(place.mesh_devices if place.fixed_device is None
                else [place.fixed_device])
  arg_avals, result_avals = lowering.physical_avals(ctx, len(args), function)
  site = transport_native.register_site(
      runtime.register(function, transforms),
      [_wire_dtype(a.dtype) for a in arg_avals], [a.shape for a in arg_avals])

  token_aval = adapter.abstract_token()
  op_ctx = ctx.replace(avals_in=[token_aval, *arg_avals],
                       avals_out=[token_aval, *result_avals])
  target = (transport_native.CALL_TARGET if function.is_call
            else transport_native.OUTFEED_TARGET)
  op = jax.ffi.build_ffi_lowering_function(target, has_side_effect=True)(
      op_ctx, ctx.tokens_in.get(adapter.host_callback_effect), *args,
      site=np.int64(site))
  adapter.set_token_op_sharding(ctx, op, place, result_avals)
  token, *results = op.results
  adapter.thread_token(ctx, token)
  return list(results)


def _lower_gathered(ctx: Any, *args: Any, devices: Sequence[Any],
                    function: HostFunction, device_index: int,
                    transforms: Transforms) -> List[Any]:
  """Sharded jit: the op inside a shard_map, sending from one device only.

  A side-effecting custom call that is not one of JAX's own callbacks loses
  its MAXIMAL sharding under Shardy. So every device gets the whole value,
  only the device at `device_index` sends it (and, for a call, gets the
  result, which it then shares with the others).
  """
  mesh = jax.sharding.Mesh(np.array(devices), (_AXIS,))
  result_avals = function.result_avals if function.is_call else ()

  def send(values):
    return primitive.bind(values, function=function, num_args=len(values),
                          device_index=0, transforms=transforms)

  def skip(values):
    if not function.is_call:
      return list(values)
    return [jax.numpy.zeros(a.shape, a.dtype) for a in result_avals]

  def per_device(*values):
    chosen = jax.lax.axis_index(_AXIS) == device_index
    results = jax.lax.cond(chosen, send, skip, list(values))
    if not function.is_call:
      return []
    return [jax.lax.all_gather(r, _AXIS)[device_index] for r in results]

  gathered = jax.shard_map(per_device, mesh=mesh,
                           in_specs=(jax.sharding.PartitionSpec(),) * len(args),
                           out_specs=jax.sharding.PartitionSpec(),
                           check_vma=False)
  # Our mesh replaces the user's: drop the avals' shardings.
  unsharded = [jax.core.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type)
               for a in ctx.avals_in[:len(args)]]
  arg_ctx = ctx.replace(avals_in=unsharded, avals_out=list(result_avals))
  results = mlir.lower_fun(gathered, multiple_results=True)(arg_ctx, *args)
  ctx.set_tokens_out(arg_ctx.tokens_out)
  return list(results)
