"""Lowering of the `host_callback` primitive: where it runs, then how.

The lowering owns placement: on one fixed device, on each device of a
shard_map or pmap (the device found at run time), or, for automatically
sharded code, inside a shard_map where only the
`device_index` device sends the gathered value. It then opens the queues of
the local devices that may send, registers the callback site, and calls the
chosen transport's `emit` (`lowering_native.emit` or `lowering_python.emit`).
Both thread our ordering token (see `ordering`).

In the synchronous mode (the CPU default, see `settings.outfeed_mode`) a tap
is emitted as `Kind.TAP_SYNC`: a request that waits for its host function.
In both modes a tap's outputs are its operands, passed on untouched (as the
original's custom call did: XLA copies nothing for it), and the ordering
token keeps it in order with later taps and calls.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence

import jax

from .. import _jax_adapter as adapter
from ..host import host_functions, host_side, transport_policy
from . import lowering_native, lowering_python, partitioned
from .. import settings
from ..host.device_numbers import device_number
from ..host.host_functions import CallKind, HostFunction, Transforms
from .lowering_kinds import Kind, wire_dtype
from .each_device import AXIS, lower_on_each_device, one_axis_mesh

_EMITTERS = {"native": lowering_native.emit, "python": lowering_python.emit}


def is_synchronous(ctx: Any) -> bool:
  """Whether taps wait for their host functions in this lowering."""
  return not any(settings.outfeed_mode(p)
                 for p in ctx.module_context.platforms)


def transport_for(ctx: Any) -> str:
  """The transport of this lowering: `transport_policy`'s for its one
  platform; Python for a lowering for several platforms."""
  platforms = tuple(ctx.module_context.platforms)
  if len(platforms) == 1:
    return transport_policy.for_platform(platforms[0])
  return "python"


def physical_avals(ctx: Any, num_args: int, function: HostFunction
                   ) -> tuple[list, list]:
  """The avals of the op's operands sent to the host and of its results,
  as the device stores them (PRNG keys as uint32 data)."""
  arg_avals = [adapter.physical_aval(a) for a in ctx.avals_in[:num_args]]
  result_avals = ([adapter.physical_aval(a) for a in ctx.avals_out]
                  if isinstance(function, CallKind) else [])
  return arg_avals, result_avals


def lower(ctx: Any, *operands: Any, bind: Callable[..., List[Any]],
          function: HostFunction, num_args: int, device_index: int,
          transforms: Transforms) -> List[Any]:
  """Lowers a tap or a call with the transport chosen for this lowering;
  `bind` binds the primitive again (per device, in sharded code)."""
  settings.queue_bytes()  # a bad setting fails here, at compile time
  devices = adapter.sharded_devices(ctx)
  if devices is not None and function.partitioned:
    return partitioned.lower(ctx, *operands, bind=bind, devices=devices,
                             function=function, num_args=num_args,
                             transforms=transforms)
  if devices is not None:
    adapter.check_device_index(device_index, len(devices))
    # Under Shardy, a side-effecting custom call that is not one of JAX's
    # own callbacks loses its single-device sharding, and JAX's own fail
    # under `jax.set_mesh` with auto axes: gather instead.
    results = _lower_gathered(ctx, *operands, bind=bind, devices=devices,
                              function=function,
                              num_args=num_args, device_index=device_index,
                              transforms=transforms)
    return results if isinstance(function, CallKind) else list(operands)

  # Not sharded by the partitioner (or per device, inside the shard_map
  # of the two lowerings above): the op itself.
  name = transport_for(ctx)
  synchronous = is_synchronous(ctx)
  place = adapter.execution_place(ctx, device_index)
  producer = host_side.transport(name)
  _open_devices(producer, place.mesh_devices if place.fixed_device is None
                else [place.fixed_device])
  if not synchronous:
    host_side.start_receiver()
  arg_avals, result_avals = physical_avals(ctx, num_args, function)
  site = host_side.register_site(
      producer, function, transforms,
      [wire_dtype(a.dtype) for a in arg_avals], [a.shape for a in arg_avals])
  adapter.keep_alive_with_executable(ctx, function)
  emit = _EMITTERS[name]
  if isinstance(function, CallKind):
    return emit(ctx, place, Kind.CALL, operands[:num_args], arg_avals,
                result_avals, site)
  kind = Kind.TAP_SYNC if synchronous else Kind.TAP
  emit(ctx, place, kind, operands[:num_args], arg_avals, [], site)
  return list(operands)


def _open_devices(producer: Any, devices: Sequence[Any]) -> None:
  """Opens the queues of the local devices that may send."""
  process = jax.process_index()
  for device in devices:
    if device.process_index == process:
      host_side.open_device(producer, device_number(device))


def _lower_gathered(ctx: Any, *operands: Any, bind: Callable[..., List[Any]],
                    devices: Sequence[Any],
                    function: HostFunction, num_args: int, device_index: int,
                    transforms: Transforms) -> List[Any]:
  """Sharded jit: the op inside a shard_map, sending from one device only.

  Every device gets the whole value, only the device at `device_index`
  sends it (and, for a call, gets the result, which it then shares with the
  others).
  """
  result_avals = host_functions.result_avals(function)

  def send(values):
    return bind(values, function=function, num_args=num_args,
                          device_index=0, transforms=transforms)

  def skip(values):
    if not isinstance(function, CallKind):
      return list(values)
    return [jax.numpy.zeros(a.shape, a.dtype) for a in result_avals]

  def per_device(*values):
    chosen = jax.lax.axis_index(AXIS) == device_index
    results = jax.lax.cond(chosen, send, skip, list(values))
    if isinstance(function, CallKind):
      return [jax.lax.all_gather(r, AXIS)[device_index] for r in results]
    return []

  # Our mesh replaces the user's: drop the avals' shardings.
  unsharded = [jax.core.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type)
               for a in ctx.avals_in]
  arg_ctx = ctx.replace(avals_in=unsharded, avals_out=list(result_avals))
  results = lower_on_each_device(
      arg_ctx, per_device, one_axis_mesh(devices), *operands,
      in_specs=(jax.sharding.PartitionSpec(),) * len(operands),
      out_specs=jax.sharding.PartitionSpec())
  ctx.set_tokens_out(arg_ctx.tokens_out)
  return list(results)

