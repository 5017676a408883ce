"""Every private JAX API that host_callback uses, in one place.

Each function names what it wraps. Checked against jax 0.10.2 (Python 3.11)
and jax 0.12.x (Python 3.12/3.13). `check_jax()` runs at import and fails
with a clear message when the installed JAX lacks something we need.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import threading
from typing import (Any, Callable, Iterator, List, Optional, Sequence,
                    Tuple)

import jax
from jax.interpreters import ad, batching, mlir
from jax.interpreters import partial_eval as pe

# The private modules, each imported once here and nowhere else.
from jax._src import api as _api
from jax._src import callback as _callback
from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import effects as _effects
from jax._src import mesh as _mesh
from jax._src import util as _util
from jax._src import named_sharding as _named_sharding
from jax._src import sharding_impls as _sharding_impls
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import partial_eval as _pe
from jax._src.interpreters import pxla as _pxla
from jax._src.lax.control_flow import loops as _loops
from jax._src.lib import xla_client as _xla_client
from jax._src.lib.mlir import ir as _ir
from jax._src.lib.mlir.dialects import hlo  # StableHLO op builders
from jax._src.lib.mlir.dialects import sdy as _sdy

SUPPORTED = ">=0.10,<0.13"

_REQUIRED = {
    _callback: ("emit_python_callback", "_callback_op_sharding"),
    _config: ("bool_state", "int_state", "enum_state",
              "use_shardy_partitioner"),
    _core: ("physical_aval", "Token", "abstract_token", "Var", "new_jaxpr_eqn",
            "trace_state_clean"),
    _dispatch: ("apply_primitive", "prim_requires_devices_during_lowering",
                "runtime_tokens"),
    _effects: ("Effect", "lowerable_effects", "control_flow_allowed_effects",
               "custom_derivatives_allowed_effects", "remat_allowed_effects",
               "ordered_effects", "shardable_ordered_effects",
               "partial_eval_kept_effects"),
    _sharding_impls: ("ShardingContext", "SPMDAxisContext", "SdyArrayList"),
    _named_sharding: ("SdyArray", "SdyDim"),
    _mlir: ("set_sharding", "wrap_with_sharding_op", "jaxpr_subcomp",
            "TokenSet"),
    _pxla: ("_cached_lowering_to_hlo", "_cached_compilation"),
    _sdy: ("TensorShardingAttr", "DimensionShardingAttr", "AxisRefAttr",
           "MeshAttr", "MeshAxisAttr"),
    _util: ("weakref_lru_cache",),
    pe: ("partial_eval_jaxpr_custom_rules",),
    _pe: ("RecomputeType",),
    _loops: ("while_p", "_while_lowering", "_scan_known_hoisting"),
}


def check_jax() -> None:
  """Raises ImportError naming the JAX version and what is missing. Checked
  against jax 0.10.2 and 0.12.0.1."""
  missing = [f"{module.__name__}.{name}"
             for module, names in _REQUIRED.items() for name in names
             if not hasattr(module, name)]
  if missing:
    raise ImportError(
        f"host_callback supports jax{SUPPORTED}, but the installed jax "
        f"{jax.__version__} lacks: {', '.join(missing)}. Install a supported "
        "JAX version, or report this at the host_callback issue tracker.")


check_jax()


# --- Settings (wraps jax._src.config.*_state: jax.config options that also
# read JAX_* environment variables and absl flags) -----------------------

def bool_setting(name: str, default: bool, help: str,
                 changes_lowering: bool = False) -> Any:
  """`changes_lowering`: part of JAX's jit and tracing cache keys, so that a
  change takes effect at the next call of a jitted function. Checked against
  jax 0.10.2 and 0.12.0.1."""
  return _config.bool_state(name, default, help,
                            include_in_jit_key=changes_lowering,
                            include_in_trace_context=changes_lowering)


def int_setting(name: str, default: int, help: str,
                changes_lowering: bool = False) -> Any:
  """`changes_lowering` as `bool_setting`'s. Checked against jax 0.10.2 and
  0.12.0.1."""
  return _config.int_state(name, default, help,
                           include_in_jit_key=changes_lowering,
                           include_in_trace_context=changes_lowering)


def enum_setting(name: str, values: Sequence[str], default: str,
                 help: str) -> Any:
  """A setting that changes the lowering, like `bool_setting`'s. Checked
  against jax 0.10.2 and 0.12.0.1."""
  return _config.enum_state(name, list(values), default, help,
                            include_in_jit_key=True,
                            include_in_trace_context=True)


# --- The ordered effect (wraps jax._src.effects registries) ---------------

class HostCallbackEffect(_effects.Effect):
  """The ordered effect of every host_callback operation. Checked against jax
  0.10.2 and 0.12.0.1."""
  __str__ = lambda self: "HostCallback"  # noqa: E731


host_callback_effect = HostCallbackEffect()
for _registry in (_effects.lowerable_effects,
                  _effects.control_flow_allowed_effects,
                  _effects.custom_derivatives_allowed_effects,
                  _effects.remat_allowed_effects,
                  _effects.ordered_effects,
                  _effects.shardable_ordered_effects,
                  # JaxprTrace's partial evaluation (grad, vjp, linearize of
                  # loops) keeps an equation with such an effect whatever
                  # uses its outputs, as for jax.debug.callback.
                  _effects.partial_eval_kept_effects):
  _registry.add_type(HostCallbackEffect)


# --- Primitive registration helpers --------------------------------------

def apply_primitive(primitive: Any, *args: Any, **params: Any) -> Any:
  """Eager evaluation by compiling the primitive (jax._src.dispatch). Checked
  against jax 0.10.2 and 0.12.0.1."""
  return _dispatch.apply_primitive(primitive, *args, **params)


def require_devices_during_lowering(primitive: Any) -> None:
  """Makes JAX give the device assignment to our lowering (jax._src.dispatch).
  Checked against jax 0.10.2 and 0.12.0.1."""
  _dispatch.prim_requires_devices_during_lowering.add(primitive)


def register_partial_eval_custom_rule(primitive: Any, rule: Callable) -> None:
  """The rule `jax.checkpoint` uses to split known/staged equations. Checked
  against jax 0.10.2 and 0.12.0.1."""
  pe.partial_eval_jaxpr_custom_rules[primitive] = rule


def hold_weakly_in_jax_caches(cls: type) -> None:
  """Makes JAX's caches that are keyed on primitive params (the abstract
  evaluation cache of jax._src.interpreters.partial_eval, a
  multi_weakref_lru_cache) hold instances of `cls` weakly, as they hold
  jaxprs, and drop an entry when its instance dies: otherwise they would keep
  every host function in a param alive until jax.clear_caches(). Adds `cls`
  to jax._src.util.weakref_cache_key_types (jax 0.10.2), which later JAX
  versions define in jax._src.multi_weakref_lru_cache; without either, the
  caches keep them until jax.clear_caches()."""
  for module in ("multi_weakref_lru_cache", "util"):
    try:
      types = getattr(importlib.import_module(f"jax._src.{module}"),
                      "weakref_cache_key_types")
    except (ImportError, AttributeError):
      continue
    types.add(cls)
    return


def remat_saves(saveable: Callable[..., Any], eqn: Any) -> bool:
  """Whether a `jax.checkpoint` policy, `saveable` as the partial-eval rule
  gets it, keeps the outputs of `eqn` for the backward pass rather than
  recomputing them (an output it offloads counts as kept). Wraps
  jax._src.interpreters.partial_eval.RecomputeType, one of the values a
  policy may return besides a bool (jax 0.10.2)."""
  case = saveable(eqn.primitive, *[x.aval for x in eqn.invars], **eqn.params)
  if isinstance(case, bool):
    return case
  return not isinstance(case, _pe.RecomputeType)


def physical_aval(aval: Any) -> Any:
  """The aval as the device stores it (PRNG keys become uint32 arrays). Checked
  against jax 0.10.2 and 0.12.0.1."""
  return _core.physical_aval(aval)


# --- Lowering helpers (wrap jax._src.callback and sharding_impls) ---------

@dataclasses.dataclass(frozen=True)
class ExecutionPlace:
  """Where a callback op runs: one fixed device, or each device of a mesh.
  Checked against jax 0.10.2 and 0.12.0.1."""
  fixed_device: Optional[Any]          # a jax.Device, when the op runs once
  mesh_devices: Tuple[Any, ...] = ()   # by partition id, when per device


def execution_place(ctx: Any, device_index: int) -> ExecutionPlace:
  """Where the op being lowered executes, from the lowering's axis context.
  Checked against jax 0.10.2 and 0.12.0.1."""
  axis_context = ctx.module_context.axis_context
  if isinstance(axis_context, _sharding_impls.SPMDAxisContext):
    return ExecutionPlace(None, tuple(axis_context.mesh.devices.flat))
  devices = getattr(axis_context, "device_assignment", None)
  if not devices:
    raise ValueError("host_callback: JAX did not provide the device "
                     "assignment while lowering the computation")
  check_device_index(device_index, len(devices))
  return ExecutionPlace(devices[device_index])


def check_device_index(device_index: int, num_devices: int) -> None:
  """Raises ValueError unless `device_index` names one of the computation's
  `num_devices` devices. Checked against jax 0.10.2 and 0.12.0.1."""
  if not 0 <= device_index < num_devices:
    raise ValueError(
        f"host_callback: device_index={device_index} is out of range for a "
        f"computation on {num_devices} device(s); use 0 to "
        f"{num_devices - 1}")


def op_sharding(ctx: Any, place: ExecutionPlace, avals_out: Sequence[Any]) -> Any:
  """The sharding annotation for a callback op (jax._src.callback). Checked
  against jax 0.10.2 and 0.12.0.1."""
  sharding = (None if place.fixed_device is None
              else jax.sharding.SingleDeviceSharding(place.fixed_device))
  axis_context = ctx.module_context.axis_context
  if (isinstance(axis_context, _sharding_impls.ShardingContext)
      and axis_context.num_devices == 1):
    return None
  return _callback._callback_op_sharding(axis_context, sharding, avals_out)


def emit_python_callback(ctx: Any, callback: Callable, operands: Sequence[Any],
                         operand_avals: Sequence[Any],
                         result_avals: Sequence[Any], sharding: Any
                         ) -> Sequence[Any]:
  """Emits a side-effecting Python callback threaded on our ordered token.

  Wraps jax._src.callback.emit_python_callback and the token plumbing of
  jax.interpreters.mlir.LoweringRuleContext. Checked against jax 0.10.2 and
  0.12.0.1."""
  token = ctx.tokens_in.get(host_callback_effect)
  op_ctx = ctx.replace(avals_in=list(operand_avals),
                       avals_out=list(result_avals))
  results, token, _ = _callback.emit_python_callback(
      op_ctx, callback, token, list(operands), list(operand_avals),
      list(result_avals), has_side_effect=True, returns_token=True,
      sharding=sharding)
  thread_token(ctx, token)
  return results


def replicate_results(ctx: Any, results: Sequence[Any],
                      avals: Sequence[Any]) -> List[Any]:
  """Marks results of a single-device op in a sharded jit as replicated.

  Otherwise the op's maximal sharding propagates to the jit's outputs, and
  JAX then reads them from the wrong device (jax 0.10-0.12, with Shardy and
  with GSPMD). Wraps jax._src.interpreters.mlir.wrap_with_sharding_op,
  jax._src.named_sharding.SdyArray and xla_client.HloSharding.
  """
  axis_context = ctx.module_context.axis_context
  if not (isinstance(axis_context, _sharding_impls.ShardingContext)
          and axis_context.num_devices > 1):
    return list(results)
  replicated = []
  for result, aval in zip(results, avals):
    if _config.use_shardy_partitioner.value:
      sharding = _named_sharding.SdyArray(
          mesh_shape=None,
          dim_shardings=(_named_sharding.SdyDim(axes=(), is_open=False),) *
          len(aval.shape))
    else:
      sharding = _xla_client.HloSharding.replicate().to_proto()
    replicated.append(_mlir.wrap_with_sharding_op(ctx, result, aval, sharding))
  return replicated


# --- Native lowering helpers (wrap jax._src.core.abstract_token and
# jax._src.interpreters.mlir.set_sharding) ----------------------------------

def abstract_token() -> Any:
  """The aval of an ordering token (jax._src.core.abstract_token). Checked
  against jax 0.10.2 and 0.12.0.1."""
  return _core.abstract_token


def device_count(ctx: Any) -> int:
  """How many devices the computation being lowered runs on, from its axis
  context (jax._src.sharding_impls.ShardingContext or SPMDAxisContext). Checked
  against jax 0.10.2 and 0.12.0.1."""
  axis_context = ctx.module_context.axis_context
  if isinstance(axis_context, _sharding_impls.SPMDAxisContext):
    return axis_context.mesh.size
  return getattr(axis_context, "num_devices", 1)


def sharded_devices(ctx: Any) -> Optional[Tuple[Any, ...]]:
  """The device assignment when lowering automatically sharded code.

  None unless the op is lowered in a `jit` over several devices whose
  partitioner places it (jax._src.sharding_impls.ShardingContext). Checked
  against jax 0.10.2 and 0.12.0.1."""
  axis_context = ctx.module_context.axis_context
  if (isinstance(axis_context, _sharding_impls.ShardingContext)
      and axis_context.num_devices > 1):
    return axis_context.device_assignment
  return None


def context_mesh(ctx: Any) -> Any:
  """The abstract mesh of the automatically sharded computation being
  lowered, or None (jax._src.sharding_impls.ShardingContext.abstract_mesh).
  Checked against jax 0.10.2."""
  mesh = getattr(ctx.module_context.axis_context, "abstract_mesh", None)
  return mesh if mesh is not None and mesh.axis_names else None


def annotated_spec(ctx: Any, value: Any,
                   mesh: Any) -> Optional[jax.sharding.PartitionSpec]:
  """The PartitionSpec over `mesh` that the module being lowered fixes for
  `value`, where the partitioner cannot choose another: the Shardy
  `sdy.sharding` of an argument of the jit (its input sharding) or of an
  `sdy.sharding_constraint` (`jax.lax.with_sharding_constraint`), every
  dimension closed. None for any other value (its sharding is chosen when
  XLA compiles), and under GSPMD (`jax_use_shardy_partitioner=False`).

  Reads the MLIR module through jax._src.lib.mlir.ir and
  jax._src.lib.mlir.dialects.sdy. Checked against jax 0.10.2."""
  attr = _sharding_attr(value)
  if attr is None:
    return None
  sharding = _sdy.TensorShardingAttr(attr)
  if (list(sharding.unreduced_axes) or
      _mesh_axes(ctx, sharding.mesh_or_ref) !=
      tuple(zip(mesh.axis_names, mesh.axis_sizes))):
    return None
  dims: List[Any] = []
  for dim in map(_sdy.DimensionShardingAttr, sharding.dimension_shardings):
    axes = list(map(_sdy.AxisRefAttr, dim.axes))
    if not dim.is_closed or any(a.sub_axis_info is not None for a in axes):
      return None
    names = tuple(a.name for a in axes)
    dims.append(names[0] if len(names) == 1 else (names or None))
  return jax.sharding.PartitionSpec(*dims)


def _sharding_attr(value: Any) -> Any:
  """The `sdy.sharding` attribute that fixes `value`'s sharding: that of a
  function argument or of a sharding constraint; None otherwise."""
  owner = value.owner
  if isinstance(owner, _ir.Block):
    function = owner.owner
    if (function.operation.name != "func.func" or
        "arg_attrs" not in function.attributes):
      return None
    number = _ir.BlockArgument(value).arg_number
    attrs = _ir.DictAttr(_ir.ArrayAttr(function.attributes["arg_attrs"])[number])
    return attrs["sdy.sharding"] if "sdy.sharding" in attrs else None
  if owner.operation.name == "sdy.sharding_constraint":
    return owner.attributes["sharding"]
  return None


def _mesh_axes(ctx: Any, mesh_or_ref: Any) -> Tuple[Tuple[str, int], ...]:
  """The (name, size) axes of the `sdy.mesh` that `mesh_or_ref` names in the
  module being lowered (or of the mesh itself); () for a mesh with its own
  device order, whose shards JAX's meshes do not describe."""
  mesh_attr = None
  if _sdy.MeshAttr.isinstance(mesh_or_ref):
    mesh_attr = mesh_or_ref
  else:
    name = _ir.FlatSymbolRefAttr(mesh_or_ref).value
    for op in ctx.module_context.module.body.operations:
      if (op.operation.name == "sdy.mesh" and
          _ir.StringAttr(op.attributes["sym_name"]).value == name):
        mesh_attr = op.attributes["mesh"]
  if mesh_attr is None:
    return ()
  mesh_attr = _sdy.MeshAttr(mesh_attr)
  if list(mesh_attr.device_ids):
    return ()
  return tuple((axis.name, axis.size)
               for axis in map(_sdy.MeshAxisAttr, mesh_attr.axes))


