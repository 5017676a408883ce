"""Lowering code on each device of automatically sharded code: inside a
shard_map over those devices (a mesh of one axis, or the operands' own, see
`partitioned`), so that the partitioner does not put a side-effecting op on
one device only."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from .._jax_adapter import mlir

# The one axis of the mesh of those shard_maps.
AXIS = "host_callback_devices"


def one_axis_mesh(devices: Sequence[Any]) -> Any:
  """A mesh of `devices` along the one axis `AXIS`."""
  return jax.sharding.Mesh(np.array(devices), (AXIS,))


def lower_on_each_device(ctx: Any, fun: Callable[..., Any], mesh: Any,
                         *operands: Any, in_specs: Any,
                         out_specs: Any) -> Any:
  """Lowers `fun(*operands)` into `ctx` in a shard_map over `mesh`; returns
  its results. Under the user's `jax.set_mesh`, shard_map requires its mesh
  to be the context's: ours is, while `fun` is traced."""
  per_device = jax.shard_map(fun, mesh=mesh, in_specs=in_specs,
                             out_specs=out_specs, check_vma=False)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    return mlir.lower_fun(per_device, multiple_results=True)(ctx, *operands)
