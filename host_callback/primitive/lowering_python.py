"""Emits a tap or a call for the Python transport: one of JAX's Python
callbacks, threaded on our ordering token, which enqueues the packet."""

from __future__ import annotations

from typing import Any, Callable, List, Sequence

import jax
import ml_dtypes
import numpy as np

from .. import _jax_adapter as adapter
from . import executions
from ..host import host_side
from .._jax_adapter import hlo, mlir
from ..host.device_numbers import device_number, numbers
from .lowering_kinds import Kind, wire_dtype
from ..receiver import native_wire
from ..receiver import ctrl_c


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


def _failing_the_execution(on_host: Callable, on_failure: Any) -> Callable:
  """`on_host`, which when it raises (so stops the execution) first calls
  `on_failure` (see `executions.failed`); Ctrl-C that stopped it reaches
  the thread that waits for the execution (see `receiver.ctrl_c`)."""
  def run(*arrays):
    try:
      return on_host(*arrays)
    except BaseException as error:
      if on_failure is not None:
        on_failure()
      if ctrl_c.stopped_by_ctrl_c(error):
        raise ctrl_c.rearming_interrupt(error)  # pylint: disable=raise-missing-from
      raise
  return run


# JAX's GPU callbacks size a packed sub-byte array by its bits rounded down
# to whole bytes (jaxlib/gpu/py_client_gpu.cc): an int4[7] loses its last
# element each way (seen on an H200, jax 0.11.2). Off CPU, sub-byte operands
# and results therefore cross the callback widened to a byte per element;
# the conversions are exact.
def _wider(dtype: np.dtype) -> np.dtype:
  """A sub-byte dtype's byte-wide twin (signed, unsigned or floating);
  any other dtype as it is. Which dtypes XLA packs is
  `native_wire.packed_bits`'s rule, shared with the native transport."""
  if native_wire.packed_bits(dtype) is None:
    return dtype
  try:
    signed = ml_dtypes.iinfo(dtype).min < 0
  except ValueError:  # a floating dtype
    return np.dtype(np.float16)
  return np.dtype(np.int8 if signed else np.uint8)


def widens_subbyte(platforms: Sequence[str]) -> bool:
  """Whether sub-byte arrays cross the callbacks of a computation for
  `platforms` widened to a byte (anywhere but on CPU)."""
  return any(platform != "cpu" for platform in platforms)


def _widened(avals: Sequence[Any]) -> List[Any]:
  return [aval.update(dtype=_wider(np.dtype(aval.dtype))) for aval in avals]


def _converted(ctx: Any, values: Sequence[Any], avals: Sequence[Any],
               to_avals: Sequence[Any]) -> List[Any]:
  """`values` (of `avals`) converted to `to_avals` where the dtypes differ."""
  return [value if aval.dtype == to.dtype else
          hlo.convert(mlir.aval_to_ir_type(ctx.module_context, to), value)
          for value, aval, to in zip(values, avals, to_avals)]


def _as_dtypes(arrays: Sequence[Any], dtypes: Sequence[Any]) -> List[Any]:
  """`arrays` on the host, as `dtypes` where they differ."""
  return [array if array.dtype == dtype else np.asarray(array).astype(dtype)
          for array, dtype in zip(arrays, dtypes)]


def emit(ctx: Any, place: adapter.ExecutionPlace, kind: Kind,
         operands: Sequence[Any], operand_avals: Sequence[Any],
         result_avals: Sequence[Any], site: int) -> List[Any]:
  """A Python callback that sends `operands` on the device; a CALL returns
  the host's reply, a TAP_SYNC returns once the host function ran."""
  extra, extra_avals, decode = _device_id_source(place)
  transport = host_side.transport("python")
  sent_avals, returned_avals = operand_avals, result_avals
  received, answer = decode, tuple
  if widens_subbyte(ctx.module_context.platforms):
    sent_avals, returned_avals = _widened(operand_avals), _widened(result_avals)
    operands = _converted(ctx, operands, operand_avals, sent_avals)
    # float0 arrives as float0 there, as bool (XLA's) on CPU.
    operand_dtypes = [wire_dtype(aval.dtype) for aval in operand_avals]
    returned_dtypes = [aval.dtype for aval in returned_avals]

    def received(arrays):
      device_id, values = decode(arrays)
      return device_id, _as_dtypes(values, operand_dtypes)

    def answer(results):
      return tuple(_as_dtypes(results, returned_dtypes))

  if kind is Kind.TAP:
    def on_host(*arrays):
      device_id, values = received(arrays)
      transport.send(device_id, site, values)
      return ()
  elif kind is Kind.CALL:
    def on_host(*arrays):
      device_id, values = received(arrays)
      return answer(transport.request(device_id, site, values))
  else:
    def on_host(*arrays):
      device_id, values = received(arrays)
      transport.request(device_id, site, values)
      return ()

  on_host = _failing_the_execution(on_host, executions.failed(ctx))
  results = adapter.emit_python_callback(
      ctx, on_host, [*extra, *operands], [*extra_avals, *sent_avals],
      returned_avals, adapter.op_sharding(ctx, place, returned_avals))
  results = _converted(ctx, results, returned_avals, result_avals)
  return adapter.replicate_results(ctx, results, result_avals)