def set_token_op_sharding(ctx: Any, op: Any, place: ExecutionPlace,
                          result_avals: Sequence[Any]) -> None:
  """Annotates an op returning (token, *results) like a Python callback.

  As jax._src.callback.emit_python_callback does: `op_sharding` of the results,
  plus, under Shardy, one for the token when there are results. Wraps
  jax._src.interpreters.mlir.set_sharding and
  jax._src.sharding_impls.SdyArrayList. Checked against jax 0.10.2 and
  0.12.0.1."""
  sharding = op_sharding(ctx, place, result_avals)
  if sharding is None:
    return
  if isinstance(sharding, _sharding_impls.SdyArrayList) and result_avals:
    first = sharding.shardings[0]
    token_sharding = dataclasses.replace(first, dim_shardings=())
    sharding = _sharding_impls.SdyArrayList(
        (token_sharding, *sharding.shardings))
  _mlir.set_sharding(ctx.module_context, op, sharding)


def set_per_device_sharding(ctx: Any, op: Any) -> None:
  """Inside a shard_map, annotates an op returning a token to run on each
  device, as a tap there is; elsewhere leaves it be. Checked against jax 0.10.2
  and 0.12.0.1."""
  axis_context = ctx.module_context.axis_context
  if isinstance(axis_context, _sharding_impls.SPMDAxisContext):
    place = ExecutionPlace(None, tuple(axis_context.mesh.devices.flat))
    set_token_op_sharding(ctx, op, place, [])


