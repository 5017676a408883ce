"""Emits a tap or a call for the native transport: an XLA FFI custom call.

A tap becomes `host_callback_outfeed(token, *args) -> token`, a synchronous
tap `host_callback_tap_sync(token, *operands) -> (token, *operands)` (aliased),
a `call` `host_callback_call(token, *args) -> (token, *results)`; the token is
our ordering token, so XLA keeps them in program order on each device. The
handlers read the executing device from the FFI device ordinal, which on CPU
is the `jax.Device.id` of the device.
"""

from __future__ import annotations

import functools
from typing import Any, List, Sequence

import jax
import numpy as np

from . import _jax_adapter as adapter
from .lowering_kinds import Kind
from .receiver import transport_native


@functools.lru_cache(maxsize=None)
def register_targets() -> None:
  """Registers the FFI handlers with XLA for CPU, once per process."""
  for name, handler in transport_native.ffi_handlers().items():
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler),
                                platform="cpu")


_TARGETS = {Kind.TAP: transport_native.OUTFEED_TARGET,
            Kind.TAP_SYNC: transport_native.TAP_SYNC_TARGET,
            Kind.CALL: transport_native.CALL_TARGET}


def emit(ctx: Any, place: adapter.ExecutionPlace, kind: Kind,
         operands: Sequence[Any], operand_avals: Sequence[Any], num_sent: int,
         result_avals: Sequence[Any], site: int) -> List[Any]:
  """The custom call, on a fixed device or on each device of a shard_map.

  It sends `operands[:num_sent]`; a TAP_SYNC's results alias its operands.
  """
  register_targets()
  # As for JAX's own callbacks (and so the Python transport): a computation
  # that taps has run when its dispatch returns, so that barrier_wait's
  # markers come after it on the device.
  adapter.run_to_completion_at_dispatch(ctx)
  token_aval = adapter.abstract_token()
  op_ctx = ctx.replace(avals_in=[token_aval, *operand_avals],
                       avals_out=[token_aval, *result_avals])
  attributes = {"site": np.int64(site)}
  lowering_args = {}
  if kind is Kind.TAP_SYNC:
    attributes["num_sent"] = np.int64(num_sent)
    lowering_args["operand_output_aliases"] = {
        i: i for i in range(1, len(operands) + 1)}
  op = jax.ffi.build_ffi_lowering_function(
      _TARGETS[kind], has_side_effect=True, **lowering_args)(
          op_ctx, ctx.tokens_in.get(adapter.host_callback_effect), *operands,
          **attributes)
  adapter.set_token_op_sharding(ctx, op, place, result_avals)
  token, *results = op.results
  adapter.thread_token(ctx, token)
  return list(results)
