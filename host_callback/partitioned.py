"""Per-shard taps and calls (`partitioned=True`) in automatically sharded
code: each device sends its own shard of the operands, and nothing is
gathered.

The op is lowered inside a shard_map over the operands' mesh whose
in_specs are the operands' own shardings, as JAX knows them at trace time
(the avals' `NamedSharding`, which meshes with explicit axes give, the
default of `jax.make_mesh`): the partitioner has nothing to move, so the
compiled program holds no collective for the op. Under a mesh with
automatic axes JAX does not know the shardings when it traces, so a
partitioned op is refused there with an error that names the fix.

A host function that asks for it (`tap_with_shard=True`, or
`call_with_shard=True`) gets `shard=`, a `host_functions.Shard` that says
where its shard lies in the global value; the table of each device's part
is made here, at lowering time, once per site.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, List, Sequence, Tuple

import jax
import numpy as np

from .devices import device_number
from .host_functions import (HostFunction, Part, ShardTable, Transforms,
                             interned)
from .per_device import lower_on_each_device

P = jax.sharding.PartitionSpec


def _mesh_and_specs(avals: Sequence[Any], api: str) -> Tuple[Any, List[Any]]:
  """The abstract mesh the operands are sharded over and each one's
  PartitionSpec; ValueError where JAX does not know them."""
  meshes = {aval.sharding.mesh for aval in avals
            if aval.sharding.mesh.axis_names}
  if len(meshes) > 1:
    raise ValueError(
        f"host_callback.{api}(partitioned=True): the operands are sharded "
        f"over different meshes ({', '.join(map(str, meshes))}); shard them "
        "over one mesh")
  mesh = next(iter(meshes), None)
  explicit = jax.sharding.AxisType.Explicit
  if mesh is None or any(t != explicit for t in mesh.axis_types):
    raise ValueError(
        f"host_callback.{api}(partitioned=True) needs the sharding of the "
        "value it sends at trace time, and this computation is sharded by "
        "the partitioner (a mesh with automatic axes, or none), which "
        "decides it later. Use a mesh with explicit axes (jax.make_mesh's "
        "default, or axis_types=(jax.sharding.AxisType.Explicit,) * n) "
        "and shard the inputs over it, or tap inside jax.shard_map")
  return mesh, [aval.sharding.spec for aval in avals]


def _concrete_mesh(abstract: Any, devices: Sequence[Any]) -> Any:
  """The mesh of `abstract`'s axes over the computation's devices, in the
  order of its device assignment (the mesh's own order)."""
  return jax.sharding.Mesh(
      np.array(devices).reshape(abstract.axis_sizes), abstract.axis_names,
      axis_types=abstract.axis_types)


def _shard_shape(shape: Sequence[int], spec: Any, mesh: Any,
                 what: str) -> Tuple[int, ...]:
  """`shape` split by `spec` over `mesh`; ValueError where it does not
  divide."""
  spec = tuple(spec) + (None,) * (len(shape) - len(spec))
  if len(spec) > len(shape):
    raise ValueError(
        f"host_callback.call(partitioned=True): {what} has rank "
        f"{len(shape)}, too small for the sharding {P(*spec)}")
  out = []
  for size, axes in zip(shape, spec):
    names = () if axes is None else (axes if isinstance(axes, tuple)
                                     else (axes,))
    parts = math.prod(mesh.shape[name] for name in names)
    if size % parts:
      raise ValueError(
          f"host_callback.call(partitioned=True): {what} of shape "
          f"{tuple(shape)} cannot be split as {P(*spec)} over the mesh "
          f"{dict(mesh.shape)}: {size} is not a multiple of {parts}")
    out.append(size // parts)
  return tuple(out)


def _shard_table(mesh: Any, specs: Sequence[Any],
                 avals: Sequence[Any]) -> ShardTable:
  """Each device's part of the sent leaves, by device number."""
  indices = [jax.sharding.NamedSharding(mesh, spec).devices_indices_map(
      tuple(aval.shape)) for spec, aval in zip(specs, avals)]
  ordered = list(mesh.devices.flat)
  parts = []
  for position, device in enumerate(ordered):
    mine = [_part(per_leaf[device]) for per_leaf in indices]
    # As jax.Array's shards: how many devices before this one, in the
    # mesh's order, hold the same part.
    replicas = tuple(sum(1 for other in ordered[:position]
                         if _part(per_leaf[other]) == part)
                     for per_leaf, part in zip(indices, mine))
    parts.append((device_number(device), tuple(mine), replicas))
  return ShardTable(tuple(parts), tuple(tuple(a.shape) for a in avals))


def _part(index: Tuple[slice, ...]) -> Part:
  return tuple((part.start, part.stop) for part in index)


def lower(ctx: Any, *operands: Any, bind: Callable[..., List[Any]],
          devices: Sequence[Any], function: HostFunction, num_args: int,
          transforms: Transforms) -> List[Any]:
  """Lowers a partitioned tap or call in automatically sharded code: each
  device runs the host function on its own shard (see the module's doc);
  `bind` binds the primitive on each device."""
  api = "call" if function.is_call else "id_tap"
  abstract, specs = _mesh_and_specs(ctx.avals_in, api)
  mesh = _concrete_mesh(abstract, devices)
  arg_avals = ctx.avals_in[:num_args]
  result_specs: List[Any] = []
  result_avals: Tuple[Any, ...] = ()
  if function.is_call:
    like = specs[0] if specs else P()
    result_specs = [like] * len(function.result_avals)
    result_avals = tuple(
        a.update(shape=_shard_shape(a.shape, like, mesh, f"result {i}"))
        for i, a in enumerate(function.result_avals))
  per_shard = interned(dataclasses.replace(
      function, partitioned=False, result_avals=result_avals,
      shard_table=(_shard_table(mesh, specs[:num_args], arg_avals)
                   if function.with_shard else None)))

  def on_each_device(*values: Any) -> List[Any]:
    out = bind(values, function=per_shard, num_args=num_args,
               device_index=0, transforms=transforms)
    return out if function.is_call else []

  op_ctx = ctx.replace(avals_out=list(function.result_avals)
                       if function.is_call else [])
  results = lower_on_each_device(
      op_ctx, on_each_device, mesh, *operands, in_specs=tuple(specs),
      out_specs=result_specs)
  ctx.set_tokens_out(op_ctx.tokens_out)
  return list(results) if function.is_call else list(operands)