def _no_host_callback(*args: Any) -> None:
  del args  # never called: its presence is what matters


def run_to_completion_at_dispatch(ctx: Any) -> None:
  """Makes the module's executable one that JAX's CPU client runs to
  completion before the dispatch returns, when its inputs are ready.

  The client does so for executables with host callbacks (JAX's own callbacks
  get it this way), so this adds one that is never called to
  jax._src.interpreters.mlir.ModuleContext.host_callbacks. Checked against jax
  0.10.2 and 0.12.0.1."""
  callbacks = ctx.module_context.host_callbacks
  if _no_host_callback not in callbacks:
    ctx.module_context.add_host_callback(_no_host_callback)


def forget_failed_runtime_tokens(is_ours: Callable[[BaseException], bool],
                                 timeout: float) -> None:
  """Drops the calling thread's per-device runtime tokens whose computation
  failed with an error for which `is_ours` is true.

  JAX keeps, per device, the runtime token of the last computation with
  host callbacks that took its Python dispatch path (pmap's always does),
  in jax._src.dispatch.runtime_tokens.output_runtime_tokens (a thread-local;
  checked against jax 0.10.2), and raises a failed one's error again at
  `jax.effects_barrier()` and in two atexit handlers (`wait_for_tokens`,
  `clean_up`). Tokens are waited for on a helper thread for at most
  `timeout` seconds in all, so that a computation stopped for ever by a
  foreign op cannot block the caller; those left are kept. At interpreter
  exit, where Python 3.12 starts no thread, they are waited for here, as
  JAX's own exit handlers would.
  """
  tokens = _dispatch.runtime_tokens.output_runtime_tokens
  pending = list(tokens.items())
  failed: List[Tuple[Any, Any]] = []

  def wait() -> None:
    for device, token in pending:
      try:
        token.block_until_ready()
      except Exception as error:  # pylint: disable=broad-except
        if is_ours(error):
          failed.append((device, token))

  waiter = threading.Thread(target=wait, daemon=True,
                            name="host_callback_runtime_tokens")
  try:
    waiter.start()
  except RuntimeError:  # "can't create new thread at interpreter shutdown"
    wait()
  else:
    waiter.join(timeout)
  for device, token in list(failed):
    if tokens.get(device) is token:
      del tokens[device]


