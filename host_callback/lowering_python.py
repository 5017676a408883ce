"""Emits a tap or a call for the Python transport: one of JAX's Python
callbacks, threaded on our ordering token, which enqueues the packet."""

from __future__ import annotations

from typing import Any, Callable, List, Sequence

import jax
import numpy as np

from . import _jax_adapter as adapter
from . import runtime
from ._jax_adapter import hlo


def _device_id_source(place: adapter.ExecutionPlace
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


def emit(ctx: Any, place: adapter.ExecutionPlace, args: Sequence[Any],
         arg_avals: Sequence[Any], result_avals: Sequence[Any], site: int,
         is_call: bool) -> List[Any]:
  """A Python callback that sends (tap) or requests (call) on the device."""
  extra, extra_avals, decode = _device_id_source(place)
  transport = runtime.transport("python")

  if is_call:
    def host_side(*arrays):
      device_id, values = decode(arrays)
      return tuple(transport.request(device_id, site, values))
  else:
    def host_side(*arrays):
      device_id, values = decode(arrays)
      transport.send(device_id, site, values)
      return ()

  results = adapter.emit_python_callback(
      ctx, host_side, [*extra, *args], [*extra_avals, *arg_avals],
      result_avals, adapter.op_sharding(ctx, place, result_avals))
  return adapter.replicate_results(ctx, results, result_avals)
