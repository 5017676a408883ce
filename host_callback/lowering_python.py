"""Emits a tap or a call for the Python transport: one of JAX's Python
callbacks, threaded on our ordering token, which enqueues the packet."""

from __future__ import annotations

from typing import Any, Callable, List, Sequence

import jax
import numpy as np

from . import _jax_adapter as adapter
from . import executions, runtime
from ._jax_adapter import hlo
from .devices import device_number, numbers
from .lowering_kinds import Kind
from .receiver import interrupts


def _device_id_source(place: adapter.ExecutionPlace
                      ) -> tuple[list, list, Callable[[Sequence[Any]], tuple]]:
  """Extra operands that identify the executing device, and their decoder.

  A fixed device needs none. Per-device code (shard_map, pmap) passes the
  partition id, which indexes the mesh's devices.
  """
  if place.fixed_device is not None:
    device_id = device_number(place.fixed_device)
    return [], [], lambda arrays: (device_id, arrays)
  aval = jax.core.ShapedArray((), np.uint32)
  partition_id = hlo.partition_id()
  device_ids = np.array(numbers(place.mesh_devices))
  return ([partition_id], [aval],
          lambda arrays: (int(device_ids[int(arrays[0])]), arrays[1:]))


def _failing_the_execution(host_side: Callable, on_failure: Any) -> Callable:
  """`host_side`, which when it raises (so stops the execution) first calls
  `on_failure` (see `executions.failed`); Ctrl-C that stopped it reaches
  the thread that waits for the execution (see `receiver.interrupts`)."""
  def run(*arrays):
    try:
      return host_side(*arrays)
    except BaseException as error:
      if on_failure is not None:
        on_failure()
      if interrupts.stopped_main_thread(error):
        raise interrupts.rearming_interrupt(error)  # pylint: disable=raise-missing-from
      raise
  return run


def emit(ctx: Any, place: adapter.ExecutionPlace, kind: Kind,
         operands: Sequence[Any], operand_avals: Sequence[Any],
         result_avals: Sequence[Any], site: int) -> List[Any]:
  """A Python callback that sends `operands` on the device; a CALL returns
  the host's reply, a TAP_SYNC returns once the host function ran."""
  extra, extra_avals, decode = _device_id_source(place)
  transport = runtime.transport("python")

  if kind is Kind.TAP:
    def host_side(*arrays):
      device_id, values = decode(arrays)
      transport.send(device_id, site, values)
      return ()
  elif kind is Kind.CALL:
    def host_side(*arrays):
      device_id, values = decode(arrays)
      return tuple(transport.request(device_id, site, values))
  else:
    def host_side(*arrays):
      device_id, values = decode(arrays)
      transport.request(device_id, site, values)
      return ()

  host_side = _failing_the_execution(host_side, executions.failed(ctx))
  results = adapter.emit_python_callback(
      ctx, host_side, [*extra, *operands], [*extra_avals, *operand_avals],
      result_avals, adapter.op_sharding(ctx, place, result_avals))
  return adapter.replicate_results(ctx, results, result_avals)