def release_finished_runtime_tokens(finished: Callable[[Any], bool]) -> None:
  """Drops the calling thread's per-device runtime tokens (see
  `forget_failed_runtime_tokens`) of the devices for which `finished(device)`
  says that every computation this thread dispatched there has finished,
  unless it failed: JAX raises that error again at `jax.effects_barrier()`.

  A token may keep its computation's host callbacks alive, and so a host
  function's closure, after the jitted function is gone: on a GPU a
  jax.debug.callback's closure was freed after `jax.effects_barrier()`,
  which drops every token, and ours, without it, was not
  (tests/test_lifetime.py). Each token waited for here is of a computation
  that `finished` vouches for, so the wait returns at once. Checked against
  jax 0.10.2 and 0.12.0.1."""
  tokens = _dispatch.runtime_tokens.output_runtime_tokens
  if not tokens:  # the usual case: an idle barrier's cost
    return
  for device, token in list(tokens.items()):
    if not finished(device):
      continue
    try:
      token.block_until_ready()
    except Exception:  # pylint: disable=broad-except
      continue
    if tokens.get(device) is token:
      del tokens[device]


def forget_runtime_tokens() -> None:
  """Drops the calling thread's runtime tokens (see
  `forget_failed_runtime_tokens`), so that JAX's exit handlers do not wait
  for their computations, in C++ where Ctrl-C cannot reach them. Checked
  against jax 0.10.2 and 0.12.0.1."""
  _dispatch.runtime_tokens.output_runtime_tokens.clear()


