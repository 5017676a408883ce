"""Per-shard taps and calls (`partitioned=True`) in automatically sharded
code: each device sends its own shard of the operands, and nothing is
gathered.

The op is lowered inside a shard_map over the operands' mesh whose
in_specs are the operands' own shardings, so that the partitioner has
nothing to move and the compiled program holds no collective for the op.
On a mesh with explicit axes (`jax.make_mesh`'s default) JAX knows them
when it traces (the avals' `NamedSharding`). On a mesh with automatic axes
(`jax.sharding.Mesh`'s default) the partitioner chooses them when XLA
compiles, except where the jit fixes them, which the tap then follows: an
input's sharding, or a sharding constraint's
(`_jax_adapter.annotated_spec` reads them from the module being lowered).
An operand whose sharding is left to the partitioner is refused, with an
error that names the fix.

A host function that asks for it (`tap_with_shard=True`, or
`call_with_shard=True`) gets `shard=`, a `host_functions.Shard` that says
where its shard lies in the global value; the table of each device's part
is made here, at lowering time, once per site.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List, Sequence, Tuple

import jax
import numpy as np

from .. import _jax_adapter as adapter
from ..host.device_numbers import device_number
from ..host import host_functions
from ..host.host_functions import (CallKind, HostFunction, Part, ShardTable,
                                   Transforms, UserKind, interned)
from .each_device import lower_on_each_device

P = jax.sharding.PartitionSpec


def _mesh_and_specs(ctx: Any, values: Sequence[Any], avals: Sequence[Any],
                    api: str) -> Tuple[Any, List[Any]]:
  """The abstract mesh the sent operands are sharded over and each one's
  PartitionSpec: their types' on a mesh with explicit axes, else what the
  jit fixes for them (`_jax_adapter.annotated_spec`); ValueError where
  neither tells."""
  mesh = _one_mesh(ctx, avals, api)
  if all(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
    return mesh, [aval.sharding.spec for aval in avals]
  specs = [adapter.annotated_spec(ctx, value, mesh) for value in values]
  unknown = [str(i) for i, spec in enumerate(specs) if spec is None]
  if unknown:
    raise ValueError(
        f"host_callback.{api}(partitioned=True) on a mesh with automatic "
        f"axes ({', '.join(mesh.axis_names)}) sends each operand as the jit "
        "fixes its sharding: the sharding of an input, or of "
        f"jax.lax.with_sharding_constraint just before the {api}. The "
        f"sharding of leaf {', '.join(unknown)} of its operand is left to "
        "the partitioner, which chooses it only when XLA compiles. "
        "Constrain it there (x = jax.lax.with_sharding_constraint(x, "
        "NamedSharding(mesh, P(...)))), use a mesh with explicit axes "
        "(jax.make_mesh's default), or tap inside jax.shard_map")
  return mesh, specs


def _one_mesh(ctx: Any, avals: Sequence[Any], api: str) -> Any:
  """The abstract mesh of the operands' types, or else of the computation;
  ValueError where there are several, or none."""
  meshes = {aval.sharding.mesh for aval in avals
            if aval.sharding.mesh.axis_names}
  if len(meshes) > 1:
    raise ValueError(
        f"host_callback.{api}(partitioned=True): the operands are sharded "
        f"over different meshes ({', '.join(map(str, meshes))}); shard them "
        "over one mesh")
  mesh = next(iter(meshes), None) or adapter.context_mesh(ctx)
  if mesh is None:
    raise ValueError(
        f"host_callback.{api}(partitioned=True): this computation is "
        "sharded over no mesh, so a shard cannot say where it lies. Shard "
        "the inputs with a NamedSharding over a jax.sharding.Mesh (or "
        "jax.make_mesh), or tap inside jax.shard_map")
  return mesh


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
  device runs the host function on its own shard of the sent operands (see
  the module's doc); a tap's `result=` leaves pass by. `bind` binds the
  primitive on each device."""
  is_call = isinstance(function, CallKind)
  sent, arg_avals = operands[:num_args], ctx.avals_in[:num_args]
  abstract, specs = _mesh_and_specs(ctx, sent, arg_avals,
                                    "call" if is_call else "id_tap")
  mesh = _concrete_mesh(abstract, devices)
  result_specs: List[Any] = []
  per_shard: Dict[str, Any] = {"partitioned": False}
  if isinstance(function, CallKind):
    like = specs[0] if specs else P()
    result_specs = [like] * len(function.result_avals)
    per_shard["result_avals"] = tuple(
        a.update(shape=_shard_shape(a.shape, like, mesh, f"result {i}"))
        for i, a in enumerate(function.result_avals))
  if isinstance(function, UserKind) and function.with_shard:
    per_shard["shard_table"] = _shard_table(mesh, specs, arg_avals)
  shard_function = interned(dataclasses.replace(function, **per_shard))

  def on_each_device(*values: Any) -> List[Any]:
    out = bind(values, function=shard_function, num_args=num_args,
               device_index=0, transforms=transforms)
    return out if is_call else []

  op_ctx = ctx.replace(avals_in=list(arg_avals),
                       avals_out=list(host_functions.result_avals(function)))
  results = lower_on_each_device(
      op_ctx, on_each_device, mesh, *sent, in_specs=tuple(specs),
      out_specs=result_specs)
  ctx.set_tokens_out(op_ctx.tokens_out)
  return list(results) if is_call else list(operands)
