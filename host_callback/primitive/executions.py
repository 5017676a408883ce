"""Executions in flight, counted on the device, for barrier_wait.

JAX's CPU client runs a computation whose inputs are not ready yet when they
are, which may be after computations dispatched later (such as the barrier's
markers), and a computation dispatched from another thread runs beside them.
So each of our computations counts its own executions: its first op on our
ordering token, on every device it runs on, counts one as begun, and its last
as ended; one of our ops that fails (which stops the execution) counts it as
ended too. barrier_wait waits for a moment when none is in flight.

Only on CPU with the native library built: elsewhere nothing is counted
(accelerators run their computations in dispatch order).
"""

from __future__ import annotations

from typing import Any, Sequence, Tuple

import jax
from jax.extend.core import Primitive

from .. import _jax_adapter as adapter
from . import each_device
from ..host import transport_policy
from .._jax_adapter import mlir
from ..receiver import transport_native

_EFFECT = adapter.host_callback_effect

execution_mark_p = Primitive("host_callback_execution_mark")
execution_mark_p.multiple_results = True
execution_mark_p.def_effectful_abstract_eval(
    lambda *kept, end: ([], {_EFFECT}))


def counted(ctx: Any) -> bool:
  """Whether the computation being lowered counts its executions."""
  return (tuple(ctx.module_context.platforms) == ("cpu",) and
          transport_policy.native_on_cpu())


def _lower_mark_op(ctx: Any, *kept: Any, end: bool) -> list:
  """The custom call `begin(token) -> token` or `end(token, *kept) ->
  token`; the end mark does not read `kept` (see `lower_mark`)."""
  target = (transport_native.END_TARGET if end
            else transport_native.BEGIN_TARGET)
  token_aval = adapter.abstract_token()
  kept_avals = [adapter.physical_aval(a) for a in ctx.avals_in]
  op_ctx = ctx.replace(avals_in=[token_aval, *kept_avals],
                       avals_out=[token_aval])
  op = jax.ffi.build_ffi_lowering_function(target, has_side_effect=True)(
      op_ctx, ctx.tokens_in.get(_EFFECT), *kept)
  adapter.set_per_device_sharding(ctx, op)
  adapter.thread_token(ctx, op.results[0])
  return []


mlir.register_lowering(execution_mark_p, _lower_mark_op, platform="cpu")


def lower_mark(ctx: Any, token: Any, *, end: bool,
               kept: Sequence[Tuple[Any, Any]] = ()) -> Any:
  """Emits the begin (or end) mark after `token` on every device of the
  computation; returns the token after it.

  `kept` are (value, aval) pairs that the end mark takes as operands without
  reading them, on a computation of one device: a user of each that XLA
  cannot remove (see `ordering.kept_results`)."""
  def mark(*values):
    return execution_mark_p.bind(*values, end=end)

  devices = adapter.sharded_devices(ctx)
  mark_ctx = ctx.replace(avals_in=[aval for _, aval in kept], avals_out=[],
                         tokens_in=mlir.TokenSet({_EFFECT: token}))
  if devices is None:
    mlir.lower_fun(mark, multiple_results=True)(
        mark_ctx, *[value for value, _ in kept])
  else:  # automatically sharded code
    assert not kept, "kept operands on one device only"
    each_device.lower_on_each_device(
        mark_ctx, mark, each_device.one_axis_mesh(devices), in_specs=(),
        out_specs=[])
  return mark_ctx.tokens_out.get(_EFFECT)


def counts() -> Tuple[int, int, int]:
  """Executions begun ever, in flight now, and the fewest in flight right
  after one ended since `reset_low_water` (huge when none ended); all 0
  without the native library."""
  if not transport_native.available():
    return 0, 0, 0
  return transport_native.executions()


def reset_low_water() -> None:
  if transport_native.available():
    transport_native.reset_executions_low_water()


def failed(ctx: Any) -> Any:
  """What one of our Python callbacks in this computation calls when it
  raises, which stops the execution: counts it as ended, if counted."""
  return transport_native.execution_failed if counted(ctx) else None