def idle_watches(hook: Callable[..., None]
                 ) -> Tuple[Tuple[Tuple[Any, str], ...],
                            Tuple[Tuple[Any, str, Any], ...]]:
  """What JAX keeps that an idle barrier's native check reads, as (object,
  attribute): what must be empty, the runtime tokens that the calling
  thread holds (see `forget_failed_runtime_tokens`: a computation with host
  callbacks dispatched through JAX's Python path since they were last
  dropped); and (object, attribute, value) for what must be `value`: the
  hook JAX calls after each fast-path dispatch on the calling thread (see
  `dispatches_hooked`). Wraps jax._src.dispatch.runtime_tokens (a
  RuntimeTokenSet, thread-local in jax 0.12) and the post-hook state below
  (checked against jax 0.10.2 and 0.12.0.1)."""
  return (((_dispatch.runtime_tokens, "output_runtime_tokens"),),
          ((_POST_HOOK, "value", hook),))


# What JAX calls after each dispatch through its C++ fast path of a jitted
# function (jitted, pmapped or ahead-of-time compiled; not the first call,
# which goes through the Python path): jax._src.api._post_hook_state, which
# jax_debug_nans and jax_debug_infs set to their check. Checked against jax
# 0.10.2 and 0.12.0.1; None where it is missing.
_POST_HOOK = getattr(_api, "_post_hook_state", None)
# The value of a thread-local setting that is not set (jaxlib's config).
_UNSET = getattr(_config.config_ext, "unset", None)


def hook_dispatches(hook: Callable[..., None]) -> None:
  """Makes JAX call `hook(*anything)` after each fast-path dispatch on the
  calling thread, unless another hook is set (jax_debug_nans's check,
  which JAX sets and unsets when that option changes).

  When a `jax.debug_nans(False)` context ends (jnp.var, lax.sort and
  jax.core.jaxpr_as_fun enter one, also while tracing), JAX leaves the
  thread's own hook set to None where it means unset, hiding the global
  one (ours, or the NaN check) on that thread for good: with neither
  debug_nans nor debug_infs set on the thread, it is unset again."""
  if _POST_HOOK is None:
    return
  if _POST_HOOK.get_global() is None:
    _POST_HOOK.set_global(hook)
  if (_UNSET is not None and _POST_HOOK.get_local() is None and
      _config.debug_nans.get_local() is _UNSET and
      _config.debug_infs.get_local() is _UNSET):
    _POST_HOOK.set_local(_UNSET)


def dispatches_hooked(hook: Callable[..., None]) -> bool:
  """Whether JAX calls `hook` after each fast-path dispatch on this
  thread."""
  return _POST_HOOK is not None and _POST_HOOK.value is hook


def dispatched_array_type() -> type:
  """The type of every array that a dispatch through JAX's C++ fast path
  outputs, which the hook of `hook_dispatches` is passed: jaxlib's
  ArrayImpl (jax._src.pjit._get_fastpath_data takes that path only where
  every output is one; checked against jax 0.10.2 and 0.12.0.1)."""
  return _xla_client.ArrayImpl


def execute_without_arguments(executable: Any) -> Any:
  """Dispatches a compiled computation that takes no arguments, as a jitted
  call would (on the calling thread's execution stream); returns jaxlib's
  `ExecuteResults`, from which `consume_token()` gives a token that is ready
  when the computation has finished.

  Wraps jaxlib's `LoadedExecutable.execute_sharded(arguments,
  with_tokens=True)`, what `jax.stages.Compiled.runtime_executable()`
  returns (checked against jax 0.10.2 and 0.12.0.1).
  """
  return executable.execute_sharded([], with_tokens=True)


def _mesh_context_states() -> Tuple[Any, Any]:
  """The thread's abstract and concrete mesh states that `jax.set_mesh`
  swaps: in `jax._src.mesh` (jax 0.12) or `jax._src.config` (jax 0.10)."""
  owner = _mesh if hasattr(_mesh, "device_context") else _config
  return owner.abstract_mesh_context_manager, owner.device_context


