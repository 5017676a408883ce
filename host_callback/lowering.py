"""Lowering of the `host_callback` primitive to an outfeed (and infeed) op.

The op takes the ordering token of our ordered effect, so JAX threads it
through control flow and successive executions; it identifies the device that
executes it, and hands the packet to that device's receiver queue.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence

import jax
import numpy as np

from . import _jax_adapter as adapter
from . import runtime, settings
from ._jax_adapter import hlo
from .host_functions import HostFunction, Transforms


def _device_key_source(place: adapter.ExecutionPlace
                       ) -> tuple[list, list, Callable[[Sequence[Any]], tuple]]:
  """Extra operands that identify the executing device, and their decoder.

  A fixed device needs none. Per-device code (shard_map, pmap) passes the
  partition id, which indexes the mesh's devices.
  """
  if place.fixed_device is not None:
    device_id = place.fixed_device.id
    return [], [], lambda arrays: (device_id, arrays)
  aval = jax.core.ShapedArray((), np.uint32)
  partition_id = hlo.partition_id()
  device_ids = np.array([d.id for d in place.mesh_devices])
  return ([partition_id], [aval],
          lambda arrays: (int(device_ids[int(arrays[0])]), arrays[1:]))


def physical_avals(ctx: Any, num_args: int, function: HostFunction
                   ) -> tuple[list, list]:
  """The avals of the op's operands sent to the host and of its results,
  as the device stores them (PRNG keys as uint32 data)."""
  arg_avals = [adapter.physical_aval(a) for a in ctx.avals_in[:num_args]]
  result_avals = ([adapter.physical_aval(a) for a in ctx.avals_out]
                  if function.is_call else [])
  return arg_avals, result_avals


def lower(ctx: Any, *operands: Any, **params: Any) -> List[Any]:
  """Lowers with the transport chosen by `jax_host_callback_transport`."""
  settings.queue_bytes()  # a bad setting fails here, at compile time
  platforms = ctx.module_context.platforms
  if (tuple(platforms) == ("cpu",) and
      settings.transport_name(runtime.native_available()) == "native"):
    from . import lowering_native
    return lowering_native.lower(ctx, *operands, **params)
  return lower_python(ctx, *operands, **params)


def lower_python(ctx: Any, *operands: Any, function: HostFunction,
                 num_args: int, device_index: int, transforms: Transforms
                 ) -> List[Any]:
  """Lowers to one of JAX's Python callbacks, which enqueues the packet."""
  place = adapter.execution_place(ctx, device_index)
  consumer_id = runtime.register(function, transforms)
  extra, extra_avals, decode = _device_key_source(place)
  arg_avals, result_avals = physical_avals(ctx, num_args, function)

  if function.is_call:
    def host_side(*arrays):
      device_key, args = decode(arrays)
      return tuple(runtime.python_request(device_key, consumer_id, args))
  else:
    def host_side(*arrays):
      device_key, args = decode(arrays)
      runtime.python_send(device_key, consumer_id, args)
      return ()

  results = adapter.emit_python_callback(
      ctx, host_side, [*extra, *operands[:num_args]], [*extra_avals, *arg_avals],
      result_avals, adapter.op_sharding(ctx, place, result_avals))
  if not function.is_call:
    return list(operands)
  return adapter.replicate_results(ctx, results, result_avals)