@contextlib.contextmanager
def outside_the_program_mesh() -> Iterator[None]:
  """A context without the mesh that the program set (`jax.set_mesh`),
  whose devices would conflict with those of the barrier's own
  computations.

  Does what `jax.set_mesh(None)` does (`jax._src.sharding_impls.set_mesh`:
  swaps the thread's meshes for empty ones, checked against jax 0.10.2 and
  0.12.0.1), without its refusal while JAX traces (a barrier called from
  code being traced): the barrier's computations are compiled apart from
  the traced code, and their probes are kept for later barriers.
  """
  abstract, concrete = _mesh_context_states()
  previous_abstract = abstract.swap_local(_sharding_impls.empty_abstract_mesh)
  previous_concrete = concrete.swap_local(_sharding_impls.empty_concrete_mesh)
  try:
    yield
  finally:
    abstract.set_local(previous_abstract)
    concrete.set_local(previous_concrete)


def tracing() -> bool:
  """Whether JAX is tracing code on this thread (a jitted call would be
  staged into it, not run). Wraps jax._src.core.trace_state_clean, checked
  against jax 0.10.2, 0.11.2 and 0.12.0.1."""
  return not _core.trace_state_clean()


def keep_alive_with_executable(ctx: Any, obj: Any) -> None:
  """Keeps `obj` alive as long as the executable being lowered.

  JAX keeps a module's host callbacks alive with its executable (and our CPU
  lowerings have one anyway, see `run_to_completion_at_dispatch`), so this adds
  one that holds `obj` and is never called. Checked against jax 0.10.2 and
  0.12.0.1."""
  ctx.module_context.add_host_callback(functools.partial(_no_host_callback, obj))


def thread_token(ctx: Any, token: Any) -> None:
  """Makes `token` the output token of our effect for this equation. Checked
  against jax 0.10.2 and 0.12.0.1."""
  ctx.set_tokens_out(
      ctx.tokens_in.update_tokens(mlir.TokenSet({host_callback_effect: token})))


# --- Our ordering token: one effect-free scope at the top of each computation
# (wraps jax._src.interpreters.pxla._cached_lowering_to_hlo, the function that
# turns a jit's top-level jaxpr into an MLIR module, and reads its ordered
# effects from `jaxpr.effects`; checked against jax 0.10.2, where it takes a
# ClosedJaxpr, and 0.12.0.1, where it takes an open Jaxpr).

def _install_top_level_rewrite(rewrite: Callable[[Any], Any],
                              applies: Callable[[Any], bool]) -> None:
  """Lowers every jit's top-level jaxpr `j` for which `applies(j)` holds as
  `rewrite(j)` instead; `rewrite` is cached per jaxpr, so JAX's own lowering
  cache keeps working. Checked against jax 0.10.2 and 0.12.0.1."""
  lower = _pxla._cached_lowering_to_hlo
  if getattr(lower, "_host_callback_rewrite", False):
    return
  cached_rewrite = _util.weakref_lru_cache(rewrite)

  def lower_rewritten(top_jaxpr: Any, *args: Any, **kwargs: Any) -> Any:
    if applies(top_jaxpr):
      top_jaxpr = cached_rewrite(top_jaxpr)
    return lower(top_jaxpr, *args, **kwargs)

  lower_rewritten._host_callback_rewrite = True  # type: ignore[attr-defined]
  _pxla._cached_lowering_to_hlo = lower_rewritten


def scope_eqn(top_jaxpr: Any, primitive: Any, effects: Any) -> Any:
  """`top_jaxpr` (a ClosedJaxpr or a Jaxpr) as one equation of `primitive`,
  whose param `jaxpr` is the original open jaxpr and whose effects are
  `effects`. The equation's inputs are the constvars then the invars. Checked
  against jax 0.10.2 and 0.12.0.1."""
  # jax 0.10 has ClosedJaxpr (a jaxpr and its consts); jax 0.12 has not.
  closed_type = getattr(_core, "ClosedJaxpr", None)
  closed = closed_type is not None and isinstance(top_jaxpr, closed_type)
  # A copy when `top_jaxpr` is open: the result, cached weakly keyed on
  # `top_jaxpr` (_install_top_level_rewrite), must not hold its key, or the
  # entry, and the host functions in it, would outlive the jaxpr.
  jaxpr = top_jaxpr.jaxpr if closed else top_jaxpr.replace()
  outvars = [_core.Var(v.aval) for v in jaxpr.outvars]
  eqn = _core.new_jaxpr_eqn([*jaxpr.constvars, *jaxpr.invars], outvars,
                            primitive, {"jaxpr": jaxpr}, set(effects))
  outer = jaxpr.replace(eqns=[eqn], outvars=outvars, effects=set(effects))
  return closed_type(outer, top_jaxpr.consts) if closed else outer


def lower_scope_body(ctx: Any, jaxpr: Any, args: Sequence[Any], effect: Any,
                     open_token: Callable[[Any], Any],
                     close_token: Callable[[Any, List[Any]], None]
                     ) -> List[Any]:
  """Lowers `jaxpr` inline with a new token for `effect`, which JAX threads
  through the body's control flow; the other effects' tokens pass through.

  `open_token(token)` returns the token the body starts from, and
  `close_token(token, outs)` gets the one it ends with and the body's
  results. Wraps jax._src.interpreters.mlir.jaxpr_subcomp and
  hlo.create_token. Checked against jax 0.10.2 and 0.12.0.1."""
  tokens = mlir.TokenSet({**dict(ctx.tokens_in.items()),
                          effect: open_token(hlo.create_token())})
  num_consts = len(jaxpr.constvars)
  outs, tokens_out = _mlir.jaxpr_subcomp(
      ctx.module_context, jaxpr, ctx.name_stack, tokens, args[:num_consts],
      *args[num_consts:], dim_var_values=ctx.dim_var_values,
      const_lowering=ctx.const_lowering, outer_traceback=ctx.traceback)
  close_token(tokens_out.get(effect), list(outs))
  ctx.set_tokens_out(mlir.TokenSet(
      {e: t for e, t in tokens_out.items() if e is not effect}))
  return list(outs)


# --- vmap of a while loop whose predicate taps (wraps
# jax._src.lax.control_flow.loops._while_lowering; checked against jax 0.10.2)
# JAX lowers a while loop with ordered effects in its cond by restaging it,
# and on that path forgets, for a batched predicate, to keep the carry of the
# elements that are done: they keep running the body and the loop returns
# wrong values. We lower that one case ourselves, as the original did.

_jax_while_lowering = _loops._while_lowering


def _while_lowering(ctx: Any, *args: Any, cond_jaxpr: Any, body_jaxpr: Any,
                    cond_nconsts: int, body_nconsts: int) -> Any:
  pred_aval = cond_jaxpr.out_avals[0]
  if not (pred_aval.shape and host_callback_effect in cond_jaxpr.effects):
    return _jax_while_lowering(ctx, *args, cond_jaxpr=cond_jaxpr,
                               body_jaxpr=body_jaxpr, cond_nconsts=cond_nconsts,
                               body_nconsts=body_nconsts)

  def fun(*args):
    cond_consts = args[:cond_nconsts]
    body_consts = args[cond_nconsts:cond_nconsts + body_nconsts]
    carry = list(args[cond_nconsts + body_nconsts:])

    def pred_of(carry):  # taps the predicate once per evaluation
      return _core.eval_jaxpr(cond_jaxpr.jaxpr, cond_jaxpr.consts,
                              *cond_consts, *carry)[0]

    def body(state):
      pred, carry = state
      new = _core.eval_jaxpr(body_jaxpr.jaxpr, body_jaxpr.consts,
                             *body_consts, *carry)
      dims = tuple(range(pred.ndim))  # the batch dims lead (batching rule)
      carry = [jax.lax.select(jax.lax.broadcast_in_dim(pred, c.shape, dims),
                              n, c) for n, c in zip(new, carry)]
      return pred_of(carry), carry

    def cond(state):
      return jax.lax.reduce_or(state[0], tuple(range(state[0].ndim)))

    return jax.lax.while_loop(cond, body, (pred_of(carry), carry))[1]

  return mlir.lower_fun(fun, multiple_results=True)(ctx, *args)


def _install_scan_hoisting_guard() -> None:
  """Keeps taps in the loop when differentiating a `scan` (and so a
  `fori_loop` with static bounds).

  After linearizing or partially evaluating a scan, JAX hoists out of the
  loop what its forward body computes from loop-invariant values only (the
  body's consts, a carry passed through unchanged, or nothing), to compute
  it once: a tap of such values, an operand-less one included, would then
  run once instead of once per iteration. This wraps
  jax._src.lax.control_flow.loops._scan_known_hoisting (jax 0.10.2 and
  0.12.0.1: called by _scan_linearize and _scan_partial_eval) so that a forward body with
  our effect is left as it is, which its own source names as the way to
  disable the hoisting; bodies without taps are hoisted as before.
  """
  hoist = _loops._scan_known_hoisting
  if getattr(hoist, "_host_callback_guard", False):
    return

  # jax 0.10.2 passes num_res; 0.12.0.1 passes num_ures, num_sres and
  # hoists among the first only.
  def hoist_unless_tapping(jaxpr_known: Any, known_consts: Any,
                           *num_res: int) -> Any:
    if host_callback_effect in jaxpr_known.effects:
      return jaxpr_known, known_consts, [False] * num_res[0], []
    return hoist(jaxpr_known, known_consts, *num_res)

  hoist_unless_tapping._host_callback_guard = True  # type: ignore[attr-defined]
  _loops._scan_known_hoisting = hoist_unless_tapping


def _install_while_lowering() -> None:
  """Registers `_while_lowering` for `while_p` on every platform. Checked
  against jax 0.10.2 and 0.12.0.1."""
  mlir.register_lowering(_loops.while_p, _while_lowering)


# --- Compiling again what XLA refused (wraps
# jax._src.interpreters.pxla._cached_compilation, which compiles a jit's
# module; checked against jax 0.10.2, 0.11.2 and 0.12.0.1, where it takes
# the same arguments).

_MODULE_MARK = "host_callback.ordered"
_ROOT_UNKEPT_MARK = "host_callback.root_unkept"


def mark_module(ctx: Any, *, root_kept: bool) -> None:
  """Marks the module being lowered as one holding our ops, and whether its
  ROOT has a user that keeps XLA's CPU library fusion off it, for the
  compile retry. Checked against jax 0.10.2, 0.11.2 and 0.12.0.1."""
  attributes = ctx.module_context.module.operation.attributes
  attributes[_MODULE_MARK] = _ir.UnitAttr.get()
  if not root_kept:
    attributes[_ROOT_UNKEPT_MARK] = _ir.UnitAttr.get()


def with_result_barrier(module: Any) -> Any:
  """A copy of the jit's `module` whose main function returns its results
  through one `stablehlo.optimization_barrier`. Checked against jax 0.10.2,
  0.11.2 and 0.12.0.1."""
  with module.context:
    copy = _ir.Module.parse(module.operation.get_asm(enable_debug_info=True))
    main = next(op for op in copy.body.operations
                if "sym_name" in op.attributes and
                _ir.StringAttr(op.attributes["sym_name"]).value == "main")
    body = main.regions[0].blocks[0].operations
    returned = body[len(body) - 1]
    with _ir.InsertionPoint(returned), returned.location:
      barrier = hlo.OptimizationBarrierOp(list(returned.operands))
    for index, result in enumerate(barrier.results):
      returned.operands[index] = result
  return copy


def _install_compile_retry(compile_ours: Callable[..., Any],
                           watching: Callable[[str], Any]) -> None:
  """Compiles a module marked by `mark_module` through
  `compile_ours(compile_with, platform=, root_kept=)`, where
  `compile_with(options, result_barrier=False)` compiles it with the
  (name, value) compiler options `options` added to the jit's (and, where
  `result_barrier`, a copy `with_result_barrier`); every compile in the context
  `watching(platform)`, with the options it yields added to the jit's
  where those set none of that name."""
  compile_ = _pxla._cached_compilation
  if getattr(compile_, "_host_callback_retry", False):
    return

  def compile_marked(computation: Any, name: str, tuple_args: Any,
                     allow_prop_to_inputs: Any, allow_prop_to_outputs: Any,
                     host_callbacks: Any, backend: Any, da: Any,
                     compiler_options_kvs: Any, pgle_profiler: Any) -> Any:
    given = tuple(compiler_options_kvs)
    marks = computation.operation.attributes
    with watching(backend.platform) as defaults:
      named = {name for name, _ in given}
      given += tuple(option for option in defaults if option[0] not in named)

      def compile_with(options: Tuple[Tuple[str, Any], ...], *,
                       result_barrier: bool = False) -> Any:
        module = (with_result_barrier(computation) if result_barrier
                  else computation)
        return compile_(module, name, tuple_args, allow_prop_to_inputs,
                        allow_prop_to_outputs, host_callbacks, backend, da,
                        given + tuple(options), pgle_profiler)
      if _MODULE_MARK not in marks:
        return compile_with(())
      return compile_ours(compile_with, platform=backend.platform,
                          root_kept=_ROOT_UNKEPT_MARK not in marks)

  compile_marked._host_callback_retry = True  # type: ignore[attr-defined]
  _pxla._cached_compilation = compile_marked


# --- Every patch of JAX's internals, in one place ---

# (what it patches, why, the JAX versions it was checked against)
PATCHES = (
    ("jax._src.interpreters.pxla._cached_lowering_to_hlo (wrapped)",
     "our ordering token: a jit's top-level jaxpr with our effect lowers as "
     "one effect-free scope, so the computation keeps JAX's C++ dispatch",
     "0.10.2, 0.12.0.1"),
    ("jax._src.lax.control_flow.loops._scan_known_hoisting (wrapped)",
     "taps stay in a scan's body under grad instead of being hoisted out",
     "0.10.2, 0.12.0.1"),
    ("the lowering rule of jax._src.lax.control_flow.loops.while_p "
     "(replaced, every platform)",
     "a tap in a batched while predicate shows the carry as it is",
     "0.10.2, 0.12.0.1"),
    ("jax._src.interpreters.pxla._cached_compilation (wrapped)",
     "a computation with our ops that XLA refuses to compile is compiled "
     "once more with options, or results behind a barrier, that avoid the "
     "refusal (compile_retry.py); "
     "a compile that one of our host functions starts on a GPU and that "
     "runs long is reported, and may leave out autotuning "
     "(compile_watch.py)",
     "0.10.2, 0.11.2, 0.12.0.1"),
)


def install_patches(rewrite: Callable[[Any], Any],
                    applies: Callable[[Any], bool],
                    compile_ours: Callable[..., Any],
                    watching: Callable[[str], Any]) -> None:
  """Installs every patch that PATCHES lists, once: the top-level rewrite
  (`rewrite` of each jit's top-level jaxpr for which `applies` holds), the
  scan hoisting guard, the while lowering and the compile retry (through
  `compile_ours` and `watching`, see `_install_compile_retry`)."""
  _install_top_level_rewrite(rewrite, applies)
  _install_scan_hoisting_guard()
  _install_while_lowering()
  _install_compile_retry(compile_ours, watching)


__all__ = [
    "ad", "batching", "hlo", "mlir", "pe", "check_jax", "bool_setting",
    "int_setting", "enum_setting", "host_callback_effect",
    "apply_primitive", "require_devices_during_lowering",
    "register_partial_eval_custom_rule", "physical_aval",
    "hold_weakly_in_jax_caches", "remat_saves", "ExecutionPlace",
    "execution_place", "check_device_index", "op_sharding",
    "emit_python_callback", "replicate_results", "abstract_token",
    "device_count", "sharded_devices", "context_mesh", "annotated_spec",
    "set_token_op_sharding",
    "set_per_device_sharding", "run_to_completion_at_dispatch",
    "forget_failed_runtime_tokens", "forget_runtime_tokens",
    "release_finished_runtime_tokens",
    "execute_without_arguments", "idle_watches", "hook_dispatches",
    "dispatched_array_type", "dispatches_hooked",
    "outside_the_program_mesh", "keep_alive_with_executable",
    "thread_token", "tracing", "install_patches", "PATCHES", "scope_eqn",
    "lower_scope_body", "mark_module", "with_result_barrier",
]
